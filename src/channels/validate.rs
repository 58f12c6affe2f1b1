//! Server-side rules for client-dispatched actions (PROTOCOL.md "Validation").
//! Pure functions over the current state: a violation is a [`Rejection`] with a
//! reason the sender sees in `rejectionReason`; the state is never touched.

use std::collections::HashMap;

use ahp_types::actions::{
    ChatInputAnswerChangedAction, ChatInputCompletedAction, ChatToolCallConfirmedAction,
    ChatTurnStartedAction, StateAction,
};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputQuestion, ChatInputResponseKind, ChatState,
    ConfirmationOptionKind, InputRequestResponsePart, ResponsePart, ToolCallContributor,
    ToolCallState,
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

fn open_input<'a>(
    state: &'a ChatState,
    request_id: &str,
) -> Result<&'a InputRequestResponsePart, Rejection> {
    let Some(turn) = &state.active_turn else {
        // Settled requests of ended turns are in `turns`.
        let settled = state
            .turns
            .iter()
            .flat_map(|t| &t.response_parts)
            .any(|p| matches!(p, ResponsePart::InputRequest(i) if i.request.id == request_id));
        return if settled {
            reject(format!(
                "input request `{request_id}` is already settled (its turn has ended)"
            ))
        } else {
            reject(format!(
                "no open input request `{request_id}`: there is no active turn"
            ))
        };
    };
    let mut settled = false;
    for part in &turn.response_parts {
        if let ResponsePart::InputRequest(i) = part {
            if i.request.id == request_id {
                if i.response.is_none() {
                    return Ok(i);
                }
                settled = true;
            }
        }
    }
    if settled {
        reject(format!("input request `{request_id}` is already settled"))
    } else {
        reject(format!(
            "no open input request `{request_id}` in the active turn"
        ))
    }
}

fn question<'a>(
    req: &'a InputRequestResponsePart,
    qid: &str,
) -> Result<&'a ChatInputQuestion, Rejection> {
    req.request
        .questions
        .iter()
        .flatten()
        .find(|q| question_id(q) == Some(qid))
        .ok_or_else(|| {
            Rejection::new(format!(
                "question `{qid}` is not in request `{}`",
                req.request.id
            ))
        })
}

/// A question's id (`None` for an unknown kind).
pub fn question_id(q: &ChatInputQuestion) -> Option<&str> {
    Some(match q {
        ChatInputQuestion::Text(q) => &q.id,
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => &q.id,
        ChatInputQuestion::Boolean(q) => &q.id,
        ChatInputQuestion::SingleSelect(q) => &q.id,
        ChatInputQuestion::MultiSelect(q) => &q.id,
        ChatInputQuestion::Unknown(_) => return None,
    })
}

fn is_required(q: &ChatInputQuestion) -> bool {
    match q {
        ChatInputQuestion::Text(q) => q.required,
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => q.required,
        ChatInputQuestion::Boolean(q) => q.required,
        ChatInputQuestion::SingleSelect(q) => q.required,
        ChatInputQuestion::MultiSelect(q) => q.required,
        ChatInputQuestion::Unknown(_) => None,
    }
    .unwrap_or(false)
}

/// Check one answer against its question. Bounds apply to submitted answers
/// only: a draft may pass through invalid states while a person types.
pub fn check_answer(q: &ChatInputQuestion, answer: &ChatInputAnswer) -> Check {
    let (value, submitted) = match answer {
        ChatInputAnswer::Skipped(_) => return Ok(()),
        ChatInputAnswer::Draft(a) => (&a.value, false),
        ChatInputAnswer::Submitted(a) => (&a.value, true),
    };
    let qid = question_id(q).unwrap_or("?");
    match (q, value) {
        (ChatInputQuestion::Text(q), ChatInputAnswerValue::Text(v)) => {
            let len = v.value.chars().count() as i64;
            if submitted {
                if let Some(min) = q.min {
                    if len < min {
                        return reject(format!(
                            "answer to `{qid}` is {len} characters; at least {min} required"
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if len > max {
                        return reject(format!(
                            "answer to `{qid}` is {len} characters; at most {max} allowed"
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Number(q), ChatInputAnswerValue::Number(v))
        | (ChatInputQuestion::Integer(q), ChatInputAnswerValue::Number(v)) => {
            if !v.value.is_finite() {
                return reject(format!("answer to `{qid}` is not a finite number"));
            }
            if submitted {
                if let Some(min) = q.min {
                    if v.value < min {
                        return reject(format!(
                            "answer to `{qid}` is {}; minimum is {min}",
                            v.value
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if v.value > max {
                        return reject(format!(
                            "answer to `{qid}` is {}; maximum is {max}",
                            v.value
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Boolean(_), ChatInputAnswerValue::Boolean(_)) => Ok(()),
        (ChatInputQuestion::SingleSelect(q), ChatInputAnswerValue::Selected(v)) => {
            let freeform = q.allow_freeform_input.unwrap_or(false);
            let known = q.options.iter().any(|o| o.id == v.value);
            if !known && !freeform {
                return reject(format!("option `{}` is not offered by `{qid}`", v.value));
            }
            if v.freeform_values.as_ref().is_some_and(|f| !f.is_empty()) && !freeform {
                return reject(format!("`{qid}` does not allow free-form input"));
            }
            if submitted && !known && v.freeform_values.as_ref().is_none_or(|f| f.is_empty()) {
                return reject(format!(
                    "answer to `{qid}` selects no offered option and has no free-form text"
                ));
            }
            Ok(())
        }
        (ChatInputQuestion::MultiSelect(q), ChatInputAnswerValue::SelectedMany(v)) => {
            let freeform = q.allow_freeform_input.unwrap_or(false);
            if let Some(bad) = v
                .value
                .iter()
                .find(|id| !q.options.iter().any(|o| &o.id == *id))
            {
                return reject(format!("option `{bad}` is not offered by `{qid}`"));
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(dup) = v.value.iter().find(|id| !seen.insert(id.as_str())) {
                return reject(format!("option `{dup}` is selected twice in `{qid}`"));
            }
            let extra = v.freeform_values.as_ref().map_or(0, Vec::len);
            if extra > 0 && !freeform {
                return reject(format!("`{qid}` does not allow free-form input"));
            }
            if submitted {
                let count = (v.value.len() + extra) as i64;
                if let Some(min) = q.min {
                    if count < min {
                        return reject(format!(
                            "`{qid}` needs at least {min} selections; got {count}"
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if count > max {
                        return reject(format!(
                            "`{qid}` allows at most {max} selections; got {count}"
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Unknown(_), _) => {
            reject(format!("question `{qid}` has an unknown kind"))
        }
        (q, v) => reject(format!(
            "a `{}` answer does not fit `{qid}`, a `{}` question",
            value_kind(v),
            question_kind(q)
        )),
    }
    .and_then(|()| integer_check(q, value, qid))
}

// Integer questions take only whole numbers, drafts included: a draft of 2.5
// could never become valid without changing kind.
fn integer_check(q: &ChatInputQuestion, value: &ChatInputAnswerValue, qid: &str) -> Check {
    if let (ChatInputQuestion::Integer(_), ChatInputAnswerValue::Number(v)) = (q, value) {
        if v.value.fract() != 0.0 {
            return reject(format!(
                "`{qid}` is an integer question; {} is not a whole number",
                v.value
            ));
        }
    }
    Ok(())
}

/// The wire kind of a question.
pub fn question_kind(q: &ChatInputQuestion) -> &'static str {
    match q {
        ChatInputQuestion::Text(_) => "text",
        ChatInputQuestion::Number(_) => "number",
        ChatInputQuestion::Integer(_) => "integer",
        ChatInputQuestion::Boolean(_) => "boolean",
        ChatInputQuestion::SingleSelect(_) => "single-select",
        ChatInputQuestion::MultiSelect(_) => "multi-select",
        ChatInputQuestion::Unknown(_) => "unknown",
    }
}

fn value_kind(v: &ChatInputAnswerValue) -> &'static str {
    match v {
        ChatInputAnswerValue::Text(_) => "text",
        ChatInputAnswerValue::Number(_) => "number",
        ChatInputAnswerValue::Boolean(_) => "boolean",
        ChatInputAnswerValue::Selected(_) => "selected",
        ChatInputAnswerValue::SelectedMany(_) => "selected-many",
        ChatInputAnswerValue::Unknown(_) => "unknown",
    }
}

/// `chat/inputAnswerChanged`.
pub fn input_answer_changed(state: &ChatState, a: &ChatInputAnswerChangedAction) -> Check {
    let req = open_input(state, &a.request_id)?;
    let q = question(req, &a.question_id)?;
    match &a.answer {
        None => Ok(()),
        Some(answer) => check_answer(q, answer),
    }
}

/// `chat/inputCompleted`.
pub fn input_completed(state: &ChatState, a: &ChatInputCompletedAction) -> Check {
    let req = open_input(state, &a.request_id)?;
    let mut merged: HashMap<&str, &ChatInputAnswer> = req
        .request
        .answers
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    for (qid, answer) in a.answers.iter().flatten() {
        let q = question(req, qid)?;
        check_answer(q, answer)?;
        merged.insert(qid.as_str(), answer);
    }
    if a.response == ChatInputResponseKind::Accept {
        for q in req.request.questions.iter().flatten() {
            let Some(qid) = question_id(q) else { continue };
            match merged.get(qid) {
                Some(ChatInputAnswer::Submitted(_)) => {
                    // Drafts were checked without bounds; a submitted draft
                    // carried over must satisfy them now.
                    if let Some(answer) = merged.get(qid) {
                        check_answer(q, answer)?;
                    }
                }
                _ if is_required(q) => {
                    return reject(format!(
                        "cannot accept: required question `{qid}` has no submitted answer"
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
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
