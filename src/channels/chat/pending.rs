//! `tandem/listPending`: the interactions still open in a chat, each with
//! the `serverSeq` of the envelope that opened it.

use actix::prelude::*;
use ahp_types::state::{SessionInputRequest, ToolCallConfirmationState};

use super::ChatActor;
use crate::channels::rollup;
use crate::ids::ServerSeq;

/// One unsettled interaction, for `tandem/listPending`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingItem {
    /// `input` or `toolApproval`.
    pub kind: &'static str,
    /// The chat it waits in.
    pub chat: String,
    /// Its turn.
    pub turn_id: String,
    /// For an input request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For a tool approval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `serverSeq` of the envelope that opened it.
    pub server_seq: ServerSeq,
}

/// Everything unsettled in this chat.
#[derive(Message)]
#[rtype(result = "Vec<PendingItem>")]
pub struct GetPending;

impl Handler<GetPending> for ChatActor {
    type Result = MessageResult<GetPending>;

    fn handle(&mut self, _: GetPending, ctx: &mut Self::Context) -> Self::Result {
        self.ensure_warm(ctx);
        let turn_id = self
            .state
            .active_turn
            .as_ref()
            .map(|t| t.id.clone())
            .unwrap_or_default();
        let items = rollup::open_items(&self.core.uri, &self.state)
            .into_iter()
            .filter_map(|i| {
                let seq = rollup::entry_id(&i)
                    .and_then(|id| self.opened.get(id))
                    .copied()
                    .unwrap_or_default();
                match i {
                    SessionInputRequest::ChatInput(r) => Some(PendingItem {
                        kind: "input",
                        chat: r.chat,
                        turn_id: turn_id.clone(),
                        request_id: Some(r.request.id),
                        tool_call_id: None,
                        server_seq: seq,
                    }),
                    SessionInputRequest::ToolConfirmation(r) => Some(PendingItem {
                        kind: "toolApproval",
                        chat: r.chat,
                        turn_id: r.turn_id,
                        request_id: None,
                        tool_call_id: Some(match &r.tool_call {
                            ToolCallConfirmationState::PendingConfirmation(p) => {
                                p.tool_call_id.clone()
                            }
                            ToolCallConfirmationState::PendingResultConfirmation(p) => {
                                p.tool_call_id.clone()
                            }
                            ToolCallConfirmationState::Unknown(_) => return None,
                        }),
                        server_seq: seq,
                    }),
                    _ => None,
                }
            })
            .collect();
        MessageResult(items)
    }
}
