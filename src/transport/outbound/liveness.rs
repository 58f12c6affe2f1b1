//! Whether a connection's client is still there: the time of its last
//! frame, the heartbeat's pings, the close of an idle client, and letting
//! go of a closing connection whose socket takes nothing.

use std::sync::atomic::Ordering;

use super::{wake, CloseCause, Frame, Outbound};

/// What the heartbeat found on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// A ping was queued.
    Pinged,
    /// Frames went out since the last beat and the client's TCP has
    /// acknowledged within the interval: it is there, no ping needed.
    Acknowledged,
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
    /// Milliseconds since this queue was made, on the runtime's clock
    /// (activity stamps). The runtime's, not the wall's: a step of the
    /// wall clock must not make every connection look idle, and tests
    /// pause it.
    pub(super) fn now_ms(&self) -> u64 {
        tokio::time::Instant::now()
            .saturating_duration_since(self.born)
            .as_millis() as u64
    }

    /// The client sent a frame just now.
    pub fn received(&self) {
        self.last_rx_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// What to do when the connection is abandoned (see [`Beat::Abandoned`]).
    pub fn set_on_abandon(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_abandon.set(Box::new(f));
    }

    /// The heartbeat, once per `interval_ms`: close a connection whose client
    /// showed no sign of life for `idle_timeout_ms`, let go of a closing one
    /// whose socket took nothing for `abandon_beats` intervals, otherwise
    /// queue a ping ahead of everything else.
    ///
    /// A sign of life is a frame from the client, or — on a connection the
    /// server wrote text frames to since the last beat — its TCP
    /// acknowledging something within the interval. A subscriber that only
    /// listens to a busy chat then costs no ping and no pong (browsers
    /// answer pings below the page anyway, so a pong says no more about the
    /// application than an acknowledgement); a client that only gets pings
    /// must answer them. A client whose application stopped reading is not
    /// kept by its kernel's acknowledgements for long: its window fills and
    /// the byte limit evicts it.
    ///
    /// A peer that stopped reading is not judged here: a slow reader draining
    /// a large reply takes nothing for a long while and is still healthy.
    /// The byte limit evicts a reader that falls too far behind, and the
    /// kernel drops one that acknowledges nothing (`TCP_USER_TIMEOUT`).
    pub fn beat(&self, idle_timeout_ms: u64, abandon_beats: u32, interval_ms: u64) -> Beat {
        let acked_wire = {
            let mut st = self.state.lock();
            let sent = std::mem::take(&mut st.text_since_beat);
            st.wire.clone().filter(|_| sent && st.close.is_none())
        };
        // Asked outside the lock: a system call.
        if acked_wire
            .and_then(|w| w.last_ack_age_ms())
            .is_some_and(|age| age <= interval_ms)
        {
            self.received();
            return Beat::Acknowledged;
        }
        let idle_ms = self
            .now_ms()
            .saturating_sub(self.last_rx_ms.load(Ordering::Relaxed));
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
