//! Three live Tandem nodes on one real `nats-server -js` serve one chat
//! together: clients of the chat spread over the nodes answer one input
//! request, their drafts converge, the second completion is refused, and
//! every client's state equals a fresh snapshot from every node; an owner
//! killed mid-load hands its chats to a surviving node; a paused owner that
//! wakes up cannot append; NATS restarted mid-load loses nothing echoed.

use std::time::Duration;

use ahp_types::actions::{ActionEnvelope, StateAction};
use ahp_types::state::{ChatState, ResponsePart};
use serde_json::{json, Value};

use crate::common::nats::{node, NatsServer};
use crate::common::{
    action, eventually, healthz, open_request_id, temp_dir, turn_started, ChatMirror,
    ServerProcess, TestClient,
};

/// Subscribe to `chat` on a node that may not have heard of it yet.
async fn join_chat(c: &TestClient, chat: &str) -> ChatMirror {
    eventually("the node knows the chat", || async {
        let r: Result<ahp_types::commands::SubscribeResult, _> = c
            .client
            .request("subscribe", json!({"channel": chat}))
            .await;
        r.ok()
    })
    .await;
    // Subscribed: the mirror comes from a second, ordinary subscribe.
    c.subscribe_chat(chat).await
}

/// A fresh snapshot of `chat` from `node`, once it serves the chat (a node
/// back from a NATS outage refuses subscriptions until it has read the
/// chat again).
async fn fresh(node: &ServerProcess, chat: &str) -> ChatState {
    let c = node
        .client(&format!("fresh-{}", uuid::Uuid::new_v4()))
        .await;
    let m = join_chat(&c, chat).await;
    c.client.shutdown().await;
    m.state
}

fn text_answer(state: &str, v: &str) -> Value {
    json!({"state": state, "value": {"kind": "text", "value": v}})
}

fn answers(state: &ChatState) -> usize {
    state
        .active_turn
        .as_ref()
        .and_then(|t| {
            t.response_parts.iter().find_map(|p| match p {
                ResponsePart::InputRequest(i) => i.request.answers.as_ref().map(|a| a.len()),
                _ => None,
            })
        })
        .unwrap_or(0)
}

fn is_request(e: &ActionEnvelope) -> bool {
    matches!(e.action, StateAction::ChatInputRequested(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_three_nodes_answer_one_request_together() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster3");
    let nodes = [
        node(&dir, &nats, "a"),
        node(&dir, &nats, "b"),
        node(&dir, &nats, "c"),
    ];
    let mut ca = nodes[0].client("ann").await;
    let mut cb = nodes[1].client("bob").await;
    let mut cc = nodes[2].client("cat").await;
    let (_session, chat) = ca.create_session().await;
    let mut ma = ca.subscribe_chat(&chat).await;
    let mut mb = join_chat(&cb, &chat).await;
    let mut mc = join_chat(&cc, &chat).await;

    // Bob, on b, starts the turn: b forwards it to a, which runs the agent.
    let spec = json!({
        "message": "Before I deploy",
        "questions": [
            {"kind": "text", "id": "q1", "message": "Service?", "required": true},
            {"kind": "text", "id": "q2", "message": "Owner?", "required": true},
            {"kind": "text", "id": "q3", "message": "Window?"}
        ]
    });
    cb.start_turn(&chat, &format!("/ask {spec}")).await;
    ca.wait_for(Some(&mut ma), is_request).await;
    cb.wait_for(Some(&mut mb), is_request).await;
    cc.wait_for(Some(&mut mc), is_request).await;
    let rid = open_request_id(&ma.state).expect("an open request");
    assert_eq!(open_request_id(&mb.state), Some(rid.clone()));
    assert_eq!(open_request_id(&mc.state), Some(rid.clone()));

    // One draft from each node.
    for (c, q, v) in [
        (&ca, "q1", "billing"),
        (&cb, "q2", "team-pay"),
        (&cc, "q3", "tonight"),
    ] {
        c.dispatch(
            &chat,
            action(json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": q, "answer": text_answer("draft", v)})),
        )
        .await;
    }
    for (c, m) in [(&mut ca, &mut ma), (&mut cb, &mut mb), (&mut cc, &mut mc)] {
        c.wait_state(m, |s| answers(s) == 3).await;
    }

    // Bob (on b) and Cat (on c) both complete: exactly one is accepted.
    let complete = |v: &str| {
        action(json!({
            "type": "chat/inputCompleted", "requestId": rid, "response": "accept",
            "answers": {
                "q1": text_answer("submitted", "billing"),
                "q2": text_answer("submitted", "team-pay"),
                "q3": text_answer("submitted", v),
            }
        }))
    };
    let sb = cb.dispatch(&chat, complete("tonight")).await;
    let sc = cc.dispatch(&chat, complete("tomorrow")).await;
    let eb = cb.wait_echo(Some(&mut mb), sb).await;
    let ec = cc.wait_echo(Some(&mut mc), sc).await;
    let accepted = [&eb, &ec]
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .count();
    assert_eq!(accepted, 1, "b: {eb:?}\nc: {ec:?}");

    let done = |s: &ChatState| s.active_turn.is_none() && !s.turns.is_empty();
    for (c, m) in [(&mut ca, &mut ma), (&mut cb, &mut mb), (&mut cc, &mut mc)] {
        c.wait_state(m, done).await;
    }
    assert_eq!(ma.state, mb.state, "a and b converge");
    assert_eq!(ma.state, mc.state, "a and c converge");
    for n in &nodes {
        assert_eq!(
            fresh(n, &chat).await,
            ma.state,
            "fresh snapshot from {}",
            n.addr
        );
    }
    // The agent resumed exactly once, with the winner's answers.
    let settled = crate::common::last_turn_markdown(&ma.state)
        .into_iter()
        .filter(|m| m.starts_with("settled: "))
        .count();
    assert_eq!(settled, 1, "{:?}", ma.state.turns.last());
}

/// What a writer saw: the texts of its turns that were accepted, its
/// client and its mirror of the chat.
struct Written {
    accepted: Vec<String>,
    client: TestClient,
    mirror: ChatMirror,
}

/// How long a writer waits after a refused start before it tries again:
/// a client's retry pace while no node runs its chat (a takeover, NATS
/// away), not a wait for anything.
const RETRY_AFTER_REFUSAL: Duration = Duration::from_millis(200);

/// What one writer's start came to, reported as it happens.
struct Outcome {
    writer: usize,
    accepted: bool,
}

/// Start turns on `chat` one after the other (each waits for the previous
/// to end: by the agent, or by the node that took the chat over) until
/// `stop` says so, reporting each outcome on `report`; a refused start is
/// tried again shortly.
async fn write_turns(
    mut c: TestClient,
    chat: String,
    writer: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
    report: tokio::sync::mpsc::UnboundedSender<Outcome>,
) -> Written {
    let mut m = join_chat(&c, &chat).await;
    let mut accepted = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        let text = format!("w{writer}-{i}");
        i += 1;
        let seq = c
            .dispatch(
                &chat,
                turn_started(&uuid::Uuid::new_v4().to_string(), &text),
            )
            .await;
        let echo = c.wait_echo(Some(&mut m), seq).await;
        let ok = echo.rejection_reason.is_none();
        let _ = report.send(Outcome {
            writer,
            accepted: ok,
        });
        if !ok {
            // Retried after the pause, or at once when told to stop.
            let _ = tokio::time::timeout(RETRY_AFTER_REFUSAL, stop.changed()).await;
            continue;
        }
        accepted.push(text);
        c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    }
    Written {
        accepted,
        client: c,
        mirror: m,
    }
}

/// The writers' outcomes as the test reads them.
struct Tally {
    outcomes: tokio::sync::mpsc::UnboundedReceiver<Outcome>,
    accepted: Vec<usize>,
    refused: Vec<usize>,
}

impl Tally {
    /// Writers that report on the returned sender, numbered from 0.
    fn new(writers: usize) -> (Self, tokio::sync::mpsc::UnboundedSender<Outcome>) {
        let (tx, outcomes) = tokio::sync::mpsc::unbounded_channel();
        let tally = Self {
            outcomes,
            accepted: vec![0; writers],
            refused: vec![0; writers],
        };
        (tally, tx)
    }

    /// Read outcomes until `done` holds of the counts (accepted, refused per
    /// writer), failing after [`WAIT`](crate::common::WAIT) with `what`.
    async fn until(&mut self, what: &str, done: impl Fn(&[usize], &[usize]) -> bool) {
        let deadline = tokio::time::Instant::now() + crate::common::WAIT;
        while !done(&self.accepted, &self.refused) {
            let o = tokio::time::timeout_at(deadline, self.outcomes.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out waiting until {what}: accepted {:?}, refused {:?}",
                        self.accepted, self.refused
                    )
                })
                .expect("the writers report");
            let counts = if o.accepted {
                &mut self.accepted
            } else {
                &mut self.refused
            };
            counts[o.writer] += 1;
        }
    }
}

/// The user messages of every turn of `state`.
fn messages(state: &ChatState) -> Vec<String> {
    state
        .turns
        .iter()
        .map(|t| t.message.text.clone())
        .chain(state.active_turn.iter().map(|t| t.message.text.clone()))
        .collect()
}

/// Every accepted turn is in `state`, once, in the writer's order.
fn assert_all_kept(state: &ChatState, w: &Written) {
    let msgs = messages(state);
    let kept: Vec<&String> = msgs.iter().filter(|m| w.accepted.contains(m)).collect();
    assert_eq!(
        kept,
        w.accepted.iter().collect::<Vec<_>>(),
        "every echoed turn kept, once, in order; chat holds {msgs:?}"
    );
}

/// Wait until `w`'s mirror ends where a fresh snapshot from `node` does.
async fn settle(w: &mut Written, node: &ServerProcess, chat: &str) -> ChatState {
    let want = eventually("no turn running", || async {
        let s = fresh(node, chat).await;
        s.active_turn.is_none().then_some(s)
    })
    .await;
    let Written { client, mirror, .. } = w;
    client.wait_state(mirror, |s| *s == want).await;
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_mid_load_hands_its_chats_to_a_surviving_node_and_nothing_echoed_is_lost() {
    let nats = NatsServer::start();
    let dir = temp_dir("cluster3");
    let mut a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let c = node(&dir, &nats, "c");
    let ca = a.client("ann").await;
    let (session, chat1) = ca.create_session().await;
    let chat2 = format!("ahp-chat:/{}", uuid::Uuid::new_v4());
    let _: Value = ca
        .client
        .request("createChat", json!({"channel": session, "chat": chat2}))
        .await
        .expect("createChat");
    // Ann watches from a, the owner, until it dies.
    let mut ma = ca.subscribe_chat(&chat1).await;

    // Writers on b and c, one chat each, both run by a.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (mut tally, report) = Tally::new(2);
    let wb = tokio::spawn(write_turns(
        b.client("bob").await,
        chat1.clone(),
        0,
        stopped.clone(),
        report.clone(),
    ));
    let wc = tokio::spawn(write_turns(
        c.client("cat").await,
        chat2.clone(),
        1,
        stopped,
        report,
    ));
    let mut ca = ca;
    ca.wait_state(&mut ma, |s| s.turns.len() >= 3).await;
    tally
        .until("both wrote while a ran the chats", |a, _| {
            a.iter().all(|n| *n > 0)
        })
        .await;
    a.kill();
    // A number a handed Ann (her snapshot's).
    let last_seen_on_a = ma.from_seq;
    // Writes go on being made while nobody runs the chats; whether one is
    // refused or waits for the new owner depends on how fast the lease
    // runs out. Each writer has at most one write in flight to `a`, so
    // three more echoes each were committed by a surviving node.
    let before = tally.accepted.clone();
    tally
        .until("both write again on the surviving nodes", |a, _| {
            a.iter().zip(&before).all(|(now, then)| now >= &(then + 3))
        })
        .await;
    stop.send_replace(true);
    let (mut wb, mut wc) = (wb.await.expect("bob"), wc.await.expect("cat"));
    assert!(wb.accepted.len() > 3 && wc.accepted.len() > 3, "both wrote");
    let owned = healthz(b.addr).await["cluster"]["channelsOwned"]
        .as_u64()
        .unwrap_or(0)
        + healthz(c.addr).await["cluster"]["channelsOwned"]
            .as_u64()
            .unwrap_or(0);
    assert_eq!(
        owned, 3,
        "the session and both chats moved to a surviving node"
    );

    for (w, chat) in [(&mut wb, &chat1), (&mut wc, &chat2)] {
        let want = settle(w, &b, chat).await;
        assert_all_kept(&want, w);
        assert_eq!(fresh(&c, chat).await, want, "b and c serve the same chat");
    }
    // Ann reconnects to a surviving node with what a sent her: snapshots,
    // equal to what the others see.
    let back = TestClient::raw_connect(&c.url()).await;
    let res = back
        .reconnect("ann".into(), last_seen_on_a as i64, vec![chat1.clone()])
        .await
        .expect("reconnect");
    let ahp_types::commands::ReconnectResult::Snapshot(s) = res else {
        panic!("a reconnect from a dead node's numbering gets snapshots, got {res:?}");
    };
    let ahp_types::state::SnapshotState::Chat(state) = &s.snapshots[0].state else {
        panic!("a chat snapshot");
    };
    assert_eq!(**state, wb.mirror.state, "Ann converges");
    back.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restarted_mid_load_refuses_writes_meanwhile_loses_nothing_and_resumes() {
    let mut nats = NatsServer::start();
    let dir = temp_dir("cluster3");
    let a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let c = node(&dir, &nats, "c");
    let ca = a.client("ann").await;
    let (session1, chat1) = ca.create_session().await;
    let (_session2, chat2) = ca.create_session().await;
    // One writer on the owner, one on a follower.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (mut tally, report) = Tally::new(2);
    let wa = tokio::spawn(write_turns(
        ca,
        chat1.clone(),
        0,
        stopped.clone(),
        report.clone(),
    ));
    let wb = tokio::spawn(write_turns(
        b.client("bob").await,
        chat2.clone(),
        1,
        stopped,
        report,
    ));
    let mut probe = a.client("probe").await;
    tally
        .until("both write", |a, _| a.iter().all(|&n| n >= 3))
        .await;
    nats.stop();
    // A write to the owner while NATS is away is refused, with the reason.
    // (The writers may be between turns or waiting for one to end — an
    // agent's update refused by the store ends the turn only once the
    // store is back — so the probe says it, not they.)
    let seq = probe
        .dispatch(
            &session1,
            action(json!({"type": "session/titleChanged", "title": "while NATS is away"})),
        )
        .await;
    let refused = probe.wait_echo(None, seq).await.rejection_reason;
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("store")),
        "a write while NATS is away: {refused:?}"
    );
    nats.restart();
    let before = tally.accepted.clone();
    tally
        .until("both write again after the restart", |a, _| {
            a.iter().zip(&before).all(|(now, then)| now >= &(then + 3))
        })
        .await;
    stop.send_replace(true);
    let (mut wa, mut wb) = (wa.await.expect("ann"), wb.await.expect("bob"));
    // Service resumed by itself: both wrote after the restart, and the
    // nodes agree on everything echoed.
    for (w, chat) in [(&mut wa, &chat1), (&mut wb, &chat2)] {
        assert!(w.accepted.len() > 3, "{} accepted", w.accepted.len());
        let want = settle(w, &c, chat).await;
        assert_all_kept(&want, w);
        for n in [&a, &b] {
            assert_eq!(
                fresh(n, chat).await,
                want,
                "every node serves the same chat"
            );
        }
    }
    let mut cb = b.client("bob-after").await;
    let seq = cb
        .dispatch(
            &chat1,
            turn_started(&uuid::Uuid::new_v4().to_string(), "after"),
        )
        .await;
    assert_eq!(cb.wait_echo(None, seq).await.rejection_reason, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_follows_its_agent_to_the_node_its_provider_connects_to() {
    use crate::common::provider::{session_with, Provider};
    let nats = NatsServer::start();
    let dir = temp_dir("cluster3");
    let a = node(&dir, &nats, "a");
    let b = node(&dir, &nats, "b");
    let c = node(&dir, &nats, "c");
    let agent = Provider::connect(&a.url(), "helper").await;
    let ca = a.client("ann").await;
    let (_session, chat) = session_with(&ca, "helper").await;
    assert_eq!(healthz(a.addr).await["cluster"]["channelsOwned"], 2);

    // The provider moves to b: the session follows it there.
    agent.client.shutdown().await;
    let mut agent = Provider::connect(&b.url(), "helper").await;
    eventually("b runs the session", || async {
        (healthz(b.addr).await["cluster"]["channelsOwned"] == 2).then_some(())
    })
    .await;
    assert_eq!(healthz(a.addr).await["cluster"]["channelsOwned"], 0);

    // A person on c starts a turn: it reaches the agent on b.
    let mut cc = c.client("cat").await;
    let mut m = join_chat(&cc, &chat).await;
    cc.start_turn(&chat, "hello from c").await;
    let (turn_chat, turn, text) = agent.next_turn().await;
    assert_eq!(
        (turn_chat.as_str(), text.as_str()),
        (chat.as_str(), "hello from c")
    );
    agent.finish(&chat, &turn, "answered on b").await;
    cc.wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    assert_eq!(
        crate::common::last_turn_markdown(&m.state),
        ["answered on b"]
    );
    assert_eq!(fresh(&a, &chat).await, m.state, "a follows b");
}

/// The next action envelope on `c`, `None` once its connection is gone.
async fn next_action(c: &mut TestClient) -> Option<ActionEnvelope> {
    loop {
        let ev = tokio::time::timeout(crate::common::WAIT, c.events.recv())
            .await
            .ok()??;
        if let ahp::SubscriptionEvent::Action(env) = ev.event {
            return Some(env);
        }
    }
}

/// A client of `chat` through the node at `url`, with its mirror; `None`
/// when that node does not serve now (it is stopping or starting).
async fn try_join(url: &str, id: &str, chat: &str) -> Option<(TestClient, ChatMirror)> {
    let transport = ahp_ws::WebSocketTransport::connect(url).await.ok()?;
    let client = ahp::Client::connect(transport, crate::common::client_config())
        .await
        .ok()?;
    let events = client.events();
    let init = client
        .initialize(id.into(), vec!["1.0.0".into()], vec![])
        .await
        .ok()?;
    let c = TestClient {
        client,
        id: id.into(),
        events,
        init,
    };
    let res: ahp_types::commands::SubscribeResult = c
        .client
        .request("subscribe", json!({"channel": chat}))
        .await
        .ok()?;
    let snap = res.snapshot?;
    let ahp_types::state::SnapshotState::Chat(state) = snap.state else {
        return None;
    };
    let mirror = ChatMirror {
        uri: chat.into(),
        state: *state,
        from_seq: snap.from_seq as u64,
    };
    Some((c, mirror))
}

/// [`write_turns`] through whichever node of `urls` answers: when its node
/// goes (a restart), the writer connects to the next one and goes on. A
/// turn counts as accepted only once its echo came back; one whose echo
/// was lost with the connection is not counted.
async fn write_turns_anywhere(
    urls: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
    chat: String,
    writer: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
    report: tokio::sync::mpsc::UnboundedSender<Outcome>,
) -> Vec<String> {
    let mut accepted = Vec::new();
    let mut i = 0;
    let mut next = writer + 1;
    while !*stop.borrow() {
        let url = {
            let u = urls.lock();
            u[next % u.len()].clone()
        };
        next += 1;
        let Some((mut c, mut m)) = try_join(&url, &format!("w{writer}-{next}"), &chat).await else {
            let _ = tokio::time::timeout(RETRY_AFTER_REFUSAL, stop.changed()).await;
            continue;
        };
        'connected: while !*stop.borrow() {
            let text = format!("w{writer}-{i}");
            i += 1;
            let sent = c
                .client
                .dispatch(
                    chat.clone(),
                    turn_started(&uuid::Uuid::new_v4().to_string(), &text),
                )
                .await;
            let Ok(ack) = sent else { break };
            let echo = loop {
                let Some(env) = next_action(&mut c).await else {
                    break 'connected;
                };
                m.apply(&env);
                let mine = env
                    .origin
                    .as_ref()
                    .is_some_and(|o| o.client_id == c.id && o.client_seq == ack.client_seq);
                if mine {
                    break env;
                }
            };
            let ok = echo.rejection_reason.is_none();
            let _ = report.send(Outcome {
                writer,
                accepted: ok,
            });
            if !ok {
                let _ = tokio::time::timeout(RETRY_AFTER_REFUSAL, stop.changed()).await;
                continue;
            }
            accepted.push(text);
            while m.state.active_turn.is_some() {
                let Some(env) = next_action(&mut c).await else {
                    break 'connected;
                };
                m.apply(&env);
            }
        }
    }
    accepted
}

/// A rolling restart: each of three nodes in turn is stopped (`SIGTERM`)
/// and started again while two writers start turns through whichever node
/// they reach. A stopping node hands its sessions to the others once their
/// turns have ended, so every echoed turn is kept once and in order, no
/// turn ends in an error, every node ends serving the same chats, and the
/// restarted nodes serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_nodes_loses_nothing_and_ends_no_turn() {
    let nats = NatsServer::start();
    let dir = temp_dir("rolling");
    let ids = ["a", "b", "c"];
    let mut nodes: Vec<ServerProcess> = ids.iter().map(|id| node(&dir, &nats, id)).collect();
    let urls = std::sync::Arc::new(parking_lot::Mutex::new(
        nodes.iter().map(ServerProcess::url).collect::<Vec<_>>(),
    ));
    // One session made on a, one on b.
    let (_, chat1) = nodes[0].client("setup-a").await.create_session().await;
    let (_, chat2) = nodes[1].client("setup-b").await.create_session().await;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (mut tally, report) = Tally::new(2);
    let writers: Vec<_> = [&chat1, &chat2]
        .into_iter()
        .enumerate()
        .map(|(k, chat)| {
            tokio::spawn(write_turns_anywhere(
                urls.clone(),
                chat.clone(),
                k,
                stopped.clone(),
                report.clone(),
            ))
        })
        .collect();
    drop(report);
    tally
        .until("both write", |a, _| a.iter().all(|&n| n >= 2))
        .await;
    for (k, id) in ids.iter().enumerate() {
        crate::common::nats::signal(nodes[k].pid(), "-TERM");
        let status = nodes[k]
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("node {id} stops after draining"));
        assert!(status.success(), "node {id} stopped cleanly: {status:?}");
        nodes[k] = ServerProcess::spawn_with(
            &dir.join(format!("{id}-again.log")),
            &[
                "--cluster",
                &nats.url(),
                "--node-id",
                id,
                "--lease-secs",
                "2",
            ],
        );
        urls.lock()[k] = nodes[k].url();
        let before = tally.accepted.clone();
        tally
            .until(&format!("both write after {id} restarted"), |a, _| {
                a.iter().zip(&before).all(|(now, then)| *now >= then + 2)
            })
            .await;
    }
    stop.send_replace(true);
    let mut accepted = Vec::new();
    for w in writers {
        accepted.push(w.await.expect("the writer ran"));
    }
    for (chat, accepted) in [&chat1, &chat2].into_iter().zip(&accepted) {
        eventually("no turn running", || async {
            fresh(&nodes[0], chat)
                .await
                .active_turn
                .is_none()
                .then_some(())
        })
        .await;
        let want = whole(&nodes[0], chat).await;
        let msgs = messages(&want);
        let kept: Vec<&String> = msgs.iter().filter(|m| accepted.contains(m)).collect();
        assert_eq!(
            kept,
            accepted.iter().collect::<Vec<_>>(),
            "every echoed turn kept, once, in order; chat holds {msgs:?}"
        );
        let failed: Vec<&str> = want
            .turns
            .iter()
            .filter(|t| t.state == ahp_types::state::TurnState::Error)
            .map(|t| t.message.text.as_str())
            .collect();
        assert!(failed.is_empty(), "turns ended by the restart: {failed:?}");
        for n in &nodes[1..] {
            assert_eq!(
                messages(&whole(n, chat).await),
                msgs,
                "every node serves the same chat"
            );
        }
    }
}

/// `chat` as `node` serves it now, its whole history paged in.
async fn whole(node: &ServerProcess, chat: &str) -> ChatState {
    let mut c = node
        .client(&format!("check-{}", uuid::Uuid::new_v4()))
        .await;
    let mut m = c.subscribe_chat(chat).await;
    crate::common::fetch_all_turns(&mut c, &mut m).await;
    m.state
}

/// NATS failover: two Tandem nodes on a three-server NATS cluster with the
/// stream and buckets at three replicas. One NATS server is SIGKILLed while
/// a writer starts turns: writes go on, and no echoed turn is lost; the
/// server, started again, catches up (every replica current).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_killed_mid_load_loses_nothing_acknowledged_and_catches_up() {
    let mut nats = crate::common::nats::nats_cluster();
    let urls: Vec<String> = nats.iter().map(|n| n.url()).collect();
    let urls = urls.join(",");
    let dir = temp_dir("nats-failover");
    let node_on = |id: &str| {
        ServerProcess::spawn_with(
            &dir.join(format!("{id}.log")),
            &[
                "--cluster",
                &urls,
                "--node-id",
                id,
                "--lease-secs",
                "2",
                "--nats-replicas",
                "3",
            ],
        )
    };
    let (a, b) = (node_on("a"), node_on("b"));
    let ca = a.client("ann").await;
    let (_, chat) = ca.create_session().await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (mut tally, report) = Tally::new(1);
    let w = tokio::spawn(write_turns(
        b.client("bob").await,
        chat.clone(),
        0,
        stopped,
        report,
    ));
    tally.until("bob writes", |a, _| a[0] >= 3).await;
    nats[0].stop();
    let before = tally.accepted[0];
    tally
        .until("bob writes on after a NATS server died", |a, _| {
            a[0] >= before + 5
        })
        .await;
    nats[0].restart();
    let before = tally.accepted[0];
    tally
        .until("bob writes on after it came back", |a, _| {
            a[0] >= before + 3
        })
        .await;
    stop.send_replace(true);
    let mut w = w.await.expect("bob");
    let want = settle(&mut w, &a, &chat).await;
    assert_all_kept(&want, &w);
    assert_eq!(
        fresh(&b, &chat).await,
        want,
        "both nodes serve the same chat"
    );

    // The restarted server holds every replica current again.
    let nc = async_nats::connect(nats[0].url()).await.expect("NATS");
    let js = async_nats::jetstream::new(nc);
    eventually("every replica of the journal is current", || async {
        let mut stream = js.get_stream("TANDEM_JOURNAL").await.ok()?;
        let info = stream.info().await.ok()?;
        let cluster = info.cluster.as_ref()?;
        let replicas = &cluster.replicas;
        (replicas.len() == 2
            && replicas
                .iter()
                .all(|r| r.current && r.lag.unwrap_or(0) == 0))
        .then_some(())
    })
    .await;
}
