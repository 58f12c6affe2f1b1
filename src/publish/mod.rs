//! Ordered fan-out: the server-wide `serverSeq`, the replay ring and the
//! per-channel subscriber hubs. What a subscriber is — a connection's
//! queue, written to its socket — is the transport's ([`crate::transport`]).
//!
//! Invariant 2 (one order per connection) is kept by doing three things under
//! one short critical section, the [`Publisher`] lock: assign the next
//! `serverSeq`, append the envelope to the replay ring, and push the frame to
//! every subscriber's [`Outbound`] queue. Pushing never awaits a socket, so the
//! section stays short; each connection's socket takes its queue in the order
//! the frames were pushed, which is `serverSeq` order.
//!
//! `serverSeq` is one node's numbering, not the cluster's: numbers strictly
//! increase on each node (so on each connection), with gaps. Every node
//! draws its numbers in blocks from one cluster-wide floor in the store
//! ([`crate::store::Journal::reserve_seq`]); a block is granted to one node
//! only, and when another node took numbers in between, a node jumps to
//! its new block ([`numbering`] says how). A `reconnect` is replayed only
//! when its `lastSeenServerSeq` is a number this node handed out and the
//! ring still holds everything this node published after it; a client
//! that comes from another node gets snapshots. A single node numbers
//! contiguously, as if alone in a cluster.

mod numbering;

use std::collections::VecDeque;
use std::sync::Arc;

use ahp_types::actions::ActionOrigin;
use bytestring::ByteString;
use parking_lot::Mutex;

use crate::ids::{ChannelUri, ConnId, ServerSeq};
use crate::transport::{Fanout, Outbound, Push};
use numbering::Numbering;
pub use numbering::{Reserver, SeqRefused};

/// The subscribers of one channel. Shared between the channel's actor (which
/// publishes) and reconnect handling (which re-registers under the publisher
/// lock), so it lives outside the actor.
///
/// The list is copied on write: a publisher takes the current list with
/// one reference count and writes to the sockets without holding any lock,
/// so a subscribe never waits for a fan-out's writes.
#[derive(Default)]
pub struct Hub {
    subscribers: Mutex<Arc<Vec<Arc<Outbound>>>>,
}

impl Hub {
    /// Add a connection; adding twice is a no-op.
    pub fn add(&self, conn: &Arc<Outbound>) {
        let mut subs = self.subscribers.lock();
        if !subs.iter().any(|s| s.id() == conn.id()) {
            Arc::make_mut(&mut subs).push(conn.clone());
        }
    }

    /// Remove a connection.
    pub fn remove(&self, conn: ConnId) {
        let mut subs = self.subscribers.lock();
        if subs.iter().any(|s| s.id() == conn) {
            Arc::make_mut(&mut subs).retain(|s| s.id() != conn);
        }
    }

    /// Whether a connection is subscribed.
    pub fn contains(&self, conn: ConnId) -> bool {
        self.subscribers.lock().iter().any(|s| s.id() == conn)
    }

    /// Number of subscribers.
    pub fn len(&self) -> usize {
        self.subscribers.lock().len()
    }

    /// Whether nobody is subscribed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The subscribers now.
    fn current(&self) -> Arc<Vec<Arc<Outbound>>> {
        self.subscribers.lock().clone()
    }

    /// The subscribers' connection ids now.
    pub fn ids(&self) -> Vec<ConnId> {
        self.current().iter().map(|s| s.id()).collect()
    }

    /// Push a non-envelope frame (a protocol notification) about `session`
    /// to every subscriber allowed to see that session.
    pub fn notify_about(&self, session: &str, frame: &ByteString) {
        for s in self.current().iter().filter(|s| s.sees_session(session)) {
            s.push(Push::Notification(frame.clone()));
        }
    }
}

struct RingEntry {
    seq: ServerSeq,
    channel: ChannelUri,
    /// Only for connections that see every session (see
    /// [`Publisher::publish_unjournaled`]).
    unscoped_only: bool,
    /// The `action` notification carrying the serialized `ActionEnvelope`.
    envelope: Envelope,
}

/// `serverSeq` values reserved in the store at a time: a restart starts
/// above the reservation, so the counter never goes backwards.
const SEQ_BLOCK: u64 = 1 << 20;

struct SeqState {
    /// This node's `serverSeq` counter and the ranges it handed out.
    numbers: Numbering,
    /// Most recent envelopes, oldest first, for `reconnect` replay.
    ring: VecDeque<RingEntry>,
    /// Highest `serverSeq` this node published that the ring no longer
    /// holds (evicted, too large to keep, or no ring): a reconnect from
    /// before it would miss that envelope.
    evicted: ServerSeq,
    /// Bytes of the envelopes in `ring`.
    ring_bytes: usize,
    /// Channels whose envelopes this node did not publish for a while (a
    /// chat another cluster node owns that nobody here watched): a
    /// reconnect from the number kept for one, or before, gets snapshots. `MAX`
    /// while the channel is not applied at all.
    gaps: std::collections::HashMap<ChannelUri, ServerSeq>,
}

/// The start of every `action` notification, before its envelope.
const ACTION_HEAD: &str = "{\"jsonrpc\":\"2.0\",\"method\":\"action\",\"params\":";

/// A published `ActionEnvelope`, kept as the `action` notification that
/// carries it: the frame every subscriber is sent and the envelope the ring
/// replays are one allocation. Reads as the envelope's JSON.
#[derive(Clone)]
pub struct Envelope(ByteString);

impl Envelope {
    /// The `action` notification.
    pub fn frame(&self) -> &ByteString {
        &self.0
    }
}

impl std::ops::Deref for Envelope {
    type Target = str;

    /// The serialized `ActionEnvelope` (the notification's `params`).
    fn deref(&self) -> &str {
        &self.0[ACTION_HEAD.len()..self.0.len() - 1]
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// A string as JSON: itself between quotes when nothing in it needs
/// escaping (a channel URI, a client id), `serde_json`'s text otherwise.
enum JsonStr<'a> {
    Plain(&'a str),
    Escaped(String),
}

impl<'a> JsonStr<'a> {
    fn of(s: &'a str) -> Self {
        if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            Self::Plain(s)
        } else {
            Self::Escaped(serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()))
        }
    }

    /// Bytes it takes, quotes included.
    fn len(&self) -> usize {
        match self {
            Self::Plain(s) => s.len() + 2,
            Self::Escaped(e) => e.len(),
        }
    }

    fn push_to(&self, out: &mut String) {
        match self {
            Self::Plain(s) => {
                out.push('"');
                out.push_str(s);
                out.push('"');
            }
            Self::Escaped(e) => out.push_str(e),
        }
    }
}

/// An `action` notification up to its `serverSeq`, built before the
/// publisher's lock is taken; [`Unnumbered::finish`] completes it under
/// the lock once the number is known. Its buffer is sized exactly, but for
/// the digits the number does not use (the ring keeps it as it is).
struct Unnumbered {
    frame: String,
    /// Where the origin starts, when there is one: it is written where the
    /// number will end, and moved after it by `finish`.
    origin_at: Option<usize>,
}

impl Unnumbered {
    /// Longest `serverSeq` in decimal.
    const SEQ_DIGITS: usize = 20;
    const CHANNEL: &str = "{\"channel\":";
    const ACTION: &str = ",\"action\":";
    const SEQ: &str = ",\"serverSeq\":";
    const ORIGIN: &str = ",\"origin\":{\"clientId\":";
    const CLIENT_SEQ: &str = ",\"clientSeq\":";
    /// The envelope's and the notification's closing braces.
    const END: &str = "}}";

    fn new(channel: &str, action_json: &str, origin: Option<&ActionOrigin>) -> Self {
        let channel = JsonStr::of(channel);
        let mut client_seq = itoa::Buffer::new();
        let origin = origin.map(|o| (JsonStr::of(&o.client_id), client_seq.format(o.client_seq)));
        let origin_len = origin.as_ref().map_or(0, |(id, seq)| {
            Self::ORIGIN.len() + id.len() + Self::CLIENT_SEQ.len() + seq.len() + 1
        });
        let mut frame = String::with_capacity(
            ACTION_HEAD.len()
                + Self::CHANNEL.len()
                + channel.len()
                + Self::ACTION.len()
                + action_json.len()
                + Self::SEQ.len()
                + Self::SEQ_DIGITS
                + origin_len
                + Self::END.len(),
        );
        frame.push_str(ACTION_HEAD);
        frame.push_str(Self::CHANNEL);
        channel.push_to(&mut frame);
        frame.push_str(Self::ACTION);
        frame.push_str(action_json);
        frame.push_str(Self::SEQ);
        let origin_at = origin.map(|(id, seq)| {
            let at = frame.len();
            frame.push_str(Self::ORIGIN);
            id.push_to(&mut frame);
            frame.push_str(Self::CLIENT_SEQ);
            frame.push_str(seq);
            frame.push('}');
            at
        });
        Self { frame, origin_at }
    }

    /// The notification numbered `seq`.
    fn finish(mut self, seq: ServerSeq) -> Envelope {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(seq.get());
        match self.origin_at {
            Some(at) => self.frame.insert_str(at, digits),
            None => self.frame.push_str(digits),
        }
        self.frame.push_str(Self::END);
        Envelope(ByteString::from(self.frame))
    }
}

/// What `reconnect` can get from the ring.
pub enum Replay {
    /// Every envelope after `lastSeenServerSeq` on the requested channels.
    Envelopes(Vec<Envelope>),
    /// The ring no longer holds the gap, the gap is too big to replay, or
    /// `lastSeenServerSeq` is not a number this node handed out (another
    /// node's, or from before this node's start).
    TooOld,
}

/// Assigns `serverSeq`, keeps the replay ring, and fans frames out in order.
pub struct Publisher {
    state: Mutex<SeqState>,
    /// Envelopes kept for replay (`--replay-ring-len`).
    ring_len: usize,
    /// Bytes of envelopes kept for replay (`--replay-ring-bytes`): a few
    /// large actions must not pin hundreds of megabytes; a reconnect from
    /// before the oldest kept envelope gets snapshots instead.
    ring_bytes_limit: usize,
    reserver: Reserver,
    /// Counts every envelope pushed (`tandem_deliveries_total`): one add
    /// per action, by its number of receivers.
    deliveries: metrics::Counter,
    /// Threads that write shares of big rooms ([`Fanout`]).
    fanout: Fanout,
}

impl Publisher {
    /// Start counting after `start_seq` (the highest seq ever handed out, so the
    /// counter never goes backwards across restarts when the store remembers it).
    pub fn new(start_seq: ServerSeq, ring_len: usize) -> Self {
        Self::with_reserver(
            start_seq,
            ring_len,
            usize::MAX,
            Box::new(|next, _| Ok(next)),
        )
    }

    /// A publisher that keeps at most `ring_len` envelopes and `ring_bytes`
    /// bytes for replay, and durably reserves blocks of `serverSeq` before
    /// using them (the store's `reserve_seq`).
    pub fn with_reserver(
        start_seq: ServerSeq,
        ring_len: usize,
        ring_bytes: usize,
        reserver: Reserver,
    ) -> Self {
        Self {
            state: Mutex::new(SeqState {
                numbers: Numbering::new(start_seq, SEQ_BLOCK),
                ring: VecDeque::with_capacity(ring_len.min(1 << 16)),
                evicted: ServerSeq::ZERO,
                ring_bytes: 0,
                gaps: std::collections::HashMap::new(),
            }),
            ring_len,
            ring_bytes_limit: ring_bytes,
            reserver,
            deliveries: metrics::Counter::noop(),
            fanout: Fanout::default(),
        }
    }

    /// Write big rooms from `threads` more threads than the publishing one
    /// (`--fanout-threads`), batching each thread's socket writes where
    /// `batched` (see [`Outbound::flush_all`], `--no-io-uring`).
    pub fn with_fanout(mut self, threads: usize, batched: bool) -> Self {
        self.fanout = Fanout::new(threads, batched);
        self
    }

    /// Threads helping to write big rooms.
    pub fn fanout_threads(&self) -> usize {
        self.fanout.threads()
    }

    /// Count deliveries on `counter`.
    pub fn with_deliveries(mut self, counter: metrics::Counter) -> Self {
        self.deliveries = counter;
        self
    }

    /// Bytes of envelopes held for replay.
    pub fn ring_bytes(&self) -> usize {
        self.state.lock().ring_bytes
    }

    /// Memory the replay ring holds: its envelopes, each in its `action`
    /// frame with the frame's shared header (counted at most), and its
    /// slots (allocated up front, at most `--replay-ring-len` of them).
    pub fn ring_footprint(&self) -> usize {
        /// What an envelope's frame holds beside the envelope, at most: the
        /// notification around it, the digits its number does not use, and
        /// the shared buffer's header (its pointer, capacity and count).
        const FRAME_EXTRA: usize =
            ACTION_HEAD.len() + 1 + Unnumbered::SEQ_DIGITS + 3 * std::mem::size_of::<usize>();
        let st = self.state.lock();
        st.ring_bytes
            + st.ring.len() * FRAME_EXTRA
            + st.ring.capacity() * std::mem::size_of::<RingEntry>()
    }

    /// Reserve `block` numbers at a time instead of [`SEQ_BLOCK`], so tests
    /// can make several publishers' blocks interleave.
    #[cfg(test)]
    fn with_seq_block(
        start_seq: ServerSeq,
        ring_len: usize,
        block: u64,
        reserver: Reserver,
    ) -> Self {
        let p = Self::with_reserver(start_seq, ring_len, usize::MAX, reserver);
        p.state.lock().numbers = Numbering::new(start_seq, block);
        p
    }

    /// The last `serverSeq` this node assigned (or burnt as the marker of
    /// a new block): what a snapshot taken now carries as `fromSeq`.
    pub fn current(&self) -> ServerSeq {
        self.state.lock().numbers.current()
    }

    /// Stop publishing `channel` here if `hub` has no subscriber (checked
    /// under the lock replay subscribes under, so no reconnect slips in
    /// between): until [`Self::resumed`], a reconnect that names it gets
    /// snapshots. `false` (nothing changed) when someone subscribes.
    pub fn pause(&self, channel: &ChannelUri, hub: &Hub) -> bool {
        let mut st = self.state.lock();
        if !hub.is_empty() {
            return false;
        }
        st.gaps.insert(channel.clone(), ServerSeq::new(u64::MAX));
        true
    }

    /// `channel` is published here again, from now: what it did while
    /// paused was never in the ring, so a reconnect from now or before gets
    /// snapshots (one whose last number is now may have been sent the
    /// fresh snapshot, or nothing since it left: they look the same).
    pub fn resumed(&self, channel: &ChannelUri) {
        let mut st = self.state.lock();
        let now = st.numbers.current();
        let evicted = st.evicted;
        st.gaps
            .retain(|_, from| from.get() == u64::MAX || *from > evicted);
        st.gaps.insert(channel.clone(), now);
    }

    /// Move to the first number of a newly reserved block before anything
    /// is handed out. A cluster node calls it at start: the floor it
    /// starts from is shared, and may be the last number another node
    /// handed out, so it must not become this node's first `fromSeq`.
    pub fn fresh_block(&self) -> Result<(), SeqRefused> {
        self.state.lock().numbers.fresh_block(&self.reserver)
    }

    /// Secure `n` numbers for actions about to be journaled, reserving a
    /// new block in the store when the current one cannot cover them. Called
    /// before the journal append, so a refusal stops the write before
    /// anything is stored; each claimed number is then used by one
    /// [`Publisher::publish`] or given back with [`Publisher::release`].
    pub fn claim(&self, n: u64) -> Result<(), SeqRefused> {
        self.state.lock().numbers.claim(n, &self.reserver)
    }

    /// Give back claimed numbers whose actions were not stored.
    pub fn release(&self, n: u64) {
        self.state.lock().numbers.release(n);
    }

    /// Publish one journaled action with a number secured by
    /// [`Publisher::claim`]: assign its seq, ring it, and push it to every
    /// subscriber of `hub` and to `origin_conn` (the dispatcher, who gets
    /// its echo even when not subscribed). `action_json` is the serialized
    /// `StateAction`. Returns the assigned seq.
    pub fn publish(
        &self,
        channel: &ChannelUri,
        hub: &Hub,
        action_json: &str,
        origin: Option<&ActionOrigin>,
        origin_conn: Option<&Arc<Outbound>>,
    ) -> ServerSeq {
        let text = Unnumbered::new(channel, action_json, origin);
        let mut st = self.state.lock();
        // Nothing claimed (a caller outside the journal path): reserve now,
        // and drop the action rather than use an unreserved number.
        let Ok(seq) = st.numbers.assign(true, &self.reserver) else {
            return st.numbers.current();
        };
        self.publish_locked(st, seq, text, channel, hub, origin_conn, false)
    }

    /// Publish an action that is not journaled (root's derived state):
    /// reserves on demand; `None`, and nothing published, if the store
    /// refused the reservation. With `unscoped_only` it goes only to the
    /// subscribers that see every session (a count of all sessions tells a
    /// scoped client about other tenants): scoped subscribers neither
    /// receive it nor get it in a replay.
    pub fn publish_unjournaled(
        &self,
        channel: &ChannelUri,
        hub: &Hub,
        action_json: &str,
        unscoped_only: bool,
    ) -> Option<ServerSeq> {
        let text = Unnumbered::new(channel, action_json, None);
        let mut st = self.state.lock();
        let seq = st.numbers.assign(false, &self.reserver).ok()?;
        Some(self.publish_locked(st, seq, text, channel, hub, None, unscoped_only))
    }

    /// Fan the envelope numbered `seq` out and ring it, under the lock.
    #[allow(clippy::too_many_arguments)]
    fn publish_locked(
        &self,
        mut st: parking_lot::MutexGuard<'_, SeqState>,
        seq: ServerSeq,
        text: Unnumbered,
        channel: &ChannelUri,
        hub: &Hub,
        origin_conn: Option<&Arc<Outbound>>,
        unscoped_only: bool,
    ) -> ServerSeq {
        let envelope = text.finish(seq);
        let frame = envelope.frame().clone();
        // Queued under the lock (that is what keeps `serverSeq` order on
        // every connection); written once it is released.
        let subs = hub.current();
        let now = tokio::time::Instant::now();
        let mut origin_delivered = false;
        let mut delivered = 0u64;
        for s in subs.iter() {
            if unscoped_only && s.is_scoped() {
                continue;
            }
            delivered += 1;
            match origin_conn {
                Some(o) if o.id() == s.id() => {
                    origin_delivered = true;
                    s.push_deferred(Push::Echo(seq, frame.clone()), now);
                }
                _ => s.push_deferred(Push::Envelope(seq, frame.clone()), now),
            }
        }
        let origin = origin_conn.filter(|_| !origin_delivered);
        if let Some(o) = origin {
            delivered += 1;
            o.push_deferred(Push::Echo(seq, frame), now);
        }
        if self.ring_len > 0 && envelope.len() <= self.ring_bytes_limit {
            while st.ring.len() >= self.ring_len
                || st.ring_bytes + envelope.len() > self.ring_bytes_limit
            {
                let Some(old) = st.ring.pop_front() else {
                    break;
                };
                st.ring_bytes -= old.envelope.len();
                st.evicted = old.seq;
            }
            st.ring_bytes += envelope.len();
            st.ring.push_back(RingEntry {
                seq,
                channel: channel.clone(),
                unscoped_only,
                envelope,
            });
        } else {
            // Too large to keep: nothing before it can be replayed either.
            st.ring.clear();
            st.ring_bytes = 0;
            st.evicted = seq;
        }
        let evicted = st.evicted;
        st.numbers.prune(evicted);
        drop(st);
        self.deliveries.increment(delivered);
        // The author's echo leaves first, subscriber or not: it is what
        // the author's client waits on to settle its pending action (after
        // a big room's writes it would wait for all of them). It is the
        // first write of this thread's first batch; a subscribed author's
        // queue is then empty when the rest of the room is written.
        match origin_conn {
            Some(o) => self.fanout.flush_after(o, &subs),
            None => self.fanout.flush(&subs),
        }
        seq
    }

    /// Register `conn` on `hub` at the current seq: every later envelope of the
    /// channel reaches it, none before. `under_lock` runs inside the critical
    /// section with the snapshot's `fromSeq` (used to push the reply first).
    pub fn subscribe_at<R>(
        &self,
        hub: &Hub,
        conn: &Arc<Outbound>,
        under_lock: impl FnOnce(ServerSeq) -> R,
    ) -> R {
        let st = self.state.lock();
        hub.add(conn);
        under_lock(st.numbers.current())
    }

    /// Replay for `reconnect`: if `last_seen` is a number this node handed
    /// out and the ring covers everything it published after it, register
    /// `conn` on every hub and return the missed envelopes of those
    /// channels, all under the lock so nothing falls between replay and
    /// live. A number from another node of the cluster gets snapshots.
    pub fn replay_and_subscribe(
        &self,
        last_seen: ServerSeq,
        channels: &[(ChannelUri, Arc<Hub>)],
        conn: &Arc<Outbound>,
        max_bytes: usize,
        under_lock: impl FnOnce(&[Envelope]),
    ) -> Replay {
        let st = self.state.lock();
        let covered = st.numbers.handed_out(last_seen)
            && st.evicted <= last_seen
            && !channels
                .iter()
                .any(|(c, _)| st.gaps.get(c).is_some_and(|from| *from >= last_seen));
        if !covered {
            return Replay::TooOld;
        }
        let start = st.ring.partition_point(|e| e.seq <= last_seen);
        let envelopes: Vec<Envelope> = st
            .ring
            .range(start..)
            .filter(|e| channels.iter().any(|(c, _)| *c == e.channel))
            .filter(|e| !(e.unscoped_only && conn.is_scoped()))
            .map(|e| e.envelope.clone())
            .collect();
        if envelopes.iter().map(|e| e.len()).sum::<usize>() > max_bytes {
            return Replay::TooOld;
        }
        for (_, hub) in channels {
            hub.add(conn);
        }
        under_lock(&envelopes);
        Replay::Envelopes(envelopes)
    }
}

/// The rejection echo for an action: to the sender only, carrying the last
/// `serverSeq` already sent to that connection and the reason.
pub fn rejection_frame(
    channel: &str,
    action_json: &str,
    last_seq: ServerSeq,
    origin: &ActionOrigin,
    reason: &str,
) -> ByteString {
    let channel = serde_json::to_string(channel).unwrap_or_else(|_| "\"\"".into());
    let origin = serde_json::to_string(origin).unwrap_or_else(|_| "null".into());
    let reason = serde_json::to_string(reason).unwrap_or_else(|_| "\"\"".into());
    ByteString::from(format!(
        "{ACTION_HEAD}{{\"channel\":{channel},\"action\":{action_json},\"serverSeq\":{last_seq},\"origin\":{origin},\"rejectionReason\":{reason}}}}}"
    ))
}

#[cfg(test)]
mod tests;
