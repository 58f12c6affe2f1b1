//! `fanout`: C chats × S subscribers; P agents per chat stream
//! `chat/draftChanged` actions; measure deliveries/s and the latency from
//! publish to every receiver and to the last receiver of each action, against
//! Tandem and its peers in one invocation: the tokio baseline and a Node.js
//! `ws` room broadcast (`loadtest/node/room.js`), Tandem then each peer per
//! round, with Tandem/peer ratios for every round.
//!
//! Two phases per server, each on fresh connections and fresh sessions:
//! 1. **max** — closed loop (`--window` actions per chat in flight until
//!    delivered to every subscriber) for `--max-seconds`: the most
//!    deliveries/s the server sustains. Tandem's figure over the baseline's
//!    is the ratio.
//! 2. **latency** — open loop at `--rate` actions/s per chat (default:
//!    `--rate-fraction` × Tandem's maximum) for `--seconds`: latency
//!    percentiles to every receiver and to the last one, loss, duplicates and
//!    order. Both servers get the same rate.

use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde_json::json;

use crate::conn::{unique, Endpoint};
use crate::engine::{
    publish_and_collect, spawn_subscribers, ActionKind, Gate, Outcome, PhaseTiming, Publisher, Run,
    Schedule, SubPlan,
};
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts, StopHow};
use crate::stats::{Integrity, Summary};

/// Which servers `fanout` runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Against {
    /// Tandem, then each of `--peers`, and their ratios.
    Both,
    /// Tandem only.
    Tandem,
    /// The peers only.
    Baseline,
}

/// A server Tandem is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// `loadtest/node/room.js`: what a team would write instead of Tandem.
    Node,
    /// The tokio + tungstenite baseline (`loadtest baseline`).
    Tokio,
}

/// One server of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tandem,
    Peer(Peer),
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tandem => "tandem",
            Kind::Peer(Peer::Node) => "node",
            Kind::Peer(Peer::Tokio) => "baseline",
        }
    }
}

/// `fanout` flags.
#[derive(Args, Debug, Clone)]
pub struct FanoutArgs {
    /// Chats (one session each).
    #[arg(long, default_value_t = 1)]
    pub chats: usize,
    /// Subscribers per chat.
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// Publishing agents per chat.
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Latency phase: actions/s per chat [default: --rate-fraction × the
    /// measured maximum, or 100 with --no-max].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Latency phase rate as a fraction of the maximum.
    #[arg(long, default_value_t = 0.5)]
    pub rate_fraction: f64,
    /// Latency phase length, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Max phase length, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub max_seconds: f64,
    /// Max phase: actions per chat in flight (not yet at every subscriber).
    #[arg(long, default_value_t = 64)]
    pub window: u64,
    /// Skip the max phase.
    #[arg(long)]
    pub no_max: bool,
    /// Skip the latency phase.
    #[arg(long)]
    pub no_latency: bool,
    /// Leading seconds of each phase left out of rates and latencies.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest wait for in-flight actions after publishing, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// Filler bytes added to each draft's text.
    #[arg(long, default_value_t = 0)]
    pub pad: usize,
    /// Which servers to run against [default: both, or tandem with --url].
    #[arg(long, value_enum)]
    pub against: Option<Against>,
    /// Peers to measure Tandem against, in this order after Tandem.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "node,tokio")]
    pub peers: Vec<Peer>,
    /// Rounds of Tandem then each peer, alternating, so that drift on a
    /// shared machine falls on every server alike.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// In each round, run the peers before Tandem (to see what running
    /// first in a fresh driver costs a server).
    #[arg(long)]
    pub peers_first: bool,
    /// Handshakes in flight while connecting subscribers.
    #[arg(long, default_value_t = 128)]
    pub connect_concurrency: usize,
    /// Instead of the max and latency phases: latency phases at these
    /// rates (actions/s per chat, rising) on every server of every round,
    /// each on fresh connections, until one's p99 to every receiver passes
    /// `--sweep-p99-ms` (or anything is lost). Reports the highest rate
    /// each server held and Tandem / peer per round and as the median.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Vec<f64>,
    /// The p99 a sweep step must hold, ms.
    #[arg(long, default_value_t = 25.0)]
    pub sweep_p99_ms: f64,
    /// After Tandem's latency phase, dispose every session it created and
    /// report the server's RSS at the phase's start, before the disposal
    /// and once it stops falling after it (sampled for up to 15 s), beside
    /// the replay ring's bytes (`/healthz`).
    #[arg(long)]
    pub dispose: bool,
    /// Who creates each chat's session: its (first) writer, as a person
    /// who opens a session and types in it, or one set-up connection that
    /// creates them all, as a back end provisioning sessions for others.
    #[arg(long, value_enum, default_value = "writer")]
    pub sessions_by: SessionsBy,
}

/// Which connection creates the sessions of a fan-out phase.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionsBy {
    /// Each chat's first writer, before it writes.
    Writer,
    /// One set-up connection, closed before the phase.
    Setup,
}

/// Memory around disposing every session of a phase: all resident memory
/// (`VmRSS`) and its anonymous part (`RssAnon`: heap and stacks, without
/// the program's own file pages).
struct Disposal {
    sessions: usize,
    rss_start: Option<u64>,
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    anon_start: Option<u64>,
    anon_before: Option<u64>,
    anon_after: Option<u64>,
    /// The allocator's live bytes (`/healthz` `allocator.allocatedBytes`).
    live_start: Option<u64>,
    live_before: Option<u64>,
    live_after: Option<u64>,
    ring_bytes: Option<u64>,
    /// The ring's whole footprint (envelopes, headers, slots).
    ring_footprint: Option<u64>,
    /// The store engine's own memory (SQLite's caches), after.
    store_bytes: Option<u64>,
    /// Channels and connections `/healthz` still counts afterwards.
    channels_left: Option<u64>,
    connections_left: Option<u64>,
}

/// Dispose `sessions` on `server`, then watch its RSS settle.
async fn dispose_all(
    server: &Server,
    opts: &ServerOpts,
    sessions: &[String],
    (rss_start, anon_start, live_start): (Option<u64>, Option<u64>, Option<u64>),
) -> anyhow::Result<Disposal> {
    let ep = Endpoint::new(&server.url, opts.source_ips).await?;
    let mut client = ep.client(&unique("dispose")).await?;
    let (rss_before, anon_before) = (server.rss(), server.rss_anon());
    let live_before = live_heap(&server.url).await;
    for s in sessions {
        client
            .request("disposeSession", json!({ "channel": s }))
            .await?;
    }
    client.close().await;
    // Freed memory goes back to the system over the allocator's decay
    // time (jemalloc's default: 10 s): sample until the lowest reading
    // holds for 8 s, at most 25 s.
    let mut low = server.rss();
    let mut anon_low = server.rss_anon();
    let mut since_low = 0;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        match (server.rss(), low) {
            (Some(r), Some(l)) if r < l => {
                low = Some(r);
                since_low = 0;
            }
            _ => since_low += 1,
        }
        if let (Some(a), Some(l)) = (server.rss_anon(), anon_low) {
            if a < l {
                anon_low = Some(a);
                since_low = 0;
            }
        }
        if since_low >= 16 {
            break;
        }
    }
    let health = healthz(&server.url).await.ok();
    let field = |k: &str| health.as_ref().and_then(|h| h[k].as_u64());
    let live_after = health
        .as_ref()
        .and_then(|h| h["allocator"]["allocatedBytes"].as_u64());
    Ok(Disposal {
        sessions: sessions.len(),
        rss_start,
        rss_before,
        rss_after: low,
        anon_start,
        anon_before,
        anon_after: anon_low,
        live_start,
        live_before,
        live_after,
        ring_bytes: field("replayRingBytes"),
        ring_footprint: field("replayRingFootprintBytes"),
        store_bytes: field("storeMemoryBytes"),
        channels_left: field("channels"),
        connections_left: field("connections"),
    })
}

/// The server's live heap as its allocator counts it, when it reports one.
async fn live_heap(ws_url: &str) -> Option<u64> {
    let h = healthz(ws_url).await.ok()?;
    h["allocator"]["allocatedBytes"].as_u64()
}

/// `GET /healthz` of the server behind `ws_url` (`ws://host:port/ahp`).
async fn healthz(ws_url: &str) -> anyhow::Result<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = ws_url
        .strip_prefix("ws://")
        .and_then(|r| r.split('/').next())
        .ok_or_else(|| anyhow::anyhow!("not a ws:// URL: {ws_url}"))?;
    let mut tcp = tokio::net::TcpStream::connect(host).await?;
    tcp.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).await?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or_else(|| anyhow::anyhow!("no body in /healthz's answer"))?;
    Ok(serde_json::from_str(body)?)
}

/// One step of a sweep.
struct Step {
    rate: f64,
    deliveries_per_sec: f64,
    p99_ms: f64,
    held: bool,
}

/// The highest deliveries/s a server held in its sweep (0 when it held
/// none), and whether it held every step (the sweep was too short).
fn highest_held(steps: &[Step]) -> (f64, bool) {
    let held = steps
        .iter()
        .filter(|s| s.held)
        .map(|s| s.deliveries_per_sec)
        .fold(0.0, f64::max);
    (held, !steps.is_empty() && steps.iter().all(|s| s.held))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// A latency phase: `rate` actions/s per chat for `--seconds`.
async fn open_phase(
    server: &Server,
    args: &FanoutArgs,
    opts: &ServerOpts,
    rate: f64,
    label: &str,
) -> anyhow::Result<(Outcome, Vec<String>)> {
    let count = (rate * args.seconds).ceil() as u64;
    let schedule = Schedule::Open { rate, count };
    phase(server, args, opts, schedule, args.seconds, label).await
}

/// One phase against one server.
async fn phase(
    server: &Server,
    args: &FanoutArgs,
    opts: &ServerOpts,
    schedule: Schedule,
    seconds: f64,
    label: &str,
) -> anyhow::Result<(Outcome, Vec<String>)> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let p = args.publishers.max(1);
    let mut chats = Vec::with_capacity(args.chats);
    let mut sessions = Vec::with_capacity(args.chats);
    // Every writer's connection, opened (and for `--sessions-by writer`,
    // the first of each chat creating its session) before any phase starts.
    let mut writers = Vec::with_capacity(args.chats * p);
    let mut setup = match args.sessions_by {
        SessionsBy::Setup => Some(ep.client(&unique("setup")).await?),
        SessionsBy::Writer => None,
    };
    for c in 0..args.chats {
        for k in 0..p {
            let client_id = unique(&format!("agent-{}", c * p + k));
            let mut client = ep
                .client(&client_id)
                .await
                .with_context(|| format!("connecting publisher {client_id}"))?;
            if k == 0 {
                let creator = setup.as_mut().unwrap_or(&mut client);
                let (session, chat) = creator.create_session().await?;
                sessions.push(session);
                chats.push(chat);
            }
            writers.push((client_id, client.ws));
        }
    }
    if let Some(setup) = setup {
        setup.close().await;
    }
    let per_pub = match schedule {
        Schedule::Open { rate, count } => Schedule::Open {
            rate: rate / p as f64,
            count: count.div_ceil(p as u64),
        },
        Schedule::Closed {
            window,
            gate,
            seconds,
            limit,
        } => Schedule::Closed {
            window: (window / p as u64).max(1),
            gate,
            seconds,
            limit,
        },
    };
    let slots = match per_pub {
        Schedule::Open { count, .. } => count as usize + 1,
        Schedule::Closed { window, .. } => 4 * window as usize + 4,
    };
    let run = Run::new(args.chats * p, slots);
    let mut publishers = Vec::new();
    let mut writers = writers.into_iter();
    for (c, chat) in chats.iter().enumerate() {
        for k in 0..p {
            let index = (c * p + k) as u32;
            let (client_id, ws) = writers.next().context("a writer per publisher")?;
            publishers.push((
                Publisher {
                    index,
                    client_id,
                    chat: chat.clone(),
                    kind: ActionKind::Draft { pad: args.pad },
                    schedule: per_pub,
                    offset: 0,
                },
                ws,
            ));
        }
    }
    let mut plans = Vec::new();
    for (c, chat) in chats.iter().enumerate() {
        for s in 0..args.subscribers {
            plans.push(SubPlan {
                id: plans.len(),
                client_id: unique(&format!("sub-{c}-{s}")),
                chat: chat.clone(),
                pub_base: (c * p) as u32,
                pubs: p,
                mirror: false,
                node: 0,
                group: 0,
            });
        }
    }
    let total = plans.len();
    let (subs, errors) = spawn_subscribers(
        &ep,
        plans,
        args.connect_concurrency,
        &run,
        &format!("{label}: subscribe"),
    )
    .await;
    if !errors.is_empty() {
        run.stop();
        anyhow::bail!(
            "{} of {total} subscribers failed to connect, e.g.: {}",
            errors.len(),
            errors[0]
        );
    }
    for pubs in &run.pubs {
        pubs.expected.store(
            args.subscribers as u32,
            std::sync::atomic::Ordering::Release,
        );
    }
    let outcome = publish_and_collect(
        run,
        publishers,
        subs,
        PhaseTiming {
            seconds,
            warmup: args.warmup.min(seconds / 2.0),
            drain: args.drain,
            label: label.to_owned(),
            server_pids: server.pid.into_iter().collect(),
        },
    )
    .await?;
    Ok((outcome, sessions))
}

fn describe(o: &Outcome, what: &str) -> String {
    let all = Summary::of(&o.all);
    let last = Summary::of(&o.last);
    format!(
        "{what}: {:.0} deliveries/s ({:.0} actions/s), p99 {:.2} ms, last-receiver p99 {:.2} ms, lost {} dup {} reord {}; cpu cores server {:.2} loadgen {:.2} other {:.2}",
        o.deliveries_per_sec,
        o.actions_per_sec,
        all.p99_ms,
        last.p99_ms,
        o.integrity.lost,
        o.integrity.duplicated,
        o.integrity.reordered,
        cores(o).unwrap_or(f64::NAN),
        o.loadgen_cpu_seconds.unwrap_or(f64::NAN) / o.window_seconds,
        o.background_cores().unwrap_or(f64::NAN),
    )
}

/// Figures of one server in one round.
struct Figures {
    kind: Kind,
    round: usize,
    label: String,
    max: Option<Outcome>,
    lat: Option<Outcome>,
    /// `VmHWM` after its phases: the most memory it held.
    peak_rss: Option<u64>,
    /// `--sweep` steps, in order.
    sweep: Vec<Step>,
    /// Integrity over the sweep's steps.
    sweep_integrity: Integrity,
    /// `--dispose` (Tandem only).
    disposal: Option<Disposal>,
}

impl Figures {
    /// The phase the side-by-side comparison reads: latency, else max.
    fn compared(&self) -> Option<&Outcome> {
        self.lat.as_ref().or(self.max.as_ref())
    }
}

/// Server CPU microseconds per delivery of a phase.
fn cpu_us_per_delivery(o: &Outcome) -> Option<f64> {
    o.server_cpu_seconds
        .map(|c| c * 1e6 / (o.deliveries_per_sec * o.window_seconds).max(1.0))
}

/// Tandem and a peer side by side in one round, with Tandem/peer ratios
/// (below 1 means Tandem used less, or was faster).
fn side_by_side(t: &Figures, p: &Figures) -> Option<serde_json::Value> {
    let (to, po) = (t.compared()?, p.compared()?);
    let (ta, pa) = (Summary::of(&to.all), Summary::of(&po.all));
    let (tl, pl) = (Summary::of(&to.last), Summary::of(&po.last));
    let (tf, pf) = (Summary::of(&to.first), Summary::of(&po.first));
    let mib = |b: u64| b as f64 / 1048576.0;
    let rows: [(&str, Option<f64>, Option<f64>); 6] = [
        (
            "server_cpu_us_per_delivery",
            cpu_us_per_delivery(to),
            cpu_us_per_delivery(po),
        ),
        ("p50_ms", Some(ta.p50_ms), Some(pa.p50_ms)),
        ("first_p50_ms", Some(tf.p50_ms), Some(pf.p50_ms)),
        ("p99_ms", Some(ta.p99_ms), Some(pa.p99_ms)),
        ("last_p99_ms", Some(tl.p99_ms), Some(pl.p99_ms)),
        ("peak_rss_mib", t.peak_rss.map(mib), p.peak_rss.map(mib)),
    ];
    let r3 = |v: f64| (v * 1000.0).round() / 1000.0;
    let mut out = serde_json::Map::new();
    out.insert("round".into(), json!(t.round + 1));
    out.insert("peer".into(), json!(p.kind.name()));
    for (key, tv, pv) in rows {
        out.insert(
            key.into(),
            json!({
                "tandem": tv.map(r3),
                "peer": pv.map(r3),
                "ratio": tv.zip(pv).map(|(a, b)| r3(a / b.max(1e-12))),
            }),
        );
    }
    Some(serde_json::Value::Object(out))
}

/// One line of a side-by-side: `key tandem / peer = ratio`, …
fn describe_side_by_side(v: &serde_json::Value) -> String {
    let keys = [
        "server_cpu_us_per_delivery",
        "p50_ms",
        "first_p50_ms",
        "p99_ms",
        "last_p99_ms",
        "peak_rss_mib",
    ];
    let parts: Vec<String> = keys
        .iter()
        .map(|key| {
            let f = |w: &str| {
                v[*key][w]
                    .as_f64()
                    .map(|x| format!("{x:.2}"))
                    .unwrap_or_else(|| "?".into())
            };
            format!("{key} {} / {} = {}", f("tandem"), f("peer"), f("ratio"))
        })
        .collect();
    format!(
        "round {}: tandem / {}: {}",
        v["round"],
        v["peer"].as_str().unwrap_or("?"),
        parts.join(", ")
    )
}

fn cores(o: &Outcome) -> Option<f64> {
    o.server_cpu_seconds.map(|c| c / o.window_seconds)
}

/// Run the scenario.
pub async fn run(args: &FanoutArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    let against = args.against.unwrap_or(if opts.url.is_some() {
        Against::Tandem
    } else {
        Against::Both
    });
    let peers = args.peers.iter().map(|p| Kind::Peer(*p));
    let order: Vec<Kind> = match against {
        Against::Both if args.peers_first => peers.chain(std::iter::once(Kind::Tandem)).collect(),
        Against::Both => std::iter::once(Kind::Tandem).chain(peers).collect(),
        Against::Tandem => vec![Kind::Tandem],
        Against::Baseline => peers.collect(),
    };
    let mut rate = args.rate;
    let mut figures: Vec<Figures> = Vec::new();
    let plan = super::store::plan_default(opts, "fanout")?;
    let rounds = (0..args.rounds.max(1)).flat_map(|r| order.iter().map(move |k| (r, *k)));
    for (round, kind) in rounds {
        let is_tandem = kind == Kind::Tandem;
        let server = match kind {
            Kind::Tandem => Server::tandem(opts, &plan.args).await?,
            Kind::Peer(Peer::Tokio) => Server::baseline(opts).await?,
            Kind::Peer(Peer::Node) => Server::node().await?,
        };
        let name = kind.name();
        if is_tandem {
            note(format!(
                "{name}: {} at {} ({})",
                server.label, server.url, plan.label
            ));
        } else {
            note(format!("{name}: {} at {}", server.label, server.url));
        }
        let mut f = Figures {
            kind,
            round,
            label: server.label.clone(),
            max: None,
            lat: None,
            peak_rss: None,
            sweep: Vec::new(),
            sweep_integrity: Integrity::default(),
            disposal: None,
        };
        let result: anyhow::Result<()> = async {
            for &r in &args.sweep {
                let (o, _) =
                    open_phase(&server, args, opts, r, &format!("{name} sweep @{r}/s")).await?;
                let p99_ms = Summary::of(&o.all).p99_ms;
                let held = p99_ms <= args.sweep_p99_ms
                    && o.integrity.lost == 0
                    && o.incomplete == 0
                    && o.closed_early == 0;
                note(describe(
                    &o,
                    &format!("{name} sweep @{r} actions/s per chat"),
                ));
                f.sweep_integrity.add(o.integrity);
                f.sweep.push(Step {
                    rate: r,
                    deliveries_per_sec: o.deliveries_per_sec,
                    p99_ms,
                    held,
                });
                if !held {
                    break;
                }
            }
            if !args.no_max && args.sweep.is_empty() {
                let (o, _) = phase(
                    &server,
                    args,
                    opts,
                    Schedule::Closed {
                        window: args.window,
                        gate: Gate::Delivered,
                        seconds: args.max_seconds,
                        limit: u64::MAX,
                    },
                    args.max_seconds,
                    &format!("{name} max"),
                )
                .await?;
                note(describe(&o, &format!("{name} max")));
                if rate.is_none() {
                    let per_chat =
                        o.deliveries_per_sec / (args.chats * args.subscribers.max(1)) as f64;
                    rate = Some((per_chat * args.rate_fraction).max(1.0));
                }
                f.max = Some(o);
            }
            if !args.no_latency && args.sweep.is_empty() {
                let r = rate.unwrap_or(100.0);
                let start = (
                    server.rss(),
                    server.rss_anon(),
                    live_heap(&server.url).await,
                );
                let (o, sessions) =
                    open_phase(&server, args, opts, r, &format!("{name} @{r}/s")).await?;
                if args.dispose && is_tandem {
                    f.disposal = Some(dispose_all(&server, opts, &sessions, start).await?);
                }
                note(describe(
                    &o,
                    &format!("{name} latency @{r} actions/s per chat"),
                ));
                f.lat = Some(o);
            }
            f.peak_rss = server.peak_rss();
            Ok(())
        }
        .await;
        server.stop(StopHow::Term).await?;
        if is_tandem {
            plan.cleanup();
        }
        result?;
        figures.push(f);
    }

    let params = json!({
        "chats": args.chats,
        "subscribers": args.subscribers,
        "publishers": args.publishers,
        "latency_rate_per_chat": rate.map(|r| (r * 10.0).round() / 10.0),
        "seconds": args.seconds,
        "max_seconds": if args.no_max { None } else { Some(args.max_seconds) },
        "window": args.window,
        "pad": args.pad,
    });
    let mut comparisons = Vec::new();
    for t in figures.iter().filter(|f| f.kind == Kind::Tandem) {
        for p in figures
            .iter()
            .filter(|p| p.round == t.round && p.kind != Kind::Tandem)
        {
            comparisons.extend(side_by_side(t, p));
        }
    }
    let mut sweeps = Vec::new();
    let mut sweep_ratios: Vec<(Kind, f64)> = Vec::new();
    let mut sweep_short = false;
    for t in figures
        .iter()
        .filter(|f| f.kind == Kind::Tandem && !f.sweep.is_empty())
    {
        let (th, t_all) = highest_held(&t.sweep);
        sweep_short |= t_all;
        for p in figures
            .iter()
            .filter(|p| p.round == t.round && p.kind != Kind::Tandem)
        {
            let (ph, p_all) = highest_held(&p.sweep);
            sweep_short |= p_all;
            if ph == 0.0 {
                note(format!(
                    "sweep round {}: {} held no step: start the sweep lower",
                    t.round + 1,
                    p.kind.name()
                ));
                continue;
            }
            let ratio = th / ph;
            sweep_ratios.push((p.kind, ratio));
            let steps = |f: &Figures| {
                f.sweep
                    .iter()
                    .map(|s| json!({"rate": s.rate, "deliveries_per_sec": s.deliveries_per_sec.round(), "p99_ms": (s.p99_ms * 100.0).round() / 100.0, "held": s.held}))
                    .collect::<Vec<_>>()
            };
            let line = format!(
                "sweep round {}: highest rate with p99 ≤ {} ms: tandem {:.0} / {} {:.0} deliveries/s = {:.2}",
                t.round + 1,
                args.sweep_p99_ms,
                th,
                p.kind.name(),
                ph,
                ratio
            );
            note(line.clone());
            sweeps.push(json!({
                "round": t.round + 1,
                "peer": p.kind.name(),
                "tandem_highest_deliveries_per_sec": th.round(),
                "peer_highest_deliveries_per_sec": ph.round(),
                "ratio": (ratio * 1000.0).round() / 1000.0,
                "tandem_steps": steps(t),
                "peer_steps": steps(p),
            }));
        }
    }
    // The single-server figures below are each kind's first round; the
    // side-by-side rows cover every round.
    let mut main = None;
    let mut base = None;
    let mut node = None;
    for f in figures {
        let slot = match f.kind {
            Kind::Tandem => &mut main,
            Kind::Peer(Peer::Tokio) => &mut base,
            Kind::Peer(Peer::Node) => &mut node,
        };
        if slot.is_none() {
            *slot = Some(f);
        }
    }
    let mut r = ScenarioResult::new(
        "fanout",
        &main
            .as_ref()
            .or(base.as_ref())
            .or(node.as_ref())
            .map(|f| f.label.clone())
            .unwrap_or_default(),
        params,
    );
    if main.is_some() {
        r.put("store", plan.label.clone());
    }
    let mut background: f64 = 0.0;
    for f in main.iter().chain(base.iter()).chain(node.iter()) {
        for o in f.max.iter().chain(f.lat.iter()) {
            background = background.max(o.background_cores().unwrap_or(0.0));
        }
    }
    r.put("background_cpu_cores_max", background);
    if background > 0.2 {
        r.note(format!(
            "other processes used up to {background:.2} cores during a measured window: the figures are skewed; rerun on a quiet machine"
        ));
    }
    let mut integrity = Integrity::default();
    let headline = |f: &Figures| {
        f.max
            .as_ref()
            .or(f.lat.as_ref())
            .map(|o| o.deliveries_per_sec)
    };
    if let Some(f) = &main {
        r.deliveries_per_sec = headline(f);
        for o in f.max.iter().chain(f.lat.iter()) {
            integrity.add(o.integrity);
            if o.incomplete > 0 || o.closed_early > 0 || o.stalled {
                r.failed = true;
                r.note(format!(
                    "{} accepted actions never reached every subscriber; {} subscribers disconnected ({:?}); stalled: {}",
                    o.incomplete, o.closed_early, o.close_reasons, o.stalled
                ));
            }
        }
        integrity.add(f.sweep_integrity);
        if let Some(o) = &f.max {
            r.put("max_actions_per_sec", o.actions_per_sec);
            r.put_latency("max_phase_last", &Summary::of(&o.last));
            if let Some(c) = cores(o) {
                r.put("max_phase_server_cpu_cores", c);
            }
            if let Some(c) = o.loadgen_cpu_seconds {
                r.put("max_phase_loadgen_cpu_cores", c / o.window_seconds);
            }
            if let Some(c) = o.store_cpu_seconds {
                r.put("max_phase_store_cpu_cores", c / o.window_seconds);
            }
        }
        if let Some(o) = &f.lat {
            let all = Summary::of(&o.all);
            r.set_latency(&all);
            r.put_latency("last", &Summary::of(&o.last));
            r.put_latency("first", &Summary::of(&o.first));
            r.put_latency("echo", &Summary::of(&o.echo));
            r.put("latency_phase_deliveries_per_sec", o.deliveries_per_sec);
            r.put("latency_phase_actions_per_sec", o.actions_per_sec);
            r.put("latency_phase_publisher_max_behind_ms", o.max_behind_ms);
            if let Some(c) = cores(o) {
                r.put("latency_phase_server_cpu_cores", c);
            }
            if let Some(c) = o.store_cpu_seconds {
                r.put("latency_phase_store_cpu_cores", c / o.window_seconds);
            }
            r.curve("tandem → every receiver", &o.all);
            r.curve("tandem → last receiver", &o.last);
        }
        r.set_integrity(&integrity);
    }
    if let Some(b) = &base {
        r.baseline_deliveries_per_sec = headline(b);
        let mut bi = Integrity::default();
        for o in b.max.iter().chain(b.lat.iter()) {
            bi.add(o.integrity);
        }
        r.put("baseline_lost", bi.lost);
        r.put("baseline_duplicated", bi.duplicated);
        r.put("baseline_reordered", bi.reordered);
        if let Some(o) = &b.max {
            if let Some(c) = cores(o) {
                r.put("baseline_max_phase_server_cpu_cores", c);
            }
        }
        if let Some(o) = &b.lat {
            r.put_latency("baseline", &Summary::of(&o.all));
            r.put_latency("baseline_last", &Summary::of(&o.last));
            r.curve("baseline → every receiver", &o.all);
            r.curve("baseline → last receiver", &o.last);
        }
        if main.is_none() {
            r.deliveries_per_sec = None;
        }
    }
    if let Some(n) = &node {
        let mut ni = Integrity::default();
        for o in n.max.iter().chain(n.lat.iter()) {
            ni.add(o.integrity);
        }
        r.put("node_lost", ni.lost);
        r.put("node_duplicated", ni.duplicated);
        r.put("node_reordered", ni.reordered);
        if let Some(o) = &n.lat {
            r.put_latency("node", &Summary::of(&o.all));
            r.put_latency("node_last", &Summary::of(&o.last));
            r.put_latency("node_first", &Summary::of(&o.first));
            r.curve("node → every receiver", &o.all);
            r.curve("node → last receiver", &o.last);
        }
        if let Some(b) = n.peak_rss {
            r.put("node_peak_rss_bytes", b);
        }
    }
    if let Some(b) = main.as_ref().and_then(|f| f.peak_rss) {
        r.put("server_peak_rss_bytes", b);
    }
    if let Some(d) = main.as_ref().and_then(|f| f.disposal.as_ref()) {
        // Allocator and runtime slack allowed on top of the ring.
        const SLACK: u64 = 4 << 20;
        let mib = |b: u64| b as f64 / 1048576.0;
        r.put("dispose_sessions", d.sessions);
        for (key, v) in [
            ("dispose_rss_start_bytes", d.rss_start),
            ("dispose_rss_before_bytes", d.rss_before),
            ("dispose_rss_after_bytes", d.rss_after),
            ("dispose_anon_start_bytes", d.anon_start),
            ("dispose_anon_before_bytes", d.anon_before),
            ("dispose_anon_after_bytes", d.anon_after),
            ("dispose_live_start_bytes", d.live_start),
            ("dispose_live_before_bytes", d.live_before),
            ("dispose_live_after_bytes", d.live_after),
            ("dispose_ring_bytes", d.ring_bytes),
            ("dispose_ring_footprint_bytes", d.ring_footprint),
            ("dispose_store_memory_bytes", d.store_bytes),
            ("dispose_channels_left", d.channels_left),
            ("dispose_connections_left", d.connections_left),
        ] {
            if let Some(v) = v {
                r.put(key, v);
            }
        }
        if let (Some(start), Some(after)) = (d.rss_start, d.rss_after) {
            let kept = after.saturating_sub(start);
            r.note(format!(
                "server RSS after every session was disposed: {:.1} MiB above the start ({:.1} → {:.1} MiB, {:.1} before disposing), of which the program's own file pages (RssFile, mapped in as its code first runs) {:.1} → {:.1} MiB",
                mib(kept),
                mib(start),
                mib(after),
                mib(d.rss_before.unwrap_or(0)),
                mib(start.saturating_sub(d.anon_start.unwrap_or(start))),
                mib(after.saturating_sub(d.anon_after.unwrap_or(after))),
            ));
        }
        if let (Some(start), Some(after)) = (d.live_start, d.live_after) {
            r.note(format!(
                "live heap (the allocator's allocated bytes) after every session was disposed: {:.1} MiB above the start ({:.1} → {:.1} MiB, {:.1} before disposing)",
                mib(after.saturating_sub(start)),
                mib(start),
                mib(after),
                mib(d.live_before.unwrap_or(0)),
            ));
        }
        // The stated budget: the ring's whole footprint (or its envelopes,
        // from a server that does not report it) and the store engine's
        // caches, both bounded by configuration, plus allocator slack.
        let ring = d.ring_footprint.or(d.ring_bytes);
        if let (Some(start), Some(after), Some(ring)) = (d.anon_start, d.anon_after, ring) {
            let kept = after.saturating_sub(start);
            let store = d.store_bytes.unwrap_or(0);
            r.target(
                "server heap (anonymous RSS) after every session was disposed",
                "≤ the phase's start + the replay ring's footprint + the store's caches + 4 MiB",
                format!(
                    "{:.1} MiB above the start ({:.1} → {:.1} MiB, {:.1} before disposing); ring {:.1} MiB ({:.1} of envelopes), store {:.1} MiB",
                    mib(kept),
                    mib(start),
                    mib(after),
                    mib(d.anon_before.unwrap_or(0)),
                    mib(ring),
                    mib(d.ring_bytes.unwrap_or(0)),
                    mib(store)
                ),
                kept <= ring + store + SLACK,
            );
        }
    }
    for p in &args.peers {
        let name = Kind::Peer(*p).name();
        let rows: Vec<_> = comparisons
            .iter()
            .filter(|v| v["peer"] == name)
            .cloned()
            .collect();
        for row in &rows {
            note(describe_side_by_side(row));
            r.note(describe_side_by_side(row));
        }
        if !rows.is_empty() {
            r.put(&format!("vs_{name}"), serde_json::Value::Array(rows));
        }
        let ratios: Vec<f64> = sweep_ratios
            .iter()
            .filter(|(k, _)| *k == Kind::Peer(*p))
            .map(|(_, v)| *v)
            .collect();
        if let Some(m) = median(ratios.clone()) {
            r.put(&format!("sweep_ratio_median_vs_{name}"), m);
            if *p == Peer::Node {
                r.target(
                    &format!(
                        "highest rate with p99 ≤ {} ms, Tandem / Node (median of {} rounds)",
                        args.sweep_p99_ms,
                        ratios.len()
                    ),
                    "≥ 2.0 over at least 3 rounds",
                    format!("{m:.2}"),
                    m >= 2.0 && ratios.len() >= 3,
                );
            }
        }
    }
    if !sweeps.is_empty() {
        for v in &sweeps {
            r.note(format!(
                "sweep round {}: tandem {} / {} {} deliveries/s = {}",
                v["round"],
                v["tandem_highest_deliveries_per_sec"],
                v["peer"].as_str().unwrap_or("?"),
                v["peer_highest_deliveries_per_sec"],
                v["ratio"]
            ));
        }
        r.put("sweep", serde_json::Value::Array(sweeps));
        if sweep_short {
            r.note("a server held every rate of the sweep: its highest rate is at least the last one; extend --sweep");
        }
    }
    // Server CPU per delivery: what each server would do with the machine to
    // itself (the load generator shares the cores and often limits both).
    let us_per = |f: &Option<Figures>| {
        f.as_ref()
            .and_then(|f| f.max.as_ref().or(f.lat.as_ref()))
            .and_then(cpu_us_per_delivery)
    };
    let (tu, bu) = (us_per(&main), us_per(&base));
    if let Some(t) = tu {
        r.put("server_cpu_us_per_delivery", t);
    }
    // nats-server's CPU (the `jetstream` store), apart from the server's.
    let store_us = main
        .as_ref()
        .and_then(|f| f.max.as_ref().or(f.lat.as_ref()))
        .and_then(|o| {
            o.store_cpu_seconds
                .map(|c| c * 1e6 / (o.deliveries_per_sec * o.window_seconds).max(1.0))
        });
    if let Some(s) = store_us {
        r.put("store_cpu_us_per_delivery", s);
        if let Some(t) = tu {
            r.put("server_plus_store_cpu_us_per_delivery", t + s);
        }
    }
    if let Some(b) = bu {
        r.put("baseline_server_cpu_us_per_delivery", b);
    }
    if let (Some(t), Some(b)) = (tu, bu) {
        r.put("cpu_efficiency_vs_baseline", b / t.max(1e-12));
    }
    if let (Some(t), Some(b)) = (r.deliveries_per_sec, r.baseline_deliveries_per_sec) {
        let ratio = t / b.max(1e-9);
        r.put("ratio_to_baseline", ratio);
        if args.no_max {
            r.note("no max phase: the ratio compares deliveries/s at the same offered rate, not maxima");
        }
        r.target(
            "Tandem / baseline deliveries/s",
            "≥ 70%",
            format!("{:.1}%", ratio * 100.0),
            ratio >= 0.70,
        );
    }
    if main.is_some() {
        r.target(
            "lost = duplicated = reordered = 0",
            "0 / 0 / 0",
            format!(
                "{} / {} / {}",
                integrity.lost, integrity.duplicated, integrity.reordered
            ),
            integrity.clean(),
        );
        if let Some(p99) = r.extra.get("last_p99_ms").and_then(|v| v.as_f64()) {
            r.target(
                "p99 to the last receiver",
                if args.rate.is_none() && !args.no_max {
                    "≤ 25 ms at half the maximum rate"
                } else {
                    "≤ 25 ms (at the given --rate)"
                },
                format!("{p99:.2} ms"),
                p99 <= 25.0,
            );
        }
    }
    if args.chats != 1 || args.subscribers != 1000 {
        r.note("the issue's targets are stated for 1 chat × 1,000 subscribers");
    }
    r.note("loadgen and server share this machine's cores: the load generator's own CPU use lowers both servers' maxima");
    Ok(r)
}
