//! A chat whose append fails goes back to what the store holds and settles
//! every interaction still open: the agent waiting on one is resumed, once,
//! with `aborted` — not left hanging. A turn whose agent lost an update to
//! the store ends with `chat/error` once the store takes writes again.
//! A dispatcher's held reply leaves with the action's echo or rejection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::ChatInputRequest;
use serde_json::json;

use crate::channels::registry::ChannelAddr;
use crate::channels::session::GetSessionState;
use crate::channels::testing::{self, TestAgents, TestJournal, WAIT};
use crate::channels::ClientDispatch;
use crate::channels::{DispatchConn, Dispatcher};
use crate::interactions::{Interaction, Outcome};
use crate::transport::{FakeWire, Outbound, Push};

fn dispatch(conn: &Arc<Outbound>, seq: i64, action: serde_json::Value) -> ClientDispatch {
    let action: StateAction = serde_json::from_value(action).expect("an action");
    assert!(!matches!(action, StateAction::Unknown(_)), "{action:?}");
    ClientDispatch {
        conn: crate::channels::Dispatcher::Conn(conn.clone().into()),
        origin: ActionOrigin {
            client_id: "client".into(),
            client_seq: seq,
        },
        action,
        as_agent: false,
    }
}

/// A session's default chat with a turn running on the test agent.
async fn chat_with_a_turn() -> (
    Arc<TestJournal>,
    actix::Addr<crate::channels::chat::ChatActor>,
    Arc<Outbound>,
    crate::channels::agent::AgentTurn,
) {
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
    (journal, chat, client, turn)
}

fn delta(text: &str) -> StateAction {
    serde_json::from_value(json!({"type": "chat/responsePart", "turnId": "t1",
        "part": {"kind": "markdown", "id": "p1", "content": text}}))
    .expect("a response part")
}

/// Wait until the journal stores the `chat/error` that ends turn `t1`
/// because the store lost its agent's update.
async fn turn_ended_by_the_store(journal: &TestJournal) {
    journal
        .wait_event("the turn's end", |e| {
            e.starts_with("append")
                && e.contains("chat/error")
                && e.contains("StoreUnavailable")
                && e.contains("t1")
        })
        .await;
}

#[actix::test]
async fn a_failed_append_aborts_the_interactions_open_in_the_chat() {
    let (journal, chat, client, turn) = chat_with_a_turn().await;
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

#[actix::test]
async fn a_turn_whose_update_the_store_refused_ends_with_an_error_once_the_store_is_back() {
    let (journal, _chat, _client, turn) = chat_with_a_turn().await;
    journal.fail_appends.store(true, Ordering::SeqCst);
    let refused = turn.handle.emit(delta("lost")).await;
    assert!(refused.is_err(), "the store refused the agent's update");
    // The agent gives up (as the built-in agents do); the store comes back.
    journal.fail_appends.store(false, Ordering::SeqCst);
    turn_ended_by_the_store(&journal).await;
    let late = turn.handle.emit(delta("late")).await;
    assert!(late.is_err(), "the ended turn takes no more updates");
}

#[actix::test]
async fn a_turn_refused_while_the_store_was_cut_off_ends_with_an_error_once_it_is_back() {
    let (journal, _chat, _client, turn) = chat_with_a_turn().await;
    journal.unwritable.store(true, Ordering::SeqCst);
    let refused = turn.handle.emit(delta("lost")).await;
    assert!(
        refused.as_ref().is_err_and(|r| r.0.contains("read-only")),
        "{refused:?}"
    );
    tokio::time::sleep(crate::channels::commit::STORE_RETRY * 2).await;
    assert!(
        !journal.events().iter().any(|e| e.contains("chat/error")),
        "nothing is written while the store is cut off"
    );
    journal.unwritable.store(false, Ordering::SeqCst);
    turn_ended_by_the_store(&journal).await;
}

/// `action` from `client` with its `dispatchAction` reply `reply` held back.
fn dispatch_held(
    client: &Arc<Outbound>,
    seq: i64,
    action: serde_json::Value,
    reply: &str,
) -> ClientDispatch {
    let held = client.push_unflushed(Push::Response(reply.to_owned().into()));
    ClientDispatch {
        conn: Dispatcher::Conn(DispatchConn::new(client.clone(), Some(held))),
        ..dispatch(client, seq, action)
    }
}

/// Wait until `wire` holds `n` frames.
async fn frames(wire: &FakeWire, n: usize) -> Vec<String> {
    tokio::time::timeout(WAIT, async {
        loop {
            let texts = wire.texts();
            if texts.len() >= n {
                return texts;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the frames are written in time")
}

#[actix::test]
async fn a_held_dispatch_reply_leaves_in_one_write_with_the_echo_or_the_rejection() {
    let (journal, chat, _, _turn) = chat_with_a_turn().await;
    let client = Arc::new(Outbound::new(1 << 20));
    let wire = FakeWire::with_room(1 << 20);
    client.attach(wire.clone(), std::time::Duration::ZERO);
    let draft = |text: &str| json!({"type": "chat/draftChanged", "draft": {"text": text, "origin": {"kind": "user"}}});

    // Stored and published: the reply, then the echo, in one write.
    chat.do_send(dispatch_held(&client, 2, draft("x"), "reply 2"));
    let texts = frames(&wire, 2).await;
    assert_eq!(texts[0], "reply 2");
    assert!(
        texts[1].contains("chat/draftChanged") && texts[1].contains("\"clientSeq\":2"),
        "{texts:?}"
    );
    assert_eq!(wire.writers().len(), 1, "reply and echo in one write");

    // Refused by the chat (a second turn while one runs): with the rejection.
    let again = json!({"type": "chat/turnStarted", "turnId": "t2", "startedAt": crate::time::now_rfc3339(),
                       "message": {"text": "again", "origin": {"kind": "user"}}});
    chat.do_send(dispatch_held(&client, 3, again, "reply 3"));
    let texts = frames(&wire, 4).await;
    assert_eq!(texts[2], "reply 3");
    assert!(texts[3].contains("rejectionReason"), "{texts:?}");
    assert_eq!(wire.writers().len(), 2);

    // Refused by the store: with the rejection.
    journal.fail_appends.store(true, Ordering::SeqCst);
    chat.do_send(dispatch_held(&client, 4, draft("y"), "reply 4"));
    let texts = frames(&wire, 6).await;
    assert_eq!(texts[4], "reply 4");
    assert!(texts[5].contains("rejectionReason"), "{texts:?}");

    // A dispatch nobody handles (its chat gone): the reply leaves when it
    // is dropped.
    drop(dispatch_held(&client, 5, draft("z"), "reply 5"));
    assert_eq!(wire.texts().last().map(String::as_str), Some("reply 5"));
}
