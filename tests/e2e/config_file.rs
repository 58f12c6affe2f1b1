//! The config file end to end: `tandem config check` says what a file
//! configures (or why it cannot be used, exit 1), and a server started
//! with `--config` takes the file's keys, an environment variable winning
//! over the file.

use crate::common;

use std::process::Command;

use common::*;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

fn check(file: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["config", "check"])
        .arg(file)
        .env_remove("TANDEM_AUTH_SECRET")
        .output()
        .expect("run tandem config check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_check_says_what_a_file_configures_or_why_not() {
    let dir = temp_dir("config-check");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "bind = \"127.0.0.1:7599\"\nin_memory = true\nmax_connections = 500\n\n[[agents]]\nname = \"gem\"\ncommand = \"gemini\"\n",
    )
    .expect("write");
    let (code, out, err) = check(&good);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("valid (listens on 127.0.0.1:7599, in memory, 1 agent(s) declared)"),
        "{out}"
    );

    for (text, says) in [
        ("in_memory = true\nmax_conections = 5\n", "line 2: unknown key `max_conections`; did you mean `max_connections`?"),
        ("max_connections = \"lots\"\n", "line 1: `max_connections`: invalid value 'lots'"),
        ("bind = \"0.0.0.0:7599\"\nin_memory = true\n", "refusing to serve on 0.0.0.0:7599 without authentication"),
        ("in_memory = true\ntls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"\n", "TLS certificate `/nonexistent/cert.pem`"),
    ] {
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, text).expect("write");
        let (code, _, err) = check(&bad);
        assert_eq!(code, Some(1), "{text}: {err}");
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_takes_the_files_keys_and_its_environment_wins() {
    let dir = temp_dir("config-serve");
    let file = dir.join("tandem.toml");
    // The file asks for text logs and a 64 KiB frame limit; the environment
    // asks for JSON logs.
    std::fs::write(
        &file,
        "in_memory = true\nlog_format = \"text\"\nmax_frame_bytes = 65536\n",
    )
    .expect("write");
    let log = dir.join("server.log");
    let mut server = ServerProcess::spawn_with_env(
        &log,
        &["--config", file.to_str().expect("utf-8")],
        &[("TANDEM_LOG_FORMAT", "json")],
    );

    // The file's frame limit holds.
    let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
        .await
        .expect("connect");
    let _ = ws
        .send(Message::text(format!(
            r#"{{"pad":"{}"}}"#,
            "x".repeat(100_000)
        )))
        .await;
    let mut code = None;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(WAIT, ws.next()).await {
        if let Message::Close(f) = m {
            code = f.map(|f| f.code);
            break;
        }
    }
    assert_eq!(code, Some(CloseCode::Size));
    server.kill();
    // The environment's log format won over the file's.
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.is_empty());
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"));
    }
}
