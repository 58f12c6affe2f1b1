//! `drafts`: W writers edit the answers of one open input request while S
//! subscribers watch. Every subscriber reduces what it receives with the
//! official `ahp` reducer, starting from its snapshot; at the end each one's
//! answers map (and whole chat state) must equal a fresh server snapshot.
//!
//! The request comes from the scripted agent (`/ask` with `--questions` text
//! questions). Writers rotate over the questions from different offsets, so
//! several writers overwrite the same answer and the server's order decides.
//! Writers send on a fixed schedule (`--rate` edits/s each); latency is from
//! the scheduled send to each subscriber and to the last one.

use std::collections::HashMap;
use std::sync::Arc;

use ahp_types::state::{ChatInputAnswer, ChatState, ResponsePart};
use anyhow::{anyhow, Context as _};
use clap::Args;
use serde_json::{json, Value};

use crate::conn::{unique, Endpoint, REQUEST_TIMEOUT};
use crate::engine::{
    connect_publisher, publish_and_collect, spawn_subscribers, ActionKind, PhaseTiming, Publisher,
    Run, Schedule, SubPlan,
};
use crate::proto;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts};
use crate::stats::Summary;

/// `drafts` flags.
#[derive(Args, Debug, Clone)]
pub struct DraftsArgs {
    /// Writers editing answers.
    #[arg(long, default_value_t = 5)]
    pub writers: usize,
    /// Subscribers watching (each runs the official reducer).
    #[arg(long, default_value_t = 50)]
    pub subscribers: usize,
    /// Text questions in the input request.
    #[arg(long, default_value_t = 8)]
    pub questions: usize,
    /// Edits per second per writer.
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// Seconds of editing.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Leading seconds left out of latencies.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest wait for in-flight edits after the last one, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// Handshakes in flight while connecting subscribers.
    #[arg(long, default_value_t = 128)]
    pub connect_concurrency: usize,
}

/// Open a chat with one pending input request; returns (chat, request id).
pub async fn open_request(ep: &Endpoint, questions: usize) -> anyhow::Result<(String, String)> {
    let mut c = ep.client(&unique("drafts-setup")).await?;
    let (_session, chat) = c.create_session().await?;
    c.subscribe(&chat).await?;
    let qs: Vec<Value> = (0..questions.max(1))
        .map(
            |i| json!({"kind": "text", "id": format!("q{i}"), "message": format!("Question {i}?")}),
        )
        .collect();
    let ask = format!("/ask {}", json!({"message": "load test", "questions": qs}));
    let action = json!({
        "type": "chat/turnStarted",
        "turnId": unique("turn"),
        "startedAt": tandem::time::now_rfc3339(),
        "message": {"text": ask, "origin": {"kind": "user"}},
    });
    let id = c.next_id();
    c.send(proto::dispatch(
        id,
        &proto::json_str(&chat),
        1,
        &action.to_string(),
    ))
    .await?;
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            anyhow::bail!("the scripted agent did not ask within {REQUEST_TIMEOUT:?}");
        }
        let text = c.next_text(remaining).await?;
        let v: Value = serde_json::from_str(&text)?;
        if v["method"] != "action" {
            continue;
        }
        let action = &v["params"]["action"];
        if let Some(reason) = v["params"]["rejectionReason"].as_str() {
            anyhow::bail!("turnStarted rejected: {reason}");
        }
        if action["type"] == "chat/inputRequested" {
            let rid = action["request"]["id"]
                .as_str()
                .ok_or_else(|| anyhow!("inputRequested without request.id: {action}"))?;
            c.close().await;
            return Ok((chat, rid.to_owned()));
        }
    }
}

/// The answers of request `rid` in `state` (active turn first).
pub fn answers(state: &ChatState, rid: &str) -> Option<HashMap<String, ChatInputAnswer>> {
    state
        .active_turn
        .iter()
        .flat_map(|t| t.response_parts.iter())
        .chain(
            state
                .turns
                .iter()
                .rev()
                .flat_map(|t| t.response_parts.iter()),
        )
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) if i.request.id == rid => {
                Some(i.request.answers.clone().unwrap_or_default())
            }
            _ => None,
        })
}

/// Run the scenario.
pub async fn run(args: &DraftsArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    let (server, plan) = super::store::start_default(opts, "drafts").await?;
    let res = run_on(&server, args, opts).await;
    super::store::finish(server, plan, res).await
}

async fn run_on(
    server: &Server,
    args: &DraftsArgs,
    opts: &ServerOpts,
) -> anyhow::Result<ScenarioResult> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let (chat, rid) = open_request(&ep, args.questions).await?;
    let questions: Vec<String> = (0..args.questions.max(1))
        .map(|i| format!("q{i}"))
        .collect();
    let count = (args.rate * args.seconds).ceil() as u64;
    let run = Run::new(args.writers, count as usize + 1);
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let client_id = unique(&format!("writer-{w}"));
        let ws = connect_publisher(&ep, &client_id).await?;
        writers.push((
            Publisher {
                index: w as u32,
                client_id,
                chat: chat.clone(),
                kind: ActionKind::Answer {
                    request_id: rid.clone(),
                    questions: questions.clone(),
                },
                schedule: Schedule::Open {
                    rate: args.rate,
                    count,
                },
                offset: w * 7,
            },
            ws,
        ));
    }
    let plans: Vec<SubPlan> = (0..args.subscribers)
        .map(|s| SubPlan {
            id: s,
            client_id: unique(&format!("watcher-{s}")),
            chat: chat.clone(),
            pub_base: 0,
            pubs: args.writers,
            mirror: true,
            node: 0,
            group: 0,
        })
        .collect();
    let (subs, errors) =
        spawn_subscribers(&ep, plans, args.connect_concurrency, &run, "subscribe").await;
    if !errors.is_empty() {
        run.stop();
        anyhow::bail!(
            "{} of {} subscribers failed to connect, e.g.: {}",
            errors.len(),
            args.subscribers,
            errors[0]
        );
    }
    for p in &run.pubs {
        p.expected.store(
            args.subscribers as u32,
            std::sync::atomic::Ordering::Release,
        );
    }
    let o = publish_and_collect(
        run,
        writers,
        subs,
        PhaseTiming {
            seconds: args.seconds,
            warmup: args.warmup.min(args.seconds / 2.0),
            drain: args.drain,
            label: "editing".into(),
            server_pids: server.pid.into_iter().collect(),
        },
    )
    .await?;

    // The server's view, from a fresh subscriber.
    let mut fresh = ep.client(&unique("drafts-check")).await?;
    let snap = fresh.subscribe(&chat).await?;
    fresh.close().await;
    let server_state: ChatState =
        serde_json::from_value(snap.state).context("decoding the final snapshot")?;
    let server_answers =
        answers(&server_state, &rid).ok_or_else(|| anyhow!("request {rid} vanished"))?;
    let mut diverged = 0;
    let mut states_differ = 0;
    let mut undecodable = 0;
    for rx in &o.receivers {
        let Some(m) = &rx.mirror else { continue };
        undecodable += m.undecodable;
        if answers(&m.state, &rid).as_ref() != Some(&server_answers) {
            diverged += 1;
        }
        if m.state != server_state {
            states_differ += 1;
        }
    }
    let converged = diverged == 0 && o.closed_early == 0 && !o.receivers.is_empty();

    let params = json!({
        "writers": args.writers,
        "subscribers": args.subscribers,
        "questions": args.questions,
        "rate_per_writer": args.rate,
        "seconds": args.seconds,
    });
    let mut r = ScenarioResult::new("drafts", &server.label, params);
    r.deliveries_per_sec = Some(o.deliveries_per_sec);
    r.actions_per_sec = Some(o.actions_per_sec);
    let all = Summary::of(&o.all);
    r.set_latency(&all);
    r.put_latency("last", &Summary::of(&o.last));
    r.put_latency("echo", &Summary::of(&o.echo));
    r.set_integrity(&o.integrity);
    r.converged = Some(converged);
    r.put("diverged_subscribers", diverged as u64);
    r.put(
        "subscribers_whose_whole_state_differs",
        states_differ as u64,
    );
    r.put("answers_in_snapshot", server_answers.len() as u64);
    r.put("edits_sent", o.sent);
    r.put("edits_accepted", o.accepted);
    r.put("edits_rejected", o.rejected);
    r.put("publisher_max_behind_ms", o.max_behind_ms);
    if let Some(b) = o.background_cores() {
        r.put("background_cpu_cores", b);
        if b > 0.2 {
            r.note(format!(
                "other processes used {b:.2} cores during the measured window: the figures are skewed"
            ));
        }
    }
    if let Some(c) = o.server_cpu_seconds {
        r.put("server_cpu_cores", c / o.window_seconds);
    }
    if let Some(c) = o.store_cpu_seconds {
        r.put("store_cpu_cores", c / o.window_seconds);
    }
    if undecodable > 0 {
        r.note(format!(
            "{undecodable} envelopes did not decode as StateAction"
        ));
    }
    if o.rejected > 0 {
        r.note(format!(
            "{} edits were rejected by the server (see its log)",
            o.rejected
        ));
    }
    if !converged || o.incomplete > 0 || o.closed_early > 0 {
        r.failed = true;
        r.note(format!(
            "{} edits never reached every subscriber; {} subscribers disconnected {:?}",
            o.incomplete, o.closed_early, o.close_reasons
        ));
    }
    r.curve("drafts → every subscriber", &o.all);
    r.curve("drafts → last subscriber", &o.last);
    r.target(
        "every subscriber's answers = server snapshot",
        "converged",
        format!("{diverged} of {} diverged", o.receivers.len()),
        converged,
    );
    r.target(
        "p99 publish → subscriber",
        "≤ 25 ms",
        format!("{:.2} ms", all.p99_ms),
        all.count > 0 && all.p99_ms <= 25.0,
    );
    if args.writers != 50 || args.subscribers != 500 {
        r.note("the issue's targets are stated for 50 writers × 500 subscribers");
    }
    Ok(r)
}
