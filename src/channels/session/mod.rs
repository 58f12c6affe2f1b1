//! The session actor: owner of one `SessionState` — its chat catalog, config,
//! and the roll-up of everything its chats wait on.

mod access;
mod approval;
mod chats;
mod follow;
mod invites;
mod state;
#[cfg(test)]
mod tests;

pub use access::SetAccess;
pub use approval::{
    AgentConfigValues, AgentNote, AgentRecall, ApprovalCheckpoint, GrantTool, TurnCheckpoint,
};
pub use chats::{
    ChatSummaryChanged, CreateChat, DisposeSession, ListPending, RemoveChat, RollupChanged,
};
pub use follow::{AdoptChat, ForgetChat};
pub use invites::{InviteOp, Invites};
pub use state::{new_session_state, summary_of};

use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{SessionMetaChangedAction, SessionReadyAction, StateAction};
use ahp_types::notifications::PartialSessionSummary;
use ahp_types::state::{SessionState, SessionSummary};

use super::chat::ChatActor;
use super::commit::{self, ChannelActor, Done};
use super::core::{Accepted, ChannelCore, Shared};
use super::recovery::{self, Rebuilt};
use super::root::{RootActor, SessionSummaryChanged};
use super::validate::{self, Rejection};
use super::ClientDispatch;
use crate::ids::{ChannelUri, ServerSeq};
use crate::interactions::policy;
use crate::publish::Hub;
use crate::time::now_rfc3339;

/// One session channel.
pub struct SessionActor {
    core: ChannelCore,
    state: SessionState,
    root: Addr<RootActor>,
    chats: Vec<(ChannelUri, Addr<ChatActor>)>,
    created_at: String,
    /// The summary as last reported to root (changes are diffed against it).
    reported: SessionSummary,
}

impl SessionActor {
    /// A new session of `provider`, not yet ready, owned by `creator`.
    pub fn new(
        uri: ChannelUri,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        provider: String,
        creator: Option<&str>,
        root: Addr<RootActor>,
    ) -> Self {
        let extra = shared
            .providers
            .get(&provider)
            .map(|a| a.config_properties())
            .unwrap_or_default();
        Self::recovered(
            uri,
            hub,
            shared,
            new_session_state(provider, extra, creator),
            now_rfc3339(),
            root,
        )
    }

    /// A session rebuilt from the store (its chats are attached after).
    pub fn recovered(
        uri: ChannelUri,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        state: SessionState,
        created_at: String,
        root: Addr<RootActor>,
    ) -> Self {
        let reported = summary_of(&uri, &state, &created_at);
        Self {
            core: ChannelCore::new(uri, hub, shared),
            state,
            root,
            chats: Vec::new(),
            reported,
            created_at,
        }
    }

    /// `Ok` when `by` may do what needs `need` here; else the refusal,
    /// naming the role.
    fn permit(
        &self,
        by: Option<&crate::people::Person>,
        need: crate::people::Access,
        what: &str,
    ) -> Result<(), crate::protocol::RpcError> {
        let shared = &self.core.shared;
        shared
            .access
            .permit(&self.core.uri, by, shared.config.session_access, need, what)
            .map_err(|r| {
                crate::protocol::RpcError::new(crate::protocol::errors::PERMISSION_DENIED, r.0)
            })
    }

    /// Put the session's access table where its chats read it.
    fn note_access(&self) {
        let meta = self.state.meta.as_ref();
        let table = crate::people::AccessTable::of_meta(meta);
        self.core.shared.access.set(&self.core.uri, table);
        let invites = crate::invites::InviteTable::of_meta(meta);
        self.core
            .shared
            .access
            .set_invites(&self.core.uri, &invites);
    }

    /// The channel's subscriber hub.
    pub fn hub(&self) -> Arc<Hub> {
        self.core.hub.clone()
    }

    /// The catalog summary root keeps for `listSessions`.
    pub fn summary(&self) -> SessionSummary {
        summary_of(&self.core.uri, &self.state, &self.created_at)
    }

    /// Tell root (and through it `root/sessionSummaryChanged`) what changed.
    fn report_summary(&mut self) {
        let after = self.summary();
        let before = std::mem::replace(&mut self.reported, after.clone());
        let mut changes = PartialSessionSummary::default();
        let mut any = false;
        if after.title != before.title {
            changes.title = Some(after.title.clone());
            any = true;
        }
        if after.status != before.status {
            changes.status = Some(after.status);
            any = true;
        }
        if after.modified_at != before.modified_at {
            changes.modified_at = Some(after.modified_at.clone());
            any = true;
        }
        if after.chats != before.chats {
            changes.chats = after.chats.clone();
            any = true;
        }
        if after.default_chat != before.default_chat {
            changes.default_chat = after.default_chat.clone();
            any = true;
        }
        if any {
            self.root.do_send(SessionSummaryChanged {
                session: self.core.uri.clone(),
                summary: after,
                changes,
            });
        }
    }

    /// A title is shown in every client's session list and copied into
    /// root notifications: it has a length limit.
    fn check_title(&self, action: &StateAction) -> Result<(), Rejection> {
        let StateAction::SessionTitleChanged(a) = action else {
            return Ok(());
        };
        let max = self.core.shared.config.limits.max_title_chars;
        let n = a.title.chars().count();
        if n > max {
            return Err(Rejection::new(format!(
                "a title of {n} characters is over the limit of {max}"
            )));
        }
        Ok(())
    }

    /// A value of a property whose choices the agent knows (its modes, its
    /// models): a string, and one of them when the agent has said which.
    fn check_dynamic(&self, key: &str, value: &serde_json::Value) -> Result<(), Rejection> {
        let Some(v) = value.as_str() else {
            return Err(Rejection::new(format!("`{key}` takes a string")));
        };
        let agent = self.core.shared.providers.get(&self.state.provider);
        let choices = agent.and_then(|a| a.config_choices(&self.core.uri, key));
        match choices {
            Some(items) if !items.iter().any(|i| i.value == v) => {
                let known: Vec<&str> = items.iter().map(|i| i.value.as_str()).collect();
                Err(Rejection::new(format!(
                    "`{v}` is not one of the agent's choices for `{key}`: {}",
                    known.join(", ")
                )))
            }
            _ => Ok(()),
        }
    }

    fn check_config(&self, action: &StateAction) -> Result<(), Rejection> {
        let StateAction::SessionConfigChanged(a) = action else {
            return Ok(());
        };
        let schema = self.state.config.as_ref().map(|c| &c.schema);
        for (key, value) in &a.config {
            let Some(prop) = schema.and_then(|s| s.properties.get(key)) else {
                return Err(Rejection::new(format!(
                    "unknown session config property `{key}`"
                )));
            };
            if prop.session_mutable == Some(false) {
                return Err(Rejection::new(format!(
                    "`{key}` cannot be changed after creation"
                )));
            }
            if let Some(allowed) = &prop.r#enum {
                if !allowed.contains(value) {
                    return Err(Rejection::new(format!(
                        "`{value}` is not an allowed value of `{key}`"
                    )));
                }
            }
            if prop.enum_dynamic == Some(true) {
                self.check_dynamic(key, value)?;
            }
        }
        if a.replace == Some(true) {
            return Err(Rejection::new(
                "replacing the whole session config is not supported; send the changed keys",
            ));
        }
        Ok(())
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        self.core.shared.homes.arrived();
        self.note_access();
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.core.shared.homes.left();
        // A session started again under the same URI (re-created, or read
        // again from the store) keeps the roles and links its actor noted.
        let me = ctx.address();
        let replaced = self
            .core
            .shared
            .registry
            .get(self.core.uri.as_ref())
            .is_some_and(
                |c| !matches!(&c.addr, super::registry::ChannelAddr::Session(a) if *a == me),
            );
        if !replaced {
            self.core.shared.access.remove(&self.core.uri);
        }
    }
}

impl ChannelActor for SessionActor {
    type State = SessionState;

    fn parts(&mut self) -> (&mut ChannelCore, &mut SessionState) {
        (&mut self.core, &mut self.state)
    }

    fn published(&mut self, _: &mut Context<Self>, _: Vec<(Accepted, ServerSeq)>) {
        self.report_summary();
        self.note_access();
    }

    fn followed(&mut self, _: &mut Context<Self>) {
        self.report_summary();
        self.note_access();
    }

    fn roll_back(&mut self, _ctx: &mut Context<Self>) {
        match recovery::reload(&self.core) {
            Ok(Some(Rebuilt::Session(state))) => {
                self.state = *state;
                self.note_access();
            }
            Ok(Some(_)) => {
                tracing::error!(session = %self.core.uri, "stored channel is not a session")
            }
            Ok(None) => {
                tracing::error!(session = %self.core.uri, "the session is not in the store")
            }
            Err(e) => {
                tracing::error!(session = %self.core.uri, error = %e, "cannot roll back");
                self.core.unreadable = Some(e);
            }
        }
    }
}

/// Finish creating the session: default chat, then `session/ready`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InitSession {
    /// URI of the default chat.
    pub default_chat: ChannelUri,
    /// Answered once the session is stored and ready.
    pub done: Done,
}

impl Handler<InitSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: InitSession, ctx: &mut Self::Context) {
        let mut actions = self.add_chat(ctx, msg.default_chat, "Chat".into(), true);
        actions.push(StateAction::SessionReady(SessionReadyAction {}));
        self.host_actions(ctx, actions, Some(msg.done));
    }
}

/// The chats of a recovered session, started by the server at start-up.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachChats(pub Vec<(ChannelUri, Addr<ChatActor>)>);

impl Handler<AttachChats> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: AttachChats, _: &mut Self::Context) {
        self.chats.extend(msg.0);
    }
}

impl Handler<ClientDispatch> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, ctx: &mut Self::Context) {
        self.client_action(ctx, msg, |act, action, _, by| {
            let shared = &act.core.shared;
            let default = shared.config.session_access;
            shared
                .access
                .permit_action(&act.core.uri, by, default, action)?;
            act.client_checks(action)?;
            let mut acts = commit::Acts::default();
            if let (StateAction::SessionConfigChanged(a), Some(by)) = (&*action, by) {
                // Who changed each property, in the session's `_meta`.
                let mut meta = act.state.meta.clone().unwrap_or_default();
                policy::record_config_change(&mut meta, a.config.keys(), by);
                let note =
                    StateAction::SessionMetaChanged(SessionMetaChangedAction { meta: Some(meta) });
                if act.reduce(&note).is_ok() {
                    acts.after.push(note);
                }
                let entry = crate::channels::audit::entry(
                    crate::channels::audit::AuditKind::ConfigChanged,
                    by,
                    &act.core.uri,
                    None,
                    serde_json::json!({ "config": a.config }),
                );
                act.core.audit.push(entry);
            }
            Ok(acts)
        });
    }
}

impl SessionActor {
    /// Every rule for a client-dispatched session action; reduces it into
    /// the state when it passes.
    fn client_checks(&mut self, action: &StateAction) -> Result<(), Rejection> {
        let ty = validate::action_type(action);
        let checked = if let StateAction::Unknown(raw) = action {
            Err(Rejection::new(validate::malformed_reason(raw)))
        } else if !validate::CLIENT_SESSION_ACTIONS.contains(&ty.as_str()) {
            Err(Rejection::new(format!(
                "`{ty}` is not a client-dispatchable action"
            )))
        } else {
            self.check_title(action)
                .and_then(|()| self.check_config(action))
        };
        checked.and_then(|()| {
            // Setting a config value to what it already is emits nothing.
            if let StateAction::SessionConfigChanged(a) = action {
                let values = self.state.config.as_ref().map(|c| &c.values);
                if policy::changes_nothing(values, &a.config) {
                    return Err(Rejection::new(
                        "no change: the session config already has these values",
                    ));
                }
            }
            self.reduce(action)
        })
    }
}

commit::channel_reads!(SessionActor, GetSessionState, SessionState);
