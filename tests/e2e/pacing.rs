//! Write pacing, as far as an end-to-end test can tell without a clock:
//! with a pacing interval far longer than any wait here, whatever arrives
//! at all was not paced — a writer's echoes, a reply, and the envelopes a
//! reply takes along. Without pacing, every envelope reaches a reader.
//! When paced frames go out (a quiet spell, the deadline) is the pacing
//! logic's own, timed on paused time beside it.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};
use tandem::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_and_replies_are_not_paced_and_a_reply_takes_the_paced_envelopes_along() {
    // Ten times any wait of the test: an envelope that arrives was not held
    // for the pacing deadline.
    let pacing = WAIT * 10;
    let server = TestServer::start_with(Config {
        write_pacing: pacing,
        // A heartbeat ping is a write too: none here.
        heartbeat_interval: Duration::from_secs(3600),
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let mut reader = server.client("reader").await;
    let mut mirror = reader.subscribe_chat(&chat).await;

    // The writer's own echoes come at once (within WAIT), though the
    // reader's copies are paced.
    let mut seqs = Vec::new();
    for text in ["one", "two", "three"] {
        let seq = writer.dispatch(&chat, draft(text)).await;
        writer.wait_echo(None, seq).await;
        seqs.push(seq);
    }

    // A reply is never paced, and the envelopes queued before it go out
    // with it, in order.
    let _: Value = reader
        .client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("listSessions");
    for seq in seqs {
        let env = reader.next_envelope().await;
        mirror.apply(&env);
        assert_eq!(env.origin.expect("an origin").client_seq, seq);
    }
    assert_eq!(
        mirror.state.draft.map(|d| d.text),
        Some("three".to_owned()),
        "the reader has every paced envelope"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pacing_every_envelope_reaches_a_reader_in_order() {
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
        let env = reader.next_envelope().await;
        assert_eq!(env.origin.expect("an origin").client_seq, seq);
    }
    server.stop().await;
}
