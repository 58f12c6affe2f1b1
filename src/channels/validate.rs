//! Server-side rules for client-dispatched actions (`docs/protocol.md`, "Validation").
//! Pure functions over the current state: a violation is a [`Rejection`] with a
//! reason the sender sees in `rejectionReason`; the state is never touched.

mod answers;

pub use crate::interactions::question_kind;
pub use answers::{
    answer_lengths, check_answer, input_answer_changed, input_completed, question_id,
};

use ahp_types::actions::{ChatToolCallConfirmedAction, ChatTurnStartedAction, StateAction};
use ahp_types::state::{
    ChatState, ConfirmationOptionKind, ResponsePart, ToolCallContributor, ToolCallState,
};
use serde_json::Value;

/// Why an action was refused; the text goes to the sender verbatim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejection(pub String);

impl Rejection {
    /// Build from anything displayable.
    pub fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }
}

type Check = Result<(), Rejection>;

fn reject<T>(reason: impl Into<String>) -> Result<T, Rejection> {
    Err(Rejection::new(reason))
}

/// The wire `type` of an action (also for unknown ones).
pub fn action_type(action: &StateAction) -> String {
    match serde_json::to_value(action) {
        Ok(Value::Object(o)) => o
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
        _ => "?".to_owned(),
    }
}

/// Chat actions a plain client may dispatch.
pub const CLIENT_CHAT_ACTIONS: &[&str] = &[
    "chat/turnStarted",
    "chat/turnCancelled",
    "chat/truncated",
    "chat/toolCallConfirmed",
    "chat/toolCallComplete",
    "chat/toolCallResultConfirmed",
    "chat/toolCallContentChanged",
    "chat/pendingMessageSet",
    "chat/pendingMessageRemoved",
    "chat/queuedMessagesReordered",
    "chat/draftChanged",
    "chat/inputAnswerChanged",
    "chat/inputCompleted",
];

/// Session actions a plain client may dispatch.
pub const CLIENT_SESSION_ACTIONS: &[&str] = &[
    "session/titleChanged",
    "session/isReadChanged",
    "session/isArchivedChanged",
    "session/activeClientSet",
    "session/activeClientRemoved",
    "session/configChanged",
];

/// An action whose `type` we know but whose payload did not decode arrives as
/// `StateAction::Unknown`; name the decoding problem instead of "unknown type".
pub fn malformed_reason(raw: &Value) -> String {
    use ahp_types::actions as a;
    let ty = raw.get("type").and_then(Value::as_str).unwrap_or("");
    fn err<T: serde::de::DeserializeOwned>(raw: &Value) -> Option<String> {
        serde_json::from_value::<T>(raw.clone())
            .err()
            .map(|e| e.to_string())
    }
    let detail = match ty {
        "chat/inputAnswerChanged" => {
            if let Some(state) = raw.pointer("/answer/state").and_then(Value::as_str) {
                if (state == "draft" || state == "submitted")
                    && raw.pointer("/answer/value").is_none()
                {
                    return format!("answer.state is `{state}` but answer.value is missing");
                }
            }
            err::<a::ChatInputAnswerChangedAction>(raw)
        }
        "chat/inputCompleted" => err::<a::ChatInputCompletedAction>(raw),
        "chat/toolCallConfirmed" => err::<a::ChatToolCallConfirmedAction>(raw),
        "chat/turnStarted" => err::<a::ChatTurnStartedAction>(raw),
        "chat/turnCancelled" => err::<a::ChatTurnCancelledAction>(raw),
        "chat/toolCallComplete" => err::<a::ChatToolCallCompleteAction>(raw),
        "chat/toolCallResultConfirmed" => err::<a::ChatToolCallResultConfirmedAction>(raw),
        "chat/toolCallContentChanged" => err::<a::ChatToolCallContentChangedAction>(raw),
        "chat/truncated" => err::<a::ChatTruncatedAction>(raw),
        "chat/pendingMessageSet" => err::<a::ChatPendingMessageSetAction>(raw),
        "chat/pendingMessageRemoved" => err::<a::ChatPendingMessageRemovedAction>(raw),
        "chat/queuedMessagesReordered" => err::<a::ChatQueuedMessagesReorderedAction>(raw),
        "chat/draftChanged" => err::<a::ChatDraftChangedAction>(raw),
        "" => return "action has no `type`".to_owned(),
        _ => None,
    };
    let known = CLIENT_CHAT_ACTIONS.contains(&ty) || CLIENT_SESSION_ACTIONS.contains(&ty);
    match detail {
        Some(d) => format!("malformed `{ty}` action: {d}"),
        None if known => format!("malformed `{ty}` action: its fields do not match the AHP schema"),
        None => format!("`{ty}` is not a client-dispatchable action"),
    }
}

/// `chat/toolCallConfirmed`.
pub fn tool_call_confirmed(state: &ChatState, a: &ChatToolCallConfirmedAction) -> Check {
    let tc = active_tool_call(state, &a.turn_id, &a.tool_call_id)?;
    let ToolCallState::PendingConfirmation(p) = tc else {
        return reject(format!(
            "tool call `{}` is not pending confirmation (it is {})",
            a.tool_call_id,
            tool_status(tc)
        ));
    };
    if a.edited_tool_input.is_some() && p.editable != Some(true) {
        return reject(format!("tool call `{}` is not editable", a.tool_call_id));
    }
    if let Some(id) = &a.selected_option_id {
        let Some(opt) = p.options.iter().flatten().find(|o| &o.id == id) else {
            return reject(format!(
                "option `{id}` is not offered for tool call `{}`",
                a.tool_call_id
            ));
        };
        let approves = opt.kind == ConfirmationOptionKind::Approve;
        if approves != a.approved {
            return reject(format!(
                "option `{id}` {} the call but `approved` is {}",
                if approves { "approves" } else { "denies" },
                a.approved
            ));
        }
    }
    Ok(())
}

/// `chat/toolCallResultConfirmed`.
pub fn tool_call_result_confirmed(state: &ChatState, turn_id: &str, tool_call_id: &str) -> Check {
    let tc = active_tool_call(state, turn_id, tool_call_id)?;
    if !matches!(tc, ToolCallState::PendingResultConfirmation(_)) {
        return reject(format!(
            "tool call `{tool_call_id}` is not pending result confirmation (it is {})",
            tool_status(tc)
        ));
    }
    Ok(())
}

/// `chat/toolCallComplete` and `chat/toolCallContentChanged` from a client:
/// only for a tool that client contributed.
pub fn client_tool_update(
    state: &ChatState,
    turn_id: &str,
    tool_call_id: &str,
    client_id: &str,
) -> Check {
    let tc = active_tool_call(state, turn_id, tool_call_id)?;
    let contributor = match tc {
        ToolCallState::Streaming(s) => &s.contributor,
        ToolCallState::PendingConfirmation(s) => &s.contributor,
        ToolCallState::Running(s) => &s.contributor,
        ToolCallState::AuthRequired(s) => &s.contributor,
        ToolCallState::PendingResultConfirmation(s) => &s.contributor,
        ToolCallState::Completed(s) => &s.contributor,
        ToolCallState::Cancelled(s) => &s.contributor,
        ToolCallState::Unknown(_) => &None,
    };
    match contributor {
        Some(ToolCallContributor::Client(c)) if c.client_id == client_id => Ok(()),
        Some(ToolCallContributor::Client(c)) => reject(format!(
            "tool call `{tool_call_id}` is contributed by client `{}`, not `{client_id}`",
            c.client_id
        )),
        _ => reject(format!(
            "tool call `{tool_call_id}` is not a client-contributed tool"
        )),
    }
}

/// `chat/turnStarted`.
pub fn turn_started(
    state: &ChatState,
    a: &ChatTurnStartedAction,
    used_turn_ids: &std::collections::HashSet<String>,
) -> Check {
    if let Some(t) = &state.active_turn {
        return reject(format!("TurnInProgress: turn `{}` is already active", t.id));
    }
    if a.turn_id.is_empty() {
        return reject("turnId must not be empty");
    }
    if used_turn_ids.contains(&a.turn_id) || state.turns.iter().any(|t| t.id == a.turn_id) {
        return reject(format!(
            "turnId `{}` is already used in this chat",
            a.turn_id
        ));
    }
    if a.started_at.parse::<jiff::Timestamp>().is_err() {
        return reject(format!(
            "startedAt `{}` is not an RFC 3339 timestamp",
            a.started_at
        ));
    }
    Ok(())
}

/// `chat/turnCancelled`.
pub fn turn_cancelled(state: &ChatState, turn_id: &str) -> Check {
    match &state.active_turn {
        None => reject("there is no active turn to cancel"),
        Some(t) if t.id != turn_id => reject(format!(
            "turn `{turn_id}` is not the active turn (`{}` is)",
            t.id
        )),
        Some(_) => Ok(()),
    }
}

fn active_tool_call<'a>(
    state: &'a ChatState,
    turn_id: &str,
    tool_call_id: &str,
) -> Result<&'a ToolCallState, Rejection> {
    let Some(turn) = &state.active_turn else {
        return reject(format!(
            "tool call `{tool_call_id}` is not in an active turn"
        ));
    };
    if turn.id != turn_id {
        return reject(format!("turn `{turn_id}` is not the active turn"));
    }
    turn.response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::ToolCall(tc) if tool_call_id_of(&tc.tool_call) == tool_call_id => {
                Some(&tc.tool_call)
            }
            _ => None,
        })
        .ok_or_else(|| Rejection::new(format!("no tool call `{tool_call_id}` in the active turn")))
}

/// The id of a tool call in any state.
pub fn tool_call_id_of(tc: &ToolCallState) -> &str {
    match tc {
        ToolCallState::Streaming(s) => &s.tool_call_id,
        ToolCallState::PendingConfirmation(s) => &s.tool_call_id,
        ToolCallState::Running(s) => &s.tool_call_id,
        ToolCallState::AuthRequired(s) => &s.tool_call_id,
        ToolCallState::PendingResultConfirmation(s) => &s.tool_call_id,
        ToolCallState::Completed(s) => &s.tool_call_id,
        ToolCallState::Cancelled(s) => &s.tool_call_id,
        ToolCallState::Unknown(_) => "",
    }
}

fn tool_status(tc: &ToolCallState) -> &'static str {
    match tc {
        ToolCallState::Streaming(_) => "streaming",
        ToolCallState::PendingConfirmation(_) => "pending-confirmation",
        ToolCallState::Running(_) => "running",
        ToolCallState::AuthRequired(_) => "auth-required",
        ToolCallState::PendingResultConfirmation(_) => "pending-result-confirmation",
        ToolCallState::Completed(_) => "completed",
        ToolCallState::Cancelled(_) => "cancelled",
        ToolCallState::Unknown(_) => "unknown",
    }
}

/// Every rule for a client-dispatched chat action. `client_id` is the
/// dispatcher's. Reducer outcomes are checked separately by the caller.
pub fn client_chat_action(
    state: &ChatState,
    action: &StateAction,
    client_id: &str,
    used_turn_ids: &std::collections::HashSet<String>,
) -> Check {
    match action {
        StateAction::ChatTurnStarted(a) => turn_started(state, a, used_turn_ids),
        StateAction::ChatTurnCancelled(a) => turn_cancelled(state, &a.turn_id),
        StateAction::ChatTruncated(_)
        | StateAction::ChatPendingMessageSet(_)
        | StateAction::ChatPendingMessageRemoved(_)
        | StateAction::ChatQueuedMessagesReordered(_)
        | StateAction::ChatDraftChanged(_) => Ok(()),
        StateAction::ChatToolCallConfirmed(a) => tool_call_confirmed(state, a),
        StateAction::ChatToolCallResultConfirmed(a) => {
            tool_call_result_confirmed(state, &a.turn_id, &a.tool_call_id)
        }
        StateAction::ChatToolCallComplete(a) => {
            client_tool_update(state, &a.turn_id, &a.tool_call_id, client_id)
        }
        StateAction::ChatToolCallContentChanged(a) => {
            client_tool_update(state, &a.turn_id, &a.tool_call_id, client_id)
        }
        StateAction::ChatInputAnswerChanged(a) => input_answer_changed(state, a),
        StateAction::ChatInputCompleted(a) => input_completed(state, a),
        StateAction::Unknown(raw) => reject(malformed_reason(raw)),
        other => reject(format!(
            "`{}` is not a client-dispatchable action",
            action_type(other)
        )),
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
