//! The connection's handles and the reads of the journal: opening the
//! stream and buckets, reading a channel's messages back, recovery.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::actions::ActionOrigin;
use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::wire::{BatchMsg, ChannelMsg, OwnerMsg, SnapshotMsg};
use super::{
    audit_subject, lease, subject, token, unavailable, Chan, AUDIT_PREFIX, AUDIT_STREAM, CHANNELS,
    FENCE_HEADER, NODES, NODE_HEADER, POS_HEADER, PROVIDERS, SNAPSHOTS, STREAM, SUBJECT_PREFIX,
    TURNS,
};
use crate::ids::{ChannelUri, JournalPos, ServerSeq};
use crate::store::{
    ChannelInfo, ChannelKind, JournalError, Record, Recovered, RecoveredChannel, SnapshotRecord,
    TurnRecord,
};

/// The connection and its handles, on the journal's own runtime.
pub(super) struct Nats {
    pub(super) js: jetstream::Context,
    pub(super) stream: stream::Stream,
    /// The audit log's stream ([`AUDIT_STREAM`]).
    pub(super) audit: stream::Stream,
    pub(super) channels: kv::Store,
    pub(super) snapshots: kv::Store,
    pub(super) turns: kv::Store,
    pub(super) providers: kv::Store,
    pub(super) nodes: kv::Store,
    pub(super) leases: kv::Store,
    /// The server's own records ([`super::SETTINGS`]).
    pub(super) settings: kv::Store,
    /// Woken when the connection to NATS is made again (consumers and
    /// watches are then made again at once rather than when they time out).
    pub(super) reconnected: Arc<tokio::sync::Notify>,
}

/// One channel as read from the stream.
pub(super) struct ChannelRead {
    pub(super) tail: Vec<Record>,
    /// Who dispatched each record of `tail` (empty when no batch read
    /// carried origins).
    pub(super) tail_origins: Vec<Option<ActionOrigin>>,
    pub(super) len: u64,
    pub(super) last_seq: u64,
    pub(super) turn_count: u64,
    /// Turns in the tail (written again: their bucket write may not have
    /// happened).
    pub(super) turns: Vec<TurnRecord>,
    pub(super) truncations: Vec<u64>,
}

/// How long the client waits before its `attempts`-th reconnection: doubling
/// from 1 ms as async-nats does by default, but at most an eighth of the
/// lease time (and 4 s). A node that reconnected only seconds after NATS was
/// back would find every lease it held expired, and other nodes taking its
/// channels.
fn reconnect_delay(attempts: usize, lease: Duration) -> Duration {
    let doubling = Duration::from_millis(1u64 << (attempts.clamp(1, 13) - 1));
    doubling.min(lease / 8).min(Duration::from_secs(4))
}

/// How long a start keeps trying to make its streams and buckets.
const SETUP_WITHIN: Duration = Duration::from_secs(20);
/// The pause between two such tries.
const SETUP_RETRY: Duration = Duration::from_millis(500);

impl Nats {
    pub(super) async fn open(
        urls: &[String],
        lease: Duration,
        auth: &super::NatsAuth,
        replicas: usize,
    ) -> Result<Self, JournalError> {
        let addrs: Vec<async_nats::ServerAddr> = urls
            .iter()
            .map(|u| u.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| unavailable("bad URL", e))?;
        let reconnected = Arc::new(tokio::sync::Notify::new());
        let notify = reconnected.clone();
        // Set at every connection, the first one included: what the start
        // waits for.
        let (connected_tx, mut connected) = tokio::sync::watch::channel(false);
        let connected_tx = Arc::new(connected_tx);
        // The last thing the connection said went wrong, for the error a
        // start that cannot connect gives (a refused login, a bad
        // certificate).
        let last_error = Arc::new(parking_lot::Mutex::new(None::<String>));
        let heard = last_error.clone();
        let opts = auth.apply(async_nats::ConnectOptions::new()).await?;
        let client = opts
            .name("tandem")
            .event_callback(move |event| {
                let notify = notify.clone();
                let connected_tx = connected_tx.clone();
                let heard = heard.clone();
                async move {
                    if matches!(
                        event,
                        async_nats::Event::ClientError(_) | async_nats::Event::ServerError(_)
                    ) {
                        *heard.lock() = Some(event.to_string());
                    }
                    tracing::info!(%event, "NATS connection");
                    if matches!(event, async_nats::Event::Connected) {
                        connected_tx.send_replace(true);
                        notify.notify_waiters();
                    }
                }
            })
            .reconnect_delay_callback(move |attempts| reconnect_delay(attempts, lease))
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(addrs)
            .await
            .map_err(|e| unavailable("connect", e))?;
        // A first connection that cannot be made fails the start instead of
        // retrying for ever.
        let up = tokio::time::timeout(Duration::from_secs(10), connected.wait_for(|up| *up))
            .await
            .is_ok_and(|r| r.is_ok());
        if !up {
            return Err(unavailable(
                "connect",
                match last_error.lock().clone() {
                    Some(e) => format!("could not connect to {} within 10 s: {e}", urls.join(", ")),
                    None => format!("no NATS server answered at {} within 10 s", urls.join(", ")),
                },
            ));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client);
        // A NATS cluster that is still forming (its JetStream leader just
        // elected, peers not yet current) refuses replicated streams for
        // a moment: the start tries again for a while before it fails.
        let deadline = tokio::time::Instant::now() + SETUP_WITHIN;
        loop {
            match Self::set_up(js.clone(), lease, replicas, reconnected.clone()).await {
                Ok(nats) => return Ok(nats),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %e, "JetStream is not ready yet; trying again");
                    tokio::time::sleep(SETUP_RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Make (or open) the streams and buckets on `js`.
    async fn set_up(
        js: jetstream::Context,
        lease: Duration,
        replicas: usize,
        reconnected: Arc<tokio::sync::Notify>,
    ) -> Result<Self, JournalError> {
        let stream = js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                subjects: vec![format!("{SUBJECT_PREFIX}.>")],
                storage: stream::StorageType::File,
                allow_direct: true,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("create the journal stream (is JetStream enabled?)", e))?;
        let audit = js
            .get_or_create_stream(stream::Config {
                name: AUDIT_STREAM.into(),
                subjects: vec![format!("{AUDIT_PREFIX}.>")],
                storage: stream::StorageType::File,
                allow_direct: true,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("create the audit stream", e))?;
        let bucket = |name: &'static str, max_age: Duration| {
            let js = js.clone();
            async move {
                // The bucket's stream, made as the key-value API makes it
                // (without asking for account details, which servers
                // before 2.10 answer in a form the client does not read).
                js.get_or_create_stream(stream::Config {
                    name: format!("KV_{name}"),
                    subjects: vec![format!("$KV.{name}.>")],
                    max_messages_per_subject: 1,
                    max_age,
                    storage: stream::StorageType::File,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: stream::DiscardPolicy::New,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| unavailable(&format!("create bucket {name}"), e))?;
                js.get_key_value(name)
                    .await
                    .map_err(|e| unavailable(&format!("open bucket {name}"), e))
            }
        };
        Ok(Self {
            channels: bucket(CHANNELS, Duration::ZERO).await?,
            snapshots: bucket(SNAPSHOTS, Duration::ZERO).await?,
            turns: bucket(TURNS, Duration::ZERO).await?,
            providers: bucket(PROVIDERS, Duration::ZERO).await?,
            nodes: bucket(NODES, Duration::ZERO).await?,
            leases: bucket(lease::LEASES, lease).await?,
            settings: bucket(super::SETTINGS, Duration::ZERO).await?,
            js,
            stream,
            audit,
            reconnected,
        })
    }

    /// Read `uri`'s messages from stream sequence `from` on, keeping the
    /// actions from journal position `at` on.
    pub(super) async fn read_channel(
        &self,
        uri: &ChannelUri,
        from: u64,
        at: u64,
    ) -> Result<ChannelRead, JournalError> {
        let subject = subject(uri);
        let mut read = ChannelRead {
            tail: Vec::new(),
            tail_origins: Vec::new(),
            len: at,
            last_seq: 0,
            turn_count: 0,
            turns: Vec::new(),
            truncations: Vec::new(),
        };
        let mut seq = from.max(1);
        while let Some(msg) = self.next_on(&subject, seq).await? {
            seq = msg.sequence + 1;
            read.last_seq = msg.sequence;
            let Some(pos) = msg
                .headers
                .get(POS_HEADER)
                .and_then(|v| v.as_str().parse::<u64>().ok())
            else {
                continue; // a fence
            };
            let batch: BatchMsg = serde_json::from_slice(&msg.payload).map_err(|e| {
                JournalError::Unavailable(format!(
                    "{uri}: stored batch at stream sequence {} does not decode: {e}",
                    msg.sequence
                ))
            })?;
            for (i, r) in batch.records.iter().enumerate() {
                if pos + i as u64 >= at {
                    read.tail_origins
                        .push(batch.origins.get(i).cloned().flatten());
                    read.tail.push(Record::from(r.get()));
                }
            }
            read.len = read.len.max(pos + batch.records.len() as u64);
            if let Some(from) = batch.truncate_turns_from {
                read.truncations.push(from);
                read.turns.retain(|t| t.index < from);
                read.turn_count = read.turn_count.min(from);
            }
            for t in batch.turns {
                read.turn_count = read.turn_count.max(t.index + 1);
                read.turns.push(TurnRecord {
                    index: t.index,
                    json: Arc::from(t.json.get()),
                });
            }
        }
        if read.tail_origins.iter().all(Option::is_none) {
            read.tail_origins = Vec::new();
        }
        Ok(read)
    }

    /// The first message on `subject` at stream sequence `seq` or later.
    async fn next_on(
        &self,
        subject: &str,
        seq: u64,
    ) -> Result<Option<async_nats::jetstream::message::StreamMessage>, JournalError> {
        next_in(&self.stream, subject, seq).await
    }

    /// Append `entries` to their sessions' audit logs, each retried a few
    /// times: the batch they belong to is stored already.
    pub(super) async fn put_audit(&self, entries: &[crate::store::AuditRecord]) {
        for a in entries {
            let subject = audit_subject(&a.session);
            let mut tries = 0;
            loop {
                let sent = async {
                    self.js
                        .publish(subject.clone(), Bytes::from(a.entry.as_bytes().to_vec()))
                        .await?
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string().into())
                };
                let res: Result<(), Box<dyn std::error::Error + Send + Sync>> = sent.await;
                match res {
                    Ok(()) => break,
                    Err(e) if tries >= 3 => {
                        tracing::error!(session = %a.session, error = %e, entry = %a.entry, "audit entry not stored");
                        break;
                    }
                    Err(_) => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(100 << tries)).await;
                    }
                }
            }
        }
    }

    /// Up to `limit` entries of `session`'s audit log after stream sequence
    /// `after`.
    pub(super) async fn audit_page(
        &self,
        session: &str,
        after: u64,
        limit: u64,
    ) -> crate::store::AuditPage {
        let subject = audit_subject(session);
        let mut page = Vec::new();
        let mut seq = after.saturating_add(1);
        while (page.len() as u64) < limit {
            let Some(msg) = next_in(&self.audit, &subject, seq).await? else {
                break;
            };
            seq = msg.sequence + 1;
            let text = std::str::from_utf8(&msg.payload)
                .map_err(|e| unavailable("read the audit log", e))?;
            page.push((msg.sequence, Arc::from(text)));
        }
        Ok(page)
    }

    /// The nodes that wrote `uri`'s messages after stream sequence `after`
    /// (a batch's writer, or a fence's).
    pub(super) async fn writers_after(
        &self,
        uri: &ChannelUri,
        after: u64,
    ) -> Result<Vec<String>, JournalError> {
        let subject = subject(uri);
        let mut writers = Vec::new();
        let mut seq = after + 1;
        while let Some(msg) = self.next_on(&subject, seq).await? {
            seq = msg.sequence + 1;
            let writer = msg
                .headers
                .get(NODE_HEADER)
                .or_else(|| msg.headers.get(FENCE_HEADER))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            writers.push(writer);
        }
        Ok(writers)
    }

    /// The channel with its snapshot and tail; its turns in the bucket
    /// brought up to date.
    pub(super) async fn load(
        &self,
        info: ChannelInfo,
    ) -> Result<(RecoveredChannel, u64), JournalError> {
        let key = token(&info.uri);
        let snap = self
            .snapshots
            .get(key.clone())
            .await
            .map_err(|e| unavailable("read a snapshot", e))?;
        let (snapshot, from, turns_at_snapshot) = match &snap {
            Some(bytes) => {
                let s: SnapshotMsg = serde_json::from_slice(bytes).map_err(|e| {
                    JournalError::Unavailable(format!(
                        "{}: snapshot does not decode: {e}",
                        info.uri
                    ))
                })?;
                (
                    Some(SnapshotRecord {
                        at_seq: JournalPos::new(s.at_seq),
                        state: Arc::from(s.state.get()),
                    }),
                    s.from_stream_seq,
                    s.turn_count,
                )
            }
            None => (None, 0, 0),
        };
        let at = snapshot.as_ref().map_or(0, |s| s.at_seq.get());
        let read = self.read_channel(&info.uri, from, at).await?;
        for from in &read.truncations {
            self.delete_turns(&key, *from, turns_at_snapshot.max(read.turn_count))
                .await;
        }
        for t in &read.turns {
            self.put_turn(&key, t).await?;
        }
        let turn_count = if read.truncations.is_empty() {
            turns_at_snapshot.max(read.turn_count)
        } else {
            read.turn_count
        };
        let channel = RecoveredChannel {
            info,
            snapshot,
            tail: read.tail,
            tail_origins: read.tail_origins,
            len: JournalPos::new(read.len),
            turn_count,
        };
        Ok((channel, read.last_seq))
    }

    pub(super) async fn put_turn(&self, chat: &str, t: &TurnRecord) -> Result<(), JournalError> {
        self.turns
            .put(
                format!("{chat}.{}", t.index),
                Bytes::copy_from_slice(t.json.as_bytes()),
            )
            .await
            .map(|_| ())
            .map_err(|e| unavailable("store a turn", e))
    }

    pub(super) async fn delete_turns(&self, chat: &str, from: u64, to: u64) {
        for i in from..to {
            let _ = self.turns.purge(format!("{chat}.{i}")).await;
        }
    }

    pub(super) async fn recover(
        &self,
    ) -> Result<(Recovered, Vec<(ChannelUri, Chan)>), JournalError> {
        // Channels in creation order.
        let mut keys = self
            .channels
            .keys()
            .await
            .map_err(|e| unavailable("list channels", e))?;
        let mut infos = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| unavailable("list channels", e))?;
            let Some(entry) = self
                .channels
                .entry(key.clone())
                .await
                .map_err(|e| unavailable("read a channel", e))?
            else {
                continue;
            };
            if entry.operation != kv::Operation::Put {
                continue;
            }
            let msg: ChannelMsg = serde_json::from_slice(&entry.value).map_err(|e| {
                JournalError::Unavailable(format!("channel record {key} does not decode: {e}"))
            })?;
            let Some(info) = msg.info() else {
                return Err(JournalError::Unavailable(format!(
                    "channel record {key} has an unknown kind"
                )));
            };
            infos.push((entry.revision, info));
        }
        // Sessions before chats (their records are written concurrently),
        // each in creation order.
        infos.sort_by_key(|(rev, info)| (info.kind != ChannelKind::Session, *rev));
        let mut channels = Vec::with_capacity(infos.len());
        let mut chans = Vec::with_capacity(infos.len());
        for (_, info) in infos {
            let uri = info.uri.clone();
            let (c, last_seq) = self.load(info).await?;
            chans.push((
                uri,
                Chan {
                    len: c.len.get(),
                    projected: c.len.get(),
                    last_seq,
                    turns: c.turn_count,
                    ..Chan::default()
                },
            ));
            channels.push(c);
        }
        let mut provider_owners = BTreeMap::new();
        let mut keys = self
            .providers
            .keys()
            .await
            .map_err(|e| unavailable("list providers", e))?;
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| unavailable("list providers", e))?;
            if let Some(v) = self
                .providers
                .get(key)
                .await
                .map_err(|e| unavailable("read a provider", e))?
            {
                if let Ok(o) = serde_json::from_slice::<OwnerMsg>(&v) {
                    provider_owners.insert(o.provider, o.subject);
                }
            }
        }
        Ok((
            Recovered {
                channels,
                seq_floor: ServerSeq::ZERO,
                provider_owners,
            },
            chans,
        ))
    }
}

/// The first message on `subject` in `stream` from sequence `seq` on.
async fn next_in(
    stream: &stream::Stream,
    subject: &str,
    seq: u64,
) -> Result<Option<async_nats::jetstream::message::StreamMessage>, JournalError> {
    let got = stream
        .raw_message_builder()
        .sequence(seq)
        .next_by_subject(subject.to_owned())
        .send()
        .await;
    match got {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(unavailable("read the journal", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnection_backs_off_but_retries_several_times_per_lease() {
        let lease = Duration::from_secs(10);
        assert_eq!(reconnect_delay(1, lease), Duration::from_millis(1));
        assert_eq!(reconnect_delay(4, lease), Duration::from_millis(8));
        assert_eq!(reconnect_delay(12, lease), Duration::from_millis(1250));
        assert_eq!(
            reconnect_delay(usize::MAX, lease),
            Duration::from_millis(1250)
        );
        assert_eq!(
            reconnect_delay(20, Duration::from_secs(2)),
            Duration::from_millis(250)
        );
        assert_eq!(
            reconnect_delay(20, Duration::from_secs(120)),
            Duration::from_secs(4)
        );
    }
}
