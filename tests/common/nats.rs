//! A real `nats-server` with JetStream for cluster tests: Debian's package,
//! installed with apt-get when the machine lacks it, started on a free
//! loopback port with its store in a temp directory, killed on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `nats-server` program, installed on first use if missing.
pub fn nats_server_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let find = || {
            [
                "/usr/sbin/nats-server",
                "/usr/bin/nats-server",
                "/usr/local/bin/nats-server",
            ]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        };
        if let Some(p) = find() {
            return p;
        }
        eprintln!("installing nats-server with apt-get");
        for args in [
            vec!["update"],
            vec!["install", "-y", "--no-install-recommends", "nats-server"],
        ] {
            let ok = Command::new("apt-get")
                .args(&args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "apt-get {args:?} failed: cluster tests need nats-server"
            );
        }
        find().expect("nats-server installed but not found")
    })
    .clone()
}

/// One `nats-server -js` on loopback.
pub struct NatsServer {
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
    dir: super::Scratch,
}

impl NatsServer {
    /// Start one with a fresh store.
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir = super::temp_dir("nats");
        let mut s = Self {
            child: None,
            port,
            dir,
        };
        s.restart();
        s
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill it (its store stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port and store; returns once it accepts
    /// connections.
    pub fn restart(&mut self) {
        self.stop();
        let log = std::fs::File::create(self.dir.join("nats.log")).expect("log");
        let child = Command::new(nats_server_bin())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("js"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Tandem node of the cluster on `nats` (2-second leases), its log in
/// `<dir>/<id>.log`.
pub fn node(dir: &std::path::Path, nats: &NatsServer, id: &str) -> super::ServerProcess {
    super::ServerProcess::spawn_with(
        &dir.join(format!("{id}.log")),
        &[
            "--cluster",
            &nats.url(),
            "--node-id",
            id,
            "--lease-secs",
            "2",
        ],
    )
}

/// Send `sig` (`-STOP`, `-CONT`, `-KILL`) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// Who wrote each message of `channel`'s subject in the journal stream, in
/// order: a node's name for a batch, `fence by <node>` for a fence.
pub async fn writers(nats: &NatsServer, channel: &str) -> Vec<String> {
    let client = async_nats::connect(nats.url())
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream("TANDEM_JOURNAL")
        .await
        .expect("the journal stream");
    let subject = format!(
        "tandem.journal.{}",
        channel
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let mut out = Vec::new();
    let mut seq = 1;
    while let Ok(m) = stream
        .raw_message_builder()
        .sequence(seq)
        .next_by_subject(subject.clone())
        .send()
        .await
    {
        seq = m.sequence + 1;
        let header = |n: &str| m.headers.get(n).map(|v| v.as_str().to_owned());
        out.push(match (header("Tandem-Node"), header("Tandem-Fence")) {
            (Some(n), _) => n,
            (None, Some(n)) => format!("fence by {n}"),
            (None, None) => "?".to_owned(),
        });
    }
    out
}
