//! The one API for "wait for a person": an agent asks for an interaction and
//! awaits its settlement. The chat actor turns each interaction into AHP
//! parts and tool-call states and settles it exactly once (invariant 3).

pub mod form;
pub(crate) mod link;
pub(crate) mod policy;

use std::collections::BTreeMap;

use ahp_types::state::{
    ChatInputAnswer, ChatInputQuestion, ChatInputRequest, ChatInputResponseKind,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Something an agent needs from a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Interaction {
    /// Questions (or a bare message) as an AHP input request.
    #[serde(rename_all = "camelCase")]
    Input {
        /// The request; `answers` may pre-fill drafts.
        request: ChatInputRequest,
        /// Opt-in timeout per question (MSP `autoResolutionMs`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        auto_resolution_ms: Option<u64>,
    },
    /// An MCP-style form: a flat `requestedSchema`, answered as `content`.
    #[serde(rename_all = "camelCase")]
    Form {
        /// What to tell the person.
        message: String,
        /// The MCP `requestedSchema`.
        schema: Value,
    },
    /// A URL the person should visit or review, then confirm.
    #[serde(rename_all = "camelCase")]
    Url {
        /// What to tell the person.
        message: String,
        /// The URL.
        url: String,
    },
    /// Approval of one tool call.
    #[serde(rename_all = "camelCase")]
    ToolApproval {
        /// The provider's tool call id.
        tool_call_id: String,
        /// Tool name (used for grants).
        tool_name: String,
        /// Tool input as a JSON string (AHP `toolInput`).
        input: String,
        /// Declared read-only: needs no approval by default.
        #[serde(default)]
        read_only: bool,
        /// Whether the person may edit the input before approving.
        #[serde(default)]
        editable: bool,
        /// The agent's own choices (an ACP agent's permission options);
        /// `None` offers the host's ([`tool_options`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        options: Option<Vec<ToolOption>>,
        /// What the agent calls this call, in words (an ACP agent's title,
        /// e.g. "Edit main.rs"); the card then says that instead of "Run
        /// `tool`".
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
    },
}

/// A choice an agent offers for one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolOption {
    /// The agent's id for it (what the settlement's `selected_option_id`
    /// carries back).
    pub id: String,
    /// What people see.
    pub label: String,
    /// What choosing it means.
    pub kind: ToolOptionKind,
}

/// What choosing a [`ToolOption`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolOptionKind {
    /// Run this call.
    AllowOnce,
    /// Run this call and, for the rest of the session, every call of the
    /// same tool without asking (a session grant).
    AllowAlways,
    /// Do not run this call.
    RejectOnce,
    /// Do not run this call nor, for the rest of the session, any call of
    /// the same tool (a session denial).
    RejectAlways,
}

impl ToolOptionKind {
    /// Whether it lets the call run.
    pub fn allows(self) -> bool {
        matches!(self, Self::AllowOnce | Self::AllowAlways)
    }

    /// Whether it decides for later calls too.
    pub fn always(self) -> bool {
        matches!(self, Self::AllowAlways | Self::RejectAlways)
    }
}

/// An agent's options as AHP confirmation options (approvals in group 0,
/// rejections in group 1, in the agent's order).
pub fn confirmation_options(options: &[ToolOption]) -> Vec<ahp_types::state::ConfirmationOption> {
    use ahp_types::state::{ConfirmationOption, ConfirmationOptionKind};
    options
        .iter()
        .map(|o| ConfirmationOption {
            id: o.id.clone(),
            label: o.label.clone(),
            kind: if o.kind.allows() {
                ConfirmationOptionKind::Approve
            } else {
                ConfirmationOptionKind::Deny
            },
            group: Some(if o.kind.allows() { 0 } else { 1 }),
        })
        .collect()
}

impl Interaction {
    /// The link it asks a person to open, if any (checked by [`link::check`]).
    pub fn url(&self) -> Option<&str> {
        match self {
            Interaction::Input { request, .. } => request.url.as_deref(),
            Interaction::Url { url, .. } => Some(url),
            Interaction::Form { .. } | Interaction::ToolApproval { .. } => None,
        }
    }
}

/// How an interaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Completed with `accept`.
    Answered,
    /// Completed with `decline`.
    Declined,
    /// Completed with `cancel`.
    Cancelled,
    /// Tool call approved.
    Approved,
    /// Tool call denied.
    Denied,
    /// Nobody engaged within the auto-resolution time.
    TimedOut,
    /// The turn was cancelled while it was open.
    Interrupted,
    /// A steering message arrived while it was open.
    Clarified,
    /// Session disposed, provider gone, or server restart.
    Aborted,
}

impl Outcome {
    /// The wire name (`answered`, `timedOut`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Declined => "declined",
            Outcome::Cancelled => "cancelled",
            Outcome::Approved => "approved",
            Outcome::Denied => "denied",
            Outcome::TimedOut => "timedOut",
            Outcome::Interrupted => "interrupted",
            Outcome::Clarified => "clarified",
            Outcome::Aborted => "aborted",
        }
    }
}

/// The result an agent receives, exactly once per interaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settlement {
    /// How it ended.
    pub outcome: Outcome,
    /// The AHP completion kind, for input interactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ChatInputResponseKind>,
    /// Final answers (drafts overlaid by the completion's answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<BTreeMap<String, ChatInputAnswer>>,
    /// Form content valid against the requested schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// Tool approval decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// Input edited by the person before approving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_tool_input: Option<String>,
    /// Free-text reason (denial reason, abort cause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The confirmation option the person chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_option_id: Option<String>,
    /// Steering text that settled the request as `clarified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clarification: Option<String>,
}

impl Settlement {
    /// A settlement carrying only an outcome.
    pub fn bare(outcome: Outcome) -> Self {
        Self {
            outcome,
            response: None,
            answers: None,
            content: None,
            approved: None,
            edited_tool_input: None,
            reason: None,
            selected_option_id: None,
            clarification: None,
        }
    }

    /// A settlement with a reason.
    pub fn with_reason(outcome: Outcome, reason: impl Into<String>) -> Self {
        Self {
            reason: Some(reason.into()),
            ..Self::bare(outcome)
        }
    }
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

/// Ids of the confirmation options every tool approval offers.
pub mod options {
    /// Approve this call only.
    pub const APPROVE_ONCE: &str = "approve-once";
    /// Approve this call and later calls of the same tool in the session.
    pub const APPROVE_SESSION: &str = "approve-session";
    /// Deny this call.
    pub const DENY: &str = "deny";
}

/// The confirmation options offered on every tool approval.
pub fn tool_options() -> Vec<ahp_types::state::ConfirmationOption> {
    use ahp_types::state::{ConfirmationOption, ConfirmationOptionKind};
    vec![
        ConfirmationOption {
            id: options::APPROVE_ONCE.into(),
            label: "Approve once".into(),
            kind: ConfirmationOptionKind::Approve,
            group: Some(0),
        },
        ConfirmationOption {
            id: options::APPROVE_SESSION.into(),
            label: "Approve for this session".into(),
            kind: ConfirmationOptionKind::Approve,
            group: Some(0),
        },
        ConfirmationOption {
            id: options::DENY.into(),
            label: "Deny".into(),
            kind: ConfirmationOptionKind::Deny,
            group: Some(1),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlement_serializes_in_camel_case_without_empty_fields() {
        let s = Settlement {
            edited_tool_input: Some("{}".into()),
            ..Settlement::bare(Outcome::TimedOut)
        };
        let v = serde_json::to_value(&s).expect("serializable");
        assert_eq!(
            v,
            serde_json::json!({"outcome": "timedOut", "editedToolInput": "{}"})
        );
    }
}
