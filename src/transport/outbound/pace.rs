//! How often a connection may be written: the pacing interval, stretched
//! under a fast stream.
//!
//! With `--write-pacing-ms` P, a connection written less than P ago keeps
//! its pushed frames until P has passed, so frames that come faster than
//! one per P share writes. Between one per P and one per 2P nothing is
//! shared: every frame still costs the connection one write, and a room of
//! a thousand at 150 actions/s costs 150,000 writes a second, more than two
//! cores can give. So a connection whose pushed frames come, on average,
//! more often than one per [`FAST_GAP`] × P is written at most once per
//! [`STRETCH`] × P: at the default 5 ms, a stream faster than about 110
//! frames a second (one per 9 ms) goes out at most 100 times a second, more
//! than one frame per write, each waiting at most 10 ms. Slower streams are
//! unchanged (no frame of a steady stream of up to 110 a second waits for
//! pacing at all; the threshold sits between the 100 a second a busy room
//! runs at and the 125 where one write per frame starts to cost a 2-core
//! server more than it has), and one pause brings the connection back to P.

use std::time::Duration;

use tokio::time::Instant;

/// A stream is fast when its average gap is under this many intervals.
const FAST_GAP: f64 = 1.8;
/// A fast stream's connection is written at most once per this many
/// intervals.
const STRETCH: u32 = 2;
/// Weight of the newest gap in the average, as a shift (1/8).
const WEIGHT_SHIFT: u32 = 3;
/// Gaps count at most this many intervals in the average: enough that one
/// pause makes the fastest stream slow (a pause moves the average at least
/// an eighth of this, 2 intervals, past [`FAST_GAP`]).
const MAX_GAP: u32 = 16;

/// One connection's pacing.
#[derive(Debug)]
pub(super) struct Pace {
    /// `--write-pacing-ms` (zero: frames are never held).
    interval: Duration,
    /// When the last pushed frame came.
    last_push: Option<Instant>,
    /// Average gap between pushed frames, µs (exponentially weighted).
    gap_us: u64,
}

impl Pace {
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_push: None,
            gap_us: Self::max_gap_us(interval),
        }
    }

    fn max_gap_us(interval: Duration) -> u64 {
        (interval * MAX_GAP).as_micros().min(u128::from(u32::MAX)) as u64
    }

    /// Whether frames are paced at all.
    pub(super) fn is_on(&self) -> bool {
        !self.interval.is_zero()
    }

    /// A frame that may wait for the pacing deadline was queued at `now`.
    pub(super) fn pushed(&mut self, now: Instant) {
        if !self.is_on() {
            return;
        }
        if let Some(last) = self.last_push.replace(now) {
            let max = Self::max_gap_us(self.interval);
            let gap = now
                .saturating_duration_since(last)
                .as_micros()
                .min(u128::from(max)) as i64;
            let avg = self.gap_us as i64;
            self.gap_us = (avg + ((gap - avg) >> WEIGHT_SHIFT)) as u64;
        }
    }

    /// Least time between two writes of pushed frames now (zero: no pacing).
    pub(super) fn interval(&self) -> Duration {
        let fast = (self.gap_us as f64) < FAST_GAP * self.interval.as_micros() as f64;
        if fast {
            self.interval * STRETCH
        } else {
            self.interval
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(pace: &mut Pace, start: Instant, gap: Duration, frames: u32) -> Instant {
        let mut t = start;
        for _ in 0..frames {
            t += gap;
            pace.pushed(t);
        }
        t
    }

    /// The interval after 200 frames of a steady stream of `per_sec`.
    fn steady(p: Duration, per_sec: u32) -> Duration {
        let mut pace = Pace::new(p);
        stream(
            &mut pace,
            Instant::now(),
            Duration::from_secs(1) / per_sec,
            200,
        );
        pace.interval()
    }

    #[test]
    fn streams_up_to_the_fast_gap_keep_the_interval() {
        let p = Duration::from_millis(5);
        for per_sec in [1, 10, 42, 100, 105] {
            assert_eq!(steady(p, per_sec), p, "{per_sec} frames/s");
        }
    }

    #[test]
    fn a_fast_stream_is_written_at_most_once_per_twice_the_interval() {
        let p = Duration::from_millis(5);
        for per_sec in [115, 125, 150, 200, 1000, 10_000] {
            assert_eq!(steady(p, per_sec), 2 * p, "{per_sec} frames/s");
        }
    }

    #[test]
    fn a_pause_brings_a_fast_stream_back_to_the_interval() {
        let p = Duration::from_millis(5);
        let mut pace = Pace::new(p);
        let t = stream(&mut pace, Instant::now(), Duration::from_millis(1), 100);
        assert_eq!(pace.interval(), 2 * p);
        pace.pushed(t + Duration::from_millis(500));
        assert_eq!(pace.interval(), p, "one frame after half a second");
    }

    #[test]
    fn a_burst_after_a_quiet_time_is_not_stretched_at_once() {
        let p = Duration::from_millis(5);
        let mut pace = Pace::new(p);
        let t = stream(&mut pace, Instant::now(), Duration::from_millis(100), 50);
        // A few frames at once (an action's envelopes): still the interval.
        stream(&mut pace, t, Duration::ZERO, 3);
        assert_eq!(pace.interval(), p);
    }

    #[test]
    fn no_pacing_stays_no_pacing() {
        let mut pace = Pace::new(Duration::ZERO);
        stream(&mut pace, Instant::now(), Duration::from_micros(10), 100);
        assert_eq!(pace.interval(), Duration::ZERO);
    }
}
