//! A scripted ACP agent for testing Tandem's agent bridge.
//!
//! It speaks ACP v1 over stdio through the official SDK's agent side and does
//! nothing but what the prompt text tells it to, so a test can drive every
//! path deterministically:
//!
//! | prompt              | what the agent does                                              |
//! |---------------------|------------------------------------------------------------------|
//! | `/stream N [MS]`    | a thought chunk, then `chunk <i> ` N times, MS ms apart          |
//! | `/slow`             | `tick <i> ` every 50 ms until cancelled (at most 1200)           |
//! | `/stamped N MS`     | an empty chunk, then `<i>@<ns> ` N times on a fixed schedule MS  |
//! |                     | ms apart (chunk i due (i-1)·MS after the first); `ns` is this    |
//! |                     | process's `CLOCK_MONOTONIC` in ns just before the chunk is sent  |
//! | `/tool NAME`        | a tool call, a permission request, then the tool's outcome       |
//! | `/tool2 NAME`       | `/tool NAME` twice in one turn                                   |
//! | `/form`             | a form elicitation (if the client supports form elicitation)     |
//! | `/url URL`          | a URL elicitation (if the client supports URL elicitation)       |
//! | `/read PATH`        | asks the client for the file (`fs/read_text_file`), says the text |
//! | `/write PATH TEXT`  | asks the client to write TEXT to the file (`fs/write_text_file`)  |
//! | `/plan`             | a plan with three entries                                        |
//! | `/extra`            | updates with no direct AHP shape (commands, mode, info, usage…)  |
//! | `/stop REASON`      | one chunk, then stops with REASON                                |
//! | `/crash CODE`       | one chunk, a line on stderr, then exits with CODE                |
//! | `/hang`             | one chunk, then never answers (and ignores cancel)               |
//! | anything else       | `echo: TEXT` in two or three chunks                              |
//!
//! Flags: `--minimal` answers `initialize` only; `--load-session` advertises and
//! accepts `session/load` (and replays one chunk, `replayed history of ID`,
//! before answering it, as real agents replay the conversation).
//!
//! `/stamped` is for the load generator (`loadtest agent-stream`): every
//! process on a machine reads the same `CLOCK_MONOTONIC`, so a subscriber can
//! subtract a chunk's stamp from its own receive time and get the delivery
//! latency from the agent's send, through the bridge and the fan-out. The
//! leading empty chunk opens the response part, so that all N stamped chunks
//! reach subscribers as `chat/delta` (the first chunk of a message becomes
//! the part itself).
//!
//! If `ACP_TEST_AGENT_LOG` names a file, the agent appends one JSON object per
//! line for everything it receives or decides; tests count those lines, so no
//! event is ever logged twice.
//!
//! Request and notification callbacks hold the SDK's dispatch loop, so each
//! turn runs in a task spawned with `cx.spawn` and answers the prompt's
//! responder when it ends: otherwise neither `session/cancel` nor the answer
//! to a permission request could be dispatched while the turn waits.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AvailableCommand, AvailableCommandsUpdate, CancelNotification, ContentBlock,
    ContentChunk, CreateElicitationRequest, CurrentModeUpdate, Diff, ElicitationCapabilities,
    ElicitationFormMode, ElicitationSchema, ElicitationSessionScope, ElicitationUrlMode,
    Implementation, InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, Plan, PlanEntry,
    PlanEntryPriority, PlanEntryStatus, PromptRequest, PromptResponse, ReadTextFileRequest,
    RequestPermissionOutcome, RequestPermissionRequest, ResourceLink, SessionConfigOption,
    SessionConfigOptionCategory, SessionConfigSelectOption, SessionId, SessionInfoUpdate,
    SessionMode, SessionModeState, SessionNotification, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest,
    SetSessionModeResponse, StopReason, ToolCall, ToolCallContent, ToolCallId, ToolCallLocation,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, UsageUpdate,
    WriteTextFileRequest,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client, Error, Stdio};
use blocking::Unblock;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The environment variable naming the event log file.
const LOG_ENV: &str = "ACP_TEST_AGENT_LOG";
/// The pause between two `/slow` ticks.
const SLOW_TICK_MS: u64 = 50;
/// `/slow` gives up after this many ticks (a minute), so a test that forgets
/// to cancel still ends.
const SLOW_MAX_TICKS: u32 = 1200;

/// Appends one JSON object per line to the event log, if there is one.
struct EventLog(Option<Mutex<File>>);

impl EventLog {
    fn from_env() -> std::io::Result<Self> {
        let Some(path) = std::env::var_os(LOG_ENV) else {
            return Ok(Self(None));
        };
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self(Some(Mutex::new(file))))
    }

    /// Writes and flushes one line. A failed write panics: a test that counts
    /// these lines must not see a silently missing one.
    fn event(&self, event: Value) {
        let Some(file) = &self.0 else { return };
        let mut file = file.lock().expect("event log lock poisoned");
        let line = format!("{event}\n");
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .expect("writing the event log");
    }
}

/// What the agent remembers about one session.
#[derive(Default)]
struct SessionState {
    /// Numbers tool calls and elicitations, so their ids are unique within
    /// the session.
    next_item: u64,
    /// Set to `true` by `session/cancel`; a fresh channel per turn.
    cancel: Option<watch::Sender<bool>>,
}

/// State shared by every handler and turn.
struct Shared {
    log: EventLog,
    /// Whether `--load-session` was given.
    load_session: bool,
    /// What the client announced in `initialize`; decides `/form` and `/url`.
    elicitation: Mutex<Option<ElicitationCapabilities>>,
    sessions: Mutex<HashMap<SessionId, SessionState>>,
    next_session: AtomicU64,
    /// `/crash` sends its exit code here; the foreground ends the connection
    /// (flushing what was already sent) and the process exits with it.
    crash: mpsc::UnboundedSender<i32>,
}

impl Shared {
    fn next_item(&self, session_id: &SessionId) -> u64 {
        let mut sessions = self.sessions.lock().expect("sessions lock poisoned");
        let state = sessions.entry(session_id.clone()).or_default();
        state.next_item += 1;
        state.next_item
    }
}

fn session_modes() -> SessionModeState {
    SessionModeState::new(
        "ask",
        vec![
            SessionMode::new("ask", "Ask"),
            SessionMode::new("code", "Code"),
        ],
    )
}

/// Its one config option: a model selector, `fast` or `deep`.
fn model_option(current: &str) -> SessionConfigOption {
    SessionConfigOption::select(
        "model",
        "Model",
        current.to_owned(),
        vec![
            SessionConfigSelectOption::new("fast", "Fast"),
            SessionConfigSelectOption::new("deep", "Deep"),
        ],
    )
    .category(SessionConfigOptionCategory::Model)
}

/// One running prompt turn.
struct Turn {
    cx: ConnectionTo<Client>,
    shared: Arc<Shared>,
    session_id: SessionId,
    cancel: watch::Receiver<bool>,
}

/// How a tool call ended.
enum ToolEnd {
    Done,
    Cancelled,
}

impl Turn {
    fn update(&self, update: SessionUpdate) -> Result<(), Error> {
        self.cx
            .send_notification(SessionNotification::new(self.session_id.clone(), update))
    }

    fn say(&self, content: impl Into<ContentBlock>) -> Result<(), Error> {
        self.update(SessionUpdate::AgentMessageChunk(ContentChunk::new(
            content.into(),
        )))
    }

    fn think(&self, text: impl Into<String>) -> Result<(), Error> {
        self.update(SessionUpdate::AgentThoughtChunk(ContentChunk::new(
            text.into().into(),
        )))
    }

    fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Waits `ms` milliseconds unless the turn is cancelled first; returns
    /// whether it was. Even a zero wait yields, so a cancel that is already
    /// on the wire gets dispatched between two chunks.
    async fn pause(&mut self, ms: u64) -> bool {
        if ms == 0 {
            tokio::task::yield_now().await;
            return self.is_cancelled();
        }
        let sleep = tokio::time::sleep(Duration::from_millis(ms));
        tokio::pin!(sleep);
        let cancel_seen = tokio::select! {
            () = &mut sleep => false,
            seen = self.cancel.wait_for(|cancelled| *cancelled) => seen.is_ok(),
        };
        // The flag's sender is gone once a newer prompt replaced it: that is
        // not a cancel, so finish the wait.
        if !cancel_seen && !sleep.is_elapsed() {
            sleep.await;
        }
        self.is_cancelled()
    }

    async fn run(&mut self, text: &str) -> Result<StopReason, Error> {
        let mut words = text.split_whitespace();
        let command = words.next().unwrap_or("");
        let rest = text[command.len()..].trim();
        let args: Vec<&str> = words.collect();
        match command {
            "/stream" => {
                let count = args.first().and_then(|n| n.parse::<u32>().ok());
                let pause_ms = match args.get(1) {
                    Some(ms) => ms.parse::<u64>().ok(),
                    None => Some(0),
                };
                match (count, pause_ms) {
                    (Some(count), Some(pause_ms)) if args.len() <= 2 => {
                        self.stream(count, pause_ms).await
                    }
                    _ => self.echo(text),
                }
            }
            "/slow" => self.slow().await,
            "/stamped" => match (
                args.first().and_then(|n| n.parse::<u32>().ok()),
                args.get(1).and_then(|ms| ms.parse::<u64>().ok()),
            ) {
                (Some(count), Some(pause_ms)) if args.len() == 2 => {
                    self.stamped(count, pause_ms).await
                }
                _ => self.echo(text),
            },
            "/tool" | "/tool2" if !rest.is_empty() => {
                let times = if command == "/tool2" { 2 } else { 1 };
                for _ in 0..times {
                    if let ToolEnd::Cancelled = self.tool(rest).await? {
                        return Ok(StopReason::Cancelled);
                    }
                }
                Ok(StopReason::EndTurn)
            }
            "/form" => self.form().await,
            "/url" if !rest.is_empty() => self.url(rest).await,
            "/read" if !rest.is_empty() => self.read(rest).await,
            "/write" if args.len() >= 2 => {
                let content = rest[args[0].len()..].trim();
                self.write(args[0], content).await
            }
            "/plan" => self.plan(),
            "/extra" => self.extra(),
            "/stop" => match serde_json::from_value::<StopReason>(json!(rest)) {
                Ok(reason) => {
                    self.say(format!("stopping: {rest}"))?;
                    Ok(reason)
                }
                Err(_) => self.echo(text),
            },
            "/crash" => match rest.parse::<i32>() {
                Ok(code) => self.crash(code).await,
                Err(_) => self.echo(text),
            },
            _ => self.echo(text),
        }
    }

    async fn stream(&mut self, count: u32, pause_ms: u64) -> Result<StopReason, Error> {
        self.think(format!("planning {count} chunks"))?;
        for i in 1..=count {
            if i > 1 && self.pause(pause_ms).await {
                return Ok(StopReason::Cancelled);
            }
            if self.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            self.say(format!("chunk {i} "))?;
        }
        Ok(StopReason::EndTurn)
    }

    /// Ask the client for a file's text and say what came back.
    async fn read(&mut self, path: &str) -> Result<StopReason, Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), path);
        let answer = self.cx.send_request(request).block_task().await;
        let said = match answer {
            Ok(r) => format!("read {path}: {}", r.content),
            Err(e) => format!(
                "read {path} failed: {} {}",
                e.message,
                e.data.unwrap_or_default()
            ),
        };
        self.shared
            .log
            .event(json!({ "event": "fs", "said": said }));
        self.say(said)?;
        Ok(StopReason::EndTurn)
    }

    /// Ask the client to write a file and say how it went.
    async fn write(&mut self, path: &str, content: &str) -> Result<StopReason, Error> {
        let request = WriteTextFileRequest::new(self.session_id.clone(), path, content);
        let answer = self.cx.send_request(request).block_task().await;
        let said = match answer {
            Ok(_) => format!("wrote {path}"),
            Err(e) => format!(
                "write {path} failed: {} {}",
                e.message,
                e.data.unwrap_or_default()
            ),
        };
        self.shared
            .log
            .event(json!({ "event": "fs", "said": said }));
        self.say(said)?;
        Ok(StopReason::EndTurn)
    }

    /// Chunk `i` is due `(i-1) × pause_ms` after the first, however long
    /// the sends before it took, so a long stream keeps its rate; a late
    /// chunk is sent at once, and its stamp says when.
    async fn stamped(&mut self, count: u32, pause_ms: u64) -> Result<StopReason, Error> {
        self.say("")?;
        let start = tokio::time::Instant::now();
        for i in 1..=count {
            let due = start + Duration::from_millis(pause_ms) * (i - 1);
            let sleep = tokio::time::sleep_until(due);
            tokio::pin!(sleep);
            let cancel_seen = tokio::select! {
                () = &mut sleep => false,
                seen = self.cancel.wait_for(|cancelled| *cancelled) => seen.is_ok(),
            };
            // As in `pause`: a replaced flag is not a cancel.
            if !cancel_seen && !sleep.is_elapsed() {
                sleep.await;
            }
            if self.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            self.say(format!("{i}@{} ", monotonic_ns()))?;
        }
        Ok(StopReason::EndTurn)
    }

    async fn slow(&mut self) -> Result<StopReason, Error> {
        for i in 1..=SLOW_MAX_TICKS {
            if self.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            self.say(format!("tick {i} "))?;
            if self.pause(SLOW_TICK_MS).await {
                return Ok(StopReason::Cancelled);
            }
        }
        Ok(StopReason::EndTurn)
    }

    /// One tool call: announce it, ask for permission, act on the answer.
    async fn tool(&mut self, name: &str) -> Result<ToolEnd, Error> {
        let tool_call_id =
            ToolCallId::new(format!("tc-{}", self.shared.next_item(&self.session_id)));
        let path = format!("/tmp/{name}.txt");
        let call = ToolCall::new(tool_call_id.clone(), format!("Run {name}"))
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Pending)
            .raw_input(json!({ "tool": name }))
            .locations(vec![ToolCallLocation::new(path.clone())])
            .content(vec![ToolCallContent::Diff(
                Diff::new(path, format!("new {name}")).old_text("old".to_owned()),
            )]);
        self.update(SessionUpdate::ToolCall(call.clone()))?;

        let options = vec![
            PermissionOption::new("allow-once", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new(
                "allow-always",
                "Always allow",
                PermissionOptionKind::AllowAlways,
            ),
            PermissionOption::new("reject-once", "Reject", PermissionOptionKind::RejectOnce),
            PermissionOption::new(
                "reject-always",
                "Always reject",
                PermissionOptionKind::RejectAlways,
            ),
        ];
        let request = RequestPermissionRequest::new(
            self.session_id.clone(),
            ToolCallUpdate::new(
                tool_call_id.clone(),
                ToolCallUpdateFields::new()
                    .title(call.title.clone())
                    .kind(call.kind)
                    .status(call.status)
                    .raw_input(call.raw_input.clone())
                    .locations(call.locations.clone())
                    .content(call.content.clone()),
            ),
            options,
        );
        // A cancelled turn still waits here: per ACP the client answers every
        // pending permission request of a cancelled session with `cancelled`.
        let answer = self.cx.send_request(request).block_task().await;
        let outcome = match answer {
            Ok(response) => response.outcome,
            Err(error) => {
                self.shared.log.event(json!({
                    "event": "permission", "sessionId": self.session_id,
                    "toolCallId": tool_call_id, "outcome": "error",
                    "error": error.to_string(),
                }));
                return Err(error);
            }
        };
        let selected = match outcome {
            RequestPermissionOutcome::Selected(selected) => Some(selected.option_id),
            _ => None,
        };
        self.shared.log.event(json!({
            "event": "permission", "sessionId": self.session_id, "toolCallId": tool_call_id,
            "outcome": if selected.is_some() { "selected" } else { "cancelled" },
            "optionId": selected,
        }));
        let Some(option_id) = selected else {
            return Ok(ToolEnd::Cancelled);
        };
        if self.is_cancelled() {
            return Ok(ToolEnd::Cancelled);
        }

        let status = |status| {
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                tool_call_id.clone(),
                ToolCallUpdateFields::new().status(status),
            ))
        };
        match option_id.0.as_ref() {
            "allow-once" | "allow-always" => {
                self.update(status(ToolCallStatus::InProgress))?;
                self.update(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    tool_call_id.clone(),
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Completed)
                        .content(vec![ToolCallContent::from(format!("{name} done"))])
                        .raw_output(json!({ "ok": true })),
                )))?;
            }
            _ => self.update(status(ToolCallStatus::Failed))?,
        }
        self.say(format!("tool {name}: {option_id}"))?;
        Ok(ToolEnd::Done)
    }

    fn supports(&self, check: impl Fn(&ElicitationCapabilities) -> bool) -> bool {
        let capabilities = self
            .shared
            .elicitation
            .lock()
            .expect("capabilities lock poisoned");
        capabilities.as_ref().is_some_and(check)
    }

    /// Sends one elicitation, logs the answer and reports it in a chunk
    /// prefixed with `label`.
    async fn elicit(
        &mut self,
        label: &str,
        request: CreateElicitationRequest,
    ) -> Result<StopReason, Error> {
        match self.cx.send_request(request).block_task().await {
            Ok(response) => {
                let response =
                    serde_json::to_value(&response).map_err(Error::into_internal_error)?;
                self.shared.log.event(json!({
                    "event": "elicitation", "sessionId": self.session_id, "response": response,
                }));
                self.say(format!("{label}: {response}"))?;
            }
            Err(error) => {
                self.shared.log.event(json!({
                    "event": "elicitation", "sessionId": self.session_id,
                    "error": error.to_string(),
                }));
                self.say(format!("{label}: error: {error}"))?;
            }
        }
        Ok(if self.is_cancelled() {
            StopReason::Cancelled
        } else {
            StopReason::EndTurn
        })
    }

    async fn form(&mut self) -> Result<StopReason, Error> {
        if !self.supports(ElicitationCapabilities::supports_form) {
            self.say("form: unsupported")?;
            return Ok(StopReason::EndTurn);
        }
        let schema = ElicitationSchema::new()
            .string("name", true)
            .integer("count", 0, 1000, false);
        let scope = ElicitationSessionScope::new(self.session_id.clone());
        let request = CreateElicitationRequest::new(
            ElicitationFormMode::new(scope, schema),
            "Tell me about the release",
        );
        self.elicit("form", request).await
    }

    async fn url(&mut self, url: &str) -> Result<StopReason, Error> {
        if !self.supports(ElicitationCapabilities::supports_url) {
            self.say("url: unsupported")?;
            return Ok(StopReason::EndTurn);
        }
        let elicitation_id = format!("el-{}", self.shared.next_item(&self.session_id));
        let scope = ElicitationSessionScope::new(self.session_id.clone());
        let request = CreateElicitationRequest::new(
            ElicitationUrlMode::new(scope, elicitation_id, url),
            "Open this page",
        );
        self.elicit("url", request).await
    }

    fn plan(&self) -> Result<StopReason, Error> {
        self.update(SessionUpdate::Plan(Plan::new(vec![
            PlanEntry::new(
                "Read the code",
                PlanEntryPriority::High,
                PlanEntryStatus::Completed,
            ),
            PlanEntry::new(
                "Write the change",
                PlanEntryPriority::Medium,
                PlanEntryStatus::InProgress,
            ),
            PlanEntry::new(
                "Run the tests",
                PlanEntryPriority::Low,
                PlanEntryStatus::Pending,
            ),
        ])))?;
        self.say("planned")?;
        Ok(StopReason::EndTurn)
    }

    fn extra(&self) -> Result<StopReason, Error> {
        self.update(SessionUpdate::AvailableCommandsUpdate(
            AvailableCommandsUpdate::new(vec![
                AvailableCommand::new("stream", "Stream N chunks"),
                AvailableCommand::new("tool", "Run a tool after asking"),
            ]),
        ))?;
        self.update(SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(
            "code",
        )))?;
        self.update(SessionUpdate::SessionInfoUpdate(
            SessionInfoUpdate::new().title("Test session".to_owned()),
        ))?;
        self.update(SessionUpdate::UsageUpdate(UsageUpdate::new(1234, 200_000)))?;
        self.say(ContentBlock::ResourceLink(ResourceLink::new(
            "notes.txt",
            "file:///tmp/notes.txt",
        )))?;
        self.say("extra done")?;
        Ok(StopReason::EndTurn)
    }

    /// Never returns: the foreground ends the process once the chunk is out.
    async fn crash(&mut self, code: i32) -> Result<StopReason, Error> {
        self.say("about to crash")?;
        self.shared
            .log
            .event(json!({ "event": "crash", "sessionId": self.session_id, "code": code }));
        self.shared
            .crash
            .send(code)
            .map_err(Error::into_internal_error)?;
        std::future::pending().await
    }

    fn echo(&self, text: &str) -> Result<StopReason, Error> {
        self.say("echo: ")?;
        let chars: Vec<char> = text.chars().collect();
        if chars.len() >= 2 {
            let (head, tail) = chars.split_at(chars.len() / 2);
            self.say(head.iter().collect::<String>())?;
            self.say(tail.iter().collect::<String>())?;
        } else {
            self.say(text)?;
        }
        Ok(StopReason::EndTurn)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock the load generator reads too
/// (std's `Instant` is the same clock, but does not show its value).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn prompt_text(prompt: &[ContentBlock]) -> String {
    let texts: Vec<&str> = prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n").trim().to_owned()
}

/// Handles `session/prompt`: registers the turn's cancel flag while still in
/// the dispatch loop (so a cancel right behind the prompt finds it), then
/// runs the turn in a spawned task.
fn start_turn(
    shared: &Arc<Shared>,
    request: PromptRequest,
    responder: Responder<PromptResponse>,
    cx: ConnectionTo<Client>,
) -> Result<(), Error> {
    let session_id = request.session_id;
    let text = prompt_text(&request.prompt);
    shared
        .log
        .event(json!({ "event": "prompt", "sessionId": session_id, "text": text }));
    let (cancel_tx, cancel_rx) = watch::channel(false);
    {
        let mut sessions = shared.sessions.lock().expect("sessions lock poisoned");
        let Some(state) = sessions.get_mut(&session_id) else {
            drop(sessions);
            return responder.respond_with_error(
                Error::invalid_params().data(json!(format!("unknown session {session_id}"))),
            );
        };
        state.cancel = Some(cancel_tx);
    }

    if text == "/hang" {
        let turn = Turn {
            cx: cx.clone(),
            shared: shared.clone(),
            session_id,
            cancel: cancel_rx,
        };
        turn.say("hanging")?;
        return cx.spawn(async move {
            // Holding the responder forever: dropping it would answer.
            let _never_answered = responder;
            std::future::pending::<()>().await;
            Ok(())
        });
    }

    let mut turn = Turn {
        cx: cx.clone(),
        shared: shared.clone(),
        session_id,
        cancel: cancel_rx,
    };
    cx.spawn(async move {
        match turn.run(&text).await {
            Ok(stop_reason) => {
                turn.shared.log.event(json!({
                    "event": "stop", "sessionId": turn.session_id, "stopReason": stop_reason,
                }));
                responder.respond(PromptResponse::new(stop_reason))
            }
            // An error answers the prompt; returning it would end the
            // whole connection.
            Err(error) => responder.respond_with_error(error),
        }
    })
}

/// Answers `initialize` only, like the SDK's `simple_agent`.
async fn run_minimal(log: EventLog) -> Result<(), Error> {
    Agent
        .v1()
        .name("acp-test-agent-minimal")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                log.event(json!({
                    "event": "initialize",
                    "protocolVersion": request.protocol_version,
                    "clientCapabilities": request.client_capabilities,
                }));
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(AgentCapabilities::new()),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await
}

/// The SDK's `Stdio` transport, built from its parts: `Stdio` is driven as
/// opaque work, so a foreground that returns (on `/crash`) does not wait for
/// the last lines to be written, while `ByteStreams` finishes its writer
/// before `connect_with` returns.
fn stdio_byte_streams() -> ByteStreams<Unblock<std::io::Stdout>, Unblock<std::io::Stdin>> {
    ByteStreams::new(
        Unblock::new(std::io::stdout()),
        Unblock::new(std::io::stdin()),
    )
}

/// Serves every command; returns the exit code `/crash` asked for, if any.
async fn run_full(log: EventLog, load_session: bool) -> Result<Option<i32>, Error> {
    let (crash_tx, mut crash_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        log,
        load_session,
        elicitation: Mutex::new(None),
        sessions: Mutex::new(HashMap::new()),
        next_session: AtomicU64::new(1),
        crash: crash_tx,
    });
    let on_initialize = shared.clone();
    let on_new = shared.clone();
    let on_load = shared.clone();
    let on_mode = shared.clone();
    let on_option = shared.clone();
    let on_prompt = shared.clone();
    let on_cancel = shared.clone();

    Agent
        .v1()
        .name("acp-test-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let shared = &on_initialize;
                shared.log.event(json!({
                    "event": "initialize",
                    "protocolVersion": request.protocol_version,
                    "clientCapabilities": request.client_capabilities,
                }));
                *shared
                    .elicitation
                    .lock()
                    .expect("capabilities lock poisoned") = request.client_capabilities.elicitation;
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(
                            AgentCapabilities::new().load_session(shared.load_session),
                        )
                        .agent_info(Implementation::new(
                            "acp-test-agent",
                            env!("CARGO_PKG_VERSION"),
                        )),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx| {
                let shared = &on_new;
                let n = shared.next_session.fetch_add(1, Ordering::Relaxed);
                let session_id = SessionId::new(format!("s-{n}"));
                shared
                    .sessions
                    .lock()
                    .expect("sessions lock poisoned")
                    .insert(session_id.clone(), SessionState::default());
                shared.log.event(json!({
                    "event": "session/new", "sessionId": session_id, "cwd": request.cwd,
                }));
                responder.respond(
                    NewSessionResponse::new(session_id.clone())
                        .modes(session_modes())
                        .config_options(vec![model_option("fast")]),
                )?;
                // As real agents do, it lists its commands before any prompt.
                cx.send_notification(SessionNotification::new(
                    session_id,
                    SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(vec![
                        AvailableCommand::new("stream", "Stream N chunks"),
                        AvailableCommand::new("tool", "Run a tool after asking"),
                    ])),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                let shared = &on_load;
                if !shared.load_session {
                    return responder.respond_with_error(Error::method_not_found());
                }
                shared.log.event(json!({
                    "event": "session/load", "sessionId": request.session_id,
                }));
                // A real agent replays the conversation before it answers;
                // the host already shows it and must not show it twice.
                cx.send_notification(SessionNotification::new(
                    request.session_id.clone(),
                    SessionUpdate::AgentMessageChunk(ContentChunk::new(
                        format!("replayed history of {}", request.session_id).into(),
                    )),
                ))?;
                shared
                    .sessions
                    .lock()
                    .expect("sessions lock poisoned")
                    .entry(request.session_id)
                    .or_default();
                responder.respond(
                    LoadSessionResponse::new()
                        .modes(session_modes())
                        .config_options(vec![model_option("fast")]),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, _cx| {
                on_mode.log.event(json!({
                    "event": "set_mode", "sessionId": request.session_id,
                    "modeId": request.mode_id,
                }));
                responder.respond(SetSessionModeResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionConfigOptionRequest, responder, _cx| {
                let value = request.value.as_value_id().map(|v| v.to_string());
                on_option.log.event(json!({
                    "event": "set_config_option", "sessionId": request.session_id,
                    "configId": request.config_id, "value": value,
                }));
                match value.as_deref() {
                    Some(v @ ("fast" | "deep")) if request.config_id.to_string() == "model" => {
                        responder
                            .respond(SetSessionConfigOptionResponse::new(vec![model_option(v)]))
                    }
                    _ => responder.respond_with_error(
                        Error::invalid_params().data(json!("unknown option or value")),
                    ),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                start_turn(&on_prompt, request, responder, cx)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                let shared = &on_cancel;
                shared.log.event(json!({
                    "event": "cancel", "sessionId": notification.session_id,
                }));
                let sessions = shared.sessions.lock().expect("sessions lock poisoned");
                if let Some(cancel) = sessions
                    .get(&notification.session_id)
                    .and_then(|state| state.cancel.as_ref())
                {
                    cancel.send_replace(true);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(stdio_byte_streams(), async |cx: ConnectionTo<Client>| {
            tokio::select! {
                code = crash_rx.recv() => Ok(code),
                () = cx.incoming_closed() => Ok(None),
            }
        })
        .await
}

#[tokio::main]
async fn main() {
    let mut minimal = false;
    let mut load_session = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--minimal" => minimal = true,
            "--load-session" => load_session = true,
            other => {
                eprintln!("acp_test_agent: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let log = match EventLog::from_env() {
        Ok(log) => log,
        Err(error) => {
            eprintln!("acp_test_agent: cannot open ${LOG_ENV}: {error}");
            std::process::exit(2);
        }
    };
    log.event(json!({ "event": "start", "pid": std::process::id() }));

    let result = if minimal {
        run_minimal(log).await.map(|()| None)
    } else {
        run_full(log, load_session).await
    };
    match result {
        Ok(Some(code)) => {
            eprintln!("fatal: crashing on purpose ({code})");
            std::process::exit(code);
        }
        // Exit at once: a `/hang` turn would otherwise keep the runtime alive.
        Ok(None) => std::process::exit(0),
        Err(error) => {
            eprintln!("acp_test_agent: {error}");
            std::process::exit(1);
        }
    }
}
