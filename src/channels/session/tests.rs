//! Durable before acknowledged, for a session removing one of its chats:
//! `disposeChat` is answered only once the store has forgotten the chat.

use std::sync::Arc;

use super::{CreateChat, RemoveChat};
use crate::channels::registry::ChannelAddr;
use crate::channels::root::CreateSession;
use crate::channels::testing::{self, TestAgents, TestJournal, WAIT};
use crate::ids::ChannelUri;

#[actix::test]
async fn a_removed_chat_is_acknowledged_only_once_its_removal_is_stored() {
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let shared = testing::shared(journal.clone(), agents);
    let (root, _) = testing::root(&shared).await;
    let session_uri = "ahp-session:/s";
    root.send(CreateSession {
        uri: session_uri.into(),
        owner: None,
        provider: None,
    })
    .await
    .expect("root runs")
    .expect("created");
    let Some(ChannelAddr::Session(session)) = shared.registry.get(session_uri).map(|c| c.addr)
    else {
        panic!("the session is registered");
    };
    let chat = ChannelUri::from("ahp-chat:/extra");
    session
        .send(CreateChat { chat: chat.clone() })
        .await
        .expect("session runs")
        .expect("created");
    assert!(
        !journal.events().iter().any(|e| e == "sync"),
        "no barrier before the removal: {:?}",
        journal.events()
    );

    journal.open_sync(false);
    let removed = actix::spawn(session.send(RemoveChat { chat: chat.clone() }));
    journal
        .wait_event("a store barrier after the removal", |e| e == "sync")
        .await;
    let events = journal.events();
    let barrier = events.iter().position(|e| e == "sync").expect("synced");
    let forgotten = events.iter().position(|e| *e == format!("remove {chat}"));
    assert!(
        forgotten.is_some_and(|f| f < barrier),
        "the chat's records are queued for removal before the barrier: {events:?}"
    );
    let uncataloged = events
        .iter()
        .position(|e| e.starts_with("append") && e.contains("session/chatRemoved"));
    assert!(
        uncataloged.is_some_and(|u| u < barrier),
        "the catalog's removal is journaled before the barrier: {events:?}"
    );
    assert!(
        !removed.is_finished(),
        "acknowledged before the removal is stored"
    );

    journal.open_sync(true);
    let reply = tokio::time::timeout(WAIT, removed).await;
    assert!(matches!(reply, Ok(Ok(Ok(Ok(()))))), "{reply:?}");
    assert!(
        shared.registry.get(&chat).is_none(),
        "gone from the registry"
    );
}
