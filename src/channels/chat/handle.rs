//! The chat actor's client API for agents: a cloneable handle on one turn
//! whose async methods wrap the actor's messages.

use actix::Addr;
use ahp_types::actions::StateAction;
use tokio::sync::oneshot;

use super::{AgentAction, ChatActor, Interact};
use crate::channels::Rejection;
use crate::ids::ChannelUri;
use crate::interactions::{Interaction, Outcome, Settlement};

/// An agent's handle on one turn of one chat.
#[derive(Clone)]
pub struct ChatHandle {
    addr: Addr<ChatActor>,
    /// Chat URI.
    pub chat: ChannelUri,
    /// The turn this handle serves.
    pub turn_id: String,
    /// When the turn started (for `duration`).
    pub started_at: String,
}

impl ChatHandle {
    /// A handle on turn `turn_id` of the chat at `addr`.
    pub fn new(
        addr: Addr<ChatActor>,
        chat: ChannelUri,
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
        self.send(action, false).await
    }

    /// Report a `chat/toolCallReady` for a tool call the agent process runs
    /// on its own decision (it did not ask): published as the agent says,
    /// not held at the session's approval checkpoint.
    pub async fn report(&self, action: StateAction) -> Result<(), Rejection> {
        self.send(action, true).await
    }

    async fn send(&self, action: StateAction, reported: bool) -> Result<(), Rejection> {
        let (reply, rx) = oneshot::channel();
        self.addr
            .send(AgentAction {
                action,
                reported,
                reply,
            })
            .await
            .map_err(|_| Rejection::new("the chat is gone"))?;
        rx.await.map_err(|_| Rejection::new("the chat is gone"))?
    }

    /// Keep something the agent said about this chat that has no AHP action
    /// (its commands, its mode, …) in the session's `_meta`
    /// (`tandem/agent` → chat → `key`). Fire and forget.
    pub fn note(&self, key: String, value: serde_json::Value) {
        self.addr.do_send(NoteForSession { key, value });
    }

    /// What [`note`](Self::note) kept under `key` for this chat, if
    /// anything: it survives a restart with the session.
    pub async fn recall(&self, key: &str) -> Option<serde_json::Value> {
        self.addr
            .send(RecallForSession {
                key: key.to_owned(),
            })
            .await
            .ok()
            .flatten()
    }

    /// The session's config values now (what people set with
    /// `session/configChanged`).
    pub async fn session_config(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        self.addr.send(ConfigForAgent).await.ok().flatten()
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

/// A note from the chat's agent, passed on to the session.
#[derive(actix::Message)]
#[rtype(result = "()")]
struct NoteForSession {
    key: String,
    value: serde_json::Value,
}

impl actix::Handler<NoteForSession> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: NoteForSession, _: &mut Self::Context) {
        self.session_addr
            .do_send(crate::channels::session::AgentNote {
                chat: self.core.uri.to_string(),
                key: msg.key,
                value: msg.value,
            });
    }
}

/// A note asked back from the session.
#[derive(actix::Message)]
#[rtype(result = "Option<serde_json::Value>")]
struct RecallForSession {
    key: String,
}

impl actix::Handler<RecallForSession> for ChatActor {
    type Result = actix::ResponseFuture<Option<serde_json::Value>>;

    fn handle(&mut self, msg: RecallForSession, _: &mut Self::Context) -> Self::Result {
        let asked = self
            .session_addr
            .send(crate::channels::session::AgentRecall {
                chat: self.core.uri.to_string(),
                key: msg.key,
            });
        Box::pin(async move { asked.await.ok().flatten() })
    }
}

/// The session's config values, asked for by the chat's agent.
#[derive(actix::Message)]
#[rtype(result = "Option<serde_json::Map<String, serde_json::Value>>")]
struct ConfigForAgent;

impl actix::Handler<ConfigForAgent> for ChatActor {
    type Result = actix::ResponseFuture<Option<serde_json::Map<String, serde_json::Value>>>;

    fn handle(&mut self, _: ConfigForAgent, _: &mut Self::Context) -> Self::Result {
        let asked = self
            .session_addr
            .send(crate::channels::session::AgentConfigValues);
        Box::pin(async move { asked.await.ok().flatten() })
    }
}
