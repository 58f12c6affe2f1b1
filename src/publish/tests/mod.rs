//! The publisher's numbering and ring, one rule per test (writing a room:
//! `room`).
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

/// The frame a subscriber gets and the envelope a replay returns are what
/// `serde_json` writes for the protocol's own `ActionEnvelope`, byte for
/// byte: with and without an origin, with characters that need escaping in
/// the channel and the client id and with ones that do not, at the
/// extremes of the numbers. The frame's buffer is sized exactly, whether
/// or not its strings were escaped: it keeps only the digits its number
/// does not use.
#[test]
fn a_published_frame_is_the_envelope_serde_writes() {
    use ahp_types::actions::{ActionEnvelope, StateAction};
    let action_json = r#"{"type":"chat/isReadChanged","isRead":true}"#;
    let action: StateAction = serde_json::from_str(action_json).unwrap();
    let origin = |id: &str, seq: i64| ActionOrigin {
        client_id: id.into(),
        client_seq: seq,
    };
    let cases = [
        ("ahp-chat:s/c", None, 1),
        ("ahp-chat:s/c", Some(origin("client-1", 7)), 42),
        ("ahp-root://", Some(origin("", -1)), u64::MAX),
        ("ahp-chat:ü/\u{7f}", Some(origin("ü\u{7f}é", 3)), 5),
        (
            "ahp-chat:\"quoted\"\\/\u{1}é",
            Some(origin("a\"b\\c\n\u{7f}ü", i64::MIN)),
            0,
        ),
        ("", Some(origin(&"\u{1}".repeat(40), i64::MAX)), 10),
    ];
    let expected = |channel: &str, origin: Option<ActionOrigin>, seq: u64| {
        serde_json::to_string(&ActionEnvelope {
            channel: channel.into(),
            action: action.clone(),
            server_seq: seq,
            origin,
            rejection_reason: None,
        })
        .unwrap()
    };
    let frame_of =
        |envelope: &str| format!(r#"{{"jsonrpc":"2.0","method":"action","params":{envelope}}}"#);
    for (channel, origin, seq) in cases.clone() {
        let unnumbered = Unnumbered::new(channel, action_json, origin.as_ref());
        assert_eq!(
            unnumbered.frame.capacity() - unnumbered.frame.len(),
            Unnumbered::SEQ_DIGITS + Unnumbered::END.len(),
            "sized for the number and the closing braces, nothing more"
        );
        let envelope = unnumbered.finish(ServerSeq::new(seq));
        let want = expected(channel, origin, seq);
        assert_eq!(&*envelope, want);
        assert_eq!(&**envelope.frame(), frame_of(&want));
    }

    // Through the publisher: what a subscriber is sent, and what a
    // reconnect from before it is replayed.
    let p = Publisher::new(ServerSeq::ZERO, 16);
    let hub = Arc::new(Hub::default());
    let sub = conn(1 << 20);
    hub.add(&sub);
    let mut sent = Vec::new();
    for (channel, origin, _) in &cases {
        let ch = ChannelUri::from(*channel);
        let seq = p.publish(&ch, &hub, action_json, origin.as_ref(), None);
        sent.push(expected(channel, origin.clone(), seq.get()));
    }
    let frames: Vec<String> = sub.drain_for_test().iter().map(|f| f.to_string()).collect();
    assert_eq!(frames, sent.iter().map(|e| frame_of(e)).collect::<Vec<_>>());
    let chans: Vec<(ChannelUri, Arc<Hub>)> = cases
        .iter()
        .map(|(c, _, _)| (ChannelUri::from(*c), hub.clone()))
        .collect();
    let Replay::Envelopes(replayed) =
        p.replay_and_subscribe(ServerSeq::ZERO, &chans, &conn(1 << 20), usize::MAX, |_| {})
    else {
        panic!("the ring holds every envelope");
    };
    let replayed: Vec<&str> = replayed.iter().map(|e| &**e).collect();
    assert_eq!(replayed, sent);
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

mod room;
