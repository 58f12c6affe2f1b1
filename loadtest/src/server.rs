//! The server under test: a spawned `tandem` child process (the default), a
//! Tandem started in this process (`--in-process`), a server at `--url`, or
//! the baseline (a child running `loadtest baseline`).
//!
//! A child process is what a user runs, and its memory and CPU can be read
//! from `/proc/<pid>`; it inherits this process's raised file limit and is
//! killed if the load generator dies (`PR_SET_PDEATHSIG`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::progress::note;

/// Where the server comes from (shared by every scenario).
#[derive(Args, Debug, Clone, Default)]
pub struct ServerOpts {
    /// Test a running server at this URL (`ws://host:port/ahp`) instead of
    /// spawning one.
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// With `--url`: the server's pid on this machine, to read its memory
    /// (`connections`) and CPU.
    #[arg(long, global = true)]
    pub server_pid: Option<u32>,
    /// Start Tandem inside this process (`tandem::run`) instead of spawning
    /// the release binary. Not for `connections` (RSS would include the load
    /// generator) nor `recovery` (needs a restart).
    #[arg(long, global = true)]
    pub in_process: bool,
    /// The `tandem` binary to spawn [default: next to this executable, i.e.
    /// target/release/tandem].
    #[arg(long, global = true)]
    pub server_bin: Option<PathBuf>,
    /// Extra argument for the spawned server (repeatable), e.g.
    /// `--server-arg=--outbound-limit-bytes=16777216`.
    #[arg(long = "server-arg", global = true, allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// The baseline server's URL, when it runs elsewhere [default: spawn
    /// `loadtest baseline`].
    #[arg(long, global = true)]
    pub baseline_url: Option<String>,
    /// Store of the spawned server in `fanout`, `drafts`, `connections` and
    /// `reconnect-storm`: `memory` (`--in-memory`), `full` / `relaxed`
    /// (SQLite in a scratch `--data-dir`), or `jetstream` (a `nats-server -js`
    /// started here, the server on `--cluster`). `durable` and `recovery` use
    /// their own `--durability`, which takes the same `jetstream`.
    #[arg(long, global = true, default_value = "memory")]
    pub store: String,
    /// Spread client sockets over this many loopback source addresses
    /// (127.0.0.1, 127.0.0.2, …) for more than ~28,000 connections.
    #[arg(long, global = true, default_value_t = 1)]
    pub source_ips: usize,
}

enum Inner {
    Child(tokio::process::Child),
    InProcess {
        stop: oneshot::Sender<()>,
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
    },
    External,
}

/// A server the scenario talks to.
pub struct Server {
    /// `ws://…/ahp`.
    pub url: String,
    /// Its process id when it is a separate process on this machine.
    pub pid: Option<u32>,
    /// What it is, for the report.
    pub label: String,
    /// Its log file (children).
    pub log: Option<PathBuf>,
    /// Its port.
    pub port: u16,
    inner: Inner,
}

/// How to stop a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StopHow {
    /// SIGINT, as Ctrl-C: a graceful shutdown.
    Term,
    /// SIGKILL: a crash.
    Kill,
}

/// A free loopback port (bound and released; a small race is accepted).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Scratch directory for logs and data of this run.
pub fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-loadtest-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

/// Per-principal limits a spawned server gets for a load test: without
/// authentication every connection is the same principal (`local`), whose
/// defaults (256 connections, 5,000 dispatches/s per connection) are meant
/// for people, not for thousands of simulated clients. Flags the user passes
/// with `--server-arg` win; flags the binary lacks are skipped.
pub const LOAD_TEST_LIMITS: [(&str, &str); 7] = [
    ("--max-connections-per-token", "1000000"),
    ("--max-sessions-per-token", "1000000"),
    ("--dispatches-per-sec", "1000000000"),
    ("--max-subscriptions-per-connection", "1000000"),
    ("--dispatch-bytes-per-sec", "1000000000000"),
    ("--inbound-bytes-per-sec", "1000000000000"),
    ("--requests-per-sec", "1000000000"),
];

fn load_test_limits(opts: &ServerOpts) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for (flag, value) in LOAD_TEST_LIMITS {
        let given = opts
            .server_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        if !given && tandem_supports(opts, flag)? {
            out.push(flag.to_owned());
            out.push(value.to_owned());
        }
    }
    Ok(out)
}

/// `NAME=COMMAND ARG…` for `tandem serve --agent`, each word quoted for the
/// server's shell-style split.
fn agent_flag(agent: &tandem::config::AgentSpec) -> anyhow::Result<String> {
    if !agent.env.is_empty() || agent.cwd.is_some() {
        bail!(
            "agent {}: --agent cannot carry env or cwd; use a config file",
            agent.name
        );
    }
    let words: Vec<String> = std::iter::once(&agent.command)
        .chain(&agent.args)
        .map(|w| shell_quote(w))
        .collect();
    Ok(format!("{}={}", agent.name, words.join(" ")))
}

/// `word` as one POSIX shell word.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,=@%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `name` in a directory of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Remove this run's scratch directory (logs, default data directories).
pub fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch_dir());
}

/// The `tandem` binary to spawn.
pub fn tandem_bin(opts: &ServerOpts) -> anyhow::Result<PathBuf> {
    if let Some(p) = &opts.server_bin {
        return Ok(p.clone());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("tandem"));
            // Test binaries live in target/<profile>/deps.
            if let Some(up) = dir.parent() {
                candidates.push(up.join("tandem"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(root.join("target/release/tandem"));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow!(
            "no tandem binary found next to this executable or in target/release: \
                 build it with `cargo build --release --workspace`, or pass --server-bin, \
                 --in-process or --url"
        )
    })
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// Warn when the binary is older than the server sources it was built from.
fn warn_if_stale(bin: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    let (Some(src_t), Ok(bin_t)) = (
        newest_mtime(&src),
        std::fs::metadata(bin).and_then(|m| m.modified()),
    ) else {
        return;
    };
    if src_t > bin_t {
        note(format!(
            "warning: {} is older than the sources in {}; rebuild with `cargo build --release --workspace`",
            bin.display(),
            src.display()
        ));
    }
}

/// Whether `tandem serve --help` mentions `flag` (e.g. `--durability`).
pub fn tandem_supports(opts: &ServerOpts, flag: &str) -> anyhow::Result<bool> {
    static HELP: Mutex<Option<(PathBuf, String)>> = Mutex::new(None);
    let bin = tandem_bin(opts)?;
    let mut cached = HELP.lock();
    if cached.as_ref().map(|(p, _)| p != &bin).unwrap_or(true) {
        let out = std::process::Command::new(&bin)
            .args(["serve", "--help"])
            .output()
            .with_context(|| format!("running {} serve --help", bin.display()))?;
        *cached = Some((bin, String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    Ok(cached.as_ref().is_some_and(|(_, text)| text.contains(flag)))
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

async fn spawn_child(
    program: &Path,
    args: Vec<String>,
    port: u16,
    label: String,
) -> anyhow::Result<Server> {
    let log = scratch_dir().join(format!("{}-{port}.log", label.replace(' ', "-")));
    let file = std::fs::File::create(&log)?;
    let mut cmd = tokio::process::Command::new(program);
    // A relative default path (e.g. `./tandem-data`) lands in scratch.
    cmd.args(&args)
        .current_dir(scratch_dir())
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        );
    // SAFETY: prctl in the forked child before exec touches no shared state.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawning {}", program.display()))?;
    let pid = child.id();
    let addr = format!("127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{label} exited during start-up ({status}); its log ({}):\n{}",
                log.display(),
                log_tail(&log)
            );
        }
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{label} did not listen on {addr} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Server {
        url: format!("ws://{addr}/ahp"),
        pid,
        label,
        log: Some(log),
        port,
        inner: Inner::Child(child),
    })
}

impl Server {
    /// The Tandem to test: `--url`, `--in-process`, or a spawned child with
    /// `extra_args` (store options) after `serve --bind`.
    pub async fn tandem(opts: &ServerOpts, extra_args: &[String]) -> anyhow::Result<Self> {
        Self::tandem_on(opts, extra_args, None).await
    }

    /// [`Server::tandem`] on a given port (restarts keep the address).
    pub async fn tandem_on(
        opts: &ServerOpts,
        extra_args: &[String],
        port: Option<u16>,
    ) -> anyhow::Result<Self> {
        Self::tandem_with_agents(opts, extra_args, port, &[]).await
    }

    /// [`Server::tandem_on`] that also declares ACP `agents`: `--agent
    /// NAME=COMMAND ARG…` for a child, `Config::agents` in process. A server
    /// at `--url` must declare them itself.
    pub async fn tandem_with_agents(
        opts: &ServerOpts,
        extra_args: &[String],
        port: Option<u16>,
        agents: &[tandem::config::AgentSpec],
    ) -> anyhow::Result<Self> {
        if let Some(url) = &opts.url {
            let port = url
                .rsplit(':')
                .next()
                .and_then(|p| p.split('/').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            return Ok(Self {
                url: url.clone(),
                pid: opts.server_pid,
                label: format!("tandem at {url}"),
                log: None,
                port,
                inner: Inner::External,
            });
        }
        if opts.in_process {
            if !extra_args.is_empty() || !opts.server_args.is_empty() {
                bail!("server arguments cannot be applied to an in-process server");
            }
            let listener = std::net::TcpListener::bind(("127.0.0.1", port.unwrap_or(0)))?;
            let port = listener.local_addr()?.port();
            let (stop, rx) = oneshot::channel::<()>();
            let mut config = tandem::Config::default();
            // One anonymous principal opens every connection of a load test.
            config.limits.max_connections_per_token = usize::MAX;
            config.limits.max_sessions_per_token = usize::MAX;
            config.limits.dispatches_per_sec = 1e9;
            config.limits.dispatch_burst = 1e9;
            config.limits.dispatch_bytes_per_sec = 1e12;
            config.limits.dispatch_bytes_burst = 1e12;
            config.limits.inbound_bytes_per_sec = 1e12;
            config.limits.requests_per_sec = 1e9;
            config.agents = agents.to_vec();
            let task = tokio::spawn(tandem::run(listener, config, async {
                let _ = rx.await;
            }));
            let addr = format!("127.0.0.1:{port}");
            for _ in 0..500 {
                if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            return Ok(Self {
                url: format!("ws://{addr}/ahp"),
                pid: None,
                label: "tandem (in-process)".into(),
                log: None,
                port,
                inner: Inner::InProcess { stop, task },
            });
        }
        let bin = tandem_bin(opts)?;
        warn_if_stale(&bin);
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut args = vec![
            "serve".to_owned(),
            "--bind".to_owned(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(extra_args.iter().cloned());
        for agent in agents {
            args.push("--agent".to_owned());
            args.push(agent_flag(agent)?);
        }
        let limits = load_test_limits(opts)?;
        let raised = !limits.is_empty();
        args.extend(limits);
        args.extend(opts.server_args.iter().cloned());
        let mut s = spawn_child(&bin, args, port, "tandem".into()).await?;
        s.label = format!(
            "tandem (child {}{})",
            bin.display(),
            if raised {
                ", per-principal limits raised for the load test"
            } else {
                ""
            }
        );
        Ok(s)
    }

    /// The baseline: `--baseline-url`, in this process (`--in-process`), or a
    /// child running `<this executable> baseline`.
    pub async fn baseline(opts: &ServerOpts) -> anyhow::Result<Self> {
        if let Some(url) = &opts.baseline_url {
            return Ok(Self {
                url: url.clone(),
                pid: None,
                label: format!("baseline at {url}"),
                log: None,
                port: 0,
                inner: Inner::External,
            });
        }
        if opts.in_process {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let port = listener.local_addr()?.port();
            let (stop, rx) = oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                tokio::select! {
                    r = crate::baseline::serve(listener) => r,
                    _ = rx => Ok(()),
                }
            });
            return Ok(Self {
                url: format!("ws://127.0.0.1:{port}/ahp"),
                pid: None,
                label: "baseline (in-process)".into(),
                log: None,
                port,
                inner: Inner::InProcess { stop, task },
            });
        }
        let exe = std::env::current_exe()?;
        let port = free_port()?;
        let args = vec![
            "baseline".to_owned(),
            "--bind".to_owned(),
            format!("127.0.0.1:{port}"),
        ];
        let mut s = spawn_child(&exe, args, port, "baseline".into()).await?;
        s.label = "baseline (child, tokio + tungstenite)".into();
        Ok(s)
    }

    /// The Node.js peer: `node loadtest/node/room.js PORT` (a `ws` room
    /// broadcast speaking the baseline's frames), its npm dependencies
    /// installed first when `node_modules` is missing.
    pub async fn node() -> anyhow::Result<Self> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("node");
        let node = find_on_path("node").ok_or_else(|| {
            anyhow!("the Node.js peer needs `node` (20 or later) on PATH; install Node.js or pass --peers tokio")
        })?;
        if !dir.join("node_modules").is_dir() {
            let npm = find_on_path("npm").ok_or_else(|| {
                anyhow!(
                    "{} has no node_modules and `npm` is not on PATH to install them",
                    dir.display()
                )
            })?;
            note(format!(
                "installing the Node.js peer's packages: npm ci --omit=dev in {}",
                dir.display()
            ));
            let out = tokio::process::Command::new(&npm)
                .args(["ci", "--omit=dev", "--no-audit", "--no-fund"])
                .current_dir(&dir)
                .stdin(Stdio::null())
                .output()
                .await
                .with_context(|| format!("running {} ci", npm.display()))?;
            if !out.status.success() {
                bail!(
                    "npm ci --omit=dev in {} failed ({}):\n{}",
                    dir.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let port = free_port()?;
        let args = vec![dir.join("room.js").display().to_string(), port.to_string()];
        let mut s = spawn_child(&node, args, port, "node".into()).await?;
        s.label = "node (child, ws + bufferutil room broadcast)".into();
        Ok(s)
    }

    /// Peak resident memory of the server process so far (`VmHWM`).
    pub fn peak_rss(&self) -> Option<u64> {
        self.pid.and_then(crate::sys::peak_rss_bytes)
    }

    /// Resident memory of the server process, when it is one we can see.
    pub fn rss(&self) -> Option<u64> {
        self.pid.and_then(crate::sys::rss_bytes)
    }

    /// Anonymous resident memory of the server process (heap and stacks).
    pub fn rss_anon(&self) -> Option<u64> {
        self.pid.and_then(crate::sys::rss_anon_bytes)
    }

    /// Whether this is a child we spawned.
    pub fn is_child(&self) -> bool {
        matches!(self.inner, Inner::Child(_))
    }

    /// Stop the server (children: by `how`; in-process: gracefully).
    pub async fn stop(self, how: StopHow) -> anyhow::Result<()> {
        match self.inner {
            Inner::Child(mut child) => {
                if let Some(pid) = child.id() {
                    let sig = match how {
                        StopHow::Term => libc::SIGINT,
                        StopHow::Kill => libc::SIGKILL,
                    };
                    // SAFETY: signalling our own child by pid.
                    unsafe {
                        libc::kill(pid as libc::pid_t, sig);
                    }
                }
                match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
                    Ok(r) => {
                        r?;
                    }
                    Err(_) => {
                        note("server did not stop within 15 s; killing it");
                        child.kill().await?;
                    }
                }
            }
            Inner::InProcess { stop, task } => {
                let _ = stop.send(());
                let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
            }
            Inner::External => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem::config::AgentSpec;

    #[test]
    fn agent_flags_survive_the_servers_split() {
        let spec = AgentSpec::new(
            "acp",
            "/tmp/my agent's dir/acp_test_agent",
            vec!["--load-session".into(), String::new()],
        );
        let flag = agent_flag(&spec).expect("no env, no cwd");
        assert_eq!(AgentSpec::parse_flag(&flag), Ok(spec));
    }
}
