//! The channels' client API: what a transport may ask of a channel, as
//! methods on [`ChannelAddr`].
//!
//! The actor messages stay private to `channels`; a connection dispatches,
//! subscribes and makes requests through these methods, and never matches on
//! the kind of actor behind a URI. A request that only one kind of channel
//! answers (`createChat` needs a session, `fetchTurns` a chat) returns `None`
//! for another kind, so the caller says which channel it could not find.
//! Every future resolves: a mailbox that is gone becomes an internal error.

use std::future::Future;
use std::sync::Arc;

use crate::people::Person;

use actix::prelude::*;
use ahp_types::actions::{ActionOrigin, StateAction};
use ahp_types::commands::ListSessionsResult;

use super::chat::{EditText, FetchTurns, OpenText, PendingItem, TextState, TextTarget};
use super::context::Shared;
use super::recovery::{RecoveryStats, Restore};
use super::registry::{Channel, ChannelAddr};
use super::root::{AgentsChanged, CreateSession, ListSessions, RemoveSession, RootActor};
use super::session::{CreateChat, ListPending, RemoveChat, SessionActor};
use super::{ClientDispatch, SnapshotJson, Subscribe};
use crate::coedit::TextOp;
use crate::ids::ChannelUri;
use crate::interactions::{Interaction, Outcome, Settlement};
use crate::protocol::RpcError;
use crate::publish::Hub;
use crate::store::Recovered;
use crate::transport::Outbound;

/// A request's answer once its mailbox is known to be reachable: a gone
/// actor is an internal error, the actor's own refusal passes through.
fn answered<T>(res: Result<Result<T, RpcError>, MailboxError>) -> Result<T, RpcError> {
    res.map_err(|e| RpcError::internal(e.to_string()))?
}

/// Who creates a session and how many it may own.
pub struct SessionOwner {
    /// The token subject.
    pub subject: String,
    /// Sessions the subject may own at once.
    pub max_sessions: usize,
}

impl ChannelAddr {
    /// Start the root actor, register `ahp-root://`, and restore every stored
    /// session and chat into running actors. Returns the root's address.
    pub async fn start_root(
        shared: &Arc<Shared>,
        recovered: Recovered,
    ) -> Result<(ChannelAddr, RecoveryStats), String> {
        let hub = Arc::new(Hub::default());
        let (s, h) = (shared.clone(), hub.clone());
        let root = RootActor::start_in_arbiter(&shared.next_arbiter(), move |ctx| {
            RootActor::new(h, s, ctx.address())
        });
        shared.registry.insert(Channel {
            uri: ahp_types::ROOT_RESOURCE_URI.into(),
            hub,
            addr: ChannelAddr::Root(root.clone()),
            session: None,
            provider: None,
        });
        let stats = root
            .send(Restore(recovered))
            .await
            .map_err(|e| e.to_string())??;
        Ok((ChannelAddr::Root(root), stats))
    }

    /// Hand a client's action to the channel. The dispatcher `conn` gets its
    /// echo or rejection from the actor; `as_agent` checks the action as the
    /// session's provider's rather than a client's.
    pub fn dispatch(
        &self,
        conn: super::DispatchConn,
        origin: ActionOrigin,
        action: StateAction,
        as_agent: bool,
        by: Option<Person>,
    ) {
        self.send_dispatch(ClientDispatch {
            conn: super::Dispatcher::Conn(conn),
            origin,
            action,
            as_agent,
            by,
        });
    }

    /// Hand a dispatch to whichever actor is behind this address.
    fn send_dispatch(&self, msg: ClientDispatch) {
        match self {
            ChannelAddr::Chat(a) => a.do_send(msg),
            ChannelAddr::Session(a) => a.do_send(msg),
            ChannelAddr::Root(a) => a.do_send(msg),
        }
    }

    /// A batch another node appended (a follower applies it).
    pub fn replicate(&self, r: crate::store::Replicated) {
        match self {
            ChannelAddr::Chat(a) => a.do_send(super::Replicate(r)),
            ChannelAddr::Session(a) => a.do_send(super::Replicate(r)),
            ChannelAddr::Root(_) => {}
        }
    }

    /// This node took the channel over.
    pub fn promote(&self) {
        match self {
            ChannelAddr::Chat(a) => a.do_send(super::Promote),
            ChannelAddr::Session(a) => a.do_send(super::Promote),
            ChannelAddr::Root(_) => {}
        }
    }

    /// Read a chat this node let pass from the store again and apply it
    /// from now on; resolves once its state is current (before a
    /// take-over, whose fence expects the journal to end where this node
    /// read it).
    pub fn warm(&self) -> impl Future<Output = ()> + 'static {
        let sent = match self {
            ChannelAddr::Chat(a) => Some(a.send(super::Warm)),
            _ => None,
        };
        async move {
            if let Some(sent) = sent {
                let _ = sent.await;
            }
        }
    }

    /// Whether a turn runs in this chat now (never for other channels).
    pub fn busy(&self) -> impl Future<Output = bool> + 'static {
        let sent = match self {
            ChannelAddr::Chat(a) => Some(a.send(super::Busy)),
            _ => None,
        };
        async move {
            match sent {
                Some(sent) => sent.await.unwrap_or(false),
                None => false,
            }
        }
    }

    /// This node hands the channel over: resolves once the actor follows.
    pub fn demote(&self) -> impl Future<Output = ()> + 'static {
        let sent = match self {
            ChannelAddr::Chat(a) => Some(futures_util::future::Either::Left(a.send(super::Demote))),
            ChannelAddr::Session(a) => {
                Some(futures_util::future::Either::Right(a.send(super::Demote)))
            }
            ChannelAddr::Root(_) => None,
        };
        async move {
            if let Some(sent) = sent {
                let _ = sent.await;
            }
        }
    }

    /// A client's action another node forwarded here (this node owns the
    /// channel); resolves with its outcome.
    pub fn dispatch_forwarded(
        &self,
        origin: ActionOrigin,
        action: StateAction,
        as_agent: bool,
        by: Option<Person>,
    ) -> impl Future<Output = Result<(), String>> + 'static {
        let (reply, rx) = super::ForwardedReply::new();
        self.send_dispatch(ClientDispatch {
            conn: super::Dispatcher::Forwarded(reply),
            origin,
            action,
            as_agent,
            by,
        });
        async move {
            rx.await
                .unwrap_or_else(|_| Err("the channel went away".to_owned()))
        }
    }

    /// A session another node created: the root starts this node's copy.
    pub fn adopt_session(&self, c: crate::store::RecoveredChannel) {
        if let ChannelAddr::Root(a) = self {
            a.do_send(super::root::AdoptSession(c));
        }
    }

    /// A chat another node created in this session: the session starts
    /// this node's copy.
    pub fn adopt_chat(&self, c: crate::store::RecoveredChannel) {
        if let ChannelAddr::Session(a) = self {
            a.do_send(super::session::AdoptChat(c));
        }
    }

    /// A channel another node disposed: this node's copy goes (asked of
    /// the root for a session, of the session for a chat).
    pub fn forget(&self, uri: ChannelUri) {
        match self {
            ChannelAddr::Root(a) => a.do_send(RemoveSession {
                uri,
                local: true,
                by: None,
            }),
            ChannelAddr::Session(a) => a.do_send(super::session::ForgetChat(uri)),
            ChannelAddr::Chat(_) => {}
        }
    }

    /// Subscribe `conn`: resolves to the channel's snapshot, after which
    /// every envelope of the channel reaches `conn`, or to the channel's
    /// refusal (its state cannot be vouched for, see
    /// [`super::core::ChannelCore::subscribe`]). The outer error means the
    /// channel is gone (its actor stopped while we asked).
    pub fn subscribe(
        &self,
        conn: Arc<Outbound>,
        view_turns: Option<i64>,
    ) -> impl Future<Output = Result<Result<SnapshotJson, RpcError>, MailboxError>> + 'static {
        let msg = Subscribe { conn, view_turns };
        let addr = self.clone();
        async move {
            match addr {
                ChannelAddr::Chat(a) => a.send(msg).await,
                ChannelAddr::Session(a) => a.send(msg).await,
                ChannelAddr::Root(a) => a.send(msg).await,
            }
        }
    }

    /// `createSession` (asked of the root); the session runs on `home`.
    pub fn create_session(
        &self,
        uri: ChannelUri,
        provider: Option<String>,
        owner: SessionOwner,
        home: ArbiterHandle,
    ) -> impl Future<Output = Result<(), RpcError>> + 'static {
        let msg = CreateSession {
            uri,
            provider,
            owner: Some((owner.subject, owner.max_sessions)),
            home: Some(home),
        };
        let sent = self.root().map(|a| a.send(msg));
        async move { answered(sent?.await) }
    }

    /// `disposeSession` (asked of the root).
    pub fn dispose_session(
        &self,
        uri: ChannelUri,
        by: Option<Person>,
    ) -> impl Future<Output = Result<(), RpcError>> {
        let sent = self.root().map(|a| {
            a.send(RemoveSession {
                uri,
                local: false,
                by,
            })
        });
        async move { answered(sent?.await) }
    }

    /// `listSessions` (asked of the root): those in `scope` when set, a page
    /// of `limit` from `cursor`.
    pub fn list_sessions(
        &self,
        scope: Option<Arc<std::collections::HashSet<String>>>,
        limit: Option<i64>,
        cursor: Option<String>,
    ) -> impl Future<Output = Result<ListSessionsResult, RpcError>> {
        let msg = ListSessions {
            scope,
            limit,
            cursor,
        };
        let sent = self.root().map(|a| a.send(msg));
        async move { answered(sent?.await) }
    }

    /// The registered agents changed: the root republishes its list.
    pub fn agents_changed(&self) {
        if let ChannelAddr::Root(a) = self {
            a.do_send(AgentsChanged);
        }
    }

    /// `createChat` in this session; `None` unless this is a session.
    pub fn create_chat(
        &self,
        chat: ChannelUri,
        by: Option<Person>,
    ) -> Option<impl Future<Output = Result<(), RpcError>>> {
        let sent = self.session()?.send(CreateChat { chat, by });
        Some(async move { answered(sent.await) })
    }

    /// `disposeChat` of one of this session's chats; `None` unless this is a
    /// session.
    pub fn remove_chat(
        &self,
        chat: ChannelUri,
        by: Option<Person>,
    ) -> Option<impl Future<Output = Result<(), RpcError>>> {
        let sent = self.session()?.send(RemoveChat { chat, by });
        Some(async move { answered(sent.await) })
    }

    /// `tandem/setAccess` in this session; `None` unless this is a session.
    pub fn set_access(
        &self,
        subject: String,
        access: Option<crate::people::Access>,
        by: Option<Person>,
    ) -> Option<impl Future<Output = Result<serde_json::Value, RpcError>>> {
        let sent = self.session()?.send(crate::channels::session::SetAccess {
            subject,
            access,
            by,
        });
        Some(async move { sent.await.map_err(|e| RpcError::internal(e.to_string()))? })
    }

    /// A change to this session's invite links; `None` unless this is a
    /// session.
    pub fn invites(
        &self,
        op: crate::channels::session::InviteOp,
        by: Option<Person>,
    ) -> Option<impl Future<Output = Result<serde_json::Value, RpcError>>> {
        let sent = self
            .session()?
            .send(crate::channels::session::Invites { op, by });
        Some(async move { sent.await.map_err(|e| RpcError::internal(e.to_string()))? })
    }

    /// `tandem/listPending`: the session's unsettled interactions; `None`
    /// unless this is a session.
    pub fn list_pending(&self) -> Option<impl Future<Output = Result<Vec<PendingItem>, RpcError>>> {
        let sent = self.session()?.send(ListPending);
        Some(async move { sent.await.map_err(|e| RpcError::internal(e.to_string())) })
    }

    /// `fetchTurns`: page older turns into the chat; resolves once they are
    /// published. `None` unless this is a chat.
    pub fn fetch_turns(
        &self,
        cursor: Option<String>,
    ) -> Option<impl Future<Output = Result<(), RpcError>>> {
        let ChannelAddr::Chat(a) = self else {
            return None;
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        a.do_send(FetchTurns { cursor, reply });
        Some(async move {
            rx.await
                .map_err(|_| RpcError::internal("the chat went away"))?
        })
    }

    /// `tandem/openText`: one of a chat's texts and its revision, for
    /// `author` to edit (`from_node`: another cluster node forwarded it,
    /// so it is not forwarded again). `None` unless this is a chat.
    pub fn open_text(
        &self,
        target: TextTarget,
        author: String,
        from_node: bool,
    ) -> Option<impl Future<Output = Result<TextState, RpcError>>> {
        let ChannelAddr::Chat(a) = self else {
            return None;
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        a.do_send(OpenText {
            target,
            author,
            from_node,
            reply,
        });
        Some(async move {
            rx.await
                .map_err(|_| RpcError::internal("the chat went away"))?
        })
    }

    /// `tandem/editText`: `author`'s edit number `seq` on revision `base`;
    /// resolves with the revision it made, once durable (`from_node` as
    /// for [`Self::open_text`]). `None` unless this is a chat.
    #[allow(clippy::too_many_arguments)]
    pub fn edit_text(
        &self,
        target: TextTarget,
        author: String,
        seq: u64,
        base: u64,
        op: TextOp,
        by: Option<Person>,
        from_node: bool,
    ) -> Option<impl Future<Output = Result<u64, RpcError>>> {
        let ChannelAddr::Chat(a) = self else {
            return None;
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        a.do_send(EditText {
            target,
            author,
            seq,
            base,
            op,
            by,
            from_node,
            reply,
        });
        Some(async move {
            rx.await
                .map_err(|_| RpcError::internal("the chat went away"))?
        })
    }

    /// Whether a session's actor is behind this address.
    pub fn is_session(&self) -> bool {
        matches!(self, ChannelAddr::Session(_))
    }

    /// Whether a chat's actor is behind this address.
    pub fn is_chat(&self) -> bool {
        matches!(self, ChannelAddr::Chat(_))
    }

    /// `tandem/requestInteraction`: ask a person on turn `turn_id` of chat
    /// `uri`; resolves with the settlement, exactly once (`aborted` when
    /// this is not a chat, or the chat goes away).
    pub fn interact(
        &self,
        uri: ChannelUri,
        turn_id: String,
        interaction: Interaction,
    ) -> impl Future<Output = Settlement> {
        let handle = match self {
            ChannelAddr::Chat(a) => Some(crate::channels::chat::ChatHandle::new(
                a.clone(),
                uri,
                turn_id,
                String::new(),
            )),
            _ => None,
        };
        async move {
            match handle {
                Some(handle) => handle.interact(interaction).await,
                None => Settlement::with_reason(Outcome::Aborted, "not a chat"),
            }
        }
    }

    /// The session actor behind this address, if it is one.
    fn session(&self) -> Option<&actix::Addr<SessionActor>> {
        match self {
            ChannelAddr::Session(a) => Some(a),
            _ => None,
        }
    }

    /// The root actor behind this address, or why a root request cannot be
    /// made of it.
    fn root(&self) -> Result<actix::Addr<RootActor>, RpcError> {
        match self {
            ChannelAddr::Root(a) => Ok(a.clone()),
            _ => Err(RpcError::internal("a root request sent to another channel")),
        }
    }
}
