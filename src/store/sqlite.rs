//! The embedded default store: SQLite in WAL mode, written by one thread that
//! group-commits the pending writes of every channel in one transaction.
//!
//! Actors hand batches to the writer through a channel and await a oneshot;
//! the writer drains whatever is queued, commits it as one transaction (one
//! fsync with `synchronous=FULL`), and then answers every waiter. Under load
//! many chats' actions share each commit, which is where the throughput comes
//! from. Reads (start-up recovery, turn paging) use a second connection.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::{
    Batch, BindCommit, ChannelInfo, ChannelKind, Commit, Journal, JournalError, Record, Recovered,
    RecoveredChannel, SnapshotRecord,
};

/// Most queued writes folded into one transaction.
const MAX_OPS_PER_COMMIT: usize = 4096;

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// `synchronous=FULL`: a commit survives power loss.
    Full,
    /// `synchronous=NORMAL`: survives a process crash, not power loss (the
    /// last commits may be lost on an OS crash).
    Relaxed,
}

enum Op {
    Create(ChannelInfo, oneshot::Sender<Result<(), JournalError>>),
    Append {
        channel: String,
        expected: u64,
        batch: Batch,
        done: oneshot::Sender<Result<(), JournalError>>,
    },
    Remove(String),
    Reserve(u64, mpsc::SyncSender<Result<(), JournalError>>),
    BindProvider {
        provider: String,
        subject: String,
        done: oneshot::Sender<Result<String, JournalError>>,
    },
}

/// The SQLite journal.
pub struct SqliteJournal {
    path: PathBuf,
    tx: Mutex<mpsc::Sender<Op>>,
    /// Records per channel, as committed (for `len`).
    lens: Arc<DashMap<String, u64>>,
    reader: Mutex<Connection>,
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(e.to_string())
}

/// Run the parameterless query `sql`, decode each row with `read` and hand
/// it to `each`; stops at the first error `each` returns.
fn for_each_row<T>(
    conn: &Connection,
    sql: &str,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    mut each: impl FnMut(T) -> Result<(), JournalError>,
) -> Result<(), JournalError> {
    let mut stmt = conn.prepare(sql).map_err(unavailable)?;
    for row in stmt.query_map([], read).map_err(unavailable)? {
        each(row.map_err(unavailable)?)?;
    }
    Ok(())
}

/// A row of (text, integer, text).
fn text_int_text(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i64, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS channels (
    uri TEXT PRIMARY KEY, ord INTEGER NOT NULL, kind TEXT NOT NULL, session TEXT,
    provider TEXT NOT NULL, title TEXT NOT NULL, created_at TEXT NOT NULL,
    len INTEGER NOT NULL DEFAULT 0, owner TEXT
);
CREATE TABLE IF NOT EXISTS actions (
    channel TEXT NOT NULL, seq INTEGER NOT NULL, action TEXT NOT NULL,
    PRIMARY KEY (channel, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (channel TEXT PRIMARY KEY, at_seq INTEGER NOT NULL, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    chat TEXT NOT NULL, idx INTEGER NOT NULL, turn TEXT NOT NULL,
    PRIMARY KEY (chat, idx)
) WITHOUT ROWID;
";

/// Bring a store written by an earlier version up to the current schema.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has_owner = conn
        .prepare("SELECT 1 FROM pragma_table_info('channels') WHERE name = 'owner'")?
        .exists([])?;
    if !has_owner {
        conn.execute_batch("ALTER TABLE channels ADD COLUMN owner TEXT;")?;
    }
    Ok(())
}

/// The data directory holds every conversation: only its owner may list or
/// enter it (0700). An existing directory is left as the operator set it.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Create the database file readable by its owner only (0600) before SQLite
/// opens it; SQLite gives its `-wal` and `-shm` files the same mode.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).map(drop)
}

/// Provider id → the token subject that first registered it. Its own table
/// (not a column of `channels`): a binding outlives every session of the
/// provider, and an id may be bound before any session uses it.
const PROVIDER_OWNERS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS provider_owners (provider TEXT PRIMARY KEY, subject TEXT NOT NULL);
";

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

/// Every stored provider binding.
fn read_provider_owners(conn: &Connection) -> Result<BTreeMap<String, String>, JournalError> {
    let mut owners = BTreeMap::new();
    for_each_row(
        conn,
        "SELECT provider, subject FROM provider_owners",
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        |(provider, subject)| {
            owners.insert(provider, subject);
            Ok(())
        },
    )?;
    Ok(owners)
}

fn open_conn(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(
        None,
        "synchronous",
        match durability {
            Durability::Full => "FULL",
            Durability::Relaxed => "NORMAL",
        },
    )?;
    Ok(conn)
}

impl SqliteJournal {
    /// Open (or create) the store in `dir`. Fails with a message that names
    /// the directory and the cause: not creatable, not writable, not a
    /// database.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, JournalError> {
        create_private_dir(dir).map_err(|e| {
            unavailable(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join("tandem.db");
        create_private_file(&path)
            .map_err(|e| unavailable(format!("cannot create the store {}: {e}", path.display())))?;
        let describe = |e: rusqlite::Error| {
            unavailable(format!("cannot open the store {}: {e}", path.display()))
        };
        let writer = open_conn(&path, durability).map_err(describe)?;
        writer.execute_batch(SCHEMA).map_err(describe)?;
        migrate(&writer).map_err(describe)?;
        writer
            .execute_batch(PROVIDER_OWNERS_SCHEMA)
            .map_err(describe)?;
        let reader = open_conn(&path, durability).map_err(describe)?;
        reader
            .execute_batch("PRAGMA query_only = ON;")
            .map_err(describe)?;
        let lens = Arc::new(DashMap::new());
        {
            let mut stmt = reader
                .prepare("SELECT uri, len FROM channels")
                .map_err(describe)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .map_err(describe)?;
            for row in rows {
                let (uri, len) = row.map_err(describe)?;
                lens.insert(uri, len as u64);
            }
        }
        let (tx, rx) = mpsc::channel();
        let writer_lens = lens.clone();
        std::thread::Builder::new()
            .name("tandem-journal".into())
            .spawn(move || write_loop(writer, rx, writer_lens))
            .map_err(unavailable)?;
        Ok(Self {
            path,
            tx: Mutex::new(tx),
            lens,
            reader: Mutex::new(reader),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, op: Op) -> bool {
        self.tx.lock().send(op).is_ok()
    }
}

fn closed() -> JournalError {
    JournalError::Unavailable("the journal writer has stopped".into())
}

impl Journal for SqliteJournal {
    fn create_channel(&self, info: ChannelInfo) -> Commit {
        let (done, rx) = oneshot::channel();
        if !self.send(Op::Create(info, done)) {
            return Box::pin(std::future::ready(Err(closed())));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(closed())) })
    }

    fn append(&self, channel: &str, expected_seq: u64, batch: Batch) -> Commit {
        let (done, rx) = oneshot::channel();
        let op = Op::Append {
            channel: channel.to_owned(),
            expected: expected_seq,
            batch,
            done,
        };
        if !self.send(op) {
            return Box::pin(std::future::ready(Err(closed())));
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(closed())) })
    }

    fn remove(&self, channel: &str) {
        self.send(Op::Remove(channel.to_owned()));
    }

    fn len(&self, channel: &str) -> u64 {
        self.lens.get(channel).map_or(0, |l| *l)
    }

    fn turns_before(
        &self,
        chat: &str,
        before: u64,
        limit: u64,
    ) -> Result<Vec<Arc<str>>, JournalError> {
        let conn = self.reader.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT turn FROM turns WHERE chat = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
            )
            .map_err(unavailable)?;
        let start = before.saturating_sub(limit);
        let rows = stmt
            .query_map(params![chat, start as i64, before as i64], |r| {
                r.get::<_, String>(0)
            })
            .map_err(unavailable)?;
        rows.map(|r| r.map(Arc::from).map_err(unavailable))
            .collect()
    }

    fn reserve_seq(&self, upto: u64) -> Result<(), JournalError> {
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.send(Op::Reserve(upto, tx)) {
            return Err(closed());
        }
        rx.recv().unwrap_or_else(|_| Err(closed()))
    }

    fn sync(&self) -> Result<(), JournalError> {
        // Ops are committed in order, so a no-op reservation is a barrier.
        self.reserve_seq(0)
    }

    fn load_channel(&self, uri: &str) -> Result<Option<RecoveredChannel>, JournalError> {
        let conn = self.reader.lock();
        let row = conn
            .query_row(
                "SELECT kind, session, provider, title, created_at, len, owner FROM channels WHERE uri = ?1",
                [uri],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, i64>(5)?,
                        r.get::<_, Option<String>>(6)?,
                    ))
                },
            )
            .optional()
            .map_err(unavailable)?;
        let Some((kind, session, provider, title, created_at, len, owner)) = row else {
            return Ok(None);
        };
        let kind = ChannelKind::parse(&kind)
            .ok_or_else(|| unavailable(format!("channel {uri} has an unknown kind `{kind}`")))?;
        let snapshot = conn
            .query_row(
                "SELECT at_seq, state FROM snapshots WHERE channel = ?1",
                [uri],
                |r| {
                    Ok(SnapshotRecord {
                        at_seq: r.get::<_, i64>(0)? as u64,
                        state: r.get::<_, String>(1)?.into(),
                    })
                },
            )
            .optional()
            .map_err(unavailable)?;
        let from = snapshot.as_ref().map_or(0, |s| s.at_seq) as i64;
        let mut stmt = conn
            .prepare("SELECT action FROM actions WHERE channel = ?1 AND seq >= ?2 ORDER BY seq")
            .map_err(unavailable)?;
        let tail = stmt
            .query_map(params![uri, from], |r| r.get::<_, String>(0))
            .map_err(unavailable)?
            .map(|r| r.map(Record::from).map_err(unavailable))
            .collect::<Result<Vec<_>, _>>()?;
        let turn_count: i64 = conn
            .query_row(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM turns WHERE chat = ?1",
                [uri],
                |r| r.get(0),
            )
            .map_err(unavailable)?;
        Ok(Some(RecoveredChannel {
            info: ChannelInfo {
                uri: uri.to_owned(),
                kind,
                session,
                provider,
                title,
                created_at,
                owner,
            },
            snapshot,
            tail,
            len: len as u64,
            turn_count: turn_count as u64,
        }))
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        let conn = self.reader.lock();
        let seq_floor: u64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'seq_floor'", [], |r| {
                r.get::<_, i64>(0)
            })
            .optional()
            .map_err(unavailable)?
            .unwrap_or(0) as u64;
        let mut snapshots: HashMap<String, SnapshotRecord> = HashMap::new();
        for_each_row(
            &conn,
            "SELECT channel, at_seq, state FROM snapshots",
            text_int_text,
            |(c, at, state)| {
                let record = SnapshotRecord {
                    at_seq: at as u64,
                    state: state.into(),
                };
                snapshots.insert(c, record);
                Ok(())
            },
        )?;
        let mut tails: HashMap<String, Vec<Record>> = HashMap::new();
        for_each_row(
            &conn,
            "SELECT channel, seq, action FROM actions ORDER BY channel, seq",
            text_int_text,
            |(c, seq, action)| {
                let from = snapshots.get(&c).map_or(0, |s| s.at_seq);
                if seq as u64 >= from {
                    tails.entry(c).or_default().push(action.into());
                }
                Ok(())
            },
        )?;
        let mut turn_counts: HashMap<String, u64> = HashMap::new();
        for_each_row(
            &conn,
            "SELECT chat, MAX(idx) + 1 FROM turns GROUP BY chat",
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
            |(c, n)| {
                turn_counts.insert(c, n as u64);
                Ok(())
            },
        )?;
        let mut channels = Vec::new();
        for_each_row(
            &conn,
            "SELECT uri, kind, session, provider, title, created_at, len, owner FROM channels ORDER BY ord",
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, Option<String>>(7)?,
                ))
            },
            |(uri, kind, session, provider, title, created_at, len, owner)| {
                let Some(kind) = ChannelKind::parse(&kind) else {
                    return Err(unavailable(format!(
                        "channel {uri} has an unknown kind `{kind}`"
                    )));
                };
                channels.push(RecoveredChannel {
                    snapshot: snapshots.remove(&uri),
                    tail: tails.remove(&uri).unwrap_or_default(),
                    len: len as u64,
                    turn_count: turn_counts.get(&uri).copied().unwrap_or(0),
                    info: ChannelInfo {
                        uri,
                        kind,
                        session,
                        provider,
                        title,
                        created_at,
                        owner,
                    },
                });
                Ok(())
            },
        )?;
        Ok(Recovered {
            channels,
            seq_floor,
            provider_owners: read_provider_owners(&conn)?,
        })
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

/// The writer thread: fold queued ops into one transaction per commit.
fn write_loop(mut conn: Connection, rx: mpsc::Receiver<Op>, lens: Arc<DashMap<String, u64>>) {
    let mut next_ord: i64 = conn
        .query_row("SELECT COALESCE(MAX(ord), 0) + 1 FROM channels", [], |r| {
            r.get(0)
        })
        .unwrap_or(1);
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        while ops.len() < MAX_OPS_PER_COMMIT {
            match rx.try_recv() {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        // Positions as they will be after this commit; published to `lens`
        // only if it succeeds.
        let mut pending: HashMap<String, u64> = HashMap::new();
        let mut results: Vec<Result<(), JournalError>> = Vec::with_capacity(ops.len());
        // The owner after each `BindProvider` op, in op order.
        let mut owners: Vec<String> = Vec::new();
        let outcome = (|| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            for op in &ops {
                let r = match op {
                    Op::Create(info, _) => {
                        tx.execute(
                            "INSERT OR REPLACE INTO channels (uri, ord, kind, session, provider, title, created_at, len, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8)",
                            params![info.uri, next_ord, info.kind.as_str(), info.session, info.provider, info.title, info.created_at, info.owner],
                        )?;
                        next_ord += 1;
                        pending.insert(info.uri.clone(), 0);
                        Ok(())
                    }
                    Op::Append {
                        channel,
                        expected,
                        batch,
                        ..
                    } => {
                        let found = pending
                            .get(channel)
                            .copied()
                            .unwrap_or_else(|| lens.get(channel).map_or(0, |l| *l));
                        if found != *expected {
                            Err(JournalError::Conflict {
                                channel: channel.clone(),
                                expected: *expected,
                                found,
                            })
                        } else {
                            write_batch(&tx, channel, *expected, batch)?;
                            pending.insert(channel.clone(), expected + batch.records.len() as u64);
                            Ok(())
                        }
                    }
                    Op::Remove(channel) => {
                        tx.execute("DELETE FROM channels WHERE uri = ?1", [channel])?;
                        tx.execute("DELETE FROM actions WHERE channel = ?1", [channel])?;
                        tx.execute("DELETE FROM snapshots WHERE channel = ?1", [channel])?;
                        tx.execute("DELETE FROM turns WHERE chat = ?1", [channel])?;
                        pending.insert(channel.clone(), 0);
                        Ok(())
                    }
                    Op::BindProvider {
                        provider, subject, ..
                    } => {
                        owners.push(bind_provider_in(&tx, provider, subject)?);
                        Ok(())
                    }
                    Op::Reserve(upto, _) => {
                        tx.execute(
                            "INSERT INTO meta (key, value) VALUES ('seq_floor', ?1) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
                            [*upto as i64],
                        )?;
                        Ok(())
                    }
                };
                results.push(r);
            }
            tx.commit()
        })();
        if let Err(e) = &outcome {
            tracing::error!(error = %e, "journal commit failed");
        } else {
            for (c, l) in pending {
                lens.insert(c, l);
            }
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

fn write_batch(
    tx: &rusqlite::Transaction<'_>,
    channel: &str,
    expected: u64,
    batch: &Batch,
) -> rusqlite::Result<()> {
    {
        let mut insert = tx.prepare_cached(
            "INSERT OR REPLACE INTO actions (channel, seq, action) VALUES (?1, ?2, ?3)",
        )?;
        for (i, r) in batch.records.iter().enumerate() {
            insert.execute(params![channel, (expected + i as u64) as i64, &**r])?;
        }
    }
    let len = expected + batch.records.len() as u64;
    tx.prepare_cached("UPDATE channels SET len = ?2 WHERE uri = ?1")?
        .execute(params![channel, len as i64])?;
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
        .execute(params![channel, s.at_seq as i64, &*s.state])?;
        // The snapshot covers everything before it: compact.
        tx.prepare_cached("DELETE FROM actions WHERE channel = ?1 AND seq < ?2")?
            .execute(params![channel, s.at_seq as i64])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TurnRecord;

    fn info(uri: &str) -> ChannelInfo {
        ChannelInfo {
            uri: uri.into(),
            kind: ChannelKind::Chat,
            session: Some("ahp-session:/s".into()),
            provider: "scripted".into(),
            title: "Chat".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            owner: None,
        }
    }

    #[tokio::test]
    async fn appends_survive_reopen_with_snapshot_compaction() {
        let dir = tempdir();
        {
            let j = SqliteJournal::open(&dir, Durability::Full).expect("open");
            j.create_channel(info("ahp-chat:/a")).await.expect("create");
            j.append("ahp-chat:/a", 0, Batch::of(vec!["1".into(), "2".into()]))
                .await
                .expect("append");
            let conflict = j
                .append("ahp-chat:/a", 0, Batch::of(vec!["x".into()]))
                .await;
            assert!(matches!(
                conflict,
                Err(JournalError::Conflict { found: 2, .. })
            ));
            j.append(
                "ahp-chat:/a",
                2,
                Batch {
                    records: vec!["3".into()],
                    turns: vec![TurnRecord {
                        index: 0,
                        json: "turn0".into(),
                    }],
                    truncate_turns_from: None,
                    snapshot: Some(SnapshotRecord {
                        at_seq: 3,
                        state: "S".into(),
                    }),
                },
            )
            .await
            .expect("append with snapshot");
            j.append("ahp-chat:/a", 3, Batch::of(vec!["4".into()]))
                .await
                .expect("tail");
            j.reserve_seq(1000).expect("reserve");
            assert_eq!(j.len("ahp-chat:/a"), 4);
        }
        let j = SqliteJournal::open(&dir, Durability::Full).expect("reopen");
        let r = j.recover().expect("recover");
        assert_eq!(r.seq_floor, 1000);
        assert_eq!(r.channels.len(), 1);
        let c = &r.channels[0];
        assert_eq!(c.len, 4);
        assert_eq!(c.snapshot.as_ref().map(|s| s.at_seq), Some(3));
        assert_eq!(c.tail, vec![Record::from("4")]);
        assert_eq!(c.turn_count, 1);
        assert_eq!(j.len("ahp-chat:/a"), 4);
        assert_eq!(
            j.turns_before("ahp-chat:/a", 1, 10).expect("turns"),
            vec![Arc::<str>::from("turn0")]
        );
        j.remove("ahp-chat:/a");
        j.reserve_seq(1001).expect("barrier after remove");
        assert!(j.recover().expect("recover").channels.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn provider_bindings_keep_their_first_owner_across_reopen() {
        let dir = tempdir();
        {
            let j = SqliteJournal::open(&dir, Durability::Full).expect("open");
            let (first, second) = tokio::join!(
                j.bind_provider("p", "alice"),
                j.bind_provider("p", "mallory")
            );
            assert_eq!(first, Ok("alice".into()), "queued first, bound first");
            assert_eq!(second, Ok("alice".into()), "the later one learns the owner");
            assert_eq!(j.bind_provider("q", "bob").await, Ok("bob".into()));
        }
        let j = SqliteJournal::open(&dir, Durability::Full).expect("reopen");
        let owners = j.recover().expect("recover").provider_owners;
        assert_eq!(
            owners.into_iter().collect::<Vec<_>>(),
            [("p".into(), "alice".into()), ("q".into(), "bob".into())]
        );
        assert_eq!(j.bind_provider("p", "mallory").await, Ok("alice".into()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_file_and_an_unusable_directory_give_clear_errors() {
        let dir = tempdir();
        std::fs::write(
            dir.join("tandem.db"),
            b"this is not a database, just text that is long enough to be read",
        )
        .expect("write");
        let err = SqliteJournal::open(&dir, Durability::Full)
            .err()
            .expect("corrupt file refused");
        assert!(err.to_string().contains("tandem.db"), "{err}");
        assert!(err.to_string().contains("not a database"), "{err}");
        let file = dir.join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let err = SqliteJournal::open(&file, Durability::Full)
            .err()
            .expect("file as dir refused");
        assert!(
            err.to_string().contains("cannot create the data directory"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("tandem-store-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }
}
