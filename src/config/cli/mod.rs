//! The command line (`tandem serve`, `tandem token`, `tandem config
//! check`) and the config file (`--config FILE`, TOML).
//!
//! Every `serve` flag has a config-file key: its name with `_` for `-`
//! (`--max-connections` is `max_connections`; the repeatable flags take an
//! array: `allowed_origin` → `allowed_origins = […]`, `agent_files`,
//! `agent_files_rw`), besides the `[[agents]]` tables (what `--agent`
//! declares, with every option) and the `[cluster]` table. A flag given on
//! the command line, or its environment variable, wins over the file. The
//! file's values are checked by the same parsers as the flags', and an
//! unknown key or a value of the wrong kind is an error naming the key and
//! its line.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::agents::{merge, ConfigFile};
use super::{Config, Limits};

mod file_keys;

use file_keys::read_file;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "An Agent Host Protocol 1.0 server: many clients, one shared agent session"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve AHP over WebSocket (the default).
    Serve(Box<ServeArgs>),
    /// Mint a bearer token signed with the server's secret.
    Token(TokenArgs),
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Read what the store keeps of people's acts.
    #[command(subcommand)]
    Audit(AuditCommand),
}

/// `tandem audit …`.
#[derive(Subcommand)]
pub enum AuditCommand {
    /// Print a session's audit log as JSON lines, oldest first, from the
    /// store the server's flags name (`--data-dir`, or `--cluster` with
    /// `--node-id`; `--config` works too). Safe while the server runs.
    Export {
        /// The session's URI (`ahp-session:/…`).
        #[arg(long = "session", id = "audit_session", value_name = "URI")]
        session: String,
        /// Where the store is, as for `tandem serve`.
        #[command(flatten)]
        serve: Box<ServeArgs>,
    },
}

/// `tandem config …`.
#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Check a config file (every key known, every value valid, the
    /// server's start-up checks) without starting the server.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
}

#[derive(clap::Args, Clone)]
pub struct SecretArgs {
    /// File holding the HS256 secret for bearer tokens: its bytes as they
    /// are (binary is fine) minus trailing whitespace, at least 32 bytes.
    /// Otherwise read from `TANDEM_AUTH_SECRET` (UTF-8, same rules). A set
    /// but unusable secret is an error. Without a secret the server accepts
    /// unauthenticated connections and only listens on loopback.
    #[arg(long)]
    pub auth_secret_file: Option<std::path::PathBuf>,
}

impl SecretArgs {
    /// The secret, from the file or `TANDEM_AUTH_SECRET`.
    pub fn secret(&self) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(crate::auth::load_secret(
            self.auth_secret_file.as_deref(),
            std::env::var_os(crate::auth::SECRET_ENV),
        )?)
    }
}

#[derive(clap::Args, Clone)]
pub struct TokenArgs {
    #[command(flatten)]
    pub secret: SecretArgs,
    /// Who the token is for.
    #[arg(long)]
    pub subject: String,
    /// client, agent or admin.
    #[arg(long, value_enum, default_value = "client")]
    pub role: crate::auth::Role,
    /// Limit the token to these session URIs (repeatable); default: any.
    #[arg(long = "session")]
    pub sessions: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    pub ttl_secs: u64,
    /// The person's display name (default: the subject).
    #[arg(long)]
    pub name: Option<String>,
    /// The holder's role in a session, `SESSION=viewer|participant|approver|owner`
    /// (repeatable); a session's owner can still change it.
    #[arg(long = "access", value_name = "SESSION=LEVEL", value_parser = parse_access)]
    pub access: Vec<(String, crate::people::Access)>,
}

/// `SESSION=LEVEL` of `tandem token --access`.
fn parse_access(s: &str) -> Result<(String, crate::people::Access), String> {
    let (session, level) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("`{s}` is not SESSION=LEVEL"))?;
    let level = <crate::people::Access as clap::ValueEnum>::from_str(level, true)
        .map_err(|_| format!("`{level}` is not viewer, participant, approver or owner"))?;
    if !session.starts_with("ahp-session:/") {
        return Err(format!("`{session}` is not a session URI (ahp-session:/…)"));
    }
    Ok((session.to_owned(), level))
}

/// How log lines are written (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub secret: SecretArgs,
    /// A web origin (`scheme://host[:port]`) besides the server's own whose
    /// pages may open /ahp: another front end, or a reverse proxy's or
    /// tunnel's public name. Repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Address to listen on.
    #[arg(long, env = "TANDEM_BIND", default_value = "127.0.0.1:7420")]
    pub bind: SocketAddr,
    /// Directory of the SQLite store (created if missing).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "./tandem-data")]
    pub data_dir: std::path::PathBuf,
    /// Keep everything in memory instead (nothing survives a restart).
    #[arg(long, conflicts_with = "data_dir")]
    pub in_memory: bool,
    /// Run as a cluster node: keep the journal in NATS JetStream at these
    /// servers (`nats://HOST:PORT[,…]`) instead of SQLite. Needs `--node-id`.
    #[arg(long, env = "TANDEM_CLUSTER", value_name = "URLS", requires = "node_id", conflicts_with_all = ["data_dir", "in_memory"])]
    pub cluster: Option<String>,
    /// This node's name in the cluster (letters, digits, `-`, `_`).
    #[arg(long, env = "TANDEM_NODE_ID", value_name = "NAME")]
    pub node_id: Option<String>,
    /// NATS user name (with `--nats-password-file`).
    #[arg(long, value_name = "NAME")]
    pub nats_user: Option<String>,
    /// File holding the NATS user's password.
    #[arg(long, value_name = "FILE")]
    pub nats_password_file: Option<std::path::PathBuf>,
    /// File holding a NATS token.
    #[arg(long, value_name = "FILE")]
    pub nats_token_file: Option<std::path::PathBuf>,
    /// A NATS `.creds` file (user JWT and NKey seed).
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// File holding a NATS NKey seed.
    #[arg(long, value_name = "FILE")]
    pub nats_nkey_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) NATS's certificate must chain to; TLS required.
    #[arg(long, value_name = "FILE")]
    pub nats_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS with NATS (with `--nats-key`).
    #[arg(long, value_name = "FILE", requires = "nats_key")]
    pub nats_cert: Option<std::path::PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "nats_cert")]
    pub nats_key: Option<std::path::PathBuf>,
    /// Seconds a channel lease lasts without renewal (renewed three times
    /// per period): how long a dead node's channels stay unwritable.
    #[arg(long, default_value_t = 10.0)]
    pub lease_secs: f64,
    /// Seconds a cluster node keeps applying another node's chat after the
    /// last of its own connections watching it left; then it lets that
    /// chat's batches pass and reads the chat from the store when someone
    /// subscribes here again.
    #[arg(long, default_value_t = Config::default().follow_grace.as_secs_f64())]
    pub follow_grace_secs: f64,
    /// Copies NATS keeps of Tandem's stream and buckets (1–5; 3 on a
    /// three-server NATS cluster survives losing one), set when they are
    /// first made.
    #[arg(long, default_value_t = 1)]
    pub nats_replicas: usize,
    /// Seconds a cluster node that stops (SIGTERM) waits for the turns
    /// running in its sessions to end before it hands those sessions to
    /// the other nodes anyway (idle sessions are handed over at once).
    #[arg(long, default_value_t = Config::default().drain.as_secs_f64())]
    pub drain_secs: f64,
    /// Where a cluster node puts the sessions made through it: `spread`
    /// (there, unless it runs clearly more than the least loaded live node,
    /// which then takes them) or `local` (always there).
    #[arg(long, value_enum, default_value = "spread")]
    pub place_sessions: crate::config::Placement,
    /// `full`: every commit survives power loss (synchronous=FULL).
    /// `relaxed`: survives a process crash, not power loss (synchronous=NORMAL).
    #[arg(long, value_enum, default_value = "full")]
    pub durability: crate::store::Durability,
    /// Longest a group commit may wait, in milliseconds, for more writes when
    /// they arrive in a steady stream (many quiet rooms): it waits as long as
    /// the recent rate says a few more take, at most this; fewer fsyncs per
    /// action, at most this much on a durable echo. A lone write, a busy
    /// chat, or a writer already behind commits at once. 0 never waits.
    #[arg(long, default_value_t = Config::default().commit_window.as_secs_f64() * 1000.0)]
    pub commit_window_ms: f64,
    /// Envelopes kept in memory for `reconnect` replay.
    #[arg(long, default_value_t = Config::default().replay_ring_len)]
    pub replay_ring_len: usize,
    /// Bytes of envelopes kept in memory for `reconnect` replay.
    #[arg(long, default_value_t = Config::default().replay_ring_bytes)]
    pub replay_ring_bytes: usize,
    /// Largest reconnect replay sent as is; bigger gaps get snapshots.
    #[arg(long, default_value_t = Config::default().max_replay_bytes)]
    pub max_replay_bytes: usize,
    /// Unsent bytes a connection may queue before it is evicted.
    #[arg(long, default_value_t = Config::default().outbound_limit_bytes)]
    pub outbound_limit_bytes: usize,
    /// Least milliseconds between two socket writes of pushed frames on one
    /// connection: under a heavy stream frames share writes (twice this for
    /// a connection whose frames come faster than one per 1.8 times it).
    /// Replies, pongs and closes never wait. 0 writes every frame at once.
    #[arg(long, default_value_t = Config::default().write_pacing.as_secs_f64() * 1000.0)]
    pub write_pacing_ms: f64,
    /// Threads that accept connections, read clients' frames, run the
    /// connection actors and the sessions clients create [default: half the
    /// cores, rounded up].
    #[arg(long, value_parser = threads)]
    pub http_workers: Option<usize>,
    /// Threads the sessions restored at start-up or followed from another
    /// node are spread over [default: one per core].
    #[arg(long, value_parser = threads)]
    pub actor_threads: Option<usize>,
    /// Threads besides the publishing one that write shares of a big room
    /// (512 subscribers or more) at once; 0 writes every room from the
    /// publishing thread [default: one per core, less one].
    #[arg(long, value_parser = threads)]
    pub fanout_threads: Option<usize>,
    /// Write every connection of a room with a system call of its own
    /// instead of handing the kernel a batch of them in one io_uring
    /// submission (Linux; without io_uring the server does this anyway).
    #[arg(long)]
    pub no_io_uring: bool,
    /// Open connections on the server.
    #[arg(long, default_value_t = crate::Limits::default().max_connections)]
    pub max_connections: usize,
    /// Open connections per token subject.
    #[arg(long, default_value_t = crate::Limits::default().max_connections_per_token)]
    pub max_connections_per_token: usize,
    /// Channels one connection may subscribe to.
    #[arg(long, default_value_t = crate::Limits::default().max_subscriptions_per_connection)]
    pub max_subscriptions_per_connection: usize,
    /// Sustained dispatches per second per connection (burst: twice that).
    #[arg(long, default_value_t = crate::Limits::default().dispatches_per_sec)]
    pub dispatches_per_sec: f64,
    /// Questions in one input request.
    #[arg(long, default_value_t = crate::Limits::default().max_questions_per_request)]
    pub max_questions_per_request: usize,
    /// Characters in one text answer.
    #[arg(long, default_value_t = crate::Limits::default().max_answer_chars)]
    pub max_answer_chars: usize,
    /// Sessions one token subject may create.
    #[arg(long, default_value_t = crate::Limits::default().max_sessions_per_token)]
    pub max_sessions_per_token: usize,
    /// Chats in one session.
    #[arg(long, default_value_t = crate::Limits::default().max_chats_per_session)]
    pub max_chats_per_session: usize,
    /// Bytes of a client-chosen session or chat URI.
    #[arg(long, default_value_t = crate::Limits::default().max_uri_bytes)]
    pub max_uri_bytes: usize,
    /// Bytes of a `clientId`.
    #[arg(long, default_value_t = crate::Limits::default().max_client_id_bytes)]
    pub max_client_id_bytes: usize,
    /// Characters of a session title or a provider's display name.
    #[arg(long, default_value_t = crate::Limits::default().max_title_chars)]
    pub max_title_chars: usize,
    /// Characters of a provider's description.
    #[arg(long, default_value_t = crate::Limits::default().max_description_chars)]
    pub max_description_chars: usize,
    /// Providers one token subject may register.
    #[arg(long, default_value_t = crate::Limits::default().max_providers_per_subject)]
    pub max_providers_per_subject: usize,
    /// Bytes of one `dispatchAction` message.
    #[arg(long, default_value_t = crate::Limits::default().max_action_bytes)]
    pub max_action_bytes: usize,
    /// Sustained bytes per second of actions per principal (burst: four
    /// times that).
    #[arg(long, default_value_t = crate::Limits::default().dispatch_bytes_per_sec)]
    pub dispatch_bytes_per_sec: f64,
    /// Bytes per second the server reads from one principal (a token
    /// subject; without auth, a connection); past it, reading pauses.
    #[arg(long, default_value_t = crate::Limits::default().inbound_bytes_per_sec)]
    pub inbound_bytes_per_sec: f64,
    /// Requests per second (other than dispatches and pings) handled for
    /// one principal; past it, handling waits.
    #[arg(long, default_value_t = crate::Limits::default().requests_per_sec)]
    pub requests_per_sec: f64,
    /// `tandem/requestInteraction` calls one connection may have waiting.
    #[arg(long, default_value_t = crate::Limits::default().max_open_interactions_per_connection)]
    pub max_open_interactions_per_connection: usize,
    /// Largest accepted WebSocket frame, in bytes.
    #[arg(long, default_value_t = Config::default().max_frame_bytes)]
    pub max_frame_bytes: usize,
    /// An ACP agent sessions can be created with: `NAME=COMMAND ARG…` (the
    /// command line split like a shell would). Repeatable; NAME is the
    /// provider id.
    #[arg(long = "agent", value_name = "NAME=COMMAND ARG…")]
    pub agents: Vec<String>,
    /// Let agent NAME read the files under DIR (ACP `fs/read_text_file`).
    /// Repeatable. No agent touches the host's files otherwise.
    #[arg(long = "agent-files", value_name = "NAME=DIR")]
    pub agent_files: Vec<String>,
    /// Let agent NAME read and write the files under DIR.
    #[arg(long = "agent-files-rw", value_name = "NAME=DIR")]
    pub agent_files_rw: Vec<String>,
    /// Serve `https://` and `wss://` with this PEM certificate chain (needs
    /// `--tls-key`).
    #[arg(
        long,
        env = "TANDEM_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(
        long,
        env = "TANDEM_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// The access level in a session of someone its owner did not set and
    /// whose token names none for it (its creator owns it; an admin owns
    /// every session).
    #[arg(long, value_enum, default_value_t = crate::people::Access::Participant)]
    pub session_access: crate::people::Access,
    /// `text` (one readable line per event) or `json` (one JSON object per
    /// line: `timestamp`, `level`, `fields` with `message`, `target`).
    #[arg(long, env = "TANDEM_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// A TOML config file: a key for every flag (its name with `_` for
    /// `-`, e.g. `max_connections = 5000`), ACP agents as `[[agents]]`
    /// tables (`name`, `display_name`, `command`, `args`, `env`, `cwd`,
    /// `start_timeout_secs`, `idle_timeout_secs`, `files`, `files_write`)
    /// and a `[cluster]` table (`urls`, `node_id`, `lease_secs`). Flags and
    /// environment variables win over the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

/// What the command line asks for.
pub enum Invocation {
    /// Run the server.
    Serve(Box<Serve>),
    /// Mint a token.
    Token(TokenArgs),
    /// Print a session's audit log from the store `serve` names.
    AuditExport {
        /// The session.
        session: String,
        /// Where the store is.
        serve: Box<Serve>,
    },
    /// Check a config file: what the server would run with it.
    CheckConfig {
        /// The file.
        file: PathBuf,
        /// What it configures.
        serve: Box<Serve>,
    },
}

/// A server to run: its configuration, where it listens, how it logs.
#[derive(Debug)]
pub struct Serve {
    /// The configuration.
    pub config: Config,
    /// Where it listens.
    pub bind: SocketAddr,
    /// How it logs.
    pub log_format: LogFormat,
}

/// Why the command line cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Clap's own (also `--help` and `--version`, which it prints).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// The config file, or the configuration it makes.
    #[error("{0}")]
    Invalid(String),
}

/// Most threads of one kind a server starts (`--http-workers`,
/// `--actor-threads`, `--fanout-threads`): far more than any machine's
/// cores, and a slip of the keyboard (`100000`) is refused instead of
/// starting that many threads.
const MAX_THREADS: usize = 1024;

/// A thread count: a number of at most [`MAX_THREADS`].
fn threads(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if n > MAX_THREADS {
        return Err(format!("at most {MAX_THREADS} threads"));
    }
    Ok(n)
}

/// Parse `argv` (the program's name first), reading the config file it
/// names; `built_in` are provider ids an agent may not take.
pub fn parse_from(argv: Vec<OsString>, built_in: &[&str]) -> Result<Invocation, CliError> {
    // A first, lenient look for `--config` and for which flags were given
    // (a flag the file completes, like `--node-id` for `--cluster`, is not
    // missing yet); the file's keys are added as the flags they stand for.
    let loose = Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(argv.clone())?;
    let serving = !matches!(loose.subcommand_name(), Some("token" | "config"));
    let given = loose
        .subcommand_matches("serve")
        .or_else(|| {
            let audit = loose.subcommand_matches("audit")?;
            audit.subcommand_matches("export")
        })
        .unwrap_or(&loose);
    let file = match given.get_one::<PathBuf>("config").filter(|_| serving) {
        Some(path) => Some(read_file(path, given)?),
        None => None,
    };
    let mut argv = argv;
    if let Some((_, extra)) = &file {
        argv.extend(extra.iter().cloned());
    }
    let matches = Cli::command().try_get_matches_from(argv.clone())?;
    let cli = Cli::from_arg_matches(&matches)?;
    let tables = file.as_ref().map(|(f, _)| f);
    match cli.command {
        Some(Command::Token(t)) => Ok(Invocation::Token(t)),
        Some(Command::Config(ConfigCommand::Check { file })) => {
            let mut argv = vec![argv[0].clone(), "serve".into(), "--config".into()];
            argv.push(file.clone().into_os_string());
            match parse_from(argv, built_in)? {
                Invocation::Serve(serve) => Ok(Invocation::CheckConfig { file, serve }),
                _ => unreachable!("a serve command line"),
            }
        }
        Some(Command::Serve(args)) => args.into_serve(tables, built_in).map(Invocation::Serve),
        Some(Command::Audit(AuditCommand::Export { session, serve })) => serve
            .into_serve(tables, built_in)
            .map(|serve| Invocation::AuditExport { session, serve }),
        None => cli
            .serve
            .into_serve(tables, built_in)
            .map(Invocation::Serve),
    }
}

impl ServeArgs {
    /// The server these arguments (and the config file's tables) describe.
    fn into_serve(
        self,
        file: Option<&ConfigFile>,
        built_in: &[&str],
    ) -> Result<Box<Serve>, CliError> {
        let invalid = |e: anyhow::Error| CliError::Invalid(format!("{e:#}"));
        let secret = self.secret.secret().map_err(invalid)?;
        let mut cluster = self.cluster(file).map_err(invalid)?;
        if let Some(c) = cluster.as_mut() {
            // What the nodes send each other is sealed with it.
            c.link_secret.clone_from(&secret);
        }
        let agents = self.agents(file, built_in).map_err(invalid)?;
        let notify = match file.and_then(|f| f.notify.as_ref()) {
            Some(t) => t.config().map_err(CliError::Invalid)?,
            None => Default::default(),
        };
        let defaults = Config::default();
        let config = Config {
            limits: Limits {
                max_connections: self.max_connections,
                max_connections_per_token: self.max_connections_per_token,
                max_subscriptions_per_connection: self.max_subscriptions_per_connection,
                dispatches_per_sec: self.dispatches_per_sec,
                dispatch_burst: self.dispatches_per_sec * 2.0,
                max_questions_per_request: self.max_questions_per_request,
                max_answer_chars: self.max_answer_chars,
                max_sessions_per_token: self.max_sessions_per_token,
                max_chats_per_session: self.max_chats_per_session,
                max_uri_bytes: self.max_uri_bytes,
                max_client_id_bytes: self.max_client_id_bytes,
                max_title_chars: self.max_title_chars,
                max_description_chars: self.max_description_chars,
                max_providers_per_subject: self.max_providers_per_subject,
                max_action_bytes: self.max_action_bytes,
                dispatch_bytes_per_sec: self.dispatch_bytes_per_sec,
                dispatch_bytes_burst: self.dispatch_bytes_per_sec * 4.0,
                max_open_interactions_per_connection: self.max_open_interactions_per_connection,
                inbound_bytes_per_sec: self.inbound_bytes_per_sec,
                requests_per_sec: self.requests_per_sec,
            },
            auth_secret: secret,
            allowed_origins: self.allowed_origins.clone(),
            session_access: self.session_access,
            data_dir: (!self.in_memory && cluster.is_none()).then(|| self.data_dir.clone()),
            durability: self.durability,
            commit_window: std::time::Duration::from_secs_f64(
                self.commit_window_ms.max(0.0) / 1000.0,
            ),
            follow_grace: std::time::Duration::from_secs_f64(self.follow_grace_secs.max(0.0)),
            drain: std::time::Duration::from_secs_f64(self.drain_secs.max(0.0)),
            place_sessions: self.place_sessions,
            replay_ring_len: self.replay_ring_len,
            replay_ring_bytes: self.replay_ring_bytes,
            max_replay_bytes: self.max_replay_bytes,
            outbound_limit_bytes: self.outbound_limit_bytes,
            write_pacing: std::time::Duration::from_secs_f64(
                self.write_pacing_ms.max(0.0) / 1000.0,
            ),
            max_frame_bytes: self.max_frame_bytes,
            agents,
            cluster,
            notify,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(super::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
            http_workers: self.http_workers.unwrap_or(defaults.http_workers).max(1),
            actor_threads: self.actor_threads.unwrap_or(defaults.actor_threads).max(1),
            fanout_threads: self.fanout_threads.unwrap_or(defaults.fanout_threads),
            io_uring: !self.no_io_uring,
            ..defaults
        };
        Ok(Box::new(Serve {
            config,
            bind: self.bind,
            log_format: self.log_format,
        }))
    }
    /// The cluster to join: `--cluster` (with `--node-id`, `--lease-secs`),
    /// else the config file's `[cluster]` table (`--node-id` still wins).
    fn cluster(
        &self,
        file: Option<&ConfigFile>,
    ) -> anyhow::Result<Option<crate::store::ClusterConfig>> {
        if let Some(urls) = &self.cluster {
            let mut c =
                crate::store::ClusterConfig::parse(urls, self.node_id.as_deref().unwrap_or(""))
                    .map_err(anyhow::Error::msg)?;
            c.lease = std::time::Duration::from_secs_f64(self.lease_secs.max(1.0));
            c.replicas = self.nats_replicas;
            c.auth = self.nats_auth(crate::store::NatsAuth::default());
            c.auth.check().map_err(anyhow::Error::msg)?;
            return Ok(Some(c));
        }
        match file.and_then(|f| f.cluster.as_ref()) {
            Some(t) => {
                let mut c = t
                    .config(self.node_id.as_deref())
                    .map_err(anyhow::Error::msg)?;
                if t.lease_secs.is_none() {
                    // `--lease-secs` (or the file's `lease_secs` key).
                    c.lease = std::time::Duration::from_secs_f64(self.lease_secs.max(1.0));
                }
                c.replicas = self.nats_replicas;
                c.auth = self.nats_auth(c.auth);
                c.auth.check().map_err(anyhow::Error::msg)?;
                Ok(Some(c))
            }
            None => Ok(None),
        }
    }

    /// `file`'s NATS credentials with the flags given over them.
    fn nats_auth(&self, file: crate::store::NatsAuth) -> crate::store::NatsAuth {
        let mut a = file;
        let over = |f: &Option<std::path::PathBuf>, v: &mut Option<std::path::PathBuf>| {
            if f.is_some() {
                v.clone_from(f);
            }
        };
        if self.nats_user.is_some() {
            a.user.clone_from(&self.nats_user);
        }
        over(&self.nats_password_file, &mut a.password_file);
        over(&self.nats_token_file, &mut a.token_file);
        over(&self.nats_creds, &mut a.creds_file);
        over(&self.nats_nkey_file, &mut a.nkey_file);
        over(&self.nats_ca, &mut a.ca_file);
        if let (Some(c), Some(k)) = (&self.nats_cert, &self.nats_key) {
            a.cert = Some((c.clone(), k.clone()));
        }
        a
    }

    /// The declared agents: the config file's, then the flags'.
    fn agents(
        &self,
        file: Option<&ConfigFile>,
        built_in: &[&str],
    ) -> anyhow::Result<Vec<crate::config::AgentSpec>> {
        let file = file.map(|f| f.agents.clone()).unwrap_or_default();
        let flags = self
            .agents
            .iter()
            .map(|f| crate::config::AgentSpec::parse_flag(f))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        let mut agents = merge(file, flags, built_in).map_err(anyhow::Error::msg)?;
        for (grants, write) in [(&self.agent_files, false), (&self.agent_files_rw, true)] {
            for g in grants {
                crate::config::AgentSpec::grant_files(&mut agents, g, write)
                    .map_err(anyhow::Error::msg)?;
            }
        }
        Ok(agents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;

    /// A scratch directory for config files, removed afterwards.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let d = std::env::temp_dir().join(format!("tandem-cli-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).expect("temp dir");
            Self(d)
        }

        fn file(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, text).expect("write");
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn parse(args: &[&str]) -> Result<Box<Serve>, CliError> {
        let mut argv: Vec<OsString> = vec!["tandem".into(), "serve".into()];
        argv.extend(args.iter().map(OsString::from));
        match parse_from(argv, &["scripted"])? {
            Invocation::Serve(s) => Ok(s),
            _ => panic!("a server"),
        }
    }

    fn serve_ok(args: &[&str]) -> Box<Serve> {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn error(args: &[&str]) -> String {
        match parse(args) {
            Err(e) => e.to_string(),
            Ok(s) => panic!("{args:?} should be refused, got {s:?}"),
        }
    }

    /// The flags the operator's reference table lists, in its order: the
    /// first cell of each row of the table under `## Every serve flag` in
    /// `docs/operating.md`.
    fn documented_flags() -> Vec<String> {
        let doc = include_str!("../../../docs/operating.md");
        let (_, table) = doc
            .split_once("## Every serve flag")
            .expect("docs/operating.md has an `## Every serve flag` section");
        table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|row| {
                let cell = row.trim_start_matches('|').split('|').next()?.trim();
                cell.strip_prefix("`--")?
                    .strip_suffix('`')
                    .map(|f| format!("--{f}"))
            })
            .collect()
    }

    #[test]
    fn the_operators_guide_lists_every_serve_flag_once_and_no_other() {
        let serve = Cli::command();
        let serve = serve.find_subcommand("serve").expect("the serve command");
        let flags: Vec<String> = serve
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|l| format!("--{l}"))
            .collect();
        let listed = documented_flags();
        for f in &flags {
            let n = listed.iter().filter(|l| *l == f).count();
            assert_eq!(
                n, 1,
                "docs/operating.md, \"Every serve flag\": `{f}` is listed {n} times"
            );
        }
        for l in &listed {
            assert!(
                flags.contains(l),
                "docs/operating.md lists `{l}`, which `tandem serve` does not take"
            );
        }
    }

    #[test]
    fn every_flag_has_a_key_that_configures_the_same_server() {
        let dir = Dir::new("keys");
        let secret = dir.file("secret", "a-secret-of-at-least-32-bytes-0123456789");
        let secret = secret.to_str().expect("utf-8");
        let cluster = ["--cluster", "nats://10.0.0.1:4222", "--node-id", "n1"];
        let agent = ["--agent", "gem=gemini"];
        let nats_table = |keys: &str| {
            format!("[cluster]\nurls = [\"nats://10.0.0.1:4222\"]\nnode_id = \"n1\"\n{keys}")
        };
        // (key, flags both forms share, the flag, the same as a file).
        let samples: Vec<(&str, Vec<&str>, Vec<&str>, String)> = vec![
            ("bind", vec![], vec!["--bind", "127.0.0.1:7999"], "bind = \"127.0.0.1:7999\"".into()),
            ("data_dir", vec![], vec!["--data-dir", "/srv/tandem"], "data_dir = \"/srv/tandem\"".into()),
            ("in_memory", vec![], vec!["--in-memory"], "in_memory = true".into()),
            (
                "cluster",
                vec![],
                vec!["--cluster", "nats://10.0.0.1:4222,nats://10.0.0.2:4222", "--node-id", "n1", "--lease-secs", "5"],
                "[cluster]\nurls = [\"nats://10.0.0.1:4222\", \"nats://10.0.0.2:4222\"]\nnode_id = \"n1\"\nlease_secs = 5".into(),
            ),
            ("node_id", vec!["--cluster", "nats://10.0.0.1:4222"], vec!["--node-id", "n2"], "node_id = \"n2\"".into()),
            ("nats_user", vec![], [cluster.as_slice(), &["--nats-user", "t", "--nats-password-file", "/etc/p"]].concat(), nats_table("user = \"t\"\npassword_file = \"/etc/p\"")),
            ("nats_password_file", vec![], [cluster.as_slice(), &["--nats-user", "u", "--nats-password-file", "/etc/q"]].concat(), nats_table("user = \"u\"\npassword_file = \"/etc/q\"")),
            ("nats_token_file", vec![], [cluster.as_slice(), &["--nats-token-file", "/etc/t"]].concat(), nats_table("token_file = \"/etc/t\"")),
            ("nats_creds", vec![], [cluster.as_slice(), &["--nats-creds", "/etc/c.creds"]].concat(), nats_table("creds_file = \"/etc/c.creds\"")),
            ("nats_nkey_file", vec![], [cluster.as_slice(), &["--nats-nkey-file", "/etc/n"]].concat(), nats_table("nkey_file = \"/etc/n\"")),
            ("nats_ca", vec![], [cluster.as_slice(), &["--nats-ca", "/etc/ca.pem"]].concat(), nats_table("ca_file = \"/etc/ca.pem\"")),
            ("nats_cert", vec![], [cluster.as_slice(), &["--nats-cert", "/etc/c.pem", "--nats-key", "/etc/k.pem"]].concat(), nats_table("cert_file = \"/etc/c.pem\"\nkey_file = \"/etc/k.pem\"")),
            ("nats_key", vec![], [cluster.as_slice(), &["--nats-cert", "/etc/d.pem", "--nats-key", "/etc/l.pem"]].concat(), nats_table("cert_file = \"/etc/d.pem\"\nkey_file = \"/etc/l.pem\"")),
            ("lease_secs", cluster.to_vec(), vec!["--lease-secs", "7"], "lease_secs = 7".into()),
            ("follow_grace_secs", cluster.to_vec(), vec!["--follow-grace-secs", "3"], "follow_grace_secs = 3".into()),
            ("drain_secs", cluster.to_vec(), vec!["--drain-secs", "4"], "drain_secs = 4".into()),
            ("nats_replicas", cluster.to_vec(), vec!["--nats-replicas", "3"], "nats_replicas = 3".into()),
            ("place_sessions", cluster.to_vec(), vec!["--place-sessions", "local"], "place_sessions = \"local\"".into()),
            ("durability", vec![], vec!["--durability", "relaxed"], "durability = \"relaxed\"".into()),
            ("commit_window_ms", vec![], vec!["--commit-window-ms", "7.5"], "commit_window_ms = 7.5".into()),
            ("replay_ring_len", vec![], vec!["--replay-ring-len", "123"], "replay_ring_len = 123".into()),
            ("replay_ring_bytes", vec![], vec!["--replay-ring-bytes", "4567"], "replay_ring_bytes = 4567".into()),
            ("max_replay_bytes", vec![], vec!["--max-replay-bytes", "999"], "max_replay_bytes = 999".into()),
            ("outbound_limit_bytes", vec![], vec!["--outbound-limit-bytes", "12345"], "outbound_limit_bytes = 12345".into()),
            ("write_pacing_ms", vec![], vec!["--write-pacing-ms", "2.5"], "write_pacing_ms = 2.5".into()),
            ("http_workers", vec![], vec!["--http-workers", "3"], "http_workers = 3".into()),
            ("actor_threads", vec![], vec!["--actor-threads", "5"], "actor_threads = 5".into()),
            ("fanout_threads", vec![], vec!["--fanout-threads", "9"], "fanout_threads = 9".into()),
            ("no_io_uring", vec![], vec!["--no-io-uring"], "no_io_uring = true".into()),
            ("max_connections", vec![], vec!["--max-connections", "77"], "max_connections = 77".into()),
            ("max_connections_per_token", vec![], vec!["--max-connections-per-token", "9"], "max_connections_per_token = 9".into()),
            ("max_subscriptions_per_connection", vec![], vec!["--max-subscriptions-per-connection", "11"], "max_subscriptions_per_connection = 11".into()),
            ("dispatches_per_sec", vec![], vec!["--dispatches-per-sec", "12.5"], "dispatches_per_sec = 12.5".into()),
            ("max_questions_per_request", vec![], vec!["--max-questions-per-request", "7"], "max_questions_per_request = 7".into()),
            ("max_answer_chars", vec![], vec!["--max-answer-chars", "300"], "max_answer_chars = 300".into()),
            ("max_sessions_per_token", vec![], vec!["--max-sessions-per-token", "13"], "max_sessions_per_token = 13".into()),
            ("max_chats_per_session", vec![], vec!["--max-chats-per-session", "14"], "max_chats_per_session = 14".into()),
            ("max_uri_bytes", vec![], vec!["--max-uri-bytes", "200"], "max_uri_bytes = 200".into()),
            ("max_client_id_bytes", vec![], vec!["--max-client-id-bytes", "100"], "max_client_id_bytes = 100".into()),
            ("max_title_chars", vec![], vec!["--max-title-chars", "50"], "max_title_chars = 50".into()),
            ("max_description_chars", vec![], vec!["--max-description-chars", "60"], "max_description_chars = 60".into()),
            ("max_providers_per_subject", vec![], vec!["--max-providers-per-subject", "3"], "max_providers_per_subject = 3".into()),
            ("max_action_bytes", vec![], vec!["--max-action-bytes", "4096"], "max_action_bytes = 4096".into()),
            ("dispatch_bytes_per_sec", vec![], vec!["--dispatch-bytes-per-sec", "1000.5"], "dispatch_bytes_per_sec = 1000.5".into()),
            ("inbound_bytes_per_sec", vec![], vec!["--inbound-bytes-per-sec", "2000"], "inbound_bytes_per_sec = 2000".into()),
            ("requests_per_sec", vec![], vec!["--requests-per-sec", "20"], "requests_per_sec = 20".into()),
            ("max_open_interactions_per_connection", vec![], vec!["--max-open-interactions-per-connection", "8"], "max_open_interactions_per_connection = 8".into()),
            ("max_frame_bytes", vec![], vec!["--max-frame-bytes", "65536"], "max_frame_bytes = 65536".into()),
            ("agents", vec![], vec!["--agent", "gem=gemini --acp"], "[[agents]]\nname = \"gem\"\ncommand = \"gemini\"\nargs = [\"--acp\"]".into()),
            ("agent_files", agent.to_vec(), vec!["--agent-files", "gem=/srv/docs"], "agent_files = [\"gem=/srv/docs\"]".into()),
            ("agent_files_rw", agent.to_vec(), vec!["--agent-files-rw", "gem=/srv/docs"], "agent_files_rw = [\"gem=/srv/docs\"]".into()),
            ("allowed_origins", vec![], vec!["--allowed-origin", "https://a.example", "--allowed-origin", "https://b.example"], "allowed_origins = [\"https://a.example\", \"https://b.example\"]".into()),
            ("log_format", vec![], vec!["--log-format", "json"], "log_format = \"json\"".into()),
            ("session_access", vec![], vec!["--session-access", "viewer"], "session_access = \"viewer\"".into()),
            ("auth_secret_file", vec![], vec!["--auth-secret-file", secret], format!("auth_secret_file = \"{secret}\"")),
            ("tls_cert", vec!["--tls-key", "/etc/tandem/key.pem"], vec!["--tls-cert", "/etc/tandem/cert.pem"], "tls_cert = \"/etc/tandem/cert.pem\"".into()),
            ("tls_key", vec!["--tls-cert", "/etc/tandem/cert.pem"], vec!["--tls-key", "/etc/tandem/key.pem"], "tls_key = \"/etc/tandem/key.pem\"".into()),
        ];
        let default = format!("{:?}", serve_ok(&[]));
        for (key, common, flag, text) in &samples {
            let path = dir.file(&format!("{key}.toml"), text);
            let by_flag = serve_ok(&[common.as_slice(), flag.as_slice()].concat());
            let by_file = serve_ok(
                &[
                    common.as_slice(),
                    &["--config", path.to_str().expect("utf-8")],
                ]
                .concat(),
            );
            let (a, b) = (format!("{by_flag:?}"), format!("{by_file:?}"));
            assert_eq!(a, b, "`{key}`: the file configures what the flag does");
            assert_ne!(a, default, "`{key}` changes something");
        }
        // And the table covers every flag (but `--config` itself).
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        for arg in cmd.get_arguments().filter(|a| a.get_long().is_some()) {
            let id = arg.get_id().as_str();
            assert!(
                id == "config" || samples.iter().any(|(k, ..)| *k == id),
                "`--{}` has no config-file sample here",
                arg.get_long().unwrap_or_default()
            );
        }
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() {
        let dir = Dir::new("precedence");
        let path = dir.file("t.toml", "max_connections = 5\nmax_frame_bytes = 4096\nallowed_origins = [\"https://file.example\"]\n");
        let path = path.to_str().expect("utf-8");
        let s = serve_ok(&[
            "--config",
            path,
            "--max-connections",
            "9",
            "--allowed-origin",
            "https://flag.example",
        ]);
        assert_eq!(s.config.limits.max_connections, 9);
        assert_eq!(s.config.max_frame_bytes, 4096);
        assert_eq!(s.config.allowed_origins, ["https://flag.example"]);
        // The store is one choice: the command line's replaces the file's.
        let cluster = dir.file(
            "c.toml",
            "data_dir = \"/srv/file-data\"\n[cluster]\nurls = [\"nats://10.0.0.1:4222\"]\nnode_id = \"n1\"\nlease_secs = 4\n",
        );
        let cluster = cluster.to_str().expect("utf-8");
        let s = serve_ok(&["--config", cluster, "--in-memory"]);
        assert!(s.config.cluster.is_none() && s.config.data_dir.is_none());
        let s = serve_ok(&["--config", cluster, "--data-dir", "/srv/flag-data"]);
        assert!(s.config.cluster.is_none());
        assert_eq!(
            s.config.data_dir.as_deref(),
            Some(std::path::Path::new("/srv/flag-data"))
        );
        let s = serve_ok(&["--config", cluster]);
        let c = s.config.cluster.expect("the file's cluster");
        assert_eq!(c.lease, std::time::Duration::from_secs(4));
        let s = serve_ok(&["--config", cluster, "--lease-secs", "6"]);
        assert_eq!(
            s.config.cluster.expect("cluster").lease,
            std::time::Duration::from_secs(6)
        );
        // `tandem --config F` (no `serve`) reads the file the same way.
        let argv = vec!["tandem".into(), "--config".into(), path.into()];
        let Ok(Invocation::Serve(s)) = parse_from(argv, &["scripted"]) else {
            panic!("a server");
        };
        assert_eq!(s.config.limits.max_connections, 5);
    }

    #[test]
    fn thread_counts_are_bounded() {
        for flag in ["--http-workers", "--actor-threads", "--fanout-threads"] {
            let e = error(&[flag, "1025"]);
            assert!(e.contains("at most 1024 threads"), "{flag}: {e}");
            let ok = serve_ok(&[flag, "1024"]);
            let c = &ok.config;
            assert!(
                [c.http_workers, c.actor_threads, c.fanout_threads].contains(&1024),
                "{flag}"
            );
        }
    }

    #[test]
    fn a_bad_file_says_which_key_and_line() {
        let dir = Dir::new("bad");
        for (text, says) in [
            ("in_memory = true\nmax_conections = 5\n", "line 2: unknown key `max_conections`; did you mean `max_connections`?"),
            ("max_connections = \"lots\"\n", "line 1: `max_connections`: invalid value 'lots' for '--max-connections <MAX_CONNECTIONS>': invalid digit found in string"),
            ("\n\nin_memory = \"yes\"\n", "line 3: `in_memory` takes true or false, not a string"),
            ("allowed_origins = \"https://a.example\"\n", "line 1: `allowed_origins` takes an array, not a string"),
            ("max_frame_bytes = [1]\n", "line 1: `max_frame_bytes` takes a string or a number, not an array"),
            ("durability = \"fast\"\n", "`durability`: invalid value 'fast' for '--durability <DURABILITY>' [possible values: full, relaxed]"),
            ("config = \"other.toml\"\n", "line 1: `config`: a config file cannot name another"),
            ("fanout_threads = 100000\n", "line 1: `fanout_threads`: invalid value '100000' for '--fanout-threads <FANOUT_THREADS>': at most 1024 threads"),
            ("http_workers = -1\n", "line 1: `http_workers`: invalid value '-1' for '--http-workers <HTTP_WORKERS>': invalid digit found in string"),
            ("[[agents]]\nname = \"a\"\ncommand = \"b\"\ncomand = \"c\"\n", "unknown field `comand`"),
            ("bind = [1\n", "TOML parse error at line 1"),
        ] {
            let path = dir.file("bad.toml", text);
            let e = error(&["--config", path.to_str().expect("utf-8")]);
            assert!(e.contains(says), "{text:?}: {e}");
            assert!(e.contains("bad.toml"), "names the file: {e}");
        }
        let e = error(&["--config", "/nonexistent/tandem.toml"]);
        assert!(e.contains("cannot read config file"), "{e}");
    }
}
