//! A connection's outbound queue, bounded in bytes.
//!
//! Publishers (chat, session and root actors) push frames without ever
//! awaiting. When the connection's socket is free — nothing being written
//! to it, nothing left over, the pacing deadline passed or the frame urgent
//! — the pusher writes the queue to it at once ([`Wire`]): one `write` on
//! the pusher's thread, no task woken. Otherwise the frames wait for the
//! socket side ([`Outbound::poll_take`]), which takes everything queued in
//! one go and writes it with one socket write, so a burst of envelopes
//! costs one wake-up and one system call per connection rather than one
//! per frame. When the queued bytes of *pushed* frames
//! (envelopes, notifications) would pass the limit the connection is marked
//! for eviction: the queue is dropped and the socket is closed with a reason.
//! The client recovers everything with `reconnect` (invariant 5).
//!
//! Every queued byte is counted. Pushed frames (envelopes, notifications,
//! answers to small requests, pongs) may hold at most the limit. Large
//! replies (snapshots for `subscribe` / `initialize`, `reconnect` replays)
//! have a budget of their own, the same size: a reply asked for while the
//! replies already queued fill it evicts the connection, so a client that
//! asks and never reads makes the server hold at most twice the limit plus
//! one reply. One large answer — a chat snapshot bigger than the limit —
//! never evicts a client that reads, and envelopes that arrive while it
//! drains are judged against their own budget.
//!
//! Two ways a frame can wait, with distinct names:
//! - **held**: while the queue is gated ([`Outbound::gate`]), pushed frames
//!   are held back until the reply being built (a snapshot) is queued ahead
//!   of them ([`Outbound::ungate_with`]).
//! - **paced**: the socket side writes a connection at most once per pacing
//!   interval; a frame that is not urgent ([`Push`]) waits in the queue for
//!   that deadline ([`Take::Paced`]), an urgent one wakes the socket at once.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use bytestring::ByteString;
use parking_lot::Mutex;

use crate::ids::{ConnId, ServerSeq};

#[cfg(target_os = "linux")]
mod batch;
mod frame;
mod liveness;
mod pace;
mod wire;

pub(crate) use frame::frame_len;
use frame::{counted_len, reply_len};
pub use frame::{CloseCause, Frame, Push, Take, Taken};
pub use liveness::Beat;
use pace::Pace;
pub use wire::{encode_frames, encoded_len, Wire};

struct State {
    frames: VecDeque<Frame>,
    /// Bytes of the pushed frames in `frames` and `held`.
    bytes: usize,
    /// Bytes of the replies in `frames`.
    reply_bytes: usize,
    /// Highest `serverSeq` pushed to this connection.
    last_seq: ServerSeq,
    /// While true, pushes go to `held` so a reply can be queued before them.
    gated: bool,
    held: VecDeque<Frame>,
    close: Option<CloseCause>,
    /// The socket side waiting for frames.
    waker: Option<Waker>,
    /// The socket side paces its writes: queued frames wait for its
    /// deadline and it only wants to be woken for urgent ones.
    pacing: bool,
    /// A frame that must not wait for the pacing deadline is queued (a
    /// reply, a pong, a close).
    urgent: bool,
    /// Takes so far (wrapping), and the count the last heartbeat saw.
    takes: u32,
    seen_takes: u32,
    /// Consecutive heartbeats, while closing, with no take in between (a
    /// close the socket cannot get to).
    stalled_beats: u32,
    /// Text frames were taken for the socket since the last heartbeat (the
    /// client's TCP acknowledging them shows it is there).
    text_since_beat: bool,
    /// The socket, for writes made by whoever pushes (see [`Wire`]).
    wire: Option<Arc<dyn Wire>>,
    /// Least time between two writes of pushed frames, from
    /// `--write-pacing-ms` and how fast frames come (see [`Pace`]).
    pace: Pace,
    /// When frames last went to the socket.
    last_write: Option<Instant>,
    /// The socket side took frames and has not finished writing them: it
    /// owns the socket until [`Outbound::wrote`].
    writing: bool,
    /// Encoded bytes a direct write could not finish: the socket side
    /// writes them before anything else.
    unsent: Bytes,
}

impl State {
    /// See [`Outbound::paced_until`].
    fn paced_until(&self) -> Option<Instant> {
        let interval = self.pace.interval();
        if interval.is_zero() {
            return None;
        }
        self.last_write.map(|t| t + interval)
    }

    /// Write the first `n` frames to the wire now (see
    /// [`Outbound::start_flush`]): returns whom to wake.
    fn write_now(&mut self, n: usize) -> Option<Waker> {
        if let Some(wire) = &self.wire {
            self.unsent = wire::write_now(&**wire, self.frames.drain(..n));
        }
        self.after_direct_write()
    }

    /// After a direct write (`unsent` holds what the socket did not take):
    /// the socket side's waker if it has something left to write.
    fn after_direct_write(&mut self) -> Option<Waker> {
        // The queue's buffer is kept for the next frames, unless a backlog
        // made it large.
        if self.frames.is_empty() && self.frames.capacity() > FRAMES_KEEP {
            self.frames = VecDeque::new();
        }
        if !self.frames.is_empty() || !self.unsent.is_empty() {
            self.waker.take()
        } else {
            None
        }
    }

    /// The socket side's waker when frames were just queued, unless they
    /// wait for its pacing deadline (none is urgent).
    fn waker_for_new_frames(&mut self) -> Option<Waker> {
        if self.pacing && !self.urgent {
            None
        } else {
            self.waker.take()
        }
    }
}

/// What the first half of a flush came to ([`Outbound::start_flush`]).
enum Flush {
    /// Nothing for the caller to write; wake this, if anything.
    Done(Option<Waker>),
    /// Write this many frames from the front of the queue to the wire now,
    /// under the lock (draining them keeps the queue's buffer, so a
    /// delivery allocates nothing for its queue).
    Write(usize),
}

/// A frame queued by [`Outbound::push_unflushed`]: dropping this writes it,
/// if nothing wrote it before. (Not the gated frames of `held`.)
pub struct FlushOnDrop(Arc<Outbound>);

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        self.0.flush();
    }
}

/// One connection's outbound frames, in the order they must be written.
pub struct Outbound {
    id: ConnId,
    limit_bytes: usize,
    /// Sessions this connection may see (`None`: all); filters session-scoped
    /// notifications such as `root/sessionAdded`.
    scope: Option<Arc<HashSet<String>>>,
    /// When this queue was made: the epoch of `last_rx_ms`.
    born: Instant,
    /// When the client last sent a frame (ms since `born`).
    last_rx_ms: AtomicU64,
    state: Mutex<State>,
    /// Lets the connection go when its socket never takes the close.
    on_abandon: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Outbound {
    /// Connections written per system call by [`Self::flush_all`] (one
    /// `io_uring` submission).
    pub const BATCH: usize = 32;

    /// A fresh queue allowing `limit_bytes` of unsent frames.
    pub fn new(limit_bytes: usize) -> Self {
        Self::scoped(limit_bytes, None)
    }

    /// A queue for a connection limited to `scope` sessions.
    pub fn scoped(limit_bytes: usize, scope: Option<Arc<HashSet<String>>>) -> Self {
        Self {
            id: ConnId::next(),
            limit_bytes,
            scope,
            born: Instant::now(),
            last_rx_ms: AtomicU64::new(0),
            state: Mutex::new(State {
                frames: VecDeque::new(),
                bytes: 0,
                reply_bytes: 0,
                last_seq: ServerSeq::ZERO,
                gated: false,
                held: VecDeque::new(),
                close: None,
                waker: None,
                pacing: false,
                urgent: false,
                takes: 0,
                seen_takes: 0,
                stalled_beats: 0,
                text_since_beat: false,
                wire: None,
                pace: Pace::new(Duration::ZERO),
                last_write: None,
                writing: false,
                unsent: Bytes::new(),
            }),
            on_abandon: std::sync::OnceLock::new(),
        }
    }

    /// This connection's id.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// Whether this connection may see session `uri`.
    pub fn sees_session(&self, uri: &str) -> bool {
        self.scope.as_ref().is_none_or(|s| s.contains(uri))
    }

    /// Whether this connection is limited to some sessions.
    pub fn is_scoped(&self) -> bool {
        self.scope.is_some()
    }

    /// Highest `serverSeq` pushed so far.
    pub fn last_seq(&self) -> ServerSeq {
        self.state.lock().last_seq
    }

    /// Whether the connection has been told to close.
    pub fn is_closing(&self) -> bool {
        self.state.lock().close.is_some()
    }

    /// Why the connection was told to close, if it was.
    pub fn close_cause(&self) -> Option<CloseCause> {
        self.state.lock().close.clone()
    }

    /// Push a frame of the given class (see [`Push`]). Pushed frames count
    /// against the limit; one past it evicts the connection. With a
    /// [`Wire`], a frame that need not wait is written at once, on the
    /// caller's thread.
    pub fn push(&self, push: Push<'_>) {
        let now = Instant::now();
        let waker = {
            let mut st = self.state.lock();
            self.enqueue_push(&mut st, push, now);
            self.flush_locked(&mut st, Some(now))
        };
        wake(waker);
    }

    /// Queue a frame like [`Outbound::push`] but neither write nor wake
    /// anyone: the caller calls [`Outbound::flush`] later (a publisher does,
    /// once out of its lock, so no socket write happens under it). `now`:
    /// the time of the publish (one clock read for all its subscribers).
    pub fn push_deferred(&self, push: Push<'_>, now: Instant) {
        let mut st = self.state.lock();
        self.enqueue_push(&mut st, push, now);
    }

    /// Queue a frame that need not leave on its own: it goes out with the
    /// next frame written on this connection, or, if none is, when the
    /// returned [`FlushOnDrop`] (and every clone of its `Arc`) is dropped. A
    /// `dispatchAction` reply travels this way with the action, so it
    /// leaves in one write with the action's echo or rejection.
    pub fn push_unflushed(self: &Arc<Self>, push: Push<'_>) -> FlushOnDrop {
        self.push_deferred(push, Instant::now());
        FlushOnDrop(self.clone())
    }

    /// Send what is queued: write it now when the wire is free and the
    /// pacing deadline has passed (or a frame is urgent), otherwise leave it
    /// to the socket side, woken if it must act.
    pub fn flush(&self) {
        let waker = {
            let mut st = self.state.lock();
            self.flush_locked(&mut st, None)
        };
        wake(waker);
    }

    /// Flush every connection of `outs` (a room after a publish). With
    /// `batched`, on Linux, the direct writes of many connections go to the
    /// kernel in one system call (see `batch`); otherwise each
    /// connection is flushed on its own.
    pub fn flush_all(outs: &[Arc<Outbound>], batched: bool) {
        #[cfg(target_os = "linux")]
        if batched && outs.len() > 1 && batch::flush(outs) {
            return;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = batched;
        for out in outs {
            out.flush();
        }
    }

    fn enqueue_push(&self, st: &mut State, push: Push<'_>, now: Instant) {
        if st.close.is_some() {
            return;
        }
        let (frame, seq, urgent) = match push {
            Push::Envelope(seq, data) => (Frame::text(data), Some(seq), false),
            Push::Echo(seq, data) => (Frame::text(data), Some(seq), true),
            Push::Notification(data) => (Frame::text(data), None, false),
            Push::Response(data) => (Frame::text(data), None, true),
            Push::AfterLastSeq(build) => (Frame::text(build(st.last_seq)), None, true),
            Push::Pong(payload) => (Frame::Pong(payload), None, true),
        };
        let len = frame_len(&frame);
        if st.bytes + len > self.limit_bytes {
            Self::overflow(st);
        } else {
            if !urgent {
                st.pace.pushed(now);
            }
            st.bytes += len;
            if let Some(seq) = seq {
                st.last_seq = st.last_seq.max(seq);
            }
            if st.gated && matches!(frame, Frame::Text { .. }) {
                st.held.push_back(frame);
            } else {
                st.urgent |= urgent;
                st.frames.push_back(frame);
            }
        }
    }

    /// The flush under the lock: returns whom to wake. `now`: the clock,
    /// if the caller has just read it.
    fn flush_locked(&self, st: &mut State, now: Option<Instant>) -> Option<Waker> {
        match Self::start_flush(st, now) {
            Flush::Done(waker) => waker,
            Flush::Write(n) => st.write_now(n),
        }
    }

    /// The first half of a flush under the lock: either nothing is written
    /// by the caller now (and whom to wake), or how many frames from the
    /// front of the queue (already uncounted) it must drain and write to
    /// the wire at once, before letting go of the lock, and then call
    /// [`State::after_direct_write`].
    fn start_flush(st: &mut State, now: Option<Instant>) -> Flush {
        if st.close.is_some() {
            // Closing (an overflow drops the queue): the socket side sends
            // the close.
            return Flush::Done(st.waker.take());
        }
        if st.frames.is_empty() {
            return Flush::Done(None);
        }
        if st.wire.is_none() {
            return Flush::Done(st.waker_for_new_frames());
        }
        if st.writing {
            // The socket side is writing and takes the rest when done.
            return Flush::Done(None);
        }
        if !st.unsent.is_empty() {
            return Flush::Done(st.waker.take());
        }
        let now = now.unwrap_or_else(Instant::now);
        let paced = !st.urgent && st.paced_until().is_some_and(|due| due > now);
        if paced {
            // The socket side keeps the deadline (woken once to set it).
            return Flush::Done(st.waker_for_new_frames());
        }
        let n = take_count(st);
        if st.frames.len() == n {
            st.urgent = false;
        }
        st.takes = st.takes.wrapping_add(1);
        st.last_write = Some(now);
        Flush::Write(n)
    }

    /// The queue passed its limit: drop it and close with
    /// [`CloseCause::Overflow`].
    fn overflow(st: &mut State) -> Option<Waker> {
        st.frames.clear();
        st.held.clear();
        st.bytes = 0;
        st.reply_bytes = 0;
        st.close = Some(CloseCause::Overflow);
        st.waker.take()
    }

    /// Hold later pushes until [`Outbound::ungate_with`], so a reply built
    /// meanwhile (a snapshot) reaches the client before envelopes after it.
    pub fn gate(&self) {
        self.state.lock().gated = true;
    }

    /// Queue `reply` (if any) and then everything held, and stop holding.
    /// The reply counts in the replies' budget, and may take it past the
    /// limit once; if the replies queued already fill it, the connection is
    /// evicted instead (a client that keeps asking without reading).
    pub fn ungate_with(&self, reply: Option<ByteString>) {
        let waker = {
            let mut st = self.state.lock();
            st.gated = false;
            if let (Some(data), None) = (reply, &st.close) {
                if st.reply_bytes >= self.limit_bytes {
                    let waker = Self::overflow(&mut st);
                    drop(st);
                    wake(waker);
                    return;
                }
                st.reply_bytes += data.len();
                st.frames.push_back(Frame::Text { data, reply: true });
                st.urgent = true;
            }
            let held = std::mem::take(&mut st.held);
            // Responses may be among the held frames: do not hold them longer.
            st.urgent |= !held.is_empty();
            st.frames.extend(held);
            self.flush_locked(&mut st, None)
        };
        wake(waker);
    }

    /// Ask the socket side to close the connection (after the frames queued
    /// so far, unless the cause is an overflow).
    pub fn close(&self, cause: CloseCause) {
        let waker = {
            let mut st = self.state.lock();
            if st.close.is_none() {
                st.close = Some(cause);
            }
            // Frames held for a reply that will not be sent now must not go
            // out without it.
            let held = std::mem::take(&mut st.held);
            st.bytes -= held.iter().map(counted_len).sum::<usize>();
            st.waker.take()
        };
        wake(waker);
    }

    /// Take everything queued, or register `cx` to be woken when there is
    /// something. With `pace`, queued frames wait for the caller's pacing
    /// deadline unless one is urgent (a reply, a pong, a close), and `cx` is
    /// woken only for an urgent one even when nothing is queued yet: the
    /// socket side keeps its own deadline.
    ///
    /// Taken frames no longer count against the limit: from here on the
    /// socket side's write buffer and the kernel hold them. While the peer
    /// does not read, that buffer does not drain, the socket side stops
    /// taking, and the queue grows until it overflows; the kernel gives up
    /// on a peer that acknowledges nothing for the idle timeout
    /// (`TCP_USER_TIMEOUT`).
    pub fn poll_take(&self, cx: &mut Context<'_>, pace: bool) -> Take {
        let mut st = self.state.lock();
        let empty = st.frames.is_empty() && st.close.is_none() && st.unsent.is_empty();
        let waits = pace && !st.urgent && st.close.is_none() && st.unsent.is_empty();
        if empty || waits {
            if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.waker = Some(cx.waker().clone());
            }
            st.pacing = pace;
            return if empty { Take::Empty } else { Take::Paced };
        }
        st.pacing = false;
        st.takes = st.takes.wrapping_add(1);
        st.writing = st.wire.is_some();
        let head = std::mem::take(&mut st.unsent);
        let frames = take_frames(&mut st);
        let more = !st.frames.is_empty();
        // A backlog is taken again at once (no pacing), so urgency only
        // needs clearing once everything has gone.
        if !more {
            st.urgent = false;
        }
        Take::Ready(Taken {
            head,
            frames,
            close: if more { None } else { st.close.clone() },
            more,
        })
    }

    /// Let pushers write to `wire` themselves (see [`Wire`]), at most once
    /// per `pacing` for frames that are not urgent (twice that under a fast
    /// stream, see [`Pace`]).
    pub fn attach(&self, wire: Arc<dyn Wire>, pacing: Duration) {
        let mut st = self.state.lock();
        st.wire = Some(wire);
        st.pace = Pace::new(pacing);
    }

    /// Until when pushed frames wait: the last write plus the pacing
    /// interval (`None`: no pacing, or nothing written yet).
    pub fn paced_until(&self) -> Option<Instant> {
        self.state.lock().paced_until()
    }

    /// The socket side finished writing what it took: pushers may write
    /// again. `backlog`: it took only part of the queue, so the pacing
    /// deadline does not start yet.
    pub fn wrote(&self, backlog: bool) {
        let mut st = self.state.lock();
        st.writing = false;
        // A backlog goes out as fast as the socket takes it.
        st.last_write = (!backlog).then(Instant::now);
    }

    /// The socket is done: nobody writes to it any more.
    pub fn detach(&self) {
        let mut st = self.state.lock();
        st.wire = None;
        st.writing = false;
        st.unsent = Bytes::new();
    }

    /// Queued bytes (for metrics and tests).
    pub fn queued_bytes(&self) -> usize {
        let st = self.state.lock();
        st.bytes + st.reply_bytes
    }

    /// Take the queued text frames (tests without a socket).
    #[cfg(test)]
    pub(crate) fn drain_for_test(&self) -> Vec<ByteString> {
        let mut st = self.state.lock();
        st.bytes = st.held.iter().map(counted_len).sum();
        st.reply_bytes = 0;
        st.frames
            .drain(..)
            .filter_map(|f| match f {
                Frame::Text { data, .. } => Some(data),
                _ => None,
            })
            .collect()
    }
}

/// Frames' room an emptied queue keeps for the next ones (a direct write
/// drains the queue in place, so a steady stream allocates nothing).
const FRAMES_KEEP: usize = 16;

/// Bytes one take carries at most (at least one frame): the rest stays
/// queued, and counted, until the socket has room again. Bounds what a
/// connection holds outside its queue to this plus the HTTP layer's buffer.
const TAKE_BUDGET: usize = 64 * 1024;

/// Take frames from the front of the queue, at most [`TAKE_BUDGET`] bytes
/// (at least one frame), uncounting them.
fn take_frames(st: &mut State) -> VecDeque<Frame> {
    let n = take_count(st);
    if n == st.frames.len() {
        std::mem::take(&mut st.frames)
    } else {
        st.frames.drain(..n).collect()
    }
}

/// How many frames from the front of the queue one take carries (at most
/// [`TAKE_BUDGET`] bytes, at least one frame), uncounted here: the caller
/// removes them.
fn take_count(st: &mut State) -> usize {
    let mut budget = TAKE_BUDGET;
    let n = st
        .frames
        .iter()
        .position(|f| {
            let len = frame_len(f);
            if len > budget {
                return true;
            }
            budget -= len;
            false
        })
        .unwrap_or(st.frames.len())
        .max(1)
        .min(st.frames.len());
    let taken = st.frames.range(..n);
    st.bytes -= taken.clone().map(counted_len).sum::<usize>();
    st.reply_bytes -= taken.clone().map(reply_len).sum::<usize>();
    st.text_since_beat |= taken.into_iter().any(|f| matches!(f, Frame::Text { .. }));
    n
}

fn wake(waker: Option<Waker>) {
    if let Some(w) = waker {
        w.wake();
    }
}

#[cfg(test)]
pub(crate) mod tests;
