//! A follower copy of a channel (a cluster node that does not own it): it
//! applies the owner's batches once each and in order, reads the store
//! again after a gap (and again until it can), and hands its clients'
//! actions to the owner, whose rejection reaches the client.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::{ActionOrigin, StateAction};

use super::commit::STORE_RETRY;
use super::forward::{ForwardReply, ForwardRequest};
use super::recovery::Restore;
use super::registry::ChannelAddr;
use super::session::GetSessionState;
use super::testing::{self, TestAgents, TestJournal};
use super::{ClientDispatch, Dispatcher, Replicate, Subscribe};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::cluster::{ClusterEvent, ClusterLink, ForwardHandler, LinkFuture};
use crate::store::{Journal, JournalError, Replicated};
use crate::transport::Outbound;

/// A link on which this node owns nothing and every forward gets `reply`.
struct FakeLink {
    forwarded: tokio::sync::watch::Sender<Vec<Vec<u8>>>,
    reply: Vec<u8>,
    /// The chats this node applies now.
    watched: parking_lot::Mutex<std::collections::HashSet<ChannelUri>>,
}

impl FakeLink {
    fn new(reply: Vec<u8>) -> Arc<Self> {
        Arc::new(Self {
            forwarded: tokio::sync::watch::channel(Vec::new()).0,
            reply,
            watched: Default::default(),
        })
    }

    /// Wait until `n` requests were forwarded, and return them.
    async fn forwarded(&self, n: usize) -> Vec<Vec<u8>> {
        let mut rx = self.forwarded.subscribe();
        let forwarded = tokio::time::timeout(testing::WAIT, rx.wait_for(|f| f.len() >= n))
            .await
            .expect("forwarded in time")
            .expect("the link is there")
            .clone();
        forwarded
    }
}

impl ClusterLink for FakeLink {
    fn node(&self) -> &str {
        "follower"
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
    fn owns(&self, _: &ChannelUri) -> bool {
        false
    }
    fn follows(&self, _: &ChannelUri) {}
    fn watch(&self, channel: &ChannelUri, on: bool) {
        let mut w = self.watched.lock();
        if on {
            w.insert(channel.clone());
        } else {
            w.remove(channel);
        }
    }
    fn follow(&self, _: Arc<dyn Fn(ClusterEvent) + Send + Sync>) {}
    fn forward(&self, _: &ChannelUri, body: Vec<u8>) -> LinkFuture<Result<Vec<u8>, String>> {
        self.forwarded.send_modify(|f| f.push(body));
        Box::pin(std::future::ready(Ok(self.reply.clone())))
    }
    fn serve(&self, _: ForwardHandler) {}
    fn orphans(&self, _: Vec<ChannelUri>) -> LinkFuture<Vec<ChannelUri>> {
        Box::pin(std::future::ready(Vec::new()))
    }
    fn take_over(&self, _: Vec<ChannelUri>) -> LinkFuture<Result<bool, JournalError>> {
        Box::pin(std::future::ready(Ok(false)))
    }
    fn release(&self, _: Vec<ChannelUri>) -> LinkFuture<()> {
        Box::pin(std::future::ready(()))
    }
    fn watch_every(&self) -> Duration {
        Duration::from_secs(60)
    }
}

fn title(text: &str) -> StateAction {
    serde_json::from_value(serde_json::json!({"type": "session/titleChanged", "title": text}))
        .expect("an action")
}

fn origin(client: &str, seq: i64) -> ActionOrigin {
    ActionOrigin {
        client_id: client.into(),
        client_seq: seq,
    }
}

/// The owner's batch holding records `from..to` of `uri`, as a follower
/// reads it from the stream.
fn batch(journal: &TestJournal, uri: &str, from: u64, to: u64) -> Replicated {
    let stored = journal
        .load_channel(&uri.into())
        .expect("readable")
        .expect("stored");
    let tail_start = stored.len.get() - stored.tail.len() as u64;
    let records = stored.tail[(from - tail_start) as usize..(to - tail_start) as usize].to_vec();
    Replicated {
        channel: uri.into(),
        writer: "owner".into(),
        pos: JournalPos::new(from),
        origins: vec![None; records.len()],
        records,
    }
}

/// Another node on `journal`, reaching the owner through `link`: its
/// copy of the session `uri`, restored from the store.
async fn follow(
    journal: &Arc<TestJournal>,
    agents: Arc<TestAgents>,
    link: Arc<FakeLink>,
    uri: &str,
) -> actix::Addr<super::session::SessionActor> {
    let follower = follower_node(journal, agents, link).await;
    let Some(ChannelAddr::Session(copy)) = follower.registry.get(uri).map(|c| c.addr) else {
        panic!("the follower has the session");
    };
    copy
}

/// Another node on `journal`, reaching the owner through `link`, restored
/// from the store.
async fn follower_node(
    journal: &Arc<TestJournal>,
    agents: Arc<TestAgents>,
    link: Arc<FakeLink>,
) -> Arc<super::context::Shared> {
    let follower = Arc::new(
        super::context::Shared::new(
            crate::Config::default(),
            journal.clone(),
            agents,
            Vec::new(),
            ServerSeq::ZERO,
        )
        .expect("serverSeq")
        .with_cluster(Some(link)),
    );
    let (follower_root, _) = testing::root(&follower).await;
    follower_root
        .send(Restore(journal.recover().expect("recover")))
        .await
        .expect("root runs")
        .expect("restored");
    follower
}

/// A new connection subscribed to `copy`.
async fn subscribed(copy: &actix::Addr<super::session::SessionActor>) -> Arc<Outbound> {
    let conn = Arc::new(Outbound::new(1 << 20));
    copy.send(Subscribe {
        conn: conn.clone(),
        view_turns: None,
    })
    .await
    .expect("runs")
    .expect("subscribed");
    conn
}

fn title_frames(conn: &Outbound) -> Vec<String> {
    testing::frames(conn)
        .into_iter()
        .filter(|f| f.contains("session/titleChanged"))
        .collect()
}

#[actix::test]
async fn a_follower_applies_each_batch_once_reads_again_after_a_gap_and_forwards_its_clients() {
    // Paused: the follower's read again comes due as the test says.
    tokio::time::pause();
    let uri = "ahp-session:/s";
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    // The owner: an ordinary node on the journal.
    let owner = testing::shared(journal.clone(), agents.clone());
    let (owner_root, _) = testing::root(&owner).await;
    let owned = testing::session(&owner, &owner_root, uri).await;
    let owner_conn = Arc::new(Outbound::new(1 << 20));
    let write = |text: &str, seq: i64| {
        owned.do_send(ClientDispatch {
            conn: Dispatcher::Conn(owner_conn.clone().into()),
            origin: origin("ann", seq),
            action: title(text),
            as_agent: false,
            by: None,
        })
    };

    // The follower: another node on the same journal, owning nothing.
    let reply = ForwardReply::Rejected {
        reason: "refused by the owner".into(),
    };
    let link = FakeLink::new(reply.encode());
    let copy = follow(&journal, agents, link.clone(), uri).await;
    let watcher = subscribed(&copy).await;
    let start = journal.len(&uri.into()).get();

    // One batch: applied and published once, however often it arrives.
    write("one", 1);
    journal
        .wait_event("the first title", |e| e.contains("\"one\""))
        .await;
    let first = batch(&journal, uri, start, start + 1);
    copy.do_send(Replicate(first.clone()));
    copy.do_send(Replicate(first));
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "one");
    assert_eq!(title_frames(&watcher).len(), 1, "published once");

    // A gap (the batch of "two" never arrived): the follower reads the
    // store again and publishes both.
    write("two", 2);
    write("three", 3);
    journal
        .wait_event("the third title", |e| e.contains("\"three\""))
        .await;
    copy.do_send(Replicate(batch(&journal, uri, start + 2, start + 3)));
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "three");
    let frames = title_frames(&watcher);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert!(frames[0].contains("\"two\"") && frames[1].contains("\"three\""));

    // A client of the follower: its action goes to the owner, and the
    // owner's rejection comes back to it.
    let client = Arc::new(Outbound::new(1 << 20));
    copy.do_send(ClientDispatch {
        conn: Dispatcher::Conn(client.clone().into()),
        origin: origin("bob", 1),
        action: title("from bob"),
        as_agent: false,
        by: None,
    });
    let sent = link.forwarded(1).await;
    assert_eq!(sent.len(), 1);
    let Ok(ForwardRequest::Dispatch {
        channel, origin, ..
    }) = ForwardRequest::decode(&sent[0])
    else {
        panic!("a forwarded dispatch");
    };
    assert_eq!((channel.as_str(), origin.client_id.as_str()), (uri, "bob"));
    let got = testing::next_frames(&client).await;
    assert!(
        got.iter().any(|f| f.contains("refused by the owner")),
        "{got:?}"
    );
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "three", "nothing applied locally");

    // A gap found while the store cannot be read (NATS away): the follower
    // reads again on its own once it can, though no batch comes after.
    write("four", 4);
    write("five", 5);
    journal
        .wait_event("the fifth title", |e| e.contains("\"five\""))
        .await;
    let fifth = batch(&journal, uri, start + 4, start + 5);
    journal.unreadable.store(true, Ordering::SeqCst);
    copy.do_send(Replicate(fifth.clone()));
    // While its read is due the follower leaves batches to it.
    copy.do_send(Replicate(fifth));
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "three", "behind while the store is away");
    journal.unreadable.store(false, Ordering::SeqCst);
    let behind = title_frames(&watcher);
    assert!(behind.is_empty(), "{behind:?}");
    // On paused time: the read again is due one STORE_RETRY after the
    // failed one, whatever the machine's load.
    let asked = tokio::time::Instant::now();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        frames.extend(
            testing::next_frames(&watcher)
                .await
                .into_iter()
                .filter(|f| f.contains("session/titleChanged")),
        );
    }
    // Timers fire on a millisecond tick: one more at most.
    assert!(
        asked.elapsed() <= STORE_RETRY + Duration::from_millis(1),
        "read again within one retry: {:?}",
        asked.elapsed()
    );
    assert!(
        frames[0].contains("\"four\"") && frames[1].contains("\"five\""),
        "{frames:?}"
    );
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "five");
}

/// A follower's client dispatches; the owner journals the action, but the
/// batch holding it never reaches the follower (the next one shows the
/// gap). Reading the channel again, the follower publishes the action with
/// its origin, and the dispatcher gets its echo — not a stranger's action
/// beside its own pending one.
#[actix::test]
async fn a_forwarded_action_a_follower_reads_again_after_a_gap_is_echoed_to_its_dispatcher() {
    let uri = "ahp-session:/s";
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let owner = testing::shared(journal.clone(), agents.clone());
    let (owner_root, _) = testing::root(&owner).await;
    let owned = testing::session(&owner, &owner_root, uri).await;
    let link = FakeLink::new(ForwardReply::Done.encode());
    let copy = follow(&journal, agents, link.clone(), uri).await;
    let start = journal.len(&uri.into()).get();

    // Bob, on the follower: his dispatch goes to the owner.
    let bob = subscribed(&copy).await;
    copy.do_send(ClientDispatch {
        conn: Dispatcher::Conn(bob.clone().into()),
        origin: origin("bob", 1),
        action: title("from bob"),
        as_agent: false,
        by: None,
    });
    assert_eq!(link.forwarded(1).await.len(), 1, "forwarded to the owner");

    // The owner journals it (as the forward would have it do), then Ann's.
    let ann = Arc::new(Outbound::new(1 << 20));
    for (who, seq, text) in [("bob", 1, "from bob"), ("ann", 1, "from ann")] {
        owned.do_send(ClientDispatch {
            conn: Dispatcher::Conn(ann.clone().into()),
            origin: origin(who, seq),
            action: title(text),
            as_agent: false,
            by: None,
        });
    }
    journal
        .wait_event("Ann's title", |e| e.contains("from ann"))
        .await;

    // Only Ann's batch arrives: a gap, so the follower reads the store.
    copy.do_send(Replicate(batch(&journal, uri, start + 1, start + 2)));
    let state = copy.send(GetSessionState).await.expect("runs");
    assert_eq!(state.title, "from ann");
    let frames = title_frames(&bob);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert!(
        frames[0].contains("from bob")
            && frames[0].contains(r#""origin":{"clientId":"bob","clientSeq":1}"#),
        "Bob's action comes back to him as his own: {frames:?}"
    );
    assert!(
        frames[1].contains("from ann") && frames[1].contains(r#""clientId":"ann""#),
        "{frames:?}"
    );
}

/// Following by interest: a chat another node owns is not applied on a
/// node where nobody watches it; a subscriber there gets it read from the
/// store and live from then on; once the last one left for the grace
/// period, it passes by again, and a reconnect naming it gets a snapshot.
#[actix::test]
async fn a_chat_is_applied_only_while_someone_on_the_node_watches_it() {
    tokio::time::pause();
    let (session, chat) = ("ahp-session:/s", "ahp-chat:/s/c");
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let owner = testing::shared(journal.clone(), agents.clone());
    let (owner_root, _) = testing::root(&owner).await;
    let owned = testing::session(&owner, &owner_root, session).await;
    ChannelAddr::Session(owned)
        .create_chat(chat.into(), None)
        .expect("a session")
        .await
        .expect("chat created");
    let Some(ChannelAddr::Chat(owned_chat)) = owner.registry.get(chat).map(|c| c.addr) else {
        panic!("the owner has the chat");
    };
    let owner_conn = Arc::new(Outbound::new(1 << 20));
    let draft = |text: &str, seq: i64| {
        owned_chat.do_send(testing::dispatch(
            &owner_conn,
            seq,
            serde_json::json!({"type": "chat/draftChanged", "draft": {"text": text, "origin": {"kind": "user"}}}),
        ));
    };

    let link = FakeLink::new(ForwardReply::Done.encode());
    let node = follower_node(&journal, agents, link.clone()).await;
    let copy = node.registry.get(chat).expect("the follower has the chat");
    let ChannelAddr::Chat(copy_addr) = copy.addr.clone() else {
        panic!("a chat");
    };
    // Not watched here: its batches pass, nothing is published.
    let start = journal.len(&chat.into()).get();
    draft("one", 1);
    journal
        .wait_event("the first draft", |e| e.contains("\"one\""))
        .await;
    let before = node.publisher.current();
    copy_addr.do_send(Replicate(batch(&journal, chat, start, start + 1)));
    copy.addr.demote().await; // the actor handled what came before
    assert!(link.watched.lock().is_empty(), "nobody watches it yet");
    assert_eq!(node.publisher.current(), before, "nothing applied");

    // A subscriber here: read from the store, then applied live.
    let watcher = Arc::new(Outbound::new(1 << 20));
    let snap = copy_addr
        .send(Subscribe {
            conn: watcher.clone(),
            view_turns: None,
        })
        .await
        .expect("runs")
        .expect("subscribed");
    assert!(
        snap.0.contains("\"one\""),
        "read from the store: {}",
        snap.0
    );
    assert!(link.watched.lock().contains(&ChannelUri::from(chat)));
    let warmed_at = node.publisher.current();
    draft("two", 2);
    journal
        .wait_event("the second draft", |e| e.contains("\"two\""))
        .await;
    copy_addr.do_send(Replicate(batch(&journal, chat, start + 1, start + 2)));
    let got = testing::next_frames(&watcher).await;
    assert!(got.iter().any(|f| f.contains("\"two\"")), "{got:?}");
    // A reconnect from before it was watched here gets a snapshot; one
    // that saw the envelope after, the replay.
    let replay = |from: ServerSeq| {
        let conn = Arc::new(Outbound::new(1 << 20));
        node.publisher.replay_and_subscribe(
            from,
            &[(chat.into(), copy.hub.clone())],
            &conn,
            1 << 20,
            |_| {},
        )
    };
    assert!(matches!(replay(before), crate::publish::Replay::TooOld));
    assert!(matches!(replay(warmed_at), crate::publish::Replay::TooOld));
    assert!(matches!(
        replay(ServerSeq::new(warmed_at.get() + 1)),
        crate::publish::Replay::Envelopes(e) if e.is_empty()
    ));

    // The last subscriber leaves (those replays subscribed too): once the
    // grace has passed, it passes this node by again.
    for id in copy.hub.ids() {
        copy.hub.remove(id);
    }
    let grace = node.config.follow_grace;
    tokio::time::sleep(grace / 2).await;
    assert!(!link.watched.lock().is_empty(), "kept within the grace");
    tokio::time::sleep(grace).await;
    copy.addr.demote().await; // the actor handled what came before
    assert!(link.watched.lock().is_empty(), "let go after the grace");
    assert!(matches!(
        replay(node.publisher.current()),
        crate::publish::Replay::TooOld
    ));
}
