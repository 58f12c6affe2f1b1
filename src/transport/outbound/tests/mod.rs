use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Wake;

use actix_http::ws::{OpCode, Parser};
use bytes::BytesMut;

use super::*;

#[cfg(target_os = "linux")]
mod batch;
mod liveness;
mod wire;

pub(crate) use wire::FakeWire;

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
