//! Whether a connection's client is still there: the time of its last
//! frame, the heartbeat's pings, the close of an idle client, and letting
//! go of a closing connection whose socket takes nothing.

use std::sync::atomic::Ordering;

use super::{wake, CloseCause, Frame, Outbound};

/// Milliseconds since the Unix epoch (activity stamps).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the heartbeat found on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// A ping was queued.
    Pinged,
    /// The client sent nothing for longer than the idle timeout: closing.
    Idle,
    /// Already closing.
    Closing,
    /// Closing, and for `abandon_beats` heartbeats in a row the socket took
    /// nothing (its peer neither reads nor goes away): the connection is let
    /// go ([`Outbound::set_on_abandon`]).
    Abandoned,
}

impl Outbound {
    /// The client sent a frame just now.
    pub fn received(&self) {
        self.last_rx_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// What to do when the connection is abandoned (see [`Beat::Abandoned`]).
    pub fn set_on_abandon(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_abandon.set(Box::new(f));
    }

    /// The heartbeat, once per interval: close a connection whose client sent
    /// nothing for `idle_timeout_ms`, let go of a closing one whose socket
    /// took nothing for `abandon_beats` intervals, otherwise queue a ping
    /// ahead of everything else.
    ///
    /// A peer that stopped reading is not judged here: a slow reader draining
    /// a large reply takes nothing for a long while and is still healthy.
    /// The byte limit evicts a reader that falls too far behind, and the
    /// kernel drops one that acknowledges nothing (`TCP_USER_TIMEOUT`).
    pub fn beat(&self, idle_timeout_ms: u64, abandon_beats: u32) -> Beat {
        let idle_ms = now_ms().saturating_sub(self.last_rx_ms.load(Ordering::Relaxed));
        let (beat, waker) = {
            let mut st = self.state.lock();
            let progressed = st.takes != st.seen_takes;
            st.seen_takes = st.takes;
            if st.close.is_some() {
                // Only a close the socket makes no progress towards counts:
                // a peer still draining what came before it is alive.
                st.stalled_beats = if progressed { 0 } else { st.stalled_beats + 1 };
                if st.stalled_beats != abandon_beats.max(1) {
                    return Beat::Closing;
                }
                drop(st);
                if let Some(abandon) = self.on_abandon.get() {
                    abandon();
                }
                return Beat::Abandoned;
            }
            if idle_ms > idle_timeout_ms {
                st.close = Some(CloseCause::Protocol(format!(
                    "idle for {idle_ms} ms without any frame"
                )));
                (Beat::Idle, st.waker.take())
            } else if matches!(st.frames.front(), Some(Frame::Ping)) {
                // The last ping has not gone out yet: one is enough.
                (Beat::Pinged, None)
            } else {
                // Control frames may go between messages: the ping goes
                // ahead of any backlog, so a client draining a large reply
                // still sees it and answers before the idle timeout. It
                // rides with the next paced write (a burst of a ping per
                // connection at once would cost a write each).
                st.frames.push_front(Frame::Ping);
                (Beat::Pinged, st.waker_for_new_frames())
            }
        };
        wake(waker);
        beat
    }
}
