//! What an agent may send into its chat: never a person's decision, no
//! unsafe link, and no confirmation of a tool that changes data unless the
//! session's policy allows it (the default safety rule).

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::state::ResponsePart;
use tokio::sync::oneshot;

use super::{tool_name_of, ChatActor};
use crate::channels::commit::ChannelActor;
use crate::channels::core::Accepted;
use crate::channels::session::ApprovalCheckpoint;
use crate::channels::validate::{self, Rejection};
use crate::channels::Dispatcher;
use crate::interactions::policy::Auto;
use crate::interactions::{link, policy, tool_options};
use crate::people::ACT_META;

/// `_meta` key by which an agent declares a tool call read-only.
pub const READ_ONLY_META: &str = "tandem/readOnly";

/// An action from the chat's agent (`chat/delta`, `chat/turnComplete`, …).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentAction {
    /// The action.
    pub action: StateAction,
    /// A tool call the agent process runs on its own decision (an ACP agent
    /// that did not ask): its `chat/toolCallReady` reports what happens and
    /// is not held at the approval checkpoint, which is for confirmations
    /// the host gives. Only in-process agents can say this.
    pub reported: bool,
    /// Answered once the action is published (or refused).
    pub reply: oneshot::Sender<Result<(), Rejection>>,
}

impl Handler<AgentAction> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: AgentAction, ctx: &mut Self::Context) {
        if msg.reported && matches!(msg.action, StateAction::ChatToolCallReady(_)) {
            return self.agent_commit(ctx, msg.action, None, Some(msg.reply));
        }
        self.agent_action(ctx, msg.action, None, Some(msg.reply));
    }
}

impl ChatActor {
    /// An action from the chat's agent — in process, or dispatched by the
    /// session's provider connection (`origin` then gets the echo).
    pub(super) fn agent_action(
        &mut self,
        ctx: &mut Context<Self>,
        action: StateAction,
        origin: Option<(ActionOrigin, Dispatcher)>,
        done: Option<oneshot::Sender<Result<(), Rejection>>>,
    ) {
        let refuse = |act: &Self,
                      origin: &Option<(ActionOrigin, Dispatcher)>,
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
        if let Some(e) = self.core.store_refusal() {
            let r = Rejection::new(format!(
                "the store is unavailable ({e}); the chat is read-only"
            ));
            self.end_turn_once_store_answers(ctx);
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
        // Who did what is the host's to say: an agent's notification may
        // not pass for a person's act.
        if let StateAction::ChatResponsePart(p) = &action {
            if let ResponsePart::SystemNotification(n) = &p.part {
                if n.meta.as_ref().is_some_and(|m| m.contains_key(ACT_META)) {
                    let r = Rejection::new(format!(
                        "`_meta[\"{ACT_META}\"]` records a person's act: only the host writes it"
                    ));
                    return refuse(self, &origin, done, &action, r);
                }
            }
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
            if policy::agent_confirmation_checked(r.confirmed.is_some(), read_only) {
                let tool_name = tool_name_of(&self.state, &r.tool_call_id).unwrap_or_default();
                let check = self.session_addr.send(ApprovalCheckpoint { tool_name });
                let mut ready = r.clone();
                ctx.wait(check.into_actor(self).map(move |auto, act, ctx| {
                    match auto.unwrap_or(Auto::Ask) {
                        Auto::Approve(reason) => ready.confirmed = Some(reason),
                        // A denied tool is put to a person too: the host
                        // refuses only what it is asked to confirm.
                        Auto::Ask | Auto::Deny => {
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
        origin: Option<(ActionOrigin, Dispatcher)>,
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
