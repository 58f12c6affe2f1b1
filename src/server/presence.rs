//! Who is looking at what in a chat (`tandem/setPresence`,
//! `tandem/listPresence`): each subscribed connection may say which of the
//! chat's texts it is on, where its caret or selection is (at a revision of
//! that text), and whether its person is active or idle. Every subscriber
//! of the chat gets each change as a `tandem/presence` notification, and a
//! `state: "gone"` one when the connection unsubscribes or closes.
//!
//! Presence is not journaled: it is about people connected now. On a
//! cluster each node announces its connections' presence to the others
//! (`ClusterLink::announce`, core NATS), again every [`REFRESH`] so a node
//! that went away is forgotten: another node's entry not heard of for
//! [`FORGET_AFTER`] is gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::connection::Connection;
use super::routes::no_chat;
use super::AppState;
use crate::channels::chat::TextTarget;
use crate::channels::Channel;
use crate::ids::{ChannelUri, ConnId};
use crate::people::Access;
use crate::protocol::{encode_notification, errors, RpcError};

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
    /// The page is shown and has the focus (its person is looking).
    #[serde(default)]
    pub focused: Option<bool>,
}

/// How often a node announces its connections' presence again.
pub const REFRESH: Duration = Duration::from_secs(5);
/// Another node's entry not heard of for this long is gone (its node went
/// away, or the announcement of its leaving was lost).
pub const FORGET_AFTER: Duration = Duration::from_secs(15);

/// Whose presence an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    /// A connection to this node.
    Here(ConnId),
    /// A connection to another node: `<node>/<conn>`.
    There(String),
}

/// The presence of every connection, by chat: this node's and, on a
/// cluster, what the other nodes announced (with when it was last heard).
#[derive(Default)]
pub struct PresenceTable {
    chats: Mutex<HashMap<ChannelUri, Vec<Present>>>,
}

/// One entry: whose, what it says, when it was last set or heard of.
type Present = (Who, Value, Instant);

impl PresenceTable {
    /// Set `who`'s entry on `chat`; the one it replaces, if any.
    fn set(&self, chat: &ChannelUri, who: Who, entry: Value) -> Option<Value> {
        let mut chats = self.chats.lock();
        let list = chats.entry(chat.clone()).or_default();
        let now = Instant::now();
        match list.iter_mut().find(|(w, ..)| *w == who) {
            Some(slot) => {
                slot.2 = now;
                Some(std::mem::replace(&mut slot.1, entry))
            }
            None => {
                list.push((who, entry, now));
                None
            }
        }
    }

    /// Whether a person is looking at `chat`: one of their entries there
    /// is active with the page shown and focused.
    /// `who` is a subject, or `client:<clientId>` for one device.
    pub fn looking(&self, chat: &str, who: &str) -> bool {
        let device = who.strip_prefix("client:");
        self.chats.lock().get(chat).is_some_and(|l| {
            l.iter().any(|(_, e, _)| {
                let theirs = match device {
                    Some(c) => e["clientId"] == c,
                    None => e["subject"] == who,
                };
                theirs && is_looking(Some(e))
            })
        })
    }

    /// `who`'s entry on `chat`, if it has one.
    fn entry(&self, chat: &ChannelUri, who: &Who) -> Option<Value> {
        let chats = self.chats.lock();
        let list = chats.get(chat)?;
        list.iter()
            .find(|(w, ..)| w == who)
            .map(|(_, e, _)| e.clone())
    }

    /// Forget `who` on `chat`; its last entry, if it had one.
    fn leave(&self, chat: &ChannelUri, who: &Who) -> Option<Value> {
        let mut chats = self.chats.lock();
        let list = chats.get_mut(chat)?;
        let i = list.iter().position(|(w, ..)| w == who)?;
        let (_, entry, _) = list.swap_remove(i);
        if list.is_empty() {
            chats.remove(chat);
        }
        Some(entry)
    }

    fn list(&self, chat: &ChannelUri) -> Vec<Value> {
        self.chats
            .lock()
            .get(chat)
            .map(|l| l.iter().map(|(_, e, _)| e.clone()).collect())
            .unwrap_or_default()
    }

    /// This node's entries, to announce again.
    fn here(&self) -> Vec<(ChannelUri, ConnId, Value)> {
        let chats = self.chats.lock();
        let mut out = Vec::new();
        for (chat, list) in chats.iter() {
            for (who, entry, _) in list {
                if let Who::Here(conn) = who {
                    out.push((chat.clone(), *conn, entry.clone()));
                }
            }
        }
        out
    }

    /// Forget the other nodes' entries not heard of since `before`; each
    /// one forgotten, with its chat.
    fn expire(&self, before: Instant) -> Vec<(ChannelUri, Value)> {
        let mut chats = self.chats.lock();
        let mut gone = Vec::new();
        for (chat, list) in chats.iter_mut() {
            list.retain(|(who, entry, heard)| {
                let stale = matches!(who, Who::There(_)) && *heard < before;
                if stale {
                    gone.push((chat.clone(), entry.clone()));
                }
                !stale
            });
        }
        chats.retain(|_, l| !l.is_empty());
        gone
    }
}

/// Whether an entry says its person looks at the chat: active, with the
/// page shown and focused.
fn is_looking(entry: Option<&Value>) -> bool {
    entry.is_some_and(|e| e["state"] == "active" && e["focused"] == true)
}

/// Tell the notifier when an entry on `chat` went from looking to not.
fn note_looking(app: &AppState, chat: &ChannelUri, before: Option<&Value>, after: Option<&Value>) {
    if is_looking(before) && !is_looking(after) {
        app.shared.notify.looked_away(chat.as_str());
    }
}

/// What a node announces of one of its connections on one chat (`entry`
/// `None`: it left).
#[derive(Serialize, Deserialize)]
struct Announced {
    node: String,
    chat: ChannelUri,
    conn: String,
    entry: Option<Value>,
}

/// The entry of a connection that left: who it was, `state: "gone"`.
fn gone(mut last: Value) -> Value {
    if let Some(o) = last.as_object_mut() {
        for key in ["target", "caret", "rev"] {
            o.remove(key);
        }
        o.insert("state".into(), json!("gone"));
    }
    last
}

/// Tell the other nodes of the cluster, if any, what `conn` does on `chat`.
fn announce(app: &AppState, chat: &ChannelUri, conn: ConnId, entry: Option<Value>) {
    let Some(link) = app.shared.cluster.as_ref() else {
        return;
    };
    let msg = Announced {
        node: link.node().to_owned(),
        chat: chat.clone(),
        conn: conn.to_string(),
        entry,
    };
    if let Ok(body) = serde_json::to_vec(&msg) {
        link.announce(body);
    }
}

/// On a cluster: hear the other nodes' presence, announce this node's again
/// every [`REFRESH`], and forget another node's entries not heard of for
/// [`FORGET_AFTER`]. Nothing for a single node. (Runs on the server's
/// actix system; holds the state weakly, so it ends with the server.)
pub(super) fn join_cluster(app: &Arc<AppState>) {
    let Some(link) = app.shared.cluster.clone() else {
        return;
    };
    let me = link.node().to_owned();
    let weak = Arc::downgrade(app);
    link.hear(Arc::new(move |body: Vec<u8>| {
        let Ok(msg) = serde_json::from_slice::<Announced>(&body) else {
            return;
        };
        let Some(app) = weak.upgrade() else {
            return;
        };
        if msg.node == me {
            return;
        }
        let who = Who::There(format!("{}/{}", msg.node, msg.conn));
        let Some(ch) = app.shared.registry.get(&msg.chat) else {
            return;
        };
        match msg.entry {
            Some(entry) => {
                let known = app.presence.list(&msg.chat).contains(&entry);
                let before = app.presence.set(&msg.chat, who, entry.clone());
                note_looking(&app, &msg.chat, before.as_ref(), Some(&entry));
                // A refresh of what everyone here knows already is not news.
                if !known {
                    broadcast(&ch, &entry);
                }
            }
            None => {
                if let Some(last) = app.presence.leave(&msg.chat, &who) {
                    note_looking(&app, &msg.chat, Some(&last), None);
                    broadcast(&ch, &gone(last));
                }
            }
        }
    }));
    let weak = Arc::downgrade(app);
    actix::spawn(async move {
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(app) = weak.upgrade() else {
                return;
            };
            for (chat, conn, entry) in app.presence.here() {
                announce(&app, &chat, conn, Some(entry));
            }
            let before = Instant::now().checked_sub(FORGET_AFTER);
            for (chat, last) in before.map(|b| app.presence.expire(b)).unwrap_or_default() {
                note_looking(&app, &chat, Some(&last), None);
                if let Some(ch) = app.shared.registry.get(&chat) {
                    broadcast(&ch, &gone(last));
                }
            }
        }
    });
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
        if p.target.is_some() {
            // Being in a text is typing there: a viewer is only present.
            if let (Some(session), Some(by)) = (&ch.session, self.person()) {
                let (default, need) = (shared.config.session_access, Access::Participant);
                shared
                    .access
                    .permit(session, Some(&by), default, need, "a caret in a text")
                    .map_err(|r| RpcError::new(errors::PERMISSION_DENIED, r.0))?;
            }
        }
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
            "name": self.person().map(|p| p.name),
            "target": p.target,
            "caret": p.caret,
            "rev": p.rev,
            "state": p.state,
            "focused": p.focused,
        });
        let before = self
            .app
            .presence
            .set(&p.channel, Who::Here(self.out.id()), entry.clone());
        note_looking(&self.app, &p.channel, before.as_ref(), Some(&entry));
        broadcast(&ch, &entry);
        announce(&self.app, &p.channel, self.out.id(), Some(entry));
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

    /// This connection's person was renamed: everyone where it is present
    /// hears the new name.
    pub(super) fn refresh_presence(&self) {
        let Some(name) = self.person().map(|p| p.name) else {
            return;
        };
        let who = Who::Here(self.out.id());
        for chat in &self.subs {
            let Some(mut entry) = self.app.presence.entry(chat, &who) else {
                continue;
            };
            entry["name"] = Value::from(name.clone());
            let _ = self.app.presence.set(chat, who.clone(), entry.clone());
            if let Some(ch) = self.app.shared.registry.get(chat) {
                broadcast(&ch, &entry);
            }
            announce(&self.app, chat, self.out.id(), Some(entry));
        }
    }

    /// This connection left `chat` (unsubscribed or closed): if it had said
    /// where it was, everyone hears it is gone.
    pub(super) fn leave_presence(&self, chat: &ChannelUri) {
        let Some(last) = self.app.presence.leave(chat, &Who::Here(self.out.id())) else {
            return;
        };
        note_looking(&self.app, chat, Some(&last), None);
        announce(&self.app, chat, self.out.id(), None);
        let Some(ch) = self.app.shared.registry.get(chat) else {
            return;
        };
        broadcast(&ch, &gone(last));
    }
}

/// `tandem/presence` with `params` to every subscriber of the chat `ch`.
fn broadcast(ch: &Channel, params: &Value) {
    let session = ch.session.as_deref().unwrap_or(ch.uri.as_str());
    let frame = ByteString::from(encode_notification(PRESENCE, params));
    ch.hub.notify_about(session, &frame);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_nodes_entries_are_forgotten_when_not_heard_of_and_this_nodes_never() {
        let t = PresenceTable::default();
        let chat: ChannelUri = "ahp-chat:/c".into();
        let me = ConnId::next();
        t.set(&chat, Who::Here(me), json!({"clientId": "here"}));
        t.set(
            &chat,
            Who::There("b/7".into()),
            json!({"clientId": "there"}),
        );
        assert_eq!(t.list(&chat).len(), 2);
        assert!(t
            .expire(Instant::now() - Duration::from_secs(60))
            .is_empty());
        let gone = t.expire(Instant::now() + Duration::from_secs(1));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].1["clientId"], "there");
        assert_eq!(t.list(&chat), vec![json!({"clientId": "here"})]);
        assert_eq!(t.here().len(), 1);
        assert_eq!(
            t.leave(&chat, &Who::Here(me)),
            Some(json!({"clientId": "here"}))
        );
        assert!(t.list(&chat).is_empty());
    }
}
