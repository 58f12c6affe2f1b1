//! Checkpoints beside the writer.
//!
//! A commit appends pages to the WAL; a checkpoint copies them back into the
//! database so the WAL can be written from its start again. Once the WAL
//! holds thousands of pages that copy takes tens to hundreds of
//! milliseconds (it grows with the database), and SQLite's automatic
//! checkpoint runs on the connection that committed: the writer thread,
//! with every write queued behind it waiting that long. So the writer's
//! automatic checkpoint is off, and:
//!
//! - once the WAL holds [`Limits::start`] pages, a thread of its own on a
//!   connection of its own copies them (a passive checkpoint, which never
//!   blocks the writer), again while rounds still leave many pages behind;
//! - at its next commit the writer copies the few pages committed meanwhile
//!   itself (nothing is appended while it does), which completes the copy,
//!   so its next transaction writes the WAL from its start again;
//! - should the WAL reach [`Limits::bound`] pages anyway (a checkpointer
//!   that cannot keep up), the writer checkpoints at every commit as SQLite
//!   would, so the WAL stays bounded.
//!
//! What a commit made durable is never at stake here: a checkpoint only
//! moves committed pages, and after a crash SQLite replays whatever is still
//! in the WAL.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, ErrorCode};

use super::writer::Counters;

/// When checkpoints run, in WAL pages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The checkpointer starts copying once the WAL holds this many pages.
    /// Many rooms append to many pages; a longer WAL between checkpoints
    /// lets a checkpoint write each page once for all of its appends
    /// instead of once per few (about a quarter less written to the disk at
    /// 2,000 actions/s over 1,000 chats). The WAL file grows to about this
    /// many pages (40 MB at 4 KiB) and is reused after each checkpoint.
    pub start: u32,
    /// The writer checkpoints itself at every commit once the WAL holds
    /// this many pages.
    pub bound: u32,
}

impl Limits {
    pub(super) const DEFAULT: Self = Self {
        start: 10_000,
        bound: 40_000,
    };
}

/// A round that leaves at most this many pages uncopied is the
/// checkpointer's last: the writer copies the rest.
const FEW_PAGES: i32 = 64;
/// Most rounds of one checkpoint on the checkpointer's thread.
const MAX_ROUNDS: u32 = 4;

/// Where the copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing to copy yet.
    Idle,
    /// The writer asked the checkpointer to copy.
    Requested,
    /// The checkpointer is copying.
    Running,
    /// The checkpointer has copied; the writer copies the rest.
    Copied,
    /// The writer is gone: the checkpointer stops.
    Stopped,
}

struct Shared {
    phase: Mutex<Phase>,
    wake: Condvar,
}

/// Which thread ran a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    Checkpointer,
    Writer,
}

/// The writer's side: told the WAL's size after each commit, it asks the
/// checkpointer for a copy, or copies itself.
pub(super) struct Checkpoints {
    shared: Arc<Shared>,
    /// The WAL's pages when the writer last looked: fewer now means the WAL was
    /// written from its start again.
    last: u32,
    /// The WAL size at which the checkpointer is asked next.
    ask_at: u32,
    limits: Limits,
    counters: Arc<Counters>,
}

impl Checkpoints {
    /// Take over the checkpoints of the writer connection `writer`: turn
    /// its automatic checkpoint off, watch its WAL's size, and start the
    /// checkpointer thread on `own` (a connection of its own to the same
    /// database).
    pub(super) fn start(
        writer: &mut Connection,
        own: Connection,
        limits: Limits,
        counters: Arc<Counters>,
    ) -> std::io::Result<Self> {
        let seen = counters.clone();
        // Registering a WAL hook replaces SQLite's automatic checkpoint. It
        // runs inside the commit, before any waiter is answered.
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: i32| {
                seen.wal_holds(u32::try_from(pages).unwrap_or(0));
                Ok(())
            }))
            .map_err(std::io::Error::other)?;
        let shared = Arc::new(Shared {
            phase: Mutex::new(Phase::Idle),
            wake: Condvar::new(),
        });
        let theirs = shared.clone();
        let their_counters = counters.clone();
        std::thread::Builder::new()
            .name("tandem-checkpoint".into())
            .spawn(move || checkpointer(own, &theirs, &their_counters))?;
        Ok(Self {
            shared,
            last: 0,
            ask_at: limits.start,
            limits,
            counters,
        })
    }

    /// After each commit of the writer on `conn`.
    pub(super) fn after_commit(&mut self, conn: &Connection) {
        let pages = self.counters.wal_pages();
        let mut phase = self.shared.phase.lock();
        if pages < self.last {
            // The WAL was written from its start again: the copy is done.
            self.ask_at = self.limits.start;
            if *phase == Phase::Copied {
                *phase = Phase::Idle;
            }
        }
        self.last = pages;
        if *phase == Phase::Copied || pages >= self.limits.bound {
            if *phase == Phase::Copied {
                *phase = Phase::Idle;
                // A reader may keep the copy from completing; the
                // checkpointer is asked again only after more pages.
                self.ask_at = pages.saturating_add(self.limits.start / 8);
            }
            drop(phase);
            let started = Instant::now();
            // Busy: the checkpointer is copying; the next commit tries again.
            if run(conn, By::Writer).is_some() {
                self.counters.checkpointed(By::Writer, started.elapsed());
            }
        } else if *phase == Phase::Idle && pages >= self.ask_at {
            *phase = Phase::Requested;
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        *self.shared.phase.lock() = Phase::Stopped;
        self.shared.wake.notify_one();
    }
}

/// The checkpointer thread: copy the WAL whenever the writer asks, until the
/// writer is gone.
fn checkpointer(conn: Connection, shared: &Shared, counters: &Counters) {
    loop {
        {
            let mut phase = shared.phase.lock();
            loop {
                match *phase {
                    Phase::Requested => break,
                    Phase::Stopped => return,
                    _ => shared.wake.wait(&mut phase),
                }
            }
            *phase = Phase::Running;
        }
        let started = Instant::now();
        let mut ran = false;
        for _ in 0..MAX_ROUNDS {
            let Some((log, copied)) = run(&conn, By::Checkpointer) else {
                break;
            };
            ran = true;
            if log - copied <= FEW_PAGES {
                break;
            }
        }
        let took = started.elapsed();
        {
            let mut phase = shared.phase.lock();
            if *phase == Phase::Running {
                *phase = Phase::Copied;
            }
        }
        if ran {
            counters.checkpointed(By::Checkpointer, took);
        }
    }
}

/// One passive checkpoint on `conn`: the WAL's pages and how many of them
/// are copied after it, or `None` if it could not run (another connection
/// is checkpointing, or an error, which is logged: the WAL then grows until
/// a later checkpoint succeeds).
fn run(conn: &Connection, by: By) -> Option<(i32, i32)> {
    match conn.wal_checkpoint_v2(Some(rusqlite::MAIN_DB), CheckpointMode::PASSIVE) {
        Ok(pages) => Some(pages),
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => None,
        Err(e) => {
            tracing::warn!(error = %e, ?by, "journal checkpoint failed; the WAL grows until one succeeds");
            None
        }
    }
}

#[cfg(test)]
mod tests;
