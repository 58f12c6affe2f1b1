//! DESIGN.md invariant 1 (durable before visible) and the session roll-up:
//! a client watching only the session sees what waits and answers it.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ahp_types::actions::StateAction;
use ahp_types::commands::SubscribeResult;
use ahp_types::state::{SessionInputRequest, SnapshotState};
use common::*;
use serde_json::{json, Value};
use tandem::ids::{ChannelUri, JournalPos, ServerSeq};
use tandem::store::{
    Batch, BindCommit, ChannelInfo, Commit, Journal, JournalError, MemoryJournal, Recovered,
    RecoveredChannel, TurnPage,
};
use tokio::sync::Notify;

/// The `Journal` methods a test journal hands straight to its `inner`
/// in-memory journal (each test journal writes only the ones it changes):
/// all of them, or (`bookkeeping`) those that neither create, read back
/// nor write a channel's actions.
macro_rules! pass_through {
    () => {
        pass_through!(bookkeeping);
        fn create_channel(&self, info: ChannelInfo) -> Commit {
            self.inner.create_channel(info)
        }
        fn recover(&self) -> Result<Recovered, JournalError> {
            self.inner.recover()
        }
        fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
            self.inner.load_channel(uri)
        }
    };
    (bookkeeping) => {
        fn remove(&self, channel: &ChannelUri) {
            self.inner.remove(channel)
        }
        fn len(&self, channel: &ChannelUri) -> JournalPos {
            self.inner.len(channel)
        }
        fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
            self.inner.turns_before(chat, before, limit)
        }
        fn audit_page(
            &self,
            session: &ChannelUri,
            after: u64,
            limit: u64,
        ) -> tandem::store::AuditPage {
            self.inner.audit_page(session, after, limit)
        }
        fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
            self.inner.bind_provider(provider, subject)
        }
    };
}

/// A journal that can hold the appends to one channel until the test
/// releases them.
#[derive(Default)]
struct GatedJournal {
    inner: MemoryJournal,
    hold: std::sync::Mutex<Option<String>>,
    release: Arc<Notify>,
    appended: std::sync::Mutex<Vec<String>>,
}

impl Journal for GatedJournal {
    pass_through!();
    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        let held = self.hold.lock().expect("lock").as_deref() == Some(channel.as_str());
        let release = self.release.clone();
        if let Ok(mut a) = self.appended.lock() {
            a.extend(batch.records.iter().map(|r| r.to_string()));
        }
        let stored = self.inner.append(channel, expected, batch);
        Box::pin(async move {
            if held {
                release.notified().await;
            }
            stored.await
        })
    }
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        self.inner.reserve_seq(next, count)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_sees_an_action_before_the_journal_has_it() {
    let journal = Arc::new(GatedJournal::default());
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let mut a = server.client("a").await;
    let mut b = server.client("b").await;
    let (_s, chat) = a.create_session().await;
    a.subscribe_chat(&chat).await;
    b.subscribe_chat(&chat).await;

    let (_s2, other_chat) = a.create_session().await;
    a.subscribe_chat(&other_chat).await;
    b.subscribe_chat(&other_chat).await;

    *journal.hold.lock().expect("lock") = Some(chat.clone());
    let seq = a.dispatch(&chat, draft("held")).await;
    let gate = &journal;
    eventually("the held append was called", || async move {
        gate.appended
            .lock()
            .expect("lock")
            .iter()
            .any(|r| r.contains("held"))
            .then_some(())
    })
    .await;
    // The append has started but not returned. A later action on another
    // chat goes through; it is the first envelope either client sees, so the
    // held one was published to neither sender nor subscriber.
    let marker = a.dispatch(&other_chat, draft("marker")).await;
    for c in [&mut a, &mut b] {
        let first = c.next_envelope().await;
        assert_eq!(
            (
                first.channel.as_str(),
                first.origin.as_ref().map(|o| o.client_seq)
            ),
            (other_chat.as_str(), Some(marker)),
            "an envelope arrived before the journal returned: {first:?}"
        );
    }
    *journal.hold.lock().expect("lock") = None;
    journal.release.notify_waiters();
    let echo = a.wait_echo(None, seq).await;
    assert!(echo.rejection_reason.is_none());
    let seen = b.next_envelope().await;
    assert_eq!(seen.server_seq, echo.server_seq);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_only_client_sees_the_rollup_and_answers_without_subscribing_to_the_chat() {
    let server = TestServer::start().await;
    let owner = server.client("owner").await;
    let (session, chat) = owner.create_session().await;
    let mut watcher = server.client("session-watcher").await;
    let initial = watcher.subscribe_session(&session).await;
    assert!(initial.input_needed.is_none());

    owner.start_turn(&chat, "/ask {\"questions\":[{\"kind\":\"text\",\"id\":\"q\",\"message\":\"?\",\"required\":true}]}").await;
    let set = watcher
        .wait_for(None, |e| {
            e.channel == session && matches!(e.action, StateAction::SessionInputNeededSet(_))
        })
        .await;
    let StateAction::SessionInputNeededSet(set) = set.action else {
        unreachable!()
    };
    let SessionInputRequest::ChatInput(req) = set.request else {
        panic!("expected a chat input entry")
    };
    assert_eq!(req.chat, chat);

    // Answer from the session roll-up alone.
    let answer =
        json!({"state": "submitted", "value": {"kind": "text", "value": "from the session"}});
    let done = watcher
        .dispatch(&req.chat, action(json!({"type": "chat/inputCompleted", "requestId": req.request.id, "response": "accept", "answers": {"q": answer}})))
        .await;
    let echo = watcher.wait_echo(None, done).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    assert_eq!(
        echo.channel, chat,
        "the echo reaches a sender not subscribed to the chat"
    );
    let removed = watcher
        .wait_for(None, |e| {
            e.channel == session && matches!(e.action, StateAction::SessionInputNeededRemoved(_))
        })
        .await;
    let StateAction::SessionInputNeededRemoved(removed) = removed.action else {
        unreachable!()
    };
    assert_eq!(removed.id, req.id);

    // The session state a fresh subscriber sees has nothing pending, and the
    // agent got the answer (its turn ends with it).
    let fresh = server
        .client("fresh")
        .await
        .subscribe_session(&session)
        .await;
    assert!(fresh.input_needed.is_none(), "{:?}", fresh.input_needed);
    let (server_ref, chat_ref) = (&server, chat.as_str());
    eventually("the agent reports the answer", || async move {
        let md = last_turn_markdown(&fresh_chat(server_ref, chat_ref).await);
        md.iter()
            .any(|m| m.starts_with("settled: answered") && m.contains("from the session"))
            .then_some(())
    })
    .await;
    server.stop().await;
}

/// A journal whose appends, or `serverSeq` reservations, start failing on
/// demand (a full or read-only disk).
#[derive(Default)]
struct FailingJournal {
    inner: MemoryJournal,
    fail: AtomicBool,
    fail_reserve: AtomicBool,
    /// Store the batch, then report a failure (its acknowledgement lost).
    lose_ack: AtomicBool,
}

impl Journal for FailingJournal {
    pass_through!();
    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        if self.fail.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(JournalError::Unavailable(
                "disk full".into(),
            ))));
        }
        if self.lose_ack.swap(false, Ordering::SeqCst) {
            let stored = self.inner.append(channel, expected, batch);
            return Box::pin(async move {
                stored.await?;
                Err(JournalError::Unavailable(
                    "the acknowledgement was lost".into(),
                ))
            });
        }
        self.inner.append(channel, expected, batch)
    }
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        if self.fail_reserve.load(Ordering::SeqCst) {
            return Err(JournalError::Unavailable("seq disk full".into()));
        }
        self.inner.reserve_seq(next, count)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_seq_reservation_stops_writes_and_keeps_serving_reads() {
    let journal = Arc::new(FailingJournal::default());
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let c = server.client("c").await;
    let (_s, chat) = c.create_session().await;
    let before = c.subscribe_chat(&chat).await.state;
    c.client.shutdown().await;
    server.stop().await;

    // After a restart the first write needs a new block of `serverSeq`
    // values, and the store refuses to record it.
    journal.fail_reserve.store(true, Ordering::SeqCst);
    let stored = journal.inner.records(&chat).len();
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let mut c = server.client("c").await;
    c.subscribe_chat(&chat).await;
    let first = c.dispatch(&chat, draft("unreserved")).await;
    let echo = c.wait_echo(None, first).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("serverSeq") && r.contains("seq disk full")),
        "a write without a reserved serverSeq is refused: {:?}",
        echo.rejection_reason
    );
    let second = c.dispatch(&chat, draft("still not")).await;
    let echo = c.wait_echo(None, second).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("read-only")),
        "{:?}",
        echo.rejection_reason
    );
    assert_eq!(
        journal.inner.records(&chat).len(),
        stored,
        "nothing was journaled"
    );

    // Reads keep working, and nothing refused is visible.
    let other = server.client("reader").await;
    let now = other.subscribe_chat(&chat).await.state;
    assert_eq!(now.draft, before.draft);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_writing_refuses_new_actions_and_keeps_serving_reads() {
    let journal = Arc::new(FailingJournal::default());
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let mut c = server.client("c").await;
    let (_s, chat) = c.create_session().await;
    let before = c.subscribe_chat(&chat).await.state;

    journal.fail.store(true, Ordering::SeqCst);
    let first = c.dispatch(&chat, draft("not stored")).await;
    let echo = c.wait_echo(None, first).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("not stored") && r.contains("disk full")),
        "{:?}",
        echo.rejection_reason
    );
    let second = c.dispatch(&chat, draft("still not")).await;
    let echo = c.wait_echo(None, second).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("read-only")),
        "{:?}",
        echo.rejection_reason
    );

    // Reads keep working, and nothing unstored is visible.
    let other = server.client("reader").await;
    let now = other.subscribe_chat(&chat).await.state;
    assert_eq!(
        now.draft, before.draft,
        "an action the store refused is not visible"
    );
    server.stop().await;
}

/// A store that goes away as a whole: appends and reads both fail until
/// it is back (a network store out of reach).
#[derive(Default)]
struct AwayJournal {
    inner: MemoryJournal,
    away: AtomicBool,
}

impl AwayJournal {
    fn check(&self) -> Result<(), JournalError> {
        if self.away.load(Ordering::SeqCst) {
            return Err(JournalError::Unavailable(
                "the store is out of reach".into(),
            ));
        }
        Ok(())
    }

    /// `commit` unless the store is away.
    fn reach(&self, commit: impl FnOnce() -> Commit) -> Commit {
        match self.check() {
            Ok(()) => commit(),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

impl Journal for AwayJournal {
    pass_through!(bookkeeping);
    fn create_channel(&self, info: ChannelInfo) -> Commit {
        self.reach(|| self.inner.create_channel(info))
    }
    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        self.reach(|| self.inner.append(channel, expected, batch))
    }
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        self.check()?;
        self.inner.reserve_seq(next, count)
    }
    fn recover(&self) -> Result<Recovered, JournalError> {
        self.check()?;
        self.inner.recover()
    }
    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        self.check()?;
        self.inner.load_channel(uri)
    }
}

/// A refused write whose channel cannot be read back (the store is away
/// for reads too) leaves a state nobody may see: subscribing is refused
/// with that reason, not as an unknown channel, an `initialize` or a
/// `reconnect` naming it is refused whole, and once the store answers
/// again the channel is served from what it holds and takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_the_store_cannot_read_back_refuses_subscriptions_with_why_until_it_can() {
    let journal = Arc::new(AwayJournal::default());
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let mut c = server.client("c").await;
    let (_s, chat) = c.create_session().await;
    let before = c.subscribe_chat(&chat).await.state;

    journal.away.store(true, Ordering::SeqCst);
    let refused = c.dispatch(&chat, draft("never stored")).await;
    let echo = c.wait_echo(None, refused).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("out of reach")),
        "{:?}",
        echo.rejection_reason
    );

    let reader = server.client("reader").await;
    let err = reader
        .client
        .request::<_, SubscribeResult>("subscribe", json!({"channel": chat}))
        .await
        .expect_err("the channel cannot vouch for its state");
    let err = format!("{err:?}");
    assert!(
        err.contains("could not be reloaded") && err.contains("out of reach"),
        "{err}"
    );
    assert!(!err.contains("no channel"), "not an unknown channel: {err}");
    // The refused channel is not left half subscribed on that connection:
    // the same request is answered the same way, not as a duplicate.
    let again = reader
        .client
        .request::<_, SubscribeResult>("subscribe", json!({"channel": chat}))
        .await
        .expect_err("still refused");
    assert!(format!("{again:?}").contains("could not be reloaded"));

    let late = TestClient::raw_connect(&server.url()).await;
    let err = late
        .initialize("late".into(), vec!["1.0.0".into()], vec![chat.clone()])
        .await
        .expect_err("initialize names a channel that refuses");
    assert!(
        format!("{err:?}").contains("could not be reloaded"),
        "{err:?}"
    );
    // Refused whole: the connection may initialize again.
    late.initialize("late".into(), vec!["1.0.0".into()], vec![])
        .await
        .expect("a second initialize after a refused one");

    // A `reconnect` too old for a replay takes fresh snapshots: refused
    // whole the same way, and the connection may try again.
    let back = TestClient::raw_connect(&server.url()).await;
    let reconnect = |subscriptions: Vec<String>| {
        back.request::<_, Value>(
            "reconnect",
            json!({"channel": "ahp-root://", "clientId": "back", "lastSeenServerSeq": -1, "subscriptions": subscriptions}),
        )
    };
    let err = reconnect(vec![chat.clone()])
        .await
        .expect_err("reconnect names a channel that refuses");
    assert!(
        format!("{err:?}").contains("could not be reloaded"),
        "{err:?}"
    );
    reconnect(vec![])
        .await
        .expect("a second reconnect after a refused one");

    journal.away.store(false, Ordering::SeqCst);
    let (reader, chat_ref) = (&reader, chat.as_str());
    let now = eventually("the channel is served again", || async move {
        let got = reader
            .client
            .request::<_, SubscribeResult>("subscribe", json!({"channel": chat_ref}))
            .await
            .ok()?;
        match got.snapshot?.state {
            SnapshotState::Chat(c) => Some(*c),
            _ => None,
        }
    })
    .await;
    assert_eq!(now.draft, before.draft, "the refused write is not visible");
    let client = tokio::sync::Mutex::new(&mut c);
    eventually("writes resume", || async {
        let mut c = client.lock().await;
        let seq = c.dispatch(&chat, draft("stored now")).await;
        c.wait_echo(None, seq)
            .await
            .rejection_reason
            .is_none()
            .then_some(())
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_but_stored_reaches_every_client_and_writes_resume() {
    let journal = Arc::new(FailingJournal::default());
    let server = TestServer::start_with_journal(tandem::Config::default(), journal.clone()).await;
    let mut a = server.client("a").await;
    let mut b = server.client("b").await;
    let (_s, chat) = a.create_session().await;
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;

    // The store keeps the draft but its answer is lost: the sender is told
    // it was refused, yet the store holds it, so it is published to all.
    journal.lose_ack.store(true, Ordering::SeqCst);
    let ghost = a.dispatch(&chat, draft("stored after all")).await;
    let echo = a.wait_echo(Some(&mut ma), ghost).await;
    assert!(
        echo.rejection_reason
            .as_deref()
            .is_some_and(|r| r.contains("acknowledgement was lost")),
        "{:?}",
        echo.rejection_reason
    );
    let text = |m: &ChatMirror| m.state.draft.as_ref().map(|d| d.text.clone());
    a.wait_state(&mut ma, |s| {
        s.draft
            .as_ref()
            .is_some_and(|d| d.text == "stored after all")
    })
    .await;
    b.wait_state(&mut mb, |s| {
        s.draft
            .as_ref()
            .is_some_and(|d| d.text == "stored after all")
    })
    .await;
    // (The reload replays the action, so only `modifiedAt` may differ.)
    let fresh = crate::common::fresh_chat(&server, &chat).await;
    assert_eq!(fresh.draft, ma.state.draft);
    assert_eq!(fresh.draft, mb.state.draft);
    assert_eq!(fresh.turns, ma.state.turns);
    assert!(
        journal
            .inner
            .records(&chat)
            .iter()
            .any(|r| r.contains("stored after all")),
        "the store holds it"
    );

    // The channel takes writes again once it has read the store back.
    let writer = tokio::sync::Mutex::new((&mut b, &mut mb));
    eventually("writes resume", || async {
        let mut w = writer.lock().await;
        let (b, mb) = &mut *w;
        let seq = b.dispatch(&chat, draft("later")).await;
        b.wait_echo(Some(&mut **mb), seq)
            .await
            .rejection_reason
            .is_none()
            .then_some(())
    })
    .await;
    a.wait_state(&mut ma, |s| {
        s.draft.as_ref().is_some_and(|d| d.text == "later")
    })
    .await;
    assert_eq!(text(&ma), Some("later".to_owned()));
    server.stop().await;
}
