//! An agent on the other end of a provider connection: an AHP client that
//! registered with `tandem/registerProvider`. Turns reach it as `tandem/turn`
//! notifications; it answers with ordinary `dispatchAction` on the chat and
//! waits for people with `tandem/requestInteraction`.
//!
//! If its connection drops, its turns wait for a grace period (it may
//! reconnect and register again); after that they end with `chat/error`, and
//! every interaction still open in them settles `aborted`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::AgentInfo;
use bytestring::ByteString;
use parking_lot::Mutex;
use serde_json::json;

use super::{Agent, AgentTurn, ChatHandle};
use crate::channels::chat::chat_error;
use crate::protocol::encode_notification;
use crate::publish::{ConnId, Outbound};

struct State {
    /// The live connection, if any.
    conn: Option<Arc<Outbound>>,
    /// Bumped on every attach and detach, so a stale grace timer does nothing.
    generation: u64,
    /// Active turns by (chat, turn id).
    turns: HashMap<(String, String), (Arc<str>, ChatHandle, ahp_types::state::Message)>,
}

/// A provider served over a connection.
pub struct RemoteAgent {
    info: AgentInfo,
    grace: Duration,
    state: Mutex<State>,
}

impl RemoteAgent {
    /// A provider attached to `conn`.
    pub fn new(info: AgentInfo, conn: Arc<Outbound>, grace: Duration) -> Self {
        Self {
            info,
            grace,
            state: Mutex::new(State {
                conn: Some(conn),
                generation: 0,
                turns: HashMap::new(),
            }),
        }
    }

    /// Whether a live connection serves it.
    pub fn is_connected(&self) -> bool {
        self.state
            .lock()
            .conn
            .as_ref()
            .is_some_and(|c| !c.is_closing())
    }

    /// A (re)registration took it over: the new connection is told about the
    /// turns still waiting for it.
    pub fn attach(&self, conn: Arc<Outbound>) {
        let mut st = self.state.lock();
        st.generation += 1;
        for ((chat, turn_id), (session, _, message)) in &st.turns {
            conn.push_now(turn_frame(session, chat, turn_id, message));
        }
        st.conn = Some(conn);
    }

    /// Its connection `conn` closed: start the grace period.
    pub fn detach(self: &Arc<Self>, conn: ConnId) {
        let generation = {
            let mut st = self.state.lock();
            if st.conn.as_ref().map(|c| c.id()) != Some(conn) {
                return;
            }
            st.conn = None;
            st.generation += 1;
            st.generation
        };
        let me = self.clone();
        actix::spawn(async move {
            tokio::time::sleep(me.grace).await;
            let turns: Vec<ChatHandle> = {
                let mut st = me.state.lock();
                if st.generation != generation || st.conn.is_some() {
                    return;
                }
                st.turns.drain().map(|(_, (_, h, _))| h).collect()
            };
            for h in turns {
                tracing::info!(provider = %me.info.provider, chat = %h.chat, turn = %h.turn_id, "provider gone: ending its turn");
                let err = chat_error(
                    &h.turn_id,
                    &h.started_at,
                    "ProviderGone",
                    &format!(
                        "the provider `{}` disconnected and did not come back",
                        me.info.provider
                    ),
                );
                let _ = h.emit(err).await;
            }
        });
    }
}

fn turn_frame(
    session: &str,
    chat: &str,
    turn_id: &str,
    message: &ahp_types::state::Message,
) -> ByteString {
    ByteString::from(encode_notification(
        "tandem/turn",
        &json!({"channel": chat, "session": session, "turnId": turn_id, "message": message}),
    ))
}

impl Agent for RemoteAgent {
    fn info(&self) -> AgentInfo {
        self.info.clone()
    }

    fn start_turn(&self, turn: AgentTurn) {
        let mut st = self.state.lock();
        let key = (turn.handle.chat.to_string(), turn.handle.turn_id.clone());
        if let Some(conn) = &st.conn {
            conn.push_now(turn_frame(&turn.session, &key.0, &key.1, &turn.message));
        }
        st.turns
            .insert(key, (turn.session, turn.handle, turn.message));
    }

    fn cancel_turn(&self, chat: &str, turn_id: &str) {
        let mut st = self.state.lock();
        st.turns.remove(&(chat.to_owned(), turn_id.to_owned()));
        if let Some(conn) = &st.conn {
            conn.push_now(ByteString::from(encode_notification(
                "tandem/turnCancelled",
                &json!({"channel": chat, "turnId": turn_id}),
            )));
        }
    }

    fn turn_ended(&self, chat: &str, turn_id: &str) {
        self.state
            .lock()
            .turns
            .remove(&(chat.to_owned(), turn_id.to_owned()));
    }
}
