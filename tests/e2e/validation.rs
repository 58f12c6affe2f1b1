//! Every row of the PROTOCOL.md validation table, over the wire: each invalid
//! action comes back to its sender only, with a `rejectionReason`, and the
//! chat a fresh subscriber sees is unchanged.

use crate::common;

use ahp_types::actions::StateAction;
use common::*;
use serde_json::{json, Value};

/// Dispatch `action` (raw JSON) and check it is rejected with a reason
/// containing `needle`, leaving the chat exactly as it was.
async fn assert_rejected(
    server: &TestServer,
    c: &mut TestClient,
    chat: &str,
    name: &str,
    action: Value,
    needle: &str,
) {
    let before = fresh_chat(server, chat).await;
    let decoded: StateAction =
        serde_json::from_value(action.clone()).unwrap_or(StateAction::Unknown(action.clone()));
    let seq = c.dispatch(chat, decoded).await;
    let echo = c.wait_echo(None, seq).await;
    let reason = echo
        .rejection_reason
        .unwrap_or_else(|| panic!("{name}: accepted, expected a rejection"));
    assert!(
        reason.contains(needle),
        "{name}: reason {reason:?} should mention {needle:?}"
    );
    assert_eq!(echo.channel, chat, "{name}");
    let after = fresh_chat(server, chat).await;
    assert_eq!(
        before, after,
        "{name}: a rejected action must leave the chat unchanged"
    );
}

fn text(state: &str, v: &str) -> Value {
    json!({"state": state, "value": {"kind": "text", "value": v}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_rule_rejects_and_changes_nothing() {
    let server = TestServer::start().await;
    let mut c = server.client("validator").await;
    let (_s, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;

    // An open request with one question of each bounded kind.
    let ask = json!({"questions": [
        {"kind": "text", "id": "name", "message": "Name", "required": true, "min": 2, "max": 5},
        {"kind": "integer", "id": "count", "message": "Count", "min": 1, "max": 10},
        {"kind": "single-select", "id": "pick", "message": "Pick", "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]},
        {"kind": "multi-select", "id": "many", "message": "Many", "max": 2, "options": [{"id": "x", "label": "X"}, {"id": "y", "label": "Y"}, {"id": "z", "label": "Z"}]}
    ]});
    let turn = c.start_turn(&chat, &format!("/ask {ask}")).await;
    c.wait_for(Some(&mut m), |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let rid = open_request_id(&m.state).expect("open request");
    let answer = |q: &str, a: Value| json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": q, "answer": a});

    let rows: Vec<(&str, Value, &str)> = vec![
        (
            "unknown request",
            json!({"type": "chat/inputAnswerChanged", "requestId": "nope", "questionId": "name", "answer": text("draft", "x")}),
            "no open input request `nope`",
        ),
        (
            "unknown question",
            answer("zzz", text("draft", "x")),
            "question `zzz`",
        ),
        (
            "draft without value",
            answer("name", json!({"state": "draft"})),
            "value is missing",
        ),
        (
            "submitted without value",
            answer("name", json!({"state": "submitted"})),
            "value is missing",
        ),
        (
            "kind mismatch",
            answer(
                "name",
                json!({"state": "draft", "value": {"kind": "number", "value": 3}}),
            ),
            "does not fit `name`",
        ),
        (
            "integer needs a whole number",
            answer(
                "count",
                json!({"state": "draft", "value": {"kind": "number", "value": 2.5}}),
            ),
            "not a whole number",
        ),
        (
            "boolean for select",
            answer(
                "pick",
                json!({"state": "draft", "value": {"kind": "boolean", "value": true}}),
            ),
            "does not fit `pick`",
        ),
        (
            "unknown option",
            answer(
                "pick",
                json!({"state": "draft", "value": {"kind": "selected", "value": "c"}}),
            ),
            "option `c`",
        ),
        (
            "free-form not allowed",
            answer(
                "pick",
                json!({"state": "draft", "value": {"kind": "selected", "value": "a", "freeformValues": ["other"]}}),
            ),
            "free-form",
        ),
        (
            "text too long when submitted",
            answer("name", text("submitted", "toolong")),
            "at most 5",
        ),
        (
            "number above max when submitted",
            answer(
                "count",
                json!({"state": "submitted", "value": {"kind": "number", "value": 11}}),
            ),
            "maximum is 10",
        ),
        (
            "too many selections when submitted",
            answer(
                "many",
                json!({"state": "submitted", "value": {"kind": "selected-many", "value": ["x", "y", "z"]}}),
            ),
            "at most 2",
        ),
        (
            "accept without required answer",
            json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept"}),
            "required question `name`",
        ),
        (
            "accept with a draft for a required question",
            json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"name": text("draft", "Ann")}}),
            "required question `name`",
        ),
        (
            "accept with an invalid overlaid answer",
            json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"name": text("submitted", "A")}}),
            "at least 2",
        ),
        (
            "complete an unknown request",
            json!({"type": "chat/inputCompleted", "requestId": "nope", "response": "decline"}),
            "no open input request `nope`",
        ),
        (
            "turn started while one is active",
            serde_json::to_value(turn_started("another", "hi")).unwrap(),
            "TurnInProgress",
        ),
        (
            "cancel a turn that is not active",
            json!({"type": "chat/turnCancelled", "turnId": "other", "duration": 1}),
            "not the active turn",
        ),
        (
            "server-only action",
            json!({"type": "chat/delta", "turnId": turn, "partId": "p", "content": "x"}),
            "not a client-dispatchable action",
        ),
        (
            "server-only turn end",
            json!({"type": "chat/turnComplete", "turnId": turn, "duration": 1}),
            "not a client-dispatchable action",
        ),
    ];
    for (name, a, needle) in rows {
        assert_rejected(&server, &mut c, &chat, name, a, needle).await;
    }

    // Settle it, then completing again is "already settled".
    let ok = c
        .dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"name": text("submitted", "Ann")}})))
        .await;
    let echo = c.wait_echo(Some(&mut m), ok).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    c.wait_for(Some(&mut m), |e| {
        matches!(e.action, StateAction::ChatTurnComplete(_))
    })
    .await;
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "complete twice",
        json!({"type": "chat/inputCompleted", "requestId": rid, "response": "decline"}),
        "already settled",
    )
    .await;
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "draft after settlement",
        answer("name", text("draft", "Bob")),
        "already settled",
    )
    .await;
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "cancel with no active turn",
        json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 1}),
        "no active turn",
    )
    .await;
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "reused turn id",
        serde_json::to_value(turn_started(&turn, "again")).unwrap(),
        "already used",
    )
    .await;
    assert_rejected(&server, &mut c, &chat, "bad startedAt", json!({"type": "chat/turnStarted", "turnId": "t-x", "startedAt": "yesterday", "message": {"text": "x", "origin": {"kind": "user"}}}), "startedAt").await;

    // A pending tool call.
    let tool_turn = c.start_turn(&chat, "/tool rm {\"path\":\"/tmp/x\"}").await;
    let ready = c
        .wait_for(
            Some(&mut m),
            |e| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.confirmed.is_none()),
        )
        .await;
    let StateAction::ChatToolCallReady(ready) = ready.action else {
        unreachable!()
    };
    let confirm = |extra: Value| {
        let mut v = json!({"type": "chat/toolCallConfirmed", "turnId": tool_turn, "toolCallId": ready.tool_call_id, "approved": true});
        if let (Value::Object(o), Value::Object(e)) = (&mut v, extra) {
            o.extend(e);
        }
        v
    };
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "unknown option",
        confirm(json!({"selectedOptionId": "approve-forever"})),
        "option `approve-forever`",
    )
    .await;
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "option contradicts approved",
        confirm(json!({"selectedOptionId": "deny"})),
        "denies the call",
    )
    .await;
    assert_rejected(&server, &mut c, &chat, "unknown tool call", json!({"type": "chat/toolCallConfirmed", "turnId": tool_turn, "toolCallId": "nope", "approved": true}), "no tool call `nope`").await;
    assert_rejected(&server, &mut c, &chat, "result confirmation while pending", json!({"type": "chat/toolCallResultConfirmed", "turnId": tool_turn, "toolCallId": ready.tool_call_id, "approved": true}), "not pending result confirmation").await;
    assert_rejected(&server, &mut c, &chat, "completing an agent's tool", json!({"type": "chat/toolCallComplete", "turnId": tool_turn, "toolCallId": ready.tool_call_id, "result": {"success": true, "pastTenseMessage": "done"}}), "not a client-contributed tool").await;

    // Deny it; a second confirmation then loses.
    let deny = c
        .dispatch(
            &chat,
            action(confirm(
                json!({"approved": false, "selectedOptionId": "deny"}),
            )),
        )
        .await;
    assert!(c
        .wait_echo(Some(&mut m), deny)
        .await
        .rejection_reason
        .is_none());
    c.wait_for(Some(&mut m), |e| {
        matches!(e.action, StateAction::ChatTurnComplete(_))
    })
    .await;
    assert!(last_turn_markdown(&m.state)
        .iter()
        .any(|t| t == "tool rm: denied"));
    assert_rejected(
        &server,
        &mut c,
        &chat,
        "second confirmation",
        confirm(json!({})),
        "not in an active turn",
    )
    .await;

    // An action on a chat that does not exist is ignored: no echo at all.
    let seq = c
        .dispatch(
            "ahp-chat:/does-not-exist",
            action(json!({"type": "chat/draftChanged"})),
        )
        .await;
    let marker = c
        .dispatch(&chat, action(json!({"type": "chat/draftChanged"})))
        .await;
    let next = c.next_envelope().await;
    assert_eq!(
        next.origin.as_ref().map(|o| o.client_seq),
        Some(marker),
        "dispatch {seq} to an unknown chat got an echo"
    );
    server.stop().await;
}
