//! The SQLite store: persistence across reopen, clear errors, the audit log.
//! The writer's groups and fencing are in `writer`.

mod writer;

use super::*;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{Record, SnapshotRecord, TurnRecord};

#[tokio::test]
async fn appends_survive_reopen_with_snapshot_compaction() {
    let dir = tempdir();
    {
        let j = SqliteJournal::open(&dir, Durability::Full).expect("open");
        j.create_channel(ChannelInfo::test_chat("ahp-chat:/a"))
            .await
            .expect("create");
        j.append(
            &"ahp-chat:/a".into(),
            JournalPos::new(0),
            Batch::of(vec!["1".into(), "2".into()]),
        )
        .await
        .expect("append");
        let conflict = j
            .append(
                &"ahp-chat:/a".into(),
                JournalPos::new(0),
                Batch::of(vec!["x".into()]),
            )
            .await;
        assert!(matches!(
            conflict,
            Err(JournalError::Conflict { found, .. }) if found == JournalPos::new(2)
        ));
        j.append(
            &"ahp-chat:/a".into(),
            JournalPos::new(2),
            Batch {
                records: vec!["3".into()],
                turns: vec![TurnRecord {
                    index: 0,
                    json: "turn0".into(),
                }],
                truncate_turns_from: None,
                snapshot: Some(SnapshotRecord {
                    at_seq: JournalPos::new(3),
                    state: "S".into(),
                }),
                origins: Vec::new(),
                audit: Vec::new(),
            },
        )
        .await
        .expect("append with snapshot");
        j.append(
            &"ahp-chat:/a".into(),
            JournalPos::new(3),
            Batch::of(vec!["4".into()]),
        )
        .await
        .expect("tail");
        assert_eq!(
            j.reserve_seq(ServerSeq::new(901), 100).expect("reserve"),
            ServerSeq::new(901),
            "a single node is granted what it asks"
        );
        assert_eq!(j.len(&"ahp-chat:/a".into()), JournalPos::new(4));
    }
    let j = SqliteJournal::open(&dir, Durability::Full).expect("reopen");
    let r = j.recover().expect("recover");
    assert_eq!(r.seq_floor, ServerSeq::new(1000));
    assert_eq!(r.channels.len(), 1);
    let c = &r.channels[0];
    assert_eq!(c.len, JournalPos::new(4));
    assert_eq!(
        c.snapshot.as_ref().map(|s| s.at_seq),
        Some(JournalPos::new(3))
    );
    assert_eq!(c.tail, vec![Record::from("4")]);
    assert_eq!(c.turn_count, 1);
    assert_eq!(j.len(&"ahp-chat:/a".into()), JournalPos::new(4));
    assert_eq!(
        j.turns_before(&"ahp-chat:/a".into(), 1, 10).expect("turns"),
        vec![Arc::<str>::from("turn0")]
    );
    j.remove(&"ahp-chat:/a".into());
    j.reserve_seq(ServerSeq::new(1001), 1)
        .expect("barrier after remove");
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

pub(super) fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-store-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A batch of one record carrying `entries` for session `s`.
fn audited(record: &str, entries: &[&str]) -> Batch {
    Batch {
        audit: entries
            .iter()
            .map(|e| crate::store::AuditRecord {
                session: "ahp-session:/s".into(),
                entry: (*e).into(),
            })
            .collect(),
        ..Batch::of(vec![record.into()])
    }
}

#[tokio::test]
async fn the_audit_log_is_stored_with_its_batch_paged_and_kept_after_removal() {
    let dir = tempdir();
    let chat: ChannelUri = "ahp-chat:/a".into();
    let session: ChannelUri = "ahp-session:/s".into();
    {
        let j = SqliteJournal::open(&dir, Durability::Full).expect("open");
        j.create_channel(ChannelInfo::test_chat("ahp-chat:/a"))
            .await
            .expect("create");
        j.append(
            &chat,
            JournalPos::new(0),
            audited("1", &["{\"n\":1}", "{\"n\":2}"]),
        )
        .await
        .expect("append");
        // A refused append stores none of its entries.
        let refused = j
            .append(&chat, JournalPos::new(0), audited("x", &["{\"n\":99}"]))
            .await;
        assert!(refused.is_err());
        j.append(&chat, JournalPos::new(1), audited("2", &["{\"n\":3}"]))
            .await
            .expect("append");
        j.remove(&chat);
        j.sync().expect("sync");
    }
    let j = SqliteJournal::open(&dir, Durability::Full).expect("reopen");
    let first = j.audit_page(&session, 0, 2).expect("page");
    let texts: Vec<&str> = first.iter().map(|(_, e)| &**e).collect();
    assert_eq!(texts, ["{\"n\":1}", "{\"n\":2}"]);
    let rest = j.audit_page(&session, first[1].0, 2).expect("page");
    assert_eq!(rest.len(), 1);
    assert_eq!(&*rest[0].1, "{\"n\":3}");
    assert!(j
        .audit_page(&"ahp-session:/other".into(), 0, 10)
        .expect("page")
        .is_empty());
    // The read-only reader `tandem audit export` uses sees the same.
    let read = SqliteJournal::read_audit(&dir, "ahp-session:/s", 0, 10).expect("read");
    assert_eq!(read, [first, rest].concat());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settings_are_kept_in_the_store_across_a_reopen() {
    let dir = tempdir();
    {
        let j = SqliteJournal::open(&dir, Durability::Full).expect("open");
        let s = j.settings().expect("a store keeps settings");
        crate::store::settings::tests::behaves(&*s);
        s.put("vapid", b"key").expect("put");
    }
    let j = SqliteJournal::open(&dir, Durability::Full).expect("reopen");
    let s = j.settings().expect("settings");
    assert_eq!(s.get("vapid").expect("get").as_deref(), Some(&b"key"[..]));
    assert_eq!(s.create("vapid", b"other").expect("create"), b"key");
}
