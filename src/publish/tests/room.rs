//! Writing a room: the publisher's and the helpers' shares, each
//! connection's order, and the author's echo first.
use super::*;
use crate::transport::{fanout_shares, FakeWire, Wire, FANOUT_MAX_BACKLOG, FANOUT_MIN_SHARE};

/// A connection and the socket it writes to.
type Wired = (Arc<Outbound>, Arc<FakeWire>);

/// A room of `n` connections, each writing to a socket that takes everything.
fn wired_room(n: usize) -> (Hub, Vec<Wired>) {
    let hub = Hub::default();
    let conns = (0..n)
        .map(|_| {
            let wire = FakeWire::with_room(usize::MAX);
            let o = conn(1 << 20);
            o.attach(wire.clone(), std::time::Duration::ZERO);
            hub.add(&o);
            (o, wire)
        })
        .collect();
    (hub, conns)
}

fn written_seqs(wire: &FakeWire) -> Vec<u64> {
    wire.texts()
        .iter()
        .map(|t| {
            let v: serde_json::Value = serde_json::from_str(t).unwrap();
            v["params"]["serverSeq"].as_u64().unwrap()
        })
        .collect()
}

/// Wait until `done` holds; fail with `what` after twenty seconds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        // A poll of the condition, not a wait standing in for it: the
        // helper threads write and count their backlog on their own and
        // signal nobody, and a verdict is given only once `done` holds.
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether every connection of the room has had `n` envelopes written.
fn all_written(conns: &[Wired], n: usize) -> bool {
    conns.iter().all(|(_, w)| written_seqs(w).len() >= n)
}

#[test]
fn a_big_room_is_written_by_the_publisher_and_a_fanout_thread_each_connection_in_order() {
    let p = Publisher::new(ServerSeq::ZERO, 16).with_fanout(1, true);
    assert_eq!(p.fanout_threads(), 1);
    let n = 2 * FANOUT_MIN_SHARE + 10;
    let (hub, conns) = wired_room(n);
    let ch = ChannelUri::from("ahp-chat:/x");
    for i in 0..20 {
        p.publish(&ch, &hub, &i.to_string(), None, None);
    }
    wait_until("every connection gets all 20 envelopes", || {
        all_written(&conns, 20)
    });
    let own = fanout_shares(n, 1)[0].clone();
    assert_eq!(own, 0..n / 2, "two shares, the publisher's first");
    let me = std::thread::current().id();
    for (i, (_, wire)) in conns.iter().enumerate() {
        assert_eq!(
            written_seqs(wire),
            (1..=20).collect::<Vec<_>>(),
            "connection {i}: every envelope once, in serverSeq order"
        );
        // The publisher's share is its own. The helper's share may be
        // written by both: twenty publishes in a row outrun one helper, and
        // past its backlog bound the publisher writes that share too (a
        // later flush may find the helper's frames already written); the
        // order above holds either way. Which thread writes when is
        // `a_helper_with_a_full_backlog_leaves_its_share_to_the_publisher`.
        if own.contains(&i) {
            assert!(
                wire.writers().iter().all(|t| *t == me),
                "connection {i}: written by the publisher"
            );
        }
    }
}

#[test]
fn rooms_that_need_fewer_helpers_than_there_are_take_turns_among_them() {
    let p = Publisher::new(ServerSeq::ZERO, 16).with_fanout(3, true);
    // Two shares: the publisher's and one helper's.
    let n = 2 * FANOUT_MIN_SHARE;
    let (hub, conns) = wired_room(n);
    let ch = ChannelUri::from("ahp-chat:/x");
    for i in 1..=6 {
        p.publish(&ch, &hub, &i.to_string(), None, None);
        wait_until(&format!("envelope {i} written"), || all_written(&conns, i));
    }
    let me = std::thread::current().id();
    let helper_share = fanout_shares(n, 3)[1].clone();
    for i in helper_share {
        let writers = conns[i].1.writers();
        assert_eq!(writers.len(), 6, "connection {i}: one write per envelope");
        assert!(
            writers.iter().all(|t| *t != me),
            "connection {i}: by helpers"
        );
        let distinct: std::collections::HashSet<_> = writers.iter().collect();
        assert_eq!(
            distinct.len(),
            3,
            "connection {i}: every helper took a turn"
        );
        assert_eq!(
            writers[..3],
            writers[3..],
            "connection {i}: the helpers in turn, round and round"
        );
    }
}

#[test]
fn a_room_under_two_shares_is_written_at_once_by_the_publisher() {
    let p = Publisher::new(ServerSeq::ZERO, 16).with_fanout(3, true);
    let (hub, conns) = wired_room(2 * FANOUT_MIN_SHARE - 1);
    let ch = ChannelUri::from("ahp-chat:/x");
    p.publish(&ch, &hub, "{}", None, None);
    let me = std::thread::current().id();
    for (_, wire) in &conns {
        // No waiting: written before `publish` returned, on this thread.
        assert_eq!(written_seqs(wire), vec![1]);
        assert_eq!(wire.writers(), vec![me]);
    }
}

#[test]
fn rooms_are_cut_into_shares_of_at_least_the_minimum_one_per_thread_at_most() {
    let shares = fanout_shares;
    let m = FANOUT_MIN_SHARE;
    assert!(shares(0, 3).is_empty());
    assert_eq!(shares(2 * m - 1, 1), vec![0..2 * m - 1]);
    assert_eq!(shares(2 * m, 1), vec![0..m, m..2 * m]);
    assert_eq!(shares(10 * m, 0), vec![0..10 * m], "no helpers: one share");
    // Three shares fit in 3.5 minimums, so a fourth thread is left out.
    let s = shares(7 * m / 2, 3);
    assert_eq!(s.len(), 3);
    assert_eq!(s.iter().map(|r| r.len()).sum::<usize>(), 7 * m / 2);
    assert!(s.iter().all(|r| r.len() >= m));
    assert!(s.windows(2).all(|w| w[0].end == w[1].start), "contiguous");
    assert_eq!(
        shares(100 * m, 3).len(),
        4,
        "one per helper and one for the caller"
    );
}

/// A socket that logs, in one list shared by a room, which connection
/// wrote when.
struct LoggedWire {
    id: usize,
    log: Arc<Mutex<Vec<usize>>>,
}

impl Wire for LoggedWire {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        self.log.lock().push(self.id);
        Ok(buf.len())
    }
}

/// A room of `n` connections numbered 1..=n and an outsider numbered 0,
/// all on [`LoggedWire`]s sharing one log.
struct LoggedRoom {
    hub: Hub,
    room: Vec<Arc<Outbound>>,
    outsider: Arc<Outbound>,
    log: Arc<Mutex<Vec<usize>>>,
}

fn logged_room(n: usize) -> LoggedRoom {
    let hub = Hub::default();
    let log = Arc::new(Mutex::new(Vec::new()));
    let wired = |id: usize| {
        let o = conn(1 << 20);
        let wire = Arc::new(LoggedWire {
            id,
            log: log.clone(),
        });
        o.attach(wire, std::time::Duration::ZERO);
        o
    };
    let room: Vec<_> = (1..=n).map(wired).collect();
    for o in &room {
        hub.add(o);
    }
    let outsider = wired(0);
    LoggedRoom {
        hub,
        room,
        outsider,
        log,
    }
}

fn an_origin() -> ActionOrigin {
    ActionOrigin {
        client_id: "c".into(),
        client_seq: 1,
    }
}

#[test]
fn the_authors_echo_is_written_before_the_room() {
    let p = Publisher::new(ServerSeq::ZERO, 16);
    let LoggedRoom {
        hub,
        room,
        outsider,
        log,
    } = logged_room(4);
    let ch = ChannelUri::from("ahp-chat:/x");
    let origin = an_origin();
    p.publish(&ch, &hub, "{}", Some(&origin), Some(&outsider));
    assert_eq!(
        *log.lock(),
        vec![0, 1, 2, 3, 4],
        "an author outside the room: its echo, then the room in order"
    );
    log.lock().clear();
    // The last subscriber writes: its echo still leaves first, once.
    p.publish(&ch, &hub, "{}", Some(&origin), Some(&room[3]));
    assert_eq!(*log.lock(), vec![4, 1, 2, 3]);
}

#[test]
fn in_a_big_room_the_authors_echo_leads_the_first_batch() {
    let p = Publisher::new(ServerSeq::ZERO, 16).with_fanout(0, false);
    let n = FANOUT_MIN_SHARE + 44;
    let LoggedRoom {
        hub,
        room,
        outsider,
        log,
    } = logged_room(n);
    let ch = ChannelUri::from("ahp-chat:/x");
    let origin = an_origin();
    p.publish(&ch, &hub, "{}", Some(&origin), Some(&outsider));
    assert_eq!(*log.lock(), (0..=n).collect::<Vec<_>>());
    // An author inside the room, in the first batch and past it: its echo
    // first, once, then everyone else in order.
    for author in [3, 200] {
        log.lock().clear();
        p.publish(&ch, &hub, "{}", Some(&origin), Some(&room[author - 1]));
        let mut expected = vec![author];
        expected.extend((1..=n).filter(|&i| i != author));
        assert_eq!(*log.lock(), expected, "author {author}");
    }
}

#[test]
fn a_helper_with_a_full_backlog_leaves_its_share_to_the_publisher() {
    let p = Publisher::new(ServerSeq::ZERO, 16).with_fanout(1, false);
    let n = 2 * FANOUT_MIN_SHARE;
    let (hub, conns) = wired_room(n);
    let ch = ChannelUri::from("ahp-chat:/x");
    let me = std::thread::current().id();
    let helper_share = fanout_shares(n, 1)[1].clone();
    // Envelope `i` written everywhere and the helper's backlog at `left`.
    let settle = |i: usize, left: usize| {
        wait_until(&format!("envelope {i} written"), || {
            all_written(&conns, i) && p.fanout.backlog() == [left]
        })
    };
    let last_writer = |i: usize| *conns[i].1.writers().last().expect("written");

    // An idle helper takes its share, and its backlog is back to none.
    p.publish(&ch, &hub, "1", None, None);
    settle(1, 0);
    assert!(helper_share.clone().all(|i| last_writer(i) != me));

    // A helper with MAX_BACKLOG shares waiting gets no more: its share is
    // written by the publisher before `publish` returns, in order.
    p.fanout.set_backlog(0, FANOUT_MAX_BACKLOG);
    p.publish(&ch, &hub, "2", None, None);
    for (i, (_, wire)) in conns.iter().enumerate() {
        assert_eq!(written_seqs(wire), vec![1, 2], "connection {i}");
        assert_eq!(last_writer(i), me, "connection {i}: by the publisher");
    }
    assert_eq!(
        p.fanout.backlog(),
        vec![FANOUT_MAX_BACKLOG],
        "nothing queued"
    );

    // One below the bound, the helper takes its share again.
    p.fanout.set_backlog(0, FANOUT_MAX_BACKLOG - 1);
    p.publish(&ch, &hub, "3", None, None);
    settle(3, FANOUT_MAX_BACKLOG - 1);
    assert!(helper_share.clone().all(|i| last_writer(i) != me));
    p.fanout.set_backlog(0, 0);
    p.publish(&ch, &hub, "4", None, None);
    settle(4, 0);
}
