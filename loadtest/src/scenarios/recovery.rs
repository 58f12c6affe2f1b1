//! `recovery`: fill a store with `--actions` actions across `--chats` chats,
//! stop the server (`--stop kill`, a crash, by default), start it again on
//! the same port with the same store, and time until it serves: a new client
//! can `initialize` and `subscribe` to every chat, and each chat's snapshot
//! holds the last action written to it before the stop.
//!
//! Needs the store flags (see [`super::store`]). With `--durability none`
//! it runs against the in-memory journal and reports what survived (nothing).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::store::{self, StoreArgs};
use crate::clock::now_ns;
use crate::conn::{unique, Endpoint};
use crate::engine::{connect_publisher, ActionKind, Gate, Publisher, Run, Schedule};
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{free_port, Server, ServerOpts, StopHow};

/// `recovery` flags.
#[derive(Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Actions to write before the restart (spread over the chats).
    #[arg(long, default_value_t = 10_000)]
    pub actions: u64,
    /// Chats to spread them over.
    #[arg(long, default_value_t = 10)]
    pub chats: usize,
    /// Actions per chat in flight while filling.
    #[arg(long, default_value_t = 32)]
    pub window: u64,
    /// How to stop the server: kill (crash) or term (graceful).
    #[arg(long, value_enum, default_value = "kill")]
    pub stop: StopHow,
    /// Give up after this many seconds (fill, and restart separately).
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Run the scenario.
pub async fn run(args: &RecoveryArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    if opts.url.is_some() || opts.in_process {
        anyhow::bail!(
            "`recovery` restarts the server, so it must spawn it: drop --url / --in-process"
        );
    }
    let plan = store::plan(&args.store, opts, "recovery")?;
    let res = run_with(args, opts, &plan).await;
    plan.cleanup();
    res
}

async fn run_with(
    args: &RecoveryArgs,
    opts: &ServerOpts,
    plan: &store::StorePlan,
) -> anyhow::Result<ScenarioResult> {
    let port = free_port()?;
    let server = Server::tandem_on(opts, &plan.args, Some(port)).await?;
    note(format!(
        "tandem: {} at {} ({})",
        server.label, server.url, plan.label
    ));
    let label = server.label.clone();
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);

    // Fill.
    let chats_n = args.chats.max(1);
    let mut setup = ep.client(&unique("recovery-setup")).await?;
    let mut chats = Vec::new();
    for _ in 0..chats_n {
        chats.push(setup.create_session().await?.1);
    }
    setup.close().await;
    let run = Run::new(chats_n, 4 * args.window as usize + 4);
    let t_fill = now_ns();
    let start = t_fill + 50_000_000;
    let mut tasks = Vec::new();
    for (c, chat) in chats.iter().enumerate() {
        let limit =
            args.actions / chats_n as u64 + u64::from((c as u64) < args.actions % chats_n as u64);
        let client_id = unique(&format!("recovery-agent-{c}"));
        let ws = connect_publisher(&ep, &client_id).await?;
        let p = Publisher {
            index: c as u32,
            client_id,
            chat: chat.clone(),
            kind: ActionKind::Draft { pad: 0 },
            schedule: Schedule::Closed {
                window: args.window.max(1),
                gate: Gate::Echoed,
                seconds: args.timeout,
                limit,
            },
            offset: 0,
        };
        tasks.push(tokio::spawn(p.run(ws, run.clone(), start)));
    }
    let pb = crate::progress::count(args.actions, "fill");
    let filled = loop {
        pb.set_position(run.accepted() + run.rejected());
        if run.pubs.iter().all(|p| p.settled()) {
            break true;
        }
        if now_ns() - t_fill > (args.timeout * 1e9) as u64 {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    pb.finish_and_clear();
    let fill_seconds = (now_ns() - t_fill) as f64 / 1e9;
    run.stop();
    for t in tasks {
        let _ = t.await;
    }
    if !filled {
        server.stop(StopHow::Kill).await?;
        anyhow::bail!("filling did not finish within {} s", args.timeout);
    }
    let last: Vec<u64> = run
        .pubs
        .iter()
        .map(|p| p.accepted_hi.load(Ordering::Acquire))
        .collect();
    let probe = ep.client(&unique("recovery-probe")).await?;
    let seq_before = probe.init_seq;
    probe.close().await;
    let rss_before = server.rss();
    note(format!(
        "wrote {} actions in {fill_seconds:.2} s; stopping the server ({:?})",
        run.accepted(),
        args.stop
    ));
    server.stop(args.stop).await?;

    // Restart and time until it serves.
    let t0 = now_ns();
    let server = Server::tandem_on(opts, &plan.args, Some(port)).await?;
    let listen_seconds = (now_ns() - t0) as f64 / 1e9;
    let deadline = t0 + (args.timeout * 1e9) as u64;
    let mut recovered = 0usize;
    let mut first_error = None;
    let served = loop {
        let attempt: anyhow::Result<(usize, u64)> = async {
            let mut c = ep.client(&unique("recovery-check")).await?;
            let seq = c.init_seq;
            let mut ok = 0;
            for (chat, want) in chats.iter().zip(&last) {
                let snap = c.subscribe(chat).await?;
                let got = snap.state["draft"]["text"]
                    .as_str()
                    .and_then(crate::proto::find_stamp)
                    .map(|s| s.n);
                if got == Some(*want) {
                    ok += 1;
                }
            }
            c.close().await;
            Ok((ok, seq))
        }
        .await;
        match attempt {
            Ok((ok, seq)) if ok == chats.len() || !plan.persistent => {
                recovered = ok;
                break Some(((now_ns() - t0) as f64 / 1e9, seq));
            }
            Ok((ok, _)) => recovered = ok,
            Err(e) => {
                if !plan.persistent {
                    // The in-memory journal forgets the chats: a missing
                    // chat is the answer, not a reason to wait.
                    first_error.get_or_insert(format!("{e:#}"));
                    break Some(((now_ns() - t0) as f64 / 1e9, 0));
                }
                first_error.get_or_insert(format!("{e:#}"));
            }
        }
        if now_ns() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let rss_after = server.rss();
    server.stop(StopHow::Term).await?;

    let params = json!({
        "actions": args.actions,
        "chats": chats_n,
        "stop": format!("{:?}", args.stop).to_lowercase(),
        "durability": args.store.durability,
    });
    let mut r = ScenarioResult::new("recovery", &label, params);
    r.put("store", plan.label.clone());
    r.put("actions_written", run.accepted());
    r.put("fill_seconds", fill_seconds);
    r.put(
        "fill_actions_per_sec",
        run.accepted() as f64 / fill_seconds.max(1e-9),
    );
    r.put("listen_seconds", listen_seconds);
    r.put("recovered_chats", recovered as u64);
    r.put("server_seq_before", seq_before);
    if let Some(b) = rss_before {
        r.put("server_rss_before_bytes", b);
    }
    if let Some(a) = rss_after {
        r.put("server_rss_after_restart_bytes", a);
    }
    match served {
        Some((s, seq)) => {
            r.seconds = Some(s);
            r.put("server_seq_after", seq);
            if plan.persistent && seq < seq_before {
                r.failed = true;
                r.note("serverSeq went backwards across the restart");
            }
        }
        None => {
            r.failed = true;
            r.note(format!(
                "the server did not serve every chat within {} s: {}",
                args.timeout,
                first_error.clone().unwrap_or_default()
            ));
        }
    }
    if plan.persistent {
        r.put("recovered", recovered == chats.len());
        if recovered != chats.len() {
            r.failed = true;
        }
    } else {
        r.note(format!(
            "in-memory journal: {recovered} of {} chats survived the restart (expected 0); `seconds` is only the time to serve again",
            chats.len()
        ));
        if let Some(e) = first_error {
            r.note(format!("after the restart: {e}"));
        }
    }
    Ok(r)
}
