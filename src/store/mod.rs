//! The journal between the channel actors and storage.
//!
//! Every accepted action is appended here before anyone sees it (invariant 1:
//! durable before visible). The trait has the `append(channel, expected)`
//! shape so a backend can fence a stale writer; `expected` is the channel's
//! own count of journaled actions before this batch (a `JournalPos`, not a
//! `serverSeq`).
//!
//! Besides actions, a batch may carry the turns that ended in it (so history
//! can be paged with `fetchTurns` without keeping it all in memory) and a
//! snapshot of the channel's state (so recovery replays only the tail).

pub(crate) mod cluster;
pub mod jetstream;
pub(crate) mod memory;
pub mod settings;
pub(crate) mod sqlite;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::ids::{ChannelUri, JournalPos, ServerSeq};

pub use cluster::{ClusterEvent, ClusterLink, Replicated};
pub use jetstream::{ClusterConfig, JetStreamJournal, NatsAuth};
pub use memory::MemoryJournal;
pub use settings::{MemorySettings, Settings};
pub use sqlite::{Durability, SqliteJournal, DEFAULT_COMMIT_WINDOW};

/// A boxed future resolving when a batch is durable.
pub type Commit = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send>>;

/// A boxed future resolving, once a provider binding is durable, with the
/// token subject the provider id is bound to.
pub type BindCommit = Pin<Box<dyn Future<Output = Result<String, JournalError>> + Send>>;

/// A page of stored turns (serialized `Turn`s), oldest first.
pub type TurnPage = Result<Vec<Arc<str>>, JournalError>;

/// Why a write was not stored. A failed append is never acknowledged: the
/// action is rejected and nobody sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Another writer appended to the channel first.
    #[error("journal position conflict on {channel}: expected {expected}, found {found}")]
    Conflict {
        /// Channel URI.
        channel: ChannelUri,
        /// Position the writer expected.
        expected: JournalPos,
        /// Position the journal holds.
        found: JournalPos,
    },
    /// The store cannot take writes or reads (full disk, read-only, corrupt).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Another node took the channel over: this one may not write it again.
    #[error("{channel} is no longer this node's to write: {reason}")]
    Fenced {
        /// Channel URI.
        channel: ChannelUri,
        /// Why.
        reason: String,
    },
}

/// One journaled action: the serialized `StateAction` of a channel.
pub type Record = Arc<str>;

/// A turn that ended, at its position in the chat's whole history.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// 0-based index in the chat's history.
    pub index: u64,
    /// The serialized `Turn`.
    pub json: Arc<str>,
}

/// A channel's serialized state after its first `at_seq` records.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRecord {
    /// Records covered by the snapshot.
    pub at_seq: JournalPos,
    /// The serialized `ChatState` / `SessionState`.
    pub state: Arc<str>,
}

/// One entry of a session's audit log: a person's act that mattered,
/// serialized (see `crate::channels::audit`).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// The session the act was in.
    pub session: ChannelUri,
    /// The entry's JSON.
    pub entry: Arc<str>,
}

/// A page of a session's audit log: `(cursor, entry)` pairs, oldest first.
/// A cursor is the entry's place in the store's log (increasing, not
/// dense); the next page starts after the last one.
pub type AuditPage = Result<Vec<(u64, Arc<str>)>, JournalError>;

/// What one `append` stores, atomically.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Actions, in order.
    pub records: Vec<Record>,
    /// Turns that ended in this batch.
    pub turns: Vec<TurnRecord>,
    /// Drop stored turns from this index on (a truncation), before `turns`.
    pub truncate_turns_from: Option<u64>,
    /// A snapshot taken after this batch.
    pub snapshot: Option<SnapshotRecord>,
    /// Who dispatched each record (empty, or one per record): a cluster
    /// journal carries them so other nodes echo the action to its
    /// dispatcher's client as the owner does.
    pub origins: Vec<Option<ahp_types::actions::ActionOrigin>>,
    /// Audit entries of the acts in this batch, stored with it (SQLite: in
    /// its transaction; JetStream: once the batch is, on the audit stream).
    /// Kept when the channel is removed.
    pub audit: Vec<AuditRecord>,
}

impl Batch {
    /// A batch of actions only.
    pub fn of(records: Vec<Record>) -> Self {
        Self {
            records,
            ..Self::default()
        }
    }
}

/// The kind of a stored channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// `ahp-session:/…`
    Session,
    /// `ahp-chat:/…`
    Chat,
}

impl ChannelKind {
    fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Session => "session",
            ChannelKind::Chat => "chat",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "session" => Some(ChannelKind::Session),
            "chat" => Some(ChannelKind::Chat),
            _ => None,
        }
    }
}

/// What is needed to bring a channel's actor back.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelInfo {
    /// Channel URI.
    pub uri: ChannelUri,
    /// Session or chat.
    pub kind: ChannelKind,
    /// For a chat: its session.
    pub session: Option<ChannelUri>,
    /// Provider id of the session.
    pub provider: String,
    /// Initial title.
    pub title: String,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// For a session: the token subject that created it (per-subject session
    /// limits hold across restarts).
    pub owner: Option<String>,
}

/// One channel as stored.
#[derive(Debug, Clone)]
pub struct RecoveredChannel {
    /// Its identity.
    pub info: ChannelInfo,
    /// The latest snapshot, if any.
    pub snapshot: Option<SnapshotRecord>,
    /// Records after the snapshot, in order.
    pub tail: Vec<Record>,
    /// Who dispatched each record of `tail`, where the store keeps it (the
    /// cluster journal does, so a follower that reads a channel again can
    /// still echo a forwarded action to its dispatcher): empty, or one per
    /// record.
    pub tail_origins: Vec<Option<ahp_types::actions::ActionOrigin>>,
    /// Total records journaled for the channel.
    pub len: JournalPos,
    /// Turns stored in its history.
    pub turn_count: u64,
}

#[cfg(test)]
impl ChannelInfo {
    /// A chat of `ahp-session:/s` on the `scripted` agent (for store tests).
    pub(crate) fn test_chat(uri: &str) -> Self {
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
}

/// Everything the store holds, for start-up.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Channels in creation order (sessions before their chats).
    pub channels: Vec<RecoveredChannel>,
    /// `serverSeq` must start above this.
    pub seq_floor: ServerSeq,
    /// Provider id → the token subject that first registered it: an id stays
    /// with its first owner across restarts, so a restart does not hand its
    /// sessions' turns to whichever agent registers first.
    pub provider_owners: BTreeMap<String, String>,
}

/// Group-commit figures of a store since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitStats {
    /// Transactions committed (or attempted).
    pub commits: u64,
    /// Writes (appends, creations, removals, …) in them.
    pub writes: u64,
    /// Commits whose group waited for more writes (the commit window).
    pub waited: u64,
    /// Checkpoints (copies of the WAL into the database) run beside the
    /// writer.
    pub checkpoints: u64,
    /// Checkpoints the writer ran itself: the last pages of each copy
    /// beside it, or every commit while the WAL is over its bound.
    pub writer_checkpoints: u64,
    /// Pages in the WAL after the last commit (0 until a commit reports
    /// it): it grows to about where checkpoints start and begins again
    /// after each.
    pub wal_pages: u64,
}

/// The journal's commit figures, recorded by its writer for `/metrics`
/// (handles on the server's recorder: one atomic add each).
#[derive(Clone)]
pub struct CommitMetrics {
    /// Time one group commit took (its transaction and `fsync`).
    pub seconds: metrics::Histogram,
    /// Writes in one group commit.
    pub writes: metrics::Histogram,
    /// Time one checkpoint took: on the checkpointer's thread, and on the
    /// writer's.
    pub checkpoint_seconds: [metrics::Histogram; 2],
}

/// Storage for the action log of every channel.
pub trait Journal: Send + Sync + 'static {
    /// Record a new channel. Resolves once durable.
    fn create_channel(&self, info: ChannelInfo) -> Commit;

    /// Append `batch` to `channel`, whose journal must currently end exactly
    /// at `expected`. Resolves once durable.
    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit;

    /// Forget a disposed channel and everything stored for it.
    fn remove(&self, channel: &ChannelUri);

    /// Where `channel`'s journal ends (the number of records held).
    fn len(&self, channel: &ChannelUri) -> JournalPos;

    /// Up to `limit` stored turns of `chat` just before index `before`,
    /// oldest first.
    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage;

    /// Up to `limit` entries of `session`'s audit log after cursor `after`
    /// (0: from the start), oldest first.
    fn audit_page(&self, session: &ChannelUri, after: u64, limit: u64) -> AuditPage;

    /// Durably reserve a block of `count` `serverSeq` values for this node,
    /// starting at `next` if no other node took numbers since: a restart
    /// starts above every block reserved. Returns the block's first number:
    /// `next` on a single node; on a cluster ([`Journal::shared_seq`]),
    /// above every block granted to any node before, so a node's blocks
    /// never overlap another's.
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError>;

    /// Everything stored, for start-up.
    fn recover(&self) -> Result<Recovered, JournalError>;

    /// Bind provider id `provider` to the token subject `subject`, unless it
    /// is bound already: the first binding wins and is never replaced (the
    /// journal is the arbiter when several writers race). Resolves, once the
    /// binding is durable, with the subject the id is bound to — `subject`,
    /// or the earlier owner. Bindings come back in
    /// [`Recovered::provider_owners`]. No default: a backend that forgot
    /// them would let any agent take an id over after a restart.
    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit;

    /// Wait until every write handed to the journal so far is durable (used
    /// at shutdown).
    fn sync(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// Whether a write would be taken now; an error when it is known not to
    /// be (a cluster node cut off from NATS), so the action is refused
    /// before it touches the channel's state.
    fn writable(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// Whether the store takes a write now, found out by making one that
    /// changes nothing, committed like any other (SQLite), or by a round
    /// trip to the store's service (a cluster node). Blocks until the store
    /// answers: the caller (`/readyz`) runs it off the serving threads and
    /// bounds how long it waits.
    fn probe_write(&self) -> Result<(), JournalError> {
        self.writable()
    }

    /// Memory the store's engine holds in this process (SQLite: its page
    /// caches and statements), when it can tell.
    fn memory_bytes(&self) -> Option<u64> {
        None
    }

    /// How the store has grouped its commits since it opened, when it
    /// groups them (SQLite).
    fn commit_stats(&self) -> Option<CommitStats> {
        None
    }

    /// Record each group commit into `metrics` from now on (a journal that
    /// groups its commits; the others have none to record).
    fn observe_commits(&self, _metrics: CommitMetrics) {}

    /// What `/healthz` shows of the store beyond the server's own figures
    /// (a cluster node: its name, its NATS connection, the channels it
    /// owns).
    fn health(&self) -> Option<serde_json::Value> {
        None
    }

    /// One channel as stored (to roll its state back after a failed append).
    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError>;

    /// The link to the other nodes sharing this journal, when it is a
    /// cluster's ([`cluster`]).
    fn cluster(&self) -> Option<Arc<dyn ClusterLink>> {
        None
    }

    /// Where the server's own records are kept beside the journal
    /// ([`settings`]); `None`: nowhere durable (they live in memory).
    fn settings(&self) -> Option<Arc<dyn Settings>> {
        None
    }

    /// Whether other nodes draw `serverSeq` blocks from the same floor (a
    /// cluster journal): then the floor a node starts from may be another
    /// node's last number, and the node starts on a fresh block.
    fn shared_seq(&self) -> bool {
        false
    }
}
