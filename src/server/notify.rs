//! The notification methods (`tandem/notifySettings`, `tandem/setNotify`,
//! `tandem/pushSubscribe`, `tandem/pushUnsubscribe`), and what the notifier
//! asks the server of people ([`Audience`]): a person's role in a session
//! from its roles and their credential, and whether they look at a chat
//! from the presence table.
//!
//! A person is their token's subject; without authentication everyone is
//! `local`, so there each device (`clientId`) is a person of its own.

use std::sync::{Arc, Weak};

use serde::Deserialize;
use serde_json::{json, Value};

use super::connection::Connection;
use super::AppState;
use crate::ids::ChannelUri;
use crate::notify::book::{Holder, Mode, ViaInvite};
use crate::notify::push::Subscription;
use crate::notify::Audience;
use crate::people::Access;
use crate::protocol::RpcError;

/// The server's answers to the notifier.
pub(super) struct ServerAudience(pub(super) Weak<AppState>);

impl Audience for ServerAudience {
    fn level(&self, session: &str, holder: &Holder) -> Option<Access> {
        let app = self.0.upgrade()?;
        let uri = ChannelUri::from(session);
        if !app
            .shared
            .registry
            .get(&uri)
            .is_some_and(|c| c.addr.is_session())
        {
            return None;
        }
        if let Some(via) = &holder.invite {
            let guest = crate::invites::Guest {
                id: via.id.clone(),
                session: ChannelUri::from(via.session.as_str()),
                digest: String::new(),
                tag: String::new(),
                access: Access::Viewer,
                name: None,
            };
            let shared = &app.shared;
            shared
                .access
                .guest_still_open(&guest, crate::auth::now_secs())
                .ok()?;
        }
        let default = app.shared.config.session_access;
        Some(app.shared.access.level(&uri, &holder.person(), default))
    }

    fn looking(&self, chat: &str, subject: &str) -> bool {
        self.0
            .upgrade()
            .is_some_and(|app| app.presence.looking(chat, subject))
    }
}

/// `tandem/notifySettings` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NotifySettingsParams {
    #[serde(default)]
    channel: Option<ChannelUri>,
}

/// `tandem/setNotify` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetNotifyParams {
    channel: ChannelUri,
    mode: Mode,
}

/// `tandem/pushSubscribe` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PushSubscribeParams {
    subscription: Subscription,
}

/// `tandem/pushUnsubscribe` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PushUnsubscribeParams {
    endpoint: String,
}

fn stored(e: crate::store::JournalError) -> RpcError {
    RpcError::internal(format!(
        "the notification settings could not be stored: {e}"
    ))
}

/// Run `f` on the people's records off the serving threads.
async fn on_book<T: Send + 'static>(
    book: Option<Arc<crate::notify::book::Book>>,
    f: impl FnOnce(&crate::notify::book::Book) -> Result<T, crate::store::JournalError> + Send + 'static,
) -> Result<Option<T>, RpcError> {
    let Some(book) = book else {
        return Ok(None);
    };
    tokio::task::spawn_blocking(move || f(&book))
        .await
        .map_err(|e| RpcError::internal(e.to_string()))?
        .map(Some)
        .map_err(stored)
}

impl Connection {
    /// Whom notifications for this connection's person go to: their
    /// subject, or without authentication their device.
    fn notify_identity(&self) -> Result<String, RpcError> {
        let person = self
            .person()
            .ok_or_else(|| RpcError::invalid_request("notifications need `initialize` first"))?;
        Ok(match &self.app.auth {
            Some(_) => person.subject,
            None => format!("client:{}", person.client_id),
        })
    }

    /// The session `channel` names, checked: the caller may use it and it
    /// exists.
    fn notify_session(&self, channel: &ChannelUri) -> Result<(), RpcError> {
        self.permit(channel)?;
        if !self
            .app
            .shared
            .registry
            .get(channel)
            .is_some_and(|c| c.addr.is_session())
        {
            return Err(super::routes::no_session(channel));
        }
        Ok(())
    }

    /// `tandem/notifySettings`: `{publicKey, devices, mode?}`.
    pub(super) fn notify_settings(
        &mut self,
        id: Option<Value>,
        p: NotifySettingsParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        if let Some(c) = &p.channel {
            self.notify_session(c)?;
        }
        let who = self.notify_identity()?;
        let notify = &self.app.shared.notify;
        let public = notify.push_key().map(str::to_owned);
        let book = notify.book().cloned();
        let session = p.channel.map(|c| c.to_string());
        let answer = on_book(book, move |b| {
            let devices = b.holder(&who)?.map_or(0, |h| h.devices.len());
            let mode = session.map(|s| b.mode(&who, &s)).transpose()?;
            Ok((devices, mode))
        });
        self.reply_when(id, answer, ctx, move |r| {
            let (devices, mode) = r.unwrap_or((0, None));
            let mut v = json!({"publicKey": public, "devices": devices});
            if let Some(m) = mode {
                v["mode"] = json!(m);
            }
            v
        });
        Ok(())
    }

    /// `tandem/setNotify`: `{mode}` once stored.
    pub(super) fn set_notify(
        &mut self,
        id: Option<Value>,
        p: SetNotifyParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        self.notify_session(&p.channel)?;
        let who = self.notify_identity()?;
        let book = self
            .app
            .shared
            .notify
            .book()
            .cloned()
            .ok_or_else(push_off)?;
        let (session, mode) = (p.channel.to_string(), p.mode);
        let answer = on_book(Some(book), move |b| b.set_mode(&who, &session, mode));
        self.reply_when(id, answer, ctx, move |_| json!({ "mode": mode }));
        Ok(())
    }

    /// `tandem/pushSubscribe`: `{devices}` once stored.
    pub(super) fn push_subscribe(
        &mut self,
        id: Option<Value>,
        p: PushSubscribeParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        let notify = &self.app.shared.notify;
        let book = notify.book().cloned().ok_or_else(push_off)?;
        let device = p
            .subscription
            .device(notify.guarded())
            .map_err(RpcError::invalid_params)?;
        let subject = self.notify_identity()?;
        let person = self
            .person()
            .ok_or_else(|| RpcError::invalid_request("notifications need `initialize` first"))?;
        let holder = Holder {
            subject,
            name: person.name,
            standing: person.standing,
            sessions: self
                .principal
                .sessions
                .as_ref()
                .map(|s| s.iter().cloned().collect()),
            invite: self.principal.invite.as_ref().map(|g| ViaInvite {
                id: g.id.clone(),
                session: g.session.to_string(),
            }),
            devices: Vec::new(),
        };
        let answer = on_book(Some(book), move |b| b.subscribe(holder, device));
        self.reply_when(id, answer, ctx, |n| json!({ "devices": n.unwrap_or(0) }));
        Ok(())
    }

    /// `tandem/pushUnsubscribe`: `{devices}` left.
    pub(super) fn push_unsubscribe(
        &mut self,
        id: Option<Value>,
        p: PushUnsubscribeParams,
        ctx: &mut actix::Context<Self>,
    ) -> Result<(), RpcError> {
        let who = self.notify_identity()?;
        let book = self
            .app
            .shared
            .notify
            .book()
            .cloned()
            .ok_or_else(push_off)?;
        let answer = on_book(Some(book), move |b| b.unsubscribe(&who, &p.endpoint));
        self.reply_when(id, answer, ctx, |n| json!({ "devices": n.unwrap_or(0) }));
        Ok(())
    }
}

fn push_off() -> RpcError {
    RpcError::invalid_request("Web Push is off on this server (`[notify] web_push = false`)")
}
