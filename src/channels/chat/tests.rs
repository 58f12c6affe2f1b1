//! A chat whose append fails goes back to what the store holds and settles
//! every interaction still open: the agent waiting on one is resumed, once,
//! with `aborted` — not left hanging. A turn whose agent lost an update to
//! the store ends with `chat/error` once the store takes writes again.
//! A dispatcher's held reply leaves with the action's echo or rejection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::state::ChatInputRequest;
use serde_json::json;

use crate::channels::testing::{chat_with_a_turn, dispatch, TestJournal, WAIT};
use crate::channels::ClientDispatch;
use crate::channels::{DispatchConn, Dispatcher};
use crate::interactions::{Interaction, Outcome};
use crate::transport::{FakeWire, Outbound, Push, Wire};

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
    // Paused: the chat's store retries come due as the test says, however
    // busy the machine is.
    tokio::time::pause();
    let (journal, _chat, _client, turn) = chat_with_a_turn().await;
    journal.unwritable.store(true, Ordering::SeqCst);
    let refused = turn.handle.emit(delta("lost")).await;
    assert!(
        refused.as_ref().is_err_and(|r| r.0.contains("read-only")),
        "{refused:?}"
    );
    // On paused time the retry due after one STORE_RETRY has run, and
    // found the store cut off, before this window closes.
    let written = journal
        .seen_within(crate::channels::commit::STORE_RETRY * 2, |e| {
            e.contains("chat/error")
        })
        .await;
    assert!(!written, "nothing is written while the store is cut off");
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

/// A [`FakeWire`] that says when it was written to.
struct WatchedWire {
    inner: Arc<FakeWire>,
    writes: tokio::sync::watch::Sender<usize>,
}

impl WatchedWire {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: FakeWire::with_room(1 << 20),
            writes: tokio::sync::watch::channel(0).0,
        })
    }
}

impl Wire for WatchedWire {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.try_write(buf)?;
        self.writes.send_modify(|w| *w += 1);
        Ok(n)
    }
}

/// Wait until `wire` holds `n` frames.
async fn frames(wire: &WatchedWire, n: usize) -> Vec<String> {
    let mut writes = wire.writes.subscribe();
    tokio::time::timeout(WAIT, writes.wait_for(|_| wire.inner.texts().len() >= n))
        .await
        .expect("the frames are written in time")
        .expect("the wire is there");
    wire.inner.texts()
}

#[actix::test]
async fn a_held_dispatch_reply_leaves_in_one_write_with_the_echo_or_the_rejection() {
    let (journal, chat, _, _turn) = chat_with_a_turn().await;
    let client = Arc::new(Outbound::new(1 << 20));
    let wire = WatchedWire::new();
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
    assert_eq!(wire.inner.writers().len(), 1, "reply and echo in one write");

    // Refused by the chat (a second turn while one runs): with the rejection.
    let again = json!({"type": "chat/turnStarted", "turnId": "t2", "startedAt": crate::time::now_rfc3339(),
                       "message": {"text": "again", "origin": {"kind": "user"}}});
    chat.do_send(dispatch_held(&client, 3, again, "reply 3"));
    let texts = frames(&wire, 4).await;
    assert_eq!(texts[2], "reply 3");
    assert!(texts[3].contains("rejectionReason"), "{texts:?}");
    assert_eq!(wire.inner.writers().len(), 2);

    // Refused by the store: with the rejection.
    journal.fail_appends.store(true, Ordering::SeqCst);
    chat.do_send(dispatch_held(&client, 4, draft("y"), "reply 4"));
    let texts = frames(&wire, 6).await;
    assert_eq!(texts[4], "reply 4");
    assert!(texts[5].contains("rejectionReason"), "{texts:?}");

    // A dispatch nobody handles (its chat gone): the reply leaves when it
    // is dropped.
    drop(dispatch_held(&client, 5, draft("z"), "reply 5"));
    assert_eq!(
        wire.inner.texts().last().map(String::as_str),
        Some("reply 5")
    );
}

/// An input request of `questions` text questions, `q0`, `q1`, ….
fn text_questions(id: &str, questions: usize) -> ChatInputRequest {
    let questions: Vec<serde_json::Value> = (0..questions)
        .map(|i| json!({"kind": "text", "id": format!("q{i}"), "message": "?"}))
        .collect();
    serde_json::from_value(json!({"id": id, "questions": questions})).expect("a request")
}

#[actix::test]
async fn an_input_nobody_engages_with_times_out_after_its_time_per_question() {
    // Paused: the auto-resolution timer comes due on the chat's clock
    // alone, however busy the machine is.
    tokio::time::pause();
    let (_journal, _chat, _client, turn) = chat_with_a_turn().await;
    let asked = tokio::time::Instant::now();
    let settled = turn
        .handle
        .interact(Interaction::Input {
            request: text_questions("r1", 3),
            auto_resolution_ms: Some(1_000),
        })
        .await;
    assert_eq!(settled.outcome, Outcome::TimedOut, "{settled:?}");
    let waited = asked.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(3)
            && waited < std::time::Duration::from_millis(3_100),
        "1 s for each of 3 questions, then at once: {waited:?}"
    );
}

#[actix::test]
async fn an_input_someone_drafted_in_does_not_time_out() {
    tokio::time::pause();
    let (journal, chat, client, turn) = chat_with_a_turn().await;
    let waiting = actix::spawn(async move {
        turn.handle
            .interact(Interaction::Input {
                request: text_questions("r1", 1),
                auto_resolution_ms: Some(1_000),
            })
            .await
    });
    journal
        .wait_event("the input request", |e| {
            e.starts_with("append") && e.contains("chat/inputRequested")
        })
        .await;
    chat.do_send(dispatch(
        &client,
        2,
        json!({"type": "chat/inputAnswerChanged", "requestId": "r1", "questionId": "q0",
               "answer": {"state": "draft", "value": {"kind": "text", "value": "ok"}}}),
    ));
    journal
        .wait_event("the draft", |e| e.contains("chat/inputAnswerChanged"))
        .await;
    // Well past the auto-resolution time: a request that had timed out
    // would have settled `timedOut` by then, and the completion below
    // would be refused.
    tokio::time::advance(std::time::Duration::from_secs(10)).await;
    chat.do_send(dispatch(
        &client,
        3,
        json!({"type": "chat/inputCompleted", "requestId": "r1", "response": "accept",
               "answers": {"q0": {"state": "submitted", "value": {"kind": "text", "value": "ok"}}}}),
    ));
    let settled = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the waiting agent is resumed")
        .expect("the agent task runs");
    assert_eq!(settled.outcome, Outcome::Answered, "{settled:?}");
}
