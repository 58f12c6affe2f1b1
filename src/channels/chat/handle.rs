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
