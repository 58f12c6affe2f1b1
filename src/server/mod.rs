//! The actix-web application: `/ahp` (WebSocket), `/healthz`, `/readyz`,
//! `/metrics`, `/admin/overview`, and the embedded browser client at `/`.
//!
//! | module | job |
//! |---|---|
//! | [`access`] | which web pages may open `/ahp` (`Origin` / `Host`) |
//! | [`admission`] | connection slots, in all and per token subject; the open connections |
//! | [`upgrade`] | `GET /ahp`: origin, token and slot checks, then the handshake; takes the socket over |
//! | [`connection`] | the connection actor: reads frames, paces them, permissions |
//! | `routes` | one handler per AHP method |
//! | `subscribe` | `subscribe`, `initialize`, `reconnect` |
//! | `provide` | a provider connection's `tandem/*` calls |
//! | [`params`] | the params of `tandem/*` methods |
//! | `scrape` | `GET /metrics` (admin token when auth is on) |
//! | `admin` | `GET /admin/overview`: connections and waiting requests for the web client's admin view |
//!
//! The arrows point one way: `upgrade` → `connection` → `routes` /
//! `subscribe` / `provide` → [`crate::channels`]; the socket, its frames and
//! TLS are [`crate::transport`]'s, which reports through a callback and a
//! stream and knows no actor.
//! The server's own tables (tokens, connections, rate buckets) live in
//! [`AppState`], not in the channels' context.

pub(crate) mod access;
mod admin;
pub(crate) mod admission;
mod audit;
mod cluster;
pub(crate) mod connection;
mod drain;
mod invites;
mod notify;
pub(crate) mod params;
mod people;
mod presence;
mod provide;
mod ready;
mod routes;
mod scrape;
mod subscribe;
mod texts;
pub(crate) mod upgrade;
#[path = "web.rs"]
pub(crate) mod web_ui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use actix::prelude::*;
use actix_web::{web, App, HttpResponse};
use anyhow::Context as _;

use self::access::{OriginConfigError, OriginPolicy};
use self::admission::Connections;
use crate::auth::{Authenticator, SecretError};
use crate::channels::context::Shared;
use crate::channels::ChannelAddr;
use crate::config::Config;
use crate::providers::acp::AcpAgent;
use crate::providers::scripted::ScriptedAgent;
use crate::providers::Providers;
use crate::rate::Principals;
use crate::store::{Journal, MemoryJournal, SqliteJournal};
use crate::transport::listen::{bind, tune_socket};
use crate::transport::tls;
use crate::transport::CloseCause;

/// What the HTTP handlers and connections need: the channels' context and
/// the server's own tables.
pub(crate) struct AppState {
    /// The channels' context.
    pub shared: Arc<Shared>,
    /// The root channel (session lifecycle).
    pub root: ChannelAddr,
    /// Every provider, for registration over connections.
    pub agents: Arc<Providers>,
    /// Which web pages may open `/ahp`.
    pub origins: OriginPolicy,
    /// Token verification, when a secret is configured.
    pub auth: Option<Authenticator>,
    /// Connection slots and the open connections' queues (pinged by the
    /// heartbeat, closed with a reason at shutdown).
    pub connections: Arc<Connections>,
    /// What each principal may still send and have journaled now.
    pub principals: Principals,
    /// Who is looking at what in each chat (`tandem/setPresence`).
    pub presence: presence::PresenceTable,
    /// The store's last answer to `/readyz`'s write probe.
    readiness: Arc<ready::Readiness>,
}

/// Why a server refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A secret is configured but cannot be used.
    #[error("{0}")]
    Secret(#[from] SecretError),
    /// No secret, and an address others can reach.
    #[error("refusing to serve on {0} without authentication: set a secret (--auth-secret-file or TANDEM_AUTH_SECRET), or bind to loopback")]
    Unauthenticated(SocketAddr),
    /// An unusable `--allowed-origin`.
    #[error("{0}")]
    Origin(#[from] OriginConfigError),
    /// An unusable `--tls-cert` / `--tls-key`.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    /// A webhook that may not be one.
    #[error("webhook `{0}`: {1}")]
    Webhook(String, String),
}

/// What the start-up checks yield.
pub struct Checked {
    /// The token verifier, when a secret is configured.
    pub auth: Option<Authenticator>,
    /// The `Origin`/`Host` rules for `/ahp`.
    pub origins: OriginPolicy,
    /// TLS, when configured: certificate and key read and matched.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Check that `config` may be served on `addr`, before anything listens:
/// the secret, when set, must make a key (never silently no authentication);
/// without one only loopback is allowed, since everyone who can connect is
/// then an admin; every allowed origin must parse. `main` calls it before
/// binding, and [`run`] again, so a library caller gets the same guarantees.
pub fn check_config(config: &Config, addr: SocketAddr) -> Result<Checked, StartError> {
    let auth = config
        .auth_secret
        .as_deref()
        .map(Authenticator::new)
        .transpose()?;
    if auth.is_none() && !addr.ip().is_loopback() {
        return Err(StartError::Unauthenticated(addr));
    }
    for w in &config.notify.webhooks {
        let guarded = !addr.ip().is_loopback() && !w.allow_loopback;
        crate::notify::target::check(&w.url, guarded)
            .map_err(|e| StartError::Webhook(w.name.clone(), e))?;
    }
    let origins = OriginPolicy::new(addr, &config.allowed_origins)?;
    let tls = config.tls.as_ref().map(tls::server_config).transpose()?;
    Ok(Checked { auth, origins, tls })
}

/// `GET /healthz`: the process lives and serves HTTP (liveness: 200 for as
/// long as it can answer), with the server's own figures. Whether it can do
/// its work is `/readyz`'s ([`ready`]).
async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let mut body = serde_json::json!({
        "status": "ok",
        "serverSeq": state.shared.publisher.current(),
        "channels": state.shared.registry.len(),
        "connections": state.connections.open_len(),
        "replayRingBytes": state.shared.publisher.ring_bytes(),
        "replayRingFootprintBytes": state.shared.publisher.ring_footprint(),
    });
    if let Some(cluster) = state.shared.journal.health() {
        body["cluster"] = cluster;
    }
    if let Some(c) = state.shared.journal.commit_stats() {
        body["storeCommits"] = serde_json::json!(c);
    }
    if let Some(b) = state.shared.journal.memory_bytes() {
        body["storeMemoryBytes"] = b.into();
    }
    if let Some(m) = crate::memory::stats() {
        body["allocator"] = serde_json::json!({
            "allocatedBytes": m.allocated,
            "residentBytes": m.resident,
        });
    }
    HttpResponse::Ok().json(body)
}

/// The HTTP server: actix-web serves the web client and the HTTP endpoints; every
/// WebSocket upgrade is handed, with its socket, to [`upgrade::serve`].
fn http_server(
    state: &Arc<AppState>,
    config: &Config,
    listener: std::net::TcpListener,
) -> anyhow::Result<actix_web::dev::Server> {
    use actix_service::{fn_service, map_config, IntoServiceFactory as _, ServiceFactoryExt as _};
    let addr = listener.local_addr().context("reading the bound address")?;
    let idle_timeout = config.idle_timeout;
    let state = state.clone();
    Ok(actix_server::Server::build()
        .workers(config.http_workers.max(1))
        .disable_signals()
        .shutdown_timeout(5)
        .listen("tandem", listener, move || {
            let app_state = state.clone();
            let ws_state = state.clone();
            let app = App::new()
                .app_data(web::Data::from(app_state))
                .route("/ahp", web::get().to(upgrade::ahp_plain))
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(ready::readyz))
                .route("/metrics", web::get().to(scrape::metrics))
                .route("/admin/overview", web::get().to(admin::overview))
                .configure(web_ui::routes);
            actix_http::HttpService::build()
                .client_request_timeout(std::time::Duration::from_secs(5))
                .client_disconnect_timeout(std::time::Duration::from_secs(1))
                .local_addr(addr)
                .on_connect_ext(move |tcp: &actix_web::rt::net::TcpStream, _| {
                    tune_socket(tcp, idle_timeout)
                })
                .upgrade(fn_service(move |(req, framed)| {
                    let state = ws_state.clone();
                    async move {
                        upgrade::serve(state, req, framed)
                            .await
                            .map_err(actix_web::Error::from)
                    }
                }))
                .finish(map_config(
                    app.into_factory()
                        .map_err(|e: actix_web::Error| e.error_response()),
                    |_| actix_web::dev::AppConfig::default(),
                ))
                .tcp()
        })
        .context("listening")?
        .run())
}

/// How long a shutdown waits for the open connections' closes to go out
/// before the workers stop.
const SHUTDOWN_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Serve AHP on `listener` until `shutdown` resolves, then stop gracefully:
/// connections are closed with a reason and in-flight work finishes.
///
/// The server runs on its own thread with its own actix system, so callers
/// (tests, `main`) can be on any tokio runtime.
pub async fn run<F>(
    listener: std::net::TcpListener,
    config: Config,
    shutdown: F,
) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    // Refuse a bad configuration before creating a store for it.
    check_config(
        &config,
        listener.local_addr().context("reading the bound address")?,
    )?;
    let journal: Arc<dyn Journal> = match (&config.cluster, &config.data_dir) {
        (Some(cluster), _) => Arc::new(
            crate::store::JetStreamJournal::connect(cluster)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("joining the cluster (check --cluster)")?,
        ),
        (None, Some(dir)) => Arc::new(
            SqliteJournal::open_with_window(dir, config.durability, config.commit_window)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("opening the store (check --data-dir)")?,
        ),
        (None, None) => Arc::new(MemoryJournal::new()),
    };
    run_with_journal(listener, config, journal, shutdown).await
}

/// [`run`] with a given journal (tests inject one to observe invariant 1).
pub async fn run_with_journal<F>(
    listener: std::net::TcpListener,
    config: Config,
    journal: Arc<dyn Journal>,
    shutdown: F,
) -> anyhow::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr().context("reading the bound address")?;
    let Checked { auth, origins, tls } = check_config(&config, addr)?;
    let base_url = config.notify.public_url.clone().unwrap_or_else(|| {
        let scheme = if tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{addr}")
    });
    // With TLS the HTTP server listens on a loopback port of its own, and
    // the public address ends TLS in front of it (`tls`).
    let (listener, tls_stop) = match tls {
        None => (listener, None),
        Some(tls_config) => {
            let inner = bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
                .context("binding the loopback port behind TLS")?;
            let inner_addr = inner.local_addr().context("reading the loopback port")?;
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let workers = config.http_workers.max(1);
            // The connection limit, and room for page loads beside it.
            let max_open = config.limits.max_connections.saturating_add(256);
            std::thread::Builder::new()
                .name("tandem-tls".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(workers)
                        .thread_name("tandem-tls")
                        .enable_all()
                        .build();
                    match rt {
                        Ok(rt) => rt.block_on(tls::terminate(
                            listener,
                            inner_addr,
                            tls_config,
                            max_open,
                            async {
                                let _ = stop_rx.await;
                            },
                        )),
                        Err(e) => tracing::error!(error = %e, "TLS runtime not started"),
                    }
                })
                .context("spawning the TLS thread")?;
            (inner, Some(stop_tx))
        }
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let store = journal.clone();
    let thread = std::thread::Builder::new()
        .name("tandem-server".into())
        .spawn(move || -> anyhow::Result<()> {
            let system = actix::System::new();
            system.block_on(async move {
                let arbiters: Vec<Arbiter> = (0..config.actor_threads.max(1))
                    .map(|_| Arbiter::new())
                    .collect();
                let providers = Arc::new(Providers::default());
                providers.register(Arc::new(ScriptedAgent));
                for spec in &config.agents {
                    providers.register(Arc::new(AcpAgent::new(spec.clone())));
                }
                let started = std::time::Instant::now();
                let mut recovered = journal
                    .recover()
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .context("reading the store")?;
                providers.restore_owners(std::mem::take(&mut recovered.provider_owners));
                let link = journal.cluster();
                let shared = Arc::new(
                    Shared::new(
                        config.clone(),
                        journal,
                        providers.clone(),
                        arbiters.iter().map(Arbiter::handle).collect(),
                        recovered.seq_floor,
                    )
                    .context("starting the serverSeq numbering")?
                    .with_cluster(link)
                    .with_notifier(base_url, !addr.ip().is_loopback())
                    .context("starting the notifier")?,
                );
                let (root, stats) = ChannelAddr::start_root(&shared, recovered)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .context("restoring the stored sessions")?;
                cluster::join(&shared, &root);
                tracing::info!(
                    sessions = stats.sessions,
                    chats = stats.chats,
                    replayed_actions = stats.replayed,
                    interrupted_turns = stats.interrupted_turns,
                    ms = started.elapsed().as_millis() as u64,
                    "store recovered"
                );
                let state = Arc::new(AppState {
                    shared,
                    root,
                    agents: providers,
                    origins,
                    auth,
                    connections: Arc::new(Connections::new(
                        config.limits.max_connections,
                        config.limits.max_connections_per_token,
                    )),
                    principals: Principals::default(),
                    presence: presence::PresenceTable::default(),
                    readiness: Arc::default(),
                });
                let app_state = state.clone();
                let server = http_server(&app_state, &config, listener)?;
                presence::join_cluster(&state);
                state
                    .shared
                    .notify
                    .serve(Arc::new(notify::ServerAudience(Arc::downgrade(&state))));
                let metrics = state.shared.metrics.clone();
                actix::spawn(async move {
                    let mut every = tokio::time::interval(scrape::UPKEEP_EVERY);
                    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        every.tick().await;
                        metrics.upkeep();
                    }
                });
                let open = state.connections.clone();
                actix::spawn(crate::transport::heartbeat(
                    move |slices| open.by_slot(slices),
                    config.heartbeat_interval,
                    config.idle_timeout,
                ));
                let _ = ready_tx.send((
                    server.handle(),
                    state.connections.clone(),
                    state.shared.clone(),
                ));
                server.await.context("serving")?;
                for a in arbiters {
                    a.stop();
                }
                Ok(())
            })
        })
        .context("spawning the server thread")?;
    let (handle, connections, shared) = match ready_rx.await {
        Ok(ready) => ready,
        Err(_) => {
            return match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(anyhow::anyhow!("the server thread stopped during start-up")),
            };
        }
    };
    tracing::info!("serving AHP");
    shutdown.await;
    tracing::info!("shutting down");
    // A cluster node hands its sessions to the others first.
    let drain_within = shared.config.drain;
    drain::drain(shared, drain_within).await;
    for conn in connections.queues() {
        conn.close(CloseCause::Shutdown);
    }
    // Upgraded sockets are ours, not the HTTP server's: give their closes
    // time to go out (each connection ends once its close is written and
    // the client answered, or after the linger) before the workers stop.
    let _ = tokio::time::timeout(SHUTDOWN_CLOSE_WAIT, connections.all_closed()).await;
    // TLS goes last: the closes above pass through it.
    if let Some(stop) = tls_stop {
        let _ = stop.send(());
    }
    handle.stop(true).await;
    let served = tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| anyhow::anyhow!("joining the server thread: {e}"))?
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))?;
    // Everything accepted before the stop is on disk before we return.
    tokio::task::spawn_blocking(move || store.sync())
        .await
        .map_err(|e| anyhow::anyhow!("syncing the store: {e}"))?
        .map_err(|e| anyhow::anyhow!("syncing the store: {e}"))?;
    tracing::info!("stopped");
    served
}
