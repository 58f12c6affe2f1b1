//! `GET /ahp`: the checks an upgrade passes before it becomes a
//! connection — the page's origin, the bearer token, a connection slot —
//! then the WebSocket handshake and the start of the connection actor.
//!
//! A refusal is an HTTP status with a JSON-RPC-shaped error body, so a
//! client that cannot read close frames still learns why.

use std::sync::Arc;

use actix_http::body::MessageBody;
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};

use super::admission::Refused;
use super::connection::Connection;
use super::inbound::Inbound;
use super::socket::OutBody;
use super::AppState;
use crate::auth::{AuthError, Principal};
use crate::protocol::errors;
use crate::publish::Outbound;

/// `GET /ahp`: upgrade to a WebSocket and start the connection.
pub async fn ahp_ws(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, actix_web::Error> {
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Err(e) = state
        .origins
        .check(header(header::ORIGIN), header(header::HOST))
    {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            errors::PERMISSION_DENIED,
            &e.to_string(),
        ));
    }
    let principal = match &state.auth {
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
    // Reserved before the handshake; a failed one drops (frees) the slot.
    let mut slot = match state.connections.admit(&principal.subject) {
        Ok(slot) => slot,
        Err(e @ Refused::Full(_)) => {
            return Ok(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                errors::INTERNAL_ERROR,
                &e.to_string(),
            ))
        }
        Err(e @ Refused::SubjectFull(..)) => {
            return Ok(refuse(
                StatusCode::TOO_MANY_REQUESTS,
                errors::INVALID_REQUEST,
                &e.to_string(),
            ))
        }
    };
    let mut handshake = actix_http::ws::handshake(req.head())?;
    let cfg = &state.shared.config;
    let (pacing, inbound) = (
        cfg.write_pacing,
        Inbound::new(body.into_inner(), cfg.max_frame_bytes),
    );
    let out = Arc::new(Outbound::scoped(
        cfg.outbound_limit_bytes,
        principal
            .is_scoped()
            .then(|| principal.sessions.clone())
            .flatten(),
    ));
    slot.open(out.clone());
    let on_gone = Connection::start(state.into_inner(), out.clone(), principal, slot, inbound);
    Ok(handshake
        .message_body(OutBody::new(out, on_gone, pacing).boxed())?
        .into())
}

/// The bearer token of an upgrade request: `Authorization: Bearer …`, or a
/// `token` query parameter (browsers cannot set headers on WebSockets).
fn bearer_token(req: &HttpRequest) -> Option<String> {
    if let Some(h) = req.headers().get(header::AUTHORIZATION) {
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
