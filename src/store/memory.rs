//! An in-memory journal: the reference behaviour of the trait, used by tests
//! and by `--store memory`. Appends are immediately "durable" for the life of
//! the process.

use dashmap::DashMap;

use super::{Commit, Journal, JournalError, Record};

/// Keeps every channel's records in a `Vec`.
#[derive(Default)]
pub struct MemoryJournal {
    channels: DashMap<String, Vec<Record>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of a channel's records (tests use this to check what was stored).
    pub fn records(&self, channel: &str) -> Vec<Record> {
        self.channels
            .get(channel)
            .map(|r| r.clone())
            .unwrap_or_default()
    }
}

impl Journal for MemoryJournal {
    fn append(&self, channel: &str, expected_seq: u64, records: Vec<Record>) -> Commit {
        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        let found = entry.len() as u64;
        let result = if found != expected_seq {
            Err(JournalError::Conflict {
                channel: channel.to_owned(),
                expected: expected_seq,
                found,
            })
        } else {
            entry.extend(records);
            Ok(())
        };
        Box::pin(std::future::ready(result))
    }

    fn remove(&self, channel: &str) {
        self.channels.remove(channel);
    }

    fn len(&self, channel: &str) -> u64 {
        self.channels
            .get(channel)
            .map(|r| r.len() as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn append_is_fenced_by_expected_seq() {
        let j = MemoryJournal::new();
        j.append("c", 0, vec!["a".into()])
            .await
            .expect("first append");
        let err = j
            .append("c", 0, vec!["b".into()])
            .await
            .expect_err("stale writer");
        assert!(matches!(err, JournalError::Conflict { found: 1, .. }));
        j.append("c", 1, vec!["b".into()])
            .await
            .expect("next append");
        assert_eq!(j.len("c"), 2);
        j.remove("c");
        assert_eq!(j.len("c"), 0);
    }
}
