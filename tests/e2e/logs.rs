//! `--log-format json`: one JSON object per line, a line per connection
//! opened and closed (with the close code and reason), per refused action
//! and command, per eviction — and never a token or the secret.

use crate::common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "logs-test-secret-0123456789abcdefghij";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_a_line_per_connection_refusal_and_eviction_and_no_secrets() {
    let dir = temp_dir("json-logs");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).expect("secret");
    let log = dir.join("server.log");
    let mut server = ServerProcess::spawn_with(
        &log,
        &[
            "--in-memory",
            "--auth-secret-file",
            secret.to_str().expect("utf-8"),
            "--log-format",
            "json",
            "--max-frame-bytes",
            "65536",
        ],
    );
    let token = Authenticator::new(SECRET.as_bytes())
        .expect("key")
        .mint(&Claims {
            sub: "ann".into(),
            role: Role::Client,
            exp: now_secs() + 600,
            sessions: None,
            ..Default::default()
        })
        .expect("mint");
    let url = format!("{}?token={token}", server.url());

    let c = TestClient::connect(&url, "ann").await;
    let (_session, chat) = c.create_session().await;
    // A refused action and a refused command.
    let bogus = json!({"type": "chat/inputCompleted", "requestId": "nope", "response": "accept"});
    c.dispatch(&chat, action(bogus)).await;
    let r: Result<Value, _> = c.client.request("subscribe", json!({"channel": 42})).await;
    assert!(r.is_err());
    // An eviction: a frame over the limit.
    let (mut ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("connect");
    let _ = ws
        .send(Message::text(format!(
            r#"{{"pad":"{}"}}"#,
            "x".repeat(100_000)
        )))
        .await;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(WAIT, ws.next()).await {
        if matches!(m, Message::Close(_)) {
            break;
        }
    }
    c.client.shutdown().await;

    let lines = eventually("the log lines are written", || async {
        let text = std::fs::read_to_string(&log).ok()?;
        let closes = text.matches("connection closed").count();
        (closes >= 2 && text.contains("action rejected")).then_some(text)
    })
    .await;
    server.kill();
    assert!(!lines.contains(&token), "a token is in the log");
    assert!(!lines.contains(SECRET), "the secret is in the log");
    let events: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let with = |message: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["fields"]["message"] == message)
            .collect()
    };
    for e in &events {
        assert!(e["timestamp"].is_string() && e["level"].is_string(), "{e}");
    }
    let opened = with("connection opened");
    assert!(opened.len() >= 2, "{lines}");
    assert!(
        opened.iter().all(|e| e["fields"]["subject"] == "ann"),
        "{lines}"
    );
    let closed = with("connection closed");
    assert!(
        closed.iter().any(|e| e["fields"]["code"] == 1009
            && e["fields"]["cause"] == "too_large"
            && e["fields"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("too large"))),
        "an eviction with its code and reason: {lines}"
    );
    assert!(
        closed.iter().any(|e| e["fields"]["cause"] == "client"),
        "the client's own close: {lines}"
    );
    let rejected = with("action rejected");
    assert!(rejected.iter().any(|e| e["fields"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("nope"))));
    let refused = with("command refused");
    assert!(
        refused.iter().any(|e| e["fields"]["code"] == -32602),
        "{lines}"
    );
}
