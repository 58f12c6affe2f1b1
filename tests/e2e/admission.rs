//! Connection admission under a storm: many upgrades at once against the
//! connection limits never admit more than the limit (a slot is reserved
//! atomically before the handshake, not counted after it).

use crate::common;

use common::{wait_connections, TestServer};
use tandem::{Config, Limits};

/// Upgrades attempted at once in each round. (Against a check-then-insert
/// cap, 30 rounds of 200 on 8 HTTP workers admitted one too many within
/// a dozen rounds on a 2-core machine.)
const STORM: usize = 200;

/// Open `STORM` WebSockets at once and keep those that were admitted.
async fn storm(url: &str) -> Vec<impl Sized> {
    let attempts = (0..STORM).map(|_| {
        let url = url.to_owned();
        tokio::spawn(async move { tokio_tungstenite::connect_async(url).await })
    });
    let mut admitted = Vec::new();
    for attempt in futures_util::future::join_all(attempts).await {
        match attempt.expect("the attempt ran") {
            Ok((socket, _)) => admitted.push(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                assert!(
                    status == 503 || status == 429,
                    "refused with {status}, not a limit"
                );
            }
            Err(e) => panic!("upgrade failed: {e}"),
        }
    }
    admitted
}

/// `rounds` storms (each starting with no connection open) each admit
/// exactly `cap` upgrades.
async fn storms_admit_exactly(limits: Limits, cap: usize, rounds: usize) {
    let server = TestServer::start_with(Config {
        limits,
        http_workers: 8,
        ..Config::default()
    })
    .await;
    let url = format!("ws://{}/ahp", server.addr);
    for round in 0..rounds {
        let admitted = storm(&url).await;
        assert_eq!(
            admitted.len(),
            cap,
            "round {round}: {} of {STORM} simultaneous upgrades admitted, the limit is {cap}",
            admitted.len()
        );
        drop(admitted);
        wait_connections(server.addr, 0).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_upgrades_never_pass_the_connection_limit() {
    let limits = Limits {
        max_connections: 3,
        max_connections_per_token: 1000,
        ..Limits::default()
    };
    storms_admit_exactly(limits, 3, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_upgrades_never_pass_the_per_token_limit() {
    // Without a secret every connection is the same local principal.
    let limits = Limits {
        max_connections: 1000,
        max_connections_per_token: 3,
        ..Limits::default()
    };
    storms_admit_exactly(limits, 3, 8).await;
}
