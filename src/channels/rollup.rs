//! The session roll-up of a chat: every open input request and every tool call
//! waiting on a person, as `SessionInputRequest` entries. The chat actor diffs
//! this after each action and tells its session what to set and remove.

use ahp_types::state::{
    ChatState, ResponsePart, SessionChatInputRequest, SessionInputRequest,
    SessionToolConfirmationRequest, ToolCallConfirmationState, ToolCallState,
};

/// Roll-up entry id for an input request (stable, opaque to clients).
pub fn input_entry_id(chat: &str, request_id: &str) -> String {
    format!("{chat}#input/{request_id}")
}

/// Roll-up entry id for a tool confirmation.
pub fn tool_entry_id(chat: &str, tool_call_id: &str) -> String {
    format!("{chat}#tool/{tool_call_id}")
}

/// The entry id of a roll-up item.
pub fn entry_id(r: &SessionInputRequest) -> Option<&str> {
    match r {
        SessionInputRequest::ChatInput(r) => Some(&r.id),
        SessionInputRequest::ToolConfirmation(r) => Some(&r.id),
        SessionInputRequest::ToolClientExecution(r) => Some(&r.id),
        SessionInputRequest::ToolAuthentication(r) => Some(&r.id),
        SessionInputRequest::Unknown(_) => None,
    }
}

/// Everything in `state`'s active turn that waits on a person, in stream order.
pub fn open_items(chat: &str, state: &ChatState) -> Vec<SessionInputRequest> {
    let Some(turn) = &state.active_turn else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for part in &turn.response_parts {
        match part {
            ResponsePart::InputRequest(i) if i.response.is_none() => {
                out.push(SessionInputRequest::ChatInput(SessionChatInputRequest {
                    id: input_entry_id(chat, &i.request.id),
                    chat: chat.to_owned(),
                    request: i.request.clone(),
                }));
            }
            ResponsePart::ToolCall(tc) => {
                let confirmation = match &tc.tool_call {
                    ToolCallState::PendingConfirmation(p) => Some((
                        p.tool_call_id.clone(),
                        ToolCallConfirmationState::PendingConfirmation(p.clone()),
                    )),
                    ToolCallState::PendingResultConfirmation(p) => Some((
                        p.tool_call_id.clone(),
                        ToolCallConfirmationState::PendingResultConfirmation(p.clone()),
                    )),
                    _ => None,
                };
                if let Some((id, tool_call)) = confirmation {
                    out.push(SessionInputRequest::ToolConfirmation(
                        SessionToolConfirmationRequest {
                            id: tool_entry_id(chat, &id),
                            chat: chat.to_owned(),
                            turn_id: turn.id.clone(),
                            tool_call,
                        },
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// What changed between two roll-ups: entries to upsert and ids to remove.
pub fn diff(
    before: &[SessionInputRequest],
    after: &[SessionInputRequest],
) -> (Vec<SessionInputRequest>, Vec<String>) {
    let set = after
        .iter()
        .filter(|a| !before.iter().any(|b| b == *a))
        .cloned()
        .collect();
    let removed = before
        .iter()
        .filter_map(entry_id)
        .filter(|id| !after.iter().any(|a| entry_id(a) == Some(id)))
        .map(str::to_owned)
        .collect();
    (set, removed)
}
