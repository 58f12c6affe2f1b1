//! Authentication, per-session authorization, and limits.

use crate::common;

use std::time::Duration;

use ahp::ClientError;
use ahp_types::commands::{ListSessionsResult, ReconnectResult};
use common::*;
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::{Config, Limits};

const SECRET: &[u8] = b"security-test-secret-0123456789abcdef";

fn token(sub: &str, role: Role, sessions: Option<Vec<&str>>, ttl: i64) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role,
            exp: (now_secs() as i64 + ttl) as u64,
            sessions: sessions.map(|s| s.into_iter().map(String::from).collect()),
            ..Default::default()
        })
        .expect("mint")
}

async fn connect(server: &TestServer, id: &str, token: &str) -> TestClient {
    TestClient::connect(&format!("{}?token={token}", server.url()), id).await
}

fn code(r: Result<Value, ClientError>) -> i32 {
    match r {
        Err(ClientError::Rpc(e)) => e.code,
        other => panic!("expected an RPC error, got {other:?}"),
    }
}

async fn secured(limits: Limits) -> TestServer {
    TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        limits,
        ..Config::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_need_a_valid_token() {
    let server = secured(Limits::default()).await;
    let http = |auth: Option<String>| {
        let url = server.url();
        async move {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut req = url.into_client_request().expect("request");
            if let Some(a) = auth {
                req.headers_mut()
                    .insert("Authorization", a.parse().expect("header"));
            }
            match tokio_tungstenite::connect_async(req).await {
                Ok(_) => 101,
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                Err(e) => panic!("unexpected {e}"),
            }
        }
    };
    assert_eq!(http(None).await, 401, "no token");
    assert_eq!(http(Some("Bearer nonsense".into())).await, 401, "garbage");
    assert_eq!(
        http(Some(format!(
            "Bearer {}",
            token("a", Role::Client, None, -5)
        )))
        .await,
        401,
        "expired"
    );
    let forged = Authenticator::new(b"some-other-secret-0123456789abcdefgh")
        .expect("key")
        .mint(&Claims {
            sub: "a".into(),
            role: Role::Admin,
            exp: now_secs() + 60,
            sessions: None,
            ..Default::default()
        })
        .expect("mint");
    assert_eq!(
        http(Some(format!("Bearer {forged}"))).await,
        401,
        "wrong signature"
    );
    assert_eq!(
        http(Some(format!(
            "Bearer {}",
            token("a", Role::Client, None, 60)
        )))
        .await,
        101,
        "header token"
    );
    let c = connect(&server, "q", &token("q", Role::Client, None, 60)).await;
    c.client.ping().await.expect("query-string token works");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_client_cannot_touch_a_foreign_session() {
    let server = secured(Limits::default()).await;
    let admin = connect(&server, "admin", &token("admin", Role::Admin, None, 60)).await;
    let (mine, my_chat) = admin.create_session().await;
    let (theirs, their_chat) = admin.create_session().await;
    // Something is waiting in theirs.
    admin
        .start_turn(
            &their_chat,
            r#"/ask {"questions":[{"kind":"text","id":"q","message":"?"}]}"#,
        )
        .await;
    let mut am = admin.subscribe_chat(&their_chat).await;
    let mut admin = admin;
    admin
        .wait_state(&mut am, |s| open_request_id(s).is_some())
        .await;
    let rid = open_request_id(&am.state).expect("open");
    let turn = am
        .state
        .active_turn
        .as_ref()
        .map(|t| t.id.clone())
        .expect("turn");

    let mut c = connect(
        &server,
        "scoped",
        &token("bob", Role::Client, Some(vec![&mine]), 60),
    )
    .await;
    // Commands on the foreign session.
    let denied = [
        ("subscribe", json!({"channel": theirs})),
        ("subscribe", json!({"channel": their_chat})),
        (
            "createChat",
            json!({"channel": theirs, "chat": "ahp-chat:/new-one"}),
        ),
        ("disposeChat", json!({"channel": their_chat})),
        ("disposeSession", json!({"channel": theirs})),
        ("fetchTurns", json!({"channel": their_chat})),
        ("tandem/listPending", json!({"channel": theirs})),
        (
            "createSession",
            json!({"channel": "ahp-session:/outside-my-scope", "provider": "scripted"}),
        ),
    ];
    for (method, params) in denied {
        assert_eq!(
            code(c.client.request(method, params.clone()).await),
            -32009,
            "{method} {params}"
        );
    }
    // Actions on it, including answering through the roll-up.
    let actions = [
        (
            their_chat.clone(),
            json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"q": {"state": "submitted", "value": {"kind": "text", "value": "x"}}}}),
        ),
        (
            their_chat.clone(),
            json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "q", "answer": {"state": "draft", "value": {"kind": "text", "value": "x"}}}),
        ),
        (
            their_chat.clone(),
            json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 1}),
        ),
        (
            theirs.clone(),
            json!({"type": "session/titleChanged", "title": "mine now"}),
        ),
    ];
    for (channel, a) in actions {
        let seq = c.dispatch(&channel, action(a.clone())).await;
        let echo = c.wait_echo(None, seq).await;
        assert!(
            echo.rejection_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("PermissionDenied")),
            "{a}: {:?}",
            echo.rejection_reason
        );
    }
    // Listing shows only its own session; the foreign prompt is untouched.
    let list: ListSessionsResult = c
        .client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    assert_eq!(
        list.items
            .iter()
            .map(|s| s.resource.as_str())
            .collect::<Vec<_>>(),
        vec![mine.as_str()]
    );
    let check = connect(&server, "checker", &token("checker", Role::Admin, None, 60)).await;
    assert_eq!(
        open_request_id(&check.subscribe_chat(&their_chat).await.state).as_deref(),
        Some(rid.as_str()),
        "nothing changed"
    );
    // Its own session works.
    c.subscribe_chat(&my_chat).await;
    // Root notifications about other sessions do not reach it.
    c.subscribe_raw("ahp-root://").await;
    let mut root = c.client.attach_subscription("ahp-root://").await;
    let _ = admin.create_session().await;
    let leaked = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            match root.recv().await {
                Some(ahp::SubscriptionEvent::SessionAdded(p)) => return p.summary.resource,
                Some(_) => continue,
                None => return String::new(),
            }
        }
    })
    .await;
    assert!(
        leaked.is_err(),
        "a foreign session was announced: {leaked:?}"
    );
    // Reconnect and initialize cannot reach it either.
    let back = TestClient::raw_connect(&format!(
        "{}?token={}",
        server.url(),
        token("bob", Role::Client, Some(vec![&mine]), 60)
    ))
    .await;
    match back
        .reconnect(
            "scoped".into(),
            0,
            vec![my_chat.clone(), their_chat.clone()],
        )
        .await
        .expect("reconnect")
    {
        ReconnectResult::Replay(r) => assert_eq!(r.missing, vec![their_chat.clone()]),
        ReconnectResult::Snapshot(s) => {
            assert!(s.snapshots.iter().all(|x| x.resource != their_chat))
        }
    }
    let init = TestClient::raw_connect(&format!(
        "{}?token={}",
        server.url(),
        token("bob", Role::Client, Some(vec![&mine]), 60)
    ))
    .await;
    let r = init
        .initialize("i".into(), vec!["1.0.0".into()], vec![their_chat.clone()])
        .await;
    assert!(matches!(r, Err(ClientError::Rpc(e)) if e.code == -32009));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_agents_register_providers_and_only_the_provider_sends_server_actions() {
    let server = secured(Limits::default()).await;
    let client = connect(&server, "c", &token("c", Role::Client, None, 60)).await;
    let reg = json!({"channel": "ahp-root://", "provider": "p1", "displayName": "P1"});
    assert_eq!(
        code(
            client
                .client
                .request("tandem/registerProvider", reg.clone())
                .await
        ),
        -32009
    );
    let agent = connect(&server, "a", &token("a", Role::Agent, None, 60)).await;
    let _: Value = agent
        .client
        .request("tandem/registerProvider", reg)
        .await
        .expect("agent registers");
    // A plain client cannot stream as the agent.
    let (_s, chat) = client.create_session().await;
    let mut client = client;
    let turn = client.start_turn(&chat, "hi").await;
    let seq = client
        .dispatch(
            &chat,
            action(json!({"type": "chat/delta", "turnId": turn, "partId": "p", "content": "x"})),
        )
        .await;
    let echo = client.wait_echo(None, seq).await;
    assert!(echo
        .rejection_reason
        .is_some_and(|r| r.contains("not a client-dispatchable")));
    server.stop().await;
}

/// A chat made by another connection (`x0`), closed again afterwards.
async fn admin_chat(server: &TestServer) -> (String, String) {
    let other = server.client("x0").await;
    let r = other.create_session().await;
    other.client.shutdown().await;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_with_clear_answers() {
    let limits = Limits {
        max_subscriptions_per_connection: 4,
        dispatches_per_sec: 5.0,
        dispatch_burst: 5.0,
        max_questions_per_request: 2,
        max_answer_chars: 10,
        max_sessions_per_token: 3,
        max_connections_per_token: 3,
        ..Limits::default()
    };
    let server = TestServer::start_with(Config {
        limits,
        ..Config::default()
    })
    .await;
    let mut c = server.client("limited").await;
    let (_s1, chat) = c.create_session().await;
    // Sessions per token (the local principal, shared by every connection
    // here): two here and one more elsewhere reach 3; a fourth is refused.
    let (_s2, chat2) = c.create_session().await;
    let _ = admin_chat(&server).await;
    let fourth = c
        .client
        .request::<_, Value>(
            "createSession",
            json!({"channel": format!("ahp-session:/{}", uuid::Uuid::new_v4())}),
        )
        .await;
    assert!(matches!(fourth, Err(ClientError::Rpc(e)) if e.message.contains("session limit")));
    // Subscriptions per connection: two sessions (create_session subscribes),
    // the chat and root make 4; a fifth channel is refused.
    c.subscribe_raw(&chat).await;
    c.subscribe_raw("ahp-root://").await;
    let over = c
        .client
        .request::<_, Value>("subscribe", json!({"channel": chat2}))
        .await;
    assert!(matches!(over, Err(ClientError::Rpc(e)) if e.message.contains("subscription limit")));
    // Questions per request.
    let mut m = c.subscribe_chat(&chat).await;
    c.start_turn(&chat, r#"/ask {"questions":[{"kind":"text","id":"a","message":"?"},{"kind":"text","id":"b","message":"?"},{"kind":"text","id":"c","message":"?"}]}"#).await;
    c.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let report = last_turn_markdown(&m.state).join("\n");
    assert!(
        report.starts_with("settled: aborted") && report.contains("the limit is 2"),
        "{report}"
    );
    // Answer length.
    c.start_turn(
        &chat,
        r#"/ask {"questions":[{"kind":"text","id":"a","message":"?"}]}"#,
    )
    .await;
    c.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
    let rid = open_request_id(&m.state).expect("open");
    let long = c.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "a", "answer": {"state": "draft", "value": {"kind": "text", "value": "far more than ten characters"}}}))).await;
    assert!(c
        .wait_echo(Some(&mut m), long)
        .await
        .rejection_reason
        .is_some_and(|r| r.contains("over the limit of 10")));
    // Dispatch rate: a burst of 20 drafts; some are refused as rate limited.
    let mut seqs = Vec::new();
    for i in 0..20 {
        seqs.push(c.dispatch(&chat, draft(&format!("d{i}"))).await);
    }
    // Rate-limit rejections are answered at once by the connection, before
    // earlier accepted echoes come back from the chat: collect them all.
    let mut waiting: std::collections::HashSet<i64> = seqs.into_iter().collect();
    let mut limited = 0;
    while !waiting.is_empty() {
        let e = c.next_envelope().await;
        m.apply(&e);
        if let Some(o) = &e.origin {
            if o.client_id == c.id
                && waiting.remove(&o.client_seq)
                && e.rejection_reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("rate limited"))
            {
                limited += 1;
            }
        }
    }
    assert!(limited >= 10, "{limited} of 20 were rate limited");
    // Connections per token: the local principal already has 1 here; open 2 more, the 4th is refused.
    let _a = server.client("x1").await;
    let _b = server.client("x2").await;
    let refused = ahp_ws::WebSocketTransport::connect(&server.url()).await;
    assert!(
        refused.is_err(),
        "the fourth connection of one token is refused"
    );
    server.stop().await;
}
