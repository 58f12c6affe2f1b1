//! Admission: how many connections may be open — in all, and per token
//! subject — and the table of the open ones (pinged by the heartbeat, closed
//! at shutdown).
//!
//! A slot is reserved *before* the upgrade is answered and released when
//! the connection ends or its upgrade fails, and both counts are checked and
//! taken under one lock: two upgrades racing for the last slot cannot both
//! get it, and one refused by its subject's limit never makes another look
//! refused by the total. (An upgrade is rare next to a frame; one short lock
//! per upgrade costs nothing measurable.)

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use parking_lot::Mutex;

use crate::ids::ConnId;
use crate::transport::Outbound;

/// Why an upgrade was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Every slot of the server is taken.
    #[error("the server is at its connection limit ({0})")]
    Full(usize),
    /// The token subject holds as many connections as it may.
    #[error("`{0}` already has {1} connections (the limit)")]
    SubjectFull(String, usize),
}

/// The slots taken, in all and per subject.
#[derive(Default)]
struct Taken {
    /// Slots taken in all.
    total: usize,
    /// Slots taken per token subject; a subject with none has no entry.
    per_subject: HashMap<String, usize>,
}

/// Open (and opening) connections, counted against the limits.
pub struct Connections {
    /// Slots in all (`max_connections`).
    max_total: usize,
    /// Slots per token subject (`max_connections_per_token`).
    max_per_subject: usize,
    /// Slots taken, including upgrades not answered yet.
    taken: Mutex<Taken>,
    /// Every connection whose upgrade went through.
    open: DashMap<ConnId, Arc<OpenConn>>,
    /// Told each time a connection leaves `open` (shutdown waits on it).
    left: tokio::sync::Notify,
}

/// An open connection as the admin view lists it.
pub struct OpenConn {
    /// Its queue.
    pub out: Arc<Outbound>,
    /// Its token subject (`local` without auth).
    pub subject: String,
    /// Its token's role.
    pub role: crate::auth::Role,
    /// When its upgrade went through.
    pub since: std::time::Instant,
    /// Its `clientId` and the name its person is shown by, once it sent
    /// `initialize` or `reconnect` (the name follows `tandem/setName`).
    pub person: parking_lot::Mutex<Option<(String, String)>>,
    /// The invite link it came in through, by id.
    pub invite: Option<String>,
}

impl AsRef<Outbound> for OpenConn {
    /// What the heartbeat beats.
    fn as_ref(&self) -> &Outbound {
        &self.out
    }
}

impl Connections {
    /// An empty table admitting `max_total` connections, at most
    /// `max_per_subject` of them for one token subject.
    pub fn new(max_total: usize, max_per_subject: usize) -> Self {
        Self {
            max_total,
            max_per_subject,
            taken: Mutex::new(Taken::default()),
            open: DashMap::new(),
            left: tokio::sync::Notify::new(),
        }
    }

    /// Reserve a slot for a connection of `subject`, or say which limit
    /// refuses it. The slot is released when the returned [`Slot`] drops.
    pub fn admit(self: &Arc<Self>, subject: &str) -> Result<Slot, Refused> {
        let mut taken = self.taken.lock();
        if taken.total >= self.max_total {
            return Err(Refused::Full(self.max_total));
        }
        let n = taken.per_subject.get(subject).copied().unwrap_or(0);
        if n >= self.max_per_subject {
            return Err(Refused::SubjectFull(
                subject.to_owned(),
                self.max_per_subject,
            ));
        }
        taken.total += 1;
        taken.per_subject.insert(subject.to_owned(), n + 1);
        Ok(Slot {
            table: self.clone(),
            subject: subject.to_owned(),
            conn: None,
        })
    }

    /// Connections whose upgrade went through and that have not ended.
    pub fn open_len(&self) -> usize {
        self.open.len()
    }

    /// Resolves once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.open.is_empty() {
                return;
            }
            left.await;
        }
    }

    /// The queues of the open connections, at this moment.
    pub fn queues(&self) -> Vec<Arc<Outbound>> {
        self.open.iter().map(|c| c.value().out.clone()).collect()
    }

    /// The open connections at this moment, by their slot of `slices` (an
    /// even share each): one pass over the table for a whole heartbeat
    /// interval. Each is held weakly — it comes back from
    /// [`Weak::upgrade`] while it is open, and not once it ended (the table
    /// holds the only strong reference but for a moment in [`Self::list`]) —
    /// so a beat costs no lookup in the table.
    pub fn by_slot(&self, slices: u64) -> Vec<Vec<Weak<OpenConn>>> {
        let mut slots = vec![Vec::new(); slices.max(1) as usize];
        for c in self.open.iter() {
            slots[c.key().slot(slices) as usize].push(Arc::downgrade(c.value()));
        }
        slots
    }

    /// The open connections, at this moment.
    pub fn list(&self) -> Vec<Arc<OpenConn>> {
        self.open.iter().map(|c| c.value().clone()).collect()
    }

    /// Note who connection `conn` speaks for: its `clientId` and name.
    pub fn note_person(&self, conn: ConnId, person: &crate::people::Person) {
        if let Some(c) = self.open.get(&conn) {
            *c.person.lock() = Some((person.client_id.clone(), person.name.clone()));
        }
    }
}

/// One reserved connection slot; dropping it frees the slot (and takes the
/// connection off the open table).
pub struct Slot {
    /// The table the slot belongs to.
    table: Arc<Connections>,
    /// The token subject it is counted for.
    subject: String,
    /// The connection, once its upgrade went through.
    conn: Option<ConnId>,
}

impl Slot {
    /// The upgrade went through: list the connection as open.
    pub fn open(&mut self, out: Arc<Outbound>, principal: &crate::auth::Principal) {
        self.conn = Some(out.id());
        let conn = OpenConn {
            out: out.clone(),
            subject: self.subject.clone(),
            role: principal.role,
            since: std::time::Instant::now(),
            person: parking_lot::Mutex::new(None),
            invite: principal.invite.as_ref().map(|g| g.id.clone()),
        };
        self.table.open.insert(out.id(), Arc::new(conn));
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut taken = self.table.taken.lock();
            taken.total -= 1;
            // A subject with no connection left leaves no entry behind.
            if let Some(n) = taken.per_subject.get_mut(&self.subject) {
                *n -= 1;
                if *n == 0 {
                    taken.per_subject.remove(&self.subject);
                }
            }
        }
        // Off the open table last: once a connection is no longer listed,
        // its slot is free.
        if let Some(id) = self.conn {
            self.table.open.remove(&id);
            crate::memory::shrink_if_sparse(&self.table.open);
            self.table.left.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    #[test]
    fn limits_refuse_with_their_reason_and_slots_come_back() {
        let t = Arc::new(Connections::new(3, 2));
        let a1 = t.admit("a").unwrap();
        let _a2 = t.admit("a").unwrap();
        assert_eq!(
            t.admit("a").err(),
            Some(Refused::SubjectFull("a".into(), 2))
        );
        let _b1 = t.admit("b").unwrap();
        assert_eq!(t.admit("c").err(), Some(Refused::Full(3)));
        drop(a1);
        let mut a3 = t.admit("a").expect("a dropped slot is free again");
        a3.open(
            Arc::new(Outbound::new(10)),
            &crate::auth::Principal::local(),
        );
        assert_eq!(t.open_len(), 1);
        drop(a3);
        assert_eq!(t.open_len(), 0, "an ended connection is no longer open");
        assert!(
            !t.taken.lock().per_subject.contains_key("c"),
            "a refused subject leaves no entry"
        );
    }

    #[test]
    fn the_heartbeat_lists_every_open_connection_once_by_slot() {
        let t = Arc::new(Connections::new(100, 100));
        let mut slots: Vec<Slot> = (0..10)
            .map(|_| {
                let mut s = t.admit("a").unwrap();
                s.open(
                    Arc::new(Outbound::new(10)),
                    &crate::auth::Principal::local(),
                );
                s
            })
            .collect();
        let by_slot = t.by_slot(4);
        assert_eq!(by_slot.len(), 4);
        let id = |c: &Weak<OpenConn>| c.upgrade().map(|c| c.out.id());
        for (slot, conns) in by_slot.iter().enumerate() {
            assert!(conns
                .iter()
                .all(|c| id(c).is_some_and(|id| id.slot(4) == slot as u64)));
        }
        let mut all: Vec<ConnId> = by_slot.iter().flatten().filter_map(id).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10, "each open connection once");
        let gone = all[3];
        slots.retain(|s| s.conn != Some(gone));
        let left: Vec<ConnId> = by_slot.iter().flatten().filter_map(id).collect();
        assert_eq!(left.len(), 9);
        assert!(!left.contains(&gone), "a closed connection is skipped");
    }

    /// Threads race for the slots of one table and each holds what it got
    /// until all have tried: never more than the limits are handed out, and
    /// exactly as many as the limits allow.
    #[test]
    fn racing_admissions_never_pass_the_limits() {
        const THREADS: usize = 8;
        const ROUNDS: usize = 200;
        for (max_total, max_per_subject, subjects) in [(3, 100, 8), (100, 2, 1), (5, 3, 2)] {
            let table = Arc::new(Connections::new(max_total, max_per_subject));
            let barrier = Arc::new(Barrier::new(THREADS));
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (table, barrier) = (table.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let subject = format!("s{}", i % subjects);
                        let mut got = Vec::new();
                        for _ in 0..ROUNDS {
                            barrier.wait();
                            let slot = table.admit(&subject).ok();
                            barrier.wait();
                            got.push(slot.is_some() as usize);
                            drop(slot);
                            barrier.wait();
                        }
                        got
                    })
                })
                .collect();
            let per_thread: Vec<Vec<usize>> =
                handles.into_iter().map(|h| h.join().unwrap()).collect();
            let allowed = max_total.min(max_per_subject * subjects.min(THREADS));
            for round in 0..ROUNDS {
                let admitted: usize = per_thread.iter().map(|g| g[round]).sum();
                assert_eq!(
                    admitted, allowed,
                    "round {round}: {admitted} admitted with room for {allowed} \
                     ({max_total} in all, {max_per_subject} per subject)"
                );
            }
            let taken = table.taken.lock();
            assert_eq!(taken.total, 0);
            assert!(taken.per_subject.is_empty());
        }
    }
}
