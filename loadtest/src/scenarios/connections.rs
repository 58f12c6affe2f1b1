//! `connections`: hold N idle connections, each initialized and subscribed to
//! one chat, and read the server's resident memory per connection from
//! `/proc/<pid>/status` (so the server must be a separate process: the
//! spawned child, or `--url` with `--server-pid`). At the end one action is
//! broadcast to prove every held connection is live.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::clock::now_ns;
use crate::conn::{unique, Endpoint};
use crate::engine::{
    connect_publisher, publish_and_collect, spawn_subscribers, ActionKind, PhaseTiming, Publisher,
    Run, Schedule, SubPlan,
};
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts};

/// `connections` flags.
#[derive(Args, Debug, Clone)]
pub struct ConnectionsArgs {
    /// Idle connections to hold.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Seconds to hold them before reading the server's memory.
    #[arg(long, default_value_t = 3.0)]
    pub hold: f64,
    /// Handshakes in flight while connecting.
    #[arg(long, default_value_t = 256)]
    pub connect_concurrency: usize,
    /// Skip the final broadcast that checks every connection is live.
    #[arg(long)]
    pub no_check: bool,
}

/// Median of a few RSS readings over `span`.
async fn rss_sample(server: &Server, span: Duration) -> Option<u64> {
    let mut v = Vec::new();
    for _ in 0..5 {
        v.extend(server.rss());
        tokio::time::sleep(span / 5).await;
    }
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Run the scenario.
pub async fn run(args: &ConnectionsArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    if opts.in_process {
        anyhow::bail!(
            "`connections` measures the server's own RSS: run it against a spawned child (default) or --url with --server-pid"
        );
    }
    let (server, plan) = super::store::start_default(opts, "connections").await?;
    if server.pid.is_none() {
        let res = Err(anyhow::anyhow!(
            "`connections` needs the server's pid: pass --server-pid with --url"
        ));
        return super::store::finish(server, plan, res).await;
    }
    let res = run_on(&server, args, opts).await;
    super::store::finish(server, plan, res).await
}

async fn run_on(
    server: &Server,
    args: &ConnectionsArgs,
    opts: &ServerOpts,
) -> anyhow::Result<ScenarioResult> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let mut setup = ep.client(&unique("conn-setup")).await?;
    let (_, chat) = setup.create_session().await?;
    setup.close().await;
    let client_id = unique("conn-agent");
    let pub_ws = connect_publisher(&ep, &client_id).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = rss_sample(server, Duration::from_millis(500))
        .await
        .ok_or_else(|| anyhow::anyhow!("cannot read the server's RSS"))?;
    let self0 = crate::sys::self_rss_bytes().unwrap_or(0);

    let run = Run::new(1, 4);
    let plans: Vec<SubPlan> = (0..args.connections)
        .map(|i| SubPlan {
            id: i,
            client_id: format!("idle-{i}"),
            chat: chat.clone(),
            pub_base: 0,
            pubs: 1,
            mirror: false,
            node: 0,
            group: 0,
        })
        .collect();
    let t0 = now_ns();
    let (subs, errors) =
        spawn_subscribers(&ep, plans, args.connect_concurrency, &run, "connect").await;
    let connect_seconds = (now_ns() - t0) as f64 / 1e9;
    let connected = subs.len();
    note(format!(
        "{connected} connections initialized and subscribed in {connect_seconds:.2} s; holding {} s",
        args.hold
    ));
    run.pubs[0]
        .expected
        .store(connected as u32, Ordering::Release);
    tokio::time::sleep(Duration::from_secs_f64(args.hold)).await;
    let rss1 = rss_sample(server, Duration::from_millis(500))
        .await
        .ok_or_else(|| anyhow::anyhow!("cannot read the server's RSS"))?;
    let self1 = crate::sys::self_rss_bytes().unwrap_or(0);
    let per_conn = rss1.saturating_sub(rss0) as f64 / connected.max(1) as f64;

    let params = json!({"connections": args.connections, "hold_seconds": args.hold});
    let mut r = ScenarioResult::new("connections", &server.label, params);
    r.rss_bytes_per_connection = Some(per_conn.round());
    r.put("connected", connected as u64);
    r.put("connect_failures", errors.len() as u64);
    r.put("connect_seconds", connect_seconds);
    r.put(
        "connects_per_sec",
        connected as f64 / connect_seconds.max(1e-9),
    );
    r.put("server_rss_before_bytes", rss0);
    r.put("server_rss_after_bytes", rss1);
    r.put(
        "loadgen_rss_bytes_per_connection",
        (self1.saturating_sub(self0) as f64 / connected.max(1) as f64).round(),
    );
    if let Some(e) = errors.first() {
        r.failed = true;
        r.note(format!("{} connections failed, e.g.: {e}", errors.len()));
    }

    // Every held connection must still be live: broadcast one action.
    let publisher = Publisher {
        index: 0,
        client_id,
        chat,
        kind: ActionKind::Draft { pad: 0 },
        schedule: Schedule::Open {
            rate: 1.0,
            count: 1,
        },
        offset: 0,
    };
    let (pubs, subs) = if args.no_check {
        (Vec::new(), subs)
    } else {
        (vec![(publisher, pub_ws)], subs)
    };
    let o = publish_and_collect(
        run,
        pubs,
        subs,
        PhaseTiming {
            seconds: 0.5,
            warmup: 0.0,
            drain: 20.0,
            label: "live check".into(),
            server_pids: server.pid.into_iter().collect(),
        },
    )
    .await?;
    if !args.no_check {
        let delivered: u64 = o.receivers.iter().map(|x| x.delivered).sum();
        r.put("live_check_delivered", delivered);
        r.set_integrity(&o.integrity);
        r.put_latency("live_check_broadcast", &crate::stats::Summary::of(&o.all));
        if o.closed_early > 0 {
            r.failed = true;
            r.note(format!(
                "{} held connections were closed by the server, e.g. {:?}",
                o.closed_early, o.close_reasons
            ));
        }
    }
    r.target(
        "server RSS per idle connection",
        "≤ 8 KiB (8,192 bytes)",
        format!("{per_conn:.0} bytes"),
        per_conn <= 8_192.0,
    );
    if args.connections != 10_000 {
        r.note("the issue's target is stated for 10,000 connections");
    }
    r.note("RSS per connection = (server VmRSS after connecting − before) / connections, medians of 5 readings");
    Ok(r)
}
