//! End-to-end smoke runs of the scenarios at tiny sizes against an
//! in-process Tandem (and baseline): the whole pipeline — connect,
//! publish, check, report — in a few seconds.

use tandem_loadtest::scenarios::agent_stream::{self, AgentStreamArgs, Agents};
use tandem_loadtest::scenarios::coedit::{self, CoeditArgs};
use tandem_loadtest::scenarios::drafts::{self, DraftsArgs};
use tandem_loadtest::scenarios::fanout::{self, Against, FanoutArgs, Peer, SessionsBy};
use tandem_loadtest::server::ServerOpts;

fn in_process() -> ServerOpts {
    ServerOpts {
        in_process: true,
        store: "memory".into(),
        source_ips: 1,
        ..ServerOpts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_measures_both_servers_without_loss() {
    tandem_loadtest::progress::set_quiet(true);
    let args = FanoutArgs {
        chats: 2,
        subscribers: 5,
        publishers: 2,
        rate: Some(100.0),
        rate_fraction: 0.5,
        seconds: 1.0,
        max_seconds: 1.0,
        window: 8,
        no_max: false,
        no_latency: false,
        warmup: 0.2,
        drain: 5.0,
        pad: 16,
        against: Some(Against::Both),
        peers: vec![Peer::Tokio],
        rounds: 1,
        peers_first: false,
        connect_concurrency: 8,
        sweep: vec![],
        sweep_p99_ms: 25.0,
        dispose: false,
        sessions_by: SessionsBy::Writer,
    };
    let r = fanout::run(&args, &in_process())
        .await
        .expect("fanout runs");
    assert!(!r.failed, "notes: {:?}", r.notes);
    assert_eq!(
        (r.lost, r.duplicated, r.reordered),
        (Some(0), Some(0), Some(0))
    );
    assert!(r.deliveries_per_sec.unwrap_or(0.0) > 0.0);
    assert!(r.baseline_deliveries_per_sec.unwrap_or(0.0) > 0.0);
    assert!(r.p99_ms.is_some() && r.extra.contains_key("last_p99_ms"));
    assert_eq!(r.extra["baseline_lost"], 0);
    assert!(tandem_loadtest::report::svg(&[r]).contains("<polyline"));
}

/// A sweep runs each server up the given rates and reports the highest rate
/// each held, and the ratio. With a p99 bound no step can miss, both hold
/// every step at the same scheduled rate: the ratio is about 1 and the
/// report says the sweep was too short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_sweep_reports_the_highest_rate_each_server_held() {
    tandem_loadtest::progress::set_quiet(true);
    let args = FanoutArgs {
        chats: 1,
        subscribers: 5,
        publishers: 1,
        rate: None,
        rate_fraction: 0.5,
        seconds: 0.6,
        max_seconds: 1.0,
        window: 8,
        no_max: false,
        no_latency: false,
        warmup: 0.1,
        drain: 5.0,
        pad: 0,
        against: Some(Against::Both),
        peers: vec![Peer::Tokio],
        rounds: 1,
        peers_first: false,
        connect_concurrency: 8,
        sweep: vec![20.0, 40.0],
        sweep_p99_ms: 10_000.0,
        dispose: false,
        sessions_by: SessionsBy::Setup,
    };
    let r = fanout::run(&args, &in_process())
        .await
        .expect("fanout runs");
    assert!(!r.failed, "notes: {:?}", r.notes);
    assert_eq!((r.lost, r.duplicated), (Some(0), Some(0)));
    let rows = r.extra["sweep"].as_array().expect("one row per round");
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    for side in ["tandem_steps", "peer_steps"] {
        let steps = row[side].as_array().unwrap();
        assert_eq!(steps.len(), 2, "{side}: every step held: {row}");
        assert!(steps.iter().all(|s| s["held"] == true));
    }
    let ratio = r.extra["sweep_ratio_median_vs_baseline"].as_f64().unwrap();
    assert!((0.8..1.25).contains(&ratio), "{ratio}");
    assert!(
        r.notes.iter().any(|n| n.contains("held every rate")),
        "{:?}",
        r.notes
    );
}

/// The Node.js peer (`loadtest/node/room.js`) answers the driver's frames and
/// delivers every action once and in order, side by side with Tandem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Node.js and npm (installs loadtest/node's packages when missing); run with --ignored"]
async fn fanout_against_the_node_peer_reports_ratios() {
    tandem_loadtest::progress::set_quiet(true);
    let args = FanoutArgs {
        chats: 1,
        subscribers: 5,
        publishers: 1,
        rate: Some(50.0),
        rate_fraction: 0.5,
        seconds: 1.0,
        max_seconds: 1.0,
        window: 8,
        no_max: true,
        no_latency: false,
        warmup: 0.2,
        drain: 5.0,
        pad: 0,
        against: Some(Against::Both),
        peers: vec![Peer::Node],
        rounds: 2,
        // Node first in each round: the rows still pair each round's two.
        peers_first: true,
        connect_concurrency: 8,
        sweep: vec![],
        sweep_p99_ms: 25.0,
        dispose: false,
        sessions_by: SessionsBy::Writer,
    };
    let r = fanout::run(&args, &in_process())
        .await
        .expect("fanout runs");
    assert!(!r.failed, "notes: {:?}", r.notes);
    assert_eq!(r.extra["node_lost"], 0);
    assert_eq!(r.extra["node_reordered"], 0);
    let rows = r.extra["vs_node"].as_array().expect("one row per round");
    assert_eq!(rows.len(), 2);
    assert!(rows[1]["p99_ms"]["ratio"].as_f64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_subscribers_converge_to_the_snapshot() {
    tandem_loadtest::progress::set_quiet(true);
    let args = DraftsArgs {
        writers: 3,
        subscribers: 4,
        questions: 2,
        rate: 20.0,
        seconds: 1.0,
        warmup: 0.2,
        drain: 5.0,
        connect_concurrency: 8,
    };
    let r = drafts::run(&args, &in_process())
        .await
        .expect("drafts runs");
    assert_eq!(r.converged, Some(true), "notes: {:?}", r.notes);
    assert_eq!(r.lost, Some(0));
    assert_eq!(r.extra["edits_rejected"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coedit_keeps_every_keystroke_and_everyone_agrees() {
    tandem_loadtest::progress::set_quiet(true);
    let args = CoeditArgs {
        typists: 4,
        subscribers: 5,
        rate: 30.0,
        seconds: 1.0,
        warmup: 0.2,
        drain: 5.0,
    };
    let r = coedit::run(&args, &in_process())
        .await
        .expect("coedit runs");
    assert_eq!(r.converged, Some(true), "notes: {:?}", r.notes);
    assert_eq!(r.extra["keystrokes"], 120);
    assert_eq!(r.extra["final_text_chars"], 120);
    assert_eq!(r.extra["keystrokes_missing"], 0);
    assert_eq!(r.extra["typists_out_of_order"], 0);
    assert_eq!(r.extra["edit_errors"], 0);
    assert!(!r.failed, "{:?}", r.targets);
}

/// The ACP test agent (`examples/acp_test_agent.rs` of the server crate):
/// `ACP_TEST_AGENT_BIN` when set, else the example `cargo test --workspace`
/// builds beside this test (`target/<profile>/examples/`). Missing, the test
/// fails at once saying how to build it.
fn acp_test_agent() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("ACP_TEST_AGENT_BIN") {
        return bin.into();
    }
    // This test runs from target/<profile>/deps.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bin = profile.join("examples").join("acp_test_agent");
    assert!(
        bin.is_file(),
        "the ACP test agent {} is not built: run `cargo build --example acp_test_agent` \
         (or scripts/test, which builds it), or set ACP_TEST_AGENT_BIN",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_stream_delivers_both_agents_chunks_to_every_subscriber() {
    tandem_loadtest::progress::set_quiet(true);
    let args = AgentStreamArgs {
        subscribers: 4,
        chunks: 40,
        interval_ms: 5,
        agents: Agents::Both,
        agent_bin: Some(acp_test_agent()),
        acp_provider: "loadtest-acp".into(),
        drain: 10.0,
        connect_concurrency: 4,
    };
    let r = agent_stream::run(&args, &in_process())
        .await
        .expect("agent-stream runs");
    assert!(!r.failed, "notes: {:?}", r.notes);
    assert_eq!(
        (r.lost, r.duplicated, r.reordered),
        (Some(0), Some(0), Some(0))
    );
    for k in ["acp", "scripted"] {
        assert_eq!(r.extra[&format!("{k}_deliveries")], 4 * 40, "{k}");
        assert_eq!(r.extra[&format!("{k}_snapshot_matches")], true, "{k}");
    }
    assert!(r.p99_ms.is_some() && r.extra.contains_key("acp_last_p99_ms"));
    assert!(r.extra.contains_key("ratio_spread_p99_acp_to_scripted"));
}
