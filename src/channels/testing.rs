//! Test support for actor-level tests: a journal whose writes can be held,
//! failed and observed, an agent directory with one agent that hands its
//! turns to the test, and a root channel started on the test's system.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::AgentInfo;
use ahp_types::ROOT_RESOURCE_URI;
use serde_json::json;
use tokio::sync::{mpsc, watch};

use super::agent::{Agent, AgentDirectory, AgentTurn};
use super::core::Shared;
use super::registry::{Channel, ChannelAddr};
use super::root::{CreateSession, RootActor};
use super::session::GetSessionState;
use super::session::SessionActor;
use super::{ClientDispatch, Subscribe};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::publish::Hub;
use crate::store::{
    AuditPage, Batch, BindCommit, ChannelInfo, Commit, Journal, JournalError, MemoryJournal,
    Recovered, RecoveredChannel, TurnPage,
};
use crate::transport::Outbound;

/// How long a test waits for anything before it fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// A journal over [`MemoryJournal`] that reports every call as an event
/// (`create <uri>`, `append <record>`, `sync`) and can hold new channels'
/// records, hold `sync`, or fail appends, on demand.
pub struct TestJournal {
    inner: MemoryJournal,
    events: watch::Sender<Vec<String>>,
    /// `false`: `create_channel` futures wait until it turns `true`.
    creates_open: watch::Sender<bool>,
    /// `false`: `sync` blocks until it turns `true`.
    sync_open: (parking_lot::Mutex<bool>, parking_lot::Condvar),
    /// Appends fail with `Unavailable` (a full disk).
    pub fail_appends: AtomicBool,
    /// `writable` says no (a cluster node cut off from NATS).
    pub unwritable: AtomicBool,
    /// `load_channel` fails with `Unavailable` (NATS away while a follower
    /// reads a channel again).
    pub unreadable: AtomicBool,
    /// The next write probe panics (a store that fails hard), once.
    pub probe_panics: AtomicBool,
    /// Who dispatched each stored record, by channel and position, kept as
    /// the cluster journal keeps them (`load_channel` hands them back).
    origins: Arc<parking_lot::Mutex<HashMap<(ChannelUri, u64), ActionOrigin>>>,
}

impl Default for TestJournal {
    fn default() -> Self {
        Self {
            inner: MemoryJournal::new(),
            events: watch::channel(Vec::new()).0,
            creates_open: watch::channel(true).0,
            sync_open: (parking_lot::Mutex::new(true), parking_lot::Condvar::new()),
            fail_appends: AtomicBool::new(false),
            unwritable: AtomicBool::new(false),
            unreadable: AtomicBool::new(false),
            probe_panics: AtomicBool::new(false),
            origins: Arc::default(),
        }
    }
}

impl TestJournal {
    fn event(&self, e: String) {
        self.events.send_modify(|v| v.push(e));
    }

    /// Wait until an event matching `pred` happened.
    pub async fn wait_event(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let seen = self.seen_within(WAIT, pred).await;
        assert!(seen, "no {what} in {:?}", self.events.borrow());
    }

    /// Whether an event matching `pred` happens (or happened) within
    /// `within`. On paused time a `false` is exact: everything due before
    /// the window closed has run.
    pub async fn seen_within(&self, within: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let mut rx = self.events.subscribe();
        let seen = tokio::time::timeout(within, rx.wait_for(|v| v.iter().any(|e| pred(e)))).await;
        matches!(seen, Ok(Ok(_)))
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<String> {
        self.events.borrow().clone()
    }

    /// Hold (`false`) or release (`true`) new channels' records.
    pub fn open_creates(&self, open: bool) {
        self.creates_open.send_replace(open);
    }

    /// Hold (`false`) or release (`true`) `sync`.
    pub fn open_sync(&self, open: bool) {
        *self.sync_open.0.lock() = open;
        self.sync_open.1.notify_all();
    }

    /// Wait until the store barrier (`sync`) is reached, and return every
    /// event before it.
    pub async fn events_before_sync(&self) -> Vec<String> {
        self.wait_event("a store barrier", |e| e == "sync").await;
        let mut events = self.events();
        let barrier = events.iter().position(|e| e == "sync");
        events.truncate(barrier.unwrap_or(events.len()));
        events
    }

    /// Release a held `sync` and return the answer of `held`, the request
    /// that waited for it (failing after [`WAIT`]).
    pub async fn release_sync<T>(&self, held: tokio::task::JoinHandle<T>) -> T {
        self.open_sync(true);
        tokio::time::timeout(WAIT, held)
            .await
            .expect("answered once the store barrier passed")
            .expect("the request's task runs")
    }
}

impl Journal for TestJournal {
    fn create_channel(&self, info: ChannelInfo) -> Commit {
        self.event(format!("create {}", info.uri));
        let stored = self.inner.create_channel(info);
        let mut open = self.creates_open.subscribe();
        Box::pin(async move {
            let _ = open.wait_for(|o| *o).await;
            stored.await
        })
    }

    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        for r in &batch.records {
            self.event(format!("append {r}"));
        }
        if self.fail_appends.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(JournalError::Unavailable(
                "disk full".into(),
            ))));
        }
        let origins: Vec<_> = batch
            .origins
            .iter()
            .enumerate()
            .filter_map(|(i, o)| Some(((channel.clone(), expected.get() + i as u64), o.clone()?)))
            .collect();
        let stored = self.inner.append(channel, expected, batch);
        let kept = self.origins.clone();
        Box::pin(async move {
            stored.await?;
            kept.lock().extend(origins);
            Ok(())
        })
    }

    fn writable(&self) -> Result<(), JournalError> {
        if self.unwritable.load(Ordering::SeqCst) {
            return Err(JournalError::Unavailable("cut off".into()));
        }
        Ok(())
    }

    fn probe_write(&self) -> Result<(), JournalError> {
        if self.probe_panics.swap(false, Ordering::SeqCst) {
            panic!("the test made the probe fail hard");
        }
        self.writable()
    }

    fn remove(&self, channel: &ChannelUri) {
        self.event(format!("remove {channel}"));
        self.inner.remove(channel)
    }

    fn len(&self, channel: &ChannelUri) -> JournalPos {
        self.inner.len(channel)
    }

    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
        self.inner.turns_before(chat, before, limit)
    }

    fn audit_page(&self, session: &ChannelUri, after: u64, limit: u64) -> AuditPage {
        self.inner.audit_page(session, after, limit)
    }

    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        self.inner.reserve_seq(next, count)
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        self.inner.recover()
    }

    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
        self.inner.bind_provider(provider, subject)
    }

    fn sync(&self) -> Result<(), JournalError> {
        self.event("sync".into());
        let mut open = self.sync_open.0.lock();
        while !*open {
            self.sync_open.1.wait(&mut open);
        }
        Ok(())
    }

    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        if self.unreadable.load(Ordering::SeqCst) {
            return Err(JournalError::Unavailable("the test made reads fail".into()));
        }
        let mut loaded = self.inner.load_channel(uri)?;
        if let Some(c) = &mut loaded {
            let first = c.len.get() - c.tail.len() as u64;
            let kept = self.origins.lock();
            c.tail_origins = (first..c.len.get())
                .map(|pos| kept.get(&(uri.clone(), pos)).cloned())
                .collect();
        }
        Ok(loaded)
    }
}

/// Provider id of the test agent.
pub const AGENT: &str = "test-agent";

/// An agent that hands every turn it gets to the test.
pub struct TestAgent {
    turns: mpsc::UnboundedSender<AgentTurn>,
}

impl Agent for TestAgent {
    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: AGENT.into(),
            display_name: "Test agent".into(),
            description: "Hands its turns to the test".into(),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn start_turn(&self, turn: AgentTurn) {
        let _ = self.turns.send(turn);
    }
}

/// A directory holding only the [`TestAgent`].
pub struct TestAgents(Arc<TestAgent>);

impl TestAgents {
    /// The directory, and the turns its agent is given.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<AgentTurn>) {
        let (turns, rx) = mpsc::unbounded_channel();
        (Arc::new(Self(Arc::new(TestAgent { turns }))), rx)
    }
}

impl AgentDirectory for TestAgents {
    fn get(&self, provider: &str) -> Option<Arc<dyn Agent>> {
        (provider == AGENT).then(|| self.0.clone() as Arc<dyn Agent>)
    }

    fn infos(&self) -> Vec<AgentInfo> {
        vec![self.0.info()]
    }

    fn default_provider(&self) -> &str {
        AGENT
    }
}

/// The server context over `journal` and `agents`, default config.
pub fn shared(journal: Arc<dyn Journal>, agents: Arc<dyn AgentDirectory>) -> Arc<Shared> {
    Arc::new(
        Shared::new(
            crate::Config::default(),
            journal,
            agents,
            Vec::new(),
            ServerSeq::ZERO,
        )
        .expect("a test store reserves serverSeq"),
    )
}

/// Start and register the root channel, with a connection subscribed to it
/// (what a client watching root would receive).
pub async fn root(shared: &Arc<Shared>) -> (Addr<RootActor>, Arc<Outbound>) {
    let hub = Arc::new(Hub::default());
    let (s, h) = (shared.clone(), hub.clone());
    let root = RootActor::create(move |ctx| RootActor::new(h, s, ctx.address()));
    shared.registry.insert(Channel {
        uri: ROOT_RESOURCE_URI.into(),
        hub,
        addr: ChannelAddr::Root(root.clone()),
        session: None,
        provider: None,
    });
    let watcher = Arc::new(Outbound::new(1 << 20));
    root.send(Subscribe {
        conn: watcher.clone(),
        view_turns: None,
    })
    .await
    .expect("root is running")
    .expect("root subscribes");
    (root, watcher)
}

/// Create session `uri` through `root` and return its actor.
pub async fn session(
    shared: &Arc<Shared>,
    root: &Addr<RootActor>,
    uri: &str,
) -> Addr<SessionActor> {
    root.send(CreateSession {
        uri: uri.into(),
        owner: None,
        provider: None,
        home: None,
    })
    .await
    .expect("root runs")
    .expect("created");
    match shared.registry.get(uri).map(|c| c.addr) {
        Some(ChannelAddr::Session(session)) => session,
        _ => panic!("session {uri} is registered"),
    }
}

/// Wait until frames are queued on `conn` (woken as its socket side would
/// be) and take their texts; fails after [`WAIT`].
pub async fn next_frames(conn: &Outbound) -> Vec<String> {
    use crate::transport::{Frame, Take};
    let taken = tokio::time::timeout(
        WAIT,
        std::future::poll_fn(|cx| match conn.poll_take(cx, false) {
            Take::Ready(taken) => std::task::Poll::Ready(taken),
            Take::Empty | Take::Paced => std::task::Poll::Pending,
        }),
    )
    .await
    .expect("frames are queued in time");
    taken
        .frames
        .into_iter()
        .filter_map(|f| match f {
            Frame::Text { data, .. } => Some(data.to_string()),
            _ => None,
        })
        .collect()
}

/// The text frames queued on `conn` since the last call.
pub fn frames(conn: &Outbound) -> Vec<String> {
    conn.drain_for_test()
        .into_iter()
        .map(|f| f.to_string())
        .collect()
}

/// `action` from a client on `conn`, numbered `seq`.
pub fn dispatch(conn: &Arc<Outbound>, seq: i64, action: serde_json::Value) -> ClientDispatch {
    let action: StateAction = serde_json::from_value(action).expect("an action");
    assert!(!matches!(action, StateAction::Unknown(_)), "{action:?}");
    ClientDispatch {
        conn: super::Dispatcher::Conn(conn.clone().into()),
        origin: ActionOrigin {
            client_id: "client".into(),
            client_seq: seq,
        },
        action,
        as_agent: false,
        by: Some(person()),
    }
}

/// The person behind [`dispatch`]'s client.
pub fn person() -> crate::people::Person {
    crate::people::Person {
        name: "Cleo".into(),
        subject: "local".into(),
        client_id: "client".into(),
        standing: crate::people::Standing {
            admin: true,
            ..Default::default()
        },
    }
}

/// A session's default chat with a turn running on the test agent.
pub async fn chat_with_a_turn() -> (
    Arc<TestJournal>,
    actix::Addr<crate::channels::chat::ChatActor>,
    Arc<Outbound>,
    crate::channels::agent::AgentTurn,
) {
    let journal = Arc::new(TestJournal::default());
    let (agents, mut turns) = TestAgents::new();
    let shared = shared(journal.clone(), agents);
    let (root, _) = root(&shared).await;
    let session = session(&shared, &root, "ahp-session:/s").await;
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
