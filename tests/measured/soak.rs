//! Soak: honest clients, churning connections and garbage senders against the
//! real binary for a bounded time (`TANDEM_SOAK_SECS`, default 20; the README
//! records a longer run). The server's RSS must stay flat, nothing may panic,
//! and every honest client must end with the state a fresh subscriber sees.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_keeps_memory_flat_and_honest_clients_converged() {
    let _alone = crate::alone().await;
    let secs: u64 = std::env::var("TANDEM_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = temp_dir("soak");
    // A small replay ring fills during warm-up, so what remains is growth
    // that should not be there (the default ring holds 100,000 envelopes and
    // would still be filling).
    let server = ServerProcess::spawn(
        &dir.join("data"),
        &["--max-frame-bytes", "65536", "--replay-ring-len", "2000"],
    );
    let pid = server.pid();
    let owner = server.client("owner").await;
    let mut chats = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (s, c) = owner.create_session().await;
        sessions.push(s);
        chats.push(c);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();

    // Honest clients: subscribe to both chats, write drafts and titles, start
    // short turns, and keep mirrors.
    for h in 0..4 {
        let url = server.url();
        let (chats, sessions, stop, sent) =
            (chats.clone(), sessions.clone(), stop.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = TestClient::connect(&url, &format!("honest-{h}")).await;
            let mut mirrors = Vec::new();
            for chat in &chats {
                mirrors.push(c.subscribe_chat(chat).await);
            }
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let chat = &chats[(i as usize) % chats.len()];
                let a = if i.is_multiple_of(50) && h == 0 {
                    turn_started(&uuid::Uuid::new_v4().to_string(), &format!("ping {i}"))
                } else if i.is_multiple_of(17) {
                    let s = &sessions[(i as usize) % sessions.len()];
                    c.dispatch(s, action(json!({"type": "session/titleChanged", "title": format!("t{h}-{i}")}))).await;
                    i += 1;
                    continue;
                } else {
                    action(json!({"type": "chat/draftChanged", "draft": {"text": format!("h{h}-{i}"), "origin": {"kind": "user"}}}))
                };
                c.dispatch(chat, a).await;
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
                // Drain what arrived so far into the mirrors.
                while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(1), c.events.recv()).await {
                    if let ahp::SubscriptionEvent::Action(env) = ev.event {
                        for m in mirrors.iter_mut() {
                            m.apply(&env);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (c, mirrors)
        }));
    }

    // Churn: connect, initialize, subscribe, leave.
    let churned = Arc::new(AtomicU64::new(0));
    for _ in 0..2 {
        let (url, chat, stop, churned) = (
            server.url(),
            chats[0].clone(),
            stop.clone(),
            churned.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let c = TestClient::connect(&url, &format!("churn-{}", uuid::Uuid::new_v4())).await;
                let _ = c.subscribe_raw(&chat).await;
                c.client.shutdown().await;
                churned.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let c = TestClient::connect(&url, "churn-done").await;
            (c, Vec::new())
        }));
    }

    // Garbage: malformed frames, binary, oversize, then reconnect when closed.
    let garbage = Arc::new(AtomicU64::new(0));
    {
        let (url, stop, garbage) = (server.url(), stop.clone(), garbage.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut ws, _)) = tokio_tungstenite::connect_async(&url).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                for _ in 0..40 {
                    let frame = match n % 10 {
                        8 => Message::Binary(vec![0xff; 16].into()),
                        9 if n % 30 == 9 => Message::text("x".repeat(70_000)),
                        _ => Message::text(GARBAGE[n % GARBAGE.len()]),
                    };
                    n += 1;
                    garbage.fetch_add(1, Ordering::Relaxed);
                    if ws.send(frame).await.is_err() {
                        break;
                    }
                    // Read whatever answer came, without waiting long.
                    let _ = tokio::time::timeout(Duration::from_millis(2), ws.next()).await;
                }
                let _ = ws.close(None).await;
            }
            let c = TestClient::connect(&url, "garbage-done").await;
            (c, Vec::new())
        }));
    }

    // Sample RSS while it runs.
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        samples.push((started.elapsed().as_secs_f64(), rss_kib(pid)));
    }
    stop.store(true, Ordering::Relaxed);
    let mut honest = Vec::new();
    for t in tasks {
        let (c, mirrors) = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("task ends")
            .expect("task ok");
        if !mirrors.is_empty() {
            honest.push((c, mirrors));
        }
    }

    // Every honest client converges with a fresh subscriber.
    let checker = server.client("checker").await;
    for (mut c, mut mirrors) in honest {
        // Let the tail of the stream arrive.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let fresh: Vec<_> = {
                let mut v = Vec::new();
                for m in &mirrors {
                    v.push(checker.subscribe_chat(&m.uri).await.state);
                }
                v
            };
            if mirrors.iter().zip(&fresh).all(|(m, f)| m.state == *f) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "client {} did not converge",
                c.id
            );
            while let Ok(Some(ev)) =
                tokio::time::timeout(Duration::from_millis(200), c.events.recv()).await
            {
                if let ahp::SubscriptionEvent::Action(env) = ev.event {
                    for m in mirrors.iter_mut() {
                        m.apply(&env);
                    }
                }
            }
        }
    }
    checker.client.ping().await.expect("server alive");

    // Memory: after the first quarter (warm-up), RSS stays within 25% (or 16 MiB) of its level then.
    let warm = samples
        .iter()
        .filter(|(t, _)| *t >= secs as f64 / 4.0)
        .map(|(_, r)| *r)
        .collect::<Vec<_>>();
    // `rss_kib` fails when it cannot read; a run too short to sample after
    // warm-up measured nothing and fails too.
    assert!(
        warm.len() >= 2,
        "only {} memory samples after warm-up ({} in all): nothing was measured",
        warm.len(),
        samples.len()
    );
    let base = warm[0];
    let peak = warm.iter().copied().max().unwrap_or(base);
    let allowed = base + (base / 4).max(16 * 1024);
    eprintln!(
        "soak {secs}s: {} honest actions, {} churned connections, {} garbage frames; RSS after warm-up {base} KiB, peak {peak} KiB (allowed {allowed} KiB)",
        sent.load(Ordering::Relaxed),
        churned.load(Ordering::Relaxed),
        garbage.load(Ordering::Relaxed)
    );
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
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
