//! `GET /admin/overview`: what the admin view in the web client shows —
//! the open connections (subject, client, subscriptions, queued bytes) and
//! the sessions, each with the requests waiting for a person and how long
//! they have waited. An `admin` token when auth is on, as for `/metrics`.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::scrape::refusal;
use super::AppState;
use crate::ids::ConnId;
use crate::transport::cause_name;

/// `GET /admin/overview`.
pub(super) async fn overview(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Some(refused) = refusal(&req, &state) {
        return refused;
    }
    let shared = &state.shared;
    let channels = shared.registry.all();
    // Subscriptions per connection, from every channel's subscribers.
    let mut subscriptions: HashMap<ConnId, usize> = HashMap::new();
    for c in &channels {
        for id in c.hub.ids() {
            *subscriptions.entry(id).or_default() += 1;
        }
    }
    let mut connections: Vec<Value> = state
        .connections
        .list()
        .iter()
        .map(|c| {
            let id = c.out.id();
            let person = c.person.lock().clone();
            let (client_id, name) = person.unzip();
            json!({
                "conn": id.to_string(),
                "subject": c.subject,
                "role": c.role.as_str(),
                "clientId": client_id,
                "name": name,
                "invite": c.invite,
                "subscriptions": subscriptions.get(&id).copied().unwrap_or(0),
                "queuedBytes": c.out.queued_bytes(),
                "openSecs": c.since.elapsed().as_secs(),
                // Why the server is closing it, until its close is written
                // (a client that reads nothing is evicted long before it
                // learns why).
                "closing": c.out.close_cause().map(|cause| cause_name(&cause)),
            })
        })
        .collect();
    connections.sort_by(|a, b| b["openSecs"].as_u64().cmp(&a["openSecs"].as_u64()));

    let mut waiting_by_session: HashMap<String, Vec<Value>> = HashMap::new();
    for w in shared.metrics.waiting() {
        waiting_by_session
            .entry(w.session.clone())
            .or_default()
            .push(json!({
                "chat": w.chat,
                "id": w.id,
                "kind": w.kind.as_str(),
                "title": w.title,
                "waitingSecs": w.since.elapsed().as_secs_f64(),
            }));
    }
    let mut chats: HashMap<&str, usize> = HashMap::new();
    for c in channels.iter().filter(|c| c.addr.is_chat()) {
        if let Some(s) = &c.session {
            *chats.entry(s.as_ref()).or_default() += 1;
        }
    }
    let now = crate::auth::now_secs();
    let mut sessions: Vec<Value> = channels
        .iter()
        .filter(|c| !c.addr.is_chat() && c.session.as_ref() == Some(&c.uri))
        .map(|c| {
            let waiting = waiting_by_session
                .remove(c.uri.as_ref())
                .unwrap_or_default();
            let members = shared.access.get(&c.uri);
            let invites = shared.access.invites_of(&c.uri);
            let open = invites
                .iter()
                .filter(|(_, i)| i.ended(now).is_none())
                .count();
            json!({
                "session": c.uri,
                "provider": c.provider.as_deref(),
                "members": members.members,
                "openInvites": open,
                "chats": chats.get(c.uri.as_ref()).copied().unwrap_or(0),
                "subscribers": c.hub.len(),
                "waiting": waiting,
            })
        })
        .collect();
    // The sessions someone waits on first, the longest wait first.
    let longest = |s: &Value| s["waiting"][0]["waitingSecs"].as_f64().unwrap_or(-1.0);
    sessions.sort_by(|a, b| longest(b).total_cmp(&longest(a)));
    let notify = notifications(&state).await;
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(json!({
            "connections": connections,
            "sessions": sessions,
            "notify": notify,
            "serverSeq": shared.publisher.current(),
        }))
}

/// The webhooks with their last delivery, and Web Push: whether it is on
/// and how many people and browsers registered. A webhook shows only its
/// scheme and host: the rest of a URL is often its secret (Slack's are).
async fn notifications(state: &AppState) -> Value {
    let notify = &state.shared.notify;
    let webhooks: Vec<Value> = notify
        .webhooks()
        .into_iter()
        .map(|(spec, last)| {
            json!({
                "name": spec.name,
                "target": format!("{}://{}", spec.url.scheme(), spec.url.host_str().unwrap_or_default()),
                "format": spec.format,
                "only": spec.only,
                "sessions": spec.sessions,
                "signed": spec.secret.is_some(),
                "last": last,
            })
        })
        .collect();
    let push = match notify.book().cloned() {
        None => json!({"on": false}),
        Some(book) => match web::block(move || book.holders()).await {
            Ok(Ok(holders)) => json!({
                "on": true,
                "people": holders.len(),
                "devices": holders.iter().map(|h| h.devices.len()).sum::<usize>(),
            }),
            Ok(Err(e)) => json!({"on": true, "error": e.to_string()}),
            Err(e) => json!({"on": true, "error": e.to_string()}),
        },
    };
    json!({"webhooks": webhooks, "webPush": push})
}
