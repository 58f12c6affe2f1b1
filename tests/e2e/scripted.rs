//! Every row of the built-in `scripted` agent's table (PROTOCOL.md), and the
//! interaction outcomes it reports.

use crate::common;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{
    ChatInputResponseKind, ChatState, ResponsePart, ToolCallConfirmationReason, ToolCallState,
    TurnState,
};
use common::*;
use serde_json::{json, Value};

fn is_done(e: &ActionEnvelope) -> bool {
    matches!(
        e.action,
        StateAction::ChatTurnComplete(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatError(_)
    )
}

fn is_request(e: &ActionEnvelope) -> bool {
    matches!(e.action, StateAction::ChatInputRequested(_))
}

fn last_input_part(state: &ChatState) -> ahp_types::state::InputRequestResponsePart {
    state
        .turns
        .last()
        .expect("a finished turn")
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) => Some(i.clone()),
            _ => None,
        })
        .expect("input part in the record")
}

async fn setup() -> (TestServer, TestClient, String, ChatMirror) {
    let server = TestServer::start().await;
    let c = server.client("scripted-tester").await;
    let (_s, chat) = c.create_session().await;
    let m = c.subscribe_chat(&chat).await;
    (server, c, chat, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anything_else_is_echoed() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(&chat, "hello there").await;
    c.wait_for(Some(&mut m), is_done).await;
    assert_eq!(
        last_turn_markdown(&m.state),
        vec!["echo: hello there".to_owned()]
    );
    assert_eq!(
        m.state.turns.last().map(|t| t.state),
        Some(TurnState::Complete)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_with_a_url_is_confirmed_by_completion() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(
        &chat,
        r#"/ask {"message":"Review the change","url":"https://example.com/pr/1"}"#,
    )
    .await;
    let req = c.wait_for(Some(&mut m), is_request).await;
    let StateAction::ChatInputRequested(req) = req.action else {
        unreachable!()
    };
    assert_eq!(req.request.url.as_deref(), Some("https://example.com/pr/1"));
    assert!(req.request.questions.is_none());
    c.dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": req.request.id, "response": "accept"}))).await;
    c.wait_for(Some(&mut m), is_done).await;
    assert!(last_turn_markdown(&m.state)[0].starts_with("settled: answered"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untouched_prompt_times_out_and_an_engaged_one_does_not() {
    let (server, mut c, chat, mut m) = setup().await;
    let two = json!({"autoResolutionMs": 100, "questions": [
        {"kind": "text", "id": "a", "message": "A?"}, {"kind": "text", "id": "b", "message": "B?"}]});
    c.start_turn(&chat, &format!("/ask {two}")).await;
    c.wait_for(Some(&mut m), is_done).await;
    assert!(last_turn_markdown(&m.state)[0].starts_with("settled: timedOut"));
    assert_eq!(
        last_input_part(&m.state).response,
        Some(ChatInputResponseKind::Cancel),
        "the host completes a timed-out prompt with cancel"
    );

    // With answer activity the timer does nothing; a decline settles it.
    c.start_turn(&chat, &format!("/ask {two}")).await;
    c.wait_for(Some(&mut m), is_request).await;
    let rid = open_request_id(&m.state).expect("open");
    let typed = c.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "a", "answer": {"state": "draft", "value": {"kind": "text", "value": "typing"}}}))).await;
    c.wait_echo(Some(&mut m), typed).await;
    // A control prompt with the same timeout, untouched and opened after the
    // answer activity in another chat: once it has timed out, the engaged
    // prompt's timer would have fired too.
    let (_s, control) = c.create_session().await;
    let mut cm = c.subscribe_chat(&control).await;
    c.start_turn(&control, &format!("/ask {two}")).await;
    c.wait_for(Some(&mut cm), |e| e.channel == control && is_done(e))
        .await;
    assert!(last_turn_markdown(&cm.state)[0].starts_with("settled: timedOut"));
    let still = fresh_chat(&server, &chat).await;
    assert_eq!(
        open_request_id(&still).as_deref(),
        Some(rid.as_str()),
        "engaged prompt must not time out"
    );
    c.dispatch(
        &chat,
        action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "decline"})),
    )
    .await;
    c.wait_for(Some(&mut m), is_done).await;
    assert!(last_turn_markdown(&m.state)[0].starts_with("settled: declined"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_turn_interrupts_the_prompt_and_keeps_it_unanswered() {
    let (server, mut c, chat, mut m) = setup().await;
    let turn = c
        .start_turn(
            &chat,
            r#"/ask {"questions":[{"kind":"boolean","id":"ok","message":"OK?"}]}"#,
        )
        .await;
    c.wait_for(Some(&mut m), is_request).await;
    c.dispatch(
        &chat,
        action(json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 5})),
    )
    .await;
    c.wait_for(Some(&mut m), is_done).await;
    assert_eq!(
        m.state.turns.last().map(|t| t.state),
        Some(TurnState::Cancelled)
    );
    assert_eq!(
        last_input_part(&m.state).response,
        None,
        "an unanswered prompt keeps response absent"
    );
    // The agent was interrupted: it writes nothing more. A later draft is
    // the next thing on the chat, and the state is what the mirror holds.
    let marker = c.dispatch(&chat, draft("after the cancel")).await;
    let next = c.wait_for(Some(&mut m), |e| e.channel == chat).await;
    assert_eq!(
        next.origin.as_ref().map(|o| o.client_seq),
        Some(marker),
        "nothing arrived between the cancel and the marker: {next:?}"
    );
    assert_eq!(fresh_chat(&server, &chat).await, m.state);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steering_message_clarifies_an_open_prompt() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(
        &chat,
        r#"/ask {"questions":[{"kind":"text","id":"q","message":"Which file?"}]}"#,
    )
    .await;
    c.wait_for(Some(&mut m), is_request).await;
    c.dispatch(&chat, action(json!({"type": "chat/pendingMessageSet", "kind": "steering", "id": "steer-1", "message": {"text": "use the staging config", "origin": {"kind": "user"}}}))).await;
    c.wait_for(Some(&mut m), is_done).await;
    let report = &last_turn_markdown(&m.state)[0];
    assert!(report.starts_with("settled: clarified"), "{report}");
    let body: Value = serde_json::from_str(report.split_once('\n').expect("body").1).expect("json");
    assert_eq!(body["clarification"], "use the staging config");
    assert_eq!(
        last_input_part(&m.state).response,
        Some(ChatInputResponseKind::Decline)
    );
    assert!(
        m.state.steering_message.is_none(),
        "the steering message was consumed"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_runs_without_asking() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(&chat, r#"/tool-ro read_file {"path":"README.md"}"#)
        .await;
    c.wait_for(Some(&mut m), is_done).await;
    let turn = m.state.turns.last().expect("turn");
    let completed = turn.response_parts.iter().find_map(|p| match p {
        ResponsePart::ToolCall(tc) => match &tc.tool_call {
            ToolCallState::Completed(c) => Some(c.clone()),
            _ => None,
        },
        _ => None,
    });
    let completed = completed.expect("completed tool call");
    assert_eq!(completed.confirmed, ToolCallConfirmationReason::NotNeeded);
    assert!(last_turn_markdown(&m.state).contains(&"tool read_file: approved".to_owned()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_asks_every_question_kind_then_a_tool_approval() {
    let (server, mut c, chat, mut m) = setup().await;
    let turn = c.start_turn(&chat, "/demo").await;
    let req = c.wait_for(Some(&mut m), is_request).await;
    let StateAction::ChatInputRequested(req) = req.action else {
        unreachable!()
    };
    let kinds: Vec<String> = req
        .request
        .questions
        .iter()
        .flatten()
        .map(|q| tandem::channels::validate::question_kind(q).to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "text",
            "integer",
            "boolean",
            "single-select",
            "multi-select"
        ]
    );
    let answers = json!({
        "name": {"state": "submitted", "value": {"kind": "text", "value": "spring"}},
        "replicas": {"state": "submitted", "value": {"kind": "number", "value": 3}},
        "canary": {"state": "submitted", "value": {"kind": "boolean", "value": false}},
        "region": {"state": "submitted", "value": {"kind": "selected", "value": "us-east"}},
        "checks": {"state": "submitted", "value": {"kind": "selected-many", "value": ["unit", "lint"]}}
    });
    let done = c.dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": req.request.id, "response": "accept", "answers": answers}))).await;
    assert!(c
        .wait_echo(Some(&mut m), done)
        .await
        .rejection_reason
        .is_none());
    let ready = c
        .wait_for(
            Some(&mut m),
            |e| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.confirmed.is_none()),
        )
        .await;
    let StateAction::ChatToolCallReady(ready) = ready.action else {
        unreachable!()
    };
    c.dispatch(&chat, action(json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": ready.tool_call_id, "approved": true, "selectedOptionId": "approve-once"}))).await;
    c.wait_for(Some(&mut m), is_done).await;
    let report = last_turn_markdown(&m.state).join("\n");
    assert!(report.starts_with("settled: answered"), "{report}");
    assert!(
        report.contains("\"us-east\"") && report.ends_with("tool deploy: approved"),
        "{report}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_streams_deltas() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(&chat, "/slow 200 streamed in small pieces")
        .await;
    let mut deltas = 0;
    loop {
        let e = c.wait_for(Some(&mut m), |_| true).await;
        if matches!(e.action, StateAction::ChatDelta(_)) {
            deltas += 1;
        }
        if is_done(&e) {
            break;
        }
    }
    assert!(deltas >= 5, "{deltas} deltas");
    assert_eq!(
        last_turn_markdown(&m.state),
        vec!["streamed in small pieces".to_owned()]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ask_payload_is_reported_in_the_chat() {
    let (server, mut c, chat, mut m) = setup().await;
    c.start_turn(&chat, "/ask {not json").await;
    c.wait_for(Some(&mut m), is_done).await;
    assert!(last_turn_markdown(&m.state)[0].starts_with("error: /ask expects"));
    server.stop().await;
}
