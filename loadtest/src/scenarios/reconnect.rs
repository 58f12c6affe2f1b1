//! `reconnect-storm`: N subscribed clients, agents streaming into their
//! chats; every client drops its socket at the same moment (no close
//! handshake, as on a network cut), waits `--outage-ms`, then all reconnect
//! at once with `reconnect {clientId, lastSeenServerSeq, subscriptions}`.
//!
//! A client has *caught up* when it holds every action its chat's agent had
//! had accepted when the client's `reconnect` reply arrived (replayed or
//! live; checked per agent counter, so a gap is never mistaken for progress).
//! `seconds` is from the start of the reconnects until the last client has
//! caught up. Publishing goes on during the whole storm; at the end every
//! client must hold every action exactly once and in order.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::{watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use crate::clock::now_ns;
use crate::conn::{unique, Client, Endpoint, Ws};
use crate::engine::{
    connect_publisher, connect_subscriber, ActionKind, Publisher, Receiver, Run, Schedule, SubPlan,
};
use crate::progress::note;
use crate::proto::{self, EnvelopeLite};
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts};
use crate::stats::{new_hist, record_ns, SeqOrder, Summary};

/// `reconnect-storm` flags.
#[derive(Args, Debug, Clone)]
pub struct ReconnectArgs {
    /// Clients that drop and reconnect.
    #[arg(long, default_value_t = 500)]
    pub connections: usize,
    /// Chats the clients are spread over (one agent each).
    #[arg(long, default_value_t = 1)]
    pub chats: usize,
    /// Actions/s each chat's agent sends throughout.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Seconds of normal traffic before the drop.
    #[arg(long, default_value_t = 2.0)]
    pub before: f64,
    /// Milliseconds between the drop and the reconnects.
    #[arg(long, default_value_t = 500)]
    pub outage_ms: u64,
    /// Seconds of traffic after everyone caught up.
    #[arg(long, default_value_t = 1.0)]
    pub after: f64,
    /// Give up waiting for the storm after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Reconnects in flight at once (0 = all at once).
    #[arg(long, default_value_t = 0)]
    pub reconnect_concurrency: usize,
    /// Handshakes in flight while first connecting.
    #[arg(long, default_value_t = 128)]
    pub connect_concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    Drop,
    Reconnect,
    Stop,
}

struct Storm {
    run: Arc<Run>,
    ep: Arc<Endpoint>,
    phase: watch::Receiver<Phase>,
    t_reconnect: AtomicU64,
    deadline_ns: AtomicU64,
    sem: Option<Arc<Semaphore>>,
    reconnected: AtomicUsize,
    caught_up: AtomicUsize,
    retries: AtomicU64,
    snapshots: AtomicU64,
    replayed: AtomicU64,
    reconnect_hist: Mutex<Histogram<u64>>,
    catchup_hist: Mutex<Histogram<u64>>,
    failures: Mutex<Vec<String>>,
}

#[derive(Deserialize)]
struct ReconnectResult<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow, default)]
    actions: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    snapshots: Vec<&'a RawValue>,
}

/// Read until the phase leaves `while_in`; false when the socket ended.
async fn read_while(ws: &mut Ws, rx: &mut Receiver, st: &Storm, while_in: Phase) -> bool {
    let mut phase = st.phase.clone();
    loop {
        if *phase.borrow() != while_in {
            return true;
        }
        tokio::select! {
            biased;
            _ = phase.changed() => {}
            m = ws.next() => match m {
                Some(Ok(Message::Text(t))) => rx.on_text(&st.run, t.as_str(), now_ns()),
                Some(Ok(Message::Close(f))) => {
                    rx.closed = Some(format!("closed by the server: {f:?}"));
                    return false;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    rx.closed = Some(e.to_string());
                    return false;
                }
                None => {
                    rx.closed = Some("connection ended".into());
                    return false;
                }
            }
        }
    }
}

fn targets(rx: &Receiver, run: &Run) -> Vec<u64> {
    (0..rx.checkers.len())
        .map(|k| {
            run.pubs[rx.pub_base as usize + k]
                .accepted_hi
                .load(Ordering::Acquire)
        })
        .collect()
}

fn is_caught_up(rx: &Receiver, targets: &[u64]) -> bool {
    rx.checkers.iter().zip(targets).all(|(c, &t)| c.prefix >= t)
}

async fn storm_client(mut ws: Ws, mut rx: Receiver, client_id: String, st: Arc<Storm>) -> Receiver {
    let run = st.run.clone();
    read_while(&mut ws, &mut rx, &st, Phase::Live).await;
    drop(ws);
    let last_seen = rx.order.last;
    let mut phase = st.phase.clone();
    let _ = phase
        .wait_for(|p| *p != Phase::Drop && *p != Phase::Live)
        .await;
    if *phase.borrow() == Phase::Stop {
        return rx;
    }
    let _permit = match &st.sem {
        Some(s) => s.clone().acquire_owned().await.ok(),
        None => None,
    };
    let t0 = st.t_reconnect.load(Ordering::Acquire);
    let deadline = st.deadline_ns.load(Ordering::Acquire);
    let fail = |e: String| {
        let mut f = st.failures.lock();
        if f.len() < 1000 {
            f.push(e);
        }
    };
    let mut client = loop {
        match st.ep.connect().await {
            Ok(ws) => break Client::new(ws),
            Err(e) => {
                st.retries.fetch_add(1, Ordering::Relaxed);
                if now_ns() > deadline {
                    fail(format!("{client_id}: could not reconnect: {e:#}"));
                    return rx;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let params = json!({
        "channel": "ahp-root://",
        "clientId": client_id,
        "lastSeenServerSeq": last_seen,
        "subscriptions": [rx.chat],
    });
    let id = client.next_id();
    let reply = match client.send(proto::request(id, "reconnect", &params)).await {
        Ok(()) => client.wait_response(id, "reconnect").await,
        Err(e) => Err(e),
    };
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            fail(format!("{client_id}: reconnect failed: {e:#}"));
            return rx;
        }
    };
    let now = now_ns();
    match serde_json::from_str::<ReconnectResult>(&reply) {
        Ok(res) if res.kind == "replay" => {
            st.replayed
                .fetch_add(res.actions.len() as u64, Ordering::Relaxed);
            for a in res.actions {
                if let Ok(env) = serde_json::from_str::<EnvelopeLite>(a.get()) {
                    rx.on_envelope(&run, &env, now);
                }
            }
        }
        Ok(res) => {
            // A snapshot: the missed actions are folded into state we do
            // not check here; what is missing will show as lost.
            st.snapshots.fetch_add(1, Ordering::Relaxed);
            let from = res
                .snapshots
                .first()
                .and_then(|s| serde_json::from_str::<serde_json::Value>(s.get()).ok())
                .and_then(|v| v["fromSeq"].as_u64())
                .unwrap_or(last_seen);
            rx.order = SeqOrder {
                last: from,
                ..rx.order.clone()
            };
        }
        Err(e) => {
            fail(format!("{client_id}: bad reconnect result: {e}"));
            return rx;
        }
    }
    st.reconnected.fetch_add(1, Ordering::AcqRel);
    record_ns(&mut st.reconnect_hist.lock(), now.saturating_sub(t0));
    let goal = targets(&rx, &run);
    for text in std::mem::take(&mut client.pending) {
        rx.on_text(&run, &text, now);
    }
    let mut ws = client.ws;
    let mut caught = false;
    let mut stop = st.phase.clone();
    loop {
        if !caught && is_caught_up(&rx, &goal) {
            caught = true;
            record_ns(&mut st.catchup_hist.lock(), now_ns().saturating_sub(t0));
            st.caught_up.fetch_add(1, Ordering::AcqRel);
        }
        if *stop.borrow() == Phase::Stop {
            break;
        }
        tokio::select! {
            biased;
            _ = stop.changed() => {}
            m = ws.next() => match m {
                Some(Ok(Message::Text(t))) => rx.on_text(&run, t.as_str(), now_ns()),
                Some(Ok(Message::Close(f))) => {
                    rx.closed = Some(format!("closed by the server after reconnecting: {f:?}"));
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    rx.closed = Some(format!("after reconnecting: {e}"));
                    break;
                }
                None => {
                    rx.closed = Some("connection ended after reconnecting".into());
                    break;
                }
            }
        }
    }
    rx.flush(&run);
    rx
}

/// Run the scenario.
pub async fn run(args: &ReconnectArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    let (server, plan) = super::store::start_default(opts, "reconnect-storm").await?;
    let res = run_on(&server, args, opts).await;
    super::store::finish(server, plan, res).await
}

async fn run_on(
    server: &Server,
    args: &ReconnectArgs,
    opts: &ServerOpts,
) -> anyhow::Result<ScenarioResult> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let chats_n = args.chats.max(1);
    let mut setup = ep.client(&unique("storm-setup")).await?;
    let mut chats = Vec::new();
    for _ in 0..chats_n {
        chats.push(setup.create_session().await?.1);
    }
    setup.close().await;
    let total_s = args.before + args.outage_ms as f64 / 1000.0 + args.timeout + args.after + 5.0;
    let count = (args.rate * total_s).ceil() as u64;
    let run = Run::new(chats_n, count as usize + 2);
    let mut publishers = Vec::new();
    for (c, chat) in chats.iter().enumerate() {
        let client_id = unique(&format!("storm-agent-{c}"));
        let ws = connect_publisher(&ep, &client_id).await?;
        publishers.push((
            Publisher {
                index: c as u32,
                client_id,
                chat: chat.clone(),
                kind: ActionKind::Draft { pad: 0 },
                schedule: Schedule::Open {
                    rate: args.rate,
                    count,
                },
                offset: 0,
            },
            ws,
        ));
    }

    // Connect everyone.
    let pb = crate::progress::count(args.connections as u64, "connect");
    let plans: Vec<SubPlan> = (0..args.connections)
        .map(|i| SubPlan {
            id: i,
            client_id: unique(&format!("storm-{i}")),
            chat: chats[i % chats_n].clone(),
            pub_base: (i % chats_n) as u32,
            pubs: 1,
            mirror: false,
            node: 0,
            group: 0,
        })
        .collect();
    let connected: Vec<anyhow::Result<(Ws, Receiver, String)>> = futures_util::stream::iter(plans)
        .map(|plan| {
            let ep = ep.clone();
            let pb = pb.clone();
            async move {
                let r = connect_subscriber(&ep, &plan).await;
                pb.inc(1);
                r.map(|(ws, rx)| (ws, rx, plan.client_id))
            }
        })
        .buffer_unordered(args.connect_concurrency.max(1))
        .collect()
        .await;
    pb.finish_and_clear();
    let (phase_tx, phase_rx) = watch::channel(Phase::Live);
    let st = Arc::new(Storm {
        run: run.clone(),
        ep: ep.clone(),
        phase: phase_rx,
        t_reconnect: AtomicU64::new(0),
        deadline_ns: AtomicU64::new(u64::MAX),
        sem: (args.reconnect_concurrency > 0)
            .then(|| Arc::new(Semaphore::new(args.reconnect_concurrency))),
        reconnected: AtomicUsize::new(0),
        caught_up: AtomicUsize::new(0),
        retries: AtomicU64::new(0),
        snapshots: AtomicU64::new(0),
        replayed: AtomicU64::new(0),
        reconnect_hist: Mutex::new(new_hist()),
        catchup_hist: Mutex::new(new_hist()),
        failures: Mutex::new(Vec::new()),
    });
    let mut per_chat = vec![0u32; chats_n];
    let mut tasks = Vec::new();
    let mut connect_errors = Vec::new();
    for r in connected {
        match r {
            Ok((ws, rx, id)) => {
                per_chat[rx.pub_base as usize] += 1;
                tasks.push(tokio::spawn(storm_client(ws, rx, id, st.clone())));
            }
            Err(e) => connect_errors.push(format!("{e:#}")),
        }
    }
    if let Some(e) = connect_errors.first() {
        let _ = phase_tx.send(Phase::Stop);
        run.stop();
        anyhow::bail!(
            "{} of {} clients failed to connect, e.g.: {e}",
            connect_errors.len(),
            args.connections
        );
    }
    for (c, n) in per_chat.iter().enumerate() {
        run.pubs[c].expected.store(*n, Ordering::Release);
    }

    // Traffic, then the drop, then the storm.
    let start = now_ns() + 100_000_000;
    run.record_from_ns.store(start, Ordering::Relaxed);
    let pub_tasks: Vec<_> = publishers
        .into_iter()
        .map(|(p, ws)| tokio::spawn(p.run(ws, run.clone(), start)))
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.before + 0.1)).await;
    let hi = |run: &Run| -> u64 {
        run.pubs
            .iter()
            .map(|p| p.accepted_hi.load(Ordering::Acquire))
            .sum()
    };
    let at_drop = hi(&run);
    let _ = phase_tx.send(Phase::Drop);
    note(format!(
        "dropped {} connections; reconnecting in {} ms",
        tasks.len(),
        args.outage_ms
    ));
    tokio::time::sleep(Duration::from_millis(args.outage_ms)).await;
    let t_reconnect = now_ns();
    let at_reconnect = hi(&run);
    st.t_reconnect.store(t_reconnect, Ordering::Release);
    let deadline = t_reconnect + (args.timeout * 1e9) as u64;
    st.deadline_ns.store(deadline, Ordering::Release);
    let _ = phase_tx.send(Phase::Reconnect);
    let pb = crate::progress::count(tasks.len() as u64, "caught up");
    let all_caught = loop {
        let caught = st.caught_up.load(Ordering::Acquire);
        pb.set_position(caught as u64);
        pb.set_message(format!(
            "{} reconnected",
            st.reconnected.load(Ordering::Relaxed)
        ));
        if caught >= tasks.len() {
            break true;
        }
        if now_ns() > deadline {
            break false;
        }
        let failed = st.failures.lock().len();
        if caught + failed >= tasks.len() && failed > 0 {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    pb.finish_and_clear();
    let storm_seconds = (now_ns() - t_reconnect) as f64 / 1e9;
    tokio::time::sleep(Duration::from_secs_f64(args.after)).await;
    run.halt.store(true, Ordering::Release);
    let drained = run.drain(Duration::from_secs(10)).await;
    let _ = phase_tx.send(Phase::Stop);
    run.stop();
    for t in pub_tasks {
        let _ = t.await;
    }
    let mut integrity = crate::stats::Integrity::default();
    let mut closed = Vec::new();
    for t in tasks {
        let rx = t.await?;
        integrity.add(rx.integrity(&run));
        if let Some(c) = rx.closed {
            closed.push(c);
        }
    }

    let catchup = Summary::of(&st.catchup_hist.lock());
    let reconnect = Summary::of(&st.reconnect_hist.lock());
    let params = json!({
        "connections": args.connections,
        "chats": chats_n,
        "rate_per_chat": args.rate,
        "outage_ms": args.outage_ms,
        "reconnect_concurrency": args.reconnect_concurrency,
    });
    let mut r = ScenarioResult::new("reconnect-storm", &server.label, params);
    let seconds = catchup.max_ms / 1000.0;
    r.seconds = all_caught.then_some(seconds);
    r.set_integrity(&integrity);
    r.put("caught_up", st.caught_up.load(Ordering::Acquire) as u64);
    r.put("reconnected", st.reconnected.load(Ordering::Acquire) as u64);
    r.put("storm_wait_seconds", storm_seconds);
    r.put(
        "seconds_from_drop",
        seconds + args.outage_ms as f64 / 1000.0,
    );
    r.put_latency("reconnect_reply", &reconnect);
    r.put_latency("catchup", &catchup);
    r.put(
        "actions_missed_during_outage_per_chat",
        (at_reconnect - at_drop) as f64 / chats_n as f64,
    );
    r.put("replayed_envelopes", st.replayed.load(Ordering::Relaxed));
    r.put("snapshot_fallbacks", st.snapshots.load(Ordering::Relaxed));
    r.put("connect_retries", st.retries.load(Ordering::Relaxed));
    r.put("accepted_actions", run.accepted());
    r.put_latency("delivery", &Summary::of(&run.all.merged()));
    let failures = st.failures.lock().clone();
    if !failures.is_empty() {
        r.failed = true;
        r.note(format!(
            "{} clients failed to recover, e.g.: {}",
            failures.len(),
            failures[0]
        ));
    }
    if !closed.is_empty() {
        r.note(format!(
            "{} sockets ended early (before the drop or after reconnecting), e.g.: {}",
            closed.len(),
            closed[0]
        ));
    }
    if !all_caught {
        r.failed = true;
        r.note(format!(
            "not every client caught up within {} s",
            args.timeout
        ));
    }
    if !drained {
        r.note("some actions were still in flight when the run stopped");
    }
    r.curve(
        "time from reconnect start to caught up",
        &st.catchup_hist.lock(),
    );
    r.target(
        "all reconnected and caught up, nothing missing",
        "≤ 5 s",
        match r.seconds {
            Some(s) => format!("{s:.2} s, lost {}", integrity.lost),
            None => format!("not all caught up, lost {}", integrity.lost),
        },
        all_caught && seconds <= 5.0 && integrity.clean(),
    );
    if args.connections != 5000 {
        r.note("the issue's target is stated for 5,000 connections");
    }
    r.note("seconds = from the start of the reconnects (after the chosen outage) until the last client holds everything accepted before its reply");
    Ok(r)
}
