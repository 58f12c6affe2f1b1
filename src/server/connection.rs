//! One WebSocket connection: decode each frame, route it by method and
//! `params.channel`, and queue replies on the connection's [`Outbound`].
//!
//! Requests are handled one at a time per connection (`ctx.wait`), so replies
//! keep request order and a `subscribe` reply always precedes the channel's
//! envelopes after it (the queue is gated while the snapshot is taken).

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use actix_http::body::MessageBody;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use ahp_types::actions::ActionOrigin;
use ahp_types::commands::{
    CreateChatParams, CreateSessionParams, DispatchActionParams, DisposeChatParams,
    DisposeSessionParams, FetchTurnsParams, InitializeParams, ListSessionsParams, ReconnectParams,
    SubscribeParams, UnsubscribeParams,
};
use bytestring::ByteString;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::socket::{Inbound, OutBody, ReadError, Received};
use super::AppState;
use crate::auth::{AuthError, Principal};
use crate::channels::chat::FetchTurns;
use crate::channels::core::Shared;
use crate::channels::registry::ChannelAddr;
use crate::channels::root::{CreateSession, ListSessions, RemoveSession, RootActor};
use crate::channels::session::{CreateChat, ListPending, RemoveChat};
use crate::channels::{ClientDispatch, SnapshotJson, Subscribe};
use crate::protocol::methods::{self as m, decode_params};
use crate::protocol::{self, errors, Incoming, RpcError};
use crate::providers::{Claim, RegisterError};
use crate::publish::outbound::CloseCause;
use crate::publish::{Outbound, Push, Replay};

/// `GET /ahp`: upgrade to a WebSocket and start the connection.
pub async fn ahp_ws(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let shared = &state.shared;
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Err(e) = state.origins.check(
        header(actix_web::http::header::ORIGIN),
        header(actix_web::http::header::HOST),
    ) {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            errors::PERMISSION_DENIED,
            &e.to_string(),
        ));
    }
    let principal = match &shared.auth {
        None => Principal::local(),
        Some(auth) => match bearer_token(&req)
            .ok_or(AuthError::Missing)
            .and_then(|t| auth.verify(&t))
        {
            Ok(p) => p,
            Err(e) => {
                return Ok(refuse(
                    StatusCode::UNAUTHORIZED,
                    errors::AUTH_REQUIRED,
                    &e.to_string(),
                ))
            }
        },
    };
    let limits = &shared.config.limits;
    if shared.connections.len() >= limits.max_connections {
        let msg = format!(
            "the server is at its connection limit ({})",
            limits.max_connections
        );
        return Ok(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            errors::INTERNAL_ERROR,
            &msg,
        ));
    }
    {
        let mut n = shared
            .connections_per_token
            .entry(principal.subject.clone())
            .or_insert(0);
        if *n >= limits.max_connections_per_token {
            let msg = format!(
                "`{}` already has {} connections (the limit)",
                principal.subject, limits.max_connections_per_token
            );
            return Ok(refuse(
                StatusCode::TOO_MANY_REQUESTS,
                errors::INVALID_REQUEST,
                &msg,
            ));
        }
        *n += 1;
    }
    let handshake = match actix_http::ws::handshake(req.head()) {
        Ok(ok) => ok,
        Err(e) => {
            release_token_slot(shared, &principal.subject);
            return Err(e.into());
        }
    };
    let cfg = &state.shared.config;
    let inbound = Inbound::new(body.into_inner(), cfg.max_frame_bytes);
    let out = Arc::new(Outbound::scoped(
        cfg.outbound_limit_bytes,
        principal
            .is_scoped()
            .then(|| principal.sessions.clone())
            .flatten(),
    ));
    state.shared.connections.insert(out.id(), out.clone());
    let rate_key = match &state.shared.auth {
        Some(_) => principal.subject.clone(),
        None => format!("conn:{}", out.id().0),
    };
    let conn = Connection {
        shared: state.shared.clone(),
        root: state.root.clone(),
        out: out.clone(),
        client_id: None,
        subs: HashSet::new(),
        providers: HashSet::new(),
        principal,
        open_interactions: 0,
        rate_key,
        budget: crate::rate::DispatchBudget::new(&cfg.limits, std::time::Instant::now()),
    };
    let addr = Connection::create(move |ctx| {
        ctx.add_stream(inbound);
        conn
    });
    let gone = addr.clone();
    out.set_on_abandon(move || gone.do_send(SocketGone));
    let mut handshake = handshake;
    Ok(handshake
        .message_body(OutBody::new(out, addr, cfg.write_pacing).boxed())?
        .into())
}

/// The bearer token of an upgrade request: `Authorization: Bearer …`, or a
/// `token` query parameter (browsers cannot set headers on WebSockets).
fn bearer_token(req: &HttpRequest) -> Option<String> {
    if let Some(h) = req.headers().get(actix_web::http::header::AUTHORIZATION) {
        return h
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
            .map(|t| t.trim().to_owned());
    }
    req.query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("token=").map(str::to_owned))
}

/// Refuse an upgrade with an HTTP status and a JSON-RPC-shaped error body.
fn refuse(status: StatusCode, code: i32, message: &str) -> HttpResponse {
    tracing::info!(%status, message, "connection refused");
    HttpResponse::build(status)
        .json(serde_json::json!({"error": {"code": code, "message": message}}))
}

fn release_token_slot(shared: &Shared, subject: &str) {
    if let Some(mut n) = shared.connections_per_token.get_mut(subject) {
        *n = n.saturating_sub(1);
    }
}

/// Connection state (lives as long as the socket).
pub struct Connection {
    shared: Arc<Shared>,
    root: Addr<RootActor>,
    out: Arc<Outbound>,
    /// Set by `initialize` or `reconnect`.
    client_id: Option<String>,
    /// Channels this connection is subscribed to.
    subs: HashSet<Arc<str>>,
    /// Providers this connection registered (it is their agent).
    providers: HashSet<String>,
    /// Who is on the connection.
    principal: Principal,
    /// `tandem/requestInteraction` calls waiting for their settlement.
    open_interactions: usize,
    /// Whose rate buckets this connection draws on (see [`crate::rate`]):
    /// the token subject, or the connection itself without authentication.
    rate_key: String,
    /// Dispatches and bytes of actions this connection may still send now.
    budget: crate::rate::DispatchBudget,
}

/// Longest single wait of a connection's token-expiry timer; a later expiry
/// re-arms it, so any `exp` (even one far past what a timer holds) works.
const MAX_EXPIRY_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Connection {
    /// Close the socket when the token expires: it was checked only at the
    /// upgrade, and must not outlive its `exp` on an open socket.
    fn arm_expiry(&mut self, ctx: &mut Context<Self>) {
        let Some(left) = self.principal.expires_in() else {
            return;
        };
        if left.is_zero() {
            tracing::info!(conn = self.out.id().0, subject = %self.principal.subject, "closing: the token expired");
            self.out.close(CloseCause::TokenExpired);
            return;
        }
        ctx.run_later(left.min(MAX_EXPIRY_WAIT), |act, ctx| act.arm_expiry(ctx));
    }
}

impl Actor for Connection {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.arm_expiry(ctx);
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        for uri in self.subs.drain() {
            if let Some(ch) = self.shared.registry.get(&uri) {
                ch.hub.remove(self.out.id());
            }
        }
        for p in self.providers.drain() {
            self.shared.providers.connection_closed(&p, self.out.id());
        }
        release_token_slot(&self.shared, &self.principal.subject);
        if self.shared.auth.is_none() {
            self.shared.principals.forget(&self.rate_key);
        }
        self.shared.connections.remove(&self.out.id());
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
                tracing::debug!(conn = self.out.id().0, ?reason, "client closed");
                self.out
                    .close(CloseCause::ClientClosed(reason.map(|r| r.code.into())));
                ctx.stop();
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::info!(conn = self.out.id().0, %msg, "closing on bad frame");
                self.reply_error(&Value::Null, RpcError::invalid_request(msg));
                self.out.close(e.close_cause());
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// A refused registration as a JSON-RPC error: someone else's id is a
/// permission matter, a taken or built-in one a conflict.
fn register_error(e: RegisterError) -> RpcError {
    let code = match &e {
        RegisterError::NotOwner(_) => errors::PERMISSION_DENIED,
        RegisterError::BuiltIn(_) | RegisterError::Taken(_) => errors::ALREADY_EXISTS,
        RegisterError::TooMany(..) => errors::INVALID_REQUEST,
        RegisterError::Store(..) => return RpcError::internal(e.to_string()),
    };
    RpcError::new(code, e.to_string())
}

/// `tandem/registerProvider` params.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RegisterProviderParams {
    channel: String,
    provider: String,
    display_name: String,
    #[serde(default)]
    description: Option<String>,
}

/// `-32602` unless a provider's display name and description are within
/// their limits: root state carries them to every client.
fn check_provider_texts(
    p: &RegisterProviderParams,
    limits: &crate::config::Limits,
) -> Result<(), RpcError> {
    let over = |field: &str, n: usize, max: usize| {
        Err(RpcError::invalid_params(format!(
            "`{field}` of {n} characters is over the limit of {max}"
        )))
    };
    let name = p.display_name.chars().count();
    if name > limits.max_title_chars {
        return over("displayName", name, limits.max_title_chars);
    }
    let description = p.description.as_deref().map_or(0, |d| d.chars().count());
    if description > limits.max_description_chars {
        return over("description", description, limits.max_description_chars);
    }
    Ok(())
}

/// `tandem/requestInteraction` params.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RequestInteractionParams {
    channel: String,
    turn_id: String,
    interaction: Value,
}

/// Params that name only a channel.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChannelParams {
    channel: String,
}

/// `result` of `initialize`, with snapshots spliced in pre-serialized.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitializeOut<'a> {
    protocol_version: &'a str,
    server_seq: u64,
    server_info: ahp_types::commands::Implementation,
    snapshots: Vec<&'a RawValue>,
}

impl Connection {
    fn reply(&self, id: &Option<Value>, result: &Value) {
        if let Some(id) = id {
            self.out
                .push(Push::Response(ByteString::from(protocol::encode_result(
                    id, result,
                ))));
        }
    }

    fn reply_error(&self, id: &Value, err: RpcError) {
        tracing::debug!(conn = self.out.id().0, code = err.code, message = %err.message, "error reply");
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
        let request = ![m::DISPATCH_ACTION, m::PING].contains(&inc.method.as_str());
        let delay = self.shared.principals.pace(
            &self.rate_key,
            text.len(),
            request,
            &self.shared.config.limits,
            std::time::Instant::now(),
        );
        let frame_bytes = text.len();
        if delay.is_zero() {
            self.handle_message(inc, frame_bytes, ctx);
        } else {
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
        if let Err(err) = self.route(inc, frame_bytes, ctx) {
            let (id, err) = err;
            self.reply_error(&id, err);
        }
    }

    /// Handle one message (`frame_bytes` long); an `Err` is answered with the
    /// id it carries.
    fn route(
        &mut self,
        inc: Incoming,
        frame_bytes: usize,
        ctx: &mut Context<Self>,
    ) -> Result<(), (Value, RpcError)> {
        let Incoming { id, method, params } = inc;
        let eid = id.clone().unwrap_or(Value::Null);
        let fail = |e: RpcError| (eid.clone(), e);
        match method.as_str() {
            m::PING => self.reply(&id, &Value::Null),
            m::INITIALIZE => {
                let p: InitializeParams = decode_params(&method, params).map_err(fail)?;
                self.initialize(id, p, ctx).map_err(fail)?;
            }
            m::RECONNECT => {
                let p: ReconnectParams = decode_params(&method, params).map_err(fail)?;
                self.reconnect(id, p, ctx).map_err(fail)?;
            }
            m::SUBSCRIBE => {
                let p: SubscribeParams = decode_params(&method, params).map_err(fail)?;
                let uri = p.channel.clone();
                self.subscribe_many(
                    vec![uri.clone()],
                    p.view.and_then(|v| v.turns),
                    ctx,
                    move |_, snaps| {
                        let id = id?;
                        let frame = match snaps.into_iter().next() {
                            Some(s) => protocol::encode_raw_result(
                                &id,
                                &format!("{{\"snapshot\":{}}}", s.0),
                            ),
                            // Disposed while we asked.
                            None => protocol::encode_error(&id, &Self::not_found(&uri)),
                        };
                        Some(ByteString::from(frame))
                    },
                )
                .map_err(fail)?;
            }
            m::UNSUBSCRIBE => {
                let p: UnsubscribeParams = decode_params(&method, params).map_err(fail)?;
                if let Some(uri) = self.subs.take(p.channel.as_str()) {
                    if let Some(ch) = self.shared.registry.get(&uri) {
                        ch.hub.remove(self.out.id());
                    }
                }
                self.reply(&id, &Value::Null);
            }
            m::DISPATCH_ACTION => {
                let p: DispatchActionParams = decode_params(&method, params).map_err(fail)?;
                let origin = ActionOrigin {
                    client_id: self.client_id.clone().unwrap_or_default(),
                    client_seq: p.client_seq,
                };
                let shared = self.shared.clone();
                let limits = &shared.config.limits;
                let refused = match self.permit(&p.channel) {
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
                };
                if let Some(reason) = refused {
                    let json = serde_json::to_string(&p.action).unwrap_or_else(|_| "null".into());
                    self.out.push(Push::AfterLastSeq(&|last| {
                        crate::publish::rejection_frame(&p.channel, &json, last, &origin, &reason)
                    }));
                    self.reply(&id, &Value::Null);
                    return Ok(());
                }
                let Some(ch) = self.shared.registry.get(&p.channel) else {
                    // AHP: an action for a channel that does not exist is
                    // ignored; a caller that asked for a reply is told why.
                    tracing::debug!(channel = %p.channel, "action for an unknown channel ignored");
                    if id.is_some() {
                        return Err(fail(Self::not_found(&p.channel)));
                    }
                    return Ok(());
                };
                let as_agent = ch
                    .provider
                    .as_deref()
                    .is_some_and(|p| self.providers.contains(p));
                let msg = ClientDispatch {
                    conn: self.out.clone(),
                    origin,
                    action: p.action,
                    as_agent,
                };
                match ch.addr {
                    ChannelAddr::Chat(a) => a.do_send(msg),
                    ChannelAddr::Session(a) => a.do_send(msg),
                    ChannelAddr::Root(a) => a.do_send(msg),
                }
                self.reply(&id, &Value::Null);
            }
            m::CREATE_SESSION => {
                let p: CreateSessionParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                let fut = self.root.send(CreateSession {
                    uri: p.channel,
                    provider: p.provider,
                    owner: Some((
                        self.principal.subject.clone(),
                        self.shared.config.limits.max_sessions_per_token,
                    )),
                });
                self.await_unit(id, fut, ctx);
            }
            m::DISPOSE_SESSION => {
                let p: DisposeSessionParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                let fut = self.root.send(RemoveSession { uri: p.channel });
                self.await_unit(id, fut, ctx);
            }
            m::LIST_SESSIONS => {
                let p: ListSessionsParams = decode_params(&method, params).map_err(fail)?;
                let fut = self.root.send(ListSessions {
                    scope: match self.principal.role {
                        crate::auth::Role::Admin => None,
                        _ => self.principal.sessions.clone(),
                    },
                    limit: p.limit,
                    cursor: p.cursor,
                });
                ctx.wait(fut.into_actor(self).map(move |res, act, _| {
                    match res
                        .map_err(|e| RpcError::internal(e.to_string()))
                        .and_then(|r| r)
                    {
                        Ok(r) => act.reply(&id, &serde_json::to_value(r).unwrap_or_default()),
                        Err(e) => act.reply_error(&id.unwrap_or_default(), e),
                    }
                }));
            }
            m::CREATE_CHAT => {
                let p: CreateChatParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                if p.source.is_some() {
                    return Err(fail(RpcError::invalid_params(
                        "`source` (fork / side chat) is not supported by this host's agents",
                    )));
                }
                if p.initial_message.is_some() {
                    return Err(fail(RpcError::invalid_params("`initialMessage` is not supported; dispatch `chat/turnStarted` after creating the chat")));
                }
                let Some(ChannelAddr::Session(session)) =
                    self.shared.registry.get(&p.channel).map(|c| c.addr)
                else {
                    return Err(fail(RpcError::new(
                        errors::SESSION_NOT_FOUND,
                        format!("no session `{}`", p.channel),
                    )));
                };
                let fut = session.send(CreateChat { chat: p.chat });
                self.await_unit(id, fut, ctx);
            }
            m::DISPOSE_CHAT => {
                let p: DisposeChatParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                let ch = self
                    .shared
                    .registry
                    .get(&p.channel)
                    .filter(|c| matches!(c.addr, ChannelAddr::Chat(_)));
                let Some(session) = ch
                    .and_then(|c| c.session)
                    .and_then(|s| self.shared.registry.get(&s))
                    .and_then(|s| match s.addr {
                        ChannelAddr::Session(a) => Some(a),
                        _ => None,
                    })
                else {
                    return Err(fail(RpcError::new(
                        errors::NOT_FOUND,
                        format!("no chat `{}`", p.channel),
                    )));
                };
                let fut = session.send(RemoveChat { chat: p.channel });
                self.await_unit(id, fut, ctx);
            }
            m::FETCH_TURNS => {
                let p: FetchTurnsParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                let Some(ChannelAddr::Chat(chat)) =
                    self.shared.registry.get(&p.channel).map(|c| c.addr)
                else {
                    return Err(fail(RpcError::new(
                        errors::NOT_FOUND,
                        format!("no chat `{}`", p.channel),
                    )));
                };
                let (reply, rx) = tokio::sync::oneshot::channel();
                chat.do_send(FetchTurns {
                    cursor: p.cursor,
                    reply,
                });
                ctx.wait(rx.into_actor(self).map(move |res, act, _| {
                    match res
                        .map_err(|_| RpcError::internal("the chat went away"))
                        .and_then(|r| r)
                    {
                        Ok(()) => act.reply(&id, &serde_json::json!({})),
                        Err(e) => act.reply_error(&id.unwrap_or_default(), e),
                    }
                }));
            }
            m::REGISTER_PROVIDER => {
                let p: RegisterProviderParams = decode_params(&method, params).map_err(fail)?;
                self.register_provider(id, p, ctx).map_err(fail)?;
            }
            m::REQUEST_INTERACTION => {
                let max = self
                    .shared
                    .config
                    .limits
                    .max_open_interactions_per_connection;
                if self.open_interactions >= max {
                    return Err(fail(RpcError::invalid_request(format!(
                        "at most {max} interactions may wait on one connection"
                    ))));
                }
                let p: RequestInteractionParams = decode_params(&method, params).map_err(fail)?;
                self.request_interaction(id, p, ctx).map_err(fail)?;
            }
            m::LIST_PENDING => {
                let p: ChannelParams = decode_params(&method, params).map_err(fail)?;
                self.permit(&p.channel).map_err(fail)?;
                let Some(ChannelAddr::Session(session)) =
                    self.shared.registry.get(&p.channel).map(|c| c.addr)
                else {
                    return Err(fail(RpcError::new(
                        errors::SESSION_NOT_FOUND,
                        format!("no session `{}`", p.channel),
                    )));
                };
                let fut = session.send(ListPending);
                ctx.wait(fut.into_actor(self).map(move |res, act, _| match res {
                    Ok(pending) => act.reply(&id, &serde_json::json!({ "pending": pending })),
                    Err(e) => {
                        act.reply_error(&id.unwrap_or_default(), RpcError::internal(e.to_string()))
                    }
                }));
            }
            other => return Err(fail(RpcError::method_not_found(other))),
        }
        Ok(())
    }

    /// Await an actor request answering `Result<(), RpcError>`; reply `null`.
    fn await_unit(
        &mut self,
        id: Option<Value>,
        fut: impl std::future::Future<Output = Result<Result<(), RpcError>, MailboxError>> + 'static,
        ctx: &mut Context<Self>,
    ) {
        ctx.wait(fut.into_actor(self).map(move |res, act, _| {
            match res
                .map_err(|e| RpcError::internal(e.to_string()))
                .and_then(|r| r)
            {
                Ok(()) => act.reply(&id, &Value::Null),
                Err(e) => act.reply_error(&id.unwrap_or_default(), e),
            }
        }));
    }

    /// The session a channel belongs to (a session URI names itself).
    fn session_of(&self, uri: &str) -> Option<Arc<str>> {
        match self.shared.registry.get(uri) {
            Some(c) => c.session,
            None if uri.starts_with("ahp-session:") => Some(uri.into()),
            None => None,
        }
    }

    /// The rejection reason when `action` is a person's act
    /// ([`crate::auth::is_persons_act`]) and this connection speaks for an
    /// agent: it serves a provider, or its token has the `agent` role.
    fn persons_act_refusal(&self, action: &ahp_types::actions::StateAction) -> Option<String> {
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

    /// `-32009` unless this connection may use the channel's session.
    ///
    /// A scoped token learns nothing about channels outside its scope: a
    /// chat that does not exist is refused exactly like another tenant's
    /// chat, and a session outside the scope likewise, whether it exists or
    /// not. Only an unscoped token is told that a channel does not exist.
    fn permit(&self, uri: &str) -> Result<(), RpcError> {
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

    /// Take one dispatch of `bytes` from the connection's and its subject's
    /// budgets.
    fn take_dispatch_token(&mut self, bytes: usize) -> bool {
        self.budget.take(
            &self.shared.principals,
            &self.rate_key,
            bytes,
            &self.shared.config.limits,
            std::time::Instant::now(),
        )
    }

    /// `tandem/registerProvider`. A provider id is bound to the token subject
    /// that first registers it; a new binding is stored before the provider
    /// is registered, so a restart keeps it.
    fn register_provider(
        &mut self,
        id: Option<Value>,
        p: RegisterProviderParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        if !self.principal.may_register_providers() {
            return Err(RpcError::new(
                errors::PERMISSION_DENIED,
                "only an `agent` token may register providers",
            ));
        }
        if p.channel != ahp_types::ROOT_RESOURCE_URI {
            return Err(RpcError::invalid_params(
                "`tandem/registerProvider` targets `ahp-root://`",
            ));
        }
        if p.provider.is_empty() || p.provider.len() > 128 {
            return Err(RpcError::invalid_params(
                "`provider` must be 1 to 128 characters",
            ));
        }
        check_provider_texts(&p, &self.shared.config.limits)?;
        let info = ahp_types::state::AgentInfo {
            provider: p.provider.clone(),
            display_name: p.display_name,
            description: p.description.unwrap_or_default(),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: Some(ahp_types::state::AgentCapabilities {
                multiple_chats: Some(Default::default()),
                multiple_working_directories: None,
            }),
        };
        let claim = self
            .shared
            .providers
            .claim(
                &p.provider,
                &self.principal,
                self.shared.config.limits.max_providers_per_subject,
            )
            .map_err(register_error)?;
        match claim {
            Claim::Owned => {
                self.attach_provider(info)?;
                self.reply(&id, &Value::Null);
            }
            Claim::New => {
                let bind = self
                    .shared
                    .journal
                    .bind_provider(&p.provider, &self.principal.subject);
                ctx.wait(bind.into_actor(self).map(move |stored, act, _| {
                    let done = act
                        .shared
                        .providers
                        .bound(&p.provider, stored, &act.principal)
                        .map_err(register_error)
                        .and_then(|()| act.attach_provider(info));
                    match done {
                        Ok(()) => act.reply(&id, &Value::Null),
                        Err(e) => act.reply_error(&id.unwrap_or_default(), e),
                    }
                }));
            }
        }
        Ok(())
    }

    /// Serve the claimed provider `info` on this connection.
    fn attach_provider(&mut self, info: ahp_types::state::AgentInfo) -> Result<(), RpcError> {
        let provider = info.provider.clone();
        self.shared
            .providers
            .register_remote(
                info,
                self.out.clone(),
                self.principal.clone(),
                self.shared.config.provider_grace,
            )
            .map_err(register_error)?;
        tracing::info!(%provider, conn = self.out.id().0, subject = %self.principal.subject, "provider registered");
        self.providers.insert(provider);
        self.root.do_send(crate::channels::root::AgentsChanged);
        Ok(())
    }

    /// `tandem/requestInteraction`: answered when the interaction settles,
    /// without holding up the connection's other requests.
    fn request_interaction(
        &mut self,
        id: Option<Value>,
        p: RequestInteractionParams,
        ctx: &mut Context<Self>,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let ch =
            self.shared.registry.get(&p.channel).ok_or_else(|| {
                RpcError::new(errors::NOT_FOUND, format!("no chat `{}`", p.channel))
            })?;
        let ChannelAddr::Chat(chat) = ch.addr else {
            return Err(RpcError::invalid_params(format!(
                "`{}` is not a chat",
                p.channel
            )));
        };
        if !ch
            .provider
            .as_deref()
            .is_some_and(|pr| self.providers.contains(pr))
        {
            return Err(RpcError::new(
                errors::PERMISSION_DENIED,
                "only the session's provider connection may request interactions",
            ));
        }
        let interaction: crate::interactions::Interaction =
            serde_json::from_value(p.interaction)
                .map_err(|e| RpcError::invalid_params(format!("invalid `interaction`: {e}")))?;
        if let Some(url) = interaction.url() {
            crate::interactions::link::check(url)
                .map_err(|e| RpcError::invalid_params(e.to_string()))?;
        }
        let asked = match &interaction {
            crate::interactions::Interaction::Form { schema, .. } => {
                crate::interactions::form::questions(schema)
                    .map_err(|e| {
                        RpcError::invalid_params(format!("the form schema is not supported: {e}"))
                    })?
                    .len()
            }
            crate::interactions::Interaction::Input { request, .. } => {
                request.questions.as_ref().map_or(0, Vec::len)
            }
            crate::interactions::Interaction::Url { .. }
            | crate::interactions::Interaction::ToolApproval { .. } => 0,
        };
        let max = self.shared.config.limits.max_questions_per_request;
        if asked > max {
            return Err(RpcError::invalid_params(format!(
                "{asked} questions in one request; the limit is {max} (`max_questions_per_request`)"
            )));
        }
        let handle =
            crate::providers::ChatHandle::new(chat, ch.uri.clone(), p.turn_id, String::new());
        let fut = async move { handle.interact(interaction).await };
        self.open_interactions += 1;
        ctx.spawn(fut.into_actor(self).map(move |settlement, act, _| {
            act.open_interactions -= 1;
            act.reply(&id, &serde_json::to_value(settlement).unwrap_or_default());
        }));
        Ok(())
    }

    fn not_found(uri: &str) -> RpcError {
        if uri.starts_with("ahp-session:") {
            RpcError::new(errors::SESSION_NOT_FOUND, format!("no session `{uri}`"))
        } else {
            RpcError::new(errors::NOT_FOUND, format!("no channel `{uri}`"))
        }
    }

    /// Subscribe to `uris` atomically with respect to this connection's queue:
    /// frames are held until `reply` (built from the snapshots) is queued.
    fn subscribe_many(
        &mut self,
        uris: Vec<String>,
        view_turns: Option<i64>,
        ctx: &mut Context<Self>,
        reply: impl FnOnce(&mut Self, Vec<SnapshotJson>) -> Option<ByteString> + 'static,
    ) -> Result<(), RpcError> {
        let max = self.shared.config.limits.max_subscriptions_per_connection;
        let new = uris
            .iter()
            .filter(|u| !self.subs.contains(u.as_str()))
            .count();
        if self.subs.len() + new > max {
            return Err(RpcError::invalid_request(format!(
                "subscription limit reached: at most {max} channels per connection"
            )));
        }
        let mut channels = Vec::with_capacity(uris.len());
        for uri in &uris {
            self.permit(uri)?;
            let ch = self
                .shared
                .registry
                .get(uri)
                .ok_or_else(|| Self::not_found(uri))?;
            channels.push(ch);
        }
        self.out.gate();
        let conn = self.out.clone();
        let futs = channels.into_iter().map(move |ch| {
            let msg = Subscribe {
                conn: conn.clone(),
                view_turns,
            };
            let uri = ch.uri.clone();
            async move {
                let res = match ch.addr {
                    ChannelAddr::Chat(a) => a.send(msg).await,
                    ChannelAddr::Session(a) => a.send(msg).await,
                    ChannelAddr::Root(a) => a.send(msg).await,
                };
                (uri, res)
            }
        });
        let all = futures_util::future::join_all(futs);
        ctx.wait(all.into_actor(self).map(move |results, act, _| {
            let mut snaps = Vec::new();
            for (uri, res) in results {
                match res {
                    Ok(Ok(s)) => {
                        act.subs.insert(uri);
                        snaps.push(s);
                    }
                    _ => tracing::debug!(%uri, "channel vanished during subscribe"),
                }
            }
            let frame = reply(act, snaps);
            act.out.ungate_with(frame);
        }));
        Ok(())
    }

    fn initialize(
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
        let uris = p.initial_subscriptions.unwrap_or_default();
        for uri in &uris {
            self.permit(uri)?;
            if !self.shared.registry.contains(uri) {
                return Err(Self::not_found(uri));
            }
        }
        // Initialized only once the subscriptions are taken: a refused
        // `initialize` leaves the connection as it was.
        self.client_id = Some(p.client_id);
        let subscribed = self.subscribe_many(uris, None, ctx, move |act, snaps| {
            let raws: Vec<Box<RawValue>> = snaps
                .into_iter()
                .filter_map(|s| RawValue::from_string(s.0).ok())
                .collect();
            let out = InitializeOut {
                protocol_version: &version,
                server_seq: act.out.last_seq().max(act.shared.publisher.current()),
                server_info: ahp_types::commands::Implementation {
                    name: "tandem".into(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                    title: Some("Tandem".into()),
                },
                snapshots: raws.iter().map(|r| r.as_ref()).collect(),
            };
            let json = serde_json::to_string(&out).unwrap_or_else(|_| "null".into());
            id.map(|id| ByteString::from(protocol::encode_raw_result(&id, &json)))
        });
        if subscribed.is_err() {
            self.client_id = None;
        }
        subscribed
    }

    /// `-32602` unless `client_id` is a usable `clientId`.
    fn check_client_id(&self, client_id: &str) -> Result<(), RpcError> {
        let max = self.shared.config.limits.max_client_id_bytes;
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

    fn reconnect(
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
        let max = self.shared.config.limits.max_subscriptions_per_connection;
        let wanted: HashSet<&str> = p.subscriptions.iter().map(String::as_str).collect();
        if wanted.len() > max {
            return Err(RpcError::invalid_request(format!(
                "subscription limit reached: at most {max} channels per connection"
            )));
        }
        self.client_id = Some(p.client_id);
        let mut present = Vec::new();
        let mut missing = Vec::new();
        for uri in p.subscriptions {
            match self.shared.registry.get(&uri) {
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
            let replay = self.shared.publisher.replay_and_subscribe(
                p.last_seen_server_seq as u64,
                &channels,
                &self.out,
                self.shared.config.max_replay_bytes,
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
                return Ok(());
            }
        }
        // Too old (or from before a restart): fresh snapshots. Channels that
        // are gone are simply absent.
        self.out.ungate_with(None);
        let uris = present.iter().map(|c| c.uri.to_string()).collect();
        self.subscribe_many(uris, None, ctx, move |_, snaps| {
            let joined = snaps.into_iter().map(|s| s.0).collect::<Vec<_>>().join(",");
            id.map(|id| {
                ByteString::from(protocol::encode_raw_result(
                    &id,
                    &format!("{{\"type\":\"snapshot\",\"snapshots\":[{joined}]}}"),
                ))
            })
        })
    }
}
