//! `durable`: many chats writing at once, each agent keeping `--window`
//! actions in flight until its own echo returns (or sending at `--rate`);
//! measures accepted actions/s and the publish → echo latency. With a store
//! (`--durability full`, the default) an echo means "durable" (DESIGN
//! invariant 1), so this prices the journal's group commit.
//!
//! The store flags are passed to the spawned server (see [`super::store`]).
//! Until the server has them the scenario refuses to run unless
//! `--durability none` says to measure the in-memory journal.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use clap::Args;
use serde_json::json;

use super::store::{self, StoreArgs};
use crate::conn::{unique, Endpoint};
use crate::engine::{
    connect_publisher, publish_and_collect, spawn_subscribers, ActionKind, Gate, PhaseTiming,
    Publisher, Run, Schedule, SubPlan,
};
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts, StopHow};
use crate::stats::Summary;

/// `durable` flags.
#[derive(Args, Debug, Clone)]
pub struct DurableArgs {
    /// Chats written at once (one agent each).
    #[arg(long, default_value_t = 32)]
    pub chats: usize,
    /// Actions per chat in flight until echoed (closed loop).
    #[arg(long, default_value_t = 8)]
    pub window: u64,
    /// Send at this many actions/s per chat instead (open loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Subscribers per chat (0: echoes only).
    #[arg(long, default_value_t = 0)]
    pub subscribers: usize,
    /// Seconds of writing.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Leading seconds left out of rates and latencies.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest wait for in-flight actions afterwards, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Run the scenario.
pub async fn run(args: &DurableArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    let plan = store::plan(&args.store, opts, "durable")?;
    let server = Server::tandem(opts, &plan.args).await?;
    note(format!(
        "tandem: {} at {} ({})",
        server.label, server.url, plan.label
    ));
    let res = run_on(&server, args, opts, &plan.label).await;
    server.stop(StopHow::Term).await?;
    plan.cleanup();
    res
}

async fn run_on(
    server: &Server,
    args: &DurableArgs,
    opts: &ServerOpts,
    store_label: &str,
) -> anyhow::Result<ScenarioResult> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let mut setup = ep.client(&unique("durable-setup")).await?;
    let mut chats = Vec::new();
    for _ in 0..args.chats.max(1) {
        chats.push(setup.create_session().await?.1);
    }
    setup.close().await;
    let (schedule, slots) = match args.rate {
        Some(rate) => {
            let count = (rate * args.seconds).ceil() as u64;
            (Schedule::Open { rate, count }, count as usize + 1)
        }
        None => (
            Schedule::Closed {
                window: args.window.max(1),
                gate: Gate::Echoed,
                seconds: args.seconds,
                limit: u64::MAX,
            },
            4 * args.window.max(1) as usize + 4,
        ),
    };
    let run = Run::new(chats.len(), slots);
    let mut publishers = Vec::new();
    for (c, chat) in chats.iter().enumerate() {
        let client_id = unique(&format!("durable-agent-{c}"));
        let ws = connect_publisher(&ep, &client_id).await?;
        publishers.push((
            Publisher {
                index: c as u32,
                client_id,
                chat: chat.clone(),
                kind: ActionKind::Draft { pad: 0 },
                schedule,
                offset: 0,
            },
            ws,
        ));
    }
    let plans: Vec<SubPlan> = (0..chats.len() * args.subscribers)
        .map(|i| SubPlan {
            id: i,
            client_id: unique(&format!("durable-sub-{i}")),
            chat: chats[i % chats.len()].clone(),
            pub_base: (i % chats.len()) as u32,
            pubs: 1,
            mirror: false,
            node: 0,
            group: 0,
        })
        .collect();
    let (subs, errors) = spawn_subscribers(&ep, plans, 128, &run, "subscribe").await;
    if let Some(e) = errors.first() {
        run.stop();
        anyhow::bail!("{} subscribers failed to connect, e.g.: {e}", errors.len());
    }
    for p in &run.pubs {
        p.expected.store(args.subscribers as u32, Ordering::Release);
    }
    let o = publish_and_collect(
        run,
        publishers,
        subs,
        PhaseTiming {
            seconds: args.seconds,
            warmup: args.warmup.min(args.seconds / 2.0),
            drain: args.drain,
            label: "writing".into(),
            server_pids: server.pid.into_iter().collect(),
        },
    )
    .await?;
    let params = json!({
        "chats": chats.len(),
        "window": if args.rate.is_none() { Some(args.window) } else { None },
        "rate_per_chat": args.rate,
        "subscribers_per_chat": args.subscribers,
        "seconds": args.seconds,
        "durability": args.store.durability,
    });
    let mut r = ScenarioResult::new("durable", &server.label, params);
    r.actions_per_sec = Some(o.actions_per_sec);
    let echo = Summary::of(&o.echo);
    r.set_latency(&echo);
    r.put("store", store_label);
    r.put("sent", o.sent);
    r.put("accepted", o.accepted);
    r.put("rejected", o.rejected);
    let unanswered = o.sent.saturating_sub(o.accepted + o.rejected);
    r.put("unanswered", unanswered);
    if unanswered > 0 {
        r.failed = true;
        r.note(format!("{unanswered} actions were never echoed"));
    }
    if args.subscribers > 0 {
        r.deliveries_per_sec = Some(o.deliveries_per_sec);
        r.put_latency("delivery", &Summary::of(&o.all));
        r.set_integrity(&o.integrity);
    }
    if let Some(b) = o.background_cores() {
        r.put("background_cpu_cores", b);
        if b > 0.2 {
            r.note(format!(
                "other processes used {b:.2} cores during the measured window: the figures are skewed"
            ));
        }
    }
    // CPU per accepted action: the server's, and the store process's
    // (nats-server for `jetstream`) apart, since it is part of the store's
    // cost.
    let per_action = |c: f64| c * 1e6 / (o.actions_per_sec * o.window_seconds).max(1.0);
    if let Some(c) = o.server_cpu_seconds {
        r.put("server_cpu_cores", c / o.window_seconds);
        r.put("server_cpu_us_per_action", per_action(c));
    }
    if let Some(s) = o.store_cpu_seconds {
        r.put("store_cpu_cores", s / o.window_seconds);
        r.put("store_cpu_us_per_action", per_action(s));
        if let Some(c) = o.server_cpu_seconds {
            r.put("server_plus_store_cpu_us_per_action", per_action(c + s));
        }
    }
    r.curve("publish → own echo", &o.echo);
    r.note("p50_ms … max_ms are publish → the publisher's own echo (durable before visible)");
    if args.store.durability == "none" {
        r.note("measured against the in-memory journal: these are NOT durable actions/s");
    }
    Ok(r)
}
