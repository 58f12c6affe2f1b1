//! One monotonic clock for the whole process. Publishers stamp each action
//! with its *scheduled* send time on this clock and receivers (in the same
//! process) subtract it from their receive time, so no clock sync is needed.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static START: OnceLock<Instant> = OnceLock::new();

fn start() -> Instant {
    *START.get_or_init(Instant::now)
}

/// Nanoseconds since the process clock started.
pub fn now_ns() -> u64 {
    start().elapsed().as_nanos() as u64
}

/// The `Instant` of a clock reading (for `sleep_until`).
pub fn instant_at(ns: u64) -> Instant {
    start() + Duration::from_nanos(ns)
}

/// Sleep until the clock reads `ns` (returns at once when already past).
pub async fn sleep_until_ns(ns: u64) {
    if ns > now_ns() {
        tokio::time::sleep_until(instant_at(ns).into()).await;
    }
}

/// The machine's `CLOCK_MONOTONIC` in nanoseconds. Unlike [`now_ns`] it
/// means the same in every process on this machine: an agent process stamps
/// what it sends with it (`acp_test_agent`'s `/stamped`), and receivers here
/// subtract the stamp from their own reading.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
