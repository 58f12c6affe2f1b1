//! The chat actor: owner of one `ChatState`, its active turn, and every
//! interaction open in it.
//!
//! Actions are handled one at a time. While a batch is in the journal the actor
//! waits (`ctx.wait`), so the state a `subscribe` snapshots always equals what
//! has been published — a snapshot never contains an action its subscriber
//! will also receive.
//!
//! The actor's jobs, one file each: this file holds the actor, its client
//! dispatches and its commit hooks; [`effects`] what a published action does
//! (agent turns, settlements, the session roll-up); [`interactions`] opening
//! interactions for agents; [`agent_rules`] what an agent may send;
//! [`history`] turn history (`fetchTurns`, truncation) and disposal;
//! [`pending`] `tandem/listPending`; [`handle`] the agents' client API;
//! [`texts`] several people typing in one text (`tandem/openText`,
//! `tandem/editText`).

mod agent_rules;
mod counting;
mod effects;
mod handle;
mod history;
mod interactions;
mod interest;
mod pending;
mod people;
#[cfg(test)]
mod tests;
mod texts;

pub use agent_rules::AgentAction;
pub use handle::ChatHandle;
pub use history::{DisposeChat, FetchTurns};
pub use interactions::Interact;
pub use pending::{GetPending, PendingItem};
pub use texts::{text_marks, EditText, OpenText, TextState, TextTarget};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{ChatErrorAction, StateAction};
use ahp_types::state::{
    ChatInputRequest, ChatState, ErrorInfo, ErrorResponsePart, ResponsePart, SessionInputRequest,
    SessionStatus,
};
use tokio::sync::oneshot;

use super::commit::{self, ChannelActor};
use super::core::{Accepted, ChannelCore, Shared};
use super::following::Following;
use super::recovery::{self, Rebuilt};
use super::registry::{Channel, ChannelAddr};
use super::rollup;
use super::session::SessionActor;
use super::validate::{self, Rejection};
use super::ClientDispatch;
use crate::coedit::TextDoc;
use crate::ids::{ChannelUri, ServerSeq};
use crate::interactions::{policy, Outcome, Settlement};
use crate::metrics::InteractionKind;
use crate::publish::Hub;
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
    /// The agent's options that decide later calls too: option id → whether
    /// it allows (a grant) or refuses (a denial).
    always: Vec<(String, bool)>,
}

impl PendingTool {
    /// What choosing `option` records for the session: `Some(true)` a grant,
    /// `Some(false)` a denial.
    fn records(&self, approved: bool, option: Option<&str>) -> Option<bool> {
        let option = option?;
        match self.always.iter().find(|(id, _)| id == option) {
            Some((_, allows)) => Some(*allows),
            None => policy::grants_for_session(approved, Some(option)).then_some(true),
        }
    }
}

/// One chat channel.
pub struct ChatActor {
    core: ChannelCore,
    session: ChannelUri,
    session_addr: Addr<SessionActor>,
    /// Provider id of the owning session.
    provider: String,
    state: ChatState,
    /// Every turn id ever started here (a reused id is rejected).
    used_turn_ids: HashSet<String>,
    inputs: HashMap<String, PendingInput>,
    tools: HashMap<String, PendingTool>,
    /// Who last wrote each answer of an open request (request id →
    /// question id → name), for the notification of its completion.
    answer_authors: HashMap<String, std::collections::BTreeMap<String, String>>,
    /// Who settled a request (input request or tool call id → their name),
    /// until the notifier is told.
    settled_by: HashMap<String, String>,
    /// Who decided each tool call just confirmed, until its effects (a
    /// session grant) have run.
    deciders: HashMap<String, crate::people::Person>,
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
    /// The running turn whose agent lost an update to the store (refused
    /// while the store was unavailable, or rolled back): ended with
    /// `chat/error` once the store takes writes again.
    turn_lost_to_store: Option<String>,
    /// `serverSeq` of the envelope that opened each roll-up entry.
    opened: HashMap<String, ServerSeq>,
    /// The texts people edit together ([`texts`]).
    texts: HashMap<TextTarget, TextDoc>,
    /// Requests for a person open now, for the metrics: kind and when it
    /// was opened ([`counting`]).
    asked: HashMap<String, (InteractionKind, std::time::Instant)>,
}

/// Where a chat lives: its channel, its session and the session's agent.
pub struct ChatHome {
    /// The chat's URI.
    pub uri: ChannelUri,
    /// Server context.
    pub shared: Arc<Shared>,
    /// The owning session's URI.
    pub session: ChannelUri,
    /// The owning session's actor (the roll-up and the catalog go there).
    pub session_addr: Addr<SessionActor>,
    /// Provider id of the owning session.
    pub provider: String,
    /// The thread the chat runs on.
    pub arbiter: ArbiterHandle,
}

impl ChatHome {
    /// Start the chat's actor, built by `make` (with the channel's new hub)
    /// on its arbiter, and register the channel.
    pub fn start(
        self,
        make: impl FnOnce(ChatHome, Arc<Hub>) -> ChatActor + Send + 'static,
    ) -> Addr<ChatActor> {
        let shared = self.shared.clone();
        let hub = Arc::new(Hub::default());
        let (uri, session) = (self.uri.clone(), self.session.clone());
        let provider = self.provider.as_str().into();
        let h = hub.clone();
        let arbiter = self.arbiter.clone();
        let addr = ChatActor::start_in_arbiter(&arbiter, move |_| make(self, h));
        shared.registry.insert(Channel {
            uri,
            hub,
            addr: ChannelAddr::Chat(addr.clone()),
            session: Some(session),
            provider: Some(provider),
        });
        addr
    }
}

impl ChatActor {
    /// A new, empty chat.
    pub fn new(home: ChatHome, hub: Arc<Hub>, title: String) -> Self {
        let state = new_chat_state(&home.uri, title);
        Self::recovered(home, hub, state, 0)
    }

    /// A chat rebuilt from the store. A turn that was running when the server
    /// stopped ends with `chat/error` as soon as the actor starts.
    pub fn recovered(home: ChatHome, hub: Arc<Hub>, state: ChatState, turn_base: u64) -> Self {
        let ChatHome {
            uri,
            shared,
            session,
            session_addr,
            provider,
            arbiter: _,
        } = home;
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
            turn_lost_to_store: None,
            core: ChannelCore::new(uri, hub, shared),
            session,
            session_addr,
            provider,
            state,
            used_turn_ids,
            inputs: HashMap::new(),
            tools: HashMap::new(),
            answer_authors: HashMap::new(),
            settled_by: HashMap::new(),
            deciders: HashMap::new(),
            turn_base,
            pending_turns: Vec::new(),
            pending_truncate: None,
            opened: HashMap::new(),
            texts: HashMap::new(),
            asked: HashMap::new(),
        }
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
}

impl ChatActor {
    /// End the active turn that a restart or a lost node interrupted with
    /// `chat/error` (its agent is gone, and with it whatever it waited for).
    fn end_interrupted_turn(&mut self, ctx: &mut Context<Self>, code: &str, message: &str) {
        if let Some(t) = &self.state.active_turn {
            tracing::info!(chat = %self.core.uri, turn = %t.id, code, "ending an interrupted turn");
            let err = chat_error(&t.id, &t.started_at, code, message);
            self.host_actions(ctx, vec![err], None);
        }
    }
}

impl ChatActor {
    /// The store refused (or rolled back) an update of the running turn, so
    /// the agent that ran it has stopped or carries on without what it
    /// lost: once writes are taken again the turn ends with `chat/error`
    /// instead of staying active with nobody to finish it.
    pub(super) fn end_turn_once_store_answers(&mut self, ctx: &mut Context<Self>) {
        let Some(turn) = self.state.active_turn.as_ref().map(|t| t.id.clone()) else {
            return;
        };
        if self.turn_lost_to_store.replace(turn).is_none() {
            self.watch_store(ctx);
        }
    }

    fn watch_store(&mut self, ctx: &mut Context<Self>) {
        ctx.run_later(commit::STORE_RETRY, |act, ctx| {
            if act.core.follower {
                // Its owner (now another node) ends it.
                act.turn_lost_to_store = None;
                return;
            }
            if act.core.store_refusal().is_some() || act.core.unreadable.is_some() {
                return act.watch_store(ctx);
            }
            let Some(lost) = act.turn_lost_to_store.take() else {
                return;
            };
            if act.state.active_turn.as_ref().is_some_and(|t| t.id == lost) {
                act.end_interrupted_turn(
                    ctx,
                    "StoreUnavailable",
                    "the store was unavailable while this turn ran: the agent's updates could not be kept",
                );
            }
        });
    }
}

impl ChannelActor for ChatActor {
    type State = ChatState;

    fn parts(&mut self) -> (&mut ChannelCore, &mut ChatState) {
        (&mut self.core, &mut self.state)
    }

    fn snapshot_json(&mut self) -> Option<String> {
        self.snapshot_with_texts()
    }

    fn reduce(&mut self, action: &StateAction) -> Result<(), Rejection> {
        if texts::is_text_edited(action) {
            // For editors only: the standard action before it changed the
            // state.
            return Ok(());
        }
        let turns_before = self.state.turns.len();
        super::reduce::reduce(&mut self.state, action)?;
        if let StateAction::ChatTurnStarted(a) = action {
            self.used_turn_ids.insert(a.turn_id.clone());
        }
        self.track_history(action, turns_before);
        Ok(())
    }

    fn take_history(&mut self) -> (Vec<TurnRecord>, Option<u64>) {
        (
            std::mem::take(&mut self.pending_turns),
            self.pending_truncate.take(),
        )
    }

    fn published(&mut self, ctx: &mut Context<Self>, batch: Vec<(Accepted, ServerSeq)>) {
        for (a, seq) in &batch {
            self.note_opened(&a.action, *seq);
        }
        // A tool call the host refused in the same batch that showed it
        // (a session's denial of the tool) never waited for a person.
        let decided: Vec<String> = batch
            .iter()
            .filter(|(a, _)| a.origin.is_none())
            .filter_map(|(a, _)| match &a.action {
                StateAction::ChatToolCallConfirmed(c) => Some(c.tool_call_id.clone()),
                _ => None,
            })
            .collect();
        for (a, _) in batch {
            self.count_interactions(&a.action, &decided);
            self.texts_after_publish(ctx, &a.action, a.origin.is_some());
            self.after_publish(ctx, a.action);
        }
        self.report_to_session();
    }

    fn warm(&mut self, ctx: &mut Context<Self>) {
        self.ensure_warm(ctx);
    }

    fn promoted(&mut self, ctx: &mut Context<Self>) {
        self.texts_promoted();
        self.crashed_turn = false;
        self.reported_status = self.state.status;
        self.rollup = rollup::open_items(&self.core.uri, &self.state);
        self.end_interrupted_turn(
            ctx,
            "HostNodeLost",
            "the cluster node running this turn went away; another node took the chat over",
        );
    }

    /// Back to what the store holds, and every open interaction settled —
    /// the chat takes no more writes.
    fn roll_back(&mut self, ctx: &mut Context<Self>) {
        self.pending_turns.clear();
        // What waited is read again from the store, or is another node's
        // to count now (a demoted chat).
        if !self.asked.is_empty() {
            self.asked.clear();
            self.core.shared.metrics.waiting_chat_gone(&self.core.uri);
        }
        // Editors re-base on the text the store holds.
        self.texts.clear();
        self.pending_truncate = None;
        match recovery::reload(&self.core) {
            Ok(Some(Rebuilt::Chat(state, base))) => {
                self.state = *state;
                self.turn_base = base;
            }
            Ok(Some(_)) => tracing::error!(chat = %self.core.uri, "stored channel is not a chat"),
            Ok(None) => self.state = new_chat_state(&self.core.uri, self.state.title.clone()),
            Err(e) => {
                tracing::error!(chat = %self.core.uri, error = %e, "cannot roll back");
                self.core.unreadable = Some(e);
            }
        }
        self.abort_all("the store is unavailable");
        if !self.core.follower {
            self.end_turn_once_store_answers(ctx);
        }
    }
}

impl Actor for ChatActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.watch_interest(ctx);
        // A follower's turn is its owner's to end.
        if self.core.follower || !std::mem::take(&mut self.crashed_turn) {
            return;
        }
        self.end_interrupted_turn(
            ctx,
            "HostRestarted",
            "the server restarted while this turn was running",
        );
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // Disposed: nothing of it waits for anyone any more.
        if !self.asked.is_empty() {
            self.core.shared.metrics.waiting_chat_gone(&self.core.uri);
            for id in self.asked.keys() {
                self.core.shared.notify.settled(crate::notify::Settle {
                    chat: self.core.uri.to_string(),
                    id: id.clone(),
                    outcome: crate::metrics::Settled::Abandoned,
                    by: None,
                });
            }
        }
    }
}

impl Handler<ClientDispatch> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, ctx: &mut Self::Context) {
        self.ensure_warm(ctx);
        if self.core.follower {
            return self.forward(ctx, msg);
        }
        if matches!(msg.action, StateAction::ChatTurnStarted(_))
            && self
                .core
                .shared
                .draining
                .load(std::sync::atomic::Ordering::Acquire)
        {
            // Its session goes to another node once the running turn ends:
            // a new one would hold it here, or be cut short.
            return self.core.reject(
                &msg.conn,
                &msg.origin,
                &msg.action,
                "the node running this chat is stopping and hands it to another node; start the turn again in a moment",
            );
        }
        // The provider can also start turns like a client would; its other
        // actions are checked as an agent's.
        if msg.as_agent && !matches!(msg.action, StateAction::ChatTurnStarted(_)) {
            let ClientDispatch {
                conn,
                origin,
                action,
                ..
            } = msg;
            return self.agent_action(ctx, action, Some((origin, conn)), None);
        }
        self.client_action(ctx, msg, |act, action, origin, by| {
            let shared = &act.core.shared;
            let max_answer_chars = shared.config.limits.max_answer_chars;
            let default = shared.config.session_access;
            shared
                .access
                .permit_action(&act.session, by, default, action)
                .and_then(|()| validate::answer_lengths(action, max_answer_chars))
                .and_then(|()| {
                    let used = &act.used_turn_ids;
                    validate::client_chat_action(&act.state, action, &origin.client_id, used)
                })
                .and_then(|()| act.record_person(action, by))
        });
    }
}

commit::channel_reads!(ChatActor, GetChatState, ChatState);

impl Handler<super::Busy> for ChatActor {
    type Result = bool;

    fn handle(&mut self, _: super::Busy, _: &mut Self::Context) -> bool {
        !self.core.cold && self.state.active_turn.is_some()
    }
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
