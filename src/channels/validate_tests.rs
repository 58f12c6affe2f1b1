//! Unit tests for the client-action validation rules in `validate.rs`.
//!
//! States and actions are built from JSON so they look exactly like what
//! travels on the wire; every rejection is checked for the ids it must name.

use std::collections::HashSet;

use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputNumberAnswerValue,
    ChatInputQuestion, ChatInputTextQuestion,
};
use serde_json::{json, Value};

use super::*;

// ─── Fixtures ────────────────────────────────────────────────────────────

const CLIENT: &str = "client-a";
const OTHER_CLIENT: &str = "client-b";
const TURN: &str = "turn-1";
const REQ: &str = "req-1";

fn user_message(text: &str) -> Value {
    json!({ "text": text, "origin": { "kind": "user" } })
}

/// A completed turn with the given response parts.
fn ended_turn(id: &str, parts: Vec<Value>) -> Value {
    json!({
        "id": id,
        "startedAt": "2025-03-10T18:00:00Z",
        "message": user_message("earlier"),
        "responseParts": parts,
        "state": "complete",
    })
}

fn chat_json(turns: Vec<Value>, active_parts: Option<Vec<Value>>) -> ChatState {
    let mut v = json!({
        "resource": "ahp://session/s1/chat/c1",
        "title": "Chat",
        "status": 0,
        "modifiedAt": "2025-03-10T18:42:03.123Z",
        "turns": turns,
    });
    if let Some(parts) = active_parts {
        v["activeTurn"] = json!({
            "id": TURN,
            "startedAt": "2025-03-10T18:42:00Z",
            "message": user_message("hello"),
            "responseParts": parts,
        });
    }
    serde_json::from_value(v).expect("chat state JSON must decode")
}

/// A chat whose active turn (`turn-1`) holds `parts`.
fn active_chat(parts: Vec<Value>) -> ChatState {
    chat_json(vec![], Some(parts))
}

/// A chat with no active turn.
fn idle_chat(turns: Vec<Value>) -> ChatState {
    chat_json(turns, None)
}

/// One question of every kind, with bounds and free-form variations:
///
/// | id      | kind          | required | details                         |
/// |---------|---------------|----------|---------------------------------|
/// | name    | text          | yes      | 2..=5 characters                |
/// | note    | text          | no       | no bounds                       |
/// | age     | number        | no       | 0..=150                         |
/// | count   | integer       | yes      | 1..=10                          |
/// | agree   | boolean       | no       |                                 |
/// | color   | single-select | no       | red, green; no free-form        |
/// | flavor  | single-select | no       | vanilla; free-form allowed      |
/// | tags    | multi-select  | no       | a, b, c; 1..=2 selections       |
/// | extras  | multi-select  | no       | x, y; free-form allowed; max 2  |
fn questions() -> Value {
    json!([
        { "kind": "text", "id": "name", "message": "Name?", "required": true, "min": 2, "max": 5 },
        { "kind": "text", "id": "note", "message": "Anything else?" },
        { "kind": "number", "id": "age", "message": "Age?", "min": 0, "max": 150 },
        { "kind": "integer", "id": "count", "message": "How many?", "required": true, "min": 1, "max": 10 },
        { "kind": "boolean", "id": "agree", "message": "Agree?" },
        {
            "kind": "single-select", "id": "color", "message": "Color?",
            "options": [ { "id": "red", "label": "Red" }, { "id": "green", "label": "Green" } ]
        },
        {
            "kind": "single-select", "id": "flavor", "message": "Flavor?",
            "options": [ { "id": "vanilla", "label": "Vanilla" } ],
            "allowFreeformInput": true
        },
        {
            "kind": "multi-select", "id": "tags", "message": "Tags?", "min": 1, "max": 2,
            "options": [
                { "id": "a", "label": "A" }, { "id": "b", "label": "B" }, { "id": "c", "label": "C" }
            ]
        },
        {
            "kind": "multi-select", "id": "extras", "message": "Extras?", "max": 2,
            "options": [ { "id": "x", "label": "X" }, { "id": "y", "label": "Y" } ],
            "allowFreeformInput": true
        }
    ])
}

/// An unresolved input request part.
fn input_part(id: &str, questions: Value, answers: Value) -> Value {
    json!({
        "kind": "inputRequest",
        "request": { "id": id, "questions": questions, "answers": answers },
    })
}

/// An input request part that already has a `response`.
fn settled_input_part(id: &str) -> Value {
    let mut p = input_part(id, questions(), json!({}));
    p["response"] = json!("decline");
    p
}

/// A chat whose active turn has one open request `req-1` with [`questions`].
fn chat_with_request(answers: Value) -> ChatState {
    active_chat(vec![input_part(REQ, questions(), answers)])
}

fn text(s: &str) -> Value {
    json!({ "kind": "text", "value": s })
}
fn number(n: f64) -> Value {
    json!({ "kind": "number", "value": n })
}
fn boolean(b: bool) -> Value {
    json!({ "kind": "boolean", "value": b })
}
fn selected(id: &str) -> Value {
    json!({ "kind": "selected", "value": id })
}
fn selected_free(id: &str, free: &[&str]) -> Value {
    json!({ "kind": "selected", "value": id, "freeformValues": free })
}
fn many(ids: &[&str]) -> Value {
    json!({ "kind": "selected-many", "value": ids })
}
fn many_free(ids: &[&str], free: &[&str]) -> Value {
    json!({ "kind": "selected-many", "value": ids, "freeformValues": free })
}
fn draft(value: Value) -> Value {
    json!({ "state": "draft", "value": value })
}
fn submitted(value: Value) -> Value {
    json!({ "state": "submitted", "value": value })
}
fn skipped() -> Value {
    json!({ "state": "skipped" })
}

/// Decode a wire action; it must decode to a known variant.
fn action(v: Value) -> StateAction {
    let a: StateAction = serde_json::from_value(v.clone()).expect("action JSON must decode");
    assert!(
        !matches!(a, StateAction::Unknown(_)),
        "fixture decoded as Unknown: {v}"
    );
    a
}

fn answer_changed(request_id: &str, question_id: &str, answer: Value) -> StateAction {
    action(json!({
        "type": "chat/inputAnswerChanged",
        "requestId": request_id,
        "questionId": question_id,
        "answer": answer,
    }))
}

fn input_completed(request_id: &str, response: &str, answers: Option<Value>) -> StateAction {
    let mut v =
        json!({ "type": "chat/inputCompleted", "requestId": request_id, "response": response });
    if let Some(a) = answers {
        v["answers"] = a;
    }
    action(v)
}

/// Run every rule as dispatched by [`CLIENT`], with no previously used turn ids.
fn check(state: &ChatState, action: &StateAction) -> Check {
    client_chat_action(state, action, CLIENT, &HashSet::new())
}

#[track_caller]
fn assert_ok(result: Check) {
    if let Err(e) = result {
        panic!("expected acceptance, got rejection: {e}");
    }
}

/// The result is a rejection whose reason contains every needle.
#[track_caller]
fn assert_rejected(result: Check, needles: &[&str]) -> String {
    match result {
        Ok(()) => panic!("expected a rejection mentioning {needles:?}, got Ok"),
        Err(Rejection(reason)) => {
            for n in needles {
                assert!(
                    reason.contains(n),
                    "rejection {reason:?} should mention {n:?}"
                );
            }
            reason
        }
    }
}

// ─── chat/inputAnswerChanged: valid answers ──────────────────────────────

#[test]
fn answer_changed_accepts_valid_drafts_of_every_kind() {
    let state = chat_with_request(json!({}));
    let cases = [
        ("name", text("Ann")),
        ("note", text("")),
        ("age", number(42.5)),
        ("count", number(3.0)),
        ("agree", boolean(true)),
        ("color", selected("red")),
        ("flavor", selected("vanilla")),
        ("flavor", selected_free("", &["mint"])),
        ("tags", many(&["a"])),
        ("extras", many_free(&["x"], &["z"])),
    ];
    for (qid, value) in cases {
        assert_ok(check(&state, &answer_changed(REQ, qid, draft(value))));
    }
}

#[test]
fn answer_changed_accepts_valid_submitted_answers_of_every_kind() {
    let state = chat_with_request(json!({}));
    let cases = [
        ("name", text("Ann")),
        ("name", text("ab")),    // exactly min
        ("name", text("abcde")), // exactly max
        ("note", text("anything at all, any length")),
        ("age", number(0.0)),
        ("age", number(150.0)),
        ("age", number(33.3)),
        ("count", number(1.0)),
        ("count", number(10.0)),
        ("agree", boolean(false)),
        ("color", selected("green")),
        ("flavor", selected("vanilla")),
        ("flavor", selected_free("vanilla", &["extra sprinkles"])),
        ("tags", many(&["a"])),
        ("tags", many(&["a", "c"])),
        ("extras", many(&[])), // no min on `extras`
        ("extras", many_free(&["y"], &["z"])),
    ];
    for (qid, value) in cases {
        assert_ok(check(&state, &answer_changed(REQ, qid, submitted(value))));
    }
}

#[test]
fn answer_changed_accepts_skipped_answers_and_clearing() {
    let state = chat_with_request(json!({}));
    // Skipping is allowed for any question, required or not.
    assert_ok(check(&state, &answer_changed(REQ, "name", skipped())));
    assert_ok(check(
        &state,
        &answer_changed(
            REQ,
            "color",
            json!({ "state": "skipped", "freeformValues": ["n/a"] }),
        ),
    ));
    // `answer` absent clears the draft.
    let clear = action(json!({
        "type": "chat/inputAnswerChanged", "requestId": REQ, "questionId": "count",
    }));
    assert_ok(check(&state, &clear));
}

#[test]
fn answer_changed_text_length_counts_characters_not_bytes() {
    let state = chat_with_request(json!({}));
    // 5 characters, 7 bytes: within max 5.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "name", submitted(text("héllö"))),
    ));
    // 2 characters, 8 bytes: at min 2.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "name", submitted(text("🦀🦀"))),
    ));
}

// ─── chat/inputAnswerChanged: request and question lookup ───────────────

#[test]
fn answer_changed_rejects_unknown_request() {
    let state = chat_with_request(json!({}));
    let reason = assert_rejected(
        check(
            &state,
            &answer_changed("req-404", "name", draft(text("Ann"))),
        ),
        &["req-404", "no open input request"],
    );
    assert!(!reason.contains("settled"), "{reason}");
}

#[test]
fn answer_changed_rejects_settled_request_and_says_so() {
    let state = active_chat(vec![settled_input_part(REQ)]);
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", draft(text("Ann")))),
        &[REQ, "already settled"],
    );
}

#[test]
fn answer_changed_finds_open_request_after_a_settled_one_with_same_id() {
    // A request id may be replaced: the settled part is skipped, the open one wins.
    let state = active_chat(vec![
        settled_input_part(REQ),
        input_part(REQ, questions(), json!({})),
    ]);
    assert_ok(check(
        &state,
        &answer_changed(REQ, "name", draft(text("Ann"))),
    ));
}

#[test]
fn answer_changed_rejects_when_no_turn_is_active() {
    let state = idle_chat(vec![]);
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", draft(text("Ann")))),
        &[REQ, "no active turn"],
    );
}

#[test]
fn answer_changed_rejects_request_of_an_ended_turn_as_settled() {
    let state = idle_chat(vec![ended_turn(
        "turn-0",
        vec![input_part(REQ, questions(), json!({}))],
    )]);
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", draft(text("Ann")))),
        &[REQ, "already settled", "turn has ended"],
    );
}

#[test]
fn answer_changed_rejects_request_of_an_earlier_turn_while_another_is_active() {
    // The request lives in a finished turn; the active turn has no such request.
    // Only the request id is asserted: unlike the idle case, `open_input` only
    // searches ended turns when no turn is active, so the reason here is "no open
    // input request … in the active turn" rather than "already settled".
    let turns = vec![ended_turn(
        "turn-0",
        vec![input_part(REQ, questions(), json!({}))],
    )];
    let state = chat_json(turns, Some(vec![]));
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", draft(text("Ann")))),
        &[REQ],
    );
}

#[test]
fn answer_changed_rejects_unknown_question() {
    let state = chat_with_request(json!({}));
    assert_rejected(
        check(&state, &answer_changed(REQ, "shoe-size", draft(text("42")))),
        &["shoe-size", REQ, "not in request"],
    );
}

#[test]
fn answer_changed_rejects_question_of_unknown_kind_as_not_in_request() {
    // A question kind from a newer protocol has no id we can read.
    let qs = json!([{ "kind": "date", "id": "when", "message": "When?" }]);
    let state = active_chat(vec![input_part(REQ, qs, json!({}))]);
    assert_rejected(
        check(&state, &answer_changed(REQ, "when", draft(text("today")))),
        &["when", REQ],
    );
}

#[test]
fn answer_changed_rejects_request_without_questions() {
    let part =
        json!({ "kind": "inputRequest", "request": { "id": REQ, "url": "https://example.com" } });
    let state = active_chat(vec![part]);
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", draft(text("Ann")))),
        &["name", REQ],
    );
}

// ─── chat/inputAnswerChanged: value kind must fit the question kind ──────

#[test]
fn answer_changed_rejects_value_kind_that_does_not_fit_question() {
    let state = chat_with_request(json!({}));
    // (question, value, value kind, question kind)
    let cases = [
        ("name", number(1.0), "number", "text"),
        ("name", boolean(true), "boolean", "text"),
        ("age", text("42"), "text", "number"),
        ("count", text("3"), "text", "integer"),
        ("count", boolean(true), "boolean", "integer"),
        ("agree", text("yes"), "text", "boolean"),
        ("agree", number(1.0), "number", "boolean"),
        ("color", many(&["red"]), "selected-many", "single-select"),
        ("color", text("red"), "text", "single-select"),
        ("tags", selected("a"), "selected", "multi-select"),
        ("tags", text("a"), "text", "multi-select"),
        (
            "name",
            json!({ "kind": "date", "value": "2025-01-01" }),
            "unknown",
            "text",
        ),
        // A known kind with a bad payload, or `null`, decodes as an unknown value.
        (
            "age",
            json!({ "kind": "number", "value": "42" }),
            "unknown",
            "number",
        ),
        ("name", Value::Null, "unknown", "text"),
    ];
    for (qid, value, vkind, qkind) in cases {
        for answer in [draft(value.clone()), submitted(value)] {
            assert_rejected(
                check(&state, &answer_changed(REQ, qid, answer)),
                &[
                    &format!("`{qid}`"),
                    &format!("a `{vkind}` answer"),
                    &format!("a `{qkind}` question"),
                ],
            );
        }
    }
}

#[test]
fn answer_changed_integer_question_needs_whole_number_even_in_drafts() {
    let state = chat_with_request(json!({}));
    for answer in [draft(number(2.5)), submitted(number(2.5))] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "count", answer)),
            &["`count`", "integer", "2.5", "whole number"],
        );
    }
    // A number question takes fractions.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "age", submitted(number(2.5))),
    ));
}

#[test]
fn check_answer_rejects_non_finite_numbers() {
    // JSON cannot carry NaN/∞, so build the answer directly.
    let q: ChatInputQuestion =
        serde_json::from_value(json!({ "kind": "number", "id": "age", "message": "Age?" }))
            .unwrap();
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let value = ChatInputAnswerValue::Number(ChatInputNumberAnswerValue { value: v });
        for answer in [
            ChatInputAnswer::Draft(ChatInputAnswered {
                value: value.clone(),
            }),
            ChatInputAnswer::Submitted(ChatInputAnswered {
                value: value.clone(),
            }),
        ] {
            assert_rejected(check_answer(&q, &answer), &["`age`", "not a finite number"]);
        }
    }
}

// ─── chat/inputAnswerChanged: bounds (submitted only) ────────────────────

#[test]
fn answer_changed_rejects_submitted_text_outside_length_bounds() {
    let state = chat_with_request(json!({}));
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", submitted(text("A")))),
        &["`name`", "1 characters", "at least 2"],
    );
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "name", submitted(text("Annabel"))),
        ),
        &["`name`", "7 characters", "at most 5"],
    );
    assert_rejected(
        check(&state, &answer_changed(REQ, "name", submitted(text("")))),
        &["`name`", "0 characters"],
    );
}

#[test]
fn answer_changed_rejects_submitted_number_outside_bounds() {
    let state = chat_with_request(json!({}));
    assert_rejected(
        check(&state, &answer_changed(REQ, "age", submitted(number(-1.0)))),
        &["`age`", "minimum is 0"],
    );
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "age", submitted(number(150.5))),
        ),
        &["`age`", "maximum is 150"],
    );
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "count", submitted(number(0.0))),
        ),
        &["`count`", "minimum is 1"],
    );
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "count", submitted(number(11.0))),
        ),
        &["`count`", "maximum is 10"],
    );
}

#[test]
fn answer_changed_rejects_submitted_selection_count_outside_bounds() {
    let state = chat_with_request(json!({}));
    assert_rejected(
        check(&state, &answer_changed(REQ, "tags", submitted(many(&[])))),
        &["`tags`", "at least 1", "got 0"],
    );
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "tags", submitted(many(&["a", "b", "c"]))),
        ),
        &["`tags`", "at most 2", "got 3"],
    );
    // Free-form entries count as selections.
    assert_rejected(
        check(
            &state,
            &answer_changed(REQ, "extras", submitted(many_free(&["x", "y"], &["z"]))),
        ),
        &["`extras`", "at most 2", "got 3"],
    );
    assert_ok(check(
        &state,
        &answer_changed(REQ, "extras", submitted(many_free(&["x"], &["z"]))),
    ));
}

#[test]
fn answer_changed_drafts_skip_bounds() {
    let state = chat_with_request(json!({}));
    let cases = [
        ("name", text("")),
        ("name", text("A")),
        ("name", text("far too long a name")),
        ("age", number(-5.0)),
        ("age", number(1000.0)),
        ("count", number(0.0)),
        ("count", number(99.0)),
        ("tags", many(&[])),
        ("tags", many(&["a", "b", "c"])),
        ("extras", many_free(&["x", "y"], &["z", "w"])),
    ];
    for (qid, value) in cases {
        assert_ok(check(&state, &answer_changed(REQ, qid, draft(value))));
    }
}

// ─── chat/inputAnswerChanged: options and free-form ──────────────────────

#[test]
fn answer_changed_rejects_unknown_single_select_option_without_freeform() {
    let state = chat_with_request(json!({}));
    for answer in [draft(selected("blue")), submitted(selected("blue"))] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "color", answer)),
            &["`blue`", "`color`", "not offered"],
        );
    }
}

#[test]
fn answer_changed_rejects_freeform_values_where_not_allowed() {
    let state = chat_with_request(json!({}));
    for answer in [
        draft(selected_free("red", &["crimson"])),
        submitted(selected_free("red", &["crimson"])),
    ] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "color", answer)),
            &["`color`", "does not allow free-form"],
        );
    }
    for answer in [
        draft(many_free(&["a"], &["d"])),
        submitted(many_free(&["a"], &["d"])),
    ] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "tags", answer)),
            &["`tags`", "does not allow free-form"],
        );
    }
    // An empty free-form list is no free-form input.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "color", submitted(selected_free("red", &[]))),
    ));
}

#[test]
fn answer_changed_single_select_with_freeform_allowed() {
    let state = chat_with_request(json!({}));
    // Free-form text instead of an offered option.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "flavor", submitted(selected_free("", &["pistachio"]))),
    ));
    assert_ok(check(
        &state,
        &answer_changed(
            REQ,
            "flavor",
            submitted(selected_free("other", &["pistachio"])),
        ),
    ));
    // A draft may name no offered option and have no text yet.
    assert_ok(check(
        &state,
        &answer_changed(REQ, "flavor", draft(selected(""))),
    ));
    // A submitted answer must select something or carry text.
    for value in [selected("chocolate"), selected_free("chocolate", &[])] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "flavor", submitted(value))),
            &["`flavor`", "no offered option", "no free-form text"],
        );
    }
}

#[test]
fn answer_changed_multi_select_rejects_unknown_option_even_with_freeform() {
    let state = chat_with_request(json!({}));
    for qid in ["tags", "extras"] {
        for answer in [draft(many(&["nope"])), submitted(many(&["nope"]))] {
            assert_rejected(
                check(&state, &answer_changed(REQ, qid, answer)),
                &["`nope`", &format!("`{qid}`"), "not offered"],
            );
        }
    }
}

#[test]
fn answer_changed_multi_select_rejects_duplicate_selection() {
    let state = chat_with_request(json!({}));
    for answer in [draft(many(&["a", "a"])), submitted(many(&["a", "a"]))] {
        assert_rejected(
            check(&state, &answer_changed(REQ, "tags", answer)),
            &["`a`", "`tags`", "twice"],
        );
    }
}

#[test]
fn check_answer_rejects_question_of_unknown_kind() {
    let q: ChatInputQuestion =
        serde_json::from_value(json!({ "kind": "date", "id": "when", "message": "When?" }))
            .unwrap();
    assert!(matches!(q, ChatInputQuestion::Unknown(_)));
    let answer: ChatInputAnswer = serde_json::from_value(submitted(text("today"))).unwrap();
    assert_rejected(check_answer(&q, &answer), &["unknown kind"]);
    // Skipping never looks at the question.
    let skip: ChatInputAnswer = serde_json::from_value(skipped()).unwrap();
    assert_ok(check_answer(&q, &skip));
}

// ─── malformed actions ───────────────────────────────────────────────────

#[test]
fn answer_with_state_but_no_value_decodes_as_unknown_and_is_named() {
    for state in ["draft", "submitted"] {
        let raw = json!({
            "type": "chat/inputAnswerChanged",
            "requestId": REQ,
            "questionId": "name",
            "answer": { "state": state },
        });
        let decoded: StateAction = serde_json::from_value(raw.clone())
            .expect("a malformed known action still decodes (as Unknown)");
        let StateAction::Unknown(ref inner) = decoded else {
            panic!("expected StateAction::Unknown, got {decoded:?}");
        };
        assert_eq!(inner, &raw);

        let expected = format!("answer.state is `{state}` but answer.value is missing");
        assert_eq!(malformed_reason(&raw), expected);
        // The dispatcher surfaces the same reason.
        let state_ = chat_with_request(json!({}));
        assert_eq!(check(&state_, &decoded), Err(Rejection(expected)));
    }
}

#[test]
fn malformed_reason_names_the_decoding_problem() {
    let cases = [
        (
            json!({ "type": "chat/inputAnswerChanged", "questionId": "name" }),
            "chat/inputAnswerChanged",
            "requestId",
        ),
        (
            json!({
                "type": "chat/inputAnswerChanged", "requestId": REQ, "questionId": "name",
                "answer": { "state": "final", "value": text("Ann") },
            }),
            "chat/inputAnswerChanged",
            "final",
        ),
        (
            json!({ "type": "chat/inputCompleted", "requestId": REQ, "response": "maybe" }),
            "chat/inputCompleted",
            "maybe",
        ),
        (
            json!({ "type": "chat/toolCallConfirmed", "turnId": TURN, "toolCallId": "t1" }),
            "chat/toolCallConfirmed",
            "approved",
        ),
        (
            json!({ "type": "chat/turnStarted", "turnId": "turn-2", "startedAt": "2025-03-10T18:42:03Z" }),
            "chat/turnStarted",
            "message",
        ),
        (
            json!({ "type": "chat/turnCancelled", "duration": 5 }),
            "chat/turnCancelled",
            "turnId",
        ),
    ];
    let state = chat_with_request(json!({}));
    for (raw, ty, detail) in cases {
        let decoded: StateAction = serde_json::from_value(raw.clone()).unwrap();
        assert!(matches!(decoded, StateAction::Unknown(_)), "{raw}");
        let reason = malformed_reason(&raw);
        assert!(
            reason.starts_with(&format!("malformed `{ty}` action: ")),
            "{reason}"
        );
        assert!(
            reason.contains(detail),
            "{reason:?} should mention {detail:?}"
        );
        assert_rejected(check(&state, &decoded), &[&reason]);
    }
}

#[test]
fn malformed_reason_without_type_or_with_unknown_type() {
    assert_eq!(
        malformed_reason(&json!({ "turnId": TURN })),
        "action has no `type`"
    );
    assert_eq!(
        malformed_reason(&json!({ "type": 7 })),
        "action has no `type`"
    );
    assert_eq!(
        malformed_reason(&json!({ "type": "chat/frobnicated" })),
        "`chat/frobnicated` is not a client-dispatchable action"
    );
    let state = idle_chat(vec![]);
    let unknown: StateAction =
        serde_json::from_value(json!({ "type": "chat/frobnicated", "x": 1 })).unwrap();
    assert!(matches!(unknown, StateAction::Unknown(_)));
    assert_rejected(
        check(&state, &unknown),
        &["chat/frobnicated", "not a client-dispatchable action"],
    );
}

// A malformed action of any client-dispatchable type is called malformed,
// naming the decoding problem.
#[test]
fn malformed_client_action_of_any_client_type_is_called_malformed() {
    let raw = json!({ "type": "chat/toolCallComplete", "turnId": TURN, "toolCallId": "t1" });
    let decoded: StateAction = serde_json::from_value(raw.clone()).unwrap();
    assert!(matches!(decoded, StateAction::Unknown(_)));
    let reason = malformed_reason(&raw);
    assert!(
        !reason.contains("not a client-dispatchable action"),
        "{reason}"
    );
    assert!(
        reason.contains("malformed `chat/toolCallComplete` action"),
        "{reason}"
    );
}

// ─── chat/inputCompleted ─────────────────────────────────────────────────

#[test]
fn input_completed_accept_with_all_required_answered_in_the_action() {
    let state = chat_with_request(json!({}));
    let answers = json!({
        "name": submitted(text("Ann")),
        "count": submitted(number(3.0)),
    });
    assert_ok(check(
        &state,
        &input_completed(REQ, "accept", Some(answers)),
    ));
}

#[test]
fn input_completed_accept_with_required_answers_already_synced() {
    let state = chat_with_request(json!({
        "name": submitted(text("Ann")),
        "count": submitted(number(3.0)),
        "note": draft(text("optional drafts are fine")),
        "agree": skipped(),
    }));
    assert_ok(check(&state, &input_completed(REQ, "accept", None)));
    assert_ok(check(
        &state,
        &input_completed(REQ, "accept", Some(json!({}))),
    ));
}

#[test]
fn input_completed_accept_overlays_action_answers_on_synced_ones() {
    // Synced: `name` is only a draft (too short, which drafts may be), `count`
    // is missing. The action submits both.
    let state = chat_with_request(json!({ "name": draft(text("A")) }));
    let answers = json!({
        "name": submitted(text("Anna")),
        "count": submitted(number(1.0)),
    });
    assert_ok(check(
        &state,
        &input_completed(REQ, "accept", Some(answers)),
    ));
}

#[test]
fn input_completed_accept_rejects_missing_required_answer() {
    let state = chat_with_request(json!({ "name": submitted(text("Ann")) }));
    assert_rejected(
        check(&state, &input_completed(REQ, "accept", None)),
        &["cannot accept", "`count`", "no submitted answer"],
    );
    // Overlaying only an optional answer does not help.
    assert_rejected(
        check(
            &state,
            &input_completed(
                REQ,
                "accept",
                Some(json!({ "agree": submitted(boolean(true)) })),
            ),
        ),
        &["cannot accept", "`count`"],
    );
}

#[test]
fn input_completed_accept_rejects_required_answer_that_is_only_draft_or_skipped() {
    for name_answer in [draft(text("Ann")), skipped()] {
        let state = chat_with_request(json!({
            "name": name_answer,
            "count": submitted(number(3.0)),
        }));
        assert_rejected(
            check(&state, &input_completed(REQ, "accept", None)),
            &["cannot accept", "`name`"],
        );
    }
    // A synced submitted answer overlaid by a draft no longer counts.
    let state = chat_with_request(json!({
        "name": submitted(text("Ann")),
        "count": submitted(number(3.0)),
    }));
    assert_rejected(
        check(
            &state,
            &input_completed(REQ, "accept", Some(json!({ "count": draft(number(4.0)) }))),
        ),
        &["cannot accept", "`count`"],
    );
}

#[test]
fn input_completed_accept_rechecks_synced_submitted_answers_against_bounds() {
    // The synced state holds a submitted answer that violates `min`.
    let state = chat_with_request(json!({
        "name": submitted(text("A")),
        "count": submitted(number(3.0)),
    }));
    assert_rejected(
        check(&state, &input_completed(REQ, "accept", None)),
        &["`name`", "at least 2"],
    );
    // An optional question's synced submitted answer is checked too.
    let state = chat_with_request(json!({
        "name": submitted(text("Ann")),
        "count": submitted(number(3.0)),
        "tags": submitted(many(&["a", "b", "c"])),
    }));
    assert_rejected(
        check(&state, &input_completed(REQ, "accept", None)),
        &["`tags`", "at most 2"],
    );
}

#[test]
fn input_completed_rejects_invalid_overlaid_answer() {
    let state = chat_with_request(json!({}));
    let cases = [
        (
            json!({ "name": submitted(text("A")) }),
            vec!["`name`", "at least 2"],
        ),
        (
            json!({ "count": submitted(number(2.5)) }),
            vec!["`count`", "whole number"],
        ),
        (
            json!({ "color": draft(selected("blue")) }),
            vec!["`blue`", "`color`"],
        ),
        (
            json!({ "agree": submitted(text("yes")) }),
            vec!["`agree`", "a `boolean` question"],
        ),
        (
            json!({ "shoe-size": submitted(text("42")) }),
            vec!["`shoe-size`", REQ, "not in request"],
        ),
    ];
    // Overlaid answers are validated whatever the response.
    for response in ["accept", "decline", "cancel"] {
        for (answers, needles) in &cases {
            assert_rejected(
                check(
                    &state,
                    &input_completed(REQ, response, Some(answers.clone())),
                ),
                needles,
            );
        }
    }
}

#[test]
fn input_completed_decline_and_cancel_ignore_missing_required_answers() {
    let state = chat_with_request(json!({ "name": draft(text("A")) }));
    for response in ["decline", "cancel"] {
        assert_ok(check(&state, &input_completed(REQ, response, None)));
        assert_ok(check(
            &state,
            &input_completed(
                REQ,
                response,
                Some(json!({ "agree": submitted(boolean(false)) })),
            ),
        ));
    }
}

#[test]
fn input_completed_accept_without_questions() {
    // A URL-style elicitation has nothing to answer.
    let part =
        json!({ "kind": "inputRequest", "request": { "id": REQ, "url": "https://example.com" } });
    let state = active_chat(vec![part]);
    assert_ok(check(&state, &input_completed(REQ, "accept", None)));
}

#[test]
fn input_completed_accept_with_only_optional_questions_unanswered() {
    let qs = json!([{ "kind": "boolean", "id": "agree", "message": "Agree?", "required": false }]);
    let state = active_chat(vec![input_part(REQ, qs, json!({}))]);
    assert_ok(check(&state, &input_completed(REQ, "accept", None)));
}

#[test]
fn input_completed_rejects_unknown_or_settled_request() {
    let state = chat_with_request(json!({}));
    assert_rejected(
        check(&state, &input_completed("req-404", "decline", None)),
        &["req-404", "no open input request"],
    );

    let state = active_chat(vec![settled_input_part(REQ)]);
    assert_rejected(
        check(&state, &input_completed(REQ, "decline", None)),
        &[REQ, "already settled"],
    );

    let state = idle_chat(vec![ended_turn("turn-0", vec![settled_input_part(REQ)])]);
    assert_rejected(
        check(&state, &input_completed(REQ, "cancel", None)),
        &[REQ, "already settled"],
    );

    let state = idle_chat(vec![]);
    assert_rejected(
        check(&state, &input_completed(REQ, "cancel", None)),
        &[REQ, "no active turn"],
    );
}

// ─── chat/toolCallConfirmed ──────────────────────────────────────────────

fn confirmation_options() -> Value {
    json!([
        { "id": "approve-once", "label": "Allow once", "kind": "approve" },
        { "id": "approve-session", "label": "Allow for session", "kind": "approve", "group": 1 },
        { "id": "deny", "label": "Deny", "kind": "deny", "group": 2 },
    ])
}

/// A pending-confirmation tool call `id`.
fn pending_tool(id: &str, editable: Option<bool>, options: Option<Value>) -> Value {
    let mut tc = json!({
        "status": "pending-confirmation",
        "toolCallId": id,
        "toolName": "shell",
        "displayName": "Shell",
        "invocationMessage": "run `ls`",
        "toolInput": "{\"cmd\":\"ls\"}",
    });
    if let Some(e) = editable {
        tc["editable"] = json!(e);
    }
    if let Some(o) = options {
        tc["options"] = o;
    }
    json!({ "kind": "toolCall", "toolCall": tc })
}

fn tool_with_status(id: &str, status: &str, contributor: Option<Value>) -> Value {
    let mut tc = json!({
        "status": status,
        "toolCallId": id,
        "toolName": "shell",
        "displayName": "Shell",
        "invocationMessage": "run `ls`",
    });
    match status {
        "streaming" | "pending-confirmation" => {}
        "running" => tc["confirmed"] = json!("user-action"),
        "completed" | "pending-result-confirmation" => {
            tc["confirmed"] = json!("user-action");
            tc["success"] = json!(true);
            tc["pastTenseMessage"] = json!("ran `ls`");
        }
        "cancelled" => tc["reason"] = json!("denied"),
        other => panic!("no fixture for status {other}"),
    }
    if let Some(c) = contributor {
        tc["contributor"] = c;
    }
    json!({ "kind": "toolCall", "toolCall": tc })
}

fn confirm(tool_call_id: &str, approved: bool, extra: Value) -> StateAction {
    let mut v = json!({
        "type": "chat/toolCallConfirmed",
        "turnId": TURN,
        "toolCallId": tool_call_id,
        "approved": approved,
    });
    for (k, val) in extra.as_object().expect("extra fields must be an object") {
        v[k] = val.clone();
    }
    action(v)
}

#[test]
fn tool_call_confirmed_accepts_plain_approval_and_denial() {
    let state = active_chat(vec![pending_tool("t1", None, Some(confirmation_options()))]);
    assert_ok(check(
        &state,
        &confirm("t1", true, json!({ "confirmed": "user-action" })),
    ));
    assert_ok(check(
        &state,
        &confirm("t1", false, json!({ "reason": "denied" })),
    ));
    let no_options = active_chat(vec![pending_tool("t1", None, None)]);
    assert_ok(check(&no_options, &confirm("t1", true, json!({}))));
}

#[test]
fn tool_call_confirmed_accepts_offered_options_matching_approved() {
    let state = active_chat(vec![pending_tool("t1", None, Some(confirmation_options()))]);
    for id in ["approve-once", "approve-session"] {
        assert_ok(check(
            &state,
            &confirm("t1", true, json!({ "selectedOptionId": id })),
        ));
    }
    assert_ok(check(
        &state,
        &confirm("t1", false, json!({ "selectedOptionId": "deny" })),
    ));
}

#[test]
fn tool_call_confirmed_accepts_edited_input_on_editable_call() {
    let state = active_chat(vec![pending_tool(
        "t1",
        Some(true),
        Some(confirmation_options()),
    )]);
    assert_ok(check(
        &state,
        &confirm(
            "t1",
            true,
            json!({ "editedToolInput": "{\"cmd\":\"ls -la\"}", "selectedOptionId": "approve-once" }),
        ),
    ));
}

#[test]
fn tool_call_confirmed_rejects_edited_input_on_non_editable_call() {
    for editable in [None, Some(false)] {
        let state = active_chat(vec![pending_tool("t1", editable, None)]);
        assert_rejected(
            check(
                &state,
                &confirm("t1", true, json!({ "editedToolInput": "{}" })),
            ),
            &["`t1`", "not editable"],
        );
    }
}

#[test]
fn tool_call_confirmed_rejects_option_not_offered() {
    let state = active_chat(vec![pending_tool("t1", None, Some(confirmation_options()))]);
    assert_rejected(
        check(
            &state,
            &confirm("t1", true, json!({ "selectedOptionId": "approve-forever" })),
        ),
        &["`approve-forever`", "`t1`", "not offered"],
    );
    // No options offered at all.
    let state = active_chat(vec![pending_tool("t1", None, None)]);
    assert_rejected(
        check(
            &state,
            &confirm("t1", true, json!({ "selectedOptionId": "approve-once" })),
        ),
        &["`approve-once`", "`t1`", "not offered"],
    );
}

#[test]
fn tool_call_confirmed_rejects_option_kind_contradicting_approved() {
    let state = active_chat(vec![pending_tool("t1", None, Some(confirmation_options()))]);
    assert_rejected(
        check(
            &state,
            &confirm("t1", false, json!({ "selectedOptionId": "approve-once" })),
        ),
        &["`approve-once`", "approves", "`approved` is false"],
    );
    assert_rejected(
        check(
            &state,
            &confirm("t1", true, json!({ "selectedOptionId": "deny" })),
        ),
        &["`deny`", "denies", "`approved` is true"],
    );
}

#[test]
fn tool_call_confirmed_rejects_call_that_is_not_pending_confirmation() {
    // E.g. the second of two racing confirmations: the first moved it on.
    for status in [
        "streaming",
        "running",
        "completed",
        "cancelled",
        "pending-result-confirmation",
    ] {
        let state = active_chat(vec![tool_with_status("t1", status, None)]);
        assert_rejected(
            check(&state, &confirm("t1", true, json!({}))),
            &[
                "`t1`",
                "not pending confirmation",
                &format!("it is {status}"),
            ],
        );
    }
}

#[test]
fn tool_call_confirmed_rejects_unknown_call_wrong_turn_or_no_turn() {
    let state = active_chat(vec![pending_tool("t1", None, None)]);
    assert_rejected(
        check(&state, &confirm("t9", true, json!({}))),
        &["`t9`", "no tool call"],
    );
    let wrong_turn = action(json!({
        "type": "chat/toolCallConfirmed", "turnId": "turn-0", "toolCallId": "t1", "approved": true,
    }));
    assert_rejected(
        check(&state, &wrong_turn),
        &["`turn-0`", "not the active turn"],
    );

    let idle = idle_chat(vec![]);
    assert_rejected(
        check(&idle, &confirm("t1", true, json!({}))),
        &["`t1`", "not in an active turn"],
    );
}

#[test]
fn tool_call_confirmed_finds_call_among_other_parts() {
    let state = active_chat(vec![
        json!({ "kind": "markdown", "id": "m1", "content": "Let me look." }),
        tool_with_status("t0", "completed", None),
        input_part(REQ, questions(), json!({})),
        pending_tool("t1", Some(true), Some(confirmation_options())),
    ]);
    assert_ok(check(
        &state,
        &confirm("t1", true, json!({ "editedToolInput": "{}" })),
    ));
    assert_rejected(
        check(&state, &confirm("t0", true, json!({}))),
        &["`t0`", "completed"],
    );
}

// ─── chat/toolCallResultConfirmed ────────────────────────────────────────

#[test]
fn tool_call_result_confirmed_only_for_pending_result_confirmation() {
    let result_confirmed = |id: &str| {
        action(json!({
            "type": "chat/toolCallResultConfirmed", "turnId": TURN, "toolCallId": id, "approved": true,
        }))
    };
    let state = active_chat(vec![
        tool_with_status("t1", "pending-result-confirmation", None),
        tool_with_status("t2", "running", None),
    ]);
    assert_ok(check(&state, &result_confirmed("t1")));
    assert_rejected(
        check(&state, &result_confirmed("t2")),
        &["`t2`", "not pending result confirmation", "it is running"],
    );
    assert_rejected(check(&state, &result_confirmed("t3")), &["`t3`"]);
}

// ─── chat/toolCallComplete and chat/toolCallContentChanged ───────────────

fn client_contributor(client_id: &str) -> Value {
    json!({ "kind": "client", "clientId": client_id })
}

fn tool_complete(tool_call_id: &str) -> StateAction {
    action(json!({
        "type": "chat/toolCallComplete",
        "turnId": TURN,
        "toolCallId": tool_call_id,
        "result": { "success": true, "pastTenseMessage": "did it" },
    }))
}

fn tool_content(tool_call_id: &str) -> StateAction {
    action(json!({
        "type": "chat/toolCallContentChanged",
        "turnId": TURN,
        "toolCallId": tool_call_id,
        "content": [ { "type": "text", "text": "progress" } ],
    }))
}

#[test]
fn client_tool_updates_accepted_from_the_contributing_client() {
    let state = active_chat(vec![tool_with_status(
        "t1",
        "running",
        Some(client_contributor(CLIENT)),
    )]);
    assert_ok(check(&state, &tool_complete("t1")));
    assert_ok(check(&state, &tool_content("t1")));
}

#[test]
fn client_tool_updates_rejected_from_another_client() {
    let state = active_chat(vec![tool_with_status(
        "t1",
        "running",
        Some(client_contributor(OTHER_CLIENT)),
    )]);
    for a in [tool_complete("t1"), tool_content("t1")] {
        assert_rejected(
            check(&state, &a),
            &["`t1`", &format!("`{OTHER_CLIENT}`"), &format!("`{CLIENT}`")],
        );
    }
}

#[test]
fn client_tool_updates_rejected_for_tools_not_contributed_by_a_client() {
    for contributor in [
        None,
        Some(json!({ "kind": "mcp", "customizationId": "mcp-1" })),
    ] {
        let state = active_chat(vec![tool_with_status("t1", "running", contributor)]);
        for a in [tool_complete("t1"), tool_content("t1")] {
            assert_rejected(
                check(&state, &a),
                &["`t1`", "not a client-contributed tool"],
            );
        }
    }
}

#[test]
fn client_tool_updates_rejected_for_unknown_call_or_inactive_turn() {
    let state = active_chat(vec![tool_with_status(
        "t1",
        "running",
        Some(client_contributor(CLIENT)),
    )]);
    assert_rejected(check(&state, &tool_complete("t9")), &["`t9`"]);
    assert_rejected(check(&idle_chat(vec![]), &tool_content("t1")), &["`t1`"]);
}

#[test]
fn client_tool_update_checks_contributor_in_every_status() {
    for status in [
        "streaming",
        "pending-confirmation",
        "running",
        "pending-result-confirmation",
        "completed",
        "cancelled",
    ] {
        let state = active_chat(vec![tool_with_status(
            "t1",
            status,
            Some(client_contributor(CLIENT)),
        )]);
        assert_ok(client_tool_update(&state, TURN, "t1", CLIENT));
        assert_rejected(
            client_tool_update(&state, TURN, "t1", OTHER_CLIENT),
            &[&format!("`{OTHER_CLIENT}`")],
        );
    }
}

// ─── chat/turnStarted ────────────────────────────────────────────────────

fn turn_started_action(turn_id: &str, started_at: &str) -> StateAction {
    action(json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": started_at,
        "message": user_message("go"),
    }))
}

#[test]
fn turn_started_accepted_on_idle_chat() {
    let state = idle_chat(vec![ended_turn("turn-0", vec![])]);
    assert_ok(check(
        &state,
        &turn_started_action("turn-2", "2025-03-10T18:42:03.123Z"),
    ));
}

#[test]
fn turn_started_rejected_while_a_turn_is_active() {
    let state = active_chat(vec![]);
    assert_rejected(
        check(
            &state,
            &turn_started_action("turn-2", "2025-03-10T18:42:03Z"),
        ),
        &["TurnInProgress", TURN],
    );
}

#[test]
fn turn_started_rejects_reused_turn_id() {
    // Used by a turn still in the transcript.
    let state = idle_chat(vec![ended_turn("turn-0", vec![])]);
    assert_rejected(
        check(
            &state,
            &turn_started_action("turn-0", "2025-03-10T18:42:03Z"),
        ),
        &["`turn-0`", "already used"],
    );
    // Used earlier in this chat (e.g. truncated away), known only to the caller.
    let used: HashSet<String> = ["turn-old".to_owned()].into();
    let state = idle_chat(vec![]);
    assert_rejected(
        client_chat_action(
            &state,
            &turn_started_action("turn-old", "2025-03-10T18:42:03Z"),
            CLIENT,
            &used,
        ),
        &["`turn-old`", "already used"],
    );
    assert_ok(client_chat_action(
        &state,
        &turn_started_action("turn-new", "2025-03-10T18:42:03Z"),
        CLIENT,
        &used,
    ));
}

#[test]
fn turn_started_rejects_empty_turn_id() {
    let state = idle_chat(vec![]);
    assert_rejected(
        check(&state, &turn_started_action("", "2025-03-10T18:42:03Z")),
        &["turnId", "empty"],
    );
}

#[test]
fn turn_started_requires_rfc3339_started_at() {
    let state = idle_chat(vec![]);
    for good in [
        "2025-03-10T18:42:03Z",
        "2025-03-10T18:42:03.123Z",
        "2025-03-10T18:42:03+02:00",
        "2025-03-10T18:42:03.5-07:30",
    ] {
        assert_ok(check(&state, &turn_started_action("turn-2", good)));
    }
    for bad in [
        "",
        "yesterday",
        "2025-03-10",
        "2025-03-10T18:42:03", // no offset
        "18:42:03Z",
        "2025-13-10T18:42:03Z",
        "1741632123",
    ] {
        assert_rejected(
            check(&state, &turn_started_action("turn-2", bad)),
            &[&format!("startedAt `{bad}`"), "RFC 3339"],
        );
    }
}

// `startedAt` is accepted when the official reducer can compute with it: the
// check uses the same parser (`jiff::Timestamp`) the reducer uses to end the
// turn, so a turn this accepts can always be ended.
#[test]
fn turn_started_accepts_what_the_reducer_can_parse() {
    let state = idle_chat(vec![]);
    for ok in ["2025-03-10T18:42Z", "2025-03-10T18:42:03+02:00"] {
        assert_ok(check(&state, &turn_started_action("turn-2", ok)));
    }
}

// ─── chat/turnCancelled ──────────────────────────────────────────────────

fn turn_cancelled_action(turn_id: &str) -> StateAction {
    action(json!({ "type": "chat/turnCancelled", "turnId": turn_id, "duration": 1200 }))
}

#[test]
fn turn_cancelled_accepted_for_the_active_turn() {
    assert_ok(check(&active_chat(vec![]), &turn_cancelled_action(TURN)));
}

#[test]
fn turn_cancelled_rejected_without_active_turn() {
    let state = idle_chat(vec![ended_turn(TURN, vec![])]);
    assert_rejected(
        check(&state, &turn_cancelled_action(TURN)),
        &["no active turn"],
    );
}

#[test]
fn turn_cancelled_rejected_for_another_turn() {
    assert_rejected(
        check(&active_chat(vec![]), &turn_cancelled_action("turn-0")),
        &["`turn-0`", "not the active turn", TURN],
    );
}

// ─── dispatchability ─────────────────────────────────────────────────────

#[test]
fn non_client_actions_are_rejected() {
    let cases = [
        json!({ "type": "chat/delta", "turnId": TURN, "partId": "m1", "content": "hi" }),
        json!({ "type": "chat/turnComplete", "turnId": TURN, "duration": 10 }),
        json!({
            "type": "chat/responsePart", "turnId": TURN,
            "part": { "kind": "markdown", "id": "m1", "content": "hi" },
        }),
        json!({
            "type": "chat/toolCallStart", "turnId": TURN, "toolCallId": "t1",
            "toolName": "shell", "displayName": "Shell",
        }),
        json!({ "type": "chat/inputRequested", "request": { "id": REQ } }),
        json!({ "type": "session/titleChanged", "title": "New title" }),
    ];
    let state = active_chat(vec![]);
    for raw in cases {
        let ty = raw["type"].as_str().unwrap().to_owned();
        let a = action(raw);
        assert_eq!(action_type(&a), ty);
        assert_eq!(
            check(&state, &a),
            Err(Rejection(format!(
                "`{ty}` is not a client-dispatchable action"
            )))
        );
    }
}

#[test]
fn every_client_chat_action_type_is_dispatchable() {
    // A minimal valid action of each listed type, against a state where the
    // stateful ones apply, is never refused as "not client-dispatchable".
    let state = active_chat(vec![
        input_part(REQ, questions(), json!({})),
        pending_tool("t1", Some(true), None),
        tool_with_status("t2", "pending-result-confirmation", None),
        tool_with_status("t3", "running", Some(client_contributor(CLIENT))),
    ]);
    let cases = [
        json!({ "type": "chat/turnStarted", "turnId": "turn-2", "startedAt": "2025-03-10T18:42:03Z", "message": user_message("x") }),
        json!({ "type": "chat/turnCancelled", "turnId": TURN, "duration": 1 }),
        json!({ "type": "chat/truncated", "turnId": TURN }),
        json!({ "type": "chat/toolCallConfirmed", "turnId": TURN, "toolCallId": "t1", "approved": true }),
        json!({
            "type": "chat/toolCallComplete", "turnId": TURN, "toolCallId": "t3",
            "result": { "success": true, "pastTenseMessage": "done" },
        }),
        json!({ "type": "chat/toolCallResultConfirmed", "turnId": TURN, "toolCallId": "t2", "approved": false }),
        json!({ "type": "chat/toolCallContentChanged", "turnId": TURN, "toolCallId": "t3", "content": [] }),
        json!({ "type": "chat/pendingMessageSet", "kind": "queued", "id": "p1", "message": user_message("later") }),
        json!({ "type": "chat/pendingMessageRemoved", "kind": "steering", "id": "p1" }),
        json!({ "type": "chat/queuedMessagesReordered", "order": ["p2", "p1"] }),
        json!({ "type": "chat/draftChanged", "draft": user_message("typing") }),
        json!({ "type": "chat/inputAnswerChanged", "requestId": REQ, "questionId": "agree", "answer": draft(boolean(true)) }),
        json!({ "type": "chat/inputCompleted", "requestId": REQ, "response": "cancel" }),
    ];
    let mut covered = HashSet::new();
    for raw in cases {
        let ty = raw["type"].as_str().unwrap().to_owned();
        assert!(CLIENT_CHAT_ACTIONS.contains(&ty.as_str()), "{ty}");
        let a = action(raw);
        let result = check(&state, &a);
        if ty == "chat/turnStarted" {
            // The state has an active turn; the refusal is a rule, not dispatchability.
            assert_rejected(result, &["TurnInProgress"]);
        } else {
            assert_ok(result);
        }
        covered.insert(ty);
    }
    assert_eq!(covered.len(), CLIENT_CHAT_ACTIONS.len());
}

#[test]
fn client_action_lists_are_namespaced_and_disjoint() {
    assert!(CLIENT_CHAT_ACTIONS.iter().all(|t| t.starts_with("chat/")));
    assert!(CLIENT_SESSION_ACTIONS
        .iter()
        .all(|t| t.starts_with("session/")));
    let chat: HashSet<_> = CLIENT_CHAT_ACTIONS.iter().collect();
    assert_eq!(chat.len(), CLIENT_CHAT_ACTIONS.len(), "duplicate entry");
    // Session actions never pass the chat-channel rules.
    let state = idle_chat(vec![]);
    let title = action(json!({ "type": "session/titleChanged", "title": "t" }));
    assert_rejected(
        check(&state, &title),
        &["session/titleChanged", "not a client-dispatchable action"],
    );
}

#[test]
fn action_type_reports_the_wire_type() {
    assert_eq!(
        action_type(&turn_cancelled_action(TURN)),
        "chat/turnCancelled"
    );
    let unknown: StateAction = serde_json::from_value(json!({ "type": "x/y", "a": 1 })).unwrap();
    assert_eq!(action_type(&unknown), "x/y");
    let untyped = StateAction::Unknown(json!({ "a": 1 }));
    assert_eq!(action_type(&untyped), "?");
}

// ─── small helpers ───────────────────────────────────────────────────────

#[test]
fn question_id_and_kind_cover_every_kind() {
    let qs: Vec<ChatInputQuestion> = serde_json::from_value(questions()).unwrap();
    let got: Vec<(Option<&str>, &str)> = qs
        .iter()
        .map(|q| (question_id(q), question_kind(q)))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("name"), "text"),
            (Some("note"), "text"),
            (Some("age"), "number"),
            (Some("count"), "integer"),
            (Some("agree"), "boolean"),
            (Some("color"), "single-select"),
            (Some("flavor"), "single-select"),
            (Some("tags"), "multi-select"),
            (Some("extras"), "multi-select"),
        ]
    );
    let unknown: ChatInputQuestion =
        serde_json::from_value(json!({ "kind": "date", "id": "when", "message": "?" })).unwrap();
    assert_eq!(
        (question_id(&unknown), question_kind(&unknown)),
        (None, "unknown")
    );
}

#[test]
fn check_answer_direct_text_question() {
    let q = ChatInputQuestion::Text(ChatInputTextQuestion {
        id: "q1".into(),
        title: None,
        message: "?".into(),
        required: Some(true),
        format: None,
        min: Some(2),
        max: Some(5),
        default_value: None,
    });
    let answer = |v: Value| -> ChatInputAnswer { serde_json::from_value(v).unwrap() };
    assert_ok(check_answer(&q, &answer(submitted(text("abc")))));
    assert_ok(check_answer(&q, &answer(draft(text("a")))));
    assert_rejected(check_answer(&q, &answer(submitted(text("a")))), &["`q1`"]);
    assert_rejected(
        check_answer(&q, &answer(submitted(text("abcdef")))),
        &["`q1`"],
    );
}

#[test]
fn rejection_displays_its_reason() {
    let r = Rejection::new("nope");
    assert_eq!(r.to_string(), "nope");
    assert_eq!(r, Rejection("nope".to_owned()));
}
