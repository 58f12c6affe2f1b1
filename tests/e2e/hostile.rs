//! Hostile clients beside honest ones, against the real binary on loopback.
//!
//! Honest clients (each in its own session, with a token of its own) send
//! a fixed number of drafts while one hostile tenant (token subject
//! `mallory`, eleven connections at a time) sends oversize strings
//! everywhere, keeps sockets that never read, floods subscriptions and
//! pushes large actions as fast as it is let; the attack lasts as long as
//! the honest work. What must hold, however busy the machine:
//!
//! - **Memory.** The server's peak RSS stays under a stated bound: what it
//!   used before the attack, plus for every connection that can hold frames
//!   its two budgets (pushed frames and replies, `--outbound-limit-bytes`
//!   each) and one reply, plus the replay ring's byte bound, plus 48 MiB of
//!   slack for allocator and SQLite caches. (Before the limits, one client
//!   reached 1.67 GB in 20 s.)
//! - **The honest clients.** None is refused or evicted, every draft is
//!   echoed, and each one's copy of its chat equals a fresh snapshot.
//!
//! How fairly the server shares the machine (honest latency with and
//! without the attack) is the load generator's `loadtest hostile`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

/// Each connection's queue budget in this test (`--outbound-limit-bytes`).
const OUTBOUND_LIMIT: u64 = 1024 * 1024;
/// The replay ring's byte bound in this test (`--replay-ring-bytes`).
const RING_BYTES: u64 = 16 * 1024 * 1024;
/// Sockets that stop reading.
const STUCK: u64 = 8;
/// Honest clients, each in its own session.
const HONEST: usize = 4;
/// Drafts each honest client sends while the attack runs.
const DRAFTS: usize = 300;
/// Attacker frames sent before the honest work starts (and as many again
/// before the attack stops): every kind of attack has run many times.
const ATTACK_FRAMES: u64 = 3000;
/// How long an attacker waits after the server turned it away, or between
/// bursts of a socket that never reads: the attack's pace, so the attackers
/// do not just spin.
const ATTACK_PAUSE: Duration = Duration::from_millis(50);
/// The server's token secret in this test.
const SECRET: &[u8] = b"hostile-test-secret-0123456789-abcdefgh";

/// The WebSocket URL with a client token for `subject`.
fn url_for(base: &str, subject: &str, role: tandem::auth::Role) -> String {
    let token = tandem::auth::Authenticator::new(SECRET)
        .expect("key")
        .mint(&tandem::auth::Claims {
            sub: subject.into(),
            role,
            exp: tandem::auth::now_secs() + 3600,
            sessions: None,
            ..Default::default()
        })
        .expect("mint");
    format!("{base}?token={token}")
}

fn client_url(base: &str, subject: &str) -> String {
    url_for(base, subject, tandem::auth::Role::Client)
}

/// Wait [`ATTACK_PAUSE`], or less when the attack is told to stop.
async fn pause(stop: &mut watch::Receiver<bool>) {
    let _ = tokio::time::timeout(ATTACK_PAUSE, stop.changed()).await;
}

/// A process's peak resident memory so far (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot measure memory: reading {path}: {e}"));
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("cannot measure memory: no VmHWM in {path}"))
}

/// Send `frames` on a fresh raw socket, reading whatever answers are there
/// after each; returns whether the connection was still usable at the end.
async fn raw_burst(url: &str, frames: &[String]) -> bool {
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await else {
        return false;
    };
    for f in frames {
        if ws.send(Message::text(f.as_str())).await.is_err() {
            return false;
        }
        // The attack's pace: what answer comes within a moment.
        let _ = tokio::time::timeout(Duration::from_millis(5), ws.next()).await;
    }
    let _ = ws.close(None).await;
    true
}

fn rpc(id: u64, method: &str, params: serde_json::Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn init(client_id: &str) -> String {
    rpc(
        0,
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id}),
    )
}

/// One honest client: subscribed to its chat, it sends [`DRAFTS`] drafts,
/// each echoed and none refused (a refusal or an eviction fails the test),
/// and returns its copy of the chat.
async fn honest(url: String, h: usize, chat: String) -> (TestClient, ChatMirror) {
    let mut c = TestClient::connect(
        &client_url(&url, &format!("honest-{h}")),
        &format!("honest-{h}"),
    )
    .await;
    let mut m = c.subscribe_chat(&chat).await;
    for i in 0..DRAFTS {
        let seq = c.dispatch(&chat, draft(&format!("honest-{h}-{i}"))).await;
        let echo = c.wait_echo(Some(&mut m), seq).await;
        assert!(
            echo.rejection_reason.is_none(),
            "an honest draft was refused: {:?}",
            echo.rejection_reason
        );
    }
    (c, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_neither_grow_memory_past_the_bound_nor_harm_honest_ones() {
    let dir = temp_dir("hostile");
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, SECRET).expect("secret file");
    let outbound = OUTBOUND_LIMIT.to_string();
    let ring = RING_BYTES.to_string();
    let server = ServerProcess::spawn(
        &dir.join("data"),
        &[
            "--auth-secret-file",
            secret_file.to_str().expect("utf-8 path"),
            "--outbound-limit-bytes",
            &outbound,
            "--durability",
            "relaxed",
            "--replay-ring-bytes",
            &ring,
        ],
    );
    let pid = server.pid();
    let url = server.url();
    let owner =
        TestClient::connect(&url_for(&url, "owner", tandem::auth::Role::Admin), "owner").await;
    let mut chats = Vec::new();
    for _ in 0..HONEST {
        chats.push(owner.create_session().await.1);
    }
    // The attackers' own session, with a large draft to ask snapshots of.
    let (bait_session, bait) = owner.create_session().await;
    let seq = owner.dispatch(&bait, draft(&"b".repeat(200_000))).await;
    let mut owner = owner;
    owner.wait_echo(None, seq).await;
    let before_kib = rss_kib(pid);

    let (stop, stopped) = watch::channel(false);
    let frames = Arc::new(AtomicU64::new(0));
    let mut attackers = Vec::new();
    // 1. Oversize strings in every field a client chooses.
    for a in 0..2u64 {
        let (url, mut stop, frames, session, bait) = (
            url.clone(),
            stopped.clone(),
            frames.clone(),
            bait_session.clone(),
            bait.clone(),
        );
        // Built once: the attackers' own work must not be what slows the
        // honest clients down (they share this machine with the server).
        let huge = "x".repeat(900_000);
        let mut batch = vec![
            init(&huge),
            init(&format!("oversize-{a}")),
            rpc(
                1,
                "tandem/registerProvider",
                json!({"channel": "ahp-root://", "provider": format!("p{a}"), "displayName": &huge[..600_000]}),
            ),
            rpc(
                2,
                "createChat",
                json!({"channel": session, "chat": format!("ahp-chat:/{}", &huge[..500_000])}),
            ),
            rpc(
                3,
                "createSession",
                json!({"channel": format!("ahp-session:/{}", &huge[..500_000]), "provider": "scripted"}),
            ),
            rpc(
                4,
                "dispatchAction",
                json!({"channel": session, "clientSeq": 1, "action": {"type": "session/titleChanged", "title": &huge[..800_000]}}),
            ),
            rpc(
                5,
                "dispatchAction",
                json!({"channel": bait, "clientSeq": 2, "action": {"type": "chat/draftChanged", "draft": {"text": huge, "origin": {"kind": "user"}}}}),
            ),
        ];
        // Large drafts within the size limit, as fast as the byte budget
        // lets them through.
        for k in 0..12 {
            batch.push(rpc(10 + k, "dispatchAction", json!({"channel": bait, "clientSeq": 10 + k, "action": {"type": "chat/draftChanged", "draft": {"text": &huge[..200_000], "origin": {"kind": "user"}}}})));
        }
        let batch = Arc::new(batch);
        attackers.push(tokio::spawn(async move {
            let url = client_url(&url, "mallory");
            while !*stop.borrow() {
                frames.fetch_add(batch.len() as u64, Ordering::Relaxed);
                if !raw_burst(&url, &batch).await {
                    pause(&mut stop).await;
                }
            }
        }));
    }
    // 2. Sockets that never read, asking for snapshots again and again.
    for s in 0..STUCK {
        let (server_addr, url, mut stop, frames, bait) = (
            server.addr,
            url.clone(),
            stopped.clone(),
            frames.clone(),
            bait.clone(),
        );
        attackers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !*stop.borrow() {
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                        .expect("socket");
                socket.set_recv_buffer_size(4096).expect("small window");
                if socket.connect(&server_addr.into()).is_err() {
                    pause(&mut stop).await;
                    continue;
                }
                socket.set_nonblocking(true).expect("nonblocking");
                let tcp = tokio::net::TcpStream::from_std(socket.into()).expect("stream");
                let stuck_url = client_url(&url, "mallory");
                let Ok((mut ws, _)) = tokio_tungstenite::client_async(&stuck_url, tcp).await else {
                    pause(&mut stop).await;
                    continue;
                };
                let _ = ws
                    .send(Message::text(init(&format!("stuck-{s}-{n}"))))
                    .await;
                for id in 1..=200u64 {
                    if *stop.borrow() {
                        break;
                    }
                    let sent = tokio::time::timeout(
                        Duration::from_millis(500),
                        ws.send(Message::text(rpc(
                            id,
                            "subscribe",
                            json!({"channel": bait}),
                        ))),
                    )
                    .await;
                    frames.fetch_add(1, Ordering::Relaxed);
                    if !matches!(sent, Ok(Ok(()))) {
                        break;
                    }
                    if id % 20 == 0 {
                        pause(&mut stop).await;
                    }
                }
                n += 1;
                // Let the socket drop: the server sees it go.
            }
        }));
    }
    // 3. A subscription flood from a client that reads.
    {
        let (url, stop, frames, bait) =
            (url.clone(), stopped.clone(), frames.clone(), bait.clone());
        attackers.push(tokio::spawn(async move {
            let c = TestClient::connect(&client_url(&url, "mallory"), "flood").await;
            while !*stop.borrow() {
                let _ = c.subscribe_raw(&bait).await;
                let _: Result<serde_json::Value, _> = c
                    .client
                    .request("unsubscribe", json!({"channel": bait}))
                    .await;
                frames.fetch_add(2, Ordering::Relaxed);
            }
        }));
    }

    // The honest work, once the attack is under way; the attack goes on
    // past it, then stops.
    eventually("the attack is under way", || async {
        (frames.load(Ordering::Relaxed) >= ATTACK_FRAMES).then_some(())
    })
    .await;
    let honest: Vec<_> = chats
        .iter()
        .enumerate()
        .map(|(h, chat)| tokio::spawn(honest(url.clone(), h, chat.clone())))
        .collect();
    let mut done = Vec::new();
    for h in honest {
        done.push(h.await.expect("an honest client"));
    }
    eventually("the attack went on past the honest work", || async {
        (frames.load(Ordering::Relaxed) >= 2 * ATTACK_FRAMES).then_some(())
    })
    .await;
    stop.send_replace(true);
    let peak_kib = peak_rss_kib(pid);
    for a in attackers {
        tokio::time::timeout(WAIT, a)
            .await
            .expect("attackers stop")
            .expect("attacker task");
    }

    // Every connection that may hold frames: the stuck sockets, the two
    // oversize senders, the flood, the honest clients and the owner.
    let holders = STUCK + 2 + 1 + HONEST as u64 + 1;
    let bound_kib = before_kib
        + holders * (2 * OUTBOUND_LIMIT + 1024 * 1024) / 1024
        + RING_BYTES / 1024
        + 48 * 1024;
    eprintln!(
        "hostile: {} attacker frames; server RSS {before_kib} KiB before, peak {peak_kib} KiB (bound {bound_kib} KiB)",
        frames.load(Ordering::Relaxed)
    );
    assert!(
        peak_kib <= bound_kib,
        "server RSS peaked at {peak_kib} KiB, over the bound of {bound_kib} KiB"
    );
    // Every honest draft kept, and every honest copy as the server has it.
    let checker = TestClient::connect(
        &url_for(&url, "owner", tandem::auth::Role::Admin),
        "checker",
    )
    .await;
    for (h, (c, m)) in done.into_iter().enumerate() {
        let fresh = checker.subscribe_chat(&m.uri).await.state;
        assert_eq!(m.state, fresh, "honest client {h} converges");
        let last = fresh.draft.as_ref().map(|d| d.text.clone());
        assert_eq!(
            last,
            Some(format!("honest-{h}-{}", DRAFTS - 1)),
            "nothing lost"
        );
        c.client
            .ping()
            .await
            .expect("the honest client is still served");
    }
    // The server is still whole and serving.
    owner.client.ping().await.expect("server alive");
    let path = dir.join("data").with_extension("log");
    let log = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the server's log {}: {e}", path.display()));
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}
