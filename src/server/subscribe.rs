//! Subscriptions and the start of a connection: `subscribe`, `initialize`
//! and `reconnect`.
//!
//! Each takes its channels' snapshots (or a replay) with the connection's
//! queue gated, so the reply carrying them is queued before any envelope
//! published after them: the client applies every later action exactly
//! once.

use std::collections::HashSet;

use actix::prelude::*;
use ahp_types::commands::{InitializeParams, ReconnectParams, SubscribeParams};
use bytestring::ByteString;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::connection::Connection;
use crate::channels::SnapshotJson;
use crate::ids::{ChannelUri, ServerSeq};
use crate::metrics::ReconnectAnswer;
use crate::protocol::{self, errors, RpcError};
use crate::publish::Replay;

/// `result` of `initialize`, with snapshots spliced in pre-serialized.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitializeOut<'a> {
    protocol_version: &'a str,
    server_seq: ServerSeq,
    server_info: ahp_types::commands::Implementation,
    snapshots: Vec<&'a RawValue>,
}

impl Connection {
    /// `subscribe`: answered with the channel's snapshot.
    pub(super) fn subscribe(
        &mut self,
        id: Option<Value>,
        p: SubscribeParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        let uri = ChannelUri::from(p.channel);
        let view_turns = p.view.and_then(|v| v.turns);
        self.subscribe_many(vec![uri.clone()], view_turns, ctx, move |_, snaps| {
            let id = id?;
            let frame = match snaps.map(|s| s.into_iter().next()) {
                Ok(Some(s)) => {
                    protocol::encode_raw_result(&id, &format!("{{\"snapshot\":{}}}", s.0))
                }
                // Disposed while we asked.
                Ok(None) => protocol::encode_error(&id, &Self::not_found(&uri)),
                Err(e) => protocol::encode_error(&id, &e),
            };
            Some(ByteString::from(frame))
        })
    }

    /// Subscribe to `uris` atomically with respect to this connection's queue:
    /// frames are held until `reply` (built from the snapshots) is queued.
    ///
    /// A channel disposed while we asked is left out of the snapshots. A
    /// channel that refuses (its state cannot be vouched for until the
    /// store answers again) fails the whole request with its reason, and
    /// the channels this request newly subscribed are let go again: the
    /// client retries and loses nothing, rather than go on without a
    /// channel it asked for.
    fn subscribe_many(
        &mut self,
        uris: Vec<ChannelUri>,
        view_turns: Option<i64>,
        ctx: &mut Context<Self>,
        reply: impl FnOnce(&mut Self, Result<Vec<SnapshotJson>, RpcError>) -> Option<ByteString>
            + 'static,
    ) -> Result<(), RpcError> {
        let max = self
            .app
            .shared
            .config
            .limits
            .max_subscriptions_per_connection;
        let new = uris.iter().filter(|u| !self.subs.contains(*u)).count();
        if self.subs.len() + new > max {
            return Err(subscription_limit(max));
        }
        let mut channels = Vec::with_capacity(uris.len());
        for uri in &uris {
            self.permit(uri)?;
            let ch = self
                .app
                .shared
                .registry
                .get(uri)
                .ok_or_else(|| Self::not_found(uri))?;
            channels.push(ch);
        }
        self.out.gate();
        let conn = self.out.clone();
        let futs = channels.into_iter().map(move |ch| {
            let snapshot = ch.addr.subscribe(conn.clone(), view_turns);
            async move { (ch, snapshot.await) }
        });
        let all = futures_util::future::join_all(futs);
        ctx.wait(all.into_actor(self).map(move |results, act, _| {
            let mut snaps = Vec::new();
            let mut added = Vec::new();
            let mut refusal = None;
            for (ch, res) in results {
                match res {
                    Ok(Ok(s)) => {
                        if act.subs.insert(ch.uri.clone()) {
                            added.push(ch);
                        }
                        snaps.push(s);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(uri = %ch.uri, reason = %e.message, "subscription refused");
                        refusal.get_or_insert(e);
                    }
                    Err(_) => tracing::debug!(uri = %ch.uri, "channel vanished during subscribe"),
                }
            }
            let answer = match refusal {
                None => Ok(snaps),
                Some(e) => {
                    for ch in added {
                        act.subs.take(ch.uri.as_str());
                        ch.hub.remove(act.out.id());
                    }
                    Err(e)
                }
            };
            let frame = reply(act, answer);
            act.out.ungate_with(frame);
        }));
        Ok(())
    }

    /// `initialize`: negotiate the protocol version, take the initial
    /// subscriptions, and answer with their snapshots.
    pub(super) fn initialize(
        &mut self,
        id: Option<Value>,
        p: InitializeParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        if self.client_id.is_some() {
            return Err(RpcError::invalid_request(
                "`initialize` was already called on this connection",
            ));
        }
        let version = match ahp_types::negotiate_protocol_version(&p.protocol_versions) {
            Err(e) => return Err(RpcError::invalid_params(e)),
            Ok(None) => {
                return Err(RpcError::new(
                    errors::UNSUPPORTED_PROTOCOL_VERSION,
                    format!("none of {:?} is supported", p.protocol_versions),
                )
                .with_data(serde_json::json!({"supportedVersions": ahp_types::SUPPORTED_PROTOCOL_VERSIONS})));
            }
            Ok(Some(v)) => v.to_owned(),
        };
        self.check_client_id(&p.client_id)?;
        let uris: Vec<ChannelUri> = p
            .initial_subscriptions
            .unwrap_or_default()
            .into_iter()
            .map(ChannelUri::from)
            .collect();
        for uri in &uris {
            self.permit(uri)?;
            if !self.app.shared.registry.contains(uri) {
                return Err(Self::not_found(uri));
            }
        }
        // Initialized only once the subscriptions are taken: a refused
        // `initialize` leaves the connection as it was.
        self.client_id = Some(p.client_id.into());
        self.name_from(p.meta.as_ref());
        let subscribed = self.subscribe_many(uris, None, ctx, move |act, snaps| {
            let snaps = match snaps {
                Ok(s) => s,
                Err(e) => {
                    // Refused as a whole: the client may `initialize` again.
                    act.client_id = None;
                    return id.map(|id| ByteString::from(protocol::encode_error(&id, &e)));
                }
            };
            let id = id?;
            let raws: Vec<Box<RawValue>> = snaps
                .into_iter()
                .filter_map(|s| RawValue::from_string(s.0).ok())
                .collect();
            let out = InitializeOut {
                protocol_version: &version,
                server_seq: act.out.last_seq().max(act.app.shared.publisher.current()),
                server_info: ahp_types::commands::Implementation {
                    name: "tandem".into(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                    title: Some("Tandem".into()),
                },
                snapshots: raws.iter().map(|r| r.as_ref()).collect(),
            };
            let json = serde_json::to_string(&out).unwrap_or_else(|_| "null".into());
            Some(ByteString::from(protocol::encode_raw_result(&id, &json)))
        });
        if subscribed.is_err() {
            self.client_id = None;
        }
        subscribed
    }

    /// `-32602` unless `client_id` is a usable `clientId`.
    fn check_client_id(&self, client_id: &str) -> Result<(), RpcError> {
        let max = self.app.shared.config.limits.max_client_id_bytes;
        if client_id.is_empty() {
            return Err(RpcError::invalid_params("`clientId` must not be empty"));
        }
        if client_id.len() > max {
            return Err(RpcError::invalid_params(format!(
                "`clientId` is {} bytes, over the limit of {max}",
                client_id.len()
            )));
        }
        Ok(())
    }

    /// `reconnect`: replay what the client missed when the ring still holds
    /// it, fresh snapshots otherwise; channels that are gone are listed as
    /// missing (replay) or absent (snapshots).
    pub(super) fn reconnect(
        &mut self,
        id: Option<Value>,
        p: ReconnectParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        if self.client_id.is_some() {
            return Err(RpcError::invalid_request(
                "`reconnect` must be the first call on a new connection",
            ));
        }
        self.check_client_id(&p.client_id)?;
        let shared = self.app.shared.clone();
        let max = shared.config.limits.max_subscriptions_per_connection;
        let wanted: HashSet<&str> = p.subscriptions.iter().map(String::as_str).collect();
        if wanted.len() > max {
            return Err(subscription_limit(max));
        }
        self.client_id = Some(p.client_id.into());
        self.name_from(p.meta.as_ref());
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for uri in p.subscriptions {
            match shared.registry.get(&uri) {
                Some(ch) if self.permit(&uri).is_ok() => present.push(ch),
                _ => missing.push(uri),
            }
        }
        self.out.gate();
        if p.last_seen_server_seq >= 0 {
            let channels: Vec<_> = present
                .iter()
                .map(|c| (c.uri.clone(), c.hub.clone()))
                .collect();
            let replay = shared.publisher.replay_and_subscribe(
                ServerSeq::new(p.last_seen_server_seq as u64),
                &channels,
                &self.out,
                shared.config.max_replay_bytes,
                |_| {},
            );
            if let Replay::Envelopes(envs) = replay {
                for c in &present {
                    self.subs.insert(c.uri.clone());
                }
                let actions = envs.iter().map(|e| &**e).collect::<Vec<&str>>().join(",");
                let missing = serde_json::to_string(&missing).unwrap_or_else(|_| "[]".into());
                let frame = id.map(|id| {
                    ByteString::from(protocol::encode_raw_result(
                        &id,
                        &format!(
                            "{{\"type\":\"replay\",\"actions\":[{actions}],\"missing\":{missing}}}"
                        ),
                    ))
                });
                self.out.ungate_with(frame);
                shared.metrics.reconnected(ReconnectAnswer::Replay);
                return Ok(());
            }
        }
        // Too old (or from before a restart): fresh snapshots. Channels that
        // are gone are simply absent.
        self.out.ungate_with(None);
        shared.metrics.reconnected(ReconnectAnswer::Snapshot);
        let uris = present.iter().map(|c| c.uri.clone()).collect();
        self.subscribe_many(uris, None, ctx, move |act, snaps| {
            if snaps.is_err() {
                // Refused whole: the client may `reconnect` again.
                act.client_id = None;
            }
            let id = id?;
            let frame = match snaps {
                Ok(snaps) => {
                    let joined = snaps.into_iter().map(|s| s.0).collect::<Vec<_>>().join(",");
                    protocol::encode_raw_result(
                        &id,
                        &format!("{{\"type\":\"snapshot\",\"snapshots\":[{joined}]}}"),
                    )
                }
                // The client keeps its state and tries again.
                Err(e) => protocol::encode_error(&id, &e),
            };
            Some(ByteString::from(frame))
        })
    }
}

/// The refusal of a subscription past the per-connection limit.
fn subscription_limit(max: usize) -> RpcError {
    RpcError::invalid_request(format!(
        "subscription limit reached: at most {max} channels per connection"
    ))
}
