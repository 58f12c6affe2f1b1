//! An in-memory journal: the reference behaviour of the trait, used by tests
//! and by `--store memory`. Appends are "durable" for the life of the process;
//! a server restarted on the same instance recovers from it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    AuditPage, Batch, BindCommit, ChannelInfo, Commit, Journal, JournalError, Record, Recovered,
    RecoveredChannel, SnapshotRecord, TurnPage,
};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};

#[derive(Default)]
struct Stored {
    info: Option<ChannelInfo>,
    order: u64,
    records: Vec<Record>,
    snapshot: Option<SnapshotRecord>,
    turns: BTreeMap<u64, Arc<str>>,
}

/// Keeps every channel in memory.
#[derive(Default)]
pub struct MemoryJournal {
    channels: Mutex<BTreeMap<ChannelUri, Stored>>,
    next_order: AtomicU64,
    seq_floor: AtomicU64,
    /// Provider id → owning token subject.
    provider_owners: Mutex<BTreeMap<String, String>>,
    /// Every audit entry, in order: `(session, entry)`.
    audit: Mutex<Vec<(ChannelUri, Arc<str>)>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of a channel's records (tests use this to check what was stored).
    pub fn records(&self, channel: &str) -> Vec<Record> {
        self.channels
            .lock()
            .get(channel)
            .map(|s| s.records.clone())
            .unwrap_or_default()
    }
}

impl Journal for MemoryJournal {
    fn create_channel(&self, info: ChannelInfo) -> Commit {
        let order = self.next_order.fetch_add(1, Ordering::Relaxed);
        let mut chans = self.channels.lock();
        let entry = chans.entry(info.uri.clone()).or_default();
        entry.info = Some(info);
        entry.order = order;
        Box::pin(std::future::ready(Ok(())))
    }

    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        let mut chans = self.channels.lock();
        let entry = chans.entry(channel.clone()).or_default();
        let found = JournalPos::new(entry.records.len() as u64);
        let result = if found != expected {
            Err(JournalError::Conflict {
                channel: channel.clone(),
                expected,
                found,
            })
        } else {
            entry.records.extend(batch.records);
            if let Some(from) = batch.truncate_turns_from {
                entry.turns.retain(|i, _| *i < from);
            }
            for t in batch.turns {
                entry.turns.insert(t.index, t.json);
            }
            if let Some(s) = batch.snapshot {
                entry.snapshot = Some(s);
            }
            let mut audit = self.audit.lock();
            audit.extend(batch.audit.into_iter().map(|a| (a.session, a.entry)));
            Ok(())
        };
        Box::pin(std::future::ready(result))
    }

    fn remove(&self, channel: &ChannelUri) {
        self.channels.lock().remove(channel);
    }

    fn len(&self, channel: &ChannelUri) -> JournalPos {
        self.channels
            .lock()
            .get(channel)
            .map_or(
                JournalPos::ZERO,
                |s| JournalPos::new(s.records.len() as u64),
            )
    }

    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
        let chans = self.channels.lock();
        let Some(s) = chans.get(chat) else {
            return Ok(Vec::new());
        };
        let start = before.saturating_sub(limit);
        Ok(s.turns
            .range(start..before)
            .map(|(_, t)| t.clone())
            .collect())
    }

    fn audit_page(&self, session: &ChannelUri, after: u64, limit: u64) -> AuditPage {
        // A cursor is the entry's place in the whole log, from 1.
        let audit = self.audit.lock();
        Ok(audit
            .iter()
            .enumerate()
            .skip(after.min(audit.len() as u64) as usize)
            .filter(|(_, (s, _))| s == session)
            .take(limit as usize)
            .map(|(i, (_, e))| (i as u64 + 1, e.clone()))
            .collect())
    }

    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        let last = next.get().saturating_add(count).saturating_sub(1);
        self.seq_floor.fetch_max(last, Ordering::SeqCst);
        Ok(next)
    }

    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        Ok(self
            .recover()?
            .channels
            .into_iter()
            .find(|c| c.info.uri == *uri))
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        let chans = self.channels.lock();
        let mut channels: Vec<(u64, RecoveredChannel)> = chans
            .values()
            .filter_map(|s| {
                let info = s.info.clone()?;
                let at = s.snapshot.as_ref().map_or(0, |x| x.at_seq.get()) as usize;
                Some((
                    s.order,
                    RecoveredChannel {
                        info,
                        snapshot: s.snapshot.clone(),
                        tail: s.records[at.min(s.records.len())..].to_vec(),
                        tail_origins: Vec::new(),
                        len: JournalPos::new(s.records.len() as u64),
                        turn_count: s.turns.keys().next_back().map_or(0, |k| k + 1),
                    },
                ))
            })
            .collect();
        channels.sort_by_key(|(o, _)| *o);
        Ok(Recovered {
            channels: channels.into_iter().map(|(_, c)| c).collect(),
            seq_floor: ServerSeq::new(self.seq_floor.load(Ordering::SeqCst)),
            provider_owners: self.provider_owners.lock().clone(),
        })
    }

    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
        let owner = self
            .provider_owners
            .lock()
            .entry(provider.to_owned())
            .or_insert_with(|| subject.to_owned())
            .clone();
        Box::pin(std::future::ready(Ok(owner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TurnRecord;

    #[tokio::test]
    async fn append_is_fenced_by_expected_seq() {
        let j = MemoryJournal::new();
        j.append(&"c".into(), JournalPos::new(0), Batch::of(vec!["a".into()]))
            .await
            .expect("first append");
        let err = j
            .append(&"c".into(), JournalPos::new(0), Batch::of(vec!["b".into()]))
            .await
            .expect_err("stale writer");
        assert!(matches!(err, JournalError::Conflict { found, .. } if found == JournalPos::new(1)));
        j.append(&"c".into(), JournalPos::new(1), Batch::of(vec!["b".into()]))
            .await
            .expect("next append");
        assert_eq!(j.len(&"c".into()), JournalPos::new(2));
        j.remove(&"c".into());
        assert_eq!(j.len(&"c".into()), JournalPos::new(0));
    }

    #[tokio::test]
    async fn recovery_returns_the_tail_after_the_snapshot_and_pages_turns() {
        let j = MemoryJournal::new();
        j.create_channel(ChannelInfo::test_chat("ahp-chat:/c"))
            .await
            .expect("create");
        let turns = (0..5)
            .map(|i| TurnRecord {
                index: i,
                json: format!("t{i}").into(),
            })
            .collect();
        j.append(
            &"ahp-chat:/c".into(),
            JournalPos::new(0),
            Batch {
                records: vec!["a".into(), "b".into()],
                turns,
                truncate_turns_from: None,
                snapshot: Some(SnapshotRecord {
                    at_seq: JournalPos::new(1),
                    state: "s".into(),
                }),
                origins: Vec::new(),
                audit: Vec::new(),
            },
        )
        .await
        .expect("append");
        let r = j.recover().expect("recover");
        assert_eq!(r.channels.len(), 1);
        assert_eq!(r.channels[0].tail, vec![Record::from("b")]);
        assert_eq!(r.channels[0].turn_count, 5);
        let page: Vec<String> = j
            .turns_before(&"ahp-chat:/c".into(), 4, 2)
            .expect("page")
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(page, ["t2", "t3"]);
    }

    #[tokio::test]
    async fn the_first_provider_binding_wins_and_is_recovered() {
        let j = MemoryJournal::new();
        assert_eq!(j.bind_provider("p", "alice").await, Ok("alice".into()));
        assert_eq!(j.bind_provider("p", "mallory").await, Ok("alice".into()));
        let owners = j.recover().expect("recover").provider_owners;
        assert_eq!(owners.get("p").map(String::as_str), Some("alice"));
    }
}
