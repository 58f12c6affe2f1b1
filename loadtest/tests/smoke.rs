//! End-to-end smoke runs of the scenarios at tiny sizes against an
//! in-process Tandem (and baseline): the whole pipeline — connect,
//! publish, check, report — in a few seconds.

use tandem_loadtest::scenarios::drafts::{self, DraftsArgs};
use tandem_loadtest::scenarios::fanout::{self, Against, FanoutArgs};
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
        connect_concurrency: 8,
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
