//! Where a new session runs: on the thread that serves the connection of
//! the client creating it, so that client's actions reach its chats without
//! a hand-off between threads (and its replies and echoes go out in one
//! write) — unless that thread already holds clearly more than its share of
//! sessions, as when one back-end connection creates sessions for many
//! people; then on the thread holding fewest.
//!
//! The threads are the HTTP workers, registered as they serve their first
//! connection. A session counts on its thread from its actor's start to
//! its stop; sessions restored at start-up or followed from another node
//! run on the actor threads and are not counted here.

use std::thread::ThreadId;

use actix::prelude::*;
use parking_lot::Mutex;

/// One connection-serving thread and the sessions running on it.
struct Home {
    thread: ThreadId,
    arbiter: ArbiterHandle,
    sessions: usize,
}

/// The connection-serving threads and their sessions.
#[derive(Default)]
pub struct Homes {
    homes: Mutex<Vec<Home>>,
}

impl Homes {
    /// The calling thread serves connections (an HTTP worker): new
    /// sessions may be placed on it. Cheap when it is already known.
    pub fn serve_here(&self) {
        let me = std::thread::current().id();
        let mut homes = self.homes.lock();
        if !homes.iter().any(|h| h.thread == me) {
            homes.push(Home {
                thread: me,
                arbiter: Arbiter::current(),
                sessions: 0,
            });
        }
    }

    /// Every connection-serving thread.
    pub fn arbiters(&self) -> Vec<ArbiterHandle> {
        self.homes
            .lock()
            .iter()
            .map(|h| h.arbiter.clone())
            .collect()
    }

    /// The thread a session created from the calling thread runs on.
    pub fn for_new_session(&self) -> ArbiterHandle {
        self.serve_here();
        let me = std::thread::current().id();
        let homes = self.homes.lock();
        let counts: Vec<usize> = homes.iter().map(|h| h.sessions).collect();
        let mine = homes.iter().position(|h| h.thread == me).unwrap_or(0);
        homes[choose(&counts, mine)].arbiter.clone()
    }

    /// A session actor started on the calling thread.
    pub fn arrived(&self) {
        self.count(1);
    }

    /// A session actor stopped on the calling thread.
    pub fn left(&self) {
        self.count(-1);
    }

    fn count(&self, delta: isize) {
        let me = std::thread::current().id();
        if let Some(h) = self.homes.lock().iter_mut().find(|h| h.thread == me) {
            h.sessions = h.sessions.saturating_add_signed(delta);
        }
    }
}

/// Index of the thread for a new session created from thread `mine`, given
/// each thread's session count: `mine` while it holds at most the fewest
/// plus a slack (a quarter of a fair share, and at least 8), otherwise the
/// one holding fewest.
fn choose(counts: &[usize], mine: usize) -> usize {
    let Some((fewest, least)) = counts.iter().enumerate().min_by_key(|(_, n)| **n) else {
        return mine;
    };
    let total: usize = counts.iter().sum();
    let slack = (total / (4 * counts.len())).max(8);
    if counts.get(mine).is_some_and(|n| *n <= least + slack) {
        mine
    } else {
        fewest
    }
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn a_session_stays_with_its_creator_while_the_threads_are_about_even() {
        assert_eq!(choose(&[0], 0), 0);
        assert_eq!(choose(&[10, 3], 0), 0, "within the slack of 8");
        assert_eq!(
            choose(&[400, 380, 390, 420], 3),
            3,
            "within a quarter share"
        );
    }

    #[test]
    fn a_creator_whose_thread_is_ahead_sends_its_sessions_to_the_emptiest() {
        assert_eq!(choose(&[12, 3], 0), 1);
        assert_eq!(choose(&[500, 380, 300, 420], 0), 2);
    }

    #[test]
    fn one_connection_creating_every_session_spreads_them_evenly() {
        // A back end on thread 0 creates 1,000 sessions, one after another.
        let mut counts = vec![0usize; 4];
        for _ in 0..1000 {
            let i = choose(&counts, 0);
            counts[i] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(max - min <= 1000 / 16 + 1, "{counts:?}");
    }
}
