//! What every channel actor shares: the journal-then-publish step
//! ([`ChannelCore`]). The application context, [`Shared`], lives in
//! [`super::context`].

use std::sync::Arc;

use ahp_types::actions::{ActionOrigin, StateAction};

pub use super::context::Shared;
use super::Dispatcher;
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::publish::{rejection_frame, Hub};
use crate::store::{Batch, Journal, JournalError, Record, SnapshotRecord, TurnRecord};
use crate::transport::{Outbound, Push};

/// Wait until every write handed to `journal` so far is durable (a removal
/// is queued like any write, and nobody waits on it otherwise).
pub async fn durable(journal: Arc<dyn Journal>) -> Result<(), String> {
    tokio::task::spawn_blocking(move || journal.sync())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// An action accepted by an actor, waiting for the journal.
pub struct Accepted {
    /// The action (already reduced into the actor's state).
    pub action: StateAction,
    /// Its serialized form, journaled and published as is.
    pub json: Record,
    /// The dispatcher, when a client sent it.
    pub origin: Option<(ActionOrigin, Dispatcher)>,
}

impl Accepted {
    /// Wrap an action, serializing it once.
    pub fn new(action: StateAction, origin: Option<(ActionOrigin, Dispatcher)>) -> Self {
        let json: Record = serde_json::to_string(&action)
            .unwrap_or_else(|_| "null".into())
            .into();
        Self {
            action,
            json,
            origin,
        }
    }
}

/// A client's action forwarded to the channel's owner, until both its
/// echo (through this node's copy) and the owner's answer are back.
pub struct Forwarded {
    /// The dispatcher, until its echo takes it.
    pub conn: Option<Arc<Outbound>>,
    /// The owner answered that it published the action.
    pub answered: bool,
}

/// A channel's identity and its path to subscribers.
pub struct ChannelCore {
    /// Channel URI.
    pub uri: ChannelUri,
    /// Subscribers.
    pub hub: Arc<Hub>,
    /// Server context.
    pub shared: Arc<Shared>,
    /// Where this channel's journal ends (the next append's `expected`).
    pub journal_len: JournalPos,
    /// Set when the journal refused a write: the channel then rejects every
    /// new action (reads keep working) instead of acknowledging unstored ones.
    pub store_failed: Option<String>,
    /// Set when, after a refused write, the state could not be reloaded
    /// from the store either: the actor's state may hold what the store does
    /// not, so it is no longer served to new subscribers.
    pub unreadable: Option<String>,
    /// Where the journal ended, as subscribers know it, when a write was
    /// refused; cleared once the store was read again ([`Self::catch_up`]).
    pub refused_at: Option<JournalPos>,
    /// Another node of the cluster writes this channel: this copy applies
    /// what it appends ([`super::commit::ChannelActor::replicated`]) and
    /// forwards its clients' actions to it.
    pub follower: bool,
    /// A follower chat nobody on this node watches: its batches pass this
    /// node by and its state is not kept; it is read from the store again
    /// when someone here needs it (`crate::channels::chat::interest`).
    pub cold: bool,
    /// Since when no connection of this node watches this followed channel.
    pub idle_since: Option<tokio::time::Instant>,
    /// A follower that could not read the channel again has a retry due
    /// ([`super::commit::ChannelActor::resync`]).
    pub resync_due: bool,
    /// Dispatchers on this node whose actions were forwarded to the owner,
    /// by origin: each gets its echo when the action comes back, even if
    /// not subscribed (as a dispatcher does from an owner).
    pub forwarded: std::collections::HashMap<(String, i64), Forwarded>,
    /// Audit entries of the acts reduced since the last append
    /// ([`super::audit`]): the next append stores them with its batch, and
    /// a batch that is not stored drops them.
    pub audit: Vec<crate::store::AuditRecord>,
    /// Records journaled since the last snapshot.
    since_snapshot: u64,
    /// `serverSeq` values claimed for journaled actions not yet published.
    claimed: u64,
}

impl ChannelCore {
    /// A core for a channel with `journal_len` records already stored.
    pub fn new(uri: ChannelUri, hub: Arc<Hub>, shared: Arc<Shared>) -> Self {
        let journal_len = shared.journal.len(&uri);
        let follower = shared.follows(&uri);
        Self {
            follower,
            cold: false,
            idle_since: None,
            resync_due: false,
            forwarded: std::collections::HashMap::new(),
            uri,
            hub,
            shared,
            journal_len,
            store_failed: None,
            unreadable: None,
            refused_at: None,
            audit: Vec::new(),
            since_snapshot: 0,
            claimed: 0,
        }
    }

    /// Register `conn` and return the snapshot of `state` at the current
    /// `serverSeq` (later envelopes of this channel all reach `conn`).
    pub fn subscribe(
        &self,
        conn: &Arc<Outbound>,
        state: &impl serde::Serialize,
    ) -> Result<super::SnapshotJson, crate::protocol::RpcError> {
        if let Some(e) = &self.unreadable {
            return Err(crate::protocol::RpcError::internal(format!(
                "`{}` is not served: after a refused write its state could not be reloaded ({e})",
                self.uri
            )));
        }
        let state = serde_json::to_string(state)
            .map_err(|e| crate::protocol::RpcError::internal(e.to_string()))?;
        Ok(self.shared.publisher.subscribe_at(&self.hub, conn, |from| {
            super::SnapshotJson::new(&self.uri, &state, from)
        }))
    }

    /// Send a rejection echo to the dispatcher only.
    pub fn reject(
        &self,
        conn: &Dispatcher,
        origin: &ActionOrigin,
        action: &StateAction,
        reason: &str,
    ) {
        let conn = match conn {
            Dispatcher::Conn(c) => &c.out,
            // Counted and logged on the node the client is connected to,
            // once its rejection comes back there.
            Dispatcher::Forwarded(reply) => return reply.answer(Err(reason.to_owned())),
        };
        tracing::info!(channel = %self.uri, client = %origin.client_id, reason, "action rejected");
        self.shared.metrics.rejected(reason);
        let json = serde_json::to_string(action).unwrap_or_else(|_| "null".into());
        conn.push(Push::AfterLastSeq(&|last| {
            rejection_frame(&self.uri, &json, last, origin, reason)
        }));
    }

    /// Start journaling a batch; the caller publishes when it resolves.
    /// Every `snapshot_every` records the channel's state (from `state`, taken
    /// after the batch) goes along, so recovery replays only the tail.
    /// The batch's `serverSeq` values are claimed first: if the store refuses
    /// to reserve them, nothing is journaled and the commit fails.
    /// Whether appending `records` more records takes a snapshot (the
    /// `state` of [`ChannelCore::append`] is then called).
    pub fn snapshot_due(&self, records: usize) -> bool {
        self.since_snapshot + records as u64 >= self.shared.config.snapshot_every
    }

    pub fn append(
        &mut self,
        batch: &[Accepted],
        turns: Vec<TurnRecord>,
        truncate_turns_from: Option<u64>,
        state: impl FnOnce() -> Option<String>,
    ) -> crate::store::Commit {
        let audit = std::mem::take(&mut self.audit);
        let records: Vec<Record> = batch.iter().map(|a| a.json.clone()).collect();
        let origins = if batch.iter().any(|a| a.origin.is_some()) {
            batch
                .iter()
                .map(|a| a.origin.as_ref().map(|(o, _)| o.clone()))
                .collect()
        } else {
            Vec::new()
        };
        if let Err(e) = self.shared.publisher.claim(records.len() as u64) {
            return Box::pin(std::future::ready(Err(JournalError::Unavailable(
                e.to_string(),
            ))));
        }
        self.claimed += records.len() as u64;
        let expected = self.journal_len;
        self.journal_len = self.journal_len.plus(records.len() as u64);
        self.since_snapshot += records.len() as u64;
        let snapshot = if self.since_snapshot >= self.shared.config.snapshot_every {
            self.since_snapshot = 0;
            state().map(|s| SnapshotRecord {
                at_seq: self.journal_len,
                state: s.into(),
            })
        } else {
            None
        };
        self.shared.journal.append(
            &self.uri,
            expected,
            Batch {
                records,
                turns,
                truncate_turns_from,
                snapshot,
                origins,
                audit,
            },
        )
    }

    /// Publish one journaled action to every subscriber (and its dispatcher)
    /// with a number claimed by [`ChannelCore::append`].
    pub fn publish(&mut self, accepted: &Accepted) -> ServerSeq {
        let (origin, conn) = match &accepted.origin {
            Some((o, c)) => (Some(o), c.conn()),
            None => (None, None),
        };
        self.claimed = self.claimed.saturating_sub(1);
        let seq = self
            .shared
            .publisher
            .publish(&self.uri, &self.hub, &accepted.json, origin, conn);
        if let Some((_, Dispatcher::Forwarded(reply))) = &accepted.origin {
            reply.answer(Ok(()));
        }
        seq
    }

    /// Publish an action another node journaled (this node follows the
    /// channel) to this node's subscribers; `None`, and nothing published,
    /// if no `serverSeq` could be reserved.
    pub fn publish_replicated(
        &mut self,
        record: &Record,
        origin: Option<&ActionOrigin>,
    ) -> Option<ServerSeq> {
        if let Err(e) = self.shared.publisher.claim(1) {
            tracing::error!(channel = %self.uri, error = %e, "no serverSeq for a replicated action");
            return None;
        }
        Some(self.publish_followed(record, origin))
    }

    /// Publish an action the owner journaled whose `serverSeq` is claimed:
    /// with its origin, and to its dispatcher if that is a client of this
    /// node (a forwarded dispatch), which takes its echo.
    fn publish_followed(&mut self, record: &Record, origin: Option<&ActionOrigin>) -> ServerSeq {
        let dispatcher = origin.and_then(|o| {
            let key = (o.client_id.clone(), o.client_seq);
            let f = self.forwarded.get_mut(&key)?;
            let conn = f.conn.take();
            if f.answered {
                self.forwarded.remove(&key);
            }
            conn
        });
        self.shared
            .publisher
            .publish(&self.uri, &self.hub, record, origin, dispatcher.as_ref())
    }

    /// Publish an action that is not journaled (root's derived state); see
    /// [`Publisher::publish_unjournaled`](crate::publish::Publisher::publish_unjournaled). `None`, and nothing published, if
    /// the store refused to reserve its `serverSeq`.
    pub fn publish_unjournaled(&self, json: &str, unscoped_only: bool) -> Option<ServerSeq> {
        let seq =
            self.shared
                .publisher
                .publish_unjournaled(&self.uri, &self.hub, json, unscoped_only);
        if seq.is_none() {
            tracing::error!(channel = %self.uri, "serverSeq not reserved; action not published");
        }
        seq
    }

    /// The state was just read back from the store after a refused write.
    /// A write can be refused and still be stored (its acknowledgement was
    /// lost on the way, as when NATS goes away mid-append): the reloaded
    /// state then holds actions no subscriber was sent. They are durable,
    /// so they are published now, in the same actor turn as the reload, and
    /// every client converges on what the store holds.
    pub fn catch_up(&mut self) {
        let Some(known) = self.refused_at.take() else {
            return;
        };
        let stored = self.shared.journal.len(&self.uri);
        self.journal_len = stored;
        if stored <= known {
            return;
        }
        let n = stored.get() - known.get();
        let (tail, origins) = match self.shared.journal.load_channel(&self.uri) {
            Ok(Some(c)) => (c.tail, c.tail_origins),
            Ok(None) => (Vec::new(), Vec::new()),
            Err(e) => {
                tracing::error!(channel = %self.uri, error = %e, "stored actions not readable for catch-up");
                self.unreadable = Some(e.to_string());
                self.refused_at = Some(known);
                return;
            }
        };
        if (tail.len() as u64) < n {
            tracing::error!(channel = %self.uri, stored = %stored, known = %known, "stored actions beyond the snapshot are missing; channel not served");
            self.unreadable = Some("the store holds actions its tail does not".into());
            self.refused_at = Some(known);
            return;
        }
        if let Err(e) = self.shared.publisher.claim(n) {
            tracing::error!(channel = %self.uri, error = %e, "no serverSeq for the stored actions; channel not served");
            self.unreadable = Some(e.to_string());
            self.refused_at = Some(known);
            return;
        }
        tracing::warn!(channel = %self.uri, actions = n, "the store holds actions subscribers were not sent (a refused write stored after all, or batches a follower missed): published now");
        let from = tail.len() - n as usize;
        for (i, record) in tail.iter().enumerate().skip(from) {
            if self.follower {
                // Batches this follower missed: a forwarded dispatch among
                // them reaches its dispatcher here or never.
                let origin = origins.get(i).and_then(Option::as_ref);
                self.publish_followed(record, origin);
            } else {
                // Writes this owner was refused: their dispatchers were
                // told so, and a second answer would contradict the first.
                self.shared
                    .publisher
                    .publish(&self.uri, &self.hub, record, None, None);
            }
        }
    }

    /// Why writes are refused now, if they are: a write the store refused
    /// earlier (until the channel is reloaded), or a store that says it
    /// cannot take any.
    pub fn store_refusal(&self) -> Option<String> {
        if let Some(e) = &self.store_failed {
            return Some(e.clone());
        }
        self.shared.journal.writable().err().map(|e| e.to_string())
    }

    /// The journal refused a batch: nobody sees it, dispatchers are told, and
    /// the channel stops taking writes (until [`super::commit`] finds the
    /// store answering again).
    pub fn commit_failed(&mut self, err: JournalError, batch: &[Accepted]) {
        tracing::error!(channel = %self.uri, error = %err, "journal append failed; channel is now read-only");
        let before = self.journal_len.get().saturating_sub(batch.len() as u64);
        self.refused_at.get_or_insert(JournalPos::new(before));
        let reason = format!("not stored: {err}");
        for a in batch {
            if let Some((o, c)) = &a.origin {
                self.reject(c, o, &a.action, &reason);
            }
        }
        self.store_failed = Some(err.to_string());
        self.shared
            .publisher
            .release(std::mem::take(&mut self.claimed));
    }
}
