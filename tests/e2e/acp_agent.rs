//! The scripted ACP test agent (`examples/acp_test_agent.rs`) on the wire:
//! raw newline-delimited JSON-RPC over its stdio, no SDK, so these tests pin
//! the bytes Tandem's bridge will see.

use crate::common;

use std::path::PathBuf;
use std::process::ExitStatus;

use common::{agent_bin, temp_dir, WAIT};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::time::timeout;

/// One agent process and the client end of its JSON-RPC stream.
struct RawAgent {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
    next_id: i64,
    log: PathBuf,
    /// The directory given as `cwd` to `session/new`.
    dir: common::Scratch,
}

impl RawAgent {
    fn spawn(args: &[&str]) -> Self {
        let dir = temp_dir("acp-agent");
        let log = dir.join("agent.log");
        let bin = agent_bin();
        let mut child = Command::new(&bin)
            .args(args)
            .env("ACP_TEST_AGENT_LOG", &log)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let stderr = child.stderr.take();
        Self {
            child,
            stdin: Some(stdin),
            stdout,
            stderr,
            next_id: 0,
            log,
            dir,
        }
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin still open");
        timeout(WAIT, stdin.write_all(line.as_bytes()))
            .await
            .expect("timed out writing to the agent")
            .expect("write to the agent");
    }

    async fn request(&mut self, method: &str, params: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    async fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    async fn recv(&mut self) -> Value {
        let line = timeout(WAIT, self.stdout.next_line())
            .await
            .expect("timed out reading from the agent")
            .expect("read from the agent")
            .expect("the agent closed its stdout");
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not JSON from the agent ({e}): {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        message
    }

    /// Reads until the response to our request `id` (a message without
    /// `method`: the agent numbers its own requests in a space of its own);
    /// returns what came before it and the response.
    async fn until_response(&mut self, id: i64) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let message = self.recv().await;
            if message.get("method").is_none() && message["id"] == id {
                return (before, message);
            }
            before.push(message);
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.request(method, params).await;
        self.until_response(id).await
    }

    /// `initialize` and `session/new`; returns the session id.
    async fn start_session(&mut self, client_capabilities: Value) -> String {
        let (_, init) = self
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": client_capabilities}),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
        let cwd = self.dir.to_str().expect("utf-8 temp dir").to_owned();
        let (_, new) = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        let session_id = new["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId: {new}"))
            .to_owned();
        // Right after the answer it lists its commands, as real agents do.
        let commands = self.recv().await;
        assert_eq!(commands["method"], "session/update", "{commands}");
        assert_eq!(commands["params"]["sessionId"], session_id.as_str());
        assert_eq!(
            commands["params"]["update"]["sessionUpdate"], "available_commands_update",
            "{commands}"
        );
        session_id
    }

    async fn prompt(&mut self, session_id: &str, text: &str) -> i64 {
        self.request(
            "session/prompt",
            json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Closes stdin and waits for the process to exit.
    async fn wait_exit(&mut self) -> ExitStatus {
        self.stdin = None;
        timeout(WAIT, self.child.wait())
            .await
            .expect("timed out waiting for the agent to exit")
            .expect("wait for the agent")
    }

    async fn stderr(&mut self) -> String {
        let mut text = String::new();
        let mut stderr = self.stderr.take().expect("stderr read once");
        timeout(WAIT, stderr.read_to_string(&mut text))
            .await
            .expect("timed out reading stderr")
            .expect("read stderr");
        text
    }

    fn events(&self, event: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).expect("read the agent log");
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("a JSON log line"))
            .filter(|line| line["event"] == event)
            .collect()
    }
}

/// The `update` of each `session/update` notification, in order.
fn updates(messages: &[Value], session_id: &str) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            assert_eq!(m["method"], "session/update", "{m}");
            assert_eq!(m["params"]["sessionId"], session_id, "{m}");
            m["params"]["update"].clone()
        })
        .collect()
}

fn chunk(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

#[tokio::test]
async fn stream_answers_after_its_updates_and_exits_on_eof() {
    let mut agent = RawAgent::spawn(&[]);
    let session_id = agent.start_session(json!({})).await;
    let id = agent.prompt(&session_id, "/stream 3").await;
    let (before, response) = agent.until_response(id).await;

    assert_eq!(
        updates(&before, &session_id),
        vec![
            chunk("agent_thought_chunk", "planning 3 chunks"),
            chunk("agent_message_chunk", "chunk 1 "),
            chunk("agent_message_chunk", "chunk 2 "),
            chunk("agent_message_chunk", "chunk 3 "),
        ]
    );
    assert_eq!(response["result"], json!({"stopReason": "end_turn"}));

    let status = agent.wait_exit().await;
    assert!(status.success(), "{status}");
    assert_eq!(agent.events("start").len(), 1);
    let init = &agent.events("initialize")[0];
    assert_eq!(init["protocolVersion"], 1);
    let new = &agent.events("session/new")[0];
    assert_eq!(new["sessionId"], session_id.as_str());
    assert_eq!(new["cwd"], agent.dir.to_str().expect("utf-8 temp dir"));
    assert_eq!(agent.events("prompt")[0]["text"], "/stream 3");
    let stop = agent.events("stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0]["stopReason"], "end_turn");
}

#[tokio::test]
async fn tool_asks_permission_then_completes() {
    let mut agent = RawAgent::spawn(&[]);
    let session_id = agent.start_session(json!({})).await;
    let prompt_id = agent.prompt(&session_id, "/tool x").await;

    // No `status`: the SDK leaves out the default, and ACP's default status
    // is `pending`. The bridge must read a missing status as `pending`.
    let tool_call = agent.recv().await;
    assert_eq!(
        tool_call["params"]["update"],
        json!({
            "sessionUpdate": "tool_call",
            "toolCallId": "tc-1",
            "title": "Run x",
            "kind": "edit",
            "rawInput": {"tool": "x"},
            "locations": [{"path": "/tmp/x.txt"}],
            "content": [{"type": "diff", "path": "/tmp/x.txt", "oldText": "old", "newText": "new x"}],
        })
    );
    let ask = agent.recv().await;
    assert_eq!(ask["method"], "session/request_permission", "{ask}");
    assert_eq!(ask["params"]["sessionId"], session_id.as_str());
    assert_eq!(ask["params"]["toolCall"]["toolCallId"], "tc-1");
    let options: Vec<(String, String)> = ask["params"]["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|o| {
            (
                o["optionId"].as_str().expect("optionId").to_owned(),
                o["kind"].as_str().expect("kind").to_owned(),
            )
        })
        .collect();
    let expected = [
        ("allow-once", "allow_once"),
        ("allow-always", "allow_always"),
        ("reject-once", "reject_once"),
        ("reject-always", "reject_always"),
    ];
    assert_eq!(
        options,
        expected.map(|(id, kind)| (id.to_owned(), kind.to_owned()))
    );

    agent
        .send(json!({
            "jsonrpc": "2.0",
            "id": ask["id"],
            "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}},
        }))
        .await;
    let (before, response) = agent.until_response(prompt_id).await;
    assert_eq!(
        updates(&before, &session_id),
        vec![
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "tc-1", "status": "in_progress"}),
            json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": "tc-1",
                "status": "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": "x done"}}],
                "rawOutput": {"ok": true},
            }),
            chunk("agent_message_chunk", "tool x: allow-once"),
        ]
    );
    assert_eq!(response["result"], json!({"stopReason": "end_turn"}));

    let answers = agent.events("permission");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["outcome"], "selected");
    assert_eq!(answers[0]["optionId"], "allow-once");
    assert_eq!(answers[0]["toolCallId"], "tc-1");
}

#[tokio::test]
async fn cancel_stops_a_slow_turn() {
    let mut agent = RawAgent::spawn(&[]);
    let session_id = agent.start_session(json!({})).await;
    let prompt_id = agent.prompt(&session_id, "/slow").await;

    let first = agent.recv().await;
    assert_eq!(
        first["params"]["update"],
        chunk("agent_message_chunk", "tick 1 ")
    );
    agent
        .notify("session/cancel", json!({"sessionId": session_id}))
        .await;
    let (before, response) = agent.until_response(prompt_id).await;
    for update in updates(&before, &session_id) {
        assert_eq!(update["sessionUpdate"], "agent_message_chunk", "{update}");
    }
    assert_eq!(response["result"], json!({"stopReason": "cancelled"}));

    let cancels = agent.events("cancel");
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["sessionId"], session_id.as_str());
    assert_eq!(agent.events("stop")[0]["stopReason"], "cancelled");
}

#[tokio::test]
async fn minimal_agent_answers_only_initialize() {
    let mut agent = RawAgent::spawn(&["--minimal"]);
    let (_, init) = agent
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let cwd = agent.dir.to_str().expect("utf-8 temp dir").to_owned();
    let (before, new) = agent
        .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
        .await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(new["error"]["code"], -32601, "{new}");
}

#[tokio::test]
async fn crash_exits_with_the_code_and_says_why() {
    let mut agent = RawAgent::spawn(&[]);
    let session_id = agent.start_session(json!({})).await;
    agent.prompt(&session_id, "/crash 3").await;

    let last_words = agent.recv().await;
    assert_eq!(
        last_words["params"]["update"],
        chunk("agent_message_chunk", "about to crash")
    );
    let status = timeout(WAIT, agent.child.wait())
        .await
        .expect("timed out waiting for the crash")
        .expect("wait for the agent");
    assert_eq!(status.code(), Some(3), "{status}");
    let stderr = agent.stderr().await;
    assert!(
        stderr.contains("fatal: crashing on purpose (3)"),
        "stderr: {stderr}"
    );
}
