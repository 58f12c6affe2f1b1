//! The SQLite store's writer: fencing, group commit, what a refused group
//! leaves, and how long a group waits.

use super::super::*;
use super::tempdir;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{Record, SnapshotRecord, TurnRecord};

/// A batch of `records` that also carries a turn, a truncation and a
/// snapshot, so a refused append has every kind of write to leave out.
fn full_batch(records: &[&str], turn_index: u64) -> Batch {
    Batch {
        records: records.iter().map(|r| Record::from(*r)).collect(),
        turns: vec![TurnRecord {
            index: turn_index,
            json: "refused turn".into(),
        }],
        truncate_turns_from: Some(0),
        snapshot: Some(SnapshotRecord {
            at_seq: JournalPos::new(99),
            state: "refused snapshot".into(),
        }),
        origins: Vec::new(),
        audit: Vec::new(),
    }
}

#[tokio::test]
async fn an_append_at_the_wrong_position_is_refused_and_changes_nothing() {
    let dir = tempdir();
    let chat = &ChannelUri::from("ahp-chat:/fenced");
    {
        let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("open");
        j.create_channel(ChannelInfo::test_chat(chat))
            .await
            .expect("create");
        let mut first = Batch::of(vec!["1".into(), "2".into()]);
        first.turns = vec![TurnRecord {
            index: 0,
            json: "turn0".into(),
        }];
        j.append(chat, JournalPos::new(0), first)
            .await
            .expect("append");
        for expected in [0, 1, 3, 7].map(JournalPos::new) {
            let refused = j.append(chat, expected, full_batch(&["x"], 0)).await;
            assert_eq!(
                refused,
                Err(JournalError::Conflict {
                    channel: chat.clone(),
                    expected,
                    found: JournalPos::new(2)
                }),
                "an append expecting {expected} records"
            );
            assert_eq!(j.len(chat), JournalPos::new(2));
        }
        j.sync().expect("sync");
    }
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("reopen");
    let c = j.load_channel(chat).expect("load").expect("stored");
    assert_eq!(c.len, JournalPos::new(2));
    assert_eq!(c.tail, vec![Record::from("1"), Record::from("2")]);
    assert!(c.snapshot.is_none(), "no refused snapshot");
    assert_eq!(c.turn_count, 1, "no refused truncation or turn");
    assert_eq!(
        j.turns_before(chat, 1, 10).expect("turns"),
        vec![Arc::<str>::from("turn0")]
    );
    // The right position still works.
    j.append(chat, JournalPos::new(2), Batch::of(vec!["3".into()]))
        .await
        .expect("append at the stored position");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A writer on a fresh store in `dir` (no thread: the test hands it groups).
fn writer(dir: &Path) -> (Writer, Arc<DashMap<ChannelUri, JournalPos>>) {
    let conn = schema::open_conn(&dir.join("tandem.db"), Durability::Relaxed).expect("open");
    schema::create(&conn).expect("schema");
    let lens = Arc::new(DashMap::new());
    (Writer::new(conn, lens.clone()), lens)
}

/// A read connection on the store in `dir`.
fn reader(dir: &Path) -> Connection {
    schema::open_conn(&dir.join("tandem.db"), Durability::Relaxed).expect("open")
}

type Answer = oneshot::Receiver<Result<(), JournalError>>;

fn create_op(uri: &str) -> (Op, Answer) {
    let (done, rx) = oneshot::channel();
    (Op::Create(ChannelInfo::test_chat(uri), done), rx)
}

fn append_op(channel: &str, expected: u64, records: &[&str]) -> (Op, Answer) {
    let (done, rx) = oneshot::channel();
    let batch = Batch::of(records.iter().map(|r| Record::from(*r)).collect());
    let op = Op::Append {
        channel: channel.into(),
        expected: JournalPos::new(expected),
        batch,
        done,
    };
    (op, rx)
}

/// Commit one group and return each waiter's answer, in order.
fn commit(w: &mut Writer, group: Vec<(Op, Answer)>) -> Vec<Result<(), JournalError>> {
    let (ops, answers): (Vec<Op>, Vec<Answer>) = group.into_iter().unzip();
    w.commit_group(ops);
    answers
        .into_iter()
        .map(|mut a| a.try_recv().expect("every waiter is answered"))
        .collect()
}

fn stored_actions(dir: &Path, channel: &str) -> Vec<String> {
    let conn = reader(dir);
    let mut stmt = conn
        .prepare("SELECT action FROM actions WHERE channel = ?1 ORDER BY seq")
        .expect("prepare");
    stmt.query_map([channel], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn a_fenced_append_fails_alone_in_its_group() {
    let dir = tempdir();
    let (mut w, lens) = writer(&dir);
    let results = commit(
        &mut w,
        vec![
            create_op("ahp-chat:/a"),
            append_op("ahp-chat:/a", 0, &["a1"]),
            // Fenced by the append just before it in the same group.
            append_op("ahp-chat:/a", 0, &["stale"]),
            append_op("ahp-chat:/b", 3, &["b?"]),
            append_op("ahp-chat:/a", 1, &["a2"]),
        ],
    );
    assert_eq!(results[..2], [Ok(()), Ok(())]);
    assert!(
        matches!(
            &results[2],
            Err(JournalError::Conflict { expected, found, .. })
                if (expected.get(), found.get()) == (0, 1)
        ),
        "{:?}",
        results[2]
    );
    assert!(
        matches!(
            &results[3],
            Err(JournalError::Conflict { expected, found, .. })
                if (expected.get(), found.get()) == (3, 0)
        ),
        "{:?}",
        results[3]
    );
    assert_eq!(results[4], Ok(()));
    assert_eq!(stored_actions(&dir, "ahp-chat:/a"), ["a1", "a2"]);
    assert!(stored_actions(&dir, "ahp-chat:/b").is_empty());
    assert_eq!(
        lens.get("ahp-chat:/a").map(|l| *l),
        Some(JournalPos::new(2))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_bad_write_fails_every_write_of_its_group_visibly() {
    let dir = tempdir();
    let (mut w, lens) = writer(&dir);
    let created = commit(
        &mut w,
        vec![create_op("ahp-chat:/a"), create_op("ahp-chat:/b")],
    );
    assert_eq!(created, [Ok(()), Ok(())]);
    // A write SQLite refuses (as a full disk or a constraint would).
    reader(&dir)
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON actions WHEN NEW.action = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poisoned record'); END;",
        )
        .expect("trigger");

    let (reserve, reserved) = mpsc::sync_channel(1);
    let (bind, mut bound) = oneshot::channel();
    let (ops, answers): (Vec<Op>, Vec<Answer>) = vec![
        append_op("ahp-chat:/a", 0, &["good"]),
        append_op("ahp-chat:/b", 0, &["poison"]),
        create_op("ahp-chat:/c"),
        append_op("ahp-chat:/a", 1, &["good too"]),
    ]
    .into_iter()
    .unzip();
    let mut ops = ops;
    ops.push(Op::Reserve(ServerSeq::new(77), reserve));
    ops.push(Op::BindProvider {
        provider: "p".into(),
        subject: "alice".into(),
        done: bind,
    });
    w.commit_group(ops);
    for (i, mut a) in answers.into_iter().enumerate() {
        let r = a.try_recv().expect("answered");
        assert!(
            matches!(&r, Err(JournalError::Unavailable(e)) if e.contains("poisoned record")),
            "op {i} of the group: {r:?}"
        );
    }
    assert!(reserved.try_recv().expect("answered").is_err());
    assert!(bound.try_recv().expect("answered").is_err());

    // Nothing of the group is stored, and no position moved.
    assert!(stored_actions(&dir, "ahp-chat:/a").is_empty());
    let r = recovery::recover(&reader(&dir)).expect("recover");
    assert_eq!(r.seq_floor, ServerSeq::ZERO);
    assert!(r.provider_owners.is_empty());
    let uris: Vec<_> = r.channels.iter().map(|c| c.info.uri.as_str()).collect();
    assert_eq!(uris, ["ahp-chat:/a", "ahp-chat:/b"]);
    assert_eq!(
        lens.get("ahp-chat:/a").map(|l| *l),
        Some(JournalPos::new(0))
    );

    // The writer goes on: the next group commits at the old positions.
    let results = commit(
        &mut w,
        vec![
            append_op("ahp-chat:/a", 0, &["good"]),
            create_op("ahp-chat:/c"),
        ],
    );
    assert_eq!(results, [Ok(()), Ok(())]);
    assert_eq!(stored_actions(&dir, "ahp-chat:/a"), ["good"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_channels_length_is_what_its_stored_actions_and_snapshot_say() {
    let dir = tempdir();
    let (mut w, lens) = writer(&dir);
    let (with_snapshot, rx) = {
        let (done, rx) = oneshot::channel();
        let batch = Batch {
            records: vec!["1".into(), "2".into()],
            turns: Vec::new(),
            truncate_turns_from: None,
            snapshot: Some(SnapshotRecord {
                at_seq: JournalPos::new(2),
                state: "S".into(),
            }),
            origins: Vec::new(),
            audit: Vec::new(),
        };
        let op = Op::Append {
            channel: "ahp-chat:/a".into(),
            expected: JournalPos::ZERO,
            batch,
            done,
        };
        (op, rx)
    };
    let results = commit(
        &mut w,
        vec![
            create_op("ahp-chat:/a"),
            create_op("ahp-chat:/b"),
            create_op("ahp-chat:/c"),
            (with_snapshot, rx),
            append_op("ahp-chat:/b", 0, &["x", "y", "z"]),
        ],
    );
    assert_eq!(results, vec![Ok(()); 5]);
    // The snapshot compacted every action of /a away.
    assert!(stored_actions(&dir, "ahp-chat:/a").is_empty());
    // A store written before appends stopped updating the row: its `len`
    // column is current, its actions compacted.
    reader(&dir)
        .execute("UPDATE channels SET len = 5 WHERE uri = 'ahp-chat:/c'", [])
        .expect("an older store's row");
    assert_eq!(
        lens.get("ahp-chat:/b").map(|l| *l),
        Some(JournalPos::new(3))
    );

    let expected = [("ahp-chat:/a", 2), ("ahp-chat:/b", 3), ("ahp-chat:/c", 5)];
    let r = recovery::recover(&reader(&dir)).expect("recover");
    let found: Vec<_> = r
        .channels
        .iter()
        .map(|c| (c.info.uri.as_str(), c.len.get()))
        .collect();
    assert_eq!(found, expected);
    for (uri, len) in expected {
        let c = recovery::load_channel(&reader(&dir), uri)
            .expect("load")
            .expect("stored");
        assert_eq!(c.len, JournalPos::new(len), "{uri}");
    }
    drop(w);
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("reopen");
    for (uri, len) in expected {
        assert_eq!(j.len(&uri.into()), JournalPos::new(len), "{uri}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_journal_counts_its_commits_and_the_writes_in_them() {
    let dir = tempdir();
    let j = SqliteJournal::open(&dir, Durability::Relaxed).expect("open");
    assert_eq!(j.commit_stats(), Some(CommitStats::default()));
    j.create_channel(ChannelInfo::test_chat("ahp-chat:/a"))
        .await
        .expect("create");
    for i in 0..3 {
        j.append(
            &"ahp-chat:/a".into(),
            JournalPos::new(i),
            Batch::of(vec!["r".into()]),
        )
        .await
        .expect("append");
    }
    // One writer awaiting each write: a group each, none of them waited
    // (a channel appending again at once, right after its creation, waits
    // on us: a wait would only slow it down).
    let stats = j.commit_stats().expect("SQLite counts");
    assert_eq!(stats.writes, 4);
    assert_eq!(stats.commits, 4);
    assert_eq!(stats.waited, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One held append to `channel`.
fn held(channel: &str) -> Vec<Op> {
    vec![append_op(channel, 0, &["r"]).0]
}

/// Feed `gather` groups of one append each, `every` apart, the channel of
/// group `i` being `channel(i)`; returns the time after the last group.
fn stream(
    gather: &mut writer::Gather,
    from: std::time::Instant,
    groups: usize,
    every: Duration,
    channel: impl Fn(usize) -> String,
) -> std::time::Instant {
    let mut at = from;
    for i in 0..groups {
        gather.group_started(at);
        let (op, _answer) = append_op(&channel(i), 0, &["r"]);
        gather.group_taken(&[op], at);
        at += every;
    }
    at
}

const WINDOW: Duration = Duration::from_millis(3);

#[test]
fn a_group_waits_only_for_a_stream_of_writes_from_many_quiet_channels() {
    let start = std::time::Instant::now();
    let many = |i: usize| format!("ahp-chat:/{i}");

    // A quiet store (ten writes a second): a write commits at once.
    let mut quiet = writer::Gather::new(WINDOW);
    let at = stream(&mut quiet, start, 20, Duration::from_millis(100), many);
    assert_eq!(quiet.wait(&held("ahp-chat:/new"), at), None);

    // Two thousand writes a second, each from a channel quiet for long:
    // the window brings six more, so a lone write waits for them.
    let mut rooms = writer::Gather::new(WINDOW);
    let after = stream(&mut rooms, start, 50, Duration::from_micros(500), many);
    assert!(rooms.wait(&held("ahp-chat:/new"), after).is_some());
    // A group that already holds more writes than the window would add,
    // or enough to spread a commit's cost, commits at once.
    let twelve: Vec<Op> = (0..12)
        .map(|i| append_op(&format!("ahp-chat:/new{i}"), 0, &["r"]).0)
        .collect();
    assert_eq!(rooms.wait(&twelve, after), None);
    // A write to a channel that wrote a moment ago commits at once.
    assert_eq!(rooms.wait(&held("ahp-chat:/49"), after), None);
    // A pause longer than a few windows: the old rate is forgotten.
    let later = after + Duration::from_secs(1);
    let at = stream(&mut rooms, later, 1, Duration::from_micros(500), |_| {
        "ahp-chat:/late".into()
    });
    assert_eq!(rooms.wait(&held("ahp-chat:/new"), at), None);

    // The same rate from four channels appending again within
    // milliseconds (busy chats, writers waiting on each answer): no wait.
    let mut busy = writer::Gather::new(WINDOW);
    let at = stream(&mut busy, start, 50, Duration::from_micros(500), |i| {
        format!("ahp-chat:/{}", i % 4)
    });
    assert_eq!(busy.wait(&held("ahp-chat:/new"), at), None);

    // A zero window never waits.
    let mut off = writer::Gather::new(Duration::ZERO);
    let at = stream(&mut off, start, 50, Duration::from_micros(500), many);
    assert_eq!(off.wait(&held("ahp-chat:/new"), at), None);
}

#[test]
fn a_waiting_group_waits_as_long_as_a_few_writes_take_at_most_the_window() {
    let start = std::time::Instant::now();
    let many = |i: usize| format!("ahp-chat:/{i}");
    let window = Duration::from_millis(10);

    // Two thousand writes a second: seven more come within 3.5 ms, so a
    // lone write waits that long, not the whole window.
    let mut busy = writer::Gather::new(window);
    let at = stream(&mut busy, start, 50, Duration::from_micros(500), many);
    let wait = busy.wait(&held("ahp-chat:/new"), at).expect("waits");
    assert!(
        wait > Duration::from_micros(3_400) && wait < Duration::from_micros(3_600),
        "{wait:?}"
    );
    // Holding four, it waits for the four more that take 2 ms.
    let four: Vec<Op> = (0..4)
        .map(|i| append_op(&format!("ahp-chat:/new{i}"), 0, &["r"]).0)
        .collect();
    let wait = busy.wait(&four, at).expect("waits");
    assert!(
        wait > Duration::from_micros(1_900) && wait < Duration::from_micros(2_100),
        "{wait:?}"
    );

    // Five hundred a second (a thousand rooms, each writing every two
    // seconds): seven more would take 14 ms, so it waits the window.
    let mut rooms = writer::Gather::new(window);
    let at = stream(&mut rooms, start, 50, Duration::from_millis(2), many);
    assert_eq!(rooms.wait(&held("ahp-chat:/new"), at), Some(window));

    // Fifty a second: the window would not even double the group.
    let mut quiet = writer::Gather::new(window);
    let at = stream(&mut quiet, start, 50, Duration::from_millis(20), many);
    assert_eq!(quiet.wait(&held("ahp-chat:/new"), at), None);
}
