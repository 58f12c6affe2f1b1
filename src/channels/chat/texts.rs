//! Several people typing in one of the chat's texts at once
//! (`tandem/openText`, `tandem/editText`): the chat is the authority of
//! each text someone edits this way ([`TextDoc`]).
//!
//! An edit is carried over the edits taken since its base revision and
//! published as two actions in one batch: the standard
//! `chat/inputAnswerChanged` (or `chat/draftChanged`) with the merged whole
//! text — what every plain AHP client sees, and what is journaled — then
//! `tandem/textEdited` with the revision and the operation, for editors.
//! A plain client's whole-text change to a text being edited is followed by
//! a `tandem/textEdited` too, so editors carry their typing over it.

use std::collections::HashMap;

use actix::prelude::*;
use ahp_types::actions::{ChatDraftChangedAction, ChatInputAnswerChangedAction, StateAction};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputAnswered, ChatInputQuestion,
    ChatInputTextAnswerValue, Message, MessageKind, MessageOrigin,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{find_input, ChatActor};
use crate::channels::commit::ChannelActor;
use crate::channels::forward::{ForwardReply, ForwardRequest};
use crate::channels::validate;
use crate::coedit::{Edit, EditError, Taken, TextDoc, TextOp};
use crate::people::Access;
use crate::protocol::{errors, RpcError};

/// The action type that carries an edit to editors.
pub const TEXT_EDITED: &str = "tandem/textEdited";

/// The key beside the state in a chat's stored snapshot under which the
/// edited texts' revisions and each editor's last edit number are kept
/// (`[{target, rev, taken: {author: seq}}]`), so after a restart an editor
/// re-bases knowing exactly which of its edits were taken.
pub const TEXTS_KEY: &str = "tandem/texts";

/// Edits kept per text to carry late ones forward.
const KEEP_EDITS: usize = 256;

/// Which of the chat's texts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TextTarget {
    /// The text answer to one question of an input request.
    #[serde(rename_all = "camelCase")]
    Answer {
        /// The input request.
        request_id: String,
        /// Its question (of kind `text`).
        question_id: String,
    },
    /// The chat's draft message (`{"draft": true}`).
    Draft {
        /// Always true.
        draft: bool,
    },
}

/// A text as `tandem/openText` answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TextState {
    /// The text now.
    pub text: String,
    /// Its revision.
    pub rev: u64,
    /// The last edit number taken from the asking editor (0: none).
    pub taken: u64,
}

/// `tandem/openText`: the text and its revision; from now on plain clients'
/// changes to it are published as edits too.
#[derive(Message)]
#[rtype(result = "()")]
pub struct OpenText {
    pub target: TextTarget,
    /// The editor (the connection's client id).
    pub author: String,
    /// Forwarded by another cluster node (a follower does not forward it
    /// again).
    pub from_node: bool,
    pub reply: oneshot::Sender<Result<TextState, RpcError>>,
}

/// `tandem/editText`: one editor's edit on revision `base`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EditText {
    pub target: TextTarget,
    pub author: String,
    /// The editor's number for it (from 1, increasing).
    pub seq: u64,
    pub base: u64,
    pub op: TextOp,
    /// The editor's person, for the session's access check.
    pub by: Option<crate::people::Person>,
    /// Forwarded by another cluster node.
    pub from_node: bool,
    /// The revision it made, once durable.
    pub reply: oneshot::Sender<Result<u64, RpcError>>,
}

/// What the store says of the edited texts: revision and each editor's
/// last edit number, by text.
pub type TextMarks = HashMap<TextTarget, (u64, HashMap<String, u64>)>;

/// The marks in a stored snapshot and the `tandem/textEdited` records
/// journaled after it.
pub fn text_marks(snapshot: Option<&str>, tail: &[crate::store::Record]) -> TextMarks {
    let mut marks = TextMarks::new();
    let stored = snapshot
        .filter(|s| s.contains(TEXTS_KEY))
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    if let Some(Value::Array(texts)) = stored.as_ref().and_then(|v| v.get(TEXTS_KEY)) {
        for t in texts {
            let (Ok(target), Some(rev)) = (
                serde_json::from_value::<TextTarget>(t["target"].clone()),
                t["rev"].as_u64(),
            ) else {
                continue;
            };
            let taken = serde_json::from_value(t["taken"].clone()).unwrap_or_default();
            marks.insert(target, (rev, taken));
        }
    }
    for r in tail.iter().filter(|r| r.contains(TEXT_EDITED)) {
        let Ok(v) = serde_json::from_str::<Value>(r) else {
            continue;
        };
        let (true, Ok(target), Some(rev)) = (
            v["type"] == TEXT_EDITED,
            serde_json::from_value::<TextTarget>(v["target"].clone()),
            v["rev"].as_u64(),
        ) else {
            continue;
        };
        let entry = marks.entry(target).or_default();
        entry.0 = rev;
        if let (Some(author), Some(seq)) = (v["author"].as_str(), v["seq"].as_u64()) {
            if seq > 0 {
                entry.1.insert(author.to_owned(), seq);
            }
        }
    }
    marks
}

/// Whether `action` is a `tandem/textEdited`.
pub fn is_text_edited(action: &StateAction) -> bool {
    matches!(action, StateAction::Unknown(v) if v.get("type").and_then(Value::as_str) == Some(TEXT_EDITED))
}

/// The `tandem/textEdited` action of `edit` on `target`.
fn text_edited(target: &TextTarget, edit: &Edit) -> StateAction {
    StateAction::Unknown(json!({
        "type": TEXT_EDITED,
        "target": target,
        "rev": edit.rev,
        "author": edit.author,
        "seq": edit.seq,
        "op": edit.op,
    }))
}

/// Where a new copy's revisions start: above any an earlier copy of the same
/// text reached (before a restart or a roll-back), so an editor still on
/// one of those is told to re-base rather than taken at a revision that
/// means something else now.
fn first_rev() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms * 1000
}

fn not_editable(why: impl Into<String>) -> RpcError {
    RpcError::new(errors::INVALID_REQUEST, why)
}

impl ChatActor {
    /// Take up the edited texts where the store left them (after a
    /// restart): those still editable get their revision and editors' last
    /// edit numbers back, with no edits kept (editors on an older revision
    /// re-base).
    pub fn with_text_marks(mut self, marks: TextMarks) -> Self {
        self.restore_texts(marks);
        self
    }

    fn restore_texts(&mut self, marks: TextMarks) {
        let max = self.core.shared.config.limits.max_answer_chars;
        for (target, (rev, taken)) in marks {
            if let Ok(text) = self.editable_text(&target) {
                let doc = TextDoc::restored(&text, rev, taken, KEEP_EDITS, max);
                self.texts.insert(target, doc);
            }
        }
    }

    /// The state as a snapshot stores it, with the edited texts' marks
    /// beside it ([`TEXTS_KEY`]).
    pub(super) fn snapshot_with_texts(&self) -> Option<String> {
        if self.texts.is_empty() {
            return serde_json::to_string(&self.state).ok();
        }
        let mut v = serde_json::to_value(&self.state).ok()?;
        let texts: Vec<Value> = self
            .texts
            .iter()
            .map(|(target, doc)| json!({"target": target, "rev": doc.rev(), "taken": doc.taken()}))
            .collect();
        v.as_object_mut()?
            .insert(TEXTS_KEY.to_owned(), Value::Array(texts));
        serde_json::to_string(&v).ok()
    }

    /// The current text of `target`, if people may edit it now.
    fn editable_text(&self, target: &TextTarget) -> Result<String, RpcError> {
        match target {
            TextTarget::Draft { draft: true } => Ok(self
                .state
                .draft
                .as_ref()
                .map(|m| m.text.clone())
                .unwrap_or_default()),
            TextTarget::Draft { .. } => Err(RpcError::invalid_params(
                "a target is {\"requestId\", \"questionId\"} or {\"draft\": true}",
            )),
            TextTarget::Answer {
                request_id,
                question_id,
            } => {
                let request = find_input(&self.state, request_id).ok_or_else(|| {
                    RpcError::new(
                        errors::NOT_FOUND,
                        format!("no input request `{request_id}`"),
                    )
                })?;
                if !self.inputs.contains_key(request_id) {
                    return Err(not_editable(format!(
                        "input request `{request_id}` is settled: its answers can no longer change"
                    )));
                }
                let question = request
                    .questions
                    .iter()
                    .flatten()
                    .find(|q| validate::question_id(q) == Some(question_id.as_str()))
                    .ok_or_else(|| {
                        RpcError::new(
                            errors::NOT_FOUND,
                            format!("no question `{question_id}` in input request `{request_id}`"),
                        )
                    })?;
                if !matches!(question, ChatInputQuestion::Text(_)) {
                    return Err(not_editable(format!(
                        "question `{question_id}` is not a text question"
                    )));
                }
                Ok(answer_text(request.answers.as_ref(), question_id).unwrap_or_default())
            }
        }
    }

    /// The authority's copy of `target`, made from its current text if
    /// nobody edited it this way yet.
    fn doc(&mut self, target: &TextTarget) -> Result<&mut TextDoc, RpcError> {
        let text = self.editable_text(target)?;
        let max = self.core.shared.config.limits.max_answer_chars;
        Ok(self
            .texts
            .entry(target.clone())
            .or_insert_with(|| TextDoc::new(&text, first_rev(), KEEP_EDITS, max)))
    }

    /// The standard action that makes `target`'s text `text`.
    fn whole_text_action(&self, target: &TextTarget, text: String) -> StateAction {
        match target {
            TextTarget::Draft { .. } => {
                let mut draft = self.state.draft.clone().unwrap_or(Message {
                    text: String::new(),
                    origin: MessageOrigin {
                        kind: MessageKind::User,
                    },
                    attachments: None,
                    model: None,
                    agent: None,
                    meta: None,
                });
                draft.text = text;
                StateAction::ChatDraftChanged(ChatDraftChangedAction { draft: Some(draft) })
            }
            TextTarget::Answer {
                request_id,
                question_id,
            } => {
                let value = ChatInputAnswered {
                    value: ChatInputAnswerValue::Text(ChatInputTextAnswerValue { value: text }),
                };
                let submitted = find_input(&self.state, request_id)
                    .and_then(|r| r.answers.as_ref()?.get(question_id))
                    .is_some_and(|a| matches!(a, ChatInputAnswer::Submitted(_)));
                StateAction::ChatInputAnswerChanged(ChatInputAnswerChangedAction {
                    request_id: request_id.clone(),
                    question_id: question_id.clone(),
                    answer: Some(if submitted {
                        ChatInputAnswer::Submitted(value)
                    } else {
                        ChatInputAnswer::Draft(value)
                    }),
                })
            }
        }
    }

    /// After a client's action is published: a whole-text change to a text
    /// being edited becomes an edit; a settled request's texts are let go.
    pub(super) fn texts_after_publish(
        &mut self,
        ctx: &mut Context<Self>,
        action: &StateAction,
        from_client: bool,
    ) {
        if self.texts.is_empty() {
            return;
        }
        let changed = match action {
            StateAction::ChatInputCompleted(a) => {
                self.texts.retain(|t, _| !matches!(t, TextTarget::Answer { request_id, .. } if *request_id == a.request_id));
                return;
            }
            StateAction::ChatTurnComplete(_)
            | StateAction::ChatError(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatTruncated(_) => {
                self.texts
                    .retain(|t, _| matches!(t, TextTarget::Draft { .. }));
                return;
            }
            _ if !from_client => return,
            StateAction::ChatInputAnswerChanged(a) => {
                let text = match &a.answer {
                    Some(ChatInputAnswer::Draft(v) | ChatInputAnswer::Submitted(v)) => {
                        match &v.value {
                            ChatInputAnswerValue::Text(t) => t.value.clone(),
                            _ => return,
                        }
                    }
                    _ => String::new(),
                };
                let target = TextTarget::Answer {
                    request_id: a.request_id.clone(),
                    question_id: a.question_id.clone(),
                };
                (target, text)
            }
            StateAction::ChatDraftChanged(a) => (
                TextTarget::Draft { draft: true },
                a.draft.as_ref().map(|m| m.text.clone()).unwrap_or_default(),
            ),
            _ => return,
        };
        let (target, text) = changed;
        let Some(doc) = self.texts.get_mut(&target) else {
            return;
        };
        match doc.replace(&text) {
            Ok(Some(edit)) => {
                let action = text_edited(&target, &edit);
                self.host_actions(ctx, vec![action], None);
            }
            Ok(None) => {}
            Err(e) => {
                // Over the length limit the client's change was refused
                // already; anything else means the copy went astray: start
                // it again from the state.
                tracing::warn!(chat = %self.core.uri, ?target, error = %e, "edited text reset");
                self.texts.remove(&target);
            }
        }
    }
}

/// The text of a text answer, if there is one.
fn answer_text(
    answers: Option<&HashMap<String, ChatInputAnswer>>,
    question_id: &str,
) -> Option<String> {
    match answers?.get(question_id)? {
        ChatInputAnswer::Draft(v) | ChatInputAnswer::Submitted(v) => match &v.value {
            ChatInputAnswerValue::Text(t) => Some(t.value.clone()),
            _ => None,
        },
        ChatInputAnswer::Skipped(_) => None,
    }
}

impl Handler<OpenText> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: OpenText, ctx: &mut Self::Context) {
        self.ensure_warm(ctx);
        if self.core.follower && !msg.from_node {
            let request = ForwardRequest::OpenText {
                channel: self.core.uri.to_string(),
                target: msg.target,
                author: msg.author,
            };
            return self.forward_text(ctx, request, msg.reply);
        }
        let answer = if self.core.follower {
            Err(follower())
        } else {
            self.doc(&msg.target).map(|doc| TextState {
                text: doc.text(),
                rev: doc.rev(),
                taken: doc.taken_from(&msg.author),
            })
        };
        let _ = msg.reply.send(answer);
    }
}

impl Handler<EditText> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: EditText, ctx: &mut Self::Context) {
        self.ensure_warm(ctx);
        let EditText {
            target,
            author,
            seq,
            base,
            op,
            by,
            from_node,
            reply,
        } = msg;
        if self.core.follower && !from_node {
            let request = ForwardRequest::EditText {
                channel: self.core.uri.to_string(),
                target,
                author,
                seq,
                base,
                edit: op,
                by,
            };
            return self.forward_text(ctx, request, reply);
        }
        if self.core.follower {
            let _ = reply.send(Err(follower()));
            return;
        }
        if let Some(e) = self.core.store_refusal() {
            let why = format!("the store is unavailable ({e}); the chat is read-only");
            let _ = reply.send(Err(not_editable(why)));
            return;
        }
        let shared = &self.core.shared;
        let (default, need) = (shared.config.session_access, Access::Participant);
        let allowed =
            shared
                .access
                .permit(&self.session, by.as_ref(), default, need, "editing a text");
        if let Err(r) = allowed {
            let _ = reply.send(Err(RpcError::new(errors::PERMISSION_DENIED, r.0)));
            return;
        }
        let doc = match self.doc(&target) {
            Ok(doc) => doc,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let edit = match doc.edit(&author, seq, base, &op) {
            Ok(Taken::Applied(edit)) => edit,
            Ok(Taken::Duplicate) => {
                let _ = reply.send(Ok(doc.rev()));
                return;
            }
            Err(e @ (EditError::Behind { .. } | EditError::Ahead { .. })) => {
                let data = json!({
                    "text": doc.text(),
                    "rev": doc.rev(),
                    "taken": doc.taken_from(&author),
                });
                let _ = reply.send(Err(
                    RpcError::new(errors::CONFLICT, e.to_string()).with_data(data)
                ));
                return;
            }
            Err(e) => {
                let _ = reply.send(Err(RpcError::invalid_params(format!(
                    "invalid params for `tandem/editText`: {e}"
                ))));
                return;
            }
        };
        let text = doc.text();
        let actions = vec![
            self.whole_text_action(&target, text),
            text_edited(&target, &edit),
        ];
        let rev = edit.rev;
        let stored = self.host_actions_stored(ctx, actions);
        ctx.spawn(
            async move {
                let _ = reply.send(
                    stored
                        .await
                        .map(|()| rev)
                        .map_err(|r| not_editable(format!("the edit was not kept: {}", r.0))),
                );
            }
            .into_actor(self),
        );
    }
}

impl ChatActor {
    /// Hand a text request to the node that runs the chat (this node
    /// follows it); its answer, or why none came, goes to `reply`. The
    /// edits it makes reach this node's subscribers as the chat's other
    /// batches do, read back from the shared journal.
    fn forward_text<T: DeserializeOwned + Send + 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        request: ForwardRequest,
        reply: oneshot::Sender<Result<T, RpcError>>,
    ) {
        let Some(link) = self.core.shared.cluster.clone() else {
            let _ = reply.send(Err(follower()));
            return;
        };
        let sent = link.forward(&self.core.uri, request.encode());
        ctx.spawn(
            async move {
                let answer = match sent.await {
                    Ok(body) => ForwardReply::decode(&body).into_typed(),
                    Err(e) => Err(RpcError::internal(format!(
                        "the node that runs the chat did not answer: {e}"
                    ))),
                };
                let _ = reply.send(answer);
            }
            .into_actor(self),
        );
    }

    /// This node runs the chat now (it took it over from a node that went
    /// away): its texts carry on from the revisions and editors' last edit
    /// numbers the store holds, so an edit the old owner kept is not taken
    /// twice when its editor re-bases.
    pub(super) fn texts_promoted(&mut self) {
        self.texts.clear();
        match self.core.shared.journal.load_channel(&self.core.uri) {
            Ok(Some(c)) => {
                let marks = text_marks(c.snapshot.as_ref().map(|s| &*s.state), &c.tail);
                self.restore_texts(marks);
            }
            Ok(None) => {}
            Err(e) => {
                // Editors on the old owner's revisions re-base on new ones.
                tracing::warn!(chat = %self.core.uri, error = %e, "edited texts start again: the store cannot be read");
            }
        }
    }
}

fn follower() -> RpcError {
    not_editable(
        "this node follows the chat for another node of the cluster, and no link to it is open",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_come_from_the_snapshot_then_the_edits_journaled_after_it() {
        let draft = TextTarget::Draft { draft: true };
        let answer = TextTarget::Answer {
            request_id: "r".into(),
            question_id: "q".into(),
        };
        let snapshot = json!({
            "resource": "ahp-chat:/c",
            TEXTS_KEY: [
                {"target": {"draft": true}, "rev": 10, "taken": {"a": 4, "b": 2}},
                {"target": {"requestId": "r", "questionId": "q"}, "rev": 3, "taken": {}},
            ],
        })
        .to_string();
        let edit = |target: Value, rev: u64, author: &str, seq: u64| -> crate::store::Record {
            json!({"type": TEXT_EDITED, "target": target, "rev": rev, "author": author, "seq": seq, "op": [1]})
                .to_string()
                .into()
        };
        let tail = vec![
            edit(json!({"draft": true}), 11, "b", 3),
            json!({"type": "chat/draftChanged"}).to_string().into(),
            edit(json!({"draft": true}), 12, "", 0),
            edit(json!({"requestId": "r", "questionId": "q"}), 4, "c", 1),
        ];
        let marks = text_marks(Some(&snapshot), &tail);
        assert_eq!(marks[&draft].0, 12);
        assert_eq!(
            marks[&draft].1,
            HashMap::from([("a".to_owned(), 4), ("b".to_owned(), 3)])
        );
        assert_eq!(marks[&answer], (4, HashMap::from([("c".to_owned(), 1)])));
        // A snapshot without marks, and no edits: nothing.
        assert!(text_marks(Some("{\"resource\":\"x\"}"), &[]).is_empty());
    }
}
