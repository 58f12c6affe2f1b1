//! What a chat needs from the agent behind its session, defined here so the
//! arrow points one way: `providers` implements [`Agent`] and
//! [`AgentDirectory`]; channels never name a provider.
//!
//! A turn reaches an agent as an [`AgentTurn`], whose
//! [`ChatHandle`] is the agent's only way back into
//! the chat: stream actions, open interactions, await settlements.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::ids::ChannelUri;
use ahp_types::commands::SessionConfigValueItem;
use ahp_types::state::{AgentInfo, Message, SessionConfigPropertySchema};

pub use super::chat::ChatHandle;

/// One turn handed to an agent.
pub struct AgentTurn {
    /// Owning session URI.
    pub session: ChannelUri,
    /// The way back into the chat.
    pub handle: ChatHandle,
    /// The user message that started the turn.
    pub message: Message,
}

/// An agent, as a chat sees it.
pub trait Agent: Send + Sync + 'static {
    /// What root state lists for it.
    fn info(&self) -> AgentInfo;
    /// A session with this agent is being created: get ready for it (an ACP
    /// agent starts its process and opens its own session). An error
    /// answers `createSession` with its text, and the session is not
    /// created.
    fn open_session(&self, _session: &ChannelUri) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// The session was disposed (or its creation failed).
    fn session_disposed(&self, _session: &str) {}
    /// Start serving a turn (spawn; do not block).
    fn start_turn(&self, turn: AgentTurn);
    /// The turn was cancelled; its open interactions already settled
    /// `interrupted`.
    fn cancel_turn(&self, _chat: &str, _turn_id: &str) {}
    /// The turn ended (completed, errored, truncated away).
    fn turn_ended(&self, _chat: &str, _turn_id: &str) {}

    /// Whether the agent is reached only through this node (a provider
    /// connected here): on a cluster, its sessions should be run here.
    fn pinned_here(&self) -> bool {
        false
    }
    /// Agent processes this agent runs on this node now (`/metrics`).
    fn processes(&self) -> usize {
        0
    }
    /// Session config properties the agent adds to each of its sessions
    /// (it applies their values itself, e.g. at the next turn).
    fn config_properties(&self) -> Vec<(String, SessionConfigPropertySchema)> {
        Vec::new()
    }
    /// The values `property` (one of [`config_properties`](Self::config_properties)
    /// with `enumDynamic`) may take in `session` now, if the agent knows
    /// them: what `sessionConfigCompletions` lists and `session/configChanged`
    /// must pick from.
    fn config_choices(
        &self,
        _session: &str,
        _property: &str,
    ) -> Option<Vec<SessionConfigValueItem>> {
        None
    }
}

/// The agents a channel can reach, by provider id. Root lists them and
/// checks `createSession`'s provider; a chat starts and cancels turns.
pub trait AgentDirectory: Send + Sync + 'static {
    /// The agent registered under `provider`.
    fn get(&self, provider: &str) -> Option<Arc<dyn Agent>>;
    /// Every agent's info, sorted by provider id (root state's `agents`).
    fn infos(&self) -> Vec<AgentInfo>;
    /// The provider of a session created without one.
    fn default_provider(&self) -> &str;
}
