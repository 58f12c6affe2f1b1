//! The journal in NATS JetStream (`tandem serve --cluster nats://…`): the
//! same [`Journal`] as SQLite's, kept where every node of a cluster can read
//! it.
//!
//! What the node creates on first start (names are fixed; a cluster shares
//! them):
//!
//! | name | kind | holds |
//! |---|---|---|
//! | `TANDEM_JOURNAL` | stream, file storage, kept until a channel is disposed | one message per appended batch on `tandem.journal.<channel>` (its actions, the turns that ended in it, a truncation), and fence messages |
//! | `tandem_channels` | key-value bucket | each channel's record (`ChannelInfo`), in creation order (revision) |
//! | `tandem_snapshots` | key-value bucket | each channel's latest snapshot and where its tail starts in the stream |
//! | `tandem_turns` | key-value bucket | ended turns by `<chat>.<index>`, for `fetchTurns` |
//! | `tandem_providers` | key-value bucket | provider id → the token subject that first registered it (create-only) |
//! | `tandem_nodes` | key-value bucket | the cluster's `serverSeq` floor (`seq`): each node numbers in blocks it raises the floor over with compare-and-set, so a reconnect to another node gets snapshots |
//! | `tandem_leases` | key-value bucket, entries expire after the lease time | which node owns each channel ([`lease`]) |
//!
//! `<channel>` is the channel URI in lowercase hex, so any URI is a valid
//! subject token and key.
//!
//! **Fencing.** Every append is published with JetStream's expected last
//! sequence for the channel's subject: the sequence of the last message this
//! node wrote or read there. A node that lost a channel (its lease expired
//! while it was paused or cut off) can never append again: the new owner's
//! first act is a fence message on the subject ([`JetStreamJournal::fence`]),
//! so the old owner's expectation no longer holds and JetStream refuses its
//! write ([`JournalError::Fenced`]).
//!
//! **One writer per channel at a time, group commit.** A channel's appends
//! go out one message at a time (each needs the previous one's sequence);
//! appends that arrive while one is in flight are sent together as the next
//! message, and all of them are acknowledged when it is stored.
//!
//! The synchronous reads of the trait (`recover`, `load_channel`,
//! `turns_before`, `reserve_seq`) block the calling thread on a request to
//! the journal's own runtime, as SQLite's reads block on the disk.
//!
//! Files: [`wire`] what is written (batch messages, bucket values),
//! [`nats`] the connection and every read (recovery), [`append`] the
//! fenced, grouped appends, [`lease`] ownership; this file the
//! configuration and the `Journal` itself.

mod append;
pub mod lease;
mod link;
mod nats;
mod wire;

use self::nats::Nats;
use self::wire::{ChannelMsg, OwnerMsg};

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{
    Batch, BindCommit, ChannelInfo, Commit, Journal, JournalError, Recovered, RecoveredChannel,
    TurnPage,
};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};

/// The stream of every channel's batches.
pub const STREAM: &str = "TANDEM_JOURNAL";
/// Subject prefix of the stream: `tandem.journal.<channel>`.
pub const SUBJECT_PREFIX: &str = "tandem.journal";
/// Channel records.
pub const CHANNELS: &str = "tandem_channels";
/// Latest snapshot per channel.
pub const SNAPSHOTS: &str = "tandem_snapshots";
/// Ended turns per chat.
pub const TURNS: &str = "tandem_turns";
/// Provider owners.
pub const PROVIDERS: &str = "tandem_providers";
/// Cluster-wide figures: the `serverSeq` floor.
pub const NODES: &str = "tandem_nodes";
/// Key of the cluster's `serverSeq` floor in [`NODES`].
const SEQ_KEY: &str = "seq";

/// Header: the journal position of a batch message's first action.
const POS_HEADER: &str = "Tandem-Pos";
/// Header: the node that wrote a fence message.
const FENCE_HEADER: &str = "Tandem-Fence";
/// Header: the node that wrote a batch message.
const NODE_HEADER: &str = "Tandem-Node";

/// How to reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// NATS server URLs (`nats://host:port`); any one will do.
    pub urls: Vec<String>,
    /// This node's name, unique in the cluster.
    pub node_id: String,
    /// How long a channel lease lasts without renewal.
    pub lease: Duration,
}

impl ClusterConfig {
    /// `--cluster nats://a:4222,nats://b:4222` and `--node-id NAME`.
    pub fn parse(urls: &str, node_id: &str) -> Result<Self, String> {
        let urls: Vec<String> = urls
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err("`--cluster` needs at least one NATS URL".into());
        }
        for u in &urls {
            if !(u.starts_with("nats://") || u.starts_with("tls://")) {
                return Err(format!(
                    "`--cluster {u}`: expected nats://HOST:PORT (or tls://HOST:PORT)"
                ));
            }
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if node_id.is_empty() || node_id.len() > 64 || !node_id.chars().all(ok) {
            return Err(format!(
                "node id `{node_id}`: use 1 to 64 letters, digits, `-` or `_`"
            ));
        }
        Ok(Self {
            urls,
            node_id: node_id.to_owned(),
            lease: Duration::from_secs(10),
        })
    }
}

/// A channel URI as a subject token and key: lowercase hex of its bytes.
pub fn token(uri: &str) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(uri.len() * 2);
    for b in uri.bytes() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn subject(uri: &str) -> String {
    format!("{SUBJECT_PREFIX}.{}", token(uri))
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("NATS JetStream: {what}: {e}"))
}

/// An append waiting for its message.
struct Pending {
    batch: Batch,
    done: oneshot::Sender<Result<(), JournalError>>,
}

/// What the journal knows of one channel.
#[derive(Default)]
struct Chan {
    /// Actions stored.
    len: u64,
    /// Actions stored or on their way.
    projected: u64,
    /// Stream sequence of the channel's last message.
    last_seq: u64,
    /// Turns stored.
    turns: u64,
    /// Appends waiting for the one in flight.
    queue: Vec<Pending>,
    in_flight: bool,
    /// Another node took the channel over.
    fenced: Option<String>,
}

struct Inner {
    nats: Nats,
    rt: tokio::runtime::Handle,
    node: String,
    lease: Duration,
    chans: Mutex<HashMap<ChannelUri, Chan>>,
    /// The leases this node holds, renewed in the background.
    owned: Mutex<HashMap<ChannelUri, lease::Lease>>,
    /// Channels another node owns: this node follows them.
    followed: Mutex<std::collections::HashSet<ChannelUri>>,
    /// Who owns the channels this node follows, as last looked up.
    owners: Mutex<link::Owners>,
    /// Requests on their way to other nodes, in order.
    forward_tx: Mutex<Option<tokio::sync::mpsc::UnboundedSender<link::Outgoing>>>,
    /// The stream's last sequence when recovery read it: following starts
    /// after it.
    follow_from: std::sync::atomic::AtomicU64,
    /// The NATS client, for its connection state.
    client: async_nats::Client,
    /// Ends the runtime's thread when the journal goes.
    _stop: oneshot::Sender<()>,
}

/// The journal of a cluster node, in NATS JetStream.
#[derive(Clone)]
pub struct JetStreamJournal {
    inner: Arc<Inner>,
}

impl JetStreamJournal {
    /// Connect, and create the stream and buckets if they are missing.
    pub async fn connect(cfg: &ClusterConfig) -> Result<Self, JournalError> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("tandem-nats".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("tandem-nats")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| unavailable("cannot start its thread", e))?;
        let rt = handle_rx
            .recv()
            .map_err(|e| unavailable("its thread", e))?
            .map_err(|e| unavailable("its runtime", e))?;
        let urls = cfg.urls.clone();
        let lease = cfg.lease;
        let nats = rt
            .spawn(async move { Nats::open(&urls, lease).await })
            .await
            .map_err(|e| unavailable("connect", e))??;
        let journal = Self {
            inner: Arc::new(Inner {
                client: nats.js.client(),
                nats,
                rt,
                node: cfg.node_id.clone(),
                lease: cfg.lease,
                chans: Mutex::new(HashMap::new()),
                owned: Mutex::new(HashMap::new()),
                followed: Mutex::default(),
                owners: Mutex::default(),
                forward_tx: Mutex::new(None),
                follow_from: std::sync::atomic::AtomicU64::new(0),
                _stop: stop_tx,
            }),
        };
        journal.start_renewing();
        Ok(journal)
    }

    /// Renew every lease this node holds, three times per lease time; a
    /// lease that cannot be renewed is lost, and the channel's appends are
    /// refused from then on.
    fn start_renewing(&self) {
        let weak = Arc::downgrade(&self.inner);
        let period = self.inner.lease / 3;
        self.inner.rt.spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let journal = JetStreamJournal { inner };
                let leases = journal.leases();
                let held: Vec<lease::Lease> =
                    journal.inner.owned.lock().values().cloned().collect();
                for l in held {
                    match leases.renew_here(&l).await {
                        Ok(renewed) => {
                            let mut owned = journal.inner.owned.lock();
                            if let Some(slot) = owned.get_mut(l.channel.as_str()) {
                                *slot = renewed;
                            }
                        }
                        Err(lease::LeaseError::Lost(_)) => {
                            let uri = ChannelUri::from(l.channel.as_str());
                            journal.inner.owned.lock().remove(&uri);
                            // Expired (NATS was away longer than the lease):
                            // take it again if nobody else wrote meanwhile.
                            match journal.reown(&uri).await {
                                Ok(()) => {
                                    tracing::warn!(channel = %uri, "lease expired and was taken again; nothing was written meanwhile")
                                }
                                Err(e) => {
                                    tracing::error!(channel = %uri, node = %journal.inner.node, error = %e, "lease lost: this node no longer writes the channel");
                                    journal.lost(&uri, "this node's lease on the channel was lost");
                                }
                            }
                        }
                        Err(e) => {
                            // NATS unreachable: keep trying while the lease
                            // may still hold; appends fail meanwhile anyway.
                            tracing::warn!(channel = %l.channel, error = %e, "lease not renewed");
                        }
                    }
                }
            }
        });
    }

    /// Take `channel` for this node: its lease, then a fence on its
    /// subject. Fails when another live node holds it.
    pub async fn own(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let lease = self.leases().acquire(channel).await.map_err(|e| match e {
            lease::LeaseError::Store(e) => e,
            e => JournalError::Fenced {
                channel: channel.clone(),
                reason: e.to_string(),
            },
        })?;
        self.inner
            .owned
            .lock()
            .insert(channel.clone(), lease.clone());
        if let Err(e) = self.fence(channel).await {
            self.inner.owned.lock().remove(channel);
            self.leases().release(&lease).await;
            return Err(e);
        }
        Ok(())
    }

    /// Take a channel this node had back after its lease expired: only if
    /// nobody holds it and nothing was written since this node's last
    /// append (its state here is then still the truth).
    async fn reown(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let lease = self
            .leases()
            .acquire_here(channel.to_string())
            .await
            .map_err(|e| JournalError::Unavailable(e.to_string()))?;
        let known = self
            .inner
            .chans
            .lock()
            .get(channel)
            .map_or(0, |c| c.last_seq);
        // Only this node's own writes since (an append stored whose
        // acknowledgement was lost) leave the channel this node's.
        let writers = self.inner.nats.writers_after(channel, known).await;
        match writers {
            Ok(w) if w.iter().all(|n| *n == self.inner.node) => {
                self.inner.owned.lock().insert(channel.clone(), lease);
                Ok(())
            }
            Ok(w) => {
                self.leases().release(&lease).await;
                Err(JournalError::Fenced {
                    channel: channel.clone(),
                    reason: format!(
                        "another node wrote to the channel while this node's lease had expired (writers since: {})",
                        w.join(", ")
                    ),
                })
            }
            Err(e) => {
                self.leases().release(&lease).await;
                Err(e)
            }
        }
    }

    /// How many channels this node owns.
    pub fn owned(&self) -> usize {
        self.inner.owned.lock().len()
    }

    /// Whether the NATS connection is up.
    pub fn connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The leases of this node ([`lease::Leases`]).
    pub fn leases(&self) -> lease::Leases {
        lease::Leases::new(
            self.inner.nats.leases.clone(),
            self.inner.node.clone(),
            self.inner.lease,
            self.inner.rt.clone(),
        )
    }

    /// Run `fut` on the journal's runtime and wait for it here.
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, JournalError>> + Send + 'static,
    ) -> Result<T, JournalError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.inner.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv_timeout(Duration::from_secs(60))
            .map_err(|_| unavailable("no answer", "within 60 s"))?
    }

    /// Take `channel` over from whoever wrote it last: a fence message on
    /// its subject, after which an earlier owner's appends are refused. The
    /// caller holds the channel's lease. The fence expects the channel's
    /// last message to be the one this node read (at recovery, or now), so
    /// a write it has not seen makes the fence, and the takeover, fail.
    pub async fn fence(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let inner = self.inner.clone();
        let uri = channel.clone();
        self.inner
            .rt
            .spawn(async move {
                // Recovery already read the channel; read it only when not.
                let known = inner
                    .chans
                    .lock()
                    .get(&uri)
                    .map(|c| (c.len, c.last_seq, c.turns));
                let (len, last_seq, turns) = match known {
                    Some(k) => k,
                    None => {
                        let read = inner.nats.read_channel(&uri, 0, 0).await?;
                        (read.len, read.last_seq, read.turn_count)
                    }
                };
                // Anything written since is caught here: the fence then
                // fails and this node does not own the channel.
                let msg = jetstream::message::PublishMessage::build()
                    .header(FENCE_HEADER, inner.node.as_str())
                    .expected_last_subject_sequence(last_seq)
                    .payload(Bytes::new());
                let ack = inner
                    .nats
                    .js
                    .send_publish(subject(&uri), msg)
                    .await
                    .map_err(|e| unavailable("fence", e))?
                    .await
                    .map_err(|e| publish_error(&uri, e))?;
                let mut chans = inner.chans.lock();
                let c = chans.entry(uri).or_default();
                c.len = len;
                c.projected = len;
                c.last_seq = ack.sequence;
                c.turns = turns;
                c.fenced = None;
                Ok(())
            })
            .await
            .map_err(|e| unavailable("fence", e))?
    }

    /// Refuse further appends to `channel` (this node lost it).
    pub fn lost(&self, channel: &ChannelUri, why: &str) {
        let mut chans = self.inner.chans.lock();
        chans.entry(channel.clone()).or_default().fenced = Some(why.to_owned());
    }
}

fn publish_error(uri: &ChannelUri, e: jetstream::context::PublishError) -> JournalError {
    match e.kind() {
        jetstream::context::PublishErrorKind::WrongLastSequence => JournalError::Fenced {
            channel: uri.clone(),
            reason: "another node wrote to the channel since this node last did".into(),
        },
        _ => unavailable("append", e),
    }
}

impl Journal for JetStreamJournal {
    fn create_channel(&self, info: ChannelInfo) -> Commit {
        let inner = self.inner.clone();
        let journal = self.clone();
        let done = self.inner.rt.spawn(async move {
            let lease = journal
                .leases()
                .acquire_here(info.uri.to_string())
                .await
                .map_err(|e| match e {
                    lease::LeaseError::Store(e) => e,
                    e => JournalError::Fenced {
                        channel: info.uri.clone(),
                        reason: e.to_string(),
                    },
                })?;
            inner.owned.lock().insert(info.uri.clone(), lease);
            let value = serde_json::to_vec(&ChannelMsg::of(&info))
                .map_err(|e| unavailable("encode a channel", e))?;
            inner
                .nats
                .channels
                .put(token(&info.uri), Bytes::from(value))
                .await
                .map_err(|e| unavailable("store a channel", e))?;
            Ok(())
        });
        Box::pin(async move { done.await.map_err(|e| unavailable("store a channel", e))? })
    }

    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut chans = self.inner.chans.lock();
            let c = chans.entry(channel.clone()).or_default();
            if let Some(reason) = &c.fenced {
                return Box::pin(std::future::ready(Err(JournalError::Fenced {
                    channel: channel.clone(),
                    reason: reason.clone(),
                })));
            }
            let found = JournalPos::new(c.projected);
            if found != expected {
                return Box::pin(std::future::ready(Err(JournalError::Conflict {
                    channel: channel.clone(),
                    expected,
                    found,
                })));
            }
            c.projected += batch.records.len() as u64;
            c.queue.push(Pending { batch, done: tx });
            !std::mem::replace(&mut c.in_flight, true)
        };
        if start {
            self.inner
                .rt
                .spawn(self.inner.clone().flush(channel.clone()));
        }
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(unavailable("append", "the journal stopped")))
        })
    }

    fn remove(&self, channel: &ChannelUri) {
        self.inner.chans.lock().remove(channel);
        if self.inner.followed.lock().remove(channel) {
            // Another node's channel: only this node's copy goes (its
            // owner removes what is stored).
            return;
        }
        let lease = self.inner.owned.lock().remove(channel);
        let inner = self.inner.clone();
        let uri = channel.clone();
        self.inner.rt.spawn(async move {
            let key = token(&uri);
            let n = &inner.nats;
            if let Err(e) = n.stream.purge().filter(subject(&uri)).await {
                tracing::warn!(channel = %uri, error = %e, "disposed channel's messages not purged");
            }
            let _ = n.snapshots.purge(key.clone()).await;
            let _ = n.channels.purge(key.clone()).await;
            let turns = format!("$KV.{TURNS}.{key}.>");
            if let Ok(s) = n.js.get_stream(format!("KV_{TURNS}")).await {
                let _ = s.purge().filter(turns).await;
            }
            if let Some(l) = lease {
                let _ = n
                    .leases
                    .delete_expect_revision(token(&l.channel), Some(l.revision))
                    .await;
            }
        });
    }

    fn len(&self, channel: &ChannelUri) -> JournalPos {
        JournalPos::new(self.inner.chans.lock().get(channel).map_or(0, |c| c.len))
    }

    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
        let inner = self.inner.clone();
        let key = token(chat);
        self.block(async move {
            let mut page = Vec::new();
            for i in before.saturating_sub(limit)..before {
                if let Some(v) = inner
                    .nats
                    .turns
                    .get(format!("{key}.{i}"))
                    .await
                    .map_err(|e| unavailable("read a turn", e))?
                {
                    let text =
                        std::str::from_utf8(&v).map_err(|e| unavailable("read a turn", e))?;
                    page.push(Arc::from(text));
                }
            }
            Ok(page)
        })
    }

    /// One floor for the whole cluster (`seq` in [`NODES`]), raised with
    /// compare-and-set: the block granted starts above the floor and above
    /// `next - 1`, and the floor moves to its last number. A node alone in
    /// the cluster is granted `next` (contiguous numbers); a node whose
    /// numbers another node overtook is granted a block above them, and the
    /// publisher jumps there, so no number is ever handed out by two nodes
    /// and a client's `lastSeenServerSeq` from another node is never
    /// mistaken for one of this node's (it gets snapshots).
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        let inner = self.inner.clone();
        self.block(async move {
            for _ in 0..16 {
                let entry = inner
                    .nats
                    .nodes
                    .entry(SEQ_KEY)
                    .await
                    .map_err(|e| unavailable("read the seq floor", e))?;
                let current = entry
                    .as_ref()
                    .filter(|e| e.operation == kv::Operation::Put)
                    .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse::<u64>().ok())
                    .unwrap_or(0);
                let base = current.max(next.get().saturating_sub(1));
                let floor = base.saturating_add(count);
                if floor == current {
                    // Nothing to reserve (`count` 0 at the floor).
                    return Ok(ServerSeq::new(base.saturating_add(1)));
                }
                let value = Bytes::from(floor.to_string());
                let stored = match &entry {
                    Some(e) => inner
                        .nats
                        .nodes
                        .update(SEQ_KEY, value, e.revision)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    None => inner
                        .nats
                        .nodes
                        .create(SEQ_KEY, value)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                };
                if stored.is_ok() {
                    return Ok(ServerSeq::new(base.saturating_add(1)));
                }
            }
            Err(unavailable(
                "store the seq floor",
                "too many concurrent raises",
            ))
        })
    }

    fn shared_seq(&self) -> bool {
        true
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        // Where following other nodes' appends starts: everything after
        // this is read again by the follower, and skipped where known.
        let inner = self.inner.clone();
        let last = self.block(async move {
            let mut stream = inner
                .nats
                .js
                .get_stream(STREAM)
                .await
                .map_err(|e| unavailable("read the journal stream", e))?;
            let info = stream
                .info()
                .await
                .map_err(|e| unavailable("read the journal stream", e))?;
            Ok(info.state.last_sequence)
        })?;
        self.inner
            .follow_from
            .store(last, std::sync::atomic::Ordering::Relaxed);
        let inner = self.inner.clone();
        let (mut recovered, chans) = self.block(async move { inner.nats.recover().await })?;
        let inner = self.inner.clone();
        recovered.seq_floor = self.block(async move {
            Ok(inner
                .nats
                .nodes
                .get(SEQ_KEY)
                .await
                .map_err(|e| unavailable("read the seq floor", e))?
                .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
                .map_or(ServerSeq::ZERO, ServerSeq::new))
        })?;
        {
            let mut map = self.inner.chans.lock();
            for (uri, c) in chans {
                map.insert(uri, c);
            }
        }
        // A session nobody runs becomes this node's, with its chats (a
        // lease and a fence each); one another live node runs is followed.
        let me = self.clone();
        let channels: Vec<(ChannelUri, Option<ChannelUri>)> = recovered
            .channels
            .iter()
            .map(|c| (c.info.uri.clone(), c.info.session.clone()))
            .collect();
        self.block(async move {
            let stored: std::collections::HashSet<ChannelUri> =
                channels.iter().map(|(u, _)| u.clone()).collect();
            let mut mine = std::collections::HashSet::new();
            for (uri, session) in channels {
                // A chat goes with its session (one whose session is not
                // stored is taken like a session).
                let ours = session
                    .as_ref()
                    .is_none_or(|s| mine.contains(s) || !stored.contains(s));
                if ours {
                    match me.own(&uri).await {
                        Ok(()) => {
                            mine.insert(uri);
                            continue;
                        }
                        Err(JournalError::Fenced { reason, .. }) => {
                            tracing::info!(channel = %uri, %reason, "followed: another node runs it");
                        }
                        Err(e) => return Err(e),
                    }
                }
                me.inner.followed.lock().insert(uri);
            }
            Ok(())
        })?;
        Ok(recovered)
    }

    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
        let inner = self.inner.clone();
        let (provider, subject) = (provider.to_owned(), subject.to_owned());
        let done = self.inner.rt.spawn(async move {
            let key = token(&provider);
            let value = serde_json::to_vec(&OwnerMsg {
                provider: provider.clone(),
                subject: subject.clone(),
            })
            .map_err(|e| unavailable("encode a provider", e))?;
            match inner
                .nats
                .providers
                .create(key.clone(), Bytes::from(value))
                .await
            {
                Ok(_) => Ok(subject),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    let v = inner
                        .nats
                        .providers
                        .get(key)
                        .await
                        .map_err(|e| unavailable("read a provider", e))?
                        .ok_or_else(|| unavailable("read a provider", "it vanished"))?;
                    let o: OwnerMsg = serde_json::from_slice(&v)
                        .map_err(|e| unavailable("read a provider", e))?;
                    Ok(o.subject)
                }
                Err(e) => Err(unavailable("bind a provider", e)),
            }
        });
        Box::pin(async move { done.await.map_err(|e| unavailable("bind a provider", e))? })
    }

    fn sync(&self) -> Result<(), JournalError> {
        // Every append is acknowledged once JetStream stored it; wait for
        // the ones in flight.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self
            .inner
            .chans
            .lock()
            .values()
            .any(|c| c.in_flight || !c.queue.is_empty())
        {
            if std::time::Instant::now() > deadline {
                return Err(unavailable("sync", "appends still in flight after 10 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    fn writable(&self) -> Result<(), JournalError> {
        if self.connected() {
            Ok(())
        } else {
            Err(unavailable(
                "not connected",
                "writes are refused until the connection to NATS is back",
            ))
        }
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "node": self.inner.node,
            "nats": if self.connected() { "connected" } else { "disconnected: writes are refused until it is back" },
            "channelsOwned": self.owned(),
        }))
    }

    fn cluster(&self) -> Option<Arc<dyn super::ClusterLink>> {
        Some(Arc::new(self.clone()))
    }

    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        let inner = self.inner.clone();
        let key = token(uri);
        let loaded = self.block(async move {
            let Some(v) = inner
                .nats
                .channels
                .get(key)
                .await
                .map_err(|e| unavailable("read a channel", e))?
            else {
                return Ok(None);
            };
            let msg: ChannelMsg =
                serde_json::from_slice(&v).map_err(|e| unavailable("read a channel", e))?;
            let Some(info) = msg.info() else {
                return Ok(None);
            };
            inner.nats.load(info).await.map(Some)
        })?;
        let Some((c, last_seq)) = loaded else {
            return Ok(None);
        };
        // A reload follows a failed append: what is stored is the truth.
        let mut chans = self.inner.chans.lock();
        let e = chans.entry(uri.clone()).or_default();
        if !e.in_flight {
            e.len = c.len.get();
            e.projected = c.len.get();
            e.last_seq = last_seq;
            e.turns = c.turn_count;
        }
        Ok(Some(c))
    }
}
