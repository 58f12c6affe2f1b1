//! The [`Journal`] of a cluster node: each call of the trait on the
//! journal's runtime (see the module's documentation for what goes where).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::wire::{ChannelMsg, OwnerMsg};
use super::{
    lease, subject, token, unavailable, JetStreamJournal, Pending, SEQ_KEY, STREAM, TURNS,
};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{
    AuditPage, Batch, BindCommit, ChannelInfo, ClusterLink, Commit, Journal, JournalError,
    Recovered, RecoveredChannel, TurnPage,
};

impl Journal for JetStreamJournal {
    fn settings(&self) -> Option<Arc<dyn crate::store::Settings>> {
        Some(Arc::new(super::settings::KvSettings(JetStreamJournal {
            inner: self.inner.clone(),
        })))
    }

    fn create_channel(&self, info: ChannelInfo) -> Commit {
        let inner = self.inner.clone();
        let journal = self.clone();
        let done = self.inner.rt.spawn(async move {
            let lease = journal
                .leases()
                .acquire_here(info.uri.to_string())
                .await
                .map_err(|e| match e {
                    lease::LeaseError::Store(e) => e,
                    e => JournalError::Fenced {
                        channel: info.uri.clone(),
                        reason: e.to_string(),
                    },
                })?;
            inner.owned.lock().insert(info.uri.clone(), lease);
            let value = serde_json::to_vec(&ChannelMsg::of(&info))
                .map_err(|e| unavailable("encode a channel", e))?;
            inner
                .nats
                .channels
                .put(token(&info.uri), Bytes::from(value))
                .await
                .map_err(|e| unavailable("store a channel", e))?;
            Ok(())
        });
        Box::pin(async move { done.await.map_err(|e| unavailable("store a channel", e))? })
    }

    fn append(&self, channel: &ChannelUri, expected: JournalPos, batch: Batch) -> Commit {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut chans = self.inner.chans.lock();
            let c = chans.entry(channel.clone()).or_default();
            if let Some(reason) = &c.fenced {
                return Box::pin(std::future::ready(Err(JournalError::Fenced {
                    channel: channel.clone(),
                    reason: reason.clone(),
                })));
            }
            let found = JournalPos::new(c.projected);
            if found != expected {
                return Box::pin(std::future::ready(Err(JournalError::Conflict {
                    channel: channel.clone(),
                    expected,
                    found,
                })));
            }
            c.projected += batch.records.len() as u64;
            c.queue.push(Pending { batch, done: tx });
            !std::mem::replace(&mut c.in_flight, true)
        };
        if start {
            self.inner
                .rt
                .spawn(self.inner.clone().flush(channel.clone()));
        }
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(unavailable("append", "the journal stopped")))
        })
    }

    fn remove(&self, channel: &ChannelUri) {
        self.inner.chans.lock().remove(channel);
        self.inner.settled.notify_all();
        self.inner.watched.lock().remove(channel);
        if self.inner.followed.lock().remove(channel) {
            // Another node's channel: only this node's copy goes (its
            // owner removes what is stored).
            return;
        }
        let lease = self.inner.owned.lock().remove(channel);
        let inner = self.inner.clone();
        let uri = channel.clone();
        self.inner.rt.spawn(async move {
            let key = token(&uri);
            let n = &inner.nats;
            if let Err(e) = n.stream.purge().filter(subject(&uri)).await {
                tracing::warn!(channel = %uri, error = %e, "disposed channel's messages not purged");
            }
            let _ = n.snapshots.purge(key.clone()).await;
            let _ = n.channels.purge(key.clone()).await;
            let turns = format!("$KV.{TURNS}.{key}.>");
            if let Ok(s) = n.js.get_stream(format!("KV_{TURNS}")).await {
                let _ = s.purge().filter(turns).await;
            }
            if let Some(l) = lease {
                let _ = n
                    .leases
                    .delete_expect_revision(token(&l.channel), Some(l.revision))
                    .await;
            }
        });
    }

    fn len(&self, channel: &ChannelUri) -> JournalPos {
        JournalPos::new(self.inner.chans.lock().get(channel).map_or(0, |c| c.len))
    }

    fn audit_page(&self, session: &ChannelUri, after: u64, limit: u64) -> AuditPage {
        let inner = self.inner.clone();
        let session = session.clone();
        self.block(async move { inner.nats.audit_page(&session, after, limit).await })
    }

    fn turns_before(&self, chat: &ChannelUri, before: u64, limit: u64) -> TurnPage {
        let inner = self.inner.clone();
        let key = token(chat);
        self.block(async move {
            let mut page = Vec::new();
            for i in before.saturating_sub(limit)..before {
                if let Some(v) = inner
                    .nats
                    .turns
                    .get(format!("{key}.{i}"))
                    .await
                    .map_err(|e| unavailable("read a turn", e))?
                {
                    let text =
                        std::str::from_utf8(&v).map_err(|e| unavailable("read a turn", e))?;
                    page.push(Arc::from(text));
                }
            }
            Ok(page)
        })
    }

    /// One floor for the whole cluster (`seq` in [`NODES`](super::NODES)), raised with
    /// compare-and-set: the block granted starts above the floor and above
    /// `next - 1`, and the floor moves to its last number. A node alone in
    /// the cluster is granted `next` (contiguous numbers); a node whose
    /// numbers another node overtook is granted a block above them, and the
    /// publisher jumps there, so no number is ever handed out by two nodes
    /// and a client's `lastSeenServerSeq` from another node is never
    /// mistaken for one of this node's (it gets snapshots).
    fn reserve_seq(&self, next: ServerSeq, count: u64) -> Result<ServerSeq, JournalError> {
        let inner = self.inner.clone();
        self.block(async move {
            for _ in 0..16 {
                let entry = inner
                    .nats
                    .nodes
                    .entry(SEQ_KEY)
                    .await
                    .map_err(|e| unavailable("read the seq floor", e))?;
                let current = entry
                    .as_ref()
                    .filter(|e| e.operation == kv::Operation::Put)
                    .and_then(|e| std::str::from_utf8(&e.value).ok()?.parse::<u64>().ok())
                    .unwrap_or(0);
                let base = current.max(next.get().saturating_sub(1));
                let floor = base.saturating_add(count);
                if floor == current {
                    // Nothing to reserve (`count` 0 at the floor).
                    return Ok(ServerSeq::new(base.saturating_add(1)));
                }
                let value = Bytes::from(floor.to_string());
                let stored = match &entry {
                    Some(e) => inner
                        .nats
                        .nodes
                        .update(SEQ_KEY, value, e.revision)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    None => inner
                        .nats
                        .nodes
                        .create(SEQ_KEY, value)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                };
                if stored.is_ok() {
                    return Ok(ServerSeq::new(base.saturating_add(1)));
                }
            }
            Err(unavailable(
                "store the seq floor",
                "too many concurrent raises",
            ))
        })
    }

    fn shared_seq(&self) -> bool {
        true
    }

    fn recover(&self) -> Result<Recovered, JournalError> {
        // Where following other nodes' appends starts: everything after
        // this is read again by the follower, and skipped where known.
        let inner = self.inner.clone();
        let last = self.block(async move {
            let mut stream = inner
                .nats
                .js
                .get_stream(STREAM)
                .await
                .map_err(|e| unavailable("read the journal stream", e))?;
            let info = stream
                .info()
                .await
                .map_err(|e| unavailable("read the journal stream", e))?;
            Ok(info.state.last_sequence)
        })?;
        self.inner
            .follow_from
            .store(last, std::sync::atomic::Ordering::Relaxed);
        let inner = self.inner.clone();
        let (mut recovered, chans) = self.block(async move { inner.nats.recover().await })?;
        let inner = self.inner.clone();
        recovered.seq_floor = self.block(async move {
            Ok(inner
                .nats
                .nodes
                .get(SEQ_KEY)
                .await
                .map_err(|e| unavailable("read the seq floor", e))?
                .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
                .map_or(ServerSeq::ZERO, ServerSeq::new))
        })?;
        {
            let mut map = self.inner.chans.lock();
            for (uri, c) in chans {
                map.insert(uri, c);
            }
        }
        // A session nobody runs becomes this node's, with its chats (a
        // lease and a fence each); one another live node runs is followed.
        let me = self.clone();
        let channels: Vec<(ChannelUri, Option<ChannelUri>)> = recovered
            .channels
            .iter()
            .map(|c| (c.info.uri.clone(), c.info.session.clone()))
            .collect();
        self.block(async move {
            let stored: std::collections::HashSet<ChannelUri> =
                channels.iter().map(|(u, _)| u.clone()).collect();
            let mut mine = std::collections::HashSet::new();
            for (uri, session) in channels {
                // A chat goes with its session (one whose session is not
                // stored is taken like a session).
                let ours = session
                    .as_ref()
                    .is_none_or(|s| mine.contains(s) || !stored.contains(s));
                if ours {
                    match me.own(&uri).await {
                        Ok(()) => {
                            mine.insert(uri);
                            continue;
                        }
                        Err(JournalError::Fenced { reason, .. }) => {
                            tracing::info!(channel = %uri, %reason, "followed: another node runs it");
                        }
                        Err(e) => return Err(e),
                    }
                }
                me.inner.followed.lock().insert(uri);
            }
            Ok(())
        })?;
        Ok(recovered)
    }

    fn bind_provider(&self, provider: &str, subject: &str) -> BindCommit {
        let inner = self.inner.clone();
        let (provider, subject) = (provider.to_owned(), subject.to_owned());
        let done = self.inner.rt.spawn(async move {
            let key = token(&provider);
            let value = serde_json::to_vec(&OwnerMsg {
                provider: provider.clone(),
                subject: subject.clone(),
            })
            .map_err(|e| unavailable("encode a provider", e))?;
            match inner
                .nats
                .providers
                .create(key.clone(), Bytes::from(value))
                .await
            {
                Ok(_) => Ok(subject),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    let v = inner
                        .nats
                        .providers
                        .get(key)
                        .await
                        .map_err(|e| unavailable("read a provider", e))?
                        .ok_or_else(|| unavailable("read a provider", "it vanished"))?;
                    let o: OwnerMsg = serde_json::from_slice(&v)
                        .map_err(|e| unavailable("read a provider", e))?;
                    Ok(o.subject)
                }
                Err(e) => Err(unavailable("bind a provider", e)),
            }
        });
        Box::pin(async move { done.await.map_err(|e| unavailable("bind a provider", e))? })
    }

    fn sync(&self) -> Result<(), JournalError> {
        // Every append is acknowledged once JetStream stored it; wait for
        // the ones in flight.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut chans = self.inner.chans.lock();
        while chans.values().any(|c| c.in_flight || !c.queue.is_empty()) {
            if self
                .inner
                .settled
                .wait_until(&mut chans, deadline)
                .timed_out()
            {
                return Err(unavailable("sync", "appends still in flight after 10 s"));
            }
        }
        Ok(())
    }

    fn writable(&self) -> Result<(), JournalError> {
        if self.connected() {
            Ok(())
        } else {
            Err(unavailable(
                "not connected",
                "writes are refused until the connection to NATS is back",
            ))
        }
    }

    fn probe_write(&self) -> Result<(), JournalError> {
        self.writable()?;
        // Connected is not enough: JetStream itself must answer (a server
        // whose JetStream is disabled, or not up yet, takes no append).
        let inner = self.inner.clone();
        self.block(async move {
            inner
                .nats
                .stream
                .get_info()
                .await
                .map(drop)
                .map_err(|e| unavailable("reach JetStream", e))
        })
    }

    fn observe_commits(&self, metrics: crate::store::CommitMetrics) {
        let _ = self.inner.commits.set(metrics);
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "node": self.inner.node,
            "nats": if self.connected() { "connected" } else { "disconnected: writes are refused until it is back" },
            "channelsOwned": self.owned(),
            "sessionsOwned": self.sessions_owned(),
            "nodes": self
                .live_loads()
                .into_iter()
                .map(|(node, sessions)| (node, serde_json::json!(sessions)))
                .collect::<serde_json::Map<_, _>>(),
            "chatsWatched": self.watched().0,
            "batchesPassed": self.watched().1,
        }))
    }

    fn cluster(&self) -> Option<Arc<dyn ClusterLink>> {
        Some(Arc::new(self.clone()))
    }

    fn load_channel(&self, uri: &ChannelUri) -> Result<Option<RecoveredChannel>, JournalError> {
        let inner = self.inner.clone();
        let key = token(uri);
        let loaded = self.block(async move {
            let Some(v) = inner
                .nats
                .channels
                .get(key)
                .await
                .map_err(|e| unavailable("read a channel", e))?
            else {
                return Ok(None);
            };
            let msg: ChannelMsg =
                serde_json::from_slice(&v).map_err(|e| unavailable("read a channel", e))?;
            let Some(info) = msg.info() else {
                return Ok(None);
            };
            inner.nats.load(info).await.map(Some)
        })?;
        let Some((c, last_seq)) = loaded else {
            return Ok(None);
        };
        // A reload follows a failed append: what is stored is the truth.
        let mut chans = self.inner.chans.lock();
        let e = chans.entry(uri.clone()).or_default();
        if !e.in_flight {
            e.len = c.len.get();
            e.projected = c.len.get();
            e.last_seq = last_seq;
            e.turns = c.turn_count;
        }
        Ok(Some(c))
    }
}
