//! ACP agents behind Tandem: the bridge between an AHP session, which many
//! clients share, and an agent program that speaks the Agent Client Protocol
//! to one client over stdio.
//!
//! One agent process serves one Tandem session; each of the session's chats
//! is one ACP session in it. `createSession` starts the process, initializes
//! it and opens the first ACP session (a failure answers `createSession`);
//! every turn is a `session/prompt`, whose `session/update`s are mapped onto
//! the chat ([`map`]) and whose permission requests become tool approvals
//! every client sees ([`permission`]). A process that exits or hangs ends its
//! running turns with `chat/error` naming the cause; the next turn starts a
//! new one, and where the agent can load sessions each chat is reattached to
//! the ACP session it had (also after a restart of Tandem). The host's files
//! are the agent's only where the operator granted a directory ([`files`]).

mod bridge;
pub mod choices;
pub mod conn;
pub mod elicit;
pub mod files;
pub mod map;
pub mod permission;

use std::sync::Arc;

use ahp_types::commands::SessionConfigValueItem;
use ahp_types::state::{AgentInfo, SessionConfigPropertySchema};
use dashmap::DashMap;
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use self::bridge::Bridge;
use super::{Agent, AgentTurn};
use crate::config::AgentSpec;
use crate::ids::ChannelUri;

/// An operator-declared ACP agent.
pub struct AcpAgent {
    spec: Arc<AgentSpec>,
    /// The bridge of each session that has one.
    bridges: DashMap<String, mpsc::UnboundedSender<Cmd>>,
    /// Chat → session, for cancels (which name only the chat).
    chats: DashMap<String, String>,
    /// Session → what its agent offers lately (modes, models).
    choices: Arc<DashMap<String, choices::Choices>>,
    /// Its processes running now.
    alive: Arc<std::sync::atomic::AtomicUsize>,
}

impl AcpAgent {
    /// The agent `spec` declares.
    pub fn new(spec: AgentSpec) -> Self {
        Self {
            spec: Arc::new(spec),
            bridges: DashMap::new(),
            chats: DashMap::new(),
            choices: Arc::new(DashMap::new()),
            alive: Arc::default(),
        }
    }

    fn bridge(&self, session: &str) -> mpsc::UnboundedSender<Cmd> {
        self.bridges
            .entry(session.to_owned())
            .or_insert_with(|| {
                Bridge::start(
                    self.spec.clone(),
                    session.to_owned(),
                    self.choices.clone(),
                    self.alive.clone(),
                )
            })
            .clone()
    }
}

/// What the bridge of one session is asked to do.
enum Cmd {
    Open(oneshot::Sender<Result<(), String>>),
    Turn(Box<AgentTurn>),
    Cancel { chat: String, turn_id: String },
    Ended { chat: String, turn_id: String },
}

impl Agent for AcpAgent {
    fn processes(&self) -> usize {
        self.alive.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn info(&self) -> AgentInfo {
        AgentInfo {
            provider: self.spec.name.clone(),
            display_name: self.spec.display_name().to_owned(),
            description: format!("ACP agent `{}`", self.spec.command),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn open_session(&self, session: &ChannelUri) -> BoxFuture<'static, Result<(), String>> {
        let bridge = self.bridge(session);
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            bridge
                .send(Cmd::Open(tx))
                .map_err(|_| "the agent bridge stopped".to_owned())?;
            rx.await
                .map_err(|_| "the agent bridge stopped".to_owned())?
        })
    }

    fn session_disposed(&self, session: &str) {
        // Dropping the sender ends the bridge, which stops the process.
        self.bridges.remove(session);
        self.chats.retain(|_, s| s != session);
        self.choices.remove(session);
    }

    fn start_turn(&self, turn: AgentTurn) {
        let session = turn.session.to_string();
        self.chats
            .insert(turn.handle.chat.to_string(), session.clone());
        let _ = self.bridge(&session).send(Cmd::Turn(Box::new(turn)));
    }

    fn cancel_turn(&self, chat: &str, turn_id: &str) {
        if let Some(session) = self.chats.get(chat).map(|s| s.clone()) {
            if let Some(b) = self.bridges.get(&session) {
                let _ = b.send(Cmd::Cancel {
                    chat: chat.to_owned(),
                    turn_id: turn_id.to_owned(),
                });
            }
        }
    }

    fn config_properties(&self) -> Vec<(String, SessionConfigPropertySchema)> {
        choices::properties()
    }

    fn config_choices(&self, session: &str, property: &str) -> Option<Vec<SessionConfigValueItem>> {
        self.choices.get(session)?.items(property)
    }

    fn turn_ended(&self, chat: &str, turn_id: &str) {
        if let Some(session) = self.chats.get(chat).map(|s| s.clone()) {
            if let Some(b) = self.bridges.get(&session) {
                let _ = b.send(Cmd::Ended {
                    chat: chat.to_owned(),
                    turn_id: turn_id.to_owned(),
                });
            }
        }
    }
}
