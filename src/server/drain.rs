//! A cluster node that stops (`SIGTERM`) hands its sessions to the other
//! nodes before it goes: a rolling restart loses nothing and ends no turn
//! that did not have to end.
//!
//! The node stops being ready (`/readyz` 503, so a load balancer sends
//! new clients elsewhere), then, round after round, hands over every
//! session it runs whose chats have no turn running: its chats and the
//! session stop writing here and their leases are released, and the other
//! nodes take them as they take a lost node's (`server::cluster`, every
//! third of a lease). A session with a turn running waits for the turn to
//! end, until the drain's time is up; then it is handed over anyway and
//! the turn ends on the node that takes it. A session whose agent is a
//! provider connection to this node stays: that agent goes with the node,
//! and its session follows it to the node it connects to next.
//!
//! The drain ends once another node runs everything handed over (or the
//! time is up); then the node closes its connections, and their clients
//! reconnect to any other node.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::ROOT_RESOURCE_URI;

use crate::channels::context::Shared;
use crate::channels::forward::ForwardReply;
use crate::channels::Channel;
use crate::ids::ChannelUri;

/// How often a drain looks again for sessions whose turn ended, and for
/// handed-over sessions another node took.
const DRAIN_ROUND: Duration = Duration::from_millis(100);

/// Hand this node's sessions to the other nodes of the cluster, waiting at
/// most `within` for running turns to end (nothing to do on a single node).
pub async fn drain(shared: Arc<Shared>, within: Duration) {
    let Some(link) = shared.cluster.clone() else {
        return;
    };
    shared.draining.store(true, Ordering::Release);
    let until = tokio::time::Instant::now() + within;
    let mut handed: Vec<ChannelUri> = Vec::new();
    let mut pinned;
    loop {
        let all = shared.registry.all();
        let mine: Vec<&Channel> = all
            .iter()
            .filter(|c| !c.addr.is_chat() && c.uri.as_str() != ROOT_RESOURCE_URI)
            .filter(|c| !shared.follows(&c.uri))
            .collect();
        let late = tokio::time::Instant::now() >= until;
        let mut waiting = 0;
        pinned = 0;
        for session in mine {
            let chats: Vec<&Channel> = all
                .iter()
                .filter(|c| c.addr.is_chat() && c.session.as_ref() == Some(&session.uri))
                .collect();
            if !late {
                let mut busy = false;
                for c in &chats {
                    busy |= c.addr.busy().await;
                }
                if busy {
                    waiting += 1;
                    continue;
                }
            }
            let answer = super::cluster::hand_over(&shared, session.clone()).await;
            if matches!(ForwardReply::decode(&answer), ForwardReply::Done) {
                tracing::info!(session = %session.uri, chats = chats.len(), "handed over: this node is stopping");
                handed.push(session.uri.clone());
            } else {
                pinned += 1;
            }
        }
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(DRAIN_ROUND).await;
    }
    // Until another node runs each of them: the clients this node closes
    // next find their sessions served elsewhere.
    let taken_by = until.max(tokio::time::Instant::now()) + link.watch_every() * 3;
    let mut left = handed.len();
    while !handed.is_empty() && tokio::time::Instant::now() < taken_by {
        handed = link.orphans(handed).await;
        left = handed.len();
        if left > 0 {
            tokio::time::sleep(DRAIN_ROUND).await;
        }
    }
    tracing::info!(
        not_taken_yet = left,
        stay_with_their_agent = pinned,
        "drained: the other nodes run this node's sessions"
    );
}
