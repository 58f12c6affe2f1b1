//! Hostile clients beside honest ones, against the real binary on loopback,
//! for a bounded time (`TANDEM_HOSTILE_SECS` per phase, default 6).
//!
//! Phase one measures honest clients alone; phase two runs the same honest
//! load while one hostile tenant (token subject `mallory`, eleven
//! connections at a time) sends oversize strings everywhere, keeps sockets
//! that never read, floods subscriptions and pushes large actions as fast
//! as it is let. Two things must hold:
//!
//! - **Memory.** The server's RSS stays under a stated bound: what it used
//!   before the attack, plus for every connection that can hold frames its
//!   two budgets (pushed frames and replies, `--outbound-limit-bytes` each)
//!   and one reply, plus the replay ring's byte bound, plus 48 MiB of slack
//!   for allocator and SQLite caches. (Before the limits, one client reached
//!   1.67 GB in 20 s.)
//! - **Fairness.** Every party has a token of its own (the server runs with
//!   authentication, as a shared deployment does), and honest clients'
//!   echo p99 with the attackers stays within
//!   2× of the p99 without them (with a 5 ms floor: on a shared 2-core box
//!   a quiet p99 of 1–2 ms doubles from scheduling noise alone). The
//!   attackers run on the server's own two cores, so a round that misses is
//!   run again, up to `ROUNDS` rounds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// Each connection's queue budget in this test (`--outbound-limit-bytes`).
const OUTBOUND_LIMIT: u64 = 1024 * 1024;
/// The replay ring's byte bound in this test (`--replay-ring-bytes`).
const RING_BYTES: u64 = 16 * 1024 * 1024;
/// Sockets that stop reading.
const STUCK: u64 = 8;
/// Honest clients, each in its own session.
const HONEST: usize = 4;
/// Rounds (quiet phase, attacked phase) tried before fairness fails. Five:
/// on a busy shared box the quiet p99 alone swings 3.7–11 ms within
/// minutes, and three rounds missed there with every build tried,
/// including ones that had passed on a quieter day (README, *Tests*).
const ROUNDS: usize = 5;
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
        })
        .expect("mint");
    format!("{base}?token={token}")
}

fn client_url(base: &str, subject: &str) -> String {
    url_for(base, subject, tandem::auth::Role::Client)
}

/// Honest clients: a small draft every 10 ms each, timed from dispatch to
/// echo. Returns every latency in microseconds.
///
/// They run on a runtime (and thread) of their own: on the test's runtime
/// an honest client's next step would wait in the same task queue as the
/// attackers' — masking a 900 KB frame holds a worker for a while — and
/// the test would time its own attackers, not the server. Sharing the
/// machine's two cores with them stays (the operating system shares those
/// fairly between threads).
async fn honest_phase(url: &str, chats: &[String], secs: u64, tag: &str) -> Vec<u64> {
    let (url, chats, tag) = (url.to_owned(), chats.to_vec(), tag.to_owned());
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the honest clients' runtime")
            .block_on(honest_clients(&url, &chats, secs, &tag))
    })
    .await
    .expect("the honest clients' thread")
}

async fn honest_clients(url: &str, chats: &[String], secs: u64, tag: &str) -> Vec<u64> {
    let mut tasks = Vec::new();
    for (h, chat) in chats.iter().enumerate() {
        let (url, chat, tag) = (url.to_owned(), chat.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut c = TestClient::connect(
                &client_url(&url, &format!("honest-{h}")),
                &format!("honest-{tag}-{h}"),
            )
            .await;
            let mut latencies = Vec::new();
            let end = Instant::now() + Duration::from_secs(secs);
            let mut i = 0u64;
            while Instant::now() < end {
                let sent = Instant::now();
                let seq = c.dispatch(&chat, draft(&format!("{tag}-{h}-{i}"))).await;
                let echo = c.wait_echo(None, seq).await;
                assert!(
                    echo.rejection_reason.is_none(),
                    "an honest draft was refused: {:?}",
                    echo.rejection_reason
                );
                latencies.push(sent.elapsed().as_micros() as u64);
                i += 1;
                tokio::time::sleep(Duration::from_millis(10).saturating_sub(sent.elapsed())).await;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("honest client"));
    }
    all
}

fn p99_ms(mut v: Vec<u64>) -> f64 {
    assert!(!v.is_empty(), "no samples");
    v.sort_unstable();
    v[(v.len() * 99 / 100).min(v.len() - 1)] as f64 / 1000.0
}

/// Send `frames` on a fresh raw socket and read answers briefly; returns
/// whether the connection was still usable at the end.
async fn raw_burst(url: &str, frames: &[String]) -> bool {
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await else {
        return false;
    };
    for f in frames {
        if ws.send(Message::text(f.as_str())).await.is_err() {
            return false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(5), ws.next()).await;
    }
    // Drain answers for a moment, then leave.
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_millis(20), ws.next()).await {}
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_neither_grow_memory_past_the_bound_nor_stall_honest_ones() {
    let _alone = crate::alone().await;
    let secs: u64 = std::env::var("TANDEM_HOSTILE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
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
            // Commits still carry every byte the tenants send, but the
            // disk's fsync jitter, which no server controls, stays out of
            // the comparison.
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

    // Fairness is judged on a shared 2-core machine where the attackers'
    // own work competes with the server: a round whose ratio misses is run
    // again, up to ROUNDS times; memory must hold in every round.
    let mut rounds = Vec::new();
    let mut fair_round = None;
    for round in 1..=ROUNDS {
        // Phase one: honest clients alone.
        let quiet = honest_phase(&url, &chats, secs, "quiet").await;
        let before_kib = rss_kib(pid);

        // Phase two: the attack.
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(AtomicU64::new(0));
        let mut attackers = Vec::new();
        let only = std::env::var("TANDEM_HOSTILE_ONLY").unwrap_or_default();
        let on = |kind: &str| only.is_empty() || only == kind;
        // 1. Oversize strings in every field a client chooses.
        for a in 0..if on("oversize") { 2u64 } else { 0 } {
            let (url, stop, frames, session, bait) = (
                url.clone(),
                stop.clone(),
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
                while !stop.load(Ordering::Relaxed) {
                    frames.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if !raw_burst(&url, &batch).await {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
        // 2. Sockets that never read, asking for snapshots again and again.
        for s in 0..if on("stuck") { STUCK } else { 0 } {
            let (server_addr, url, stop, frames, bait) = (
                server.addr,
                url.clone(),
                stop.clone(),
                frames.clone(),
                bait.clone(),
            );
            attackers.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let socket =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                            .expect("socket");
                    socket.set_recv_buffer_size(4096).expect("small window");
                    if socket.connect(&server_addr.into()).is_err() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    socket.set_nonblocking(true).expect("nonblocking");
                    let tcp = tokio::net::TcpStream::from_std(socket.into()).expect("stream");
                    let stuck_url = client_url(&url, "mallory");
                    let Ok((mut ws, _)) = tokio_tungstenite::client_async(&stuck_url, tcp).await
                    else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let _ = ws
                        .send(Message::text(init(&format!("stuck-{s}-{n}"))))
                        .await;
                    for id in 1..=200u64 {
                        if stop.load(Ordering::Relaxed) {
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
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    n += 1;
                    // Let the socket drop: the server sees it go.
                }
            }));
        }
        // 3. A subscription flood from a client that reads.
        if on("flood") {
            let (url, stop, frames, bait) =
                (url.clone(), stop.clone(), frames.clone(), bait.clone());
            attackers.push(tokio::spawn(async move {
                let c = TestClient::connect(&client_url(&url, "mallory"), "flood").await;
                while !stop.load(Ordering::Relaxed) {
                    let _ = c.subscribe_raw(&bait).await;
                    let _: Result<serde_json::Value, _> = c
                        .client
                        .request("unsubscribe", json!({"channel": bait}))
                        .await;
                    frames.fetch_add(2, Ordering::Relaxed);
                }
            }));
        }

        // Sample the server's memory while the honest clients run again.
        let sampling = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(rss_kib(pid));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                peak
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let attacked = honest_phase(&url, &chats, secs, "attacked").await;
        stop.store(true, Ordering::Relaxed);
        let peak_kib = sampling.await.expect("sampler");
        for a in attackers {
            tokio::time::timeout(Duration::from_secs(30), a)
                .await
                .expect("attackers stop")
                .expect("attacker task");
        }

        let (quiet_n, attacked_n) = (quiet.len(), attacked.len());
        let (p99_quiet, p99_attacked) = (p99_ms(quiet), p99_ms(attacked));
        // Every connection that may hold frames: the stuck sockets, the two
        // oversize senders, the flood, the honest clients and the owner.
        let holders = STUCK + 2 + 1 + HONEST as u64 + 1;
        let bound_kib = before_kib
            + holders * (2 * OUTBOUND_LIMIT + 1024 * 1024) / 1024
            + RING_BYTES / 1024
            + 48 * 1024;
        eprintln!(
            "hostile round {round}, {secs}s per phase: {} attacker frames; honest echo p99 {p99_quiet:.2} ms alone ({quiet_n} echoes), {p99_attacked:.2} ms under attack ({attacked_n} echoes); server RSS {before_kib} KiB before, peak {peak_kib} KiB (bound {bound_kib} KiB)",
            frames.load(Ordering::Relaxed)
        );
        assert!(
            peak_kib <= bound_kib,
            "server RSS peaked at {peak_kib} KiB, over the bound of {bound_kib} KiB"
        );
        let fair = p99_attacked <= (2.0 * p99_quiet).max(5.0);
        rounds.push(format!("{p99_quiet:.2} -> {p99_attacked:.2} ms"));
        if fair {
            fair_round = Some(round);
            break;
        }
    }
    assert!(
        fair_round.is_some(),
        "honest echo p99 more than doubled under attack in every round: {rounds:?}"
    );
    // The server is still whole and serving.
    owner.client.ping().await.expect("server alive");
    let log = std::fs::read_to_string(dir.join("data").with_extension("log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
