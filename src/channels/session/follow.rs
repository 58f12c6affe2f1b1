//! A session another node of the cluster runs: its chats come and go as
//! that node creates and disposes them, and this node's `createChat` and
//! `disposeChat` are asked of it ([`crate::store::cluster`]).

use actix::prelude::*;

use super::SessionActor;
use crate::channels::chat::{ChatActor, ChatHome, DisposeChat};
use crate::channels::forward::{ask_owner, ForwardRequest};
use crate::channels::recovery::{self, Rebuilt};
use crate::ids::ChannelUri;
use crate::protocol::RpcError;
use crate::store::RecoveredChannel;

/// A chat of this session another node created: start this node's copy.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AdoptChat(pub RecoveredChannel);

impl Handler<AdoptChat> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: AdoptChat, ctx: &mut Self::Context) {
        let c = msg.0;
        let uri = c.info.uri.clone();
        if self.core.shared.registry.contains(&uri) {
            return;
        }
        if let Some(link) = &self.core.shared.cluster {
            link.follows(&uri);
        }
        let shared = self.core.shared.clone();
        let (state, base) = match recovery::rebuild(
            &c,
            shared.config.turns_window,
            &*shared.providers,
        ) {
            Ok(Rebuilt::Chat(state, base)) => (state, base),
            Ok(Rebuilt::Session(_)) => return,
            Err(e) => {
                tracing::error!(chat = %uri, error = %e, "a chat another node created cannot be read");
                return;
            }
        };
        let home = ChatHome {
            uri: uri.clone(),
            arbiter: shared.next_arbiter(),
            shared,
            session: self.core.uri.clone(),
            session_addr: ctx.address(),
            provider: c.info.provider.clone(),
        };
        let addr = home.start(move |home, hub| ChatActor::recovered(home, hub, *state, base));
        addr.do_send(crate::channels::Resync(c.len));
        self.chats.push((uri, addr));
    }
}

/// A chat of this session another node disposed: stop this node's copy.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ForgetChat(pub ChannelUri);

impl Handler<ForgetChat> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ForgetChat, _: &mut Self::Context) {
        if let Some(pos) = self.chats.iter().position(|(u, _)| *u == msg.0) {
            let (uri, addr) = self.chats.remove(pos);
            self.core.shared.registry.remove(&uri);
            addr.do_send(DisposeChat);
        }
    }
}

impl SessionActor {
    /// On a follower: hand `request` to the session's owner; its answer.
    pub(super) fn forward_to_owner(
        &self,
        request: ForwardRequest,
    ) -> ResponseFuture<Result<serde_json::Value, RpcError>> {
        let (link, session) = (self.core.shared.cluster.clone(), self.core.uri.clone());
        Box::pin(async move { ask_owner(link, &session, request).await?.into_value() })
    }

    /// `createChat` / `disposeChat` of a session another node runs: asked
    /// of that node; once it answered, this node's copy of `chat` is
    /// brought in line before the client hears back (so the chat can be
    /// subscribed here at once, or is gone here too).
    pub(super) fn ask_owner_for_chat(
        &self,
        ctx: &mut Context<Self>,
        request: ForwardRequest,
        chat: ChannelUri,
    ) -> ResponseFuture<Result<(), RpcError>> {
        let shared = self.core.shared.clone();
        let session = self.core.uri.clone();
        let me = ctx.address();
        let create = matches!(request, ForwardRequest::CreateChat { .. });
        Box::pin(async move {
            ask_owner(shared.cluster.clone(), &session, request)
                .await?
                .into_result()?;
            if create {
                let journal = shared.journal.clone();
                let uri = chat.clone();
                let loaded = tokio::task::spawn_blocking(move || journal.load_channel(&uri))
                    .await
                    .map_err(|e| RpcError::internal(e.to_string()))?
                    .map_err(|e| RpcError::internal(e.to_string()))?;
                if let Some(c) = loaded {
                    let _ = me.send(AdoptChat(c)).await;
                }
            } else {
                let _ = me.send(ForgetChat(chat)).await;
            }
            Ok(())
        })
    }
}
