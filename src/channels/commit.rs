//! The one commit path of every channel actor (root, session, chat).
//!
//! An actor reduces an action into its state with the official reducer,
//! hands the batch to the journal and waits (`ctx.wait`, so no other message
//! sees a state the subscribers have not); once the journal has the batch it
//! publishes every action and runs their effects. A refused append is never
//! acknowledged: the dispatchers are told, the actor goes back to what the
//! store holds, and the channel stops taking writes.

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};
use tokio::sync::oneshot;

use super::core::{Accepted, ChannelCore};
use super::following::Following;
pub use super::reduce::ChannelState;
use super::validate::Rejection;
use super::ClientDispatch;
use crate::ids::ServerSeq;
use crate::people::Person;
use crate::store::{JournalError, TurnRecord};

/// How long a channel whose write the store refused waits before trying
/// the store again.
pub(crate) const STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// A channel whose write the store refused is read-only; every
/// [`STORE_RETRY`] it reloads its state from the store, and once that
/// works, writes resume (the next one shows whether the store takes them
/// again). A channel another node took over is not retried.
fn retry_store<A: ChannelActor>(ctx: &mut Context<A>) {
    ctx.run_later(STORE_RETRY, |act, ctx| {
        let core = act.parts().0;
        if core.store_failed.is_none() {
            return;
        }
        if core.unreadable.take().is_some() {
            act.roll_back(ctx);
        }
        let core = act.parts().0;
        if core.unreadable.is_none() {
            core.catch_up();
        }
        if core.unreadable.is_none() {
            core.journal_len = core.shared.journal.len(&core.uri);
            core.store_failed = None;
            tracing::info!(channel = %core.uri, "the store answers again; writes resume");
        } else {
            retry_store(ctx);
        }
    });
}

/// What a person's action brings into the record with it: host actions,
/// already reduced into the state by the check, committed in the same batch
/// just before and just after it (a notification of who did what).
#[derive(Default)]
pub struct Acts {
    /// Committed before the person's action.
    pub before: Vec<StateAction>,
    /// Committed after it.
    pub after: Vec<StateAction>,
}

/// Answered once a batch is published (or with why it was not).
pub type Done = oneshot::Sender<Result<(), Rejection>>;

/// A channel actor: its core, its state, and what it does around a commit.
/// The provided methods are the commit path; actors implement the hooks.
pub trait ChannelActor: Actor<Context = Context<Self>> {
    /// The channel's state.
    type State: ChannelState;

    /// Whether batches go through the journal. Root's state is derived from
    /// the agents registered and the sessions stored, so it is published
    /// without a journal entry and rebuilt at start-up.
    const JOURNALED: bool = true;

    /// The channel's core (identity, path to subscribers) and its state at
    /// once: a batch is journaled with a snapshot of the state.
    fn parts(&mut self) -> (&mut ChannelCore, &mut Self::State);

    /// The state as a snapshot stores it (the chat adds what it keeps
    /// beside the state).
    fn snapshot_json(&mut self) -> Option<String> {
        serde_json::to_string(self.parts().1).ok()
    }

    /// Reduce one action into the state (the default is the official
    /// reducer; the chat also tracks its turn history here).
    fn reduce(&mut self, action: &StateAction) -> Result<(), Rejection> {
        super::reduce::reduce(self.parts().1, action)
    }

    /// What the next batch stores besides its actions: turns that ended, and
    /// where a truncation cut the stored history.
    fn take_history(&mut self) -> (Vec<TurnRecord>, Option<u64>) {
        (Vec::new(), None)
    }

    /// The batch is journaled and published, each action with its
    /// `serverSeq`: run its effects.
    fn published(&mut self, ctx: &mut Context<Self>, batch: Vec<(Accepted, ServerSeq)>);

    /// A batch was refused by the journal: go back to what the store holds
    /// (what clients saw).
    fn roll_back(&mut self, ctx: &mut Context<Self>);

    /// A follower applied and published actions another node journaled
    /// (no effects run here: the owner runs them).
    fn followed(&mut self, _ctx: &mut Context<Self>) {}

    /// This node took the channel over from an owner that went away: end
    /// what that owner was running, as after a crash.
    fn promoted(&mut self, _ctx: &mut Context<Self>) {}

    /// Someone on this node needs the channel's state: a follower copy
    /// that let the owner's batches pass reads it from the store and
    /// applies them again (only chats are ever cold).
    fn warm(&mut self, _ctx: &mut Context<Self>) {}

    /// A client's action: refused while the channel is read-only, otherwise
    /// checked by `check` (which reduces it into the state when it passes)
    /// and committed. The dispatcher gets the rejection, or its echo.
    fn client_action(
        &mut self,
        ctx: &mut Context<Self>,
        msg: ClientDispatch,
        check: impl FnOnce(
            &mut Self,
            &mut StateAction,
            &ActionOrigin,
            Option<&Person>,
        ) -> Result<Acts, Rejection>,
    ) {
        let ClientDispatch {
            conn,
            origin,
            mut action,
            by,
            ..
        } = msg;
        let core = self.parts().0;
        if core.follower {
            return self.forward(
                ctx,
                ClientDispatch {
                    conn,
                    origin,
                    action,
                    as_agent: false,
                    by,
                },
            );
        }
        if let Some(e) = core.store_refusal() {
            let kind = <Self::State as ChannelState>::KIND;
            let reason = format!("the store is unavailable ({e}); the {kind} is read-only");
            core.reject(&conn, &origin, &action, &reason);
            return;
        }
        let acts = match check(self, &mut action, &origin, by.as_ref()) {
            Ok(acts) => acts,
            Err(r) => {
                self.parts().0.reject(&conn, &origin, &action, &r.0);
                return;
            }
        };
        let mut batch: Vec<Accepted> = acts
            .before
            .into_iter()
            .map(|a| Accepted::new(a, None))
            .collect();
        batch.push(Accepted::new(action, Some((origin, conn))));
        batch.extend(acts.after.into_iter().map(|a| Accepted::new(a, None)));
        self.commit(ctx, batch, None);
    }

    /// Reduce host or agent actions in order (skipping any that no longer
    /// apply) and commit them as one batch.
    fn host_actions(
        &mut self,
        ctx: &mut Context<Self>,
        actions: Vec<StateAction>,
        done: Option<Done>,
    ) {
        let mut batch = Vec::with_capacity(actions.len());
        for action in actions {
            match self.reduce(&action) {
                Ok(()) => batch.push(Accepted::new(action, None)),
                Err(r) => {
                    tracing::debug!(channel = %self.parts().0.uri, reason = %r, "host action skipped")
                }
            }
        }
        self.commit(ctx, batch, done);
    }

    /// [`ChannelActor::host_actions`], resolving once the batch is published
    /// (so durable), or with why it was not.
    fn host_actions_stored(
        &mut self,
        ctx: &mut Context<Self>,
        actions: Vec<StateAction>,
    ) -> impl std::future::Future<Output = Result<(), Rejection>> + 'static {
        let (done, stored) = oneshot::channel();
        self.host_actions(ctx, actions, Some(done));
        async move {
            let kind = <Self::State as ChannelState>::KIND;
            let gone = || Err(Rejection::new(format!("the {kind} went away")));
            stored.await.unwrap_or_else(|_| gone())
        }
    }

    /// Journal a reduced batch; once durable publish it and run its effects,
    /// then answer `done`. While the journal has it the actor handles nothing
    /// else.
    fn commit(&mut self, ctx: &mut Context<Self>, batch: Vec<Accepted>, done: Option<Done>) {
        if batch.is_empty() || self.parts().0.follower || !Self::JOURNALED {
            // Nothing this node stores: no act of it is on the record.
            self.parts().0.audit.clear();
        }
        if batch.is_empty() {
            if let Some(done) = done {
                let _ = done.send(Ok(()));
            }
            return;
        }
        if self.parts().0.follower {
            // Only the owner writes; whatever asked for this here (a timer,
            // an effect) is the owner's job.
            tracing::debug!(channel = %self.parts().0.uri, "a follower does not write: batch dropped");
            if let Some(done) = done {
                let _ = done.send(Err(Rejection::new(
                    "another node of the cluster runs this channel",
                )));
            }
            return;
        }
        if !Self::JOURNALED {
            publish_all(self, ctx, batch, done);
            return;
        }
        let (turns, truncate) = self.take_history();
        let snapshot = if self.parts().0.snapshot_due(batch.len()) {
            self.snapshot_json()
        } else {
            None
        };
        let commit = self
            .parts()
            .0
            .append(&batch, turns, truncate, move || snapshot);
        ctx.wait(commit.into_actor(self).map(move |res, act, ctx| match res {
            Ok(()) => publish_all(act, ctx, batch, done),
            Err(e) => {
                let reason = format!("not stored: {e}");
                let retry = matches!(e, JournalError::Unavailable(_));
                let fenced = matches!(e, JournalError::Fenced { .. });
                act.parts().0.commit_failed(e, &batch);
                act.roll_back(ctx);
                let core = act.parts().0;
                if core.unreadable.is_none() {
                    core.catch_up();
                }
                if retry {
                    retry_store(ctx);
                }
                if fenced {
                    // Another node took the channel over: follow it.
                    let core = act.parts().0;
                    core.follower = true;
                    core.store_failed = None;
                }
                if let Some(done) = done {
                    let _ = done.send(Err(Rejection::new(reason)));
                }
            }
        }));
    }
}

/// The reads a journaled channel answers from its state alone, the same way
/// for a chat and a session: `subscribe` (the snapshot; refused once the
/// state is no longer known to match the store, see
/// [`ChannelCore::subscribe`]) and `$get`, a copy of its `$state` (for tests
/// and server-side reads).
macro_rules! channel_reads {
    ($actor:ty, $get:ident, $state:ty) => {
        impl actix::Handler<$crate::channels::Subscribe> for $actor {
            type Result = Result<$crate::channels::SnapshotJson, $crate::protocol::RpcError>;

            fn handle(
                &mut self,
                msg: $crate::channels::Subscribe,
                ctx: &mut Self::Context,
            ) -> Self::Result {
                $crate::channels::commit::ChannelActor::warm(self, ctx);
                let (core, state) = $crate::channels::commit::ChannelActor::parts(self);
                core.subscribe(&msg.conn, state)
            }
        }

        impl actix::Handler<$crate::channels::Replicate> for $actor {
            type Result = ();

            fn handle(&mut self, msg: $crate::channels::Replicate, ctx: &mut Self::Context) {
                $crate::channels::following::Following::replicated(self, ctx, msg.0)
            }
        }

        impl actix::Handler<$crate::channels::Resync> for $actor {
            type Result = ();

            fn handle(&mut self, msg: $crate::channels::Resync, ctx: &mut Self::Context) {
                let (core, _) = $crate::channels::commit::ChannelActor::parts(self);
                if core.cold {
                    // Read from the store when it is watched.
                    return;
                }
                core.journal_len = msg.0;
                $crate::channels::following::Following::resync(self, ctx);
            }
        }

        impl actix::Handler<$crate::channels::Demote> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::channels::Demote, _: &mut Self::Context) {
                let (core, _) = $crate::channels::commit::ChannelActor::parts(self);
                core.follower = true;
                tracing::info!(channel = %core.uri, "handed over to another node: following it");
            }
        }

        impl actix::Handler<$crate::channels::Promote> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::channels::Promote, ctx: &mut Self::Context) {
                $crate::channels::commit::ChannelActor::warm(self, ctx);
                let (core, _) = $crate::channels::commit::ChannelActor::parts(self);
                if !core.follower {
                    return;
                }
                core.follower = false;
                tracing::info!(channel = %core.uri, "this node runs the channel now");
                if core.shared.journal.len(&core.uri) != core.journal_len {
                    // Batches read from the stream but not applied yet.
                    $crate::channels::following::Following::resync(self, ctx);
                }
                $crate::channels::commit::ChannelActor::promoted(self, ctx)
            }
        }

        #[doc = concat!("A copy of the `", stringify!($state), "`.")]
        pub struct $get;

        impl actix::Message for $get {
            type Result = $state;
        }

        impl actix::Handler<$crate::channels::Warm> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::channels::Warm, ctx: &mut Self::Context) {
                $crate::channels::commit::ChannelActor::warm(self, ctx);
            }
        }

        impl actix::Handler<$get> for $actor {
            type Result = actix::MessageResult<$get>;

            fn handle(&mut self, _: $get, ctx: &mut Self::Context) -> Self::Result {
                $crate::channels::commit::ChannelActor::warm(self, ctx);
                actix::MessageResult(self.state.clone())
            }
        }
    };
}
pub(crate) use channel_reads;

fn publish_all<A: ChannelActor>(
    act: &mut A,
    ctx: &mut Context<A>,
    batch: Vec<Accepted>,
    done: Option<Done>,
) {
    let core = act.parts().0;
    let from_connections = batch.iter().filter(|a| a.origin.is_some()).count();
    core.shared.metrics.accepted(batch.len(), from_connections);
    let published = batch
        .into_iter()
        .filter_map(|a| {
            let seq = if A::JOURNALED {
                Some(core.publish(&a))
            } else {
                core.publish_unjournaled(&a.json, false)
            };
            seq.map(|seq| (a, seq))
        })
        .collect();
    act.published(ctx, published);
    if let Some(done) = done {
        let _ = done.send(Ok(()));
    }
}
