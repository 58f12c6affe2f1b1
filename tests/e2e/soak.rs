//! Soak: honest clients, churning connections and garbage senders against
//! the real binary, in rounds of the same fixed work (`TANDEM_SOAK_ROUNDS`,
//! default 4). The server's RSS after each round must stay within a bound of
//! its level after the first (warm-up), nothing may panic, and every honest
//! client must end with the state a fresh subscriber sees.

use crate::common::*;
use futures_util::SinkExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const GARBAGE: &[&str] = &[
    "not json at all",
    "[1,2,3]",
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"nope\"}",
    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"subscribe\",\"params\":{\"channel\":5}}",
    "{\"jsonrpc\":\"2.0\",\"method\":\"dispatchAction\",\"params\":{\"channel\":\"ahp-chat:/x\"}}",
    "{\"id\":{},\"method\":[]}",
    "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"initialize\",\"params\":{\"channel\":\"ahp-root://\",\"protocolVersions\":[\"0.0.1\"],\"clientId\":\"g\"}}",
];

/// Each honest client's actions per round.
const HONEST_ACTIONS: u64 = 250;
/// Connections each churner opens and leaves per round.
const CHURNS: usize = 25;
/// Garbage connections per round (40 frames each).
const GARBAGE_CONNECTIONS: usize = 10;

/// An honest client with a copy of each chat.
struct Honest {
    c: TestClient,
    mirrors: Vec<ChatMirror>,
    next: u64,
}

impl Honest {
    /// Apply envelopes to every copy until our own `seq` is echoed.
    async fn until_echo(&mut self, seq: i64) {
        let id = self.c.id.clone();
        loop {
            let env = self.c.next_envelope().await;
            for m in self.mirrors.iter_mut() {
                m.apply(&env);
            }
            if env
                .origin
                .as_ref()
                .is_some_and(|o| o.client_id == id && o.client_seq == seq)
            {
                return;
            }
        }
    }

    /// One round of drafts, titles and (for client 0) short turns.
    async fn round(mut self, h: usize, chats: Vec<String>, sessions: Vec<String>) -> Self {
        for _ in 0..HONEST_ACTIONS {
            let i = self.next;
            self.next += 1;
            let (channel, a) = if i.is_multiple_of(17) {
                let s = &sessions[(i as usize) % sessions.len()];
                let t = json!({"type": "session/titleChanged", "title": format!("t{h}-{i}")});
                (s.clone(), action(t))
            } else if i.is_multiple_of(50) && h == 0 {
                let chat = &chats[(i as usize) % chats.len()];
                let t = turn_started(&uuid::Uuid::new_v4().to_string(), &format!("ping {i}"));
                (chat.clone(), t)
            } else {
                let chat = &chats[(i as usize) % chats.len()];
                (chat.clone(), draft(&format!("h{h}-{i}")))
            };
            let seq = self.c.dispatch(&channel, a).await;
            self.until_echo(seq).await;
        }
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_keeps_memory_flat_and_honest_clients_converged() {
    let rounds: usize = std::env::var("TANDEM_SOAK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
        .max(2);
    let dir = temp_dir("soak");
    // A small replay ring fills during warm-up, so what remains is growth
    // that should not be there.
    let server = ServerProcess::spawn(
        &dir.join("data"),
        &["--max-frame-bytes", "65536", "--replay-ring-len", "2000"],
    );
    let pid = server.pid();
    let owner = server.client("owner").await;
    let (mut chats, mut sessions) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let (s, c) = owner.create_session().await;
        sessions.push(s);
        chats.push(c);
    }
    let mut honest = Vec::new();
    for h in 0..4 {
        let c = server.client(&format!("honest-{h}")).await;
        let mut mirrors = Vec::new();
        for chat in &chats {
            mirrors.push(c.subscribe_chat(chat).await);
        }
        honest.push(Honest {
            c,
            mirrors,
            next: 1,
        });
    }

    let mut rss = Vec::new();
    for _ in 0..rounds {
        let mut tasks = Vec::new();
        for (h, hc) in honest.drain(..).enumerate() {
            tasks.push(tokio::spawn(hc.round(h, chats.clone(), sessions.clone())));
        }
        // Churn: connect, initialize, subscribe, leave.
        let churners: Vec<_> = (0..2)
            .map(|_| {
                let (url, chat) = (server.url(), chats[0].clone());
                tokio::spawn(async move {
                    for _ in 0..CHURNS {
                        let c =
                            TestClient::connect(&url, &format!("churn-{}", uuid::Uuid::new_v4()))
                                .await;
                        let _ = c.subscribe_raw(&chat).await;
                        c.client.shutdown().await;
                    }
                })
            })
            .collect();
        // Garbage: malformed frames, binary, oversize; a new connection
        // each time the server closes one.
        let url = server.url();
        let garbage = tokio::spawn(async move {
            let mut n = 0usize;
            for _ in 0..GARBAGE_CONNECTIONS {
                let (mut ws, _) = tokio_tungstenite::connect_async(&url)
                    .await
                    .expect("a garbage sender connects");
                for _ in 0..40 {
                    let frame = match n % 10 {
                        8 => Message::Binary(vec![0xff; 16].into()),
                        9 if n % 30 == 9 => Message::text("x".repeat(70_000)),
                        _ => Message::text(GARBAGE[n % GARBAGE.len()]),
                    };
                    n += 1;
                    if ws.send(frame).await.is_err() {
                        break;
                    }
                }
                let _ = ws.close(None).await;
            }
        });
        for t in tasks {
            honest.push(t.await.expect("an honest client"));
        }
        for t in churners {
            t.await.expect("a churner");
        }
        garbage.await.expect("the garbage sender");
        rss.push(rss_kib(pid));
    }

    // Every honest client converges with a fresh subscriber: a last action
    // on each chat, once its echo is in, follows everything before it.
    let mut checker = server.client("checker").await;
    let mut marks = Vec::new();
    for chat in &chats {
        let seq = checker.dispatch(chat, draft("checked")).await;
        checker.wait_echo(None, seq).await;
        marks.push(seq);
    }
    for hc in honest.iter_mut() {
        let mut seen = 0;
        while seen < marks.len() {
            let env = hc.c.next_envelope().await;
            for m in hc.mirrors.iter_mut() {
                m.apply(&env);
            }
            if env
                .origin
                .as_ref()
                .is_some_and(|o| o.client_id == "checker")
            {
                seen += 1;
            }
        }
        for m in &hc.mirrors {
            let fresh = checker.subscribe_chat(&m.uri).await.state;
            assert_eq!(m.state, fresh, "client {} converges on {}", hc.c.id, m.uri);
        }
    }
    checker.client.ping().await.expect("server alive");

    // Memory: after the first round (warm-up), RSS stays within 25% (or
    // 16 MiB) of its level then.
    let base = rss[0];
    let peak = rss.iter().copied().max().unwrap_or(base);
    let allowed = base + (base / 4).max(16 * 1024);
    eprintln!("soak, {rounds} rounds: RSS after each {rss:?} KiB (allowed {allowed} KiB)");
    assert!(
        peak <= allowed,
        "server RSS grew from {base} KiB to {peak} KiB"
    );
    let log_path = dir.join("data").with_extension("log");
    let log = std::fs::read_to_string(&log_path).unwrap_or_else(|e| {
        panic!(
            "cannot check the server for panics: reading {}: {e}",
            log_path.display()
        )
    });
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}
