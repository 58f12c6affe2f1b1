//! Opening interactions for an agent: an input request, a form, a URL or a
//! tool approval becomes AHP parts in the active turn, and the agent's reply
//! channel waits in the actor until the interaction settles.

use actix::prelude::*;
use ahp_types::actions::{
    ChatInputCompletedAction, ChatInputRequestedAction, ChatToolCallConfirmedAction,
    ChatToolCallReadyAction, ChatToolCallStartAction, StateAction,
};
use ahp_types::state::{
    ChatInputRequest, ChatInputResponseKind, ToolCallConfirmationReason, ToolInput,
};
use tokio::sync::oneshot;

use super::{find_input, find_tool, ChatActor, PendingInput, PendingTool};
use crate::channels::commit::ChannelActor;
use crate::channels::session::ApprovalCheckpoint;
use crate::interactions::policy::Auto;
use crate::interactions::{
    confirmation_options, form, link, policy, tool_options, Interaction, Outcome, Settlement,
    ToolOption,
};

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
        self.ensure_warm(ctx);
        if let Some(e) = self.core.store_refusal() {
            let _ = msg.reply.send(Settlement::with_reason(
                Outcome::Aborted,
                format!("the store is unavailable ({e})"),
            ));
            return;
        }
        self.open_interaction(ctx, msg);
    }
}

/// A tool approval an agent asked for, on its way to becoming parts of the
/// active turn (after the session's approval checkpoint, if it needs one).
struct ToolAsk {
    turn_id: String,
    tool_call_id: String,
    tool_name: String,
    input: String,
    editable: bool,
    /// The agent's own options, if it brought them.
    options: Option<Vec<ToolOption>>,
    /// The call in the agent's words, if it gave them.
    title: Option<String>,
    reply: oneshot::Sender<Settlement>,
}

impl ChatActor {
    /// `reply` back when `turn_id` is the active turn; otherwise the
    /// interaction cannot be opened and is settled `aborted` here.
    fn on_active_turn(
        &self,
        turn_id: &str,
        reply: oneshot::Sender<Settlement>,
    ) -> Option<oneshot::Sender<Settlement>> {
        if self.state.active_turn.as_ref().map(|t| t.id.as_str()) == Some(turn_id) {
            return Some(reply);
        }
        let reason = format!("turn `{turn_id}` is not active");
        let _ = reply.send(Settlement::with_reason(Outcome::Aborted, reason));
        None
    }

    fn open_interaction(&mut self, ctx: &mut Context<Self>, msg: Interact) {
        let Interact {
            turn_id,
            interaction,
            reply,
        } = msg;
        let Some(reply) = self.on_active_turn(&turn_id, reply) else {
            return;
        };
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
                options,
                title,
            } => {
                let ask = ToolAsk {
                    turn_id,
                    tool_call_id,
                    tool_name,
                    input,
                    editable,
                    options,
                    title,
                    reply,
                };
                if !policy::needs_approval(read_only) {
                    let auto = Auto::Approve(ToolCallConfirmationReason::NotNeeded);
                    return self.open_tool(ctx, ask, auto);
                }
                // The approval checkpoint: the session's policy as of now.
                let check = self.session_addr.send(ApprovalCheckpoint {
                    tool_name: ask.tool_name.clone(),
                });
                ctx.wait(
                    check.into_actor(self).map(move |auto, act, ctx| {
                        act.open_tool(ctx, ask, auto.unwrap_or(Auto::Ask))
                    }),
                );
            }
        }
    }

    /// Put a tool call up for confirmation, or decide it by `auto`.
    fn open_tool(&mut self, ctx: &mut Context<Self>, ask: ToolAsk, auto: Auto) {
        let Some(reply) = self.on_active_turn(&ask.turn_id, ask.reply) else {
            return;
        };
        let (turn_id, tool_call_id, tool_name) = (ask.turn_id, ask.tool_call_id, ask.tool_name);
        let mut actions = Vec::new();
        if find_tool(&self.state, &tool_call_id).is_none() {
            actions.push(StateAction::ChatToolCallStart(ChatToolCallStartAction {
                turn_id: turn_id.clone(),
                tool_call_id: tool_call_id.clone(),
                meta: None,
                tool_name: tool_name.clone(),
                display_name: ask.title.clone().unwrap_or_else(|| tool_name.clone()),
                intention: None,
                contributor: None,
            }));
        }
        let (invocation, confirmation) = match &ask.title {
            Some(title) => (title.clone(), format!("Allow “{title}”?")),
            None => (
                format!("Run `{tool_name}`"),
                format!("Allow `{tool_name}`?"),
            ),
        };
        let confirmed = match &auto {
            Auto::Approve(reason) => Some(reason.clone()),
            Auto::Ask | Auto::Deny => None,
        };
        let offered = match &ask.options {
            Some(o) => confirmation_options(o),
            None => tool_options(),
        };
        actions.push(StateAction::ChatToolCallReady(ChatToolCallReadyAction {
            turn_id: turn_id.clone(),
            tool_call_id: tool_call_id.clone(),
            meta: None,
            contributor: None,
            intention: None,
            invocation_message: invocation.into(),
            tool_input: Some(ToolInput::Inline(ask.input)),
            confirmation_title: Some(confirmation.into()),
            risk_assessment: None,
            edits: None,
            editable: Some(ask.editable),
            confirmed: confirmed.clone(),
            options: confirmed.is_none().then_some(offered),
        }));
        match auto {
            Auto::Approve(reason) => {
                let _ = reply.send(Settlement {
                    approved: Some(true),
                    reason: Some(policy::auto_reason(&reason).into()),
                    ..Settlement::bare(Outcome::Approved)
                });
            }
            Auto::Deny => {
                // Refused by the session's denial of this tool: shown as a
                // denial every client sees, decided by the host.
                let reason = format!("`{tool_name}` is refused for this session");
                actions.push(StateAction::ChatToolCallConfirmed(
                    ChatToolCallConfirmedAction {
                        turn_id: turn_id.clone(),
                        tool_call_id: tool_call_id.clone(),
                        meta: None,
                        approved: false,
                        confirmed: None,
                        reason: None,
                        edited_tool_input: None,
                        user_suggestion: None,
                        reason_message: Some(reason.clone().into()),
                        selected_option_id: None,
                    },
                ));
                let _ = reply.send(Settlement {
                    approved: Some(false),
                    reason: Some(reason),
                    ..Settlement::bare(Outcome::Denied)
                });
            }
            Auto::Ask => {
                let always = ask
                    .options
                    .iter()
                    .flatten()
                    .filter(|o| o.kind.always())
                    .map(|o| (o.id.clone(), o.kind.allows()))
                    .collect();
                self.tools.insert(
                    tool_call_id,
                    PendingTool {
                        turn_id,
                        reply,
                        always,
                    },
                );
            }
        }
        self.host_actions(ctx, actions, None);
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
            None,
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
            None,
        );
    }
}
