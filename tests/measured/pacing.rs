//! Write pacing: frames pushed to a busy connection share one write, while
//! what a client waits for (its echo, a reply) is never paced.

use std::time::{Duration, Instant};

use crate::common::*;
use ahp::SubscriptionEvent;
use serde_json::{json, Value};
use tandem::Config;

/// The next action envelope within `within`, or `None`.
async fn envelope_within(
    c: &mut TestClient,
    within: Duration,
) -> Option<ahp_types::actions::ActionEnvelope> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let ev = tokio::time::timeout_at(deadline, c.events.recv())
            .await
            .ok()??;
        if let SubscriptionEvent::Action(env) = ev.event {
            return Some(env);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_frames_wait_for_the_pacing_deadline_but_echoes_and_replies_do_not() {
    let _alone = crate::alone().await;
    const PACING: Duration = Duration::from_secs(2);
    let server = TestServer::start_with(Config {
        write_pacing: PACING,
        // A heartbeat ping is a write too, and pings are spread over the
        // interval (one could go out to the reader in the middle of this
        // test and start a pacing window): none here.
        heartbeat_interval: Duration::from_secs(3600),
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let mut reader = server.client("reader").await;
    reader.subscribe_chat(&chat).await;
    // Let both connections' last writes fall out of the pacing window.
    tokio::time::sleep(PACING + Duration::from_millis(200)).await;

    // After a quiet spell the first envelope goes out at once.
    let sent = Instant::now();
    let seq = writer.dispatch(&chat, draft("one")).await;
    writer.wait_echo(None, seq).await;
    let first = envelope_within(&mut reader, PACING / 2)
        .await
        .expect("the first envelope after a quiet spell is not paced");
    let first_at = Instant::now();
    assert!(first_at - sent < PACING / 2, "{:?}", first_at - sent);
    assert_eq!(first.origin.unwrap().client_seq, seq);

    // More envelopes inside the window: the writer's own echoes come at once,
    // the reader's copies are paced.
    let mut seqs = Vec::new();
    for text in ["two", "three"] {
        let t = Instant::now();
        let seq = writer.dispatch(&chat, draft(text)).await;
        writer.wait_echo(None, seq).await;
        assert!(
            t.elapsed() < PACING / 2,
            "an echo is never paced: {:?}",
            t.elapsed()
        );
        seqs.push(seq);
    }
    assert!(
        envelope_within(&mut reader, Duration::from_millis(200))
            .await
            .is_none(),
        "pushed envelopes wait for the pacing deadline"
    );

    // A reply is never paced, and it comes after the paced envelopes.
    let t = Instant::now();
    let _: Value = reader
        .client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    assert!(
        first_at.elapsed() < PACING,
        "the reply went out before the deadline: {:?} after the first envelope ({:?} for the request)",
        first_at.elapsed(),
        t.elapsed()
    );
    for seq in seqs {
        let env = envelope_within(&mut reader, Duration::from_millis(100))
            .await
            .expect("paced envelopes went out with the reply, before it");
        assert_eq!(env.origin.unwrap().client_seq, seq);
    }

    // With nothing urgent, paced envelopes go out at the deadline.
    tokio::time::sleep(PACING + Duration::from_millis(200)).await;
    let seq = writer.dispatch(&chat, draft("four")).await;
    writer.wait_echo(None, seq).await;
    let four = envelope_within(&mut reader, PACING / 2)
        .await
        .expect("four");
    let four_at = Instant::now();
    let seq = writer.dispatch(&chat, draft("five")).await;
    writer.wait_echo(None, seq).await;
    let five = envelope_within(&mut reader, PACING * 2)
        .await
        .expect("five");
    let gap = four_at.elapsed();
    assert!(
        gap >= PACING - Duration::from_millis(300),
        "five waited for the deadline: {gap:?}"
    );
    assert_eq!(five.server_seq, four.server_seq + 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pacing_every_frame_goes_out_at_once() {
    let _alone = crate::alone().await;
    let server = TestServer::start_with(Config {
        write_pacing: Duration::ZERO,
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let mut reader = server.client("reader").await;
    reader.subscribe_chat(&chat).await;
    for text in ["a", "b", "c"] {
        let seq = writer.dispatch(&chat, draft(text)).await;
        writer.wait_echo(None, seq).await;
        let env = envelope_within(&mut reader, Duration::from_secs(1))
            .await
            .expect("delivered at once");
        assert_eq!(env.origin.unwrap().client_seq, seq);
    }
    server.stop().await;
}
