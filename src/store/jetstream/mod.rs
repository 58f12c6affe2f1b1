//! The journal in NATS JetStream (`tandem serve --cluster nats://…`): the
//! same [`Journal`](super::Journal) as SQLite's, kept where every node of a cluster can read
//! it.
//!
//! What the node creates on first start (names are fixed; a cluster shares
//! them):
//!
//! | name | kind | holds |
//! |---|---|---|
//! | `TANDEM_JOURNAL` | stream, file storage, kept until a channel is disposed | one message per appended batch on `tandem.journal.<channel>` (its actions, the turns that ended in it, a truncation), and fence messages |
//! | `TANDEM_AUDIT` | stream, file storage, kept | each session's audit log on `tandem.audit.<session>`: one message per entry, published once its batch is stored |
//! | `tandem_channels` | key-value bucket | each channel's record (`ChannelInfo`), in creation order (revision) |
//! | `tandem_snapshots` | key-value bucket | each channel's latest snapshot and where its tail starts in the stream |
//! | `tandem_turns` | key-value bucket | ended turns by `<chat>.<index>`, for `fetchTurns` |
//! | `tandem_providers` | key-value bucket | provider id → the token subject that first registered it (create-only) |
//! | `tandem_nodes` | key-value bucket | the cluster's `serverSeq` floor (`seq`): each node numbers in blocks it raises the floor over with compare-and-set, so a reconnect to another node gets snapshots |
//! | `tandem_settings` | key-value bucket | the server's own records ([`crate::store::settings`]): the Web Push key, push subscriptions, notification choices |
//! | `tandem_leases` | key-value bucket, entries expire after the lease time | which node owns each channel ([`lease`]) |
//!
//! `<channel>` is the channel URI in lowercase hex, so any URI is a valid
//! subject token and key.
//!
//! **Fencing.** Every append is published with JetStream's expected last
//! sequence for the channel's subject: the sequence of the last message this
//! node wrote or read there. A node that lost a channel (its lease expired
//! while it was paused or cut off) can never append again: the new owner's
//! first act is a fence message on the subject ([`JetStreamJournal::fence`]),
//! so the old owner's expectation no longer holds and JetStream refuses its
//! write ([`JournalError::Fenced`]).
//!
//! **One writer per channel at a time, group commit.** A channel's appends
//! go out one message at a time (each needs the previous one's sequence);
//! appends that arrive while one is in flight are sent together as the next
//! message, and all of them are acknowledged when it is stored.
//!
//! The synchronous reads of the trait (`recover`, `load_channel`,
//! `turns_before`, `reserve_seq`) block the calling thread on a request to
//! the journal's own runtime, as SQLite's reads block on the disk.
//!
//! Files: [`wire`] what is written (batch messages, bucket values),
//! [`nats`] the connection and every read (recovery), [`append`] the
//! fenced, grouped appends, [`lease`] the lease records, `ownership` this
//! node's leases and fences, `journal` the [`Journal`](super::Journal) trait's calls; this
//! file the configuration, the shared state and the connection.

mod append;
mod journal;
pub(crate) mod lease;
pub use lease::LEASES;
pub use settings::SETTINGS;
mod link;
mod nats;
mod ownership;
mod placement;
pub mod seal;
mod settings;
mod wire;

use self::nats::Nats;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{Batch, JournalError};
use crate::ids::ChannelUri;

/// The stream of every channel's batches.
pub const STREAM: &str = "TANDEM_JOURNAL";
/// Subject prefix of the stream: `tandem.journal.<channel>`.
pub const SUBJECT_PREFIX: &str = "tandem.journal";
/// The stream of every session's audit log.
pub const AUDIT_STREAM: &str = "TANDEM_AUDIT";
/// Subject prefix of the audit stream: `tandem.audit.<session>`.
pub const AUDIT_PREFIX: &str = "tandem.audit";
/// Channel records.
pub const CHANNELS: &str = "tandem_channels";
/// Latest snapshot per channel.
pub const SNAPSHOTS: &str = "tandem_snapshots";
/// Ended turns per chat.
pub const TURNS: &str = "tandem_turns";
/// Provider owners.
pub const PROVIDERS: &str = "tandem_providers";
/// Cluster-wide figures: the `serverSeq` floor.
pub const NODES: &str = "tandem_nodes";
/// Key of the cluster's `serverSeq` floor in [`NODES`].
const SEQ_KEY: &str = "seq";

/// Header: the journal position of a batch message's first action.
const POS_HEADER: &str = "Tandem-Pos";
/// Header: the node that wrote a fence message.
const FENCE_HEADER: &str = "Tandem-Fence";
/// Header: the node that wrote a batch message.
const NODE_HEADER: &str = "Tandem-Node";

/// How to reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// NATS server URLs (`nats://host:port`); any one will do.
    pub urls: Vec<String>,
    /// This node's name, unique in the cluster.
    pub node_id: String,
    /// How long a channel lease lasts without renewal.
    pub lease: Duration,
    /// Credentials and TLS for a secured NATS.
    pub auth: NatsAuth,
    /// The server's auth secret: what the nodes send each other on core
    /// NATS is sealed with a key drawn from it ([`seal`]). `None` (no
    /// authentication): the nodes trust whatever reaches them on NATS.
    pub link_secret: Option<Vec<u8>>,
    /// Copies NATS keeps of the journal stream and every bucket (1–5,
    /// on a NATS cluster of at least as many servers), set when they are
    /// first made.
    pub replicas: usize,
}

/// How a node proves itself to NATS and checks the server: files only, so
/// no secret is on a command line, in the environment or in a log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsAuth {
    /// A user name, with `password_file`.
    pub user: Option<String>,
    /// The file holding the user's password.
    pub password_file: Option<std::path::PathBuf>,
    /// The file holding a token.
    pub token_file: Option<std::path::PathBuf>,
    /// A `.creds` file (a user JWT and its NKey seed).
    pub creds_file: Option<std::path::PathBuf>,
    /// The file holding an NKey seed (`SU…`).
    pub nkey_file: Option<std::path::PathBuf>,
    /// The CA certificate (PEM) the server's certificate must chain to;
    /// TLS is then required.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate (PEM) and its key, for mutual TLS.
    pub cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl NatsAuth {
    /// Check the combination: one way to log in at most, a user with a
    /// password.
    pub fn check(&self) -> Result<(), String> {
        let ways = [
            self.user.is_some() || self.password_file.is_some(),
            self.token_file.is_some(),
            self.creds_file.is_some(),
            self.nkey_file.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(
                "NATS: give one of a user and password, a token, a creds file or an NKey seed"
                    .into(),
            );
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err("NATS: a user needs a password file, and a password file a user".into());
        }
        Ok(())
    }

    /// `opts` with these credentials and TLS settings.
    async fn apply(
        &self,
        mut opts: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, JournalError> {
        let secret = |p: &std::path::Path| -> Result<String, JournalError> {
            let text = std::fs::read_to_string(p)
                .map_err(|e| unavailable(&format!("read {}", p.display()), e))?;
            let t = text.trim().to_owned();
            if t.is_empty() {
                return Err(unavailable(&format!("read {}", p.display()), "it is empty"));
            }
            Ok(t)
        };
        if let (Some(user), Some(p)) = (&self.user, &self.password_file) {
            opts = opts.user_and_password(user.clone(), secret(p)?);
        }
        if let Some(p) = &self.token_file {
            opts = opts.token(secret(p)?);
        }
        if let Some(p) = &self.nkey_file {
            opts = opts.nkey(secret(p)?);
        }
        if let Some(p) = &self.creds_file {
            opts = opts
                .credentials_file(p)
                .await
                .map_err(|e| unavailable(&format!("read {}", p.display()), e))?;
        }
        if let Some(ca) = &self.ca_file {
            opts = opts.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some((cert, key)) = &self.cert {
            opts = opts
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        Ok(opts)
    }
}

impl ClusterConfig {
    /// `--cluster nats://a:4222,nats://b:4222` and `--node-id NAME`.
    pub fn parse(urls: &str, node_id: &str) -> Result<Self, String> {
        let urls: Vec<String> = urls
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err("`--cluster` needs at least one NATS URL".into());
        }
        for u in &urls {
            if !(u.starts_with("nats://") || u.starts_with("tls://")) {
                return Err(format!(
                    "`--cluster {u}`: expected nats://HOST:PORT (or tls://HOST:PORT)"
                ));
            }
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if node_id.is_empty() || node_id.len() > 64 || !node_id.chars().all(ok) {
            return Err(format!(
                "node id `{node_id}`: use 1 to 64 letters, digits, `-` or `_`"
            ));
        }
        Ok(Self {
            urls,
            node_id: node_id.to_owned(),
            lease: Duration::from_secs(10),
            auth: NatsAuth::default(),
            link_secret: None,
            replicas: 1,
        })
    }
}

/// A channel URI as a subject token and key: lowercase hex of its bytes.
pub fn token(uri: &str) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(uri.len() * 2);
    for b in uri.bytes() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn subject(uri: &str) -> String {
    format!("{SUBJECT_PREFIX}.{}", token(uri))
}

fn audit_subject(session: &str) -> String {
    format!("{AUDIT_PREFIX}.{}", token(session))
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("NATS JetStream: {what}: {e}"))
}

/// An append waiting for its message.
struct Pending {
    batch: Batch,
    done: oneshot::Sender<Result<(), JournalError>>,
}

/// What the journal knows of one channel.
#[derive(Default)]
struct Chan {
    /// Actions stored.
    len: u64,
    /// Actions stored or on their way.
    projected: u64,
    /// Stream sequence of the channel's last message.
    last_seq: u64,
    /// Turns stored.
    turns: u64,
    /// Appends waiting for the one in flight.
    queue: Vec<Pending>,
    in_flight: bool,
    /// Another node took the channel over.
    fenced: Option<String>,
}

struct Inner {
    nats: Nats,
    rt: tokio::runtime::Handle,
    node: String,
    lease: Duration,
    chans: Mutex<HashMap<ChannelUri, Chan>>,
    /// Signalled on `chans` whenever a channel's appends are all stored
    /// (none in flight, none queued), for [`Journal::sync`] to wait on.
    ///
    /// [`Journal::sync`]: crate::store::Journal::sync
    settled: parking_lot::Condvar,
    /// The leases this node holds, renewed in the background.
    owned: Mutex<HashMap<ChannelUri, lease::Lease>>,
    /// Channels another node owns: this node follows them.
    followed: Mutex<std::collections::HashSet<ChannelUri>>,
    /// Chats another node owns whose batches this node applies: watched by
    /// a connection here ([`crate::store::ClusterLink::watch`]). Every other
    /// chat's batches pass by undecoded.
    watched: Mutex<std::collections::HashSet<ChannelUri>>,
    /// Batches let pass because nobody here watches their chat.
    passed: std::sync::atomic::AtomicU64,
    /// Who owns the channels this node follows, as last looked up.
    owners: Mutex<link::Owners>,
    /// Requests on their way to other nodes, in order.
    forward_tx: Mutex<Option<tokio::sync::mpsc::UnboundedSender<link::Outgoing>>>,
    /// The stream's last sequence when recovery read it: following starts
    /// after it.
    follow_from: std::sync::atomic::AtomicU64,
    /// A consumer reads the journal stream now (the other nodes' writes
    /// reach this node).
    following_journal: std::sync::atomic::AtomicBool,
    /// A watch reads the channel records now (channels created or disposed
    /// elsewhere reach this node).
    watching_channels: std::sync::atomic::AtomicBool,
    /// The NATS client, for its connection state.
    client: async_nats::Client,
    /// Where each append's time and size are recorded, once set.
    commits: std::sync::OnceLock<super::CommitMetrics>,
    /// What the other nodes last told of their load.
    loads: placement::Loads,
    /// Seals what this node tells the others over core NATS, and opens
    /// what they tell it.
    seal: seal::Seal,
    /// Announcements, sent in order by one task (started on first use).
    announcer: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    /// Ends the runtime's thread when the journal goes.
    _stop: oneshot::Sender<()>,
}

/// The journal of a cluster node, in NATS JetStream.
#[derive(Clone)]
pub struct JetStreamJournal {
    inner: Arc<Inner>,
}

impl JetStreamJournal {
    /// Connect, and create the stream and buckets if they are missing.
    pub async fn connect(cfg: &ClusterConfig) -> Result<Self, JournalError> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("tandem-nats".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("tandem-nats")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| unavailable("cannot start its thread", e))?;
        let rt = handle_rx
            .recv()
            .map_err(|e| unavailable("its thread", e))?
            .map_err(|e| unavailable("its runtime", e))?;
        cfg.auth.check().map_err(|e| unavailable("connect", e))?;
        let urls = cfg.urls.clone();
        let lease = cfg.lease;
        let auth = cfg.auth.clone();
        let replicas = cfg.replicas.clamp(1, 5);
        let nats = rt
            .spawn(async move { Nats::open(&urls, lease, &auth, replicas).await })
            .await
            .map_err(|e| unavailable("connect", e))??;
        let journal = Self {
            inner: Arc::new(Inner {
                client: nats.js.client(),
                nats,
                rt,
                node: cfg.node_id.clone(),
                lease: cfg.lease,
                chans: Mutex::new(HashMap::new()),
                settled: parking_lot::Condvar::new(),
                owned: Mutex::new(HashMap::new()),
                followed: Mutex::default(),
                watched: Mutex::default(),
                passed: std::sync::atomic::AtomicU64::new(0),
                owners: Mutex::default(),
                forward_tx: Mutex::new(None),
                follow_from: std::sync::atomic::AtomicU64::new(0),
                following_journal: std::sync::atomic::AtomicBool::new(false),
                watching_channels: std::sync::atomic::AtomicBool::new(false),
                commits: std::sync::OnceLock::new(),
                seal: seal::Seal::new(cfg.link_secret.as_deref()),
                loads: placement::Loads::default(),
                announcer: std::sync::OnceLock::new(),
                _stop: stop_tx,
            }),
        };
        journal.start_renewing();
        Ok(journal)
    }

    /// How many channels this node owns.
    pub fn owned(&self) -> usize {
        self.inner.owned.lock().len()
    }

    /// How many chats another node owns this node applies now (watched
    /// here), and how many of their batches it let pass since it started.
    pub fn watched(&self) -> (usize, u64) {
        (
            self.inner.watched.lock().len(),
            self.inner.passed.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether the NATS connection is up.
    pub fn connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The leases of this node ([`lease::Leases`]).
    pub fn leases(&self) -> lease::Leases {
        lease::Leases::new(
            self.inner.nats.leases.clone(),
            self.inner.node.clone(),
            self.inner.lease,
            self.inner.rt.clone(),
        )
    }

    /// Run `fut` on the journal's runtime and wait for it here.
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, JournalError>> + Send + 'static,
    ) -> Result<T, JournalError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.inner.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv_timeout(Duration::from_secs(60))
            .map_err(|_| unavailable("no answer", "within 60 s"))?
    }
}

fn publish_error(uri: &ChannelUri, e: jetstream::context::PublishError) -> JournalError {
    match e.kind() {
        jetstream::context::PublishErrorKind::WrongLastSequence => JournalError::Fenced {
            channel: uri.clone(),
            reason: "another node wrote to the channel since this node last did".into(),
        },
        _ => unavailable("append", e),
    }
}
