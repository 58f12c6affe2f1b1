//! Which node writes a channel: this node's leases, renewed in the
//! background and taken back after an outage only if nobody wrote
//! meanwhile, and the fence message that makes a takeover final.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;

use super::{lease, publish_error, subject, unavailable, JetStreamJournal, FENCE_HEADER};
use crate::ids::ChannelUri;
use crate::store::JournalError;

impl JetStreamJournal {
    /// Renew every lease this node holds, three times per lease time; a
    /// lease that cannot be renewed is lost, and the channel's appends are
    /// refused from then on.
    pub(super) fn start_renewing(&self) {
        let weak = Arc::downgrade(&self.inner);
        let period = renewal_period(self.inner.lease);
        self.inner.rt.spawn(every(period, weak, |inner| async move {
                let journal = JetStreamJournal { inner };
                let leases = journal.leases();
                let held: Vec<lease::Lease> =
                    journal.inner.owned.lock().values().cloned().collect();
                for l in held {
                    let uri = ChannelUri::from(l.channel.as_str());
                    if journal.refused(&uri) {
                        // Held but no longer appended to here (a fence
                        // refused this node's append): renewing would keep
                        // the channel written by nobody. Given up, another
                        // node — or this one, once it has read the channel
                        // again — takes it over and ends what was open.
                        journal.inner.disown(&uri);
                        leases.release(&l).await;
                        tracing::warn!(channel = %uri, "lease given up: this node's appends to the channel are refused");
                        continue;
                    }
                    match leases.renew_here(&l).await {
                        Ok(renewed) => {
                            let mut owned = journal.inner.owned.lock();
                            if let Some(slot) = owned.get_mut(l.channel.as_str()) {
                                *slot = renewed;
                            }
                        }
                        Err(lease::LeaseError::Lost(_)) => {
                            journal.inner.disown(&uri);
                            // Expired (NATS was away longer than the lease):
                            // take it again if nobody else wrote meanwhile.
                            match journal.reown(&uri).await {
                                Ok(()) => {
                                    tracing::warn!(channel = %uri, "lease expired and was taken again; nothing was written meanwhile")
                                }
                                Err(e) => {
                                    tracing::error!(channel = %uri, node = %journal.inner.node, error = %e, "lease lost: this node no longer writes the channel");
                                    journal.lost(&uri, "this node's lease on the channel was lost");
                                }
                            }
                        }
                        Err(e) => {
                            // NATS unreachable: keep trying while the lease
                            // may still hold; appends fail meanwhile anyway.
                            tracing::warn!(channel = %l.channel, error = %e, "lease not renewed");
                        }
                    }
                }
        }));
    }

    /// Take `channel` for this node: its lease, then a fence on its
    /// subject. Fails when another live node holds it.
    pub async fn own(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let lease = self.leases().acquire(channel).await.map_err(|e| match e {
            lease::LeaseError::Store(e) => e,
            e => JournalError::Fenced {
                channel: channel.clone(),
                reason: e.to_string(),
            },
        })?;
        self.inner
            .owned
            .lock()
            .insert(channel.clone(), lease.clone());
        if let Err(e) = self.fence(channel).await {
            self.inner.owned.lock().remove(channel);
            self.leases().release(&lease).await;
            return Err(e);
        }
        Ok(())
    }

    /// Take a channel this node had back after its lease expired: only if
    /// nobody holds it and nothing was written since this node's last
    /// append (its state here is then still the truth).
    async fn reown(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let lease = self
            .leases()
            .acquire_here(channel.to_string())
            .await
            .map_err(|e| JournalError::Unavailable(e.to_string()))?;
        let known = self
            .inner
            .chans
            .lock()
            .get(channel)
            .map_or(0, |c| c.last_seq);
        // Only this node's own writes since (an append stored whose
        // acknowledgement was lost) leave the channel this node's.
        let writers = self.inner.nats.writers_after(channel, known).await;
        match writers {
            Ok(w) if w.iter().all(|n| *n == self.inner.node) => {
                self.inner.owned.lock().insert(channel.clone(), lease);
                Ok(())
            }
            Ok(w) => {
                self.leases().release(&lease).await;
                Err(JournalError::Fenced {
                    channel: channel.clone(),
                    reason: format!(
                        "another node wrote to the channel while this node's lease had expired (writers since: {})",
                        w.join(", ")
                    ),
                })
            }
            Err(e) => {
                self.leases().release(&lease).await;
                Err(e)
            }
        }
    }

    /// Take `channel` over from whoever wrote it last: a fence message on
    /// its subject, after which an earlier owner's appends are refused. The
    /// caller holds the channel's lease. The fence expects the channel's
    /// last message to be the one this node read (at recovery, or now), so
    /// a write it has not seen makes the fence, and the takeover, fail.
    pub async fn fence(&self, channel: &ChannelUri) -> Result<(), JournalError> {
        let inner = self.inner.clone();
        let uri = channel.clone();
        self.inner
            .rt
            .spawn(async move {
                // Recovery already read the channel; read it only when not.
                let known = inner
                    .chans
                    .lock()
                    .get(&uri)
                    .map(|c| (c.len, c.last_seq, c.turns));
                let (len, last_seq, turns) = match known {
                    Some(k) => k,
                    None => {
                        let read = inner.nats.read_channel(&uri, 0, 0).await?;
                        (read.len, read.last_seq, read.turn_count)
                    }
                };
                // Anything written since is caught here: the fence then
                // fails and this node does not own the channel.
                let msg = jetstream::message::PublishMessage::build()
                    .header(FENCE_HEADER, inner.node.as_str())
                    .expected_last_subject_sequence(last_seq)
                    .payload(Bytes::new());
                let ack = inner
                    .nats
                    .js
                    .send_publish(subject(&uri), msg)
                    .await
                    .map_err(|e| unavailable("fence", e))?
                    .await
                    .map_err(|e| publish_error(&uri, e))?;
                let mut chans = inner.chans.lock();
                let c = chans.entry(uri).or_default();
                c.len = len;
                c.projected = len;
                c.last_seq = ack.sequence;
                c.turns = turns;
                c.fenced = None;
                Ok(())
            })
            .await
            .map_err(|e| unavailable("fence", e))?
    }

    /// Whether this node holds `channel`'s lease and still appends to it
    /// (no fence has refused it since).
    pub(super) fn writes(&self, channel: &ChannelUri) -> bool {
        !self.refused(channel) && self.inner.owned.lock().contains_key(channel)
    }

    /// Whether appends to `channel` are refused here (a fence moved the
    /// channel on, or the lease was lost).
    pub(super) fn refused(&self, channel: &ChannelUri) -> bool {
        self.inner
            .chans
            .lock()
            .get(channel)
            .is_some_and(|c| c.fenced.is_some())
    }

    /// Refuse further appends to `channel` (this node lost it).
    pub fn lost(&self, channel: &ChannelUri, why: &str) {
        let mut chans = self.inner.chans.lock();
        chans.entry(channel.clone()).or_default().fenced = Some(why.to_owned());
    }
}

/// How often the leases are renewed: three times per lease time, so a
/// renewal can fail twice (NATS briefly away) before a lease expires.
fn renewal_period(lease: Duration) -> Duration {
    lease / 3
}

/// Run `round` every `period` while `owner` lives, the first one `period`
/// after the start. A round that overruns the period (NATS slow to answer)
/// delays the next one by as much rather than bunching the missed ones.
async fn every<T, F, Fut>(period: Duration, owner: Weak<T>, mut round: F)
where
    F: FnMut(Arc<T>) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(owner) = owner.upgrade() else {
            return;
        };
        round(owner).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    const LEASE: Duration = Duration::from_secs(3);

    /// Rounds on paused time: each one reports when it ran, and takes
    /// `busy[i]` (simulated time) to finish.
    fn rounds(owner: &Arc<()>, busy: Vec<Duration>) -> mpsc::UnboundedReceiver<Instant> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut busy = busy.into_iter();
        tokio::spawn(every(
            renewal_period(LEASE),
            Arc::downgrade(owner),
            move |_| {
                let _ = tx.send(Instant::now());
                let took = busy.next().unwrap_or_default();
                async move { tokio::time::advance(took).await }
            },
        ));
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn leases_are_renewed_three_times_per_lease_time() {
        let owner = Arc::new(());
        let start = Instant::now();
        let mut ran = rounds(&owner, Vec::new());
        for n in 1..=6u32 {
            let at = ran.recv().await.expect("a renewal round");
            assert_eq!(at - start, LEASE * n / 3, "round {n}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_renewal_delays_the_next_instead_of_bunching_them() {
        let owner = Arc::new(());
        let start = Instant::now();
        // The first round takes two periods and a half (NATS slow to answer).
        let period = renewal_period(LEASE);
        let mut ran = rounds(&owner, vec![period * 5 / 2]);
        assert_eq!(ran.recv().await.expect("round 1") - start, period);
        let second = ran.recv().await.expect("round 2") - start;
        let third = ran.recv().await.expect("round 3") - start;
        assert_eq!(second, period * 7 / 2, "at once when it is overdue");
        assert_eq!(third - second, period, "then a period apart");
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_stop_when_the_journal_is_gone() {
        let owner = Arc::new(());
        let mut ran = rounds(&owner, Vec::new());
        ran.recv().await.expect("a renewal round while it lives");
        drop(owner);
        assert!(
            ran.recv().await.is_none(),
            "no round after the journal went, and the task ended"
        );
    }
}
