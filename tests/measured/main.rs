//! Tests that measure time or resources against the real binary: write
//! pacing (`pacing`), hostile clients beside honest ones (`hostile`), and
//! the soak (`soak`).
//!
//! They share one test binary (each file used to be a binary of its own,
//! linking the server and the client stack again) but never run beside one
//! another, nor beside the other end-to-end tests, which live in another
//! binary: each takes [`alone`] for its whole run, so the figures it judges
//! are the server's alone.

#[path = "../common/mod.rs"]
mod common;

mod hostile;
mod pacing;
mod soak;

/// Held by a test here for as long as it runs: one at a time.
async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ALONE.lock().await
}
