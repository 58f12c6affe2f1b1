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

use crate::auth::Principal;
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
    /// Provider id → the token subject that first registered it. A provider
    /// receives its sessions' prompts and asks people for passwords, so its
    /// id must not pass to whoever registers it next; the binding is
    /// persisted (`Journal::bind_provider`) so a restart keeps it too.
    owners: DashMap<String, String>,
    /// Held while a new id is counted and bound, so two claims of one
    /// subject cannot both pass its limit.
    claiming: parking_lot::Mutex<()>,
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
    /// The id is bound to another token subject.
    #[error("provider `{0}` belongs to the token subject that first registered it: only that subject or an `admin` token may register it")]
    NotOwner(String),
    /// The subject already owns as many providers as it may.
    #[error("`{0}` already registered {1} providers (the limit)")]
    TooMany(String, usize),
    /// The binding could not be stored.
    #[error("the owner of provider `{0}` could not be stored: {1}")]
    Store(String, crate::store::JournalError),
}

/// What [`Providers::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The id is bound to the claimant (or the claimant is an admin):
    /// register at once.
    Owned,
    /// The id was free and is now bound to the claimant in memory: store the
    /// binding with `Journal::bind_provider`, hand the answer to
    /// [`Providers::bound`], then register.
    New,
}

impl Providers {
    /// Bindings read from the store at start-up.
    pub fn restore_owners(&self, owners: impl IntoIterator<Item = (String, String)>) {
        for (provider, subject) in owners {
            self.owners.insert(provider, subject);
        }
    }

    /// May `principal` register `provider`? A free id is bound to it at once,
    /// so a concurrent claim by another subject is refused; a subject owns
    /// at most `max_per_subject` ids (root state lists every provider, and
    /// every client receives it).
    pub fn claim(
        &self,
        provider: &str,
        principal: &Principal,
        max_per_subject: usize,
    ) -> Result<Claim, RegisterError> {
        if self.agents.contains_key(provider) && !self.remotes.contains_key(provider) {
            return Err(RegisterError::BuiltIn(provider.to_owned()));
        }
        let _claiming = self.claiming.lock();
        if !self.owners.contains_key(provider) {
            let owned = self
                .owners
                .iter()
                .filter(|o| *o.value() == principal.subject)
                .count();
            if owned >= max_per_subject {
                return Err(RegisterError::TooMany(
                    principal.subject.clone(),
                    max_per_subject,
                ));
            }
        }
        match self.owners.entry(provider.to_owned()) {
            dashmap::Entry::Occupied(o) if principal.may_take_over_provider(o.get()) => {
                Ok(Claim::Owned)
            }
            dashmap::Entry::Occupied(_) => Err(RegisterError::NotOwner(provider.to_owned())),
            dashmap::Entry::Vacant(v) => {
                v.insert(principal.subject.clone());
                Ok(Claim::New)
            }
        }
    }

    /// The store answered a [`Claim::New`] with the id's owner (another
    /// writer may have bound it first). A store failure keeps the in-memory
    /// binding: refusing everyone else is the safe side.
    pub fn bound(
        &self,
        provider: &str,
        stored: Result<String, crate::store::JournalError>,
        principal: &Principal,
    ) -> Result<(), RegisterError> {
        let owner = stored.map_err(|e| RegisterError::Store(provider.to_owned(), e))?;
        let ok = principal.may_take_over_provider(&owner);
        self.owners.insert(provider.to_owned(), owner);
        if ok {
            Ok(())
        } else {
            Err(RegisterError::NotOwner(provider.to_owned()))
        }
    }

    /// Register a provider served over `conn` for `principal`, or hand an
    /// existing one whose connection is gone to `conn` (re-registration after
    /// a reconnect). The caller has [`claim`](Self::claim)ed the id.
    pub fn register_remote(
        &self,
        info: AgentInfo,
        conn: Arc<crate::publish::Outbound>,
        principal: Principal,
        grace: std::time::Duration,
    ) -> Result<(), RegisterError> {
        let id = info.provider.clone();
        if let Some(existing) = self.remotes.get(&id).map(|r| r.clone()) {
            if existing.is_connected() {
                return Err(RegisterError::Taken(id));
            }
            existing.attach(conn, principal);
            return Ok(());
        }
        if self.agents.contains_key(&id) {
            return Err(RegisterError::BuiltIn(id));
        }
        let agent = Arc::new(remote::RemoteAgent::new(info, conn, principal, grace));
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
