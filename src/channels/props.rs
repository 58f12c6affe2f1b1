//! Property tests: for arbitrary sequences of client actions — valid and
//! not — validation and the official reducer never panic, and an action that
//! is refused (by our rules or by the reducer) leaves the chat state
//! byte-identical. Also: JSON-RPC decoding of arbitrary text never panics.

use std::collections::HashSet;

use ahp::reducers::{apply_action_to_chat, ReduceOutcome};
use ahp_types::actions::StateAction;
use ahp_types::state::ChatState;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::validate::client_chat_action;

const TURN: &str = "turn-1";

fn base_state() -> ChatState {
    serde_json::from_value(json!({
        "resource": "ahp-chat:/p", "title": "p", "status": 24, "modifiedAt": "2026-01-01T00:00:00.000Z",
        "turns": [{"id": "old", "message": {"text": "x", "origin": {"kind": "user"}}, "responseParts": [], "state": "complete"}],
        "activeTurn": {"id": TURN, "startedAt": "2026-01-01T00:00:00.000Z", "message": {"text": "go", "origin": {"kind": "user"}}, "responseParts": [
            {"kind": "inputRequest", "request": {"id": "req", "questions": [
                {"kind": "text", "id": "t", "message": "?", "required": true, "min": 1, "max": 5},
                {"kind": "integer", "id": "i", "message": "?", "min": 0, "max": 9},
                {"kind": "boolean", "id": "b", "message": "?"},
                {"kind": "single-select", "id": "s", "message": "?", "options": [{"id": "a", "label": "A"}, {"id": "z", "label": "Z"}]},
                {"kind": "multi-select", "id": "m", "message": "?", "max": 2, "options": [{"id": "a", "label": "A"}, {"id": "z", "label": "Z"}, {"id": "q", "label": "Q"}]}
            ]}},
            {"kind": "toolCall", "toolCall": {"status": "pending-confirmation", "toolCallId": "tc", "toolName": "w", "displayName": "w", "invocationMessage": "run", "toolInput": "{}", "editable": true,
                "options": [{"id": "approve-once", "label": "ok", "kind": "approve"}, {"id": "deny", "label": "no", "kind": "deny"}]}}
        ]}
    }))
    .expect("valid base state")
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z]{0,8}".prop_map(|s| json!({"kind": "text", "value": s})),
        (-3.0f64..12.0).prop_map(|n| json!({"kind": "number", "value": n})),
        (0i64..12).prop_map(|n| json!({"kind": "number", "value": n})),
        any::<bool>().prop_map(|b| json!({"kind": "boolean", "value": b})),
        prop::sample::select(vec!["a", "z", "nope", ""])
            .prop_map(|s| json!({"kind": "selected", "value": s})),
        prop::collection::vec(prop::sample::select(vec!["a", "z", "q", "x"]), 0..4)
            .prop_map(|v| json!({"kind": "selected-many", "value": v})),
        Just(json!({"kind": "mystery", "value": 1})),
    ]
}

fn answer() -> impl Strategy<Value = Value> {
    prop_oneof![
        value().prop_map(|v| json!({"state": "draft", "value": v})),
        value().prop_map(|v| json!({"state": "submitted", "value": v})),
        Just(json!({"state": "skipped"})),
        Just(json!({"state": "draft"})),
    ]
}

fn question() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["t", "i", "b", "s", "m", "nope"])
}

fn request() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["req", "req", "other"])
}

fn action() -> impl Strategy<Value = Value> {
    let turn = prop::sample::select(vec![TURN, TURN, "old", "new"]);
    prop_oneof![
        (request(), question(), prop::option::of(answer()))
            .prop_map(|(r, q, a)| json!({"type": "chat/inputAnswerChanged", "requestId": r, "questionId": q, "answer": a})),
        (request(), prop::sample::select(vec!["accept", "decline", "cancel"]), prop::collection::hash_map(question(), answer(), 0..4))
            .prop_map(|(r, resp, answers)| json!({"type": "chat/inputCompleted", "requestId": r, "response": resp, "answers": answers})),
        (turn.clone(), prop::sample::select(vec!["tc", "nope"]), any::<bool>(), prop::option::of(prop::sample::select(vec!["approve-once", "deny", "bogus"])), prop::option::of("[{}a-z]{0,6}"))
            .prop_map(|(t, id, ok, opt, edit)| json!({"type": "chat/toolCallConfirmed", "turnId": t, "toolCallId": id, "approved": ok, "selectedOptionId": opt, "editedToolInput": edit})),
        turn.clone().prop_map(|t| json!({"type": "chat/turnCancelled", "turnId": t, "duration": 3})),
        (turn.clone(), prop::sample::select(vec!["2026-01-01T00:00:01Z", "not a time"]))
            .prop_map(|(t, at)| json!({"type": "chat/turnStarted", "turnId": t, "startedAt": at, "message": {"text": "hi", "origin": {"kind": "user"}}})),
        prop::option::of(prop::sample::select(vec!["old", "nope"])).prop_map(|t| json!({"type": "chat/truncated", "turnId": t})),
        turn.prop_map(|t| json!({"type": "chat/delta", "turnId": t, "partId": "p", "content": "x"})),
        "[a-z]{0,5}".prop_map(|s| json!({"type": "chat/draftChanged", "draft": {"text": s, "origin": {"kind": "user"}}})),
        Just(json!({"type": "chat/unknownThing"})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn refused_actions_leave_the_state_byte_identical(actions in prop::collection::vec(action(), 1..24)) {
        let mut state = base_state();
        let mut used: HashSet<String> = [TURN.to_owned(), "old".to_owned()].into();
        for raw in actions {
            let action: StateAction = serde_json::from_value(raw.clone()).unwrap_or(StateAction::Unknown(raw));
            let before = serde_json::to_string(&state).expect("serializes");
            if client_chat_action(&state, &action, "client", &used).is_ok()
                && apply_action_to_chat(&mut state, &action) == ReduceOutcome::Applied
            {
                if let StateAction::ChatTurnStarted(a) = &action {
                    used.insert(a.turn_id.clone());
                }
                continue;
            }
            prop_assert_eq!(before, serde_json::to_string(&state).expect("serializes"));
        }
    }

    #[test]
    fn decoding_arbitrary_frames_never_panics(text in ".{0,200}") {
        let _ = crate::protocol::decode(&text);
    }

    #[test]
    fn decoding_arbitrary_json_objects_never_panics(
        id in prop::option::of(prop_oneof![any::<i64>().prop_map(Value::from), "[a-z]{0,4}".prop_map(Value::from), Just(Value::Null), Just(json!({}))]),
        method in prop::option::of(prop_oneof!["[a-zA-Z/]{0,16}".prop_map(Value::from), Just(json!(3))]),
        params in prop::option::of(prop_oneof![Just(json!({})), Just(json!([])), Just(json!(1)), Just(json!("x"))]),
    ) {
        let mut o = serde_json::Map::new();
        o.insert("jsonrpc".into(), json!("2.0"));
        if let Some(id) = id { o.insert("id".into(), id); }
        if let Some(m) = method { o.insert("method".into(), m); }
        if let Some(p) = params { o.insert("params".into(), p); }
        let _ = crate::protocol::decode(&Value::Object(o).to_string());
    }
}
