//! Server configuration: every tunable with its unit in the name.

use std::path::PathBuf;
use std::time::Duration;

use crate::store::Durability;

pub(crate) mod agents;
pub mod cli;

pub use crate::transport::tls::TlsFiles;
pub use agents::AgentSpec;

/// How the server runs. `Default` is what `tandem serve` uses without flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// HS256 secret for bearer tokens, used byte for byte (at least
    /// [`crate::auth::MIN_SECRET_BYTES`]; the server refuses to start with a
    /// shorter one); `None` accepts everyone (loopback only).
    pub auth_secret: Option<Vec<u8>>,
    /// Web origins (`scheme://host[:port]`) besides the server's own whose
    /// pages may open `/ahp` (other front ends, a reverse proxy's public
    /// name); see `server::access`.
    pub allowed_origins: Vec<String>,
    /// Limits.
    pub limits: Limits,
    /// Where the SQLite store lives; `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// How hard a commit waits for the disk.
    pub durability: Durability,
    /// How long a group commit of the SQLite store may wait for more writes
    /// when they arrive in a steady stream (zero: never waits).
    pub commit_window: Duration,
    /// Envelopes kept in memory for `reconnect` replay.
    pub replay_ring_len: usize,
    /// Bytes of envelopes kept in memory for `reconnect` replay; older ones
    /// are dropped first, and a reconnect from before them gets snapshots.
    pub replay_ring_bytes: usize,
    /// Largest `reconnect` replay sent as is; a bigger gap is answered with
    /// snapshots, which are smaller than a long backlog and fit any client's
    /// frame limit.
    pub max_replay_bytes: usize,
    /// A channel's state is snapshotted into the store every this many
    /// journaled actions, so recovery replays only the tail.
    pub snapshot_every: u64,
    /// Completed turns a chat keeps in memory after a restart; older ones are
    /// paged in with `fetchTurns`.
    pub turns_window: usize,
    /// Turns one `fetchTurns` loads.
    pub turns_page: u64,
    /// How long a disconnected provider's turns wait for it to come back.
    pub provider_grace: Duration,
    /// On a cluster node: how long a chat another node owns stays applied
    /// here after the last local connection watching it left.
    pub follow_grace: Duration,
    /// On a cluster node that stops: how long it waits for running turns
    /// to end before it hands their sessions to the other nodes anyway.
    pub drain: Duration,
    /// Where a cluster node puts the sessions made through it.
    pub place_sessions: Placement,
    /// Unsent bytes a connection may queue before it is evicted.
    pub outbound_limit_bytes: usize,
    /// Largest accepted WebSocket frame.
    pub max_frame_bytes: usize,
    /// Least time between two socket writes of pushed frames on one
    /// connection; frames pushed meanwhile share the next write. Replies,
    /// pongs and closes never wait. Zero writes every frame at once.
    pub write_pacing: Duration,
    /// Threads serving HTTP and WebSocket connections; a session a client
    /// creates runs on the thread serving that client
    /// ([`crate::channels::homes`]).
    pub http_workers: usize,
    /// Threads the sessions restored at start-up or followed from another
    /// node (and the root channel) are spread over.
    pub actor_threads: usize,
    /// Threads besides the publishing one that write shares of a room of
    /// at least 512 subscribers (twice the least share of one thread).
    pub fanout_threads: usize,
    /// Batch the socket writes of a room's connections in io_uring
    /// submissions (Linux, where the kernel allows it).
    pub io_uring: bool,
    /// A socket with no traffic (not even pongs) for this long is closed.
    pub idle_timeout: Duration,
    /// How often the server pings an idle socket.
    pub heartbeat_interval: Duration,
    /// ACP agents the operator declared (`--agent`, `[[agents]]`).
    pub agents: Vec<AgentSpec>,
    /// A cluster node: the journal is in NATS JetStream (`--cluster`)
    /// instead of `data_dir`.
    pub cluster: Option<crate::store::ClusterConfig>,
    /// Serve `https://` and `wss://` with this certificate (`None`: plain
    /// HTTP, for loopback or behind a proxy that does TLS).
    pub tls: Option<TlsFiles>,
    /// A session's default access level: of whoever its owner did not set
    /// and whose token names none for it (`--session-access`).
    pub session_access: crate::people::Access,
    /// Who is told when a request for a person waits (`[notify]`).
    pub notify: crate::notify::NotifyConfig,
}

/// Per-server, per-token and per-connection limits. Each names what a client
/// sees when it hits it (`docs/protocol.md`, "Limits a client meets").
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections on the server (HTTP 503 on upgrade beyond it).
    pub max_connections: usize,
    /// Open connections per token subject (HTTP 429 beyond it).
    pub max_connections_per_token: usize,
    /// Channels one connection may subscribe to (`-32600`).
    pub max_subscriptions_per_connection: usize,
    /// Sustained `dispatchAction`s per second per connection (token bucket;
    /// beyond it: a rejection echo).
    pub dispatches_per_sec: f64,
    /// Burst size of that bucket.
    pub dispatch_burst: f64,
    /// Questions in one input request (`-32602` / `aborted`).
    pub max_questions_per_request: usize,
    /// Characters in one text answer or free-form value (rejection echo).
    pub max_answer_chars: usize,
    /// Sessions one token subject may create (`-32600`); counted across
    /// restarts (the owner is stored with the session).
    pub max_sessions_per_token: usize,
    /// Chats in one session (`createChat` → `-32600`).
    pub max_chats_per_session: usize,
    /// Bytes of a session or chat URI chosen by a client (`-32602`).
    pub max_uri_bytes: usize,
    /// Bytes of a `clientId` (`-32602`): it is copied into every envelope
    /// the client's actions produce.
    pub max_client_id_bytes: usize,
    /// Characters of a session title or a provider's display name
    /// (rejection echo / `-32602`).
    pub max_title_chars: usize,
    /// Characters of a provider's description (`-32602`).
    pub max_description_chars: usize,
    /// Providers one token subject may register (`-32600`).
    pub max_providers_per_subject: usize,
    /// Bytes of one `dispatchAction` message (rejection echo): bounds every
    /// string inside an action — drafts, prompts, edited tool input.
    pub max_action_bytes: usize,
    /// Sustained bytes per second of actions one principal (a token
    /// subject; without authentication, a connection) may have the journal
    /// write (token bucket; beyond it: a rejection echo), so one tenant
    /// cannot stall everyone's group commits.
    pub dispatch_bytes_per_sec: f64,
    /// Burst size of that bucket, in bytes.
    pub dispatch_bytes_burst: f64,
    /// Bytes of frames per second the server reads from one principal
    /// (burst: twice that); past it, reading pauses.
    pub inbound_bytes_per_sec: f64,
    /// Requests per second (other than `dispatchAction` and `ping`) the
    /// server handles for one principal (burst: twice that); past it,
    /// handling waits.
    pub requests_per_sec: f64,
    /// `tandem/requestInteraction` calls one connection may have waiting at
    /// once (`-32600`).
    pub max_open_interactions_per_connection: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 20_000,
            max_connections_per_token: 256,
            max_subscriptions_per_connection: 1_024,
            dispatches_per_sec: 5_000.0,
            dispatch_burst: 10_000.0,
            max_questions_per_request: 50,
            max_answer_chars: 20_000,
            max_sessions_per_token: 10_000,
            max_chats_per_session: 256,
            max_uri_bytes: 256,
            max_client_id_bytes: 256,
            max_title_chars: 1_000,
            max_description_chars: 4_000,
            max_providers_per_subject: 16,
            max_action_bytes: 256 * 1024,
            dispatch_bytes_per_sec: 1024.0 * 1024.0,
            dispatch_bytes_burst: 4.0 * 1024.0 * 1024.0,
            max_open_interactions_per_connection: 64,
            inbound_bytes_per_sec: 4.0 * 1024.0 * 1024.0,
            requests_per_sec: 100.0,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        // Serving threads on half the cores (rounded up): fewer threads
        // spend less CPU per delivery (fewer sleeps and wake-ups), and a big
        // room's writes still reach every core through the fan-out threads.
        // Measured: `docs/perf/experiments.md`, "Fan-out threads and thread
        // placement".
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let serving = cores.div_ceil(2);
        Self {
            auth_secret: None,
            allowed_origins: Vec::new(),
            limits: Limits::default(),
            data_dir: None,
            durability: Durability::Full,
            commit_window: crate::store::DEFAULT_COMMIT_WINDOW,
            replay_ring_len: 100_000,
            replay_ring_bytes: 64 * 1024 * 1024,
            max_replay_bytes: 4 * 1024 * 1024,
            snapshot_every: 64,
            provider_grace: Duration::from_secs(10),
            follow_grace: Duration::from_secs(30),
            drain: Duration::from_secs(30),
            place_sessions: Placement::Spread,
            turns_window: 50,
            turns_page: 50,
            outbound_limit_bytes: 8 * 1024 * 1024,
            write_pacing: Duration::from_millis(5),
            max_frame_bytes: 1024 * 1024,
            http_workers: serving,
            actor_threads: cores,
            fanout_threads: cores.saturating_sub(1),
            io_uring: true,
            idle_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(20),
            agents: Vec::new(),
            cluster: None,
            tls: None,
            session_access: crate::people::Access::Participant,
            notify: crate::notify::NotifyConfig::default(),
        }
    }
}

/// Where a cluster node puts the sessions made through it (`--place-sessions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// On this node unless it runs clearly more sessions than the least
    /// loaded live node, which then takes them.
    #[default]
    Spread,
    /// Always on this node.
    Local,
}
