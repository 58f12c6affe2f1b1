//! Agents behind the host. An agent gets turns and answers with actions and
//! interactions through a [`ChatHandle`]; it never touches state directly.
//! The API an agent implements ([`Agent`]) and the directory channels look
//! agents up in ([`AgentDirectory`]) are defined by `channels`; this module
//! provides them: [`Providers`] is the directory.

pub(crate) mod acp;
pub(crate) mod remote;
pub mod scripted;

use std::sync::Arc;

use ahp_types::state::AgentInfo;
use dashmap::DashMap;

use crate::auth::Principal;
pub use crate::channels::agent::{Agent, AgentDirectory, AgentTurn, ChatHandle};

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
        conn: Arc<crate::transport::Outbound>,
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
    pub fn connection_closed(&self, provider: &str, conn: crate::ids::ConnId) {
        if let Some(r) = self.remotes.get(provider).map(|r| r.clone()) {
            r.detach(conn);
        }
    }

    /// Register (or replace) an agent.
    pub fn register(&self, agent: Arc<dyn Agent>) {
        self.agents.insert(agent.info().provider, agent);
    }

    /// Agents connected over AHP now, and agent processes running.
    pub fn alive(&self) -> (usize, usize) {
        let connected = self
            .remotes
            .iter()
            .filter(|r| r.value().pinned_here())
            .count();
        let processes = self.agents.iter().map(|a| a.value().processes()).sum();
        (connected, processes)
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

impl AgentDirectory for Providers {
    fn get(&self, provider: &str) -> Option<Arc<dyn Agent>> {
        Providers::get(self, provider)
    }

    fn infos(&self) -> Vec<AgentInfo> {
        Providers::infos(self)
    }

    fn default_provider(&self) -> &str {
        scripted::PROVIDER_ID
    }
}
