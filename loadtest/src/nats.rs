//! A `nats-server -js` the load generator starts for `--store jetstream` /
//! `--durability jetstream`: loopback only, on a free port, its JetStream
//! store in this run's scratch directory.
//!
//! It is stopped (SIGINT, then SIGKILL after 5 s) when the store plan that
//! owns it is cleaned up or dropped, so also when a scenario fails; it dies
//! with the load generator (`PR_SET_PDEATHSIG`). While it runs its pid is
//! published through [`store_pid`], and every phase reads its CPU time from
//! `/proc` next to the tandem server's: it is part of the store's cost.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// Pid of the running store process (nats-server), 0 when none.
static STORE_PID: AtomicU32 = AtomicU32::new(0);

/// The pid of the store process the load generator started (nats-server),
/// for CPU accounting, while it runs.
pub fn store_pid() -> Option<u32> {
    match STORE_PID.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// `nats-server` on `PATH`, or where Debian's package puts it.
pub fn nats_server_bin() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nats-server"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin/nats-server", "/usr/local/sbin/nats-server"].map(PathBuf::from))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the jetstream store needs nats-server (2.9 or later), found neither on PATH \
                 nor in /usr/sbin: install it with `apt-get install nats-server`"
            )
        })
}

/// A running `nats-server -js` on 127.0.0.1.
pub struct NatsServer {
    child: Option<Child>,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its JetStream store directory (`-sd`).
    pub dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
}

impl NatsServer {
    /// Start one with its store in `dir` (created afresh), and wait until it
    /// listens (at most 15 s).
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = nats_server_bin()?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the nats-server store {}", dir.display()))?;
        let port = crate::server::free_port()?;
        let log = dir.join("nats-server.log");
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&bin);
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.join("js"))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        // SAFETY: prctl in the forked child before exec touches no shared state.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut s = Self {
            child: Some(child),
            port,
            dir: dir.to_owned(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(c) = s.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    s.child = None;
                    bail!(
                        "nats-server exited during start-up ({status}); its log ({}):\n{}",
                        s.log.display(),
                        std::fs::read_to_string(&s.log).unwrap_or_default()
                    );
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                s.stop();
                bail!("nats-server did not listen on 127.0.0.1:{port} within 15 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(pid) = s.pid() {
            STORE_PID.store(pid, Ordering::Release);
        }
        Ok(s)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stop it: SIGINT (a clean shutdown), SIGKILL if it is not gone within
    /// 5 s. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = STORE_PID.compare_exchange(child.id(), 0, Ordering::AcqRel, Ordering::Acquire);
        // SAFETY: signalling our own child by pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
        crate::progress::note("nats-server did not stop within 5 s; killing it");
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
