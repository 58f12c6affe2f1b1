//! "The agent needs you" by webhook: a request for a person reaches each
//! webhook once, signed, after the quiet delay, and its end once more; a
//! receiver that fails is retried, one that never answers does not slow
//! the chat, and a webhook may not point at this machine from a server
//! others can reach.

use crate::common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use common::*;
use hmac::{KeyInit, Mac};
use serde_json::Value;
use tandem::notify::{Format, NotifyConfig, Only, Retry, WebhookSpec};
use tandem::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::people::{answer, approve, completed, open_call, ASK};

const SECRET: &[u8] = b"webhook-secret-0123456789";

/// One request a receiver got.
#[derive(Debug)]
pub(crate) struct Got {
    pub(crate) path: String,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
    /// The status it was answered with.
    pub(crate) status: u16,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// An HTTP receiver on loopback answering its `statuses` in turn (then
/// 200), each request reported on the channel.
pub(crate) async fn receiver(statuses: Vec<u16>) -> (String, mpsc::UnboundedReceiver<Got>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut statuses = statuses.into_iter();
        while let Ok((mut s, _)) = listener.accept().await {
            let status = statuses.next().unwrap_or(200);
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head_end, length) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (i + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let headers = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
                    .collect();
                let body = buf[head_end..head_end + length].to_vec();
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = tx.send(Got {
                    path,
                    headers,
                    body,
                    status,
                });
            });
        }
    });
    (url, rx)
}

/// Start a turn that asks a question; the open request's id.
pub(crate) async fn ask(c: &mut TestClient, chat: &str, m: &mut ChatMirror) -> String {
    c.start_turn(chat, ASK).await;
    c.wait_state(m, |s| open_request_id(s).is_some()).await;
    open_request_id(&m.state).expect("a request")
}

pub(crate) async fn next(rx: &mut mpsc::UnboundedReceiver<Got>) -> Got {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a delivery in time")
        .expect("the receiver runs")
}

fn hook(url: &str, include_content: bool) -> WebhookSpec {
    WebhookSpec {
        name: "team".into(),
        url: url::Url::parse(url).expect("url"),
        sessions: None,
        format: Format::Json,
        only: Only::All,
        include_content,
        secret: Some(SECRET.to_vec()),
        allow_loopback: false,
    }
}

fn notifying(hooks: Vec<WebhookSpec>, quiet: Duration) -> Config {
    Config {
        notify: NotifyConfig {
            quiet_delay: quiet,
            public_url: Some("https://tandem.example.com".into()),
            webhooks: hooks,
            retry: Retry {
                attempts: 3,
                first_backoff: Duration::from_millis(50),
                timeout: Duration::from_secs(2),
            },
            ..NotifyConfig::default()
        },
        ..Config::default()
    }
}

/// The delivery's signature checks out with the webhook's secret, computed
/// here from the Standard Webhooks definition.
fn verify(got: &Got) {
    let id = &got.headers["webhook-id"];
    let ts = &got.headers["webhook-timestamp"];
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SECRET).expect("key");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got.body);
    let want = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert_eq!(
        got.headers["webhook-signature"], want,
        "the signature verifies"
    );
    let age = tandem::auth::now_secs().abs_diff(ts.parse().expect("a timestamp"));
    assert!(age < 300, "a fresh timestamp: {ts}");
    assert_eq!(got.headers["content-type"], "application/json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_and_an_approval_each_reach_the_webhook_once_signed_then_settled() {
    let (url, mut rx) = receiver(vec![]).await;
    let server = TestServer::start_with(notifying(
        vec![hook(&url, true)],
        Duration::from_millis(100),
    ))
    .await;
    let mut c = server.client("ann-laptop").await;
    let (session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;

    // A question: one signed delivery saying what it asks, with a link.
    let rid = ask(&mut c, &chat, &mut m).await;
    let got = next(&mut rx).await;
    verify(&got);
    let v = got.json();
    assert_eq!(v["type"], "interaction.opened", "{v}");
    assert_eq!(v["session"], session.as_str());
    assert_eq!(v["chat"], chat.as_str());
    assert_eq!(v["interaction"]["id"], rid.as_str());
    assert_eq!(v["interaction"]["kind"], "input");
    let tail = |u: &str| u.rsplit('/').next().unwrap_or_default().to_owned();
    assert_eq!(
        v["link"],
        format!(
            "https://tandem.example.com/#/s/{}/{}",
            tail(&session),
            tail(&chat)
        ),
    );
    assert_eq!(
        got.headers["webhook-id"],
        v["id"].as_str().unwrap_or_default()
    );

    // Answered: one "settled" delivery.
    c.dispatch(&chat, answer(&rid, "submitted", "Tandem")).await;
    c.dispatch(&chat, completed(&rid)).await;
    let got = next(&mut rx).await;
    verify(&got);
    let v = got.json();
    assert_eq!(v["type"], "interaction.settled", "{v}");
    assert_eq!(v["interaction"]["id"], rid.as_str());
    assert_eq!(v["outcome"], "answered");
    assert!(
        v["settledBy"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("guest ")),
        "who answered, by name: {v}"
    );
    c.wait_state(&mut m, |s| s.active_turn.is_none()).await;

    // A tool approval: opened with the tool's name, then approved.
    c.start_turn(&chat, "/tool deploy {\"env\":\"prod\"}").await;
    c.wait_state(&mut m, |s| open_call(s).is_some()).await;
    let (turn, call) = open_call(&m.state).expect("a call waits");
    let got = next(&mut rx).await;
    verify(&got);
    let v = got.json();
    assert_eq!(v["type"], "interaction.opened", "{v}");
    assert_eq!(v["interaction"]["kind"], "tool");
    assert_eq!(v["interaction"]["id"], call.as_str());
    assert_eq!(v["interaction"]["toolName"], "deploy");
    c.dispatch(&chat, approve(&turn, &call)).await;
    let got = next(&mut rx).await;
    let v = got.json();
    assert_eq!(v["type"], "interaction.settled", "{v}");
    assert_eq!(v["outcome"], "approved");
    c.wait_state(&mut m, |s| s.active_turn.is_none()).await;

    // Exactly once: the webhook's deliveries go out in order, so had either
    // been sent twice, the copy would come before the next request's.
    let third = ask(&mut c, &chat, &mut m).await;
    let v = next(&mut rx).await.json();
    assert_eq!(v["type"], "interaction.opened", "{v}");
    assert_eq!(v["interaction"]["id"], third.as_str(), "{v}");

    // The admin view lists the webhook (its host only) and its last delivery.
    let addr = server.addr;
    let hook = eventually("the admin view shows the last delivery", || async move {
        let (_, _, body) = http(addr, "GET", "/admin/overview").await;
        let o: Value = serde_json::from_slice(&body).expect("JSON");
        let h = o["notify"]["webhooks"][0].clone();
        (h["last"]["outcome"] == "sent").then_some(h)
    })
    .await;
    assert_eq!(hook["name"], "team");
    assert_eq!(hook["target"], "http://127.0.0.1", "{hook}");
    assert_eq!(hook["signed"], true);
    assert_eq!(hook["last"]["status"], 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_the_delivery_on_the_third_try() {
    let (url, mut rx) = receiver(vec![500, 500]).await;
    let server = TestServer::start_with(notifying(
        vec![hook(&url, false)],
        Duration::from_millis(50),
    ))
    .await;
    let mut c = server.client("ann-laptop").await;
    let (_, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    ask(&mut c, &chat, &mut m).await;
    let tries = [
        next(&mut rx).await,
        next(&mut rx).await,
        next(&mut rx).await,
    ];
    assert_eq!(
        tries.iter().map(|g| g.status).collect::<Vec<_>>(),
        [500, 500, 200]
    );
    let ids: Vec<&String> = tries.iter().map(|g| &g.headers["webhook-id"]).collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "one delivery, retried: {ids:?}"
    );
    for g in &tries {
        verify(g);
    }
    // Without content, the body says only what kind of request waits.
    let v = tries[2].json();
    assert!(v["interaction"].get("title").is_none(), "{v}");
    assert_eq!(v["interaction"]["kind"], "input");
    eventually("the delivery is counted as sent", || async {
        let (_, _, body) = http(server.addr, "GET", "/metrics").await;
        let text = String::from_utf8_lossy(&body).into_owned();
        text.lines()
            .any(|l| l == r#"tandem_notifications_total{channel="webhook",outcome="sent"} 1"#)
            .then_some(())
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_settled_within_the_quiet_delay_is_told_to_nobody() {
    let (url, mut rx) = receiver(vec![]).await;
    // Long enough that answering at once always comes first.
    let server =
        TestServer::start_with(notifying(vec![hook(&url, true)], Duration::from_secs(3))).await;
    let mut c = server.client("ann-laptop").await;
    let (_, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    let first = ask(&mut c, &chat, &mut m).await;
    c.dispatch(&chat, answer(&first, "submitted", "quick"))
        .await;
    c.dispatch(&chat, completed(&first)).await;
    c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    // A second request is left open: the first delivery is its.
    let second = ask(&mut c, &chat, &mut m).await;
    let v = next(&mut rx).await.json();
    assert_eq!(v["type"], "interaction.opened", "{v}");
    assert_eq!(
        v["interaction"]["id"],
        second.as_str(),
        "not the answered one: {v}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_does_not_slow_the_chat() {
    // Accepts connections and never answers them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let (reached_tx, mut reached) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
            let _ = reached_tx.send(());
        }
    });
    let mut config = notifying(vec![hook(&url, true)], Duration::ZERO);
    config.notify.retry.timeout = Duration::from_secs(30);
    let server = TestServer::start_with(config).await;
    let mut c = server.client("ann-laptop").await;
    let (_, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    // Requests whose deliveries hang.
    let rid = ask(&mut c, &chat, &mut m).await;
    tokio::time::timeout(WAIT, reached.recv())
        .await
        .expect("the delivery reaches the receiver");
    // Drafts echo as fast as ever while the webhook hangs.
    let mut took = Vec::new();
    for i in 0..60 {
        let at = std::time::Instant::now();
        let seq = c
            .dispatch(&chat, answer(&rid, "draft", &format!("draft {i}")))
            .await;
        c.wait_echo(Some(&mut m), seq).await;
        took.push(at.elapsed());
    }
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    assert!(
        p99 < Duration::from_millis(500),
        "echo p99 {p99:?} with a webhook that never answers"
    );
    server.stop().await;
}

#[test]
fn a_webhook_at_this_machine_is_refused_on_a_server_others_can_reach() {
    let dir = temp_dir("notify-config");
    let secret = dir.join("secret");
    std::fs::write(&secret, "a-secret-of-at-least-32-bytes-0123456789").expect("write");
    let file = dir.join("tandem.toml");
    let run = |url: &str, allow: bool| {
        std::fs::write(
            &file,
            format!(
                "bind = \"0.0.0.0:7598\"\nin_memory = true\nauth_secret_file = {secret:?}\n\n[[notify.webhooks]]\nname = \"local\"\nurl = \"{url}\"\nallow_loopback = {allow}\n"
            ),
        )
        .expect("write");
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["config", "check"])
            .arg(&file)
            .env_remove("TANDEM_AUTH_SECRET")
            .output()
            .expect("run tandem config check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/",
        "http://localhost/",
    ] {
        let (code, err) = run(url, false);
        assert_eq!(code, Some(1), "{url}: {err}");
        assert!(
            err.contains("webhook `local`") && err.contains("allow_loopback"),
            "{err}"
        );
    }
    let (code, err) = run("http://127.0.0.1:9/hook", true);
    assert_eq!(code, Some(0), "allowed: {err}");
    let (code, err) = run("ftp://example.com/", false);
    assert_eq!(code, Some(1));
    assert!(err.contains("http:// or https://"), "{err}");
}
