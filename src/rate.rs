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

use std::time::{Duration, Instant};

use dashmap::DashMap;

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

/// One principal's shared buckets.
struct PrincipalBuckets {
    /// Bytes of actions the journal may still write for it.
    journal_bytes: Bucket,
    /// Bytes of frames read from it.
    inbound_bytes: Bucket,
    /// Requests (other than `dispatchAction` and `ping`) handled for it.
    requests: Bucket,
}

/// Every principal's buckets, by key (see the module doc).
#[derive(Default)]
pub struct Principals {
    buckets: DashMap<String, PrincipalBuckets>,
}

impl Principals {
    fn with<R>(
        &self,
        key: &str,
        limits: &Limits,
        now: Instant,
        f: impl FnOnce(&mut PrincipalBuckets) -> R,
    ) -> R {
        // Known principals (every frame but a principal's first) need no
        // owned key.
        if let Some(mut known) = self.buckets.get_mut(key) {
            return f(&mut known);
        }
        let mut entry = self
            .buckets
            .entry(key.to_owned())
            .or_insert_with(|| PrincipalBuckets {
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
            });
        f(&mut entry)
    }

    /// Account for a frame of `bytes` read from principal `key` (a request
    /// when `request`): how long to wait before handling it.
    pub fn pace(
        &self,
        key: &str,
        bytes: usize,
        request: bool,
        limits: &Limits,
        now: Instant,
    ) -> Duration {
        self.with(key, limits, now, |b| {
            let read = b.inbound_bytes.debit(bytes as f64, now);
            let asked = if request {
                b.requests.debit(1.0, now)
            } else {
                Duration::ZERO
            };
            read.max(asked)
        })
    }

    /// Forget a principal (a connection that was its own principal closed).
    pub fn forget(&self, key: &str) {
        self.buckets.remove(key);
        crate::memory::shrink_if_sparse(&self.buckets);
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

    /// Take one dispatch of `bytes` for principal `key`, or say no (and
    /// take nothing).
    pub fn take(
        &mut self,
        principals: &Principals,
        key: &str,
        bytes: usize,
        limits: &Limits,
        now: Instant,
    ) -> bool {
        if !self.count.has(1.0, now) {
            return false;
        }
        let bytes = bytes as f64;
        principals.with(key, limits, now, |b| {
            if !b.journal_bytes.has(bytes, now) {
                return false;
            }
            b.journal_bytes.take(bytes);
            self.count.take(1.0);
            true
        })
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
        let p = Principals::default();
        let mut b = DispatchBudget::new(&limits, t0);
        assert!(b.take(&p, "a", 600, &limits, t0));
        assert!(
            !b.take(&p, "a", 600, &limits, t0),
            "the bytes bucket is short"
        );
        assert!(
            b.take(&p, "a", 400, &limits, t0),
            "a smaller one still fits"
        );
        for _ in 0..8 {
            assert!(b.take(&p, "a", 0, &limits, t0));
        }
        assert!(!b.take(&p, "a", 0, &limits, t0), "ten dispatches per burst");
        let later = t0 + Duration::from_millis(500);
        assert!(
            b.take(&p, "a", 400, &limits, later),
            "half a second refills 5 and 500 bytes"
        );
        assert!(!b.take(&p, "a", 400, &limits, later));
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
        assert!(DispatchBudget::new(&limits, t0).take(&p, "a", 1000, &limits, t0));
        assert!(
            !DispatchBudget::new(&limits, t0).take(&p, "a", 1, &limits, t0),
            "a fresh connection gets no fresh budget"
        );
        assert!(
            DispatchBudget::new(&limits, t0).take(&p, "b", 1000, &limits, t0),
            "another principal has its own"
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
        let p = Principals::default();
        assert!(DispatchBudget::new(&limits, t0).take(&p, "a", 1000, &limits, t0));
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
        for _ in 0..20 {
            assert_eq!(
                p.pace("a", 10, true, &limits, t0),
                Duration::ZERO,
                "the burst"
            );
        }
        assert_eq!(
            p.pace("a", 10, true, &limits, t0),
            Duration::from_millis(100),
            "one request over: a tenth of a second"
        );
        assert_eq!(
            p.pace("b", 10, true, &limits, t0),
            Duration::ZERO,
            "another principal"
        );
        assert_eq!(
            p.pace("c", 3000, false, &limits, t0),
            Duration::from_secs(1),
            "a thousand bytes over at a thousand per second"
        );
        p.forget("c");
        assert_eq!(p.pace("c", 10, false, &limits, t0), Duration::ZERO);
    }
}
