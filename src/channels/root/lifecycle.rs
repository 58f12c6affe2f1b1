//! Session creation and disposal, durable before visible: root lists a new
//! session (`root/sessionAdded`, the session count, `listSessions`) and
//! answers `createSession` only once its record and first actions are in
//! the journal, and answers `disposeSession` and notifies its removal only
//! once the journal has forgotten it.

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;
use ahp_types::notifications::{PartialSessionSummary, SessionAddedParams, SessionRemovedParams};
use ahp_types::state::SessionSummary;
use ahp_types::ROOT_RESOURCE_URI;

use super::RootActor;
use crate::channels::core::durable;
use crate::channels::forward::{ask_owner, ForwardRequest};
use crate::channels::recovery::{self, Rebuilt};
use crate::channels::registry::{Channel, ChannelAddr};
use crate::channels::session::summary_of;
use crate::channels::session::{DisposeSession, InitSession, SessionActor};
use crate::channels::validate::Rejection;
use crate::ids::ChannelUri;
use crate::protocol::{errors, RpcError};
use crate::publish::Hub;
use crate::store::{ChannelInfo, ChannelKind, RecoveredChannel};

/// A session started but not yet stored: not listed, not counted, not
/// announced.
pub(super) struct Creating {
    /// The summary `root/sessionAdded` carries (as created).
    added: SessionSummary,
    /// Summary changes reported meanwhile, announced after it.
    changes: Vec<PartialSessionSummary>,
}

/// `createSession`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct CreateSession {
    /// The client-chosen `ahp-session:/<id>` URI.
    pub uri: ChannelUri,
    /// Token subject creating it, and how many sessions it may own.
    pub owner: Option<(String, usize)>,
    /// Provider id (default: the directory's default, the built-in `scripted`).
    pub provider: Option<String>,
    /// The thread the session and its chats run on: the one serving the
    /// creating client's connection, so its actions need no hand-off
    /// between threads (`None`: the next of the actor threads).
    pub home: Option<ArbiterHandle>,
}

impl Handler<CreateSession> for RootActor {
    type Result = ResponseActFuture<Self, Result<(), RpcError>>;

    fn handle(&mut self, msg: CreateSession, _: &mut Self::Context) -> Self::Result {
        let (uri, stored) = match self.create_session(msg) {
            Ok(started) => started,
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        };
        Box::pin(
            stored
                .into_actor(self)
                .map(move |stored, act, _| match stored {
                    Ok(()) => {
                        act.session_stored(&uri);
                        Ok(())
                    }
                    Err(e) => {
                        act.session_not_stored(&uri);
                        Err(e)
                    }
                }),
        )
    }
}

/// `disposeSession`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct RemoveSession {
    /// The session URI.
    pub uri: ChannelUri,
    /// Only this node's copy: the node that runs the session disposed it.
    pub local: bool,
    /// Who asks (`None`: the host), checked where the session runs.
    pub by: Option<crate::people::Person>,
}

impl Handler<RemoveSession> for RootActor {
    type Result = ResponseActFuture<Self, Result<(), RpcError>>;

    fn handle(&mut self, msg: RemoveSession, ctx: &mut Self::Context) -> Self::Result {
        if !msg.local && self.core.shared.follows(&msg.uri) {
            return self.dispose_at_owner(ctx, msg.uri, msg.by);
        }
        let shared = &self.core.shared;
        let (default, need) = (shared.config.session_access, crate::people::Access::Owner);
        let allowed = shared.access.permit(
            &msg.uri,
            msg.by.as_ref(),
            default,
            need,
            "disposing of the session",
        );
        if let Err(r) = allowed {
            let e = RpcError::new(errors::PERMISSION_DENIED, r.0);
            return Box::pin(actix::fut::ready(Err(e)));
        }
        let Some((addr, summary)) = self.sessions.remove(msg.uri.as_str()) else {
            return Box::pin(actix::fut::ready(Err(RpcError::new(
                errors::SESSION_NOT_FOUND,
                format!("no session `{}`", msg.uri),
            ))));
        };
        crate::memory::shrink_map_if_sparse(&mut self.sessions);
        self.agent_forgets(&summary.provider, &msg.uri);
        // Gone for new requests at once; announced once the store forgot it.
        let announced = self.creating.remove(msg.uri.as_str()).is_none();
        self.core.shared.registry.remove(&msg.uri);
        for owned in self.owned.values_mut() {
            owned.remove(msg.uri.as_str());
        }
        let journal = self.core.shared.journal.clone();
        let removed = async move {
            addr.send(DisposeSession)
                .await
                .map_err(|_| "the session went away before it was removed".to_owned())?;
            durable(journal).await
        };
        Box::pin(removed.into_actor(self).map(move |removed, act, _| {
            if let Err(e) = removed {
                tracing::error!(session = %msg.uri, error = %e, "session removal not stored");
                return Err(RpcError::internal(format!(
                    "the removal could not be stored: {e}"
                )));
            }
            if announced {
                act.notify(
                    &msg.uri,
                    "root/sessionRemoved",
                    &SessionRemovedParams {
                        channel: ROOT_RESOURCE_URI.into(),
                        session: msg.uri.to_string(),
                    },
                );
                act.session_count_changed();
            }
            // The session's chats, states and queues are freed: hand the
            // pages back rather than keep them for reuse.
            crate::memory::release_soon(act.core.shared.all_arbiters());
            Ok(())
        }))
    }
}

/// A session another node of the cluster created: start this node's copy
/// (its chats follow with [`crate::channels::session::AdoptChat`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AdoptSession(pub RecoveredChannel);

impl Handler<AdoptSession> for RootActor {
    type Result = ();

    fn handle(&mut self, msg: AdoptSession, _: &mut Self::Context) {
        let c = msg.0;
        let uri = c.info.uri.clone();
        if self.core.shared.registry.contains(&uri) {
            return;
        }
        if let Some(link) = &self.core.shared.cluster {
            link.follows(&uri);
        }
        let shared = self.shared();
        let state = match recovery::rebuild(&c, shared.config.turns_window, &*shared.providers) {
            Ok(Rebuilt::Session(state)) => state,
            Ok(Rebuilt::Chat(..)) => return,
            Err(e) => {
                tracing::error!(session = %uri, error = %e, "a session another node created cannot be read");
                return;
            }
        };
        let summary = summary_of(&uri, &state, &c.info.created_at);
        let actor = SessionActor::recovered(
            uri.clone(),
            Arc::new(Hub::default()),
            shared,
            *state,
            c.info.created_at.clone(),
            self.address(),
        );
        if let Some(owner) = &c.info.owner {
            self.note_owner(owner, uri.clone());
        }
        let home = self.core.shared.next_arbiter();
        let addr = self.start_session(uri.clone(), actor, summary.clone(), &home);
        addr.do_send(crate::channels::Resync(c.len));
        self.notify(
            &uri,
            "root/sessionAdded",
            &SessionAddedParams {
                channel: ROOT_RESOURCE_URI.into(),
                summary,
            },
        );
        self.session_count_changed();
    }
}

impl RootActor {
    /// `disposeSession` of a session another node runs: asked of it; this
    /// node's copy goes once it answered, before the client hears back.
    fn dispose_at_owner(
        &mut self,
        ctx: &mut Context<Self>,
        uri: ChannelUri,
        by: Option<crate::people::Person>,
    ) -> ResponseActFuture<Self, Result<(), RpcError>> {
        let link = self.core.shared.cluster.clone();
        let me = ctx.address();
        let asked = async move {
            let request = ForwardRequest::DisposeSession {
                session: uri.to_string(),
                by,
            };
            ask_owner(link, &uri, request).await?.into_result()?;
            me.send(RemoveSession {
                uri,
                local: true,
                by: None,
            })
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?
            .or(Ok(()))
        };
        Box::pin(asked.into_actor(self))
    }

    /// Check `msg`, start the session and its default chat, and return its
    /// URI with a future that resolves once its record and its first
    /// actions are stored.
    fn create_session(
        &mut self,
        msg: CreateSession,
    ) -> Result<(ChannelUri, impl Future<Output = Result<(), RpcError>>), RpcError> {
        let prefix = "ahp-session:/";
        let max_uri = self.core.shared.config.limits.max_uri_bytes;
        if msg.uri.len() > max_uri {
            return Err(RpcError::invalid_params(format!(
                "a session URI of {} bytes is over the limit of {max_uri}",
                msg.uri.len()
            )));
        }
        if !msg.uri.starts_with(prefix)
            || msg.uri.len() <= prefix.len()
            || msg.uri[prefix.len()..].contains('/')
        {
            return Err(RpcError::invalid_params(format!(
                "session URI `{}` must look like `ahp-session:/<id>`",
                msg.uri
            )));
        }
        let shared = self.core.shared.clone();
        let provider = msg
            .provider
            .unwrap_or_else(|| shared.providers.default_provider().to_owned());
        let Some(agent) = shared.providers.get(&provider) else {
            return Err(RpcError::new(
                errors::PROVIDER_NOT_FOUND,
                format!("no provider `{provider}` is registered"),
            ));
        };
        let agent_name = provider.clone();
        if shared.registry.contains(&msg.uri) {
            return Err(RpcError::new(
                errors::SESSION_ALREADY_EXISTS,
                format!("session `{}` already exists", msg.uri),
            ));
        }
        if let Some((owner, max)) = &msg.owner {
            let n = self.owned.get(owner).map_or(0, |s| s.len());
            if n >= *max {
                return Err(RpcError::invalid_request(format!(
                    "session limit reached: `{owner}` may create at most {max} sessions"
                )));
            }
        }
        let uri = msg.uri;
        if let Some((owner, _)) = &msg.owner {
            self.note_owner(owner, uri.clone());
        }
        let session_actor = SessionActor::new(
            uri.clone(),
            Arc::new(Hub::default()),
            shared.clone(),
            provider.clone(),
            msg.owner.as_ref().map(|(owner, _)| owner.as_str()),
            self.me.clone(),
        );
        let summary = session_actor.summary();
        // Queued before the session's first actions.
        let recorded = shared.journal.create_channel(ChannelInfo {
            uri: uri.clone(),
            kind: ChannelKind::Session,
            session: None,
            provider,
            title: summary.title.clone(),
            created_at: summary.created_at.clone(),
            owner: msg.owner.as_ref().map(|(owner, _)| owner.clone()),
        });
        let (done, ready) = tokio::sync::oneshot::channel();
        self.creating.insert(
            uri.clone(),
            Creating {
                added: summary.clone(),
                changes: Vec::new(),
            },
        );
        let home = msg.home.unwrap_or_else(|| shared.next_arbiter());
        let addr = self.start_session(uri.clone(), session_actor, summary, &home);
        addr.do_send(InitSession {
            default_chat: format!("ahp-chat:/{}", uuid::Uuid::new_v4()).into(),
            done,
        });
        // The agent gets ready (an ACP agent starts its process and opens
        // its own session) while the record is written; a failure to start
        // answers `createSession` with the cause and the session never was.
        let opening = agent.open_session(&uri);
        let stored = async move {
            let not_stored =
                |r: Rejection| RpcError::internal(format!("the session could not be stored: {r}"));
            let opened = opening.await;
            recorded
                .await
                .map_err(|e| not_stored(Rejection::new(e.to_string())))?;
            ready
                .await
                .unwrap_or_else(|_| Err(Rejection::new("the session went away")))
                .map_err(not_stored)?;
            opened.map_err(|e| {
                RpcError::internal(format!(
                    "agent `{agent_name}` could not start the session: {e}"
                ))
            })
        };
        Ok((uri, stored))
    }

    /// The new session is stored: list it, count it, announce it (and what
    /// changed in it meanwhile).
    fn session_stored(&mut self, uri: &ChannelUri) {
        // Disposed meanwhile: never announced, nothing to take back.
        let Some(creating) = self.creating.remove(uri) else {
            return;
        };
        self.notify(
            uri,
            "root/sessionAdded",
            &SessionAddedParams {
                channel: ROOT_RESOURCE_URI.into(),
                summary: creating.added,
            },
        );
        self.session_count_changed();
        for changes in creating.changes {
            self.notify_summary_changed(uri, changes);
        }
    }

    /// The new session could not be stored: it never existed for clients.
    fn session_not_stored(&mut self, uri: &ChannelUri) {
        if self.creating.remove(uri).is_none() {
            return;
        }
        if let Some((addr, summary)) = self.sessions.remove(uri) {
            addr.do_send(DisposeSession);
            self.agent_forgets(&summary.provider, uri);
        }
        self.core.shared.registry.remove(uri);
        for owned in self.owned.values_mut() {
            owned.remove(uri);
        }
    }

    /// Tell the session's agent it is gone (an ACP agent stops its process).
    fn agent_forgets(&self, provider: &str, session: &str) {
        if let Some(agent) = self.core.shared.providers.get(provider) {
            agent.session_disposed(session);
        }
    }

    /// Whether `session` is started but not yet stored (not announced).
    pub(super) fn is_creating(&self, session: &str) -> bool {
        self.creating.contains_key(session)
    }

    /// Hold a summary change of a session not yet announced.
    pub(super) fn defer_summary_change(&mut self, session: &str, changes: PartialSessionSummary) {
        if let Some(c) = self.creating.get_mut(session) {
            c.changes.push(changes);
        }
    }

    /// `owner` created `session` (counted against its session limit).
    pub fn note_owner(&mut self, owner: &str, session: ChannelUri) {
        self.owned
            .entry(owner.to_owned())
            .or_default()
            .insert(session);
    }

    /// Start a session actor on `arbiter`, register it, and list it.
    pub fn start_session(
        &mut self,
        uri: ChannelUri,
        actor: SessionActor,
        summary: SessionSummary,
        arbiter: &ArbiterHandle,
    ) -> Addr<SessionActor> {
        let shared = self.core.shared.clone();
        let hub = actor.hub();
        let provider: Arc<str> = summary.provider.as_str().into();
        let addr = SessionActor::start_in_arbiter(arbiter, move |_| actor);
        shared.registry.insert(Channel {
            uri: uri.clone(),
            hub,
            addr: ChannelAddr::Session(addr.clone()),
            session: Some(uri.clone()),
            provider: Some(provider),
        });
        self.sessions.insert(uri, (addr.clone(), summary));
        addr
    }
}
