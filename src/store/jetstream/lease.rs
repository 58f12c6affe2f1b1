//! Channel ownership: a lease per channel in the `tandem_leases` bucket,
//! taken and renewed with compare-and-set on the entry's revision.
//!
//! The bucket's entries expire after the lease time (its `max_age`), so a
//! node that stops renewing — dead, paused, cut off from NATS — loses its
//! channels without anyone deleting anything, and another node can create
//! the entry anew. Taking a lease is half of a takeover: the new owner then
//! fences the channel's subject ([`super::JetStreamJournal::fence`]), which
//! makes any append of the old owner fail, whatever it believes.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::token;
use crate::store::JournalError;

/// The bucket of leases.
pub const LEASES: &str = "tandem_leases";

/// A lease this node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The channel.
    pub channel: String,
    /// The entry's revision: the next renewal must find it unchanged.
    pub revision: u64,
}

/// Why a lease was not taken or kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Another node holds it.
    #[error("channel `{channel}` is owned by node `{node}`")]
    Held {
        /// The channel.
        channel: String,
        /// Its owner.
        node: String,
    },
    /// The lease expired or was taken over since the last renewal.
    #[error("the lease of `{0}` was lost")]
    Lost(String),
    /// NATS could not be asked.
    #[error(transparent)]
    Store(#[from] JournalError),
}

#[derive(Serialize, Deserialize)]
struct Holder {
    node: String,
}

/// This node's side of the leases.
#[derive(Clone)]
pub struct Leases {
    kv: kv::Store,
    node: String,
    ttl: Duration,
    rt: tokio::runtime::Handle,
}

impl Leases {
    pub(super) fn new(
        kv: kv::Store,
        node: String,
        ttl: Duration,
        rt: tokio::runtime::Handle,
    ) -> Self {
        Self { kv, node, ttl, rt }
    }

    /// How long a lease lasts unrenewed; renew well within it.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn value(&self) -> Bytes {
        Bytes::from(
            serde_json::to_vec(&Holder {
                node: self.node.clone(),
            })
            .unwrap_or_default(),
        )
    }

    /// Take the lease of `channel`: free (never taken, expired) or already
    /// this node's.
    pub async fn acquire(&self, channel: &str) -> Result<Lease, LeaseError> {
        let this = self.clone();
        let channel = channel.to_owned();
        self.rt
            .spawn(async move { this.acquire_here(channel).await })
            .await
            .map_err(|e| JournalError::Unavailable(format!("lease task: {e}")))?
    }

    pub(super) async fn acquire_here(&self, channel: String) -> Result<Lease, LeaseError> {
        let key = token(&channel);
        let unavailable = |e: &dyn std::fmt::Display| {
            LeaseError::Store(JournalError::Unavailable(format!(
                "NATS JetStream: lease of {channel}: {e}"
            )))
        };
        match self.kv.create(key.clone(), self.value()).await {
            Ok(revision) => return Ok(Lease { channel, revision }),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(e) => return Err(unavailable(&e)),
        }
        let entry = self
            .kv
            .entry(key.clone())
            .await
            .map_err(|e| unavailable(&e))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                let holder: Option<Holder> = serde_json::from_slice(&e.value).ok();
                match holder {
                    Some(h) if h.node == self.node => {
                        // Ours already (a restart within the lease time).
                        let revision = self
                            .kv
                            .update(key, self.value(), e.revision)
                            .await
                            .map_err(|_| LeaseError::Lost(channel.clone()))?;
                        Ok(Lease { channel, revision })
                    }
                    Some(h) => Err(LeaseError::Held {
                        channel,
                        node: h.node,
                    }),
                    None => Err(unavailable(&"the lease entry does not decode")),
                }
            }
            // Deleted or purged: free; take it over the tombstone.
            Some(e) => {
                let revision = self
                    .kv
                    .update(key, self.value(), e.revision)
                    .await
                    .map_err(|_| LeaseError::Lost(channel.clone()))?;
                Ok(Lease { channel, revision })
            }
            // Expired between our create and our read: try once more.
            None => match self.kv.create(key, self.value()).await {
                Ok(revision) => Ok(Lease { channel, revision }),
                Err(_) => Err(LeaseError::Lost(channel)),
            },
        }
    }

    /// Renew `lease`; fails once someone else holds it or it expired.
    pub async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let this = self.clone();
        let lease = lease.clone();
        self.rt
            .spawn(async move { this.renew_here(&lease).await })
            .await
            .map_err(|e| JournalError::Unavailable(format!("lease task: {e}")))?
    }

    pub(super) async fn renew_here(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let key = token(&lease.channel);
        match self.kv.update(key, self.value(), lease.revision).await {
            Ok(revision) => Ok(Lease {
                channel: lease.channel.clone(),
                revision,
            }),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(LeaseError::Lost(lease.channel.clone()))
            }
            Err(e) => Err(LeaseError::Store(JournalError::Unavailable(format!(
                "NATS JetStream: renew the lease of {}: {e}",
                lease.channel
            )))),
        }
    }

    /// Give `lease` up (a clean shutdown): another node may take the
    /// channel at once.
    pub async fn release(&self, lease: &Lease) {
        let this = self.clone();
        let lease = lease.clone();
        let _ = self
            .rt
            .spawn(async move {
                let key = token(&lease.channel);
                let _ = this
                    .kv
                    .delete_expect_revision(key, Some(lease.revision))
                    .await;
            })
            .await;
    }

    /// Who holds `channel`'s lease now, if anyone.
    pub async fn holder(&self, channel: &str) -> Result<Option<String>, LeaseError> {
        let this = self.clone();
        let key = token(channel);
        self.rt
            .spawn(async move {
                let entry = this.kv.entry(key).await.map_err(|e| {
                    JournalError::Unavailable(format!("NATS JetStream: read a lease: {e}"))
                })?;
                Ok(entry
                    .filter(|e| e.operation == kv::Operation::Put)
                    .and_then(|e| serde_json::from_slice::<Holder>(&e.value).ok())
                    .map(|h| h.node))
            })
            .await
            .map_err(|e| JournalError::Unavailable(format!("lease task: {e}")))?
    }
}
