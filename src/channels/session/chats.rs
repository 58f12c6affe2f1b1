//! The session's chats: creating one (actor, registry entry, store entry and
//! catalog actions), mirroring their status and roll-up, removing one,
//! disposing of them all with the session, and `tandem/listPending`.

use actix::prelude::*;
use ahp_types::actions::{
    PartialChatSummary, SessionChatAddedAction, SessionChatRemovedAction, SessionChatUpdatedAction,
    SessionInputNeededRemovedAction, SessionInputNeededSetAction, StateAction,
};
use ahp_types::state::{ChatSummary, SessionInputRequest, SessionStatus};

use super::SessionActor;
use crate::channels::chat::{ChatActor, ChatHome, DisposeChat, GetPending, PendingItem};
use crate::channels::commit::ChannelActor;
use crate::channels::core::durable;
use crate::channels::forward::ForwardRequest;
use crate::channels::rollup;
use crate::ids::ChannelUri;
use crate::people::Access;
use crate::protocol::{errors, RpcError};
use crate::store::{ChannelInfo, ChannelKind};
use crate::time::now_rfc3339;

impl SessionActor {
    /// Start a chat actor, register it and its store entry; returns the
    /// catalog actions that add it.
    pub(super) fn add_chat(
        &mut self,
        ctx: &mut Context<Self>,
        uri: ChannelUri,
        title: String,
        make_default: bool,
    ) -> Vec<StateAction> {
        let shared = self.core.shared.clone();
        let now = now_rfc3339();
        // Queued before the catalog actions, so stored no later than they are.
        drop(shared.journal.create_channel(ChannelInfo {
            uri: uri.clone(),
            kind: ChannelKind::Chat,
            session: Some(self.core.uri.clone()),
            provider: self.state.provider.clone(),
            title: title.clone(),
            created_at: now.clone(),
            owner: None,
        }));
        let home = ChatHome {
            uri: uri.clone(),
            shared,
            session: self.core.uri.clone(),
            session_addr: ctx.address(),
            provider: self.state.provider.clone(),
            // The session's own thread: where its creator's connection is
            // served, so that client's actions reach the chat without a
            // hand-off between threads.
            arbiter: Arbiter::current(),
        };
        let t = title.clone();
        let addr = home.start(move |home, hub| ChatActor::new(home, hub, t));
        self.chats.push((uri.clone(), addr));
        let mut actions = vec![StateAction::SessionChatAdded(SessionChatAddedAction {
            summary: ChatSummary {
                resource: uri.to_string(),
                title,
                status: SessionStatus::Idle.bits(),
                activity: None,
                modified_at: now,
                changes: None,
                origin: None,
                movable: None,
                interactivity: None,
                working_directories: None,
            },
        })];
        if make_default {
            actions.push(StateAction::SessionDefaultChatChanged(
                ahp_types::actions::SessionDefaultChatChangedAction {
                    default_chat: Some(uri.to_string()),
                },
            ));
        }
        actions
    }
}

/// A chat's roll-up changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RollupChanged {
    /// Entries to upsert.
    pub set: Vec<SessionInputRequest>,
    /// Entry ids to remove.
    pub removed: Vec<String>,
}

impl Handler<RollupChanged> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: RollupChanged, ctx: &mut Self::Context) {
        let mut actions: Vec<StateAction> = msg
            .removed
            .into_iter()
            .map(|id| {
                StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction { id })
            })
            .collect();
        actions.extend(msg.set.into_iter().map(|request| {
            StateAction::SessionInputNeededSet(Box::new(SessionInputNeededSetAction { request }))
        }));
        self.host_actions(ctx, actions, None);
    }
}

/// A chat's status changed; mirror it in the catalog.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChatSummaryChanged {
    /// The chat.
    pub chat: ChannelUri,
    /// Its status bits.
    pub status: u32,
    /// Its `modifiedAt`.
    pub modified_at: String,
}

impl Handler<ChatSummaryChanged> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ChatSummaryChanged, ctx: &mut Self::Context) {
        let update = StateAction::SessionChatUpdated(SessionChatUpdatedAction {
            chat: msg.chat.to_string(),
            changes: PartialChatSummary {
                status: Some(msg.status),
                modified_at: Some(msg.modified_at),
                ..Default::default()
            },
        });
        self.host_actions(ctx, vec![update], None);
    }
}

/// `createChat`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct CreateChat {
    /// The client-chosen chat URI.
    pub chat: ChannelUri,
    /// Who asks (`None`: the host).
    pub by: Option<crate::people::Person>,
}

impl Handler<CreateChat> for SessionActor {
    type Result = ResponseFuture<Result<(), RpcError>>;

    fn handle(&mut self, msg: CreateChat, ctx: &mut Self::Context) -> Self::Result {
        if self.core.follower {
            let request = ForwardRequest::CreateChat {
                session: self.core.uri.to_string(),
                chat: msg.chat.to_string(),
                by: msg.by,
            };
            return self.ask_owner_for_chat(ctx, request, msg.chat);
        }
        if let Err(e) = self.permit(msg.by.as_ref(), Access::Participant, "creating a chat") {
            return Box::pin(std::future::ready(Err(e)));
        }
        let limits = &self.core.shared.config.limits;
        if msg.chat.len() > limits.max_uri_bytes {
            let e = RpcError::invalid_params(format!(
                "a chat URI of {} bytes is over the limit of {}",
                msg.chat.len(),
                limits.max_uri_bytes
            ));
            return Box::pin(std::future::ready(Err(e)));
        }
        if self.chats.len() >= limits.max_chats_per_session {
            let e = RpcError::invalid_request(format!(
                "chat limit reached: a session holds at most {} chats",
                limits.max_chats_per_session
            ));
            return Box::pin(std::future::ready(Err(e)));
        }
        if !msg.chat.starts_with("ahp-chat:/") || msg.chat.len() <= "ahp-chat:/".len() {
            let e = RpcError::invalid_params(format!(
                "chat URI `{}` must look like `ahp-chat:/<id>`",
                msg.chat
            ));
            return Box::pin(std::future::ready(Err(e)));
        }
        if self.core.shared.registry.contains(&msg.chat) {
            let e = RpcError::new(
                errors::ALREADY_EXISTS,
                format!("chat `{}` already exists", msg.chat),
            );
            return Box::pin(std::future::ready(Err(e)));
        }
        let title = format!("Chat {}", self.chats.len() + 1);
        let actions = self.add_chat(ctx, msg.chat, title, false);
        let stored = self.host_actions_stored(ctx, actions);
        Box::pin(async move { stored.await.map_err(|r| RpcError::internal(r.0)) })
    }
}

/// `disposeChat` for a chat of this session.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct RemoveChat {
    /// The chat URI.
    pub chat: ChannelUri,
    /// Who asks (`None`: the host).
    pub by: Option<crate::people::Person>,
}

impl Handler<RemoveChat> for SessionActor {
    type Result = ResponseFuture<Result<(), RpcError>>;

    /// Answered once the removal is durable: the catalog actions are
    /// journaled, the chat has queued the removal of its records (after any
    /// write it still had in flight), and the store has made everything
    /// queued durable.
    fn handle(&mut self, msg: RemoveChat, ctx: &mut Self::Context) -> Self::Result {
        if self.core.follower {
            let request = ForwardRequest::DisposeChat {
                session: self.core.uri.to_string(),
                chat: msg.chat.to_string(),
                by: msg.by,
            };
            return self.ask_owner_for_chat(ctx, request, msg.chat);
        }
        if let Err(e) = self.permit(msg.by.as_ref(), Access::Owner, "disposing of a chat") {
            return Box::pin(std::future::ready(Err(e)));
        }
        let Some(pos) = self.chats.iter().position(|(u, _)| *u == msg.chat) else {
            let e = RpcError::new(
                errors::NOT_FOUND,
                format!("chat `{}` is not in this session", msg.chat),
            );
            return Box::pin(std::future::ready(Err(e)));
        };
        let (uri, addr) = self.chats.remove(pos);
        // Gone for new requests at once, before the actor winds down.
        self.core.shared.registry.remove(&uri);
        let disposed = addr.send(DisposeChat);
        // Its open requests leave the roll-up with it.
        let prefix = format!("{uri}#");
        let stale: Vec<StateAction> = self
            .state
            .input_needed
            .iter()
            .flatten()
            .filter_map(rollup::entry_id)
            .filter(|id| id.starts_with(&prefix))
            .map(|id| {
                StateAction::SessionInputNeededRemoved(SessionInputNeededRemovedAction {
                    id: id.to_owned(),
                })
            })
            .collect();
        let mut actions = stale;
        actions.push(StateAction::SessionChatRemoved(SessionChatRemovedAction {
            chat: uri.to_string(),
        }));
        let stored = self.host_actions_stored(ctx, actions);
        let journal = self.core.shared.journal.clone();
        Box::pin(async move {
            let not_stored = |e: String| {
                tracing::error!(chat = %uri, error = %e, "chat removal not stored");
                RpcError::internal(format!("the removal could not be stored: {e}"))
            };
            stored.await.map_err(|r| not_stored(r.0))?;
            disposed
                .await
                .map_err(|_| not_stored("the chat went away before it was removed".into()))?;
            durable(journal).await.map_err(not_stored)
        })
    }
}

/// The whole session is being disposed. Answered once every record of it
/// (and of its chats) is queued for removal.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DisposeSession;

impl Handler<DisposeSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: DisposeSession, ctx: &mut Self::Context) {
        // The chats' records go with the session's, queued before the reply
        // (root then waits for the store to make the removal durable).
        for (uri, addr) in self.chats.drain(..) {
            self.core.shared.registry.remove(&uri);
            self.core.shared.journal.remove(&uri);
            addr.do_send(DisposeChat);
        }
        self.core.shared.registry.remove(&self.core.uri);
        self.core.shared.journal.remove(&self.core.uri);
        ctx.stop();
    }
}

/// `tandem/listPending`: every unsettled interaction of the session, in the
/// order they opened.
#[derive(Message)]
#[rtype(result = "Vec<PendingItem>")]
pub struct ListPending;

impl Handler<ListPending> for SessionActor {
    type Result = ResponseFuture<Vec<PendingItem>>;

    fn handle(&mut self, _: ListPending, _: &mut Self::Context) -> Self::Result {
        let asks: Vec<_> = self.chats.iter().map(|(_, a)| a.send(GetPending)).collect();
        Box::pin(async move {
            let mut all: Vec<PendingItem> = futures_util::future::join_all(asks)
                .await
                .into_iter()
                .flat_map(|r| r.unwrap_or_default())
                .collect();
            all.sort_by_key(|p| p.server_seq);
            all
        })
    }
}
