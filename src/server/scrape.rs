//! `GET /metrics`: the Prometheus text exposition of [`crate::metrics`],
//! with the figures the server keeps (connections, subscriptions, channels,
//! agents) read at the scrape. When auth is on it takes an `admin` token as
//! `Authorization: Bearer …` (what Prometheus' `authorization` setting
//! sends); never in the URL, where proxies and logs would keep it.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use super::AppState;
use crate::auth::Role;
use crate::metrics::Readings;

/// How often histogram samples are folded into their buckets when nobody
/// scrapes.
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a scrape is refused, if it is.
pub(super) fn refusal(req: &HttpRequest, state: &AppState) -> Option<HttpResponse> {
    let auth = state.auth.as_ref()?;
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let refuse = |status: actix_web::http::StatusCode, why: &str| {
        Some(
            HttpResponse::build(status)
                .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                .body(format!("{why}\n")),
        )
    };
    let Some(token) = token else {
        return refuse(
            actix_web::http::StatusCode::UNAUTHORIZED,
            "an admin token is required (Authorization: Bearer …)",
        );
    };
    match auth.verify(token) {
        Ok(p) if p.role == Role::Admin => None,
        Ok(_) => refuse(
            actix_web::http::StatusCode::FORBIDDEN,
            "only an admin token may read the server's metrics",
        ),
        Err(e) => refuse(actix_web::http::StatusCode::UNAUTHORIZED, &e.to_string()),
    }
}

/// `GET /metrics`.
pub(super) async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Some(refused) = refusal(&req, &state) {
        return refused;
    }
    let shared = &state.shared;
    let (mut sessions, mut chats, mut subscriptions) = (0, 0, 0);
    for c in shared.registry.all() {
        subscriptions += c.hub.len();
        if c.addr.is_chat() {
            chats += 1;
        } else if c.session.is_some() {
            sessions += 1;
        }
    }
    let (providers_connected, agent_processes) = state.agents.alive();
    let body = shared.metrics.render(Readings {
        connections: state.connections.open_len(),
        subscriptions,
        sessions,
        chats,
        providers_connected,
        agent_processes,
        replay_ring_bytes: shared.publisher.ring_bytes(),
    });
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(body)
}
