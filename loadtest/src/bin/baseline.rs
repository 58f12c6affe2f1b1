//! `baseline` — the minimal broadcast server on its own (the same as
//! `loadtest baseline`): `baseline [--bind ADDR] [--seconds N]`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "baseline",
    about = "Minimal tokio + tungstenite AHP broadcast server (fan-out yardstick)"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7421")]
    bind: String,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tandem_loadtest::baseline::run_standalone(&cli.bind, cli.seconds)
}
