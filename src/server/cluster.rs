//! A cluster node's part in the cluster ([`crate::store::cluster`]): its
//! channels hear what other nodes append, create and dispose; requests
//! other nodes forward are handed to the channels this node owns; and the
//! sessions of a node that went away are taken over.

use std::sync::Arc;
use std::time::Duration;

use ahp_types::ROOT_RESOURCE_URI;

use crate::channels::context::Shared;
use crate::channels::forward::{ForwardReply, ForwardRequest};
use crate::channels::{Channel, ChannelAddr};
use crate::ids::ChannelUri;
use crate::protocol::RpcError;
use crate::store::cluster::{ClusterEvent, LinkFuture};
use crate::store::{ChannelKind, RecoveredChannel};

/// Join the cluster: follow it, answer it, and watch for owners that went
/// away. Nothing for a single node.
pub fn join(shared: &Arc<Shared>, root: &ChannelAddr) {
    let Some(link) = shared.cluster.clone() else {
        return;
    };
    let s = shared.clone();
    let r = root.clone();
    link.serve(Arc::new(move |body: Vec<u8>| answer(&s, &r, &body)));
    let s = shared.clone();
    let r = root.clone();
    link.follow(Arc::new(move |event| heard(&s, &r, event)));
    actix::spawn(take_over_orphans(shared.clone()));
}

/// What another node did, for this node's channels.
fn heard(shared: &Arc<Shared>, root: &ChannelAddr, event: ClusterEvent) {
    match event {
        ClusterEvent::Appended(r) => {
            if let Some(c) = shared.registry.get(&r.channel) {
                c.addr.replicate(r);
            }
            // Not here yet: its adoption reads it from the store.
        }
        ClusterEvent::ChannelAdded(uri) => {
            if !shared.registry.contains(&uri) {
                adopt(shared.clone(), root.clone(), uri);
            }
        }
        ClusterEvent::ChannelRemoved(uri) => {
            let Some(c) = shared.registry.get(&uri) else {
                return;
            };
            if c.addr.is_chat() {
                if let Some(session) = c.session.and_then(|s| shared.registry.get(&s)) {
                    session.addr.forget(uri);
                }
            } else {
                root.forget(uri);
            }
        }
    }
}

/// Pause between attempts to take a handed-over session's channels (at
/// most [`HANDOFF_TRIES`]).
const HANDOFF_RETRY: Duration = Duration::from_millis(100);
/// Attempts to take a handed-over session's channels.
const HANDOFF_TRIES: u32 = 20;

/// How long a chat another node created waits for its session to be
/// adopted here (the two records arrive separately).
const SESSION_WAIT: Duration = Duration::from_secs(2);

/// Start this node's copy of a channel another node created, from the
/// store; a chat whose session is not here yet waits for it to be adopted,
/// then is read again. (Runs on the link's runtime, where cluster events
/// arrive.)
fn adopt(shared: Arc<Shared>, root: ChannelAddr, uri: ChannelUri) {
    tokio::spawn(async move {
        let Some(c) = load(&shared, &uri).await else {
            return;
        };
        let session = match (c.info.kind, c.info.session.clone()) {
            (ChannelKind::Session, _) => return root.adopt_session(c),
            (ChannelKind::Chat, Some(session)) => session,
            (ChannelKind::Chat, None) => return,
        };
        if let Some(s) = shared.registry.get(&session) {
            return s.addr.adopt_chat(c);
        }
        let Some(s) = shared.registry.wait_for(&session, SESSION_WAIT).await else {
            tracing::warn!(chat = %uri, "a chat whose session is unknown here was not adopted");
            return;
        };
        // Read again: the chat may have moved on while its session came.
        if let Some(c) = load(&shared, &uri).await {
            s.addr.adopt_chat(c);
        }
    });
}

/// How long a request naming a channel this node has not adopted yet
/// waits for it (read from the store, then started here).
const FETCH_WAIT: Duration = Duration::from_secs(3);

/// Make sure this node has `uri`, a channel another node may just have
/// created (its announcement not heard here yet): read it from the store
/// and start this node's copy now, a chat's session first. `true` once the
/// channel is here; `false` when the store does not hold it (or it did
/// not start within [`FETCH_WAIT`]). Read-your-writes across nodes: a
/// client told of a channel by one node can use it on any other at once.
pub(super) async fn fetch(shared: Arc<Shared>, root: ChannelAddr, uri: ChannelUri) -> bool {
    if shared.registry.contains(&uri) {
        return true;
    }
    if shared.cluster.is_none() {
        return false;
    }
    let Some(c) = load(&shared, &uri).await else {
        return false;
    };
    match (c.info.kind, c.info.session.clone()) {
        (ChannelKind::Session, _) => root.adopt_session(c),
        (ChannelKind::Chat, Some(session)) => {
            if !Box::pin(fetch(shared.clone(), root.clone(), session.clone())).await {
                return false;
            }
            let Some(s) = shared.registry.get(&session) else {
                return false;
            };
            s.addr.adopt_chat(c);
        }
        (ChannelKind::Chat, None) => return false,
    }
    shared.registry.wait_for(&uri, FETCH_WAIT).await.is_some()
}

/// A channel as the store holds it now (`None`: gone, or unreadable —
/// logged).
async fn load(shared: &Arc<Shared>, uri: &ChannelUri) -> Option<RecoveredChannel> {
    let journal = shared.journal.clone();
    let u = uri.clone();
    match tokio::task::spawn_blocking(move || journal.load_channel(&u)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::warn!(channel = %uri, error = %e, "a channel another node created cannot be read yet");
            None
        }
        Err(_) => None,
    }
}

/// A request another node forwarded: handed to the channel now (so
/// requests keep their order), answered when done.
fn answer(shared: &Arc<Shared>, root: &ChannelAddr, body: &[u8]) -> LinkFuture<Vec<u8>> {
    let ready =
        |r: ForwardReply| -> LinkFuture<Vec<u8>> { Box::pin(std::future::ready(r.encode())) };
    let request = match ForwardRequest::decode(body) {
        Ok(r) => r,
        Err(message) => return ready(ForwardReply::failed(RpcError::invalid_request(message))),
    };
    if matches!(request, ForwardRequest::CreateSession { .. }) {
        return placed_here(shared, root, request);
    }
    let channel = match &request {
        ForwardRequest::Dispatch { channel, .. }
        | ForwardRequest::OpenText { channel, .. }
        | ForwardRequest::EditText { channel, .. } => channel.clone(),
        ForwardRequest::CreateChat { session, .. }
        | ForwardRequest::DisposeChat { session, .. }
        | ForwardRequest::DisposeSession { session, .. }
        | ForwardRequest::SetAccess { session, .. }
        | ForwardRequest::Invites { session, .. }
        | ForwardRequest::Handoff { session, .. } => session.clone(),
        ForwardRequest::CreateSession { session, .. } => session.clone(),
    };
    let Some(target) = shared.registry.get(&channel) else {
        return ready(ForwardReply::NotOwner);
    };
    if shared.follows(&target.uri) {
        return ready(ForwardReply::NotOwner);
    }
    match request {
        request @ ForwardRequest::CreateSession { .. } => placed_here(shared, root, request),
        ForwardRequest::Dispatch {
            origin,
            action,
            as_agent,
            by,
            ..
        } => {
            let done = target.addr.dispatch_forwarded(
                origin,
                ForwardRequest::action(action),
                as_agent,
                by,
            );
            Box::pin(async move {
                match done.await {
                    Ok(()) => ForwardReply::Done,
                    Err(reason) => ForwardReply::Rejected { reason },
                }
                .encode()
            })
        }
        ForwardRequest::CreateChat { chat, by, .. } => {
            match target.addr.create_chat(chat.into(), by) {
                Some(done) => Box::pin(async move { ForwardReply::of(done.await).encode() }),
                None => ready(ForwardReply::NotOwner),
            }
        }
        ForwardRequest::DisposeChat { chat, by, .. } => {
            match target.addr.remove_chat(chat.into(), by) {
                Some(done) => Box::pin(async move { ForwardReply::of(done.await).encode() }),
                None => ready(ForwardReply::NotOwner),
            }
        }
        ForwardRequest::DisposeSession { session, by } => {
            let done = root.dispose_session(session.into(), by);
            Box::pin(async move { ForwardReply::of(done.await).encode() })
        }
        ForwardRequest::Handoff { watchers: None, .. } => hand_over(shared, target),
        ForwardRequest::Handoff {
            watchers: Some(n), ..
        } => hand_over_to_watchers(shared, target, n),
        ForwardRequest::SetAccess {
            subject,
            access,
            by,
            ..
        } => match target.addr.set_access(subject, access, by) {
            Some(done) => Box::pin(async move { ForwardReply::of_value(done.await).encode() }),
            None => ready(ForwardReply::NotOwner),
        },
        ForwardRequest::Invites { change, by, .. } => match target.addr.invites(change, by) {
            Some(done) => Box::pin(async move { ForwardReply::of_value(done.await).encode() }),
            None => ready(ForwardReply::NotOwner),
        },
        ForwardRequest::OpenText {
            target: t, author, ..
        } => match target.addr.open_text(t, author, true) {
            Some(done) => Box::pin(async move { ForwardReply::of_value(done.await).encode() }),
            None => ready(ForwardReply::failed(super::routes::no_chat(&target.uri))),
        },
        ForwardRequest::EditText {
            target: t,
            author,
            seq,
            base,
            edit,
            by,
            ..
        } => match target.addr.edit_text(t, author, seq, base, edit, by, true) {
            Some(done) => Box::pin(async move { ForwardReply::of_value(done.await).encode() }),
            None => ready(ForwardReply::failed(super::routes::no_chat(&target.uri))),
        },
    }
}

/// A session another node placed here (this node ran fewer): made here,
/// as that node's client asked.
fn placed_here(
    shared: &Arc<Shared>,
    root: &ChannelAddr,
    request: ForwardRequest,
) -> LinkFuture<Vec<u8>> {
    let ForwardRequest::CreateSession {
        session,
        provider,
        owner,
        max_sessions,
    } = request
    else {
        return Box::pin(std::future::ready(ForwardReply::NotOwner.encode()));
    };
    let owner = crate::channels::addr::SessionOwner {
        subject: owner,
        max_sessions,
    };
    // On an actor thread, as sessions taken from other nodes are (this is
    // the link's thread, which serves no connection).
    let home = shared.next_arbiter();
    let done = root.create_session(session.into(), provider, owner, home);
    Box::pin(async move { ForwardReply::of(done.await).encode() })
}

/// Another node, where the session's agent is connected, asks for the
/// session: its chats, then the session, stop writing here, and their
/// leases are released for that node to take. Refused while the agent is
/// connected here too.
pub(super) fn hand_over(shared: &Arc<Shared>, session: Channel) -> LinkFuture<Vec<u8>> {
    let pinned = session
        .provider
        .as_deref()
        .and_then(|p| shared.providers.get(p))
        .is_some_and(|a| a.pinned_here());
    let Some(link) = shared.cluster.clone().filter(|_| !pinned) else {
        let refused = ForwardReply::failed(RpcError::invalid_request(
            "the session's agent is connected to this node too",
        ));
        return Box::pin(std::future::ready(refused.encode()));
    };
    let mut channels: Vec<Channel> = shared
        .registry
        .all()
        .into_iter()
        .filter(|c| c.addr.is_chat() && c.session.as_ref() == Some(&session.uri))
        .collect();
    channels.push(session);
    Box::pin(async move {
        for c in &channels {
            c.addr.demote().await;
        }
        link.release(channels.iter().map(|c| c.uri.clone()).collect())
            .await;
        ForwardReply::Done.encode()
    })
}

/// Fewest watchers a node must have of a session before it asks for it.
const WATCHERS_TO_CLAIM: usize = 3;

/// The connections of this node watching `session` or one of its chats.
fn watchers_here(all: &[Channel], session: &ChannelUri) -> usize {
    let mut ids = std::collections::HashSet::new();
    for c in all
        .iter()
        .filter(|c| c.uri == *session || c.session.as_ref() == Some(session))
    {
        ids.extend(c.hub.ids());
    }
    ids.len()
}

/// Another node, where `n` connections watch the session, asks for it:
/// handed over when that is clearly most of its watchers (more than twice
/// this node's, plus one, so it never moves back and forth) and no turn
/// runs in it.
fn hand_over_to_watchers(shared: &Arc<Shared>, session: Channel, n: usize) -> LinkFuture<Vec<u8>> {
    let all = shared.registry.all();
    let here = watchers_here(&all, &session.uri);
    let refuse = |why: String| -> LinkFuture<Vec<u8>> {
        Box::pin(std::future::ready(
            ForwardReply::failed(RpcError::invalid_request(why)).encode(),
        ))
    };
    if n < WATCHERS_TO_CLAIM || n <= 2 * here + 1 {
        return refuse(format!("{here} of its watchers are here, {n} there"));
    }
    let chats: Vec<ChannelAddr> = all
        .iter()
        .filter(|c| c.addr.is_chat() && c.session.as_ref() == Some(&session.uri))
        .map(|c| c.addr.clone())
        .collect();
    let shared = shared.clone();
    Box::pin(async move {
        for c in &chats {
            if c.busy().await {
                return ForwardReply::failed(RpcError::invalid_request("a turn runs in it"))
                    .encode();
            }
        }
        tracing::info!(session = %session.uri, here, there = n, "handing the session to the node where most of its watchers are");
        hand_over(&shared, session).await
    })
}

/// Ask for the sessions this node follows whose agent is connected here
/// (a provider connection), or most of whose watchers are here, and run
/// them here once handed over.
async fn claim_sessions(shared: &Arc<Shared>, all: &[Channel]) {
    let Some(link) = shared.cluster.clone() else {
        return;
    };
    let pinned = |c: &Channel| {
        c.provider
            .as_deref()
            .and_then(|p| shared.providers.get(p))
            .is_some_and(|a| a.pinned_here())
    };
    let wanted: Vec<(&Channel, Option<usize>)> = all
        .iter()
        .filter(|c| !c.addr.is_chat() && c.uri.as_str() != ROOT_RESOURCE_URI)
        .filter(|c| shared.follows(&c.uri))
        .filter_map(|c| {
            if pinned(c) {
                return Some((c, None));
            }
            let n = watchers_here(all, &c.uri);
            (n >= WATCHERS_TO_CLAIM).then_some((c, Some(n)))
        })
        .collect();
    for (session, watchers) in wanted {
        let body = ForwardRequest::Handoff {
            session: session.uri.to_string(),
            watchers,
        }
        .encode();
        let handed = link
            .forward(&session.uri, body)
            .await
            .map(|b| ForwardReply::decode(&b));
        if !matches!(handed, Ok(ForwardReply::Done)) {
            continue;
        }
        let mut channels = vec![session.uri.clone()];
        channels.extend(
            all.iter()
                .filter(|c| c.addr.is_chat() && c.session.as_ref() == Some(&session.uri))
                .map(|c| c.uri.clone()),
        );
        warm(shared, &channels).await;
        // The last batches of the old owner may still be on their way here.
        for _ in 0..HANDOFF_TRIES {
            match link.take_over(channels.clone()).await {
                Ok(true) => {
                    tracing::info!(session = %session.uri, ?watchers, "handed over: this node runs the session now (its agent is connected here, or most of its watchers are)");
                    for uri in &channels {
                        if let Some(c) = shared.registry.get(uri) {
                            c.addr.promote();
                        }
                    }
                    break;
                }
                // A retry's pause: the follow consumer tells nobody when it
                // has read a channel's last batch, and only this round trip
                // says whether the fence can be written yet.
                Ok(false) => tokio::time::sleep(HANDOFF_RETRY).await,
                Err(_) => break,
            }
        }
    }
}

/// Have the chats among `channels` that this node let pass read from the
/// store and applied again: a take-over's fence expects the journal to end
/// where this node read it.
async fn warm(shared: &Arc<Shared>, channels: &[ChannelUri]) {
    for uri in channels {
        if let Some(c) = shared.registry.get(uri) {
            c.addr.warm().await;
        }
    }
}

/// Every few seconds: the sessions this node follows whose owner's lease
/// ran out are taken over, with their chats, and run here from now on.
async fn take_over_orphans(shared: Arc<Shared>) {
    let Some(link) = shared.cluster.clone() else {
        return;
    };
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + link.watch_every(),
        link.watch_every(),
    );
    // A round that overran (NATS slow) is not caught up with more rounds
    // at once: the next waits a whole period.
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let all = shared.registry.all();
        claim_sessions(&shared, &all).await;
        let followed: Vec<ChannelUri> = all
            .iter()
            .filter(|c| !c.addr.is_chat() && c.uri.as_str() != ROOT_RESOURCE_URI)
            .filter(|c| shared.follows(&c.uri))
            .map(|c| c.uri.clone())
            .collect();
        // A chat this node lost while it kept the chat's session (its lease
        // ran out while NATS was away, and its last write is unaccounted
        // for): taken back once nobody holds it.
        let strays: Vec<ChannelUri> = all
            .iter()
            .filter(|c| c.addr.is_chat() && shared.follows(&c.uri))
            .filter(|c| c.session.as_ref().is_some_and(|s| !shared.follows(s)))
            .map(|c| c.uri.clone())
            .collect();
        if followed.is_empty() && strays.is_empty() {
            continue;
        }
        for chat in link.orphans(strays).await {
            warm(&shared, std::slice::from_ref(&chat)).await;
            if let Ok(true) = link.take_over(vec![chat.clone()]).await {
                tracing::warn!(chat = %chat, "this node runs the chat again");
                if let Some(c) = shared.registry.get(&chat) {
                    c.addr.promote();
                }
            }
        }
        for session in link.orphans(followed).await {
            let mut channels = vec![session.clone()];
            channels.extend(
                all.iter()
                    .filter(|c| c.addr.is_chat() && c.session.as_ref() == Some(&session))
                    .map(|c| c.uri.clone()),
            );
            warm(&shared, &channels).await;
            match link.take_over(channels.clone()).await {
                Ok(true) => {
                    tracing::warn!(session = %session, chats = channels.len() - 1, "its node went away: this node runs the session now");
                    // The session first, so its chats' reports find it
                    // writable.
                    for uri in &channels {
                        if let Some(c) = shared.registry.get(uri) {
                            c.addr.promote();
                        }
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(session = %session, error = %e, "take-over failed"),
            }
        }
    }
}
