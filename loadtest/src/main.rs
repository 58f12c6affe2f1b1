//! `loadtest` — load scenarios against Tandem over real AHP/WebSocket.
//!
//! ```sh
//! cargo build --release --workspace
//! target/release/loadtest fanout --subscribers 1000 --json fanout.json --svg fanout.svg
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tandem_loadtest::report::{self, ScenarioResult};
use tandem_loadtest::scenarios::{
    agent_stream::{self, AgentStreamArgs},
    cluster::{self, ClusterArgs},
    coedit::{self, CoeditArgs},
    connections::{self, ConnectionsArgs},
    drafts::{self, DraftsArgs},
    durable::{self, DurableArgs},
    fanout::{self, FanoutArgs},
    hostile::{self, HostileArgs},
    reconnect::{self, ReconnectArgs},
    recovery::{self, RecoveryArgs},
};
use tandem_loadtest::server::ServerOpts;
use tandem_loadtest::{baseline, progress, sys};

#[derive(Parser)]
#[command(
    name = "loadtest",
    version,
    about = "Load generator for Tandem: real AHP over WebSocket, many connections per process",
    long_about = "Load generator for Tandem: real AHP over WebSocket, many connections per process.\n\n\
        Without --url each scenario spawns the release server (target/release/tandem, built with \
        `cargo build --release --workspace`) on a free loopback port and stops it afterwards. \
        Every run is bounded in time and stops by itself."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Write the results as JSON, one object per scenario per line.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Draw the latency distribution as SVG.
    #[arg(long, global = true)]
    svg: Option<PathBuf>,
    /// No progress bars or notes (the final table is still printed).
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Exit with status 2 when a target of the issue is missed.
    #[arg(long, global = true)]
    strict: bool,
    /// Worker threads of the load generator's runtime, and its subscribers'
    /// reading threads [default: cores].
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(flatten)]
    server: ServerOpts,
}

#[derive(Subcommand)]
enum Command {
    /// C chats × S subscribers, agents streaming actions: deliveries/s and
    /// latency to every / the last receiver, against Tandem and the baseline.
    Fanout(FanoutArgs),
    /// W writers edit answers of one open input request while S subscribers
    /// watch; every subscriber must converge to the server snapshot.
    Drafts(DraftsArgs),
    /// T typists type into one text answer at once (`tandem/editText`)
    /// while S subscribers watch: every keystroke kept, everyone agreeing,
    /// keystroke → every subscriber latency, CPU per delivery.
    Coedit(CoeditArgs),
    /// Many chats writing at once with a store: durable actions/s and echo
    /// latency.
    Durable(DurableArgs),
    /// Hold N idle initialized, subscribed connections: server RSS per
    /// connection.
    Connections(ConnectionsArgs),
    /// Drop N connections at once; time until all reconnected and caught up.
    ReconnectStorm(ReconnectArgs),
    /// Fill a store, restart the server, time until it serves again.
    Recovery(RecoveryArgs),
    /// S subscribers watch one turn whose agent streams N chunks: an ACP
    /// agent process behind the bridge, then the scripted agent; every
    /// delta to every subscriber once and in order, latency from the
    /// agent's send, CPU per delivery, and the ratios.
    AgentStream(AgentStreamArgs),
    /// Fan-out and drafts against one node on SQLite and against an N-node
    /// cluster on NATS JetStream (sessions owned by node 0, subscribers
    /// spread over the nodes), alternating: throughput, p99, p99 to the last
    /// receiver, CPU per delivery, the latency a cross-node hop adds, and
    /// the ratios.
    Cluster(ClusterArgs),
    /// Honest clients alone, then beside a hostile tenant (oversize
    /// strings, sockets that never read, a subscription flood): honest
    /// echo p99 in both phases and the ratio, server memory before and at
    /// its peak.
    Hostile(HostileArgs),
    /// Run the baseline broadcast server (what `fanout` compares against).
    Baseline {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7421")]
        bind: String,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
    },
}

async fn run_scenario(cmd: &Command, opts: &ServerOpts) -> anyhow::Result<ScenarioResult> {
    match cmd {
        Command::Fanout(a) => fanout::run(a, opts).await,
        Command::Drafts(a) => drafts::run(a, opts).await,
        Command::Coedit(a) => coedit::run(a, opts).await,
        Command::Durable(a) => durable::run(a, opts).await,
        Command::Connections(a) => connections::run(a, opts).await,
        Command::ReconnectStorm(a) => reconnect::run(a, opts).await,
        Command::Recovery(a) => recovery::run(a, opts).await,
        Command::AgentStream(a) => agent_stream::run(a, opts).await,
        Command::Cluster(a) => cluster::run(a, opts).await,
        Command::Hostile(a) => hostile::run(a, opts).await,
        Command::Baseline { .. } => unreachable!("handled before the runtime starts"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Baseline { bind, seconds } = &cli.command {
        return match baseline::run_standalone(bind, *seconds) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("baseline: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    progress::set_quiet(cli.quiet);
    tandem_loadtest::clock::now_ns();
    let nofile = sys::raise_nofile_limit();
    progress::note(format!("open-file limit: {nofile}"));
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.threads {
        rt.worker_threads(n.max(1));
        tandem_loadtest::readers::set_threads(n);
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run_scenario(&cli.command, &cli.server));
    drop(rt);
    let scratch = tandem_loadtest::server::scratch_dir();
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            eprintln!("loadtest: server logs kept in {}", scratch.display());
            return ExitCode::FAILURE;
        }
    };
    if r.failed {
        eprintln!("loadtest: server logs kept in {}", scratch.display());
    } else {
        tandem_loadtest::server::remove_scratch();
    }
    println!("{}", report::table(&r));
    let results = [r];
    if let Some(path) = &cli.json {
        if let Err(e) = report::write_json(path, &results) {
            eprintln!("loadtest: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        progress::note(format!("results written to {}", path.display()));
    }
    if let Some(path) = &cli.svg {
        if let Err(e) = std::fs::write(path, report::svg(&results)) {
            eprintln!("loadtest: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        progress::note(format!("latency plot written to {}", path.display()));
    }
    let r = &results[0];
    if r.failed {
        eprintln!("loadtest: a correctness check failed (see the table)");
        return ExitCode::from(1);
    }
    if cli.strict && r.targets.iter().any(|t| !t.met) {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
