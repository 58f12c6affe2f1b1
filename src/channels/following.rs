//! A channel on a cluster node that does not own it: reading back what the
//! owner journaled, reading the channel again after a gap, handing a
//! client's action to the owner, and stepping down when another node took
//! the channel. Every channel actor has these through [`Following`].

use actix::prelude::*;
use ahp_types::actions::StateAction;

use super::commit::{ChannelActor, STORE_RETRY};
use super::core::Forwarded;
use super::forward::{ForwardReply, ForwardRequest};
use super::{ClientDispatch, Dispatcher};
use crate::store::Replicated;

/// What a channel actor does as a follower (see the module docs).
pub trait Following: ChannelActor {
    /// A batch some node appended, read back from the shared journal. A
    /// follower reduces and publishes the records it does not have yet (a
    /// gap means it missed some: it reads the channel again; while a read
    /// is due, batches wait in the store for it); an owner
    /// ignores its own batches, and another node's means this node lost
    /// the channel.
    fn replicated(&mut self, ctx: &mut Context<Self>, r: Replicated) {
        let core = self.parts().0;
        let end = r.pos.plus(r.records.len() as u64);
        if core.cold {
            // Nobody here watches it: read from the store when someone does.
            return;
        }
        if end <= core.journal_len {
            return;
        }
        if !core.follower {
            let me = core.shared.cluster.as_ref().map(|c| c.node().to_owned());
            if me.as_deref() == Some(r.writer.as_str()) {
                return;
            }
            tracing::warn!(channel = %core.uri, writer = %r.writer, "another node wrote this channel: following it from now on");
            return self.demote(ctx);
        }
        if core.unreadable.is_some() {
            // A catch-up from the store is due: it reads this batch with
            // the ones missed before it, in order. Applying it now would
            // publish it ahead of them.
            if !core.resync_due {
                self.resync(ctx);
            }
            return;
        }
        if r.pos > core.journal_len {
            tracing::warn!(channel = %core.uri, have = %core.journal_len, got = %r.pos, "replicated batches missed: reading the channel again");
            return self.resync(ctx);
        }
        let skip = (core.journal_len.get() - r.pos.get()) as usize;
        for (i, record) in r.records.iter().enumerate().skip(skip) {
            let action = match serde_json::from_str::<StateAction>(record) {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(channel = %self.parts().0.uri, error = %e, "a replicated action does not decode");
                    return self.resync(ctx);
                }
            };
            if let Err(e) = self.reduce(&action) {
                tracing::error!(channel = %self.parts().0.uri, reason = %e, "a replicated action does not apply: reading the channel again");
                return self.resync(ctx);
            }
            let _ = self.take_history();
            let core = self.parts().0;
            core.journal_len = core.journal_len.plus(1);
            let origin = r.origins.get(i).and_then(Option::as_ref);
            core.publish_replicated(record, origin);
        }
        self.followed(ctx);
    }

    /// Read the channel from the store again and publish what subscribers
    /// have not seen. A follower that cannot (the store is away) tries
    /// again every [`STORE_RETRY`] until it can, rather than wait for the
    /// owner's next batch, which may never come.
    fn resync(&mut self, ctx: &mut Context<Self>) {
        let core = self.parts().0;
        // Where subscribers' knowledge ends: kept from an earlier attempt
        // whose catch-up failed.
        if core.refused_at.is_none() {
            core.refused_at = Some(core.journal_len);
        }
        // Whatever an earlier attempt could not read is read now.
        core.unreadable = None;
        self.roll_back(ctx);
        let core = self.parts().0;
        if core.unreadable.is_none() {
            core.catch_up();
        }
        if core.unreadable.is_some() && core.follower && !core.resync_due {
            core.resync_due = true;
            ctx.run_later(STORE_RETRY, |act, ctx| {
                let core = act.parts().0;
                core.resync_due = false;
                if core.unreadable.is_some() && core.follower {
                    tracing::info!(channel = %core.uri, "reading the followed channel again");
                    act.resync(ctx);
                }
            });
        }
    }

    /// This node no longer writes the channel: it follows the new owner,
    /// from what the store holds.
    fn demote(&mut self, ctx: &mut Context<Self>) {
        self.parts().0.follower = true;
        self.resync(ctx);
        let core = self.parts().0;
        core.store_failed = None;
    }

    /// Hand a client's action to the node that owns the channel; a
    /// rejection (or an owner that does not answer) comes back to the
    /// dispatcher, the echo through this node's copy of the channel.
    fn forward(&mut self, ctx: &mut Context<Self>, msg: ClientDispatch) {
        let core = self.parts().0;
        let Some(link) = core.shared.cluster.clone() else {
            return;
        };
        // Its echo comes back through this copy.
        core.idle_since = None;
        let ClientDispatch {
            conn,
            origin,
            action,
            as_agent,
            by,
        } = msg;
        let body = ForwardRequest::Dispatch {
            channel: core.uri.to_string(),
            origin: origin.clone(),
            action: serde_json::to_value(&action).unwrap_or_default(),
            as_agent,
            by,
        }
        .encode();
        if let Dispatcher::Conn(c) = &conn {
            // Bounded: dispatches whose echo never came back are not kept
            // for ever.
            if core.forwarded.len() >= 4096 {
                core.forwarded.retain(|_, f| !f.answered);
            }
            let key = (origin.client_id.clone(), origin.client_seq);
            core.forwarded.insert(
                key,
                Forwarded {
                    conn: Some(c.out.clone()),
                    answered: false,
                },
            );
        }
        let sent = link.forward(&core.uri, body);
        ctx.spawn(sent.into_actor(self).map(move |res, act, _| {
            let key = (origin.client_id.clone(), origin.client_seq);
            let refused = match res.map(|b| ForwardReply::decode(&b)) {
                Ok(ForwardReply::Done | ForwardReply::Value { .. }) => {
                    let forwarded = &mut act.parts().0.forwarded;
                    if let Some(f) = forwarded.get_mut(&key) {
                        f.answered = true;
                        if f.conn.is_none() {
                            forwarded.remove(&key);
                        }
                    }
                    return;
                }
                Ok(ForwardReply::Rejected { reason }) => reason,
                Ok(ForwardReply::Failed { message, .. }) => message,
                Ok(ForwardReply::NotOwner) => {
                    "the channel is changing hands between nodes; try again".to_owned()
                }
                Err(e) => e,
            };
            let core = act.parts().0;
            if core
                .forwarded
                .remove(&key)
                .is_some_and(|f| f.conn.is_none())
            {
                // Its echo came back already: the owner stored it, then its
                // answer was lost (it went away right after).
                return;
            }
            core.reject(&conn, &origin, &action, &refused);
        }));
    }
}

impl<A: ChannelActor> Following for A {}
