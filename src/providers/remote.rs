//! An agent on the other end of a provider connection: an AHP client that
//! registered with `tandem/registerProvider`. Turns reach it as `tandem/turn`
//! notifications; it answers with ordinary `dispatchAction` on the chat and
//! waits for people with `tandem/requestInteraction`.
//!
//! If its connection drops, its turns wait for a grace period (it may
//! reconnect and register again); after that they end with `chat/error`, and
//! every interaction still open in them settles `aborted`.
//!
//! A turn carries a person's prompt, so it only goes to a connection whose
//! token may use the turn's session. A turn the serving connection may not
//! see is not delivered: it ends at once with `chat/error`
//! (`ProviderNotPermitted`), so the person learns why instead of waiting for
//! an agent that will never answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ahp_types::state::AgentInfo;
use bytestring::ByteString;
use parking_lot::Mutex;
use serde_json::json;

use super::{Agent, AgentTurn, ChatHandle};
use crate::auth::Principal;
use crate::channels::chat::chat_error;
use crate::ids::{ChannelUri, ConnId};
use crate::protocol::encode_notification;
use crate::transport::{Outbound, Push};

/// The connection serving the provider, and who is on it.
struct Serving {
    conn: Arc<Outbound>,
    /// Decides which sessions' turns the connection may receive.
    principal: Principal,
}

struct State {
    /// The live connection, if any.
    serving: Option<Serving>,
    /// Bumped on every attach and detach, so a stale grace timer does nothing.
    generation: u64,
    /// Active turns by (chat, turn id).
    turns: HashMap<(ChannelUri, String), (ChannelUri, ChatHandle, ahp_types::state::Message)>,
}

/// A provider served over a connection.
pub struct RemoteAgent {
    info: AgentInfo,
    grace: Duration,
    state: Mutex<State>,
}

impl RemoteAgent {
    /// A provider attached to `conn`, on which `principal` is.
    pub fn new(
        info: AgentInfo,
        conn: Arc<Outbound>,
        principal: Principal,
        grace: Duration,
    ) -> Self {
        Self {
            info,
            grace,
            state: Mutex::new(State {
                serving: Some(Serving { conn, principal }),
                generation: 0,
                turns: HashMap::new(),
            }),
        }
    }

    /// Whether a live connection serves it.
    pub fn is_connected(&self) -> bool {
        self.state
            .lock()
            .serving
            .as_ref()
            .is_some_and(|s| !s.conn.is_closing())
    }

    /// A (re)registration took it over: the new connection is told about the
    /// turns still waiting for it — those of sessions its `principal` may
    /// use; the others end with an error.
    pub fn attach(&self, conn: Arc<Outbound>, principal: Principal) {
        let mut st = self.state.lock();
        st.generation += 1;
        let refused: Vec<(ChannelUri, String)> = st
            .turns
            .iter()
            .filter(|(_, (session, _, _))| !principal.may_use_session(session))
            .map(|(key, _)| key.clone())
            .collect();
        for key in refused {
            if let Some((session, handle, _)) = st.turns.remove(&key) {
                self.refuse_turn(handle, &session);
            }
        }
        for ((chat, turn_id), (session, _, message)) in &st.turns {
            conn.push(Push::Response(turn_frame(session, chat, turn_id, message)));
        }
        st.serving = Some(Serving { conn, principal });
    }

    /// End a turn the serving connection may not see.
    fn refuse_turn(&self, handle: ChatHandle, session: &ChannelUri) {
        tracing::info!(provider = %self.info.provider, chat = %handle.chat, %session, "turn outside the provider connection's sessions: ending it");
        let err = chat_error(
            &handle.turn_id,
            &handle.started_at,
            "ProviderNotPermitted",
            &format!(
                "the connection serving provider `{}` may not serve session `{session}`",
                self.info.provider
            ),
        );
        actix::spawn(async move {
            let _ = handle.emit(err).await;
        });
    }

    /// Its connection `conn` closed: start the grace period.
    pub fn detach(self: &Arc<Self>, conn: ConnId) {
        let generation = {
            let mut st = self.state.lock();
            if st.serving.as_ref().map(|s| s.conn.id()) != Some(conn) {
                return;
            }
            st.serving = None;
            st.generation += 1;
            st.generation
        };
        let me = self.clone();
        let gone_at = tokio::time::Instant::now() + self.grace;
        actix::spawn(async move {
            // The grace period's timer: a registration meanwhile bumps the
            // generation, and this then does nothing.
            tokio::time::sleep_until(gone_at).await;
            let turns: Vec<ChatHandle> = {
                let mut st = me.state.lock();
                if st.generation != generation || st.serving.is_some() {
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
    fn pinned_here(&self) -> bool {
        self.state.lock().serving.is_some()
    }

    fn info(&self) -> AgentInfo {
        self.info.clone()
    }

    fn start_turn(&self, turn: AgentTurn) {
        let mut st = self.state.lock();
        let key = (turn.handle.chat.clone(), turn.handle.turn_id.clone());
        if let Some(s) = &st.serving {
            if !s.principal.may_use_session(&turn.session) {
                drop(st);
                return self.refuse_turn(turn.handle, &turn.session);
            }
            s.conn.push(Push::Response(turn_frame(
                &turn.session,
                &key.0,
                &key.1,
                &turn.message,
            )));
        }
        st.turns
            .insert(key, (turn.session, turn.handle, turn.message));
    }

    fn cancel_turn(&self, chat: &str, turn_id: &str) {
        let mut st = self.state.lock();
        // A turn it never held (refused) is none of its business.
        if st
            .turns
            .remove(&(ChannelUri::from(chat), turn_id.to_owned()))
            .is_none()
        {
            return;
        }
        if let Some(s) = &st.serving {
            s.conn
                .push(Push::Response(ByteString::from(encode_notification(
                    "tandem/turnCancelled",
                    &json!({"channel": chat, "turnId": turn_id}),
                ))));
        }
    }

    fn turn_ended(&self, chat: &str, turn_id: &str) {
        self.state
            .lock()
            .turns
            .remove(&(ChannelUri::from(chat), turn_id.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::testing::{self, chat_with_a_turn};

    const GRACE: Duration = Duration::from_secs(3);

    fn info() -> AgentInfo {
        AgentInfo {
            provider: "remote".into(),
            display_name: "Remote".into(),
            description: "On a provider connection".into(),
            models: Vec::new(),
            protected_resources: None,
            customizations: None,
            capabilities: None,
        }
    }

    fn turn_frames(conn: &Outbound) -> usize {
        testing::frames(conn)
            .iter()
            .filter(|f| f.contains("tandem/turn"))
            .count()
    }

    /// On paused time: a provider that registers again within the grace
    /// period gets its turn back; one that does not come back has it ended
    /// with `ProviderGone` exactly one grace period after it left.
    #[actix::test]
    async fn a_turn_waits_one_grace_period_for_its_provider_to_come_back() {
        tokio::time::pause();
        let (journal, _chat, _client, turn) = chat_with_a_turn().await;
        let first = Arc::new(Outbound::new(1 << 20));
        let agent = Arc::new(RemoteAgent::new(
            info(),
            first.clone(),
            Principal::local(),
            GRACE,
        ));
        agent.start_turn(turn);
        assert_eq!(turn_frames(&first), 1, "the turn reaches the provider");

        // Gone, and back halfway through the grace period.
        agent.detach(first.id());
        tokio::time::advance(GRACE / 2).await;
        let second = Arc::new(Outbound::new(1 << 20));
        agent.attach(second.clone(), Principal::local());
        assert_eq!(turn_frames(&second), 1, "the waiting turn is handed over");

        // Gone for good: the first departure's timer comes due first and
        // does nothing; the turn ends one grace period after the second.
        let left = tokio::time::Instant::now();
        agent.detach(second.id());
        journal
            .wait_event("the turn's end", |e| {
                e.contains("chat/error") && e.contains("ProviderGone")
            })
            .await;
        // Timers fire on a millisecond tick; the first departure's would
        // have ended it half a grace period earlier.
        let waited = left.elapsed();
        assert!(
            (GRACE..=GRACE + Duration::from_millis(1)).contains(&waited),
            "ended when the grace period ran out: {waited:?}"
        );
    }
}
