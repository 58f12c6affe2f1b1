//! What a connection's queue holds: frames, how each is counted against
//! the byte limits, what the socket side takes, and why a socket closes.

use std::collections::VecDeque;

use bytes::Bytes;
use bytestring::ByteString;

use crate::ids::ServerSeq;

/// Why a connection's socket must close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseCause {
    /// The client read too slowly and its queue passed the byte limit.
    Overflow,
    /// A policy violation that leaves no id to answer (an idle client).
    Protocol(String),
    /// A frame or message over the size limit.
    TooLarge(String),
    /// A malformed WebSocket frame.
    Malformed(String),
    /// A text message that is not UTF-8.
    InvalidText(String),
    /// The connection ended on the server's side.
    Normal,
    /// The client sent a close frame with this code (echoed back).
    ClientClosed(Option<u16>),
    /// The server is going away.
    Shutdown,
    /// The connection's token expired while it was open.
    TokenExpired,
    /// The invite link the connection came in through was revoked or
    /// expired (the reason says which).
    InviteEnded(&'static str),
}

/// One queued frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A text frame (JSON-RPC).
    Text {
        /// The text to write.
        data: ByteString,
        /// A reply counted in the replies' budget rather than the pushed
        /// frames'.
        reply: bool,
    },
    /// A ping (heartbeat).
    Ping,
    /// A pong answering the client's ping with its payload.
    Pong(Bytes),
}

impl Frame {
    /// A pushed text frame (counted in the pushed frames' budget).
    pub(super) fn text(data: ByteString) -> Self {
        Frame::Text { data, reply: false }
    }
}

/// What the socket side took from the queue: frames to write in order, then,
/// if set, the close to send.
#[derive(Debug, Default)]
pub struct Taken {
    /// Bytes already encoded that a direct write left unsent: they go
    /// first.
    pub head: Bytes,
    /// Frames to write, in order.
    pub frames: VecDeque<Frame>,
    /// Close the socket for this cause after the frames.
    pub close: Option<CloseCause>,
    /// More frames are queued than one take carries: take again as soon as
    /// the socket has room (no pacing for a backlog).
    pub more: bool,
}

/// The outcome of [`Outbound::poll_take`](super::Outbound::poll_take).
#[derive(Debug)]
pub enum Take {
    /// Everything queued, to write now.
    Ready(Taken),
    /// Nothing queued: woken on the next push (the next urgent one when
    /// pacing).
    Empty,
    /// Frames are queued but none is urgent, and the caller is pacing its
    /// writes: they wait for its deadline, and it is woken only for an
    /// urgent frame (the caller keeps its own timer).
    Paced,
}

/// What a pushed frame is, which says how it is counted and whether it
/// waits for the socket side's pacing deadline.
pub enum Push<'a> {
    /// Another connection's action envelope carrying `serverSeq` `seq`:
    /// counted, paced.
    Envelope(ServerSeq, ByteString),
    /// The envelope of this connection's own action, carrying `seq`: the
    /// client waits for it, so it is urgent.
    Echo(ServerSeq, ByteString),
    /// A notification to every subscriber: counted, paced.
    Notification(ByteString),
    /// A frame the client is waiting for (the response to one of its
    /// requests, a notification addressed to it alone), in order with the
    /// frames pushed before it: counted, urgent.
    Response(ByteString),
    /// A response built from the last `serverSeq` pushed here (rejection
    /// echoes carry it), atomically with reading it: counted, urgent.
    AfterLastSeq(&'a dyn Fn(ServerSeq) -> ByteString),
    /// A pong answering the client's ping with its payload: counted (a
    /// client that pings and never reads is evicted like any other), urgent.
    Pong(Bytes),
}

pub(crate) fn frame_len(f: &Frame) -> usize {
    match f {
        Frame::Text { data, .. } => data.len(),
        Frame::Ping => 0,
        Frame::Pong(p) => p.len(),
    }
}

/// Bytes of `f` in the pushed frames' budget.
pub(super) fn counted_len(f: &Frame) -> usize {
    match f {
        Frame::Text { reply: true, .. } => 0,
        f => frame_len(f),
    }
}

/// Bytes of `f` in the replies' budget.
pub(super) fn reply_len(f: &Frame) -> usize {
    match f {
        Frame::Text { data, reply: true } => data.len(),
        _ => 0,
    }
}
