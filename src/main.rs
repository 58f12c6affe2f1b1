//! `tandem` — parse the command line and run the server.

use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use tandem::Config;

/// jemalloc rather than the C library's allocator: frames are allocated on
/// one thread (a chat's) and freed on others; measured with 1,000 chats × 10
/// subscribers, the server used 15–20 % less CPU with the same tail latency
/// and idle memory (README, dependency table).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: a background thread gives freed memory back to the
/// system on its decay schedule even when the server then goes quiet
/// (without it, memory freed by disposing every session stayed resident
/// until the next burst of allocations). `_RJEM_MALLOC_CONF` overrides.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true\0";

/// jemalloc's figures for `/healthz` (refreshed on each read).
fn jemalloc_stats() -> Option<tandem::memory::AllocatorStats> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    Some(tandem::memory::AllocatorStats {
        allocated: tikv_jemalloc_ctl::stats::allocated::read().ok()? as u64,
        resident: tikv_jemalloc_ctl::stats::resident::read().ok()? as u64,
    })
}

/// Return the calling thread's cached blocks to its arena
/// (`thread.tcache.flush`).
fn jemalloc_flush_thread() {
    // SAFETY: a void mallctl takes no old or new value; the name is
    // NUL-terminated.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// Purge every arena's unused pages (`arena.<MALLCTL_ARENAS_ALL>.purge`).
fn jemalloc_release() {
    // SAFETY: a void mallctl takes no old or new value; the name is
    // NUL-terminated.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "jemalloc did not purge");
    }
}

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
    Serve(Box<ServeArgs>),
    /// Mint a bearer token signed with the server's secret.
    Token(TokenArgs),
}

#[derive(clap::Args, Clone)]
struct SecretArgs {
    /// File holding the HS256 secret for bearer tokens: its bytes as they
    /// are (binary is fine) minus trailing whitespace, at least 32 bytes.
    /// Otherwise read from `TANDEM_AUTH_SECRET` (UTF-8, same rules). A set
    /// but unusable secret is an error. Without a secret the server accepts
    /// unauthenticated connections and only listens on loopback.
    #[arg(long)]
    auth_secret_file: Option<std::path::PathBuf>,
}

impl SecretArgs {
    fn secret(&self) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(tandem::auth::load_secret(
            self.auth_secret_file.as_deref(),
            std::env::var_os(tandem::auth::SECRET_ENV),
        )?)
    }
}

#[derive(clap::Args, Clone)]
struct TokenArgs {
    #[command(flatten)]
    secret: SecretArgs,
    /// Who the token is for.
    #[arg(long)]
    subject: String,
    /// client, agent or admin.
    #[arg(long, value_enum, default_value = "client")]
    role: tandem::auth::Role,
    /// Limit the token to these session URIs (repeatable); default: any.
    #[arg(long = "session")]
    sessions: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    ttl_secs: u64,
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    #[command(flatten)]
    secret: SecretArgs,
    /// A web origin (`scheme://host[:port]`) besides the server's own whose
    /// pages may open /ahp: another front end, or a reverse proxy's or
    /// tunnel's public name. Repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Address to listen on.
    #[arg(long, env = "TANDEM_BIND", default_value = "127.0.0.1:7420")]
    bind: SocketAddr,
    /// Directory of the SQLite store (created if missing).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "./tandem-data")]
    data_dir: std::path::PathBuf,
    /// Keep everything in memory instead (nothing survives a restart).
    #[arg(long, conflicts_with = "data_dir")]
    in_memory: bool,
    /// Run as a cluster node: keep the journal in NATS JetStream at these
    /// servers (`nats://HOST:PORT[,…]`) instead of SQLite. Needs `--node-id`.
    #[arg(long, env = "TANDEM_CLUSTER", value_name = "URLS", requires = "node_id", conflicts_with_all = ["data_dir", "in_memory"])]
    cluster: Option<String>,
    /// This node's name in the cluster (letters, digits, `-`, `_`).
    #[arg(long, env = "TANDEM_NODE_ID", value_name = "NAME")]
    node_id: Option<String>,
    /// Seconds a channel lease lasts without renewal (renewed three times
    /// per period): how long a dead node's channels stay unwritable.
    #[arg(long, default_value_t = 10.0)]
    lease_secs: f64,
    /// `full`: every commit survives power loss (synchronous=FULL).
    /// `relaxed`: survives a process crash, not power loss (synchronous=NORMAL).
    #[arg(long, value_enum, default_value = "full")]
    durability: tandem::store::Durability,
    /// Milliseconds a group commit may wait for more writes when they arrive
    /// in a steady stream (many quiet rooms): fewer fsyncs per action, at most
    /// this much on a durable echo. A lone write, or a writer already behind,
    /// commits at once. 0 never waits.
    #[arg(long, default_value_t = Config::default().commit_window.as_secs_f64() * 1000.0)]
    commit_window_ms: f64,
    /// Envelopes kept in memory for `reconnect` replay.
    #[arg(long, default_value_t = Config::default().replay_ring_len)]
    replay_ring_len: usize,
    /// Bytes of envelopes kept in memory for `reconnect` replay.
    #[arg(long, default_value_t = Config::default().replay_ring_bytes)]
    replay_ring_bytes: usize,
    /// Largest reconnect replay sent as is; bigger gaps get snapshots.
    #[arg(long, default_value_t = Config::default().max_replay_bytes)]
    max_replay_bytes: usize,
    /// Unsent bytes a connection may queue before it is evicted.
    #[arg(long, default_value_t = Config::default().outbound_limit_bytes)]
    outbound_limit_bytes: usize,
    /// Least milliseconds between two socket writes of pushed frames on one
    /// connection: under a heavy stream frames share writes. Replies, pongs
    /// and closes never wait. 0 writes every frame at once.
    #[arg(long, default_value_t = Config::default().write_pacing.as_secs_f64() * 1000.0)]
    write_pacing_ms: f64,
    /// Threads that accept connections, read clients' frames, run the
    /// connection actors and the sessions clients create [default: one per
    /// core].
    #[arg(long)]
    http_workers: Option<usize>,
    /// Threads the sessions restored at start-up or followed from another
    /// node are spread over [default: one per core].
    #[arg(long)]
    actor_threads: Option<usize>,
    /// Open connections on the server.
    #[arg(long, default_value_t = tandem::Limits::default().max_connections)]
    max_connections: usize,
    /// Open connections per token subject.
    #[arg(long, default_value_t = tandem::Limits::default().max_connections_per_token)]
    max_connections_per_token: usize,
    /// Channels one connection may subscribe to.
    #[arg(long, default_value_t = tandem::Limits::default().max_subscriptions_per_connection)]
    max_subscriptions_per_connection: usize,
    /// Sustained dispatches per second per connection (burst: twice that).
    #[arg(long, default_value_t = tandem::Limits::default().dispatches_per_sec)]
    dispatches_per_sec: f64,
    /// Questions in one input request.
    #[arg(long, default_value_t = tandem::Limits::default().max_questions_per_request)]
    max_questions_per_request: usize,
    /// Characters in one text answer.
    #[arg(long, default_value_t = tandem::Limits::default().max_answer_chars)]
    max_answer_chars: usize,
    /// Sessions one token subject may create.
    #[arg(long, default_value_t = tandem::Limits::default().max_sessions_per_token)]
    max_sessions_per_token: usize,
    /// Chats in one session.
    #[arg(long, default_value_t = tandem::Limits::default().max_chats_per_session)]
    max_chats_per_session: usize,
    /// Bytes of a client-chosen session or chat URI.
    #[arg(long, default_value_t = tandem::Limits::default().max_uri_bytes)]
    max_uri_bytes: usize,
    /// Bytes of a `clientId`.
    #[arg(long, default_value_t = tandem::Limits::default().max_client_id_bytes)]
    max_client_id_bytes: usize,
    /// Characters of a session title or a provider's display name.
    #[arg(long, default_value_t = tandem::Limits::default().max_title_chars)]
    max_title_chars: usize,
    /// Characters of a provider's description.
    #[arg(long, default_value_t = tandem::Limits::default().max_description_chars)]
    max_description_chars: usize,
    /// Providers one token subject may register.
    #[arg(long, default_value_t = tandem::Limits::default().max_providers_per_subject)]
    max_providers_per_subject: usize,
    /// Bytes of one `dispatchAction` message.
    #[arg(long, default_value_t = tandem::Limits::default().max_action_bytes)]
    max_action_bytes: usize,
    /// Sustained bytes per second of actions per connection (burst: four
    /// times that).
    #[arg(long, default_value_t = tandem::Limits::default().dispatch_bytes_per_sec)]
    dispatch_bytes_per_sec: f64,
    /// Bytes per second the server reads from one principal (a token
    /// subject; without auth, a connection); past it, reading pauses.
    #[arg(long, default_value_t = tandem::Limits::default().inbound_bytes_per_sec)]
    inbound_bytes_per_sec: f64,
    /// Requests per second (other than dispatches and pings) handled for
    /// one principal; past it, handling waits.
    #[arg(long, default_value_t = tandem::Limits::default().requests_per_sec)]
    requests_per_sec: f64,
    /// `tandem/requestInteraction` calls one connection may have waiting.
    #[arg(long, default_value_t = tandem::Limits::default().max_open_interactions_per_connection)]
    max_open_interactions_per_connection: usize,
    /// Largest accepted WebSocket frame, in bytes.
    #[arg(long, default_value_t = Config::default().max_frame_bytes)]
    max_frame_bytes: usize,
    /// An ACP agent sessions can be created with: `NAME=COMMAND ARG…` (the
    /// command line split like a shell would). Repeatable; NAME is the
    /// provider id.
    #[arg(long = "agent", value_name = "NAME=COMMAND ARG…")]
    agents: Vec<String>,
    /// Let agent NAME read the files under DIR (ACP `fs/read_text_file`).
    /// Repeatable. No agent touches the host's files otherwise.
    #[arg(long = "agent-files", value_name = "NAME=DIR")]
    agent_files: Vec<String>,
    /// Let agent NAME read and write the files under DIR.
    #[arg(long = "agent-files-rw", value_name = "NAME=DIR")]
    agent_files_rw: Vec<String>,
    /// A TOML config file: ACP agents as `[[agents]]` tables (`name`,
    /// `display_name`, `command`, `args`, `env`, `cwd`, `start_timeout_secs`,
    /// `idle_timeout_secs`, `files`, `files_write`) and a `[cluster]` table
    /// (`urls`, `node_id`, `lease_secs`).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
}

impl ServeArgs {
    /// The cluster to join: `--cluster` (with `--node-id`, `--lease-secs`),
    /// else the config file's `[cluster]` table (`--node-id` still wins).
    fn cluster(&self) -> anyhow::Result<Option<tandem::store::ClusterConfig>> {
        use tandem::config::agents::ConfigFile;
        if let Some(urls) = &self.cluster {
            let mut c =
                tandem::store::ClusterConfig::parse(urls, self.node_id.as_deref().unwrap_or(""))
                    .map_err(anyhow::Error::msg)?;
            c.lease = std::time::Duration::from_secs_f64(self.lease_secs.max(1.0));
            return Ok(Some(c));
        }
        let Some(path) = &self.config else {
            return Ok(None);
        };
        match ConfigFile::load(path).map_err(anyhow::Error::msg)?.cluster {
            Some(t) => Ok(Some(
                t.config(self.node_id.as_deref())
                    .map_err(anyhow::Error::msg)?,
            )),
            None => Ok(None),
        }
    }

    /// The declared agents: the config file's, then the flags'.
    fn agents(&self) -> anyhow::Result<Vec<tandem::config::AgentSpec>> {
        use tandem::config::agents::{merge, ConfigFile};
        let file = match &self.config {
            Some(path) => ConfigFile::load(path).map_err(anyhow::Error::msg)?.agents,
            None => Vec::new(),
        };
        let flags = self
            .agents
            .iter()
            .map(|f| tandem::config::AgentSpec::parse_flag(f))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        let mut agents = merge(file, flags, &[tandem::providers::scripted::PROVIDER_ID])
            .map_err(anyhow::Error::msg)?;
        for (grants, write) in [(&self.agent_files, false), (&self.agent_files_rw, true)] {
            for g in grants {
                tandem::config::AgentSpec::grant_files(&mut agents, g, write)
                    .map_err(anyhow::Error::msg)?;
            }
        }
        Ok(agents)
    }
}

fn main() {
    tandem::memory::install(tandem::memory::Allocator {
        stats: jemalloc_stats,
        release: jemalloc_release,
        flush_thread: jemalloc_flush_thread,
    });
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
        Some(Command::Serve(a)) => *a,
        Some(Command::Token(t)) => return mint(t),
        None => cli.serve,
    };
    let secret = args.secret.secret()?;
    let cluster = args.cluster()?;
    let defaults = Config::default();
    let config = Config {
        limits: tandem::Limits {
            max_connections: args.max_connections,
            max_connections_per_token: args.max_connections_per_token,
            max_subscriptions_per_connection: args.max_subscriptions_per_connection,
            dispatches_per_sec: args.dispatches_per_sec,
            dispatch_burst: args.dispatches_per_sec * 2.0,
            max_questions_per_request: args.max_questions_per_request,
            max_answer_chars: args.max_answer_chars,
            max_sessions_per_token: args.max_sessions_per_token,
            max_chats_per_session: args.max_chats_per_session,
            max_uri_bytes: args.max_uri_bytes,
            max_client_id_bytes: args.max_client_id_bytes,
            max_title_chars: args.max_title_chars,
            max_description_chars: args.max_description_chars,
            max_providers_per_subject: args.max_providers_per_subject,
            max_action_bytes: args.max_action_bytes,
            dispatch_bytes_per_sec: args.dispatch_bytes_per_sec,
            dispatch_bytes_burst: args.dispatch_bytes_per_sec * 4.0,
            max_open_interactions_per_connection: args.max_open_interactions_per_connection,
            inbound_bytes_per_sec: args.inbound_bytes_per_sec,
            requests_per_sec: args.requests_per_sec,
        },
        auth_secret: secret,
        allowed_origins: args.allowed_origins.clone(),
        data_dir: (!args.in_memory && cluster.is_none()).then(|| args.data_dir.clone()),
        durability: args.durability,
        commit_window: std::time::Duration::from_secs_f64(args.commit_window_ms.max(0.0) / 1000.0),
        replay_ring_len: args.replay_ring_len,
        replay_ring_bytes: args.replay_ring_bytes,
        max_replay_bytes: args.max_replay_bytes,
        outbound_limit_bytes: args.outbound_limit_bytes,
        write_pacing: std::time::Duration::from_secs_f64(args.write_pacing_ms.max(0.0) / 1000.0),
        max_frame_bytes: args.max_frame_bytes,
        agents: args.agents()?,
        cluster,
        http_workers: args.http_workers.unwrap_or(defaults.http_workers).max(1),
        actor_threads: args.actor_threads.unwrap_or(defaults.actor_threads).max(1),
        ..defaults
    };
    // The same checks `run` makes, before a store is opened or a port bound.
    tandem::server::check_config(&config, args.bind)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let journal: std::sync::Arc<dyn tandem::store::Journal> =
        match (&config.cluster, &config.data_dir) {
            (Some(cluster), _) => std::sync::Arc::new(
                rt.block_on(tandem::store::JetStreamJournal::connect(cluster))
                    .map_err(|e| anyhow::anyhow!("joining the cluster: {e}"))?,
            ),
            (None, Some(dir)) => std::sync::Arc::new(
                tandem::store::SqliteJournal::open_with_window(
                    dir,
                    config.durability,
                    config.commit_window,
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            ),
            (None, None) => std::sync::Arc::new(tandem::store::MemoryJournal::new()),
        };
    let listener = tandem::server::bind(args.bind)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.bind))?;
    let addr = listener.local_addr()?;
    match (&config.cluster, &config.data_dir) {
        (Some(c), _) => {
            tracing::info!(%addr, node = %c.node_id, nats = %c.urls.join(","), "tandem cluster node starting; AHP at /ahp")
        }
        (None, Some(dir)) => {
            tracing::info!(%addr, data_dir = %dir.display(), durability = ?config.durability, "tandem starting; AHP at /ahp")
        }
        (None, None) => tracing::info!(%addr, "tandem starting in memory; AHP at /ahp"),
    }
    // One plain line on stdout so scripts and tests can find the port.
    println!("tandem listening on http://{addr}");
    if config.auth_secret.is_none() {
        tracing::warn!("no auth secret: accepting unauthenticated connections (loopback only)");
    }
    rt.block_on(tandem::server::run_with_journal(
        listener,
        config,
        journal,
        async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                        return;
                    }
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        },
    ))
}

fn mint(t: TokenArgs) -> anyhow::Result<()> {
    let secret = t.secret.secret()?.ok_or_else(|| {
        anyhow::anyhow!("no secret: set --auth-secret-file or TANDEM_AUTH_SECRET")
    })?;
    let auth = tandem::auth::Authenticator::new(&secret)?;
    let claims = tandem::auth::Claims {
        sub: t.subject,
        role: t.role,
        exp: tandem::auth::now_secs() + t.ttl_secs,
        sessions: (!t.sessions.is_empty()).then_some(t.sessions),
    };
    println!(
        "{}",
        auth.mint(&claims).map_err(|e| anyhow::anyhow!("{e}"))?
    );
    Ok(())
}
