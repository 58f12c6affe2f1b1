//! `agent-stream`: S subscribers watch one chat while its agent streams a
//! long answer (`--chunks` deltas, `--interval-ms` apart), once with a real
//! ACP agent process behind the ACP bridge and once with the built-in
//! `scripted` agent, each on a fresh server, in one invocation.
//!
//! Every subscriber must receive every `chat/delta` of the turn exactly once
//! and in order (`serverSeq` strictly increasing on its connection, chunk
//! numbers 1..=N each once and ascending), the concatenated text must equal
//! what the agent sent, and the turn must complete.
//!
//! **Where the send time comes from.** The chunks are produced by the agent,
//! not by this process. The ACP test agent's `/stamped N MS` puts its
//! `CLOCK_MONOTONIC` reading into every chunk (`<i>@<ns> `) just before it
//! writes the chunk to the bridge; receivers read the same clock (one kernel
//! clock for every process on the machine), so `receive − stamp` is the
//! delivery latency from the agent's send through the bridge, the chat actor
//! and the fan-out. The scripted agent runs inside the server and cannot
//! stamp: its chunks (`/slow <ms>x<N>`, fixed-width `<i>:---- ` tokens on
//! the same fixed schedule) are compared on what both runs measure — the
//! spread from the first to the last subscriber of each chunk, server CPU per
//! delivery and deliveries/s.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::{ChatState, ResponsePart};
use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::watch as signal;

use crate::clock::monotonic_ns;
use crate::conn::{unique, Endpoint, REQUEST_TIMEOUT};
use crate::progress::note;
use crate::proto;
use crate::report::ScenarioResult;
use crate::server::{Server, ServerOpts, StopHow};

use phase::{analyse, children, report, Cpu, Phase};
use watch::{watch_turn, Watch};

mod phase;
mod watch;

/// Which agents `agent-stream` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Agents {
    /// The ACP agent, then the scripted agent, and their ratios.
    Both,
    /// The ACP test agent behind the bridge only.
    Acp,
    /// The built-in scripted agent only.
    Scripted,
}

/// `agent-stream` flags.
#[derive(Args, Debug, Clone)]
pub struct AgentStreamArgs {
    /// Subscribers watching the chat.
    #[arg(long, default_value_t = 200)]
    pub subscribers: usize,
    /// Chunks the agent streams (each one `chat/delta`).
    #[arg(long, default_value_t = 2000)]
    pub chunks: u32,
    /// Milliseconds between two chunks (a fixed schedule).
    #[arg(long, default_value_t = 5)]
    pub interval_ms: u64,
    /// Which agents to run.
    #[arg(long, value_enum, default_value = "both")]
    pub agents: Agents,
    /// The ACP test agent binary [default: examples/acp_test_agent next to
    /// this executable, i.e. target/release/examples/acp_test_agent].
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Provider name the ACP agent is declared under (with `--url`, the
    /// server must declare the test agent under this name).
    #[arg(long, default_value = "loadtest-acp")]
    pub acp_provider: String,
    /// Longest wait for the turn to reach every subscriber after its
    /// scheduled end, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub drain: f64,
    /// Handshakes in flight while connecting subscribers.
    #[arg(long, default_value_t = 128)]
    pub connect_concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Acp,
    Scripted,
}

impl Kind {
    pub(super) fn key(self) -> &'static str {
        match self {
            Kind::Acp => "acp",
            Kind::Scripted => "scripted",
        }
    }
}

/// The ACP test agent to declare: `--agent-bin`, or `examples/acp_test_agent`
/// next to this executable (or one directory up, for test binaries in
/// `deps/`), or the workspace's `target/release/examples`.
pub fn agent_bin(args: &AgentStreamArgs) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.agent_bin {
        if !p.is_file() {
            bail!("--agent-bin {}: no such file", p.display());
        }
        return Ok(p.clone());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("examples/acp_test_agent"));
            if let Some(up) = dir.parent() {
                candidates.push(up.join("examples/acp_test_agent"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(root.join("target/release/examples/acp_test_agent"));
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "no ACP test agent found (looked at {}): build it with \
         `cargo build --release --example acp_test_agent`, or pass --agent-bin",
        looked.join(", ")
    )
}

/// The prompt that makes `kind` stream `chunks` chunks `interval_ms` apart,
/// and for the scripted agent the text it will stream.
fn prompt(kind: Kind, chunks: u32, interval_ms: u64) -> (String, Option<String>) {
    match kind {
        Kind::Acp => (format!("/stamped {chunks} {interval_ms}"), None),
        Kind::Scripted => {
            let text = scripted_text(chunks);
            let ms = interval_ms * u64::from(chunks);
            let prompt = format!("/slow {ms}x{chunks} {text}");
            // The agent trims the message, and with it the last space.
            (prompt, Some(text.trim_end().to_owned()))
        }
    }
}

/// `chunks` tokens of one width, so that `/slow`'s even split makes each
/// one a delta. The width is that of an ACP chunk (`<i>@<ns> `, `ns` being
/// this machine's clock), so both agents send deltas of the same size.
fn scripted_text(chunks: u32) -> String {
    let index_width = chunks.max(1).to_string().len();
    let stamp_width = monotonic_ns().to_string().len();
    (1..=chunks)
        .map(|i| format!("{i:0index_width$}:{:-<stamp_width$} ", ""))
        .collect()
}

/// Run the scenario.
pub async fn run(args: &AgentStreamArgs, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    if args.subscribers == 0 || args.chunks == 0 {
        bail!("--subscribers and --chunks must be at least 1");
    }
    let kinds: &[Kind] = match args.agents {
        Agents::Both => &[Kind::Acp, Kind::Scripted],
        Agents::Acp => &[Kind::Acp],
        Agents::Scripted => &[Kind::Scripted],
    };
    // Find the agent before starting anything.
    let agent = if kinds.contains(&Kind::Acp) && opts.url.is_none() {
        Some(agent_bin(args)?)
    } else {
        None
    };
    let mut phases = Vec::new();
    for &kind in kinds {
        let agents = match (kind, &agent) {
            (Kind::Acp, Some(bin)) => vec![tandem::config::AgentSpec::new(
                args.acp_provider.clone(),
                bin.display().to_string(),
                Vec::new(),
            )],
            _ => Vec::new(),
        };
        let plan = super::store::plan_default(opts, "agent-stream")?;
        let server = Server::tandem_with_agents(opts, &plan.args, None, &agents).await?;
        note(format!(
            "{}: {} at {} ({})",
            kind.key(),
            server.label,
            server.url,
            plan.label
        ));
        let res = run_phase(&server, kind, args, opts).await;
        server.stop(StopHow::Term).await?;
        plan.cleanup();
        phases.push(res?);
    }
    Ok(report(args, phases))
}

async fn run_phase(
    server: &Server,
    kind: Kind,
    args: &AgentStreamArgs,
    opts: &ServerOpts,
) -> anyhow::Result<Phase> {
    let ep = Arc::new(Endpoint::new(&server.url, opts.source_ips).await?);
    let provider = match kind {
        Kind::Acp => args.acp_provider.as_str(),
        Kind::Scripted => "scripted",
    };
    let mut driver = ep.client(&unique("agent-stream-driver")).await?;
    let (_session, chat) = driver
        .create_session_with(provider)
        .await
        .with_context(|| format!("creating a session with provider `{provider}`"))?;
    driver.subscribe(&chat).await?;
    let turn_id: Arc<str> = unique("turn").into();

    // Subscribers, each reading as soon as it is subscribed.
    let done = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = signal::channel(false);
    let pb = crate::progress::count(args.subscribers as u64, "subscribe");
    let connected: Vec<anyhow::Result<tokio::task::JoinHandle<Watch>>> =
        futures_util::stream::iter(0..args.subscribers)
            .map(|s| {
                let (ep, chat, turn_id) = (ep.clone(), chat.clone(), turn_id.clone());
                let (done, stop, pb) = (done.clone(), stop_rx.clone(), pb.clone());
                let chunks = args.chunks;
                async move {
                    let mut c = ep.client(&unique(&format!("watcher-{s}"))).await?;
                    let snap = c.subscribe(&chat).await?;
                    pb.inc(1);
                    let pending: Vec<String> = c.pending.drain(..).collect();
                    let w = Watch::new(snap.from_seq, chunks);
                    Ok(tokio::spawn(watch_turn(
                        c.ws, pending, w, turn_id, done, stop,
                    )))
                }
            })
            .buffer_unordered(args.connect_concurrency.max(1))
            .collect()
            .await;
    pb.finish_and_clear();
    let mut tasks = Vec::new();
    for c in connected {
        match c {
            Ok(t) => tasks.push(t),
            Err(e) => {
                let _ = stop_tx.send(true);
                return Err(e.context("connecting a subscriber"));
            }
        }
    }

    let agent_pid = match kind {
        Kind::Acp => server.pid.and_then(|p| children(p).into_iter().next()),
        Kind::Scripted => None,
    };
    let (text, expected) = prompt(kind, args.chunks, args.interval_ms);
    let before = Cpu::read(server.pid, agent_pid);
    let action = json!({
        "type": "chat/turnStarted",
        "turnId": &*turn_id,
        "startedAt": tandem::time::now_rfc3339(),
        "message": {"text": text, "origin": {"kind": "user"}},
    });
    let id = driver.next_id();
    driver
        .send(proto::dispatch(
            id,
            &proto::json_str(&chat),
            1,
            &action.to_string(),
        ))
        .await?;
    // The driver's own echo says whether the turn started; afterwards its
    // socket is drained so that its queue never holds the stream up.
    loop {
        let frame = driver.next_text(REQUEST_TIMEOUT).await?;
        let Some(env) = proto::parse_action(&frame) else {
            continue;
        };
        if env.origin.as_ref().is_some_and(|o| o.client_seq == 1) {
            if let Some(reason) = env.rejection_reason {
                let _ = stop_tx.send(true);
                bail!("chat/turnStarted rejected: {reason}");
            }
            break;
        }
    }
    let mut driver_stop = stop_rx.clone();
    let drain_driver = tokio::spawn(async move {
        let mut ws = driver.ws;
        loop {
            tokio::select! {
                m = ws.next() => if !matches!(m, Some(Ok(_))) { break },
                _ = driver_stop.wait_for(|s| *s) => break,
            }
        }
    });

    let scheduled = Duration::from_millis(args.interval_ms * u64::from(args.chunks));
    let deadline = tokio::time::Instant::now() + scheduled + Duration::from_secs_f64(args.drain);
    let pb = crate::progress::timed(
        scheduled.as_secs_f64(),
        &format!("{} streaming", kind.key()),
    );
    let ticker = {
        let pb = pb.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                pb.inc(1);
            }
        })
    };
    while done.load(Ordering::Relaxed) < tasks.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = Cpu::read(server.pid, agent_pid);
    ticker.abort();
    pb.finish_and_clear();
    let _ = stop_tx.send(true);
    let mut watches = Vec::with_capacity(tasks.len());
    for t in tasks {
        watches.push(t.await.context("subscriber task")?);
    }
    let _ = drain_driver.await;

    // The server's record of the turn, from a fresh subscriber.
    let mut fresh = ep.client(&unique("agent-stream-check")).await?;
    let snap = fresh.subscribe(&chat).await?;
    fresh.close().await;
    let state: ChatState =
        serde_json::from_value(snap.state).context("decoding the chat snapshot")?;
    let recorded: Option<String> = state.turns.iter().find(|t| *t.id == *turn_id).map(|t| {
        t.response_parts
            .iter()
            .filter_map(|p| match p {
                ResponsePart::Markdown(m) => Some(m.content.as_str()),
                _ => None,
            })
            .collect()
    });

    Ok(analyse(
        kind,
        server.label.clone(),
        args,
        watches,
        expected,
        recorded,
        before,
        after,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use watch::token;

    #[test]
    fn scripted_tokens_have_one_width_and_parse() {
        let text = scripted_text(12);
        let widths: Vec<usize> = text.split_inclusive(' ').map(str::len).collect();
        assert_eq!(widths.len(), 12);
        assert!(widths.iter().all(|w| *w == widths[0]), "{text}");
        let parsed: Vec<u64> = text
            .split(' ')
            .filter(|t| !t.is_empty())
            .filter_map(|t| token(t).map(|(i, _)| i))
            .collect();
        assert_eq!(parsed, (1..=12).collect::<Vec<_>>());
    }
}
