//! Memory a client can make the server hold, and what a scoped client may
//! learn: one test per item of the limits part of the security review
//! (items 8–12), and the consistency rules for scoped clients.

use crate::common;

use std::time::Duration;

use ahp::ClientError;
use ahp_types::commands::ReconnectResult;
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::{Config, Limits};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &[u8] = b"limits-test-secret-0123456789-abcdef";

fn token(sub: &str, role: Role, sessions: Option<Vec<&str>>) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role,
            exp: now_secs() + 600,
            sessions: sessions.map(|s| s.into_iter().map(String::from).collect()),
            ..Default::default()
        })
        .expect("mint")
}

fn action_type(a: &ahp_types::actions::StateAction) -> String {
    serde_json::to_value(a).expect("json")["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(ClientError::Rpc(e)) => e.code,
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

fn code_and_message<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (i32, String) {
    match r {
        Err(ClientError::Rpc(e)) => (e.code, e.message),
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

/// A raw WebSocket whose kernel receive window is 4 KiB: once it stops
/// reading, everything the server sends piles up in the server's queue.
async fn stuck_socket(
    server: &TestServer,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("small window");
    socket.connect(&server.addr.into()).expect("connect");
    socket.set_nonblocking(true).expect("nonblocking");
    let tcp = tokio::net::TcpStream::from_std(socket.into()).expect("tokio stream");
    tokio_tungstenite::client_async(server.url(), tcp)
        .await
        .expect("upgrade")
        .0
}

// Item 8: replies count against the connection's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_for_snapshots_and_never_reads_is_evicted() {
    // A long idle timeout: the kernel's `TCP_USER_TIMEOUT` (set to it) must
    // not be what lets go of the hoarder — the reply budget must.
    let server = TestServer::start_with(Config {
        heartbeat_interval: Duration::from_millis(250),
        idle_timeout: Duration::from_secs(120),
        outbound_limit_bytes: 512 * 1024,
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let seq = writer.dispatch(&chat, draft(&"d".repeat(200_000))).await;
    writer.wait_echo(None, seq).await;

    let mut ws = stuck_socket(&server).await;
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "hoarder"}}).to_string(),
    ))
    .await
    .expect("send");
    // 100 snapshots of 200 KB: 20 MB if every reply were held.
    for id in 1..=100 {
        let frame =
            json!({"jsonrpc": "2.0", "id": id, "method": "subscribe", "params": {"channel": chat}});
        ws.send(Message::text(frame.to_string()))
            .await
            .expect("send");
    }
    // The client reads nothing until the server has decided to evict it
    // (the admin view says why a connection is closing), then reads what
    // the server kept for it: a few replies the kernel already held, then
    // the eviction — not 100 snapshots.
    eventually("the hoarder is being evicted", || async {
        let (_, _, body) = http(server.addr, "GET", "/admin/overview").await;
        let doc: serde_json::Value = serde_json::from_slice(&body).ok()?;
        doc["connections"]
            .as_array()?
            .iter()
            .any(|c| c["clientId"] == "hoarder" && c["closing"] == "overflow")
            .then_some(())
    })
    .await;
    let mut replies = 0;
    let close = loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("frames in time")
            .expect("a frame or the close")
            .expect("readable");
        match frame {
            Message::Close(c) => break c,
            Message::Text(t) if t.contains("\"snapshot\"") => replies += 1,
            _ => {}
        }
    };
    let close = close.expect("a close reason");
    assert_eq!(u16::from(close.code), 1008, "{close:?}");
    assert!(
        close.reason.contains("outbound buffer overflow"),
        "{close:?}"
    );
    assert!(
        replies < 100,
        "all {replies} snapshots were kept for a client that did not read"
    );
    writer
        .client
        .ping()
        .await
        .expect("the writer is still served");
    server.stop().await;
}

// Item 8: one reply larger than the limit still reaches a client that reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_snapshot_larger_than_the_limit_still_reaches_a_reader() {
    let server = TestServer::start_with(Config {
        outbound_limit_bytes: 256 * 1024,
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let mut mirror = writer.subscribe_chat(&chat).await;
    // Three turns of 100 KB prompts, each echoed back by the agent: a chat
    // of about 600 KB, more than twice the limit.
    for i in 0..3 {
        writer
            .start_turn(&chat, &format!("{i}{}", "p".repeat(100_000)))
            .await;
        writer
            .wait_state(&mut mirror, |s| {
                s.turns.len() == i + 1 && s.active_turn.is_none()
            })
            .await;
    }
    let reader = server.client("reader").await;
    let got = reader.subscribe_chat(&chat).await;
    assert_eq!(got.state.turns.len(), 3, "the large snapshot arrived whole");
    reader
        .client
        .ping()
        .await
        .expect("and the reader is still served");
    server.stop().await;
}

// Item 9: the replay ring is bounded in bytes; past it, snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_ring_is_bounded_in_bytes() {
    let server = TestServer::start_with(Config {
        replay_ring_bytes: 100 * 1024,
        ..Config::default()
    })
    .await;
    let mut writer = server.client("writer").await;
    let (_session, chat) = writer.create_session().await;
    let before = healthz(server.addr).await["serverSeq"]
        .as_u64()
        .expect("seq");
    let mut last = 0;
    for i in 0..10 {
        let seq = writer
            .dispatch(&chat, draft(&format!("{i}{}", "x".repeat(30_000))))
            .await;
        last = writer.wait_echo(None, seq).await.server_seq;
    }
    let from_before = TestClient::raw_connect(&server.url())
        .await
        .reconnect("r1".into(), before as i64, vec![chat.clone()])
        .await
        .expect("reconnect");
    assert!(
        matches!(from_before, ReconnectResult::Snapshot(_)),
        "300 KB of envelopes are not kept in a 100 KB ring"
    );
    let recent = TestClient::raw_connect(&server.url())
        .await
        .reconnect("r2".into(), (last - 1) as i64, vec![chat.clone()])
        .await
        .expect("reconnect");
    match recent {
        ReconnectResult::Replay(r) => assert_eq!(r.actions.len(), 1),
        other => panic!("the newest envelopes are replayed: {other:?}"),
    }
    server.stop().await;
}

// Item 10: every client-chosen size has a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_chosen_sizes_are_limited() {
    let server = TestServer::start_with(Config {
        limits: Limits {
            max_chats_per_session: 3,
            max_action_bytes: 64 * 1024,
            max_providers_per_subject: 2,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    // clientId.
    let long_id = "c".repeat(257);
    let r = TestClient::raw_connect(&server.url())
        .await
        .initialize(long_id, vec!["1.0.0".into()], vec![])
        .await;
    assert_eq!(code(r), -32602, "a clientId over 256 bytes");

    let mut c = server.client("sizes").await;
    let (session, chat) = c.create_session().await;
    // Session URI.
    let long_session = format!("ahp-session:/{}", "s".repeat(300));
    let r: Result<Value, _> = c
        .client
        .request(
            "createSession",
            json!({"channel": long_session, "provider": "scripted"}),
        )
        .await;
    assert_eq!(code(r), -32602, "a session URI over 256 bytes");
    // Chat URI and chats per session.
    let long_chat = format!("ahp-chat:/{}", "c".repeat(300));
    let r: Result<Value, _> = c
        .client
        .request("createChat", json!({"channel": session, "chat": long_chat}))
        .await;
    assert_eq!(code(r), -32602, "a chat URI over 256 bytes");
    for n in 0..2 {
        let _: Value = c
            .client
            .request(
                "createChat",
                json!({"channel": session, "chat": format!("ahp-chat:/extra-{n}")}),
            )
            .await
            .expect("within the chat limit");
    }
    let r: Result<Value, _> = c
        .client
        .request(
            "createChat",
            json!({"channel": session, "chat": "ahp-chat:/one-too-many"}),
        )
        .await;
    let (rpc_code, message) = code_and_message(r);
    assert_eq!(rpc_code, -32600);
    assert!(message.contains("at most 3 chats"), "{message}");
    // Session title.
    let seq = c
        .dispatch(
            &session,
            action(json!({"type": "session/titleChanged", "title": "t".repeat(1_001)})),
        )
        .await;
    let echo = c.wait_echo(None, seq).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("over the limit of 1000")),
        "{:?}",
        echo.rejection_reason
    );
    // Any action: its message size.
    let seq = c.dispatch(&chat, draft(&"x".repeat(70_000))).await;
    let echo = c.wait_echo(None, seq).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("too large")),
        "{:?}",
        echo.rejection_reason
    );
    // Provider display name and description.
    let r: Result<Value, _> = c
        .client
        .request(
            "tandem/registerProvider",
            json!({"channel": "ahp-root://", "provider": "big", "displayName": "n".repeat(1_001)}),
        )
        .await;
    assert_eq!(code(r), -32602, "a display name over 1000 characters");
    let r: Result<Value, _> = c
        .client
        .request(
            "tandem/registerProvider",
            json!({"channel": "ahp-root://", "provider": "big", "displayName": "Big", "description": "d".repeat(4_001)}),
        )
        .await;
    assert_eq!(code(r), -32602, "a description over 4000 characters");
    // The server still serves this client normally.
    let seq = c.dispatch(&chat, draft("small")).await;
    assert!(c.wait_echo(None, seq).await.rejection_reason.is_none());
    // Providers per subject (everyone is the one local subject here).
    let agent = server.client("agent").await;
    for n in 0..2 {
        let _: Value = agent
            .client
            .request(
                "tandem/registerProvider",
                json!({"channel": "ahp-root://", "provider": format!("p{n}"), "displayName": "P"}),
            )
            .await
            .expect("within the provider limit");
    }
    let r: Result<Value, _> = agent
        .client
        .request(
            "tandem/registerProvider",
            json!({"channel": "ahp-root://", "provider": "p2", "displayName": "P"}),
        )
        .await;
    let (rpc_code, message) = code_and_message(r);
    assert_eq!(rpc_code, -32600);
    assert!(message.contains("2 providers"), "{message}");
    server.stop().await;
}

// Item 11: the bytes of actions one subject may have journaled per second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_a_subject_may_have_journaled_are_rate_limited() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        limits: Limits {
            dispatch_bytes_per_sec: 100_000.0,
            dispatch_bytes_burst: 200_000.0,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let url = |sub: &str| format!("{}?token={}", server.url(), token(sub, Role::Client, None));
    let mut heavy = TestClient::connect(&url("heavy"), "heavy").await;
    let (_session, chat) = heavy.create_session().await;
    let text = "h".repeat(50_000);
    let mut seqs = Vec::new();
    for _ in 0..20 {
        seqs.push(heavy.dispatch(&chat, draft(&text)).await);
    }
    // Rejections are answered at once, accepted actions after the journal:
    // collect every echo, in whatever order they come.
    let mut pending: std::collections::HashSet<i64> = seqs.into_iter().collect();
    let mut rejected = 0;
    while !pending.is_empty() {
        let env = heavy.next_envelope().await;
        let Some(origin) = env.origin.as_ref().filter(|o| o.client_id == "heavy") else {
            continue;
        };
        if pending.remove(&origin.client_seq)
            && env
                .rejection_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("rate limited"))
        {
            rejected += 1;
        }
    }
    assert!(
        rejected >= 10,
        "1 MB in a burst against 200 KB: {rejected} of 20 rejected"
    );
    // A fresh connection of the same subject gets no fresh budget...
    let mut again = TestClient::connect(&url("heavy"), "heavy-again").await;
    let seq = again.dispatch(&chat, draft(&text)).await;
    assert!(
        again
            .wait_echo(None, seq)
            .await
            .rejection_reason
            .is_some_and(|r| r.starts_with("rate limited")),
        "reconnecting does not refill the budget"
    );
    // ...while another subject has its own.
    let mut other = TestClient::connect(&url("other"), "other").await;
    let seq = other.dispatch(&chat, draft(&text)).await;
    assert!(other.wait_echo(None, seq).await.rejection_reason.is_none());
    server.stop().await;
}

/// A server allowing `max` subscriptions per connection, with one session
/// (and its chat) created by another client.
async fn with_subscription_limit(max: usize) -> (TestServer, String, String) {
    let server = TestServer::start_with(Config {
        limits: Limits {
            max_subscriptions_per_connection: max,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let (session, chat) = server.client("c").await.create_session().await;
    (server, session, chat)
}

// Item 12: reconnect respects the subscription limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_cannot_subscribe_past_the_limit() {
    let (server, session, chat) = with_subscription_limit(2).await;
    let client = TestClient::raw_connect(&server.url()).await;
    let r = client
        .reconnect(
            "again".into(),
            0,
            vec![session.clone(), chat.clone(), "ahp-root://".into()],
        )
        .await;
    assert_eq!(code(r), -32600);
    // Refused means not started: the connection may still begin properly.
    client
        .reconnect("again".into(), 0, vec![session, chat])
        .await
        .expect("within the limit");
    server.stop().await;
}

// Item 12: the per-subject session limit holds across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_limit_survives_a_restart() {
    let dir = temp_dir("session-cap");
    let config = || Config {
        auth_secret: Some(SECRET.to_vec()),
        data_dir: Some(dir.clone()),
        limits: Limits {
            max_sessions_per_token: 2,
            ..Limits::default()
        },
        ..Config::default()
    };
    let url = |server: &TestServer| {
        format!(
            "{}?token={}",
            server.url(),
            token("bob", Role::Client, None)
        )
    };
    let server = TestServer::start_with(config()).await;
    let bob = TestClient::connect(&url(&server), "bob").await;
    bob.create_session().await;
    bob.create_session().await;
    drop(bob);
    server.stop().await;

    let server = TestServer::start_with(config()).await;
    let bob = TestClient::connect(&url(&server), "bob").await;
    let r: Result<Value, _> = bob
        .client
        .request(
            "createSession",
            json!({"channel": format!("ahp-session:/{}", uuid::Uuid::new_v4()), "provider": "scripted"}),
        )
        .await;
    let (rpc_code, message) = code_and_message(r);
    assert_eq!(rpc_code, -32600);
    assert!(message.contains("at most 2 sessions"), "{message}");
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

// Item 12: the store is readable by its owner only.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let base = temp_dir("private-store");
    let dir = base.join("data");
    let server = TestServer::start_with(Config {
        data_dir: Some(dir.clone()),
        ..Config::default()
    })
    .await;
    let c = server.client("c").await;
    c.create_session().await;
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "the data directory");
    for entry in std::fs::read_dir(&dir).expect("list") {
        let path = entry.expect("entry").path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&base);
}

// Scoped clients: the session count is not theirs to see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_client_sees_no_session_count() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    })
    .await;
    let url = |t: String| format!("{}?token={t}", server.url());
    let admin = TestClient::connect(&url(token("admin", Role::Admin, None)), "admin").await;
    let (mine, _) = admin.create_session().await;
    admin.create_session().await;
    let scoped =
        TestClient::connect(&url(token("bob", Role::Client, Some(vec![&mine]))), "bob").await;
    let snap = scoped.subscribe_raw("ahp-root://").await;
    let state = serde_json::to_value(&snap.snapshot.expect("snapshot").state).expect("json");
    assert!(
        state.get("activeSessions").is_none(),
        "the count of every tenant's sessions: {state}"
    );
    let mut root = scoped.client.attach_subscription("ahp-root://").await;
    let unscoped = TestClient::connect(&url(token("carol", Role::Client, None)), "carol").await;
    let snap = unscoped.subscribe_raw("ahp-root://").await;
    let state = serde_json::to_value(&snap.snapshot.expect("snapshot").state).expect("json");
    assert_eq!(state["activeSessions"], 2, "an unscoped client sees it");
    let mut all = unscoped.client.attach_subscription("ahp-root://").await;
    admin.create_session().await;
    // The unscoped client gets the new count...
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(ahp::SubscriptionEvent::Action(env)) = all.recv().await {
                if action_type(&env.action) == "root/activeSessionsChanged" {
                    return;
                }
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "unscoped clients see the count change");
    // ...and the scoped one does not, now or in a replay.
    let leaked = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            match root.recv().await {
                Some(ahp::SubscriptionEvent::Action(env)) => return action_type(&env.action),
                Some(_) => continue,
                None => return String::new(),
            }
        }
    })
    .await;
    assert!(leaked.is_err(), "a scoped client saw {leaked:?}");
    let again = TestClient::raw_connect(&url(token("bob", Role::Client, Some(vec![&mine])))).await;
    match again
        .reconnect("bob2".into(), 0, vec!["ahp-root://".into()])
        .await
        .expect("reconnect")
    {
        ReconnectResult::Replay(r) => assert!(
            r.actions
                .iter()
                .all(|e| action_type(&e.action) != "root/activeSessionsChanged"),
            "replayed to a scoped client"
        ),
        ReconnectResult::Snapshot(s) => {
            assert!(s.snapshots.iter().all(|s| serde_json::to_value(&s.state)
                .expect("json")
                .get("activeSessions")
                .is_none()))
        }
    }
    server.stop().await;
}

// Scoped clients: an unknown chat and another tenant's chat look the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_client_cannot_tell_a_foreign_chat_from_a_missing_one() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    })
    .await;
    let url = |t: String| format!("{}?token={t}", server.url());
    let admin = TestClient::connect(&url(token("admin", Role::Admin, None)), "admin").await;
    let (mine, _) = admin.create_session().await;
    let (_theirs, their_chat) = admin.create_session().await;
    let missing = format!("ahp-chat:/{}", uuid::Uuid::new_v4());
    let mut bob =
        TestClient::connect(&url(token("bob", Role::Client, Some(vec![&mine]))), "bob").await;
    for method in ["subscribe", "fetchTurns", "disposeChat"] {
        let foreign: Result<Value, _> = bob
            .client
            .request(method, json!({"channel": their_chat}))
            .await;
        let unknown: Result<Value, _> = bob
            .client
            .request(method, json!({"channel": missing}))
            .await;
        let ((fc, f), (uc, u)) = (code_and_message(foreign), code_and_message(unknown));
        assert_eq!(fc, uc, "{method}: {f} / {u}");
        assert_eq!(
            f.replace(&their_chat, "X"),
            u.replace(&missing, "X"),
            "{method}"
        );
    }
    let mut reasons = Vec::new();
    for channel in [&their_chat, &missing] {
        let seq = bob.dispatch(channel, draft("x")).await;
        let echo = bob.wait_echo(None, seq).await;
        reasons.push(
            echo.rejection_reason
                .unwrap_or_default()
                .replace(channel.as_str(), "X"),
        );
    }
    assert_eq!(reasons[0], reasons[1]);
    assert!(reasons[0].starts_with("PermissionDenied"), "{reasons:?}");
    server.stop().await;
}

// A `dispatchAction` sent as a request always gets an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_request_to_an_unknown_channel_is_answered() {
    let server = TestServer::start().await;
    let c = server.client("c").await;
    let r: Result<Value, _> = tokio::time::timeout(
        Duration::from_secs(5),
        c.client.request(
            "dispatchAction",
            json!({"channel": "ahp-chat:/nowhere", "clientSeq": 1, "action": {"type": "chat/draftChanged", "draft": {"text": "x"}}}),
        ),
    )
    .await
    .expect("an answer, not silence");
    assert_eq!(code(r), -32008, "NotFound");
    server.stop().await;
}

// A refused `initialize` leaves the connection uninitialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_initialize_leaves_the_connection_uninitialized() {
    let (server, session, chat) = with_subscription_limit(1).await;
    let fresh = TestClient::raw_connect(&server.url()).await;
    let r = fresh
        .initialize(
            "f".into(),
            vec!["1.0.0".into()],
            vec![session.clone(), chat.clone()],
        )
        .await;
    assert_eq!(code(r), -32600, "two subscriptions against a limit of one");
    let r: Result<Value, _> = fresh.request("listSessions", json!({})).await;
    assert_eq!(code(r), -32600, "not initialized");
    fresh
        .initialize("f".into(), vec!["1.0.0".into()], vec![session])
        .await
        .expect("initialize can be tried again");
    server.stop().await;
}
