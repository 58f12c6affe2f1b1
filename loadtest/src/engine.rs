//! The measuring machinery shared by the scenarios: publishers that send on a
//! fixed schedule, receivers that time and check every envelope, and a phase
//! runner that wires them to a server.
//!
//! * **Open loop** ([`Schedule::Open`]): action `i` of a publisher is due at
//!   `start + phase + i / rate` (publishers' phases spread evenly over one
//!   interval) and is stamped with that *scheduled* time; if the socket or
//!   the server is slow the publisher sends late ones at once, and the
//!   lateness shows up in the latency (no coordinated omission).
//! * **Closed loop** ([`Schedule::Closed`]): at most `window` actions per
//!   publisher are in flight (not yet delivered to every subscriber, or not
//!   yet echoed). Used only to find the maximum throughput, never for latency
//!   targets.
//!
//! Every receiver checks, per publisher, that each counter arrives exactly
//! once and in order, and that `serverSeq` strictly increases on its
//! connection. Each action has a slot counting its receivers; the receiver
//! that completes the count records the latency to the *last* receiver, the
//! one that starts it the latency to the *first* (the server's time to its
//! first write, which splits a median into time before the fan-out and the
//! fan-out's spread).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ahp::reducers::apply_action_to_chat;
use ahp_types::actions::StateAction;
use ahp_types::state::ChatState;
use anyhow::Context as _;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::clock::{now_ns, sleep_until_ns, PreciseTimer};
use crate::conn::{Endpoint, Ws};
use crate::proto::{self, EnvelopeLite};
use crate::stats::{Integrity, Seen, SeqChecker, SeqOrder, ShardedCounter, ShardedHist};

/// How a publisher paces its actions.
#[derive(Debug, Clone, Copy)]
pub enum Schedule {
    /// `count` actions at `rate` per second each, stamped with their
    /// scheduled times.
    Open { rate: f64, count: u64 },
    /// Keep `window` actions in flight until `seconds` have passed or
    /// `limit` actions were sent.
    Closed {
        window: u64,
        gate: Gate,
        seconds: f64,
        limit: u64,
    },
}

/// What frees a closed-loop window slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// The action reached every subscriber of its chat.
    Delivered,
    /// The publisher got its own echo (durability, no subscribers needed).
    Echoed,
}

/// What a publisher dispatches.
#[derive(Debug, Clone)]
pub enum ActionKind {
    /// `chat/draftChanged` with the stamp plus `pad` filler bytes.
    Draft { pad: usize },
    /// `chat/inputAnswerChanged` on one open request; successive actions
    /// rotate over `questions`, starting at an offset per writer, so writers
    /// overwrite each other's answers.
    Answer {
        request_id: String,
        questions: Vec<String>,
    },
}

/// Shared state of one publisher.
pub struct PubShared {
    /// Global publisher index (the stamp's first field).
    pub index: u32,
    /// Subscribers of this publisher's chat (set once they are connected).
    pub expected: AtomicU32,
    slots: Vec<AtomicU32>,
    /// Actions sent.
    pub sent: AtomicU64,
    /// Echoes without a rejection.
    pub accepted: AtomicU64,
    /// Highest counter echoed as accepted.
    pub accepted_hi: AtomicU64,
    /// Rejection echoes.
    pub rejected: AtomicU64,
    /// Actions delivered to every subscriber.
    pub completed: AtomicU64,
    /// The send loop has ended (its `sent` is final).
    pub sending_done: AtomicBool,
    notify: Notify,
}

impl PubShared {
    fn new(index: u32, slots: usize) -> Self {
        Self {
            index,
            expected: AtomicU32::new(0),
            slots: (0..slots.max(1)).map(|_| AtomicU32::new(0)).collect(),
            sent: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            accepted_hi: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            sending_done: AtomicBool::new(false),
            notify: Notify::new(),
        }
    }

    fn slot(&self, n: u64) -> &AtomicU32 {
        &self.slots[(n % self.slots.len() as u64) as usize]
    }

    /// Everything sent has been answered and (with subscribers) delivered.
    pub fn settled(&self) -> bool {
        if !self.sending_done.load(Ordering::Acquire) {
            return false;
        }
        let sent = self.sent.load(Ordering::Acquire);
        let acc = self.accepted.load(Ordering::Acquire);
        let answered = acc + self.rejected.load(Ordering::Acquire) >= sent;
        let delivered = self.expected.load(Ordering::Acquire) == 0
            || self.completed.load(Ordering::Acquire) >= acc;
        answered && delivered
    }
}

/// Everything the tasks of one measured phase share.
pub struct Run {
    /// One per publisher, by global index.
    pub pubs: Vec<PubShared>,
    /// Deliveries to subscribers so far (sharded by receiver: a single
    /// counter bumped a million times a second from every thread would be
    /// the load generator's hottest cache line).
    pub deliveries: ShardedCounter,
    /// Publish → each subscriber.
    pub all: ShardedHist,
    /// Publish → the last subscriber of each action.
    pub last: ShardedHist,
    /// Publish → the first subscriber of each action.
    pub first: ShardedHist,
    /// Publish → the publisher's own echo.
    pub echo: ShardedHist,
    /// Publish → each subscriber, by the subscriber's group (e.g. the
    /// cluster node it is connected to); empty unless asked for.
    pub groups: Vec<ShardedHist>,
    /// Actions scheduled before this are not recorded (warm-up).
    pub record_from_ns: AtomicU64,
    /// Set when a closed-loop publisher made no progress for too long.
    pub stalled: AtomicBool,
    /// Publishers stop sending (their echo readers keep counting).
    pub halt: AtomicBool,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
}

impl Run {
    /// A run with one entry per publisher, each with `slots` receive slots.
    pub fn new(publishers: usize, slots: usize) -> Arc<Self> {
        Self::with_groups(publishers, slots, 0)
    }

    /// [`Run::new`] that also keeps a latency histogram per receiver group
    /// (`0..groups`, see [`SubPlan::group`]).
    pub fn with_groups(publishers: usize, slots: usize, groups: usize) -> Arc<Self> {
        let (stop_tx, stop_rx) = watch::channel(false);
        Arc::new(Self {
            pubs: (0..publishers)
                .map(|i| PubShared::new(i as u32, slots))
                .collect(),
            deliveries: ShardedCounter::new(64),
            all: ShardedHist::new(16),
            last: ShardedHist::new(16),
            first: ShardedHist::new(16),
            echo: ShardedHist::new(16),
            groups: (0..groups).map(|_| ShardedHist::new(16)).collect(),
            record_from_ns: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            halt: AtomicBool::new(false),
            stop_tx,
            stop_rx,
        })
    }

    /// Tell every task to finish.
    pub fn stop(&self) {
        let _ = self.stop_tx.send(true);
    }

    /// Whether [`Run::stop`] has been called.
    pub fn stopped(&self) -> bool {
        *self.stop_rx.borrow()
    }

    /// A handle that resolves when [`Run::stop`] is called.
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop_rx.clone()
    }

    fn records(&self, t_ns: u64) -> bool {
        t_ns >= self.record_from_ns.load(Ordering::Relaxed)
    }

    /// Wait until every publisher has settled, or `timeout`; true if settled.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.pubs.iter().all(PubShared::settled) {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Accepted actions summed over publishers.
    pub fn accepted(&self) -> u64 {
        self.pubs
            .iter()
            .map(|p| p.accepted.load(Ordering::Acquire))
            .sum()
    }

    /// Sent actions summed over publishers.
    pub fn sent(&self) -> u64 {
        self.pubs
            .iter()
            .map(|p| p.sent.load(Ordering::Acquire))
            .sum()
    }

    /// Rejected actions summed over publishers.
    pub fn rejected(&self) -> u64 {
        self.pubs
            .iter()
            .map(|p| p.rejected.load(Ordering::Acquire))
            .sum()
    }

    /// Accepted actions that did not reach every subscriber.
    pub fn incomplete(&self) -> u64 {
        self.pubs
            .iter()
            .filter(|p| p.expected.load(Ordering::Acquire) > 0)
            .map(|p| {
                p.accepted
                    .load(Ordering::Acquire)
                    .saturating_sub(p.completed.load(Ordering::Acquire))
            })
            .sum()
    }
}

/// A subscriber's copy of its chat, kept with the official reducer.
pub struct Mirror {
    /// The chat URI.
    pub chat: String,
    /// State reduced from the snapshot and every later envelope.
    pub state: ChatState,
    /// The snapshot's `fromSeq`.
    pub from_seq: u64,
    /// Envelopes that did not decode as a `StateAction`.
    pub undecodable: u64,
}

impl Mirror {
    fn apply(&mut self, env: &EnvelopeLite<'_>) {
        if env.rejection_reason.is_some()
            || env.server_seq <= self.from_seq
            || env.channel != self.chat
        {
            return;
        }
        match serde_json::from_str::<StateAction>(env.action) {
            Ok(a) => {
                apply_action_to_chat(&mut self.state, &a);
            }
            Err(_) => self.undecodable += 1,
        }
    }
}

/// One subscriber connection's bookkeeping.
pub struct Receiver {
    /// Index (also picks the histogram shard).
    pub id: usize,
    /// The chat it subscribes to.
    pub chat: String,
    /// Global index of the first publisher of its chat.
    pub pub_base: u32,
    /// One checker per publisher of its chat.
    pub checkers: Vec<SeqChecker>,
    /// `serverSeq` order on this connection.
    pub order: SeqOrder,
    /// Stamped envelopes received.
    pub delivered: u64,
    /// Envelopes without a stamp of ours (e.g. the agent's own actions).
    pub unstamped: u64,
    /// Reduced chat state, when the scenario checks convergence.
    pub mirror: Option<Mirror>,
    /// Why the socket ended before the phase did.
    pub closed: Option<String>,
    /// Its group's histogram in [`Run::groups`], if there is one.
    pub group: usize,
    /// Envelopes received more than once.
    pub duplicates: u64,
    /// Envelopes that came after a later one (by `serverSeq` on this
    /// connection, or by their publisher's counter).
    pub reorders: u64,
    samples: Vec<u64>,
    last_samples: Vec<u64>,
    first_samples: Vec<u64>,
}

impl Receiver {
    /// A receiver of `chat`, whose publishers are `pub_base..pub_base+pubs`,
    /// subscribed at `from_seq`.
    pub fn new(id: usize, chat: String, pub_base: u32, pubs: usize, from_seq: u64) -> Self {
        Self {
            id,
            chat,
            pub_base,
            checkers: vec![SeqChecker::default(); pubs],
            order: SeqOrder::after(from_seq),
            delivered: 0,
            unstamped: 0,
            mirror: None,
            closed: None,
            group: 0,
            duplicates: 0,
            reorders: 0,
            samples: Vec::with_capacity(256),
            last_samples: Vec::new(),
            first_samples: Vec::new(),
        }
    }

    /// Handle one text frame received at `now`.
    pub fn on_text(&mut self, run: &Run, text: &str, now: u64) {
        if let Some(env) = proto::parse_action(text) {
            self.on_envelope(run, &env, now);
        }
    }

    /// Handle one action envelope received at `now`.
    pub fn on_envelope(&mut self, run: &Run, env: &EnvelopeLite<'_>, now: u64) {
        if env.rejection_reason.is_some() {
            // Our subscribers never dispatch; a rejection is not theirs.
            return;
        }
        let by_seq = self.order.observe(env.server_seq);
        if let Some(m) = self.mirror.as_mut() {
            m.apply(env);
        }
        let stamp = proto::find_stamp(env.action);
        let checker = stamp.and_then(|st| {
            let k = st.publisher.checked_sub(self.pub_base)?;
            self.checkers.get_mut(k as usize)
        });
        let (Some(st), Some(checker)) = (stamp, checker) else {
            self.unstamped += 1;
            match by_seq {
                Seen::Duplicate => self.duplicates += 1,
                Seen::Late => self.reorders += 1,
                Seen::New => {}
            }
            return;
        };
        match checker.observe(st.n) {
            Seen::Duplicate => {
                self.duplicates += 1;
                return;
            }
            Seen::Late => self.reorders += 1,
            Seen::New if by_seq != Seen::New => self.reorders += 1,
            Seen::New => {}
        }
        self.delivered += 1;
        run.deliveries.add(self.id, 1);
        let lat = now.saturating_sub(st.t_ns);
        let record = run.records(st.t_ns);
        if record {
            self.samples.push(lat);
            if self.samples.len() >= 256 {
                self.flush_samples(run);
            }
        }
        let p = &run.pubs[st.publisher as usize];
        let expected = p.expected.load(Ordering::Relaxed);
        if expected > 0 {
            let slot = p.slot(st.n);
            let before = slot.fetch_add(1, Ordering::AcqRel);
            if before == 0 && record {
                self.first_samples.push(lat);
                if self.first_samples.len() >= 64 {
                    run.first.flush(self.id, &mut self.first_samples);
                }
            }
            if before + 1 == expected {
                slot.store(0, Ordering::Release);
                p.completed.fetch_add(1, Ordering::AcqRel);
                p.notify.notify_one();
                if record {
                    self.last_samples.push(lat);
                    if self.last_samples.len() >= 64 {
                        run.last.flush(self.id, &mut self.last_samples);
                    }
                }
            }
        }
    }

    fn flush_samples(&mut self, run: &Run) {
        if let Some(g) = run.groups.get(self.group) {
            g.record(self.id, &self.samples);
        }
        run.all.flush(self.id, &mut self.samples);
    }

    /// Move buffered samples into the shared histograms.
    pub fn flush(&mut self, run: &Run) {
        self.flush_samples(run);
        run.last.flush(self.id, &mut self.last_samples);
        run.first.flush(self.id, &mut self.first_samples);
    }

    /// Loss, duplicates and reordering seen by this receiver.
    pub fn integrity(&self, run: &Run) -> Integrity {
        let mut i = Integrity {
            lost: 0,
            duplicated: self.duplicates,
            reordered: self.reorders,
        };
        for (k, c) in self.checkers.iter().enumerate() {
            let p = &run.pubs[self.pub_base as usize + k];
            i.lost += p.accepted.load(Ordering::Acquire).saturating_sub(c.unique);
        }
        i
    }
}

/// A publisher about to start.
pub struct Publisher {
    /// Global index.
    pub index: u32,
    /// Its client id (echoes carry it).
    pub client_id: String,
    /// The chat it writes to.
    pub chat: String,
    /// What it sends.
    pub kind: ActionKind,
    /// When and how fast.
    pub schedule: Schedule,
    /// Offset into the question rotation (answers).
    pub offset: usize,
}

/// What a publisher did.
#[derive(Debug, Default, Clone, Copy)]
pub struct PubReport {
    /// Actions sent.
    pub sent: u64,
    /// Largest lag behind schedule when sending, in ns (open loop).
    pub max_behind_ns: u64,
    /// Why it stopped early, if it did.
    pub failed: bool,
}

impl Publisher {
    fn action(&self, n: u64, text: &str) -> String {
        match &self.kind {
            ActionKind::Draft { .. } => proto::draft_action(text),
            ActionKind::Answer {
                request_id,
                questions,
            } => {
                let q = &questions[(self.offset + n as usize) % questions.len()];
                proto::answer_action(&proto::json_str(request_id), &proto::json_str(q), text)
            }
        }
    }

    fn pad(&self) -> usize {
        match self.kind {
            ActionKind::Draft { pad } => pad,
            ActionKind::Answer { .. } => 0,
        }
    }

    /// Run on `ws` starting at `start_ns` until the schedule is done.
    pub async fn run(self, ws: Ws, run: Arc<Run>, start_ns: u64) -> PubReport {
        let (sink, stream) = ws.split();
        let echo = tokio::spawn(echo_reader(stream, run.clone(), self.client_id.clone()));
        let (report, sink) = self.send_loop(sink, &run, start_ns).await;
        run.pubs[self.index as usize]
            .sending_done
            .store(true, Ordering::Release);
        // The reader ends when the run stops (after the drain); then both
        // halves are dropped and the socket closes.
        if let Ok(stream) = echo.await {
            if let Ok(mut ws) = stream.reunite(sink) {
                let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
            }
        }
        report
    }

    async fn send_loop(
        &self,
        mut sink: SplitSink<Ws, Message>,
        run: &Run,
        start_ns: u64,
    ) -> (PubReport, SplitSink<Ws, Message>) {
        let p = &run.pubs[self.index as usize];
        let chat_json = proto::json_str(&self.chat);
        let mut report = PubReport::default();
        let mut id = 1_000u64;
        match self.schedule {
            Schedule::Open { rate, count } => {
                let interval = 1e9 / rate.max(1e-9);
                // Publishers are interleaved evenly over one interval: with
                // aligned schedules, P publishers would all fire at once and
                // the burst, not the rate, would set the latency.
                let phase = interval * self.index as f64 / run.pubs.len().max(1) as f64;
                let timer = PreciseTimer::new();
                for n in 1..=count {
                    let due = start_ns + (phase + (n - 1) as f64 * interval) as u64;
                    match &timer {
                        Ok(t) => {
                            if let Err(e) = t.sleep_until_ns(due).await {
                                crate::progress::note(format!("publisher timer: {e}"));
                                report.failed = true;
                                break;
                            }
                        }
                        Err(_) => sleep_until_ns(due).await,
                    }
                    if run.stopped() || run.halt.load(Ordering::Relaxed) {
                        break;
                    }
                    report.max_behind_ns = report.max_behind_ns.max(now_ns().saturating_sub(due));
                    id += 1;
                    let text = proto::stamp(self.index, n, due, self.pad());
                    let frame = proto::dispatch(id, &chat_json, n, &self.action(n, &text));
                    if sink.send(Message::text(frame)).await.is_err() {
                        report.failed = true;
                        break;
                    }
                    p.sent.fetch_add(1, Ordering::AcqRel);
                    report.sent += 1;
                }
            }
            Schedule::Closed {
                window,
                gate,
                seconds,
                limit,
            } => {
                sleep_until_ns(start_ns).await;
                let until = start_ns + (seconds * 1e9) as u64;
                let mut n = 0u64;
                let mut last_progress = now_ns();
                let mut last_done = 0;
                'outer: while n < limit
                    && now_ns() < until
                    && !run.stopped()
                    && !run.halt.load(Ordering::Relaxed)
                {
                    // Wait for room in the window and a free slot.
                    loop {
                        let notified = p.notify.notified();
                        let done = match gate {
                            Gate::Delivered => p.completed.load(Ordering::Acquire),
                            Gate::Echoed => {
                                p.accepted.load(Ordering::Acquire)
                                    + p.rejected.load(Ordering::Acquire)
                            }
                        };
                        if done != last_done {
                            last_done = done;
                            last_progress = now_ns();
                        }
                        let slot_free = p.expected.load(Ordering::Relaxed) == 0
                            || p.slot(n + 1).load(Ordering::Acquire) == 0;
                        if n - done.min(n) < window && slot_free {
                            break;
                        }
                        if now_ns() >= until {
                            break 'outer;
                        }
                        if now_ns() - last_progress > 10_000_000_000 {
                            run.stalled.store(true, Ordering::Relaxed);
                            report.failed = true;
                            break 'outer;
                        }
                        let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                    }
                    n += 1;
                    id += 1;
                    let t = now_ns();
                    let text = proto::stamp(self.index, n, t, self.pad());
                    let frame = proto::dispatch(id, &chat_json, n, &self.action(n, &text));
                    if sink.send(Message::text(frame)).await.is_err() {
                        report.failed = true;
                        break;
                    }
                    p.sent.fetch_add(1, Ordering::AcqRel);
                    report.sent += 1;
                }
            }
        }
        (report, sink)
    }
}

/// Count the publisher's echoes and time them.
async fn echo_reader(
    mut stream: SplitStream<Ws>,
    run: Arc<Run>,
    client_id: String,
) -> SplitStream<Ws> {
    let mut stop = run.stop_signal();
    let stopped = stop.wait_for(|s| *s);
    tokio::pin!(stopped);
    let mut samples = Vec::with_capacity(256);
    let mut key = 0;
    loop {
        let m = tokio::select! {
            biased;
            m = stream.next() => m,
            _ = &mut stopped => break,
        };
        let Some(Ok(m)) = m else { break };
        let Message::Text(t) = m else { continue };
        let now = now_ns();
        let Some(env) = proto::parse_action(t.as_str()) else {
            continue;
        };
        if env.origin.as_ref().map(|o| o.client_id.as_ref()) != Some(client_id.as_str()) {
            continue;
        }
        let Some(st) = proto::find_stamp(env.action) else {
            continue;
        };
        let p = &run.pubs[st.publisher as usize];
        key = st.publisher as usize;
        if env.rejection_reason.is_some() {
            p.rejected.fetch_add(1, Ordering::AcqRel);
        } else {
            p.accepted_hi.fetch_max(st.n, Ordering::AcqRel);
            p.accepted.fetch_add(1, Ordering::AcqRel);
            if run.records(st.t_ns) {
                samples.push(now.saturating_sub(st.t_ns));
                if samples.len() >= 256 {
                    run.echo.flush(key, &mut samples);
                }
            }
        }
        p.notify.notify_one();
    }
    run.echo.flush(key, &mut samples);
    stream
}

/// Connect a publisher socket: `initialize` as `client_id`, no subscriptions.
pub async fn connect_publisher(ep: &Endpoint, client_id: &str) -> anyhow::Result<Ws> {
    Ok(ep
        .client(client_id)
        .await
        .with_context(|| format!("connecting publisher {client_id}"))?
        .ws)
}

/// One planned subscriber.
#[derive(Clone)]
pub struct SubPlan {
    /// Receiver index.
    pub id: usize,
    /// Its client id.
    pub client_id: String,
    /// The chat to subscribe to.
    pub chat: String,
    /// First publisher index of that chat.
    pub pub_base: u32,
    /// Publishers in that chat.
    pub pubs: usize,
    /// Keep a reduced mirror of the chat.
    pub mirror: bool,
    /// Which endpoint to connect to (an index into the endpoints given to
    /// [`spawn_subscribers_on`]; 0 with a single server).
    pub node: usize,
    /// Its latency group in [`Run::groups`].
    pub group: usize,
}

/// How long a subscriber retries a `subscribe` answered "not found": a
/// cluster node learns of a chat created on another node shortly after its
/// creation (about 100 ms), not at once.
const SUBSCRIBE_NOT_FOUND_RETRY: Duration = Duration::from_secs(5);

/// Whether a failed `subscribe` says the server does not know the channel
/// (yet): "no channel `…`" (code -32008) or "not found".
fn is_unknown_channel(error: &str) -> bool {
    error.contains("no channel") || error.contains("not found")
}

/// Connect, `initialize` and `subscribe` one subscriber; returns the socket
/// and its receiver (seeded from the snapshot).
pub async fn connect_subscriber(ep: &Endpoint, plan: &SubPlan) -> anyhow::Result<(Ws, Receiver)> {
    let mut c = ep.client(&plan.client_id).await?;
    let deadline = tokio::time::Instant::now() + SUBSCRIBE_NOT_FOUND_RETRY;
    let snap = loop {
        match c.subscribe(&plan.chat).await {
            Ok(s) => break s,
            Err(e)
                if is_unknown_channel(&format!("{e:#}"))
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let mut rx = Receiver::new(
        plan.id,
        plan.chat.clone(),
        plan.pub_base,
        plan.pubs,
        snap.from_seq,
    );
    rx.group = plan.group;
    if plan.mirror {
        let state: ChatState =
            serde_json::from_value(snap.state).context("decoding the chat snapshot")?;
        rx.mirror = Some(Mirror {
            chat: plan.chat.clone(),
            state,
            from_seq: snap.from_seq,
            undecodable: 0,
        });
    }
    Ok((c.ws, rx))
}

/// A subscriber being read on a reading thread ([`crate::readers`]): yields
/// its [`Receiver`] once the run stops or its socket ends.
pub type Subscriber = tokio::sync::oneshot::Receiver<Receiver>;

/// Connect many subscribers with at most `concurrency` handshakes at once,
/// and hand each to a reading thread as soon as it is subscribed. Returns
/// the subscribers and the errors of those that failed.
pub async fn spawn_subscribers(
    ep: &Arc<Endpoint>,
    plans: Vec<SubPlan>,
    concurrency: usize,
    run: &Arc<Run>,
    what: &str,
) -> (Vec<Subscriber>, Vec<String>) {
    spawn_subscribers_on(std::slice::from_ref(ep), plans, concurrency, run, what).await
}

/// [`spawn_subscribers`] over several servers (cluster nodes): each plan
/// connects to `endpoints[plan.node]`.
pub async fn spawn_subscribers_on(
    endpoints: &[Arc<Endpoint>],
    plans: Vec<SubPlan>,
    concurrency: usize,
    run: &Arc<Run>,
    what: &str,
) -> (Vec<Subscriber>, Vec<String>) {
    let pb = crate::progress::count(plans.len() as u64, what);
    let results: Vec<anyhow::Result<Subscriber>> = futures_util::stream::iter(plans)
        .map(|plan| {
            let ep = endpoints[plan.node % endpoints.len()].clone();
            let run = run.clone();
            let pb = pb.clone();
            async move {
                let r = connect_subscriber(&ep, &plan).await;
                pb.inc(1);
                let (ws, rx) = r?;
                crate::readers::adopt(ws, rx, run)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    pb.finish_and_clear();
    let mut tasks = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(t) => tasks.push(t),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    (tasks, errors)
}

/// What one phase measured.
pub struct Outcome {
    /// Deliveries per second to subscribers over the measured window.
    pub deliveries_per_sec: f64,
    /// Accepted actions per second over the measured window.
    pub actions_per_sec: f64,
    /// Publish → each subscriber.
    pub all: Histogram<u64>,
    /// Publish → last subscriber.
    pub last: Histogram<u64>,
    /// Publish → first subscriber.
    pub first: Histogram<u64>,
    /// Publish → own echo.
    pub echo: Histogram<u64>,
    /// Publish → each subscriber, per group ([`Run::groups`]).
    pub groups: Vec<Histogram<u64>>,
    /// Loss, duplicates, reordering over every subscriber.
    pub integrity: Integrity,
    /// Actions sent / accepted / rejected.
    pub sent: u64,
    pub accepted: u64,
    pub rejected: u64,
    /// Accepted actions that never reached every subscriber.
    pub incomplete: u64,
    /// Subscribers whose socket ended during the phase.
    pub closed_early: usize,
    /// First few of their reasons.
    pub close_reasons: Vec<String>,
    /// The drain finished before its timeout.
    pub drained: bool,
    /// A closed-loop publisher stopped making progress.
    pub stalled: bool,
    /// Largest lag of a publisher behind its schedule, ms.
    pub max_behind_ms: f64,
    /// The receivers, for scenario-specific checks (mirrors).
    pub receivers: Vec<Receiver>,
    /// Measured window in seconds.
    pub window_seconds: f64,
    /// Server CPU seconds used during the measured window, when known
    /// (summed over every server process of [`PhaseTiming::server_pids`]).
    pub server_cpu_seconds: Option<f64>,
    /// The same per server process, in the order of the pids.
    pub server_cpu_seconds_each: Vec<f64>,
    /// CPU seconds of the store process the load generator started
    /// (nats-server for `jetstream`) during the measured window.
    pub store_cpu_seconds: Option<f64>,
    /// This process's CPU seconds during the measured window.
    pub loadgen_cpu_seconds: Option<f64>,
    /// Busy CPU seconds of the whole machine during the measured window.
    pub machine_cpu_seconds: Option<f64>,
}

impl Outcome {
    /// Cores busy with other work than this process and the server during
    /// the window (other processes on the machine skew the figures).
    pub fn background_cores(&self) -> Option<f64> {
        let m = self.machine_cpu_seconds?;
        let own = self.loadgen_cpu_seconds.unwrap_or(0.0)
            + self.server_cpu_seconds.unwrap_or(0.0)
            + self.store_cpu_seconds.unwrap_or(0.0);
        Some(((m - own) / self.window_seconds).max(0.0))
    }
}

/// Publish with `publishers` (sockets already connected) into a run whose
/// subscribers are already reading, measure, drain and collect.
pub struct PhaseTiming {
    /// Measured duration of publishing, seconds.
    pub seconds: f64,
    /// Leading part not counted in rates and latencies.
    pub warmup: f64,
    /// Longest wait for in-flight actions after publishing.
    pub drain: f64,
    /// Label of the progress bar.
    pub label: String,
    /// Server pids (for CPU accounting): one, or every node of a cluster.
    pub server_pids: Vec<u32>,
}

/// A single-threaded runtime on its own thread, for the publishers.
struct PublisherThread {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PublisherThread {
    fn start() -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the publishers' runtime")?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("publishers".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                })
            })
            .context("starting the publishers' thread")?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for PublisherThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run publishers against subscribers already reading; see [`PhaseTiming`].
pub async fn publish_and_collect(
    run: Arc<Run>,
    publishers: Vec<(Publisher, Ws)>,
    subscribers: Vec<Subscriber>,
    timing: PhaseTiming,
) -> anyhow::Result<Outcome> {
    let start_ns = now_ns() + 200_000_000;
    let warm_ns = start_ns + (timing.warmup * 1e9) as u64;
    let end_ns = start_ns + (timing.seconds * 1e9) as u64;
    run.record_from_ns.store(warm_ns, Ordering::Relaxed);

    // Sample counters at the edges of the measured window.
    let sampler = {
        let run = run.clone();
        let pids = timing.server_pids.clone();
        let cpu_each = move || -> Option<Vec<f64>> {
            pids.iter().map(|&p| crate::sys::cpu_seconds(p)).collect()
        };
        let store_pid = crate::nats::store_pid();
        tokio::spawn(async move {
            sleep_until_ns(warm_ns).await;
            let d0 = run.deliveries.load();
            let a0 = run.accepted();
            let c0 = cpu_each();
            let s0 = store_pid.and_then(crate::sys::cpu_seconds);
            let l0 = crate::sys::cpu_seconds(std::process::id());
            let m0 = crate::sys::machine_busy_seconds();
            let t0 = now_ns();
            sleep_until_ns(end_ns).await;
            let d1 = run.deliveries.load();
            let a1 = run.accepted();
            let c1 = cpu_each();
            let s1 = store_pid.and_then(crate::sys::cpu_seconds);
            let l1 = crate::sys::cpu_seconds(std::process::id());
            let m1 = crate::sys::machine_busy_seconds();
            let secs = (now_ns() - t0) as f64 / 1e9;
            (
                (d1 - d0) as f64 / secs,
                (a1 - a0) as f64 / secs,
                secs,
                c0.zip(c1).and_then(|(a, b)| {
                    (!a.is_empty())
                        .then(|| a.iter().zip(&b).map(|(a, b)| b - a).collect::<Vec<f64>>())
                }),
                l0.zip(l1).map(|(a, b)| b - a),
                m0.zip(m1).map(|(a, b)| b - a),
                s0.zip(s1).map(|(a, b)| b - a),
            )
        })
    };

    let pb = crate::progress::timed(timing.seconds + 0.2, &timing.label);
    let ticker = {
        let run = run.clone();
        let pb = pb.clone();
        tokio::spawn(async move {
            let mut last = (now_ns(), 0u64);
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = now_ns();
                let d = run.deliveries.load();
                pb.inc(1);
                if now - last.0 >= 1_000_000_000 {
                    let rate = (d - last.1) as f64 / ((now - last.0) as f64 / 1e9);
                    pb.set_message(format!(
                        "{:.0} deliveries/s, {} accepted",
                        rate,
                        run.accepted()
                    ));
                    last = (now, d);
                }
            }
        })
    };

    // Publishers run on a thread of their own: on the receivers' runtime a
    // send would wait behind thousands of ready receivers, and that wait
    // (counted as latency, since stamps carry the due time) is the load
    // generator's, not the server's.
    let pub_thread = PublisherThread::start()?;
    let pub_tasks: Vec<JoinHandle<PubReport>> = publishers
        .into_iter()
        .map(|(p, ws)| pub_thread.handle.spawn(p.run(ws, run.clone(), start_ns)))
        .collect();

    // Publishers' send loops end by themselves (count or time); their echo
    // readers run until the stop below. Wait for the sending to end.
    sleep_until_ns(end_ns).await;
    let (dps, aps, window_seconds, cpu, lcpu, mcpu, scpu) = sampler.await.context("sampler")?;
    ticker.abort();
    pb.finish_and_clear();
    let drain_pb = crate::progress::timed(timing.drain, "draining");
    // Open-loop publishers that fell behind may still be sending.
    let drained = {
        let deadline = now_ns() + (timing.drain * 1e9) as u64;
        loop {
            if run.pubs.iter().all(PubShared::settled) {
                break true;
            }
            if now_ns() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    drain_pb.finish_and_clear();
    run.stop();
    let mut max_behind_ns = 0;
    for t in pub_tasks {
        if let Ok(r) = t.await {
            max_behind_ns = max_behind_ns.max(r.max_behind_ns);
        }
    }
    drop(pub_thread);
    let mut receivers = Vec::with_capacity(subscribers.len());
    let mut integrity = Integrity::default();
    let mut closed_early = 0;
    let mut close_reasons = Vec::new();
    for t in subscribers {
        let rx = t.await.context("a subscriber's reading thread ended")?;
        integrity.add(rx.integrity(&run));
        if let Some(r) = &rx.closed {
            closed_early += 1;
            if close_reasons.len() < 5 {
                close_reasons.push(r.clone());
            }
        }
        receivers.push(rx);
    }
    Ok(Outcome {
        deliveries_per_sec: dps,
        actions_per_sec: aps,
        all: run.all.merged(),
        last: run.last.merged(),
        first: run.first.merged(),
        echo: run.echo.merged(),
        groups: run.groups.iter().map(ShardedHist::merged).collect(),
        integrity,
        sent: run.sent(),
        accepted: run.accepted(),
        rejected: run.rejected(),
        incomplete: run.incomplete(),
        closed_early,
        close_reasons,
        drained,
        stalled: run.stalled.load(Ordering::Relaxed),
        max_behind_ms: max_behind_ns as f64 / 1e6,
        receivers,
        window_seconds,
        server_cpu_seconds: cpu.as_ref().map(|c| c.iter().sum()),
        server_cpu_seconds_each: cpu.unwrap_or_default(),
        store_cpu_seconds: scpu,
        loadgen_cpu_seconds: lcpu,
        machine_cpu_seconds: mcpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(seq: u64, publisher: u32, n: u64, t: u64) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"ahp-chat:/c","action":{},"serverSeq":{seq}}}}}"#,
            proto::draft_action(&proto::stamp(publisher, n, t, 0))
        )
    }

    #[test]
    fn receivers_complete_slots_and_time_the_last_one() {
        let run = Run::new(1, 8);
        run.pubs[0].expected.store(2, Ordering::Relaxed);
        run.pubs[0].accepted.store(3, Ordering::Relaxed);
        let mut a = Receiver::new(0, "ahp-chat:/c".into(), 0, 1, 0);
        let mut b = Receiver::new(1, "ahp-chat:/c".into(), 0, 1, 0);
        a.on_text(&run, &env(1, 0, 1, 100), 1_100);
        a.on_text(&run, &env(2, 0, 2, 200), 1_200);
        a.on_text(&run, &env(2, 0, 2, 200), 1_300); // duplicate envelope
        b.on_text(&run, &env(2, 0, 2, 200), 5_200); // 1 missing on b
        b.on_text(&run, &env(3, 0, 3, 300), 5_300);
        a.flush(&run);
        b.flush(&run);
        assert_eq!(
            run.pubs[0].completed.load(Ordering::Relaxed),
            1,
            "only #2 reached both"
        );
        assert_eq!(run.deliveries.load(), 4);
        let ia = a.integrity(&run);
        assert_eq!((ia.lost, ia.duplicated, ia.reordered), (1, 1, 0), "{ia:?}");
        let ib = b.integrity(&run);
        assert_eq!((ib.lost, ib.duplicated, ib.reordered), (1, 0, 0), "{ib:?}");
        assert_eq!(run.last.merged().len(), 1);
        // #1 and #3 reached only their first receiver, #2 both: a first
        // receiver each, timed from its publish (in µs).
        let first = run.first.merged();
        assert_eq!(first.len(), 3);
        assert_eq!((first.min(), first.max()), (1, 5));
        assert_eq!(run.all.merged().len(), 4);
    }

    #[test]
    fn each_receivers_latency_lands_in_its_group_too() {
        let run = Run::with_groups(1, 8, 2);
        run.pubs[0].expected.store(2, Ordering::Relaxed);
        let mut owner = Receiver::new(0, "ahp-chat:/c".into(), 0, 1, 0);
        let mut follower = Receiver::new(1, "ahp-chat:/c".into(), 0, 1, 0);
        follower.group = 1;
        owner.on_text(&run, &env(1, 0, 1, 1_000_000), 2_000_000);
        follower.on_text(&run, &env(1, 0, 1, 1_000_000), 5_000_000);
        follower.on_text(&run, &env(2, 0, 2, 1_000_000), 6_000_000);
        owner.flush(&run);
        follower.flush(&run);
        let groups: Vec<Histogram<u64>> = run.groups.iter().map(ShardedHist::merged).collect();
        assert_eq!((groups[0].len(), groups[1].len()), (1, 2));
        assert_eq!(groups[0].max(), 1_000, "owner: 1 ms in µs");
        assert!(groups[1].min() >= 4_000, "follower: 4 and 5 ms");
        assert_eq!(run.all.merged().len(), 3, "every sample is also in `all`");
    }
}
