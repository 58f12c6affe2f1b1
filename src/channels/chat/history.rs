//! The chat's turn history beyond memory: ended turns and truncations go to
//! the store with their batch, `fetchTurns` pages older turns back in, and
//! disposal forgets the chat.

use actix::prelude::*;
use ahp_types::actions::{ChatTurnsLoadedAction, StateAction};
use tokio::sync::oneshot;

use super::ChatActor;
use crate::channels::commit::ChannelActor;
use crate::channels::core::Accepted;
use crate::channels::validate::Rejection;
use crate::protocol::RpcError;
use crate::store::TurnRecord;

impl ChatActor {
    /// The opaque `turnsNextCursor` for history before turn `base`.
    fn cursor(base: u64) -> String {
        format!("turns-before:{base}")
    }

    /// Keep what an action did to the turn history, for the store.
    pub(super) fn track_history(&mut self, action: &StateAction, turns_before: usize) {
        match action {
            StateAction::ChatTurnComplete(_)
            | StateAction::ChatTurnCancelled(_)
            | StateAction::ChatError(_) => {
                if let Some(t) = self.state.turns.last() {
                    self.pending_turns.push(TurnRecord {
                        index: self.turn_base + self.state.turns.len() as u64 - 1,
                        json: serde_json::to_string(t).unwrap_or_default().into(),
                    });
                }
            }
            StateAction::ChatTruncated(a) => {
                let from = if a.turn_id.is_none() {
                    self.turn_base = 0;
                    0
                } else {
                    self.turn_base + self.state.turns.len() as u64
                };
                self.pending_turns.retain(|t| t.index < from);
                self.pending_truncate = Some(self.pending_truncate.map_or(from, |f| f.min(from)));
            }
            StateAction::ChatTurnsLoaded(_) => {
                let added = self.state.turns.len().saturating_sub(turns_before) as u64;
                self.turn_base = self.turn_base.saturating_sub(added);
            }
            _ => {}
        }
    }
}

/// `fetchTurns`: page older stored turns into the chat (for everyone) with
/// `chat/turnsLoaded`, answering once it is published.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FetchTurns {
    /// The cursor from `turnsNextCursor`; `None` loads the next page if any.
    pub cursor: Option<String>,
    /// Answered after the turns are in the state (or with the reason not).
    pub reply: oneshot::Sender<Result<(), RpcError>>,
}

impl Handler<FetchTurns> for ChatActor {
    type Result = ();

    fn handle(&mut self, msg: FetchTurns, ctx: &mut Self::Context) {
        self.ensure_warm(ctx);
        let current = self.state.turns_next_cursor.clone();
        match (&msg.cursor, &current) {
            (None, None) => {
                let _ = msg.reply.send(Ok(()));
                return;
            }
            (Some(c), Some(cur)) if c == cur => {}
            (None, Some(_)) => {}
            (Some(c), _) => {
                let _ = msg.reply.send(Err(RpcError::invalid_params(format!(
                    "unrecognised turns cursor `{c}`"
                ))));
                return;
            }
        }
        let page = self.core.shared.config.turns_page;
        let loaded =
            match self
                .core
                .shared
                .journal
                .turns_before(&self.core.uri, self.turn_base, page)
            {
                Ok(t) => t,
                Err(e) => {
                    let _ = msg.reply.send(Err(RpcError::internal(format!(
                        "reading stored turns: {e}"
                    ))));
                    return;
                }
            };
        let turns: Result<Vec<ahp_types::state::Turn>, _> =
            loaded.iter().map(|t| serde_json::from_str(t)).collect();
        let turns = match turns {
            Ok(t) => t,
            Err(e) => {
                let _ = msg.reply.send(Err(RpcError::internal(format!(
                    "a stored turn does not decode: {e}"
                ))));
                return;
            }
        };
        let new_base = self.turn_base.saturating_sub(turns.len() as u64);
        let action = StateAction::ChatTurnsLoaded(ChatTurnsLoadedAction {
            turns,
            turns_next_cursor: (new_base > 0).then(|| Self::cursor(new_base)),
        });
        if let Err(r) = self.reduce(&action) {
            let _ = msg.reply.send(Err(RpcError::internal(r.0)));
            return;
        }
        let (done, rx) = oneshot::channel();
        self.commit(ctx, vec![Accepted::new(action, None)], Some(done));
        let reply = msg.reply;
        actix::spawn(async move {
            let r = rx
                .await
                .unwrap_or_else(|_| Err(Rejection::new("the chat went away")));
            let _ = reply.send(r.map_err(|e| RpcError::internal(e.0)));
        });
    }
}

/// The chat is being disposed (by `disposeChat` or its session's disposal).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DisposeChat;

impl Handler<DisposeChat> for ChatActor {
    type Result = ();

    fn handle(&mut self, _: DisposeChat, ctx: &mut Self::Context) {
        self.abort_all("the chat was disposed");
        if let (Some(t), Some(agent)) = (
            &self.state.active_turn,
            self.core.shared.providers.get(&self.provider),
        ) {
            agent.cancel_turn(&self.core.uri, &t.id);
        }
        self.core.shared.registry.remove(&self.core.uri);
        self.core.shared.journal.remove(&self.core.uri);
        ctx.stop();
    }
}
