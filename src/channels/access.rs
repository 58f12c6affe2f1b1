//! Who may do what in each session this node serves: the sessions' access
//! tables ([`AccessTable`], kept in each session's `_meta`), for the chat
//! and session actors to check a person's act against before they take it.
//!
//! A session actor puts its table here whenever its state is (re)built or
//! changes; its chats, on the same node, read it. A node that forwards a
//! request does not check: the owner does, with the person and their
//! token's standing carried in the request.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ahp_types::actions::StateAction;

use super::validate::{action_type, Rejection};
use crate::ids::ChannelUri;
use crate::invites::{Closed, Guest, Invite, InviteTable};
use crate::people::{needed_for, Access, AccessTable, Person};

/// The access tables of the sessions on this node, and their invite
/// links by id (for an upgrade to find the session a code is for).
#[derive(Default)]
pub struct AccessBook {
    tables: RwLock<HashMap<ChannelUri, Arc<AccessTable>>>,
    invites: RwLock<HashMap<String, (ChannelUri, Invite)>>,
}

impl AccessBook {
    /// Keep `table` as `session`'s.
    pub fn set(&self, session: &ChannelUri, table: AccessTable) {
        let mut t = self.tables.write().unwrap_or_else(|e| e.into_inner());
        if t.get(session).is_some_and(|old| **old == table) {
            return;
        }
        t.insert(session.clone(), Arc::new(table));
    }

    /// Forget `session` (disposed, or no longer on this node), and its
    /// links.
    pub fn remove(&self, session: &ChannelUri) {
        let mut t = self.tables.write().unwrap_or_else(|e| e.into_inner());
        t.remove(session);
        drop(t);
        self.set_invites(session, &InviteTable::default());
    }

    /// Keep `table` as `session`'s links.
    pub fn set_invites(&self, session: &ChannelUri, table: &InviteTable) {
        let mut i = self.invites.write().unwrap_or_else(|e| e.into_inner());
        let unchanged = table
            .0
            .iter()
            .all(|(id, inv)| i.get(id).is_some_and(|(s, old)| s == session && old == inv))
            && i.values().filter(|(s, _)| s == session).count() == table.0.len();
        if unchanged {
            return;
        }
        i.retain(|_, (s, _)| s != session);
        for (id, inv) in &table.0 {
            i.insert(id.clone(), (session.clone(), inv.clone()));
        }
    }

    /// The link `id` and its session.
    pub fn invite(&self, id: &str) -> Option<(ChannelUri, Invite)> {
        let i = self.invites.read().unwrap_or_else(|e| e.into_inner());
        i.get(id).cloned()
    }

    /// Whether `guest`'s link still lets them in at `now`: `Err` with why
    /// not, as this node knows the link.
    pub fn guest_still_open(&self, guest: &Guest, now: u64) -> Result<(), Closed> {
        match self.invite(&guest.id) {
            Some((s, invite)) if s == guest.session => invite.ended(now).map_or(Ok(()), Err),
            _ => Err(Closed::Unknown),
        }
    }

    /// `session`'s links, by id.
    pub fn invites_of(&self, session: &ChannelUri) -> Vec<(String, Invite)> {
        let i = self.invites.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = i
            .iter()
            .filter(|(_, (s, _))| s == session)
            .map(|(id, (_, inv))| (id.clone(), inv.clone()))
            .collect();
        v.sort_by(|a, b| a.1.created_at.cmp(&b.1.created_at));
        v
    }

    /// `session`'s table (empty if this node has none).
    pub fn get(&self, session: &ChannelUri) -> Arc<AccessTable> {
        let t = self.tables.read().unwrap_or_else(|e| e.into_inner());
        t.get(session).cloned().unwrap_or_default()
    }

    /// What `by` may do in `session`, with the server's `default`.
    pub fn level(&self, session: &ChannelUri, by: &Person, default: Access) -> Access {
        self.get(session).level_of(session.as_str(), by, default)
    }

    /// `Ok` when `by` (`None`: the host or an agent) may do what needs
    /// `need` in `session`; else a rejection naming the role it needs.
    pub fn permit(
        &self,
        session: &ChannelUri,
        by: Option<&Person>,
        default: Access,
        need: Access,
        what: &str,
    ) -> Result<(), Rejection> {
        let Some(by) = by else { return Ok(()) };
        self.get(session)
            .permit(session.as_str(), by, default, need, what)
            .map_err(Rejection::new)
    }

    /// [`Self::permit`] for a dispatched `action`.
    pub fn permit_action(
        &self,
        session: &ChannelUri,
        by: Option<&Person>,
        default: Access,
        action: &StateAction,
    ) -> Result<(), Rejection> {
        let Some(by) = by.filter(|b| !b.standing.admin) else {
            return Ok(());
        };
        let need = needed_for(action);
        let table = self.get(session);
        if table.level_of(session.as_str(), by, default) >= need {
            return Ok(());
        }
        let what = format!("`{}`", action_type(action));
        table
            .permit(session.as_str(), by, default, need, &what)
            .map_err(Rejection::new)
    }
}
