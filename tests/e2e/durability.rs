//! The SQLite store: nothing a client saw is lost on a crash, history pages in
//! order after a restart, and a broken store is reported clearly.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ahp::SubscriptionEvent;
use ahp_types::actions::StateAction;
use ahp_types::commands::ReconnectResult;
use ahp_types::state::{ResponsePart, SnapshotState, TurnState};
use common::*;
use serde_json::{json, Value};
use tandem::Config;

fn queued(id: &str) -> StateAction {
    action(
        json!({"type": "chat/pendingMessageSet", "kind": "queued", "id": id, "message": {"text": id, "origin": {"kind": "user"}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_echoed_action_survives_sigkill_and_clients_converge_after_restart() {
    let dir = temp_dir("crash");
    let data = dir.join("data");
    let mut server = ServerProcess::spawn(&data, &[]);
    let owner = server.client("owner").await;
    let mut chats = Vec::new();
    for _ in 0..4 {
        chats.push(owner.create_session().await.1);
    }
    // An observer that will reconnect after the restart.
    let mut observer = server.client("observer").await;
    for c in &chats {
        observer.subscribe_chat(c).await;
    }

    // Four writers on their own connections, each writing to every chat, and
    // recording every id the server echoed as accepted.
    let echoed = Arc::new(tokio::sync::watch::channel(HashSet::<String>::new()).0);
    let mut writers = Vec::new();
    for w in 0..4 {
        let c = server.client(&format!("writer-{w}")).await;
        let chats = chats.clone();
        let echoed = echoed.clone();
        writers.push(tokio::spawn(async move {
            let mut events = c.client.events();
            let reader = {
                let echoed = echoed.clone();
                tokio::spawn(async move {
                    while let Some(ev) = events.recv().await {
                        if let SubscriptionEvent::Action(env) = ev.event {
                            if let (StateAction::ChatPendingMessageSet(a), None) =
                                (&env.action, &env.rejection_reason)
                            {
                                echoed.send_modify(|e| {
                                    e.insert(a.id.clone());
                                });
                            }
                        }
                    }
                })
            };
            for i in 0..100_000 {
                let chat = &chats[i % chats.len()];
                if c.client
                    .dispatch(chat.clone(), queued(&format!("w{w}-{i}")))
                    .await
                    .is_err()
                {
                    break;
                }
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), reader).await;
        }));
    }
    // Let them write, then kill the server mid-load: once 1,000 actions
    // were echoed (the writers go on sending meanwhile).
    let mut seen = echoed.subscribe();
    tokio::time::timeout(WAIT, seen.wait_for(|e| e.len() >= 1000))
        .await
        .expect("1,000 echoes in time")
        .expect("the writers report");
    let last_seen = {
        let mut last = 0;
        while let Ok(Some(ev)) =
            tokio::time::timeout(Duration::from_millis(1), observer.events.recv()).await
        {
            if let SubscriptionEvent::Action(env) = ev.event {
                last = last.max(env.server_seq);
            }
        }
        last
    };
    server.kill();
    for w in writers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    let echoed = echoed.borrow().clone();
    assert!(
        echoed.len() >= 1000,
        "the load ran ({} echoes)",
        echoed.len()
    );

    // Restart on the same data dir.
    let server = ServerProcess::spawn(&data, &[]);
    let checker = server.client("checker").await;
    let mut stored = HashSet::new();
    for c in &chats {
        let state = checker.subscribe_chat(c).await.state;
        stored.extend(state.queued_messages.iter().flatten().map(|m| m.id.clone()));
    }
    let lost: Vec<_> = echoed.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} echoed actions lost, e.g. {:?}",
        lost.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );

    // A client from before the restart reconnects: snapshots, equal to fresh.
    let back = TestClient::raw_connect(&server.url()).await;
    let res = back
        .reconnect("observer".into(), last_seen as i64, chats.clone())
        .await
        .expect("reconnect");
    let ReconnectResult::Snapshot(snaps) = res else {
        panic!("a reconnect from before the restart gets snapshots, got {res:?}")
    };
    assert_eq!(snaps.snapshots.len(), chats.len());
    for snap in snaps.snapshots {
        assert!(
            snap.from_seq as u64 > last_seen,
            "serverSeq never goes backwards across restarts"
        );
        let SnapshotState::Chat(state) = snap.state else {
            panic!("chat snapshot")
        };
        let fresh = checker.subscribe_chat(&snap.resource).await.state;
        assert_eq!(
            *state, fresh,
            "reconnected client converges with a fresh subscriber"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_request_with_drafts_survives_and_its_turn_ends_with_an_error() {
    let dir = temp_dir("pending");
    let data = dir.join("data");
    let mut server = ServerProcess::spawn(&data, &[]);
    let mut c = server.client("c").await;
    let (session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    c.start_turn(&chat, r#"/ask {"questions":[{"kind":"text","id":"a","message":"A?","required":true},{"kind":"integer","id":"b","message":"B?"}]}"#).await;
    c.wait_for(Some(&mut m), |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let rid = open_request_id(&m.state).expect("open request");
    let d1 = c.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "a", "answer": {"state": "draft", "value": {"kind": "text", "value": "half-typed"}}}))).await;
    let d2 = c.dispatch(&chat, action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "b", "answer": {"state": "draft", "value": {"kind": "number", "value": 4}}}))).await;
    c.wait_echo(Some(&mut m), d1).await;
    c.wait_echo(Some(&mut m), d2).await;
    server.kill();

    let server = ServerProcess::spawn(&data, &[]);
    let c = server.client("after").await;
    let state = c.subscribe_chat(&chat).await.state;
    assert!(state.active_turn.is_none(), "the running turn was ended");
    let turn = state.turns.last().expect("the turn is in the record");
    assert_eq!(turn.state, TurnState::Error);
    let part = turn
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::InputRequest(i) => Some(i.clone()),
            _ => None,
        })
        .expect("the input request part survived");
    assert_eq!(part.request.id, rid);
    assert_eq!(
        part.response, None,
        "an unanswered request keeps response absent"
    );
    let answers = part.request.answers.expect("drafts survived");
    assert_eq!(answers.len(), 2);
    assert!(matches!(
        turn.response_parts.last(),
        Some(ResponsePart::Error(_))
    ));
    // The session no longer lists it as waiting.
    let (c, session) = (&c, &session);
    eventually(
        "the session roll-up drops the ended request",
        || async move {
            c.subscribe_session(session)
                .await
                .input_needed
                .is_none()
                .then_some(())
        },
    )
    .await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_turns_pages_through_500_turns_after_a_restart() {
    let dir = temp_dir("paging");
    let config = Config {
        data_dir: Some(dir.join("data")),
        ..Config::default()
    };
    let server = TestServer::start_with(config.clone()).await;
    let mut c = server.client("pager").await;
    let (_s, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    let mut ids = Vec::new();
    for i in 0..500 {
        ids.push(c.start_turn(&chat, &format!("turn {i}")).await);
        c.wait_state(&mut m, |s| {
            s.active_turn.is_none() && s.turns.len() == i + 1
        })
        .await;
    }
    c.client.shutdown().await;
    server.stop().await;

    let server = TestServer::start_with(config).await;
    let mut c = server.client("pager-2").await;
    let mut m = c.subscribe_chat(&chat).await;
    assert!(
        m.state.turns.len() < 500,
        "only a window is loaded after a restart"
    );
    assert!(m.state.turns_next_cursor.is_some());
    let bad = c
        .client
        .request::<_, Value>(
            "fetchTurns",
            json!({"channel": chat, "cursor": "turns-before:3"}),
        )
        .await;
    assert!(
        bad.is_err(),
        "a cursor that is not the current one is refused"
    );
    let pages = fetch_all_turns(&mut c, &mut m).await;
    assert!(pages <= 20, "{pages} pages");
    let got: Vec<String> = m.state.turns.iter().map(|t| t.id.clone()).collect();
    assert_eq!(got.len(), 500, "no turn missing");
    assert_eq!(got, ids, "in order, no gap or duplicate");
    assert_eq!(m.state.turns[499].message.text, "turn 499");
    assert_eq!(
        fresh_chat(&server, &chat).await,
        m.state,
        "everyone sees the loaded history"
    );
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `n` turns `"{prefix}{i}"` to completion; returns their ids.
async fn run_turns(c: &mut TestClient, m: &mut ChatMirror, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let before = m.state.turns.len();
        ids.push(c.start_turn(&m.uri.clone(), &format!("{prefix}{i}")).await);
        c.wait_state(m, |s| {
            s.active_turn.is_none() && s.turns.len() == before + 1
        })
        .await;
    }
    ids
}

/// Dispatch `chat/truncated` (keep up to `keep`, or clear) and wait for it.
async fn truncate(c: &mut TestClient, m: &mut ChatMirror, keep: Option<&str>) {
    let mut a = json!({"type": "chat/truncated"});
    if let Some(id) = keep {
        a["turnId"] = json!(id);
    }
    let seq = c.dispatch(&m.uri.clone(), action(a)).await;
    let echo = c.wait_echo(Some(m), seq).await;
    assert!(echo.rejection_reason.is_none(), "{echo:?}");
}

fn turn_ids(m: &ChatMirror) -> Vec<String> {
    m.state.turns.iter().map(|t| t.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_history_stays_truncated_across_restarts_and_paging() {
    let dir = temp_dir("truncated");
    let config = Config {
        data_dir: Some(dir.join("data")),
        turns_window: 3,
        turns_page: 2,
        snapshot_every: 7,
        ..Config::default()
    };
    let restart = |server: TestServer| {
        let config = config.clone();
        async move {
            server.stop().await;
            TestServer::start_with(config).await
        }
    };
    let server = TestServer::start_with(config.clone()).await;
    let mut c = server.client("t").await;
    let (_s, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    let mut ids = run_turns(&mut c, &mut m, "a", 8).await;
    truncate(&mut c, &mut m, Some(&ids[4])).await;
    ids.truncate(5);
    ids.extend(run_turns(&mut c, &mut m, "b", 2).await);
    assert_eq!(turn_ids(&m), ids);
    c.client.shutdown().await;

    // After a restart only a window is loaded; truncate inside it, with
    // older turns still only in the store.
    let server = restart(server).await;
    let mut c = server.client("t2").await;
    let mut m = c.subscribe_chat(&chat).await;
    assert_eq!(turn_ids(&m), ids[4..], "the newest window of what is left");
    assert!(m.state.turns_next_cursor.is_some());
    truncate(&mut c, &mut m, Some(&ids[5])).await;
    ids.truncate(6);
    ids.extend(run_turns(&mut c, &mut m, "c", 1).await);
    c.client.shutdown().await;

    // Paging after another restart finds exactly what is left: no truncated
    // turn comes back, none is missing or repeated.
    let server = restart(server).await;
    let mut c = server.client("t3").await;
    let mut m = c.subscribe_chat(&chat).await;
    assert_eq!(turn_ids(&m), ids[ids.len() - 3..]);
    let pages = fetch_all_turns(&mut c, &mut m).await;
    assert_eq!(turn_ids(&m), ids, "history after truncations and restarts");
    assert_eq!(pages, 2, "4 older turns in pages of 2");
    assert_eq!(fresh_chat(&server, &chat).await, m.state);

    // Clearing everything leaves nothing to load, across a restart too.
    truncate(&mut c, &mut m, None).await;
    c.client.shutdown().await;
    let server = restart(server).await;
    let c = server.client("t4").await;
    let m = c.subscribe_chat(&chat).await;
    assert!(m.state.turns.is_empty(), "{:?}", turn_ids(&m));
    assert_eq!(m.state.turns_next_cursor, None);
    let none: Value = c
        .client
        .request("fetchTurns", json!({"channel": chat}))
        .await
        .expect("fetchTurns");
    assert_eq!(none, json!({}));
    c.client.shutdown().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_data_dir_or_a_corrupt_store_is_refused_with_a_clear_message() {
    let dir = temp_dir("broken");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, "x").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["serve", "--bind", "127.0.0.1:0", "--data-dir"])
        .arg(&file)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot create the data directory") && err.contains("not-a-dir"),
        "{err}"
    );

    let corrupt = dir.join("corrupt");
    std::fs::create_dir_all(&corrupt).expect("dir");
    std::fs::write(
        corrupt.join("tandem.db"),
        "definitely not an SQLite database, but long enough to be read as a header".repeat(20),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["serve", "--bind", "127.0.0.1:0", "--data-dir"])
        .arg(&corrupt)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a database") && err.contains("tandem.db"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
