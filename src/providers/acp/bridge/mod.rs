//! The bridge of one Tandem session: a task that owns the session's agent
//! process, maps what the agent sends onto the chats' running turns, puts
//! its questions to people and sends back exactly one answer each, and ends
//! turns when the process exits or hangs.

mod asking;
mod sessions;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use agent_client_protocol::v1::schema::StopReason;
use ahp_types::actions::{ChatTurnCompleteAction, StateAction};
use dashmap::DashMap;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use self::asking::Answered;
use super::choices::Choices;
use super::conn::{Event, Process};
use super::map::{self, json_of, TurnMap};
use super::Cmd;
use crate::channels::agent::{AgentTurn, ChatHandle};
use crate::channels::chat::chat_error;
use crate::config::AgentSpec;
use crate::time::millis_since;

/// The note (session `_meta`, `tandem/agent` → chat → this key) that names
/// the chat's ACP session: `{"id": …}`.
pub const ACP_SESSION_NOTE: &str = "acpSession";

/// How often the bridge checks its deadlines: a failed prompt's end, and
/// an agent silent for longer than its idle timeout.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// A turn the agent is working on.
struct Turn {
    chat: String,
    handle: ChatHandle,
    map: TurnMap,
    /// People are being asked something: the agent waits, not hangs.
    asking: usize,
    cancelled: bool,
    /// The prompt failed without the process exiting (yet): the error, and
    /// when to report it if no exit comes to name a better cause.
    failed: Option<(String, Instant)>,
}

/// The bridge of one session: owns its process and turns.
pub(super) struct Bridge {
    spec: Arc<AgentSpec>,
    /// The agent's processes running now, over every session.
    alive: Arc<std::sync::atomic::AtomicUsize>,
    session: String,
    process: Option<Arc<Process>>,
    events: Option<mpsc::UnboundedReceiver<Event>>,
    decided_tx: mpsc::UnboundedSender<Answered>,
    /// The ACP session opened at `createSession`, not yet any chat's.
    spare: Option<String>,
    /// Chat → its ACP session.
    chats: HashMap<String, String>,
    /// ACP session → its running turn.
    turns: HashMap<String, Turn>,
    /// Chat → a handle from its latest turn, to keep what the agent says
    /// between turns.
    handles: HashMap<String, ChatHandle>,
    last_heard: Instant,
    /// Why the process was stopped, if the bridge stopped it.
    stopped_because: Option<String>,
    /// What each ACP session offers (modes, models).
    offered: HashMap<String, Choices>,
    /// What the session's ACP sessions offer lately, for the session
    /// config's choices (shared with the agent).
    choices: Arc<DashMap<String, Choices>>,
    /// Settings the agent refused (ACP session, property): noted until one
    /// is applied.
    refused: HashSet<(String, &'static str)>,
    /// What ACP sessions said before their first turn, by kind.
    early: HashMap<String, HashMap<String, Value>>,
}

impl Bridge {
    /// Start the bridge of `session`: its commands go to the sender.
    pub(super) fn start(
        spec: Arc<AgentSpec>,
        session: String,
        choices: Arc<DashMap<String, Choices>>,
        alive: Arc<std::sync::atomic::AtomicUsize>,
    ) -> mpsc::UnboundedSender<Cmd> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (decided_tx, decided_rx) = mpsc::unbounded_channel();
        let bridge = Bridge {
            spec,
            alive,
            session,
            process: None,
            events: None,
            decided_tx,
            spare: None,
            chats: HashMap::new(),
            turns: HashMap::new(),
            handles: HashMap::new(),
            last_heard: Instant::now(),
            stopped_because: None,
            offered: HashMap::new(),
            choices,
            refused: HashSet::new(),
            early: HashMap::new(),
        };
        tokio::spawn(bridge.run(rx, decided_rx));
        tx
    }

    async fn run(
        mut self,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        mut decided: mpsc::UnboundedReceiver<Answered>,
    ) {
        // The clock for the bridge's deadlines (a turn's idle time, an
        // answer's wait): one interval, so a steady stream of events does
        // not keep putting the check off.
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = async {
                match self.events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => self.command(cmd).await,
                    None => break,
                },
                Some(a) = decided.recv() => match a {
                    Answered::Permission(d) => self.decided(*d).await,
                    Answered::Elicitation { acp_session } => self.asked_done(&acp_session),
                },
                ev = event => match ev {
                    Some(ev) => {
                        self.last_heard = Instant::now();
                        self.event(ev).await;
                    }
                    None => self.events = None,
                },
                _ = tick.tick() => self.check_time().await,
            }
        }
        if let Some(p) = self.process.take() {
            p.stop();
        }
        tracing::debug!(session = %self.session, "agent bridge stopped");
    }

    async fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Open(reply) => {
                let opened = self.open().await;
                if let Ok(id) = &opened {
                    self.spare = Some(id.clone());
                }
                let _ = reply.send(opened.map(|_| ()));
            }
            Cmd::Turn(turn) => self.start_turn(*turn).await,
            Cmd::Cancel { chat, turn_id } => {
                let Some(acp) = self.chats.get(&chat).cloned() else {
                    return;
                };
                if let Some(t) = self.turns.get_mut(&acp) {
                    if t.handle.turn_id == turn_id {
                        t.cancelled = true;
                        if let Some(p) = &self.process {
                            p.cancel(&acp);
                        }
                    }
                }
            }
            Cmd::Ended { chat, turn_id } => {
                if let Some(acp) = self.chats.get(&chat) {
                    if self
                        .turns
                        .get(acp)
                        .is_some_and(|t| t.handle.turn_id == turn_id && !t.cancelled)
                    {
                        self.turns.remove(acp);
                    }
                }
            }
        }
    }

    async fn start_turn(&mut self, turn: AgentTurn) {
        let chat = turn.handle.chat.to_string();
        let handle = turn.handle;
        let opened = match self.session_for(&chat, &handle).await {
            Ok(acp) => match &self.process {
                Some(p) => Ok((acp, p.clone())),
                None => Err("the agent process is gone".to_owned()),
            },
            Err(e) => Err(e),
        };
        let (acp, process) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                let err = chat_error(
                    &handle.turn_id,
                    &handle.started_at,
                    "AgentUnavailable",
                    &format!("agent `{}` could not start: {e}", self.spec.name),
                );
                let _ = handle.emit(err).await;
                return;
            }
        };
        self.chats.insert(chat.clone(), acp.clone());
        self.handles.insert(chat.clone(), handle.clone());
        for (key, value) in self.early.remove(&acp).unwrap_or_default() {
            handle.note(key, value);
        }
        self.apply_config(&acp, &process, &handle).await;
        self.last_heard = Instant::now();
        if let Err(e) = process.prompt(&acp, turn.message.text, handle.turn_id.clone()) {
            let err = chat_error(&handle.turn_id, &handle.started_at, "AgentUnavailable", &e);
            let _ = handle.emit(err).await;
            return;
        }
        self.turns.insert(
            acp,
            Turn {
                chat,
                map: TurnMap::new(handle.turn_id.clone()),
                handle,
                asking: 0,
                cancelled: false,
                failed: None,
            },
        );
    }

    async fn event(&mut self, ev: Event) {
        match ev {
            Event::Update(n) => {
                let acp = n.session_id.to_string();
                if let Some(offered) = self.offered.get_mut(&acp) {
                    if offered.update(&n.update) {
                        self.choices.insert(self.session.clone(), offered.clone());
                    }
                }
                let Some(turn) = self.turns.get_mut(&acp) else {
                    // Between turns: keep what it says about the chat.
                    self.note_outside_turn(&acp, &n.update);
                    return;
                };
                let mapped = turn.map.update(&n.update);
                for note in mapped.notes {
                    turn.handle.note(note.key, note.value);
                }
                emit_all(&turn.handle, mapped.actions).await;
            }
            Event::Permission(request, responder) => self.permission(request, responder).await,
            Event::Loaded { session, result } => {
                // Its turn was given up waiting for it.
                tracing::debug!(acp_session = %session, ?result, "late session/load answer");
            }
            Event::Elicitation(request, responder) => self.elicitation(request, responder),
            Event::PromptDone {
                session,
                tag,
                result,
            } => self.prompt_done(session, tag, result).await,
            Event::Exited(cause) => {
                let cause = match self.stopped_because.take() {
                    Some(why) => format!("{why} ({cause})"),
                    None => cause,
                };
                tracing::warn!(agent = %self.spec.name, session = %self.session, %cause, "agent process gone");
                self.process = None;
                self.events = None;
                self.spare = None;
                self.chats.clear();
                self.early.clear();
                self.offered.clear();
                for (_, turn) in self.turns.drain() {
                    let h = &turn.handle;
                    let err = chat_error(&h.turn_id, &h.started_at, "AgentExited", &cause);
                    let _ = h.emit(err).await;
                }
            }
        }
    }

    fn chat_of(&self, acp: &str) -> Option<String> {
        self.chats
            .iter()
            .find(|(_, a)| a.as_str() == acp)
            .map(|(c, _)| c.clone())
    }

    /// Between turns nothing can be added to the chat: everything the
    /// agent says goes to the session's `_meta`, whole. Before the ACP
    /// session's first turn no chat is known yet: the latest update of each
    /// kind is kept and noted when the first turn names the chat.
    fn note_outside_turn(
        &mut self,
        acp: &str,
        update: &agent_client_protocol::v1::schema::SessionUpdate,
    ) {
        let note = map::note_of(update);
        match self.chat_of(acp).and_then(|c| self.handles.get(&c)) {
            Some(h) => h.note(note.key, note.value),
            None => {
                self.early
                    .entry(acp.to_owned())
                    .or_default()
                    .insert(note.key, note.value);
            }
        }
    }

    async fn prompt_done(
        &mut self,
        acp: String,
        tag: String,
        result: Result<agent_client_protocol::v1::schema::PromptResponse, String>,
    ) {
        let Some(turn) = self.turns.get_mut(&acp) else {
            return;
        };
        if turn.handle.turn_id != tag {
            return;
        }
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                // Perhaps the process is dying: its exit names the cause
                // better, so give it a moment.
                turn.failed = Some((e, Instant::now() + std::time::Duration::from_secs(1)));
                return;
            }
        };
        let Some(turn) = self.turns.remove(&acp) else {
            return;
        };
        let h = &turn.handle;
        let stop = json_of(&response.stop_reason);
        let action = match response.stop_reason {
            StopReason::Refusal => chat_error(
                &h.turn_id,
                &h.started_at,
                "Refusal",
                "the agent refused to continue",
            ),
            StopReason::Cancelled if turn.cancelled => return,
            _ => StateAction::ChatTurnComplete(ChatTurnCompleteAction {
                turn_id: h.turn_id.clone(),
                duration: millis_since(&h.started_at),
                meta: Some(Map::from_iter([("tandem/stopReason".to_owned(), stop)])),
            }),
        };
        if let Err(r) = h.emit(action).await {
            tracing::debug!(chat = %turn.chat, reason = %r, "turn end not published");
        }
    }

    /// Report prompt failures that no exit explained, and stop a process
    /// that went silent mid-turn while nobody was being asked anything.
    async fn check_time(&mut self) {
        let now = Instant::now();
        let failed: Vec<String> = self
            .turns
            .iter()
            .filter(|(_, t)| t.failed.as_ref().is_some_and(|(_, at)| *at <= now))
            .map(|(acp, _)| acp.clone())
            .collect();
        for acp in failed {
            if let Some(turn) = self.turns.remove(&acp) {
                let h = &turn.handle;
                let e = turn.failed.map(|(e, _)| e).unwrap_or_default();
                let err = chat_error(
                    &h.turn_id,
                    &h.started_at,
                    "AgentError",
                    &format!("the agent failed the prompt: {e}"),
                );
                let _ = h.emit(err).await;
            }
        }
        let waiting = self
            .turns
            .values()
            .any(|t| t.asking == 0 && t.failed.is_none());
        let idle = self.spec.idle_timeout();
        if waiting && self.stopped_because.is_none() && now.duration_since(self.last_heard) > idle {
            if let Some(p) = &self.process {
                self.stopped_because = Some(format!(
                    "the agent did not answer for {} s and was stopped",
                    idle.as_secs()
                ));
                p.stop();
            }
        }
    }
}

/// Emit mapped actions in order; a tool call the agent runs on its own is
/// reported, not held for approval.
async fn emit_all(handle: &ChatHandle, actions: Vec<StateAction>) {
    for action in actions {
        let sent = match &action {
            StateAction::ChatToolCallReady(_) => handle.report(action).await,
            _ => handle.emit(action).await,
        };
        if let Err(r) = sent {
            tracing::debug!(chat = %handle.chat, reason = %r, "agent update not published");
        }
    }
}
