//! Durable before visible, for root: a session is announced, counted,
//! listed and acknowledged only once the store has it, and its disposal
//! only once the store has forgotten it.

use std::sync::Arc;

use super::{CreateSession, ListSessions, RemoveSession};
use crate::channels::session::GetSessionState;
use crate::channels::testing::{self, TestAgents, TestJournal, WAIT};

fn position(frames: &[String], what: &str) -> Option<usize> {
    frames.iter().position(|f| f.contains(what))
}

fn create(uri: &str) -> CreateSession {
    CreateSession {
        uri: uri.into(),
        owner: None,
        provider: None,
        home: None,
    }
}

fn list() -> ListSessions {
    ListSessions {
        scope: None,
        limit: None,
        cursor: None,
    }
}

#[actix::test]
async fn a_new_session_is_announced_counted_listed_and_acknowledged_only_once_stored() {
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let shared = testing::shared(journal.clone(), agents);
    let (root, watcher) = testing::root(&shared).await;
    let uri = "ahp-session:/held";

    journal.open_creates(false);
    let created = actix::spawn(root.send(create(uri)));
    journal
        .wait_event("the session's record", |e| e == format!("create {uri}"))
        .await;
    // Its first actions are journaled too: only the record is held now.
    journal
        .wait_event("the session's first actions", |e| {
            e.starts_with("append") && e.contains("session/ready")
        })
        .await;
    let early = testing::frames(&watcher);
    assert_eq!(position(&early, "root/sessionAdded"), None, "{early:?}");
    assert_eq!(
        position(&early, "root/activeSessionsChanged"),
        None,
        "{early:?}"
    );
    let listed = root.send(list()).await.expect("root runs").expect("lists");
    assert!(
        listed.items.is_empty(),
        "listed before stored: {:?}",
        listed.items
    );
    assert!(!created.is_finished(), "acknowledged before stored");

    journal.open_creates(true);
    let reply = tokio::time::timeout(WAIT, created).await;
    assert!(matches!(reply, Ok(Ok(Ok(Ok(()))))), "{reply:?}");
    let seen = testing::frames(&watcher);
    let added = position(&seen, "root/sessionAdded").expect("announced once stored");
    let counted = position(&seen, "root/activeSessionsChanged").expect("counted once stored");
    assert!(added < counted, "{seen:?}");
    if let Some(changed) = position(&seen, "root/sessionSummaryChanged") {
        assert!(
            added < changed,
            "a change announced before the session: {seen:?}"
        );
    }
    let listed = root.send(list()).await.expect("root runs").expect("lists");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].resource, uri);
}

#[actix::test]
async fn a_disposed_session_is_announced_gone_only_once_its_removal_is_stored() {
    let journal = Arc::new(TestJournal::default());
    let (agents, _turns) = TestAgents::new();
    let shared = testing::shared(journal.clone(), agents);
    let (root, watcher) = testing::root(&shared).await;
    let uri = "ahp-session:/gone";
    let session = testing::session(&shared, &root, uri).await;
    let chat = session
        .send(GetSessionState)
        .await
        .expect("session runs")
        .default_chat
        .expect("a default chat");
    testing::frames(&watcher);

    journal.open_sync(false);
    let removed = actix::spawn(root.send(RemoveSession {
        by: None,
        uri: uri.into(),
        local: false,
    }));
    let before = journal.events_before_sync().await;
    for channel in [uri, chat.as_str()] {
        assert!(
            before.contains(&format!("remove {channel}")),
            "{channel} removed before the barrier: {before:?}"
        );
    }
    let early = testing::frames(&watcher);
    assert_eq!(position(&early, "root/sessionRemoved"), None, "{early:?}");
    assert_eq!(
        position(&early, "root/activeSessionsChanged"),
        None,
        "{early:?}"
    );
    assert!(
        !removed.is_finished(),
        "acknowledged before the removal is stored"
    );

    let reply = journal.release_sync(removed).await;
    assert!(matches!(reply, Ok(Ok(()))), "{reply:?}");
    let seen = testing::frames(&watcher);
    assert!(position(&seen, "root/sessionRemoved").is_some(), "{seen:?}");
    assert!(
        position(&seen, "root/activeSessionsChanged").is_some(),
        "{seen:?}"
    );
}
