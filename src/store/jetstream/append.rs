//! Appends: a channel's queued batches go out one message at a time, each
//! fenced by the sequence of the one before, then their turn pages and
//! snapshot follow.

use std::sync::Arc;

use async_nats::jetstream;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::wire::{raw, BatchMsg, SnapshotMsg, TurnMsg};
use super::{publish_error, subject, token, unavailable, Inner, Pending, NODE_HEADER, POS_HEADER};
use crate::ids::ChannelUri;
use crate::store::{JournalError, SnapshotRecord};

impl Inner {
    /// Send `channel`'s queued appends, one message at a time, until none
    /// are left.
    pub(super) async fn flush(self: Arc<Self>, uri: ChannelUri) {
        loop {
            let (group, pos, last_seq, turns_before) = {
                let mut chans = self.chans.lock();
                let Some(c) = chans.get_mut(&uri) else {
                    return;
                };
                if c.queue.is_empty() {
                    c.in_flight = false;
                    self.settled.notify_all();
                    return;
                }
                (std::mem::take(&mut c.queue), c.len, c.last_seq, c.turns)
            };
            let started = std::time::Instant::now();
            let outcome = self.send(&uri, &group, pos, last_seq, turns_before).await;
            if let Some(m) = self.commits.get() {
                m.seconds.record(started.elapsed().as_secs_f64());
                m.writes.record(group.len() as f64);
            }
            let mut chans = self.chans.lock();
            let Some(c) = chans.get_mut(&uri) else {
                return;
            };
            match outcome {
                Ok((seq, added, turns)) => {
                    c.last_seq = seq;
                    c.len += added;
                    c.turns = turns;
                    drop(chans);
                    for p in group {
                        let _ = p.done.send(Ok(()));
                    }
                }
                Err(e) => {
                    // Everything queued behind it built on it: refused too.
                    if let JournalError::Fenced { reason, .. } = &e {
                        c.fenced = Some(reason.clone());
                    }
                    let queued = std::mem::take(&mut c.queue);
                    c.projected = c.len;
                    drop(chans);
                    for p in group.into_iter().chain(queued) {
                        let _ = p.done.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// One message for `group`; its stream sequence, the actions it added
    /// and the channel's turn count after it.
    async fn send(
        &self,
        uri: &ChannelUri,
        group: &[Pending],
        pos: u64,
        last_seq: u64,
        turns_before: u64,
    ) -> Result<(u64, u64, u64), JournalError> {
        let mut records: Vec<&RawValue> = Vec::new();
        let mut turns: Vec<TurnMsg> = Vec::new();
        let mut truncate: Option<u64> = None;
        let mut turn_count = turns_before;
        let mut snapshot: Option<&SnapshotRecord> = None;
        let mut origins = Vec::new();
        let any_origin = group.iter().any(|p| !p.batch.origins.is_empty());
        for p in group {
            if any_origin {
                let n = p.batch.records.len();
                origins.extend((0..n).map(|i| p.batch.origins.get(i).cloned().flatten()));
            }
            if let Some(from) = p.batch.truncate_turns_from {
                turns.retain(|t| t.index < from);
                truncate = Some(truncate.map_or(from, |t| t.min(from)));
                turn_count = turn_count.min(from);
            }
            for t in &p.batch.turns {
                turn_count = turn_count.max(t.index + 1);
                turns.push(TurnMsg {
                    index: t.index,
                    json: raw(&t.json)?,
                });
            }
            for r in &p.batch.records {
                records.push(raw(r)?);
            }
            if let Some(s) = &p.batch.snapshot {
                snapshot = Some(s);
            }
        }
        let added = records.len() as u64;
        let payload = serde_json::to_vec(&BatchMsg {
            records,
            turns,
            truncate_turns_from: truncate,
            origins,
        })
        .map_err(|e| unavailable("encode a batch", e))?;
        let msg = jetstream::message::PublishMessage::build()
            .header(POS_HEADER, pos.to_string().as_str())
            .header(NODE_HEADER, self.node.as_str())
            .expected_last_subject_sequence(last_seq)
            .payload(Bytes::from(payload));
        let ack = self
            .nats
            .js
            .send_publish(subject(uri), msg)
            .await
            .map_err(|e| unavailable("append", e))?
            .await
            .map_err(|e| publish_error(uri, e))?;
        // The batch is stored (and holds its turns); the turn pages and the
        // snapshot follow. A turn that could not be written leaves the
        // snapshot where it was, so the next start writes it again.
        let audit: Vec<_> = group
            .iter()
            .flat_map(|p| p.batch.audit.iter().cloned())
            .collect();
        if !audit.is_empty() {
            self.nats.put_audit(&audit).await;
        }
        let key = token(uri);
        if let Some(from) = truncate {
            self.nats.delete_turns(&key, from, turns_before).await;
        }
        let mut turns_ok = true;
        for p in group {
            for t in &p.batch.turns {
                if let Err(e) = self.nats.put_turn(&key, t).await {
                    tracing::warn!(channel = %uri, error = %e, "turn page not written; recovery writes it again");
                    turns_ok = false;
                }
            }
        }
        if let (Some(s), true) = (snapshot, turns_ok) {
            let value = SnapshotMsg {
                at_seq: s.at_seq.get(),
                from_stream_seq: ack.sequence,
                turn_count,
                state: raw(&s.state)?,
            };
            match serde_json::to_vec(&value) {
                Ok(v) => {
                    if let Err(e) = self.nats.snapshots.put(key, Bytes::from(v)).await {
                        tracing::warn!(channel = %uri, error = %e, "snapshot not stored; recovery reads a longer tail");
                    }
                }
                Err(e) => tracing::warn!(channel = %uri, error = %e, "snapshot does not encode"),
            }
        }
        Ok((ack.sequence, added, turn_count))
    }
}
