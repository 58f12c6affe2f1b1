mod common;
use common::*;
use serde_json::json;
use std::time::Instant;
use tandem::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let w: usize = std::env::var("W").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let ping: bool = std::env::var("P").is_ok();
    let n: usize = 4000;
    let server = TestServer::start_with(Config { outbound_limit_bytes: 64*1024, ..Config::default() }).await;
    let driver = server.client("driver").await;
    let (_s, chat) = driver.create_session().await;
    let mut fast = server.client("fast").await;
    let _m = fast.subscribe_chat(&chat).await;
    let filler = "x".repeat(1000);
    let t = Instant::now();
    let mut seen = 0;
    for i in 0..n {
        while seen + w < i {
            fast.next_envelope().await;
            seen += 1;
            if ping && seen % 4 == 0 { let c = fast.client.clone(); tokio::spawn(async move { let _ = c.ping().await; }); }
        }
        driver.dispatch(&chat, action(json!({"type":"chat/draftChanged","draft":{"text": format!("{i} {filler}"),"origin":{"kind":"user"}}}))).await;
    }
    eprintln!("sent in {:?}", t.elapsed());
}
