//! `GET /ahp`: the checks an upgrade passes before it becomes a
//! connection — the page's origin, the bearer token, a connection slot —
//! then the WebSocket handshake and the start of the connection actor.
//!
//! A refusal is an HTTP status with a JSON-RPC-shaped error body, so a
//! client that cannot read close frames still learns why.
//!
//! The HTTP/1 dispatcher hands every WebSocket upgrade to [`serve`] with its
//! socket; from then on the socket is ours ([`Upgraded`]), and the
//! dispatcher and its buffers are gone.

use std::io;
use std::sync::Arc;

use actix_codec::Framed;
use actix_http::body::{BodySize, BoxBody};
use actix_http::{h1, ConnectionType, Request, RequestHead, Response};
use actix_web::http::{header, StatusCode};
use actix_web::rt::net::TcpStream;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::SinkExt;

use super::admission::{Refused, Slot};
use super::connection::Connection;
use super::AppState;
use crate::auth::{AuthError, Principal};
use crate::invites::{guest_subject, guest_tag, parse_code, Closed, Guest};
use crate::protocol::errors;
use crate::transport::{Outbound, Upgraded};

/// A WebSocket upgrade handed over by the HTTP/1 dispatcher with its
/// socket: `/ahp` becomes a connection (after [`admit`]); any other path is
/// not found.
pub async fn serve(
    state: Arc<AppState>,
    req: Request,
    mut framed: Framed<TcpStream, h1::Codec>,
) -> io::Result<()> {
    let head = req.head();
    if head.uri.path() != "/ahp" {
        let res = refuse(
            StatusCode::NOT_FOUND,
            errors::INVALID_REQUEST,
            "no WebSocket endpoint here: connect to /ahp",
        );
        return respond(framed, res.into()).await;
    }
    let (principal, mut slot) = match admit(head, &state) {
        Ok(admitted) => admitted,
        Err(refusal) => return respond(framed, refusal.response().into()).await,
    };
    if let Some(guest) = &principal.invite {
        // A guest's first arrival is a use of the link, stored before the
        // socket opens (so a link's last use goes to one person only).
        if let Err(refusal) = use_invite(&state, guest, &principal).await {
            return respond(framed, refusal.response().into()).await;
        }
    }
    let res = match actix_http::ws::handshake(head) {
        Ok(mut res) => res.finish(),
        Err(e) => return respond(framed, e.into()).await,
    };
    framed
        .send(h1::Message::Item((res.drop_body(), BodySize::None)))
        .await?;
    let upgraded = Upgraded::take_over(framed, state.shared.metrics.clone());
    let peer = upgraded.peer();
    state.shared.metrics.connections_opened.increment(1);
    let cfg = &state.shared.config;
    let (pacing, limit) = (cfg.write_pacing, cfg.max_frame_bytes);
    let out = Arc::new(Outbound::scoped(
        cfg.outbound_limit_bytes,
        principal
            .is_scoped()
            .then(|| principal.sessions.clone())
            .flatten(),
    ));
    let (inbound, writer) = upgraded.serve(&out, pacing, limit);
    slot.open(out.clone(), &principal);
    tracing::info!(
        conn = %out.id(),
        subject = %principal.subject,
        role = principal.role.as_str(),
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        "connection opened"
    );
    let on_gone = Connection::start(state, out, principal, slot, inbound);
    writer.spawn(on_gone);
    Ok(())
}

/// `GET /ahp` without an upgrade: the same checks, then the handshake's
/// refusal (it is not a WebSocket request).
pub async fn ahp_plain(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    if let Err(refusal) = admit(req.head(), &state) {
        return Ok(refusal.response());
    }
    actix_http::ws::verify_handshake(req.head())?;
    Ok(refuse(
        StatusCode::BAD_REQUEST,
        errors::INVALID_REQUEST,
        "not a WebSocket upgrade",
    ))
}

/// The checks an upgrade passes: the page's origin, the bearer token, a
/// connection slot (reserved now; dropping it frees it).
fn admit(head: &RequestHead, state: &AppState) -> Result<(Principal, Slot), Refusal> {
    let header = |name| head.headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(e) = state
        .origins
        .check(header(header::ORIGIN), header(header::HOST))
    {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            errors::PERMISSION_DENIED,
            e.to_string(),
        ));
    }
    let invite = query_param(head, "invite");
    let principal = match (&state.auth, invite) {
        (_, Some(code)) => invite_principal(head, state, &code)?,
        (None, None) => Principal::local(),
        (Some(auth), None) => match bearer_token(head)
            .ok_or(AuthError::Missing)
            .and_then(|t| auth.verify(&t))
        {
            Ok(p) => p,
            Err(e) => {
                return Err(Refusal(
                    StatusCode::UNAUTHORIZED,
                    errors::AUTH_REQUIRED,
                    e.to_string(),
                ))
            }
        },
    };
    match state.connections.admit(&principal.subject) {
        Ok(slot) => Ok((principal, slot)),
        Err(e @ Refused::Full(_)) => Err(Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            errors::INTERNAL_ERROR,
            e.to_string(),
        )),
        Err(e @ Refused::SubjectFull(..)) => Err(Refusal(
            StatusCode::TOO_MANY_REQUESTS,
            errors::INVALID_REQUEST,
            e.to_string(),
        )),
    }
}

/// The principal of a guest coming in through the invite link `code`
/// (`guest=` names their device, `name=` may give their name).
fn invite_principal(
    head: &RequestHead,
    state: &AppState,
    code: &str,
) -> Result<Principal, Refusal> {
    let refused = |c: Closed| {
        Refusal(
            StatusCode::FORBIDDEN,
            errors::PERMISSION_DENIED,
            c.reason().to_owned(),
        )
    };
    let (id, digest) = parse_code(code).ok_or(refused(Closed::Unknown))?;
    let (session, invite) = state
        .shared
        .access
        .invite(id)
        .ok_or(refused(Closed::Unknown))?;
    let device = query_param(head, "guest")
        .filter(|g| (8..=128).contains(&g.len()))
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let tag = guest_tag(&device);
    invite
        .admits(&digest, &tag, crate::auth::now_secs())
        .map_err(refused)?;
    let guest = Guest {
        id: id.to_owned(),
        session,
        digest,
        tag,
        access: invite.access,
        name: query_param(head, "name").and_then(|n| crate::people::clean_name(&n)),
    };
    Ok(guest_principal(guest))
}

/// The principal a guest's connection speaks for: one session, the link's
/// role in it, under the guest's own subject.
fn guest_principal(guest: Guest) -> Principal {
    let session = guest.session.to_string();
    Principal {
        subject: guest_subject(&guest.id, &guest.tag),
        role: crate::auth::Role::Client,
        sessions: Some(Arc::new([session.clone()].into())),
        expires_at_secs: None,
        name: None,
        access: Arc::new([(session, guest.access)].into()),
        invite: Some(Arc::new(guest)),
    }
}

/// Record a guest's arrival with their link's session (a guest coming back
/// changes nothing).
async fn use_invite(state: &AppState, guest: &Guest, principal: &Principal) -> Result<(), Refusal> {
    let failed = |e: crate::protocol::RpcError| {
        let status = if e.code == errors::PERMISSION_DENIED {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        Refusal(status, e.code, e.message)
    };
    let by = crate::people::Person {
        name: guest.name.clone().unwrap_or_else(|| "guest".to_owned()),
        subject: principal.subject.clone(),
        client_id: guest.tag.clone(),
        standing: Default::default(),
    };
    let op = crate::channels::session::InviteOp::Use {
        id: guest.id.clone(),
        digest: guest.digest.clone(),
        guest: guest.tag.clone(),
    };
    let done = state
        .shared
        .registry
        .get(&guest.session)
        .and_then(|c| c.addr.invites(op, Some(by)))
        .ok_or_else(|| failed(super::routes::no_session(&guest.session)))?;
    done.await.map(drop).map_err(failed)
}

/// A query parameter of the upgrade, percent-decoded.
fn query_param(head: &RequestHead, name: &str) -> Option<String> {
    let query = head.uri.query()?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Why an upgrade is refused: the HTTP status, the JSON-RPC error code and
/// the message of the body.
struct Refusal(StatusCode, i32, String);

impl Refusal {
    fn response(&self) -> HttpResponse {
        refuse(self.0, self.1, &self.2)
    }
}

/// Answer an upgrade with `res` and close the connection.
async fn respond(
    mut framed: Framed<TcpStream, h1::Codec>,
    res: Response<BoxBody>,
) -> io::Result<()> {
    let (mut res, body) = res.into_parts();
    let body = actix_http::body::to_bytes(body).await.unwrap_or_default();
    res.head_mut().set_connection_type(ConnectionType::Close);
    // Head and body go out in one write: some clients (tungstenite) read a
    // refused upgrade's body only when it arrives with the head.
    framed
        .feed(h1::Message::Item((res, BodySize::Sized(body.len() as u64))))
        .await?;
    if !body.is_empty() {
        framed.feed(h1::Message::Chunk(Some(body))).await?;
    }
    framed.send(h1::Message::Chunk(None)).await?;
    framed.close().await
}

/// The bearer token of an upgrade request: `Authorization: Bearer …`, or a
/// `token` query parameter (browsers cannot set headers on WebSockets).
fn bearer_token(head: &RequestHead) -> Option<String> {
    if let Some(h) = head.headers.get(header::AUTHORIZATION) {
        return h
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
            .map(|t| t.trim().to_owned());
    }
    head.uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("token=").map(str::to_owned))
}

/// Refuse an upgrade with an HTTP status and a JSON-RPC-shaped error body.
fn refuse(status: StatusCode, code: i32, message: &str) -> HttpResponse {
    tracing::info!(%status, message, "connection refused");
    HttpResponse::build(status)
        .json(serde_json::json!({"error": {"code": code, "message": message}}))
}
