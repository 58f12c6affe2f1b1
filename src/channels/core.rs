//! What every channel actor shares: the server-wide context ([`Shared`]) and
//! the journal-then-publish step ([`ChannelCore`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};

use super::registry::Registry;
use crate::config::Config;
use crate::providers::Providers;
use crate::publish::{rejection_frame, ConnId, Hub, Outbound, Publisher, Push, ServerSeq};
use crate::store::{Batch, Journal, JournalError, Record, SnapshotRecord, TurnRecord};

/// Server-wide context handed to every actor and connection.
pub struct Shared {
    /// Tunables.
    pub config: Config,
    /// `serverSeq`, replay ring, ordered fan-out.
    pub publisher: Publisher,
    /// Channel URI → actor.
    pub registry: Registry,
    /// Durable action log.
    pub journal: Arc<dyn Journal>,
    /// Agents by provider id.
    pub providers: Providers,
    /// Every open connection's queue (closed with a reason at shutdown).
    pub connections: dashmap::DashMap<ConnId, Arc<Outbound>>,
    /// Open connections per token subject.
    pub connections_per_token: dashmap::DashMap<String, usize>,
    /// What each principal may still send and have journaled now.
    pub principals: crate::rate::Principals,
    /// Token verification, when a secret is configured.
    pub auth: Option<crate::auth::Authenticator>,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: AtomicUsize,
}

impl Shared {
    /// Assemble the context. `auth` verifies tokens (built from
    /// `config.auth_secret` by the start-up checks, which refuse a secret
    /// that makes no key); `arbiters` are the threads actors are spread on.
    pub fn new(
        config: Config,
        auth: Option<crate::auth::Authenticator>,
        journal: Arc<dyn Journal>,
        providers: Providers,
        arbiters: Vec<ArbiterHandle>,
        start_seq: u64,
    ) -> Self {
        let reserving = journal.clone();
        Self {
            publisher: Publisher::with_reserver(
                start_seq,
                config.replay_ring_len,
                config.replay_ring_bytes,
                Box::new(move |upto| reserving.reserve_seq(upto).is_ok()),
            ),
            config,
            registry: Registry::default(),
            journal,
            providers,
            connections: dashmap::DashMap::new(),
            connections_per_token: dashmap::DashMap::new(),
            principals: crate::rate::Principals::default(),
            auth,
            arbiters,
            next_arbiter: AtomicUsize::new(0),
        }
    }

    /// The arbiter for the next new actor (round robin), so chats run in
    /// parallel across threads.
    pub fn next_arbiter(&self) -> ArbiterHandle {
        if self.arbiters.is_empty() {
            return Arbiter::current();
        }
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        self.arbiters[i].clone()
    }
}

/// An action accepted by an actor, waiting for the journal.
pub struct Accepted {
    /// The action (already reduced into the actor's state).
    pub action: StateAction,
    /// Its serialized form, journaled and published as is.
    pub json: Record,
    /// The dispatcher, when a client sent it.
    pub origin: Option<(ActionOrigin, Arc<Outbound>)>,
}

impl Accepted {
    /// Wrap an action, serializing it once.
    pub fn new(action: StateAction, origin: Option<(ActionOrigin, Arc<Outbound>)>) -> Self {
        let json: Record = serde_json::to_string(&action)
            .unwrap_or_else(|_| "null".into())
            .into();
        Self {
            action,
            json,
            origin,
        }
    }
}

/// A channel's identity and its path to subscribers.
pub struct ChannelCore {
    /// Channel URI.
    pub uri: Arc<str>,
    /// Subscribers.
    pub hub: Arc<Hub>,
    /// Server context.
    pub shared: Arc<Shared>,
    /// Records this channel has in the journal (the next `expected_seq`).
    pub journal_len: u64,
    /// Set when the journal refused a write: the channel then rejects every
    /// new action (reads keep working) instead of acknowledging unstored ones.
    pub store_failed: Option<String>,
    /// Records journaled since the last snapshot.
    since_snapshot: u64,
}

impl ChannelCore {
    /// A core for a channel with `journal_len` records already stored.
    pub fn new(uri: Arc<str>, hub: Arc<Hub>, shared: Arc<Shared>) -> Self {
        let journal_len = shared.journal.len(&uri);
        Self {
            uri,
            hub,
            shared,
            journal_len,
            store_failed: None,
            since_snapshot: 0,
        }
    }

    /// Register `conn` and return the snapshot of `state` at the current
    /// `serverSeq` (later envelopes of this channel all reach `conn`).
    pub fn subscribe(
        &self,
        conn: &Arc<Outbound>,
        state: &impl serde::Serialize,
    ) -> Result<super::SnapshotJson, crate::protocol::RpcError> {
        let state = serde_json::to_string(state)
            .map_err(|e| crate::protocol::RpcError::internal(e.to_string()))?;
        Ok(self.shared.publisher.subscribe_at(&self.hub, conn, |from| {
            super::SnapshotJson::new(&self.uri, &state, from)
        }))
    }

    /// Send a rejection echo to the dispatcher only.
    pub fn reject(
        &self,
        conn: &Outbound,
        origin: &ActionOrigin,
        action: &StateAction,
        reason: &str,
    ) {
        let json = serde_json::to_string(action).unwrap_or_else(|_| "null".into());
        tracing::debug!(channel = %self.uri, client = %origin.client_id, reason, "action rejected");
        conn.push(Push::AfterLastSeq(&|last| {
            rejection_frame(&self.uri, &json, last, origin, reason)
        }));
    }

    /// Start journaling a batch; the caller publishes when it resolves.
    /// Every `snapshot_every` records the channel's state (from `state`, taken
    /// after the batch) goes along, so recovery replays only the tail.
    pub fn append(
        &mut self,
        batch: &[Accepted],
        turns: Vec<TurnRecord>,
        truncate_turns_from: Option<u64>,
        state: impl FnOnce() -> Option<String>,
    ) -> crate::store::Commit {
        let records: Vec<Record> = batch.iter().map(|a| a.json.clone()).collect();
        let expected = self.journal_len;
        self.journal_len += records.len() as u64;
        self.since_snapshot += records.len() as u64;
        let snapshot = if self.since_snapshot >= self.shared.config.snapshot_every {
            self.since_snapshot = 0;
            state().map(|s| SnapshotRecord {
                at_seq: self.journal_len,
                state: s.into(),
            })
        } else {
            None
        };
        self.shared.journal.append(
            &self.uri,
            expected,
            Batch {
                records,
                turns,
                truncate_turns_from,
                snapshot,
            },
        )
    }

    /// Publish one journaled action to every subscriber (and its dispatcher).
    pub fn publish(&self, accepted: &Accepted) -> ServerSeq {
        let (origin, conn) = match &accepted.origin {
            Some((o, c)) => (Some(o), Some(c)),
            None => (None, None),
        };
        self.shared
            .publisher
            .publish(&self.uri, &self.hub, &accepted.json, origin, conn)
    }

    /// The journal refused a batch: nobody sees it, dispatchers are told, and
    /// the channel stops taking writes.
    pub fn commit_failed(&mut self, err: JournalError, batch: &[Accepted]) {
        tracing::error!(channel = %self.uri, error = %err, "journal append failed; channel is now read-only");
        let reason = format!("not stored: {err}");
        for a in batch {
            if let Some((o, c)) = &a.origin {
                self.reject(c, o, &a.action, &reason);
            }
        }
        self.store_failed = Some(err.to_string());
    }
}
