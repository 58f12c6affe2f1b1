//! The web client (issue 6): the embedded files are served at `/`, and the
//! browser test (`web/tests/browser.test.mjs`) passes in real headless
//! Chromium against a server on 127.0.0.1:0.
//!
//! What the browser tests need beyond Rust — Debian's `chromium`, Node.js,
//! and `playwright-core` in `web/tests/node_modules` — is installed by
//! `scripts/test`; a test that finds one missing fails at once naming it.
//! Only loopback traffic: the pages load from the test server and speak
//! AHP to its `/ahp`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The Chromium the page tests drive: `CHROMIUM`, or Debian's.
fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn works(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fail at once, naming what is missing, unless Chromium, Node.js and
/// playwright-core are all there.
fn require_browser_tools(web_tests: &Path) {
    let mut missing = Vec::new();
    let chromium = chromium();
    if !Path::new(&chromium).exists() {
        missing.push(format!("chromium ({chromium}; CHROMIUM names another)"));
    }
    if !works("node") {
        missing.push("node (Node.js)".to_owned());
    }
    if !web_tests
        .join("node_modules/playwright-core/package.json")
        .exists()
    {
        missing.push(format!(
            "playwright-core in {}",
            web_tests.join("node_modules").display()
        ));
    }
    assert!(
        missing.is_empty(),
        "the browser tests need {}: run scripts/test, which installs them",
        missing.join(", ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_is_served_from_the_binary() {
    let server = TestServer::start().await;
    let (status, headers, body) = http(server.addr, "GET", "/").await;
    assert_eq!(status, "http/1.1 200 ok");
    assert!(
        headers.contains("content-type: text/html; charset=utf-8"),
        "{headers}"
    );
    let html = String::from_utf8(body).expect("utf-8");
    assert!(html.contains(r#"<script type="module" src="/app.js">"#));
    assert_eq!(
        html.as_bytes(),
        std::fs::read(repo().join("web/index.html")).expect("index.html")
    );

    for (path, ct) in [
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/ahp.js", "text/javascript; charset=utf-8"),
        ("/reducers.js", "text/javascript; charset=utf-8"),
        ("/style.css", "text/css; charset=utf-8"),
        ("/admin.js", "text/javascript; charset=utf-8"),
        ("/people.js", "text/javascript; charset=utf-8"),
        ("/invites.js", "text/javascript; charset=utf-8"),
        ("/activity.js", "text/javascript; charset=utf-8"),
        ("/presence.js", "text/javascript; charset=utf-8"),
        ("/notify.js", "text/javascript; charset=utf-8"),
        ("/waiting.js", "text/javascript; charset=utf-8"),
        ("/sw.js", "text/javascript; charset=utf-8"),
        ("/favicon.svg", "image/svg+xml"),
    ] {
        let (status, headers, body) = http(server.addr, "GET", path).await;
        assert_eq!(status, "http/1.1 200 ok", "{path}");
        assert!(
            headers.contains(&format!("content-type: {ct}")),
            "{path}: {headers}"
        );
        assert!(
            headers.contains("cache-control: no-cache"),
            "{path}: {headers}"
        );
        let file = std::fs::read(repo().join("web").join(&path[1..])).expect("file");
        assert_eq!(body, file, "{path} is the file in web/");
    }
    let (status, _, body) = http(server.addr, "HEAD", "/style.css").await;
    assert_eq!(status, "http/1.1 200 ok");
    assert!(body.is_empty());
    let (status, _, _) = http(server.addr, "GET", "/nope.js").await;
    assert_eq!(status, "http/1.1 404 not found");
    // The neighbours are untouched.
    let (status, _, body) = http(server.addr, "GET", "/healthz").await;
    assert_eq!(status, "http/1.1 200 ok");
    assert!(String::from_utf8_lossy(&body).contains("serverSeq"));
    server.stop().await;
}

/// Where the page tests write their screenshots by default.
fn screenshots_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshots directory");
    dir
}

/// Check what the page tests need, then run `file` (under `web/tests/`)
/// with Node and `env`; it must pass `passes` tests within `limit`.
async fn run_page_tests(file: &str, env: &[(&str, String)], passes: usize, limit: Duration) {
    let web_tests = repo().join("web/tests");
    require_browser_tools(&web_tests);
    let mut node = tokio::process::Command::new("node");
    node.args([
        "--test",
        "--test-reporter=spec",
        &format!("web/tests/{file}"),
    ])
    .current_dir(repo())
    .env("CHROMIUM", chromium())
    // Screenshots go under the target directory: a test run leaves the
    // checkout as it found it. `TANDEM_SCREENSHOTS=docs/screenshots`
    // refreshes the committed ones.
    .env(
        "TANDEM_SCREENSHOTS",
        std::env::var_os("TANDEM_SCREENSHOTS")
            .unwrap_or_else(|| screenshots_dir().into_os_string()),
    )
    .envs(env.iter().map(|(k, v)| (k, v)))
    .kill_on_drop(true);
    // What node says goes to files, so a run that does not finish still
    // tells how far it got.
    let logs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-tests");
    std::fs::create_dir_all(&logs).expect("the page tests' log directory");
    let (out_path, err_path) = (
        logs.join(format!("{file}.{}.out", std::process::id())),
        logs.join(format!("{file}.{}.err", std::process::id())),
    );
    node.stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let mut child = node.spawn().expect("run node");
    let finished = tokio::time::timeout(limit, child.wait()).await;
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    println!("{stdout}\n{stderr}");
    let status = match finished {
        Ok(status) => status.expect("wait for node"),
        Err(_) => {
            let _ = child.kill().await;
            panic!("{file} did not finish within {limit:?}; so far:\n{stdout}\n{stderr}");
        }
    };
    assert!(
        status.success(),
        "{file} failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("pass {passes}")) && stdout.contains("fail 0"),
        "all {passes} tests of {file} ran:\n{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_works_in_headless_chromium() {
    // The test ACP agent sits behind the server, for the bridge's page test.
    let agent =
        tandem::config::AgentSpec::new("acp-test", agent_bin().to_string_lossy(), Vec::new());
    let server = TestServer::start_with(tandem::Config {
        agents: vec![agent],
        ..tandem::Config::default()
    })
    .await;
    let url = format!("http://{}/", server.addr);
    run_page_tests(
        "browser.test.mjs",
        &[("TANDEM_URL", url)],
        6,
        Duration::from_secs(180),
    )
    .await;
    server.stop().await;
}

/// The web client over TLS (`--tls-cert`, `--tls-key`): the page loads over
/// `https://` and speaks AHP over `wss://` (`web/tests/tls.test.mjs`), with a
/// certificate made here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_works_over_https_and_wss() {
    let scratch = temp_dir("browser-tls");
    let (files, _) = test_certificate(&scratch);
    let server = TestServer::start_with(tandem::Config {
        tls: Some(files),
        ..tandem::Config::default()
    })
    .await;
    let url = format!("https://localhost:{}/", server.addr.port());
    run_page_tests(
        "tls.test.mjs",
        &[("TANDEM_URL", url)],
        1,
        Duration::from_secs(120),
    )
    .await;
    server.stop().await;
}

/// The admin view (`#/admin`, `web/tests/admin.test.mjs`) against a server
/// with auth: an admin token sees the connections, the waiting session and
/// the metrics; a client token is refused. Writes `admin-view.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_view_shows_the_server_to_an_admin_only() {
    use tandem::auth::{now_secs, Authenticator, Claims, Role};
    let secret = b"admin-view-test-secret-0123456789abcdef";
    let server = TestServer::start_with(tandem::Config {
        auth_secret: Some(secret.to_vec()),
        ..tandem::Config::default()
    })
    .await;
    let auth = Authenticator::new(secret).expect("key");
    let mint = |sub: &str, role| {
        auth.mint(&Claims {
            sub: sub.into(),
            role,
            exp: now_secs() + 600,
            sessions: None,
            ..Default::default()
        })
        .expect("mint")
    };
    let env = [
        ("TANDEM_URL", format!("http://{}/", server.addr)),
        ("ADMIN_TOKEN", mint("ops", Role::Admin)),
        ("CLIENT_TOKEN", mint("ann", Role::Client)),
    ];
    run_page_tests("admin.test.mjs", &env, 1, Duration::from_secs(120)).await;
    server.stop().await;
}

/// People in the web client (`web/tests/people.test.mjs`): against a
/// server with auth, Ann (an owner of the session, by her token's `access`
/// claim), Vic (a viewer of it, by his) and Pat (a participant, the
/// server's default) open the same chat; Vic's page shows the tool approval
/// and the form without their buttons and says why, Pat's the approval
/// without its buttons, Ann approves and answers, and every page shows
/// "Approved by Ann" and "Answered by Ann" and her name on her message.
/// Against a server without auth, a person picks a name that their
/// messages, their caret and a reloaded page keep. Writes `people.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_shows_who_did_what_and_offers_what_a_role_may_do() {
    use tandem::auth::{now_secs, Authenticator, Claims, Role};
    use tandem::people::Access;
    let secret = b"people-web-test-secret-0123456789abcdef";
    let server = TestServer::start_with(tandem::Config {
        auth_secret: Some(secret.to_vec()),
        ..tandem::Config::default()
    })
    .await;
    let open = TestServer::start().await;
    // The session's URI is chosen here, so the tokens can name it.
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let auth = Authenticator::new(secret).expect("key");
    let mint = |sub: &str, name: &str, access: Option<Access>| {
        auth.mint(&Claims {
            sub: sub.into(),
            role: Role::Client,
            exp: now_secs() + 600,
            name: Some(name.into()),
            access: access.map(|a| [(session.clone(), a)].into()),
            ..Default::default()
        })
        .expect("mint")
    };
    let env = [
        ("TANDEM_URL", format!("http://{}/", server.addr)),
        ("TANDEM_OPEN_URL", format!("http://{}/", open.addr)),
        ("SESSION", session.clone()),
        ("ANN_TOKEN", mint("ann", "Ann", Some(Access::Owner))),
        ("VIC_TOKEN", mint("vic", "Vic", Some(Access::Viewer))),
        // No claim for the session: the server's default, a participant.
        ("PAT_TOKEN", mint("pat", "Pat", None)),
    ];
    run_page_tests("people.test.mjs", &env, 2, Duration::from_secs(150)).await;
    server.stop().await;
    open.stop().await;
}

/// Invite links in the web client (`web/tests/invites.test.mjs`): against a
/// server with auth, Ann (an owner of the session, by her token) makes a
/// viewer link for 60 s in the Share dialog; Gus opens it in another
/// browser, picks his name and watches the chat (a viewer's closed
/// composer) while Ann's page shows him here; Ann revokes the link and
/// Gus's page says "This invite link was revoked" within 5 s and neither
/// reconnects nor gets in on a reload. Ann's Activity panel lists who made,
/// used and revoked the link. A one-second link, once listed as expired,
/// is refused when opened, and a link revoked while a guest types their
/// name refuses them on joining. Writes `invite.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_invites_by_link_and_revokes() {
    use tandem::auth::{now_secs, Authenticator, Claims, Role};
    use tandem::people::Access;
    let secret = b"invite-web-test-secret-0123456789abcdef";
    let server = TestServer::start_with(tandem::Config {
        auth_secret: Some(secret.to_vec()),
        ..tandem::Config::default()
    })
    .await;
    let session = format!("ahp-session:/{}", uuid::Uuid::new_v4());
    let auth = Authenticator::new(secret).expect("key");
    let ann = auth
        .mint(&Claims {
            sub: "ann".into(),
            role: Role::Client,
            exp: now_secs() + 600,
            name: Some("Ann".into()),
            access: Some([(session.clone(), Access::Owner)].into()),
            ..Default::default()
        })
        .expect("mint");
    let env = [
        ("TANDEM_URL", format!("http://{}/", server.addr)),
        ("SESSION", session),
        ("ANN_TOKEN", ann),
    ];
    run_page_tests("invites.test.mjs", &env, 2, Duration::from_secs(150)).await;
    server.stop().await;
}

/// The browser's operations (`web/coedit.js`) agree with the server's
/// (`tandem::coedit`) on many random edits: the same results applied,
/// transformed, composed, carets moved, and a diff that rebuilds its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browsers_text_operations_agree_with_the_servers() {
    use tandem::coedit::TextOp;
    let web_tests = repo().join("web/tests");
    require_browser_tools(&web_tests);
    // A small fixed generator: the same cases every run.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    let alphabet = ['a', 'b', 'é', '😀', ' '];
    let text_of = |next: &mut dyn FnMut(usize) -> usize| -> String {
        (0..next(12))
            .map(|_| alphabet[next(alphabet.len())])
            .collect()
    };
    let op_on = |text: &str, next: &mut dyn FnMut(usize) -> usize| -> TextOp {
        let chars: Vec<char> = text.chars().collect();
        let mut op = TextOp::new();
        let mut k = 0;
        while k < chars.len() {
            let n = (next(3) + 1).min(chars.len() - k);
            let units: usize = chars[k..k + n].iter().map(|c| c.len_utf16()).sum();
            match next(4) {
                0 => {
                    op.delete(units);
                }
                1 => {
                    op.insert_str(["x", "y😁"][next(2)]);
                    continue;
                }
                _ => {
                    op.retain(units);
                }
            }
            k += n;
        }
        if next(2) == 0 {
            op.insert_str("z");
        }
        op
    };
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for _ in 0..400 {
        let text = text_of(&mut next);
        let other = text_of(&mut next);
        let a = op_on(&text, &mut next);
        let b = op_on(&text, &mut next);
        let after_a = a.apply_str(&text).expect("a applies");
        let c = op_on(&after_a, &mut next);
        let units = text.encode_utf16().count();
        let carets: Vec<usize> = (0..=units).collect();
        let (a2, b2) = TextOp::transform(&a, &b).expect("transform");
        expected.push(serde_json::json!({
            "applied": after_a,
            "transformed": [a2, b2],
            "converged": true,
            "composed": a.compose(&c).expect("compose"),
            "carets": carets.iter().map(|i| [a.transform_index(*i, false), a.transform_index(*i, true)]).collect::<Vec<_>>(),
            "diffed": true,
        }));
        cases.push(serde_json::json!({"text": text, "other": other, "a": a, "b": b, "c": c, "carets": carets}));
    }
    let scratch = temp_dir("coedit-agree");
    let file = scratch.join("cases.json");
    std::fs::write(&file, serde_json::to_vec(&cases).expect("json")).expect("write cases");
    let out = tokio::process::Command::new("node")
        .arg("web/tests/coedit-agree.mjs")
        .arg(&file)
        .current_dir(repo())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run node");
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("node's json");
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "case {i}: {}", cases[i]);
    }
}

/// Notifications in the web client (`web/tests/notify.test.mjs`), against a
/// server with auth and Web Push on, and a short quiet delay: the service
/// worker registers and is active at the root; "Notify me" goes as far as
/// headless Chromium allows (its off-the-record profile refuses every push
/// subscription) and says so; the worker shows a request pushed through
/// DevTools and closes it on its end; the choice "only tool approvals"
/// outlives a reload. With a stand-in `PushManager` whose endpoint the test
/// serves, the page turns Web Push on, says `focused: false` when hidden
/// and `true` when shown (a shared field's target kept), and the server's
/// push of a question asked while hidden, decrypted by the test, is shown
/// by the worker and closed by the push of its end. "Waiting on you" lists
/// a question and a tool approval in two sessions, oldest first, for Ann
/// (an owner) and only the question for Pat (a participant); the tab's
/// title and icon carry the count and lose it once both are answered from
/// the list's links. What Chromium cannot do here (a real push service, a
/// click on a notification) is in the test file's header. Writes
/// `waiting.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_client_notifies_and_lists_what_waits_on_you() {
    use tandem::auth::{now_secs, Authenticator, Claims, Role};
    let secret = b"notify-web-test-secret-0123456789abcdef";
    let server = TestServer::start_with(tandem::Config {
        auth_secret: Some(secret.to_vec()),
        notify: tandem::notify::NotifyConfig {
            quiet_delay: Duration::from_millis(300),
            ..tandem::notify::NotifyConfig::default()
        },
        ..tandem::Config::default()
    })
    .await;
    let auth = Authenticator::new(secret).expect("key");
    let mint = |sub: &str, name: &str| {
        auth.mint(&Claims {
            sub: sub.into(),
            role: Role::Client,
            exp: now_secs() + 600,
            name: Some(name.into()),
            ..Default::default()
        })
        .expect("mint")
    };
    let env = [
        ("TANDEM_URL", format!("http://{}/", server.addr)),
        ("ANN_TOKEN", mint("ann", "Ann")),
        // No claim for the sessions: the server's default, a participant.
        ("PAT_TOKEN", mint("pat", "Pat")),
    ];
    run_page_tests("notify.test.mjs", &env, 3, Duration::from_secs(180)).await;
    server.stop().await;
}
