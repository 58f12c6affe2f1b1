//! One system call for the direct writes of many connections (Linux).
//!
//! After a publish, each subscriber whose socket is free gets its frames in
//! one direct write ([`super::Wire`]): for a room that is one `send` per
//! subscriber, and for a small frame the system call's own entry and exit
//! is a sizeable share of its cost. Here the writes of up to [`BATCH`]
//! connections go to the kernel in one `io_uring_enter`. Each connection's
//! lock is held from taking its frames until the kernel has answered for
//! its write, exactly as around a single direct write, so nothing else
//! writes to that socket in between and every connection's order stays the
//! queue's.
//!
//! A connection whose lock is busy (its socket side, or another thread
//! flushing a room it is also in) is not waited for while other
//! connections' locks are held — two threads batching rooms that share
//! connections would otherwise wait for each other — but flushed on its own
//! once the batch is done.
//!
//! Sends do not block (`MSG_DONTWAIT`): what a socket did not take is kept
//! for the socket side, as after a direct write. Where the kernel refuses
//! io_uring (an old kernel, a sandbox that forbids it) the thread writes
//! one connection per system call instead, and the server says so once.

use std::cell::RefCell;
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Waker;
use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use io_uring::{opcode, types, IoUring};
use parking_lot::MutexGuard;

use super::{encode_frames, wake, Flush, Outbound, State};

/// Connections written by one submission at most (the ring's size).
pub(super) const BATCH: usize = Outbound::BATCH;

/// Capacity of a thread's encoding buffer kept between batches.
const BUF_KEEP: usize = 1024 * 1024;

/// The answer of an entry the kernel was never given: written plainly.
const NOT_SUBMITTED: i32 = i32::MIN;

/// The answer of an entry the kernel took but never answered (the ring
/// broke while waiting): whether its bytes went out is unknown.
const UNANSWERED: i32 = i32::MIN + 1;

/// A thread's ring and the buffer its batches are encoded into.
struct Ring {
    ring: IoUring,
    buf: BytesMut,
    /// Per entry of the batch being written: the kernel's answer.
    results: Vec<i32>,
}

enum Slot {
    Untried,
    Ready(Box<Ring>),
    Refused,
}

thread_local! {
    static RING: RefCell<Slot> = const { RefCell::new(Slot::Untried) };
}

/// Whether the server has said that io_uring is unavailable.
static WARNED: AtomicBool = AtomicBool::new(false);

fn refused(e: &std::io::Error) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(error = %e, "io_uring is not available: rooms are written with one system call per connection");
    }
}

/// Flush every connection of `outs`, batching their direct writes. False
/// (and nothing done) when this thread cannot have a ring.
pub(super) fn flush(outs: &[Arc<Outbound>]) -> bool {
    RING.with_borrow_mut(|slot| {
        if matches!(slot, Slot::Untried) {
            *slot = match new_ring() {
                Ok(ring) => Slot::Ready(Box::new(Ring {
                    ring,
                    buf: BytesMut::new(),
                    results: Vec::with_capacity(BATCH),
                })),
                Err(e) => {
                    refused(&e);
                    Slot::Refused
                }
            };
        }
        let Slot::Ready(ring) = slot else {
            return false;
        };
        let mut busy = Vec::new();
        let mut broken = None;
        for chunk in outs.chunks(BATCH) {
            if broken.is_some() {
                busy.extend(chunk.iter().cloned());
                continue;
            }
            if let Err(e) = ring.write(chunk, &mut busy) {
                broken = Some(e);
            }
        }
        if ring.buf.capacity() > BUF_KEEP {
            ring.buf = BytesMut::new();
        }
        if let Some(e) = broken {
            // Entries the kernel never took stay in the ring: it is dropped
            // unsubmitted, and this thread writes plainly from now on.
            refused(&e);
            *slot = Slot::Refused;
        }
        for out in busy {
            out.flush();
        }
        true
    })
}

fn new_ring() -> std::io::Result<IoUring> {
    let entries = BATCH as u32;
    IoUring::builder()
        .setup_single_issuer()
        .build(entries)
        .or_else(|_| IoUring::new(entries))
}

/// A connection whose frames are in the batch, locked until its answer.
struct Held<'a> {
    st: MutexGuard<'a, State>,
    /// Its socket's descriptor.
    fd: RawFd,
    bytes: Range<usize>,
}

impl Ring {
    /// Flush `outs` (at most [`BATCH`]): connections whose lock is busy go
    /// to `busy`. An error: the ring cannot be used again (every
    /// connection was still written, plainly where the kernel did not take
    /// its entry).
    fn write<'a>(
        &mut self,
        outs: &'a [Arc<Outbound>],
        busy: &mut Vec<Arc<Outbound>>,
    ) -> std::io::Result<()> {
        let now = Instant::now();
        let mut wakers: Vec<Waker> = Vec::new();
        let mut held: Vec<Held<'a>> = Vec::with_capacity(outs.len());
        self.buf.clear();
        for out in outs {
            let Some(mut st) = out.state.try_lock() else {
                busy.push(out.clone());
                continue;
            };
            match Outbound::start_flush(&mut st, Some(now)) {
                Flush::Done(waker) => wakers.extend(waker),
                Flush::Write(n) => match st.wire.as_ref().and_then(|w| w.raw_fd()) {
                    Some(fd) => {
                        let start = self.buf.len();
                        encode_frames(&mut self.buf, st.frames.drain(..n));
                        held.push(Held {
                            st,
                            fd,
                            bytes: start..self.buf.len(),
                        });
                    }
                    None => wakers.extend(st.write_now(n)),
                },
            }
        }
        let outcome = if held.len() > 1 {
            self.submit(&held)
        } else {
            self.results.clear();
            self.results.resize(held.len(), NOT_SUBMITTED);
            Ok(())
        };
        let mut lost_track = false;
        for (h, &res) in held.iter_mut().zip(&self.results) {
            let st: &mut State = &mut h.st;
            if res == UNANSWERED {
                // Part of a frame may be on the wire: the stream cannot go
                // on. The client reconnects and catches up.
                lost_track = true;
                wakers.extend(Outbound::overflow(st));
                continue;
            }
            let Some(wire) = &st.wire else {
                continue;
            };
            let bytes = &self.buf[h.bytes.clone()];
            let written = match res {
                NOT_SUBMITTED => wire.try_write(bytes).unwrap_or_default(),
                n if n >= 0 => {
                    wire.sent(n as usize);
                    n as usize
                }
                // Would block, or failed: the socket side writes it all and
                // finds out.
                _ => 0,
            };
            st.unsent = if written < bytes.len() {
                Bytes::copy_from_slice(&bytes[written..])
            } else {
                Bytes::new()
            };
            wakers.extend(st.after_direct_write());
        }
        drop(held);
        if lost_track {
            // The kernel may still read the buffer: it is never reused.
            std::mem::forget(std::mem::take(&mut self.buf));
        }
        for waker in wakers {
            wake(Some(waker));
        }
        outcome
    }

    /// Give the kernel one send per held connection and collect its
    /// answers in `results`, in `held`'s order.
    fn submit(&mut self, held: &[Held<'_>]) -> std::io::Result<()> {
        self.results.clear();
        self.results.resize(held.len(), NOT_SUBMITTED);
        {
            let mut sq = self.ring.submission();
            for (i, h) in held.iter().enumerate() {
                let bytes = &self.buf[h.bytes.clone()];
                let send = opcode::Send::new(types::Fd(h.fd), bytes.as_ptr(), bytes.len() as u32)
                    .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the buffer is neither changed nor dropped until
                // every entry submitted has been answered (below), and the
                // descriptor stays open while its connection's lock is held
                // (the wire is only let go under it). The ring holds
                // `BATCH` entries and a batch at most that many.
                if unsafe { sq.push(&send) }.is_err() {
                    break;
                }
            }
        }
        let queued = self.ring.submission().len();
        let mut error = None;
        let mut tries = 0;
        // Hand everything to the kernel.
        while !self.ring.submission().is_empty() {
            tries += 1;
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if retry(&e) && tries < MAX_TRIES => self.reap(),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        // Entries the kernel did not take are the last ones queued: they
        // keep NOT_SUBMITTED and are written plainly. They never reach the
        // kernel: from here on it is only waited on (nothing submitted),
        // and after an error the ring is dropped.
        let submitted = queued - self.ring.submission().len();
        self.reap();
        let mut waits = 0;
        while self.results[..submitted].contains(&NOT_SUBMITTED) {
            waits += 1;
            // SAFETY: nothing is submitted and no argument is passed.
            let waited = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
            };
            match waited {
                Ok(_) => {}
                Err(e) if retry(&e) && waits < MAX_TRIES => {}
                Err(e) => {
                    self.reap();
                    for r in &mut self.results[..submitted] {
                        if *r == NOT_SUBMITTED {
                            *r = UNANSWERED;
                        }
                    }
                    return Err(e);
                }
            }
            self.reap();
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Take the answers the kernel has posted.
    fn reap(&mut self) {
        for cqe in self.ring.completion() {
            if let Some(slot) = self.results.get_mut(cqe.user_data() as usize) {
                *slot = cqe.result();
            }
        }
    }
}

/// `IORING_ENTER_GETEVENTS` (`linux/io_uring.h`): wait for answers.
const ENTER_GETEVENTS: u32 = 1;

/// Submissions (and waits) tried for one batch before the ring is given up.
const MAX_TRIES: usize = 1000;

/// A submission error worth trying again at once.
fn retry(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
