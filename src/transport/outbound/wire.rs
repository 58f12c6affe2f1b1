//! Frames on the wire: server WebSocket framing, and the direct write a
//! pusher makes to a connection's socket ([`Wire`]).

use std::collections::VecDeque;

use actix_http::ws::{OpCode, Parser};
use bytes::{Bytes, BytesMut};

use super::{frame_len, Frame};

/// A connection's socket, written by whoever pushes a frame when nothing
/// else is being written to it: a frame to a waiting subscriber then costs
/// one `write` on the publisher's thread, with no task to wake and no
/// buffer to copy it through. The socket side (which owns the socket and
/// waits for room when it is full) writes everything else.
pub trait Wire: Send + Sync {
    /// Write as much of `buf` as the socket takes now, without waiting.
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize>;

    /// The socket's descriptor, for a write batched with other connections'
    /// in one system call (`None`: written through [`Wire::try_write`]).
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// `n` bytes went to the socket by a batched write (for its metrics).
    fn sent(&self, _n: usize) {}

    /// Milliseconds since the client's TCP last acknowledged anything, where
    /// the socket can tell.
    fn last_ack_age_ms(&self) -> Option<u64> {
        None
    }
}

/// Capacity of the per-thread encoding buffer kept between direct writes.
const SCRATCH_KEEP: usize = 256 * 1024;

thread_local! {
    /// Frames encoded for a direct write (one per thread, reused).
    static SCRATCH: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Encode `frames` and write them to `wire` now; what the socket did not
/// take (empty when it took everything). A write that would block or
/// failed leaves it all: the socket side writes it and finds out.
pub(super) fn write_now(wire: &dyn Wire, frames: impl IntoIterator<Item = Frame>) -> Bytes {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        encode_frames(buf, frames);
        let written: usize = wire.try_write(buf).unwrap_or_default();
        let unsent = if written < buf.len() {
            Bytes::copy_from_slice(&buf[written..])
        } else {
            Bytes::new()
        };
        if buf.capacity() > SCRATCH_KEEP {
            *buf = BytesMut::new();
        }
        unsent
    })
}

/// Bytes of `frames` on the wire, at most (headers included).
pub fn encoded_len(frames: &VecDeque<Frame>) -> usize {
    frames.iter().map(|f| frame_len(f) + 10).sum()
}

/// Append `frames` to `buf` as server WebSocket frames (unmasked; each
/// reserves its own room).
pub fn encode_frames(buf: &mut BytesMut, frames: impl IntoIterator<Item = Frame>) {
    for frame in frames {
        match frame {
            Frame::Text { data, .. } => {
                Parser::write_message(buf, data.as_bytes(), OpCode::Text, true, false)
            }
            Frame::Ping => Parser::write_message(buf, b"", OpCode::Ping, true, false),
            Frame::Pong(payload) => {
                let payload = &payload[..payload.len().min(125)];
                Parser::write_message(buf, payload, OpCode::Pong, true, false)
            }
        }
    }
}
