//! One ACP agent process: spawned with the operator's command line, spoken
//! to with the official SDK's client side over its stdin/stdout, its stderr
//! kept (the last lines name the cause when it dies), its exit reported.
//!
//! Everything the agent sends arrives as an [`Event`] on one channel, in the
//! order the SDK's dispatch loop saw it, so the bridge maps updates and
//! permission requests in the order the agent meant them.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, CreateElicitationRequest,
    CreateElicitationResponse, ElicitationCapabilities, ElicitationFormCapabilities,
    ElicitationUrlCapabilities, FileSystemCapabilities, InitializeRequest, LoadSessionRequest,
    NewSessionRequest, PromptRequest, PromptResponse, ReadTextFileRequest,
    RequestPermissionRequest, RequestPermissionResponse, SessionConfigOption, SessionId,
    SessionNotification, SetSessionConfigOptionRequest, SetSessionModeRequest, TextContent,
    WriteTextFileRequest,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent as AgentPeer, ByteStreams, Client};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use super::choices::{Choices, SetCall};
use super::files::FileAccess;
use crate::config::AgentSpec;

/// Lines of stderr kept for error messages.
const STDERR_LINES: usize = 12;

/// What the agent process sends or does, in order.
pub enum Event {
    /// A `session/update`.
    Update(Box<SessionNotification>),
    /// A `session/request_permission`, answered through the responder.
    Permission(
        Box<RequestPermissionRequest>,
        Responder<RequestPermissionResponse>,
    ),
    /// An `elicitation/create`, answered through the responder.
    Elicitation(
        Box<CreateElicitationRequest>,
        Responder<CreateElicitationResponse>,
    ),
    /// A `session/prompt` was answered (or failed).
    PromptDone {
        /// The ACP session.
        session: String,
        /// The bridge's tag for the prompt (its turn).
        tag: String,
        /// The answer, or why there is none.
        result: Result<PromptResponse, String>,
    },
    /// A `session/load` was answered (or failed). It comes after every
    /// update the agent sent while loading (its replay of the history).
    Loaded {
        /// The ACP session.
        session: String,
        /// What it offers there, or why it did not load.
        result: Result<Choices, String>,
    },
    /// The process is gone: why (exit status and its last stderr lines).
    Exited(String),
}

/// A request from the bridge to the agent.
enum Call {
    NewSession(PathBuf, oneshot::Sender<Result<(String, Choices), String>>),
    Set(
        String,
        SetCall,
        oneshot::Sender<Result<Option<Vec<SessionConfigOption>>, String>>,
    ),
    Load(String, PathBuf),
    Prompt(String, String, String),
    Cancel(String),
}

/// A running agent process.
pub struct Process {
    calls: mpsc::UnboundedSender<Call>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
    /// Its process id.
    pub pid: Option<u32>,
    /// Whether it advertised `loadSession` in `initialize`.
    pub load_session: bool,
}

/// One running agent process in its agent's count: counted while it lives.
struct Running(Arc<std::sync::atomic::AtomicUsize>);

impl Running {
    fn new(alive: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        alive.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(alive)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Process {
    /// Spawn `spec`'s command, `initialize` it and wait for the answer.
    /// Events go to `events`, tagged with nothing: one process per bridge.
    pub async fn start(
        spec: &AgentSpec,
        events: mpsc::UnboundedSender<Event>,
        alive: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<Arc<Self>, String> {
        let files = Arc::new(FileAccess::of(spec)?);
        let mut cmd = Command::new(&spec.command);
        cmd.args(&spec.args)
            .envs(&spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run `{}`: {e}", spec.command))?;
        let pid = child.id();
        // Counted until it has exited (the exit watcher below owns it).
        let running = Running::new(alive);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the agent's standard streams could not be opened".into());
        };

        // Stderr: the last lines, for error messages; logged as they come.
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_LINES)));
        let (stderr_done_tx, stderr_done) = watch::channel(false);
        {
            let tail = tail.clone();
            let name = spec.name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(agent = %name, "stderr: {line}");
                    let mut t = tail.lock();
                    if t.len() == STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
                let _ = stderr_done_tx.send(true);
            });
        }

        // Exit: reported once, with the status and the stderr tail.
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        {
            let events = events.clone();
            let tail = tail.clone();
            let mut stderr_done = stderr_done.clone();
            tokio::spawn(async move {
                let status = tokio::select! {
                    status = child.wait() => status,
                    _ = kill_rx => {
                        let _ = child.kill().await;
                        child.wait().await
                    }
                };
                drop(running);
                // Let the stderr reader take the last lines first.
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(500),
                    stderr_done.wait_for(|done| *done),
                )
                .await;
                let status = match status {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("status unknown ({e})"),
                };
                let lines: Vec<String> = tail.lock().iter().cloned().collect();
                let cause = if lines.is_empty() {
                    format!("the agent process exited ({status})")
                } else {
                    format!(
                        "the agent process exited ({status}); its last output: {}",
                        lines.join(" | ")
                    )
                };
                let _ = events.send(Event::Exited(cause));
            });
        }

        let (calls, calls_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<bool, String>>();
        let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
        let name = spec.name.clone();
        tokio::spawn(run(transport, events, calls_rx, ready_tx, name, files));
        let mut process = Self {
            calls,
            kill: Mutex::new(Some(kill_tx)),
            pid,
            load_session: false,
        };
        let ready = tokio::time::timeout(spec.start_timeout(), ready_rx).await;
        let outcome = match ready {
            Ok(Ok(Ok(load_session))) => {
                process.load_session = load_session;
                return Ok(Arc::new(process));
            }
            Ok(Ok(Err(e))) => format!("`initialize` failed: {e}"),
            Ok(Err(_)) => "the agent closed the connection during `initialize`".to_owned(),
            Err(_) => format!(
                "no answer to `initialize` within {} s",
                spec.start_timeout().as_secs()
            ),
        };
        process.stop();
        // Say why, with what the process printed, if it has exited by now.
        let mut last = String::new();
        let _ = tokio::time::timeout(std::time::Duration::from_millis(300), async {
            let mut stderr_done = stderr_done;
            let _ = stderr_done.wait_for(|d| *d).await;
        })
        .await;
        let lines: Vec<String> = tail.lock().iter().cloned().collect();
        if !lines.is_empty() {
            last = format!("; its last output: {}", lines.join(" | "));
        }
        Err(format!("{outcome}{last}"))
    }

    /// Open an ACP session in `cwd`: its id and what it offers.
    pub async fn new_session(&self, cwd: PathBuf) -> Result<(String, Choices), String> {
        let (tx, rx) = oneshot::channel();
        self.calls
            .send(Call::NewSession(cwd, tx))
            .map_err(|_| "the agent process is gone".to_owned())?;
        rx.await
            .map_err(|_| "the agent process is gone".to_owned())?
    }

    /// Send `session/load` for `session`; the answer comes as
    /// [`Event::Loaded`].
    pub fn load(&self, session: &str, cwd: PathBuf) -> Result<(), String> {
        self.calls
            .send(Call::Load(session.to_owned(), cwd))
            .map_err(|_| "the agent process is gone".to_owned())
    }

    /// Set a mode or config option of `session`: the options as they are
    /// after it, when the agent says.
    pub async fn set(
        &self,
        session: &str,
        call: SetCall,
    ) -> Result<Option<Vec<SessionConfigOption>>, String> {
        let (tx, rx) = oneshot::channel();
        self.calls
            .send(Call::Set(session.to_owned(), call, tx))
            .map_err(|_| "the agent process is gone".to_owned())?;
        rx.await
            .map_err(|_| "the agent process is gone".to_owned())?
    }

    /// Send `session/prompt`; the answer comes as [`Event::PromptDone`].
    pub fn prompt(&self, session: &str, text: String, tag: String) -> Result<(), String> {
        self.calls
            .send(Call::Prompt(session.to_owned(), text, tag))
            .map_err(|_| "the agent process is gone".to_owned())
    }

    /// Send `session/cancel`.
    pub fn cancel(&self, session: &str) {
        let _ = self.calls.send(Call::Cancel(session.to_owned()));
    }

    /// Stop the process (its exit is still reported).
    pub fn stop(&self) {
        if let Some(kill) = self.kill.lock().take() {
            let _ = kill.send(());
        }
    }
}

/// The connection: handlers forward what the agent sends; the foreground
/// initializes, then serves the bridge's calls until they stop.
async fn run(
    transport: impl agent_client_protocol::ConnectTo<Client> + 'static,
    events: mpsc::UnboundedSender<Event>,
    mut calls: mpsc::UnboundedReceiver<Call>,
    ready: oneshot::Sender<Result<bool, String>>,
    name: String,
    files: Arc<FileAccess>,
) {
    let capabilities = ClientCapabilities::new()
        // Questions, yes (every client can answer them); the host's files
        // only as the operator granted; terminals, no.
        .elicitation(
            ElicitationCapabilities::new()
                .form(ElicitationFormCapabilities::new())
                .url(ElicitationUrlCapabilities::new()),
        )
        .fs(FileSystemCapabilities::new()
            .read_text_file(files.can_read())
            .write_text_file(files.can_write()));
    let reads = files.clone();
    let writes = files;
    let updates = events.clone();
    let permissions = events.clone();
    let elicitations = events.clone();
    let result = Client
        .v1()
        .name("tandem")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                let _ = updates.send(Event::Update(Box::new(n)));
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |r: RequestPermissionRequest, responder, _cx| {
                let _ = permissions.send(Event::Permission(Box::new(r), responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: CreateElicitationRequest, responder, _cx| {
                let _ = elicitations.send(Event::Elicitation(Box::new(r), responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: ReadTextFileRequest, responder, _cx| {
                let files = reads.clone();
                tokio::spawn(async move {
                    let _ = match files.read(&r).await {
                        Ok(answer) => responder.respond(answer),
                        Err(e) => {
                            tracing::info!(agent_session = %r.session_id, path = %r.path.display(), error = %e, "file read refused");
                            responder.respond_with_error(e)
                        }
                    };
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: WriteTextFileRequest, responder, _cx| {
                let files = writes.clone();
                tokio::spawn(async move {
                    let _ = match files.write(&r).await {
                        Ok(answer) => responder.respond(answer),
                        Err(e) => {
                            tracing::info!(agent_session = %r.session_id, path = %r.path.display(), error = %e, "file write refused");
                            responder.respond_with_error(e)
                        }
                    };
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<AgentPeer>| {
            let init = cx
                .send_request(
                    InitializeRequest::new(ProtocolVersion::V1).client_capabilities(capabilities),
                )
                .block_task()
                .await;
            match init {
                Ok(init) => {
                    let _ = ready.send(Ok(init.agent_capabilities.load_session));
                }
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return Ok(());
                }
            }
            while let Some(call) = calls.recv().await {
                match call {
                    Call::NewSession(cwd, reply) => {
                        let cx2 = cx.clone();
                        tokio::spawn(async move {
                            let r = cx2
                                .send_request(NewSessionRequest::new(cwd))
                                .block_task()
                                .await
                                .map(|s| {
                                    let choices = Choices::new(s.modes, s.config_options);
                                    (s.session_id.to_string(), choices)
                                })
                                .map_err(|e| e.to_string());
                            let _ = reply.send(r);
                        });
                    }
                    Call::Load(session, cwd) => {
                        let cx2 = cx.clone();
                        let events = events.clone();
                        tokio::spawn(async move {
                            let result = cx2
                                .send_request(LoadSessionRequest::new(
                                    SessionId::new(session.clone()),
                                    cwd,
                                ))
                                .block_task()
                                .await
                                .map(|r| Choices::new(r.modes, r.config_options))
                                .map_err(|e| e.to_string());
                            let _ = events.send(Event::Loaded { session, result });
                        });
                    }
                    Call::Set(session, call, reply) => {
                        let cx2 = cx.clone();
                        tokio::spawn(async move {
                            let id = SessionId::new(session);
                            let r = match call {
                                SetCall::Mode(mode) => cx2
                                    .send_request(SetSessionModeRequest::new(id, mode))
                                    .block_task()
                                    .await
                                    .map(|_| None),
                                SetCall::Option(option, value) => cx2
                                    .send_request(SetSessionConfigOptionRequest::new(
                                        id,
                                        option,
                                        value.as_str(),
                                    ))
                                    .block_task()
                                    .await
                                    .map(|r| Some(r.config_options)),
                            };
                            let _ = reply.send(r.map_err(|e| e.to_string()));
                        });
                    }
                    Call::Prompt(session, text, tag) => {
                        let cx2 = cx.clone();
                        let events = events.clone();
                        tokio::spawn(async move {
                            let request = PromptRequest::new(
                                SessionId::new(session.clone()),
                                vec![ContentBlock::Text(TextContent::new(text))],
                            );
                            let result = cx2
                                .send_request(request)
                                .block_task()
                                .await
                                .map_err(|e| e.to_string());
                            let _ = events.send(Event::PromptDone {
                                session,
                                tag,
                                result,
                            });
                        });
                    }
                    Call::Cancel(session) => {
                        let _ =
                            cx.send_notification(CancelNotification::new(SessionId::new(session)));
                    }
                }
            }
            Ok(())
        })
        .await;
    if let Err(e) = result {
        tracing::debug!(agent = %name, error = %e, "the agent connection ended");
    }
}
