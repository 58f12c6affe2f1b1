//! ACP `session/update` → AHP chat actions, for one turn. Pure: a
//! [`TurnMap`] remembers which response part the agent is streaming into and
//! where each tool call stands, and turns every update into the actions that
//! show it. What has no AHP shape is returned as a [`Note`] for the session's
//! `_meta`, never dropped.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, Plan, PlanEntryStatus, SessionUpdate, ToolCall, ToolCallContent, ToolCallStatus,
    ToolCallUpdate, ToolKind,
};
use ahp_types::actions::{
    ChatDeltaAction, ChatReasoningAction, ChatResponsePartAction, ChatToolCallCompleteAction,
    ChatToolCallContentChangedAction, ChatToolCallReadyAction, ChatToolCallStartAction,
    ChatUsageAction, StateAction,
};
use ahp_types::state::{
    MarkdownResponsePart, ReasoningResponsePart, ResponsePart, SystemNotificationResponsePart,
    ToolCallConfirmationReason, ToolCallResult, ToolResultContent, ToolResultTextContent,
    UsageInfo,
};
use serde_json::{Map, Value};

/// `_meta` key under which the agent's own message is kept whole.
pub const ACP_META: &str = "tandem/acp";

/// Something the agent said that has no AHP action: kept in the session's
/// `_meta` (`tandem/agent` → chat → `key`).
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// What kind of thing it is (`availableCommands`, `currentMode`, …).
    pub key: String,
    /// The agent's message as it sent it.
    pub value: Value,
}

/// What to do with one update.
#[derive(Debug, Default, PartialEq)]
pub struct Mapped {
    /// Actions for the chat, in order.
    pub actions: Vec<StateAction>,
    /// Things for the session's `_meta`.
    pub notes: Vec<Note>,
}

/// Where a tool call stands, as the bridge knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolPhase {
    /// Announced, not yet running (AHP: streaming).
    Announced,
    /// A person is asked (AHP: pending confirmation).
    Asked,
    /// Running (AHP: running).
    Running,
    /// Denied (AHP: cancelled); later updates have nothing to change.
    Denied,
    /// Completed or failed.
    Done,
}

struct ToolEntry {
    phase: ToolPhase,
    title: String,
    content: Vec<ToolResultContent>,
}

/// The mapping state of one turn.
pub struct TurnMap {
    turn_id: String,
    /// The markdown part message chunks stream into, while they come in a row.
    message_part: Option<String>,
    /// Likewise for thought chunks.
    thought_part: Option<String>,
    tools: HashMap<String, ToolEntry>,
    next_part: u64,
}

impl TurnMap {
    /// Mapping state for turn `turn_id`.
    pub fn new(turn_id: impl Into<String>) -> Self {
        Self {
            turn_id: turn_id.into(),
            message_part: None,
            thought_part: None,
            tools: HashMap::new(),
            next_part: 0,
        }
    }

    fn part_id(&mut self, kind: &str) -> String {
        self.next_part += 1;
        format!("{}-{kind}-{}", self.turn_id, self.next_part)
    }

    /// Map one update.
    pub fn update(&mut self, update: &SessionUpdate) -> Mapped {
        let mut out = Mapped::default();
        match update {
            SessionUpdate::AgentMessageChunk(c) => {
                self.thought_part = None;
                self.message(&c.content, &mut out);
            }
            SessionUpdate::AgentThoughtChunk(c) => {
                self.message_part = None;
                self.thought(&c.content, &mut out);
            }
            SessionUpdate::ToolCall(tc) => {
                self.end_streams();
                self.tool_call(tc, &mut out);
            }
            SessionUpdate::ToolCallUpdate(u) => {
                self.end_streams();
                self.tool_call_update(u, &mut out);
            }
            SessionUpdate::Plan(plan) => {
                self.end_streams();
                let id = self.part_id("plan");
                out.actions
                    .push(self.markdown(id, render_plan(plan), json_of(plan)));
            }
            SessionUpdate::UsageUpdate(u) => {
                out.actions.push(StateAction::ChatUsage(ChatUsageAction {
                    turn_id: self.turn_id.clone(),
                    usage: UsageInfo {
                        input_tokens: None,
                        output_tokens: None,
                        model: None,
                        cache_read_tokens: None,
                        meta: Some(acp_meta(json_of(u))),
                    },
                    meta: None,
                }));
            }
            SessionUpdate::Notice(n) => {
                self.end_streams();
                let text = match &n.description {
                    Some(d) => format!("**{}** — {d}", n.title),
                    None => format!("**{}**", n.title),
                };
                out.actions
                    .push(StateAction::ChatResponsePart(ChatResponsePartAction {
                        turn_id: self.turn_id.clone(),
                        part: ResponsePart::SystemNotification(SystemNotificationResponsePart {
                            content: text.into(),
                            meta: Some(acp_meta(json_of(n))),
                        }),
                        meta: None,
                    }));
            }
            other => out.notes.push(note_of(other)),
        }
        out
    }

    fn end_streams(&mut self) {
        self.message_part = None;
        self.thought_part = None;
    }

    fn markdown(&self, id: String, content: String, raw: Value) -> StateAction {
        StateAction::ChatResponsePart(ChatResponsePartAction {
            turn_id: self.turn_id.clone(),
            part: ResponsePart::Markdown(MarkdownResponsePart { id, content }),
            meta: (!raw.is_null()).then(|| acp_meta(raw)),
        })
    }

    fn message(&mut self, content: &ContentBlock, out: &mut Mapped) {
        let ContentBlock::Text(t) = content else {
            // Images, audio and resources: a part of their own that names
            // them, with the block whole in `_meta`.
            self.message_part = None;
            let id = self.part_id("content");
            out.actions
                .push(self.markdown(id, describe_block(content), json_of(content)));
            return;
        };
        match &self.message_part {
            Some(part_id) => out.actions.push(StateAction::ChatDelta(ChatDeltaAction {
                turn_id: self.turn_id.clone(),
                part_id: part_id.clone(),
                content: t.text.clone(),
                meta: None,
            })),
            None => {
                let id = self.part_id("text");
                self.message_part = Some(id.clone());
                out.actions
                    .push(self.markdown(id, t.text.clone(), Value::Null));
            }
        }
    }

    fn thought(&mut self, content: &ContentBlock, out: &mut Mapped) {
        let text = match content {
            ContentBlock::Text(t) => t.text.clone(),
            other => describe_block(other),
        };
        match &self.thought_part {
            Some(part_id) => out
                .actions
                .push(StateAction::ChatReasoning(ChatReasoningAction {
                    turn_id: self.turn_id.clone(),
                    part_id: part_id.clone(),
                    content: text,
                    meta: None,
                })),
            None => {
                let id = self.part_id("thought");
                self.thought_part = Some(id.clone());
                out.actions
                    .push(StateAction::ChatResponsePart(ChatResponsePartAction {
                        turn_id: self.turn_id.clone(),
                        part: ResponsePart::Reasoning(ReasoningResponsePart { id, content: text }),
                        meta: None,
                    }));
            }
        }
    }

    /// The phase of tool call `id`, if the agent announced it.
    #[cfg(test)]
    fn phase(&self, id: &str) -> Option<ToolPhase> {
        self.tools.get(id).map(|t| t.phase)
    }

    /// A person is now asked about tool call `id` (announced first, from the
    /// permission request's own description, if the agent had not).
    pub fn asking(&mut self, update: &ToolCallUpdate) -> Vec<StateAction> {
        let id = update.tool_call_id.to_string();
        let actions: Vec<StateAction> = self.announce_unseen(update).into_iter().collect();
        if let Some(t) = self.tools.get_mut(&id) {
            if t.phase == ToolPhase::Announced {
                t.phase = ToolPhase::Asked;
            }
        }
        actions
    }

    /// `chat/toolCallStart` for a call the agent names first in an update
    /// (or a permission request), from what that says of it.
    fn announce_unseen(&mut self, u: &ToolCallUpdate) -> Option<StateAction> {
        let id = u.tool_call_id.to_string();
        if self.tools.contains_key(&id) {
            return None;
        }
        let title = u.fields.title.clone().unwrap_or_else(|| "tool call".into());
        let start = self.start(&id, &title, u.fields.name.as_deref(), json_of(u));
        self.tools.insert(
            id,
            ToolEntry {
                phase: ToolPhase::Announced,
                title,
                content: Vec::new(),
            },
        );
        Some(start)
    }

    /// The person (or the session's policy) decided about tool call `id`.
    pub fn decided(&mut self, id: &str, approved: bool) {
        if let Some(t) = self.tools.get_mut(id) {
            if t.phase == ToolPhase::Asked {
                t.phase = if approved {
                    ToolPhase::Running
                } else {
                    ToolPhase::Denied
                };
            }
        }
    }

    fn start(&self, id: &str, title: &str, name: Option<&str>, raw: Value) -> StateAction {
        StateAction::ChatToolCallStart(ChatToolCallStartAction {
            turn_id: self.turn_id.clone(),
            tool_call_id: id.to_owned(),
            meta: Some(acp_meta(raw)),
            tool_name: name.unwrap_or(title).to_owned(),
            display_name: title.to_owned(),
            intention: None,
            contributor: None,
        })
    }

    fn tool_call(&mut self, tc: &ToolCall, out: &mut Mapped) {
        let id = tc.tool_call_id.to_string();
        if self.tools.contains_key(&id) {
            // Announced twice: treat the repeat as an update of everything.
            let raw = json_of(tc);
            if let Ok(u) = serde_json::from_value::<ToolCallUpdate>(raw) {
                self.tool_call_update(&u, out);
            }
            return;
        }
        out.actions
            .push(self.start(&id, &tc.title, tc.name.as_deref(), json_of(tc)));
        self.tools.insert(
            id.clone(),
            ToolEntry {
                phase: ToolPhase::Announced,
                title: tc.title.clone(),
                content: tool_content(&tc.content),
            },
        );
        self.advance(
            &id,
            Some(tc.status),
            Some(tc.kind),
            tc.raw_output.as_ref(),
            out,
        );
    }

    fn tool_call_update(&mut self, u: &ToolCallUpdate, out: &mut Mapped) {
        let id = u.tool_call_id.to_string();
        // An update of a call never announced: announce it now.
        out.actions.extend(self.announce_unseen(u));
        if let Some(entry) = self.tools.get_mut(&id) {
            if let Some(title) = &u.fields.title {
                entry.title = title.clone();
            }
            if let Some(content) = &u.fields.content {
                entry.content = tool_content(content);
                if entry.phase == ToolPhase::Running && u.fields.status.is_none() {
                    out.actions.push(StateAction::ChatToolCallContentChanged(
                        ChatToolCallContentChangedAction {
                            turn_id: self.turn_id.clone(),
                            tool_call_id: id.clone(),
                            meta: Some(acp_meta(json_of(u))),
                            content: entry.content.clone(),
                        },
                    ));
                }
            }
        }
        self.advance(
            &id,
            u.fields.status,
            u.fields.kind,
            u.fields.raw_output.as_ref(),
            out,
        );
    }

    /// Move a tool call along to `status`.
    fn advance(
        &mut self,
        id: &str,
        status: Option<ToolCallStatus>,
        kind: Option<ToolKind>,
        raw_output: Option<&Value>,
        out: &mut Mapped,
    ) {
        let turn_id = self.turn_id.clone();
        let Some(entry) = self.tools.get_mut(id) else {
            return;
        };
        let Some(status) = status else {
            return;
        };
        let runs = matches!(
            status,
            ToolCallStatus::InProgress | ToolCallStatus::Completed | ToolCallStatus::Failed
        );
        if runs && entry.phase == ToolPhase::Announced {
            // The agent runs it without asking: its own decision, reported.
            let mut meta = Map::new();
            if let Some(kind) = kind {
                meta.insert("tandem/acpKind".into(), json_of(&kind));
            }
            out.actions
                .push(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
                    turn_id: turn_id.clone(),
                    tool_call_id: id.to_owned(),
                    meta: Some(meta),
                    contributor: None,
                    intention: None,
                    invocation_message: entry.title.clone().into(),
                    tool_input: None,
                    confirmation_title: None,
                    risk_assessment: None,
                    edits: None,
                    editable: None,
                    confirmed: Some(ToolCallConfirmationReason::NotNeeded),
                    options: None,
                }));
            entry.phase = ToolPhase::Running;
        }
        let done = matches!(status, ToolCallStatus::Completed | ToolCallStatus::Failed);
        if done && matches!(entry.phase, ToolPhase::Running | ToolPhase::Asked) {
            let success = status == ToolCallStatus::Completed;
            let mut content = entry.content.clone();
            if !success && content.is_empty() {
                content.push(text("the tool call failed"));
            }
            out.actions.push(StateAction::ChatToolCallComplete(
                ChatToolCallCompleteAction {
                    turn_id,
                    tool_call_id: id.to_owned(),
                    meta: None,
                    result: ToolCallResult {
                        success,
                        past_tense_message: entry.title.clone().into(),
                        content: (!content.is_empty()).then_some(content),
                        structured_content: raw_output.map(|v| match v {
                            Value::Object(o) => o.clone(),
                            other => Map::from_iter([("rawOutput".to_owned(), other.clone())]),
                        }),
                        error: None,
                    },
                    requires_result_confirmation: None,
                },
            ));
            entry.phase = ToolPhase::Done;
        }
    }
}

fn text(s: impl Into<String>) -> ToolResultContent {
    ToolResultContent::Text(ToolResultTextContent { text: s.into() })
}

/// ACP tool-call content as AHP tool result content: text stays text, a
/// diff becomes a unified diff in a fenced block (the full old and new text
/// are in the tool call's `_meta`), a terminal is named.
pub fn tool_content(content: &[ToolCallContent]) -> Vec<ToolResultContent> {
    content
        .iter()
        .map(|c| match c {
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Text(t) => text(t.text.clone()),
                other => text(describe_block(other)),
            },
            ToolCallContent::Diff(d) => {
                let mut body = format!("```diff\n--- {0}\n+++ {0}\n", d.path.display());
                for line in d.old_text.as_deref().unwrap_or("").lines() {
                    body.push_str(&format!("-{line}\n"));
                }
                for line in d.new_text.lines() {
                    body.push_str(&format!("+{line}\n"));
                }
                body.push_str("```");
                text(body)
            }
            ToolCallContent::Terminal(t) => text(format!("terminal `{}`", t.terminal_id)),
            other => text(format!("`{}`", json_of(other))),
        })
        .collect()
}

/// A plan as a markdown checklist.
pub fn render_plan(plan: &Plan) -> String {
    let mut s = String::from("**Plan**\n");
    for e in &plan.entries {
        let mark = match e.status {
            PlanEntryStatus::Completed => "[x]",
            PlanEntryStatus::InProgress => "[~]",
            _ => "[ ]",
        };
        s.push_str(&format!("- {mark} {}\n", e.content));
    }
    s
}

/// A non-text content block, named for people.
fn describe_block(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image {}]", i.mime_type),
        ContentBlock::Audio(a) => format!("[audio {}]", a.mime_type),
        ContentBlock::ResourceLink(l) => format!("[{}]({})", l.name, l.uri),
        ContentBlock::Resource(_) => "[embedded resource]".to_owned(),
        _ => "[content]".to_owned(),
    }
}

/// Any update whole, as a note keyed by its kind.
pub fn note_of(update: &SessionUpdate) -> Note {
    let value = json_of(update);
    let key = value
        .get("sessionUpdate")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    Note { key, value }
}

/// `{"tandem/acp": raw}`.
pub fn acp_meta(raw: Value) -> Map<String, Value> {
    Map::from_iter([(ACP_META.to_owned(), raw)])
}

/// Any serializable value as JSON (`null` if it does not serialize).
pub fn json_of<T: serde::Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn upd(v: Value) -> SessionUpdate {
        serde_json::from_value(v).expect("a valid update")
    }

    fn kinds(m: &Mapped) -> Vec<String> {
        m.actions
            .iter()
            .map(|a| json_of(a)["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }

    #[test]
    fn message_chunks_stream_into_one_part_until_something_else_comes() {
        let mut m = TurnMap::new("t1");
        let chunk = |s: &str| {
            upd(
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": s}}),
            )
        };
        let thought = upd(
            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hm"}}),
        );
        assert_eq!(kinds(&m.update(&chunk("a"))), ["chat/responsePart"]);
        assert_eq!(kinds(&m.update(&chunk("b"))), ["chat/delta"]);
        assert_eq!(kinds(&m.update(&thought)), ["chat/responsePart"]);
        assert_eq!(kinds(&m.update(&thought)), ["chat/reasoning"]);
        let again = m.update(&chunk("c"));
        assert_eq!(
            kinds(&again),
            ["chat/responsePart"],
            "a new part after the thought"
        );
        let v = json_of(&again.actions[0]);
        assert_eq!(v["part"]["kind"], "markdown");
        assert_eq!(v["part"]["content"], "c");
    }

    #[test]
    fn a_tool_call_the_agent_runs_itself_is_reported_running_then_complete() {
        let mut m = TurnMap::new("t1");
        let start = m.update(&upd(json!({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Read a.rs", "kind": "read", "status": "in_progress", "rawInput": {"path": "a.rs"}})));
        assert_eq!(kinds(&start), ["chat/toolCallStart", "chat/toolCallReady"]);
        let s = json_of(&start.actions[0]);
        assert_eq!(s["toolName"], "Read a.rs");
        assert_eq!(s["_meta"]["tandem/acp"]["rawInput"]["path"], "a.rs");
        assert_eq!(json_of(&start.actions[1])["confirmed"], "not-needed");
        let content = m.update(&upd(json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "content": [{"type": "content", "content": {"type": "text", "text": "fn main"}}]})));
        assert_eq!(kinds(&content), ["chat/toolCallContentChanged"]);
        let done = m.update(&upd(json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed", "rawOutput": {"bytes": 7}})));
        assert_eq!(kinds(&done), ["chat/toolCallComplete"]);
        let r = &json_of(&done.actions[0])["result"];
        assert_eq!(r["success"], true);
        assert_eq!(r["structuredContent"]["bytes"], 7);
        assert_eq!(r["content"][0]["text"], "fn main");
        assert_eq!(m.phase("c1"), Some(ToolPhase::Done));
        assert!(m
            .update(&upd(
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "failed"})
            ))
            .actions
            .is_empty());
    }

    #[test]
    fn an_asked_tool_call_waits_for_the_decision_and_a_denied_one_stays_denied() {
        let mut m = TurnMap::new("t1");
        let start = m.update(&upd(json!({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Write x", "kind": "edit", "status": "pending", "content": [{"type": "diff", "path": "/x", "oldText": "a", "newText": "b"}]})));
        assert_eq!(kinds(&start), ["chat/toolCallStart"]);
        let asked: ToolCallUpdate =
            serde_json::from_value(json!({"toolCallId": "c1"})).expect("update");
        assert!(m.asking(&asked).is_empty(), "already announced");
        assert_eq!(m.phase("c1"), Some(ToolPhase::Asked));
        // The agent's `in_progress` after an approval changes nothing more.
        m.decided("c1", true);
        let run = m.update(&upd(json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "in_progress"})));
        assert!(run.actions.is_empty());
        let done = m.update(&upd(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed"}),
        ));
        let r = &json_of(&done.actions[0])["result"];
        assert!(r["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("-a\n+b"));

        let mut m = TurnMap::new("t2");
        let unseen: ToolCallUpdate =
            serde_json::from_value(json!({"toolCallId": "c9", "title": "Delete y"}))
                .expect("update");
        assert_eq!(
            kinds(&Mapped {
                actions: m.asking(&unseen),
                notes: vec![]
            }),
            ["chat/toolCallStart"]
        );
        m.decided("c9", false);
        let failed = m.update(&upd(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "c9", "status": "failed"}),
        ));
        assert!(
            failed.actions.is_empty(),
            "a denied call has nothing to complete"
        );
    }

    #[test]
    fn plans_usage_and_notices_are_visible_and_the_rest_goes_to_meta() {
        let mut m = TurnMap::new("t1");
        let plan = m.update(&upd(json!({"sessionUpdate": "plan", "entries": [
            {"content": "read", "priority": "high", "status": "completed"},
            {"content": "write", "priority": "low", "status": "pending"}]})));
        let p = json_of(&plan.actions[0]);
        assert_eq!(p["part"]["content"], "**Plan**\n- [x] read\n- [ ] write\n");
        assert_eq!(p["_meta"]["tandem/acp"]["entries"][1]["content"], "write");
        let cmds = m.update(&upd(json!({"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "web", "description": "search"}]})));
        assert!(cmds.actions.is_empty());
        assert_eq!(cmds.notes[0].key, "available_commands_update");
        assert_eq!(cmds.notes[0].value["availableCommands"][0]["name"], "web");
        let mode = m.update(&upd(
            json!({"sessionUpdate": "current_mode_update", "currentModeId": "code"}),
        ));
        assert_eq!(mode.notes[0].key, "current_mode_update");
        let link = m.update(&upd(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "resource_link", "name": "spec", "uri": "file:///spec.md"}})));
        let l = json_of(&link.actions[0]);
        assert_eq!(l["part"]["content"], "[spec](file:///spec.md)");
        assert_eq!(l["_meta"]["tandem/acp"]["uri"], "file:///spec.md");
    }
}
