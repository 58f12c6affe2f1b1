//! The store of a spawned server: `--in-memory`, or the SQLite store as
//! `--durability <level> --data-dir <dir>` with a scratch directory.
//!
//! `durable` and `recovery` take `--durability full|relaxed|none` (default
//! full); the other scenarios take the global `--store memory|full|relaxed`
//! (default memory, to measure fan-out apart from the journal). A binary
//! without the store flags is refused rather than reported as durable; a
//! spawned server never falls back to its default `./tandem-data`.
//!
//! `jetstream` (as `--durability` or `--store`) keeps the journal in NATS
//! JetStream instead: the load generator starts its own `nats-server -js`
//! (see [`crate::nats`]) and the server runs `--cluster nats://127.0.0.1:PORT
//! --node-id loadtest`. nats-server is stopped when the plan is cleaned up or
//! dropped, and its CPU time is reported apart from the server's.

use std::path::PathBuf;

use clap::Args;
use parking_lot::Mutex;

use crate::nats::NatsServer;
use crate::progress::note;
use crate::report::ScenarioResult;
use crate::server::{tandem_supports, Server, ServerOpts, StopHow};

/// `--durability` / `--data-dir` for the server.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Durability level passed to the server (`--durability full|relaxed`);
    /// `none` runs the server `--in-memory`; `jetstream` starts a
    /// `nats-server -js` and runs the server on it (`--cluster`).
    #[arg(long, default_value = "full")]
    pub durability: String,
    /// Store directory passed to the server (`--data-dir <dir>`) [default: a
    /// fresh directory under the system temp dir, removed afterwards].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the default data directory after the run.
    #[arg(long)]
    pub keep_data: bool,
}

/// The server arguments for a store, and a label for the report.
pub struct StorePlan {
    /// Extra `tandem serve` arguments.
    pub args: Vec<String>,
    /// What the results measure.
    pub label: String,
    /// A directory to remove afterwards.
    pub cleanup: Option<PathBuf>,
    /// Whether a store is in use (state should survive a restart).
    pub persistent: bool,
    /// The nats-server started for `jetstream` (stopped by [`Self::cleanup`]
    /// or on drop).
    pub nats: Mutex<Option<NatsServer>>,
}

impl StorePlan {
    /// Stop the nats-server (if any), then remove the scratch data directory
    /// (unless kept).
    pub fn cleanup(&self) {
        if let Some(mut n) = self.nats.lock().take() {
            n.stop();
        }
        if let Some(d) = &self.cleanup {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The store of the non-store scenarios, from the global `--store`.
pub fn plan_default(opts: &ServerOpts, scenario: &str) -> anyhow::Result<StorePlan> {
    let store = StoreArgs {
        durability: opts.store.clone(),
        data_dir: None,
        keep_data: false,
    };
    plan(&store, opts, scenario)
}

/// Start the Tandem of a scenario on the default store and announce it.
pub async fn start_default(
    opts: &ServerOpts,
    scenario: &str,
) -> anyhow::Result<(Server, StorePlan)> {
    let plan = plan_default(opts, scenario)?;
    let server = Server::tandem(opts, &plan.args).await?;
    note(format!(
        "tandem: {} at {} ({})",
        server.label, server.url, plan.label
    ));
    Ok((server, plan))
}

/// Stop the server, remove its scratch store, and label `res` with the store.
pub async fn finish(
    server: Server,
    plan: StorePlan,
    res: anyhow::Result<ScenarioResult>,
) -> anyhow::Result<ScenarioResult> {
    server.stop(StopHow::Term).await?;
    plan.cleanup();
    let mut r = res?;
    r.put("store", plan.label.clone());
    Ok(r)
}

/// Work out the store flags, refusing to fake durability.
pub fn plan(store: &StoreArgs, opts: &ServerOpts, scenario: &str) -> anyhow::Result<StorePlan> {
    if opts.url.is_none()
        && opts.in_process
        && !matches!(store.durability.as_str(), "none" | "memory" | "")
    {
        anyhow::bail!("`{scenario}` passes store flags to a spawned server; drop --in-process");
    }
    if matches!(store.durability.as_str(), "none" | "memory" | "") {
        let in_memory =
            opts.url.is_none() && !opts.in_process && tandem_supports(opts, "--in-memory")?;
        return Ok(StorePlan {
            args: if in_memory {
                vec!["--in-memory".into()]
            } else {
                Vec::new()
            },
            label: "in-memory journal (nothing is durable)".into(),
            cleanup: None,
            persistent: false,
            nats: Mutex::new(None),
        });
    }
    if opts.url.is_some() {
        return Ok(StorePlan {
            args: Vec::new(),
            label: "as configured on the server at --url".into(),
            cleanup: None,
            persistent: true,
            nats: Mutex::new(None),
        });
    }
    if store.durability == "jetstream" {
        return plan_jetstream(store, opts, scenario);
    }
    let has_durability = tandem_supports(opts, "--durability")?;
    let has_data_dir = tandem_supports(opts, "--data-dir")?;
    if !has_durability || !has_data_dir {
        anyhow::bail!(
            "this tandem binary has no {} flag yet: the SQLite store is not built, so `{scenario}` \
             cannot measure durable storage. Run with `--durability none` (or `--store memory`) \
             to exercise the scenario against the in-memory journal (labelled as such), or rebuild \
             once the store lands (`cargo build --release --workspace`).",
            match (has_durability, has_data_dir) {
                (false, false) => "--durability or --data-dir",
                (false, true) => "--durability",
                _ => "--data-dir",
            }
        );
    }
    let (dir, cleanup) = match &store.data_dir {
        Some(d) => (d.clone(), None),
        None => {
            let d = crate::server::scratch_dir().join(format!("data-{scenario}"));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d)?;
            let cleanup = (!store.keep_data).then(|| d.clone());
            (d, cleanup)
        }
    };
    let tmpfs = on_tmpfs(&dir);
    Ok(StorePlan {
        args: vec![
            "--durability".into(),
            store.durability.clone(),
            "--data-dir".into(),
            dir.display().to_string(),
        ],
        label: format!(
            "store: --durability {} --data-dir {}{}",
            store.durability,
            dir.display(),
            if tmpfs {
                " (tmpfs: fsync costs nothing here, pass --data-dir on a disk)"
            } else {
                ""
            }
        ),
        cleanup,
        persistent: true,
        nats: Mutex::new(None),
    })
}

/// `jetstream`: start a `nats-server -js` whose store is `--data-dir` or a
/// scratch directory, and point the server at it.
fn plan_jetstream(
    store: &StoreArgs,
    opts: &ServerOpts,
    scenario: &str,
) -> anyhow::Result<StorePlan> {
    if !tandem_supports(opts, "--cluster")? {
        anyhow::bail!(
            "this tandem binary has no --cluster flag: rebuild it (`cargo build --release \
             --workspace`) to run `{scenario}` on JetStream"
        );
    }
    let (dir, cleanup) = match &store.data_dir {
        Some(d) => (d.clone(), None),
        None => {
            let d = crate::server::scratch_dir().join(format!("nats-{scenario}"));
            let cleanup = (!store.keep_data).then(|| d.clone());
            (d, cleanup)
        }
    };
    let nats = NatsServer::start(&dir)?;
    note(format!(
        "nats-server (pid {}) at {}, JetStream store in {}, log {}",
        nats.pid().unwrap_or(0),
        nats.url(),
        dir.display(),
        nats.log.display()
    ));
    let tmpfs = on_tmpfs(&dir);
    Ok(StorePlan {
        args: vec![
            "--cluster".into(),
            nats.url(),
            "--node-id".into(),
            "loadtest".into(),
        ],
        label: format!(
            "store: NATS JetStream (nats-server -js at {}, store {}){}",
            nats.url(),
            dir.display(),
            if tmpfs { " (tmpfs)" } else { "" }
        ),
        cleanup,
        persistent: true,
        nats: Mutex::new(Some(nats)),
    })
}

/// Whether `dir` is on tmpfs, where fsync is free and "durable" rates flatter.
fn on_tmpfs(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we pass.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(path.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC
    }
}
