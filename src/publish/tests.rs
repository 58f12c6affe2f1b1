//! The publisher's numbering, ring and fan-out, one rule per test.
use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

fn conn(limit: usize) -> Arc<Outbound> {
    Arc::new(Outbound::new(limit))
}

#[test]
fn publish_assigns_increasing_seqs_and_echoes_origin_once() {
    let p = Publisher::new(ServerSeq::ZERO, 16);
    let hub = Hub::default();
    let a = conn(1 << 20);
    let b = conn(1 << 20);
    hub.add(&a);
    let ch = ChannelUri::from("ahp-chat:/x");
    let origin = ActionOrigin {
        client_id: "c".into(),
        client_seq: 1,
    };
    assert_eq!(
        p.publish(&ch, &hub, "{}", Some(&origin), Some(&a)),
        ServerSeq::new(1)
    );
    assert_eq!(
        p.publish(&ch, &hub, "{}", Some(&origin), Some(&b)),
        ServerSeq::new(2)
    );
    assert_eq!(
        a.drain_for_test().len(),
        2,
        "subscriber gets both, echo not doubled"
    );
    assert_eq!(
        b.drain_for_test().len(),
        1,
        "non-subscribed sender gets its echo"
    );
    assert_eq!(a.last_seq(), ServerSeq::new(2));
}

#[test]
fn the_ring_is_bounded_in_bytes_and_falls_back_to_snapshots() {
    let p = Publisher::with_reserver(ServerSeq::ZERO, 1000, 1000, Box::new(|next, _| Ok(next)));
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let big = format!("\"{}\"", "x".repeat(300));
    for _ in 0..10 {
        p.publish(&ch, &hub, &big, None, None);
    }
    assert!(p.ring_bytes() <= 1000, "{} bytes kept", p.ring_bytes());
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    assert!(
        matches!(
            p.replay_and_subscribe(ServerSeq::new(5), &chans, &c, usize::MAX, |_| {}),
            Replay::TooOld
        ),
        "what the byte bound dropped is answered with snapshots"
    );
    match p.replay_and_subscribe(ServerSeq::new(8), &chans, &c, usize::MAX, |_| {}) {
        Replay::Envelopes(e) => assert_eq!(e.len(), 2),
        Replay::TooOld => panic!("the newest envelopes are kept"),
    }
    let huge = format!("\"{}\"", "x".repeat(2000));
    p.publish(&ch, &hub, &huge, None, None);
    assert_eq!(p.ring_bytes(), 0, "an envelope over the bound is not kept");
    assert!(matches!(
        p.replay_and_subscribe(ServerSeq::new(10), &chans, &c, usize::MAX, |_| {}),
        Replay::TooOld
    ));
    p.publish(&ch, &hub, "{}", None, None);
    match p.replay_and_subscribe(ServerSeq::new(11), &chans, &c, usize::MAX, |_| {}) {
        Replay::Envelopes(e) => assert_eq!(e.len(), 1),
        Replay::TooOld => panic!("replay resumes after the large one"),
    }
}

/// A publisher whose store refuses reservations while `refuse` is set,
/// recording the highest reservation it granted.
fn reserving(refuse: &Arc<AtomicBool>, granted: &Arc<AtomicU64>) -> Publisher {
    let (refuse, granted) = (refuse.clone(), granted.clone());
    Publisher::with_reserver(
        ServerSeq::ZERO,
        16,
        usize::MAX,
        Box::new(move |next, count| {
            if refuse.load(Ordering::SeqCst) {
                return Err("disk full".into());
            }
            granted.fetch_max(next.get() + count - 1, Ordering::SeqCst);
            Ok(next)
        }),
    )
}

#[test]
fn a_refused_reservation_hands_out_no_number_and_stays_refused() {
    let refuse = Arc::new(AtomicBool::new(true));
    let granted = Arc::new(AtomicU64::new(0));
    let p = reserving(&refuse, &granted);
    let hub = Hub::default();
    let sub = conn(1 << 20);
    hub.add(&sub);
    let ch = ChannelUri::from("ahp-chat:/x");
    let err = p.claim(1).expect_err("nothing reserved, nothing claimed");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", false), None);
    assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", true), None);
    assert_eq!(p.current(), ServerSeq::ZERO, "no number was handed out");
    assert!(sub.drain_for_test().is_empty(), "nothing was published");
    refuse.store(false, Ordering::SeqCst);
    assert!(
        p.claim(1).is_err(),
        "writes stay stopped once a reservation failed"
    );
    assert_eq!(granted.load(Ordering::SeqCst), 0);
}

#[test]
fn claimed_numbers_are_reserved_before_they_are_used() {
    let refuse = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicU64::new(0));
    let p = reserving(&refuse, &granted);
    let hub = Hub::default();
    let ch = ChannelUri::from("ahp-chat:/x");
    p.claim(3).expect("reserved");
    let block = granted.load(Ordering::SeqCst);
    assert!(block >= 3, "the claim is covered: {block}");
    refuse.store(true, Ordering::SeqCst);
    // Numbers claimed before the store failed are still safe to use.
    for _ in 0..3 {
        let seq = p.publish(&ch, &hub, "{}", None, None);
        assert!(seq.get() <= block, "{seq} beyond the reservation {block}");
    }
    // Claims up to the reserved block need no store write...
    p.claim(block - 3).expect("inside the reserved block");
    // ...one past it does, and the store refuses.
    assert!(p.claim(1).is_err());
    p.release(block - 3);
    assert!(p.claim(1).is_err(), "released or not, writes stay stopped");
    assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", false), None);
    assert_eq!(p.current(), ServerSeq::new(3));
}

#[test]
fn replay_covers_only_what_the_ring_holds() {
    let p = Publisher::new(ServerSeq::ZERO, 3);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    for _ in 0..5 {
        p.publish(&ch, &hub, "{}", None, None);
    }
    let c = conn(1 << 20);
    let chans = vec![(ch.clone(), hub.clone())];
    assert!(matches!(
        p.replay_and_subscribe(ServerSeq::new(1), &chans, &c, usize::MAX, |_| {}),
        Replay::TooOld
    ));
    match p.replay_and_subscribe(ServerSeq::new(2), &chans, &c, usize::MAX, |_| {}) {
        Replay::Envelopes(e) => assert_eq!(e.len(), 3),
        Replay::TooOld => panic!("ring holds seqs 3..=5"),
    }
    assert!(hub.contains(c.id()));
    assert!(matches!(
        p.replay_and_subscribe(ServerSeq::new(9), &chans, &c, usize::MAX, |_| {}),
        Replay::TooOld
    ));
    match p.replay_and_subscribe(ServerSeq::new(5), &chans, &c, usize::MAX, |_| {}) {
        Replay::Envelopes(e) => assert!(e.is_empty()),
        Replay::TooOld => panic!("nothing missed"),
    }
}

/// A cluster's shared floor as the JetStream journal keeps it: a block
/// starts above the floor and above `next - 1`, and the floor moves to its
/// last number. Refuses while `refuse` is set.
fn cluster_floor(floor: &Arc<Mutex<u64>>, refuse: &Arc<AtomicBool>) -> Reserver {
    let (floor, refuse) = (floor.clone(), refuse.clone());
    Box::new(move |next, count| {
        if refuse.load(Ordering::SeqCst) {
            return Err("NATS is gone".into());
        }
        let mut f = floor.lock();
        let base = (*f).max(next.get() - 1);
        *f = base + count;
        Ok(ServerSeq::new(base + 1))
    })
}

/// A cluster node on `floor` reserving 2 spare numbers at a time (so two
/// nodes' blocks interleave), started as the server starts a cluster node.
fn cluster_node(floor: &Arc<Mutex<u64>>, refuse: &Arc<AtomicBool>, ring_len: usize) -> Publisher {
    let start = ServerSeq::new(*floor.lock());
    let p = Publisher::with_seq_block(start, ring_len, 2, cluster_floor(floor, refuse));
    p.fresh_block().expect("a first block");
    p
}

/// The `serverSeq` of each replayed envelope.
fn seqs(replay: Replay) -> Vec<u64> {
    let Replay::Envelopes(envelopes) = replay else {
        panic!("expected a replay, got snapshots");
    };
    envelopes
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).expect("an envelope");
            v["serverSeq"].as_u64().expect("serverSeq")
        })
        .collect()
}

fn too_old(replay: Replay) -> bool {
    matches!(replay, Replay::TooOld)
}

/// `p` publishes `n` actions; their numbers.
fn publish_n(p: &Publisher, ch: &ChannelUri, hub: &Hub, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| p.publish(ch, hub, "{}", None, None).get())
        .collect()
}

#[test]
fn two_nodes_on_one_floor_hand_out_increasing_numbers_no_other_node_hands_out() {
    let floor = Arc::new(Mutex::new(0));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 1000);
    let b = cluster_node(&floor, &refuse, 1000);
    let (hub, ch) = (Hub::default(), ChannelUri::from("ahp-chat:/x"));
    // Everything a client can get from each node: envelopes' numbers and
    // the current position (a snapshot's `fromSeq`), in the order given.
    let mut given: [Vec<u64>; 2] = [vec![a.current().get()], vec![b.current().get()]];
    for round in 0..30 {
        for (i, p) in [&a, &b].into_iter().enumerate() {
            given[i].extend(publish_n(p, &ch, &hub, 1 + (round + i) % 4));
            given[i].push(p.subscribe_at(&hub, &conn(1 << 20), |from| from.get()));
        }
    }
    for g in &given {
        let mut strictly = g.clone();
        strictly.dedup();
        assert!(strictly.windows(2).all(|w| w[0] < w[1]), "{strictly:?}");
    }
    let jumps = given[0].windows(2).filter(|w| w[1] > w[0] + 1).count();
    assert!(jumps > 10, "the blocks interleave: {:?}", given[0]);
    assert!(
        given[0].iter().all(|s| !given[1].contains(s)),
        "no number is handed out by both: {given:?}"
    );
}

#[test]
fn a_last_seen_handed_out_by_another_node_gets_snapshots() {
    let floor = Arc::new(Mutex::new(0));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 1000);
    let b = cluster_node(&floor, &refuse, 1000);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    let mut of_b = Vec::new();
    let mut b_from = Vec::new();
    for _ in 0..5 {
        publish_n(&a, &ch, &hub, 3);
        of_b.extend(publish_n(&b, &ch, &hub, 3));
        // b's first block after a jump: its marker is b's `fromSeq`.
        b_from.push(b.current().get());
    }
    publish_n(&a, &ch, &hub, 3);
    let (lo, hi) = (ServerSeq::ZERO, a.current());
    for s in of_b.iter().chain(&b_from) {
        let s = ServerSeq::new(*s);
        assert!(lo < s && s < hi, "{s} lies among a's numbers");
        assert!(
            too_old(a.replay_and_subscribe(s, &chans, &c, usize::MAX, |_| {})),
            "{s} is b's: a must not replay from it"
        );
    }
    let own = a.current();
    assert_eq!(
        seqs(a.replay_and_subscribe(own, &chans, &c, usize::MAX, |_| {})),
        Vec::<u64>::new(),
        "a's own current position replays nothing"
    );
}

#[test]
fn a_node_replays_exactly_what_it_published_after_its_own_number_from_before_a_jump() {
    let floor = Arc::new(Mutex::new(0));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 1000);
    let b = cluster_node(&floor, &refuse, 1000);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    let first = publish_n(&a, &ch, &hub, 2);
    let before_jump = a.current();
    publish_n(&b, &ch, &hub, 4);
    let after = publish_n(&a, &ch, &hub, 6);
    assert!(
        after[0] > before_jump.get() + 1,
        "a jumped over b's numbers: {first:?} then {after:?}"
    );
    assert_eq!(
        seqs(a.replay_and_subscribe(before_jump, &chans, &c, usize::MAX, |_| {})),
        after
    );
    let mut expected = first[1..].to_vec();
    expected.extend(&after);
    assert_eq!(
        seqs(a.replay_and_subscribe(ServerSeq::new(first[0]), &chans, &c, usize::MAX, |_| {})),
        expected
    );
}

#[test]
fn a_number_from_before_a_jump_is_replayed_only_while_the_ring_holds_what_followed() {
    let floor = Arc::new(Mutex::new(0));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 3);
    let b = cluster_node(&floor, &refuse, 3);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    let first = publish_n(&a, &ch, &hub, 2);
    publish_n(&b, &ch, &hub, 4);
    let after = publish_n(&a, &ch, &hub, 3);
    // The ring holds `after`: the last number before the jump is still
    // served, the one before it (its successor was evicted) is not.
    assert_eq!(
        seqs(a.replay_and_subscribe(ServerSeq::new(first[1]), &chans, &c, usize::MAX, |_| {})),
        after
    );
    assert!(too_old(a.replay_and_subscribe(
        ServerSeq::new(first[0]),
        &chans,
        &c,
        usize::MAX,
        |_| {}
    )));
    publish_n(&a, &ch, &hub, 1);
    assert!(too_old(a.replay_and_subscribe(
        ServerSeq::new(first[1]),
        &chans,
        &c,
        usize::MAX,
        |_| {}
    )));
}

#[test]
fn a_cluster_node_does_not_start_at_the_shared_floor() {
    // Another node handed out numbers up to 10 and stopped there.
    let floor = Arc::new(Mutex::new(10));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 16);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    let from = a.subscribe_at(&hub, &c, |from| from);
    assert!(from > ServerSeq::new(10), "first fromSeq {from}");
    assert!(
        too_old(a.replay_and_subscribe(ServerSeq::new(10), &chans, &c, usize::MAX, |_| {})),
        "the floor is another node's number"
    );
    assert_eq!(
        seqs(a.replay_and_subscribe(from, &chans, &c, usize::MAX, |_| {})),
        Vec::<u64>::new()
    );
    let published = publish_n(&a, &ch, &hub, 2);
    assert_eq!(
        seqs(a.replay_and_subscribe(from, &chans, &c, usize::MAX, |_| {})),
        published
    );
}

#[test]
fn a_single_node_restart_replays_nothing_from_its_start() {
    let p = Publisher::new(ServerSeq::new(7), 16);
    let hub = Arc::new(Hub::default());
    let ch = ChannelUri::from("ahp-chat:/x");
    let chans = vec![(ch.clone(), hub.clone())];
    let c = conn(1 << 20);
    assert_eq!(p.current(), ServerSeq::new(7));
    assert_eq!(
        seqs(p.replay_and_subscribe(ServerSeq::new(7), &chans, &c, usize::MAX, |_| {})),
        Vec::<u64>::new()
    );
    assert_eq!(publish_n(&p, &ch, &hub, 2), vec![8, 9], "contiguous");
}

#[test]
fn claimed_numbers_stay_reserved_across_a_jump() {
    let floor = Arc::new(Mutex::new(0));
    let refuse = Arc::new(AtomicBool::new(false));
    let a = cluster_node(&floor, &refuse, 16);
    let b = cluster_node(&floor, &refuse, 16);
    let (hub, ch) = (Hub::default(), ChannelUri::from("ahp-chat:/x"));
    a.claim(2).expect("inside a's first block");
    let b_numbers = publish_n(&b, &ch, &hub, 1);
    let before = a.current();
    // Past a's block: the new one is above b's, and covers all five claims.
    a.claim(3).expect("a new block");
    let a_block_end = *floor.lock();
    refuse.store(true, Ordering::SeqCst);
    let used = publish_n(&a, &ch, &hub, 5);
    assert!(used[0] > before.get() + 1, "a jumped: {used:?}");
    assert!(used.windows(2).all(|w| w[0] < w[1]), "{used:?}");
    assert!(
        used.iter()
            .all(|s| *s <= a_block_end && !b_numbers.contains(s) && *s > b_numbers[0]),
        "claimed numbers come from a's own block: {used:?}, b {b_numbers:?}"
    );
    // Released claims are given back; nothing unclaimed is handed out while
    // the store refuses.
    a.claim(2).expect("inside the new block");
    a.release(2);
    assert!(a.publish_unjournaled(&ch, &hub, "{}", false).is_some());
    assert!(a.current().get() <= a_block_end);
}

/// A connection and the socket it writes to.
type Wired = (Arc<Outbound>, Arc<outbound::tests::FakeWire>);

/// A room of `n` connections, each writing to a socket that takes everything.
fn wired_room(n: usize) -> (Hub, Vec<Wired>) {
    let hub = Hub::default();
    let conns = (0..n)
        .map(|_| {
            let wire = outbound::tests::FakeWire::with_room(usize::MAX);
            let o = conn(1 << 20);
            o.attach(wire.clone(), std::time::Duration::ZERO);
            hub.add(&o);
            (o, wire)
        })
        .collect();
    (hub, conns)
}

fn written_seqs(wire: &outbound::tests::FakeWire) -> Vec<u64> {
    wire.texts()
        .iter()
        .map(|t| {
            let v: serde_json::Value = serde_json::from_str(t).unwrap();
            v["params"]["serverSeq"].as_u64().unwrap()
        })
        .collect()
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while conns.iter().any(|(_, w)| written_seqs(w).len() < 20) {
        assert!(
            std::time::Instant::now() < deadline,
            "every connection gets all 20 envelopes"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let own = fanout::shares(n, 1)[0].clone();
    assert_eq!(own, 0..n / 2, "two shares, the publisher's first");
    let me = std::thread::current().id();
    for (i, (_, wire)) in conns.iter().enumerate() {
        assert_eq!(
            written_seqs(wire),
            (1..=20).collect::<Vec<_>>(),
            "connection {i}: every envelope once, in serverSeq order"
        );
        let writers = wire.writers();
        if own.contains(&i) {
            assert!(
                writers.iter().all(|t| *t == me),
                "connection {i}: written by the publisher"
            );
        } else {
            assert!(
                writers.iter().all(|t| *t != me),
                "connection {i}: written by the fan-out thread"
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for i in 1..=6 {
        p.publish(&ch, &hub, &i.to_string(), None, None);
        while conns.iter().any(|(_, w)| written_seqs(w).len() < i) {
            assert!(std::time::Instant::now() < deadline, "envelope {i} written");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let me = std::thread::current().id();
    let helper_share = fanout::shares(n, 3)[1].clone();
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
    use fanout::shares;
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

impl outbound::Wire for LoggedWire {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        self.log.lock().push(self.id);
        Ok(buf.len())
    }
}

#[test]
fn the_authors_echo_is_written_before_the_room() {
    let p = Publisher::new(ServerSeq::ZERO, 16);
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
    let room: Vec<_> = (1..=4).map(wired).collect();
    for o in &room {
        hub.add(o);
    }
    let outsider = wired(0);
    let ch = ChannelUri::from("ahp-chat:/x");
    let origin = ActionOrigin {
        client_id: "c".into(),
        client_seq: 1,
    };
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
