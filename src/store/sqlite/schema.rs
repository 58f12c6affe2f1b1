//! The store's tables, their migrations, and how its files and connections
//! are opened.

use std::path::Path;

use rusqlite::Connection;

use super::Durability;

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
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_session ON audit (session, seq);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
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
pub(super) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
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
pub(super) fn create_private_file(path: &Path) -> std::io::Result<()> {
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

pub(super) fn open_conn(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
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

/// Create the tables a fresh store lacks and migrate an older one.
pub(super) fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    migrate(conn)?;
    conn.execute_batch(PROVIDER_OWNERS_SCHEMA)
}
