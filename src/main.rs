//! `tandem` — parse the command line and run the server.

use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use tandem::Config;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "An Agent Host Protocol 1.0 server: many clients, one shared agent session"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve AHP over WebSocket (the default).
    Serve(ServeArgs),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TANDEM_BIND", default_value = "127.0.0.1:7420")]
    bind: SocketAddr,
    /// Directory of the SQLite store (created if missing).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "./tandem-data")]
    data_dir: std::path::PathBuf,
    /// Keep everything in memory instead (nothing survives a restart).
    #[arg(long, conflicts_with = "data_dir")]
    in_memory: bool,
    /// `full`: every commit survives power loss (synchronous=FULL).
    /// `relaxed`: survives a process crash, not power loss (synchronous=NORMAL).
    #[arg(long, value_enum, default_value = "full")]
    durability: tandem::store::Durability,
    /// Envelopes kept in memory for `reconnect` replay.
    #[arg(long, default_value_t = Config::default().replay_ring_len)]
    replay_ring_len: usize,
    /// Largest reconnect replay sent as is; bigger gaps get snapshots.
    #[arg(long, default_value_t = Config::default().max_replay_bytes)]
    max_replay_bytes: usize,
    /// Unsent bytes a connection may queue before it is evicted.
    #[arg(long, default_value_t = Config::default().outbound_limit_bytes)]
    outbound_limit_bytes: usize,
    /// Largest accepted WebSocket frame, in bytes.
    #[arg(long, default_value_t = Config::default().max_frame_bytes)]
    max_frame_bytes: usize,
}

fn main() {
    if let Err(e) = serve() {
        eprintln!("tandem: {e:#}");
        std::process::exit(1);
    }
}

fn serve() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,actix_server=warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(a)) => a,
        None => cli.serve,
    };
    let config = Config {
        data_dir: (!args.in_memory).then(|| args.data_dir.clone()),
        durability: args.durability,
        replay_ring_len: args.replay_ring_len,
        max_replay_bytes: args.max_replay_bytes,
        outbound_limit_bytes: args.outbound_limit_bytes,
        max_frame_bytes: args.max_frame_bytes,
        ..Config::default()
    };
    let journal: std::sync::Arc<dyn tandem::store::Journal> = match &config.data_dir {
        Some(dir) => std::sync::Arc::new(
            tandem::store::SqliteJournal::open(dir, config.durability)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        None => std::sync::Arc::new(tandem::store::MemoryJournal::new()),
    };
    let listener = std::net::TcpListener::bind(args.bind)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.bind))?;
    let addr = listener.local_addr()?;
    match &config.data_dir {
        Some(dir) => {
            tracing::info!(%addr, data_dir = %dir.display(), durability = ?config.durability, "tandem starting; AHP at /ahp")
        }
        None => tracing::info!(%addr, "tandem starting in memory; AHP at /ahp"),
    }
    // One plain line on stdout so scripts and tests can find the port.
    println!("tandem listening on http://{addr}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(tandem::server::run_with_journal(
        listener,
        config,
        journal,
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    ))
}
