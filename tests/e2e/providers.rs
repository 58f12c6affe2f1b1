//! External providers over the wire (`tandem/*`), forms, every interaction
//! outcome, and the approval policy — with several clients attached.

use crate::common;

use std::time::Duration;

use ahp_types::actions::StateAction;
use ahp_types::state::{ResponsePart, ToolCallConfirmationReason, ToolCallState, TurnState};
use common::provider::{session_with, Provider};
use common::*;
use serde_json::{json, Value};
use tandem::Config;

fn every_type_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email", "title": "Email", "minLength": 3, "maxLength": 60},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": 1, "maximum": 9, "default": 2},
            "agree": {"type": "boolean"},
            "size": {"type": "string", "enum": ["s", "m", "l"], "enumNames": ["Small", "Medium", "Large"]},
            "color": {"type": "string", "oneOf": [{"const": "red", "title": "Red"}, {"const": "blue", "title": "Blue"}]},
            "city": {"type": "string", "anyOf": [{"const": "paris", "title": "Paris"}, {"type": "string"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 2}
        },
        "required": ["email", "count", "size"]
    })
}

fn sub(v: Value) -> Value {
    json!({"state": "submitted", "value": v})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_provider_asks_a_form_that_two_clients_fill_together() {
    let server = TestServer::start().await;
    let mut agent = Provider::connect(&server.url(), "form-agent").await;
    let mut a = server.client("a").await;
    let mut b = server.client("b").await;
    let root = a.subscribe_raw("ahp-root://").await;
    assert!(
        format!("{root:?}").contains("form-agent"),
        "the provider is listed in root state"
    );
    let (_s, chat) = session_with(&a, "form-agent").await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;
    a.start_turn(&chat, "fill the form").await;
    let (tchat, turn, text) = agent.next_turn().await;
    assert_eq!(
        (tchat.as_str(), text.as_str()),
        (chat.as_str(), "fill the form")
    );

    let schema = every_type_schema();
    let pending = {
        let (chat, turn, schema) = (chat.clone(), turn.clone(), schema.clone());
        let client = agent.client.clone();
        tokio::spawn(async move {
            client
                .request::<_, Value>("tandem/requestInteraction", json!({"channel": chat, "turnId": turn, "interaction": {"kind": "form", "message": "Sign-up", "schema": schema}}))
                .await
                .expect("requestInteraction")
        })
    };
    let is_request = |e: &ahp_types::actions::ActionEnvelope| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    };
    a.wait_for(Some(&mut ma), is_request).await;
    b.wait_for(Some(&mut mb), is_request).await;
    let rid = open_request_id(&ma.state).expect("open form");
    let draft = |q: &str, v: Value| {
        action(
            json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": q, "answer": {"state": "draft", "value": v}}),
        )
    };
    // Concurrent drafts from both clients.
    tokio::join!(
        a.dispatch(
            &chat,
            draft("email", json!({"kind": "text", "value": "ann@example.com"}))
        ),
        b.dispatch(
            &chat,
            draft(
                "tags",
                json!({"kind": "selected-many", "value": ["a", "c"]})
            )
        ),
        a.dispatch(&chat, draft("count", json!({"kind": "number", "value": 7}))),
        b.dispatch(
            &chat,
            draft(
                "city",
                json!({"kind": "selected", "value": "", "freeformValues": ["Lyon"]})
            )
        ),
    );
    let done = b
        .dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {
            "email": sub(json!({"kind": "text", "value": "ann@example.com"})),
            "ratio": sub(json!({"kind": "number", "value": 0.5})),
            "count": sub(json!({"kind": "number", "value": 7})),
            "agree": sub(json!({"kind": "boolean", "value": true})),
            "size": sub(json!({"kind": "selected", "value": "m"})),
            "color": sub(json!({"kind": "selected", "value": "blue"})),
            "city": sub(json!({"kind": "selected", "value": "", "freeformValues": ["Lyon"]})),
            "tags": sub(json!({"kind": "selected-many", "value": ["a", "c"]}))
        }})))
        .await;
    let echo = b.wait_echo(Some(&mut mb), done).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );

    let settled = tokio::time::timeout(WAIT, pending)
        .await
        .expect("settled")
        .expect("task");
    assert_eq!(settled["outcome"], "answered");
    let content = &settled["content"];
    tandem::interactions::form::validate(&schema, content)
        .expect("content validates against the schema");
    assert_eq!(content["count"], json!(7));
    assert_eq!(content["city"], json!("Lyon"));
    assert_eq!(content["tags"], json!(["a", "c"]));

    agent.finish(&chat, &turn, "thanks").await;
    a.wait_state(&mut ma, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    b.wait_state(&mut mb, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    assert_eq!(ma.state, mb.state);
    assert_eq!(fresh_chat(&server, &chat).await, ma.state);

    // A schema outside the subset is refused, naming the keyword.
    a.start_turn(&chat, "bad form").await;
    let (_, turn2, _) = agent.next_turn().await;
    let bad = agent
        .client
        .request::<_, Value>("tandem/requestInteraction", json!({"channel": chat, "turnId": turn2, "interaction": {"kind": "form", "message": "x", "schema": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^a"}}}}}))
        .await;
    match bad {
        Err(ahp::ClientError::Rpc(e)) => {
            assert!(e.code == -32602 && e.message.contains("`pattern`"), "{e:?}")
        }
        other => panic!("expected -32602, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_reaches_the_provider_once() {
    let server = TestServer::start().await;
    let mut agent = Provider::connect(&server.url(), "outcomes").await;
    let mut u = server.client("user").await;
    let (_s, chat) = session_with(&u, "outcomes").await;
    let mut m = u.subscribe_chat(&chat).await;
    let ask = json!({"kind": "input", "request": {"id": "", "questions": [{"kind": "text", "id": "q", "message": "?"}]}});

    // Run one interaction in a fresh turn; `act` is what the user does.
    async fn round(
        agent: &mut Provider,
        u: &mut TestClient,
        m: &mut ChatMirror,
        chat: &str,
        mut interaction: Value,
        act: impl FnOnce(String, String) -> Vec<Value>,
    ) -> Value {
        u.start_turn(chat, "go").await;
        let (_, turn, _) = agent.next_turn().await;
        if interaction["kind"] == "input" {
            interaction["request"]["id"] = json!(uuid::Uuid::new_v4().to_string());
        }
        let call = agent.interact_later(chat, &turn, interaction);
        u.wait_state(m, |s| {
            s.active_turn.as_ref().is_some_and(|t| {
                t.response_parts.iter().any(|p| matches!(p, ResponsePart::InputRequest(i) if i.response.is_none())
                    || matches!(p, ResponsePart::ToolCall(tc) if matches!(tc.tool_call, ToolCallState::PendingConfirmation(_))))
            })
        })
        .await;
        let target = open_request_id(&m.state).unwrap_or_else(|| {
            m.state
                .active_turn
                .as_ref()
                .and_then(|t| {
                    t.response_parts.iter().find_map(|p| match p {
                        ResponsePart::ToolCall(tc) => match &tc.tool_call {
                            ToolCallState::PendingConfirmation(p) => Some(p.tool_call_id.clone()),
                            _ => None,
                        },
                        _ => None,
                    })
                })
                .unwrap_or_default()
        });
        for a in act(turn.clone(), target) {
            u.dispatch(chat, action(a)).await;
        }
        let settled = tokio::time::timeout(WAIT, call)
            .await
            .expect("settles")
            .expect("task")
            .expect("reply");
        // End the turn if the user did not.
        if m.state.active_turn.as_ref().is_some_and(|t| t.id == turn) {
            agent.finish(chat, &turn, "done").await;
        }
        u.wait_state(m, |s| s.active_turn.is_none()).await;
        settled
    }

    let complete = |resp: &'static str| {
        move |_t: String, rid: String| {
            vec![json!({"type": "chat/inputCompleted", "requestId": rid, "response": resp})]
        }
    };
    for (resp, outcome) in [("decline", "declined"), ("cancel", "cancelled")] {
        let s = round(
            &mut agent,
            &mut u,
            &mut m,
            &chat,
            ask.clone(),
            complete(resp),
        )
        .await;
        assert_eq!(s["outcome"], outcome);
        assert_eq!(s["response"], resp);
    }
    let s = round(&mut agent, &mut u, &mut m, &chat, ask.clone(), |_t, rid| {
        vec![json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"q": sub(json!({"kind": "text", "value": "yes"}))}})]
    })
    .await;
    assert_eq!(s["outcome"], "answered");
    assert_eq!(s["answers"]["q"]["value"]["value"], "yes");

    let tool = json!({"kind": "toolApproval", "toolCallId": "", "toolName": "deploy", "input": "{\"env\":\"prod\"}", "editable": true});
    let mut t1 = tool.clone();
    t1["toolCallId"] = json!("call-1");
    let s = round(&mut agent, &mut u, &mut m, &chat, t1, |turn, id| {
        vec![json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": id, "approved": true, "selectedOptionId": "approve-once", "editedToolInput": "{\"env\":\"staging\"}"})]
    })
    .await;
    assert_eq!(s["outcome"], "approved");
    assert_eq!(s["editedToolInput"], "{\"env\":\"staging\"}");
    let mut t2 = tool.clone();
    t2["toolCallId"] = json!("call-2");
    let s = round(&mut agent, &mut u, &mut m, &chat, t2, |turn, id| {
        vec![json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": id, "approved": false, "selectedOptionId": "deny", "reasonMessage": "not today"})]
    })
    .await;
    assert_eq!(s["outcome"], "denied");
    assert_eq!(s["reason"], "not today");

    let mut timed = ask.clone();
    timed["autoResolutionMs"] = json!(100);
    let s = round(&mut agent, &mut u, &mut m, &chat, timed, |_t, _r| vec![]).await;
    assert_eq!(s["outcome"], "timedOut");

    let s = round(
        &mut agent,
        &mut u,
        &mut m,
        &chat,
        ask.clone(),
        |turn, _r| vec![json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 1})],
    )
    .await;
    assert_eq!(s["outcome"], "interrupted");
    assert_eq!(
        m.state.turns.last().map(|t| t.state),
        Some(TurnState::Cancelled)
    );

    let s = round(&mut agent, &mut u, &mut m, &chat, ask.clone(), |_t, _r| {
        vec![json!({"type": "chat/pendingMessageSet", "kind": "steering", "id": "s1", "message": {"text": "use the other region", "origin": {"kind": "user"}}})]
    })
    .await;
    assert_eq!(s["outcome"], "clarified");
    assert_eq!(s["clarification"], "use the other region");

    // Aborted: the chat is disposed while the prompt is open.
    u.start_turn(&chat, "go").await;
    let (_, turn, _) = agent.next_turn().await;
    let mut last = ask.clone();
    last["request"]["id"] = json!("last");
    let call = agent.interact_later(&chat, &turn, last);
    u.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
    let _: Value = u
        .client
        .request("disposeChat", json!({"channel": chat}))
        .await
        .expect("disposeChat");
    let s = tokio::time::timeout(WAIT, call)
        .await
        .expect("settles")
        .expect("task")
        .expect("reply");
    assert_eq!(s["outcome"], "aborted");
    server.stop().await;
}

async fn set_mode(u: &mut TestClient, session: &str, mode: &str) {
    let seq = u
        .dispatch(
            session,
            action(json!({"type": "session/configChanged", "config": {"approvalMode": mode}})),
        )
        .await;
    let e = u.wait_echo(None, seq).await;
    assert!(e.rejection_reason.is_none(), "{:?}", e.rejection_reason);
}

fn tool_state(m: &ChatMirror, id: &str) -> Option<ToolCallState> {
    m.state
        .active_turn
        .iter()
        .flat_map(|t| &t.response_parts)
        .chain(m.state.turns.iter().flat_map(|t| &t.response_parts))
        .find_map(|p| match p {
            ResponsePart::ToolCall(tc)
                if tandem::channels::validate::tool_call_id_of(&tc.tool_call) == id =>
            {
                Some(tc.tool_call.clone())
            }
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_applies_from_the_next_checkpoint_and_grants_cover_one_tool_across_a_restart()
{
    let dir = temp_dir("policy");
    let config = Config {
        data_dir: Some(dir.join("data")),
        ..Config::default()
    };
    let server = TestServer::start_with(config.clone()).await;
    let mut agent = Provider::connect(&server.url(), "policy").await;
    let mut u = server.client("user").await;
    let (session, chat) = session_with(&u, "policy").await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(&chat, "tools please").await;
    let (_, turn, _) = agent.next_turn().await;
    let ask_tool = |id: &str, name: &str| json!({"kind": "toolApproval", "toolCallId": id, "toolName": name, "input": "{}"});

    // A confirmation is pending when the mode flips to always-allow.
    let first = agent.interact_later(&chat, &turn, ask_tool("c1", "write"));
    u.wait_state(&mut m, |_| true).await;
    u.wait_state(&mut m, |s| {
        tool_state(
            &ChatMirror {
                uri: String::new(),
                state: s.clone(),
                from_seq: 0,
            },
            "c1",
        )
        .is_some_and(|t| matches!(t, ToolCallState::PendingConfirmation(_)))
    })
    .await;
    set_mode(&mut u, &session, "always-allow").await;
    // The next call is confirmed by the setting.
    let s = agent.interact(&chat, &turn, ask_tool("c2", "delete")).await;
    assert_eq!(s["outcome"], "approved");
    u.wait_state(&mut m, |s| {
        tool_state(
            &ChatMirror {
                uri: String::new(),
                state: s.clone(),
                from_seq: 0,
            },
            "c2",
        )
        .is_some_and(|t| !matches!(t, ToolCallState::Streaming(_)))
    })
    .await;
    match tool_state(&m, "c2") {
        Some(ToolCallState::Running(r)) => {
            assert_eq!(r.confirmed, ToolCallConfirmationReason::Setting)
        }
        other => panic!("expected running by setting, got {other:?}"),
    }
    // c2 confirmed by the setting shows the chat had the new mode; the call
    // pending from before it was not settled by the change.
    assert!(
        matches!(
            tool_state(&m, "c1"),
            Some(ToolCallState::PendingConfirmation(_))
        ),
        "the pending one stays pending"
    );
    let state = u.subscribe_session(&session).await;
    assert_eq!(
        state
            .meta
            .as_ref()
            .and_then(|m| m.get("tandem/effectiveApprovalMode")),
        Some(&json!("always-allow"))
    );
    // Approve the first one for the whole session (a grant for `write`).
    u.dispatch(&chat, action(json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": "c1", "approved": true, "selectedOptionId": "approve-session"}))).await;
    assert_eq!(
        tokio::time::timeout(WAIT, first)
            .await
            .expect("settles")
            .expect("task")
            .expect("reply")["outcome"],
        "approved"
    );
    set_mode(&mut u, &session, "ask").await;
    // Grants: `write` is auto-confirmed, `delete` is not.
    let s = agent.interact(&chat, &turn, ask_tool("c3", "write")).await;
    assert_eq!(s["outcome"], "approved");
    let pending = agent.interact_later(&chat, &turn, ask_tool("c4", "delete"));
    u.wait_state(&mut m, |s| {
        tool_state(
            &ChatMirror {
                uri: String::new(),
                state: s.clone(),
                from_seq: 0,
            },
            "c4",
        )
        .is_some_and(|t| matches!(t, ToolCallState::PendingConfirmation(_)))
    })
    .await;
    u.dispatch(&chat, action(json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": "c4", "approved": false}))).await;
    assert_eq!(
        tokio::time::timeout(WAIT, pending)
            .await
            .expect("settles")
            .expect("task")
            .expect("reply")["outcome"],
        "denied"
    );
    agent.finish(&chat, &turn, "done").await;
    u.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    set_mode(&mut u, &session, "always-allow").await;
    u.client.shutdown().await;
    agent.client.shutdown().await;
    server.stop().await;

    // Both the mode and the grant survive a restart.
    let server = TestServer::start_with(config).await;
    let mut agent = Provider::connect(&server.url(), "policy").await;
    let mut u = server.client("user-2").await;
    let state = u.subscribe_session(&session).await;
    assert_eq!(
        state
            .config
            .as_ref()
            .map(|c| c.values["approvalMode"].clone()),
        Some(json!("always-allow"))
    );
    assert_eq!(
        state.meta.as_ref().and_then(|m| m.get("tandem/toolGrants")),
        Some(&json!(["write"]))
    );
    set_mode(&mut u, &session, "ask").await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(&chat, "again").await;
    let (_, turn, _) = agent.next_turn().await;
    assert_eq!(
        agent.interact(&chat, &turn, ask_tool("c5", "write")).await["outcome"],
        "approved"
    );
    agent.finish(&chat, &turn, "done").await;
    u.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_auto_confirm_a_tool_that_changes_data() {
    let server = TestServer::start().await;
    let mut agent = Provider::connect(&server.url(), "sneaky").await;
    let mut u = server.client("user").await;
    let (_s, chat) = session_with(&u, "sneaky").await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(&chat, "go").await;
    let (_, turn, _) = agent.next_turn().await;
    for (id, name, meta) in [
        ("w1", "write_file", json!(null)),
        ("r1", "read_file", json!({"tandem/readOnly": true})),
    ] {
        agent.act(&chat, json!({"type": "chat/toolCallStart", "turnId": turn, "toolCallId": id, "toolName": name, "displayName": name})).await;
        let mut ready = json!({"type": "chat/toolCallReady", "turnId": turn, "toolCallId": id, "invocationMessage": "run", "toolInput": "{}", "confirmed": "not-needed"});
        if !meta.is_null() {
            ready["_meta"] = meta;
        }
        agent.act(&chat, ready).await;
    }
    u.wait_state(&mut m, |s| {
        let m = ChatMirror {
            uri: String::new(),
            state: s.clone(),
            from_seq: 0,
        };
        tool_state(&m, "w1").is_some_and(|t| !matches!(t, ToolCallState::Streaming(_)))
            && tool_state(&m, "r1").is_some_and(|t| !matches!(t, ToolCallState::Streaming(_)))
    })
    .await;
    match tool_state(&m, "w1") {
        Some(ToolCallState::PendingConfirmation(p)) => {
            assert!(p.options.is_some(), "offered the approval options")
        }
        other => panic!("a data-changing tool must wait for a person, got {other:?}"),
    }
    assert!(
        matches!(tool_state(&m, "r1"), Some(ToolCallState::Running(_))),
        "a declared read-only tool runs"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_disappears_mid_turn_ends_it_after_the_grace_period() {
    let config = Config {
        provider_grace: Duration::from_millis(300),
        ..Config::default()
    };
    let server = TestServer::start_with(config).await;
    let mut agent = Provider::connect(&server.url(), "flaky").await;
    let mut a = server.client("a").await;
    let mut b = server.client("b").await;
    let (session, chat) = session_with(&a, "flaky").await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;
    a.start_turn(&chat, "go").await;
    let (_, turn, _) = agent.next_turn().await;
    let client = agent.client.clone();
    let (c2, t2) = (chat.clone(), turn.clone());
    tokio::spawn(async move {
        let _ = client
            .request::<_, Value>("tandem/requestInteraction", json!({"channel": c2, "turnId": t2, "interaction": {"kind": "input", "request": {"id": "r1", "message": "still there?"}}}))
            .await;
    });
    a.wait_state(&mut ma, |s| open_request_id(s).is_some())
        .await;
    agent.client.shutdown().await;
    drop(agent);

    for (c, m) in [(&mut a, &mut ma), (&mut b, &mut mb)] {
        c.wait_state(m, |s| s.active_turn.is_none() && !s.turns.is_empty())
            .await;
    }
    let last = ma.state.turns.last().expect("turn");
    assert_eq!(last.state, TurnState::Error);
    let part = last.response_parts.iter().find_map(|p| match p {
        ResponsePart::InputRequest(i) => Some(i.clone()),
        _ => None,
    });
    assert_eq!(part.expect("prompt kept").response, None);
    assert_eq!(ma.state, mb.state, "every client sees the same");
    let pending: Value = a
        .client
        .request("tandem/listPending", json!({"channel": session}))
        .await
        .expect("listPending");
    assert_eq!(pending["pending"], json!([]), "nothing is left waiting");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pending_shows_open_interactions_in_opening_order() {
    let server = TestServer::start().await;
    let mut agent = Provider::connect(&server.url(), "lister").await;
    let mut u = server.client("user").await;
    let (session, chat) = session_with(&u, "lister").await;
    let mut m = u.subscribe_chat(&chat).await;
    u.start_turn(&chat, "go").await;
    let (_, turn, _) = agent.next_turn().await;
    for (id, i) in [
        (
            "in-1",
            json!({"kind": "input", "request": {"id": "in-1", "message": "a?"}}),
        ),
        (
            "tc-1",
            json!({"kind": "toolApproval", "toolCallId": "tc-1", "toolName": "x", "input": "{}"}),
        ),
    ] {
        let (client, chat, turn) = (agent.client.clone(), chat.clone(), turn.clone());
        tokio::spawn(async move {
            let _ = client
                .request::<_, Value>(
                    "tandem/requestInteraction",
                    json!({"channel": chat, "turnId": turn, "interaction": i}),
                )
                .await;
        });
        // Opened (in the chat) before the next one is asked for.
        u.wait_state(&mut m, |s| {
            s.active_turn.as_ref().is_some_and(|t| {
                serde_json::to_string(&t.response_parts).is_ok_and(|p| p.contains(id))
            })
        })
        .await;
    }
    let list: Value = u
        .client
        .request("tandem/listPending", json!({"channel": session}))
        .await
        .expect("listPending");
    let items = list["pending"].as_array().expect("array");
    assert_eq!(items.len(), 2, "{list}");
    assert_eq!(items[0]["kind"], "input");
    assert_eq!(items[0]["requestId"], "in-1");
    assert_eq!(items[1]["kind"], "toolApproval");
    assert_eq!(items[1]["toolCallId"], "tc-1");
    assert!(items[0]["serverSeq"].as_u64() < items[1]["serverSeq"].as_u64());
    // Only the session's provider may ask people for things.
    let denied = u.client.request::<_, Value>("tandem/requestInteraction", json!({"channel": chat, "turnId": turn, "interaction": {"kind": "url", "message": "x", "url": "https://example.com"}})).await;
    assert!(matches!(denied, Err(ahp::ClientError::Rpc(e)) if e.code == -32009));
    server.stop().await;
}
