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

    /// The live nodes and how many sessions each runs, this node first
    /// (only this node when it has heard of no other).
    fn loads(&self) -> Vec<(String, usize)> {
        vec![(self.node().to_owned(), 0)]
    }

    /// A session was just placed on `node`: count it there until that
    /// node next tells its load.
    fn placed(&self, _node: &str) {}

    /// Send `body` to node `node` (a request no channel names yet: a new
    /// session placed there); resolves with its answer.
    fn forward_to(&self, node: &str, _body: Vec<u8>) -> LinkFuture<Result<Vec<u8>, String>> {
        let node = node.to_owned();
        Box::pin(async move { Err(format!("node `{node}` cannot be reached from here")) })
    }

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

/// The node a new session made through node `me` goes to, given each live
/// node's sessions (`loads`, `me` among them): `me` while it runs no more
/// than a little above the least loaded node (the session's first people
/// are on `me`), else the least loaded (ties: the first named). So a node
/// that joins takes new sessions until it has its share, and a cluster
/// whose clients are spread stays local.
pub fn place(me: &str, loads: &[(String, usize)]) -> String {
    let mine = loads.iter().find(|(n, _)| n == me).map_or(0, |(_, l)| *l);
    let Some((least, low)) = loads
        .iter()
        .min_by(|(an, al), (bn, bl)| al.cmp(bl).then_with(|| an.cmp(bn)))
    else {
        return me.to_owned();
    };
    let total: usize = loads.iter().map(|(_, l)| l).sum();
    let slack = (total / loads.len().max(1) / 5).max(2);
    if mine <= low + slack {
        me.to_owned()
    } else {
        least.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::place;

    fn loads(v: &[(&str, usize)]) -> Vec<(String, usize)> {
        v.iter().map(|(n, l)| ((*n).to_owned(), *l)).collect()
    }

    #[test]
    fn a_new_session_stays_where_it_is_made_unless_that_node_runs_well_above_the_least() {
        assert_eq!(place("a", &loads(&[("a", 0)])), "a", "alone");
        assert_eq!(place("a", &loads(&[("a", 5), ("b", 4), ("c", 6)])), "a");
        assert_eq!(
            place("a", &loads(&[("a", 2), ("b", 0)])),
            "a",
            "within the slack of 2"
        );
        assert_eq!(place("a", &loads(&[("a", 3), ("b", 0)])), "b");
        // A node that joins takes new sessions until it has its share.
        assert_eq!(place("a", &loads(&[("a", 40), ("b", 40), ("c", 0)])), "c");
        assert_eq!(
            place("b", &loads(&[("a", 40), ("b", 40), ("c", 35)])),
            "b",
            "slack: a fifth of the mean"
        );
        assert_eq!(
            place("a", &loads(&[("a", 9), ("b", 1), ("c", 1)])),
            "b",
            "ties: the first named"
        );
    }
}
