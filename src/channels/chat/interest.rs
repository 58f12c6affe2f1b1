//! Following by interest: a chat another cluster node owns is applied on
//! this node only while one of this node's connections watches it.
//!
//! A follower chat nobody here has watched for `--follow-grace-secs` turns
//! *cold*: the link lets its batches pass undecoded
//! ([`crate::store::ClusterLink::watch`]), its state is dropped, and the
//! publisher marks it paused, so a `reconnect` naming it gets a snapshot
//! rather than a replay with a hole. Anything that needs its state
//! (a subscribe, a dispatch, `fetchTurns`, a take-over) warms it first:
//! watch again, then read snapshot and tail from the store, in that order,
//! so no batch falls between the read and the first one applied.
//!
//! A chat another node created starts cold here; so does one this node
//! recovered at start-up and another node runs. Sessions and the root are
//! always followed: they are small, and every node lists them.

use actix::prelude::*;

use super::{new_chat_state, ChatActor};
use crate::channels::commit::ChannelActor;
use crate::channels::following::Following;

/// How often a warm follower chat looks whether anyone here still watches
/// it, at most (a quarter of the grace, so it cools within 1.25 × grace).
const IDLE_CHECK_MAX: std::time::Duration = std::time::Duration::from_secs(5);

impl ChatActor {
    /// On a cluster node, look every so often whether this follower chat
    /// is still watched here; start cold if it is a follower already.
    pub(super) fn watch_interest(&mut self, ctx: &mut Context<Self>) {
        if self.core.shared.cluster.is_none() {
            return;
        }
        if self.core.follower {
            self.cool();
        }
        let grace = self.core.shared.config.follow_grace;
        let every = (grace / 4).clamp(std::time::Duration::from_millis(50), IDLE_CHECK_MAX);
        ctx.run_interval(every, move |act, _| act.check_interest(grace));
    }

    fn check_interest(&mut self, grace: std::time::Duration) {
        let core = &mut self.core;
        if !core.follower || core.cold || !core.hub.is_empty() {
            core.idle_since = None;
            return;
        }
        let now = tokio::time::Instant::now();
        let since = *core.idle_since.get_or_insert(now);
        if now.duration_since(since) >= grace {
            self.cool();
        }
    }

    /// Stop applying this chat here: nobody on this node watches it.
    fn cool(&mut self) {
        let core = &mut self.core;
        if core.cold || !core.shared.publisher.pause(&core.uri, &core.hub) {
            return;
        }
        core.cold = true;
        core.idle_since = None;
        if let Some(link) = &core.shared.cluster {
            link.watch(&core.uri, false);
        }
        tracing::debug!(chat = %core.uri, "nobody here watches it: its batches pass this node by");
        // Kept as the owner's copy says; only what applying needs goes.
        core.forwarded.clear();
        let title = std::mem::take(&mut self.state.title);
        self.state = new_chat_state(&self.core.uri, title);
        self.texts.clear();
        self.opened.clear();
        self.rollup.clear();
    }

    /// Apply this chat here again: watch it, then read it from the store.
    pub(super) fn ensure_warm(&mut self, ctx: &mut Context<Self>) {
        if !self.core.cold {
            return;
        }
        self.core.cold = false;
        self.core.idle_since = None;
        if let Some(link) = &self.core.shared.cluster {
            link.watch(&self.core.uri, true);
        }
        // Nobody here was sent what it did meanwhile: nothing to catch up
        // on, only the state to read.
        self.core.refused_at = None;
        self.roll_back(ctx);
        let core = &mut self.core;
        core.journal_len = core.shared.journal.len(&core.uri);
        core.shared.publisher.resumed(&core.uri);
        tracing::debug!(chat = %core.uri, at = %core.journal_len, "watched here: applying it again");
        if core.unreadable.is_some() {
            // The store cannot be read now: try again until it can.
            self.resync(ctx);
        }
    }
}
