//! An ACP agent behind Tandem, end to end: the test agent
//! (`examples/acp_test_agent.rs`) declared as a provider, driven by two
//! official AHP clients. Its log (`ACP_TEST_AGENT_LOG`) says what the agent
//! itself received, so "exactly one answer" is checked on the agent's side.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tandem::config::AgentSpec;
use tandem::Config;

use crate::common::{
    self, action, agent_bin, last_turn_markdown, temp_dir, ChatMirror, TestClient, TestServer,
};

const AGENT: &str = "testagent";

fn spec(log: &Path, args: &[&str]) -> AgentSpec {
    let mut s = AgentSpec::new(
        AGENT,
        agent_bin().to_string_lossy(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    s.env
        .insert("ACP_TEST_AGENT_LOG".into(), log.to_string_lossy().into());
    s.idle_timeout_secs = 3;
    s.start_timeout_secs = 20;
    s
}

fn config(agents: Vec<AgentSpec>, data_dir: Option<PathBuf>) -> Config {
    Config {
        agents,
        data_dir,
        ..Config::default()
    }
}

/// The agent's log lines of `event`.
fn logged(log: &Path, event: &str) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

async fn create(c: &TestClient) -> Result<(String, String), String> {
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    c.client
        .request::<_, Value>(
            "createSession",
            json!({"channel": session, "provider": AGENT}),
        )
        .await
        .map_err(|e| e.to_string())?;
    let state = c.subscribe_session(&session).await;
    Ok((session, state.default_chat.expect("default chat")))
}

/// Wait until `m` has `n` finished turns; the last one as JSON.
async fn finished(c: &mut TestClient, m: &mut ChatMirror, n: usize) -> Value {
    c.wait_state(m, |s| s.active_turn.is_none() && s.turns.len() >= n)
        .await;
    serde_json::to_value(m.state.turns.last().expect("a turn")).expect("json")
}

/// Wait for the active turn's tool call pending confirmation: its id and
/// offered option ids.
async fn pending_tool(c: &mut TestClient, m: &mut ChatMirror) -> (String, Vec<String>) {
    let mut found = None;
    c.wait_state(m, |s| {
        let v = serde_json::to_value(s.active_turn.as_ref()).unwrap_or_default();
        found = v["responseParts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| &p["toolCall"])
            .find(|t| t["status"] == "pending-confirmation")
            .map(|t| {
                let opts = t["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o["id"].as_str().map(str::to_owned))
                    .collect();
                (t["toolCallId"].as_str().unwrap_or("").to_owned(), opts)
            });
        found.is_some()
    })
    .await;
    found.expect("a pending tool call")
}

fn confirm(
    turn: &str,
    call: &str,
    option: &str,
    approved: bool,
) -> ahp_types::actions::StateAction {
    action(
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": call,
        "approved": approved, "selectedOptionId": option}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_drive_one_acp_agent_stream_approve_cancel_and_survive_its_crash() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let server = TestServer::start_with(config(vec![spec(&log, &[])], None)).await;
    let mut a = server.client("alice").await;
    let mut b = server.client("bob").await;

    // Root lists the agent.
    let root = a.subscribe_raw("ahp-root://").await;
    let root = serde_json::to_value(root.snapshot.expect("root")).expect("json");
    assert!(
        root.to_string().contains("\"provider\":\"testagent\""),
        "{root}"
    );

    let (_session, chat) = create(&a).await.expect("createSession");
    assert_eq!(
        logged(&log, "session/new").len(),
        1,
        "createSession opened an ACP session"
    );
    let mut ma = a.subscribe_chat(&chat).await;
    let mut mb = b.subscribe_chat(&chat).await;

    // Streaming: both see the thought and the chunks in one markdown part.
    a.start_turn(&chat, "/stream 3 5").await;
    let t = finished(&mut b, &mut mb, 1).await;
    assert_eq!(
        last_turn_markdown(&mb.state),
        ["chunk 1 chunk 2 chunk 3 "],
        "{t}"
    );
    assert!(
        t.to_string().contains("planning 3 chunks"),
        "the thought is a reasoning part: {t}"
    );
    finished(&mut a, &mut ma, 1).await;
    assert_eq!(ma.state, mb.state);

    // A permission request: every client sees the agent's own options; the
    // first answer settles it, the second is refused, the agent gets one.
    let turn = a.start_turn(&chat, "/tool x").await;
    let (call, options) = pending_tool(&mut b, &mut mb).await;
    assert_eq!(
        options,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );
    let (call_a, _) = pending_tool(&mut a, &mut ma).await;
    assert_eq!(call, call_a);
    let seq = b
        .dispatch(&chat, confirm(&turn, &call, "allow-always", true))
        .await;
    let echo = b.wait_echo(Some(&mut mb), seq).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    let late = a
        .dispatch(&chat, confirm(&turn, &call, "reject-once", false))
        .await;
    let echo = a.wait_echo(Some(&mut ma), late).await;
    assert!(
        echo.rejection_reason.is_some(),
        "a second answer is refused"
    );
    finished(&mut a, &mut ma, 2).await;
    assert!(last_turn_markdown(&ma.state).contains(&"tool x: allow-always".to_owned()));
    let answers = logged(&log, "permission");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["optionId"], "allow-always");

    // "Always allow" is a session grant: the host answers the next request
    // for the tool without asking anyone.
    a.start_turn(&chat, "/tool x").await;
    finished(&mut a, &mut ma, 3).await;
    assert!(last_turn_markdown(&ma.state).contains(&"tool x: allow-once".to_owned()));
    assert_eq!(logged(&log, "permission").len(), 2);

    // Cancel mid-prompt reaches the agent.
    let turn = a.start_turn(&chat, "/slow").await;
    a.wait_state(&mut ma, |s| {
        serde_json::to_string(&s.active_turn)
            .unwrap_or_default()
            .contains("tick 2")
    })
    .await;
    a.dispatch(
        &chat,
        action(json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 1})),
    )
    .await;
    finished(&mut a, &mut ma, 4).await;
    common::eventually("the agent saw the cancel", || async {
        (!logged(&log, "cancel").is_empty()).then_some(())
    })
    .await;

    // The agent process dies mid-turn: chat/error naming the cause, on
    // every client.
    a.start_turn(&chat, "/crash 3").await;
    let t = finished(&mut b, &mut mb, 5).await;
    let text = t.to_string();
    assert!(text.contains("AgentExited"), "{text}");
    assert!(text.contains("exit status: 3"), "{text}");
    assert!(text.contains("crashing on purpose"), "{text}");
    finished(&mut a, &mut ma, 5).await;

    // The next turn starts the agent again.
    a.start_turn(&chat, "/stream 1").await;
    finished(&mut a, &mut ma, 6).await;
    assert_eq!(last_turn_markdown(&ma.state), ["chunk 1 "]);
    assert_eq!(logged(&log, "start").len(), 2, "a second process");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_hold_a_session_fails_create_session_clearly() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let mut missing = spec(&log, &[]);
    missing.name = "missing".into();
    missing.command = dir.join("no-such-agent").to_string_lossy().into();
    let server =
        TestServer::start_with(config(vec![spec(&log, &["--minimal"]), missing], None)).await;
    let c = server.client("carol").await;
    let e = create(&c)
        .await
        .expect_err("a minimal agent cannot hold a session");
    assert!(e.contains("session/new"), "{e}");
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let e = c
        .client
        .request::<_, Value>(
            "createSession",
            json!({"channel": session, "provider": "missing"}),
        )
        .await
        .expect_err("no such program");
    assert!(e.to_string().contains("cannot run"), "{e}");
    // Neither session exists.
    let sessions: Value = c
        .client
        .request("listSessions", json!({"channel": "ahp-root://"}))
        .await
        .expect("list");
    assert_eq!(
        sessions["items"].as_array().map(Vec::len),
        Some(0),
        "{sessions}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_ends_the_turn_with_an_error_and_the_next_turn_works() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let server = TestServer::start_with(config(vec![spec(&log, &[])], None)).await;
    let mut a = server.client("dave").await;
    let (session, chat) = create(&a).await.expect("createSession");
    let mut m = a.subscribe_chat(&chat).await;
    a.start_turn(&chat, "/hang").await;
    let t = tokio::time::timeout(Duration::from_secs(30), finished(&mut a, &mut m, 1))
        .await
        .expect("the hang is detected");
    assert!(t.to_string().contains("did not answer for 3 s"), "{t}");
    a.start_turn(&chat, "hello").await;
    finished(&mut a, &mut m, 2).await;
    assert_eq!(last_turn_markdown(&m.state).concat(), "echo: hello");

    // What has no AHP shape is kept whole in the session's `_meta`; a plan
    // and a non-text block are visible parts.
    a.start_turn(&chat, "/extra").await;
    finished(&mut a, &mut m, 3).await;
    a.start_turn(&chat, "/plan").await;
    let t = finished(&mut a, &mut m, 4).await.to_string();
    assert!(t.contains("**Plan**"), "{t}");
    // A form question: asked like any other, the settled content goes back.
    a.start_turn(&chat, "/form").await;
    let mut rid = None;
    a.wait_state(&mut m, |s| {
        rid = common::open_request_id(s);
        rid.is_some()
    })
    .await;
    let sub = |v: Value| json!({"state": "submitted", "value": v});
    let done = a
        .dispatch(&chat, action(json!({"type": "chat/inputCompleted", "requestId": rid, "response": "accept", "answers": {
            "name": sub(json!({"kind": "text", "value": "spring"})),
            "count": sub(json!({"kind": "number", "value": 3}))
        }})))
        .await;
    let echo = a.wait_echo(Some(&mut m), done).await;
    assert!(
        echo.rejection_reason.is_none(),
        "{:?}",
        echo.rejection_reason
    );
    finished(&mut a, &mut m, 5).await;
    let said = last_turn_markdown(&m.state).concat();
    assert!(
        said.contains(r#""action":"accept""#) && said.contains(r#""name":"spring""#),
        "{said}"
    );
    let got = logged(&log, "elicitation");
    assert_eq!(got.len(), 1, "one answer: {got:?}");
    assert_eq!(got[0]["response"]["content"]["count"], 3);

    let fresh = server.client("erin-2").await;
    common::eventually(
        "the agent's commands and mode in the session's _meta",
        || {
            let fresh = &fresh;
            let session = session.clone();
            let chat = chat.clone();
            async move {
                let state = serde_json::to_value(fresh.subscribe_session(&session).await).ok()?;
                let notes = &state["_meta"]["tandem/agent"][&chat];
                (notes["available_commands_update"]["availableCommands"].is_array()
                    && notes["current_mode_update"]["currentModeId"] == "code")
                    .then_some(())
            }
        },
    )
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_and_always_reject_outlive_a_restart_and_a_killed_agent_aborts_its_request() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let cfg = || config(vec![spec(&log, &[])], Some(dir.join("data")));
    let server = TestServer::start_with(cfg()).await;
    let mut a = server.client("erin").await;
    let (_s, chat) = create(&a).await.expect("createSession");
    let mut m = a.subscribe_chat(&chat).await;

    let turn = a.start_turn(&chat, "/tool keep").await;
    let (call, _) = pending_tool(&mut a, &mut m).await;
    a.dispatch(&chat, confirm(&turn, &call, "allow-always", true))
        .await;
    finished(&mut a, &mut m, 1).await;
    let turn = a.start_turn(&chat, "/tool drop").await;
    let (call, _) = pending_tool(&mut a, &mut m).await;
    a.dispatch(&chat, confirm(&turn, &call, "reject-always", false))
        .await;
    finished(&mut a, &mut m, 2).await;
    assert!(last_turn_markdown(&m.state).contains(&"tool drop: reject-always".to_owned()));
    assert_eq!(logged(&log, "permission").len(), 2);
    drop(a);
    server.stop().await;

    // After a restart the host answers both tools from the session's grants.
    let server = TestServer::start_with(cfg()).await;
    let mut a = server.client("erin").await;
    let mut m = a.subscribe_chat(&chat).await;
    let before = m.state.turns.len();
    a.start_turn(&chat, "/tool keep").await;
    finished(&mut a, &mut m, before + 1).await;
    assert!(last_turn_markdown(&m.state).contains(&"tool keep: allow-once".to_owned()));
    a.start_turn(&chat, "/tool drop").await;
    finished(&mut a, &mut m, before + 2).await;
    assert!(last_turn_markdown(&m.state).contains(&"tool drop: reject-once".to_owned()));
    let answers = logged(&log, "permission");
    assert_eq!(answers.len(), 4, "one answer per request: {answers:?}");

    // Killed while a person is being asked: chat/error, and the request is
    // no longer pending anywhere.
    a.start_turn(&chat, "/tool other").await;
    pending_tool(&mut a, &mut m).await;
    let pid = logged(&log, "start")
        .last()
        .and_then(|s| s["pid"].as_i64())
        .expect("pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let t = finished(&mut a, &mut m, before + 3).await.to_string();
    assert!(t.contains("AgentExited") && t.contains("signal: 9"), "{t}");
    assert!(!t.contains("pending-confirmation"), "{t}");
    let fresh = common::fresh_chat(&server, &chat).await;
    assert_eq!(fresh, m.state, "every client sees the same state");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_reattached_to_its_acp_session_after_a_restart_where_the_agent_can_load_it() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let cfg = || {
        config(
            vec![spec(&log, &["--load-session"])],
            Some(dir.join("data")),
        )
    };
    let server = TestServer::start_with(cfg()).await;
    let mut a = server.client("fay").await;
    let (session, chat) = create(&a).await.expect("createSession");
    let mut m = a.subscribe_chat(&chat).await;
    a.start_turn(&chat, "first words").await;
    finished(&mut a, &mut m, 1).await;
    let acp = logged(&log, "prompt")[0]["sessionId"].clone();
    // The chat's ACP session is noted in the session's `_meta`.
    let state = serde_json::to_value(a.subscribe_session(&session).await).expect("json");
    assert_eq!(
        state["_meta"]["tandem/agent"][&chat]["acpSession"]["id"],
        acp
    );
    drop(a);
    server.stop().await;

    // After a restart the next turn loads that ACP session again; the
    // agent's replay of its history is not shown twice.
    let server = TestServer::start_with(cfg()).await;
    let mut a = server.client("fay").await;
    let mut m = a.subscribe_chat(&chat).await;
    a.start_turn(&chat, "second words").await;
    finished(&mut a, &mut m, 2).await;
    let loads = logged(&log, "session/load");
    assert_eq!(loads.len(), 1, "{loads:?}");
    assert_eq!(loads[0]["sessionId"], acp);
    assert_eq!(logged(&log, "session/new").len(), 1, "no new ACP session");
    let prompts = logged(&log, "prompt");
    assert_eq!(prompts[1]["sessionId"], acp);
    let all = serde_json::to_string(&m.state).expect("json");
    assert!(!all.contains("replayed history"), "{all}");
    assert!(last_turn_markdown(&m.state)
        .join("")
        .contains("second words"));

    // The agent killed between turns: the next turn starts it again and
    // loads the same session.
    let pid = logged(&log, "start")
        .last()
        .and_then(|s| s["pid"].as_i64())
        .expect("pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Gone from /proc once the bridge's exit watcher has reaped it.
    let proc_dir = format!("/proc/{pid}");
    common::eventually("the killed agent is reaped", || async {
        (!std::path::Path::new(&proc_dir).exists()).then_some(())
    })
    .await;
    a.start_turn(&chat, "third words").await;
    finished(&mut a, &mut m, 3).await;
    assert_eq!(logged(&log, "session/load").len(), 2);
    assert_eq!(logged(&log, "prompt")[2]["sessionId"], acp);
    assert!(last_turn_markdown(&m.state)
        .join("")
        .contains("third words"));
    let fresh = common::fresh_chat(&server, &chat).await;
    assert_eq!(fresh, m.state, "every client sees the same state");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reaches_only_the_files_the_operator_granted_it() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let granted = dir.join("granted");
    std::fs::create_dir_all(&granted).expect("mkdir");
    std::fs::write(granted.join("notes.txt"), "shared notes").expect("write");
    std::fs::write(dir.join("private.txt"), "private").expect("write");
    let mut reader = spec(&log, &[]);
    reader.files = Some(granted.clone());
    let mut writer = spec(&log, &[]);
    writer.name = "writer".into();
    writer.files = Some(granted.clone());
    writer.files_write = true;
    let mut none = spec(&log, &[]);
    none.name = "nofiles".into();
    let server = TestServer::start_with(config(vec![reader, writer, none], None)).await;
    let mut a = server.client("gus").await;

    // What each agent was offered in `initialize`.
    let mut said = Vec::new();
    for (provider, prompts) in [
        (
            AGENT,
            vec![
                format!("/read {}", granted.join("notes.txt").display()),
                format!("/read {}", dir.join("private.txt").display()),
                format!("/read {}/../private.txt", granted.display()),
                format!("/write {} hello", granted.join("new.txt").display()),
            ],
        ),
        (
            "writer",
            vec![
                format!("/write {} hello there", granted.join("new.txt").display()),
                format!("/write {} no", dir.join("escape.txt").display()),
            ],
        ),
        (
            "nofiles",
            vec![format!("/read {}", granted.join("notes.txt").display())],
        ),
    ] {
        let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
        a.client
            .request::<_, Value>(
                "createSession",
                json!({"channel": session, "provider": provider}),
            )
            .await
            .expect("createSession");
        let chat = a
            .subscribe_session(&session)
            .await
            .default_chat
            .expect("chat");
        let mut m = a.subscribe_chat(&chat).await;
        for (i, p) in prompts.iter().enumerate() {
            a.start_turn(&chat, p).await;
            finished(&mut a, &mut m, i + 1).await;
            said.push(last_turn_markdown(&m.state).join(""));
        }
    }
    let fs: Vec<Value> = logged(&log, "initialize")
        .iter()
        .map(|i| i["clientCapabilities"]["fs"].clone())
        .collect();
    assert_eq!(fs[0]["readTextFile"], true, "{fs:?}");
    assert_eq!(fs[0]["writeTextFile"], false, "{fs:?}");
    assert_eq!(fs[1]["writeTextFile"], true, "{fs:?}");
    assert_eq!(fs[2]["readTextFile"], false, "{fs:?}");
    assert!(
        logged(&log, "initialize")
            .iter()
            .all(|i| i["clientCapabilities"]["terminal"] != true),
        "no terminals"
    );

    assert!(said[0].contains("shared notes"), "{}", said[0]);
    assert!(
        said[1].contains("failed") && said[1].contains("outside"),
        "{}",
        said[1]
    );
    assert!(
        said[2].contains("failed") && said[2].contains("outside"),
        "{}",
        said[2]
    );
    assert!(
        said[3].contains("failed") && said[3].contains("not granted"),
        "{}",
        said[3]
    );
    assert!(said[4].contains("wrote"), "{}", said[4]);
    assert_eq!(
        std::fs::read_to_string(granted.join("new.txt")).expect("written"),
        "hello there"
    );
    assert!(
        said[5].contains("failed") && said[5].contains("outside"),
        "{}",
        said[5]
    );
    assert!(!dir.join("escape.txt").exists());
    assert!(
        said[6].contains("failed") && said[6].contains("not granted"),
        "{}",
        said[6]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_modes_and_models_are_session_config_applied_before_the_next_prompt() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let server = TestServer::start_with(config(vec![spec(&log, &[])], None)).await;
    let mut a = server.client("hal").await;
    let (session, chat) = create(&a).await.expect("createSession");
    let state = serde_json::to_value(a.subscribe_session(&session).await).expect("json");
    for key in ["agentMode", "agentModel"] {
        assert_eq!(
            state["config"]["schema"]["properties"][key]["enumDynamic"], true,
            "{key}: {state}"
        );
    }

    // The agent's offer, as the protocol lists dynamic values.
    let completions = |property: &'static str, query: Option<&'static str>| {
        let c = &a.client;
        let session = session.clone();
        async move {
            let r: Value = c
                .request(
                    "sessionConfigCompletions",
                    json!({"channel": session, "property": property, "query": query}),
                )
                .await
                .expect("sessionConfigCompletions");
            r["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|i| i["value"].as_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(completions("agentMode", None).await, ["ask", "code"]);
    assert_eq!(completions("agentModel", None).await, ["fast", "deep"]);
    assert_eq!(completions("agentModel", Some("DE")).await, ["deep"]);

    // Only what the agent offers is accepted.
    let bad = a
        .dispatch(
            &session,
            action(json!({"type": "session/configChanged", "config": {"agentMode": "yolo"}})),
        )
        .await;
    let r = a.wait_echo(None, bad).await.rejection_reason;
    assert!(
        r.as_deref().is_some_and(|r| r.contains("ask, code")),
        "{r:?}"
    );
    let set = a
        .dispatch(
            &session,
            action(json!({"type": "session/configChanged",
                "config": {"agentMode": "code", "agentModel": "deep"}})),
        )
        .await;
    assert!(a.wait_echo(None, set).await.rejection_reason.is_none());
    assert!(
        logged(&log, "set_mode").is_empty(),
        "applied at the next turn"
    );

    // The next prompt finds the agent switched, once.
    let mut m = a.subscribe_chat(&chat).await;
    a.start_turn(&chat, "hello").await;
    finished(&mut a, &mut m, 1).await;
    let modes = logged(&log, "set_mode");
    assert_eq!(modes.len(), 1, "{modes:?}");
    assert_eq!(modes[0]["modeId"], "code");
    let options = logged(&log, "set_config_option");
    assert_eq!(options.len(), 1, "{options:?}");
    assert_eq!(
        (&options[0]["configId"], &options[0]["value"]),
        (&json!("model"), &json!("deep"))
    );
    a.start_turn(&chat, "again").await;
    finished(&mut a, &mut m, 2).await;
    // What it said before the first prompt (its commands) is kept too.
    let noted = serde_json::to_value(a.subscribe_session(&session).await).expect("json");
    assert_eq!(
        noted["_meta"]["tandem/agent"][&chat]["available_commands_update"]["availableCommands"][0]
            ["name"],
        "stream",
        "{noted}"
    );
    assert_eq!(logged(&log, "set_mode").len(), 1, "not set again");
    assert_eq!(logged(&log, "set_config_option").len(), 1, "not set again");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_and_queued_messages_reach_the_agent_as_the_next_prompts_in_order() {
    let dir = temp_dir("acp");
    let log = dir.join("agent.log");
    let server = TestServer::start_with(config(vec![spec(&log, &[])], None)).await;
    let mut a = server.client("ida").await;
    let (_s, chat) = create(&a).await.expect("createSession");
    let mut m = a.subscribe_chat(&chat).await;
    a.start_turn(&chat, "/stream 10 100").await;
    a.wait_state(&mut m, |s| {
        last_turn_markdown(s).is_empty()
            && serde_json::to_string(&s.active_turn)
                .unwrap_or_default()
                .contains("chunk 2")
    })
    .await;
    // ACP cannot inject a message into a running prompt: the steering
    // message waits for the prompt to end and goes first, then the queue.
    let pending = |kind: &str, id: &str| {
        action(
            json!({"type": "chat/pendingMessageSet", "kind": kind, "id": id,
            "message": {"text": format!("{kind} {id}"), "origin": {"kind": "user"}}}),
        )
    };
    a.dispatch(&chat, pending("queued", "q1")).await;
    a.dispatch(&chat, pending("steering", "s1")).await;
    a.dispatch(&chat, pending("queued", "q2")).await;
    finished(&mut a, &mut m, 4).await;
    let texts: Vec<String> = logged(&log, "prompt")
        .iter()
        .map(|p| p["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        texts,
        ["/stream 10 100", "steering s1", "queued q1", "queued q2"]
    );
    assert!(m.state.steering_message.is_none());
    assert!(m.state.queued_messages.is_none());
    assert!(last_turn_markdown(&m.state).join("").contains("queued q2"));
    server.stop().await;
}
