//! People in a session: names bound to tokens, roles enforced on every
//! act (a refusal names the role it needs), and who settled each answer
//! and approval on the record — after a SIGKILL and restart too.

use crate::common;

use ahp::ClientError;
use ahp_types::actions::StateAction;
use ahp_types::state::{ChatState, ResponsePart};
use common::*;
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::people::Access;
use tandem::Config;

pub(crate) const SECRET: &[u8] = b"people-test-secret-0123456789abcdef!!";

pub(crate) fn token(sub: &str, name: &str, access: Option<(&str, Access)>) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role: Role::Client,
            exp: now_secs() + 600,
            name: Some(name.into()),
            access: access.map(|(s, a)| [(s.to_owned(), a)].into()),
            ..Default::default()
        })
        .expect("mint")
}

async fn person(server: &TestServer, id: &str, token: &str) -> TestClient {
    TestClient::connect(&format!("{}?token={token}", server.url()), id).await
}

/// The reason the server refused our dispatch `seq` (panics if accepted).
pub(crate) async fn refusal(c: &mut TestClient, m: &mut ChatMirror, seq: i64) -> String {
    let echo = c.wait_echo(Some(m), seq).await;
    echo.rejection_reason
        .unwrap_or_else(|| panic!("{} was accepted: {:?}", c.id, echo.action))
}

/// Our dispatch `seq` was accepted.
pub(crate) async fn accepted(c: &mut TestClient, m: &mut ChatMirror, seq: i64) {
    let echo = c.wait_echo(Some(m), seq).await;
    assert_eq!(echo.rejection_reason, None, "{}'s dispatch", c.id);
}

pub(crate) fn rpc_refusal(r: Result<Value, ClientError>) -> (i32, String) {
    match r {
        Err(ClientError::Rpc(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The `tandem/act` notifications of `state`'s turns: (text, act).
pub(crate) fn acts(state: &ChatState) -> Vec<(String, Value)> {
    state
        .turns
        .iter()
        .flat_map(|t| t.response_parts.iter())
        .chain(
            state
                .active_turn
                .iter()
                .flat_map(|t| t.response_parts.iter()),
        )
        .filter_map(|p| match p {
            ResponsePart::SystemNotification(n) => {
                let act = n.meta.as_ref()?.get("tandem/act")?.clone();
                let text = serde_json::to_value(&n.content).ok()?;
                Some((text.as_str().unwrap_or_default().to_owned(), act))
            }
            _ => None,
        })
        .collect()
}

/// A viewer's `chat/turnStarted` is refused naming the role it needs.
pub(crate) async fn viewer_cannot_start_a_turn(
    vic: &mut TestClient,
    m: &mut ChatMirror,
    chat: &str,
) {
    let seq = vic.dispatch(chat, turn_started("vic-turn", "hello")).await;
    let why = refusal(vic, m, seq).await;
    assert!(
        why.contains("participant role") && why.contains("Vic is a viewer"),
        "{why}"
    );
}

/// A viewer's `tandem/editText` is refused (-32009) naming the role.
async fn viewer_cannot_type(vic: &TestClient, chat: &str) {
    let edit =
        json!({"channel": chat, "target": {"draft": true}, "base": 0, "seq": 1, "op": ["hi"]});
    let (code, why) = rpc_refusal(vic.client.request("tandem/editText", edit).await);
    assert_eq!(code, -32009, "{why}");
    assert!(why.contains("participant role"), "{why}");
}

pub(crate) fn answer(rid: &str, state: &str, text: &str) -> StateAction {
    action(
        json!({"type": "chat/inputAnswerChanged", "requestId": rid, "questionId": "q",
        "answer": {"state": state, "value": {"kind": "text", "value": text}}}),
    )
}

pub(crate) fn completed(rid: &str) -> StateAction {
    action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept"}))
}

pub(crate) fn approve(turn: &str, call: &str) -> StateAction {
    action(
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": call, "approved": true}),
    )
}

/// The open tool call of the active turn.
pub(crate) fn open_call(state: &ChatState) -> Option<(String, String)> {
    let t = state.active_turn.as_ref()?;
    t.response_parts.iter().find_map(|p| match p {
        ResponsePart::ToolCall(c) => {
            let v = serde_json::to_value(&c.tool_call).ok()?;
            (v["status"] == "pending-confirmation").then(|| {
                (
                    t.id.clone(),
                    v["toolCallId"].as_str().unwrap_or_default().into(),
                )
            })
        }
        _ => None,
    })
}

pub(crate) const ASK: &str =
    r#"/ask {"questions":[{"kind":"text","id":"q","message":"Name?","required":true}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_does_what_it_may_and_is_refused_the_rest_by_name() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    })
    .await;
    let mut ann = person(&server, "ann-laptop", &token("ann", "Ann", None)).await;
    let (session, chat) = ann.create_session().await;
    let s = session.as_str();
    let mut vic = person(
        &server,
        "vic-phone",
        &token("vic", "Vic", Some((s, Access::Viewer))),
    )
    .await;
    let mut pat = person(&server, "pat-web", &token("pat", "Pat", None)).await;
    let mut abe = person(
        &server,
        "abe-ide",
        &token("abe", "Abe", Some((s, Access::Approver))),
    )
    .await;

    // Who each is, as the server says.
    for (c, level) in [
        (&ann, "owner"),
        (&vic, "viewer"),
        (&pat, "participant"),
        (&abe, "approver"),
    ] {
        let me: Value = c
            .client
            .request("tandem/access", json!({"channel": session}))
            .await
            .expect("tandem/access");
        assert_eq!(me["access"], level, "{me}");
    }
    // A name comes from the token: nobody renames themselves.
    let (code, _) = rpc_refusal(
        vic.client
            .request("tandem/setName", json!({"name": "Ann"}))
            .await,
    );
    assert_eq!(code, -32009);

    let mut ma = ann.subscribe_chat(&chat).await;
    let mut mv = vic.subscribe_chat(&chat).await;
    let mut mp = pat.subscribe_chat(&chat).await;
    let mut mb = abe.subscribe_chat(&chat).await;

    // A viewer starts no turn.
    viewer_cannot_start_a_turn(&mut vic, &mut mv, &chat).await;

    // Ann asks; a participant's message carries its author, not a forged one.
    ann.start_turn(&chat, ASK).await;
    ann.wait_for(Some(&mut ma), |e| {
        matches!(e.action, StateAction::ChatInputRequested(_))
    })
    .await;
    let rid = open_request_id(&ma.state).expect("an open request");
    pat.wait_state(&mut mp, |s| open_request_id(s).is_some())
        .await;
    vic.wait_state(&mut mv, |s| open_request_id(s).is_some())
        .await;

    // The viewer neither answers, types nor changes the mode.
    let seq = vic.dispatch(&chat, answer(&rid, "draft", "from vic")).await;
    let why = refusal(&mut vic, &mut mv, seq).await;
    assert!(
        why.contains("`chat/inputAnswerChanged` needs the participant role"),
        "{why}"
    );
    viewer_cannot_type(&vic, &chat).await;
    let mode = action(json!({"type": "session/configChanged", "config": {"approvalMode": "auto"}}));
    let r = vic
        .client
        .dispatch(session.clone(), mode.clone())
        .await
        .expect("dispatch");
    let echo = vic
        .wait_for(None, |e| {
            e.origin
                .as_ref()
                .is_some_and(|o| o.client_id == "vic-phone" && o.client_seq == r.client_seq)
        })
        .await;
    let why = echo
        .rejection_reason
        .expect("a viewer's mode change is refused");
    assert!(why.contains("approver role"), "{why}");
    let (code, _) = rpc_refusal(
        vic.client
            .request("disposeSession", json!({"channel": session}))
            .await,
    );
    assert_eq!(code, -32009);

    // The participant answers and settles the form.
    let seq = pat
        .dispatch(&chat, answer(&rid, "submitted", "Tandem"))
        .await;
    accepted(&mut pat, &mut mp, seq).await;
    let seq = pat.dispatch(&chat, completed(&rid)).await;
    accepted(&mut pat, &mut mp, seq).await;
    ann.wait_state(&mut ma, |s| s.active_turn.is_none()).await;

    // A tool call: the participant may not approve it, the approver does.
    ann.start_turn(&chat, "/tool deploy {\"env\":\"prod\"}")
        .await;
    pat.wait_state(&mut mp, |s| open_call(s).is_some()).await;
    let (turn, call) = open_call(&mp.state).expect("a call waits");
    let seq = pat.dispatch(&chat, approve(&turn, &call)).await;
    let why = refusal(&mut pat, &mut mp, seq).await;
    assert!(
        why.contains("needs the approver role") && why.contains("Pat is a participant"),
        "{why}"
    );
    abe.wait_state(&mut mb, |s| open_call(s).is_some()).await;
    let seq = abe.dispatch(&chat, approve(&turn, &call)).await;
    accepted(&mut abe, &mut mb, seq).await;
    ann.wait_state(&mut ma, |s| s.active_turn.is_none() && s.turns.len() == 2)
        .await;

    // The record names who did what, the same in a fresh snapshot.
    let fresh = ann.subscribe_chat(&chat).await.state;
    let record = acts(&fresh);
    let texts: Vec<&str> = record.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        texts,
        ["Pat submitted the answers", "Abe approved `deploy`"]
    );
    assert_eq!(record[0].1["by"]["name"], "Pat");
    assert_eq!(record[0].1["answeredBy"]["q"], "Pat");
    assert_eq!(record[1].1["by"]["subject"], "abe");
    assert_eq!(record[1].1["toolName"], "deploy");
    let author = fresh.turns[0].message.meta.as_ref().expect("meta")["tandem/author"].clone();
    assert_eq!(author["name"], "Ann");

    // The owner makes the viewer a participant: now Vic may type.
    let set: Value = ann
        .client
        .request(
            "tandem/setAccess",
            json!({"channel": session, "subject": "vic", "access": "participant"}),
        )
        .await
        .expect("setAccess");
    assert_eq!(set["members"]["vic"], "participant");
    let (code, _) = rpc_refusal(
        pat.client
            .request(
                "tandem/setAccess",
                json!({"channel": session, "subject": "pat", "access": "owner"}),
            )
            .await,
    );
    assert_eq!(code, -32009, "only an owner sets access");
    let seq = vic
        .dispatch(&chat, turn_started("vic-turn-2", "now I may"))
        .await;
    accepted(&mut vic, &mut mv, seq).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_settled_a_form_and_an_approval_survives_sigkill() {
    let dir = temp_dir("people-kill");
    let data = dir.join("data");
    let mut server = ServerProcess::spawn(&data, &[]);
    let mut c = server.client("ann-laptop").await;
    let named: Value = c
        .client
        .request("tandem/setName", json!({"name": "  Ann\u{7}  "}))
        .await
        .expect("setName");
    assert_eq!(named["name"], "Ann");
    let (_session, chat) = c.create_session().await;
    let mut m = c.subscribe_chat(&chat).await;
    c.start_turn(&chat, ASK).await;
    c.wait_state(&mut m, |s| open_request_id(s).is_some()).await;
    let rid = open_request_id(&m.state).expect("open");
    c.dispatch(&chat, answer(&rid, "submitted", "x")).await;
    c.dispatch(&chat, completed(&rid)).await;
    c.wait_state(&mut m, |s| s.active_turn.is_none()).await;
    c.start_turn(&chat, "/tool rollout {}").await;
    c.wait_state(&mut m, |s| open_call(s).is_some()).await;
    let (turn, call) = open_call(&m.state).expect("a call");
    let deny = action(
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": call,
        "approved": false, "reasonMessage": "not on a Friday"}),
    );
    c.dispatch(&chat, deny).await;
    c.wait_state(&mut m, |s| s.active_turn.is_none() && s.turns.len() == 2)
        .await;
    server.kill();

    let server = ServerProcess::spawn(&data, &[]);
    let after = server.client("after").await;
    let state = after.subscribe_chat(&chat).await.state;
    let record = acts(&state);
    let texts: Vec<&str> = record.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        texts,
        [
            "Ann submitted the answers",
            "Ann denied `rollout`: not on a Friday"
        ]
    );
    assert_eq!(record[1].1["by"]["clientId"], "ann-laptop");
    assert_eq!(record[1].1["approved"], false);
    assert!(record[1].1["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster node on `nats` that needs tokens signed with [`SECRET`].
fn secured_node(dir: &std::path::Path, nats: &common::nats::NatsServer, id: &str) -> ServerProcess {
    let secret = std::str::from_utf8(SECRET).expect("an ASCII secret");
    common::nats::node_with_env(dir, nats, id, &[("TANDEM_AUTH_SECRET", secret)])
}

/// Subscribe to `uri` on a node that may not have heard of it yet.
async fn join(c: &TestClient, uri: &str) {
    eventually("the node knows the channel", || async {
        let r: Result<Value, _> = c.client.request("subscribe", json!({"channel": uri})).await;
        r.ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_hold_when_another_node_forwards_to_the_owner() {
    let nats = common::nats::NatsServer::start();
    let dir = temp_dir("people-cluster");
    let (a, b, c) = (
        secured_node(&dir, &nats, "a"),
        secured_node(&dir, &nats, "b"),
        secured_node(&dir, &nats, "c"),
    );
    let at = |n: &ServerProcess, t: &str| format!("{}?token={t}", n.url());
    let mut ann = TestClient::connect(&at(&a, &token("ann", "Ann", None)), "ann-a").await;
    let (session, chat) = ann.create_session().await;
    let s = session.as_str();
    let mut vic = TestClient::connect(
        &at(&b, &token("vic", "Vic", Some((s, Access::Viewer)))),
        "vic-b",
    )
    .await;
    let mut pat = TestClient::connect(&at(&c, &token("pat", "Pat", None)), "pat-c").await;
    let mut abe = TestClient::connect(
        &at(&b, &token("abe", "Abe", Some((s, Access::Approver)))),
        "abe-b",
    )
    .await;
    for p in [&vic, &pat, &abe] {
        join(p, &session).await;
        join(p, &chat).await;
    }
    let mut ma = ann.subscribe_chat(&chat).await;
    let mut mv = vic.subscribe_chat(&chat).await;
    let mut mp = pat.subscribe_chat(&chat).await;
    let mut mb = abe.subscribe_chat(&chat).await;

    // The viewer on b: b forwards to a, which refuses by role.
    viewer_cannot_start_a_turn(&mut vic, &mut mv, &chat).await;

    ann.start_turn(&chat, ASK).await;
    ann.wait_state(&mut ma, |s| open_request_id(s).is_some())
        .await;
    let rid = open_request_id(&ma.state).expect("open");
    vic.wait_state(&mut mv, |s| open_request_id(s).is_some())
        .await;
    let seq = vic.dispatch(&chat, answer(&rid, "draft", "vic")).await;
    let why = refusal(&mut vic, &mut mv, seq).await;
    assert!(why.contains("participant role"), "{why}");
    viewer_cannot_type(&vic, &chat).await;

    // The participant on c answers; it may not approve.
    pat.wait_state(&mut mp, |s| open_request_id(s).is_some())
        .await;
    let seq = pat
        .dispatch(&chat, answer(&rid, "submitted", "Tandem"))
        .await;
    accepted(&mut pat, &mut mp, seq).await;
    let seq = pat.dispatch(&chat, completed(&rid)).await;
    accepted(&mut pat, &mut mp, seq).await;
    ann.wait_state(&mut ma, |s| s.active_turn.is_none()).await;
    ann.start_turn(&chat, "/tool deploy {}").await;
    pat.wait_state(&mut mp, |s| open_call(s).is_some()).await;
    let (turn, call) = open_call(&mp.state).expect("a call waits");
    let seq = pat.dispatch(&chat, approve(&turn, &call)).await;
    let why = refusal(&mut pat, &mut mp, seq).await;
    assert!(why.contains("approver role"), "{why}");

    // The approver on b approves; every node's record names Pat and Abe.
    abe.wait_state(&mut mb, |s| open_call(s).is_some()).await;
    let seq = abe.dispatch(&chat, approve(&turn, &call)).await;
    accepted(&mut abe, &mut mb, seq).await;
    let settled = |s: &ChatState| s.active_turn.is_none() && s.turns.len() == 2;
    for (p, m) in [
        (&mut ann, &mut ma),
        (&mut vic, &mut mv),
        (&mut pat, &mut mp),
    ] {
        p.wait_state(m, settled).await;
        let texts: Vec<String> = acts(&m.state).into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            texts,
            ["Pat submitted the answers", "Abe approved `deploy`"]
        );
    }
    drop((a, b, c));
    let _ = std::fs::remove_dir_all(&dir);
}

/// NATS is not a node: a dispatch forged on it as a forwarded request (no
/// person behind it, so the host's, and as the agent) is refused by the
/// owner, which does nothing and answers nothing; the same change made by
/// a person through another node is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_forged_on_nats_is_refused_by_the_owner() {
    use futures_util::{FutureExt, StreamExt};
    let nats = common::nats::NatsServer::start();
    let dir = temp_dir("people-forged");
    let (a, b) = (
        secured_node(&dir, &nats, "a"),
        secured_node(&dir, &nats, "b"),
    );
    let at = |n: &ServerProcess, t: &str| format!("{}?token={t}", n.url());
    let ann = TestClient::connect(&at(&a, &token("ann", "Ann", None)), "ann-a").await;
    let (session, _) = ann.create_session().await;

    let nc = async_nats::connect(nats.url()).await.expect("NATS");
    let forged = json!({
        "op": "dispatch",
        "channel": session,
        "origin": {"clientId": "mallory", "clientSeq": 1},
        "action": {"type": "session/titleChanged", "title": "forged"},
        "asAgent": true,
    });
    let inbox = nc.new_inbox();
    let mut answers = nc.subscribe(inbox.clone()).await.expect("inbox");
    nc.publish_with_reply(
        "tandem.node.a",
        inbox,
        serde_json::to_vec(&forged).expect("JSON").into(),
    )
    .await
    .expect("published");
    nc.flush().await.expect("flushed");
    let log = dir.join("a.log");
    eventually("a refuses the forged request", || async {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("a forwarded request was refused")
            .then_some(())
    })
    .await;

    // Bob on b changes the title: b seals its forward, a does it.
    let mut bob = TestClient::connect(&at(&b, &token("bob", "Bob", None)), "bob-b").await;
    join(&bob, &session).await;
    let seq = bob
        .dispatch(
            &session,
            action(json!({"type": "session/titleChanged", "title": "by Bob"})),
        )
        .await;
    assert_eq!(bob.wait_echo(None, seq).await.rejection_reason, None);
    let title = ann.subscribe_session(&session).await.title;
    assert_eq!(title, "by Bob", "the forged title was never set");
    assert!(
        answers.next().now_or_never().flatten().is_none(),
        "the forger got no answer"
    );
}
