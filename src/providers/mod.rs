//! Agents behind the host. An agent gets turns and answers with actions and
//! interactions through a [`ChatHandle`]; it never touches state directly.

pub mod remote;
pub mod scripted;

use std::sync::Arc;

use actix::Addr;
use ahp_types::actions::StateAction;
use ahp_types::state::{AgentInfo, Message};
use dashmap::DashMap;
use tokio::sync::oneshot;

use crate::channels::chat::{AgentAction, ChatActor, Interact};
use crate::channels::Rejection;
use crate::interactions::{Interaction, Outcome, Settlement};

/// One turn handed to an agent.
pub struct AgentTurn {
    /// Owning session URI.
    pub session: Arc<str>,
    /// The way back into the chat.
    pub handle: ChatHandle,
    /// The user message that started the turn.
    pub message: Message,
}

/// An agent provider.
pub trait Agent: Send + Sync + 'static {
    /// What root state lists for it.
    fn info(&self) -> AgentInfo;
    /// Start serving a turn (spawn; do not block).
    fn start_turn(&self, turn: AgentTurn);
    /// The turn was cancelled; its open interactions already settled
    /// `interrupted`.
    fn cancel_turn(&self, _chat: &str, _turn_id: &str) {}
    /// The turn ended (completed, errored, truncated away).
    fn turn_ended(&self, _chat: &str, _turn_id: &str) {}
}

/// Registered agents by provider id.
#[derive(Default)]
pub struct Providers {
    agents: DashMap<String, Arc<dyn Agent>>,
    /// The agents served over connections (also in `agents`).
    remotes: DashMap<String, Arc<remote::RemoteAgent>>,
}

/// Why a provider registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The id names a built-in agent.
    #[error("`{0}` is a built-in provider")]
    BuiltIn(String),
    /// Another live connection serves it.
    #[error("provider `{0}` is already served by another connection")]
    Taken(String),
}

impl Providers {
    /// Register a provider served over `conn`, or hand an existing one whose
    /// connection is gone to `conn` (re-registration after a reconnect).
    pub fn register_remote(
        &self,
        info: AgentInfo,
        conn: Arc<crate::publish::Outbound>,
        grace: std::time::Duration,
    ) -> Result<(), RegisterError> {
        let id = info.provider.clone();
        if let Some(existing) = self.remotes.get(&id).map(|r| r.clone()) {
            if existing.is_connected() {
                return Err(RegisterError::Taken(id));
            }
            existing.attach(conn);
            return Ok(());
        }
        if self.agents.contains_key(&id) {
            return Err(RegisterError::BuiltIn(id));
        }
        let agent = Arc::new(remote::RemoteAgent::new(info, conn, grace));
        self.remotes.insert(id.clone(), agent.clone());
        self.agents.insert(id, agent);
        Ok(())
    }

    /// The connection `conn` serving `provider` closed.
    pub fn connection_closed(&self, provider: &str, conn: crate::publish::ConnId) {
        if let Some(r) = self.remotes.get(provider).map(|r| r.clone()) {
            r.detach(conn);
        }
    }

    /// Register (or replace) an agent.
    pub fn register(&self, agent: Arc<dyn Agent>) {
        self.agents.insert(agent.info().provider, agent);
    }

    /// Look an agent up.
    pub fn get(&self, provider: &str) -> Option<Arc<dyn Agent>> {
        self.agents.get(provider).map(|a| a.clone())
    }

    /// Every agent's info, sorted by provider id.
    pub fn infos(&self) -> Vec<AgentInfo> {
        let mut v: Vec<AgentInfo> = self.agents.iter().map(|a| a.info()).collect();
        v.sort_by(|a, b| a.provider.cmp(&b.provider));
        v
    }
}

/// An agent's handle on one turn of one chat.
#[derive(Clone)]
pub struct ChatHandle {
    addr: Addr<ChatActor>,
    /// Chat URI.
    pub chat: Arc<str>,
    /// The turn this handle serves.
    pub turn_id: String,
    /// When the turn started (for `duration`).
    pub started_at: String,
}

impl ChatHandle {
    pub(crate) fn new(
        addr: Addr<ChatActor>,
        chat: Arc<str>,
        turn_id: String,
        started_at: String,
    ) -> Self {
        Self {
            addr,
            chat,
            turn_id,
            started_at,
        }
    }

    /// Send an action; resolves once it is published, or with the reason it
    /// was refused (e.g. the turn was cancelled meanwhile).
    pub async fn emit(&self, action: StateAction) -> Result<(), Rejection> {
        let (reply, rx) = oneshot::channel();
        self.addr
            .send(AgentAction { action, reply })
            .await
            .map_err(|_| Rejection::new("the chat is gone"))?;
        rx.await.map_err(|_| Rejection::new("the chat is gone"))?
    }

    /// Wait for a person. Always resolves, exactly once: a chat that goes away
    /// settles it `aborted`.
    pub async fn interact(&self, interaction: Interaction) -> Settlement {
        let (reply, rx) = oneshot::channel();
        let sent = self.addr.send(Interact {
            turn_id: self.turn_id.clone(),
            interaction,
            reply,
        });
        if sent.await.is_err() {
            return Settlement::with_reason(Outcome::Aborted, "the chat is gone");
        }
        rx.await
            .unwrap_or_else(|_| Settlement::with_reason(Outcome::Aborted, "the chat is gone"))
    }
}
