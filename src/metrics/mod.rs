//! What the server counts for `GET /metrics` (Prometheus text format,
//! rendered by `metrics-exporter-prometheus`).
//!
//! Every series is registered once, when the server starts, and kept as a
//! handle: counting is one atomic add on the handle, with no lookup, lock
//! or allocation. Deliveries are counted once per published action (by the
//! number of its receivers), bytes once per socket write. Figures the
//! server already keeps (open connections, subscriptions, channels,
//! providers) are read when `/metrics` is scraped, not counted as they
//! change.
//!
//! Each server has its own recorder (not the process-wide one), so servers
//! in one process (tests) count apart.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::store::CommitMetrics;
use crate::transport::CloseCause;

mod labels;
mod registrar;

use labels::{eviction, EVICTIONS};
pub use labels::{InteractionKind, ReconnectAnswer, RejectClass, Settled, Waiting};
use registrar::Registrar;

/// Figures read when `/metrics` is scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readings {
    /// Open connections.
    pub connections: usize,
    /// Subscriptions over every channel.
    pub subscriptions: usize,
    /// Live sessions.
    pub sessions: usize,
    /// Live chats.
    pub chats: usize,
    /// Agents connected over AHP (`tandem/registerProvider`).
    pub providers_connected: usize,
    /// ACP agent processes running.
    pub agent_processes: usize,
    /// Bytes of envelopes in the replay ring.
    pub replay_ring_bytes: usize,
}

/// Every series the server exports, registered.
pub struct Metrics {
    handle: PrometheusHandle,
    connections: Gauge,
    subscriptions: Gauge,
    sessions: Gauge,
    chats: Gauge,
    providers_connected: Gauge,
    agent_processes: Gauge,
    replay_ring_bytes: Gauge,
    /// Connections accepted (upgraded to WebSocket).
    pub connections_opened: Counter,
    accepted_from_connections: Counter,
    accepted_from_server: Counter,
    rejected: [Counter; 6],
    /// Envelopes pushed to connections (one per receiver of an action).
    pub deliveries: Counter,
    /// Bytes written to sockets.
    pub sent_bytes: Counter,
    evictions: [Counter; 7],
    reconnect_replay: Counter,
    reconnect_snapshot: Counter,
    commits: CommitMetrics,
    opened: [Counter; 3],
    /// By kind and outcome; `None` where the outcome cannot happen to the
    /// kind (a tool call is not declined, a question not approved).
    settled: [[Option<Counter>; 7]; 3],
    settle_seconds: [Histogram; 3],
    /// Requests for a person open now, by chat and id (written when one
    /// opens or ends, read by the admin view).
    waiting: dashmap::DashMap<(String, String), Waiting>,
    /// Webhook deliveries.
    pub notify_webhook: NotifyCounters,
    /// Web Push deliveries.
    pub notify_push: NotifyCounters,
}

/// What one way of notifying counts.
#[derive(Clone)]
pub struct NotifyCounters {
    /// Deliveries the receiver took.
    pub sent: Counter,
    /// Deliveries given up after their retries (or refused outright).
    pub failed: Counter,
    /// Deliveries dropped unsent (a full queue).
    pub dropped: Counter,
    /// From a delivery's first attempt to its end.
    pub seconds: Histogram,
}

/// Seconds buckets of the journal's commits: 50 µs to 1 s.
const COMMIT_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.25, 1.0,
];
/// Seconds buckets of the journal's checkpoints: 1 ms to 2.5 s.
const CHECKPOINT_BUCKETS: [f64; 10] = [
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
];
/// Writes per group commit.
const GROUP_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// Seconds a person took to settle an interaction: 1 s to a day.
const SETTLE_BUCKETS: [f64; 10] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0,
];

/// Seconds a notification took, retries included: 10 ms to 5 min.
const NOTIFY_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A recorder of its own with every series registered (at zero).
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("tandem_journal_commit_seconds".into()),
                &COMMIT_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tandem_journal_commit_writes".into()),
                    &GROUP_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tandem_journal_checkpoint_seconds".into()),
                    &CHECKPOINT_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tandem_interaction_settle_seconds".into()),
                    &SETTLE_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tandem_notification_seconds".into()),
                    &NOTIFY_BUCKETS,
                )
            })
            .expect("the buckets are not empty")
            .build_recorder();
        let r = Registrar {
            recorder: &recorder,
        };
        let connections = r.gauge("tandem_connections", "Open WebSocket connections.", &[]);
        let subscriptions = r.gauge(
            "tandem_subscriptions",
            "Subscriptions over every channel.",
            &[],
        );
        let channels = "Live channels by kind.";
        let sessions = r.gauge("tandem_channels", channels, &[("kind", "session")]);
        let chats = r.gauge("tandem_channels", channels, &[("kind", "chat")]);
        let providers_connected = r.gauge(
            "tandem_providers_connected",
            "Agents connected over AHP (tandem/registerProvider).",
            &[],
        );
        let agent_processes = r.gauge(
            "tandem_agent_processes",
            "ACP agent processes running.",
            &[],
        );
        let replay_ring_bytes = r.gauge(
            "tandem_replay_ring_bytes",
            "Bytes of envelopes kept for reconnect replay.",
            &[],
        );
        let connections_opened = r.counter(
            "tandem_connections_opened_total",
            "WebSocket connections accepted.",
            &[],
        );
        let accepted = "Actions journaled and published, by who sent them: a connection (client or agent) or the server itself.";
        let accepted_from_connections = r.counter(
            "tandem_actions_accepted_total",
            accepted,
            &[("source", "connection")],
        );
        let accepted_from_server = r.counter(
            "tandem_actions_accepted_total",
            accepted,
            &[("source", "server")],
        );
        let rejected = RejectClass::ALL.map(|c| {
            r.counter(
                "tandem_actions_rejected_total",
                "Actions refused, by class of reason.",
                &[("reason", c.as_str())],
            )
        });
        let deliveries = r.counter(
            "tandem_deliveries_total",
            "Envelopes pushed to connections (one per receiver of each action).",
            &[],
        );
        let sent_bytes = r.counter(
            "tandem_sent_bytes_total",
            "Bytes written to WebSocket connections.",
            &[],
        );
        let evictions = EVICTIONS.map(|cause| {
            r.counter(
                "tandem_evictions_total",
                "Connections the server closed on its own, by cause.",
                &[("cause", cause)],
            )
        });
        let reconnects = "`reconnect` requests, by how they were answered.";
        let reconnect_replay = r.counter(
            "tandem_reconnects_total",
            reconnects,
            &[("answer", "replay")],
        );
        let reconnect_snapshot = r.counter(
            "tandem_reconnects_total",
            reconnects,
            &[("answer", "snapshot")],
        );
        let commits = CommitMetrics {
            seconds: r.histogram(
                "tandem_journal_commit_seconds",
                "Time one group commit of the journal took (transaction and fsync).",
                Some(Unit::Seconds),
                &[],
            ),
            writes: r.histogram(
                "tandem_journal_commit_writes",
                "Writes in one group commit of the journal.",
                None,
                &[],
            ),
            checkpoint_seconds: ["checkpointer", "writer"].map(|thread| {
                r.histogram(
                    "tandem_journal_checkpoint_seconds",
                    "Time one checkpoint of the journal's WAL took, by the thread that ran it (the writer only finishes a copy or works over the WAL's bound).",
                    Some(Unit::Seconds),
                    &[("thread", thread)],
                )
            }),
        };
        let opened = InteractionKind::ALL.map(|k| {
            r.counter(
                "tandem_interactions_opened_total",
                "Requests for a person (questions, URLs, tool approvals), by kind.",
                &[("kind", k.as_str())],
            )
        });
        let settled = InteractionKind::ALL.map(|k| {
            Settled::ALL.map(|o| {
                o.happens_to(k).then(|| {
                    r.counter(
                        "tandem_interactions_settled_total",
                        "Requests for a person that ended, by kind and outcome.",
                        &[("kind", k.as_str()), ("outcome", o.as_str())],
                    )
                })
            })
        });
        let settle_seconds = InteractionKind::ALL.map(|k| {
            r.histogram(
                "tandem_interaction_settle_seconds",
                "Time from a request for a person to its settlement, by kind.",
                Some(Unit::Seconds),
                &[("kind", k.as_str())],
            )
        });
        let notifications = "Notifications by channel and outcome: sent, failed (given up after retries), dropped (a full queue).";
        let notify = |channel: &'static str| {
            NotifyCounters {
            sent: r.counter(
                "tandem_notifications_total",
                notifications,
                &[("channel", channel), ("outcome", "sent")],
            ),
            failed: r.counter(
                "tandem_notifications_total",
                notifications,
                &[("channel", channel), ("outcome", "failed")],
            ),
            dropped: r.counter(
                "tandem_notifications_total",
                notifications,
                &[("channel", channel), ("outcome", "dropped")],
            ),
            seconds: r.histogram(
                "tandem_notification_seconds",
                "Time from a notification's first attempt to its end (retries included), by channel.",
                Some(Unit::Seconds),
                &[("channel", channel)],
            ),
        }
        };
        let notify_webhook = notify("webhook");
        let notify_push = notify("push");
        Self {
            handle: recorder.handle(),
            connections,
            subscriptions,
            sessions,
            chats,
            providers_connected,
            agent_processes,
            replay_ring_bytes,
            connections_opened,
            accepted_from_connections,
            accepted_from_server,
            rejected,
            deliveries,
            sent_bytes,
            evictions,
            reconnect_replay,
            reconnect_snapshot,
            commits,
            opened,
            settled,
            settle_seconds,
            waiting: dashmap::DashMap::new(),
            notify_webhook,
            notify_push,
        }
    }

    /// `w` waits for a person from now on.
    pub fn waiting_opened(&self, w: Waiting) {
        self.waiting.insert((w.chat.clone(), w.id.clone()), w);
    }

    /// The request `id` of `chat` no longer waits (settled, or its chat gone).
    pub fn waiting_ended(&self, chat: &str, id: &str) {
        self.waiting.remove(&(chat.to_owned(), id.to_owned()));
    }

    /// Every request of `chat` no longer waits.
    pub fn waiting_chat_gone(&self, chat: &str) {
        self.waiting.retain(|(c, _), _| c != chat);
    }

    /// The requests waiting for a person now, the longest waiting first.
    pub fn waiting(&self) -> Vec<Waiting> {
        let mut all: Vec<Waiting> = self.waiting.iter().map(|w| w.value().clone()).collect();
        all.sort_by_key(|w| w.since);
        all
    }

    /// `n` actions published: `from_connections` of them sent by a
    /// connection, the rest by the server.
    pub fn accepted(&self, n: usize, from_connections: usize) {
        if from_connections > 0 {
            self.accepted_from_connections
                .increment(from_connections as u64);
        }
        if n > from_connections {
            self.accepted_from_server
                .increment((n - from_connections) as u64);
        }
    }

    /// An action was refused for `reason`.
    pub fn rejected(&self, reason: &str) {
        let class = RejectClass::of(reason);
        let i = RejectClass::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(RejectClass::ALL.len() - 1);
        self.rejected[i].increment(1);
    }

    /// A `reconnect` was answered.
    pub fn reconnected(&self, answer: ReconnectAnswer) {
        match answer {
            ReconnectAnswer::Replay => self.reconnect_replay.increment(1),
            ReconnectAnswer::Snapshot => self.reconnect_snapshot.increment(1),
        }
    }

    /// The journal's commit histograms (for its writer).
    pub fn commits(&self) -> CommitMetrics {
        self.commits.clone()
    }

    /// A request for a person was opened.
    pub fn interaction_opened(&self, kind: InteractionKind) {
        self.opened[kind_index(kind)].increment(1);
    }

    /// A request for a person ended after `waited` (unknown for one opened
    /// before a restart).
    pub fn interaction_settled(
        &self,
        kind: InteractionKind,
        outcome: Settled,
        waited: Option<Duration>,
    ) {
        let k = kind_index(kind);
        let o = Settled::ALL.iter().position(|s| *s == outcome).unwrap_or(0);
        if let Some(c) = &self.settled[k][o] {
            c.increment(1);
        }
        if let Some(w) = waited {
            self.settle_seconds[k].record(w.as_secs_f64());
        }
    }

    /// The exposition, with the figures read now.
    pub fn render(&self, now: Readings) -> String {
        self.connections.set(now.connections as f64);
        self.subscriptions.set(now.subscriptions as f64);
        self.sessions.set(now.sessions as f64);
        self.chats.set(now.chats as f64);
        self.providers_connected.set(now.providers_connected as f64);
        self.agent_processes.set(now.agent_processes as f64);
        self.replay_ring_bytes.set(now.replay_ring_bytes as f64);
        self.handle.render()
    }

    /// Fold recorded histogram samples into their buckets (done on every
    /// render too); run now and then so samples do not pile up unscraped.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }
}

impl crate::transport::Meter for Metrics {
    fn sent(&self, bytes: u64) {
        self.sent_bytes.increment(bytes);
    }

    /// Counted when the server evicted the connection.
    fn closed(&self, cause: &CloseCause) {
        if let Some(i) = eviction(cause) {
            self.evictions[i].increment(1);
        }
    }
}

fn kind_index(kind: InteractionKind) -> usize {
    InteractionKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Meter as _;

    #[test]
    fn rejection_reasons_fall_into_their_classes() {
        for (reason, class) in [
            (
                "PermissionDenied: not your session",
                RejectClass::NotAllowed,
            ),
            (
                "`chat/inputCompleted` is a person's act: an agent may not send it",
                RejectClass::NotAllowed,
            ),
            (
                "rate limited: more than 50 dispatches",
                RejectClass::RateLimited,
            ),
            (
                "too large: a `dispatchAction` of 9000 bytes",
                RejectClass::TooLarge,
            ),
            (
                "the store is unavailable (disk full); the chat is read-only",
                RejectClass::Store,
            ),
            ("not stored: locked", RejectClass::Store),
            (
                "the channel is changing hands between nodes; try again",
                RejectClass::Cluster,
            ),
            (
                "input request `r1` is already settled",
                RejectClass::Invalid,
            ),
        ] {
            assert_eq!(RejectClass::of(reason), class, "{reason}");
        }
    }

    #[test]
    fn the_grafana_dashboard_uses_only_exported_series() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/grafana/tandem-dashboard.json"))
                .expect("the dashboard is JSON");
        let m = Metrics::new();
        m.commits().seconds.record(0.001);
        m.commits().writes.record(1.0);
        m.interaction_settled(
            InteractionKind::Input,
            Settled::Answered,
            Some(Duration::from_secs(1)),
        );
        let text = m.render(Readings::default());
        let exported: std::collections::HashSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let mut used = 0;
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("expr");
                for (i, _) in expr.match_indices("tandem_") {
                    let name: String = expr[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        exported.contains(name.as_str()),
                        "{name} (in `{expr}`) is not exported"
                    );
                    used += 1;
                }
            }
        }
        assert!(used >= 15, "the dashboard draws the metrics ({used} uses)");
    }

    #[test]
    fn every_series_is_exported_from_the_start_and_counts_what_it_is_told() {
        let m = Metrics::new();
        let zero = m.render(Readings::default());
        for line in [
            "tandem_actions_rejected_total{reason=\"rate_limited\"} 0",
            "tandem_evictions_total{cause=\"overflow\"} 0",
            "tandem_interactions_settled_total{kind=\"tool\",outcome=\"denied\"} 0",
            "tandem_channels{kind=\"chat\"} 0",
        ] {
            assert!(zero.contains(line), "{line} in\n{zero}");
        }
        m.rejected("rate limited: more than 1 dispatches");
        m.accepted(5, 2);
        m.closed(&CloseCause::Overflow);
        m.closed(&CloseCause::Normal);
        m.interaction_opened(InteractionKind::Tool);
        m.interaction_settled(
            InteractionKind::Tool,
            Settled::Denied,
            Some(Duration::from_secs(2)),
        );
        m.commits().seconds.record(0.000_3);
        m.commits().writes.record(3.0);
        let text = m.render(Readings {
            chats: 4,
            ..Readings::default()
        });
        for line in [
            "tandem_actions_rejected_total{reason=\"rate_limited\"} 1",
            "tandem_actions_accepted_total{source=\"connection\"} 2",
            "tandem_actions_accepted_total{source=\"server\"} 3",
            "tandem_evictions_total{cause=\"overflow\"} 1",
            "tandem_interactions_opened_total{kind=\"tool\"} 1",
            "tandem_interactions_settled_total{kind=\"tool\",outcome=\"denied\"} 1",
            "tandem_interaction_settle_seconds_bucket{kind=\"tool\",le=\"5\"} 1",
            "tandem_interaction_settle_seconds_bucket{kind=\"tool\",le=\"1\"} 0",
            "tandem_journal_commit_seconds_bucket{le=\"0.0005\"} 1",
            "tandem_journal_commit_writes_sum 3",
            "tandem_channels{kind=\"chat\"} 4",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(!text.contains("cause=\"normal\""));
        assert!(!text.contains("kind=\"tool\",outcome=\"declined\""));
    }
}
