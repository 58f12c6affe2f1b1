//! `hostile`: honest clients alone, then the same honest load while one
//! hostile tenant (token subject `mallory`) sends oversize strings, keeps
//! sockets that never read and floods subscriptions; each round reports the
//! honest clients' echo latency in both phases and its ratio, and the
//! server's memory before and at its peak.
//!
//! Every party has a token of its own (the server runs with
//! authentication, as a shared deployment does). The attackers run on the
//! same machine as the server, so the ratio says how fairly the server
//! shares what the machine has; the test suite keeps the verdicts that do
//! not depend on the machine (memory bound, no eviction, nothing lost).
//!
//! Sizes are fixed: each honest client sends `--drafts` drafts per phase at
//! `--rate` a second; the attack lasts as long as the honest load under it.
//! A phase that passes `--max-seconds` is cut short and said so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{scratch_dir, Server, ServerOpts, StopHow};
use crate::stats::{new_hist, record_ns, Summary};

/// `hostile` flags.
#[derive(Args, Debug, Clone)]
pub struct HostileArgs {
    /// Honest clients, each in a session of its own.
    #[arg(long, default_value_t = 4)]
    pub honest: usize,
    /// Drafts each honest client sends per phase.
    #[arg(long, default_value_t = 500)]
    pub drafts: u64,
    /// Drafts per second per honest client.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Sockets that stop reading.
    #[arg(long, default_value_t = 8)]
    pub stuck: usize,
    /// Rounds (alone, then attacked).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Longest phase, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub max_seconds: f64,
}

/// Each connection's queue budget (`--outbound-limit-bytes`).
const OUTBOUND_LIMIT: u64 = 1024 * 1024;
/// The replay ring's byte bound (`--replay-ring-bytes`).
const RING_BYTES: u64 = 16 * 1024 * 1024;
/// The allowed ratio of attacked to quiet honest p99, and the floor below
/// which a quiet p99 counts as this (scheduling noise on a small machine
/// doubles a 1–2 ms p99 alone).
const FAIR_RATIO: f64 = 2.0;
const FLOOR_MS: f64 = 2.5;
/// How long an attacker waits before trying again after the server turned
/// it away, and a socket that never reads between bursts of subscribes:
/// the attack's pace, so the attackers do not just spin.
const ATTACK_RETRY: Duration = Duration::from_millis(50);
/// How long an oversize sender reads answers after each frame.
const ATTACK_READ: Duration = Duration::from_millis(5);
/// The server's token secret.
const SECRET: &[u8] = b"loadtest-hostile-secret-0123456789-abcdef";

fn url_for(base: &str, subject: &str, role: tandem::auth::Role) -> anyhow::Result<String> {
    let token = tandem::auth::Authenticator::new(SECRET)
        .map_err(|e| anyhow!("{e}"))?
        .mint(&tandem::auth::Claims {
            sub: subject.into(),
            role,
            exp: tandem::auth::now_secs() + 3600,
            sessions: None,
            ..Default::default()
        })
        .map_err(|e| anyhow!("{e}"))?;
    Ok(format!("{base}?token={token}"))
}

fn rpc(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn init(client_id: &str) -> String {
    rpc(
        0,
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": client_id}),
    )
}

fn draft(chat: &str, seq: u64, text: &str) -> String {
    rpc(
        seq,
        "dispatchAction",
        json!({"channel": chat, "clientSeq": seq, "action": {"type": "chat/draftChanged", "draft": {"text": text, "origin": {"kind": "user"}}}}),
    )
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connect, initialize as `client_id`, and wait for the reply.
async fn connect(url: &str, client_id: &str) -> anyhow::Result<Ws> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .context("connect")?;
    ws.send(Message::text(init(client_id))).await?;
    reply(&mut ws, 0).await?;
    Ok(ws)
}

/// Read until the reply to request `id`; its `result`.
async fn reply(ws: &mut Ws, id: u64) -> anyhow::Result<Value> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .map_err(|_| anyhow!("no reply to request {id} within 30 s"))?
            .ok_or_else(|| anyhow!("the connection ended"))??;
        let Message::Text(t) = m else { continue };
        let v: Value = serde_json::from_str(&t)?;
        if v["id"] == id {
            if let Some(e) = v.get("error") {
                bail!("request {id} failed: {e}");
            }
            return Ok(v["result"].clone());
        }
    }
}

/// Read until the echo of our `client_id`'s `seq`; an error if refused.
async fn echo(ws: &mut Ws, client_id: &str, seq: u64) -> anyhow::Result<()> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .map_err(|_| anyhow!("no echo of {seq} within 30 s"))?
            .ok_or_else(|| anyhow!("the connection ended (evicted?)"))??;
        let Message::Text(t) = m else { continue };
        let v: Value = serde_json::from_str(&t)?;
        let o = &v["params"]["origin"];
        if v["method"] == "action" && o["clientId"] == client_id && o["clientSeq"] == seq {
            if let Some(r) = v["params"]["rejectionReason"].as_str() {
                bail!("an honest draft was refused: {r}");
            }
            return Ok(());
        }
    }
}

/// The honest clients' phase: every echo latency, in one histogram.
async fn honest_phase(
    url: &str,
    chats: &[String],
    args: &HostileArgs,
    tag: &str,
) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let mut tasks = Vec::new();
    for (h, chat) in chats.iter().enumerate() {
        let url = url_for(url, &format!("honest-{h}"), tandem::auth::Role::Client)?;
        let (chat, tag, drafts) = (chat.clone(), tag.to_owned(), args.drafts);
        let every = Duration::from_secs_f64(1.0 / args.rate.max(0.1));
        tasks.push(tokio::spawn(async move {
            let client_id = format!("honest-{tag}-{h}");
            let mut ws = connect(&url, &client_id).await?;
            let mut hist = new_hist();
            // The schedule: one draft every `every`, latency from the send.
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for seq in 1..=drafts {
                ticks.tick().await;
                let sent = Instant::now();
                ws.send(Message::text(draft(
                    &chat,
                    seq,
                    &format!("{tag}-{h}-{seq}"),
                )))
                .await?;
                echo(&mut ws, &client_id, seq).await?;
                record_ns(&mut hist, sent.elapsed().as_nanos() as u64);
            }
            let _ = ws.close(None).await;
            anyhow::Ok(hist)
        }));
    }
    let mut all = new_hist();
    for t in tasks {
        all.add(t.await??)?;
    }
    Ok(all)
}

/// [`honest_phase`] on a thread and runtime of its own: the attackers'
/// tasks mask and send 900 KB frames on the load generator's runtime, and
/// an honest client's step queued behind one would time the load
/// generator, not the server. Both phases run this way, alike.
async fn honest_phase_apart(
    url: &str,
    chats: &[String],
    args: &HostileArgs,
    tag: &str,
) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let (url, chats, args, tag) = (url.to_owned(), chats.to_vec(), args.clone(), tag.to_owned());
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("honest-{tag}"))
        .spawn(move || {
            let phase = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(honest_phase(&url, &chats, &args, &tag)));
            let _ = done.send(phase);
        })
        .context("start the honest clients' thread")?;
    result
        .await
        .map_err(|_| anyhow!("the honest clients' thread ended without a result"))?
}

/// Start the attackers; they stop when `stop` turns true. `frames` counts
/// what they sent.
fn attack(
    server: &Server,
    bait_session: &str,
    bait: &str,
    stuck: usize,
    stop: &watch::Receiver<bool>,
    frames: &Arc<AtomicU64>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let url = url_for(&server.url, "mallory", tandem::auth::Role::Client)?;
    let mut tasks = Vec::new();
    // Oversize strings in every field a client chooses, and large drafts as
    // fast as the byte budget lets them through.
    for a in 0..2u64 {
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
                "createSession",
                json!({"channel": format!("ahp-session:/{}", &huge[..500_000]), "provider": "scripted"}),
            ),
            rpc(
                3,
                "dispatchAction",
                json!({"channel": bait_session, "clientSeq": 1, "action": {"type": "session/titleChanged", "title": &huge[..800_000]}}),
            ),
        ];
        for k in 0..12 {
            batch.push(draft(bait, 10 + k, &huge[..200_000]));
        }
        let (url, mut stop, frames) = (url.clone(), stop.clone(), frames.clone());
        tasks.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let Ok((mut ws, _)) = tokio_tungstenite::connect_async(&url).await else {
                    let _ = tokio::time::timeout(ATTACK_RETRY, stop.changed()).await;
                    continue;
                };
                for f in &batch {
                    frames.fetch_add(1, Ordering::Relaxed);
                    if ws.send(Message::text(f.as_str())).await.is_err() {
                        break;
                    }
                    // The attack's pace: what answer comes within a moment.
                    let _ = tokio::time::timeout(ATTACK_READ, ws.next()).await;
                }
                let _ = ws.close(None).await;
            }
        }));
    }
    // Sockets that never read, asking for snapshots again and again.
    for s in 0..stuck {
        let (url, mut stop, frames, bait) =
            (url.clone(), stop.clone(), frames.clone(), bait.to_owned());
        let addr = server.url.clone();
        tasks.push(tokio::spawn(async move {
            let host = addr
                .trim_start_matches("ws://")
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let mut n = 0u64;
            while !*stop.borrow() {
                let Ok(tcp) = small_window(&host).await else {
                    let _ = tokio::time::timeout(ATTACK_RETRY, stop.changed()).await;
                    continue;
                };
                let Ok((mut ws, _)) = tokio_tungstenite::client_async(&url, tcp).await else {
                    let _ = tokio::time::timeout(ATTACK_RETRY, stop.changed()).await;
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
                        let _ = tokio::time::timeout(ATTACK_RETRY, stop.changed()).await;
                    }
                }
                n += 1;
            }
        }));
    }
    // A subscription flood from a client that reads.
    {
        let (url, stop, frames, bait) = (url, stop.clone(), frames.clone(), bait.to_owned());
        tasks.push(tokio::spawn(async move {
            let Ok(mut ws) = connect(&url, "flood").await else {
                return;
            };
            let mut id = 1;
            while !*stop.borrow() {
                for method in ["subscribe", "unsubscribe"] {
                    frames.fetch_add(1, Ordering::Relaxed);
                    if ws
                        .send(Message::text(rpc(id, method, json!({"channel": bait}))))
                        .await
                        .is_err()
                        || reply(&mut ws, id).await.is_err()
                    {
                        return;
                    }
                    id += 1;
                }
            }
        }));
    }
    Ok(tasks)
}

/// A TCP connection to `host` with a 4 KiB receive window.
async fn small_window(host: &str) -> anyhow::Result<tokio::net::TcpStream> {
    let addr: std::net::SocketAddr = host.parse()?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    Ok(socket.connect(addr).await?)
}

/// Resident and peak resident memory of `pid`, KiB.
fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Run the scenario.
pub async fn run(args: &HostileArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    if opts.in_process {
        bail!("hostile runs the server as a process of its own (its memory is measured)");
    }
    let secret = scratch_dir().join("hostile-secret");
    std::fs::write(&secret, SECRET)?;
    let server_args: Vec<String> = [
        "--auth-secret-file",
        secret
            .to_str()
            .ok_or_else(|| anyhow!("scratch path not UTF-8"))?,
        "--outbound-limit-bytes",
        &OUTBOUND_LIMIT.to_string(),
        // The disk's fsync jitter, which no server controls, stays out of
        // the comparison.
        "--durability",
        "relaxed",
        "--replay-ring-bytes",
        &RING_BYTES.to_string(),
    ]
    .map(String::from)
    .to_vec();
    // The per-principal limits a load test otherwise raises are the
    // defence under test: the server keeps its defaults.
    let defaults = tandem::Limits::default();
    let mut opts = opts.clone();
    for (flag, value) in [
        (
            "--max-connections-per-token",
            defaults.max_connections_per_token.to_string(),
        ),
        (
            "--max-sessions-per-token",
            defaults.max_sessions_per_token.to_string(),
        ),
        (
            "--dispatches-per-sec",
            defaults.dispatches_per_sec.to_string(),
        ),
        (
            "--max-subscriptions-per-connection",
            defaults.max_subscriptions_per_connection.to_string(),
        ),
        (
            "--dispatch-bytes-per-sec",
            defaults.dispatch_bytes_per_sec.to_string(),
        ),
        (
            "--inbound-bytes-per-sec",
            defaults.inbound_bytes_per_sec.to_string(),
        ),
        ("--requests-per-sec", defaults.requests_per_sec.to_string()),
    ] {
        if !opts
            .server_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        {
            opts.server_args.extend([flag.to_owned(), value]);
        }
    }
    let server = Server::tandem(&opts, &server_args).await?;
    note(format!("tandem: {} at {}", server.label, server.url));
    let res = run_on(&server, args).await;
    server.stop(StopHow::Term).await?;
    res
}

async fn run_on(server: &Server, args: &HostileArgs) -> anyhow::Result<ScenarioResult> {
    let admin = url_for(&server.url, "owner", tandem::auth::Role::Admin)?;
    let mut owner = connect(&admin, "owner").await?;
    let mut next = 1;
    let mut chats = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..=args.honest {
        let (id, session) = (
            next,
            format!("ahp-session:/hostile-{}-{next}", std::process::id()),
        );
        next += 1;
        owner
            .send(Message::text(rpc(
                id,
                "createSession",
                json!({"channel": session, "provider": "scripted"}),
            )))
            .await?;
        reply(&mut owner, id).await?;
        let sub = next;
        next += 1;
        owner
            .send(Message::text(rpc(
                sub,
                "subscribe",
                json!({"channel": session}),
            )))
            .await?;
        let r = reply(&mut owner, sub).await?;
        let chat = r["snapshot"]["state"]["defaultChat"]
            .as_str()
            .ok_or_else(|| anyhow!("no default chat in {r}"))?
            .to_owned();
        sessions.push(session);
        chats.push(chat);
    }
    // The attackers' own session, with a large draft to ask snapshots of.
    let (bait_session, bait) = (
        sessions.pop().unwrap_or_default(),
        chats.pop().unwrap_or_default(),
    );
    owner
        .send(Message::text(draft(&bait, next, &"b".repeat(200_000))))
        .await?;
    echo(&mut owner, "owner", next).await?;

    let mut r = ScenarioResult::new(
        "hostile",
        &server.label,
        json!({"honest": args.honest, "drafts": args.drafts, "rate": args.rate, "stuck": args.stuck, "rounds": args.rounds}),
    );
    let limit = Duration::from_secs_f64(args.max_seconds);
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let (mut quiet_all, mut attacked_all) = (new_hist(), new_hist());
    for round in 1..=args.rounds.max(1) {
        let quiet = tokio::time::timeout(
            limit,
            honest_phase_apart(&server.url, &chats, args, "quiet"),
        )
        .await
        .map_err(|_| anyhow!("round {round}: the quiet phase passed {limit:?}"))??;
        let before = server.pid.and_then(memory_kib);
        let (stop, stopped) = watch::channel(false);
        let frames = Arc::new(AtomicU64::new(0));
        let attackers = attack(server, &bait_session, &bait, args.stuck, &stopped, &frames)?;
        let attacked = tokio::time::timeout(
            limit,
            honest_phase_apart(&server.url, &chats, args, "attacked"),
        )
        .await;
        stop.send_replace(true);
        for a in attackers {
            let _ = tokio::time::timeout(Duration::from_secs(30), a).await;
        }
        let attacked = attacked
            .map_err(|_| anyhow!("round {round}: the attacked phase passed {limit:?}"))??;
        let after = server.pid.and_then(memory_kib);
        let (q, a) = (Summary::of(&quiet), Summary::of(&attacked));
        let ratio = a.p99_ms / q.p99_ms.max(FLOOR_MS);
        ratios.push(ratio);
        note(format!(
            "round {round}: honest echo p99 {:.2} ms alone, {:.2} ms attacked (×{ratio:.2}); {} attacker frames",
            q.p99_ms,
            a.p99_ms,
            frames.load(Ordering::Relaxed)
        ));
        rows.push(json!({
            "round": round,
            "quiet_p99_ms": q.p99_ms,
            "attacked_p99_ms": a.p99_ms,
            "ratio": ratio,
            "attacker_frames": frames.load(Ordering::Relaxed),
            "rss_before_kib": before.map(|m| m.0),
            "rss_peak_kib": after.map(|m| m.1),
        }));
        quiet_all.add(&quiet)?;
        attacked_all.add(&attacked)?;
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    r.set_latency(&Summary::of(&attacked_all));
    r.put_latency("quiet", &Summary::of(&quiet_all));
    r.put_latency("attacked", &Summary::of(&attacked_all));
    r.put("ratio_p99_attacked_to_quiet_median", median);
    r.put("rounds", Value::Array(rows));
    r.target(
        "honest echo p99 under attack (median of rounds)",
        &format!("≤ {FAIR_RATIO}× alone (floor {FLOOR_MS} ms)"),
        format!("×{median:.2}"),
        median <= FAIR_RATIO,
    );
    if server.pid.is_none() {
        r.note("the server's memory was not measured: pass --server-pid with --url");
    }
    Ok(r)
}
