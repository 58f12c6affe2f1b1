//! The command surface: session and chat lifecycle, listing, paging, and the
//! AHP error codes each command answers with.

use crate::common;

use ahp::{ClientError, SubscriptionEvent};
use ahp_types::actions::StateAction;
use ahp_types::commands::ListSessionsResult;
use ahp_types::state::{RootState, SessionLifecycle, SnapshotState};
use common::*;
use serde_json::{json, Value};

fn code(e: ClientError) -> i32 {
    match e {
        ClientError::Rpc(e) => e.code,
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_chat_lifecycle_with_notifications() {
    let server = TestServer::start().await;
    let c = server.client("lifecycle").await;
    let root = c
        .subscribe_raw("ahp-root://")
        .await
        .snapshot
        .expect("root snapshot");
    let SnapshotState::Root(root_state) = root.state else {
        panic!("root state")
    };
    let RootState { agents, .. } = *root_state;
    assert!(
        agents.iter().any(|a| a.provider == "scripted"),
        "the scripted agent is always registered"
    );
    let mut root_sub = c.client.attach_subscription("ahp-root://").await;

    let (session, chat) = c.create_session().await;
    let state = c.subscribe_session(&session).await;
    assert_eq!(state.lifecycle, SessionLifecycle::Ready);
    assert_eq!(state.chats.len(), 1);
    assert_eq!(state.chats[0].resource, chat);

    // root/sessionAdded reached the root subscriber.
    let mut added = false;
    while !added {
        match tokio::time::timeout(WAIT, root_sub.recv())
            .await
            .expect("root event")
            .expect("open")
        {
            SubscriptionEvent::SessionAdded(p) => added = p.summary.resource == session,
            _ => continue,
        }
    }

    // Errors: existing URI, unknown provider, malformed URI.
    let dup = c
        .client
        .request::<_, Value>(
            "createSession",
            json!({"channel": session, "provider": "scripted"}),
        )
        .await;
    assert_eq!(code(dup.expect_err("duplicate")), -32003);
    let other = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let bad = c
        .client
        .request::<_, Value>(
            "createSession",
            json!({"channel": other, "provider": "nobody"}),
        )
        .await;
    assert_eq!(code(bad.expect_err("unknown provider")), -32002);
    let bad = c
        .client
        .request::<_, Value>("createSession", json!({"channel": "not-a-session"}))
        .await;
    assert_eq!(code(bad.expect_err("bad uri")), -32602);

    // A second chat, then dispose it.
    let second = format!("ahp-chat:/{}", uuid::Uuid::new_v4());
    let _: Value = c
        .client
        .request("createChat", json!({"channel": session, "chat": second}))
        .await
        .expect("createChat");
    let mut m = c.subscribe_chat(&second).await;
    assert!(m.state.turns.is_empty());
    let dup = c
        .client
        .request::<_, Value>("createChat", json!({"channel": session, "chat": second}))
        .await;
    assert_eq!(code(dup.expect_err("duplicate chat")), -32010);
    let bad = c
        .client
        .request::<_, Value>(
            "createChat",
            json!({"channel": "ahp-session:/nope", "chat": "ahp-chat:/x"}),
        )
        .await;
    assert_eq!(code(bad.expect_err("unknown session")), -32001);
    let mut c = c;
    c.start_turn(&second, "hi").await;
    c.wait_for(Some(&mut m), |e| {
        matches!(e.action, StateAction::ChatTurnComplete(_))
    })
    .await;
    let _: Value = c
        .client
        .request("disposeChat", json!({"channel": second}))
        .await
        .expect("disposeChat");
    c.wait_for(
        None,
        |e| matches!(&e.action, StateAction::SessionChatRemoved(r) if r.chat == second),
    )
    .await;
    let gone = c
        .client
        .request::<_, Value>("subscribe", json!({"channel": second}))
        .await;
    assert_eq!(code(gone.expect_err("disposed chat")), -32008);

    // fetchTurns: no older page exists; a foreign cursor is invalid params.
    let ok: Value = c
        .client
        .request("fetchTurns", json!({"channel": chat}))
        .await
        .expect("fetchTurns");
    assert_eq!(ok, json!({}));
    let bad = c
        .client
        .request::<_, Value>("fetchTurns", json!({"channel": chat, "cursor": "made-up"}))
        .await;
    assert_eq!(code(bad.expect_err("cursor")), -32602);

    // Dispose the session: root/sessionRemoved, then it is gone.
    let _: Value = c
        .client
        .request("disposeSession", json!({"channel": session}))
        .await
        .expect("disposeSession");
    let mut removed = false;
    while !removed {
        match tokio::time::timeout(WAIT, root_sub.recv())
            .await
            .expect("root event")
            .expect("open")
        {
            SubscriptionEvent::SessionRemoved(p) => removed = p.session == session,
            _ => continue,
        }
    }
    // The reply came after the session left the registry: it is gone now.
    let gone = c
        .client
        .request::<_, Value>("subscribe", json!({"channel": session}))
        .await;
    assert_eq!(code(gone.expect_err("disposed session")), -32001);
    let gone = c
        .client
        .request::<_, Value>("disposeSession", json!({"channel": session}))
        .await;
    assert_eq!(code(gone.expect_err("disposed twice")), -32001);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_pages_most_recent_first() {
    let server = TestServer::start().await;
    let c = server.client("lister").await;
    let mut created = Vec::new();
    for _ in 0..7 {
        created.push(c.create_session().await.0);
        // The next one is created in a later millisecond (the timestamps'
        // resolution), so "most recent first" has one answer.
        let stamp = tandem::time::now_rfc3339();
        while tandem::time::now_rfc3339() == stamp {
            tokio::task::yield_now().await;
        }
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut params = json!({"channel": "ahp-root://", "limit": 3});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page: ListSessionsResult = c
            .client
            .request("listSessions", params)
            .await
            .expect("listSessions");
        assert!(page.items.len() <= 3);
        seen.extend(
            page.items
                .iter()
                .map(|s| (s.resource.clone(), s.modified_at.clone())),
        );
        match page.next_cursor {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), 7, "every session exactly once");
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    assert_eq!(seen, sorted, "most recently modified first");
    let bad = c
        .client
        .request::<_, Value>(
            "listSessions",
            json!({"channel": "ahp-root://", "cursor": "x"}),
        )
        .await;
    assert_eq!(code(bad.expect_err("bad cursor")), -32602);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_rules() {
    let server = TestServer::start().await;
    // Methods before initialize are refused; ping works.
    let raw = TestClient::raw_connect(&server.url()).await;
    raw.ping().await.expect("ping before initialize");
    let early = raw
        .request::<_, Value>("listSessions", json!({"channel": "ahp-root://"}))
        .await;
    assert_eq!(code(early.expect_err("before initialize")), -32600);
    // Unsupported versions: -32005 with supportedVersions.
    let bad = raw
        .initialize("x".into(), vec!["9.0.0".into()], vec![])
        .await;
    match bad {
        Err(ClientError::Rpc(e)) => {
            assert_eq!(e.code, -32005);
            assert!(e.data.expect("data")["supportedVersions"]
                .as_array()
                .is_some_and(|v| !v.is_empty()));
        }
        other => panic!("expected -32005, got {other:?}"),
    }
    // initialSubscriptions come back as snapshots; serverSeq is current.
    let init = raw
        .initialize("x".into(), vec!["1.0.0".into()], vec!["ahp-root://".into()])
        .await
        .expect("initialize");
    assert_eq!(init.protocol_version, "1.0.0");
    assert_eq!(init.snapshots.len(), 1);
    assert_eq!(init.snapshots[0].resource, "ahp-root://");
    let again = raw
        .initialize("x".into(), vec!["1.0.0".into()], vec![])
        .await;
    assert_eq!(code(again.expect_err("twice")), -32600);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_actions_are_validated_and_config_changes_are_idempotent() {
    let server = TestServer::start().await;
    let mut c = server.client("sess").await;
    let (session, _chat) = c.create_session().await;
    let title = c
        .dispatch(
            &session,
            action(json!({"type": "session/titleChanged", "title": "Release train"})),
        )
        .await;
    assert!(c.wait_echo(None, title).await.rejection_reason.is_none());
    let mode = c.dispatch(&session, action(json!({"type": "session/configChanged", "config": {"approvalMode": "always-allow"}}))).await;
    assert!(c.wait_echo(None, mode).await.rejection_reason.is_none());
    let same = c.dispatch(&session, action(json!({"type": "session/configChanged", "config": {"approvalMode": "always-allow"}}))).await;
    assert!(c
        .wait_echo(None, same)
        .await
        .rejection_reason
        .is_some_and(|r| r.contains("no change")));
    let bad = c
        .dispatch(
            &session,
            action(
                json!({"type": "session/configChanged", "config": {"approvalMode": "sometimes"}}),
            ),
        )
        .await;
    assert!(c
        .wait_echo(None, bad)
        .await
        .rejection_reason
        .is_some_and(|r| r.contains("not an allowed value")));
    let unknown = c
        .dispatch(
            &session,
            action(json!({"type": "session/configChanged", "config": {"colour": "blue"}})),
        )
        .await;
    assert!(c
        .wait_echo(None, unknown)
        .await
        .rejection_reason
        .is_some_and(|r| r.contains("unknown session config property")));
    let server_only = c
        .dispatch(&session, action(json!({"type": "session/ready"})))
        .await;
    assert!(c
        .wait_echo(None, server_only)
        .await
        .rejection_reason
        .is_some_and(|r| r.contains("not a client-dispatchable")));
    let root = c
        .dispatch(
            "ahp-root://",
            action(json!({"type": "root/activeSessionsChanged", "activeSessions": 99})),
        )
        .await;
    assert!(c.wait_echo(None, root).await.rejection_reason.is_some());
    let state = c.subscribe_session(&session).await;
    assert_eq!(state.title, "Release train");
    assert_eq!(
        state.config.expect("config").values["approvalMode"],
        "always-allow"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_title_change_reaches_session_lists() {
    let server = TestServer::start().await;
    let mut c = server.client("titles").await;
    let (session, _chat) = c.create_session().await;
    c.subscribe_raw("ahp-root://").await;
    let mut root = c.client.attach_subscription("ahp-root://").await;
    let seq = c
        .dispatch(
            &session,
            action(json!({"type": "session/titleChanged", "title": "Renamed"})),
        )
        .await;
    c.wait_echo(None, seq).await;
    let changed = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(SubscriptionEvent::SessionSummaryChanged(p)) = root.recv().await {
                return p;
            }
        }
    })
    .await
    .expect("root/sessionSummaryChanged");
    assert_eq!(changed.session, session);
    assert_eq!(changed.changes.title.as_deref(), Some("Renamed"));
    let list: ListSessionsResult = c
        .client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    assert_eq!(list.items[0].title, "Renamed");
    server.stop().await;
}
