//! Two or more clients answering one agent together (issue "AHP host core",
//! must-show 1–3), against a real server with the official `ahp` client.

use crate::common;

use ahp_types::actions::StateAction;
use ahp_types::state::{ChatInputResponseKind, ResponsePart, ToolCallState, ToolResultContent};
use common::*;
use serde_json::{json, Value};

fn ask_three() -> String {
    let spec = json!({
        "message": "Before I deploy",
        "questions": [
            {"kind": "text", "id": "q1", "message": "Service name?", "required": true},
            {"kind": "text", "id": "q2", "message": "Owner?", "required": true},
            {"kind": "boolean", "id": "q3", "message": "Page on-call?"}
        ]
    });
    format!("/ask {spec}")
}

fn text_answer(state: &str, v: &str) -> Value {
    json!({"state": state, "value": {"kind": "text", "value": v}})
}

/// The `settled:` line and answers JSON the scripted agent wrote.
fn settled_report(state: &ahp_types::state::ChatState) -> (String, Value) {
    let md = last_turn_markdown(state);
    let report = md
        .iter()
        .find(|m| m.starts_with("settled: "))
        .expect("settled report");
    let (line, body) = report.split_once('\n').expect("two lines");
    (
        line.to_owned(),
        serde_json::from_str(body).expect("answers json"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_merge_across_clients_and_one_completion_settles_for_both() {
    let server = TestServer::start().await;
    let mut a = server.client("client-a").await;
    let mut b = server.client("client-b").await;
    let (_session, chat) = a.create_session().await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;

    a.start_turn(&chat, &ask_three()).await;
    let is_request = |e: &ahp_types::actions::ActionEnvelope| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    };
    a.wait_for(Some(&mut ma), is_request).await;
    b.wait_for(Some(&mut mb), is_request).await;
    let request_id = open_request_id(&ma.state).expect("open request on A");
    assert_eq!(
        open_request_id(&mb.state).as_deref(),
        Some(request_id.as_str())
    );

    // A drafts q1, B drafts q2.
    a.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": request_id, "questionId": "q1", "answer": text_answer("draft", "billing")}))).await;
    b.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": request_id, "questionId": "q2", "answer": text_answer("draft", "team-pay")}))).await;

    // Both observe the merged answers map.
    for (client, mirror) in [(&mut a, &mut ma), (&mut b, &mut mb)] {
        loop {
            let merged = mirror
                .state
                .active_turn
                .as_ref()
                .and_then(|t| {
                    t.response_parts.iter().find_map(|p| match p {
                        ResponsePart::InputRequest(i) => i.request.answers.clone(),
                        _ => None,
                    })
                })
                .unwrap_or_default();
            if merged.contains_key("q1") && merged.contains_key("q2") {
                break;
            }
            client.wait_for(Some(mirror), |_| true).await;
        }
    }

    // B completes with accept, submitting both drafts and q3.
    let done = b
        .dispatch(
            &chat,
            action(json!({
                "type": "chat/inputCompleted", "requestId": request_id, "response": "accept",
                "answers": {
                    "q1": text_answer("submitted", "billing"),
                    "q2": text_answer("submitted", "team-pay"),
                    "q3": {"state": "submitted", "value": {"kind": "boolean", "value": true}}
                }
            })),
        )
        .await;
    let echo = b.wait_echo(Some(&mut mb), done).await;
    assert!(
        echo.rejection_reason.is_none(),
        "completion rejected: {:?}",
        echo.rejection_reason
    );

    let is_done = |e: &ahp_types::actions::ActionEnvelope| {
        matches!(e.action, StateAction::ChatTurnComplete(_))
    };
    a.wait_for(Some(&mut ma), is_done).await;
    b.wait_for(Some(&mut mb), is_done).await;

    // Same final part on both, with response accept.
    for m in [&ma, &mb] {
        let part = m
            .state
            .turns
            .last()
            .expect("finished turn")
            .response_parts
            .iter()
            .find_map(|p| match p {
                ResponsePart::InputRequest(i) => Some(i.clone()),
                _ => None,
            });
        let part = part.expect("input part kept in the record");
        assert_eq!(part.response, Some(ChatInputResponseKind::Accept));
        assert_eq!(part.request.answers.as_ref().map(|a| a.len()), Some(3));
    }
    assert_eq!(ma.state, mb.state, "both clients converge");
    let fresh = fresh_chat(&server, &chat).await;
    assert_eq!(ma.state, fresh, "clients equal a fresh subscriber");

    let (line, body) = settled_report(&ma.state);
    assert_eq!(line, "settled: answered");
    assert_eq!(body["answers"]["q1"]["value"]["value"], "billing");
    assert_eq!(body["answers"]["q2"]["value"]["value"], "team-pay");
    assert_eq!(body["answers"]["q3"]["value"]["value"], true);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_completions_settle_once_and_the_loser_is_rejected() {
    let server = TestServer::start().await;
    let mut a = server.client("client-a").await;
    let mut b = server.client("client-b").await;
    let (_s, chat) = a.create_session().await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;
    a.start_turn(
        &chat,
        "/ask {\"questions\":[{\"kind\":\"text\",\"id\":\"q\",\"message\":\"?\"}]}",
    )
    .await;
    let is_request = |e: &ahp_types::actions::ActionEnvelope| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    };
    a.wait_for(Some(&mut ma), is_request).await;
    b.wait_for(Some(&mut mb), is_request).await;
    let rid = open_request_id(&ma.state).expect("open request");

    let complete = |v: &str| {
        action(
            json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {"q": text_answer("submitted", v)}}),
        )
    };
    let (sa, sb) = tokio::join!(
        a.dispatch(&chat, complete("from-a")),
        b.dispatch(&chat, complete("from-b"))
    );
    let ea = a.wait_echo(Some(&mut ma), sa).await;
    let eb = b.wait_echo(Some(&mut mb), sb).await;
    let accepted = [&ea, &eb]
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .count();
    assert_eq!(
        accepted, 1,
        "exactly one completion wins: {:?} / {:?}",
        ea.rejection_reason, eb.rejection_reason
    );
    let loser = if ea.rejection_reason.is_some() {
        &ea
    } else {
        &eb
    };
    assert!(
        loser
            .rejection_reason
            .as_deref()
            .unwrap_or_default()
            .contains("already settled"),
        "{:?}",
        loser.rejection_reason
    );
    let winner = if ea.rejection_reason.is_none() {
        "from-a"
    } else {
        "from-b"
    };

    // The loser's rejection may arrive after the turn ended, so wait on state.
    a.wait_state(&mut ma, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let reports = last_turn_markdown(&ma.state)
        .into_iter()
        .filter(|m| m.starts_with("settled:"))
        .count();
    assert_eq!(reports, 1, "the agent resumed exactly once");
    let (line, body) = settled_report(&ma.state);
    assert_eq!(line, "settled: answered");
    assert_eq!(body["answers"]["q"]["value"]["value"], winner);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tool_confirmations_one_wins_and_its_edit_reaches_the_result() {
    let server = TestServer::start().await;
    let mut a = server.client("client-a").await;
    let mut b = server.client("client-b").await;
    let (_s, chat) = a.create_session().await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;
    let turn = a
        .start_turn(&chat, "/tool write_file {\"path\":\"a.txt\"}")
        .await;
    let is_pending = |e: &ahp_types::actions::ActionEnvelope| matches!(&e.action, StateAction::ChatToolCallReady(r) if r.confirmed.is_none());
    let ready = a.wait_for(Some(&mut ma), is_pending).await;
    b.wait_for(Some(&mut mb), is_pending).await;
    let StateAction::ChatToolCallReady(ready) = ready.action else {
        unreachable!()
    };
    assert_eq!(ready.editable, Some(true));

    let confirm = |edit: &str| {
        action(json!({
            "type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": ready.tool_call_id,
            "approved": true, "confirmed": "user-action", "selectedOptionId": "approve-once",
            "editedToolInput": edit
        }))
    };
    let (sa, sb) = tokio::join!(
        a.dispatch(&chat, confirm("{\"path\":\"edited-by-a.txt\"}")),
        b.dispatch(&chat, confirm("{\"path\":\"edited-by-b.txt\"}"))
    );
    let ea = a.wait_echo(Some(&mut ma), sa).await;
    let eb = b.wait_echo(Some(&mut mb), sb).await;
    let accepted: Vec<_> = [(&ea, "a"), (&eb, "b")]
        .into_iter()
        .filter(|(e, _)| e.rejection_reason.is_none())
        .collect();
    assert_eq!(accepted.len(), 1, "one confirmation wins");
    let winner = accepted[0].1;
    let loser = if winner == "a" { &eb } else { &ea };
    let reason = loser.rejection_reason.as_deref().unwrap_or_default();
    // The loser finds the call confirmed — or, if the tool already ran and the
    // turn ended, no longer in an active turn.
    assert!(
        reason.contains("not pending confirmation") || reason.contains("not in an active turn"),
        "{reason}"
    );

    a.wait_state(&mut ma, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let turn = ma.state.turns.last().expect("finished turn");
    let result = turn.response_parts.iter().find_map(|p| match p {
        ResponsePart::ToolCall(tc) => match &tc.tool_call {
            ToolCallState::Completed(c) => Some(c.clone()),
            _ => None,
        },
        _ => None,
    });
    let result = result.expect("tool call completed");
    let text = match result.content.as_deref() {
        Some([ToolResultContent::Text(t)]) => t.text.clone(),
        other => panic!("unexpected content {other:?}"),
    };
    assert_eq!(
        text,
        format!("{{\"path\":\"edited-by-{winner}.txt\"}}"),
        "the winner's edit is the tool's input"
    );
    assert!(last_turn_markdown(&ma.state)
        .iter()
        .any(|m| m == "tool write_file: approved"));
    server.stop().await;
}
