//! What the process's allocator holds, and handing freed memory back to
//! the system, when the binary's allocator can tell and do it (the server
//! binary installs jemalloc's; the library, its tests included, runs on
//! whatever allocator its host uses and reports nothing).
//!
//! Disposing sessions frees their memory inside the allocator, which keeps
//! the pages for reuse and returns them on its own decay schedule — or,
//! with fragmentation, not at all. So a disposal asks for a release a
//! moment after the last one (a burst of disposals is released once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// What the allocator holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes the program has allocated and not freed (its live heap).
    pub allocated: u64,
    /// Bytes of physical memory the allocator holds: the live heap, its
    /// bookkeeping, and freed pages it has not handed back yet.
    pub resident: u64,
}

/// What the binary's allocator offers.
#[derive(Clone, Copy)]
pub struct Allocator {
    /// Its current figures.
    pub stats: fn() -> Option<AllocatorStats>,
    /// Hand every freed page back to the system now.
    pub release: fn(),
    /// Return the calling thread's cached free blocks to the shared pool
    /// (a thread that stays idle keeps them otherwise).
    pub flush_thread: fn(),
}

static ALLOCATOR: OnceLock<Allocator> = OnceLock::new();
static RELEASE_PENDING: AtomicBool = AtomicBool::new(false);

/// How long after a disposal the freed memory is released (a burst of
/// disposals shares one release).
pub const RELEASE_DELAY: Duration = Duration::from_secs(1);

/// Give back a map's spare room once it holds under a quarter of what it
/// has room for (after a burst of connections or sessions went away); an
/// occasional rebuild, so removals stay cheap on average.
pub fn shrink_if_sparse<K, V>(map: &dashmap::DashMap<K, V>)
where
    K: Eq + std::hash::Hash,
{
    if is_sparse(map.len(), map.capacity()) {
        map.shrink_to_fit();
    }
}

/// [`shrink_if_sparse`] for a map one owner holds.
pub fn shrink_map_if_sparse<K, V>(map: &mut std::collections::HashMap<K, V>)
where
    K: Eq + std::hash::Hash,
{
    if is_sparse(map.len(), map.capacity()) {
        map.shrink_to_fit();
    }
}

/// Room for more than 1,024 entries, under a quarter of it used.
fn is_sparse(len: usize, capacity: usize) -> bool {
    capacity > 1024 && len * 4 < capacity
}

/// Install the binary's allocator (once; later calls are ignored).
pub fn install(allocator: Allocator) {
    let _ = ALLOCATOR.set(allocator);
}

/// The allocator's figures, when the binary installed one that has them.
pub fn stats() -> Option<AllocatorStats> {
    ALLOCATOR.get().and_then(|a| (a.stats)())
}

/// Memory was freed in bulk (sessions disposed): release it
/// [`RELEASE_DELAY`] from now, unless a release is already due. Each of
/// `threads` (the arbiters sessions ran on) first hands its cached free
/// blocks back, then, once all have, every arena's unused pages go back to
/// the system. Runs on the calling actix arbiter.
pub fn release_soon(threads: Vec<actix::dev::ArbiterHandle>) {
    let Some(allocator) = ALLOCATOR.get().copied() else {
        return;
    };
    if RELEASE_PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    let release_at = tokio::time::Instant::now() + RELEASE_DELAY;
    actix::spawn(async move {
        // A timer, not a wait for work elsewhere: disposals arriving until
        // then share this release.
        tokio::time::sleep_until(release_at).await;
        RELEASE_PENDING.store(false, Ordering::Release);
        let flushed: Vec<_> = threads
            .iter()
            .filter_map(|t| {
                let (done, flushed) = tokio::sync::oneshot::channel::<()>();
                t.spawn(async move {
                    (allocator.flush_thread)();
                    let _ = done.send(());
                })
                .then_some(flushed)
            })
            .collect();
        (allocator.flush_thread)();
        // Every thread flushed (or its arbiter stopped, dropping `done`).
        for f in flushed {
            let _ = f.await;
        }
        (allocator.release)();
    });
}

#[cfg(test)]
mod tests {
    use super::{shrink_if_sparse, shrink_map_if_sparse};

    #[test]
    fn a_map_that_emptied_gives_its_room_back_and_a_full_one_keeps_it() {
        let mut map: std::collections::HashMap<u32, u32> = (0..5000).map(|i| (i, i)).collect();
        let room = map.capacity();
        for i in 0..2000 {
            map.remove(&i);
            shrink_map_if_sparse(&mut map);
        }
        assert!(
            map.capacity() >= 5000,
            "still more than a quarter full: {} of {room}",
            map.capacity()
        );
        for i in 2000..4990 {
            map.remove(&i);
            shrink_map_if_sparse(&mut map);
        }
        assert!(map.capacity() < 1024 + 64, "{} of {room}", map.capacity());
        assert_eq!(map.len(), 10);

        let shared: dashmap::DashMap<u32, u32> = (0..5000).map(|i| (i, i)).collect();
        let room = shared.capacity();
        for i in 0..4990 {
            shared.remove(&i);
            shrink_if_sparse(&shared);
        }
        assert!(
            shared.capacity() < room / 2,
            "{} of {room}",
            shared.capacity()
        );
        assert_eq!(shared.len(), 10);
    }
}
