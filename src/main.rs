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

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
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
        replay_ring_len: args.replay_ring_len,
        max_replay_bytes: args.max_replay_bytes,
        outbound_limit_bytes: args.outbound_limit_bytes,
        max_frame_bytes: args.max_frame_bytes,
        ..Config::default()
    };
    let listener = std::net::TcpListener::bind(args.bind)?;
    tracing::info!(addr = %listener.local_addr()?, "tandem listening; AHP at /ahp");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(tandem::run(listener, config, async {
        let _ = tokio::signal::ctrl_c().await;
    }))
}
