//! The writer thread: every write goes through one connection, and whatever
//! is queued when the thread wakes is committed as one transaction (group
//! commit), then each waiter is answered.
//!
//! Inside a group, a fenced append (wrong `expected_seq`) fails alone and
//! writes nothing. Any SQLite error — one bad write, or the commit itself —
//! rolls the whole group back and fails every op in it: nobody is told a
//! write is stored that is not, and no write is dropped silently.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;

use dashmap::DashMap;
use rusqlite::{params, Connection};
use tokio::sync::oneshot;

use super::unavailable;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{Batch, ChannelInfo, JournalError};

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
        }
    }

    /// The thread's loop: fold queued ops into one transaction per commit,
    /// until every sender is gone.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Op>) {
        while let Ok(first) = rx.recv() {
            let mut ops = vec![first];
            while ops.len() < MAX_OPS_PER_COMMIT {
                match rx.try_recv() {
                    Ok(op) => ops.push(op),
                    Err(_) => break,
                }
            }
            self.commit_group(ops);
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
            let tx = self.conn.transaction()?;
            for op in &ops {
                let r = apply(
                    &tx,
                    op,
                    &mut self.next_ord,
                    &mut pending,
                    &self.lens,
                    &mut owners,
                )?;
                results.push(r);
            }
            tx.commit()
        })();
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

/// Write one op inside the group's transaction. `Err` is an SQLite error
/// (the group fails); `Ok(Err)` is this op's own refusal (a fenced append).
fn apply(
    tx: &rusqlite::Transaction<'_>,
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
fn bind_provider_in(
    tx: &rusqlite::Transaction<'_>,
    provider: &str,
    subject: &str,
) -> rusqlite::Result<String> {
    tx.prepare_cached("INSERT OR IGNORE INTO provider_owners (provider, subject) VALUES (?1, ?2)")?
        .execute(params![provider, subject])?;
    tx.prepare_cached("SELECT subject FROM provider_owners WHERE provider = ?1")?
        .query_row([provider], |r| r.get(0))
}

fn write_batch(
    tx: &rusqlite::Transaction<'_>,
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
    let len = expected.plus(batch.records.len() as u64);
    tx.prepare_cached("UPDATE channels SET len = ?2 WHERE uri = ?1")?
        .execute(params![channel, len.get() as i64])?;
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
