//! The WebSocket itself, on actix-http's HTTP/1 dispatcher.
//!
//! The upgrade response's body is [`OutBody`]: when the dispatcher has room
//! in its write buffer it polls the body, which takes *everything* queued on
//! the connection's [`Outbound`] and encodes it into one chunk, so a burst of
//! envelopes costs one wake-up and one socket write per connection. No task
//! or channel sits between the publishers and the socket. Writes are paced:
//! on a connection written less than `--write-pacing-ms` ago, pushed frames
//! wait until that much time has passed, so under a heavy stream they go
//! out several per write (replies, pongs and closes never wait). Frames from
//! the client arrive through [`super::inbound::Inbound`]. One [`heartbeat`]
//! task pings every connection,
//! closes the idle ones and lets go of those whose close cannot be written.
//!
//! The socket knows nothing of the connection actor above it: it is handed
//! an [`OnGone`] callback to call once the socket is done.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use actix_http::body::{BodySize, MessageBody};
use actix_http::ws::{CloseCode, CloseReason, OpCode, Parser};
use bytes::{Bytes, BytesMut};
use tokio::time::Sleep;

use super::admission::Connections;
use crate::publish::outbound::{Beat, CloseCause, Frame, Outbound, Take, Taken};

/// RFC 6455: a close frame's reason is at most 123 bytes (strict clients
/// such as Chromium fail the connection on longer ones).
const MAX_CLOSE_REASON: usize = 123;

/// The close code for an expired token: in the range RFC 6455 leaves to
/// applications, and mirroring HTTP 401 so a client can tell it from other
/// policy closes (1008) — reconnecting with the same token would be refused.
pub const TOKEN_EXPIRED_CLOSE_CODE: u16 = 4401;

/// The close reason sent with [`TOKEN_EXPIRED_CLOSE_CODE`].
pub const TOKEN_EXPIRED_REASON: &str = "token expired: reconnect with a fresh token";

/// Whether a close code may be sent (1005, 1006, 1015 and unassigned ranges
/// may not).
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The close frame for `cause`.
pub fn close_reason(cause: &CloseCause) -> CloseReason {
    let (code, text) = match cause {
        CloseCause::Overflow => (
            CloseCode::Policy,
            "outbound buffer overflow: the client read too slowly; reconnect to resume".to_owned(),
        ),
        CloseCause::Protocol(msg) => (CloseCode::Policy, msg.clone()),
        CloseCause::TooLarge(msg) => (CloseCode::Size, msg.clone()),
        CloseCause::Malformed(msg) => (CloseCode::Protocol, msg.clone()),
        CloseCause::InvalidText(msg) => (CloseCode::Invalid, msg.clone()),
        CloseCause::Normal => (CloseCode::Normal, String::new()),
        // RFC 6455 §5.5.1: echo the client's code, unless it is one that
        // must not appear on the wire.
        CloseCause::ClientClosed(Some(code)) if sendable(*code) => {
            (CloseCode::from(*code), String::new())
        }
        CloseCause::ClientClosed(_) => (CloseCode::Normal, String::new()),
        CloseCause::Shutdown => (CloseCode::Away, "server shutting down".to_owned()),
        CloseCause::TokenExpired => (
            CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE),
            TOKEN_EXPIRED_REASON.to_owned(),
        ),
    };
    let mut text = text;
    if text.len() > MAX_CLOSE_REASON {
        let mut end = MAX_CLOSE_REASON;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    CloseReason {
        code,
        description: (!text.is_empty()).then_some(text),
    }
}

/// Called once when the socket is done (closed by us, by the peer, or
/// failed), so whoever serves the connection lets it go.
pub type OnGone = Box<dyn FnOnce()>;

/// The upgrade response's body: the connection's outbound frames.
pub struct OutBody {
    out: Arc<Outbound>,
    /// Taken (and called) when the body is dropped.
    on_gone: Option<OnGone>,
    /// The close frame has been written.
    closed: bool,
    /// Least time between two writes of pushed frames (zero: no pacing).
    pacing: Duration,
    /// When frames were last taken.
    last_write: Option<Instant>,
    /// The pacing deadline's timer, kept once a connection has needed one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl OutBody {
    /// The body writing `out`, at most one write of pushed frames per
    /// `pacing`; `on_gone` is called once the socket is done.
    pub fn new(out: Arc<Outbound>, on_gone: OnGone, pacing: Duration) -> Self {
        Self {
            out,
            on_gone: Some(on_gone),
            closed: false,
            pacing,
            last_write: None,
            timer: None,
        }
    }

    /// Take what is queued; pushed frames wait for the pacing deadline.
    /// Within the pacing window only the timer (or an urgent frame) wakes
    /// the socket, so a busy connection costs one wake-up per write.
    fn poll_take(&mut self, cx: &mut Context<'_>) -> Poll<Taken> {
        let mut passed = false;
        loop {
            let due = self
                .last_write
                .map(|t| t + self.pacing)
                .filter(|due| !passed && !self.pacing.is_zero() && *due > Instant::now());
            match (self.out.poll_take(cx, due.is_some()), due) {
                (Take::Ready(taken), _) => {
                    // A backlog goes out as fast as the socket takes it.
                    self.last_write = (!taken.more).then(Instant::now);
                    return Poll::Ready(taken);
                }
                (Take::Empty, None) => return Poll::Pending,
                (Take::Empty | Take::Paced, Some(due)) => {
                    let due = due.into();
                    let timer = match self.timer.as_mut() {
                        Some(timer) => {
                            if timer.deadline() != due {
                                timer.as_mut().reset(due);
                            }
                            timer
                        }
                        None => self.timer.insert(Box::pin(tokio::time::sleep_until(due))),
                    };
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The deadline passed meanwhile: look again without pacing.
                    passed = true;
                }
                (Take::Paced, None) => unreachable!("paced only when asked to pace"),
            }
        }
    }
}

fn encoded_len(frame: &Frame) -> usize {
    let payload = match frame {
        Frame::Text { data, .. } => data.len(),
        Frame::Ping => 0,
        Frame::Pong(p) => p.len(),
    };
    payload + 10
}

impl MessageBody for OutBody {
    type Error = Infallible;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(None);
        }
        let taken = ready!(this.poll_take(cx));
        let size = taken.frames.iter().map(encoded_len).sum::<usize>() + 2 + MAX_CLOSE_REASON;
        let mut buf = BytesMut::with_capacity(size);
        for frame in taken.frames {
            match frame {
                Frame::Text { data, .. } => {
                    Parser::write_message(&mut buf, data.as_bytes(), OpCode::Text, true, false)
                }
                Frame::Ping => Parser::write_message(&mut buf, b"", OpCode::Ping, true, false),
                Frame::Pong(payload) => {
                    let payload = &payload[..payload.len().min(125)];
                    Parser::write_message(&mut buf, payload, OpCode::Pong, true, false)
                }
            }
        }
        if let Some(cause) = taken.close {
            match &cause {
                CloseCause::Shutdown | CloseCause::Normal | CloseCause::ClientClosed(_) => {
                    tracing::debug!(conn = %this.out.id(), ?cause, "closing connection")
                }
                _ => tracing::info!(conn = %this.out.id(), ?cause, "closing connection"),
            }
            Parser::write_close(&mut buf, Some(close_reason(&cause)), false);
            this.closed = true;
        }
        Poll::Ready(Some(Ok(buf.freeze())))
    }
}

impl Drop for OutBody {
    fn drop(&mut self) {
        // The socket is done (closed by us, by the peer, or failed): the
        // connection has nothing left to serve.
        self.out.close(CloseCause::Normal);
        if let Some(gone) = self.on_gone.take() {
            gone();
        }
    }
}

/// Ping every connection each `interval`; close those whose client sent
/// nothing for `idle_timeout`, and let go of those whose close could not be
/// written for as long. Runs until the server's system stops.
pub async fn heartbeat(connections: Arc<Connections>, interval: Duration, idle_timeout: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    let idle_ms = idle_timeout.as_millis() as u64;
    let abandon_beats = idle_timeout
        .as_millis()
        .div_ceil(interval.as_millis())
        .max(1) as u32;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        for c in connections.queues() {
            match c.beat(idle_ms, abandon_beats) {
                Beat::Idle => tracing::info!(conn = %c.id(), "closing an idle connection"),
                Beat::Abandoned => tracing::info!(
                    conn = %c.id(),
                    "letting go of a connection whose peer never took its close"
                ),
                Beat::Pinged | Beat::Closing => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::inbound::ReadError;
    use super::*;

    #[test]
    fn close_reasons_fit_a_control_frame() {
        let long = CloseCause::Protocol("é".repeat(200));
        let reason = close_reason(&long);
        assert!(reason.description.unwrap().len() <= MAX_CLOSE_REASON);
        assert_eq!(
            close_reason(&ReadError::TooLarge(10).close_cause()).code,
            CloseCode::Size
        );
        assert_eq!(
            close_reason(&ReadError::Protocol("x".into()).close_cause()).code,
            CloseCode::Protocol
        );
        assert_eq!(close_reason(&CloseCause::Shutdown).code, CloseCode::Away);
        let expired = close_reason(&CloseCause::TokenExpired);
        assert_eq!(expired.code, CloseCode::Other(TOKEN_EXPIRED_CLOSE_CODE));
        assert!(expired
            .description
            .is_some_and(|d| d.len() <= MAX_CLOSE_REASON));
        assert_eq!(close_reason(&CloseCause::Normal).description, None);
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(4001))).code,
            CloseCode::Other(4001)
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(Some(1005))).code,
            CloseCode::Normal
        );
        assert_eq!(
            close_reason(&CloseCause::ClientClosed(None)).code,
            CloseCode::Normal
        );
    }
}
