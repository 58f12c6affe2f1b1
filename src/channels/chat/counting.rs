//! What the chat tells the metrics about requests for a person: each one
//! opened (an input request, a URL to visit, a tool call waiting for
//! approval), and how and after how long it ended — read off the published
//! actions, so every way of asking (the built-in agent, an AHP agent, an
//! ACP agent) counts the same.

use std::time::Instant;

use ahp_types::actions::StateAction;
use ahp_types::state::ChatInputResponseKind;

use super::ChatActor;
use crate::metrics::{InteractionKind, Settled, Waiting};
use crate::notify::{Opened, Settle};

impl ChatActor {
    /// Count `action` (just published) if it opens or ends a request for a
    /// person; tool calls in `decided` were settled by the host in the batch
    /// that showed them, and are not counted.
    pub(super) fn count_interactions(&mut self, action: &StateAction, decided: &[String]) {
        let metrics = &self.core.shared.metrics;
        let (id, outcome) = match action {
            StateAction::ChatInputRequested(a) => {
                let kind = if a.request.url.is_some() {
                    InteractionKind::Url
                } else {
                    InteractionKind::Input
                };
                let title = a
                    .request
                    .message
                    .clone()
                    .or_else(|| a.request.url.as_ref().map(|u| u.to_string()))
                    .or_else(|| first_question(&a.request))
                    .unwrap_or_else(|| "questions".to_owned());
                return self.opened_one(&a.request.id, kind, title, None);
            }
            StateAction::ChatToolCallReady(a) if decided.contains(&a.tool_call_id) => return,
            StateAction::ChatToolCallConfirmed(a)
                if decided.contains(&a.tool_call_id)
                    && !self.asked.contains_key(&a.tool_call_id) =>
            {
                return
            }
            StateAction::ChatToolCallReady(a) if a.confirmed.is_none() => {
                let tool = super::tool_name_of(&self.state, &a.tool_call_id);
                let title = match &tool {
                    Some(n) => format!("tool `{n}`"),
                    None => "a tool call".to_owned(),
                };
                return self.opened_one(&a.tool_call_id, InteractionKind::Tool, title, tool);
            }
            StateAction::ChatInputCompleted(a) => {
                let outcome = match a.response {
                    ChatInputResponseKind::Accept => Settled::Answered,
                    ChatInputResponseKind::Decline => Settled::Declined,
                    ChatInputResponseKind::Cancel => Settled::Cancelled,
                };
                (a.request_id.as_str(), outcome)
            }
            StateAction::ChatToolCallConfirmed(a) => {
                let outcome = if a.approved {
                    Settled::Approved
                } else {
                    Settled::Denied
                };
                (a.tool_call_id.as_str(), outcome)
            }
            StateAction::ChatTurnCancelled(_) => {
                return self.count_all_ended(Settled::Interrupted);
            }
            // Requests belong to the active turn: gone if it was truncated away.
            StateAction::ChatTruncated(_) if self.state.active_turn.is_none() => {
                return self.count_all_ended(Settled::Interrupted);
            }
            StateAction::ChatTurnComplete(_) | StateAction::ChatError(_) => {
                return self.count_all_ended(Settled::Abandoned);
            }
            _ => return,
        };
        metrics.waiting_ended(&self.core.uri, id);
        let by = self.settled_by.remove(id);
        self.core.shared.notify.settled(Settle {
            chat: self.core.uri.to_string(),
            id: id.to_owned(),
            outcome,
            by,
        });
        match self.asked.remove(id) {
            Some((kind, at)) => metrics.interaction_settled(kind, outcome, Some(at.elapsed())),
            // Opened before a restart: how long it waited is not known here.
            None => {
                let kind = match outcome {
                    Settled::Approved | Settled::Denied => InteractionKind::Tool,
                    _ => InteractionKind::Input,
                };
                metrics.interaction_settled(kind, outcome, None);
            }
        }
    }

    /// Every request still open ended with its turn.
    fn count_all_ended(&mut self, outcome: Settled) {
        let metrics = self.core.shared.metrics.clone();
        self.settled_by.clear();
        for (id, (kind, at)) in self.asked.drain() {
            metrics.waiting_ended(&self.core.uri, &id);
            metrics.interaction_settled(kind, outcome, Some(at.elapsed()));
            self.core.shared.notify.settled(Settle {
                chat: self.core.uri.to_string(),
                id,
                outcome,
                by: None,
            });
        }
    }

    /// Request `id` of `kind` waits for a person from now on (once: a
    /// request replaced with the same id is the same request).
    fn opened_one(&mut self, id: &str, kind: InteractionKind, title: String, tool: Option<String>) {
        if self.asked.contains_key(id) {
            return;
        }
        let since = Instant::now();
        self.asked.insert(id.to_owned(), (kind, since));
        let metrics = &self.core.shared.metrics;
        metrics.interaction_opened(kind);
        self.core.shared.notify.opened(Opened {
            session: self.session.to_string(),
            chat: self.core.uri.to_string(),
            id: id.to_owned(),
            kind,
            title: title.clone(),
            tool,
        });
        metrics.waiting_opened(Waiting {
            session: self.session.to_string(),
            chat: self.core.uri.to_string(),
            id: id.to_owned(),
            kind,
            title,
            since,
        });
    }
}

/// What the first of a request's questions asks, and how many follow.
fn first_question(r: &ahp_types::state::ChatInputRequest) -> Option<String> {
    let qs = r.questions.as_ref()?;
    let first = serde_json::to_value(qs.first()?).ok()?;
    let message = first.get("message")?.as_str()?.to_owned();
    Some(match qs.len() {
        1 => message,
        n => format!("{message} (+{} more)", n - 1),
    })
}
