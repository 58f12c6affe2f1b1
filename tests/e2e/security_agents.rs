//! What an agent may not do: take over another subject's provider id (also
//! after a restart), receive turns of sessions its token may not use, or
//! make a person's decisions (approve its own tool call, answer its own
//! questions, switch its session to `always-allow`). And a provider asking
//! more questions than the limit gets `-32602`, as the README says.

use crate::common;

use std::sync::Arc;

use ahp::ClientError;
use ahp_types::state::{ResponsePart, ToolCallState, TurnState};
use common::provider::{session_at, session_with, Provider};
use common::*;
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::store::MemoryJournal;
use tandem::{Config, Limits};

const SECRET: &[u8] = b"agents-test-secret-0123456789abcdef";

/// Lifetime of the tokens minted here.
const TOKEN_TTL_SECS: u64 = 600;

fn token(sub: &str, role: Role, sessions: Option<Vec<&str>>) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role,
            exp: now_secs() + TOKEN_TTL_SECS,
            sessions: sessions.map(|s| s.into_iter().map(String::from).collect()),
            ..Default::default()
        })
        .expect("mint")
}

fn secured_config() -> Config {
    Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    }
}

fn with_token(server_url: &str, token: &str) -> String {
    format!("{server_url}?token={token}")
}

/// The JSON-RPC error of a request that must fail.
fn rpc_error(r: Result<Value, ClientError>) -> ahp_types::messages::JsonRpcError {
    match r {
        Err(ClientError::Rpc(e)) => e,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_id_stays_with_the_subject_that_first_registered_it() {
    let server = TestServer::start_with(secured_config()).await;
    let agent_a = |n: u32| {
        let url = with_token(&server.url(), &token("agent-a", Role::Agent, None));
        async move { Provider::open(&url, &format!("agent-a-{n}")).await }
    };
    let mut a = agent_a(1).await;
    a.register("helper")
        .await
        .expect("the first registration binds the id");
    let mut u = TestClient::connect(
        &with_token(&server.url(), &token("user", Role::Client, None)),
        "user",
    )
    .await;
    let (_s, chat) = session_with(&u, "helper").await;
    let mut m = u.subscribe_chat(&chat).await;
    let turn = u.start_turn(&chat, "my password is hunter2").await;
    assert_eq!(a.next_turn().await.1, turn);
    a.client.shutdown().await;
    drop(a);
    // Only the user is left: the provider's connection is gone and its turn
    // waits for it to come back.
    wait_connections(server.addr, 1).await;

    // Another agent, scoped to an unrelated session, cannot take the id over.
    let b = Provider::open(
        &with_token(
            &server.url(),
            &token("agent-b", Role::Agent, Some(vec!["ahp-session:/unrelated"])),
        ),
        "agent-b",
    )
    .await;
    let e = rpc_error(b.register("helper").await);
    assert_eq!(e.code, -32009, "{e:?}");
    assert!(e.message.contains("first registered"), "{e:?}");

    // Its owner can, on a new connection, and gets the waiting turn.
    let mut a = agent_a(2).await;
    a.register("helper").await.expect("the owner re-registers");
    let (tchat, tturn, text) = a.next_turn().await;
    assert_eq!(
        (tchat.as_str(), tturn.as_str(), text.as_str()),
        (chat.as_str(), turn.as_str(), "my password is hunter2")
    );
    a.finish(&chat, &turn, "done").await;
    u.wait_state(&mut m, |s| s.turns.iter().any(|t| t.id == turn))
        .await;
    a.client.shutdown().await;
    drop(a);
    wait_connections(server.addr, 2).await;

    // So can an admin (an operator replacing a broken agent).
    let mut admin = Provider::open(
        &with_token(&server.url(), &token("ops", Role::Admin, None)),
        "ops",
    )
    .await;
    admin.register("helper").await.expect("an admin may");
    let turn = u.start_turn(&chat, "again").await;
    assert_eq!(admin.next_turn().await.1, turn);
    server.stop().await;
}

/// Register `keeper` as `agent-a`, restart on the same store, and check that
/// another subject still cannot have it while its owner can.
async fn the_binding_survives_a_restart(config: Config, memory: Option<Arc<MemoryJournal>>) {
    let start = || {
        let (config, memory) = (config.clone(), memory.clone());
        async move {
            match memory {
                Some(j) => TestServer::start_with_journal(config, j).await,
                None => TestServer::start_with(config).await,
            }
        }
    };
    let server = start().await;
    let owner = token("agent-a", Role::Agent, None);
    let a = Provider::open(&with_token(&server.url(), &owner), "agent-a").await;
    a.register("keeper").await.expect("binds");
    let user = token("user", Role::Client, None);
    let u = TestClient::connect(&with_token(&server.url(), &user), "user").await;
    let (_s, chat) = session_with(&u, "keeper").await;
    a.client.shutdown().await;
    u.client.shutdown().await;
    server.stop().await;

    let server = start().await;
    let b = Provider::open(
        &with_token(&server.url(), &token("agent-b", Role::Agent, None)),
        "agent-b",
    )
    .await;
    let e = rpc_error(b.register("keeper").await);
    assert_eq!(
        e.code, -32009,
        "the first to register after a restart: {e:?}"
    );
    let mut a = Provider::open(&with_token(&server.url(), &owner), "agent-a").await;
    a.register("keeper")
        .await
        .expect("the owner registers again");
    let u = TestClient::connect(&with_token(&server.url(), &user), "user").await;
    let turn = u.start_turn(&chat, "after the restart").await;
    assert_eq!(a.next_turn().await.1, turn);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_binding_survives_a_restart_on_sqlite() {
    let dir = temp_dir("owners");
    let config = Config {
        data_dir: Some(dir.join("data")),
        ..secured_config()
    };
    the_binding_survives_a_restart(config, None).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_binding_survives_a_restart_on_the_memory_store() {
    let journal = Arc::new(MemoryJournal::new());
    the_binding_survives_a_restart(secured_config(), Some(journal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_agent_gets_no_turns_and_asks_nothing_outside_its_sessions() {
    let server = TestServer::start_with(secured_config()).await;
    let mine = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let mut a = Provider::open(
        &with_token(
            &server.url(),
            &token("agent-a", Role::Agent, Some(vec![&mine])),
        ),
        "agent-a",
    )
    .await;
    a.register("scoped").await.expect("registers");
    let mut u = TestClient::connect(
        &with_token(&server.url(), &token("user", Role::Client, None)),
        "user",
    )
    .await;
    session_at(&u, &mine, "scoped").await;
    let my_chat = u
        .subscribe_session(&mine)
        .await
        .default_chat
        .expect("default chat");
    let (other, other_chat) = session_with(&u, "scoped").await;
    let mut m = u.subscribe_chat(&other_chat).await;

    let foreign = u.start_turn(&other_chat, "the other team's secret").await;
    u.wait_state(&mut m, |s| s.active_turn.is_some() || !s.turns.is_empty())
        .await;
    let own = u.start_turn(&my_chat, "hello").await;
    let (tchat, tturn, _) = a.next_turn().await;
    assert_eq!(
        (tchat.as_str(), tturn.as_str()),
        (my_chat.as_str(), own.as_str()),
        "the first turn it receives is its own session's"
    );
    // The foreign turn ended at once, saying why.
    u.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let last = m.state.turns.last().expect("turn");
    assert_eq!(
        (last.id.as_str(), last.state),
        (foreign.as_str(), TurnState::Error)
    );
    let why = serde_json::to_string(&last.response_parts).expect("json");
    assert!(
        why.contains("ProviderNotPermitted")
            && why.contains("may not serve session")
            && why.contains(&other),
        "{why}"
    );
    // Nor can it open an interaction there.
    let e = rpc_error(
        a.client
            .request(
                "tandem/requestInteraction",
                json!({"channel": other_chat, "turnId": foreign, "interaction": {"kind": "url", "message": "log in", "url": "https://example.com"}}),
            )
            .await,
    );
    assert_eq!(e.code, -32009, "{e:?}");
    a.finish(&my_chat, &own, "hi").await;
    server.stop().await;
}

/// The pending tool call `id` in `state`'s active turn, if it waits for a person.
fn pending_tool(state: &ahp_types::state::ChatState, id: &str) -> bool {
    state.active_turn.as_ref().is_some_and(|t| {
        t.response_parts.iter().any(|p| {
            matches!(p, ResponsePart::ToolCall(tc)
                if matches!(&tc.tool_call, ToolCallState::PendingConfirmation(c) if c.tool_call_id == id))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_approve_its_own_tool_call_or_relax_its_session() {
    let server = TestServer::start().await;
    let mut agent = Provider::connect(&server.url(), "self-approver").await;
    let mut u = server.client("user").await;
    let (session, chat) = session_with(&u, "self-approver").await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(&chat, "deploy please").await;
    let (_, turn, _) = agent.next_turn().await;
    let approval = agent.interact_later(
        &chat,
        &turn,
        json!({"kind": "toolApproval", "toolCallId": "deploy-1", "toolName": "deploy", "input": "{}"}),
    );
    u.wait_state(&mut m, |s| pending_tool(s, "deploy-1")).await;

    // The provider connection approves its own call for the whole session,
    // then tries to make every later call pass.
    let attempts = [
        (
            chat.clone(),
            json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": "deploy-1", "approved": true, "selectedOptionId": "approve-session"}),
        ),
        (
            session.clone(),
            json!({"type": "session/configChanged", "config": {"approvalMode": "always-allow"}}),
        ),
        (
            chat.clone(),
            json!({"type": "chat/draftChanged", "draft": {"text": "typed by the agent", "origin": {"kind": "user"}}}),
        ),
    ];
    for (channel, a) in attempts {
        let seq = agent.act(&channel, a.clone()).await;
        let echo = agent.wait_echo(seq).await;
        assert!(
            echo.rejection_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("PermissionDenied")
                    && r.contains("person's act")
                    && r.contains("serves a provider")),
            "{a}: {:?}",
            echo.rejection_reason
        );
    }
    assert!(pending_tool(&fresh_chat(&server, &chat).await, "deploy-1"));

    // The person decides.
    let seq = u
        .dispatch(
            &chat,
            action(
                json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": "deploy-1", "approved": false, "selectedOptionId": "deny"}),
            ),
        )
        .await;
    let echo = u.wait_echo(Some(&mut m), seq).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    let settled = tokio::time::timeout(WAIT, approval)
        .await
        .expect("settles")
        .expect("task")
        .expect("reply");
    assert_eq!(settled["outcome"], "denied");
    let state = u.subscribe_session(&session).await;
    let meta = state.meta.unwrap_or_default();
    assert!(
        meta.get("tandem/toolGrants")
            .is_none_or(|g| g.as_array().is_some_and(Vec::is_empty)),
        "no grant: {meta:?}"
    );
    assert_eq!(
        meta.get("tandem/effectiveApprovalMode"),
        Some(&json!("ask")),
        "{meta:?}"
    );
    agent.finish(&chat, &turn, "not deployed").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_cannot_answer_a_persons_question_on_any_chat() {
    let server = TestServer::start_with(secured_config()).await;
    let mut u = TestClient::connect(
        &with_token(&server.url(), &token("user", Role::Client, None)),
        "user",
    )
    .await;
    let (_s, chat) = u.create_session().await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(
        &chat,
        r#"/ask {"questions":[{"kind":"text","id":"q","message":"password?"}]}"#,
    )
    .await;
    u.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
    let rid = open_request_id(&m.state).expect("open");

    // An agent token that serves no provider at all.
    let mut agent = Provider::open(
        &with_token(&server.url(), &token("agent-x", Role::Agent, None)),
        "agent-x",
    )
    .await;
    let answer = json!({"state": "submitted", "value": {"kind": "text", "value": "guess"}});
    for a in [
        json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "q", "answer": answer}),
        json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"q": answer}}),
    ] {
        let seq = agent.act(&chat, a.clone()).await;
        let echo = agent.wait_echo(seq).await;
        assert!(
            echo.rejection_reason
                .as_deref()
                .is_some_and(|r| r.contains("person's act") && r.contains("`agent` role")),
            "{a}: {:?}",
            echo.rejection_reason
        );
    }
    assert_eq!(
        open_request_id(&fresh_chat_with(&server, &chat).await).as_deref(),
        Some(rid.as_str()),
        "still open"
    );
    // The person answers.
    let seq = u.dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"q": {"state": "submitted", "value": {"kind": "text", "value": "mine"}}}}))).await;
    let echo = u.wait_echo(Some(&mut m), seq).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    u.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let md = last_turn_markdown(&m.state).join("\n");
    assert!(
        md.starts_with("settled: answered") && md.contains("mine"),
        "{md}"
    );
    server.stop().await;
}

/// A fresh snapshot of `chat` on a secured server (an admin token).
async fn fresh_chat_with(server: &TestServer, chat: &str) -> ahp_types::state::ChatState {
    let c = TestClient::connect(
        &with_token(&server.url(), &token("checker", Role::Admin, None)),
        "checker",
    )
    .await;
    let m = c.subscribe_chat(chat).await;
    c.client.shutdown().await;
    m.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_questions_from_a_provider_are_a_params_error_naming_the_limit() {
    let server = TestServer::start_with(Config {
        limits: Limits {
            max_questions_per_request: 2,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let mut agent = Provider::connect(&server.url(), "asker").await;
    let u = server.client("user").await;
    let (_s, chat) = session_with(&u, "asker").await;
    u.start_turn(&chat, "ask me").await;
    let (_, turn, _) = agent.next_turn().await;
    let q = |id: &str| json!({"kind": "text", "id": id, "message": "?"});
    let three_props = json!({"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"}
    }});
    for interaction in [
        json!({"kind": "input", "request": {"id": "r1", "questions": [q("a"), q("b"), q("c")]}}),
        json!({"kind": "form", "message": "three", "schema": three_props}),
    ] {
        let e = rpc_error(
            agent
                .client
                .request(
                    "tandem/requestInteraction",
                    json!({"channel": chat, "turnId": turn, "interaction": interaction}),
                )
                .await,
        );
        assert_eq!(e.code, -32602, "{e:?}");
        assert!(
            e.message.contains("the limit is 2") && e.message.contains("max_questions_per_request"),
            "{e:?}"
        );
    }
    agent.finish(&chat, &turn, "fine").await;
    server.stop().await;
}
