//! The transport: everything between a TCP socket and an AHP message.
//!
//! Above this module a connection is an [`Outbound`] queue to push frames
//! to and an [`Inbound`] stream of the client's messages; nothing above it
//! speaks of WebSocket framing, sockets, system calls or TLS. What lives
//! here:
//!
//! | module | job |
//! |---|---|
//! | [`listen`] | the listening socket (a deep accept backlog) and each accepted socket's options |
//! | `socket` | the upgraded TCP stream taken over from the HTTP/1 dispatcher ([`Upgraded`]): direct writes, the writer task with its pacing, the reader, the linger after a close |
//! | `inbound` | the client's frames: decoded, reassembled, within the frame limit |
//! | `outbound` | a connection's queue, bounded in bytes: direct writes by the pusher, pacing, liveness (pings, idle close), io_uring batches of many connections' writes |
//! | `fanout` | one envelope written to a big room from several threads |
//! | `heartbeat` | the task that looks at every connection once per interval |
//! | `close` | close frames: code and reason for each [`CloseCause`] |
//! | [`tls`] | `--tls-cert` / `--tls-key`: TLS ended in front of the HTTP server |
//!
//! The transport knows no actor, channel or session: a connection's
//! owner hears that its socket is done through a callback ([`OnGone`]), and
//! bytes and closes are counted through [`Meter`]. It uses nothing of the
//! crate but [`crate::ids`].

mod close;
mod fanout;
mod heartbeat;
mod inbound;
pub mod listen;
mod outbound;
mod socket;
pub mod tls;

pub(crate) use close::cause_name;
#[cfg(test)]
pub(crate) use close::close_reason;
pub(crate) use fanout::Fanout;
pub use heartbeat::heartbeat;
pub use inbound::{Inbound, ReadError, Received};
#[cfg(test)]
pub(crate) use outbound::Wire;
pub use outbound::{Beat, CloseCause, FlushOnDrop, Outbound, Push};
#[cfg(test)]
pub(crate) use outbound::{Frame, Take};
pub use socket::{OnGone, Upgraded};

#[cfg(test)]
pub(crate) use fanout::{
    shares as fanout_shares, MAX_BACKLOG as FANOUT_MAX_BACKLOG, MIN_SHARE as FANOUT_MIN_SHARE,
};
#[cfg(test)]
pub(crate) use outbound::tests::FakeWire;

/// What the transport counts: bytes written to sockets and connections
/// closed, by cause (the server's metrics implement it).
pub trait Meter: Send + Sync {
    /// `bytes` went to a socket.
    fn sent(&self, bytes: u64);
    /// A connection's close was written, or it ended without it, for
    /// `cause`.
    fn closed(&self, cause: &CloseCause);
}
