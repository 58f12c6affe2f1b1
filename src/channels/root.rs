//! The root actor: `ahp-root://` state (agents, session count), session
//! creation and disposal, and the session catalog behind `listSessions`.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use ahp_types::actions::{RootActiveSessionsChangedAction, RootAgentsChangedAction, StateAction};
use ahp_types::notifications::{
    PartialSessionSummary, SessionAddedParams, SessionRemovedParams, SessionSummaryChangedParams,
};
use ahp_types::state::{RootState, SessionSummary};
use ahp_types::ROOT_RESOURCE_URI;
use bytestring::ByteString;

use super::core::{ChannelCore, Shared};
use super::registry::{Channel, ChannelAddr};
use super::session::{DisposeSession, InitSession, SessionActor};
use super::validate;
use super::{ClientDispatch, SnapshotJson, Subscribe};
use crate::protocol::{encode_notification, errors, RpcError};
use crate::publish::Hub;
use crate::store::{ChannelInfo, ChannelKind};

/// The root channel.
pub struct RootActor {
    core: ChannelCore,
    /// Own address, handed to the sessions it starts.
    me: Addr<RootActor>,
    state: RootState,
    sessions: HashMap<Arc<str>, (Addr<SessionActor>, SessionSummary)>,
    /// Sessions created per token subject (for the per-token limit).
    owned: HashMap<String, std::collections::HashSet<Arc<str>>>,
}

impl RootActor {
    /// The root channel with the given agents registered.
    pub fn new(hub: Arc<Hub>, shared: Arc<Shared>, me: Addr<RootActor>) -> Self {
        let agents = shared.providers.infos();
        Self {
            me,
            core: ChannelCore::new(ROOT_RESOURCE_URI.into(), hub, shared),
            state: RootState {
                agents,
                active_sessions: Some(0),
                terminals: None,
                config: None,
                meta: None,
            },
            sessions: HashMap::new(),
            owned: HashMap::new(),
        }
    }

    /// Root state is derived (the agents registered, the sessions that exist),
    /// so its actions are published without a journal entry: after a restart
    /// it is rebuilt from the stored sessions.
    fn host_action(&mut self, action: StateAction) {
        if ahp::reducers::apply_action_to_root(&mut self.state, &action)
            != ahp::ReduceOutcome::Applied
        {
            return;
        }
        self.core.publish_unjournaled(&action, false);
    }

    /// A root notification about `session`, to the subscribers who may see it.
    fn notify(&self, session: &str, method: &str, params: &impl serde::Serialize) {
        let params = serde_json::to_value(params).unwrap_or_default();
        self.core.hub.notify_about(
            session,
            &ByteString::from(encode_notification(method, &params)),
        );
    }

    /// The server context.
    pub fn shared(&self) -> Arc<Shared> {
        self.core.shared.clone()
    }

    /// Own address.
    pub fn address(&self) -> Addr<RootActor> {
        self.me.clone()
    }

    /// Publish the session count — to the subscribers that see every
    /// session only: a scoped client would learn other tenants' activity
    /// from it, so its root state has no `activeSessions` at all.
    pub fn session_count_changed(&mut self) {
        let n = self.sessions.len() as i64;
        let action = StateAction::RootActiveSessionsChanged(RootActiveSessionsChangedAction {
            active_sessions: n,
        });
        if ahp::reducers::apply_action_to_root(&mut self.state, &action)
            != ahp::ReduceOutcome::Applied
        {
            return;
        }
        self.core.publish_unjournaled(&action, true);
    }
}

impl Actor for RootActor {
    type Context = Context<Self>;
}

impl Handler<ClientDispatch> for RootActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, _: &mut Self::Context) {
        let reason = match &msg.action {
            StateAction::Unknown(raw) => validate::malformed_reason(raw),
            StateAction::RootConfigChanged(_) => {
                "this host has no root configuration to change".to_owned()
            }
            other => format!(
                "`{}` is not a client-dispatchable action",
                validate::action_type(other)
            ),
        };
        self.core
            .reject(&msg.conn, &msg.origin, &msg.action, &reason);
    }
}

impl Handler<Subscribe> for RootActor {
    type Result = Result<SnapshotJson, RpcError>;

    fn handle(&mut self, msg: Subscribe, _: &mut Self::Context) -> Self::Result {
        if msg.conn.is_scoped() {
            let scoped = RootState {
                active_sessions: None,
                ..self.state.clone()
            };
            return self.core.subscribe(&msg.conn, &scoped);
        }
        self.core.subscribe(&msg.conn, &self.state)
    }
}

/// `createSession`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct CreateSession {
    /// The client-chosen `ahp-session:/<id>` URI.
    pub uri: String,
    /// Token subject creating it, and how many sessions it may own.
    pub owner: Option<(String, usize)>,
    /// Provider id (default: the built-in `scripted`).
    pub provider: Option<String>,
}

impl Handler<CreateSession> for RootActor {
    type Result = ResponseFuture<Result<(), RpcError>>;

    fn handle(&mut self, msg: CreateSession, _: &mut Self::Context) -> Self::Result {
        match self.create_session(msg) {
            Ok(done) => Box::pin(async move {
                done.await
                    .unwrap_or_else(|_| Err(super::Rejection::new("the session went away")))
                    .map_err(|r| {
                        RpcError::internal(format!("the session could not be stored: {r}"))
                    })
            }),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

impl RootActor {
    fn create_session(
        &mut self,
        msg: CreateSession,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<(), super::Rejection>>, RpcError> {
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
        let provider = msg
            .provider
            .unwrap_or_else(|| crate::providers::scripted::PROVIDER_ID.to_owned());
        if self.core.shared.providers.get(&provider).is_none() {
            return Err(RpcError::new(
                errors::PROVIDER_NOT_FOUND,
                format!("no provider `{provider}` is registered"),
            ));
        }
        if self.core.shared.registry.contains(&msg.uri) {
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
        let shared = self.core.shared.clone();
        let uri: Arc<str> = msg.uri.into();
        if let Some((owner, _)) = &msg.owner {
            self.note_owner(owner, uri.clone());
        }
        let session_actor = SessionActor::new(
            uri.clone(),
            Arc::new(Hub::default()),
            shared.clone(),
            provider.clone(),
            self.me.clone(),
        );
        let summary = session_actor.summary();
        drop(shared.journal.create_channel(ChannelInfo {
            uri: uri.to_string(),
            kind: ChannelKind::Session,
            session: None,
            provider,
            title: summary.title.clone(),
            created_at: summary.created_at.clone(),
            owner: msg.owner.as_ref().map(|(owner, _)| owner.clone()),
        }));
        let (done, rx) = tokio::sync::oneshot::channel();
        let addr = self.start_session(uri.clone(), session_actor, summary.clone());
        addr.do_send(InitSession {
            default_chat: format!("ahp-chat:/{}", uuid::Uuid::new_v4()).into(),
            done,
        });
        self.notify(
            &uri,
            "root/sessionAdded",
            &SessionAddedParams {
                channel: ROOT_RESOURCE_URI.into(),
                summary,
            },
        );
        self.session_count_changed();
        Ok(rx)
    }

    /// `owner` created `session` (counted against its session limit).
    pub fn note_owner(&mut self, owner: &str, session: Arc<str>) {
        self.owned
            .entry(owner.to_owned())
            .or_default()
            .insert(session);
    }

    /// Start a session actor, register it, and list it.
    pub fn start_session(
        &mut self,
        uri: Arc<str>,
        actor: SessionActor,
        summary: SessionSummary,
    ) -> Addr<SessionActor> {
        let shared = self.core.shared.clone();
        let hub = actor.hub();
        let provider: Arc<str> = summary.provider.as_str().into();
        let addr = SessionActor::start_in_arbiter(&shared.next_arbiter(), move |_| actor);
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

/// `disposeSession`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct RemoveSession {
    /// The session URI.
    pub uri: String,
}

impl Handler<RemoveSession> for RootActor {
    type Result = Result<(), RpcError>;

    fn handle(&mut self, msg: RemoveSession, _: &mut Self::Context) -> Self::Result {
        let Some((addr, _)) = self.sessions.remove(msg.uri.as_str()) else {
            return Err(RpcError::new(
                errors::SESSION_NOT_FOUND,
                format!("no session `{}`", msg.uri),
            ));
        };
        self.core.shared.registry.remove(&msg.uri);
        addr.do_send(DisposeSession);
        for owned in self.owned.values_mut() {
            owned.remove(msg.uri.as_str());
        }
        let session = msg.uri.clone();
        self.notify(
            &session,
            "root/sessionRemoved",
            &SessionRemovedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: msg.uri,
            },
        );
        self.session_count_changed();
        Ok(())
    }
}

/// A session's summary changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SessionSummaryChanged {
    /// The session.
    pub session: Arc<str>,
    /// The full new summary.
    pub summary: SessionSummary,
    /// Only the fields that changed.
    pub changes: PartialSessionSummary,
}

impl Handler<SessionSummaryChanged> for RootActor {
    type Result = ();

    fn handle(&mut self, msg: SessionSummaryChanged, _: &mut Self::Context) {
        let Some(entry) = self.sessions.get_mut(&msg.session) else {
            return;
        };
        entry.1 = msg.summary;
        self.notify(
            &msg.session,
            "root/sessionSummaryChanged",
            &SessionSummaryChangedParams {
                channel: ROOT_RESOURCE_URI.into(),
                session: msg.session.to_string(),
                changes: msg.changes,
            },
        );
    }
}

/// `listSessions`: most recently modified first, paged by offset cursors.
#[derive(Message)]
#[rtype(result = "Result<ahp_types::commands::ListSessionsResult, RpcError>")]
pub struct ListSessions {
    /// Only sessions in this set (a scoped token).
    pub scope: Option<Arc<std::collections::HashSet<String>>>,
    /// Page size.
    pub limit: Option<i64>,
    /// Cursor from a previous page.
    pub cursor: Option<String>,
}

/// Largest page `listSessions` returns.
const MAX_PAGE: usize = 500;

impl Handler<ListSessions> for RootActor {
    type Result = Result<ahp_types::commands::ListSessionsResult, RpcError>;

    fn handle(&mut self, msg: ListSessions, _: &mut Self::Context) -> Self::Result {
        let offset = match &msg.cursor {
            None => 0,
            Some(c) => c
                .strip_prefix("offset:")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| RpcError::invalid_params(format!("unrecognised cursor `{c}`")))?,
        };
        let limit = msg
            .limit
            .map_or(MAX_PAGE, |l| (l.max(1) as usize).min(MAX_PAGE));
        let mut all: Vec<&SessionSummary> = self
            .sessions
            .values()
            .map(|(_, s)| s)
            .filter(|s| msg.scope.as_ref().is_none_or(|sc| sc.contains(&s.resource)))
            .collect();
        all.sort_by(|a, b| {
            b.modified_at
                .cmp(&a.modified_at)
                .then_with(|| a.resource.cmp(&b.resource))
        });
        let items: Vec<SessionSummary> = all
            .iter()
            .skip(offset)
            .take(limit)
            .map(|s| (*s).clone())
            .collect();
        let next = offset + items.len();
        Ok(ahp_types::commands::ListSessionsResult {
            next_cursor: (next < all.len()).then(|| format!("offset:{next}")),
            items,
        })
    }
}

/// Replace the agent list (a provider registered or left).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AgentsChanged;

impl Handler<AgentsChanged> for RootActor {
    type Result = ();

    fn handle(&mut self, _: AgentsChanged, _: &mut Self::Context) {
        let agents = self.core.shared.providers.infos();
        self.host_action(StateAction::RootAgentsChanged(RootAgentsChangedAction {
            agents,
        }));
    }
}
