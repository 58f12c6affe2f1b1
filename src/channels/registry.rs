//! Channel URI → actor address, plus the channel's subscriber hub.

use std::sync::Arc;

use actix::Addr;
use dashmap::DashMap;

use super::chat::ChatActor;
use super::root::RootActor;
use super::session::SessionActor;
use crate::ids::ChannelUri;
use crate::publish::Hub;

/// The actor behind a channel.
#[derive(Clone)]
pub enum ChannelAddr {
    /// `ahp-root://`.
    Root(Addr<RootActor>),
    /// `ahp-session:/…`.
    Session(Addr<SessionActor>),
    /// `ahp-chat:/…`.
    Chat(Addr<ChatActor>),
}

/// One registered channel.
#[derive(Clone)]
pub struct Channel {
    /// The channel URI, shared with ring entries.
    pub uri: ChannelUri,
    /// Its subscribers.
    pub hub: Arc<Hub>,
    /// Its actor.
    pub addr: ChannelAddr,
    /// For chats and sessions: the owning session URI.
    pub session: Option<ChannelUri>,
    /// For chats and sessions: the session's provider id.
    pub provider: Option<Arc<str>>,
}

/// Every live channel by URI.
#[derive(Default)]
pub struct Registry {
    channels: DashMap<ChannelUri, Channel>,
    /// Told after each insert (see [`Registry::wait_for`]).
    inserted: tokio::sync::Notify,
}

impl Registry {
    /// Register a channel (replacing nothing: URIs are unique).
    pub fn insert(&self, channel: Channel) {
        self.channels.insert(channel.uri.clone(), channel);
        self.inserted.notify_waiters();
    }

    /// The channel `uri` once it is registered, waiting at most `within`.
    pub async fn wait_for(&self, uri: &str, within: std::time::Duration) -> Option<Channel> {
        let wait = async {
            loop {
                let inserted = self.inserted.notified();
                tokio::pin!(inserted);
                inserted.as_mut().enable();
                if let Some(c) = self.get(uri) {
                    return c;
                }
                inserted.await;
            }
        };
        tokio::time::timeout(within, wait).await.ok()
    }

    /// Look a channel up.
    pub fn get(&self, uri: &str) -> Option<Channel> {
        self.channels.get(uri).map(|c| c.clone())
    }

    /// A channel's owning session, if the channel exists (`Some(None)`:
    /// it exists and has none) — without cloning the rest of its entry, as
    /// every permission check of every action asks this.
    pub fn session_of(&self, uri: &str) -> Option<Option<ChannelUri>> {
        self.channels.get(uri).map(|c| c.session.clone())
    }

    /// Remove a channel.
    pub fn remove(&self, uri: &str) -> Option<Channel> {
        let removed = self.channels.remove(uri).map(|(_, c)| c);
        crate::memory::shrink_if_sparse(&self.channels);
        removed
    }

    /// Whether a channel exists.
    pub fn contains(&self, uri: &str) -> bool {
        self.channels.contains_key(uri)
    }

    /// Every registered channel (a copy, for periodic sweeps).
    pub fn all(&self) -> Vec<Channel> {
        self.channels.iter().map(|c| c.value().clone()).collect()
    }

    /// Number of channels.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// Whether no channel is registered.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }
}
