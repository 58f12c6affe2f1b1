//! Durable before acknowledged, for a session removing one of its chats:
//! `disposeChat` is answered only once the store has forgotten the chat.

use std::sync::Arc;

use super::{CreateChat, RemoveChat};
use crate::channels::testing::{self, TestAgents, TestJournal};
use crate::ids::ChannelUri;

#[actix::test]
async fn a_removed_chat_is_acknowledged_only_once_its_removal_is_stored() {
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let shared = testing::shared(journal.clone(), agents);
    let (root, _) = testing::root(&shared).await;
    let session = testing::session(&shared, &root, "ahp-session:/s").await;
    let chat = ChannelUri::from("ahp-chat:/extra");
    session
        .send(CreateChat {
            chat: chat.clone(),
            by: None,
        })
        .await
        .expect("session runs")
        .expect("created");
    assert!(
        !journal.events().iter().any(|e| e == "sync"),
        "no barrier before the removal: {:?}",
        journal.events()
    );

    journal.open_sync(false);
    let removed = actix::spawn(session.send(RemoveChat {
        chat: chat.clone(),
        by: None,
    }));
    let before = journal.events_before_sync().await;
    assert!(
        before.contains(&format!("remove {chat}")),
        "the chat's records are queued for removal before the barrier: {before:?}"
    );
    assert!(
        before
            .iter()
            .any(|e| e.starts_with("append") && e.contains("session/chatRemoved")),
        "the catalog's removal is journaled before the barrier: {before:?}"
    );
    assert!(
        !removed.is_finished(),
        "acknowledged before the removal is stored"
    );

    let reply = journal.release_sync(removed).await;
    assert!(matches!(reply, Ok(Ok(()))), "{reply:?}");
    assert!(
        shared.registry.get(&chat).is_none(),
        "gone from the registry"
    );
}
