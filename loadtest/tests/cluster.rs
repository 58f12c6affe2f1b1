//! The `cluster` scenario's `spread` shape at a tiny size against real
//! servers: one spawned Tandem on SQLite, then three spawned Tandem nodes
//! on a `nats-server -js` the scenario starts. Needs the `tandem` binary
//! (`cargo test --workspace` builds it; `TANDEM_BIN` names another) and
//! nats-server (`scripts/test` installs it).

use std::path::PathBuf;

use serde_json::Value;
use tandem_loadtest::scenarios::cluster::{self, ClusterArgs, ShapeName, Targets};
use tandem_loadtest::server::ServerOpts;

/// `TANDEM_BIN` when set, else what the load generator finds next to this
/// test (`target/<profile>/tandem`) or in `target/release`. Missing, the
/// test fails at once saying how to build it.
fn tandem_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TANDEM_BIN") {
        return bin.into();
    }
    tandem_loadtest::server::tandem_bin(&ServerOpts::default()).unwrap_or_else(|e| {
        panic!("{e:#}: run `cargo build --bin tandem` (or scripts/test), or set TANDEM_BIN")
    })
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap_or_else(|| panic!("not a figure: {v}")))
        .collect()
}

/// Six chats × two subscribers, one round: chat i lives on node i mod 3.
/// The report has CPU per delivery of both targets, their ratio and each
/// idle node's share, and every subscriber got every action (the figures
/// themselves depend on the server and are not checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_reports_cpu_per_delivery_ratio_and_idle_shares_with_every_delivery() {
    tandem_loadtest::progress::set_quiet(true);
    tandem_loadtest::nats::nats_server_bin()
        .unwrap_or_else(|e| panic!("{e:#} (scripts/test installs it)"));
    let opts = ServerOpts {
        server_bin: Some(tandem_bin()),
        store: "memory".into(),
        source_ips: 1,
        ..ServerOpts::default()
    };
    let args = ClusterArgs {
        nodes: 3,
        rounds: 1,
        targets: Targets::Both,
        shapes: vec![ShapeName::Spread],
        chats: 6,
        chat_subscribers: 2,
        chat_rate: 20.0,
        fanout_subscribers: 0,
        fanout_rate: 1.0,
        draft_writers: 0,
        draft_subscribers: 0,
        draft_rate: 1.0,
        questions: 1,
        seconds: 1.0,
        max_seconds: 1.0,
        no_max: false,
        window: 8,
        warmup: 0.2,
        drain: 10.0,
        publish_node: 0,
        lease_secs: 10.0,
        connect_concurrency: 8,
    };
    let r = cluster::run(&args, &opts).await.expect("cluster runs");
    assert!(!r.failed, "notes: {:#?}", r.notes);
    let get = |k: &str| {
        r.extra
            .get(&format!("spread6x2.{k}"))
            .cloned()
            .unwrap_or_else(|| panic!("no spread6x2.{k} in {:?}", r.extra.keys()))
    };
    let cpu = get("cpu_per_delivery_us");
    assert_eq!(numbers(&cpu["single"]).len(), 1, "{cpu}");
    assert_eq!(numbers(&cpu["cluster"]).len(), 1, "{cpu}");
    assert_eq!(numbers(&get("cluster_over_single")).len(), 1);
    let share = get("idle_node_share");
    for node in ["node1", "node2"] {
        assert_eq!(numbers(&share[node]).len(), 1, "{share}");
    }
    assert!(share.get("node0").is_none(), "{share}");
    let rounds = get("rounds");
    let row = &rounds[0];
    // 20/s for 1 s: 20 actions per chat, each to both its subscribers; in
    // the idle phase only node 0's chats (0 and 3) get traffic.
    for (what, want) in [
        ("single", 6 * 20 * 2),
        ("cluster", 6 * 20 * 2),
        ("idle", 2 * 20 * 2),
    ] {
        assert_eq!(row[&format!("{what}_expected")], want, "{what}: {row}");
        assert_eq!(
            row[&format!("{what}_delivered")],
            row[&format!("{what}_expected")],
            "{what}: {row}"
        );
    }
    assert_eq!(numbers(&row["idle_node_cores"]).len(), 3, "{row}");
    let names: Vec<&str> = r.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // The nodes' logs; kept when an assertion above failed.
    tandem_loadtest::server::remove_scratch();
}
