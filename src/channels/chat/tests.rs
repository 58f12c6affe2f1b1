//! A chat whose append fails goes back to what the store holds and settles
//! every interaction still open: the agent waiting on one is resumed, once,
//! with `aborted` — not left hanging.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::ChatInputRequest;
use serde_json::json;

use crate::channels::registry::ChannelAddr;
use crate::channels::session::GetSessionState;
use crate::channels::testing::{self, TestAgents, TestJournal, WAIT};
use crate::channels::ClientDispatch;
use crate::interactions::{Interaction, Outcome};
use crate::publish::Outbound;

fn dispatch(conn: &Arc<Outbound>, seq: i64, action: serde_json::Value) -> ClientDispatch {
    let action: StateAction = serde_json::from_value(action).expect("an action");
    assert!(!matches!(action, StateAction::Unknown(_)), "{action:?}");
    ClientDispatch {
        conn: crate::channels::Dispatcher::Conn(conn.clone()),
        origin: ActionOrigin {
            client_id: "client".into(),
            client_seq: seq,
        },
        action,
        as_agent: false,
    }
}

#[actix::test]
async fn a_failed_append_aborts_the_interactions_open_in_the_chat() {
    let journal = Arc::new(TestJournal::default());
    let (agents, mut turns) = TestAgents::new();
    let shared = testing::shared(journal.clone(), agents);
    let (root, _) = testing::root(&shared).await;
    let session = testing::session(&shared, &root, "ahp-session:/s").await;
    let chat_uri = session
        .send(GetSessionState)
        .await
        .expect("session runs")
        .default_chat
        .expect("a default chat");
    let Some(ChannelAddr::Chat(chat)) = shared.registry.get(&chat_uri).map(|c| c.addr) else {
        panic!("the chat is registered");
    };

    let client = Arc::new(Outbound::new(1 << 20));
    chat.do_send(dispatch(
        &client,
        1,
        json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": crate::time::now_rfc3339(),
               "message": {"text": "hi", "origin": {"kind": "user"}}}),
    ));
    let turn = tokio::time::timeout(WAIT, turns.recv())
        .await
        .expect("the agent gets the turn in time")
        .expect("a turn");
    let waiting = actix::spawn(async move {
        turn.handle
            .interact(Interaction::Input {
                request: ChatInputRequest {
                    id: "r1".into(),
                    message: Some("?".into()),
                    url: None,
                    questions: None,
                    answers: None,
                },
                auto_resolution_ms: None,
            })
            .await
    });
    journal
        .wait_event("the input request", |e| {
            e.starts_with("append") && e.contains("chat/inputRequested")
        })
        .await;

    journal.fail_appends.store(true, Ordering::SeqCst);
    chat.do_send(dispatch(
        &client,
        2,
        json!({"type": "chat/draftChanged", "draft": {"text": "x", "origin": {"kind": "user"}}}),
    ));
    let settled = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the waiting agent is resumed")
        .expect("the agent task runs");
    assert_eq!(settled.outcome, Outcome::Aborted);
    assert!(
        settled
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("the store is unavailable")),
        "settled by the roll-back, not by the chat going away: {settled:?}"
    );
}
