//! A connection's outbound queue, bounded in bytes.
//!
//! Publishers (chat, session and root actors) push frames without ever
//! awaiting; the connection's writer task pops them and awaits the socket.
//! When the queued bytes of *pushed* frames (envelopes, notifications) would
//! pass the limit the connection is marked for eviction: the queue is dropped
//! and the writer closes the socket with a reason. The client recovers
//! everything with `reconnect` (invariant 5).
//!
//! Replies to the client's own requests are not counted against the limit:
//! the client asked for them, and a `reconnect` replay after an eviction is
//! by construction larger than the limit that evicted it.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytestring::ByteString;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Identifies one WebSocket connection for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Why a connection's writer must close the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseCause {
    /// The client read too slowly and its queue passed the byte limit.
    Overflow,
    /// A protocol violation that leaves no id to answer (e.g. oversize frame).
    Protocol(String),
    /// The server is going away.
    Shutdown,
}

/// A queued frame and whether it counts against the limit.
pub struct Frame {
    /// The text to write.
    pub data: ByteString,
    /// Counted in `bytes` (pushed, not a reply).
    counted: bool,
}

struct State {
    frames: VecDeque<Frame>,
    /// Bytes of counted frames in `frames` and `held`, plus the counted frame
    /// the writer is sending.
    bytes: usize,
    /// Highest `serverSeq` pushed to this connection.
    last_seq: u64,
    /// While true, pushes go to `held` so a reply can be queued before them.
    gated: bool,
    held: VecDeque<Frame>,
    close: Option<CloseCause>,
}

/// One connection's outbound frames, in the order they must be written.
pub struct Outbound {
    id: ConnId,
    limit_bytes: usize,
    /// Sessions this connection may see (`None`: all); filters session-scoped
    /// notifications such as `root/sessionAdded`.
    scope: Option<Arc<HashSet<String>>>,
    state: Mutex<State>,
    wake: Notify,
}

/// What the writer should do next.
pub enum Next {
    /// Write this frame, then hand it back to [`Outbound::sent`].
    Frame(Frame),
    /// Close the socket for this cause.
    Close(CloseCause),
}

impl Outbound {
    /// A fresh queue allowing `limit_bytes` of unsent frames.
    pub fn new(limit_bytes: usize) -> Self {
        Self::scoped(limit_bytes, None)
    }

    /// A queue for a connection limited to `scope` sessions.
    pub fn scoped(limit_bytes: usize, scope: Option<Arc<HashSet<String>>>) -> Self {
        Self {
            id: ConnId(NEXT_CONN.fetch_add(1, Ordering::Relaxed)),
            limit_bytes,
            scope,
            state: Mutex::new(State {
                frames: VecDeque::new(),
                bytes: 0,
                last_seq: 0,
                gated: false,
                held: VecDeque::new(),
                close: None,
            }),
            wake: Notify::new(),
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

    /// Highest `serverSeq` pushed so far.
    pub fn last_seq(&self) -> u64 {
        self.state.lock().last_seq
    }

    /// Whether the connection has been told to close.
    pub fn is_closing(&self) -> bool {
        self.state.lock().close.is_some()
    }

    fn push_locked(&self, st: &mut State, frame: ByteString) -> bool {
        if st.close.is_some() {
            return false;
        }
        if st.bytes + frame.len() > self.limit_bytes {
            st.frames.clear();
            st.held.clear();
            st.close = Some(CloseCause::Overflow);
            self.wake.notify_one();
            return false;
        }
        st.bytes += frame.len();
        let frame = Frame {
            data: frame,
            counted: true,
        };
        if st.gated {
            st.held.push_back(frame);
        } else {
            st.frames.push_back(frame);
            self.wake.notify_one();
        }
        true
    }

    /// Push an action envelope frame carrying `seq`.
    pub fn push_envelope(&self, seq: u64, frame: ByteString) {
        let mut st = self.state.lock();
        if self.push_locked(&mut st, frame) {
            st.last_seq = st.last_seq.max(seq);
        }
    }

    /// Push a notification frame (counted against the limit).
    pub fn push_frame(&self, frame: ByteString) {
        let mut st = self.state.lock();
        self.push_locked(&mut st, frame);
    }

    /// Queue a reply to one of the client's requests (not counted).
    pub fn push_reply(&self, frame: ByteString) {
        let mut st = self.state.lock();
        if st.close.is_some() {
            return;
        }
        st.frames.push_back(Frame {
            data: frame,
            counted: false,
        });
        self.wake.notify_one();
    }

    /// Push a frame built from the last `serverSeq` sent here (rejection echoes
    /// carry it), atomically with reading it.
    pub fn push_with_last_seq(&self, build: impl FnOnce(u64) -> ByteString) {
        let mut st = self.state.lock();
        let frame = build(st.last_seq);
        self.push_locked(&mut st, frame);
    }

    /// Hold later pushes until [`Outbound::ungate_with`], so a reply built
    /// meanwhile (a snapshot) reaches the client before envelopes after it.
    pub fn gate(&self) {
        self.state.lock().gated = true;
    }

    /// Queue `reply` (if any, not counted) and then everything held, and stop
    /// holding.
    pub fn ungate_with(&self, reply: Option<ByteString>) {
        let mut st = self.state.lock();
        st.gated = false;
        if let (Some(reply), None) = (reply, &st.close) {
            st.frames.push_back(Frame {
                data: reply,
                counted: false,
            });
        }
        let held = std::mem::take(&mut st.held);
        st.frames.extend(held);
        self.wake.notify_one();
    }

    /// Ask the writer to close the socket.
    pub fn close(&self, cause: CloseCause) {
        let mut st = self.state.lock();
        if st.close.is_none() {
            st.close = Some(cause);
        }
        self.wake.notify_one();
    }

    /// Wait for the next frame to write, or the close cause. Frames queued
    /// before a close (other than overflow, which drops them) are written first.
    pub async fn next(&self) -> Next {
        loop {
            {
                let mut st = self.state.lock();
                if let Some(cause) = &st.close {
                    if *cause == CloseCause::Overflow || st.frames.is_empty() {
                        return Next::Close(cause.clone());
                    }
                }
                if let Some(f) = st.frames.pop_front() {
                    return Next::Frame(f);
                }
            }
            self.wake.notified().await;
        }
    }

    /// Resolves once the connection is evicted for overflow (the writer uses
    /// this to stop waiting on a socket whose peer stopped reading).
    pub async fn evicted(&self) {
        loop {
            if self.state.lock().close == Some(CloseCause::Overflow) {
                return;
            }
            self.wake.notified().await;
        }
    }

    /// The writer finished with a frame (written or dropped).
    pub fn sent(&self, frame: &Frame) {
        if frame.counted {
            let mut st = self.state.lock();
            st.bytes = st.bytes.saturating_sub(frame.data.len());
        }
    }

    /// Queued bytes (for metrics and tests).
    pub fn queued_bytes(&self) -> usize {
        self.state.lock().bytes
    }

    #[cfg(test)]
    pub(crate) fn drain_for_test(&self) -> Vec<ByteString> {
        let mut st = self.state.lock();
        st.bytes = 0;
        st.frames.drain(..).map(|f| f.data).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_drops_the_queue_and_marks_close() {
        let o = Outbound::new(10);
        o.push_frame("12345".into());
        o.push_frame("12345".into());
        assert!(!o.is_closing());
        o.push_frame("x".into());
        assert!(o.is_closing());
        assert_eq!(
            o.queued_bytes(),
            10,
            "bytes stay counted until the writer closes"
        );
    }

    #[test]
    fn gate_puts_the_reply_before_held_frames() {
        let o = Outbound::new(1000);
        o.push_frame("a".into());
        o.gate();
        o.push_envelope(5, "env".into());
        o.ungate_with(Some("reply".into()));
        let frames: Vec<String> = o.drain_for_test().iter().map(|f| f.to_string()).collect();
        assert_eq!(frames, ["a", "reply", "env"]);
        assert_eq!(o.last_seq(), 5);
    }

    #[test]
    fn replies_do_not_count_against_the_limit() {
        let o = Outbound::new(10);
        o.push_reply(ByteString::from("a reply far larger than ten bytes"));
        assert!(!o.is_closing());
        assert_eq!(o.queued_bytes(), 0);
        o.gate();
        o.push_envelope(1, "12345".into());
        o.ungate_with(Some("another long reply".into()));
        assert!(!o.is_closing());
        assert_eq!(o.queued_bytes(), 5);
    }

    #[tokio::test]
    async fn writer_sees_frames_then_close() {
        let o = Outbound::new(1000);
        o.push_frame("a".into());
        o.close(CloseCause::Shutdown);
        match o.next().await {
            Next::Frame(f) => {
                assert_eq!(&*f.data, "a");
                o.sent(&f);
            }
            Next::Close(_) => panic!("frame first"),
        }
        assert!(matches!(o.next().await, Next::Close(CloseCause::Shutdown)));
    }
}
