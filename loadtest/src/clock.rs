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

/// A one-shot timer on the kernel's high-resolution clock (a `timerfd`),
/// for the open-loop publishers. tokio's own timer rounds every deadline up
/// to its next whole-millisecond tick, so an action stamped with its due
/// time would leave 0–2 ms after it and carry that lateness into every
/// receiver's latency, for every server alike; this one fires within the
/// thread's timer slack (50 µs by default) of the due time.
pub struct PreciseTimer {
    fd: tokio::io::unix::AsyncFd<std::fs::File>,
}

impl PreciseTimer {
    /// A disarmed timer, registered with the current runtime.
    pub fn new() -> std::io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: timerfd_create takes no pointers; a non-negative result is
        // a fresh descriptor we own from here on.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is open and nothing else owns it.
        let fd = unsafe { std::fs::File::from_raw_fd(raw) };
        // SAFETY: the `File` keeps the descriptor open, and refers to
        // the same timer, for as long as the `AsyncFd` that owns it lives.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(std::io::Error::from)?;
        Ok(Self { fd })
    }

    /// Sleep until [`now_ns`] reads `ns` (returns at once when already past).
    pub async fn sleep_until_ns(&self, ns: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd as _;
        let now = now_ns();
        if ns <= now {
            return Ok(());
        }
        // `now_ns` counts from an `Instant`, which on Linux is this same
        // CLOCK_MONOTONIC: the due time is the machine's reading plus what is
        // left of the wait.
        let due = monotonic_ns() + (ns - now);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (due / 1_000_000_000) as libc::time_t,
                tv_nsec: (due % 1_000_000_000) as libc::c_long,
            },
        };
        let fd = self.fd.get_ref().as_raw_fd();
        // SAFETY: `spec` is a valid itimerspec and the old value is not asked
        // for (null).
        let rc = unsafe {
            libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let mut ready = self.fd.readable().await?;
            // The count of expirations; reading it disarms the timer until
            // the next call arms it.
            let read = std::io::Read::read(&mut self.fd.get_ref(), &mut [0u8; 8]);
            // Either way the next wait is for the kernel's next edge.
            ready.clear_ready();
            match read {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_precise_timer_never_fires_early_and_can_be_rearmed() {
        let timer = PreciseTimer::new().expect("timerfd");
        for wait_ns in [2_000_000u64, 300_000, 5_000_000] {
            let due = now_ns() + wait_ns;
            timer.sleep_until_ns(due).await.expect("sleep");
            assert!(now_ns() >= due, "woke before the due time");
        }
        // A due time already past returns at once, without arming.
        let past = now_ns();
        timer.sleep_until_ns(past).await.expect("past");
    }
}
