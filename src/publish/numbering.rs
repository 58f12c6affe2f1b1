//! How one node numbers `serverSeq`: blocks of numbers granted by the store
//! before use, and the ranges of numbers this node handed out.
//!
//! Invariant: every number a client can get from this node — an envelope's
//! `serverSeq`, a snapshot's `fromSeq`, `initialize`'s `serverSeq` — lies in
//! one of [`Numbering`]'s ranges, and each range lies in a block the store
//! granted to this node alone. Numbers only grow. In a cluster every node
//! draws its blocks from one shared floor ([`crate::store::Journal::reserve_seq`]),
//! so when another node took numbers in between, the next grant is not
//! contiguous: the node jumps, and burns the first granted number as a
//! marker (never published, but the `fromSeq` of snapshots taken before
//! the next action), so even the current position after a jump is one no
//! other node handed out. A `lastSeenServerSeq` outside the ranges was
//! handed out by another node (or never): it is answered with snapshots.

use std::collections::VecDeque;

use crate::ids::ServerSeq;

/// Durably reserves `count` numbers starting at `next` (the store's
/// `reserve_seq`); the first number of the block actually granted, at or
/// after `next`, or the store's reason if it refused.
pub type Reserver = Box<dyn Fn(ServerSeq, u64) -> Result<ServerSeq, String> + Send + Sync>;

/// The store refused a `serverSeq` reservation: from then on no new number
/// is handed out, so none can repeat after a restart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not reserve serverSeq values in the store: {0}")]
pub struct SeqRefused(pub String);

/// One node's `serverSeq` counter (kept under the publisher's lock).
pub(super) struct Numbering {
    /// Last assigned `serverSeq` (an envelope's, or the marker of the
    /// newest block): the `fromSeq` of a snapshot taken now.
    seq: ServerSeq,
    /// First number of the range `seq` is in: `lo..=seq` were all handed
    /// out by this node.
    lo: ServerSeq,
    /// Earlier ranges `(lo, hi)`, oldest first: left behind by a jump, kept
    /// while a reconnect from inside them could still be replayed.
    past: VecDeque<(ServerSeq, ServerSeq)>,
    /// Highest `serverSeq` the store allows before the next reservation.
    reserved: ServerSeq,
    /// Numbers promised to journaled actions not yet published
    /// ([`Numbering::claim`]); `seq + claimed <= reserved` always holds,
    /// across a jump too (a claim is a count, not particular numbers).
    claimed: u64,
    /// Set when a reservation failed; every later claim is refused.
    failed: Option<SeqRefused>,
    /// Numbers reserved beyond what is needed at each reservation: a
    /// store write once per block, not once per action.
    block: u64,
}

impl Numbering {
    /// Start after `start` (a restart starts above everything reserved
    /// before), taking `block` extra numbers at each reservation.
    pub(super) fn new(start: ServerSeq, block: u64) -> Self {
        Self {
            seq: start,
            lo: start,
            past: VecDeque::new(),
            reserved: start,
            claimed: 0,
            failed: None,
            block,
        }
    }

    /// The last assigned `serverSeq`.
    pub(super) fn current(&self) -> ServerSeq {
        self.seq
    }

    /// Secure `n` numbers for actions about to be journaled.
    pub(super) fn claim(&mut self, n: u64, reserver: &Reserver) -> Result<(), SeqRefused> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.reserve(self.claimed + n, reserver)?;
        self.claimed += n;
        Ok(())
    }

    /// Give back claimed numbers whose actions were not stored.
    pub(super) fn release(&mut self, n: u64) {
        self.claimed = self.claimed.saturating_sub(n);
    }

    /// The next number: one claimed earlier if `use_claim` and there is
    /// one, else one reserved now (refused once a reservation failed).
    pub(super) fn assign(
        &mut self,
        use_claim: bool,
        reserver: &Reserver,
    ) -> Result<ServerSeq, SeqRefused> {
        if use_claim && self.claimed > 0 {
            self.claimed -= 1;
        } else {
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            self.reserve(self.claimed + 1, reserver)?;
        }
        self.seq = self.seq.next();
        debug_assert!(
            self.seq.plus(self.claimed) <= self.reserved,
            "an unreserved serverSeq"
        );
        Ok(self.seq)
    }

    /// Take a new block and move to its first number, even if the grant is
    /// contiguous: a cluster node starts from the shared floor, which may be
    /// another node's last number, so it must not hand that out as its own.
    /// The numbers of the current range are dropped from this node's ranges.
    pub(super) fn fresh_block(&mut self, reserver: &Reserver) -> Result<(), SeqRefused> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let granted = self.take_block(self.claimed, reserver)?;
        self.lo = granted;
        self.seq = granted;
        Ok(())
    }

    /// Whether this node handed out `seq` (as an envelope's number or as
    /// the current position), as far as the kept ranges tell.
    pub(super) fn handed_out(&self, seq: ServerSeq) -> bool {
        (self.lo..=self.seq).contains(&seq)
            || self.past.iter().any(|(lo, hi)| (*lo..=*hi).contains(&seq))
    }

    /// Forget ranges that end before `evicted` (the highest number dropped
    /// from the replay ring): a reconnect from inside them is too old
    /// anyway.
    pub(super) fn prune(&mut self, evicted: ServerSeq) {
        while self.past.front().is_some_and(|(_, hi)| *hi < evicted) {
            self.past.pop_front();
        }
    }

    /// Make sure the store allows `want` numbers after `seq` (rare: once
    /// per block, a short synchronous store write). A refusal is remembered.
    fn reserve(&mut self, want: u64, reserver: &Reserver) -> Result<(), SeqRefused> {
        if self.seq.plus(want) <= self.reserved {
            return Ok(());
        }
        let next = self.reserved.next();
        let granted = self.take_block(want, reserver)?;
        if granted > next {
            // Another node was granted the numbers in between.
            self.past.push_back((self.lo, self.seq));
            self.lo = granted;
            self.seq = granted;
        }
        Ok(())
    }

    /// Ask the store for a block after `reserved` large enough for a marker
    /// and `want` numbers after it; the block's first number.
    fn take_block(&mut self, want: u64, reserver: &Reserver) -> Result<ServerSeq, SeqRefused> {
        let next = self.reserved.next();
        let count = want + 1 + self.block;
        let reason = match reserver(next, count) {
            Ok(granted) if granted >= next => {
                self.reserved = granted.plus(count - 1);
                return Ok(granted);
            }
            Ok(granted) => format!("the store granted {granted}, below the asked {next}"),
            Err(reason) => reason,
        };
        tracing::error!(%next, count, %reason, "could not reserve serverSeq values in the store; writes stop");
        let e = SeqRefused(reason);
        self.failed = Some(e.clone());
        Err(e)
    }
}
