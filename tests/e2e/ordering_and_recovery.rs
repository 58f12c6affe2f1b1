//! One order per connection, and recovery after a dropped or evicted
//! connection (`reconnect` replay and snapshot), against a real server.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::commands::ReconnectResult;
use ahp_types::state::{Snapshot, SnapshotState};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::Config;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

fn is_draft(e: &ActionEnvelope) -> bool {
    matches!(e.action, StateAction::ChatDraftChanged(_))
}

/// Dispatch `n` drafts `"{prefix}{i}"` and wait for the echo of the last one,
/// so every one of them has been published when this returns.
async fn send_drafts(driver: &mut TestClient, chat: &str, prefix: &str, n: usize) {
    let mut last = 0;
    for i in 0..n {
        last = driver.dispatch(chat, draft(&format!("{prefix}{i}"))).await;
    }
    let echo = driver.wait_echo(None, last).await;
    assert!(echo.rejection_reason.is_none(), "draft rejected: {echo:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_sees_strictly_increasing_server_seq_across_two_busy_chats() {
    const N: usize = 2000;
    let server = TestServer::start().await;
    let setup = server.client("setup").await;
    let (_s1, chat1) = setup.create_session().await;
    let (_s2, chat2) = setup.create_session().await;

    let mut observer = server.client("observer").await;
    let mut m1 = observer.subscribe_chat(&chat1).await;
    let mut m2 = observer.subscribe_chat(&chat2).await;

    let d1 = server.client("driver-1").await;
    let d2 = server.client("driver-2").await;
    let drive = |d: TestClient, chat: String| async move {
        for i in 0..N {
            d.dispatch(&chat, draft(&format!("d{i}"))).await;
        }
        d
    };
    let t1 = tokio::spawn(drive(d1, chat1.clone()));
    let t2 = tokio::spawn(drive(d2, chat2.clone()));

    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut last_seq = 0u64;
    let mut received = 0usize;
    while received < 2 * N {
        let env = observer.next_envelope().await;
        assert!(
            env.server_seq > last_seq,
            "serverSeq went from {last_seq} to {} ({})",
            env.server_seq,
            env.channel
        );
        last_seq = env.server_seq;
        assert!(
            env.rejection_reason.is_none(),
            "rejected: {:?}",
            env.rejection_reason
        );
        m1.apply(&env);
        m2.apply(&env);
        if is_draft(&env) {
            *counts.entry(env.channel.clone()).or_default() += 1;
            received += 1;
        }
    }
    assert_eq!(counts.get(&chat1).copied(), Some(N), "chat 1 drafts");
    assert_eq!(counts.get(&chat2).copied(), Some(N), "chat 2 drafts");
    let d1 = t1.await.expect("driver 1");
    let d2 = t2.await.expect("driver 2");

    assert_eq!(m1.state, fresh_chat(&server, &chat1).await, "chat 1 mirror");
    assert_eq!(m2.state, fresh_chat(&server, &chat2).await, "chat 2 mirror");
    assert_eq!(
        m1.state.draft.as_ref().map(|d| d.text.as_str()),
        Some(format!("d{}", N - 1).as_str())
    );
    for c in [setup, observer, d1, d2] {
        c.client.shutdown().await;
    }
    server.stop().await;
}

/// C sees 50 drafts, disconnects, misses 100; returns (server, driver, chat,
/// C's last seen serverSeq, C's mirror).
async fn miss_hundred(config: Config) -> (TestServer, TestClient, String, u64, ChatMirror) {
    let server = TestServer::start_with(config).await;
    let mut driver = server.client("driver").await;
    let (_s, chat) = driver.create_session().await;

    let mut c = server.client("c").await;
    let mut mirror = c.subscribe_chat(&chat).await;
    send_drafts(&mut driver, &chat, "before-", 50).await;
    let mut last_seq = mirror.from_seq;
    let mut seen = 0;
    while seen < 50 {
        let env = c.next_envelope().await;
        assert!(env.server_seq > last_seq);
        last_seq = env.server_seq;
        mirror.apply(&env);
        if is_draft(&env) {
            seen += 1;
        }
    }
    assert_eq!(mirror.state, fresh_chat(&server, &chat).await);
    c.client.shutdown().await;
    drop(c);

    send_drafts(&mut driver, &chat, "missed-", 100).await;
    (server, driver, chat, last_seq, mirror)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_replays_exactly_the_missed_envelopes() {
    let (server, driver, chat, last_seq, mut mirror) = miss_hundred(Config::default()).await;

    let gone = "ahp-chat:/does-not-exist".to_string();
    let client = TestClient::raw_connect(&server.url()).await;
    let res = tokio::time::timeout(
        WAIT,
        client.reconnect(
            "c".into(),
            last_seq as i64,
            vec![chat.clone(), gone.clone()],
        ),
    )
    .await
    .expect("reconnect timed out")
    .expect("reconnect");
    let ReconnectResult::Replay(r) = res else {
        panic!("expected a replay, got {res:?}");
    };
    assert_eq!(r.actions.len(), 100, "exactly the missed envelopes");
    assert_eq!(r.missing, vec![gone], "the unknown channel is missing");
    let mut prev = last_seq;
    for (i, env) in r.actions.iter().enumerate() {
        assert_eq!(env.channel, chat);
        assert!(env.server_seq > prev, "replay serverSeq order");
        prev = env.server_seq;
        match &env.action {
            StateAction::ChatDraftChanged(d) => {
                assert_eq!(
                    d.draft.as_ref().map(|m| m.text.clone()),
                    Some(format!("missed-{i}"))
                )
            }
            other => panic!("unexpected replayed action {other:?}"),
        }
        mirror.apply(env);
    }
    assert_eq!(mirror.state, fresh_chat(&server, &chat).await);
    client.shutdown().await;
    driver.client.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_older_than_the_ring_gets_snapshots() {
    let config = Config {
        replay_ring_len: 20,
        ..Config::default()
    };
    let (server, driver, chat, last_seq, _mirror) = miss_hundred(config).await;
    expect_snapshot_then_live(&server, driver, &chat, last_seq).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_over_the_replay_limit_gets_snapshots() {
    // The ring still holds all 100 missed drafts (~15 KB of envelopes);
    // only the replay byte limit sends the client to snapshots.
    let config = Config {
        max_replay_bytes: 10 * 1024,
        ..Config::default()
    };
    let (server, driver, chat, last_seq, _mirror) = miss_hundred(config).await;
    expect_snapshot_then_live(&server, driver, &chat, last_seq).await;
    server.stop().await;
}

/// Reconnect as "c" after `last_seq`: expect a snapshot of `chat` that
/// matches the server's state, then a live action on top of it.
async fn expect_snapshot_then_live(
    server: &TestServer,
    driver: TestClient,
    chat: &str,
    last_seq: u64,
) {
    let client = TestClient::raw_connect(&server.url()).await;
    let mut events = client.events();
    let res = tokio::time::timeout(
        WAIT,
        client.reconnect("c".into(), last_seq as i64, vec![chat.to_owned()]),
    )
    .await
    .expect("reconnect timed out")
    .expect("reconnect");
    let ReconnectResult::Snapshot(s) = res else {
        panic!("expected snapshots, got {res:?}");
    };
    assert_eq!(s.snapshots.len(), 1);
    let snap = &s.snapshots[0];
    assert_eq!(snap.resource, chat);
    assert!(snap.from_seq as u64 > last_seq);
    let SnapshotState::Chat(state) = &snap.state else {
        panic!("not a chat snapshot: {:?}", snap.state);
    };
    assert_eq!(**state, fresh_chat(server, chat).await);
    let mut mirror = ChatMirror {
        uri: chat.to_owned(),
        state: (**state).clone(),
        from_seq: snap.from_seq as u64,
    };

    // Live actions flow again after the snapshot.
    let seq = driver.dispatch(chat, draft("after-reconnect")).await;
    let env = loop {
        let ev = tokio::time::timeout(WAIT, events.recv())
            .await
            .expect("timed out waiting for a live action")
            .expect("client closed");
        if let ahp::SubscriptionEvent::Action(env) = ev.event {
            break env;
        }
    };
    assert_eq!(env.channel, chat);
    assert!(env.server_seq > mirror.from_seq);
    assert_eq!(
        env.origin
            .as_ref()
            .map(|o| (o.client_id.as_str(), o.client_seq)),
        Some(("driver", seq))
    );
    mirror.apply(&env);
    assert_eq!(mirror.state, fresh_chat(server, chat).await);
    client.shutdown().await;
    driver.client.shutdown().await;
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Next text frame as JSON (Ping/Pong skipped); panics on anything else.
async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("timed out waiting for a frame")
            .expect("socket ended")
            .expect("socket error");
        match msg {
            Message::Text(t) => return serde_json::from_str(&t).expect("frame is JSON"),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// What the slow client saw: the close frame, its last serverSeq, how many
/// actions it read, and its mirror.
type SlowOutcome = (
    tokio_tungstenite::tungstenite::protocol::CloseFrame,
    u64,
    usize,
    ChatMirror,
);

/// How long the slow client takes over each frame of its backlog.
const SLOW_READ: Duration = Duration::from_millis(2);

/// Read the slow client's backlog up to the close frame.
async fn read_until_close(mut slow: Ws, mut mirror: ChatMirror) -> SlowOutcome {
    let mut last_seq = mirror.from_seq;
    let mut frames = 0usize;
    loop {
        let msg = tokio::time::timeout(WAIT, slow.next())
            .await
            .expect("slow client: timed out waiting for the close")
            .expect("slow client: socket ended without a close frame")
            .unwrap_or_else(|e| {
                panic!(
                    "slow client: socket error after {frames} actions (seq {last_seq}) \
                     before any close frame: {e}"
                )
            });
        match msg {
            Message::Text(t) => {
                // A client slower than the server's first second after its
                // close: the server keeps the socket while the client still
                // takes what was sent before it.
                // The slowness under test, not synchronisation.
                tokio::time::sleep(SLOW_READ).await;
                let v: Value = serde_json::from_str(&t).expect("json frame");
                assert_eq!(v["method"], "action", "only actions before the close: {v}");
                let env: ActionEnvelope =
                    serde_json::from_value(v["params"].clone()).expect("envelope");
                assert!(env.server_seq > last_seq, "slow client order");
                last_seq = env.server_seq;
                mirror.apply(&env);
                frames += 1;
            }
            Message::Ping(_) | Message::Pong(_) => {}
            Message::Close(frame) => {
                let frame = frame.expect("close frame with a reason");
                return (frame, last_seq, frames, mirror);
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Drafts the driver sends in the eviction tests (~1 KiB each, ~8.6 MB in
/// all: past the slow client's buffers, below a WebSocket frame's 16 MiB so
/// the whole gap fits one replay reply).
const N: usize = 8_000;

/// What an eviction left: the server, the driver, the chat, the slow
/// client's last seen serverSeq, how many drafts it read, and its mirror.
struct Evicted {
    server: TestServer,
    driver: TestClient,
    fast: TestClient,
    chat: String,
    last_seq: u64,
    frames: usize,
    slow_mirror: ChatMirror,
    fresh: ahp_types::state::ChatState,
}

/// A slow client subscribes and stops reading while the driver sends N
/// drafts; it is evicted for overflow, and reads its backlog up to the close.
async fn evict_a_slow_client(max_replay_bytes: usize) -> Evicted {
    // The slow client resumes reading after this many drafts (> 6 MiB queued
    // for it, far past what its 8 KiB receive buffer, the server's send buffer
    // and the 64 KiB limit can hold). It resumes before all N are sent so the
    // test does not lean on how long the server keeps a closing peer whose
    // socket makes no progress (`idle_timeout`): the close frame sits behind
    // frames already handed to the socket layer.
    const RESUME_AT: usize = 6_000;
    // The byte limit applies to every connection (including the driver, which
    // gets its own echoes), so nobody else may fall more than a few frames
    // behind either: the driver stays at most WINDOW drafts (~36 KiB of
    // frames) ahead of what the fast client has read.
    const WINDOW: usize = 32;
    let server = TestServer::start_with(Config {
        outbound_limit_bytes: 64 * 1024,
        max_replay_bytes,
        // Pings every 100 ms: the backlog the slow client reads after its
        // eviction has pings in it, which it answers as it reads on, after
        // the server has written its close.
        heartbeat_interval: Duration::from_millis(100),
        // 8 MB of drafts from one connection, faster than a person's
        // budget of journaled bytes allows: this test is about eviction.
        limits: tandem::Limits {
            dispatch_bytes_per_sec: 1e12,
            dispatch_bytes_burst: 1e12,
            ..tandem::Limits::default()
        },
        ..Config::default()
    })
    .await;
    let driver = server.client("driver").await;
    let (_s, chat) = driver.create_session().await;

    // The slow client: raw socket with a small receive buffer, initialize +
    // subscribe, then no reads.
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(8 * 1024).expect("SO_RCVBUF");
    let tcp = tokio::time::timeout(WAIT, sock.connect(server.addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let (mut slow, _) = tokio_tungstenite::client_async(server.url(), tcp)
        .await
        .expect("slow handshake");
    slow.send(Message::text(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"slow"}}).to_string(),
    ))
    .await
    .expect("send initialize");
    let init = next_json(&mut slow).await;
    assert_eq!(init["id"], 1, "{init}");
    assert!(init.get("result").is_some(), "{init}");
    slow.send(Message::text(
        json!({"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"channel": chat}}).to_string(),
    ))
    .await
    .expect("send subscribe");
    let sub = next_json(&mut slow).await;
    assert_eq!(sub["id"], 2, "{sub}");
    let snap: Snapshot =
        serde_json::from_value(sub["result"]["snapshot"].clone()).expect("subscribe snapshot");
    let SnapshotState::Chat(state) = snap.state else {
        panic!("not a chat snapshot");
    };
    let slow_mirror = ChatMirror {
        uri: chat.clone(),
        state: *state,
        from_seq: snap.from_seq as u64,
    };

    let mut fast = server.client("fast").await;
    let mut fast_mirror = fast.subscribe_chat(&chat).await;

    let filler = "x".repeat(1000);
    let started = Instant::now();
    let mut fast_seen = 0usize;
    let mut fast_last = fast_mirror.from_seq;
    let mut fast_recv = |env: ActionEnvelope, mirror: &mut ChatMirror| {
        assert!(env.server_seq > fast_last, "fast client order");
        fast_last = env.server_seq;
        mirror.apply(&env);
        usize::from(is_draft(&env))
    };
    let mut slow = Some((slow, slow_mirror));
    let mut slow_task = None;
    for i in 0..N {
        if i == RESUME_AT {
            let (ws, mirror) = slow.take().expect("slow client");
            slow_task = Some(tokio::spawn(read_until_close(ws, mirror)));
        }
        while fast_seen + WINDOW < i {
            let env = fast.next_envelope().await;
            fast_seen += fast_recv(env, &mut fast_mirror);
        }
        driver
            .dispatch(&chat, draft(&format!("{i:05} {filler}")))
            .await;
    }
    while fast_seen < N {
        let env = fast.next_envelope().await;
        fast_seen += fast_recv(env, &mut fast_mirror);
    }
    let fast_done_in = started.elapsed();
    let (close, last_seq, frames, slow_mirror) = slow_task
        .expect("slow reader started")
        .await
        .expect("slow reader");
    eprintln!(
        "fast client got all {N} in {fast_done_in:?}; \
         slow client read {frames} actions then close {close:?}"
    );
    assert_eq!(close.code, CloseCode::Policy);
    assert!(
        close.reason.contains("overflow"),
        "reason: {}",
        close.reason
    );
    assert!(
        frames < RESUME_AT,
        "the slow client was cut off while not reading"
    );

    let fresh = fresh_chat(&server, &chat).await;
    assert_eq!(fast_mirror.state, fresh, "fast client mirror");
    Evicted {
        server,
        driver,
        fast,
        chat,
        last_seq,
        frames,
        slow_mirror,
        fresh,
    }
}

/// Reconnect as the evicted client after its last seen serverSeq.
async fn reconnect_slow(e: &Evicted) -> (ahp::Client, ReconnectResult) {
    let back = TestClient::raw_connect(&e.server.url()).await;
    let res = tokio::time::timeout(
        WAIT,
        back.reconnect("slow".into(), e.last_seq as i64, vec![e.chat.clone()]),
    )
    .await
    .expect("reconnect timed out")
    .expect("reconnect");
    (back, res)
}

impl Evicted {
    async fn stop(self, back: ahp::Client) {
        back.shutdown().await;
        self.fast.client.shutdown().await;
        self.driver.client.shutdown().await;
        self.server.stop().await;
    }
}

// The replay after an eviction is larger than the outbound limit that
// evicted the client; replies are not counted against that limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_client_gets_exactly_what_it_missed_by_replay() {
    // Every missed draft fits the replay limit and the ring.
    let mut e = evict_a_slow_client(64 * 1024 * 1024).await;
    let (back, res) = reconnect_slow(&e).await;
    let ReconnectResult::Replay(r) = res else {
        panic!("a gap within the replay limit is replayed, got {res:?}");
    };
    assert!(r.missing.is_empty(), "missing: {:?}", r.missing);
    // The slow client read drafts 0..frames in order; the replay must be
    // exactly frames..N: no gap, no duplicate.
    let indices: Vec<usize> = r
        .actions
        .iter()
        .map(|env| match &env.action {
            StateAction::ChatDraftChanged(d) => d
                .draft
                .as_ref()
                .and_then(|m| m.text.get(..5)?.parse().ok())
                .expect("a numbered draft"),
            other => panic!("unexpected replayed action {other:?}"),
        })
        .collect();
    assert_eq!(
        indices,
        (e.frames..N).collect::<Vec<_>>(),
        "replay fills the gap exactly"
    );
    let mut prev = e.last_seq;
    for env in &r.actions {
        assert_eq!(env.channel, e.chat);
        assert!(env.server_seq > prev, "replay order");
        prev = env.server_seq;
        e.slow_mirror.apply(env);
    }
    assert_eq!(e.slow_mirror.state, e.fresh, "slow client recovered");
    e.stop(back).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_client_past_the_replay_limit_gets_a_snapshot() {
    // The default 4 MiB limit is below the ~8 MB the client missed.
    let e = evict_a_slow_client(Config::default().max_replay_bytes).await;
    let (back, res) = reconnect_slow(&e).await;
    let ReconnectResult::Snapshot(s) = res else {
        panic!("a gap over the replay limit gets a snapshot, got {res:?}");
    };
    assert_eq!(s.snapshots.len(), 1);
    let SnapshotState::Chat(state) = s.snapshots[0].state.clone() else {
        panic!("chat snapshot expected");
    };
    assert!(s.snapshots[0].from_seq as u64 > e.last_seq);
    assert_eq!(*state, e.fresh, "slow client recovered");
    e.stop(back).await;
}
