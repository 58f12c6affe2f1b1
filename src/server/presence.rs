//! Who is looking at what in a chat (`tandem/setPresence`,
//! `tandem/listPresence`): each subscribed connection may say which of the
//! chat's texts it is on, where its caret or selection is (at a revision of
//! that text), and whether its person is active or idle. Every subscriber
//! of the chat gets each change as a `tandem/presence` notification, and a
//! `state: "gone"` one when the connection unsubscribes or closes.
//!
//! Presence is not journaled: it is about people connected now. On a
//! cluster, a node knows the presence of its own connections.

use std::collections::HashMap;

use bytestring::ByteString;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::connection::Connection;
use super::routes::no_chat;
use crate::channels::chat::TextTarget;
use crate::channels::Channel;
use crate::ids::{ChannelUri, ConnId};
use crate::protocol::{encode_notification, RpcError};

/// The notification every subscriber of the chat gets.
pub const PRESENCE: &str = "tandem/presence";

/// Whether a person is at their screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    /// Typing or looking.
    Active,
    /// Away from the keyboard for a while (the client decides when).
    Idle,
}

/// A caret (`anchor == head`) or a selection, in UTF-16 units of the
/// target's text at revision `rev`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caret {
    pub anchor: u64,
    pub head: u64,
}

/// `tandem/setPresence` params.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetPresenceParams {
    /// The chat (the connection must be subscribed to it).
    pub channel: ChannelUri,
    /// The text the person is on, if any.
    #[serde(default)]
    pub target: Option<TextTarget>,
    /// Where in it.
    #[serde(default)]
    pub caret: Option<Caret>,
    /// The text's revision the caret is at.
    #[serde(default)]
    pub rev: Option<u64>,
    pub state: Activity,
}

/// The presence of every connection, by chat.
#[derive(Default)]
pub struct PresenceTable {
    chats: Mutex<HashMap<ChannelUri, Vec<(ConnId, Value)>>>,
}

impl PresenceTable {
    fn set(&self, chat: &ChannelUri, conn: ConnId, entry: Value) {
        let mut chats = self.chats.lock();
        let list = chats.entry(chat.clone()).or_default();
        match list.iter_mut().find(|(c, _)| *c == conn) {
            Some(slot) => slot.1 = entry,
            None => list.push((conn, entry)),
        }
    }

    /// Forget `conn` on `chat`; its last entry, if it had one.
    fn leave(&self, chat: &ChannelUri, conn: ConnId) -> Option<Value> {
        let mut chats = self.chats.lock();
        let list = chats.get_mut(chat)?;
        let i = list.iter().position(|(c, _)| *c == conn)?;
        let (_, entry) = list.swap_remove(i);
        if list.is_empty() {
            chats.remove(chat);
        }
        Some(entry)
    }

    fn list(&self, chat: &ChannelUri) -> Vec<Value> {
        self.chats
            .lock()
            .get(chat)
            .map(|l| l.iter().map(|(_, e)| e.clone()).collect())
            .unwrap_or_default()
    }
}

impl Connection {
    /// `tandem/setPresence`.
    pub(super) fn set_presence(
        &mut self,
        id: Option<Value>,
        p: SetPresenceParams,
        frame_bytes: usize,
    ) -> Result<(), RpcError> {
        self.permit(&p.channel)?;
        let Some(ch) = self
            .app
            .shared
            .registry
            .get(&p.channel)
            .filter(|c| c.addr.is_chat())
        else {
            return Err(no_chat(&p.channel));
        };
        if !self.subs.contains(&p.channel) {
            return Err(RpcError::invalid_request(format!(
                "`tandem/setPresence` on `{}` needs a subscription to it",
                p.channel
            )));
        }
        let shared = self.app.shared.clone();
        let limits = &shared.config.limits;
        if frame_bytes > limits.max_action_bytes {
            return Err(RpcError::invalid_params(format!(
                "too large: a `tandem/setPresence` of {frame_bytes} bytes is over the limit of {} bytes",
                limits.max_action_bytes
            )));
        }
        if !self.take_dispatch_token(frame_bytes) {
            return Err(RpcError::invalid_request(format!(
                "rate limited: more than {} dispatches or {} bytes of actions per second",
                limits.dispatches_per_sec, limits.dispatch_bytes_per_sec
            )));
        }
        let entry = json!({
            "channel": p.channel,
            "clientId": self.client_id.as_ref().map(|c| c.to_string()),
            "subject": self.principal.subject,
            "target": p.target,
            "caret": p.caret,
            "rev": p.rev,
            "state": p.state,
        });
        self.app
            .presence
            .set(&p.channel, self.out.id(), entry.clone());
        broadcast(&ch, &entry);
        self.reply(&id, &Value::Null);
        Ok(())
    }

    /// `tandem/listPresence`: everyone present on a chat now.
    pub(super) fn list_presence(
        &mut self,
        id: Option<Value>,
        channel: ChannelUri,
    ) -> Result<(), RpcError> {
        self.permit(&channel)?;
        if !self
            .app
            .shared
            .registry
            .get(&channel)
            .is_some_and(|c| c.addr.is_chat())
        {
            return Err(no_chat(&channel));
        }
        let presence = self.app.presence.list(&channel);
        self.reply(&id, &json!({ "presence": presence }));
        Ok(())
    }

    /// This connection left `chat` (unsubscribed or closed): if it had said
    /// where it was, everyone hears it is gone.
    pub(super) fn leave_presence(&self, chat: &ChannelUri) {
        let Some(mut last) = self.app.presence.leave(chat, self.out.id()) else {
            return;
        };
        let Some(ch) = self.app.shared.registry.get(chat) else {
            return;
        };
        if let Some(o) = last.as_object_mut() {
            for key in ["target", "caret", "rev"] {
                o.remove(key);
            }
            o.insert("state".into(), json!("gone"));
        }
        broadcast(&ch, &last);
    }
}

/// `tandem/presence` with `params` to every subscriber of the chat `ch`.
fn broadcast(ch: &Channel, params: &Value) {
    let session = ch.session.as_deref().unwrap_or(ch.uri.as_str());
    let frame = ByteString::from(encode_notification(PRESENCE, params));
    ch.hub.notify_about(session, &frame);
}
