//! Writing one envelope to a big room from more than one thread.
//!
//! Once an envelope is queued on every subscriber (under the publisher
//! lock, which fixes the order), what is left is one socket write per
//! subscriber. For a room of a thousand that is a few milliseconds of one
//! thread's time, and on loopback each write also wakes the reader, which
//! the kernel tends to put on the writing thread's own core (a socket
//! wake-up is a "sync" one: the waker is expected to sleep soon), so the
//! readers and the writer take turns on one core while the other idles.
//! Handing shares of a big room to helper threads writes it on every
//! core: the publishing thread writes the first share itself and each
//! helper one more, at the cost of one hand-off per helper.
//!
//! Order per connection is not at stake: the frames are already queued,
//! and whichever thread flushes a connection takes its queue in order under
//! that connection's lock and is its only writer until the write returns
//! ([`Outbound::flush`]; the lock itself is released during the write, so
//! the publisher queueing the next frame never waits for a helper's system
//! call). Shares go to the helpers in turn, and a helper far behind hands
//! the next share back to the publisher.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use super::Outbound;

/// Least subscribers in one share: a room under twice this is written by
/// the publishing thread alone (a hand-off costs about as much as a few
/// dozen writes).
pub const MIN_SHARE: usize = 256;

/// Shares a helper may have waiting before the publisher writes the next
/// one itself: a helper that falls far behind slows the publisher down
/// instead of letting its shares pile up without bound. Generous, because
/// a helper a few shares behind is what lets a busy room's frames share
/// writes (with 2, the publisher's own writes halved the most a room of a
/// thousand was sent: loadtest/README.md, "A big room on every core").
pub const MAX_PENDING: usize = 32;

/// One helper's share of a room.
struct Job {
    subs: Arc<Vec<Arc<Outbound>>>,
    range: Range<usize>,
}

/// A helper thread: its queue and how many shares wait in it.
struct Helper {
    tx: mpsc::Sender<Job>,
    pending: Arc<AtomicUsize>,
}

/// The helper threads (none on one core, or with `--fanout-threads 0`).
#[derive(Default)]
pub struct Fanout {
    helpers: Vec<Helper>,
    /// Which helper takes the next room's first handed-off share, so rooms
    /// that need fewer helpers than there are still use them all.
    next: AtomicUsize,
}

impl Fanout {
    /// Start `threads` helpers; they end when this is dropped.
    pub fn new(threads: usize) -> Self {
        let mut helpers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::channel::<Job>();
            let pending = Arc::new(AtomicUsize::new(0));
            let done = pending.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tandem-fanout-{i}"))
                .spawn(move || {
                    for job in rx {
                        flush_all(&job.subs[job.range]);
                        done.fetch_sub(1, Ordering::AcqRel);
                    }
                });
            match spawned {
                Ok(_) => helpers.push(Helper { tx, pending }),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a fan-out thread; big rooms are written by fewer threads");
                    break;
                }
            }
        }
        Self {
            helpers,
            next: AtomicUsize::new(0),
        }
    }

    /// Helper threads running.
    pub fn threads(&self) -> usize {
        self.helpers.len()
    }

    /// Write what is queued on every connection of `subs`: the first share
    /// on this thread, the others on helpers (here too when a helper
    /// already has [`MAX_PENDING`] shares waiting).
    pub fn flush(&self, subs: &Arc<Vec<Arc<Outbound>>>) {
        let mut shares = shares(subs.len(), self.helpers.len()).into_iter();
        let Some(own) = shares.next() else {
            return;
        };
        let first = if shares.len() > 0 {
            self.next.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        for (k, range) in shares.enumerate() {
            let helper = &self.helpers[(first + k) % self.helpers.len()];
            if helper.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
                helper.pending.fetch_sub(1, Ordering::AcqRel);
                flush_all(&subs[range]);
                continue;
            }
            let job = Job {
                subs: subs.clone(),
                range,
            };
            if let Err(mpsc::SendError(job)) = helper.tx.send(job) {
                // The helper is gone (it cannot panic on its own, but if it
                // did): its share is written here.
                helper.pending.fetch_sub(1, Ordering::AcqRel);
                flush_all(&job.subs[job.range]);
            }
        }
        flush_all(&subs[own]);
    }
}

fn flush_all(subs: &[Arc<Outbound>]) {
    for s in subs {
        s.flush();
    }
}

/// `n` subscribers cut into contiguous shares of at least [`MIN_SHARE`]
/// whose sizes differ by one at most, one for the caller and at most one
/// per helper; the first is the caller's. Empty for an empty room.
pub fn shares(n: usize, helpers: usize) -> Vec<Range<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let parts = (helpers + 1).min(n / MIN_SHARE).max(1);
    let (size, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|k| {
            let len = size + usize::from(k < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}
