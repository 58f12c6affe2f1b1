//! Shared harness for end-to-end tests: a real Tandem server on 127.0.0.1:0,
//! official `ahp` clients over `ahp-ws`, and a local mirror of channel state
//! reduced with the same official reducers the server uses.
#![allow(dead_code)]

#[allow(dead_code)]
pub mod nats;
pub mod provider;

use std::net::SocketAddr;
use std::time::Duration;

use ahp::reducers::apply_action_to_chat;
use ahp::{Client, ClientConfig, ClientEvent, SubscriptionEvent};
use ahp_types::actions::{ActionEnvelope, ChatTurnStartedAction, StateAction};
use ahp_types::commands::{InitializeResult, SubscribeResult};
use ahp_types::state::{
    ChatState, Message, MessageKind, MessageOrigin, SessionState, SnapshotState,
};
use serde_json::{json, Value};
use tandem::Config;
use tokio::sync::oneshot;

/// A plain HTTP/1.1 request; returns (status line, header lines, body),
/// status and headers lower-cased.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (String, String, Vec<u8>) {
    http_with(addr, method, path, &[]).await
}

/// [`http`] with extra request headers.
pub async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (String, String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: tandem\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .expect("read");
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&buf[..split]).to_lowercase();
    let (status, headers) = head.split_once("\r\n").unwrap_or((&head, ""));
    (
        status.to_owned(),
        headers.to_owned(),
        buf[split + 4..].to_vec(),
    )
}

/// The server's `GET /healthz` document.
pub async fn healthz(addr: SocketAddr) -> Value {
    let (_, _, body) = http(addr, "GET", "/healthz").await;
    serde_json::from_slice(&body).expect("healthz JSON")
}

/// Wait until `/healthz` counts `n` WebSocket connections.
pub async fn wait_connections(addr: SocketAddr, n: u64) {
    eventually(&format!("/healthz counts {n} connections"), || async {
        (healthz(addr).await["connections"] == n).then_some(())
    })
    .await
}

/// Poll `check` until it yields `Some`, failing after [`WAIT`] with `what`:
/// an awaited condition. The one polling loop of the tests, for states
/// that announce themselves to nobody (a figure on `/healthz`, a file, a
/// process's state); anything that sends an event is waited on instead.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        // The poll interval, not a guess at how long anything takes.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A running server.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(Config::default()).await
    }

    /// Start with `config`: the SQLite store when `data_dir` is set, memory
    /// otherwise.
    pub async fn start_with(config: Config) -> Self {
        let journal: std::sync::Arc<dyn tandem::store::Journal> = match &config.data_dir {
            Some(dir) => std::sync::Arc::new(
                tandem::store::SqliteJournal::open(dir, config.durability).expect("open the store"),
            ),
            None => std::sync::Arc::new(tandem::store::MemoryJournal::new()),
        };
        Self::start_with_journal(config, journal).await
    }

    pub async fn start_with_journal(
        config: Config,
        journal: std::sync::Arc<dyn tandem::store::Journal>,
    ) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(tandem::server::run_with_journal(
            listener,
            config,
            journal,
            async move {
                let _ = rx.await;
            },
        ));
        // No wait: the socket listens from the bind on, and connections
        // queue until the server accepts them.
        Self {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/ahp", self.addr)
    }

    /// Connect and initialize an official client.
    pub async fn client(&self, client_id: &str) -> TestClient {
        TestClient::connect(&self.url(), client_id).await
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// An official client plus its all-events stream.
pub struct TestClient {
    pub client: Client,
    pub id: String,
    pub events: ahp::ClientEventStream,
    pub init: InitializeResult,
}

pub fn client_config() -> ClientConfig {
    ClientConfig {
        default_request_timeout: Some(Duration::from_secs(30)),
        subscription_buffer: 1 << 17,
    }
}

impl TestClient {
    pub async fn connect(url: &str, client_id: &str) -> Self {
        let client = Self::raw_connect(url).await;
        Self::initialized(client, client_id).await
    }

    /// Initialize an official client already connected.
    pub async fn initialized(client: Client, client_id: &str) -> Self {
        let events = client.events();
        let init = client
            .initialize(client_id.into(), vec!["1.0.0".into()], vec![])
            .await
            .expect("initialize");
        Self {
            client,
            id: client_id.into(),
            events,
            init,
        }
    }

    /// A transport-connected client that has not initialized yet.
    pub async fn raw_connect(url: &str) -> Client {
        let transport = ahp_ws::WebSocketTransport::connect(url)
            .await
            .expect("connect");
        Client::connect(transport, client_config())
            .await
            .expect("client")
    }

    /// `createSession` with the scripted agent; returns (session, default chat).
    pub async fn create_session(&self) -> (String, String) {
        let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
        let _: Value = self
            .client
            .request(
                "createSession",
                json!({"channel": session, "provider": "scripted"}),
            )
            .await
            .expect("createSession");
        let state = self.subscribe_session(&session).await;
        let chat = state.default_chat.expect("default chat");
        (session, chat)
    }

    pub async fn subscribe_raw(&self, uri: &str) -> SubscribeResult {
        self.client
            .request("subscribe", json!({"channel": uri}))
            .await
            .expect("subscribe")
    }

    pub async fn subscribe_session(&self, uri: &str) -> SessionState {
        match self
            .subscribe_raw(uri)
            .await
            .snapshot
            .expect("snapshot")
            .state
        {
            SnapshotState::Session(s) => *s,
            other => panic!("not a session snapshot: {other:?}"),
        }
    }

    /// Subscribe to a chat and return a mirror seeded with the snapshot.
    pub async fn subscribe_chat(&self, uri: &str) -> ChatMirror {
        let snap = self.subscribe_raw(uri).await.snapshot.expect("snapshot");
        match snap.state {
            SnapshotState::Chat(c) => ChatMirror {
                uri: uri.into(),
                state: *c,
                from_seq: snap.from_seq as u64,
            },
            other => panic!("not a chat snapshot: {other:?}"),
        }
    }

    pub async fn dispatch(&self, channel: &str, action: StateAction) -> i64 {
        self.client
            .dispatch(channel.into(), action)
            .await
            .expect("dispatch")
            .client_seq
    }

    /// Dispatch a raw action JSON (for malformed actions).
    pub async fn dispatch_json(&self, channel: &str, action: Value) -> i64 {
        self.dispatch(channel, StateAction::Unknown(action)).await
    }

    /// Start a turn with `text`; returns the turn id.
    pub async fn start_turn(&self, chat: &str, text: &str) -> String {
        let turn_id = uuid::Uuid::new_v4().to_string();
        self.dispatch(chat, turn_started(&turn_id, text)).await;
        turn_id
    }

    /// Next action envelope on any channel.
    pub async fn next_envelope(&mut self) -> ActionEnvelope {
        loop {
            let ev = tokio::time::timeout(WAIT, self.events.recv())
                .await
                .expect("timed out waiting for an envelope")
                .expect("client closed");
            if let ClientEvent {
                event: SubscriptionEvent::Action(env),
                ..
            } = ev
            {
                return env;
            }
        }
    }

    /// Envelopes until one matches `pred` (which is returned); `mirror`, when
    /// given, has every accepted envelope of its channel applied on the way.
    pub async fn wait_for(
        &mut self,
        mut mirror: Option<&mut ChatMirror>,
        mut pred: impl FnMut(&ActionEnvelope) -> bool,
    ) -> ActionEnvelope {
        loop {
            let env = self.next_envelope().await;
            if let Some(m) = mirror.as_deref_mut() {
                m.apply(&env);
            }
            if pred(&env) {
                return env;
            }
        }
    }

    /// Apply envelopes to `mirror` until its state satisfies `pred` (checked
    /// first, so an envelope consumed earlier is not waited for again).
    pub async fn wait_state(
        &mut self,
        mirror: &mut ChatMirror,
        mut pred: impl FnMut(&ChatState) -> bool,
    ) {
        while !pred(&mirror.state) {
            let env = self.next_envelope().await;
            mirror.apply(&env);
        }
    }

    /// The echo of our own dispatch `client_seq`.
    pub async fn wait_echo(
        &mut self,
        mirror: Option<&mut ChatMirror>,
        client_seq: i64,
    ) -> ActionEnvelope {
        let id = self.id.clone();
        self.wait_for(mirror, |e| {
            e.origin
                .as_ref()
                .is_some_and(|o| o.client_id == id && o.client_seq == client_seq)
        })
        .await
    }
}

/// Page a chat's whole history into `mirror` with `fetchTurns`, following
/// `turnsNextCursor` until there is none; returns the number of pages.
pub async fn fetch_all_turns(c: &mut TestClient, mirror: &mut ChatMirror) -> usize {
    let mut pages = 0;
    while let Some(cursor) = mirror.state.turns_next_cursor.clone() {
        let before = mirror.state.turns.len();
        let _: Value = c
            .client
            .request(
                "fetchTurns",
                json!({"channel": mirror.uri, "cursor": cursor}),
            )
            .await
            .expect("fetchTurns");
        c.wait_state(mirror, |s| s.turns.len() > before).await;
        pages += 1;
        assert!(pages <= 1000, "paging terminates");
    }
    pages
}

/// A client-side copy of a chat, kept with the official reducer.
#[derive(Clone, Debug)]
pub struct ChatMirror {
    pub uri: String,
    pub state: ChatState,
    pub from_seq: u64,
}

impl ChatMirror {
    /// Apply an accepted envelope of this chat newer than the snapshot.
    pub fn apply(&mut self, env: &ActionEnvelope) {
        if env.channel == self.uri
            && env.rejection_reason.is_none()
            && env.server_seq > self.from_seq
        {
            apply_action_to_chat(&mut self.state, &env.action);
        }
    }
}

pub fn user_message(text: &str) -> Message {
    Message {
        text: text.into(),
        origin: MessageOrigin {
            kind: MessageKind::User,
        },
        attachments: None,
        model: None,
        agent: None,
        meta: None,
    }
}

pub fn turn_started(turn_id: &str, text: &str) -> StateAction {
    StateAction::ChatTurnStarted(ChatTurnStartedAction {
        turn_id: turn_id.into(),
        started_at: tandem::time::now_rfc3339(),
        message: user_message(text),
        queued_message_id: None,
        meta: None,
    })
}

/// Build any action from JSON (panics on a typo in the test).
/// A `chat/draftChanged` action carrying `text` as a user draft.
pub fn draft(text: &str) -> StateAction {
    action(
        json!({"type": "chat/draftChanged", "draft": {"text": text, "origin": {"kind": "user"}}}),
    )
}

pub fn action(v: Value) -> StateAction {
    let a: StateAction = serde_json::from_value(v.clone()).expect("valid action json");
    assert!(
        !matches!(a, StateAction::Unknown(_)),
        "action did not decode: {v}"
    );
    a
}

/// The request id of the (last) input request part in the active turn.
pub fn open_request_id(state: &ChatState) -> Option<String> {
    state
        .active_turn
        .as_ref()?
        .response_parts
        .iter()
        .rev()
        .find_map(|p| match p {
            ahp_types::state::ResponsePart::InputRequest(i) if i.response.is_none() => {
                Some(i.request.id.clone())
            }
            _ => None,
        })
}

/// All markdown text of the last finished turn.
pub fn last_turn_markdown(state: &ChatState) -> Vec<String> {
    state
        .turns
        .last()
        .map(|t| {
            t.response_parts
                .iter()
                .filter_map(|p| match p {
                    ahp_types::state::ResponsePart::Markdown(m) => Some(m.content.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Fetch a fresh snapshot of a chat over a new connection.
pub async fn fresh_chat(server: &TestServer, chat: &str) -> ChatState {
    let c = server
        .client(&format!("fresh-{}", uuid::Uuid::new_v4()))
        .await;
    let m = c.subscribe_chat(chat).await;
    c.client.shutdown().await;
    m.state
}

/// The real `tandem` binary as a child process (for crash tests).
pub struct ServerProcess {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Start `tandem serve` on a free loopback port with `data_dir`; stderr
    /// goes to `<data_dir>/../<name>.log` for post-mortems.
    pub fn spawn(data_dir: &std::path::Path, extra: &[&str]) -> Self {
        let mut args = vec!["--data-dir", data_dir.to_str().expect("utf-8 dir")];
        args.extend_from_slice(extra);
        Self::spawn_with(&data_dir.with_extension("log"), &args)
    }

    /// Start `tandem serve` on a free loopback port with `args`, its stderr
    /// in `log`.
    pub fn spawn_with(log: &std::path::Path, args: &[&str]) -> Self {
        Self::spawn_with_env(log, args, &[])
    }

    /// [`Self::spawn_with`] with environment variables set for the server.
    pub fn spawn_with_env(log: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        let log = std::fs::File::create(log).expect("log file");
        // `TANDEM_TEST_BIN` runs the tests against another build (e.g. the
        // release binary) of the same version.
        let bin = std::env::var("TANDEM_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tandem").to_owned());
        let mut child = std::process::Command::new(bin)
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn tandem");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        let addr = line
            .trim()
            .rsplit("://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Self { child, addr }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/ahp", self.addr)
    }

    /// The server's process id (to read its memory from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn client(&self, client_id: &str) -> TestClient {
        // The process printed its address once it listened: a connection
        // queues until it serves.
        let transport = ahp_ws::WebSocketTransport::connect(&self.url())
            .await
            .unwrap_or_else(|e| panic!("server at {} refused the connection: {e}", self.addr));
        let client = Client::connect(transport, client_config())
            .await
            .expect("client");
        TestClient::initialized(client, client_id).await
    }

    /// Wait for the process to exit on its own.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        // A thread waits for the exit without reaping it (`WNOWAIT`), so
        // the process is still this `Child`'s to collect.
        let pid = self.child.id() as libc::id_t;
        let (exited, exit) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: `info` is a valid out-parameter for `waitid`.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            loop {
                // SAFETY: waits on our own child; WNOWAIT leaves it unreaped.
                let r = unsafe {
                    libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT)
                };
                let interrupted =
                    std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
                if r == 0 || !interrupted {
                    break;
                }
            }
            let _ = exited.send(());
        });
        exit.recv_timeout(within).ok()?;
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL: no shutdown, no flush, no goodbye.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process's resident memory in KiB. Panics when it cannot be read (no
/// `/proc`, the process is gone, no `VmRSS` line): a memory check that
/// cannot measure must fail, not pass comparing zeros.
pub fn rss_kib(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot measure memory: reading {path}: {e}"));
    let kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("cannot measure memory: no VmRSS in {path}"));
    assert!(kib > 0, "cannot measure memory: {path} says VmRSS is 0");
    kib
}

/// A fresh directory under the system temp dir, removed when the test is
/// done with it; kept (and named on stderr) when the test fails, for its
/// logs and stores.
pub fn temp_dir(tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("tandem-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d).expect("temp dir");
    Scratch(d)
}

/// A test's scratch directory (see [`temp_dir`]).
pub struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::PathBuf;
    fn deref(&self) -> &std::path::PathBuf {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The ACP test agent (`examples/acp_test_agent.rs`): `ACP_TEST_AGENT_BIN`
/// when set, else the example next to the `tandem` binary
/// (`target/<profile>/examples/`), which `cargo test --workspace` builds.
/// A filtered run (`cargo test --test e2e`) builds no examples: missing,
/// the test fails at once saying how to build it.
pub fn agent_bin() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("ACP_TEST_AGENT_BIN") {
        return bin.into();
    }
    let tandem = std::path::Path::new(env!("CARGO_BIN_EXE_tandem"));
    let dir = tandem.parent().expect("the tandem binary has a directory");
    let bin = dir.join("examples").join("acp_test_agent");
    assert!(
        bin.is_file(),
        "the ACP test agent {} is not built: run `cargo build --example acp_test_agent` \
         (or scripts/test, which builds it), or set ACP_TEST_AGENT_BIN",
        bin.display()
    );
    bin
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as PEM
/// files in `dir`; the certificate's DER for the clients to trust.
pub fn test_certificate(dir: &std::path::Path) -> (tandem::config::TlsFiles, Vec<u8>) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let files = tandem::config::TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&files.cert, cert.cert.pem()).expect("cert.pem");
    std::fs::write(&files.key, cert.signing_key.serialize_pem()).expect("key.pem");
    (files, cert.cert.der().to_vec())
}
