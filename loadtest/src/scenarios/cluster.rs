//! `cluster`: the same fan-out and drafts workloads against one Tandem on
//! SQLite (`--durability full`) and against an N-node cluster on NATS
//! JetStream, alternating round by round, with the ratios.
//!
//! In the cluster every session (but `spread`'s) is created on node 0,
//! which therefore owns it; subscribers are spread round-robin over the
//! nodes (subscriber `i` on node `i mod N`) and the writers all connect to
//! `--publish-node` (default 0, the owner). A receiver's latency is
//! recorded in its node's group, so the report can set receivers on the
//! owner against receivers on the other nodes, whose envelopes took the
//! extra path owner append → JetStream → follower consumer → follower
//! publish: the difference of their p50 and p99 is the latency a cross-node
//! hop adds.
//!
//! Shapes (each on fresh sessions and connections):
//! * `chats` — `--chats` chats × `--chat-subscribers`, one agent per chat
//!   typing `chat/draftChanged`;
//! * `fanout` — 1 chat × `--fanout-subscribers`, one agent;
//! * `drafts` — 1 chat, `--draft-writers` writers editing the answers of one
//!   open input request (`chat/inputAnswerChanged`) while
//!   `--draft-subscribers` watch; every watcher's reduced answers must equal
//!   the owner's snapshot, and every node's snapshot the owner's;
//! * `spread` — whether a cluster adds capacity: `--chats` chats ×
//!   `--chat-subscribers`, chat `i` created through node `i mod N` (which
//!   so owns it), its subscribers and its agent all on that node, nothing
//!   of it watched elsewhere (on SQLite everything is on the one node). The
//!   figure is CPU per delivery of the cluster ÷ the single node's, per
//!   round (target ≤ 1.1). Then, in the cluster only, an idle phase on the
//!   same chats, subscribed afresh: only node 0's chats get traffic while
//!   the others stay subscribed and quiet, and each other node's CPU is set
//!   against node 0's (target ≤ 5 %).
//!
//! `chats` and `fanout` first run closed-loop for `--max-seconds` (the most
//! deliveries/s), then open-loop at a fixed rate, the same for both targets,
//! for `--seconds` (latency, CPU per delivery); `drafts` and `spread` run
//! open-loop only. CPU per delivery counts every Tandem process plus
//! nats-server.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::cluster::{Nodes, Target};
use crate::conn::{unique, Endpoint};
use crate::engine::{
    connect_publisher, publish_and_collect, spawn_subscribers_on, ActionKind, Gate, Outcome,
    PhaseTiming, Publisher, Run, Schedule, SubPlan,
};
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::ServerOpts;
use crate::stats::{new_hist, Summary};

/// Which targets to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Targets {
    /// SQLite, then the cluster, each round.
    Both,
    /// One node on SQLite only.
    Sqlite,
    /// The cluster only.
    Cluster,
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShapeName {
    /// Many chats × a few subscribers each.
    Chats,
    /// One chat × many subscribers.
    Fanout,
    /// Many writers editing answers in one chat, many watchers.
    Drafts,
    /// Many chats, each owned, watched and written on one node (`i mod N`):
    /// does the cluster add capacity, and do idle nodes stay idle?
    Spread,
}

/// `cluster` flags.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Tandem nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Rounds; each runs every shape on SQLite, then on the cluster.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Which targets to run.
    #[arg(long, value_enum, default_value = "both")]
    pub targets: Targets,
    /// Shapes to run, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "chats,fanout,drafts"
    )]
    pub shapes: Vec<ShapeName>,
    /// `chats`, `spread`: chats.
    #[arg(long, default_value_t = 32)]
    pub chats: usize,
    /// `chats`, `spread`: subscribers per chat.
    #[arg(long, default_value_t = 30)]
    pub chat_subscribers: usize,
    /// `chats`, `spread`: latency phase actions/s per chat.
    #[arg(long, default_value_t = 25.0)]
    pub chat_rate: f64,
    /// `fanout`: subscribers of the one chat.
    #[arg(long, default_value_t = 1000)]
    pub fanout_subscribers: usize,
    /// `fanout`: latency phase actions/s.
    #[arg(long, default_value_t = 100.0)]
    pub fanout_rate: f64,
    /// `drafts`: writers.
    #[arg(long, default_value_t = 50)]
    pub draft_writers: usize,
    /// `drafts`: watchers.
    #[arg(long, default_value_t = 500)]
    pub draft_subscribers: usize,
    /// `drafts`: edits/s per writer.
    #[arg(long, default_value_t = 4.0)]
    pub draft_rate: f64,
    /// `drafts`: text questions in the input request.
    #[arg(long, default_value_t = 8)]
    pub questions: usize,
    /// Latency phase length, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Max phase length, seconds (`chats`, `fanout`).
    #[arg(long, default_value_t = 4.0)]
    pub max_seconds: f64,
    /// Skip the max phases.
    #[arg(long)]
    pub no_max: bool,
    /// Max phase: actions per chat in flight.
    #[arg(long, default_value_t = 64)]
    pub window: u64,
    /// Leading seconds of each phase left out of rates and latencies.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest wait for in-flight actions after publishing, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// The node the writers connect to (0 owns every session); `spread`
    /// writes each chat on its own node instead.
    #[arg(long, default_value_t = 0)]
    pub publish_node: usize,
    /// The cluster nodes' `--lease-secs`.
    #[arg(long, default_value_t = 10.0)]
    pub lease_secs: f64,
    /// Handshakes in flight while connecting subscribers.
    #[arg(long, default_value_t = 128)]
    pub connect_concurrency: usize,
}

/// One workload's sizes.
struct Shape {
    name: ShapeName,
    chats: usize,
    subscribers: usize,
    publishers: usize,
    /// Open-loop actions/s per publisher.
    rate: f64,
}

impl Shape {
    fn of(name: ShapeName, a: &ClusterArgs) -> Self {
        match name {
            ShapeName::Chats => Self {
                name,
                chats: a.chats,
                subscribers: a.chat_subscribers,
                publishers: 1,
                rate: a.chat_rate,
            },
            ShapeName::Fanout => Self {
                name,
                chats: 1,
                subscribers: a.fanout_subscribers,
                publishers: 1,
                rate: a.fanout_rate,
            },
            ShapeName::Drafts => Self {
                name,
                chats: 1,
                subscribers: a.draft_subscribers,
                publishers: a.draft_writers,
                rate: a.draft_rate,
            },
            ShapeName::Spread => Self {
                name,
                chats: a.chats,
                subscribers: a.chat_subscribers,
                publishers: 1,
                rate: a.chat_rate,
            },
        }
    }

    fn key(&self) -> String {
        match self.name {
            ShapeName::Chats => format!("chats{}x{}", self.chats, self.subscribers),
            ShapeName::Fanout => format!("fanout1x{}", self.subscribers),
            ShapeName::Drafts => format!("drafts{}w{}s", self.publishers, self.subscribers),
            ShapeName::Spread => format!("spread{}x{}", self.chats, self.subscribers),
        }
    }

    fn drafts(&self) -> bool {
        self.name == ShapeName::Drafts
    }

    fn spread(&self) -> bool {
        self.name == ShapeName::Spread
    }

    /// The node chat `c` is created through (and so owned by) among `n`:
    /// node 0 for every chat, but chat `c mod n` for `spread`.
    fn home(&self, c: usize, n: usize) -> usize {
        if self.spread() {
            c % n.max(1)
        } else {
            0
        }
    }
}

/// Convergence of a drafts phase.
#[derive(Default)]
struct Convergence {
    /// Watchers whose reduced answers differ from the owner's snapshot.
    diverged: usize,
    /// Nodes whose own snapshot's answers differ from the owner's.
    nodes_differ: usize,
}

/// The chats of a phase: each chat's URI and, for drafts, the id of its
/// open input request.
type Chats = Vec<(String, Option<String>)>;

/// Create `shape.chats` fresh chats, chat `c` through its home node
/// ([`Shape::home`]; one setup connection per node, the nodes in parallel).
async fn create_chats(
    eps: &[Arc<Endpoint>],
    shape: &Shape,
    args: &ClusterArgs,
) -> anyhow::Result<Chats> {
    let n = eps.len().max(1);
    let mut chats: Chats = Vec::with_capacity(shape.chats);
    if shape.drafts() {
        for _ in 0..shape.chats {
            let (chat, rid) = super::drafts::open_request(&eps[0], args.questions).await?;
            chats.push((chat, Some(rid)));
        }
        return Ok(chats);
    }
    // Node k creates the chats c with home(c) == k, in order.
    let mut per_node = futures_util::future::try_join_all((0..n).map(|k| {
        let ep = eps[k].clone();
        let count = (0..shape.chats).filter(|&c| shape.home(c, n) == k).count();
        async move {
            let mut made = Vec::with_capacity(count);
            if count > 0 {
                let mut setup = ep.client(&unique("setup")).await?;
                for _ in 0..count {
                    made.push(setup.create_session().await?.1);
                }
                setup.close().await;
            }
            anyhow::Ok(made.into_iter())
        }
    }))
    .await?;
    for c in 0..shape.chats {
        let chat = per_node[shape.home(c, n)]
            .next()
            .expect("a chat per planned slot");
        chats.push((chat, None));
    }
    Ok(chats)
}

/// One phase of one shape on one target, on `chats` ([`create_chats`]).
/// With `busy_node`, only the chats whose home is that node get traffic;
/// the others keep their subscribers and a writer that sends nothing.
#[allow(clippy::too_many_arguments)]
async fn phase(
    nodes: &Nodes,
    eps: &[Arc<Endpoint>],
    shape: &Shape,
    args: &ClusterArgs,
    chats: &Chats,
    busy_node: Option<usize>,
    schedule: Schedule,
    seconds: f64,
    label: &str,
) -> anyhow::Result<(Outcome, Option<Convergence>)> {
    let n = eps.len();
    let questions: Vec<String> = (0..args.questions.max(1))
        .map(|i| format!("q{i}"))
        .collect();
    let p = shape.publishers.max(1);
    let slots = match schedule {
        Schedule::Open { count, .. } => count as usize + 1,
        Schedule::Closed { window, .. } => 4 * window as usize + 4,
    };
    let run = Run::with_groups(shape.chats * p, slots, n);
    let mut publishers = Vec::new();
    for (c, (chat, rid)) in chats.iter().enumerate() {
        let home = shape.home(c, n);
        // A spread chat is written on its own node.
        let pub_ep = if shape.spread() {
            &eps[home]
        } else {
            &eps[args.publish_node % n]
        };
        let schedule = if busy_node.is_some_and(|b| b != home) {
            quiet(schedule)
        } else {
            schedule
        };
        for k in 0..p {
            let index = (c * p + k) as u32;
            let client_id = unique(&format!("writer-{index}"));
            let ws = connect_publisher(pub_ep, &client_id).await?;
            let kind = match rid {
                Some(r) => ActionKind::Answer {
                    request_id: r.clone(),
                    questions: questions.clone(),
                },
                None => ActionKind::Draft { pad: 0 },
            };
            publishers.push((
                Publisher {
                    index,
                    client_id,
                    chat: chat.clone(),
                    kind,
                    schedule,
                    offset: k * 7,
                },
                ws,
            ));
        }
    }
    let mut plans = Vec::new();
    for (c, (chat, _)) in chats.iter().enumerate() {
        for s in 0..shape.subscribers {
            // A spread chat is watched on its own node only; otherwise the
            // subscribers go round-robin over the nodes, each in its node's
            // latency group (0: the owner's).
            let (node, group) = if shape.spread() {
                (shape.home(c, n), 0)
            } else {
                (plans.len() % n, plans.len() % n)
            };
            plans.push(SubPlan {
                id: plans.len(),
                client_id: unique(&format!("sub-{c}-{s}")),
                chat: chat.clone(),
                pub_base: (c * p) as u32,
                pubs: p,
                mirror: shape.drafts(),
                node,
                group,
            });
        }
    }
    let total = plans.len();
    let (subs, errors) = spawn_subscribers_on(
        eps,
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
            shape.subscribers as u32,
            std::sync::atomic::Ordering::Release,
        );
    }
    let o = publish_and_collect(
        run,
        publishers,
        subs,
        PhaseTiming {
            seconds,
            warmup: args.warmup.min(seconds / 2.0),
            drain: args.drain,
            label: label.to_owned(),
            server_pids: nodes.pids(),
        },
    )
    .await?;
    let conv = if shape.drafts() {
        let mut conv = Convergence::default();
        for (chat, rid) in chats {
            let Some(rid) = rid else { continue };
            let mut per_node = Vec::with_capacity(n);
            for ep in eps {
                let mut c = ep.client(&unique("drafts-check")).await?;
                let snap = c.subscribe(chat).await?;
                c.close().await;
                let state: ahp_types::state::ChatState = serde_json::from_value(snap.state)?;
                per_node.push(super::drafts::answers(&state, rid));
            }
            conv.nodes_differ += per_node.iter().filter(|a| **a != per_node[0]).count();
            for rx in o.receivers.iter().filter(|r| &r.chat == chat) {
                let mine = rx
                    .mirror
                    .as_ref()
                    .and_then(|m| super::drafts::answers(&m.state, rid));
                if mine.is_none() || mine != per_node[0] {
                    conv.diverged += 1;
                }
            }
        }
        Some(conv)
    } else {
        None
    };
    Ok((o, conv))
}

/// The same schedule sending nothing: a quiet chat's writer stays connected
/// and idle.
fn quiet(schedule: Schedule) -> Schedule {
    match schedule {
        Schedule::Open { rate, .. } => Schedule::Open { rate, count: 0 },
        Schedule::Closed {
            window,
            gate,
            seconds,
            ..
        } => Schedule::Closed {
            window,
            gate,
            seconds,
            limit: 0,
        },
    }
}

/// What one shape measured on one target in one round.
#[derive(Default, Clone)]
struct Fig {
    max_deliveries_per_sec: Option<f64>,
    lat_deliveries_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    last_p99_ms: f64,
    /// Tandem processes + nats-server, latency phase.
    cpu_us_per_delivery: Option<f64>,
    /// Each Tandem process, latency phase.
    node_cpu_us: Vec<f64>,
    nats_cpu_us: Option<f64>,
    owner: Summary,
    others: Summary,
    problems: Vec<String>,
    /// The round (1-based).
    round: usize,
    /// Every phase delivered every accepted action to every subscriber,
    /// once and in order, and (`spread`) every scheduled action was sent
    /// and accepted. A figure counts only then.
    complete: bool,
    /// `spread`'s idle phase (cluster only): each node's CPU, in cores.
    idle_node_cores: Vec<f64>,
    /// The same for nats-server.
    idle_nats_cores: Option<f64>,
    /// Node `k`'s CPU ÷ node 0's in the idle phase, for `k` = 1…N−1.
    idle_node_share: Vec<f64>,
    /// Deliveries/s of the idle phase (node 0's chats only).
    idle_deliveries_per_sec: f64,
    /// Latency phase: actions received by subscribers (each once), and
    /// accepted actions × subscribers per chat.
    delivered: u64,
    expected: u64,
    /// The same for the idle phase.
    idle_delivered: u64,
    idle_expected: u64,
}

/// Actions received (each once) over every receiver, and accepted actions ×
/// subscribers per chat: equal when every delivery arrived.
fn counts(o: &Outcome, shape: &Shape) -> (u64, u64) {
    let delivered = o.receivers.iter().map(|r| r.delivered).sum();
    (delivered, o.accepted * shape.subscribers as u64)
}

fn per_delivery(cpu_s: f64, o: &Outcome) -> f64 {
    cpu_s * 1e6 / (o.deliveries_per_sec * o.window_seconds).max(1.0)
}

/// Push a problem unless every accepted action reached every subscriber
/// once and in order; true when clean.
fn check(o: &Outcome, what: &str, problems: &mut Vec<String>) -> bool {
    let i = o.integrity;
    let clean =
        i.clean() && o.incomplete == 0 && o.closed_early == 0 && !o.stalled && o.rejected == 0;
    if !clean {
        problems.push(format!(
            "{what}: lost {} dup {} reord {}, {} accepted actions not at every subscriber, {} \
             rejected, {} subscribers disconnected {:?}, stalled {}",
            i.lost,
            i.duplicated,
            i.reordered,
            o.incomplete,
            o.rejected,
            o.closed_early,
            o.close_reasons,
            o.stalled
        ));
    }
    clean
}

/// `spread`: also every scheduled action was sent and accepted, and the
/// drain ended in time (an open-loop writer that fell behind and was cut
/// short would otherwise pass with fewer deliveries). True when so.
fn check_sent(o: &Outcome, scheduled: u64, what: &str, problems: &mut Vec<String>) -> bool {
    let ok = o.sent == scheduled && o.accepted == scheduled && o.drained;
    if !ok {
        problems.push(format!(
            "{what}: {} of {scheduled} scheduled actions sent, {} accepted, drained {}",
            o.sent, o.accepted, o.drained
        ));
    }
    ok
}

/// Note a phase whose window other processes shared.
fn skew(o: &Outcome, what: &str, problems: &mut Vec<String>) {
    if let Some(b) = o.background_cores() {
        if b > 0.3 {
            problems.push(format!(
                "{what}: other processes used {b:.2} cores (figures skewed)"
            ));
        }
    }
}

/// Run every phase of `shape` on `nodes`.
async fn measure(
    nodes: &Nodes,
    shape: &Shape,
    args: &ClusterArgs,
    opts: &ServerOpts,
    tag: &str,
    round: usize,
) -> anyhow::Result<Fig> {
    let eps = nodes.endpoints(opts.source_ips).await?;
    let mut f = Fig {
        round,
        complete: true,
        ..Fig::default()
    };
    if !args.no_max && !shape.drafts() && !shape.spread() {
        let chats = create_chats(&eps, shape, args).await?;
        let (o, _) = phase(
            nodes,
            &eps,
            shape,
            args,
            &chats,
            None,
            Schedule::Closed {
                window: args.window,
                gate: Gate::Delivered,
                seconds: args.max_seconds,
                limit: u64::MAX,
            },
            args.max_seconds,
            &format!("{tag} max"),
        )
        .await?;
        f.complete &= check(&o, "max phase", &mut f.problems);
        f.max_deliveries_per_sec = Some(o.deliveries_per_sec);
    }
    let count = (shape.rate * args.seconds).ceil() as u64;
    let chats = create_chats(&eps, shape, args).await?;
    let (o, conv) = phase(
        nodes,
        &eps,
        shape,
        args,
        &chats,
        None,
        Schedule::Open {
            rate: shape.rate,
            count,
        },
        args.seconds,
        &format!("{tag} @{}/s", shape.rate),
    )
    .await?;
    f.complete &= check(&o, "latency phase", &mut f.problems);
    if shape.spread() {
        let scheduled = count * (shape.chats * shape.publishers.max(1)) as u64;
        f.complete &= check_sent(&o, scheduled, "latency phase", &mut f.problems);
    }
    (f.delivered, f.expected) = counts(&o, shape);
    if let Some(c) = conv {
        if c.diverged > 0 || c.nodes_differ > 0 {
            f.complete = false;
            f.problems.push(format!(
                "drafts: {} watchers' answers differ from the owner's snapshot, {} nodes' \
                 snapshots differ from the owner's",
                c.diverged, c.nodes_differ
            ));
        }
    }
    f.lat_deliveries_per_sec = o.deliveries_per_sec;
    let all = Summary::of(&o.all);
    f.p50_ms = all.p50_ms;
    f.p99_ms = all.p99_ms;
    f.last_p99_ms = Summary::of(&o.last).p99_ms;
    f.node_cpu_us = o
        .server_cpu_seconds_each
        .iter()
        .map(|&c| per_delivery(c, &o))
        .collect();
    f.nats_cpu_us = o.store_cpu_seconds.map(|c| per_delivery(c, &o));
    f.cpu_us_per_delivery = o
        .server_cpu_seconds
        .map(|c| per_delivery(c + o.store_cpu_seconds.unwrap_or(0.0), &o));
    if let Some(g) = o.groups.first() {
        f.owner = Summary::of(g);
    }
    let mut others: Histogram<u64> = new_hist();
    for g in o.groups.iter().skip(1) {
        let _ = others.add(g);
    }
    f.others = Summary::of(&others);
    skew(&o, "latency phase", &mut f.problems);
    if shape.spread() && eps.len() > 1 {
        idle_phase(nodes, &eps, shape, args, &chats, tag, &mut f).await?;
    }
    note(format!(
        "{tag}: max {} deliveries/s; @{}/s: {:.0} deliveries/s, p50 {:.2} p99 {:.2} ms, last p99 {:.2} ms, cpu {:.2} µs/delivery (nodes {:?}, nats {:.2}); owner p50/p99 {:.2}/{:.2}, others {:.2}/{:.2} ms",
        f.max_deliveries_per_sec.map(|d| format!("{d:.0}")).unwrap_or("-".into()),
        shape.rate,
        f.lat_deliveries_per_sec,
        f.p50_ms,
        f.p99_ms,
        f.last_p99_ms,
        f.cpu_us_per_delivery.unwrap_or(f64::NAN),
        f.node_cpu_us.iter().map(|u| (u * 100.0).round() / 100.0).collect::<Vec<_>>(),
        f.nats_cpu_us.unwrap_or(0.0),
        f.owner.p50_ms,
        f.owner.p99_ms,
        f.others.p50_ms,
        f.others.p99_ms,
    ));
    if !f.idle_node_share.is_empty() {
        note(format!(
            "{tag} idle (node 0's chats only): {:.0} deliveries/s, node cores {:?}, nats {:.3}; \
             nodes 1… ÷ node 0: {:?}",
            f.idle_deliveries_per_sec,
            f.idle_node_cores.iter().map(|c| r3(*c)).collect::<Vec<_>>(),
            f.idle_nats_cores.unwrap_or(0.0),
            f.idle_node_share.iter().map(|c| r3(*c)).collect::<Vec<_>>(),
        ));
    }
    for p in &f.problems {
        note(format!("{tag}: {p}"));
    }
    Ok(f)
}

/// `spread`'s second phase, on the cluster: the same chats, freshly
/// subscribed, but only node 0's chats get traffic (the same per-chat
/// rate); every node's CPU is read apart, and each other node's is set
/// against node 0's.
async fn idle_phase(
    nodes: &Nodes,
    eps: &[Arc<Endpoint>],
    shape: &Shape,
    args: &ClusterArgs,
    chats: &Chats,
    tag: &str,
    f: &mut Fig,
) -> anyhow::Result<()> {
    let n = eps.len();
    let count = (shape.rate * args.seconds).ceil() as u64;
    let (o, _) = phase(
        nodes,
        eps,
        shape,
        args,
        chats,
        Some(0),
        Schedule::Open {
            rate: shape.rate,
            count,
        },
        args.seconds,
        &format!("{tag} idle @{}/s", shape.rate),
    )
    .await?;
    f.complete &= check(&o, "idle phase", &mut f.problems);
    let busy = (0..shape.chats).filter(|&c| shape.home(c, n) == 0).count();
    let scheduled = count * (busy * shape.publishers.max(1)) as u64;
    f.complete &= check_sent(&o, scheduled, "idle phase", &mut f.problems);
    skew(&o, "idle phase", &mut f.problems);
    let secs = o.window_seconds.max(1e-9);
    f.idle_node_cores = o.server_cpu_seconds_each.iter().map(|c| c / secs).collect();
    f.idle_nats_cores = o.store_cpu_seconds.map(|c| c / secs);
    f.idle_deliveries_per_sec = o.deliveries_per_sec;
    (f.idle_delivered, f.idle_expected) = counts(&o, shape);
    if let Some((&c0, rest)) = o.server_cpu_seconds_each.split_first() {
        f.idle_node_share = rest.iter().map(|c| c / c0.max(1e-9)).collect();
    }
    Ok(())
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Figures of one shape, by target, one entry per round.
#[derive(Default)]
struct Series {
    sqlite: Vec<Fig>,
    cluster: Vec<Fig>,
}

/// Run the scenario.
pub async fn run(args: &ClusterArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    let mut targets = Vec::new();
    if args.targets != Targets::Cluster {
        targets.push(Target::Sqlite);
    }
    if args.targets != Targets::Sqlite {
        targets.push(Target::Cluster {
            nodes: args.nodes.max(1),
        });
    }
    let shapes: Vec<Shape> = args.shapes.iter().map(|&s| Shape::of(s, args)).collect();
    let mut series: Vec<Series> = shapes.iter().map(|_| Series::default()).collect();
    // Correctness failures, and phases other processes shared (notes only).
    let mut failed = Vec::new();
    let mut skewed = Vec::new();
    let mut labels = Vec::new();
    for round in 1..=args.rounds.max(1) {
        for &target in &targets {
            let nodes = Nodes::start(target, opts, args.lease_secs).await?;
            note(format!("round {round}, {}: {}", target.name(), nodes.label));
            if round == 1 {
                labels.push(nodes.label.clone());
            }
            for (shape, s) in shapes.iter().zip(series.iter_mut()) {
                let tag = format!("r{round} {} {}", target.name(), shape.key());
                match measure(&nodes, shape, args, opts, &tag, round).await {
                    Ok(f) => {
                        let (skew, fail): (Vec<&String>, Vec<&String>) = f
                            .problems
                            .iter()
                            .partition(|p| p.ends_with("(figures skewed)"));
                        let join = |ps: Vec<&String>| {
                            ps.into_iter().cloned().collect::<Vec<_>>().join("; ")
                        };
                        if !fail.is_empty() {
                            failed.push(format!("{tag}: {}", join(fail)));
                        }
                        if !skew.is_empty() {
                            skewed.push(format!("{tag}: {}", join(skew)));
                        }
                        match target {
                            Target::Sqlite => s.sqlite.push(f),
                            Target::Cluster { .. } => s.cluster.push(f),
                        }
                    }
                    Err(e) => {
                        note(format!("{tag} failed: {e:#}"));
                        failed.push(format!(
                            "{tag} failed: {e:#} (logs: {})",
                            nodes.logs().join(", ")
                        ));
                    }
                }
            }
            nodes.stop().await;
        }
    }
    let params = serde_json::to_value(format!("{args:?}")).unwrap_or(Value::Null);
    let mut r = ScenarioResult::new("cluster", &labels.join(" vs "), params);
    for (shape, s) in shapes.iter().zip(&series) {
        if shape.spread() {
            // A round that did not deliver everything is a failure, not a
            // figure.
            let done = |v: &[Fig]| v.iter().filter(|f| f.complete).cloned().collect();
            let s = Series {
                sqlite: done(&s.sqlite),
                cluster: done(&s.cluster),
            };
            report_shape(&mut r, shape, &s);
            report_spread(&mut r, shape, &s, args);
        } else {
            report_shape(&mut r, shape, s);
        }
    }
    for f in failed.iter().chain(&skewed) {
        r.note(f.clone());
    }
    // Every problem but a busy machine is a correctness failure.
    r.failed = !failed.is_empty();
    r.note(
        "CPU per delivery = CPU of every Tandem process plus nats-server over deliveries, in \
         the latency phase (same offered rate on both targets); every cluster node applies \
         every batch",
    );
    Ok(r)
}

/// Per-round lists, means and cluster ÷ SQLite ratios of one shape.
fn report_shape(r: &mut ScenarioResult, shape: &Shape, s: &Series) {
    let k = shape.key();
    type Get = fn(&Fig) -> Option<f64>;
    let metrics: [(&str, Get); 10] = [
        ("max_deliveries_per_sec", |f| f.max_deliveries_per_sec),
        ("lat_deliveries_per_sec", |f| Some(f.lat_deliveries_per_sec)),
        ("p50_ms", |f| Some(f.p50_ms)),
        ("p99_ms", |f| Some(f.p99_ms)),
        ("last_p99_ms", |f| Some(f.last_p99_ms)),
        ("cpu_us_per_delivery", |f| f.cpu_us_per_delivery),
        ("nats_cpu_us_per_delivery", |f| f.nats_cpu_us),
        ("owner_p50_ms", |f| {
            (f.owner.count > 0).then_some(f.owner.p50_ms)
        }),
        ("owner_p99_ms", |f| {
            (f.owner.count > 0).then_some(f.owner.p99_ms)
        }),
        ("others_p99_ms", |f| {
            (f.others.count > 0).then_some(f.others.p99_ms)
        }),
    ];
    let mut lines = Vec::new();
    for (name, get) in metrics {
        // Every `spread` receiver is on its chat's owner: no owner/others.
        if shape.spread() && (name.starts_with("owner_") || name.starts_with("others_")) {
            continue;
        }
        let sq: Vec<f64> = s.sqlite.iter().filter_map(get).collect();
        let cl: Vec<f64> = s.cluster.iter().filter_map(get).collect();
        if sq.is_empty() && cl.is_empty() {
            continue;
        }
        r.put(
            &format!("{k}.{name}"),
            json!({"sqlite": sq.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
                   "cluster": cl.iter().map(|x| r3(*x)).collect::<Vec<_>>()}),
        );
        let (ms, mc) = (mean(&sq), mean(&cl));
        let ratio = ms.zip(mc).map(|(a, b)| b / a.max(1e-12));
        if let Some(x) = ratio {
            r.put(&format!("{k}.{name}.cluster_over_sqlite"), r3(x));
        }
        let m = |x: Option<f64>| x.map(|x| format!("{:.3}", r3(x))).unwrap_or("-".into());
        lines.push(format!(
            "{name}: mean sqlite {} cluster {}{}",
            m(ms),
            m(mc),
            ratio
                .map(|x| format!(" → cluster/sqlite {x:.2}×"))
                .unwrap_or_default()
        ));
    }
    // The cross-node hop: followers' receivers minus the owner's, per round.
    let hop50: Vec<f64> = s
        .cluster
        .iter()
        .filter(|f| f.others.count > 0)
        .map(|f| f.others.p50_ms - f.owner.p50_ms)
        .collect();
    let hop99: Vec<f64> = s
        .cluster
        .iter()
        .filter(|f| f.others.count > 0)
        .map(|f| f.others.p99_ms - f.owner.p99_ms)
        .collect();
    if !hop50.is_empty() {
        r.put(
            &format!("{k}.hop_p50_ms"),
            json!(hop50.iter().map(|x| r3(*x)).collect::<Vec<_>>()),
        );
        r.put(
            &format!("{k}.hop_p99_ms"),
            json!(hop99.iter().map(|x| r3(*x)).collect::<Vec<_>>()),
        );
        lines.push(format!(
            "cross-node hop (others − owner): p50 {:?} ms, p99 {:?} ms",
            hop50.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
            hop99.iter().map(|x| r3(*x)).collect::<Vec<_>>()
        ));
    }
    let splits: Vec<String> = s
        .cluster
        .iter()
        .map(|f| {
            format!(
                "nodes {:?} + nats {:.2}",
                f.node_cpu_us.iter().map(|u| r3(*u)).collect::<Vec<_>>(),
                f.nats_cpu_us.unwrap_or(0.0)
            )
        })
        .collect();
    if !splits.is_empty() {
        lines.push(format!(
            "cluster CPU µs/delivery split: {}",
            splits.join("; ")
        ));
    }
    for l in lines {
        r.note(format!("{k} {l}"));
    }
}

/// Bounds from the issue: the cluster's CPU per delivery over the single
/// node's, and an idle node's CPU over the busy node's.
const CLUSTER_OVER_SINGLE_MAX: f64 = 1.1;
const IDLE_NODE_SHARE_MAX: f64 = 0.05;

/// `spread`'s own figures, one value per round (null where that round's
/// target failed), from rounds that delivered everything: CPU per delivery
/// of the single node and of the cluster, their ratio, and each idle
/// node's share of node 0's CPU; with the two targets.
fn report_spread(r: &mut ScenarioResult, shape: &Shape, s: &Series, args: &ClusterArgs) {
    let k = shape.key();
    let rounds = args.rounds.max(1);
    let idle_nodes = args.nodes.max(1) - 1;
    let of = |v: &[Fig], round: usize| v.iter().find(|f| f.round == round && f.complete).cloned();
    let mut single = Vec::new();
    let mut cluster = Vec::new();
    let mut ratio = Vec::new();
    let mut share: Vec<Vec<Option<f64>>> = vec![Vec::new(); idle_nodes];
    let mut rows = Vec::new();
    for round in 1..=rounds {
        let sq = of(&s.sqlite, round);
        let cl = of(&s.cluster, round);
        let a = sq.as_ref().and_then(|f| f.cpu_us_per_delivery);
        let b = cl.as_ref().and_then(|f| f.cpu_us_per_delivery);
        let x = a.zip(b).map(|(a, b)| b / a.max(1e-12));
        let sh: Vec<Option<f64>> = (0..idle_nodes)
            .map(|i| cl.as_ref().and_then(|f| f.idle_node_share.get(i).copied()))
            .collect();
        for (i, v) in sh.iter().enumerate() {
            share[i].push(v.map(r3));
        }
        single.push(a.map(r3));
        cluster.push(b.map(r3));
        ratio.push(x.map(r3));
        rows.push(json!({
            "round": round,
            "single_cpu_per_delivery_us": a.map(r3),
            "cluster_cpu_per_delivery_us": b.map(r3),
            "cluster_over_single": x.map(r3),
            "cluster_node_cpu_per_delivery_us":
                cl.as_ref().map(|f| f.node_cpu_us.iter().map(|u| r3(*u)).collect::<Vec<_>>()),
            "cluster_nats_cpu_per_delivery_us": cl.as_ref().and_then(|f| f.nats_cpu_us).map(r3),
            "idle_node_share": sh.iter().map(|v| v.map(r3)).collect::<Vec<_>>(),
            "idle_node_cores":
                cl.as_ref().map(|f| f.idle_node_cores.iter().map(|c| r3(*c)).collect::<Vec<_>>()),
            "idle_nats_cores": cl.as_ref().and_then(|f| f.idle_nats_cores).map(r3),
            "idle_deliveries_per_sec": cl.as_ref().map(|f| f.idle_deliveries_per_sec.round()),
            "single_delivered": sq.as_ref().map(|f| f.delivered),
            "single_expected": sq.as_ref().map(|f| f.expected),
            "cluster_delivered": cl.as_ref().map(|f| f.delivered),
            "cluster_expected": cl.as_ref().map(|f| f.expected),
            "idle_delivered": cl.as_ref().map(|f| f.idle_delivered),
            "idle_expected": cl.as_ref().map(|f| f.idle_expected),
        }));
        let pct = |v: &Option<f64>| {
            v.map(|x| format!("{:.1} %", 100.0 * x))
                .unwrap_or("-".into())
        };
        let us = |v: Option<f64>| v.map(|x| format!("{x:.3} µs")).unwrap_or("-".into());
        r.note(format!(
            "{k} round {round}: CPU per delivery single {}, cluster {} → cluster/single {}; \
             idle nodes' CPU ÷ node 0's: {}",
            us(a),
            us(b),
            x.map(|x| format!("{x:.3}×")).unwrap_or("-".into()),
            sh.iter()
                .enumerate()
                .map(|(i, v)| format!("node{} {}", i + 1, pct(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    r.put(
        &format!("{k}.cpu_per_delivery_us"),
        json!({"single": single, "cluster": cluster}),
    );
    r.put(&format!("{k}.cluster_over_single"), json!(ratio));
    let by_node: serde_json::Map<String, Value> = share
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("node{}", i + 1), json!(v)))
        .collect();
    r.put(&format!("{k}.idle_node_share"), Value::Object(by_node));
    r.put(&format!("{k}.rounds"), json!(rows));
    let some = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(" · ")
    };
    let ratios = some(&ratio);
    if let Some(m) = mean(&ratios) {
        r.put(&format!("{k}.cluster_over_single_mean"), r3(m));
        r.target(
            &format!("{k}: cluster CPU per delivery ÷ single node's (mean of rounds)"),
            &format!("≤ {CLUSTER_OVER_SINGLE_MAX}"),
            format!("{m:.3} (rounds {})", list(&ratios)),
            m <= CLUSTER_OVER_SINGLE_MAX,
        );
    }
    // The busiest idle node, by its mean over rounds.
    let worst = share
        .iter()
        .enumerate()
        .filter_map(|(i, v)| mean(&some(v)).map(|m| (i + 1, m, some(v))))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((node, m, per_round)) = worst {
        r.put(&format!("{k}.idle_node_share_max"), r3(m));
        r.target(
            &format!(
                "{k}: an idle node's CPU ÷ the busy node's (busiest idle node, mean of rounds)"
            ),
            &format!("≤ {:.0} %", 100.0 * IDLE_NODE_SHARE_MAX),
            format!(
                "node{node} {:.1} % (rounds {})",
                100.0 * m,
                per_round
                    .iter()
                    .map(|x| format!("{:.1} %", 100.0 * x))
                    .collect::<Vec<_>>()
                    .join(" · ")
            ),
            m <= IDLE_NODE_SHARE_MAX,
        );
    }
    r.note(format!(
        "{k}: chat i is created, watched and written on node i mod {}; CPU per delivery = \
         every Tandem process plus nats-server over deliveries at {}/s per chat on both \
         targets; idle share = a node's CPU ÷ node 0's while only node 0's chats get traffic \
         (the others subscribed and quiet); rounds that lost, duplicated, reordered or did \
         not send an action count as failures, not figures",
        args.nodes.max(1),
        shape.rate
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(owner_p50: f64, others_p50: f64, cpu: f64) -> Fig {
        let s = |p50: f64| Summary {
            count: 10,
            p50_ms: p50,
            p99_ms: 2.0 * p50,
            ..Summary::default()
        };
        Fig {
            cpu_us_per_delivery: Some(cpu),
            owner: s(owner_p50),
            others: s(others_p50),
            ..Fig::default()
        }
    }

    #[test]
    fn report_has_ratios_and_the_hop_per_round() {
        let args = ClusterArgs::parse_from_defaults();
        let shape = Shape::of(ShapeName::Fanout, &args);
        let single = Fig {
            others: Summary::default(),
            ..fig(1.0, 0.0, 2.0)
        };
        let s = Series {
            sqlite: vec![single.clone(), single],
            cluster: vec![fig(1.0, 3.0, 5.0), fig(2.0, 3.0, 7.0)],
        };
        let mut r = ScenarioResult::default();
        report_shape(&mut r, &shape, &s);
        let get = |k: &str| r.extra.get(k).cloned().unwrap_or(Value::Null);
        assert_eq!(
            get("fanout1x1000.cpu_us_per_delivery.cluster_over_sqlite"),
            json!(3.0)
        );
        assert_eq!(get("fanout1x1000.hop_p50_ms"), json!([2.0, 1.0]));
        assert_eq!(get("fanout1x1000.hop_p99_ms"), json!([4.0, 2.0]));
        assert_eq!(
            get("fanout1x1000.others_p99_ms"),
            json!({"sqlite": [], "cluster": [6.0, 6.0]}),
            "a single node has no receivers on other nodes"
        );
    }

    #[test]
    fn spread_homes_chat_i_on_node_i_mod_n_and_the_others_on_node_0() {
        let args = ClusterArgs::parse_from_defaults();
        let spread = Shape::of(ShapeName::Spread, &args);
        let chats = Shape::of(ShapeName::Chats, &args);
        assert_eq!(
            (0..7).map(|c| spread.home(c, 3)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2, 0]
        );
        assert!((0..7).all(|c| spread.home(c, 1) == 0 && chats.home(c, 3) == 0));
        assert_eq!(spread.key(), "spread32x30");
        assert!(matches!(
            quiet(Schedule::Open {
                rate: 5.0,
                count: 9
            }),
            Schedule::Open { count: 0, .. }
        ));
    }

    #[test]
    fn spread_report_pairs_rounds_and_a_failed_round_is_no_figure() {
        let mut args = ClusterArgs::parse_from_defaults();
        args.rounds = 2;
        args.shapes = vec![ShapeName::Spread];
        let shape = Shape::of(ShapeName::Spread, &args);
        let f = |round: usize, cpu: f64, complete: bool, share: Vec<f64>| Fig {
            round,
            complete,
            cpu_us_per_delivery: Some(cpu),
            idle_node_share: share,
            ..Fig::default()
        };
        let s = Series {
            sqlite: vec![f(1, 2.0, true, vec![]), f(2, 4.0, true, vec![])],
            cluster: vec![
                f(1, 2.1, true, vec![0.02, 0.5]),
                f(2, 9.0, false, vec![0.9, 0.9]),
            ],
        };
        let mut r = ScenarioResult::default();
        report_spread(&mut r, &shape, &s, &args);
        let get = |k: &str| r.extra.get(k).cloned().unwrap_or(Value::Null);
        assert_eq!(
            get("spread32x30.cpu_per_delivery_us"),
            json!({"single": [2.0, 4.0], "cluster": [2.1, null]})
        );
        assert_eq!(get("spread32x30.cluster_over_single"), json!([1.05, null]));
        assert_eq!(
            get("spread32x30.idle_node_share"),
            json!({"node1": [0.02, null], "node2": [0.5, null]})
        );
        assert_eq!(get("spread32x30.cluster_over_single_mean"), json!(1.05));
        assert_eq!(get("spread32x30.idle_node_share_max"), json!(0.5));
        assert_eq!(get("spread32x30.rounds").as_array().map(Vec::len), Some(2));
        let met: Vec<bool> = r.targets.iter().map(|t| t.met).collect();
        assert_eq!(met, [true, false], "{:?}", r.targets);
    }

    impl ClusterArgs {
        fn parse_from_defaults() -> Self {
            #[derive(clap::Parser)]
            struct Cli {
                #[command(flatten)]
                args: ClusterArgs,
            }
            <Cli as clap::Parser>::parse_from(["cluster"]).args
        }
    }
}
