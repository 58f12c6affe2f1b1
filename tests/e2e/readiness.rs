//! `/healthz` is liveness, `/readyz` readiness: `/readyz` answers 503 with
//! the reason while the store refuses writes (a SQLite database another
//! process holds locked, a cluster node without NATS) and 200 once it
//! takes them again, while `/healthz` answers 200 throughout.

use std::net::SocketAddr;

use serde_json::Value;

use crate::common::nats::{node, NatsServer};
use crate::common::{eventually, http, temp_dir, TestServer};

/// `/readyz`'s status code and document.
async fn readyz(addr: SocketAddr) -> (u16, Value) {
    let (status, _, body) = http(addr, "GET", "/readyz").await;
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status}"));
    let doc = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("/readyz JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (code, doc)
}

/// Wait until `/readyz` answers `code`; its document then.
async fn readyz_becomes(addr: SocketAddr, code: u16) -> Value {
    eventually(&format!("/readyz answers {code}"), || async move {
        let (got, doc) = readyz(addr).await;
        (got == code).then_some(doc)
    })
    .await
}

async fn healthz_status(addr: SocketAddr) -> String {
    http(addr, "GET", "/healthz").await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_sqlite_store_refuses_writes_and_200_after() {
    let dir = temp_dir("ready");
    let server = TestServer::start_with(tandem::Config {
        data_dir: Some(dir.to_path_buf()),
        ..tandem::Config::default()
    })
    .await;
    let doc = readyz_becomes(server.addr, 200).await;
    assert_eq!(doc["ready"], true, "{doc}");
    assert_eq!(doc["checks"]["store"], "ok", "{doc}");

    // Another process takes the database's write lock: every write of the
    // server waits for it, then fails.
    let lock = rusqlite::Connection::open(dir.join("tandem.db")).expect("open the store");
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let doc = readyz_becomes(server.addr, 503).await;
    assert_eq!(doc["ready"], false, "{doc}");
    let why = doc["checks"]["store"].as_str().expect("a reason");
    assert_ne!(why, "ok", "{doc}");
    assert!(
        doc["reasons"][0]
            .as_str()
            .is_some_and(|r| r.starts_with("store: ")),
        "{doc}"
    );
    assert_eq!(healthz_status(server.addr).await, "http/1.1 200 ok");

    lock.execute_batch("ROLLBACK").expect("let the lock go");
    let doc = readyz_becomes(server.addr, 200).await;
    assert_eq!(doc["checks"]["store"], "ok", "{doc}");
    assert_eq!(doc["reasons"], serde_json::json!([]), "{doc}");
    assert_eq!(healthz_status(server.addr).await, "http/1.1 200 ok");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_nats_is_stopped_and_200_after() {
    let mut nats = NatsServer::start();
    let dir = temp_dir("ready-cluster");
    let a = node(&dir, &nats, "a");
    let doc = readyz_becomes(a.addr, 200).await;
    assert_eq!(doc["checks"]["cluster"], "ok", "{doc}");
    assert_eq!(doc["checks"]["store"], "ok", "{doc}");

    nats.stop();
    let doc = readyz_becomes(a.addr, 503).await;
    let reasons = doc["reasons"].to_string();
    assert!(reasons.contains("NATS"), "{doc}");
    assert_eq!(healthz_status(a.addr).await, "http/1.1 200 ok");

    nats.restart();
    let doc = readyz_becomes(a.addr, 200).await;
    assert_eq!(doc["checks"]["cluster"], "ok", "{doc}");
    assert_eq!(healthz_status(a.addr).await, "http/1.1 200 ok");
}
