//! What a published action does beyond the state: start, cancel and end
//! agent turns, settle the interactions it answered (each exactly once),
//! start the next queued message, and tell the session what changed.

use actix::prelude::*;
use ahp_types::actions::{
    ChatInputCompletedAction, ChatPendingMessageRemovedAction, ChatTurnStartedAction, StateAction,
};
use ahp_types::state::{ChatInputResponseKind, PendingMessageKind};

use super::{chat_error, find_input, tool_name_of, ChatActor, ChatHandle};
use crate::channels::agent::AgentTurn;
use crate::channels::commit::ChannelActor;
use crate::channels::rollup;
use crate::channels::session::{ChatSummaryChanged, GrantTool, RollupChanged, TurnCheckpoint};
use crate::ids::ServerSeq;
use crate::interactions::{form, policy, Outcome, Settlement};
use crate::time::now_rfc3339;

impl ChatActor {
    /// Effects of a published action: settlements, agent turns, queued turns.
    pub(super) fn after_publish(&mut self, ctx: &mut Context<Self>, action: StateAction) {
        match action {
            StateAction::ChatTurnStarted(a) => {
                self.session_addr.do_send(TurnCheckpoint);
                self.start_agent_turn(ctx, a);
            }
            StateAction::ChatTurnCancelled(a) => {
                self.settle_turn(&a.turn_id, Outcome::Interrupted, "the turn was cancelled");
                if let Some(agent) = self.core.shared.providers.get(&self.provider) {
                    agent.cancel_turn(&self.core.uri, &a.turn_id);
                }
                self.start_queued(ctx);
            }
            StateAction::ChatTruncated(_) => {
                let active = self.state.active_turn.as_ref().map(|t| t.id.clone());
                let gone: Vec<String> = self
                    .inputs
                    .values()
                    .map(|p| p.turn_id.clone())
                    .chain(self.tools.values().map(|p| p.turn_id.clone()))
                    .filter(|t| Some(t) != active.as_ref())
                    .collect();
                for turn in gone {
                    self.settle_turn(&turn, Outcome::Interrupted, "the turn was truncated");
                }
            }
            StateAction::ChatTurnComplete(a) => {
                if let Some(agent) = self.core.shared.providers.get(&self.provider) {
                    agent.turn_ended(&self.core.uri, &a.turn_id);
                }
                self.settle_turn(&a.turn_id, Outcome::Aborted, "the turn ended");
                self.start_queued(ctx);
            }
            StateAction::ChatError(a) => {
                if let Some(agent) = self.core.shared.providers.get(&self.provider) {
                    agent.turn_ended(&self.core.uri, &a.turn_id);
                }
                self.settle_turn(&a.turn_id, Outcome::Aborted, "the turn ended with an error");
                self.start_queued(ctx);
            }
            StateAction::ChatInputAnswerChanged(a) => {
                if let Some(p) = self.inputs.get_mut(&a.request_id) {
                    p.engaged = true;
                }
            }
            StateAction::ChatInputCompleted(a) => self.settle_input_completed(&a),
            StateAction::ChatToolCallConfirmed(a) => {
                let option = a.selected_option_id.as_deref();
                let records = match self.tools.get(&a.tool_call_id) {
                    Some(p) => p.records(a.approved, option),
                    None => policy::grants_for_session(a.approved, option).then_some(true),
                };
                let by = self.deciders.remove(&a.tool_call_id);
                if let Some(allow) = records {
                    if let Some(name) = tool_name_of(&self.state, &a.tool_call_id) {
                        self.session_addr.do_send(GrantTool {
                            tool_name: name,
                            allow,
                            by,
                        });
                    }
                }
                if let Some(p) = self.tools.remove(&a.tool_call_id) {
                    let s = if a.approved {
                        Settlement {
                            approved: Some(true),
                            edited_tool_input: a.edited_tool_input.clone(),
                            selected_option_id: a.selected_option_id.clone(),
                            ..Settlement::bare(Outcome::Approved)
                        }
                    } else {
                        Settlement {
                            approved: Some(false),
                            reason: a.reason_message.as_ref().map(|m| m.as_text().to_owned()),
                            selected_option_id: a.selected_option_id.clone(),
                            ..Settlement::bare(Outcome::Denied)
                        }
                    };
                    let _ = p.reply.send(s);
                }
            }
            StateAction::ChatPendingMessageSet(a) if a.kind == PendingMessageKind::Steering => {
                self.clarify(ctx, a.id.clone(), a.message.text.clone());
                // Nothing to steer: it is the next message.
                self.start_queued(ctx);
            }
            _ => {}
        }
    }

    fn start_agent_turn(&mut self, ctx: &mut Context<Self>, a: ChatTurnStartedAction) {
        let Some(agent) = self.core.shared.providers.get(&self.provider) else {
            let err = chat_error(
                &a.turn_id,
                &a.started_at,
                "ProviderUnavailable",
                &format!("provider `{}` is not available", self.provider),
            );
            self.host_actions(ctx, vec![err], None);
            return;
        };
        let handle = ChatHandle::new(
            ctx.address(),
            self.core.uri.clone(),
            a.turn_id.clone(),
            a.started_at.clone(),
        );
        agent.start_turn(AgentTurn {
            session: self.session.clone(),
            handle,
            message: a.message,
        });
    }

    /// After a turn ends, the next queued message starts the next turn.
    /// The chat is idle: start the next pending message as a turn. A
    /// steering message the turn did not take in (no agent here injects
    /// one mid-turn; it only answers an open question) comes first, then
    /// the queue in order.
    fn start_queued(&mut self, ctx: &mut Context<Self>) {
        if self.state.active_turn.is_some() {
            return;
        }
        let Some(next) = self.state.steering_message.clone().or_else(|| {
            self.state
                .queued_messages
                .as_ref()
                .and_then(|q| q.first())
                .cloned()
        }) else {
            return;
        };
        let started = StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: uuid::Uuid::new_v4().to_string(),
            started_at: now_rfc3339(),
            message: next.message,
            queued_message_id: Some(next.id),
            meta: None,
        });
        self.host_actions(ctx, vec![started], None);
    }

    fn settle_input_completed(&mut self, a: &ChatInputCompletedAction) {
        let Some(p) = self.inputs.remove(&a.request_id) else {
            return;
        };
        let raw_answers = find_input(&self.state, &a.request_id).and_then(|r| r.answers.clone());
        let content = match (&p.form_schema, a.response) {
            (Some(schema), ChatInputResponseKind::Accept) => {
                let c = form::content(schema, &raw_answers.clone().unwrap_or_default());
                if let Err(e) = form::validate(schema, &c) {
                    tracing::warn!(chat = %self.core.uri, error = %e, "form content does not validate");
                }
                Some(c)
            }
            _ => None,
        };
        let answers = raw_answers.map(|m| m.into_iter().collect());
        let settlement = match p.forced {
            Some(forced) => Settlement {
                response: Some(a.response),
                ..forced
            },
            None => Settlement {
                response: Some(a.response),
                answers,
                content,
                ..Settlement::bare(match a.response {
                    ChatInputResponseKind::Accept => Outcome::Answered,
                    ChatInputResponseKind::Decline => Outcome::Declined,
                    ChatInputResponseKind::Cancel => Outcome::Cancelled,
                })
            },
        };
        let _ = p.reply.send(settlement);
    }

    /// A steering message while an input request is open settles it
    /// `clarified` with the text; the message is consumed.
    fn clarify(&mut self, ctx: &mut Context<Self>, message_id: String, text: String) {
        let open: Vec<String> = self.inputs.keys().cloned().collect();
        if open.is_empty() {
            return;
        }
        let mut actions = Vec::new();
        for id in open {
            if let Some(p) = self.inputs.get_mut(&id) {
                p.forced = Some(Settlement {
                    clarification: Some(text.clone()),
                    ..Settlement::bare(Outcome::Clarified)
                });
            }
            actions.push(StateAction::ChatInputCompleted(ChatInputCompletedAction {
                request_id: id,
                response: ChatInputResponseKind::Decline,
                answers: None,
            }));
        }
        actions.push(StateAction::ChatPendingMessageRemoved(
            ChatPendingMessageRemovedAction {
                kind: PendingMessageKind::Steering,
                id: message_id,
            },
        ));
        self.host_actions(ctx, actions, None);
    }

    /// Settle every interaction of `turn_id` (the turn is gone or going).
    fn settle_turn(&mut self, turn_id: &str, outcome: Outcome, reason: &str) {
        let inputs: Vec<String> = self
            .inputs
            .iter()
            .filter(|(_, p)| p.turn_id == turn_id)
            .map(|(k, _)| k.clone())
            .collect();
        for id in inputs {
            if let Some(p) = self.inputs.remove(&id) {
                let _ = p.reply.send(Settlement::with_reason(outcome, reason));
            }
        }
        let tools: Vec<String> = self
            .tools
            .iter()
            .filter(|(_, p)| p.turn_id == turn_id)
            .map(|(k, _)| k.clone())
            .collect();
        for id in tools {
            if let Some(p) = self.tools.remove(&id) {
                let _ = p.reply.send(Settlement::with_reason(outcome, reason));
            }
        }
    }

    /// Remember which envelope opened an interaction (for `listPending`).
    pub(super) fn note_opened(&mut self, action: &StateAction, seq: ServerSeq) {
        let id = match action {
            StateAction::ChatInputRequested(r) => {
                rollup::input_entry_id(&self.core.uri, &r.request.id)
            }
            StateAction::ChatToolCallReady(r) if r.confirmed.is_none() => {
                rollup::tool_entry_id(&self.core.uri, &r.tool_call_id)
            }
            _ => return,
        };
        self.opened.entry(id).or_insert(seq);
    }

    /// Tell the session what changed in the roll-up and the catalog entry.
    pub(super) fn report_to_session(&mut self) {
        let items = rollup::open_items(&self.core.uri, &self.state);
        self.opened.retain(|id, _| {
            items
                .iter()
                .any(|i| rollup::entry_id(i) == Some(id.as_str()))
        });
        let (set, removed) = rollup::diff(&self.rollup, &items);
        if !set.is_empty() || !removed.is_empty() {
            self.session_addr.do_send(RollupChanged { set, removed });
        }
        self.rollup = items;
        if self.state.status != self.reported_status {
            self.reported_status = self.state.status;
            self.session_addr.do_send(ChatSummaryChanged {
                chat: self.core.uri.clone(),
                status: self.state.status,
                modified_at: self.state.modified_at.clone(),
            });
        }
    }
}
