//! The session's side of the approval policy ([`crate::interactions::policy`]):
//! checkpoints make the configured mode the effective one, and grants are
//! recorded in the session's `_meta`, published and journaled like any
//! other change.

use actix::prelude::*;
use ahp_types::actions::{SessionMetaChangedAction, StateAction};
use ahp_types::state::ToolCallConfirmationReason;
use serde_json::{Map, Value};

use super::SessionActor;
use crate::channels::commit::ChannelActor;
use crate::interactions::policy;

/// A tool call needs approval: apply any pending approval-mode change (this is
/// a checkpoint) and say whether policy confirms it without asking.
#[derive(Message)]
#[rtype(result = "Option<ToolCallConfirmationReason>")]
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
    type Result = Option<ToolCallConfirmationReason>;

    fn handle(&mut self, msg: ApprovalCheckpoint, ctx: &mut Self::Context) -> Self::Result {
        let mode = self.checkpoint(ctx);
        let granted = policy::granted(self.state.meta.as_ref(), &msg.tool_name);
        policy::auto_confirmation(&mode, granted)
    }
}

/// "Approve for this session" was chosen for a tool.
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantTool {
    /// The tool now approved for the session.
    pub tool_name: String,
}

impl Handler<GrantTool> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: GrantTool, ctx: &mut Self::Context) {
        if let Some(meta) = policy::grant(self.state.meta.as_ref(), &msg.tool_name) {
            self.set_meta(ctx, meta);
        }
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
