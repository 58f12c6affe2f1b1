//! The cluster side of the journal seam: what a node learns from, and asks
//! of, the other nodes that share its journal.
//!
//! Every channel is written by one node at a time, its *owner* (a lease in
//! the shared store, see [`super::jetstream::lease`]). Every other node
//! keeps a *follower* copy of the channel: it applies the batches the owner
//! appends (read back from the shared journal, so only what is durable) and
//! publishes them to its own subscribers, and it forwards its clients'
//! commands to the owner ([`ClusterLink::forward`]). When an owner goes
//! away, a follower takes its channels over ([`ClusterLink::take_over`]).
//!
//! A single node (SQLite, memory) has no link: it owns everything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ahp_types::actions::ActionOrigin;

use super::{JournalError, Record};
use crate::ids::{ChannelUri, JournalPos};

/// A boxed future of the link.
pub type LinkFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A batch some node appended to a channel, as read from the shared journal.
#[derive(Debug, Clone)]
pub struct Replicated {
    /// The channel.
    pub channel: ChannelUri,
    /// The node that wrote it.
    pub writer: String,
    /// Journal position of its first record.
    pub pos: JournalPos,
    /// Its actions, in order.
    pub records: Vec<Record>,
    /// Who dispatched each action (`None`: the host or an agent); empty
    /// when the batch carries no origins.
    pub origins: Vec<Option<ActionOrigin>>,
}

/// What a node hears from the rest of the cluster.
#[derive(Debug, Clone)]
pub enum ClusterEvent {
    /// A batch was appended by another node (or by this one, to a channel
    /// it no longer owns).
    Appended(Replicated),
    /// A channel was created (by any node).
    ChannelAdded(ChannelUri),
    /// A channel was disposed (by any node).
    ChannelRemoved(ChannelUri),
}

/// Answers requests other nodes forward to this one.
pub type ForwardHandler = Arc<dyn Fn(Vec<u8>) -> LinkFuture<Vec<u8>> + Send + Sync>;

/// A node's link to the other nodes of its cluster.
pub trait ClusterLink: Send + Sync + 'static {
    /// This node's name.
    fn node(&self) -> &str;

    /// Whether this node writes `channel` now.
    fn owns(&self, channel: &ChannelUri) -> bool;

    /// Note that another node writes `channel` (this node is about to
    /// start its copy of a channel that node created).
    fn follows(&self, channel: &ChannelUri);

    /// Whether this node applies the batches other nodes append to
    /// `channel` (`true`) or lets them pass (`false`). A chat another node
    /// owns is applied only while it is watched here (a connection of this
    /// node subscribes to it); sessions and the root always are, and so is
    /// every channel this node owns.
    fn watch(&self, _channel: &ChannelUri, _on: bool) {}

    /// Start delivering what happens elsewhere in the cluster to `sink`
    /// (called once, after start-up recovery).
    fn follow(&self, sink: Arc<dyn Fn(ClusterEvent) + Send + Sync>);

    /// Send `body` to the node that owns `channel`; resolves with its
    /// answer, or why no owner answered.
    fn forward(&self, channel: &ChannelUri, body: Vec<u8>) -> LinkFuture<Result<Vec<u8>, String>>;

    /// Answer the requests other nodes forward to this one with `handler`.
    fn serve(&self, handler: ForwardHandler);

    /// Of `channels`, those no node holds a lease on (their owner is gone).
    fn orphans(&self, channels: Vec<ChannelUri>) -> LinkFuture<Vec<ChannelUri>>;

    /// Take `channels` (a session and its chats) for this node: their
    /// leases, then a fence on each, expecting the journal to end where
    /// this node has read it. `Ok(false)` when another node was quicker or
    /// this node has not read everything yet (nothing is kept then). A
    /// channel this node already writes is left as it is.
    fn take_over(&self, channels: Vec<ChannelUri>) -> LinkFuture<Result<bool, JournalError>>;

    /// Give `channels` up (handing them to another node): their leases are
    /// released and this node follows them from now on.
    fn release(&self, channels: Vec<ChannelUri>) -> LinkFuture<()>;

    /// How often to look for orphaned channels.
    fn watch_every(&self) -> std::time::Duration;

    /// Tell every other node `body` (best effort, not journaled: who is
    /// looking at what now).
    fn announce(&self, _body: Vec<u8>) {}

    /// Deliver what the other nodes announce to `sink`.
    fn hear(&self, _sink: Arc<dyn Fn(Vec<u8>) + Send + Sync>) {}

    /// Whether the link does its part now (`/readyz`): connected to the
    /// cluster, reading the other nodes' writes and the channels they
    /// create or dispose. `Err` says what is missing.
    fn ready(&self) -> Result<(), String>;
}
