//! The embedded default store: SQLite in WAL mode, written by one thread that
//! group-commits the pending writes of every channel in one transaction.
//!
//! Actors hand batches to the writer through a channel and await a oneshot;
//! the writer drains whatever is queued, commits it as one transaction (one
//! fsync with `synchronous=FULL`), and then answers every waiter. Under load
//! many chats' actions share each commit, which is where the throughput comes
//! from; under a steady stream of small writes a group may wait up to the
//! commit window for more (`writer::Gather`). Reads (start-up recovery, turn
//! paging) use a second connection, checkpoints a third.
//!
//! `schema` creates and migrates the tables, `writer` is the writer thread
//! and its group commit, `checkpoint` copies the WAL into the database
//! beside it, `recovery` the reads.

mod checkpoint;
mod recovery;
mod schema;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::Mutex;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::{
    AuditPage, Batch, BindCommit, ChannelInfo, Commit, CommitMetrics, CommitStats, Journal,
    JournalError, Recovered, RecoveredChannel, TurnPage,
};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use writer::{Op, Writer};

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// `synchronous=FULL`: a commit survives power loss.
    Full,
    /// `synchronous=NORMAL`: survives a process crash, not power loss (the
    /// last commits may be lost on an OS crash).
    Relaxed,
}

/// The longest a group commit may wait for more writes by default (only
/// under a steady stream of writes from many quiet channels, and only as
/// long as a few more take to arrive, see `writer`): fewer `fsync`s, page
/// rewrites and wake-ups per write at the price of at most this much on a
/// durable echo.
pub const DEFAULT_COMMIT_WINDOW: Duration = Duration::from_millis(20);

/// The SQLite journal.
pub struct SqliteJournal {
    path: PathBuf,
    tx: Mutex<mpsc::Sender<Op>>,
    /// Records per channel, as committed (for `len`).
    lens: Arc<DashMap<ChannelUri, JournalPos>>,
    reader: Mutex<Connection>,
    /// The server's own records ([`crate::store::settings`]), on a
    /// connection of their own: rare small writes that need not wait for a
    /// group.
    settings: Arc<SqliteSettings>,
    /// The writer's group-commit figures.
    counters: Arc<writer::Counters>,
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(e.to_string())
}

impl SqliteJournal {
    /// Open (or create) the store in `dir`. Fails with a message that names
    /// the directory and the cause: not creatable, not writable, not a
    /// database.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, JournalError> {
        Self::open_with_window(dir, durability, DEFAULT_COMMIT_WINDOW)
    }

    /// Up to `limit` entries of `session`'s audit log after `after`, read
    /// from the store in `dir` without opening it for writes (the server
    /// may be running on it).
    pub fn read_audit(dir: &Path, session: &str, after: u64, limit: u64) -> AuditPage {
        let path = dir.join("tandem.db");
        if !path.exists() {
            return Err(unavailable(format!("no store at {}", path.display())));
        }
        let conn = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| unavailable(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(unavailable)?;
        recovery::audit_page(&conn, session, after, limit)
    }

    /// [`Self::open`] with a commit window of `window` (zero: every group
    /// commits as soon as the writer takes it).
    pub fn open_with_window(
        dir: &Path,
        durability: Durability,
        window: Duration,
    ) -> Result<Self, JournalError> {
        Self::open_with_limits(dir, durability, window, checkpoint::Limits::DEFAULT)
    }

    /// [`Self::open_with_window`] with checkpoints at `limits`.
    fn open_with_limits(
        dir: &Path,
        durability: Durability,
        window: Duration,
        limits: checkpoint::Limits,
    ) -> Result<Self, JournalError> {
        schema::create_private_dir(dir).map_err(|e| {
            unavailable(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join("tandem.db");
        schema::create_private_file(&path)
            .map_err(|e| unavailable(format!("cannot create the store {}: {e}", path.display())))?;
        let describe = |e: rusqlite::Error| {
            unavailable(format!("cannot open the store {}: {e}", path.display()))
        };
        let writer = schema::open_conn(&path, durability).map_err(describe)?;
        schema::create(&writer).map_err(describe)?;
        let reader = schema::open_conn(&path, durability).map_err(describe)?;
        reader
            .execute_batch("PRAGMA query_only = ON;")
            .map_err(describe)?;
        let lens = Arc::new(DashMap::new());
        for (uri, len) in recovery::lengths(&reader)
            .map_err(|e| unavailable(format!("cannot read the store {}: {e}", path.display())))?
        {
            lens.insert(ChannelUri::from(uri), JournalPos::new(len));
        }
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer::new(writer, lens.clone());
        let checkpointer = schema::open_conn(&path, durability).map_err(describe)?;
        writer
            .checkpoint_beside(checkpointer, limits)
            .map_err(unavailable)?;
        let counters = writer.counters();
        let settings = Arc::new(SqliteSettings(Mutex::new(
            schema::open_conn(&path, durability).map_err(describe)?,
        )));
        std::thread::Builder::new()
            .name("tandem-journal".into())
            .spawn(move || writer.run(rx, window))
            .map_err(unavailable)?;
        Ok(Self {
            path,
            tx: Mutex::new(tx),
            lens,
            reader: Mutex::new(reader),
            settings,
            counters,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, op: Op) -> bool {
        self.tx.lock().send(op).is_ok()
    }

    /// Durably raise the stored `serverSeq` floor to `upto` (never lowers it).
    fn raise_seq_floor(&self, upto: ServerSeq) -> Result<(), JournalError> {
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.send(Op::Reserve(upto, tx)) {
            return Err(closed());
        }
        rx.recv().unwrap_or_else(|_| Err(closed()))
    }
}

fn closed() -> JournalError {
    JournalError::Unavailable("the journal writer has stopped".into())
}

/// The `settings` table.
struct SqliteSettings(Mutex<Connection>);

impl crate::store::Settings for SqliteSettings {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, JournalError> {
        use rusqlite::OptionalExtension;
        self.0
            .lock()
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(unavailable)
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), JournalError> {
        self.0
            .lock()
            .execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                rusqlite::params![key, value],
            )
            .map(drop)
            .map_err(unavailable)
    }

    fn delete(&self, key: &str) -> Result<(), JournalError> {
        self.0
            .lock()
            .execute("DELETE FROM settings WHERE key = ?1", [key])
            .map(drop)
            .map_err(unavailable)
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        let conn = self.0.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT key, value FROM settings WHERE substr(key, 1, ?2) = ?1 ORDER BY key",
            )
            .map_err(unavailable)?;
        let rows = stmt
            .query_map(rusqlite::params![prefix, prefix.len() as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(unavailable)?;
        rows.collect::<Result<_, _>>().map_err(unavailable)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, JournalError> {
        let conn = self.0.lock();
        conn.execute(
            "INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)",
            rusqlite::params![key, value],
        )
        .map_err(unavailable)?;
        conn.query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .map_err(unavailable)
    }
}

impl Journal for SqliteJournal {
    fn settings(&self) -> Option<Arc<dyn crate::store::Settings>> {
        Some(self.settings.clone())
    }

    fn commit_stats(&self) -> Option<CommitStats> {
        Some(self.counters.read())
    }

    fn observe_commits(&self, metrics: CommitMetrics) {
        self.counters.observe(metrics);
    }

    fn memory_bytes(&self) -> Option<u64> {
        // SAFETY: a read of SQLite's global counter, no arguments.
        let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
        u64::try_from(used).ok()
    }

    fn create_channel(&self, info: ChannelInfo) -> Commit {
        let (done, rx) = oneshot::channel();
        if !self.send(Op::Create(info, done)) {
            return Box::pin(std::future::ready(Err(closed())));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(closed())) })
    }

    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        let (done, rx) = oneshot::channel();
        let op = Op::Append {
            channel: channel.clone(),
            expected,
            batch,
            done,
        };
        if !self.send(op) {
            return Box::pin(std::future::ready(Err(closed())));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(closed())) })
    }

    fn remove(&self, channel: &ChannelUri) {
        self.send(Op::Remove(channel.clone()));
    }

    fn len(&self, channel: &ChannelUri) -> JournalPos {
        self.lens.get(channel).map_or(JournalPos::ZERO, |l| *l)
    }

    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
        recovery::turns_before(&self.reader.lock(), chat, before, limit)
    }

    fn audit_page(&self, session: &ChannelUri, after: u64, limit: u64) -> AuditPage {
        recovery::audit_page(&self.reader.lock(), session, after, limit)
    }

    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        let last = next.get().saturating_add(count).saturating_sub(1);
        self.raise_seq_floor(ServerSeq::new(last))?;
        Ok(next)
    }

    fn sync(&self) -> Result<(), JournalError> {
        // Ops are committed in order, so a no-op reservation is a barrier.
        self.raise_seq_floor(ServerSeq::ZERO)
    }

    fn probe_write(&self) -> Result<(), JournalError> {
        // The barrier is a real write (the floor set to what it is), so it
        // takes the database's write lock and commits like any group.
        self.raise_seq_floor(ServerSeq::ZERO)
    }

    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        recovery::load_channel(&self.reader.lock(), uri)
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        recovery::recover(&self.reader.lock())
    }

    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
        let (done, rx) = oneshot::channel();
        let op = Op::BindProvider {
            provider: provider.to_owned(),
            subject: subject.to_owned(),
            done,
        };
        if !self.send(op) {
            return Box::pin(std::future::ready(Err(closed())));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(closed())) })
    }
}

#[cfg(test)]
mod tests;
