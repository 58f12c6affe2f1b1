//! The journal between the channel actors and storage.
//!
//! Every accepted action is appended here before anyone sees it (invariant 1:
//! durable before visible). The trait has the `append(channel, expected_seq)`
//! shape so a stricter backend can fence a stale writer; `expected_seq` is the
//! channel's own count of journaled actions before this batch.

pub mod memory;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use memory::MemoryJournal;

/// A boxed future resolving when a batch is durable.
pub type Commit = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send>>;

/// Why a batch was not stored. A failed append is never acknowledged: the
/// action is rejected and nobody sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Another writer appended to the channel first.
    #[error("journal position conflict on {channel}: expected {expected}, found {found}")]
    Conflict {
        /// Channel URI.
        channel: String,
        /// Position the writer expected.
        expected: u64,
        /// Position the journal holds.
        found: u64,
    },
    /// The store cannot take writes (full disk, read-only, closed).
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// One journaled action: the serialized `StateAction` of a channel.
pub type Record = Arc<str>;

/// Storage for the action log of every channel.
pub trait Journal: Send + Sync + 'static {
    /// Append `records` to `channel`, whose journal must currently hold
    /// exactly `expected_seq` records. Resolves once durable.
    fn append(&self, channel: &str, expected_seq: u64, records: Vec<Record>) -> Commit;

    /// Forget a disposed channel.
    fn remove(&self, channel: &str);

    /// Number of records held for `channel`.
    fn len(&self, channel: &str) -> u64;
}
