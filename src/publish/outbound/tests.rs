use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Wake;

use actix_http::ws::{OpCode, Parser};
use bytes::BytesMut;

use super::*;

/// Counts its wake-ups.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Wake for Counter {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn texts(taken: &Taken) -> Vec<String> {
    taken
        .frames
        .iter()
        .map(|f| match f {
            Frame::Text { data, .. } => data.to_string(),
            Frame::Ping => "<ping>".into(),
            Frame::Pong(p) => format!("<pong {}>", String::from_utf8_lossy(p)),
        })
        .collect()
}

fn take(o: &Outbound) -> Option<Taken> {
    let waker = Arc::new(Counter::default()).into();
    match o.poll_take(&mut Context::from_waker(&waker), false) {
        Take::Ready(t) => Some(t),
        Take::Empty | Take::Paced => None,
    }
}

#[test]
fn overflow_drops_the_queue_and_closes() {
    let o = Outbound::new(10);
    o.push(Push::Notification("12345".into()));
    o.push(Push::Notification("12345".into()));
    assert!(!o.is_closing());
    assert_eq!(o.queued_bytes(), 10);
    o.push(Push::Notification("x".into()));
    assert!(o.is_closing());
    let t = take(&o).expect("the close is ready");
    assert!(t.frames.is_empty(), "an evicted queue is dropped");
    assert_eq!(t.close, Some(CloseCause::Overflow));
    o.push(Push::Response("late".into()));
    assert!(take(&o).unwrap().frames.is_empty(), "nothing after a close");
}

#[test]
fn taking_frees_the_budget() {
    let o = Outbound::new(10);
    o.push(Push::Notification("12345".into()));
    o.push(Push::Notification("12345".into()));
    assert_eq!(texts(&take(&o).unwrap()), ["12345", "12345"]);
    assert_eq!(o.queued_bytes(), 0);
    o.push(Push::Notification("1234567890".into()));
    assert!(!o.is_closing());
}

#[test]
fn gate_puts_the_reply_before_held_frames() {
    let o = Outbound::new(1000);
    o.push(Push::Notification("a".into()));
    o.gate();
    o.push(Push::Envelope(ServerSeq::new(5), "env".into()));
    assert_eq!(texts(&take(&o).unwrap()), ["a"], "held frames wait");
    assert_eq!(o.queued_bytes(), 3, "held frames stay counted");
    o.ungate_with(Some("reply".into()));
    assert_eq!(texts(&take(&o).unwrap()), ["reply", "env"]);
    assert_eq!(o.last_seq(), ServerSeq::new(5));
}

#[test]
fn a_reply_may_pass_the_limit_once_and_a_second_one_evicts() {
    let o = Outbound::new(10);
    o.gate();
    o.push(Push::Envelope(ServerSeq::new(1), "12345".into()));
    o.ungate_with(Some("a reply far larger than ten bytes".into()));
    assert!(!o.is_closing(), "one large reply never evicts");
    assert_eq!(o.queued_bytes(), 5 + 33, "the reply is counted");
    o.push(Push::Envelope(ServerSeq::new(2), "12345".into()));
    assert!(
        !o.is_closing(),
        "envelopes have their own budget while a reply drains"
    );
    o.gate();
    o.ungate_with(Some("another long reply".into()));
    assert!(o.is_closing(), "asking again without reading evicts");
    let t = take(&o).expect("the close is ready");
    assert!(t.frames.is_empty());
    assert_eq!(t.close, Some(CloseCause::Overflow));
}

#[test]
fn taking_a_reply_frees_its_budget() {
    let o = Outbound::new(10);
    o.gate();
    o.ungate_with(Some("a reply far larger than ten bytes".into()));
    assert_eq!(
        texts(&take(&o).unwrap()),
        ["a reply far larger than ten bytes"]
    );
    assert_eq!(o.queued_bytes(), 0);
    o.gate();
    o.ungate_with(Some("another long reply".into()));
    assert!(!o.is_closing(), "a client that reads may ask again");
}

#[test]
fn pongs_count_against_the_limit() {
    let o = Outbound::new(10);
    o.push(Push::Pong(Bytes::from_static(b"123456")));
    assert!(!o.is_closing());
    o.push(Push::Pong(Bytes::from_static(b"123456")));
    assert!(
        o.is_closing(),
        "a client that pings and never reads is evicted"
    );
}

#[test]
fn frames_queued_before_a_close_are_taken_with_it() {
    let o = Outbound::new(1000);
    o.push(Push::Notification("a".into()));
    o.push(Push::Pong(Bytes::from_static(b"p")));
    o.close(CloseCause::Shutdown);
    o.close(CloseCause::Normal);
    let t = take(&o).unwrap();
    assert_eq!(texts(&t), ["a", "<pong p>"]);
    assert_eq!(t.close, Some(CloseCause::Shutdown), "the first cause wins");
}

#[test]
fn one_wake_per_batch() {
    let o = Outbound::new(1000);
    let counter = Arc::new(Counter::default());
    let waker = counter.clone().into();
    let mut cx = Context::from_waker(&waker);
    assert!(matches!(o.poll_take(&mut cx, false), Take::Empty));
    for i in 0..10 {
        o.push(Push::Envelope(ServerSeq::new(i), "e".into()));
    }
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "pushes before the next take wake once"
    );
    match o.poll_take(&mut cx, false) {
        Take::Ready(t) => assert_eq!(t.frames.len(), 10),
        other => panic!("frames are queued: {other:?}"),
    }
    assert!(matches!(o.poll_take(&mut cx, false), Take::Empty));
    o.push(Push::Notification("n".into()));
    assert_eq!(counter.0.load(Ordering::SeqCst), 2);
}

#[test]
fn paced_frames_wait_for_the_deadline_but_urgent_ones_do_not() {
    let o = Outbound::new(1000);
    let counter = Arc::new(Counter::default());
    let waker = counter.clone().into();
    let mut cx = Context::from_waker(&waker);
    let wakes = || counter.0.load(Ordering::SeqCst);
    assert!(matches!(o.poll_take(&mut cx, false), Take::Empty));
    o.push(Push::Envelope(ServerSeq::new(1), "e1".into()));
    assert_eq!(
        wakes(),
        1,
        "without pacing the first frame wakes the socket"
    );
    assert!(matches!(o.poll_take(&mut cx, true), Take::Paced));
    o.push(Push::Envelope(ServerSeq::new(2), "e2".into()));
    o.push(Push::Notification("n".into()));
    assert_eq!(wakes(), 1, "pushed frames wait for the deadline quietly");
    o.push(Push::Response("r".into()));
    assert_eq!(wakes(), 2, "a reply wakes at once");
    match o.poll_take(&mut cx, true) {
        Take::Ready(t) => assert_eq!(texts(&t), ["e1", "e2", "n", "r"]),
        other => panic!("the reply is urgent: {other:?}"),
    }
    // Pacing with nothing queued: a pushed frame does not wake either.
    assert!(matches!(o.poll_take(&mut cx, true), Take::Empty));
    o.push(Push::Envelope(ServerSeq::new(3), "e3".into()));
    assert_eq!(wakes(), 2);
    assert!(matches!(o.poll_take(&mut cx, true), Take::Paced));
    match o.poll_take(&mut cx, false) {
        Take::Ready(t) => assert_eq!(texts(&t), ["e3"]),
        other => panic!("{other:?}"),
    }
    // So are a response and the echo of the connection's own action.
    o.push(Push::Envelope(ServerSeq::new(5), "e5".into()));
    assert!(matches!(o.poll_take(&mut cx, true), Take::Paced));
    o.push(Push::Echo(ServerSeq::new(6), "echo".into()));
    match o.poll_take(&mut cx, true) {
        Take::Ready(t) => assert_eq!(texts(&t), ["e5", "echo"]),
        other => panic!("{other:?}"),
    }
    o.push(Push::Response("resp".into()));
    assert!(matches!(o.poll_take(&mut cx, true), Take::Ready(_)));
    // A close is urgent too.
    o.push(Push::Envelope(ServerSeq::new(4), "e4".into()));
    assert!(matches!(o.poll_take(&mut cx, true), Take::Paced));
    o.close(CloseCause::Shutdown);
    match o.poll_take(&mut cx, true) {
        Take::Ready(t) => {
            assert_eq!(texts(&t), ["e4"]);
            assert_eq!(t.close, Some(CloseCause::Shutdown));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn heartbeat_pings_a_slow_reader_without_evicting_it() {
    let o = Outbound::new(1000);
    for _ in 0..10 {
        assert_eq!(o.beat(60_000, 3, 20_000), Beat::Pinged);
    }
    assert!(!o.is_closing(), "taking nothing for a while is not a fault");
    assert_eq!(
        texts(&take(&o).unwrap()),
        ["<ping>"],
        "pings do not pile up"
    );
}

#[test]
fn a_backlog_is_taken_in_budgeted_pieces_and_stays_counted() {
    let o = Outbound::new(1 << 20);
    let frame = ByteString::from("x".repeat(10_000));
    for i in 0..20 {
        o.push(Push::Envelope(ServerSeq::new(i), frame.clone()));
    }
    o.push(Push::Response("reply".into()));
    o.close(CloseCause::Shutdown);
    let first = take(&o).unwrap();
    assert_eq!(first.frames.len(), TAKE_BUDGET / 10_000);
    assert!(first.more);
    assert_eq!(
        first.close, None,
        "the close waits for the frames before it"
    );
    assert_eq!(o.queued_bytes(), (20 - first.frames.len()) * 10_000 + 5);
    let mut rest = Vec::new();
    loop {
        let t = take(&o).unwrap();
        rest.extend(texts(&t));
        if !t.more {
            assert_eq!(t.close, Some(CloseCause::Shutdown));
            break;
        }
    }
    assert_eq!(rest.len(), 20 - first.frames.len() + 1);
    assert_eq!(rest.last().map(String::as_str), Some("reply"));
    assert_eq!(o.queued_bytes(), 0);
    // A frame bigger than the budget still goes, alone.
    let o = Outbound::new(1 << 20);
    o.push(Push::Notification(ByteString::from(
        "y".repeat(TAKE_BUDGET * 2),
    )));
    o.push(Push::Notification("z".into()));
    let t = take(&o).unwrap();
    assert_eq!(t.frames.len(), 1);
    assert!(t.more);
}

#[test]
fn a_close_the_socket_cannot_reach_abandons_the_connection_once() {
    let o = Outbound::new(1 << 20);
    let abandoned = Arc::new(AtomicUsize::new(0));
    let a = abandoned.clone();
    o.set_on_abandon(move || {
        a.fetch_add(1, Ordering::SeqCst);
    });
    for i in 0..60 {
        o.push(Push::Envelope(
            ServerSeq::new(i),
            ByteString::from("x".repeat(10_000)),
        ));
    }
    o.close(CloseCause::Shutdown);
    // The peer drains steadily: never abandoned, however long it takes.
    for _ in 0..6 {
        assert!(take(&o).unwrap().more);
        assert_eq!(o.beat(60_000, 3, 20_000), Beat::Closing);
    }
    // It stops: the third beat in a row without a take lets go, once.
    let beats: Vec<Beat> = (0..6).map(|_| o.beat(60_000, 3, 20_000)).collect();
    assert_eq!(
        beats,
        [
            Beat::Closing,
            Beat::Closing,
            Beat::Abandoned,
            Beat::Closing,
            Beat::Closing,
            Beat::Closing
        ]
    );
    assert_eq!(abandoned.load(Ordering::SeqCst), 1);
}

#[test]
fn a_ping_goes_ahead_of_a_backlog_once() {
    let o = Outbound::new(1 << 20);
    for i in 0..3 {
        o.push(Push::Envelope(
            ServerSeq::new(i),
            ByteString::from(format!("e{i}")),
        ));
    }
    assert_eq!(o.beat(60_000, 3, 20_000), Beat::Pinged);
    assert_eq!(o.beat(60_000, 3, 20_000), Beat::Pinged);
    assert_eq!(texts(&take(&o).unwrap()), ["<ping>", "e0", "e1", "e2"]);
}

#[test]
fn a_close_while_gated_drops_the_held_frames() {
    let o = Outbound::new(1000);
    o.push(Push::Notification("before".into()));
    o.gate();
    o.push(Push::Envelope(
        ServerSeq::new(1),
        "after the snapshot".into(),
    ));
    o.close(CloseCause::Shutdown);
    assert_eq!(o.queued_bytes(), 6);
    o.ungate_with(Some("reply".into()));
    let t = take(&o).unwrap();
    assert_eq!(texts(&t), ["before"], "no envelope without its reply");
    assert_eq!(t.close, Some(CloseCause::Shutdown));
}

#[test]
fn a_rejection_carries_the_last_seq_and_a_pong_is_never_held() {
    let o = Outbound::new(1000);
    o.push(Push::Envelope(ServerSeq::new(7), "e7".into()));
    o.gate();
    o.push(Push::Pong(Bytes::from_static(b"p")));
    o.push(Push::AfterLastSeq(&|last| {
        format!("rejected after {last}").into()
    }));
    assert_eq!(
        texts(&take(&o).unwrap()),
        ["e7", "<pong p>"],
        "a pong answers at once; a response waits for the gated reply"
    );
    o.ungate_with(Some("reply".into()));
    assert_eq!(texts(&take(&o).unwrap()), ["reply", "rejected after 7"]);
}

#[test]
fn heartbeat_closes_an_idle_client() {
    let o = Outbound::new(1000);
    o.last_rx_ms.store(now_ms() - 5_000, Ordering::Relaxed);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    o.received();
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    o.last_rx_ms.store(now_ms() - 11_000, Ordering::Relaxed);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Idle);
    let close = take(&o).unwrap().close;
    assert!(
        matches!(&close, Some(CloseCause::Protocol(m)) if m.starts_with("idle for")),
        "{close:?}"
    );
}

#[test]
fn heartbeat_does_not_ping_a_client_whose_tcp_acknowledged_what_it_was_sent() {
    let o = Outbound::new(1 << 20);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    o.last_rx_ms.store(now_ms() - 9_000, Ordering::Relaxed);
    o.push(Push::Envelope(ServerSeq::new(1), "e1".into()));
    wire.ack_age_ms.store(100, Ordering::SeqCst);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Acknowledged);
    assert_eq!(wire.texts(), ["e1"], "no ping");
    // The acknowledgement counts as a sign of life.
    assert!(now_ms() - o.last_rx_ms.load(Ordering::Relaxed) < 1_000);

    // Nothing sent since the last beat: an old acknowledgement says
    // nothing, so the client is pinged and must answer.
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    take(&o);
    // Sent, but the last acknowledgement is older than the interval.
    o.push(Push::Envelope(ServerSeq::new(2), "e2".into()));
    wire.ack_age_ms.store(6_000, Ordering::SeqCst);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    take(&o);
    // A socket that cannot tell: pinged.
    o.push(Push::Envelope(ServerSeq::new(3), "e3".into()));
    wire.ack_age_ms.store(u64::MAX, Ordering::SeqCst);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    take(&o);
    // Only pings and no answer: idle as before.
    o.last_rx_ms.store(now_ms() - 11_000, Ordering::Relaxed);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Idle);
}

/// A socket that takes `room` more bytes, then would block.
pub(crate) struct FakeWire {
    written: Mutex<Vec<u8>>,
    room: AtomicUsize,
    /// What `last_ack_age_ms` answers (`u64::MAX`: cannot tell).
    ack_age_ms: AtomicU64,
    /// The threads that wrote to it, in order.
    writers: Mutex<Vec<std::thread::ThreadId>>,
}

impl FakeWire {
    pub(crate) fn with_room(room: usize) -> Arc<Self> {
        Arc::new(Self {
            written: Mutex::new(Vec::new()),
            room: AtomicUsize::new(room),
            ack_age_ms: AtomicU64::new(u64::MAX),
            writers: Mutex::new(Vec::new()),
        })
    }

    /// The text of every whole frame written so far.
    pub(crate) fn texts(&self) -> Vec<String> {
        decode(&self.written.lock())
    }

    /// The threads that wrote to it, in order.
    pub(crate) fn writers(&self) -> Vec<std::thread::ThreadId> {
        self.writers.lock().clone()
    }
}

impl Wire for FakeWire {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.room.load(Ordering::SeqCst));
        if n == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        self.room.fetch_sub(n, Ordering::SeqCst);
        self.written.lock().extend_from_slice(&buf[..n]);
        self.writers.lock().push(std::thread::current().id());
        Ok(n)
    }

    fn last_ack_age_ms(&self) -> Option<u64> {
        Some(self.ack_age_ms.load(Ordering::SeqCst)).filter(|&a| a != u64::MAX)
    }
}

/// The texts of the whole server frames in `bytes`.
fn decode(bytes: &[u8]) -> Vec<String> {
    let mut buf = BytesMut::from(bytes);
    let mut texts = Vec::new();
    while let Ok(Some((_, op, payload))) = Parser::parse(&mut buf, false, 1 << 20) {
        let payload = payload.map(|p| p.to_vec()).unwrap_or_default();
        texts.push(match op {
            OpCode::Text => String::from_utf8(payload).unwrap(),
            OpCode::Ping => "<ping>".into(),
            other => format!("<{other:?}>"),
        });
    }
    texts
}

/// Register a counting waker as the socket side, pacing or not.
fn park(o: &Outbound, pace: bool) -> Arc<Counter> {
    let counter = Arc::new(Counter::default());
    let waker = counter.clone().into();
    assert!(!matches!(
        o.poll_take(&mut Context::from_waker(&waker), pace),
        Take::Ready(_)
    ));
    counter
}

fn env(seq: u64, text: &str) -> Push<'static> {
    Push::Envelope(ServerSeq::new(seq), ByteString::from(text.to_owned()))
}

#[test]
fn a_push_to_an_idle_connection_is_written_by_the_pusher() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    let socket_side = park(&o, false);
    o.push(env(1, "a"));
    o.push(Push::Response("b".into()));
    assert_eq!(wire.texts(), ["a", "b"]);
    assert_eq!(o.queued_bytes(), 0);
    assert_eq!(
        socket_side.0.load(Ordering::SeqCst),
        0,
        "no task woken for a direct write"
    );
    assert!(take(&o).is_none());
}

#[test]
fn a_publisher_queues_under_its_lock_and_writes_after() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    o.push_deferred(env(1, "a"), Instant::now());
    o.push_deferred(env(2, "b"), Instant::now());
    assert!(wire.texts().is_empty(), "nothing written before the flush");
    o.flush();
    assert_eq!(wire.texts(), ["a", "b"], "one write, in order");
    o.flush();
    assert_eq!(wire.texts(), ["a", "b"]);
}

#[test]
fn within_the_pacing_interval_frames_wait_for_the_socket_side() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::from_secs(3600));
    let socket_side = park(&o, false);
    o.push(env(1, "first"));
    assert_eq!(wire.texts(), ["first"], "nothing written before: no wait");
    o.push(env(2, "paced"));
    assert_eq!(wire.texts(), ["first"]);
    assert_eq!(
        socket_side.0.load(Ordering::SeqCst),
        1,
        "woken once to keep the deadline"
    );
    // The socket side now waits for its deadline: not woken again for a
    // frame that can wait, and an urgent one goes at once, after it.
    let socket_side = park(&o, true);
    o.push(env(3, "paced too"));
    assert_eq!(socket_side.0.load(Ordering::SeqCst), 0);
    o.push(Push::Echo(ServerSeq::new(4), "echo".into()));
    assert_eq!(wire.texts(), ["first", "paced", "paced too", "echo"]);
}

#[test]
fn what_a_direct_write_leaves_goes_first_from_the_socket_side() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(4);
    o.attach(wire.clone(), Duration::ZERO);
    let socket_side = park(&o, false);
    o.push(env(1, "hello"));
    assert_eq!(wire.written.lock().len(), 4, "a partial write");
    assert_eq!(socket_side.0.load(Ordering::SeqCst), 1);
    o.push(env(2, "next"));
    assert_eq!(wire.written.lock().len(), 4, "nothing jumps the rest");
    let t = take(&o).expect("the rest and the next frame");
    let mut bytes = wire.written.lock().clone();
    bytes.extend_from_slice(&t.head);
    let mut buf = BytesMut::new();
    encode_frames(&mut buf, t.frames);
    bytes.extend_from_slice(&buf);
    assert_eq!(decode(&bytes), ["hello", "next"]);
}

#[test]
fn nothing_is_written_directly_while_the_socket_side_writes() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(0);
    o.attach(wire.clone(), Duration::ZERO);
    o.push(env(1, "blocked"));
    let t = take(&o).expect("the socket side takes the unsent bytes");
    assert!(!t.head.is_empty());
    wire.room.store(1 << 20, Ordering::SeqCst);
    o.push(env(2, "while writing"));
    assert!(wire.texts().is_empty(), "the socket side owns the socket");
    // It wrote what it took; the next frame goes directly.
    wire.written.lock().extend_from_slice(&t.head);
    o.wrote(false);
    o.flush();
    assert_eq!(wire.texts(), ["blocked", "while writing"]);
}

#[test]
fn a_detached_connection_is_not_written() {
    let o = Outbound::new(1000);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    o.detach();
    o.push(env(1, "after"));
    assert!(wire.texts().is_empty());
}

#[test]
fn a_fast_stream_stretches_the_pacing_interval_and_a_slow_one_does_not() {
    let o = Outbound::new(1 << 20);
    let wire = FakeWire::with_room(1 << 20);
    let p = Duration::from_secs(100);
    o.attach(wire.clone(), p);
    let _socket_side = park(&o, false);
    assert_eq!(o.paced_until(), None, "nothing written yet");
    o.push(env(1, "first"));
    let written = o.state.lock().last_write.expect("written at once");
    assert_eq!(o.paced_until(), Some(written + p));
    // Frames far faster than one per 1.8 intervals: the interval doubles.
    for seq in 2..40 {
        o.push(env(seq, "fast"));
    }
    assert_eq!(o.paced_until(), Some(written + 2 * p));
    assert_eq!(wire.texts(), ["first"], "the rest wait for the deadline");
    // Urgent frames do not count as a stream, and are not held.
    let o = Outbound::new(1 << 20);
    o.attach(wire.clone(), p);
    for seq in 1..40 {
        o.push(Push::Echo(ServerSeq::new(seq), "echo".into()));
    }
    let written = o.state.lock().last_write.expect("written");
    assert_eq!(o.paced_until(), Some(written + p));
}
