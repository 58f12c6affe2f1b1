//! The session's side of the approval policy ([`crate::interactions::policy`]):
//! checkpoints make the configured mode the effective one, and grants are
//! recorded in the session's `_meta`, published and journaled like any
//! other change.

use actix::prelude::*;
use ahp_types::actions::{SessionMetaChangedAction, StateAction};
use serde_json::{Map, Value};

use super::SessionActor;
use crate::channels::commit::ChannelActor;
use crate::interactions::policy;

/// A tool call needs approval: apply any pending approval-mode change (this is
/// a checkpoint) and say whether policy decides it without asking.
#[derive(Message)]
#[rtype(result = "policy::Auto")]
pub struct ApprovalCheckpoint {
    /// The tool being called.
    pub tool_name: String,
}

impl SessionActor {
    /// Publish a new `_meta`.
    pub(super) fn set_meta(&mut self, ctx: &mut Context<Self>, meta: Map<String, Value>) {
        let action = StateAction::SessionMetaChanged(SessionMetaChangedAction { meta: Some(meta) });
        self.host_actions(ctx, vec![action], None);
    }

    /// A checkpoint: the configured mode becomes the effective one (and is
    /// returned).
    pub fn checkpoint(&mut self, ctx: &mut Context<Self>) -> String {
        let configured = policy::configured_mode(self.state.config.as_ref()).to_owned();
        if let Some(meta) = policy::checkpoint(self.state.meta.as_ref(), &configured) {
            self.set_meta(ctx, meta);
        }
        configured
    }
}

impl Handler<ApprovalCheckpoint> for SessionActor {
    type Result = MessageResult<ApprovalCheckpoint>;

    fn handle(&mut self, msg: ApprovalCheckpoint, ctx: &mut Self::Context) -> Self::Result {
        let mode = self.checkpoint(ctx);
        let meta = self.state.meta.as_ref();
        MessageResult(policy::decide(
            &mode,
            policy::granted(meta, &msg.tool_name),
            policy::denied(meta, &msg.tool_name),
        ))
    }
}

/// "Approve for this session" (or an agent's "allow always") was chosen for
/// a tool — or an agent's "reject always" (`allow: false`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantTool {
    /// The tool now decided for the session.
    pub tool_name: String,
    /// Approved (a grant) or refused (a denial).
    pub allow: bool,
    /// The person whose choice it was.
    pub by: Option<crate::people::Person>,
}

impl Handler<GrantTool> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: GrantTool, ctx: &mut Self::Context) {
        let meta = self.state.meta.as_ref();
        let changed = if msg.allow {
            policy::grant(meta, &msg.tool_name)
        } else {
            policy::deny(meta, &msg.tool_name)
        };
        if let Some(mut meta) = changed {
            if let Some(by) = &msg.by {
                policy::record_decider(&mut meta, &msg.tool_name, msg.allow, by);
            }
            self.set_meta(ctx, meta);
        }
    }
}

/// Something an agent said about one of the session's chats that has no AHP
/// action of its own (its commands, its mode, …): kept in the session's
/// `_meta` under `tandem/agent` → chat URI → `key`, so every client sees it
/// and it survives a restart. The same value again publishes nothing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentNote {
    /// The chat it is about.
    pub chat: String,
    /// What it is (e.g. `available_commands_update`).
    pub key: String,
    /// The agent's message as sent.
    pub value: Value,
}

/// `_meta` key of [`AgentNote`]s.
pub const AGENT_NOTES_META: &str = "tandem/agent";

impl Handler<AgentNote> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: AgentNote, ctx: &mut Self::Context) {
        let mut meta = self.state.meta.clone().unwrap_or_default();
        let notes = meta
            .entry(AGENT_NOTES_META)
            .or_insert_with(|| Value::Object(Map::new()));
        if !notes.is_object() {
            *notes = Value::Object(Map::new());
        }
        let chat = notes.as_object_mut().map(|n| {
            n.entry(msg.chat)
                .or_insert_with(|| Value::Object(Map::new()))
        });
        let Some(Value::Object(chat)) = chat else {
            return;
        };
        if chat.get(&msg.key) == Some(&msg.value) {
            return;
        }
        chat.insert(msg.key, msg.value);
        self.set_meta(ctx, meta);
    }
}

/// What an [`AgentNote`] kept for a chat under `key`, if anything.
#[derive(Message)]
#[rtype(result = "Option<Value>")]
pub struct AgentRecall {
    /// The chat it is about.
    pub chat: String,
    /// What it is.
    pub key: String,
}

impl Handler<AgentRecall> for SessionActor {
    type Result = Option<Value>;

    fn handle(&mut self, msg: AgentRecall, _: &mut Self::Context) -> Self::Result {
        self.state
            .meta
            .as_ref()?
            .get(AGENT_NOTES_META)?
            .get(&msg.chat)?
            .get(&msg.key)
            .cloned()
    }
}

/// The session's config values, for its agent.
#[derive(Message)]
#[rtype(result = "Option<Map<String, Value>>")]
pub struct AgentConfigValues;

impl Handler<AgentConfigValues> for SessionActor {
    type Result = Option<Map<String, Value>>;

    fn handle(&mut self, _: AgentConfigValues, _: &mut Self::Context) -> Self::Result {
        self.state.config.as_ref().map(|c| c.values.clone())
    }
}

/// A turn starts in one of the session's chats: also a checkpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TurnCheckpoint;

impl Handler<TurnCheckpoint> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: TurnCheckpoint, ctx: &mut Self::Context) {
        self.checkpoint(ctx);
    }
}
