//! Where new sessions go: every node tells the others how many sessions
//! it runs (`load.<node>` in `tandem_nodes`, every third of a lease), and
//! watches what they tell. A node that has heard from another within a
//! lease time counts it live; [`crate::store::cluster::place`] picks the
//! node for a new session from those counts.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;

use super::{Inner, JetStreamJournal};

/// What this node last heard of each other node's load.
#[derive(Default)]
pub(super) struct Loads {
    pub(super) heard: Mutex<HashMap<String, (usize, Instant)>>,
}

/// The key of `node`'s load record.
fn key(node: &str) -> String {
    format!("load.{}", super::token(node))
}

impl JetStreamJournal {
    /// Sessions this node runs now.
    pub(super) fn sessions_owned(&self) -> usize {
        self.inner
            .owned
            .lock()
            .keys()
            .filter(|c| c.as_str().starts_with("ahp-session:"))
            .count()
    }

    /// Tell the others this node's load, every third of a lease, for ever.
    pub(super) fn start_telling_load(&self) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let period = self.inner.lease / 3;
        self.inner.rt.spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let journal = JetStreamJournal { inner };
                let load = serde_json::json!({
                    "node": journal.inner.node,
                    "sessions": journal.sessions_owned(),
                });
                let body = Bytes::from(serde_json::to_vec(&load).unwrap_or_default());
                if let Err(e) = journal
                    .inner
                    .nats
                    .nodes
                    .put(key(&journal.inner.node), body)
                    .await
                {
                    tracing::debug!(error = %e, "this node's load was not told");
                }
            }
        });
        let me = self.clone();
        self.inner.rt.spawn(async move { me.hear_loads().await });
    }

    /// Keep what the other nodes tell of their load.
    async fn hear_loads(self) {
        loop {
            let mut watch = match self.inner.nats.nodes.watch("load.>").await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot hear the other nodes' load yet");
                    tokio::time::sleep(self.inner.lease / 3).await;
                    continue;
                }
            };
            while let Some(Ok(entry)) = watch.next().await {
                if entry.operation != kv::Operation::Put {
                    continue;
                }
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&entry.value) else {
                    continue;
                };
                let (Some(node), Some(n)) = (v["node"].as_str(), v["sessions"].as_u64()) else {
                    continue;
                };
                if node != self.inner.node {
                    self.inner
                        .loads
                        .heard
                        .lock()
                        .insert(node.to_owned(), (n as usize, Instant::now()));
                }
            }
            if !self.inner.following_journal.load(Ordering::Acquire) {
                tokio::time::sleep(self.inner.lease / 3).await;
            }
        }
    }

    /// The live nodes and the sessions each runs, this node first.
    pub(super) fn live_loads(&self) -> Vec<(String, usize)> {
        let mut out = vec![(self.inner.node.clone(), self.sessions_owned())];
        let lease = self.inner.lease;
        out.extend(
            self.inner
                .loads
                .heard
                .lock()
                .iter()
                .filter(|(_, (_, at))| at.elapsed() < lease)
                .map(|(node, (n, _))| (node.clone(), *n)),
        );
        out
    }
}
