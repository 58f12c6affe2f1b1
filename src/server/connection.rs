//! One WebSocket connection: the actor that reads the client's frames,
//! paces them, and hands each message to its method's handler
//! ([`super::routes`]), queueing replies on the connection's [`Outbound`].
//!
//! Requests are handled one at a time per connection (`ctx.wait`), so replies
//! keep request order and a `subscribe` reply always precedes the channel's
//! envelopes after it (the queue is gated while the snapshot is taken).
//! Who may use which channel is decided here ([`Connection::permit`]).

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use bytestring::ByteString;
use serde_json::Value;

use super::admission::Slot;
use super::AppState;
use crate::auth::Principal;
use crate::ids::{ChannelUri, ClientId};
use crate::protocol::methods as m;
use crate::protocol::{self, errors, Incoming, RpcError};
use crate::transport::{
    CloseCause, FlushOnDrop, Inbound, OnGone, Outbound, Push, ReadError, Received,
};

/// Connection state (lives as long as the socket).
pub struct Connection {
    /// The server's state: channels, connection table, rate buckets.
    pub(super) app: Arc<AppState>,
    /// This connection's queue of frames to the client.
    pub(super) out: Arc<Outbound>,
    /// Set by `initialize` or `reconnect`.
    pub(super) client_id: Option<ClientId>,
    /// Channels this connection is subscribed to.
    pub(super) subs: HashSet<ChannelUri>,
    /// Providers this connection registered (it is their agent).
    pub(super) providers: HashSet<String>,
    /// Who is on the connection.
    pub(super) principal: Principal,
    /// `tandem/requestInteraction` calls waiting for their settlement.
    pub(super) open_interactions: usize,
    /// The rate buckets this connection draws on (see [`crate::rate`]):
    /// its token subject's, or its own without authentication.
    pub(super) rates: crate::rate::Rates,
    /// Dispatches and bytes of actions this connection may still send now.
    pub(super) budget: crate::rate::DispatchBudget,
    /// The connection's admission slot, given back when it stops.
    slot: Option<Slot>,
    /// The name its client gave its person (only without authentication;
    /// see `server::people`).
    pub(super) chosen_name: Option<String>,
}

/// Longest single wait of a connection's token-expiry timer; a later expiry
/// re-arms it, so any `exp` (even one far past what a timer holds) works.
const MAX_EXPIRY_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Connection {
    /// Start the actor serving `principal` on `out`, reading `inbound`, in
    /// admission `slot`. Returns what the socket calls once it is gone.
    pub fn start(
        app: Arc<AppState>,
        out: Arc<Outbound>,
        principal: Principal,
        slot: Slot,
        inbound: Inbound,
    ) -> OnGone {
        let (limits, now) = (&app.shared.config.limits, std::time::Instant::now());
        let rates = match &app.auth {
            Some(_) => app.principals.of(&principal.subject, limits, now),
            None => crate::rate::Rates::own(limits, now),
        };
        let budget = crate::rate::DispatchBudget::new(limits, now);
        let principal_name = principal.invite.as_ref().and_then(|g| g.name.clone());
        // This thread serves connections: sessions created here may run here.
        app.shared.homes.serve_here();
        let conn = Connection {
            app,
            out: out.clone(),
            client_id: None,
            subs: HashSet::new(),
            providers: HashSet::new(),
            principal,
            open_interactions: 0,
            rates,
            budget,
            slot: Some(slot),
            chosen_name: principal_name,
        };
        let addr = Connection::create(move |ctx| {
            ctx.add_stream(inbound);
            conn
        });
        Box::new(move || addr.do_send(SocketGone))
    }

    /// Close the socket when the token expires: it was checked only at the
    /// upgrade, and must not outlive its `exp` on an open socket. The time
    /// left is read off the wall clock once, here; from then on the
    /// deadline is on the runtime's clock.
    fn arm_expiry(&mut self, ctx: &mut Context<Self>) {
        let Some(left) = self.principal.expires_in() else {
            return;
        };
        let out = self.out.clone();
        let subject = self.principal.subject.clone();
        let deadline = tokio::time::Instant::now().checked_add(left);
        ctx.spawn(
            async move {
                if close_at_expiry(&out, deadline).await {
                    tracing::info!(conn = %out.id(), %subject, "closing: the token expired");
                }
            }
            .into_actor(self),
        );
    }
}

/// How often a connection that came in through an invite link looks at
/// the link: a revocation (journaled, so on every node) or the link's
/// expiry closes it within this much.
const INVITE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl Connection {
    /// Close the socket once the invite link it came in through is revoked
    /// or expires.
    fn watch_invite(&mut self, ctx: &mut Context<Self>) {
        if self.principal.invite.is_none() {
            return;
        }
        ctx.run_interval(INVITE_CHECK, |act, ctx| {
            let Some(guest) = &act.principal.invite else {
                return;
            };
            let now = crate::auth::now_secs();
            if let Err(closed) = act.app.shared.access.guest_still_open(guest, now) {
                if !act.out.is_closing() {
                    tracing::info!(conn = %act.out.id(), subject = %act.principal.subject, reason = closed.reason(), "closing: the invite link ended");
                    act.out.close(CloseCause::InviteEnded(closed.reason()));
                }
                ctx.stop();
            }
        });
    }
}

/// Close `out` with [`CloseCause::TokenExpired`] once `deadline` passes
/// (`None`: beyond what the clock holds, never). Waits at most
/// [`MAX_EXPIRY_WAIT`] at a time, so any deadline works. `false` when the
/// connection was closing before.
async fn close_at_expiry(out: &Outbound, deadline: Option<tokio::time::Instant>) -> bool {
    let Some(deadline) = deadline else {
        return std::future::pending().await;
    };
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let step = (deadline - now).min(MAX_EXPIRY_WAIT);
        tokio::time::sleep_until(now + step).await;
    }
    if out.is_closing() {
        return false;
    }
    out.close(CloseCause::TokenExpired);
    true
}

impl Actor for Connection {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.arm_expiry(ctx);
        self.watch_invite(ctx);
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        let subs: Vec<ChannelUri> = self.subs.drain().collect();
        for uri in subs {
            if let Some(ch) = self.app.shared.registry.get(&uri) {
                ch.hub.remove(self.out.id());
            }
            self.leave_presence(&uri);
        }
        for p in self.providers.drain() {
            self.app.agents.connection_closed(&p, self.out.id());
        }
        self.slot = None;
        self.out.close(CloseCause::Normal);
        Running::Stop
    }
}

/// The socket is gone (closed or failed).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SocketGone;

impl Handler<SocketGone> for Connection {
    type Result = ();

    fn handle(&mut self, _: SocketGone, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl StreamHandler<Result<Received, ReadError>> for Connection {
    fn handle(&mut self, item: Result<Received, ReadError>, ctx: &mut Self::Context) {
        if self.out.is_closing() && !matches!(item, Ok(Received::Close(_))) {
            // Evicted or closing: whatever the client still sends is not
            // worked on (its answers could not be sent anyway).
            return;
        }
        self.out.received();
        match item {
            Ok(Received::Text(text)) => self.on_text(&text, ctx),
            Ok(Received::Binary) => self.reply_error(
                &Value::Null,
                RpcError::invalid_request(
                    "binary frames are not supported: send one JSON-RPC message per text frame",
                ),
            ),
            Ok(Received::Ping(bytes)) => self.out.push(Push::Pong(bytes)),
            Ok(Received::Pong) => {}
            Ok(Received::Close(reason)) => {
                tracing::debug!(conn = %self.out.id(), ?reason, "client closed");
                self.out
                    .close(CloseCause::ClientClosed(reason.map(|r| r.code.into())));
                ctx.stop();
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::info!(conn = %self.out.id(), %msg, "closing on bad frame");
                self.reply_error(&Value::Null, RpcError::invalid_request(msg));
                self.out.close(e.close_cause());
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Connection {
    /// Answer request `id` (nothing for a notification) with `result`.
    pub(super) fn reply(&self, id: &Option<Value>, result: &Value) {
        if let Some(id) = id {
            self.out
                .push(Push::Response(ByteString::from(protocol::encode_result(
                    id, result,
                ))));
        }
    }

    /// Queue the answer to a `dispatchAction` request `id` (`null`) ahead of
    /// the action's echo, held back so both leave in one write: the reply
    /// goes with the echo or the rejection, whichever thread and however
    /// late that comes, and at the latest when the dispatch is dropped
    /// (see [`crate::channels::DispatchConn`]). `None` for a notification.
    pub(super) fn hold_reply(&self, id: &Option<Value>) -> Option<FlushOnDrop> {
        id.as_ref().map(|id| {
            self.out
                .push_unflushed(Push::Response(ByteString::from(protocol::encode_result(
                    id,
                    &Value::Null,
                ))))
        })
    }

    /// Answer request `id` with an error.
    pub(super) fn reply_error(&self, id: &Value, err: RpcError) {
        tracing::info!(conn = %self.out.id(), code = err.code, error = %err.message, "command refused");
        self.out
            .push(Push::Response(ByteString::from(protocol::encode_error(
                id, &err,
            ))));
    }

    fn on_text(&mut self, text: &str, ctx: &mut Context<Self>) {
        let inc = match protocol::decode(text) {
            Ok(inc) => inc,
            Err((id, err)) => return self.reply_error(&id, err),
        };
        if inc.method.is_empty() {
            // A response to a server request; nothing is awaited yet.
            return;
        }
        if self.client_id.is_none()
            && ![m::INITIALIZE, m::RECONNECT, m::PING].contains(&inc.method.as_str())
        {
            let id = inc.id.clone().unwrap_or(Value::Null);
            return self.reply_error(
                &id,
                RpcError::invalid_request(format!("`{}` before `initialize`: a connection starts with `initialize` or `reconnect`", inc.method)),
            );
        }
        // Past its principal's rate, a connection's next message waits (and
        // nothing more is read from it meanwhile).
        // An edit is paced like the action it becomes (in its handler).
        let request = ![m::DISPATCH_ACTION, m::EDIT_TEXT, m::SET_PRESENCE, m::PING]
            .contains(&inc.method.as_str());
        let delay = self
            .rates
            .pace(text.len(), request, std::time::Instant::now());
        let frame_bytes = text.len();
        if delay.is_zero() {
            self.handle_message(inc, frame_bytes, ctx);
        } else {
            // A timer: the budget refills with time, nothing else tells.
            ctx.wait(
                tokio::time::sleep(delay)
                    .into_actor(self)
                    .map(move |(), act, ctx| act.handle_message(inc, frame_bytes, ctx)),
            );
        }
    }

    fn handle_message(&mut self, inc: Incoming, frame_bytes: usize, ctx: &mut Context<Self>) {
        if self.out.is_closing() {
            return;
        }
        if self.app.shared.cluster.is_some() {
            let unknown: Vec<ChannelUri> = named_channels(&inc)
                .into_iter()
                .filter(|u| !self.app.shared.registry.contains(u))
                .collect();
            if !unknown.is_empty() {
                // Another node may just have made it: fetch it, then answer
                // (later messages wait, so replies keep their order).
                let (shared, root) = (self.app.shared.clone(), self.app.root.clone());
                let fetched = async move {
                    for u in unknown {
                        super::cluster::fetch(shared.clone(), root.clone(), u).await;
                    }
                };
                ctx.wait(
                    fetched
                        .into_actor(self)
                        .map(move |(), act, ctx| act.route_message(inc, frame_bytes, ctx)),
                );
                return;
            }
        }
        self.route_message(inc, frame_bytes, ctx);
    }

    fn route_message(&mut self, inc: Incoming, frame_bytes: usize, ctx: &mut Context<Self>) {
        if self.out.is_closing() {
            return;
        }
        let id = inc.id.clone().unwrap_or(Value::Null);
        if let Err(err) = self.route(inc, frame_bytes, ctx) {
            self.reply_error(&id, err);
        }
    }

    /// The error for a channel that does not exist.
    pub(super) fn not_found(uri: &str) -> RpcError {
        if uri.starts_with("ahp-session:") {
            RpcError::new(errors::SESSION_NOT_FOUND, format!("no session `{uri}`"))
        } else {
            RpcError::new(errors::NOT_FOUND, format!("no channel `{uri}`"))
        }
    }

    /// The session a channel belongs to (a session URI names itself).
    fn session_of(&self, uri: &str) -> Option<ChannelUri> {
        match self.app.shared.registry.session_of(uri) {
            Some(session) => session,
            None if uri.starts_with("ahp-session:") => Some(uri.into()),
            None => None,
        }
    }

    /// `-32009` unless this connection may use the channel's session.
    ///
    /// A scoped token learns nothing about channels outside its scope: a
    /// chat that does not exist is refused exactly like another tenant's
    /// chat, and a session outside the scope likewise, whether it exists or
    /// not. Only an unscoped token is told that a channel does not exist.
    pub(super) fn permit(&self, uri: &str) -> Result<(), RpcError> {
        let denied = |uri: &str| {
            Err(RpcError::new(
                errors::PERMISSION_DENIED,
                format!("this token may not use `{uri}`"),
            ))
        };
        match self.session_of(uri) {
            Some(s) if !self.principal.may_use_session(&s) => denied(uri),
            Some(_) => Ok(()),
            None if uri == ahp_types::ROOT_RESOURCE_URI => Ok(()),
            None if self.principal.is_scoped() => denied(uri),
            None => Ok(()),
        }
    }
}

/// The channels a request names that must exist for it to be answered
/// (not a new session's, nor on the hot paths of actions, edits and
/// presence, which follow a subscription).
fn named_channels(inc: &Incoming) -> Vec<ChannelUri> {
    use crate::protocol::methods as m;
    if [
        m::PING,
        m::INITIALIZE,
        m::CREATE_SESSION,
        m::DISPATCH_ACTION,
        m::EDIT_TEXT,
        m::SET_PRESENCE,
    ]
    .contains(&inc.method.as_str())
    {
        return Vec::new();
    }
    let parsed;
    let v = match &inc.params {
        crate::protocol::Params::Value(v) => v,
        crate::protocol::Params::Raw(raw) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(v) => {
                parsed = v;
                &parsed
            }
            Err(_) => return Vec::new(),
        },
    };
    let mut out = Vec::new();
    let mut add = |u: &Value| {
        if let Some(s) = u
            .as_str()
            .filter(|s| s.starts_with("ahp-session:") || s.starts_with("ahp-chat:"))
        {
            out.push(ChannelUri::from(s));
        }
    };
    if inc.method == m::RECONNECT {
        for u in v["subscriptions"].as_array().into_iter().flatten() {
            add(u);
        }
    } else {
        add(&v["channel"]);
        add(&v["session"]);
    }
    out.truncate(64);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_closed_when_its_token_expires_and_not_before() {
        let out = Arc::new(Outbound::new(1 << 20));
        let lifetime = std::time::Duration::from_secs(3 * 24 * 3600);
        let deadline = tokio::time::Instant::now() + lifetime;
        let expiry = tokio::spawn({
            let out = out.clone();
            async move { close_at_expiry(&out, Some(deadline)).await }
        });
        // The timer's first wait (its longest) is set before time moves.
        tokio::task::yield_now().await;
        // Through two of the timer's longest waits, each ending early, then
        // to a millisecond short of the deadline.
        for _ in 0..2 {
            tokio::time::advance(MAX_EXPIRY_WAIT).await;
            tokio::task::yield_now().await;
            assert!(!out.is_closing(), "open until the token's exp");
        }
        tokio::time::advance(lifetime - 2 * MAX_EXPIRY_WAIT - std::time::Duration::from_millis(1))
            .await;
        tokio::task::yield_now().await;
        assert!(!out.is_closing(), "open until the token's exp");
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(
            expiry.await.expect("the timer ends"),
            "it closed the connection"
        );
        assert_eq!(out.close_cause(), Some(CloseCause::TokenExpired));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_does_not_override_a_close_already_under_way() {
        let out = Outbound::new(1 << 20);
        out.close(CloseCause::Overflow);
        assert!(!close_at_expiry(&out, Some(tokio::time::Instant::now())).await);
        assert_eq!(out.close_cause(), Some(CloseCause::Overflow));
    }
}
