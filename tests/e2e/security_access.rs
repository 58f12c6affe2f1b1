//! Who may reach a Tandem, and for how long: browser origins and hosts on
//! the upgrade, start-up refusals (library and binary), token expiry on an
//! open socket, and which links an agent may put in front of a person.

use crate::common;

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tandem::auth::{now_secs, Authenticator, Claims, Role};
use tandem::Config;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const SECRET: &[u8] = b"access-test-secret-0123456789abcdef";

fn token(sub: &str, exp: u64) -> String {
    Authenticator::new(SECRET)
        .expect("key")
        .mint(&Claims {
            sub: sub.into(),
            role: Role::Admin,
            exp,
            sessions: None,
            ..Default::default()
        })
        .expect("mint")
}

/// Upgrade `url` with extra headers: the HTTP status (101 when accepted)
/// and, when refused, the JSON body.
pub(crate) async fn upgrade(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = url.into_client_request().expect("request");
    for (name, value) in headers {
        let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
            .expect("header name");
        req.headers_mut()
            .insert(name, value.parse().expect("header value"));
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((mut ws, _)) => {
            let _ = ws.close(None).await;
            (101, Value::Null)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            (r.status().as_u16(), body)
        }
        Err(e) => panic!("unexpected {e}"),
    }
}

/// A refusal naming `why`, in the shape of every refused upgrade.
fn assert_refused(got: (u16, Value), why: &str, case: &str) {
    assert_eq!(got.0, 403, "{case}: {}", got.1);
    assert_eq!(got.1["error"]["code"], -32009, "{case}: {}", got.1);
    let msg = got.1["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(why), "{case}: {msg:?} should name {why:?}");
}

/// Item 1: a page from another origin, `Origin: null`, or a rebound name
/// cannot open `/ahp` on a loopback Tandem; its own page, other loopback
/// names, clients without `Origin` and allow-listed front ends can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_this_servers_own_pages_and_allowed_origins_may_upgrade() {
    let server = TestServer::start_with(Config {
        allowed_origins: vec!["https://ide.example.com".into()],
        ..Config::default()
    })
    .await;
    let url = server.url();
    let port = server.addr.port();
    let own = format!("http://127.0.0.1:{port}");
    let localhost = format!("http://localhost:{port}");
    let localhost_host = format!("localhost:{port}");
    let rebound = format!("http://evil.example:{port}");
    let rebound_host = format!("evil.example:{port}");

    assert_refused(
        upgrade(&url, &[("Origin", "https://evil.example")]).await,
        "cross-origin",
        "a foreign page",
    );
    assert_refused(
        upgrade(&url, &[("Origin", "null")]).await,
        "Origin: null",
        "an opaque origin",
    );
    assert_refused(
        upgrade(
            &url,
            &[
                ("Origin", rebound.as_str()),
                ("Host", rebound_host.as_str()),
            ],
        )
        .await,
        "DNS rebinding",
        "a rebound name",
    );
    assert_refused(
        upgrade(&url, &[("Origin", "http://127.0.0.1:1")]).await,
        "cross-origin",
        "another port",
    );

    assert_eq!(upgrade(&url, &[("Origin", own.as_str())]).await.0, 101);
    assert_eq!(
        upgrade(
            &url,
            &[
                ("Origin", localhost.as_str()),
                ("Host", localhost_host.as_str())
            ]
        )
        .await
        .0,
        101
    );
    assert_eq!(
        upgrade(&url, &[("Origin", "https://ide.example.com")])
            .await
            .0,
        101,
        "an allowed front end"
    );
    assert_eq!(upgrade(&url, &[]).await.0, 101, "no Origin: not a browser");
    assert_eq!(
        upgrade(&url, &[("Host", rebound_host.as_str())]).await.0,
        101,
        "a non-browser client may name any Host"
    );
    // The official client (no Origin) works as before.
    let c = server.client("plain").await;
    c.client.ping().await.expect("ping");
    server.stop().await;
}

/// Item 4: the library refuses, before serving, a secret that makes no key
/// and an unauthenticated server on a non-loopback address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_refuses_to_start_unsafely() {
    async fn start(bind: &str, config: Config) -> (anyhow::Result<()>, bool) {
        let listener = std::net::TcpListener::bind(bind).expect("bind");
        let served = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = served.clone();
        // Awaited only once the server serves.
        let shutdown = async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) };
        let result = tokio::time::timeout(WAIT, tandem::run(listener, config, shutdown))
            .await
            .expect("run returns");
        (result, served.load(std::sync::atomic::Ordering::SeqCst))
    }
    let (result, served) = start(
        "127.0.0.1:0",
        Config {
            auth_secret: Some(b"too-short-secret".to_vec()),
            ..Config::default()
        },
    )
    .await;
    let err = format!("{:#}", result.expect_err("a 16-byte secret is refused"));
    assert!(err.contains("at least 32 bytes"), "{err}");
    assert!(!served, "refused before serving");

    let (result, served) = start("0.0.0.0:0", Config::default()).await;
    let err = format!("{:#}", result.expect_err("no secret on 0.0.0.0"));
    assert!(err.contains("without authentication"), "{err}");
    assert!(!served, "refused before serving");

    let (result, served) = start(
        "127.0.0.1:0",
        Config {
            allowed_origins: vec!["ide.example.com".into()],
            ..Config::default()
        },
    )
    .await;
    let err = format!("{:#}", result.expect_err("an origin without a scheme"));
    assert!(err.contains("--allowed-origin `ide.example.com`"), "{err}");
    assert!(!served, "refused before serving");

    // A good secret on the same path serves.
    let (result, served) = start(
        "127.0.0.1:0",
        Config {
            auth_secret: Some(SECRET.to_vec()),
            ..Config::default()
        },
    )
    .await;
    result.expect("serves");
    assert!(served);
}

/// Item 5: a socket whose token expires is closed at that moment with code
/// 4401 and a reason; a connection with a live token is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_is_closed_when_its_token_expires() {
    let server = TestServer::start_with(Config {
        auth_secret: Some(SECRET.to_vec()),
        ..Config::default()
    })
    .await;
    let long = TestClient::connect(
        &format!("{}?token={}", server.url(), token("long", now_secs() + 600)),
        "long",
    )
    .await;
    let exp = now_secs() + 2;
    let mut req = server.url().into_client_request().expect("request");
    req.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", token("short", exp))
            .parse()
            .expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("a valid token is accepted");
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "short"}}).to_string(),
    ))
    .await
    .expect("send");
    let close = tokio::time::timeout(WAIT, async {
        while let Some(msg) = ws.next().await {
            if let Message::Close(frame) = msg.expect("frame") {
                return frame;
            }
        }
        None
    })
    .await
    .expect("closed within the wait")
    .expect("a close frame with a reason");
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert_eq!(close.code, CloseCode::from(4401));
    assert_eq!(
        close.reason.as_str(),
        "token expired: reconnect with a fresh token"
    );
    assert!(at >= exp as f64 - 0.05, "closed at {at}, before exp {exp}");
    assert!(
        at < exp as f64 + 5.0,
        "closed at {at}, long after exp {exp}"
    );
    long.client
        .ping()
        .await
        .expect("the live token's socket is open");
    // The expired token cannot come back.
    let again = format!("{}?token={}", server.url(), token("short", exp));
    assert_eq!(upgrade(&again, &[]).await.0, 401);
    server.stop().await;
}

/// `tandem serve` with `envs` and `args` (in memory, loopback): its exit
/// status and stderr once it exits, or `Err(first stdout line)` when it
/// started serving instead (it is then killed).
async fn serve_binary(
    envs: &[(&str, &std::ffi::OsStr)],
    args: &[&std::ffi::OsStr],
) -> Result<(std::process::ExitStatus, String), String> {
    use tokio::io::AsyncBufReadExt;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args(["serve", "--bind", "127.0.0.1:0", "--in-memory"])
        .args(args)
        .env_remove(tandem::auth::SECRET_ENV)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn tandem");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    let _ = tokio::time::timeout(WAIT, tokio::io::BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("the binary starts or exits in time");
    if !line.is_empty() {
        let _ = child.kill().await;
        return Err(line);
    }
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("exits in time")
        .expect("wait");
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A start of the binary with a bad secret: (what, environment, arguments,
/// the message it must exit with).
type SecretCase<'a> = (
    &'a str,
    Vec<(&'a str, &'a std::ffi::OsStr)>,
    Vec<&'a std::ffi::OsStr>,
    &'a str,
);

/// Item 6: a secret that is set but unusable stops the binary with a message
/// naming it; a secret is used byte for byte, trailing whitespace trimmed
/// alike from the variable and the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_secret_stops_the_binary_and_a_good_one_is_trimmed_alike() {
    use std::os::unix::ffi::OsStrExt;
    let dir = temp_dir("secrets");
    let binary_short = dir.join("six-bytes");
    std::fs::write(&binary_short, [0xff; 6]).expect("write");
    let cases: Vec<SecretCase> = vec![
        (
            "empty variable",
            vec![(tandem::auth::SECRET_ENV, std::ffi::OsStr::new(""))],
            vec![],
            "TANDEM_AUTH_SECRET is set but empty",
        ),
        (
            "non-UTF-8 variable",
            vec![(
                tandem::auth::SECRET_ENV,
                std::ffi::OsStr::from_bytes(&[0xff; 40]),
            )],
            vec![],
            "TANDEM_AUTH_SECRET is not valid UTF-8",
        ),
        (
            "31-byte variable",
            vec![(
                tandem::auth::SECRET_ENV,
                std::ffi::OsStr::new("0123456789012345678901234567890"),
            )],
            vec![],
            "holds 31 bytes; a secret must be at least 32 bytes",
        ),
        (
            "six binary bytes in a file",
            vec![],
            vec![
                std::ffi::OsStr::new("--auth-secret-file"),
                binary_short.as_os_str(),
            ],
            "holds 6 bytes; a secret must be at least 32 bytes",
        ),
    ];
    for (case, envs, args, message) in cases {
        match serve_binary(&envs, &args).await {
            Ok((status, stderr)) => {
                assert_eq!(status.code(), Some(1), "{case}: {stderr}");
                assert!(stderr.contains(message), "{case}: {stderr}");
            }
            Err(line) => panic!("{case}: the server started: {line}"),
        }
    }

    // An exported secret ending in a newline means the same key as the
    // file `echo` writes, and as the text itself.
    let text = std::str::from_utf8(SECRET).expect("text secret");
    let (status_line, child) = {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["serve", "--bind", "127.0.0.1:0", "--in-memory"])
            .env(tandem::auth::SECRET_ENV, format!("{text}\n"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn tandem");
        let mut line = String::new();
        tokio::time::timeout(
            WAIT,
            tokio::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line),
        )
        .await
        .expect("starts in time")
        .expect("read");
        (line, child)
    };
    let addr: SocketAddr = status_line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {status_line:?}"));
    let url = format!("ws://{addr}/ahp?token={}", token("t", now_secs() + 60));
    // The port listens from the start (requests wait in its backlog).
    let status = match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url.as_str()))
        .await
        .expect("answered in time")
    {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
        Err(e) => panic!("unexpected {e}"),
    };
    assert_eq!(status, 101, "a token minted with the trimmed secret works");
    drop(child);
    let _ = std::fs::remove_dir_all(dir);
}

/// A raw JSON-RPC connection (for the provider's side of the wire).
struct Raw {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
    /// Messages read while looking for another one, oldest first.
    unread: std::collections::VecDeque<Value>,
}

impl Raw {
    async fn connect(url: &str) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        Self {
            ws,
            next_id: 1,
            unread: Default::default(),
        }
    }

    /// The first message, read or unread, that satisfies `pred`; the others
    /// stay unread.
    async fn until(&mut self, mut pred: impl FnMut(&Value) -> bool) -> Value {
        if let Some(i) = self.unread.iter().position(&mut pred) {
            return self.unread.remove(i).expect("present");
        }
        tokio::time::timeout(WAIT, async {
            loop {
                let msg = self.ws.next().await.expect("open").expect("frame");
                if let Message::Text(t) = msg {
                    let v: Value = serde_json::from_str(&t).expect("JSON");
                    if pred(&v) {
                        return v;
                    }
                    self.unread.push_back(v);
                }
            }
        })
        .await
        .expect("the message came in time")
    }

    /// Send a request and return its whole response.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.ws
            .send(Message::text(
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
            ))
            .await
            .expect("send");
        self.until(|v| v["id"] == id).await
    }
}

/// Item 7: an agent's link that is not an absolute http(s) URL never reaches
/// a client — refused on `tandem/requestInteraction` (`-32602`), on a raw
/// `chat/inputRequested`, and for the in-process agent; http(s) links pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_must_be_absolute_http_urls() {
    let server = TestServer::start().await;
    let mut agent = Raw::connect(&server.url()).await;
    let init = agent
        .call(
            "initialize",
            json!({"channel": "ahp-root://", "protocolVersions": ["1.0.0"], "clientId": "agent-linker"}),
        )
        .await;
    assert!(init.get("result").is_some(), "{init}");
    let reg = agent
        .call(
            "tandem/registerProvider",
            json!({"channel": "ahp-root://", "provider": "linker", "displayName": "Linker"}),
        )
        .await;
    assert!(reg.get("error").is_none(), "{reg}");

    let mut person = server.client("person").await;
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let _: Value = person
        .client
        .request(
            "createSession",
            json!({"channel": session, "provider": "linker"}),
        )
        .await
        .expect("createSession");
    let chat = person
        .subscribe_session(&session)
        .await
        .default_chat
        .expect("default chat");
    let mut mirror = person.subscribe_chat(&chat).await;
    person.start_turn(&chat, "send me somewhere").await;
    let turn = agent.until(|v| v["method"] == "tandem/turn").await["params"]["turnId"]
        .as_str()
        .expect("turn id")
        .to_owned();

    for interaction in [
        json!({"kind": "url", "message": "Open this", "url": "javascript:alert(document.cookie)"}),
        json!({"kind": "url", "message": "Open this", "url": "/relative"}),
        json!({"kind": "input", "request": {"id": "r-data", "message": "Look", "url": "data:text/html,<script>alert(1)</script>"}}),
    ] {
        let r = agent
            .call(
                "tandem/requestInteraction",
                json!({"channel": chat, "turnId": turn, "interaction": interaction}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32602, "{interaction}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("must be an absolute http or https URL"),
            "{msg}"
        );
    }

    // A provider's own `chat/inputRequested` with a bad link is rejected;
    // one with an https link is accepted.
    let raw = |seq: u64, id: &str, url: &str| json!({"channel": chat, "clientSeq": seq, "action": {"type": "chat/inputRequested", "request": {"id": id, "message": "Open", "url": url}}});
    let echo_of = |seq: u64| {
        move |v: &Value| v["method"] == "action" && v["params"]["origin"]["clientSeq"] == seq
    };
    agent
        .call("dispatchAction", raw(1, "bad", "file:///etc/passwd"))
        .await;
    let echo = agent.until(echo_of(1)).await;
    let reason = echo["params"]["rejectionReason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("the scheme `file:` is not allowed"),
        "{echo}"
    );
    agent
        .call("dispatchAction", raw(2, "good", "https://example.com/docs"))
        .await;
    let echo = agent.until(echo_of(2)).await;
    assert!(
        echo["params"].get("rejectionReason").is_none(),
        "an https link is accepted: {echo}"
    );
    person
        .wait_state(&mut mirror, |s| {
            open_request_id(s).as_deref() == Some("good")
        })
        .await;

    // The in-process agent's request settles `aborted` with the rule.
    let (_s, scripted) = person.create_session().await;
    let mut m = person.subscribe_chat(&scripted).await;
    person
        .start_turn(
            &scripted,
            r#"/ask {"message": "go", "url": "javascript:alert(1)"}"#,
        )
        .await;
    person
        .wait_state(&mut m, |s| s.active_turn.is_none() && !s.turns.is_empty())
        .await;
    let report = last_turn_markdown(&m.state).join("\n");
    assert!(
        report.starts_with("settled: aborted")
            && report.contains("must be an absolute http or https URL"),
        "{report}"
    );
    assert!(
        open_request_id(&m.state).is_none(),
        "no link was offered to anyone"
    );
    server.stop().await;
}

/// The status line of a plain HTTP `GET path` (no upgrade) to `addr`.
async fn plain_get(addr: SocketAddr, path: &str, origin: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{origin}Connection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.expect("read");
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// Only `/ahp` is a WebSocket: an upgrade to another path is refused 404 in
/// the shape of every refusal, while `/ahp` upgrades; a plain `GET /ahp`
/// meets the same checks as an upgrade (a foreign page is refused first)
/// and is then refused as not a WebSocket request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_ahp_upgrades_and_a_plain_get_meets_the_same_checks() {
    let server = TestServer::start().await;
    let port = server.addr.port();
    let (status, body) = upgrade(&format!("ws://127.0.0.1:{port}/elsewhere"), &[]).await;
    assert_eq!(status, 404, "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("/ahp"), "{body}");
    assert_eq!(upgrade(&server.url(), &[]).await.0, 101);
    assert_eq!(plain_get(server.addr, "/ahp", None).await, 400);
    assert_eq!(
        plain_get(server.addr, "/ahp", Some("https://evil.example")).await,
        403
    );
    assert_eq!(plain_get(server.addr, "/healthz", None).await, 200);
}
