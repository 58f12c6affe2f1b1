//! Token buckets for what a client may ask of the server per second.
//!
//! Dispatches are limited per connection (a count per second, refused past
//! it) and per principal (bytes of actions per second, refused past it):
//! bytes are what the journal must write. What a principal sends at all —
//! frames read and requests handled — is *paced*: past its rate the server
//! stops reading that principal's connection until the bucket has refilled,
//! so one tenant's floods cost the others a bounded share of the machine,
//! and an honest burst is slowed, never refused.
//!
//! A principal is the token subject when the server authenticates (a fresh
//! connection gets no fresh budget); without authentication every client is
//! the same local user, so each connection is its own principal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use parking_lot::Mutex;

use crate::config::Limits;

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
    rate: f64,
    burst: f64,
}

impl Bucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            last: now,
            rate,
            burst,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    /// Whether `n` tokens are there (after refilling to `now`), without
    /// taking them.
    pub fn has(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= n
    }

    /// Take `n` tokens; call only after [`Bucket::has`] said yes.
    pub fn take(&mut self, n: f64) {
        self.tokens -= n;
    }

    /// Take `n` tokens even if that leaves a debt, and say how long until
    /// the debt is paid back (zero when there is none).
    pub fn debit(&mut self, n: f64, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= n;
        if self.tokens >= 0.0 || self.rate <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-self.tokens / self.rate)
    }
}

/// One principal's buckets.
struct PrincipalBuckets {
    /// Bytes of actions the journal may still write for it.
    journal_bytes: Bucket,
    /// Bytes of frames read from it.
    inbound_bytes: Bucket,
    /// Requests (other than `dispatchAction` and `ping`) handled for it.
    requests: Bucket,
}

/// A principal's buckets, as a connection holds them: every connection of a
/// principal holds the same ones, and reaches them without looking the
/// principal up again (a frame costs one uncontended lock, not a hash of
/// the key and a lock of the table's shard).
#[derive(Clone)]
pub struct Rates(Arc<Mutex<PrincipalBuckets>>);

impl Rates {
    /// Full buckets from the configured limits. Held only by the caller —
    /// as a connection without authentication holds its own, which go with
    /// it — until handed to others ([`Principals::of`]).
    pub fn own(limits: &Limits, now: Instant) -> Self {
        Self(Arc::new(Mutex::new(PrincipalBuckets {
            // One action of the largest size always fits a full bucket.
            journal_bytes: Bucket::new(
                limits.dispatch_bytes_per_sec,
                limits
                    .dispatch_bytes_burst
                    .max(limits.max_action_bytes as f64),
                now,
            ),
            inbound_bytes: Bucket::new(
                limits.inbound_bytes_per_sec,
                limits.inbound_bytes_per_sec * 2.0,
                now,
            ),
            requests: Bucket::new(limits.requests_per_sec, limits.requests_per_sec * 2.0, now),
        })))
    }

    /// Account for a frame of `bytes` read from the principal (a request
    /// when `request`): how long to wait before handling it.
    pub fn pace(&self, bytes: usize, request: bool, now: Instant) -> Duration {
        let mut b = self.0.lock();
        let read = b.inbound_bytes.debit(bytes as f64, now);
        let asked = if request {
            b.requests.debit(1.0, now)
        } else {
            Duration::ZERO
        };
        read.max(asked)
    }
}

/// The buckets of every authenticated principal, by token subject (see the
/// module doc): a fresh connection of a subject gets the buckets its other
/// connections drew on, and a subject's buckets outlive its connections (a
/// reconnect gets no fresh budget either).
#[derive(Default)]
pub struct Principals {
    buckets: DashMap<String, Rates>,
}

impl Principals {
    /// Principal `key`'s buckets, full ones for a principal not seen before
    /// (asked once per connection, at its start).
    pub fn of(&self, key: &str, limits: &Limits, now: Instant) -> Rates {
        self.buckets
            .entry(key.to_owned())
            .or_insert_with(|| Rates::own(limits, now))
            .clone()
    }
}

/// The dispatch limits of one connection: actions per second of its own,
/// and bytes of actions per second from its principal's shared bucket. A
/// dispatch passes only when both have room, and then takes from both.
#[derive(Debug, Clone)]
pub struct DispatchBudget {
    count: Bucket,
}

impl DispatchBudget {
    /// A full count bucket from the configured limits.
    pub fn new(limits: &Limits, now: Instant) -> Self {
        Self {
            count: Bucket::new(limits.dispatches_per_sec, limits.dispatch_burst, now),
        }
    }

    /// Take one dispatch of `bytes` from the principal's `rates`, or say no
    /// (and take nothing).
    pub fn take(&mut self, rates: &Rates, bytes: usize, now: Instant) -> bool {
        if !self.count.has(1.0, now) {
            return false;
        }
        let bytes = bytes as f64;
        let mut b = rates.0.lock();
        if !b.journal_bytes.has(bytes, now) {
            return false;
        }
        b.journal_bytes.take(bytes);
        self.count.take(1.0);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_buckets_must_have_room_and_refill_over_time() {
        let t0 = Instant::now();
        let limits = Limits {
            dispatches_per_sec: 10.0,
            dispatch_burst: 10.0,
            dispatch_bytes_per_sec: 1000.0,
            dispatch_bytes_burst: 1000.0,
            max_action_bytes: 500,
            ..Limits::default()
        };
        let a = Principals::default().of("a", &limits, t0);
        let mut b = DispatchBudget::new(&limits, t0);
        assert!(b.take(&a, 600, t0));
        assert!(!b.take(&a, 600, t0), "the bytes bucket is short");
        assert!(b.take(&a, 400, t0), "a smaller one still fits");
        for _ in 0..8 {
            assert!(b.take(&a, 0, t0));
        }
        assert!(!b.take(&a, 0, t0), "ten dispatches per burst");
        let later = t0 + Duration::from_millis(500);
        assert!(
            b.take(&a, 400, later),
            "half a second refills 5 and 500 bytes"
        );
        assert!(!b.take(&a, 400, later));
    }

    #[test]
    fn a_new_connection_of_the_same_principal_shares_its_bytes() {
        let t0 = Instant::now();
        let limits = Limits {
            dispatch_bytes_per_sec: 1000.0,
            dispatch_bytes_burst: 1000.0,
            max_action_bytes: 500,
            ..Limits::default()
        };
        let p = Principals::default();
        let first = p.of("a", &limits, t0);
        assert!(DispatchBudget::new(&limits, t0).take(&first, 1000, t0));
        drop(first);
        assert!(
            !DispatchBudget::new(&limits, t0).take(&p.of("a", &limits, t0), 1, t0),
            "a fresh connection gets no fresh budget, even after the others closed"
        );
        assert!(
            DispatchBudget::new(&limits, t0).take(&p.of("b", &limits, t0), 1000, t0),
            "another principal has its own"
        );
        assert!(
            DispatchBudget::new(&limits, t0).take(&Rates::own(&limits, t0), 1000, t0),
            "a connection that is its own principal has its own"
        );
    }

    #[test]
    fn one_action_of_the_largest_size_always_fits_a_full_bucket() {
        let t0 = Instant::now();
        let limits = Limits {
            dispatch_bytes_per_sec: 10.0,
            dispatch_bytes_burst: 10.0,
            max_action_bytes: 1000,
            ..Limits::default()
        };
        assert!(DispatchBudget::new(&limits, t0).take(&Rates::own(&limits, t0), 1000, t0));
    }

    #[test]
    fn pacing_delays_past_the_rate_and_never_refuses() {
        let t0 = Instant::now();
        let limits = Limits {
            requests_per_sec: 10.0,
            inbound_bytes_per_sec: 1000.0,
            ..Limits::default()
        };
        let p = Principals::default();
        let a = p.of("a", &limits, t0);
        for _ in 0..20 {
            assert_eq!(a.pace(10, true, t0), Duration::ZERO, "the burst");
        }
        assert_eq!(
            p.of("a", &limits, t0).pace(10, true, t0),
            Duration::from_millis(100),
            "one request over: a tenth of a second"
        );
        assert_eq!(
            p.of("b", &limits, t0).pace(10, true, t0),
            Duration::ZERO,
            "another principal"
        );
        assert_eq!(
            Rates::own(&limits, t0).pace(3000, false, t0),
            Duration::from_secs(1),
            "a thousand bytes over at a thousand per second"
        );
    }
}
