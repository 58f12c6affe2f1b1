//! The root actor: `ahp-root://` state (agents, session count), session
//! creation and disposal, and the session catalog behind `listSessions`.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{RootActiveSessionsChangedAction, RootAgentsChangedAction, StateAction};
use ahp_types::notifications::{PartialSessionSummary, SessionSummaryChangedParams};
use ahp_types::state::{RootState, SessionSummary};
use ahp_types::ROOT_RESOURCE_URI;
use bytestring::ByteString;

mod lifecycle;

pub use lifecycle::{AdoptSession, CreateSession, RemoveSession};

use super::commit::ChannelActor;
use super::core::{Accepted, ChannelCore, Shared};
use super::session::SessionActor;
use super::validate;
use super::{ClientDispatch, SnapshotJson, Subscribe};
use crate::ids::{ChannelUri, ServerSeq};
use crate::protocol::{encode_notification, RpcError};
use crate::publish::Hub;

/// The root channel.
pub struct RootActor {
    core: ChannelCore,
    /// Own address, handed to the sessions it starts.
    me: Addr<RootActor>,
    state: RootState,
    sessions: HashMap<ChannelUri, (Addr<SessionActor>, SessionSummary)>,
    /// Sessions created per token subject (for the per-token limit).
    owned: HashMap<String, std::collections::HashSet<ChannelUri>>,
    /// Sessions started but not yet stored (in `sessions`, not yet listed).
    creating: HashMap<ChannelUri, lifecycle::Creating>,
}

impl RootActor {
    /// The root channel with the given agents registered.
    pub fn new(hub: Arc<Hub>, shared: Arc<Shared>, me: Addr<RootActor>) -> Self {
        let agents = shared.providers.infos();
        Self {
            me,
            core: ChannelCore::new(ROOT_RESOURCE_URI.into(), hub, shared),
            state: RootState {
                agents,
                active_sessions: Some(0),
                terminals: None,
                config: None,
                meta: None,
            },
            sessions: HashMap::new(),
            owned: HashMap::new(),
            creating: HashMap::new(),
        }
    }

    /// A root notification about `session`, to the subscribers who may see it.
    fn notify(&self, session: &str, method: &str, params: &impl serde::Serialize) {
        let params = serde_json::to_value(params).unwrap_or_default();
        self.core.hub.notify_about(
            session,
            &ByteString::from(encode_notification(method, &params)),
        );
    }

    /// `root/sessionSummaryChanged` for `session`.
    fn notify_summary_changed(&self, session: &str, changes: PartialSessionSummary) {
        self.notify(
            session,
            "root/sessionSummaryChanged",
            &SessionSummaryChangedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: session.to_owned(),
                changes,
            },
        );
    }

    /// The server context.
    pub fn shared(&self) -> Arc<Shared> {
        self.core.shared.clone()
    }

    /// Own address.
    pub fn address(&self) -> Addr<RootActor> {
        self.me.clone()
    }

    /// Publish the session count — to the subscribers that see every
    /// session only: a scoped client would learn other tenants' activity
    /// from it, so its root state has no `activeSessions` at all.
    pub fn session_count_changed(&mut self) {
        let n = (self.sessions.len() - self.creating.len()) as i64;
        let action = StateAction::RootActiveSessionsChanged(RootActiveSessionsChangedAction {
            active_sessions: n,
        });
        if super::reduce::reduce(&mut self.state, &action).is_err() {
            return;
        }
        let json = serde_json::to_string(&action).unwrap_or_else(|_| "null".into());
        self.core.publish_unjournaled(&json, true);
    }
}

impl Actor for RootActor {
    type Context = Context<Self>;
}

impl ChannelActor for RootActor {
    type State = RootState;

    /// Root state is derived (the agents registered, the sessions that
    /// exist), so its actions are published without a journal entry: after
    /// a restart it is rebuilt from the stored sessions.
    const JOURNALED: bool = false;

    fn parts(&mut self) -> (&mut ChannelCore, &mut RootState) {
        (&mut self.core, &mut self.state)
    }

    fn published(&mut self, _: &mut Context<Self>, _: Vec<(Accepted, ServerSeq)>) {}

    fn roll_back(&mut self, _ctx: &mut Context<Self>) {}
}

impl Handler<ClientDispatch> for RootActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, _: &mut Self::Context) {
        let reason = match &msg.action {
            StateAction::Unknown(raw) => validate::malformed_reason(raw),
            StateAction::RootConfigChanged(_) => {
                "this host has no root configuration to change".to_owned()
            }
            other => format!(
                "`{}` is not a client-dispatchable action",
                validate::action_type(other)
            ),
        };
        self.core
            .reject(&msg.conn, &msg.origin, &msg.action, &reason);
    }
}

impl Handler<Subscribe> for RootActor {
    type Result = Result<SnapshotJson, RpcError>;

    fn handle(&mut self, msg: Subscribe, _: &mut Self::Context) -> Self::Result {
        if msg.conn.is_scoped() {
            let scoped = RootState {
                active_sessions: None,
                ..self.state.clone()
            };
            return self.core.subscribe(&msg.conn, &scoped);
        }
        self.core.subscribe(&msg.conn, &self.state)
    }
}

/// A session's summary changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SessionSummaryChanged {
    /// The session.
    pub session: ChannelUri,
    /// The full new summary.
    pub summary: SessionSummary,
    /// Only the fields that changed.
    pub changes: PartialSessionSummary,
}

impl Handler<SessionSummaryChanged> for RootActor {
    type Result = ();

    fn handle(&mut self, msg: SessionSummaryChanged, _: &mut Self::Context) {
        let Some(entry) = self.sessions.get_mut(&msg.session) else {
            return;
        };
        entry.1 = msg.summary;
        if self.is_creating(&msg.session) {
            self.defer_summary_change(&msg.session, msg.changes);
            return;
        }
        self.notify_summary_changed(&msg.session, msg.changes);
    }
}

/// `listSessions`: most recently modified first, paged by offset cursors.
#[derive(Message)]
#[rtype(result = "Result<ahp_types::commands::ListSessionsResult, RpcError>")]
pub struct ListSessions {
    /// Only sessions in this set (a scoped token).
    pub scope: Option<Arc<std::collections::HashSet<String>>>,
    /// Page size.
    pub limit: Option<i64>,
    /// Cursor from a previous page.
    pub cursor: Option<String>,
}

/// Largest page `listSessions` returns.
const MAX_PAGE: usize = 500;

impl Handler<ListSessions> for RootActor {
    type Result = Result<ahp_types::commands::ListSessionsResult, RpcError>;

    fn handle(&mut self, msg: ListSessions, _: &mut Self::Context) -> Self::Result {
        let offset = match &msg.cursor {
            None => 0,
            Some(c) => c
                .strip_prefix("offset:")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| RpcError::invalid_params(format!("unrecognised cursor `{c}`")))?,
        };
        let limit = msg
            .limit
            .map_or(MAX_PAGE, |l| (l.max(1) as usize).min(MAX_PAGE));
        let mut all: Vec<&SessionSummary> = self
            .sessions
            .iter()
            .filter(|(uri, _)| !self.creating.contains_key(*uri))
            .map(|(_, (_, s))| s)
            .filter(|s| msg.scope.as_ref().is_none_or(|sc| sc.contains(&s.resource)))
            .collect();
        all.sort_by(|a, b| {
            b.modified_at
                .cmp(&a.modified_at)
                .then_with(|| a.resource.cmp(&b.resource))
        });
        let items: Vec<SessionSummary> = all
            .iter()
            .skip(offset)
            .take(limit)
            .map(|s| (*s).clone())
            .collect();
        let next = offset + items.len();
        Ok(ahp_types::commands::ListSessionsResult {
            next_cursor: (next < all.len()).then(|| format!("offset:{next}")),
            items,
        })
    }
}

/// Replace the agent list (a provider registered or left).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentsChanged;

impl Handler<AgentsChanged> for RootActor {
    type Result = ();

    fn handle(&mut self, _: AgentsChanged, ctx: &mut Self::Context) {
        let agents = self.core.shared.providers.infos();
        let action = StateAction::RootAgentsChanged(RootAgentsChangedAction { agents });
        self.host_actions(ctx, vec![action], None);
    }
}

#[cfg(test)]
mod tests;
