//! Who did what, in the chat's record: a person's message carries its
//! author, and a person's answer, approval, denial or stop is followed (or,
//! for a stop, preceded) in the turn by a system notification naming them —
//! "Ann approved `deploy`" — with the act itself in its `_meta`
//! ([`ACT_META`]). Only the host writes these: whatever a client or an
//! agent puts under those keys is replaced or refused
//! ([`super::agent_rules`]).
//!
//! They are ordinary response parts, so any AHP client shows them, every
//! node of a cluster reduces them alike, and they are in the snapshot and
//! the journal like the rest of the turn.

use ahp_types::actions::{ChatResponsePartAction, StateAction};
use ahp_types::common::StringOrMarkdown;
use ahp_types::state::{
    ChatInputResponseKind, Message, ResponsePart, SystemNotificationResponsePart,
};
use serde_json::{json, Map, Value};

use super::{tool_name_of, ChatActor};
use crate::channels::audit::{self, AuditKind};
use crate::channels::commit::{Acts, ChannelActor};
use crate::channels::validate::Rejection;
use crate::people::{Person, ACT_META, AUTHOR_META};
use crate::time::now_rfc3339;

/// Put `by` as the author of `message` (replacing whatever the sender put
/// there).
pub(crate) fn stamp_author(message: &mut Message, by: &Person) {
    message
        .meta
        .get_or_insert_with(Default::default)
        .insert(AUTHOR_META.into(), by.to_json());
}

/// A system notification of `by`'s act in `turn_id`: `text` for people,
/// `act` (with `by` and the time added) for clients.
fn notice(turn_id: &str, text: String, by: &Person, mut act: Map<String, Value>) -> StateAction {
    act.insert("by".into(), by.to_json());
    act.insert("at".into(), now_rfc3339().into());
    let mut meta = Map::new();
    meta.insert(ACT_META.into(), Value::Object(act));
    StateAction::ChatResponsePart(ChatResponsePartAction {
        turn_id: turn_id.to_owned(),
        part: ResponsePart::SystemNotification(SystemNotificationResponsePart {
            content: StringOrMarkdown::Plain(text),
            meta: Some(meta),
        }),
        meta: None,
    })
}

/// The message a turn start or a pending message carries.
fn message_of(action: &mut StateAction) -> Option<&mut Message> {
    match action {
        StateAction::ChatTurnStarted(a) => Some(&mut a.message),
        StateAction::ChatPendingMessageSet(a) => Some(&mut a.message),
        _ => None,
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl ChatActor {
    /// Reduce a person's checked action into the state with what the record
    /// keeps of who sent it; the notifications to commit with it. Without a
    /// person (an agent's turn), the action alone.
    pub(super) fn record_person(
        &mut self,
        action: &mut StateAction,
        by: Option<&Person>,
    ) -> Result<Acts, Rejection> {
        let Some(by) = by else {
            // An agent's message (a provider starting a turn) names no
            // person: an author it put there is not kept.
            if let Some(m) = message_of(action) {
                if let Some(meta) = m.meta.as_mut() {
                    meta.remove(AUTHOR_META);
                }
            }
            self.reduce(action)?;
            return Ok(Acts::default());
        };
        if let Some(m) = message_of(action) {
            stamp_author(m, by);
        }
        if let StateAction::ChatInputAnswerChanged(a) = action {
            self.answer_authors
                .entry(a.request_id.clone())
                .or_default()
                .insert(a.question_id.clone(), by.name.clone());
        }
        match action {
            StateAction::ChatInputCompleted(a) => {
                self.settled_by.insert(a.request_id.clone(), by.name.clone());
            }
            StateAction::ChatToolCallConfirmed(a) => {
                self.settled_by.insert(a.tool_call_id.clone(), by.name.clone());
            }
            _ => {}
        }
        let mut acts = Acts::default();
        if let StateAction::ChatTurnCancelled(a) = action {
            // Before the stop: once the turn ends nothing joins it. The
            // stop was checked already, so the turn is the active one.
            let before = notice(
                &a.turn_id,
                format!("{} stopped the turn", by.name),
                by,
                object(json!({"kind": "turnCancelled", "turnId": a.turn_id})),
            );
            self.reduce(&before)?;
            acts.before.push(before);
            let fields = json!({"turnId": a.turn_id});
            self.audit(AuditKind::TurnCancelled, by, fields);
        }
        if let Err(e) = self.reduce(action) {
            if !acts.before.is_empty() {
                self.drop_last_part();
                self.core.audit.pop();
            }
            return Err(e);
        }
        if let Some(after) = self.notice_after(action, by) {
            // The active turn holds the request or the call: its part is
            // appended to it.
            if self.reduce(&after).is_ok() {
                acts.after.push(after);
            }
        }
        Ok(acts)
    }

    /// Put `by`'s act on the session's audit log, stored with this batch.
    fn audit(&mut self, kind: AuditKind, by: &Person, fields: Value) {
        let e = audit::entry(kind, by, &self.session, Some(&self.core.uri), fields);
        self.core.audit.push(e);
    }

    /// The notification that follows a person's answer or decision (and
    /// its audit entry).
    fn notice_after(&mut self, action: &StateAction, by: &Person) -> Option<StateAction> {
        let turn = self.state.active_turn.as_ref()?.id.clone();
        match action {
            StateAction::ChatInputCompleted(a) => {
                let authors = self
                    .answer_authors
                    .remove(&a.request_id)
                    .unwrap_or_default();
                let (verb, response) = match a.response {
                    ChatInputResponseKind::Accept => ("submitted the answers", "accept"),
                    ChatInputResponseKind::Decline => ("declined the request", "decline"),
                    ChatInputResponseKind::Cancel => ("cancelled the request", "cancel"),
                };
                let fields = json!({
                    "requestId": a.request_id,
                    "response": response,
                    "answeredBy": authors,
                });
                self.audit(AuditKind::Answered, by, fields);
                Some(notice(
                    &turn,
                    format!("{} {verb}", by.name),
                    by,
                    object(json!({
                        "kind": "inputCompleted",
                        "requestId": a.request_id,
                        "response": response,
                        "answeredBy": authors,
                    })),
                ))
            }
            StateAction::ChatToolCallConfirmed(a) => {
                let tool = tool_name_of(&self.state, &a.tool_call_id).unwrap_or_default();
                let reason = a.reason_message.as_ref().map(|m| m.as_text().to_owned());
                let text = match (a.approved, a.selected_option_id.as_deref(), &reason) {
                    (true, Some("approve-session"), _) => {
                        format!("{} approved `{tool}` for this session", by.name)
                    }
                    (true, _, _) => format!("{} approved `{tool}`", by.name),
                    (false, _, Some(r)) if !r.is_empty() => {
                        format!("{} denied `{tool}`: {r}", by.name)
                    }
                    (false, _, _) => format!("{} denied `{tool}`", by.name),
                };
                self.deciders.insert(a.tool_call_id.clone(), by.clone());
                let kind = match (a.approved, a.selected_option_id.as_deref()) {
                    (true, Some("approve-session")) => AuditKind::Granted,
                    (true, _) => AuditKind::Approved,
                    (false, _) => AuditKind::Denied,
                };
                let input = super::find_tool(&self.state, &a.tool_call_id).and_then(|p| match p {
                    ResponsePart::ToolCall(tc) => audit::input_digest(&tc.tool_call),
                    _ => None,
                });
                let mut fields = audit::decision(&tool, input, reason.as_deref());
                fields["toolCallId"] = a.tool_call_id.clone().into();
                self.audit(kind, by, fields);
                Some(notice(
                    &turn,
                    text,
                    by,
                    object(json!({
                        "kind": "toolCallConfirmed",
                        "toolCallId": a.tool_call_id,
                        "toolName": tool,
                        "approved": a.approved,
                        "selectedOptionId": a.selected_option_id,
                        "reason": reason,
                    })),
                ))
            }
            _ => None,
        }
    }

    /// Take back the part a notification added (its person's action was
    /// refused after all).
    fn drop_last_part(&mut self) {
        if let Some(t) = self.state.active_turn.as_mut() {
            t.response_parts.pop();
        }
    }
}
