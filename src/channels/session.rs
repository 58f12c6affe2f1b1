//! The session actor: owner of one `SessionState` — its chat catalog, config,
//! and the roll-up of everything its chats wait on.

use std::sync::Arc;

use actix::prelude::*;
use ahp::reducers::{apply_action_to_session, ReduceOutcome};
use ahp_types::actions::{
    PartialChatSummary, SessionChatAddedAction, SessionChatRemovedAction, SessionChatUpdatedAction,
    SessionInputNeededRemovedAction, SessionInputNeededSetAction, SessionReadyAction, StateAction,
};
use ahp_types::notifications::PartialSessionSummary;
use ahp_types::state::{
    ChatSummary, SessionConfigPropertySchema, SessionConfigSchema, SessionConfigState,
    SessionInputRequest, SessionLifecycle, SessionState, SessionStatus, SessionSummary,
    ToolCallConfirmationReason,
};
use serde_json::Value;

use super::chat::{ChatActor, DisposeChat};
use super::core::{Accepted, ChannelCore, Shared};
use super::registry::{Channel, ChannelAddr};
use super::root::{RootActor, SessionSummaryChanged};
use super::validate::{self, Rejection};
use super::{ClientDispatch, SnapshotJson, Subscribe};
use crate::protocol::{errors, RpcError};
use crate::publish::Hub;
use crate::store::{ChannelInfo, ChannelKind};
use crate::time::now_rfc3339;
use tokio::sync::oneshot;

/// Answered once a batch is published (or with why it was not).
pub type Done = oneshot::Sender<Result<(), Rejection>>;

/// Session config key for the approval policy.
pub const APPROVAL_MODE: &str = "approvalMode";
/// `_meta` key: the approval mode in effect (it follows the configured one at
/// the next approval checkpoint).
pub const EFFECTIVE_MODE_META: &str = "tandem/effectiveApprovalMode";
/// `_meta` key: tool names approved for the whole session.
pub const GRANTS_META: &str = "tandem/toolGrants";

/// The approval mode where tool calls run without asking.
pub const ALWAYS_ALLOW: &str = "always-allow";

/// One session channel.
pub struct SessionActor {
    core: ChannelCore,
    state: SessionState,
    root: Addr<RootActor>,
    chats: Vec<(Arc<str>, Addr<ChatActor>)>,
    created_at: String,
    /// The summary as last reported to root (changes are diffed against it).
    reported: SessionSummary,
}

impl SessionActor {
    /// A new session of `provider`, not yet ready.
    pub fn new(
        uri: Arc<str>,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        provider: String,
        root: Addr<RootActor>,
    ) -> Self {
        Self::recovered(
            uri,
            hub,
            shared,
            new_session_state(provider),
            now_rfc3339(),
            root,
        )
    }

    /// A session rebuilt from the store (its chats are attached after).
    pub fn recovered(
        uri: Arc<str>,
        hub: Arc<Hub>,
        shared: Arc<Shared>,
        state: SessionState,
        created_at: String,
        root: Addr<RootActor>,
    ) -> Self {
        let reported = summary_of(&uri, &state, &created_at);
        Self {
            core: ChannelCore::new(uri, hub, shared),
            state,
            root,
            chats: Vec::new(),
            reported,
            created_at,
        }
    }

    /// After a failed append: go back to what the store holds.
    fn roll_back(&mut self) {
        match self.core.shared.journal.load_channel(&self.core.uri) {
            Ok(Some(c)) => match super::recovery::rebuild(&c, usize::MAX) {
                Ok(super::recovery::Rebuilt::Session(state)) => self.state = *state,
                _ => tracing::error!(session = %self.core.uri, "cannot rebuild the session"),
            },
            Ok(None) => {
                tracing::error!(session = %self.core.uri, "the session is not in the store")
            }
            Err(e) => {
                tracing::error!(session = %self.core.uri, error = %e, "cannot read the store to roll back")
            }
        }
    }

    /// The channel's subscriber hub.
    pub fn hub(&self) -> Arc<Hub> {
        self.core.hub.clone()
    }

    /// The catalog summary root keeps for `listSessions`.
    pub fn summary(&self) -> SessionSummary {
        summary_of(&self.core.uri, &self.state, &self.created_at)
    }

    fn reduce(&mut self, action: &StateAction) -> Result<(), Rejection> {
        match apply_action_to_session(&mut self.state, action) {
            ReduceOutcome::Applied => Ok(()),
            ReduceOutcome::NoOp => Err(Rejection::new(format!(
                "`{}` has no effect on this session",
                validate::action_type(action)
            ))),
            ReduceOutcome::OutOfScope => Err(Rejection::new(format!(
                "`{}` is not a session action",
                validate::action_type(action)
            ))),
            ReduceOutcome::Invalid(e) => Err(Rejection::new(e.to_string())),
        }
    }

    fn host_actions(&mut self, ctx: &mut Context<Self>, actions: Vec<StateAction>) {
        self.host_actions_then(ctx, actions, None);
    }

    /// Reduce and journal host actions; `done` is answered once published.
    fn host_actions_then(
        &mut self,
        ctx: &mut Context<Self>,
        actions: Vec<StateAction>,
        done: Option<Done>,
    ) {
        let mut batch = Vec::new();
        for a in actions {
            match self.reduce(&a) {
                Ok(()) => batch.push(Accepted::new(a, None)),
                Err(r) => {
                    tracing::debug!(session = %self.core.uri, reason = %r, "host action skipped")
                }
            }
        }
        self.commit(ctx, batch, done);
    }

    fn commit(&mut self, ctx: &mut Context<Self>, batch: Vec<Accepted>, done: Option<Done>) {
        if batch.is_empty() {
            if let Some(done) = done {
                let _ = done.send(Ok(()));
            }
            return;
        }
        let state = &self.state;
        let commit = self.core.append(&batch, Vec::new(), None, || {
            serde_json::to_string(state).ok()
        });
        ctx.wait(commit.into_actor(self).map(move |res, act, _| match res {
            Ok(()) => {
                for a in &batch {
                    act.core.publish(a);
                }
                act.report_summary();
                if let Some(done) = done {
                    let _ = done.send(Ok(()));
                }
            }
            Err(e) => {
                let reason = e.to_string();
                act.core.commit_failed(e, &batch);
                act.roll_back();
                if let Some(done) = done {
                    let _ = done.send(Err(Rejection::new(format!("not stored: {reason}"))));
                }
            }
        }));
    }

    /// Tell root (and through it `root/sessionSummaryChanged`) what changed.
    fn report_summary(&mut self) {
        let after = self.summary();
        let before = std::mem::replace(&mut self.reported, after.clone());
        let mut changes = PartialSessionSummary::default();
        let mut any = false;
        if after.title != before.title {
            changes.title = Some(after.title.clone());
            any = true;
        }
        if after.status != before.status {
            changes.status = Some(after.status);
            any = true;
        }
        if after.modified_at != before.modified_at {
            changes.modified_at = Some(after.modified_at.clone());
            any = true;
        }
        if after.chats != before.chats {
            changes.chats = after.chats.clone();
            any = true;
        }
        if after.default_chat != before.default_chat {
            changes.default_chat = after.default_chat.clone();
            any = true;
        }
        if any {
            self.root.do_send(SessionSummaryChanged {
                session: self.core.uri.clone(),
                summary: after,
                changes,
            });
        }
    }

    /// Start a chat actor, register it and its store entry; returns the
    /// catalog actions that add it.
    fn add_chat(
        &mut self,
        ctx: &mut Context<Self>,
        uri: Arc<str>,
        title: String,
        make_default: bool,
    ) -> Vec<StateAction> {
        let shared = self.core.shared.clone();
        let now = now_rfc3339();
        // Queued before the catalog actions, so stored no later than they are.
        drop(shared.journal.create_channel(ChannelInfo {
            uri: uri.to_string(),
            kind: ChannelKind::Chat,
            session: Some(self.core.uri.to_string()),
            provider: self.state.provider.clone(),
            title: title.clone(),
            created_at: now.clone(),
            owner: None,
        }));
        let hub = Arc::new(Hub::default());
        let session = self.core.uri.clone();
        let provider = self.state.provider.clone();
        let me = ctx.address();
        let (u, h, s) = (uri.clone(), hub.clone(), shared.clone());
        let t = title.clone();
        let addr = ChatActor::start_in_arbiter(&shared.next_arbiter(), move |_| {
            ChatActor::new(u, h, s, session, me, provider, t)
        });
        shared.registry.insert(Channel {
            uri: uri.clone(),
            hub,
            addr: ChannelAddr::Chat(addr.clone()),
            session: Some(self.core.uri.clone()),
            provider: Some(self.state.provider.as_str().into()),
        });
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

    /// A title is shown in every client's session list and copied into
    /// root notifications: it has a length limit.
    fn check_title(&self, action: &StateAction) -> Result<(), Rejection> {
        let StateAction::SessionTitleChanged(a) = action else {
            return Ok(());
        };
        let max = self.core.shared.config.limits.max_title_chars;
        let n = a.title.chars().count();
        if n > max {
            return Err(Rejection::new(format!(
                "a title of {n} characters is over the limit of {max}"
            )));
        }
        Ok(())
    }

    fn check_config(&self, action: &StateAction) -> Result<(), Rejection> {
        let StateAction::SessionConfigChanged(a) = action else {
            return Ok(());
        };
        let schema = self.state.config.as_ref().map(|c| &c.schema);
        for (key, value) in &a.config {
            let Some(prop) = schema.and_then(|s| s.properties.get(key)) else {
                return Err(Rejection::new(format!(
                    "unknown session config property `{key}`"
                )));
            };
            if prop.session_mutable == Some(false) {
                return Err(Rejection::new(format!(
                    "`{key}` cannot be changed after creation"
                )));
            }
            if let Some(allowed) = &prop.r#enum {
                if !allowed.contains(value) {
                    return Err(Rejection::new(format!(
                        "`{value}` is not an allowed value of `{key}`"
                    )));
                }
            }
        }
        if a.replace == Some(true) {
            return Err(Rejection::new(
                "replacing the whole session config is not supported; send the changed keys",
            ));
        }
        Ok(())
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;
}

/// Finish creating the session: default chat, then `session/ready`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InitSession {
    /// URI of the default chat.
    pub default_chat: Arc<str>,
    /// Answered once the session is stored and ready.
    pub done: Done,
}

impl Handler<InitSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: InitSession, ctx: &mut Self::Context) {
        let mut actions = self.add_chat(ctx, msg.default_chat, "Chat".into(), true);
        actions.push(StateAction::SessionReady(SessionReadyAction {}));
        self.host_actions_then(ctx, actions, Some(msg.done));
    }
}

/// The chats of a recovered session, started by the server at start-up.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachChats(pub Vec<(Arc<str>, Addr<ChatActor>)>);

impl Handler<AttachChats> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: AttachChats, _: &mut Self::Context) {
        self.chats.extend(msg.0);
    }
}

impl Handler<ClientDispatch> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ClientDispatch, ctx: &mut Self::Context) {
        let ClientDispatch {
            conn,
            origin,
            action,
            ..
        } = msg;
        if let Some(e) = &self.core.store_failed {
            let reason = format!("the store is unavailable ({e}); the session is read-only");
            self.core.reject(&conn, &origin, &action, &reason);
            return;
        }
        let ty = validate::action_type(&action);
        let checked = if let StateAction::Unknown(raw) = &action {
            Err(Rejection::new(validate::malformed_reason(raw)))
        } else if !validate::CLIENT_SESSION_ACTIONS.contains(&ty.as_str()) {
            Err(Rejection::new(format!(
                "`{ty}` is not a client-dispatchable action"
            )))
        } else {
            self.check_title(&action)
                .and_then(|()| self.check_config(&action))
        };
        let checked = checked.and_then(|()| {
            // Setting a config value to what it already is emits nothing.
            if let StateAction::SessionConfigChanged(a) = &action {
                let values = self.state.config.as_ref().map(|c| &c.values);
                if a.config
                    .iter()
                    .all(|(k, v)| values.and_then(|vals| vals.get(k)) == Some(v))
                {
                    return Err(Rejection::new(
                        "no change: the session config already has these values",
                    ));
                }
            }
            self.reduce(&action)
        });
        if let Err(r) = checked {
            self.core.reject(&conn, &origin, &action, &r.0);
            return;
        }
        self.commit(ctx, vec![Accepted::new(action, Some((origin, conn)))], None);
    }
}

impl Handler<Subscribe> for SessionActor {
    type Result = Result<SnapshotJson, RpcError>;

    fn handle(&mut self, msg: Subscribe, _: &mut Self::Context) -> Self::Result {
        self.core.subscribe(&msg.conn, &self.state)
    }
}

/// A tool call needs approval: apply any pending approval-mode change (this is
/// a checkpoint) and say whether policy confirms it without asking.
#[derive(Message)]
#[rtype(result = "Option<ToolCallConfirmationReason>")]
pub struct ApprovalCheckpoint {
    /// The tool being called.
    pub tool_name: String,
}

impl SessionActor {
    fn meta_value(&self, key: &str) -> Option<&Value> {
        self.state.meta.as_ref().and_then(|m| m.get(key))
    }

    fn configured_mode(&self) -> String {
        self.state
            .config
            .as_ref()
            .and_then(|c| c.values.get(APPROVAL_MODE))
            .and_then(Value::as_str)
            .unwrap_or("ask")
            .to_owned()
    }

    /// Publish a new `_meta` with `key` set to `value`.
    fn set_meta(&mut self, ctx: &mut Context<Self>, key: &str, value: Value) {
        let mut meta = self.state.meta.clone().unwrap_or_default();
        meta.insert(key.to_owned(), value);
        self.host_actions(
            ctx,
            vec![StateAction::SessionMetaChanged(
                ahp_types::actions::SessionMetaChangedAction { meta: Some(meta) },
            )],
        );
    }

    /// A checkpoint: the configured mode becomes the effective one.
    pub fn checkpoint(&mut self, ctx: &mut Context<Self>) -> String {
        let configured = self.configured_mode();
        if self.meta_value(EFFECTIVE_MODE_META).and_then(Value::as_str) != Some(configured.as_str())
        {
            self.set_meta(ctx, EFFECTIVE_MODE_META, Value::from(configured.clone()));
        }
        configured
    }
}

impl Handler<ApprovalCheckpoint> for SessionActor {
    type Result = Option<ToolCallConfirmationReason>;

    fn handle(&mut self, msg: ApprovalCheckpoint, ctx: &mut Self::Context) -> Self::Result {
        let mode = self.checkpoint(ctx);
        let granted = self
            .meta_value(GRANTS_META)
            .and_then(Value::as_array)
            .is_some_and(|g| g.iter().any(|t| t.as_str() == Some(msg.tool_name.as_str())));
        (mode == ALWAYS_ALLOW || granted).then_some(ToolCallConfirmationReason::Setting)
    }
}

/// "Approve for this session" was chosen for a tool.
#[derive(Message)]
#[rtype(result = "()")]
pub struct GrantTool {
    /// The tool now approved for the session.
    pub tool_name: String,
}

impl Handler<GrantTool> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: GrantTool, ctx: &mut Self::Context) {
        let mut grants: Vec<Value> = self
            .meta_value(GRANTS_META)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if grants
            .iter()
            .any(|g| g.as_str() == Some(msg.tool_name.as_str()))
        {
            return;
        }
        grants.push(Value::from(msg.tool_name));
        self.set_meta(ctx, GRANTS_META, Value::Array(grants));
    }
}

/// A turn starts in one of the session's chats: also a checkpoint.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TurnCheckpoint;

impl Handler<TurnCheckpoint> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: TurnCheckpoint, ctx: &mut Self::Context) {
        self.checkpoint(ctx);
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
        self.host_actions(ctx, actions);
    }
}

/// A chat's status changed; mirror it in the catalog.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChatSummaryChanged {
    /// The chat.
    pub chat: Arc<str>,
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
        self.host_actions(ctx, vec![update]);
    }
}

/// `createChat`.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct CreateChat {
    /// The client-chosen chat URI.
    pub chat: String,
}

impl Handler<CreateChat> for SessionActor {
    type Result = ResponseFuture<Result<(), RpcError>>;

    fn handle(&mut self, msg: CreateChat, ctx: &mut Self::Context) -> Self::Result {
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
        let actions = self.add_chat(ctx, msg.chat.into(), title, false);
        let (done, rx) = oneshot::channel();
        self.host_actions_then(ctx, actions, Some(done));
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(Rejection::new("the session went away")))
                .map_err(|r| RpcError::internal(r.0))
        })
    }
}

/// `disposeChat` for a chat of this session.
#[derive(Message)]
#[rtype(result = "Result<(), RpcError>")]
pub struct RemoveChat {
    /// The chat URI.
    pub chat: String,
}

impl Handler<RemoveChat> for SessionActor {
    type Result = Result<(), RpcError>;

    fn handle(&mut self, msg: RemoveChat, ctx: &mut Self::Context) -> Self::Result {
        let Some(pos) = self.chats.iter().position(|(u, _)| **u == *msg.chat) else {
            return Err(RpcError::new(
                errors::NOT_FOUND,
                format!("chat `{}` is not in this session", msg.chat),
            ));
        };
        let (uri, addr) = self.chats.remove(pos);
        // Gone for new requests at once, before the actor winds down.
        self.core.shared.registry.remove(&uri);
        addr.do_send(DisposeChat);
        // Its open requests leave the roll-up with it.
        let prefix = format!("{uri}#");
        let stale: Vec<StateAction> = self
            .state
            .input_needed
            .iter()
            .flatten()
            .filter_map(super::rollup::entry_id)
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
        self.host_actions(ctx, actions);
        Ok(())
    }
}

/// The whole session is being disposed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DisposeSession;

impl Handler<DisposeSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: DisposeSession, ctx: &mut Self::Context) {
        for (uri, addr) in self.chats.drain(..) {
            self.core.shared.registry.remove(&uri);
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
#[rtype(result = "Vec<super::chat::PendingItem>")]
pub struct ListPending;

impl Handler<ListPending> for SessionActor {
    type Result = ResponseFuture<Vec<super::chat::PendingItem>>;

    fn handle(&mut self, _: ListPending, _: &mut Self::Context) -> Self::Result {
        let asks: Vec<_> = self
            .chats
            .iter()
            .map(|(_, a)| a.send(super::chat::GetPending))
            .collect();
        Box::pin(async move {
            let mut all: Vec<super::chat::PendingItem> = futures_util::future::join_all(asks)
                .await
                .into_iter()
                .flat_map(|r| r.unwrap_or_default())
                .collect();
            all.sort_by_key(|p| p.server_seq);
            all
        })
    }
}

/// A copy of the session state.
#[derive(Message)]
#[rtype(result = "SessionState")]
pub struct GetSessionState;

impl Handler<GetSessionState> for SessionActor {
    type Result = MessageResult<GetSessionState>;

    fn handle(&mut self, _: GetSessionState, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.clone())
    }
}

/// The state of a session nobody has written to yet.
pub fn new_session_state(provider: String) -> SessionState {
    let mut values = serde_json::Map::new();
    values.insert(APPROVAL_MODE.into(), Value::from("ask"));
    let mut properties = std::collections::HashMap::new();
    properties.insert(
        APPROVAL_MODE.to_owned(),
        SessionConfigPropertySchema {
            r#type: "string".into(),
            title: "Approval mode".into(),
            description: Some("`ask`: tool calls that change data wait for a person. `always-allow`: they run without asking.".into()),
            default: Some(Value::from("ask")),
            r#enum: Some(vec![Value::from("ask"), Value::from("always-allow")]),
            enum_labels: Some(vec!["Ask".into(), "Always allow".into()]),
            enum_descriptions: None,
            read_only: None,
            items: None,
            min_items: None,
            max_items: None,
            properties: None,
            required: None,
            additional_properties: None,
            enum_dynamic: None,
            session_mutable: Some(true),
        },
    );
    SessionState {
        provider,
        title: "New session".into(),
        status: SessionStatus::Idle.bits(),
        activity: None,
        origin: None,
        project: None,
        working_directories: None,
        annotations: None,
        lifecycle: SessionLifecycle::Creating,
        creation_error: None,
        server_tools: None,
        active_clients: Vec::new(),
        chats: Vec::new(),
        default_chat: None,
        config: Some(SessionConfigState {
            schema: SessionConfigSchema {
                r#type: "object".into(),
                properties,
                required: None,
            },
            values,
        }),
        customizations: None,
        changesets: None,
        input_needed: None,
        meta: Some(serde_json::Map::from_iter([
            (EFFECTIVE_MODE_META.to_owned(), Value::from("ask")),
            (GRANTS_META.to_owned(), Value::Array(Vec::new())),
        ])),
    }
}

/// The catalog entry for a session state.
pub fn summary_of(uri: &str, s: &SessionState, created_at: &str) -> SessionSummary {
    let modified_at = s
        .chats
        .iter()
        .map(|c| c.modified_at.as_str())
        .max()
        .unwrap_or(created_at)
        .to_owned();
    // Activity bits from the default chat; InputNeeded and Error promoted from any chat.
    let activity_mask = (1u32 << 5) - 1;
    let default = s
        .chats
        .iter()
        .find(|c| Some(&c.resource) == s.default_chat.as_ref())
        .map(|c| c.status & activity_mask)
        .unwrap_or(SessionStatus::Idle.bits());
    let mut status = (s.status & !activity_mask) | default;
    if s.input_needed.as_ref().is_some_and(|v| !v.is_empty())
        || s.chats.iter().any(|c| {
            c.status & SessionStatus::InputNeeded.bits() == SessionStatus::InputNeeded.bits()
        })
    {
        status = (status & !activity_mask) | SessionStatus::InputNeeded.bits();
    } else if s
        .chats
        .iter()
        .any(|c| c.status & SessionStatus::Error.bits() != 0)
    {
        status |= SessionStatus::Error.bits();
    }
    SessionSummary {
        provider: s.provider.clone(),
        title: s.title.clone(),
        status,
        activity: s.activity.clone(),
        origin: None,
        project: None,
        working_directories: s.working_directories.clone(),
        annotations: None,
        resource: uri.to_owned(),
        created_at: created_at.to_owned(),
        modified_at,
        changes: None,
        meta: None,
        chats: Some(
            s.chats
                .iter()
                .map(|c| ahp_types::state::SessionChatSummary {
                    resource: c.resource.clone(),
                    title: c.title.clone(),
                    origin: c.origin.clone(),
                    interactivity: c.interactivity,
                    status: Some(c.status),
                    changes: None,
                })
                .collect(),
        ),
        default_chat: s.default_chat.clone(),
    }
}
