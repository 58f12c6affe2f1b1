//! `tandem` — parse the command line and run the server.

use tandem::config::cli::{self, LogFormat};

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

fn main() {
    tandem::memory::install(tandem::memory::Allocator {
        stats: jemalloc_stats,
        release: jemalloc_release,
        flush_thread: jemalloc_flush_thread,
    });
    let built_in = [tandem::providers::scripted::PROVIDER_ID];
    let invocation = match cli::parse_from(std::env::args_os().collect(), &built_in) {
        Ok(i) => i,
        Err(cli::CliError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("tandem: {e}");
            std::process::exit(1);
        }
    };
    let done = match invocation {
        cli::Invocation::Serve(s) => serve(*s),
        cli::Invocation::Token(t) => mint(t),
        cli::Invocation::CheckConfig { file, serve } => check(&file, &serve),
        cli::Invocation::AuditExport { session, serve } => export_audit(&session, &serve),
    };
    if let Err(e) = done {
        eprintln!("tandem: {e:#}");
        std::process::exit(1);
    }
}

/// Log to stderr in `format`; `RUST_LOG` filters (default: info).
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,actix_server=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
}

/// `tandem config check FILE`: the file parsed, and the checks the server
/// makes before it opens a store or binds a port.
fn check(file: &std::path::Path, serve: &cli::Serve) -> anyhow::Result<()> {
    tandem::server::check_config(&serve.config, serve.bind)?;
    println!(
        "{}: valid (listens on {}, {}, {} agent(s) declared)",
        file.display(),
        serve.bind,
        match (&serve.config.cluster, &serve.config.data_dir) {
            (Some(c), _) => format!("cluster node `{}`", c.node_id),
            (None, Some(d)) => format!("SQLite store in {}", d.display()),
            (None, None) => "in memory".to_owned(),
        },
        serve.config.agents.len()
    );
    Ok(())
}

/// `tandem audit export --session URI`: the session's audit log as JSON
/// lines on stdout, from the store the serve flags name.
fn export_audit(session: &str, serve: &cli::Serve) -> anyhow::Result<()> {
    use std::io::Write;
    const PAGE: u64 = 500;
    let session: tandem::ids::ChannelUri = session.into();
    let cluster = match (&serve.config.cluster, &serve.config.data_dir) {
        (Some(cluster), _) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let journal = rt
                .block_on(tandem::store::JetStreamJournal::connect(cluster))
                .map_err(|e| anyhow::anyhow!("reaching the cluster's store: {e}"))?;
            Some(journal)
        }
        (None, Some(_)) => None,
        (None, None) => {
            anyhow::bail!("name the store: --data-dir DIR, or --cluster URL --node-id ID")
        }
    };
    let mut out = std::io::stdout().lock();
    let mut after = 0;
    loop {
        let page = match (&cluster, &serve.config.data_dir) {
            (Some(j), _) => tandem::store::Journal::audit_page(j, &session, after, PAGE),
            (None, Some(dir)) => {
                tandem::store::SqliteJournal::read_audit(dir, &session, after, PAGE)
            }
            (None, None) => unreachable!("checked above"),
        }
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (cursor, entry) in &page {
            writeln!(out, "{entry}")?;
            after = *cursor;
        }
        if (page.len() as u64) < PAGE {
            return Ok(());
        }
    }
}

fn serve(serve: cli::Serve) -> anyhow::Result<()> {
    init_logs(serve.log_format);
    let cli::Serve { config, bind, .. } = serve;
    // The same checks `run` makes, before a store is opened or a port bound.
    tandem::server::check_config(&config, bind)?;
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
    let listener =
        tandem::bind(bind).map_err(|e| anyhow::anyhow!("cannot listen on {bind}: {e}"))?;
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
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    println!("tandem listening on {scheme}://{addr}");
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

fn mint(t: cli::TokenArgs) -> anyhow::Result<()> {
    let secret = t.secret.secret()?.ok_or_else(|| {
        anyhow::anyhow!("no secret: set --auth-secret-file or TANDEM_AUTH_SECRET")
    })?;
    let auth = tandem::auth::Authenticator::new(&secret)?;
    let claims = tandem::auth::Claims {
        sub: t.subject,
        role: t.role,
        exp: tandem::auth::now_secs() + t.ttl_secs,
        sessions: (!t.sessions.is_empty()).then_some(t.sessions),
        name: t.name.and_then(|n| tandem::people::clean_name(&n)),
        access: (!t.access.is_empty()).then(|| t.access.into_iter().collect()),
    };
    println!(
        "{}",
        auth.mint(&claims).map_err(|e| anyhow::anyhow!("{e}"))?
    );
    Ok(())
}
