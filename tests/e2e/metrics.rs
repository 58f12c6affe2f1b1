//! `GET /metrics` after a known workload: the counters say what the test
//! did (actions accepted and refused by class, an eviction, interactions by
//! kind and outcome, reconnects, journal commits), the whole exposition
//! parses as Prometheus text, and only an admin token may read it.

use crate::common;

use std::collections::HashMap;

use ahp_types::actions::{ActionEnvelope, StateAction};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::{Config, Limits};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &[u8] = b"metrics-test-secret-0123456789abcdef";

fn token(sub: &str, role: Role, sessions: Option<Vec<String>>) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role,
            exp: now_secs() + 600,
            sessions,
            ..Default::default()
        })
        .expect("mint")
}

/// `/metrics` with `token` (if any): status line and body.
async fn scrape(server: &TestServer, token: Option<&str>) -> (String, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    let (status, _, body) = http_with(server.addr, "GET", "/metrics", &headers).await;
    (status, String::from_utf8(body).expect("UTF-8"))
}

/// The samples of an exposition by name and labels (`name{k="v",…}`,
/// labels sorted), parsed with `prometheus-parse`; also its documented names.
fn samples(text: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    let mut out = HashMap::new();
    for s in &scrape.samples {
        let mut labels: Vec<(String, String)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.sort();
        let key = if labels.is_empty() {
            s.metric.clone()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            format!("{}{{{}}}", s.metric, l.join(","))
        };
        let v = match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => {
                // Bucket series are named with `le`; keep the `+Inf` count.
                h.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            prometheus_parse::Value::Summary(_) => continue,
        };
        out.insert(key, v);
    }
    (out, scrape.docs)
}

/// What one client dispatched and saw answered.
#[derive(Default)]
struct Tally {
    accepted: usize,
    rejected: Vec<String>,
}

impl Tally {
    /// Dispatch and wait for the echo; note whether it was accepted.
    async fn send(
        &mut self,
        c: &mut TestClient,
        m: &mut ChatMirror,
        chat: &str,
        a: StateAction,
    ) -> ActionEnvelope {
        let seq = c.dispatch(chat, a).await;
        let echo = c.wait_echo(Some(m), seq).await;
        match &echo.rejection_reason {
            Some(r) => self.rejected.push(r.clone()),
            None => self.accepted += 1,
        }
        echo
    }

    fn rejected_starting(&self, prefix: &str) -> usize {
        self.rejected
            .iter()
            .filter(|r| r.starts_with(prefix))
            .count()
    }
}

fn is_open_tool(e: &ActionEnvelope) -> Option<(String, String)> {
    match &e.action {
        StateAction::ChatToolCallReady(r) if r.confirmed.is_none() => {
            Some((r.turn_id.clone(), r.tool_call_id.clone()))
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_a_known_workload_did_and_parse_as_prometheus_text() {
    let dir = temp_dir("metrics");
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        data_dir: Some(dir.join("data")),
        max_frame_bytes: 64 * 1024,
        limits: Limits {
            dispatches_per_sec: 5.0,
            dispatch_burst: 10.0,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let client_token = token("ann", Role::Client, None);
    let admin = token("ops", Role::Admin, None);
    let url = |t: &str| format!("{}?token={t}", server.url());

    // Only an admin reads the metrics.
    let (status, _) = scrape(&server, None).await;
    assert!(status.contains("401"), "{status}");
    let (status, _) = scrape(&server, Some(&client_token)).await;
    assert!(status.contains("403"), "{status}");
    let (status, _) = scrape(&server, Some("not-a-token")).await;
    assert!(status.contains("401"), "{status}");

    let mut c = TestClient::connect(&url(&client_token), "ann").await;
    let (session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    let mut tally = Tally::default();
    // Spread the workload out: the dispatch budget is 5 per second, and
    // steps at most 4 a second stay within it (slower only spends less).
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(250));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pace.tick().await;

    // Two questions: one answered, one declined; a URL: cancelled.
    for (spec, response) in [
        (
            json!({"questions": [{"kind": "text", "id": "q", "message": "Why?"}]}),
            "accept",
        ),
        (
            json!({"questions": [{"kind": "text", "id": "q", "message": "Where?"}]}),
            "decline",
        ),
        (
            json!({"message": "Sign in", "url": "https://example.com/login"}),
            "cancel",
        ),
    ] {
        let text = format!("/ask {spec}");
        let turn = uuid::Uuid::new_v4().to_string();
        tally
            .send(&mut c, &mut m, &chat, turn_started(&turn, &text))
            .await;
        c.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
        let rid = open_request_id(&m.state).expect("request");
        pace.tick().await;
        let done = json!({"type": "chat/inputCompleted", "requestId": rid, "response": response});
        let echo = tally.send(&mut c, &mut m, &chat, action(done)).await;
        assert!(echo.rejection_reason.is_none(), "{echo:?}");
        c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
        pace.tick().await;
    }

    // Two tool calls: one approved, one denied.
    for (tool, approved) in [("deploy", true), ("drop_table", false)] {
        let text = format!("/tool {tool} {{}}");
        let turn = uuid::Uuid::new_v4().to_string();
        tally
            .send(&mut c, &mut m, &chat, turn_started(&turn, &text))
            .await;
        let ready = c
            .wait_for(Some(&mut m), |e| is_open_tool(e).is_some())
            .await;
        let (turn_id, call) = is_open_tool(&ready).expect("a tool call");
        pace.tick().await;
        let option = if approved { "approve-once" } else { "deny" };
        let confirm = json!({"type": "chat/toolCallConfirmed", "turnId": turn_id, "toolCallId": call,
            "approved": approved, "selectedOptionId": option});
        let echo = tally.send(&mut c, &mut m, &chat, action(confirm)).await;
        assert!(echo.rejection_reason.is_none(), "{echo:?}");
        c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
        pace.tick().await;
    }

    // Refused: an answer to no request (invalid), then a burst past the
    // dispatch budget (rate limited).
    let bogus = json!({"type": "chat/inputCompleted", "requestId": "no-such-request", "response": "accept"});
    let echo = tally.send(&mut c, &mut m, &chat, action(bogus)).await;
    assert!(echo.rejection_reason.is_some());
    let mut seqs = Vec::new();
    let mut seen = 0;
    for i in 0..30 {
        seqs.push(c.dispatch(&chat, draft(&format!("draft {i}"))).await);
    }
    // Refusals come back at once, acceptances once stored: in any order.
    let mut waiting: std::collections::HashSet<i64> = seqs.into_iter().collect();
    while !waiting.is_empty() {
        let env = c.next_envelope().await;
        let Some(o) = env.origin.as_ref().filter(|o| o.client_id == "ann") else {
            continue;
        };
        if !waiting.remove(&o.client_seq) {
            continue;
        }
        match env.rejection_reason {
            Some(r) => tally.rejected.push(r),
            None => {
                tally.accepted += 1;
                seen = seen.max(env.server_seq);
            }
        }
    }
    let rate_limited = tally.rejected_starting("rate limited");
    assert!(rate_limited > 0, "the burst went past the budget");

    // Refused: a token for another session (not allowed).
    let scoped = token(
        "bob",
        Role::Client,
        Some(vec!["ahp-session:/elsewhere".into()]),
    );
    let mut b = TestClient::connect(&url(&scoped), "bob").await;
    let seq = b.dispatch(&chat, draft("not mine")).await;
    let echo = b.wait_echo(None, seq).await;
    let reason = echo.rejection_reason.expect("refused");
    assert!(reason.starts_with("PermissionDenied"), "{reason}");

    // An eviction: a frame over the limit.
    let (mut ws, _) = tokio_tungstenite::connect_async(url(&client_token))
        .await
        .expect("connect");
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(100 * 1024)
    );
    let _ = ws.send(Message::text(big)).await;
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(WAIT, ws.next()).await {
        if matches!(msg, Message::Close(_)) {
            break;
        }
    }

    // Two reconnects: one replayed, one answered with snapshots.
    for (last, answer) in [(seen as i64, "replay"), (-1, "snapshot")] {
        let (mut ws, _) = tokio_tungstenite::connect_async(url(&client_token))
            .await
            .expect("connect");
        let req = json!({"jsonrpc": "2.0", "id": 1, "method": "reconnect", "params": {"channel": "ahp-root://",
            "clientId": format!("re-{answer}"), "lastSeenServerSeq": last, "subscriptions": [chat]}});
        ws.send(Message::text(req.to_string())).await.expect("send");
        loop {
            let msg = tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("an answer")
                .expect("open")
                .expect("frame");
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).expect("JSON");
                if v["id"] == 1 {
                    assert_eq!(v["result"]["type"], answer, "{v}");
                    break;
                }
            }
        }
        let _ = ws.close(None).await;
    }

    // Closed connections are let go a moment after their close.
    let (status, text) = eventually("the closes are counted", || async {
        let (status, text) = scrape(&server, Some(&admin)).await;
        (text.contains("tandem_evictions_total{cause=\"too_large\"} 1")
            && text.contains("tandem_connections 2\n"))
        .then_some((status, text))
    })
    .await;
    assert!(status.contains("200"), "{status}");
    let (v, docs) = samples(&text);
    let get = |k: &str| *v.get(k).unwrap_or_else(|| panic!("no `{k}` in\n{text}"));

    // Every exported family is documented.
    for name in [
        "tandem_connections",
        "tandem_subscriptions",
        "tandem_channels",
        "tandem_actions_accepted_total",
        "tandem_actions_rejected_total",
        "tandem_deliveries_total",
        "tandem_sent_bytes_total",
        "tandem_evictions_total",
        "tandem_reconnects_total",
        "tandem_journal_commit_seconds",
        "tandem_journal_commit_writes",
        "tandem_journal_checkpoint_seconds",
        "tandem_interactions_opened_total",
        "tandem_interactions_settled_total",
        "tandem_interaction_settle_seconds",
        "tandem_providers_connected",
        "tandem_agent_processes",
    ] {
        assert!(docs.contains_key(name), "no HELP for {name}");
    }

    assert_eq!(
        get("tandem_actions_accepted_total{source=\"connection\"}") as usize,
        tally.accepted,
        "every accepted dispatch and nothing else"
    );
    assert!(
        get("tandem_actions_accepted_total{source=\"server\"}") > 0.0,
        "the agent's actions"
    );
    assert_eq!(
        get("tandem_actions_rejected_total{reason=\"rate_limited\"}") as usize,
        rate_limited
    );
    assert_eq!(
        get("tandem_actions_rejected_total{reason=\"invalid\"}"),
        1.0
    );
    assert_eq!(
        get("tandem_actions_rejected_total{reason=\"not_allowed\"}"),
        1.0
    );
    assert_eq!(get("tandem_actions_rejected_total{reason=\"store\"}"), 0.0);
    assert_eq!(get("tandem_evictions_total{cause=\"too_large\"}"), 1.0);
    assert_eq!(get("tandem_evictions_total{cause=\"overflow\"}"), 0.0);
    assert_eq!(get("tandem_reconnects_total{answer=\"replay\"}"), 1.0);
    assert_eq!(get("tandem_reconnects_total{answer=\"snapshot\"}"), 1.0);

    for (kind, n) in [("input", 2.0), ("url", 1.0), ("tool", 2.0)] {
        assert_eq!(
            get(&format!(
                "tandem_interactions_opened_total{{kind=\"{kind}\"}}"
            )),
            n,
            "{kind}"
        );
        assert_eq!(
            get(&format!(
                "tandem_interaction_settle_seconds_count{{kind=\"{kind}\"}}"
            )),
            n,
            "{kind}: every settlement timed"
        );
    }
    for (kind, outcome, n) in [
        ("input", "answered", 1.0),
        ("input", "declined", 1.0),
        ("url", "cancelled", 1.0),
        ("tool", "approved", 1.0),
        ("tool", "denied", 1.0),
        ("input", "abandoned", 0.0),
    ] {
        assert_eq!(
            get(&format!(
                "tandem_interactions_settled_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}"
            )),
            n,
            "{kind} {outcome}"
        );
    }

    assert_eq!(get("tandem_channels{kind=\"session\"}"), 1.0);
    assert_eq!(get("tandem_channels{kind=\"chat\"}"), 1.0);
    // Ann's and Bob's connections are open.
    assert_eq!(get("tandem_connections"), 2.0);
    assert!(get("tandem_subscriptions") >= 1.0);
    assert!(get("tandem_connections_opened_total") >= 5.0);
    assert!(get("tandem_deliveries_total") >= tally.accepted as f64);
    assert!(get("tandem_sent_bytes_total") > 1000.0);
    // The SQLite store committed, and every commit was timed.
    let commits = get("tandem_journal_commit_seconds_count");
    assert!(commits > 0.0);
    assert_eq!(get("tandem_journal_commit_writes_count"), commits);
    // Its checkpoints are timed by the thread that ran them (a short run
    // fills no WAL: none yet).
    for thread in ["checkpointer", "writer"] {
        let key = format!("tandem_journal_checkpoint_seconds_count{{thread=\"{thread}\"}}");
        assert_eq!(get(&key), 0.0, "{key}");
    }
    assert_eq!(get("tandem_agent_processes"), 0.0);
    let _ = session;
    server.stop().await;
}
