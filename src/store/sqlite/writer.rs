//! The writer thread: every write goes through one connection, and whatever
//! is queued when the thread wakes is committed as one transaction (group
//! commit), then each waiter is answered.
//!
//! Under a steady stream of small writes (many quiet rooms) a group would
//! hold one or two writes and every one would pay an `fsync` and rewrite its
//! pages. So a group may wait for more ([`Gather`]): as long as the recent
//! arrival rate says it takes to hold a few writes, at most the commit
//! window — but only when that rate says the wait will at least double it
//! and the writes come from channels that did not write a moment before: a
//! lone write on a quiet server, a writer that is already behind (its
//! queue holds a big group), a busy chat and a client waiting on each
//! answer commit at once.
//!
//! Inside a group, a fenced append (wrong `expected_seq`) fails alone and
//! writes nothing. Any SQLite error — one bad write, or the commit itself —
//! rolls the whole group back and fails every op in it: nobody is told a
//! write is stored that is not, and no write is dropped silently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use rusqlite::{params, Connection};
use tokio::sync::oneshot;

use super::checkpoint::{By, Checkpoints, Limits};
use super::unavailable;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{Batch, ChannelInfo, CommitMetrics, CommitStats, JournalError};

/// Most queued writes folded into one transaction.
const MAX_OPS_PER_COMMIT: usize = 4096;

/// One write handed to the writer thread, with the waiter to answer.
pub(super) enum Op {
    /// Record a new channel.
    Create(ChannelInfo, oneshot::Sender<Result<(), JournalError>>),
    /// Append a batch at `expected`.
    Append {
        channel: ChannelUri,
        expected: JournalPos,
        batch: Batch,
        done: oneshot::Sender<Result<(), JournalError>>,
    },
    /// Forget a channel (nobody waits).
    Remove(ChannelUri),
    /// Raise the stored `serverSeq` floor (0: a barrier that writes nothing new).
    Reserve(ServerSeq, mpsc::SyncSender<Result<(), JournalError>>),
    /// Bind a provider id to a token subject unless it is bound.
    BindProvider {
        provider: String,
        subject: String,
        done: oneshot::Sender<Result<String, JournalError>>,
    },
}

/// The writing connection and what it keeps between groups.
pub(super) struct Writer {
    conn: Connection,
    /// `ord` of the next created channel.
    next_ord: i64,
    /// Records per channel, as committed (shared with the journal's `len`).
    lens: Arc<DashMap<ChannelUri, JournalPos>>,
    /// Group-commit figures (shared with the journal's `commit_stats`).
    counters: Arc<Counters>,
    /// Who checkpoints when, once [`Self::checkpoint_beside`] is called
    /// (until then SQLite's automatic checkpoint runs on this connection).
    checkpoints: Option<Checkpoints>,
}

/// How the writer has grouped its commits.
#[derive(Default)]
pub(super) struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    waited: AtomicU64,
    /// Checkpoints run beside the writer, and by the writer itself.
    checkpoints: AtomicU64,
    writer_checkpoints: AtomicU64,
    /// Pages in the WAL after the last commit.
    wal_pages: AtomicU64,
    /// Where each commit's time and size are recorded, once set.
    observer: std::sync::OnceLock<CommitMetrics>,
}

impl Counters {
    /// A group of `writes` committed (`waited`: it waited for more).
    fn add(&self, writes: usize, waited: bool) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
        if waited {
            self.waited.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A checkpoint by `by` took `took`.
    pub(super) fn checkpointed(&self, by: By, took: Duration) {
        let (count, thread) = match by {
            By::Checkpointer => (&self.checkpoints, 0),
            By::Writer => (&self.writer_checkpoints, 1),
        };
        count.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = self.observer.get() {
            m.checkpoint_seconds[thread].record(took.as_secs_f64());
        }
    }

    /// The WAL holds `pages` after a commit.
    pub(super) fn wal_holds(&self, pages: u32) {
        self.wal_pages.store(u64::from(pages), Ordering::Relaxed);
    }

    /// Pages in the WAL after the last commit.
    pub(super) fn wal_pages(&self) -> u32 {
        u32::try_from(self.wal_pages.load(Ordering::Relaxed)).unwrap_or(u32::MAX)
    }

    /// Record every later commit into `metrics` (the first call wins).
    pub(super) fn observe(&self, metrics: CommitMetrics) {
        let _ = self.observer.set(metrics);
    }

    pub(super) fn read(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            writer_checkpoints: self.writer_checkpoints.load(Ordering::Relaxed),
            wal_pages: self.wal_pages.load(Ordering::Relaxed),
        }
    }
}

impl Writer {
    /// A writer on `conn` (schema in place) publishing lengths to `lens`.
    pub(super) fn new(conn: Connection, lens: Arc<DashMap<ChannelUri, JournalPos>>) -> Self {
        let next_ord = conn
            .query_row("SELECT COALESCE(MAX(ord), 0) + 1 FROM channels", [], |r| {
                r.get(0)
            })
            .unwrap_or(1);
        Self {
            conn,
            next_ord,
            lens,
            counters: Arc::default(),
            checkpoints: None,
        }
    }

    /// Checkpoint on a thread of its own, on `own` (a second connection to
    /// the same database), rather than on this connection after a commit
    /// (see `checkpoint`).
    pub(super) fn checkpoint_beside(
        &mut self,
        own: Connection,
        limits: Limits,
    ) -> std::io::Result<()> {
        let checkpoints = Checkpoints::start(&mut self.conn, own, limits, self.counters.clone())?;
        self.checkpoints = Some(checkpoints);
        Ok(())
    }

    /// The figures this writer keeps as it commits.
    pub(super) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The thread's loop: fold queued ops into one transaction per commit
    /// (waiting up to `window` for more when [`Gather`] says it pays), until
    /// every sender is gone.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Op>, window: Duration) {
        let mut gather = Gather::new(window);
        while let Ok(first) = rx.recv() {
            let started = Instant::now();
            gather.group_started(started);
            let mut ops = Vec::with_capacity(Gather::TARGET * 2);
            ops.push(first);
            drain(&rx, &mut ops);
            let wait = gather.wait(&ops, Instant::now());
            if let Some(wait) = wait {
                // Sleep rather than wait on the channel: writes that arrive
                // meanwhile are queued without waking this thread (nor their
                // senders paying a wake-up each); one drain takes them all.
                let left = (started + wait).saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    std::thread::sleep(left);
                }
                drain(&rx, &mut ops);
            }
            gather.group_taken(&ops, Instant::now());
            self.counters.add(ops.len(), wait.is_some());
            let writes = ops.len();
            let commit_started = Instant::now();
            self.commit_group(ops);
            if let Some(m) = self.counters.observer.get() {
                m.seconds.record(commit_started.elapsed().as_secs_f64());
                m.writes.record(writes as f64);
            }
            if let Some(c) = &mut self.checkpoints {
                c.after_commit(&self.conn);
            }
        }
    }

    /// Commit `ops` as one transaction and answer each op's waiter (see the
    /// module documentation for what fails when).
    pub(super) fn commit_group(&mut self, ops: Vec<Op>) {
        // Positions as they will be after this commit; published to `lens`
        // only if it succeeds.
        // `None`: removed.
        let mut pending: HashMap<ChannelUri, Option<JournalPos>> = HashMap::new();
        let mut results: Vec<Result<(), JournalError>> = Vec::with_capacity(ops.len());
        // The owner after each `BindProvider` op, in op order.
        let mut owners: Vec<String> = Vec::new();
        let ord_before = self.next_ord;
        let outcome = (|| -> rusqlite::Result<()> {
            // Prepared once and kept (as every statement of a group), not
            // parsed again for each of the many commits a second.
            self.conn.prepare_cached("BEGIN")?.execute([])?;
            for op in &ops {
                let r = apply(
                    &self.conn,
                    op,
                    &mut self.next_ord,
                    &mut pending,
                    &self.lens,
                    &mut owners,
                )?;
                results.push(r);
            }
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(())
        })();
        if outcome.is_err() && !self.conn.is_autocommit() {
            // Nothing of a failed group stays: the transaction is undone
            // before the next one begins.
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "journal rollback failed");
            }
        }
        if let Err(e) = &outcome {
            tracing::error!(error = %e, ops = ops.len(), "journal commit failed; every write in it is refused");
            self.next_ord = ord_before;
        } else {
            for (c, l) in pending {
                match l {
                    Some(l) => {
                        self.lens.insert(c, l);
                    }
                    None => {
                        self.lens.remove(&c);
                    }
                }
            }
            crate::memory::shrink_if_sparse(&self.lens);
        }
        let mut owners = owners.into_iter();
        for (op, r) in ops
            .into_iter()
            .zip(results.into_iter().chain(std::iter::repeat_with(|| Ok(()))))
        {
            let r = match &outcome {
                Ok(()) => r,
                Err(e) => Err(unavailable(e)),
            };
            match op {
                Op::Create(_, done) | Op::Append { done, .. } => {
                    let _ = done.send(r);
                }
                Op::Reserve(_, done) => {
                    let _ = done.send(r);
                }
                Op::BindProvider { done, .. } => {
                    let owner = owners
                        .next()
                        .ok_or_else(|| unavailable("the binding was not written"));
                    let _ = done.send(r.and(owner));
                }
                Op::Remove(_) => {}
            }
        }
    }
}

/// Move whatever is queued into `ops` (up to the group limit).
fn drain(rx: &mpsc::Receiver<Op>, ops: &mut Vec<Op>) {
    while ops.len() < MAX_OPS_PER_COMMIT {
        match rx.try_recv() {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
}

/// Whether a group should wait for more writes, from what the last groups
/// showed:
///
/// - the arrival rate (writes taken per interval between group starts,
///   smoothed): waiting pays only if the window brings at least as many
///   writes again as the group holds;
/// - how promptly channels append again (the share of appends that come
///   within a few windows of their channel's previous one, smoothed): a
///   channel that appends that often is busy, its writer likely waits on
///   our answers (a client in a closed loop) and a wait would only slow it
///   down. Waiting pays when the writes come from many quiet channels, each
///   long after its previous one.
#[derive(Debug)]
pub(super) struct Gather {
    window: Duration,
    /// Writes per second, smoothed over the last groups.
    rate: f64,
    /// Share of a group's appends that came within `PROMPT_WINDOWS` windows
    /// of their channel's previous append, smoothed over the last groups.
    prompt: f64,
    /// When the previous group started, and how many writes it took.
    previous: Option<(Instant, usize)>,
    /// When each channel's last append was taken into a group (entries
    /// older than [`Self::FORGET`] are dropped now and then).
    taken: HashMap<ChannelUri, Instant>,
    /// Groups since `taken` was last pruned.
    since_pruned: u32,
}

impl Gather {
    /// Weight of the newest group in the smoothed figures.
    const WEIGHT: f64 = 0.25;
    /// Above this share of prompt appends a group never waits.
    const MOST_PROMPT: f64 = 0.5;
    /// An append within this many windows of its channel's previous one is
    /// prompt.
    const PROMPT_WINDOWS: u32 = 4;
    /// Appends older than this say nothing about the next one.
    const FORGET: Duration = Duration::from_secs(1);
    /// Groups between two prunings of `taken`.
    const PRUNE_EVERY: u32 = 1024;
    /// Writes a waiting group aims for: with this many, a commit's fixed
    /// cost (its `fsync`, SQLite's locks, waking the waiting chats) is
    /// spread thin, and waiting longer would mostly add latency.
    const TARGET: usize = 8;

    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            rate: 0.0,
            prompt: 0.0,
            previous: None,
            taken: HashMap::new(),
            since_pruned: 0,
        }
    }

    /// A group starts at `at` (its first write has arrived): the writes the
    /// previous group took arrived over the time since it started.
    pub(super) fn group_started(&mut self, at: Instant) {
        if let Some((then, taken)) = self.previous {
            let secs = at.saturating_duration_since(then).as_secs_f64().max(1e-6);
            let sample = taken as f64 / secs;
            // After a pause longer than a few windows the old rate says
            // nothing about the next writes.
            self.rate = if secs > 4.0 * self.window.as_secs_f64() {
                sample
            } else {
                self.rate + Self::WEIGHT * (sample - self.rate)
            };
        }
        self.previous = Some((at, 0));
    }

    /// The group that started last took `ops`, at `now`.
    pub(super) fn group_taken(&mut self, ops: &[Op], now: Instant) {
        if let Some((_, taken)) = &mut self.previous {
            *taken = ops.len();
        }
        if self.window.is_zero() {
            // Never waits: nothing to learn about the channels.
            return;
        }
        let (appends, prompt) = self.count_prompt(ops, now);
        if appends > 0 {
            let share = prompt as f64 / appends as f64;
            self.prompt += Self::WEIGHT * (share - self.prompt);
        }
        for op in ops {
            match op {
                Op::Append { channel, .. } => {
                    self.taken.insert(channel.clone(), now);
                }
                // A chat appended to right after its creation is busy too.
                Op::Create(info, _) => {
                    self.taken.insert(info.uri.clone(), now);
                }
                Op::Remove(channel) => {
                    self.taken.remove(channel);
                }
                _ => {}
            }
        }
        self.since_pruned += 1;
        if self.since_pruned >= Self::PRUNE_EVERY {
            self.since_pruned = 0;
            self.taken
                .retain(|_, t| now.saturating_duration_since(*t) < Self::FORGET);
            crate::memory::shrink_map_if_sparse(&mut self.taken);
        }
    }

    /// How long after its start a group holding `held` waits for more
    /// (`None`: it commits at once). It waits when it holds fewer than
    /// [`Self::TARGET`] writes, the writes expected within the window at
    /// least match the held ones (the group would at least double) and
    /// they come from channels that do not wait on this commit: neither
    /// lately nor in this group are most appends prompt. It waits as long
    /// as the rate says the group takes to reach [`Self::TARGET`] writes,
    /// at most the window: a busy store waits little, many quiet rooms up
    /// to the window.
    pub(super) fn wait(&self, held: &[Op], now: Instant) -> Option<Duration> {
        if self.window.is_zero()
            || held.len() >= Self::TARGET
            || self.prompt >= Self::MOST_PROMPT
            || self.rate * self.window.as_secs_f64() < held.len() as f64
        {
            return None;
        }
        let (appends, prompt) = self.count_prompt(held, now);
        if (prompt as f64) >= Self::MOST_PROMPT * appends as f64 && appends > 0 {
            return None;
        }
        let fill = (Self::TARGET - held.len()) as f64 / self.rate;
        Some(Duration::from_secs_f64(fill).min(self.window))
    }

    /// Appends among `ops`, and how many of them are prompt at `now`.
    fn count_prompt(&self, ops: &[Op], now: Instant) -> (usize, usize) {
        let within = self.window * Self::PROMPT_WINDOWS;
        let (mut appends, mut prompt) = (0, 0);
        for op in ops {
            if let Op::Append { channel, .. } = op {
                appends += 1;
                if self
                    .taken
                    .get(channel)
                    .is_some_and(|t| now.saturating_duration_since(*t) <= within)
                {
                    prompt += 1;
                }
            }
        }
        (appends, prompt)
    }
}

/// Write one op inside the group's transaction. `Err` is an SQLite error
/// (the group fails); `Ok(Err)` is this op's own refusal (a fenced append).
fn apply(
    tx: &Connection,
    op: &Op,
    next_ord: &mut i64,
    pending: &mut HashMap<ChannelUri, Option<JournalPos>>,
    lens: &DashMap<ChannelUri, JournalPos>,
    owners: &mut Vec<String>,
) -> rusqlite::Result<Result<(), JournalError>> {
    match op {
        Op::Create(info, _) => {
            tx.execute(
                "INSERT OR REPLACE INTO channels (uri, ord, kind, session, provider, title, created_at, len, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8)",
                params![info.uri.as_str(), *next_ord, info.kind.as_str(), info.session.as_deref(), info.provider, info.title, info.created_at, info.owner],
            )?;
            *next_ord += 1;
            pending.insert(info.uri.clone(), Some(JournalPos::ZERO));
        }
        Op::Append {
            channel,
            expected,
            batch,
            ..
        } => {
            let found = match pending.get(channel) {
                Some(l) => l.unwrap_or(JournalPos::ZERO),
                None => lens.get(channel).map_or(JournalPos::ZERO, |l| *l),
            };
            if found != *expected {
                return Ok(Err(JournalError::Conflict {
                    channel: channel.clone(),
                    expected: *expected,
                    found,
                }));
            }
            write_batch(tx, channel, *expected, batch)?;
            pending.insert(
                channel.clone(),
                Some(expected.plus(batch.records.len() as u64)),
            );
        }
        Op::Remove(channel) => {
            tx.execute("DELETE FROM channels WHERE uri = ?1", [channel.as_str()])?;
            tx.execute("DELETE FROM actions WHERE channel = ?1", [channel.as_str()])?;
            tx.execute(
                "DELETE FROM snapshots WHERE channel = ?1",
                [channel.as_str()],
            )?;
            tx.execute("DELETE FROM turns WHERE chat = ?1", [channel.as_str()])?;
            pending.insert(channel.clone(), None);
        }
        Op::BindProvider {
            provider, subject, ..
        } => owners.push(bind_provider_in(tx, provider, subject)?),
        Op::Reserve(upto, _) => {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('seq_floor', ?1) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
                [upto.get() as i64],
            )?;
        }
    }
    Ok(Ok(()))
}

/// Bind `provider` to `subject` unless it is bound; the owner it has after.
fn bind_provider_in(tx: &Connection, provider: &str, subject: &str) -> rusqlite::Result<String> {
    tx.prepare_cached("INSERT OR IGNORE INTO provider_owners (provider, subject) VALUES (?1, ?2)")?
        .execute(params![provider, subject])?;
    tx.prepare_cached("SELECT subject FROM provider_owners WHERE provider = ?1")?
        .query_row([provider], |r| r.get(0))
}

fn write_batch(
    tx: &Connection,
    channel: &str,
    expected: JournalPos,
    batch: &Batch,
) -> rusqlite::Result<()> {
    {
        let mut insert = tx.prepare_cached(
            "INSERT OR REPLACE INTO actions (channel, seq, action) VALUES (?1, ?2, ?3)",
        )?;
        for (i, r) in batch.records.iter().enumerate() {
            insert.execute(params![channel, expected.plus(i as u64).get() as i64, &**r])?;
        }
    }
    if let Some(from) = batch.truncate_turns_from {
        tx.prepare_cached("DELETE FROM turns WHERE chat = ?1 AND idx >= ?2")?
            .execute(params![channel, from as i64])?;
    }
    if !batch.turns.is_empty() {
        let mut insert = tx
            .prepare_cached("INSERT OR REPLACE INTO turns (chat, idx, turn) VALUES (?1, ?2, ?3)")?;
        for t in &batch.turns {
            insert.execute(params![channel, t.index as i64, &*t.json])?;
        }
    }
    if !batch.audit.is_empty() {
        let mut insert = tx.prepare_cached("INSERT INTO audit (session, entry) VALUES (?1, ?2)")?;
        for a in &batch.audit {
            insert.execute(params![a.session.as_str(), &*a.entry])?;
        }
    }
    if let Some(s) = &batch.snapshot {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO snapshots (channel, at_seq, state) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![channel, s.at_seq.get() as i64, &*s.state])?;
        // The snapshot covers everything before it: compact.
        tx.prepare_cached("DELETE FROM actions WHERE channel = ?1 AND seq < ?2")?
            .execute(params![channel, s.at_seq.get() as i64])?;
    }
    Ok(())
}
