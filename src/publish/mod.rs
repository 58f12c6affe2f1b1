//! Ordered fan-out: the server-wide `serverSeq`, the replay ring, per-channel
//! subscriber hubs and per-connection outbound queues.
//!
//! Invariant 2 (one order per connection) is kept by doing three things under
//! one short critical section, the [`Publisher`] lock: assign the next
//! `serverSeq`, append the envelope to the replay ring, and push the frame to
//! every subscriber's [`Outbound`] queue. Pushing never awaits a socket, so the
//! section stays short; each connection's socket takes its queue in the order
//! the frames were pushed, which is `serverSeq` order.

pub mod outbound;

use std::collections::VecDeque;
use std::sync::Arc;

use ahp_types::actions::ActionOrigin;
use bytestring::ByteString;
use parking_lot::Mutex;

use crate::ids::ChannelUri;
pub use crate::ids::{ConnId, ServerSeq};
pub use outbound::{Outbound, Push};

/// The subscribers of one channel. Shared between the channel's actor (which
/// publishes) and reconnect handling (which re-registers under the publisher
/// lock), so it lives outside the actor.
#[derive(Default)]
pub struct Hub {
    subscribers: Mutex<Vec<Arc<Outbound>>>,
}

impl Hub {
    /// Add a connection; adding twice is a no-op.
    pub fn add(&self, conn: &Arc<Outbound>) {
        let mut subs = self.subscribers.lock();
        if !subs.iter().any(|s| s.id() == conn.id()) {
            subs.push(conn.clone());
        }
    }

    /// Remove a connection.
    pub fn remove(&self, conn: ConnId) {
        self.subscribers.lock().retain(|s| s.id() != conn);
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

    /// Push a non-envelope frame (a protocol notification) about `session`
    /// to every subscriber allowed to see that session.
    pub fn notify_about(&self, session: &str, frame: &ByteString) {
        for s in self
            .subscribers
            .lock()
            .iter()
            .filter(|s| s.sees_session(session))
        {
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
    /// The serialized `ActionEnvelope` (the `params` of an `action` notification).
    envelope: Arc<str>,
}

/// `serverSeq` values reserved in the store at a time: a restart starts
/// above the reservation, so the counter never goes backwards.
const SEQ_BLOCK: u64 = 1 << 20;

/// Durably records a reservation; the store's reason if it refused.
pub type Reserver = Box<dyn Fn(ServerSeq) -> Result<(), String> + Send + Sync>;

/// The store refused a `serverSeq` reservation: from then on no new number
/// is handed out, so none can repeat after a restart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not reserve serverSeq values in the store: {0}")]
pub struct SeqRefused(pub String);

struct SeqState {
    /// Last assigned `serverSeq`.
    seq: ServerSeq,
    /// Highest `serverSeq` the store allows before the next reservation.
    reserved: ServerSeq,
    /// Numbers promised to journaled actions not yet published
    /// ([`Publisher::claim`]); `seq + claimed <= reserved` always holds.
    claimed: u64,
    /// Set when a reservation failed; every later claim is refused.
    failed: Option<SeqRefused>,
    /// Most recent envelopes, oldest first, for `reconnect` replay.
    ring: VecDeque<RingEntry>,
    /// Bytes of the envelopes in `ring`.
    ring_bytes: usize,
}

/// An envelope's channel and origin, serialized before taking the lock.
struct Encoded {
    channel_json: String,
    /// `,"origin":{…}` or empty.
    origin_json: String,
}

impl Encoded {
    fn new(channel: &str, origin: Option<&ActionOrigin>) -> Self {
        Self {
            channel_json: serde_json::to_string(channel).unwrap_or_else(|_| "\"\"".into()),
            origin_json: origin
                .map(|o| serde_json::to_string(o).unwrap_or_else(|_| "null".into()))
                .map(|o| format!(",\"origin\":{o}"))
                .unwrap_or_default(),
        }
    }
}

/// What `reconnect` can get from the ring.
pub enum Replay {
    /// Every envelope after `lastSeenServerSeq` on the requested channels.
    Envelopes(Vec<Arc<str>>),
    /// The ring no longer holds the gap, the gap is too big to replay, or
    /// the client is from another epoch.
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
}

impl Publisher {
    /// Start counting after `start_seq` (the highest seq ever handed out, so the
    /// counter never goes backwards across restarts when the store remembers it).
    pub fn new(start_seq: ServerSeq, ring_len: usize) -> Self {
        Self::with_reserver(start_seq, ring_len, usize::MAX, Box::new(|_| Ok(())))
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
                seq: start_seq,
                reserved: start_seq,
                claimed: 0,
                failed: None,
                ring: VecDeque::with_capacity(ring_len.min(1 << 16)),
                ring_bytes: 0,
            }),
            ring_len,
            ring_bytes_limit: ring_bytes,
            reserver,
        }
    }

    /// Bytes of envelopes held for replay.
    pub fn ring_bytes(&self) -> usize {
        self.state.lock().ring_bytes
    }

    /// The last assigned `serverSeq`.
    pub fn current(&self) -> ServerSeq {
        self.state.lock().seq
    }

    /// Secure `n` numbers for actions about to be journaled, reserving a
    /// new block in the store when the current one cannot cover them. Called
    /// before the journal append, so a refusal stops the write before
    /// anything is stored; each claimed number is then used by one
    /// [`Publisher::publish`] or given back with [`Publisher::release`].
    pub fn claim(&self, n: u64) -> Result<(), SeqRefused> {
        let mut st = self.state.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let need = st.seq.plus(st.claimed + n);
        self.reserve(&mut st, need)?;
        st.claimed += n;
        Ok(())
    }

    /// Give back claimed numbers whose actions were not stored.
    pub fn release(&self, n: u64) {
        let mut st = self.state.lock();
        st.claimed = st.claimed.saturating_sub(n);
    }

    /// Make sure the store allows numbers up to `need` (rare: once per
    /// block, a short synchronous store write). A refusal is remembered.
    fn reserve(&self, st: &mut SeqState, need: ServerSeq) -> Result<(), SeqRefused> {
        if need <= st.reserved {
            return Ok(());
        }
        let upto = need.plus(SEQ_BLOCK);
        match (self.reserver)(upto) {
            Ok(()) => {
                st.reserved = upto;
                Ok(())
            }
            Err(reason) => {
                tracing::error!(%upto, %reason, "could not reserve serverSeq values in the store; writes stop");
                let e = SeqRefused(reason);
                st.failed = Some(e.clone());
                Err(e)
            }
        }
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
        let text = Encoded::new(channel, origin);
        let mut st = self.state.lock();
        if st.claimed == 0 {
            // Nothing claimed (a caller outside the journal path): reserve
            // now, and drop the action rather than use an unreserved number.
            if self.unclaimed(&mut st).is_err() {
                return st.seq;
            }
        } else {
            st.claimed -= 1;
        }
        self.publish_locked(st, &text, channel, hub, action_json, origin_conn, false)
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
        let text = Encoded::new(channel, None);
        let mut st = self.state.lock();
        self.unclaimed(&mut st).ok()?;
        Some(self.publish_locked(st, &text, channel, hub, action_json, None, unscoped_only))
    }

    /// Room for one number nobody claimed.
    fn unclaimed(&self, st: &mut SeqState) -> Result<(), SeqRefused> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let need = st.seq.plus(st.claimed + 1);
        self.reserve(st, need)
    }

    /// Assign the next (reserved) seq and fan the envelope out, under the lock.
    #[allow(clippy::too_many_arguments)]
    fn publish_locked(
        &self,
        mut st: parking_lot::MutexGuard<'_, SeqState>,
        text: &Encoded,
        channel: &ChannelUri,
        hub: &Hub,
        action_json: &str,
        origin_conn: Option<&Arc<Outbound>>,
        unscoped_only: bool,
    ) -> ServerSeq {
        let Encoded {
            channel_json,
            origin_json,
        } = text;
        st.seq = st.seq.next();
        let seq = st.seq;
        debug_assert!(seq <= st.reserved, "an unreserved serverSeq");
        let envelope: Arc<str> = format!(
            "{{\"channel\":{channel_json},\"action\":{action_json},\"serverSeq\":{seq}{origin_json}}}"
        )
        .into();
        let frame = action_frame(&envelope);
        let subs = hub.subscribers.lock();
        let mut origin_delivered = false;
        for s in subs.iter() {
            if unscoped_only && s.is_scoped() {
                continue;
            }
            match origin_conn {
                Some(o) if o.id() == s.id() => {
                    origin_delivered = true;
                    s.push(Push::Echo(seq, frame.clone()));
                }
                _ => s.push(Push::Envelope(seq, frame.clone())),
            }
        }
        drop(subs);
        if let (Some(o), false) = (origin_conn, origin_delivered) {
            o.push(Push::Echo(seq, frame));
        }
        if self.ring_len > 0 && envelope.len() <= self.ring_bytes_limit {
            while st.ring.len() >= self.ring_len
                || st.ring_bytes + envelope.len() > self.ring_bytes_limit
            {
                let Some(old) = st.ring.pop_front() else {
                    break;
                };
                st.ring_bytes -= old.envelope.len();
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
        under_lock(st.seq)
    }

    /// Replay for `reconnect`: if the ring covers everything after `last_seen`,
    /// register `conn` on every hub and return the missed envelopes of those
    /// channels, all under the lock so nothing falls between replay and live.
    pub fn replay_and_subscribe(
        &self,
        last_seen: ServerSeq,
        channels: &[(ChannelUri, Arc<Hub>)],
        conn: &Arc<Outbound>,
        max_bytes: usize,
        under_lock: impl FnOnce(&[Arc<str>]),
    ) -> Replay {
        let st = self.state.lock();
        let covered = last_seen <= st.seq
            && match st.ring.front() {
                Some(first) => first.seq <= last_seen.next(),
                None => last_seen == st.seq,
            };
        if !covered {
            return Replay::TooOld;
        }
        let start = st.ring.partition_point(|e| e.seq <= last_seen);
        let envelopes: Vec<Arc<str>> = st
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

/// The `action` notification frame for a serialized envelope.
pub fn action_frame(envelope: &str) -> ByteString {
    ByteString::from(format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"action\",\"params\":{envelope}}}"
    ))
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
        "{{\"jsonrpc\":\"2.0\",\"method\":\"action\",\"params\":{{\"channel\":{channel},\"action\":{action_json},\"serverSeq\":{last_seq},\"origin\":{origin},\"rejectionReason\":{reason}}}}}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    fn conn(limit: usize) -> Arc<Outbound> {
        Arc::new(Outbound::new(limit))
    }

    #[test]
    fn publish_assigns_increasing_seqs_and_echoes_origin_once() {
        let p = Publisher::new(ServerSeq::ZERO, 16);
        let hub = Hub::default();
        let a = conn(1 << 20);
        let b = conn(1 << 20);
        hub.add(&a);
        let ch = ChannelUri::from("ahp-chat:/x");
        let origin = ActionOrigin {
            client_id: "c".into(),
            client_seq: 1,
        };
        assert_eq!(
            p.publish(&ch, &hub, "{}", Some(&origin), Some(&a)),
            ServerSeq::new(1)
        );
        assert_eq!(
            p.publish(&ch, &hub, "{}", Some(&origin), Some(&b)),
            ServerSeq::new(2)
        );
        assert_eq!(
            a.drain_for_test().len(),
            2,
            "subscriber gets both, echo not doubled"
        );
        assert_eq!(
            b.drain_for_test().len(),
            1,
            "non-subscribed sender gets its echo"
        );
        assert_eq!(a.last_seq(), ServerSeq::new(2));
    }

    #[test]
    fn the_ring_is_bounded_in_bytes_and_falls_back_to_snapshots() {
        let p = Publisher::with_reserver(ServerSeq::ZERO, 1000, 1000, Box::new(|_| Ok(())));
        let hub = Arc::new(Hub::default());
        let ch = ChannelUri::from("ahp-chat:/x");
        let big = format!("\"{}\"", "x".repeat(300));
        for _ in 0..10 {
            p.publish(&ch, &hub, &big, None, None);
        }
        assert!(p.ring_bytes() <= 1000, "{} bytes kept", p.ring_bytes());
        let chans = vec![(ch.clone(), hub.clone())];
        let c = conn(1 << 20);
        assert!(
            matches!(
                p.replay_and_subscribe(ServerSeq::new(5), &chans, &c, usize::MAX, |_| {}),
                Replay::TooOld
            ),
            "what the byte bound dropped is answered with snapshots"
        );
        match p.replay_and_subscribe(ServerSeq::new(8), &chans, &c, usize::MAX, |_| {}) {
            Replay::Envelopes(e) => assert_eq!(e.len(), 2),
            Replay::TooOld => panic!("the newest envelopes are kept"),
        }
        let huge = format!("\"{}\"", "x".repeat(2000));
        p.publish(&ch, &hub, &huge, None, None);
        assert_eq!(p.ring_bytes(), 0, "an envelope over the bound is not kept");
        assert!(matches!(
            p.replay_and_subscribe(ServerSeq::new(10), &chans, &c, usize::MAX, |_| {}),
            Replay::TooOld
        ));
        p.publish(&ch, &hub, "{}", None, None);
        match p.replay_and_subscribe(ServerSeq::new(11), &chans, &c, usize::MAX, |_| {}) {
            Replay::Envelopes(e) => assert_eq!(e.len(), 1),
            Replay::TooOld => panic!("replay resumes after the large one"),
        }
    }

    /// A publisher whose store refuses reservations while `refuse` is set,
    /// recording the highest reservation it granted.
    fn reserving(refuse: &Arc<AtomicBool>, granted: &Arc<AtomicU64>) -> Publisher {
        let (refuse, granted) = (refuse.clone(), granted.clone());
        Publisher::with_reserver(
            ServerSeq::ZERO,
            16,
            usize::MAX,
            Box::new(move |upto| {
                if refuse.load(Ordering::SeqCst) {
                    return Err("disk full".into());
                }
                granted.fetch_max(upto.get(), Ordering::SeqCst);
                Ok(())
            }),
        )
    }

    #[test]
    fn a_refused_reservation_hands_out_no_number_and_stays_refused() {
        let refuse = Arc::new(AtomicBool::new(true));
        let granted = Arc::new(AtomicU64::new(0));
        let p = reserving(&refuse, &granted);
        let hub = Hub::default();
        let sub = conn(1 << 20);
        hub.add(&sub);
        let ch = ChannelUri::from("ahp-chat:/x");
        let err = p.claim(1).expect_err("nothing reserved, nothing claimed");
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", false), None);
        assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", true), None);
        assert_eq!(p.current(), ServerSeq::ZERO, "no number was handed out");
        assert!(sub.drain_for_test().is_empty(), "nothing was published");
        refuse.store(false, Ordering::SeqCst);
        assert!(
            p.claim(1).is_err(),
            "writes stay stopped once a reservation failed"
        );
        assert_eq!(granted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn claimed_numbers_are_reserved_before_they_are_used() {
        let refuse = Arc::new(AtomicBool::new(false));
        let granted = Arc::new(AtomicU64::new(0));
        let p = reserving(&refuse, &granted);
        let hub = Hub::default();
        let ch = ChannelUri::from("ahp-chat:/x");
        p.claim(3).expect("reserved");
        let block = granted.load(Ordering::SeqCst);
        assert!(block >= 3, "the claim is covered: {block}");
        refuse.store(true, Ordering::SeqCst);
        // Numbers claimed before the store failed are still safe to use.
        for _ in 0..3 {
            let seq = p.publish(&ch, &hub, "{}", None, None);
            assert!(seq.get() <= block, "{seq} beyond the reservation {block}");
        }
        // Claims up to the reserved block need no store write...
        p.claim(block - 3).expect("inside the reserved block");
        // ...one past it does, and the store refuses.
        assert!(p.claim(1).is_err());
        p.release(block - 3);
        assert!(p.claim(1).is_err(), "released or not, writes stay stopped");
        assert_eq!(p.publish_unjournaled(&ch, &hub, "{}", false), None);
        assert_eq!(p.current(), ServerSeq::new(3));
    }

    #[test]
    fn replay_covers_only_what_the_ring_holds() {
        let p = Publisher::new(ServerSeq::ZERO, 3);
        let hub = Arc::new(Hub::default());
        let ch = ChannelUri::from("ahp-chat:/x");
        for _ in 0..5 {
            p.publish(&ch, &hub, "{}", None, None);
        }
        let c = conn(1 << 20);
        let chans = vec![(ch.clone(), hub.clone())];
        assert!(matches!(
            p.replay_and_subscribe(ServerSeq::new(1), &chans, &c, usize::MAX, |_| {}),
            Replay::TooOld
        ));
        match p.replay_and_subscribe(ServerSeq::new(2), &chans, &c, usize::MAX, |_| {}) {
            Replay::Envelopes(e) => assert_eq!(e.len(), 3),
            Replay::TooOld => panic!("ring holds seqs 3..=5"),
        }
        assert!(hub.contains(c.id()));
        assert!(matches!(
            p.replay_and_subscribe(ServerSeq::new(9), &chans, &c, usize::MAX, |_| {}),
            Replay::TooOld
        ));
        match p.replay_and_subscribe(ServerSeq::new(5), &chans, &c, usize::MAX, |_| {}) {
            Replay::Envelopes(e) => assert!(e.is_empty()),
            Replay::TooOld => panic!("nothing missed"),
        }
    }
}
