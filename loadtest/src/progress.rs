//! Progress bars on stderr (hidden with `--quiet` or when stderr is not a
//! terminal), and one-line status notes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Hide every bar and note from now on.
pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

fn target() -> ProgressDrawTarget {
    if QUIET.load(Ordering::Relaxed) {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// A bar counting `len` items (connections, actions).
pub fn count(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), target());
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>14} [{bar:32}] {pos}/{len} {per_sec} {elapsed} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(what.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A bar over a timed phase of `seconds`; the caller ticks it once per
/// second and sets a live message.
pub fn timed(seconds: f64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some((seconds * 10.0).ceil() as u64), target());
    pb.set_style(
        ProgressStyle::with_template("{prefix:>14} [{bar:32}] {elapsed}/{duration} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A status line on stderr (not in quiet mode).
pub fn note(msg: impl AsRef<str>) {
    if !QUIET.load(Ordering::Relaxed) {
        eprintln!("· {}", msg.as_ref());
    }
}
