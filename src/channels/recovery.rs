//! Start-up: rebuild every stored session and chat and start their actors.
//!
//! Each channel's state is its latest snapshot plus the journaled tail reduced
//! with the official reducers — the same code path as live traffic, so the
//! rebuilt state is the state clients saw. The reducing runs on all cores
//! before any actor starts.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use ahp::reducers::{apply_action_to_chat, apply_action_to_session};
use ahp_types::actions::StateAction;
use ahp_types::state::{ChatState, SessionState};

use super::agent::AgentDirectory;
use super::chat::{new_chat_state, ChatActor, ChatHome};
use super::core::ChannelCore;
use super::root::RootActor;
use super::session::{new_session_state, summary_of, AttachChats, SessionActor};
use crate::ids::ChannelUri;
use crate::publish::Hub;
use crate::store::{ChannelKind, Recovered, RecoveredChannel};

/// A chat's URI and actor, to attach to its session.
type ChatEntry = (ChannelUri, Addr<ChatActor>);

/// A channel's rebuilt state.
pub enum Rebuilt {
    /// A session.
    Session(Box<SessionState>),
    /// A chat and the number of its stored turns before the in-memory window.
    Chat(Box<ChatState>, u64),
}

/// What start-up found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Sessions restored.
    pub sessions: usize,
    /// Chats restored.
    pub chats: usize,
    /// Journaled actions replayed on top of snapshots.
    pub replayed: usize,
    /// Turns that were running when the server stopped (ended with `chat/error`).
    pub interrupted_turns: usize,
}

/// Rebuild one channel from its snapshot and tail. `turns_window` bounds the
/// completed turns kept in memory; older ones stay in the store behind
/// `turnsNextCursor`.
pub fn rebuild(
    c: &RecoveredChannel,
    turns_window: usize,
    agents: &dyn AgentDirectory,
) -> Result<Rebuilt, String> {
    let parse_action = |r: &str| {
        serde_json::from_str::<StateAction>(r)
            .map_err(|e| format!("{}: stored action does not decode: {e}", c.info.uri))
    };
    match c.info.kind {
        ChannelKind::Session => {
            let mut state = match &c.snapshot {
                Some(s) => serde_json::from_str(&s.state)
                    .map_err(|e| format!("{}: snapshot does not decode: {e}", c.info.uri))?,
                None => new_session_state(
                    c.info.provider.clone(),
                    agents
                        .get(&c.info.provider)
                        .map(|a| a.config_properties())
                        .unwrap_or_default(),
                    c.info.owner.as_deref(),
                ),
            };
            for r in &c.tail {
                apply_action_to_session(&mut state, &parse_action(r)?);
            }
            Ok(Rebuilt::Session(Box::new(state)))
        }
        ChannelKind::Chat => {
            let mut state: ChatState = match &c.snapshot {
                Some(s) => serde_json::from_str(&s.state)
                    .map_err(|e| format!("{}: snapshot does not decode: {e}", c.info.uri))?,
                None => new_chat_state(&c.info.uri, c.info.title.clone()),
            };
            for r in &c.tail {
                apply_action_to_chat(&mut state, &parse_action(r)?);
            }
            let mut base = c.turn_count.saturating_sub(state.turns.len() as u64);
            if state.turns.len() > turns_window {
                let cut = state.turns.len() - turns_window;
                state.turns.drain(..cut);
                base += cut as u64;
            }
            if base > 0 {
                state.turns_next_cursor = Some(format!("turns-before:{base}"));
            }
            Ok(Rebuilt::Chat(Box::new(state), base))
        }
    }
}

/// A channel as the store holds it now, rebuilt with its whole history in
/// memory (to roll back after a failed append); `None` if it is not stored.
pub fn reload(core: &ChannelCore) -> Result<Option<Rebuilt>, String> {
    match core.shared.journal.load_channel(&core.uri) {
        Ok(Some(c)) => rebuild(&c, usize::MAX, &*core.shared.providers).map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("cannot read the store: {e}")),
    }
}

/// Restore everything into running actors, registered and listed by `root`.
#[derive(Message)]
#[rtype(result = "Result<RecoveryStats, String>")]
pub struct Restore(pub Recovered);

impl Handler<Restore> for RootActor {
    type Result = Result<RecoveryStats, String>;

    fn handle(&mut self, msg: Restore, _: &mut Self::Context) -> Self::Result {
        let shared = self.shared();
        let window = shared.config.turns_window;
        let channels = msg.0.channels;
        let agents: &dyn AgentDirectory = &*shared.providers;
        let replayed = channels.iter().map(|c| c.tail.len()).sum();
        // Reduce on every core.
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(1);
        let chunk = channels.len().div_ceil(threads).max(1);
        let rebuilt: Vec<Result<Rebuilt, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = channels
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|c| rebuild(c, window, agents))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|_| vec![Err("a recovery thread panicked".into())])
                })
                .collect()
        });
        let mut stats = RecoveryStats {
            replayed,
            ..RecoveryStats::default()
        };
        let mut sessions: HashMap<ChannelUri, Addr<SessionActor>> = HashMap::new();
        let mut attach: HashMap<ChannelUri, Vec<ChatEntry>> = HashMap::new();
        for (c, state) in channels.into_iter().zip(rebuilt) {
            let uri = c.info.uri.clone();
            match state? {
                Rebuilt::Session(state) => {
                    let summary = summary_of(&uri, &state, &c.info.created_at);
                    let actor = SessionActor::recovered(
                        uri.clone(),
                        Arc::new(Hub::default()),
                        shared.clone(),
                        *state,
                        c.info.created_at.clone(),
                        self.address(),
                    );
                    if let Some(owner) = &c.info.owner {
                        self.note_owner(owner, uri.clone());
                    }
                    let home = shared.next_arbiter();
                    let addr = self.start_session(uri, actor, summary, &home);
                    sessions.insert(c.info.uri, addr);
                    stats.sessions += 1;
                }
                Rebuilt::Chat(state, base) => {
                    let Some(session_uri) = c.info.session.clone() else {
                        return Err(format!("{uri}: a chat without a session"));
                    };
                    let Some(session) = sessions.get(&session_uri).cloned() else {
                        tracing::warn!(chat = %uri, session = %session_uri, "skipping a chat whose session is gone");
                        continue;
                    };
                    if state.active_turn.is_some() {
                        stats.interrupted_turns += 1;
                    }
                    let home = ChatHome {
                        uri: uri.clone(),
                        shared: shared.clone(),
                        session: session_uri.clone(),
                        session_addr: session,
                        provider: c.info.provider.clone(),
                        arbiter: shared.next_arbiter(),
                    };
                    let marks =
                        super::chat::text_marks(c.snapshot.as_ref().map(|s| &*s.state), &c.tail);
                    let addr = home.start(move |home, hub| {
                        ChatActor::recovered(home, hub, *state, base).with_text_marks(marks)
                    });
                    attach.entry(session_uri).or_default().push((uri, addr));
                    stats.chats += 1;
                }
            }
        }
        for (session, chats) in attach {
            if let Some(addr) = sessions.get(&session) {
                addr.do_send(AttachChats(chats));
            }
        }
        self.session_count_changed();
        Ok(stats)
    }
}
