//! Checkpoints beside the writer: the WAL is copied, starts over, stays
//! bounded, and nothing committed is lost on the way.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::Limits;
use crate::ids::{ChannelUri, JournalPos};
use crate::store::sqlite::tests::tempdir;
use crate::store::sqlite::{Durability, SqliteJournal};
use crate::store::{Batch, ChannelInfo, CommitStats, Journal, Record};

/// A journal in `dir` checkpointing at `limits`, committing at once, with
/// `chat` created.
async fn journal_with_chat(dir: &Path, limits: Limits, chat: &ChannelUri) -> SqliteJournal {
    let j = SqliteJournal::open_with_limits(dir, Durability::Relaxed, Duration::ZERO, limits)
        .expect("open");
    j.create_channel(ChannelInfo::test_chat(chat.as_str()))
        .await
        .expect("create");
    j
}

/// A record of about a kilobyte (a quarter page of WAL each).
fn padded(i: u64) -> Record {
    format!("{i:06}:{}", "x".repeat(1000)).into()
}

/// Poll the journal's figures until `done` holds (at most ten seconds).
async fn until(j: &SqliteJournal, done: impl Fn(CommitStats) -> bool) -> CommitStats {
    for _ in 0..1000 {
        let stats = j.commit_stats().expect("SQLite counts");
        if done(stats) {
            return stats;
        }
        // The poll interval: the checkpointer announces its figures to
        // nobody, so they are read again until they get there.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the journal never got there: {:?}", j.commit_stats());
}

#[tokio::test]
async fn the_wal_is_copied_beside_the_writer_and_then_written_from_its_start() {
    let dir = tempdir();
    let chat = ChannelUri::from("ahp-chat:/long");
    let limits = Limits {
        start: 32,
        bound: 1_000_000,
    };
    let j = journal_with_chat(&dir, limits, &chat).await;
    let mut len = 0;
    // Fill the WAL up to where the checkpointer starts: the writer itself
    // never copies.
    while j.commit_stats().expect("counts").wal_pages < 32 {
        j.append(&chat, JournalPos::new(len), Batch::of(vec![padded(len)]))
            .await
            .expect("append");
        len += 1;
        assert!(len < 1000, "the WAL grows with the appends");
    }
    let stats = until(&j, |s| s.checkpoints == 1).await;
    assert_eq!(stats.writer_checkpoints, 0, "{stats:?}");
    // Nothing was written meanwhile: the checkpointer copied every page, so
    // the next commit writes the WAL from its start.
    j.append(&chat, JournalPos::new(len), Batch::of(vec![padded(len)]))
        .await
        .expect("append");
    len += 1;
    let stats = j.commit_stats().expect("counts");
    assert!(stats.wal_pages < 8, "the WAL started over: {stats:?}");
    assert_eq!((stats.checkpoints, stats.writer_checkpoints), (1, 0));
    drop(j);
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("reopen");
    let stored = j.load_channel(&chat).expect("load").expect("stored");
    assert_eq!(stored.len, JournalPos::new(len));
    assert_eq!(stored.tail, (0..len).map(padded).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_wal_over_its_bound_is_copied_by_the_writer_at_every_commit() {
    let dir = tempdir();
    let chat = ChannelUri::from("ahp-chat:/bound");
    // The checkpointer is never asked: only the bound applies.
    let limits = Limits {
        start: u32::MAX,
        bound: 16,
    };
    let j = journal_with_chat(&dir, limits, &chat).await;
    let mut most = 0;
    for i in 0..200 {
        j.append(&chat, JournalPos::new(i), Batch::of(vec![padded(i)]))
            .await
            .expect("append");
        most = most.max(j.commit_stats().expect("counts").wal_pages);
    }
    let stats = j.commit_stats().expect("counts");
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert!(stats.writer_checkpoints >= 4, "{stats:?}");
    // 200 KB of records went through a WAL that never held more than the
    // bound and one commit's pages.
    assert!(most < 16 + 4, "the WAL stayed near its bound: {most} pages");
    drop(j);
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("reopen");
    let stored = j.load_channel(&chat).expect("load").expect("stored");
    assert_eq!(stored.tail, (0..200).map(padded).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn writes_racing_the_checkpointer_are_all_kept_and_the_wal_stays_bounded() {
    let dir = tempdir();
    let limits = Limits {
        start: 64,
        bound: 4096,
    };
    let j = Arc::new(
        SqliteJournal::open_with_limits(
            &dir,
            Durability::Relaxed,
            Duration::from_millis(2),
            limits,
        )
        .expect("open"),
    );
    let chats: Vec<String> = (0..16).map(|c| format!("ahp-chat:/race-{c}")).collect();
    for c in &chats {
        j.create_channel(ChannelInfo::test_chat(c))
            .await
            .expect("create");
    }
    // Sixteen chats append at once, so commits keep coming while the
    // checkpointer copies: each at least 100 records, and on until the
    // checkpointer has copied once (however busy the machine keeps it).
    let writers = chats.iter().map(|c| {
        let j = j.clone();
        let chat = ChannelUri::from(c.as_str());
        tokio::spawn(async move {
            let mut i = 0;
            while i < 100 || j.commit_stats().expect("counts").checkpoints == 0 {
                assert!(i < 20_000, "the checkpointer never copied");
                j.append(&chat, JournalPos::new(i), Batch::of(vec![padded(i)]))
                    .await
                    .expect("append");
                i += 1;
            }
            i
        })
    });
    let mut written = Vec::new();
    for w in writers.collect::<Vec<_>>() {
        written.push(w.await.expect("writer"));
    }
    let stats = j.commit_stats().expect("counts");
    assert!(stats.checkpoints >= 1, "the checkpointer copied: {stats:?}");
    // Once writes calm down, the copy completes (the checkpointer's or the
    // writer's last part of it) and a commit writes the WAL from its start.
    let quiet = ChannelUri::from(chats[0].as_str());
    let mut len = written[0];
    while j.commit_stats().expect("counts").wal_pages >= 64 {
        j.append(&quiet, JournalPos::new(len), Batch::of(vec![padded(len)]))
            .await
            .expect("append");
        len += 1;
        assert!(
            len < written[0] + 1000,
            "the WAL never started over: {:?}",
            j.commit_stats()
        );
        // Writes calming down is the condition under test: a pause
        // between them, not a wait for anything.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(j);
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("reopen");
    for (c, n) in chats.iter().zip(&written).skip(1) {
        let stored = j
            .load_channel(&c.as_str().into())
            .expect("load")
            .expect("stored");
        assert_eq!(stored.tail, (0..*n).map(padded).collect::<Vec<_>>(), "{c}");
    }
    let stored = j.load_channel(&quiet).expect("load").expect("stored");
    assert_eq!(stored.tail, (0..len).map(padded).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}
