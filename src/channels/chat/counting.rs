//! What the chat tells the metrics about requests for a person: each one
//! opened (an input request, a URL to visit, a tool call waiting for
//! approval), and how and after how long it ended — read off the published
//! actions, so every way of asking (the built-in agent, an AHP agent, an
//! ACP agent) counts the same.

use std::time::Instant;

use ahp_types::actions::StateAction;
use ahp_types::state::ChatInputResponseKind;

use super::ChatActor;
use crate::metrics::{InteractionKind, Settled};

impl ChatActor {
    /// Count `action` (just published) if it opens or ends a request for a
    /// person.
    pub(super) fn count_interactions(&mut self, action: &StateAction) {
        let metrics = &self.core.shared.metrics;
        let (id, outcome) = match action {
            StateAction::ChatInputRequested(a) => {
                let kind = if a.request.url.is_some() {
                    InteractionKind::Url
                } else {
                    InteractionKind::Input
                };
                if !self.asked.contains_key(&a.request.id) {
                    self.asked
                        .insert(a.request.id.clone(), (kind, Instant::now()));
                    metrics.interaction_opened(kind);
                }
                return;
            }
            StateAction::ChatToolCallReady(a) if a.confirmed.is_none() => {
                if !self.asked.contains_key(&a.tool_call_id) {
                    let opened = (InteractionKind::Tool, Instant::now());
                    self.asked.insert(a.tool_call_id.clone(), opened);
                    metrics.interaction_opened(InteractionKind::Tool);
                }
                return;
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
        for (_, (kind, at)) in self.asked.drain() {
            metrics.interaction_settled(kind, outcome, Some(at.elapsed()));
        }
    }
}
