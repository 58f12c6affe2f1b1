//! Latency histograms (HDR, microseconds) and the loss / duplicate / order
//! checker every receiver runs.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

/// Highest latency a histogram holds, in microseconds (one hour).
const MAX_US: u64 = 3_600_000_000;

/// A latency histogram in microseconds, 3 significant figures.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// Record a latency given in nanoseconds.
pub fn record_ns(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record((ns / 1_000).clamp(1, MAX_US));
}

/// Percentiles of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Summary {
    /// Summarize `h` (all zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1_000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            mean_ms: h.mean() / 1_000.0,
        }
    }
}

/// A counter many threads add to without sharing a cache line: each adder
/// picks a shard by key, readers sum the shards.
pub struct ShardedCounter {
    shards: Vec<PaddedU64>,
}

#[repr(align(128))]
#[derive(Default)]
struct PaddedU64(std::sync::atomic::AtomicU64);

impl ShardedCounter {
    /// A counter with `shards` shards (at least one).
    pub fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| PaddedU64::default()).collect(),
        }
    }

    /// Add `n` on the shard for `key`.
    pub fn add(&self, key: usize, n: u64) {
        self.shards[key % self.shards.len()]
            .0
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The total so far.
    pub fn load(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

/// Histograms shared by many receiver tasks: each task buffers samples
/// locally and flushes them into one of a few shards, so recording costs a
/// push on the hot path and a short uncontended lock now and then.
pub struct ShardedHist {
    shards: Vec<Mutex<Histogram<u64>>>,
}

impl ShardedHist {
    /// `n` shards.
    pub fn new(n: usize) -> Self {
        Self {
            shards: (0..n.max(1)).map(|_| Mutex::new(new_hist())).collect(),
        }
    }

    /// Record nanosecond samples into shard `key % n`.
    pub fn flush(&self, key: usize, samples_ns: &mut Vec<u64>) {
        if samples_ns.is_empty() {
            return;
        }
        let mut h = self.shards[key % self.shards.len()].lock();
        for &ns in samples_ns.iter() {
            record_ns(&mut h, ns);
        }
        samples_ns.clear();
    }

    /// Record nanosecond samples into shard `key % n`, keeping them.
    pub fn record(&self, key: usize, samples_ns: &[u64]) {
        if samples_ns.is_empty() {
            return;
        }
        let mut h = self.shards[key % self.shards.len()].lock();
        for &ns in samples_ns {
            record_ns(&mut h, ns);
        }
    }

    /// All shards merged.
    pub fn merged(&self) -> Histogram<u64> {
        let mut out = new_hist();
        for s in &self.shards {
            let _ = out.add(&*s.lock());
        }
        out
    }
}

/// What one received item was, relative to those before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First time, in order.
    New,
    /// First time, but after a later one (it overtook nothing; it was overtaken).
    Late,
    /// Already seen.
    Duplicate,
}

/// Per-publisher bookkeeping of one receiver: which counters `n` (1, 2, …)
/// arrived, how many twice, how many out of order, and the longest
/// contiguous prefix 1..=prefix.
#[derive(Debug, Default, Clone)]
pub struct SeqChecker {
    bits: Vec<u64>,
    /// Distinct counters seen.
    pub unique: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Highest counter seen.
    pub max: u64,
    /// Every counter in 1..=prefix has been seen.
    pub prefix: u64,
}

impl SeqChecker {
    fn test_and_set(&mut self, n: u64) -> bool {
        let (w, b) = ((n / 64) as usize, n % 64);
        if w >= self.bits.len() {
            self.bits.resize(w + 1 + w / 2, 0);
        }
        let was = self.bits[w] & (1 << b) != 0;
        self.bits[w] |= 1 << b;
        was
    }

    /// Whether counter `n` has been seen.
    pub fn contains(&self, n: u64) -> bool {
        let (w, b) = ((n / 64) as usize, n % 64);
        self.bits.get(w).is_some_and(|x| x & (1 << b) != 0)
    }

    /// Record counter `n`.
    pub fn observe(&mut self, n: u64) -> Seen {
        if self.test_and_set(n) {
            self.duplicates += 1;
            return Seen::Duplicate;
        }
        self.unique += 1;
        let seen = if n < self.max {
            self.reordered += 1;
            Seen::Late
        } else {
            self.max = n;
            Seen::New
        };
        while self.contains(self.prefix + 1) {
            self.prefix += 1;
        }
        seen
    }

    /// How many of the counters in 1..=upto were never seen.
    pub fn missing_upto(&self, upto: u64) -> u64 {
        (1..=upto).filter(|&n| !self.contains(n)).count() as u64
    }
}

/// `serverSeq` must strictly increase on one connection (DESIGN invariant 2).
#[derive(Debug, Default, Clone)]
pub struct SeqOrder {
    /// Highest `serverSeq` seen.
    pub last: u64,
    /// Envelopes whose `serverSeq` equalled the previous one.
    pub duplicates: u64,
    /// Envelopes whose `serverSeq` went backwards.
    pub reordered: u64,
}

impl SeqOrder {
    /// Start after `seq` (a snapshot's `fromSeq`).
    pub fn after(seq: u64) -> Self {
        Self {
            last: seq,
            ..Self::default()
        }
    }

    /// Record an envelope's `serverSeq`: `New` when it increased,
    /// `Duplicate` when it repeated the last one, `Late` when it went back.
    pub fn observe(&mut self, seq: u64) -> Seen {
        if seq > self.last {
            self.last = seq;
            Seen::New
        } else if seq == self.last {
            self.duplicates += 1;
            Seen::Duplicate
        } else {
            self.reordered += 1;
            Seen::Late
        }
    }
}

/// Loss, duplicates and reordering summed over receivers.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Integrity {
    /// Accepted actions some subscriber never received.
    pub lost: u64,
    /// Actions a subscriber received more than once.
    pub duplicated: u64,
    /// Actions that arrived after a later one from the same publisher, plus
    /// envelopes whose `serverSeq` did not increase on their connection.
    pub reordered: u64,
}

impl Integrity {
    /// Sum.
    pub fn add(&mut self, o: Integrity) {
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
    }

    /// All zero.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.reordered == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_counts_loss_duplicates_and_reordering() {
        let mut c = SeqChecker::default();
        for n in [1, 2, 4, 3, 3, 6, 200] {
            c.observe(n);
        }
        assert_eq!(c.unique, 6);
        assert_eq!(c.duplicates, 1);
        assert_eq!(c.reordered, 1, "3 after 4");
        assert_eq!(c.prefix, 4);
        assert_eq!(c.missing_upto(6), 1, "5 never came");
        assert_eq!(c.max, 200);
        c.observe(5);
        assert_eq!(c.prefix, 6);
    }

    #[test]
    fn server_seq_must_increase() {
        let mut o = SeqOrder::after(10);
        assert_eq!(o.observe(11), Seen::New);
        assert_eq!(o.observe(11), Seen::Duplicate);
        assert_eq!(o.observe(9), Seen::Late);
        assert_eq!(o.observe(12), Seen::New);
        assert_eq!((o.duplicates, o.reordered, o.last), (1, 1, 12));
    }

    #[test]
    fn summary_reports_percentiles_in_ms() {
        let sh = ShardedHist::new(4);
        let mut buf: Vec<u64> = (1..=1000).map(|i| i * 1_000_000).collect(); // 1..1000 ms
        sh.flush(3, &mut buf);
        assert!(buf.is_empty());
        let s = Summary::of(&sh.merged());
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_ms - 990.0).abs() < 1.0, "{s:?}");
        assert!((s.max_ms - 1000.0).abs() < 1.0, "{s:?}");
        assert_eq!(Summary::of(&new_hist()), Summary::default());
    }
}
