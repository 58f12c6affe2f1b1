//! Channel actors — root, one per session, one per chat — and the registry
//! that finds them by URI.
//!
//! Each actor owns its channel's state and is the only writer of it: it
//! validates an action, reduces it with the official `ahp::reducers`, hands it
//! to the journal, and only once the journal has it publishes it (through
//! [`crate::publish::Publisher`]) to every subscriber. That path is written
//! once, in [`commit`], for all three kinds of channel.
//!
//! Agents are reached through [`agent`]: the traits the chat calls, which
//! `providers` implements.

pub(crate) mod access;
pub(crate) mod addr;
pub(crate) mod agent;
pub mod audit;
pub(crate) mod chat;
pub(crate) mod commit;
pub(crate) mod context;
pub(crate) mod core;
pub(crate) mod following;
pub(crate) mod forward;
pub(crate) mod homes;
pub(crate) mod recovery;
pub(crate) mod reduce;
pub(crate) mod registry;
pub(crate) mod rollup;
pub(crate) mod root;
pub(crate) mod session;
pub mod validate;

#[cfg(test)]
mod follow_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
pub(crate) mod testing;

use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};

use crate::ids::ServerSeq;
use crate::protocol::RpcError;
use crate::transport::{FlushOnDrop, Outbound};

pub use registry::{Channel, ChannelAddr, Registry};
pub use validate::Rejection;

/// Who dispatched a client's action, and so who hears of its fate.
#[derive(Clone)]
pub enum Dispatcher {
    /// A connection of this node: its echo, or its rejection, is a frame on
    /// it.
    Conn(DispatchConn),
    /// A client of another node of the cluster, which forwarded the
    /// dispatch here: the outcome goes back in the forward's answer (the
    /// client's echo reaches it through that node's copy of the channel).
    Forwarded(ForwardedReply),
}

/// The answer to a forwarded dispatch: `Ok` once published, or the
/// rejection's reason. Answered once; later answers are dropped.
#[derive(Clone)]
pub struct ForwardedReply(Arc<parking_lot::Mutex<Option<ReplySender>>>);

/// Where a forwarded dispatch's outcome goes.
type ReplySender = tokio::sync::oneshot::Sender<Result<(), String>>;

impl ForwardedReply {
    /// A reply and where its answer arrives.
    pub fn new() -> (Self, tokio::sync::oneshot::Receiver<Result<(), String>>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Self(Arc::new(parking_lot::Mutex::new(Some(tx)))), rx)
    }

    /// Answer (the first answer counts).
    pub fn answer(&self, outcome: Result<(), String>) {
        if let Some(tx) = self.0.lock().take() {
            let _ = tx.send(outcome);
        }
    }
}

/// A connection of this node that dispatched an action, with its
/// `dispatchAction` reply: queued, and held back until the action's echo or
/// rejection is written on the connection (they leave in one write), or
/// until the last copy of this is dropped, whatever became of the action.
#[derive(Clone)]
pub struct DispatchConn {
    /// The connection.
    pub out: Arc<Outbound>,
    /// Its held reply, if the dispatch asked for one.
    _reply: Option<Arc<FlushOnDrop>>,
}

impl DispatchConn {
    /// `out`, holding `reply` back as long as the dispatch travels.
    pub fn new(out: Arc<Outbound>, reply: Option<FlushOnDrop>) -> Self {
        Self {
            out,
            _reply: reply.map(Arc::new),
        }
    }
}

impl From<Arc<Outbound>> for DispatchConn {
    /// A dispatch without a reply to hold.
    fn from(out: Arc<Outbound>) -> Self {
        Self::new(out, None)
    }
}

impl Dispatcher {
    /// The dispatcher's connection, when it is one of this node's.
    pub fn conn(&self) -> Option<&Arc<Outbound>> {
        match self {
            Dispatcher::Conn(c) => Some(&c.out),
            Dispatcher::Forwarded(_) => None,
        }
    }
}

/// A client's `dispatchAction` routed to the channel's actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClientDispatch {
    /// The dispatcher: gets its echo, or the rejection.
    pub conn: Dispatcher,
    /// `clientId` + `clientSeq` of the dispatch.
    pub origin: ActionOrigin,
    /// The action as decoded.
    pub action: StateAction,
    /// The dispatcher is the connection of the session's provider: the action
    /// is checked as an agent's (server-side actions allowed) not a client's.
    pub as_agent: bool,
    /// The person who sent it (`None`: an agent), as the record names them.
    pub by: Option<crate::people::Person>,
}

/// Subscribe a connection. The actor registers it under the publisher lock and
/// returns its snapshot; the connection holds later frames until the reply
/// with the snapshot is queued.
#[derive(Message)]
#[rtype(result = "Result<SnapshotJson, RpcError>")]
pub struct Subscribe {
    /// The subscribing connection.
    pub conn: Arc<Outbound>,
    /// `view.turns` from the request, if any.
    pub view_turns: Option<i64>,
}

/// A batch another node of the cluster appended to the channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replicate(pub crate::store::Replicated);

/// A copy of a channel started from the store at journal position `.0`:
/// read it again, since batches read from the stream meanwhile may be
/// counted but not applied.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resync(pub crate::ids::JournalPos);

/// This node hands the channel over to another node: it follows it from
/// now on (its state is the store's already).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Demote;

/// Someone on this node needs the channel's state (a take-over, or a
/// subscriber): a copy that let the owner's batches pass reads the
/// channel from the store and applies them again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Warm;

/// Whether a turn runs in the chat now (a session or the root: never).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Busy;

/// This node took the channel over (its owner went away).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Promote;

/// A serialized `Snapshot`.
#[derive(Debug, Clone)]
pub struct SnapshotJson(pub String);

impl SnapshotJson {
    /// Build the `Snapshot` object from its parts.
    pub fn new(resource: &str, state_json: &str, from_seq: ServerSeq) -> Self {
        let resource = serde_json::to_string(resource).unwrap_or_else(|_| "\"\"".into());
        SnapshotJson(format!(
            "{{\"resource\":{resource},\"state\":{state_json},\"fromSeq\":{from_seq}}}"
        ))
    }
}
