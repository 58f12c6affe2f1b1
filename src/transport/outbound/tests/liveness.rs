//! The heartbeat's view of a connection: pings, idle closes, letting go.

use super::*;

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

#[tokio::test(start_paused = true)]
async fn heartbeat_closes_an_idle_client() {
    let o = Outbound::new(1000);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    o.received();
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Pinged);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        o.beat(10_000, 3, 5_000),
        Beat::Pinged,
        "idle for just the timeout"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Idle);
    let close = take(&o).unwrap().close;
    assert!(
        matches!(&close, Some(CloseCause::Protocol(m)) if m.starts_with("idle for")),
        "{close:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeat_does_not_ping_a_client_whose_tcp_acknowledged_what_it_was_sent() {
    let o = Outbound::new(1 << 20);
    let wire = FakeWire::with_room(1 << 20);
    o.attach(wire.clone(), Duration::ZERO);
    tokio::time::advance(Duration::from_secs(9)).await;
    o.push(Push::Envelope(ServerSeq::new(1), "e1".into()));
    wire.ack_age_ms.store(100, Ordering::SeqCst);
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Acknowledged);
    assert_eq!(wire.texts(), ["e1"], "no ping");
    // The acknowledgement counts as a sign of life.
    assert_eq!(o.last_rx_ms.load(Ordering::Relaxed), o.now_ms());

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
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(o.beat(10_000, 3, 5_000), Beat::Idle);
}
