//! Routing: one handler per AHP method, each taking its decoded params.
//!
//! A handler checks what the connection may do (permissions, limits) and
//! asks the channel through [`crate::channels::ChannelAddr`]'s methods; it
//! returns an error to answer at once, or arranges the reply itself when
//! the answer has to wait for an actor. Handlers of the session lifecycle
//! and of subscriptions live in [`super::subscribe`], those of provider
//! connections in [`super::provide`].

use std::future::Future;

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, DispatchActionParams, DisposeChatParams,
    DisposeSessionParams, FetchTurnsParams, ListSessionsParams, SessionConfigCompletionsParams,
    SessionConfigCompletionsResult, UnsubscribeParams,
};
use serde_json::Value;

use super::connection::Connection;
use super::params::ChannelParams;
use crate::channels::addr::SessionOwner;
use crate::channels::forward::{ForwardReply, ForwardRequest};
use crate::channels::{ChannelAddr, DispatchConn};
use crate::protocol::action::decode_dispatch;
use crate::protocol::methods::{self as m, decode_params};
use crate::protocol::{errors, Incoming, RpcError};
use crate::transport::Push;

impl Connection {
    /// Handle one message (`frame_bytes` long); an `Err` is answered at once
    /// with the message's id.
    pub(super) fn route(
        &mut self,
        inc: Incoming,
        frame_bytes: usize,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        let Incoming { id, method, params } = inc;
        let method = method.as_str();
        match method {
            m::PING => {
                self.reply(&id, &Value::Null);
                Ok(())
            }
            m::INITIALIZE => self.initialize(id, decode_params(method, params)?, ctx),
            m::RECONNECT => self.reconnect(id, decode_params(method, params)?, ctx),
            m::SUBSCRIBE => self.subscribe(id, decode_params(method, params)?, ctx),
            m::UNSUBSCRIBE => {
                self.unsubscribe(id, decode_params(method, params)?);
                Ok(())
            }
            m::DISPATCH_ACTION => self.dispatch_action(id, decode_dispatch(params)?, frame_bytes),
            m::CREATE_SESSION => self.create_session(id, decode_params(method, params)?, ctx),
            m::DISPOSE_SESSION => self.dispose_session(id, decode_params(method, params)?, ctx),
            m::LIST_SESSIONS => {
                self.list_sessions(id, decode_params(method, params)?, ctx);
                Ok(())
            }
            m::CREATE_CHAT => self.create_chat(id, decode_params(method, params)?, ctx),
            m::DISPOSE_CHAT => self.dispose_chat(id, decode_params(method, params)?, ctx),
            m::FETCH_TURNS => self.fetch_turns(id, decode_params(method, params)?, ctx),
            m::SESSION_CONFIG_COMPLETIONS => {
                self.config_completions(id, decode_params(method, params)?)
            }
            m::REGISTER_PROVIDER => self.register_provider(id, decode_params(method, params)?, ctx),
            m::REQUEST_INTERACTION => {
                // Refused before its params are even read.
                self.check_interaction_room()?;
                self.request_interaction(id, decode_params(method, params)?, ctx)
            }
            m::LIST_PENDING => self.list_pending(id, decode_params(method, params)?, ctx),
            m::OPEN_TEXT => self.open_text(id, decode_params(method, params)?, ctx),
            m::EDIT_TEXT => self.edit_text(id, decode_params(method, params)?, frame_bytes, ctx),
            m::SET_PRESENCE => self.set_presence(id, decode_params(method, params)?, frame_bytes),
            m::LIST_PRESENCE => {
                let p: ChannelParams = decode_params(method, params)?;
                self.list_presence(id, p.channel)
            }
            m::SET_NAME => self.set_name(id, decode_params(method, params)?),
            m::ACCESS => self.my_access(id, decode_params(method, params)?),
            m::SET_ACCESS => self.set_access(id, decode_params(method, params)?, ctx),
            m::CREATE_INVITE => self.create_invite(id, decode_params(method, params)?, ctx),
            m::REVOKE_INVITE => self.revoke_invite(id, decode_params(method, params)?, ctx),
            m::LIST_INVITES => {
                let p: ChannelParams = decode_params(method, params)?;
                self.list_invites(id, p.channel)
            }
            m::AUDIT_LOG => self.audit_log(id, decode_params(method, params)?, ctx),
            m::NOTIFY_SETTINGS => self.notify_settings(id, decode_params(method, params)?, ctx),
            m::SET_NOTIFY => self.set_notify(id, decode_params(method, params)?, ctx),
            m::PUSH_SUBSCRIBE => self.push_subscribe(id, decode_params(method, params)?, ctx),
            m::PUSH_UNSUBSCRIBE => self.push_unsubscribe(id, decode_params(method, params)?, ctx),
            m::ADD_WEBHOOK => self.add_webhook(id, decode_params(method, params)?, ctx),
            m::LIST_WEBHOOKS => {
                let p: ChannelParams = decode_params(method, params)?;
                self.list_webhooks(id, p.channel, ctx)
            }
            m::REMOVE_WEBHOOK => self.remove_webhook(id, decode_params(method, params)?, ctx),
            other => Err(RpcError::method_not_found(other)),
        }
    }

    /// Reply to `id` once `answer` resolves: with `result` of its value, or
    /// with its error. Later requests wait until then (replies keep order).
    pub(super) fn reply_when<T: 'static>(
        &mut self,
        id: Option<Value>,
        answer: impl Future<Output = Result<T, RpcError>> + 'static,
        ctx: &mut Context<Self>,
        result: impl FnOnce(T) -> Value + 'static,
    ) {
        ctx.wait(answer.into_actor(self).map(move |res, act, _| match res {
            Ok(r) => act.reply(&id, &result(r)),
            Err(e) => act.reply_error(&id.unwrap_or_default(), e),
        }));
    }

    /// `unsubscribe`.
    fn unsubscribe(&mut self, id: Option<Value>, p: UnsubscribeParams) {
        if let Some(uri) = self.subs.take(p.channel.as_str()) {
            if let Some(ch) = self.app.shared.registry.get(&uri) {
                ch.hub.remove(self.out.id());
            }
            self.leave_presence(&uri);
        }
        self.reply(&id, &Value::Null);
    }

    /// `dispatchAction`: refused with a rejection echo when this connection
    /// may not send it now, otherwise handed to the channel, whose echo (or
    /// rejection) follows.
    fn dispatch_action(
        &mut self,
        id: Option<Value>,
        p: DispatchActionParams,
        frame_bytes: usize,
    ) -> Result<(), RpcError> {
        let origin = ActionOrigin {
            client_id: self.client_id.clone().map(String::from).unwrap_or_default(),
            client_seq: p.client_seq,
        };
        if let Some(reason) = self.dispatch_refusal(&p, frame_bytes) {
            self.app.shared.metrics.rejected(&reason);
            tracing::info!(conn = %self.out.id(), channel = %p.channel, client = %origin.client_id, %reason, "action rejected");
            let json = serde_json::to_string(&p.action).unwrap_or_else(|_| "null".into());
            self.out.push(Push::AfterLastSeq(&|last| {
                crate::publish::rejection_frame(&p.channel, &json, last, &origin, &reason)
            }));
            self.reply(&id, &Value::Null);
            return Ok(());
        }
        let Some(ch) = self.app.shared.registry.get(&p.channel) else {
            // AHP: an action for a channel that does not exist is ignored; a
            // caller that asked for a reply is told why.
            tracing::debug!(channel = %p.channel, "action for an unknown channel ignored");
            return match id {
                Some(_) => Err(Self::not_found(&p.channel)),
                None => Ok(()),
            };
        };
        let as_agent = ch
            .provider
            .as_deref()
            .is_some_and(|p| self.providers.contains(p));
        let reply = self.hold_reply(&id);
        let by = if as_agent { None } else { self.person() };
        ch.addr.dispatch(
            DispatchConn::new(self.out.clone(), reply),
            origin,
            p.action,
            as_agent,
            by,
        );
        Ok(())
    }

    /// Why this connection may not dispatch `p` now, if it may not.
    fn dispatch_refusal(&mut self, p: &DispatchActionParams, frame_bytes: usize) -> Option<String> {
        let shared = self.app.shared.clone();
        let limits = &shared.config.limits;
        match self.permit(&p.channel) {
            Err(e) => Some(format!("PermissionDenied: {}", e.message)),
            Ok(()) if frame_bytes > limits.max_action_bytes => Some(format!(
                "too large: a `dispatchAction` of {frame_bytes} bytes is over the limit of {} bytes",
                limits.max_action_bytes
            )),
            Ok(()) => self.persons_act_refusal(&p.action).or_else(|| {
                (!self.take_dispatch_token(frame_bytes)).then(|| {
                    format!(
                        "rate limited: more than {} dispatches or {} bytes of actions per second",
                        limits.dispatches_per_sec, limits.dispatch_bytes_per_sec
                    )
                })
            }),
        }
    }

    /// `createSession`, owned by this connection's token subject.
    fn create_session(
        &mut self,
        id: Option<Value>,
        p: CreateSessionParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let owner = SessionOwner {
            subject: self.principal.subject.clone(),
            max_sessions: self.app.shared.config.limits.max_sessions_per_token,
        };
        let (shared, root) = (self.app.shared.clone(), self.app.root.clone());
        let spread = shared.config.place_sessions == crate::config::Placement::Spread;
        let target = shared.cluster.as_ref().filter(|_| spread).and_then(|link| {
            let to = crate::store::cluster::place(link.node(), &link.loads());
            (to != link.node()).then(|| (link.clone(), to))
        });
        let Some((link, to)) = target else {
            let home = shared.homes.for_new_session();
            let done = root.create_session(p.channel.into(), p.provider, owner, home);
            self.reply_when(id, done, ctx, |()| Value::Null);
            return Ok(());
        };
        // Another node runs fewer sessions: it takes this one, and this
        // node reads it back before answering, so the client can use it at
        // once. One that cannot be reached leaves it here.
        let uri = crate::ids::ChannelUri::from(p.channel.as_str());
        let body = ForwardRequest::CreateSession {
            session: p.channel.clone(),
            provider: p.provider.clone(),
            owner: owner.subject.clone(),
            max_sessions: owner.max_sessions,
        }
        .encode();
        let done = async move {
            let placed = match link.forward_to(&to, body).await {
                Ok(answer) => ForwardReply::decode(&answer).into_result(),
                Err(why) => {
                    tracing::info!(session = %uri, node = %to, reason = %why, "not placed on another node: made here");
                    let home = shared.homes.for_new_session();
                    return root.create_session(uri, p.provider, owner, home).await;
                }
            };
            placed?;
            link.placed(&to);
            tracing::debug!(session = %uri, node = %to, "placed on the node that runs fewest sessions");
            super::cluster::fetch(shared, root, uri).await;
            Ok(())
        };
        self.reply_when(id, done, ctx, |()| Value::Null);
        Ok(())
    }

    /// `disposeSession`.
    fn dispose_session(
        &mut self,
        id: Option<Value>,
        p: DisposeSessionParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let done = self
            .app
            .root
            .dispose_session(p.channel.into(), self.person());
        self.reply_when(id, done, ctx, |()| Value::Null);
        Ok(())
    }

    /// `listSessions`: a scoped token sees its own sessions only.
    fn list_sessions(&mut self, id: Option<Value>, p: ListSessionsParams, ctx: &mut Context<Self>) {
        let scope = match self.principal.role {
            crate::auth::Role::Admin => None,
            _ => self.principal.sessions.clone(),
        };
        let page = self.app.root.list_sessions(scope, p.limit, p.cursor);
        self.reply_when(id, page, ctx, |r| {
            serde_json::to_value(r).unwrap_or_default()
        });
    }

    /// `createChat` in a session.
    fn create_chat(
        &mut self,
        id: Option<Value>,
        p: CreateChatParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        if p.source.is_some() {
            return Err(RpcError::invalid_params(
                "`source` (fork / side chat) is not supported by this host's agents",
            ));
        }
        if p.initial_message.is_some() {
            return Err(RpcError::invalid_params("`initialMessage` is not supported; dispatch `chat/turnStarted` after creating the chat"));
        }
        let (chat, by) = (p.chat.into(), self.person());
        let done = self.ask(&p.channel, |c| c.create_chat(chat, by), no_session)?;
        self.reply_when(id, done, ctx, |()| Value::Null);
        Ok(())
    }

    /// `disposeChat`, asked of the chat's session.
    fn dispose_chat(
        &mut self,
        id: Option<Value>,
        p: DisposeChatParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let registry = &self.app.shared.registry;
        let done = registry
            .get(&p.channel)
            .filter(|c| c.addr.is_chat())
            .and_then(|c| c.session)
            .and_then(|s| registry.get(&s))
            .and_then(|s| s.addr.remove_chat(p.channel.as_str().into(), self.person()))
            .ok_or_else(|| no_chat(&p.channel))?;
        self.reply_when(id, done, ctx, |()| Value::Null);
        Ok(())
    }

    /// `fetchTurns`: answered once the older turns are published.
    fn fetch_turns(
        &mut self,
        id: Option<Value>,
        p: FetchTurnsParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let done = self.ask(&p.channel, |c| c.fetch_turns(p.cursor), no_chat)?;
        self.reply_when(id, done, ctx, |()| serde_json::json!({}));
        Ok(())
    }

    /// `sessionConfigCompletions`: the values a dynamic config property of
    /// a session may take (an ACP agent's modes or models), filtered by the
    /// query. Choices exist per session, so a query on root finds none.
    fn config_completions(
        &mut self,
        id: Option<Value>,
        p: SessionConfigCompletionsParams,
    ) -> Result<(), RpcError> {
        let channel = p.channel.as_str();
        let mut items = Vec::new();
        if channel != ahp_types::ROOT_RESOURCE_URI {
            self.permit(channel)?;
            let Some(ch) = self.app.shared.registry.get(channel) else {
                return Err(Self::not_found(channel));
            };
            let agent = ch
                .provider
                .as_deref()
                .and_then(|p| self.app.shared.providers.get(p));
            if let Some(agent) = agent {
                items = agent
                    .config_choices(channel, &p.property)
                    .unwrap_or_default();
            }
        }
        if let Some(q) = p.query.as_deref().map(str::to_lowercase) {
            items.retain(|i| {
                i.value.to_lowercase().contains(&q) || i.label.to_lowercase().contains(&q)
            });
        }
        let result = SessionConfigCompletionsResult { items };
        self.reply(&id, &serde_json::to_value(result).unwrap_or(Value::Null));
        Ok(())
    }

    /// `tandem/listPending`: a session's unsettled interactions.
    fn list_pending(
        &mut self,
        id: Option<Value>,
        p: ChannelParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let pending = self.ask(&p.channel, ChannelAddr::list_pending, no_session)?;
        self.reply_when(
            id,
            pending,
            ctx,
            |pending| serde_json::json!({ "pending": pending }),
        );
        Ok(())
    }

    /// What `ask` makes of channel `uri`'s address, or `missing(uri)` when
    /// there is no such channel or it is not the kind that answers `ask`.
    pub(super) fn ask<T>(
        &self,
        uri: &str,
        ask: impl FnOnce(&ChannelAddr) -> Option<T>,
        missing: fn(&str) -> RpcError,
    ) -> Result<T, RpcError> {
        let channel = self.app.shared.registry.get(uri);
        channel
            .and_then(|c| ask(&c.addr))
            .ok_or_else(|| missing(uri))
    }

    /// The rejection reason when `action` is a person's act
    /// ([`crate::auth::is_persons_act`]) and this connection speaks for an
    /// agent: it serves a provider, or its token has the `agent` role.
    pub(super) fn persons_act_refusal(&self, action: &StateAction) -> Option<String> {
        if !crate::auth::is_persons_act(action) {
            return None;
        }
        let why = if !self.providers.is_empty() {
            "this connection serves a provider"
        } else {
            match self.principal.role {
                crate::auth::Role::Agent => "this connection's token has the `agent` role",
                crate::auth::Role::Client | crate::auth::Role::Admin => return None,
            }
        };
        Some(format!(
            "PermissionDenied: `{}` is a person's act: only client connections may send it, and {why}",
            crate::channels::validate::action_type(action)
        ))
    }

    /// Take one dispatch of `bytes` from the connection's and its subject's
    /// budgets.
    pub(super) fn take_dispatch_token(&mut self, bytes: usize) -> bool {
        self.budget
            .take(&self.rates, bytes, std::time::Instant::now())
    }
}

/// The answer for a session that is not there (or not a session).
pub(super) fn no_session(uri: &str) -> RpcError {
    RpcError::new(errors::SESSION_NOT_FOUND, format!("no session `{uri}`"))
}

/// The answer for a chat that is not there (or not a chat).
pub(super) fn no_chat(uri: &str) -> RpcError {
    RpcError::new(errors::NOT_FOUND, format!("no chat `{uri}`"))
}
