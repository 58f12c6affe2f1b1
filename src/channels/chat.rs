//! The chat actor: owner of one `ChatState`, its active turn, and every
//! interaction open in it.
//!
//! Actions are handled one at a time. While a batch is in the journal the actor
//! waits (`ctx.wait`), so the state a `subscribe` snapshots always equals what
//! has been published — a snapshot never contains an action its subscriber
//! will also receive.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use ahp::reducers::{apply_action_to_chat, ReduceOutcome};
use ahp_types::actions::{
    ActionOrigin, ChatErrorAction, ChatInputCompletedAction, ChatInputRequestedAction,
    ChatPendingMessageRemovedAction, ChatToolCallReadyAction, ChatToolCallStartAction,
    ChatTurnStartedAction, StateAction,
};
use ahp_types::state::{
    ChatInputRequest, ChatInputResponseKind, ChatState, ErrorInfo, ErrorResponsePart,
    PendingMessageKind, ResponsePart, SessionInputRequest, SessionStatus,
    ToolCallConfirmationReason, ToolInput,
};
use tokio::sync::oneshot;

use super::core::{Accepted, ChannelCore, Shared};
use super::rollup;
use super::session::{
    ApprovalCheckpoint, ChatSummaryChanged, GrantTool, RollupChanged, SessionActor, TurnCheckpoint,
};
use super::validate::{self, Rejection};
use super::{ClientDispatch, SnapshotJson, Subscribe};
use crate::interactions::{form, link, tool_options, Interaction, Outcome, Settlement};
use crate::protocol::RpcError;
use crate::providers::{AgentTurn, ChatHandle};
use crate::publish::{Hub, Outbound};
use crate::store::TurnRecord;
use crate::time::{millis_since, now_rfc3339};

/// An open input request an agent is waiting on.
struct PendingInput {
    turn_id: String,
    reply: oneshot::Sender<Settlement>,
    /// Any answer activity since it opened (disables the auto-resolution).
    engaged: bool,
    /// Set when the host completes the request for a reason of its own
    /// (timeout, clarification), so the completion settles with that outcome.
    forced: Option<Settlement>,
    /// For a form: the schema the accepted answers become `content` for.
    form_schema: Option<serde_json::Value>,
}

/// A tool call waiting for confirmation.
struct PendingTool {
    turn_id: String,
    reply: oneshot::Sender<Settlement>,
}

/// One chat channel.
pub struct ChatActor {
    core: ChannelCore,
    session: Arc<str>,
    session_addr: Addr<SessionActor>,
    /// Provider id of the owning session.
    provider: String,
    state: ChatState,
    /// Every turn id ever started here (a reused id is rejected).
    used_turn_ids: HashSet<String>,
    inputs: HashMap<String, PendingInput>,
    tools: HashMap<String, PendingTool>,
    /// Last roll-up reported to the session.
    rollup: Vec<SessionInputRequest>,
    /// Last status reported to the session's chat catalog.
    reported_status: u32,
    /// Turns of the history before `state.turns` (stored, not in memory).
    turn_base: u64,
    /// Turns ended by actions reduced since the last commit.
    pending_turns: Vec<TurnRecord>,
    /// A truncation reduced since the last commit: drop stored turns from here.
    pending_truncate: Option<u64>,
    /// Recovered with a turn that was running when the server stopped.
    crashed_turn: bool,
    /// A failed append could not be rolled back: the in-memory state may hold
    /// what the store does not, so it is not served.
    unreadable: bool,
    /// `serverSeq` of the envelope that opened each roll-up entry.
    opened: HashMap<String, u64>,
}

impl ChatActor {
    /// A new, empty chat.
    pub fn new(
        uri: Arc<str>,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        session: Arc<str>,
        session_addr: Addr<SessionActor>,
        provider: String,
        title: String,
    ) -> Self {
        let state = new_chat_state(&uri, title);
        Self::recovered(uri, hub, shared, session, session_addr, provider, state, 0)
    }

    /// A chat rebuilt from the store. A turn that was running when the server
    /// stopped ends with `chat/error` as soon as the actor starts.
    #[allow(clippy::too_many_arguments)]
    pub fn recovered(
        uri: Arc<str>,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        session: Arc<str>,
        session_addr: Addr<SessionActor>,
        provider: String,
        state: ChatState,
        turn_base: u64,
    ) -> Self {
        let used_turn_ids = state
            .turns
            .iter()
            .map(|t| t.id.clone())
            .chain(state.active_turn.iter().map(|t| t.id.clone()))
            .collect();
        Self {
            reported_status: state.status,
            rollup: rollup::open_items(&uri, &state),
            crashed_turn: state.active_turn.is_some(),
            core: ChannelCore::new(uri, hub, shared),
            session,
            session_addr,
            provider,
            state,
            used_turn_ids,
            inputs: HashMap::new(),
            tools: HashMap::new(),
            turn_base,
            pending_turns: Vec::new(),
            pending_truncate: None,
            unreadable: false,
            opened: HashMap::new(),
        }
    }

    /// After a failed append: go back to what the store holds (what clients
    /// saw), and settle every open interaction — the chat takes no more writes.
    fn roll_back(&mut self) {
        self.pending_turns.clear();
        self.pending_truncate = None;
        match self.core.shared.journal.load_channel(&self.core.uri) {
            Ok(Some(c)) => match super::recovery::rebuild(&c, usize::MAX) {
                Ok(super::recovery::Rebuilt::Chat(state, base)) => {
                    self.state = *state;
                    self.turn_base = base;
                }
                Ok(_) => tracing::error!(chat = %self.core.uri, "stored channel is not a chat"),
                Err(e) => {
                    tracing::error!(chat = %self.core.uri, error = %e, "cannot rebuild the chat")
                }
            },
            Ok(None) => self.state = new_chat_state(&self.core.uri, self.state.title.clone()),
            Err(e) => {
                tracing::error!(chat = %self.core.uri, error = %e, "cannot read the store to roll back");
                self.unreadable = true;
            }
        }
        self.abort_all("the store is unavailable");
    }

    /// Settle every open interaction `aborted` (the chat takes no more input).
    fn abort_all(&mut self, reason: &str) {
        let inputs = std::mem::take(&mut self.inputs)
            .into_values()
            .map(|p| p.reply);
        let tools = std::mem::take(&mut self.tools)
            .into_values()
            .map(|p| p.reply);
        for reply in inputs.chain(tools) {
            let _ = reply.send(Settlement::with_reason(Outcome::Aborted, reason));
        }
    }

    /// The opaque `turnsNextCursor` for history before turn `base`.
    fn cursor(base: u64) -> String {
        format!("turns-before:{base}")
    }

    /// Keep what an action did to the turn history, for the store.
    fn track_history(&mut self, action: &StateAction, turns_before: usize) {
        match action {
            StateAction::ChatTurnComplete(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatError(_) => {
                if let Some(t) = self.state.turns.last() {
                    self.pending_turns.push(TurnRecord {
                        index: self.turn_base + self.state.turns.len() as u64 - 1,
                        json: serde_json::to_string(t).unwrap_or_default().into(),
                    });
                }
            }
            StateAction::ChatTruncated(a) => {
                let from = if a.turn_id.is_none() {
                    self.turn_base = 0;
                    0
                } else {
                    self.turn_base + self.state.turns.len() as u64
                };
                self.pending_turns.retain(|t| t.index < from);
                self.pending_truncate = Some(self.pending_truncate.map_or(from, |f| f.min(from)));
            }
            StateAction::ChatTurnsLoaded(_) => {
                let added = self.state.turns.len().saturating_sub(turns_before) as u64;
                self.turn_base = self.turn_base.saturating_sub(added);
            }
            _ => {}
        }
    }

    fn reduce(&mut self, action: &StateAction) -> Result<(), Rejection> {
        let turns_before = self.state.turns.len();
        match apply_action_to_chat(&mut self.state, action) {
            ReduceOutcome::Applied => {
                if let StateAction::ChatTurnStarted(a) = action {
                    self.used_turn_ids.insert(a.turn_id.clone());
                }
                self.track_history(action, turns_before);
                Ok(())
            }
            ReduceOutcome::NoOp => Err(Rejection::new(format!(
                "`{}` has no effect on this chat (unknown turn, part or id)",
                validate::action_type(action)
            ))),
            ReduceOutcome::OutOfScope => Err(Rejection::new(format!(
                "`{}` is not a chat action",
                validate::action_type(action)
            ))),
            ReduceOutcome::Invalid(e) => Err(Rejection::new(e.to_string())),
        }
    }

    /// Reduce host/agent actions in order (skipping any that no longer apply)
    /// and journal them as one batch.
    fn host_actions(&mut self, ctx: &mut Context<Self>, actions: Vec<StateAction>) {
        let mut batch = Vec::with_capacity(actions.len());
        for action in actions {
            match self.reduce(&action) {
                Ok(()) => batch.push(Accepted::new(action, None)),
                Err(r) => {
                    tracing::debug!(chat = %self.core.uri, reason = %r, "host action skipped")
                }
            }
        }
        self.commit(ctx, batch, None);
    }

    /// Journal a reduced batch; once durable publish it, run its effects, and
    /// answer `done` (an agent waiting for its action to land).
    fn commit(
        &mut self,
        ctx: &mut Context<Self>,
        batch: Vec<Accepted>,
        done: Option<oneshot::Sender<Result<(), Rejection>>>,
    ) {
        if batch.is_empty() {
            if let Some(done) = done {
                let _ = done.send(Ok(()));
            }
            return;
        }
        let turns = std::mem::take(&mut self.pending_turns);
        let truncate = self.pending_truncate.take();
        let state = &self.state;
        let commit = self.core.append(&batch, turns, truncate, || {
            serde_json::to_string(state).ok()
        });
        ctx.wait(commit.into_actor(self).map(move |res, act, ctx| match res {
            Ok(()) => {
                for a in &batch {
                    let seq = act.core.publish(a);
                    act.note_opened(&a.action, seq.0);
                }
                for a in batch {
                    act.after_publish(ctx, a.action);
                }
                act.report_to_session();
                if let Some(done) = done {
                    let _ = done.send(Ok(()));
                }
            }
            Err(e) => {
                let reason = e.to_string();
                act.core.commit_failed(e, &batch);
                act.roll_back();
                if let Some(done) = done {
                    let _ = done.send(Err(Rejection::new(format!("not stored: {reason}"))));
                }
            }
        }));
    }

    /// Effects of a published action: settlements, agent turns, queued turns.
    fn after_publish(&mut self, ctx: &mut Context<Self>, action: StateAction) {
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
                if a.approved
                    && a.selected_option_id.as_deref()
                        == Some(crate::interactions::options::APPROVE_SESSION)
                {
                    if let Some(name) = tool_name_of(&self.state, &a.tool_call_id) {
                        self.session_addr.do_send(GrantTool { tool_name: name });
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
            self.host_actions(ctx, vec![err]);
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
    fn start_queued(&mut self, ctx: &mut Context<Self>) {
        if self.state.active_turn.is_some() {
            return;
        }
        let Some(next) = self
            .state
            .queued_messages
            .as_ref()
            .and_then(|q| q.first())
            .cloned()
        else {
            return;
        };
        let started = StateAction::ChatTurnStarted(ChatTurnStartedAction {
            turn_id: uuid::Uuid::new_v4().to_string(),
            started_at: now_rfc3339(),
            message: next.message,
            queued_message_id: Some(next.id),
            meta: None,
        });
        self.host_actions(ctx, vec![started]);
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
        self.host_actions(ctx, actions);
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
    fn note_opened(&mut self, action: &StateAction, seq: u64) {
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
    fn report_to_session(&mut self) {
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

    fn open_interaction(&mut self, ctx: &mut Context<Self>, msg: Interact) {
        let Interact {
            turn_id,
            interaction,
            reply,
        } = msg;
        if self.state.active_turn.as_ref().map(|t| t.id.as_str()) != Some(turn_id.as_str()) {
            let _ = reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!("turn `{turn_id}` is not active"),
            ));
            return;
        }
        match interaction {
            Interaction::Input {
                request,
                auto_resolution_ms,
            } => self.open_input(ctx, turn_id, request, auto_resolution_ms, reply),
            Interaction::Url { message, url } => {
                let request = ChatInputRequest {
                    id: uuid::Uuid::new_v4().to_string(),
                    message: Some(message),
                    url: Some(url),
                    questions: None,
                    answers: None,
                };
                self.open_input(ctx, turn_id, request, None, reply)
            }
            Interaction::Form { message, schema } => {
                let questions = match form::questions(&schema) {
                    Ok(q) => q,
                    Err(e) => {
                        let _ = reply.send(Settlement::with_reason(
                            Outcome::Aborted,
                            format!("the form schema is not supported: {e}"),
                        ));
                        return;
                    }
                };
                let request = ChatInputRequest {
                    id: uuid::Uuid::new_v4().to_string(),
                    message: Some(message),
                    url: None,
                    questions: Some(questions),
                    answers: None,
                };
                let id = request.id.clone();
                self.open_input(ctx, turn_id, request, None, reply);
                if let Some(p) = self.inputs.get_mut(&id) {
                    p.form_schema = Some(schema);
                }
            }
            Interaction::ToolApproval {
                tool_call_id,
                tool_name,
                input,
                read_only,
                editable,
            } => {
                if read_only {
                    self.open_tool(
                        ctx,
                        turn_id,
                        tool_call_id,
                        tool_name,
                        input,
                        editable,
                        Some(ToolCallConfirmationReason::NotNeeded),
                        reply,
                    );
                    return;
                }
                // The approval checkpoint: the session's policy as of now.
                let check = self.session_addr.send(ApprovalCheckpoint {
                    tool_name: tool_name.clone(),
                });
                ctx.wait(check.into_actor(self).map(move |auto, act, ctx| {
                    let auto = auto.ok().flatten();
                    act.open_tool(
                        ctx,
                        turn_id,
                        tool_call_id,
                        tool_name,
                        input,
                        editable,
                        auto,
                        reply,
                    );
                }));
            }
        }
    }

    /// Put a tool call up for confirmation, or auto-confirm it with `auto`.
    #[allow(clippy::too_many_arguments)]
    fn open_tool(
        &mut self,
        ctx: &mut Context<Self>,
        turn_id: String,
        tool_call_id: String,
        tool_name: String,
        input: String,
        editable: bool,
        auto: Option<ToolCallConfirmationReason>,
        reply: oneshot::Sender<Settlement>,
    ) {
        if self.state.active_turn.as_ref().map(|t| t.id.as_str()) != Some(turn_id.as_str()) {
            let _ = reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!("turn `{turn_id}` is not active"),
            ));
            return;
        }
        let mut actions = Vec::new();
        if find_tool(&self.state, &tool_call_id).is_none() {
            actions.push(StateAction::ChatToolCallStart(ChatToolCallStartAction {
                turn_id: turn_id.clone(),
                tool_call_id: tool_call_id.clone(),
                meta: None,
                tool_name: tool_name.clone(),
                display_name: tool_name.clone(),
                intention: None,
                contributor: None,
            }));
        }
        actions.push(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
            turn_id: turn_id.clone(),
            tool_call_id: tool_call_id.clone(),
            meta: None,
            contributor: None,
            intention: None,
            invocation_message: format!("Run `{tool_name}`").into(),
            tool_input: Some(ToolInput::Inline(input)),
            confirmation_title: Some(format!("Allow `{tool_name}`?").into()),
            risk_assessment: None,
            edits: None,
            editable: Some(editable),
            confirmed: auto.clone(),
            options: auto.is_none().then(tool_options),
        }));
        match auto {
            Some(reason) => {
                let why = match reason {
                    ToolCallConfirmationReason::NotNeeded => "read-only tool",
                    _ => "allowed by the session's approval policy",
                };
                let _ = reply.send(Settlement {
                    approved: Some(true),
                    reason: Some(why.into()),
                    ..Settlement::bare(Outcome::Approved)
                });
            }
            None => {
                self.tools
                    .insert(tool_call_id, PendingTool { turn_id, reply });
            }
        }
        self.host_actions(ctx, actions);
    }

    fn open_input(
        &mut self,
        ctx: &mut Context<Self>,
        turn_id: String,
        request: ChatInputRequest,
        auto_resolution_ms: Option<u64>,
        reply: oneshot::Sender<Settlement>,
    ) {
        if self.inputs.contains_key(&request.id) || find_input(&self.state, &request.id).is_some() {
            let _ = reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!(
                    "input request id `{}` is already used in this chat",
                    request.id
                ),
            ));
            return;
        }
        if let Some(Err(e)) = request.url.as_deref().map(link::check) {
            let _ = reply.send(Settlement::with_reason(Outcome::Aborted, e.to_string()));
            return;
        }
        let max = self.core.shared.config.limits.max_questions_per_request;
        let asked = request.questions.as_ref().map_or(0, Vec::len);
        if asked > max {
            let _ = reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!("{asked} questions in one request; the limit is {max}"),
            ));
            return;
        }
        let questions = asked.max(1) as u64;
        let id = request.id.clone();
        self.inputs.insert(
            id.clone(),
            PendingInput {
                turn_id,
                reply,
                engaged: false,
                forced: None,
                form_schema: None,
            },
        );
        self.host_actions(
            ctx,
            vec![StateAction::ChatInputRequested(ChatInputRequestedAction {
                request,
            })],
        );
        if let Some(ms) = auto_resolution_ms {
            let after = std::time::Duration::from_millis(ms.saturating_mul(questions));
            ctx.run_later(after, move |act, ctx| act.auto_resolve(ctx, id));
        }
    }

    /// A prompt nobody engaged with settles `timedOut`; on the wire the host
    /// completes it with `cancel`.
    fn auto_resolve(&mut self, ctx: &mut Context<Self>, request_id: String) {
        let Some(p) = self.inputs.get_mut(&request_id) else {
            return;
        };
        if p.engaged {
            return;
        }
        p.forced = Some(Settlement::with_reason(
            Outcome::TimedOut,
            "no answer activity before the auto-resolution time",
        ));
        self.host_actions(
            ctx,
            vec![StateAction::ChatInputCompleted(ChatInputCompletedAction {
                request_id,
                response: ChatInputResponseKind::Cancel,
                answers: None,
            })],
        );
    }
}

impl Actor for ChatActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if !std::mem::take(&mut self.crashed_turn) {
            return;
        }
        if let Some(t) = &self.state.active_turn {
            tracing::info!(chat = %self.core.uri, turn = %t.id, "ending a turn interrupted by a restart");
            let err = chat_error(
                &t.id,
                &t.started_at,
                "HostRestarted",
                "the server restarted while this turn was running",
            );
            self.host_actions(ctx, vec![err]);
        }
    }
}

impl Handler<ClientDispatch> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, ctx: &mut Self::Context) {
        let ClientDispatch {
            conn,
            origin,
            action,
            as_agent,
        } = msg;
        if as_agent {
            if let StateAction::ChatTurnStarted(_) = action {
                // The provider can also start turns like a client would.
            } else {
                self.agent_action(ctx, action, Some((origin, conn)), None);
                return;
            }
        }
        if let Some(e) = &self.core.store_failed {
            let reason = format!("the store is unavailable ({e}); the chat is read-only");
            self.core.reject(&conn, &origin, &action, &reason);
            return;
        }
        let checked = answer_lengths(&action, self.core.shared.config.limits.max_answer_chars)
            .and_then(|()| {
                validate::client_chat_action(
                    &self.state,
                    &action,
                    &origin.client_id,
                    &self.used_turn_ids,
                )
            })
            .and_then(|()| self.reduce(&action));
        if let Err(r) = checked {
            self.core.reject(&conn, &origin, &action, &r.0);
            return;
        }
        self.commit(ctx, vec![Accepted::new(action, Some((origin, conn)))], None);
    }
}

impl Handler<Subscribe> for ChatActor {
    type Result = Result<SnapshotJson, RpcError>;

    fn handle(&mut self, msg: Subscribe, _: &mut Self::Context) -> Self::Result {
        self.core.subscribe(&msg.conn, &self.state)
    }
}

/// `_meta` key by which an agent declares a tool call read-only.
pub const READ_ONLY_META: &str = "tandem/readOnly";

/// An action from the chat's agent (`chat/delta`, `chat/turnComplete`, …).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentAction {
    /// The action.
    pub action: StateAction,
    /// Answered once the action is published (or refused).
    pub reply: oneshot::Sender<Result<(), Rejection>>,
}

impl Handler<AgentAction> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: AgentAction, ctx: &mut Self::Context) {
        self.agent_action(ctx, msg.action, None, Some(msg.reply));
    }
}

impl ChatActor {
    /// An action from the chat's agent — in process, or dispatched by the
    /// session's provider connection (`origin` then gets the echo).
    fn agent_action(
        &mut self,
        ctx: &mut Context<Self>,
        action: StateAction,
        origin: Option<(ActionOrigin, Arc<Outbound>)>,
        done: Option<oneshot::Sender<Result<(), Rejection>>>,
    ) {
        let refuse = |act: &Self,
                      origin: &Option<(ActionOrigin, Arc<Outbound>)>,
                      done: Option<oneshot::Sender<Result<(), Rejection>>>,
                      action: &StateAction,
                      r: Rejection| {
            if let Some((o, c)) = origin {
                act.core.reject(c, o, action, &r.0);
            }
            if let Some(done) = done {
                let _ = done.send(Err(r));
            }
        };
        if let Some(e) = &self.core.store_failed {
            let r = Rejection::new(format!(
                "the store is unavailable ({e}); the chat is read-only"
            ));
            return refuse(self, &origin, done, &action, r);
        }
        if let StateAction::Unknown(raw) = &action {
            return refuse(
                self,
                &origin,
                done,
                &action,
                Rejection::new(validate::malformed_reason(raw)),
            );
        }
        // A person's decision is never an agent's to make, in process or over
        // a provider connection (which the connection refuses first).
        if crate::auth::is_persons_act(&action) {
            let r = Rejection::new(format!(
                "`{}` is a person's act: an agent may not send it",
                validate::action_type(&action)
            ));
            return refuse(self, &origin, done, &action, r);
        }
        if let StateAction::ChatInputRequested(r) = &action {
            if let Some(Err(e)) = r.request.url.as_deref().map(link::check) {
                return refuse(self, &origin, done, &action, Rejection::new(e.to_string()));
            }
        }
        // Default safety: an agent may not confirm a tool that changes data on
        // its own; only read-only tools, the session's mode or a grant can.
        if let StateAction::ChatToolCallReady(r) = &action {
            let read_only = r
                .meta
                .as_ref()
                .and_then(|m| m.get(READ_ONLY_META))
                .and_then(serde_json::Value::as_bool)
                == Some(true);
            if r.confirmed.is_some() && !read_only {
                let tool_name = tool_name_of(&self.state, &r.tool_call_id).unwrap_or_default();
                let check = self.session_addr.send(ApprovalCheckpoint { tool_name });
                let mut ready = r.clone();
                ctx.wait(check.into_actor(self).map(move |auto, act, ctx| {
                    match auto.ok().flatten() {
                        Some(reason) => ready.confirmed = Some(reason),
                        None => {
                            ready.confirmed = None;
                            ready.options.get_or_insert_with(tool_options);
                        }
                    }
                    act.agent_commit(ctx, StateAction::ChatToolCallReady(ready), origin, done);
                }));
                return;
            }
        }
        self.agent_commit(ctx, action, origin, done);
    }

    fn agent_commit(
        &mut self,
        ctx: &mut Context<Self>,
        action: StateAction,
        origin: Option<(ActionOrigin, Arc<Outbound>)>,
        done: Option<oneshot::Sender<Result<(), Rejection>>>,
    ) {
        match self.reduce(&action) {
            Ok(()) => self.commit(ctx, vec![Accepted::new(action, origin)], done),
            Err(r) => {
                if let Some((o, c)) = &origin {
                    self.core.reject(c, o, &action, &r.0);
                }
                if let Some(done) = done {
                    let _ = done.send(Err(r));
                }
            }
        }
    }
}

/// An agent waits for a person.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Interact {
    /// The turn the interaction belongs to (must be active).
    pub turn_id: String,
    /// What is asked.
    pub interaction: Interaction,
    /// Receives the settlement, exactly once.
    pub reply: oneshot::Sender<Settlement>,
}

impl Handler<Interact> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: Interact, ctx: &mut Self::Context) {
        if let Some(e) = &self.core.store_failed {
            let _ = msg.reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!("the store is unavailable ({e})"),
            ));
            return;
        }
        self.open_interaction(ctx, msg);
    }
}

/// One unsettled interaction, for `tandem/listPending`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingItem {
    /// `input` or `toolApproval`.
    pub kind: &'static str,
    /// The chat it waits in.
    pub chat: String,
    /// Its turn.
    pub turn_id: String,
    /// For an input request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For a tool approval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `serverSeq` of the envelope that opened it.
    pub server_seq: u64,
}

/// Everything unsettled in this chat.
#[derive(Message)]
#[rtype(result = "Vec<PendingItem>")]
pub struct GetPending;

impl Handler<GetPending> for ChatActor {
    type Result = MessageResult<GetPending>;

    fn handle(&mut self, _: GetPending, _: &mut Self::Context) -> Self::Result {
        let turn_id = self
            .state
            .active_turn
            .as_ref()
            .map(|t| t.id.clone())
            .unwrap_or_default();
        let items = rollup::open_items(&self.core.uri, &self.state)
            .into_iter()
            .filter_map(|i| {
                let seq = rollup::entry_id(&i).and_then(|id| self.opened.get(id)).copied().unwrap_or(0);
                match i {
                    SessionInputRequest::ChatInput(r) => Some(PendingItem {
                        kind: "input",
                        chat: r.chat,
                        turn_id: turn_id.clone(),
                        request_id: Some(r.request.id),
                        tool_call_id: None,
                        server_seq: seq,
                    }),
                    SessionInputRequest::ToolConfirmation(r) => Some(PendingItem {
                        kind: "toolApproval",
                        chat: r.chat,
                        turn_id: r.turn_id,
                        request_id: None,
                        tool_call_id: Some(match &r.tool_call {
                            ahp_types::state::ToolCallConfirmationState::PendingConfirmation(p) => p.tool_call_id.clone(),
                            ahp_types::state::ToolCallConfirmationState::PendingResultConfirmation(p) => p.tool_call_id.clone(),
                            ahp_types::state::ToolCallConfirmationState::Unknown(_) => return None,
                        }),
                        server_seq: seq,
                    }),
                    _ => None,
                }
            })
            .collect();
        MessageResult(items)
    }
}

/// A copy of the chat state (for tests and server-side reads).
#[derive(Message)]
#[rtype(result = "ChatState")]
pub struct GetChatState;

impl Handler<GetChatState> for ChatActor {
    type Result = MessageResult<GetChatState>;

    fn handle(&mut self, _: GetChatState, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.clone())
    }
}

/// `fetchTurns`: page older stored turns into the chat (for everyone) with
/// `chat/turnsLoaded`, answering once it is published.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FetchTurns {
    /// The cursor from `turnsNextCursor`; `None` loads the next page if any.
    pub cursor: Option<String>,
    /// Answered after the turns are in the state (or with the reason not).
    pub reply: oneshot::Sender<Result<(), RpcError>>,
}

impl Handler<FetchTurns> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: FetchTurns, ctx: &mut Self::Context) {
        let current = self.state.turns_next_cursor.clone();
        match (&msg.cursor, &current) {
            (None, None) => {
                let _ = msg.reply.send(Ok(()));
                return;
            }
            (Some(c), Some(cur)) if c == cur => {}
            (None, Some(_)) => {}
            (Some(c), _) => {
                let _ = msg.reply.send(Err(RpcError::invalid_params(format!(
                    "unrecognised turns cursor `{c}`"
                ))));
                return;
            }
        }
        let page = self.core.shared.config.turns_page;
        let loaded =
            match self
                .core
                .shared
                .journal
                .turns_before(&self.core.uri, self.turn_base, page)
            {
                Ok(t) => t,
                Err(e) => {
                    let _ = msg.reply.send(Err(RpcError::internal(format!(
                        "reading stored turns: {e}"
                    ))));
                    return;
                }
            };
        let turns: Result<Vec<ahp_types::state::Turn>, _> =
            loaded.iter().map(|t| serde_json::from_str(t)).collect();
        let turns = match turns {
            Ok(t) => t,
            Err(e) => {
                let _ = msg.reply.send(Err(RpcError::internal(format!(
                    "a stored turn does not decode: {e}"
                ))));
                return;
            }
        };
        let new_base = self.turn_base.saturating_sub(turns.len() as u64);
        let action = StateAction::ChatTurnsLoaded(ahp_types::actions::ChatTurnsLoadedAction {
            turns,
            turns_next_cursor: (new_base > 0).then(|| Self::cursor(new_base)),
        });
        if let Err(r) = self.reduce(&action) {
            let _ = msg.reply.send(Err(RpcError::internal(r.0)));
            return;
        }
        let (done, rx) = oneshot::channel();
        self.commit(ctx, vec![Accepted::new(action, None)], Some(done));
        let reply = msg.reply;
        actix::spawn(async move {
            let r = rx
                .await
                .unwrap_or_else(|_| Err(Rejection::new("the chat went away")));
            let _ = reply.send(r.map_err(|e| RpcError::internal(e.0)));
        });
    }
}

/// The chat is being disposed (by `disposeChat` or its session's disposal).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DisposeChat;

impl Handler<DisposeChat> for ChatActor {
    type Result = ();

    fn handle(&mut self, _: DisposeChat, ctx: &mut Self::Context) {
        self.abort_all("the chat was disposed");
        if let (Some(t), Some(agent)) = (
            &self.state.active_turn,
            self.core.shared.providers.get(&self.provider),
        ) {
            agent.cancel_turn(&self.core.uri, &t.id);
        }
        self.core.shared.registry.remove(&self.core.uri);
        self.core.shared.journal.remove(&self.core.uri);
        ctx.stop();
    }
}

/// Text answers and free-form values longer than `max` characters are refused.
fn answer_lengths(action: &StateAction, max: usize) -> Result<(), Rejection> {
    use ahp_types::state::{ChatInputAnswer as A, ChatInputAnswerValue as V};
    let answers: Vec<&A> = match action {
        StateAction::ChatInputAnswerChanged(a) => a.answer.iter().collect(),
        StateAction::ChatInputCompleted(a) => a.answers.iter().flat_map(|m| m.values()).collect(),
        _ => return Ok(()),
    };
    for a in answers {
        let texts: Vec<&str> = match a {
            A::Draft(x) | A::Submitted(x) => match &x.value {
                V::Text(t) => vec![t.value.as_str()],
                V::Selected(s) => s
                    .freeform_values
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                V::SelectedMany(s) => s
                    .freeform_values
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                _ => Vec::new(),
            },
            A::Skipped(s) => s
                .freeform_values
                .iter()
                .flatten()
                .map(String::as_str)
                .collect(),
        };
        if let Some(t) = texts.iter().find(|t| t.chars().count() > max) {
            return Err(Rejection::new(format!(
                "an answer of {} characters is over the limit of {max}",
                t.chars().count()
            )));
        }
    }
    Ok(())
}

/// The request of an input part in the active or a finished turn.
fn find_input<'a>(state: &'a ChatState, request_id: &str) -> Option<&'a ChatInputRequest> {
    state
        .active_turn
        .iter()
        .flat_map(|t| &t.response_parts)
        .chain(state.turns.iter().flat_map(|t| &t.response_parts))
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) if i.request.id == request_id => Some(&i.request),
            _ => None,
        })
}

/// The tool name of a call in the active turn.
fn tool_name_of(state: &ChatState, tool_call_id: &str) -> Option<String> {
    use ahp_types::state::ToolCallState as T;
    find_tool(state, tool_call_id).and_then(|p| match p {
        ResponsePart::ToolCall(tc) => Some(
            match &tc.tool_call {
                T::Streaming(s) => &s.tool_name,
                T::PendingConfirmation(s) => &s.tool_name,
                T::Running(s) => &s.tool_name,
                T::AuthRequired(s) => &s.tool_name,
                T::PendingResultConfirmation(s) => &s.tool_name,
                T::Completed(s) => &s.tool_name,
                T::Cancelled(s) => &s.tool_name,
                T::Unknown(_) => return None,
            }
            .clone(),
        ),
        _ => None,
    })
}

fn find_tool<'a>(state: &'a ChatState, tool_call_id: &str) -> Option<&'a ResponsePart> {
    state.active_turn.iter().flat_map(|t| &t.response_parts).find(|p| {
        matches!(p, ResponsePart::ToolCall(tc) if validate::tool_call_id_of(&tc.tool_call) == tool_call_id)
    })
}

/// A `chat/error` ending `turn_id` now.
pub fn chat_error(turn_id: &str, started_at: &str, error_type: &str, message: &str) -> StateAction {
    StateAction::ChatError(ChatErrorAction {
        turn_id: turn_id.to_owned(),
        duration: millis_since(started_at),
        part: ErrorResponsePart {
            error: ErrorInfo {
                error_type: error_type.to_owned(),
                message: message.to_owned(),
                stack: None,
                meta: None,
            },
            resumable: None,
        },
        meta: None,
    })
}

/// The state of a chat nobody has written to yet.
pub fn new_chat_state(uri: &str, title: String) -> ChatState {
    ChatState {
        resource: uri.to_owned(),
        title,
        status: SessionStatus::Idle.bits(),
        activity: None,
        modified_at: now_rfc3339(),
        changes: None,
        origin: None,
        movable: None,
        interactivity: None,
        working_directories: None,
        changesets: None,
        background_work: None,
        canvases: None,
        turns: Vec::new(),
        turns_next_cursor: None,
        active_turn: None,
        steering_message: None,
        queued_messages: None,
        draft: None,
        meta: None,
    }
}
