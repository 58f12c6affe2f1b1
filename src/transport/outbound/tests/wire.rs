//! Direct writes by whoever pushes, and pacing against the socket side.

use super::*;

/// A socket that takes `room` more bytes, then would block.
pub(crate) struct FakeWire {
    pub(super) written: Mutex<Vec<u8>>,
    pub(super) room: AtomicUsize,
    /// What `last_ack_age_ms` answers (`u64::MAX`: cannot tell).
    pub(super) ack_age_ms: AtomicU64,
    /// The threads that wrote to it, in order.
    pub(super) writers: Mutex<Vec<std::thread::ThreadId>>,
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
pub(super) fn decode(bytes: &[u8]) -> Vec<String> {
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
pub(super) fn park(o: &Outbound, pace: bool) -> Arc<Counter> {
    let counter = Arc::new(Counter::default());
    let waker = counter.clone().into();
    assert!(!matches!(
        o.poll_take(&mut Context::from_waker(&waker), pace),
        Take::Ready(_)
    ));
    counter
}

pub(super) fn env(seq: u64, text: &str) -> Push<'static> {
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

#[test]
fn a_direct_write_keeps_the_queue_buffer_unless_a_backlog_made_it_large() {
    let o = Outbound::new(1 << 20);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    o.push_deferred(env(1, "a"), Instant::now());
    o.flush();
    let kept = o.state.lock().frames.capacity();
    assert!(kept > 0, "the next frame reuses the buffer");
    o.push_deferred(env(2, "b"), Instant::now());
    o.flush();
    assert_eq!(o.state.lock().frames.capacity(), kept, "no new buffer");
    // A backlog of 100 frames written in one go: its buffer is let go.
    for seq in 3..103 {
        o.push_deferred(env(seq, "c"), Instant::now());
    }
    o.flush();
    assert_eq!(o.state.lock().frames.capacity(), 0);
    assert_eq!(wire.texts().len(), 102, "every frame written once");
}

#[test]
fn an_unflushed_reply_leaves_with_the_next_write_or_when_let_go() {
    let o = Arc::new(Outbound::new(1000));
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    let held = o.push_unflushed(Push::Response("reply".into()));
    assert!(wire.texts().is_empty(), "held back for the echo");
    o.push_deferred(Push::Echo(ServerSeq::new(1), "echo".into()), Instant::now());
    o.flush();
    assert_eq!(wire.texts(), ["reply", "echo"]);
    assert_eq!(wire.writers().len(), 1, "reply and echo in one write");
    drop(held);
    assert_eq!(wire.texts(), ["reply", "echo"], "nothing written twice");
    // A reply whose action is never heard of again leaves when the last
    // holder lets it go.
    let held = Arc::new(o.push_unflushed(Push::Response("lone".into())));
    let other = held.clone();
    drop(held);
    assert_eq!(wire.texts(), ["reply", "echo"]);
    drop(other);
    assert_eq!(wire.texts(), ["reply", "echo", "lone"]);
}
