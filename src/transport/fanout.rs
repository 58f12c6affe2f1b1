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
//! and whichever thread flushes a connection writes its queue in order
//! under that connection's lock ([`Outbound::flush`]).
//!
//! Each thread writes its share with one system call per batch of
//! connections where it can ([`Outbound::flush_all`]; `--no-io-uring` turns it
//! off).
//!
//! A helper's queue is bounded by what it has not yet written: with
//! [`MAX_BACKLOG`] shares waiting on it (it is starved of a core, or more
//! serving threads publish than the helpers keep up with), the publishing
//! thread writes the next share itself. The room's subscribers then wait
//! for at most that backlog, publishing slows to the pace the writes
//! allow, and no queue of hand-offs grows without end.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use super::Outbound;

/// Least subscribers in one share: a room under twice this is written by
/// the publishing thread alone, so a hand-off (a wake-up of another
/// thread) is only paid where it saves hundreds of writes.
pub const MIN_SHARE: usize = 256;

/// Most shares waiting on one helper before the publishing thread writes
/// the next one itself (a share is at least [`MIN_SHARE`] writes, so this
/// is a few milliseconds of one core's work).
pub const MAX_BACKLOG: usize = 8;

/// One helper's share of a room.
struct Job {
    subs: Arc<Vec<Arc<Outbound>>>,
    range: Range<usize>,
}

/// A helper thread's queue, and how many shares on it are not yet written.
struct Helper {
    tx: mpsc::Sender<Job>,
    backlog: Arc<AtomicUsize>,
}

/// The helper threads (none on one core, or with `--fanout-threads 0`).
pub struct Fanout {
    helpers: Vec<Helper>,
    /// Where the next room's first helper share goes: rooms too small to
    /// need every helper take turns, rather than all queue on the first.
    next: AtomicUsize,
    /// Batch the writes of many connections in one system call.
    batched: bool,
}

impl Default for Fanout {
    /// No helpers; writes batched.
    fn default() -> Self {
        Self::new(0, true)
    }
}

impl Fanout {
    /// Start `threads` helpers; they end when this is dropped. `batched`:
    /// see [`Outbound::flush_all`].
    pub fn new(threads: usize, batched: bool) -> Self {
        let mut helpers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::channel::<Job>();
            let backlog = Arc::new(AtomicUsize::new(0));
            let left = backlog.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tandem-fanout-{i}"))
                .spawn(move || {
                    for job in rx {
                        Outbound::flush_all(&job.subs[job.range], batched);
                        left.fetch_sub(1, Ordering::Release);
                    }
                });
            match spawned {
                Ok(_) => helpers.push(Helper { tx, backlog }),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a fan-out thread; big rooms are written by fewer threads");
                    break;
                }
            }
        }
        Self {
            helpers,
            next: AtomicUsize::new(0),
            batched,
        }
    }

    /// Helper threads running.
    pub fn threads(&self) -> usize {
        self.helpers.len()
    }

    /// Write what is queued on every connection of `subs`: the first share
    /// on this thread, the others on helpers, each room starting from the
    /// helper after the one the previous room started from. A share whose
    /// helper has [`MAX_BACKLOG`] shares waiting is written here too, after
    /// this thread's own.
    pub fn flush(&self, subs: &Arc<Vec<Arc<Outbound>>>) {
        self.flush_led_by(None, subs);
    }

    /// [`Self::flush`], with `author`'s queue (its echo) written first, in
    /// this thread's first batch, once the helpers have their shares.
    fn flush_led_by(&self, author: Option<&Arc<Outbound>>, subs: &Arc<Vec<Arc<Outbound>>>) {
        let shares = shares(subs.len(), self.helpers.len());
        let mut shares = shares.into_iter();
        let Some(own) = shares.next() else {
            if let Some(a) = author {
                a.flush();
            }
            return;
        };
        let first = if shares.len() == 0 {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed) % self.helpers.len()
        };
        let helpers = self.helpers.iter().cycle().skip(first);
        let mut here = Vec::new();
        for (helper, range) in helpers.zip(shares) {
            // Checked, then counted: two serving threads publishing at once
            // may both pass at MAX_BACKLOG - 1, so the bound can be passed by
            // one share per serving thread, never more.
            if helper.backlog.load(Ordering::Acquire) >= MAX_BACKLOG {
                here.push(range);
                continue;
            }
            helper.backlog.fetch_add(1, Ordering::AcqRel);
            let job = Job {
                subs: subs.clone(),
                range,
            };
            if let Err(mpsc::SendError(job)) = helper.tx.send(job) {
                // The helper is gone (it cannot panic on its own, but if it
                // did): its share is written here.
                helper.backlog.fetch_sub(1, Ordering::AcqRel);
                here.push(job.range);
            }
        }
        let own = &subs[own];
        match author {
            Some(a) => {
                // The echo and the first connections of this share in one
                // system call; the rest of the share after.
                let head = own.len().min(Outbound::BATCH - 1);
                let mut first = Vec::with_capacity(head + 1);
                first.push(a.clone());
                first.extend(own[..head].iter().filter(|s| s.id() != a.id()).cloned());
                Outbound::flush_all(&first, self.batched);
                Outbound::flush_all(&own[head..], self.batched);
            }
            None => Outbound::flush_all(own, self.batched),
        }
        for range in here {
            Outbound::flush_all(&subs[range], self.batched);
        }
    }

    /// Write the author's queue (its echo), then every connection of
    /// `subs`: once the helpers have their shares, the echo is the first
    /// write of this thread's first batch, with the first connections of its
    /// share. One system call wakes the author's client and the room's
    /// first readers rather than one each (in a room of ten a large share
    /// of an action's cost), and in a big room its first frames leave with
    /// the echo instead of after a write of its own.
    pub fn flush_after(&self, author: &Arc<Outbound>, subs: &Arc<Vec<Arc<Outbound>>>) {
        self.flush_led_by(Some(author), subs);
    }

    /// Shares waiting on each helper.
    #[cfg(test)]
    pub(crate) fn backlog(&self) -> Vec<usize> {
        self.helpers
            .iter()
            .map(|h| h.backlog.load(Ordering::Acquire))
            .collect()
    }

    /// Pretend helper `i` has `n` shares waiting (it has none when this is
    /// called; its real shares still count down from `n` as it writes).
    #[cfg(test)]
    pub(crate) fn set_backlog(&self, i: usize, n: usize) {
        self.helpers[i].backlog.store(n, Ordering::Release);
    }
}

/// `n` subscribers cut into contiguous shares of at least [`MIN_SHARE`],
/// one for the caller and at most one per helper; the first is the
/// caller's. Empty for an empty room.
pub fn shares(n: usize, helpers: usize) -> Vec<Range<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let parts = (helpers + 1).min(n / MIN_SHARE).max(1);
    let size = n.div_ceil(parts);
    (0..parts)
        .map(|k| k * size..n.min((k + 1) * size))
        // With hundreds of helpers the last shares can start past the end.
        .filter(|r| !r.is_empty())
        .collect()
}
