//! The node's link to the rest of the cluster ([`ClusterLink`]): following
//! the batches other nodes append (one ordered consumer on the whole
//! journal stream) and the channels they create or dispose (a watch on
//! `tandem_channels`), forwarding requests to a channel's owner and
//! answering those forwarded here (core NATS request/reply on
//! `tandem.node.<node>`), announcements to every node (core NATS on
//! `tandem.announce`: presence), and taking over the channels of a node
//! that went away.
//!
//! Forwarded requests leave in the order they were made (one task sends
//! them all) and the owner hands them to its channels in the order they
//! arrive, so one client's actions keep their order across the hop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::kv;
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::seal::Purpose;
use super::wire::BatchMsg;
use super::{
    lease, Inner, JetStreamJournal, FENCE_HEADER, NODE_HEADER, POS_HEADER, SUBJECT_PREFIX,
};
use crate::ids::{ChannelUri, JournalPos};
use crate::store::cluster::{ClusterEvent, ClusterLink, ForwardHandler, LinkFuture, Replicated};
use crate::store::{JournalError, Record};

/// Subject prefix of the requests forwarded to a node: `tandem.node.<node>`.
pub const NODE_PREFIX: &str = "tandem.node";
/// Subject of what nodes announce to each other (core NATS, not the stream).
pub const ANNOUNCE_SUBJECT: &str = "tandem.announce";
/// How long a forwarded request waits for its owner's answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a follow waits before making its consumer or watch again after
/// NATS refused it (at most: it tries again as soon as NATS reconnects).
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);
/// How long a follow waits before making its consumer or watch again after
/// it ended (NATS went away or came back).
const RESUME_AFTER_END: Duration = Duration::from_millis(200);
/// How long one pull of the journal follow waits on the server: its
/// heartbeats come at half that, and two missed ones make the consumer
/// again (about twice this after its server died).
const FOLLOW_PULL_EXPIRES: Duration = Duration::from_secs(2);
/// The root's URI: what a request to a node rather than a channel names.
const ROOT_URI: &str = ahp_types::ROOT_RESOURCE_URI;
/// How a chat's URI starts (the channels followed by interest).
const CHAT_SCHEME: &str = "ahp-chat:";
/// How long a channel's owner, once looked up, is trusted.
const OWNER_TTL: Duration = Duration::from_secs(1);

/// Where the owner's answer to a forwarded request goes.
type Answer = oneshot::Sender<Result<Vec<u8>, String>>;

/// A request on its way to a channel's owner.
pub(super) struct Outgoing {
    channel: ChannelUri,
    /// The node to send it to (else the channel's owner).
    node: Option<String>,
    body: Vec<u8>,
    done: Answer,
}

/// What the node knows of who runs the channels it follows.
#[derive(Default)]
pub(super) struct Owners {
    known: HashMap<ChannelUri, (String, Instant)>,
}

fn unhex(token: &str) -> Option<ChannelUri> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok().map(ChannelUri::from)
}

impl JetStreamJournal {
    /// Apply one message of the journal stream to what this node knows,
    /// and say what the node's channels must hear of it.
    fn on_journal_message(
        &self,
        subject: &str,
        seq: u64,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
    ) -> Option<Replicated> {
        let uri = unhex(subject.strip_prefix(SUBJECT_PREFIX)?.strip_prefix('.')?)?;
        if self.passes(&uri) {
            self.inner.passed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let header = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let writer = header(NODE_HEADER).or_else(|| header(FENCE_HEADER))?;
        if writer == self.inner.node {
            // This node's own write: its appends account for it (and one
            // whose acknowledgement was lost is found by the channel's
            // reload), so it never counts twice here.
            return None;
        }
        let pos = header(POS_HEADER).and_then(|p| p.parse::<u64>().ok());
        let batch = match pos {
            Some(_) => match serde_json::from_slice::<BatchMsg>(payload) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::error!(channel = %uri, seq, error = %e, "a journal batch does not decode");
                    return None;
                }
            },
            None => None,
        };
        let mut chans = self.inner.chans.lock();
        let c = chans.entry(uri.clone()).or_default();
        if self.inner.disown(&uri) {
            // Another node wrote a channel this node held: it took it over.
            c.fenced = Some(format!("node `{writer}` took the channel over"));
            self.inner.followed.lock().insert(uri.clone());
        }
        if seq <= c.last_seq {
            return None;
        }
        c.last_seq = seq;
        let (pos, batch) = (pos?, batch?);
        let n = batch.records.len() as u64;
        c.len = c.len.max(pos + n);
        c.projected = c.projected.max(c.len);
        if let Some(from) = batch.truncate_turns_from {
            c.turns = c.turns.min(from);
        }
        for t in &batch.turns {
            c.turns = c.turns.max(t.index + 1);
        }
        drop(chans);
        Some(Replicated {
            channel: uri,
            writer,
            pos: JournalPos::new(pos),
            records: batch
                .records
                .iter()
                .map(|r| Record::from(r.get()))
                .collect(),
            origins: batch.origins,
        })
    }

    /// Whether a batch of `uri` passes this node by: a chat nobody here
    /// watches and this node does not own. Its state is read from the
    /// store when someone subscribes here ([`ClusterLink::watch`]).
    fn passes(&self, uri: &ChannelUri) -> bool {
        uri.as_str().starts_with(CHAT_SCHEME)
            && !self.inner.watched.lock().contains(uri)
            && !self.inner.owned.lock().contains_key(uri)
    }

    /// Follow the journal stream from where recovery read it, for ever
    /// (an ordered consumer; made again after an error).
    async fn follow_journal(self, sink: Arc<dyn Fn(ClusterEvent) + Send + Sync>) {
        let mut from = self.inner.follow_from.load(Ordering::Relaxed) + 1;
        loop {
            let consumer = self
                .inner
                .nats
                .stream
                .create_consumer(OrderedConfig {
                    filter_subject: format!("{SUBJECT_PREFIX}.>"),
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: from,
                    },
                    // Pulls that expire soon, with heartbeats at half
                    // that: a consumer lost with its NATS server (the
                    // stream's leader) is found missing in seconds, not
                    // the half minute of the default pull.
                    max_expires: FOLLOW_PULL_EXPIRES,
                    ..Default::default()
                })
                .await;
            let messages = match consumer {
                Ok(c) => c.messages().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let mut messages = match messages {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot follow the journal yet; trying again");
                    self.retry_pause(RETRY_AFTER_ERROR).await;
                    continue;
                }
            };
            self.inner.following_journal.store(true, Ordering::Release);
            loop {
                let next = tokio::select! {
                    m = messages.next() => m,
                    () = self.inner.nats.reconnected.notified() => {
                        tracing::info!("NATS is back: following the journal again from sequence {from}");
                        break;
                    }
                };
                let Some(m) = next else { break };
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "following the journal was interrupted");
                        break;
                    }
                };
                let Ok(seq) = m.info().map(|i| i.stream_sequence) else {
                    continue;
                };
                from = seq + 1;
                if let Some(r) =
                    self.on_journal_message(m.subject.as_str(), seq, m.headers.as_ref(), &m.payload)
                {
                    sink(ClusterEvent::Appended(r));
                }
            }
            self.inner.following_journal.store(false, Ordering::Release);
            self.retry_pause(RESUME_AFTER_END).await;
        }
    }

    /// Wait before a follow tries again: until NATS reconnects, or `at_most`.
    /// A timer as well as the event: a consumer or watch can fail while the
    /// connection stays up (JetStream not ready yet), and then only time
    /// says when to try again.
    async fn retry_pause(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.inner.nats.reconnected.notified()).await;
    }

    /// Watch the channel records: channels other nodes create or dispose.
    async fn follow_channels(self, sink: Arc<dyn Fn(ClusterEvent) + Send + Sync>) {
        loop {
            let mut watch = match self.inner.nats.channels.watch_with_history(">").await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the channel records yet; trying again");
                    self.retry_pause(RETRY_AFTER_ERROR).await;
                    continue;
                }
            };
            self.inner.watching_channels.store(true, Ordering::Release);
            loop {
                let next = tokio::select! {
                    e = watch.next() => e,
                    () = self.inner.nats.reconnected.notified() => break,
                };
                let Some(Ok(entry)) = next else { break };
                let Some(uri) = unhex(&entry.key) else {
                    continue;
                };
                if self.inner.owned.lock().contains_key(&uri) {
                    continue; // this node's own
                }
                match entry.operation {
                    kv::Operation::Put => {
                        self.inner.followed.lock().insert(uri.clone());
                        sink(ClusterEvent::ChannelAdded(uri));
                    }
                    kv::Operation::Delete | kv::Operation::Purge => {
                        sink(ClusterEvent::ChannelRemoved(uri))
                    }
                }
            }
            self.inner.watching_channels.store(false, Ordering::Release);
            self.retry_pause(RESUME_AFTER_END).await;
        }
    }

    /// The node that owns `channel`, as its lease says (looked up again
    /// after [`OWNER_TTL`]).
    async fn owner_of(&self, channel: &ChannelUri) -> Result<Option<String>, String> {
        if let Some((node, at)) = self.inner.owners.lock().known.get(channel) {
            if at.elapsed() < OWNER_TTL {
                return Ok(Some(node.clone()));
            }
        }
        let holder = self
            .leases()
            .holder(channel.as_str())
            .await
            .map_err(|e| e.to_string())?;
        if let Some(node) = &holder {
            self.inner
                .owners
                .lock()
                .known
                .insert(channel.clone(), (node.clone(), Instant::now()));
        }
        Ok(holder)
    }

    /// Send forwarded requests one after the other (their order is the
    /// order they were made); answers come back on this node's inbox.
    pub(super) async fn send_forwarded(self, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
        let client = self.inner.client.clone();
        let inbox = client.new_inbox();
        let waiting: Arc<Mutex<HashMap<u64, Answer>>> = Arc::default();
        match client.subscribe(format!("{inbox}.*")).await {
            Ok(mut answers) => {
                let waiting = waiting.clone();
                let seal = self.inner.seal.clone();
                tokio::spawn(async move {
                    while let Some(m) = answers.next().await {
                        let id = m.subject.rsplit('.').next().and_then(|s| s.parse().ok());
                        if m.payload.is_empty() {
                            // NATS's own answer: nobody listens on that
                            // node's subject (it is starting or gone).
                            if let Some(done) = id.and_then(|id: u64| waiting.lock().remove(&id)) {
                                let _ = done.send(Err(
                                    "no node answers there now (starting, or gone)".to_owned(),
                                ));
                            }
                            continue;
                        }
                        let body = match seal.open(Purpose::Answer, &m.payload) {
                            Ok(b) => b,
                            Err(e) => {
                                tracing::warn!(subject = %m.subject, error = %e, "an answer to a forwarded request was dropped");
                                continue;
                            }
                        };
                        if let Some(done) = id.and_then(|id: u64| waiting.lock().remove(&id)) {
                            let _ = done.send(Ok(body.to_vec()));
                        }
                    }
                });
            }
            Err(e) => tracing::error!(error = %e, "no inbox for forwarded requests"),
        }
        let next = AtomicU64::new(1);
        while let Some(out) = rx.recv().await {
            let looked_up = match &out.node {
                Some(node) => Ok(Some(node.clone())),
                None => self.owner_of(&out.channel).await,
            };
            let owner = match looked_up {
                Ok(Some(node)) if node != self.inner.node => node,
                Ok(Some(_)) => {
                    let _ = out.done.send(Err(format!(
                        "`{}` is changing hands to this node; try again",
                        out.channel
                    )));
                    continue;
                }
                Ok(None) => {
                    let _ = out.done.send(Err(format!(
                        "no node runs `{}` now: its node went away, and another takes it over within {} s",
                        out.channel,
                        self.inner.lease.as_secs()
                    )));
                    continue;
                }
                Err(e) => {
                    let _ = out.done.send(Err(e));
                    continue;
                }
            };
            let id = next.fetch_add(1, Ordering::Relaxed);
            waiting.lock().insert(id, out.done);
            let sent = client
                .publish_with_reply(
                    format!("{NODE_PREFIX}.{owner}"),
                    format!("{inbox}.{id}"),
                    self.inner.seal.seal(Purpose::Forward, out.body),
                )
                .await;
            if let Err(e) = sent {
                if let Some(done) = waiting.lock().remove(&id) {
                    let _ = done.send(Err(format!("cannot reach node `{owner}`: {e}")));
                }
                continue;
            }
            let waiting = waiting.clone();
            let gives_up_at = tokio::time::Instant::now() + FORWARD_TIMEOUT;
            tokio::spawn(async move {
                tokio::time::sleep_until(gives_up_at).await;
                if let Some(done) = waiting.lock().remove(&id) {
                    let _ = done.send(Err(format!(
                        "node `{owner}` did not answer within {} s",
                        FORWARD_TIMEOUT.as_secs()
                    )));
                }
            });
        }
    }
}

impl Inner {
    /// This node no longer writes `channel`: its copy here is current, so
    /// it is applied (watched) until nobody here watches it. `true` when
    /// this node held it.
    pub(super) fn disown(&self, channel: &ChannelUri) -> bool {
        let held = self.owned.lock().remove(channel).is_some();
        if held {
            self.watched.lock().insert(channel.clone());
        }
        held
    }

    /// The forwarded-request sender, started on first use.
    fn forwarder(self: &Arc<Self>) -> mpsc::UnboundedSender<Outgoing> {
        let mut slot = self.forward_tx.lock();
        if let Some(tx) = slot.as_ref() {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let journal = JetStreamJournal {
            inner: self.clone(),
        };
        self.rt.spawn(journal.send_forwarded(rx));
        *slot = Some(tx.clone());
        tx
    }
}

impl ClusterLink for JetStreamJournal {
    fn node(&self) -> &str {
        &self.inner.node
    }

    fn ready(&self) -> Result<(), String> {
        let node = &self.inner.node;
        if !self.connected() {
            return Err(format!(
                "node `{node}` is not connected to NATS: it follows nothing and writes nothing until it is back"
            ));
        }
        if !self.inner.following_journal.load(Ordering::Acquire) {
            return Err(format!(
                "node `{node}` does not read the journal stream yet: the other nodes' writes do not reach it"
            ));
        }
        if !self.inner.watching_channels.load(Ordering::Acquire) {
            return Err(format!(
                "node `{node}` does not watch the channel records yet: channels created elsewhere do not reach it"
            ));
        }
        Ok(())
    }

    fn owns(&self, channel: &ChannelUri) -> bool {
        !self.refused(channel) && !self.inner.followed.lock().contains(channel)
    }

    fn follows(&self, channel: &ChannelUri) {
        if !self.inner.owned.lock().contains_key(channel) {
            self.inner.followed.lock().insert(channel.clone());
        }
    }

    fn watch(&self, channel: &ChannelUri, on: bool) {
        let mut watched = self.inner.watched.lock();
        if on {
            watched.insert(channel.clone());
        } else {
            watched.remove(channel);
        }
    }

    fn follow(&self, sink: Arc<dyn Fn(ClusterEvent) + Send + Sync>) {
        self.inner
            .rt
            .spawn(self.clone().follow_journal(sink.clone()));
        self.inner.rt.spawn(self.clone().follow_channels(sink));
    }

    fn forward(&self, channel: &ChannelUri, body: Vec<u8>) -> LinkFuture<Result<Vec<u8>, String>> {
        let (done, answer) = oneshot::channel();
        let sent = self.inner.forwarder().send(Outgoing {
            channel: channel.clone(),
            node: None,
            body,
            done,
        });
        Box::pin(async move {
            sent.map_err(|_| "the cluster link stopped".to_owned())?;
            answer
                .await
                .unwrap_or_else(|_| Err("the cluster link stopped".to_owned()))
        })
    }

    fn loads(&self) -> Vec<(String, usize)> {
        self.live_loads()
    }

    fn placed(&self, node: &str) {
        if let Some((n, _)) = self.inner.loads.heard.lock().get_mut(node) {
            *n += 1;
        }
    }

    fn forward_to(&self, node: &str, body: Vec<u8>) -> LinkFuture<Result<Vec<u8>, String>> {
        let (done, answer) = oneshot::channel();
        let sent = self.inner.forwarder().send(Outgoing {
            channel: ChannelUri::from(ROOT_URI),
            node: Some(node.to_owned()),
            body,
            done,
        });
        Box::pin(async move {
            sent.map_err(|_| "the cluster link stopped".to_owned())?;
            answer
                .await
                .unwrap_or_else(|_| Err("the cluster link stopped".to_owned()))
        })
    }

    fn serve(&self, handler: ForwardHandler) {
        let client = self.inner.client.clone();
        let subject = format!("{NODE_PREFIX}.{}", self.inner.node);
        let seal = self.inner.seal.clone();
        let inner = self.inner.clone();
        self.inner.rt.spawn(async move {
            let mut requests = match client.subscribe(subject.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, subject, "cannot answer forwarded requests");
                    return;
                }
            };
            // Only a node that answers tells the others its load (new
            // sessions are placed by it).
            JetStreamJournal { inner }.start_telling_load();
            while let Some(m) = requests.next().await {
                let Some(reply) = m.reply.clone() else {
                    continue;
                };
                let body = match seal.open(Purpose::Forward, &m.payload) {
                    Ok(b) => b,
                    Err(e) => {
                        // Not from a node of this cluster: nothing is done,
                        // nothing answered.
                        tracing::warn!(subject = %m.subject, error = %e, "a forwarded request was refused");
                        continue;
                    }
                };
                // Handed to the channel now, in arrival order; answered
                // when done.
                let answer = handler(body.to_vec());
                let client = client.clone();
                let seal = seal.clone();
                tokio::spawn(async move {
                    let body = seal.seal(Purpose::Answer, answer.await);
                    if let Err(e) = client.publish(reply, body).await {
                        tracing::warn!(error = %e, "a forwarded request's answer was not sent");
                    }
                });
            }
        });
    }

    fn announce(&self, body: Vec<u8>) {
        // One task sends them all, so they leave in the order they were made
        // (a connection's leaving never overtakes its last presence).
        let tx = self.inner.announcer.get_or_init(|| {
            let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
            let client = self.inner.client.clone();
            let seal = self.inner.seal.clone();
            self.inner.rt.spawn(async move {
                while let Some(body) = rx.recv().await {
                    let body = seal.seal(Purpose::Announce, body);
                    if let Err(e) = client.publish(ANNOUNCE_SUBJECT, body).await {
                        tracing::debug!(error = %e, "an announcement was not sent");
                    }
                }
            });
            tx
        });
        let _ = tx.send(body);
    }

    fn hear(&self, sink: Arc<dyn Fn(Vec<u8>) + Send + Sync>) {
        let client = self.inner.client.clone();
        let seal = self.inner.seal.clone();
        self.inner.rt.spawn(async move {
            let mut heard = match client.subscribe(ANNOUNCE_SUBJECT).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot hear the other nodes' announcements");
                    return;
                }
            };
            while let Some(m) = heard.next().await {
                match seal.open(Purpose::Announce, &m.payload) {
                    Ok(body) => sink(body.to_vec()),
                    Err(e) => tracing::debug!(error = %e, "an announcement was dropped"),
                }
            }
        });
    }

    fn orphans(&self, channels: Vec<ChannelUri>) -> LinkFuture<Vec<ChannelUri>> {
        let leases = self.leases();
        let rt = self.inner.rt.clone();
        Box::pin(async move {
            rt.spawn(async move {
                let mut gone = Vec::new();
                for c in channels {
                    if let Ok(None) = leases.holder(c.as_str()).await {
                        gone.push(c);
                    }
                }
                gone
            })
            .await
            .unwrap_or_default()
        })
    }

    fn take_over(&self, channels: Vec<ChannelUri>) -> LinkFuture<Result<bool, JournalError>> {
        let me = self.clone();
        let rt = self.inner.rt.clone();
        Box::pin(async move {
            rt.spawn(async move {
                // A channel this node still writes is not taken again: its
                // fence would refuse this node's own appends in flight (and
                // leave the channel written by nobody), and a take-over
                // that failed on another channel would release its lease.
                let channels: Vec<ChannelUri> =
                    channels.into_iter().filter(|c| !me.writes(c)).collect();
                let leases = me.leases();
                let mut taken = Vec::new();
                let mut ok = true;
                for c in &channels {
                    match leases.acquire_here(c.to_string()).await {
                        Ok(l) => taken.push(l),
                        Err(lease::LeaseError::Store(e)) => {
                            for l in &taken {
                                leases.release(l).await;
                            }
                            return Err(e);
                        }
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    for c in &channels {
                        if let Err(e) = me.fence(c).await {
                            tracing::info!(channel = %c, error = %e, "not taken over yet");
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    for l in &taken {
                        leases.release(l).await;
                    }
                    return Ok(false);
                }
                let mut owned = me.inner.owned.lock();
                let mut followed = me.inner.followed.lock();
                let mut watched = me.inner.watched.lock();
                for l in taken {
                    followed.remove(l.channel.as_str());
                    watched.remove(l.channel.as_str());
                    owned.insert(ChannelUri::from(l.channel.as_str()), l);
                }
                Ok(true)
            })
            .await
            .map_err(|e| JournalError::Unavailable(format!("take-over task: {e}")))?
        })
    }

    fn release(&self, channels: Vec<ChannelUri>) -> LinkFuture<()> {
        let me = self.clone();
        let rt = self.inner.rt.clone();
        Box::pin(async move {
            let _ = rt
                .spawn(async move {
                    let leases = me.leases();
                    for c in channels {
                        me.inner.followed.lock().insert(c.clone());
                        let lease = me.inner.owned.lock().remove(&c);
                        me.inner.watched.lock().insert(c.clone());
                        if let Some(l) = lease {
                            leases.release(&l).await;
                        }
                    }
                })
                .await;
        })
    }

    fn watch_every(&self) -> Duration {
        self.inner.lease / 3
    }
}
