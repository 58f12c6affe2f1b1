//! What one agent's run measured, and the report that compares the runs.

use hdrhistogram::Histogram;
use serde_json::json;

use super::watch::{token, well_formed_stamped, Watch};
use super::{AgentStreamArgs, Kind};
use crate::clock::monotonic_ns;
use crate::report::ScenarioResult;
use crate::stats::{new_hist, record_ns, Integrity, Summary};

/// CPU readings at one moment: server, agent process, this process, machine.
#[derive(Clone, Copy)]
pub(super) struct Cpu {
    server: Option<f64>,
    agent: Option<f64>,
    loadgen: Option<f64>,
    machine: Option<f64>,
    at_ns: u64,
}

impl Cpu {
    pub(super) fn read(server: Option<u32>, agent: Option<u32>) -> Self {
        Self {
            server: server.and_then(crate::sys::cpu_seconds),
            agent: agent.and_then(crate::sys::cpu_seconds),
            loadgen: crate::sys::cpu_seconds(std::process::id()),
            machine: crate::sys::machine_busy_seconds(),
            at_ns: monotonic_ns(),
        }
    }
}

/// The server's child processes (the ACP agent), from
/// `/proc/<pid>/task/*/children`.
pub(super) fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// What one agent's run measured.
pub(super) struct Phase {
    kind: Kind,
    label: String,
    integrity: Integrity,
    deliveries: u64,
    expected_deliveries: u64,
    /// Subscribers whose text is not what the agent sent.
    wrong_text: usize,
    /// Subscribers that did not see the turn complete.
    incomplete: usize,
    close_reasons: Vec<String>,
    bad_tokens: u64,
    /// The server's snapshot of the turn holds the agent's text.
    snapshot_ok: bool,
    /// Agent stamp → every subscriber (ACP only).
    all: Histogram<u64>,
    /// Agent stamp → last subscriber of each chunk (ACP only).
    last: Histogram<u64>,
    /// First → last subscriber of each chunk.
    spread: Histogram<u64>,
    /// First arrival of any chunk → last arrival of any chunk, seconds.
    stream_seconds: f64,
    /// Latest chunk behind the agent's own schedule, ms (ACP only).
    agent_max_late_ms: Option<f64>,
    before: Cpu,
    after: Cpu,
}

impl Phase {
    fn cpu_window_seconds(&self) -> f64 {
        (self.after.at_ns.saturating_sub(self.before.at_ns)) as f64 / 1e9
    }

    fn cpu(&self, f: impl Fn(&Cpu) -> Option<f64>) -> Option<f64> {
        Some(f(&self.after)? - f(&self.before)?)
    }

    fn server_cpu_us_per_delivery(&self) -> Option<f64> {
        self.cpu(|c| c.server)
            .map(|s| s * 1e6 / self.deliveries.max(1) as f64)
    }

    fn deliveries_per_sec(&self) -> f64 {
        self.deliveries as f64 / self.stream_seconds.max(1e-9)
    }

    fn background_cores(&self) -> Option<f64> {
        let own = self.cpu(|c| c.server).unwrap_or(0.0)
            + self.cpu(|c| c.agent).unwrap_or(0.0)
            + self.cpu(|c| c.loadgen).unwrap_or(0.0);
        Some(((self.cpu(|c| c.machine)? - own) / self.cpu_window_seconds().max(1e-9)).max(0.0))
    }

    fn clean(&self) -> bool {
        self.integrity.clean()
            && self.wrong_text == 0
            && self.incomplete == 0
            && self.bad_tokens == 0
            && self.snapshot_ok
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn analyse(
    kind: Kind,
    label: String,
    args: &AgentStreamArgs,
    watches: Vec<Watch>,
    expected: Option<String>,
    recorded: Option<String>,
    before: Cpu,
    after: Cpu,
) -> Phase {
    let n = args.chunks as usize;
    // What the agent sent: known in advance (scripted), or the first
    // subscriber's text if it has the agent's form (ACP).
    let reference = expected.or_else(|| {
        watches
            .iter()
            .map(|w| &w.text)
            .find(|t| well_formed_stamped(t, args.chunks))
            .cloned()
    });
    let mut integrity = Integrity::default();
    let mut deliveries = 0;
    let mut wrong_text = 0;
    let mut incomplete = 0;
    let mut bad_tokens = 0;
    let mut close_reasons = Vec::new();
    let mut all = new_hist();
    for w in &watches {
        integrity.lost += u64::from(args.chunks).saturating_sub(w.chunks.unique);
        integrity.duplicated += w.chunks.duplicates + w.order.duplicates;
        integrity.reordered += w.chunks.reordered + w.order.reordered;
        deliveries += w.deltas;
        bad_tokens += w.bad_tokens;
        if reference.as_deref() != Some(w.text.as_str()) {
            wrong_text += 1;
        }
        if w.end.as_deref() != Some("chat/turnComplete") {
            incomplete += 1;
            if close_reasons.len() < 5 {
                close_reasons.push(
                    w.closed
                        .clone()
                        .or_else(|| w.end.clone())
                        .unwrap_or_else(|| "no end of turn before the deadline".into()),
                );
            }
        }
        let _ = all.add(&w.latency);
    }
    let stamps: Vec<Option<u64>> = match &reference {
        Some(text) if kind == Kind::Acp => text
            .split(' ')
            .filter(|t| !t.is_empty())
            .map(|t| token(t).and_then(|(_, s)| s))
            .collect(),
        _ => vec![None; n],
    };
    let (mut last, mut spread) = (new_hist(), new_hist());
    let (mut first_any, mut last_any) = (u64::MAX, 0);
    for i in 0..n {
        let times = watches.iter().map(|w| w.arrivals[i]).filter(|&t| t > 0);
        let (lo, hi) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        if hi == 0 {
            continue;
        }
        first_any = first_any.min(lo);
        last_any = last_any.max(hi);
        record_ns(&mut spread, hi - lo);
        if let Some(Some(stamp)) = stamps.get(i) {
            record_ns(&mut last, hi.saturating_sub(*stamp));
        }
    }
    let agent_max_late_ms = match (stamps.first(), kind) {
        (Some(Some(first)), Kind::Acp) => Some(
            stamps
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let due = first + i as u64 * args.interval_ms * 1_000_000;
                    s.map(|s| s.saturating_sub(due))
                })
                .max()
                .unwrap_or(0) as f64
                / 1e6,
        ),
        _ => None,
    };
    Phase {
        kind,
        label,
        integrity,
        deliveries,
        expected_deliveries: u64::from(args.chunks) * watches.len() as u64,
        wrong_text,
        incomplete,
        close_reasons,
        bad_tokens,
        snapshot_ok: recorded.is_some() && recorded == reference,
        all,
        last,
        spread,
        stream_seconds: last_any.saturating_sub(first_any) as f64 / 1e9,
        agent_max_late_ms,
        before,
        after,
    }
}

pub(super) fn report(args: &AgentStreamArgs, phases: Vec<Phase>) -> ScenarioResult {
    let params = json!({
        "subscribers": args.subscribers,
        "chunks": args.chunks,
        "interval_ms": args.interval_ms,
        "agents": format!("{:?}", args.agents).to_lowercase(),
    });
    let label = phases
        .iter()
        .map(|p| format!("{}: {}", p.kind.key(), p.label))
        .collect::<Vec<_>>()
        .join("; ");
    let mut r = ScenarioResult::new("agent-stream", &label, params);
    let mut integrity = Integrity::default();
    for p in &phases {
        let k = p.kind.key();
        integrity.add(p.integrity);
        r.put(&format!("{k}_deliveries"), p.deliveries);
        r.put(&format!("{k}_deliveries_per_sec"), p.deliveries_per_sec());
        r.put(&format!("{k}_stream_seconds"), p.stream_seconds);
        r.put(&format!("{k}_lost"), p.integrity.lost);
        r.put(&format!("{k}_duplicated"), p.integrity.duplicated);
        r.put(&format!("{k}_reordered"), p.integrity.reordered);
        r.put(&format!("{k}_wrong_text"), p.wrong_text as u64);
        r.put(&format!("{k}_incomplete"), p.incomplete as u64);
        r.put(&format!("{k}_snapshot_matches"), p.snapshot_ok);
        r.put_latency(&format!("{k}_spread"), &Summary::of(&p.spread));
        r.curve(&format!("{k}: first → last subscriber"), &p.spread);
        if p.kind == Kind::Acp {
            r.put_latency("acp", &Summary::of(&p.all));
            r.put_latency("acp_last", &Summary::of(&p.last));
            r.curve("acp: agent → every subscriber", &p.all);
            r.curve("acp: agent → last subscriber", &p.last);
            if let Some(late) = p.agent_max_late_ms {
                r.put("acp_agent_max_late_ms", late);
            }
        }
        if let Some(us) = p.server_cpu_us_per_delivery() {
            r.put(&format!("{k}_server_cpu_us_per_delivery"), us);
        }
        if let Some(c) = p.cpu(|c| c.server) {
            // Per chunk: what one chunk costs the server whatever the fan-out
            // (the bridge's share shows here most clearly).
            r.put(
                &format!("{k}_server_cpu_us_per_chunk"),
                c * 1e6 / f64::from(args.chunks),
            );
            r.put(
                &format!("{k}_server_cpu_cores"),
                c / p.cpu_window_seconds().max(1e-9),
            );
        }
        if let Some(c) = p.cpu(|c| c.agent) {
            r.put(
                "acp_agent_cpu_us_per_chunk",
                c * 1e6 / f64::from(args.chunks),
            );
        }
        if let Some(b) = p.background_cores() {
            r.put(&format!("{k}_background_cpu_cores"), b);
            if b > 0.2 {
                r.note(format!(
                    "{k}: other processes used {b:.2} cores during the turn: the figures are skewed"
                ));
            }
        }
        if p.deliveries != p.expected_deliveries {
            r.note(format!(
                "{k}: {} deltas delivered, {} expected ({} subscribers × {} chunks)",
                p.deliveries, p.expected_deliveries, args.subscribers, args.chunks
            ));
        }
        if p.bad_tokens > 0 {
            r.note(format!("{k}: {} chunk tokens did not parse", p.bad_tokens));
        }
        if !p.snapshot_ok {
            r.note(format!(
                "{k}: the server's snapshot of the turn does not hold the agent's text"
            ));
        }
        if !p.close_reasons.is_empty() {
            r.note(format!(
                "{k}: {} subscribers did not see the turn complete, e.g. {:?}",
                p.incomplete, p.close_reasons
            ));
        }
        if !p.clean() {
            r.failed = true;
        }
    }
    r.set_integrity(&integrity);
    // The headline figures: the ACP run when there is one.
    let main = phases
        .iter()
        .find(|p| p.kind == Kind::Acp)
        .or(phases.first());
    if let Some(p) = main {
        r.deliveries_per_sec = Some(p.deliveries_per_sec());
        r.seconds = Some(p.stream_seconds);
        r.set_latency(&Summary::of(&p.all));
    }
    let acp = phases.iter().find(|p| p.kind == Kind::Acp);
    let scripted = phases.iter().find(|p| p.kind == Kind::Scripted);
    if let (Some(a), Some(s)) = (acp, scripted) {
        if let (Some(x), Some(y)) = (
            a.server_cpu_us_per_delivery(),
            s.server_cpu_us_per_delivery(),
        ) {
            r.put(
                "ratio_server_cpu_per_delivery_acp_to_scripted",
                x / y.max(1e-12),
            );
        }
        let (x, y) = (Summary::of(&a.spread), Summary::of(&s.spread));
        if x.count > 0 && y.count > 0 {
            r.put(
                "ratio_spread_p50_acp_to_scripted",
                x.p50_ms / y.p50_ms.max(1e-3),
            );
            r.put(
                "ratio_spread_p99_acp_to_scripted",
                x.p99_ms / y.p99_ms.max(1e-3),
            );
        }
        r.put(
            "ratio_deliveries_per_sec_acp_to_scripted",
            a.deliveries_per_sec() / s.deliveries_per_sec().max(1e-9),
        );
    }
    let all_clean = phases.iter().all(Phase::clean);
    r.target(
        "every subscriber: every delta once, in order, the agent's text, the turn's end",
        "all",
        phases
            .iter()
            .map(|p| {
                format!(
                    "{}: lost {} / dup {} / reordered {} / wrong text {} / incomplete {}",
                    p.kind.key(),
                    p.integrity.lost,
                    p.integrity.duplicated,
                    p.integrity.reordered,
                    p.wrong_text,
                    p.incomplete
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        all_clean,
    );
    r.note(
        "acp latency: the agent's CLOCK_MONOTONIC stamp → receive; the scripted agent cannot stamp, \
         so both are compared on first → last subscriber spread, CPU per delivery and deliveries/s",
    );
    r.note("server CPU excludes the ACP agent process (acp_agent_cpu_us_per_chunk)");
    r
}
