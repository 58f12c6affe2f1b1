//! A real `nats-server` with JetStream for cluster tests: Debian's package
//! (`scripts/test` installs it), started on a free loopback port with its
//! store in a temp directory, killed on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `nats-server` program: on `PATH`, or where Debian's package puts
/// it. Missing, the test fails at once saying how to get it.
pub fn nats_server_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nats-server not found on PATH, in /usr/sbin or /usr/local/sbin: run scripts/test, which installs it"
            )
        })
}

/// One `nats-server -js` on loopback.
pub struct NatsServer {
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
    dir: super::Scratch,
    /// Options beyond the defaults (users, TLS).
    extra: Vec<String>,
}

impl NatsServer {
    /// Start one with a fresh store.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start one with `extra` options (e.g. `--user`, `--pass`).
    pub fn start_with(extra: &[&str]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir = super::temp_dir("nats");
        let mut s = Self {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.restart();
        s
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its log file.
    pub fn log(&self) -> std::path::PathBuf {
        self.dir.join("nats.log")
    }

    /// Kill it (its store stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port and store; returns once it says it
    /// is ready (its listeners are up by then).
    pub fn restart(&mut self) {
        use std::io::{BufRead, Write};
        self.stop();
        let mut log = std::fs::File::create(self.dir.join("nats.log")).expect("log");
        let mut child = Command::new(nats_server_bin())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("js"))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nats-server");
        // Its log goes on to the file; the line that says it is ready is
        // the signal.
        let stderr = child.stderr.take().expect("piped stderr");
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log, "{line}");
                if line.contains("Server is ready") {
                    let _ = ready_tx.send(());
                }
            }
        });
        self.child = Some(child);
        ready
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!(
                    "nats-server did not start: see {}",
                    self.dir.join("nats.log").display()
                )
            });
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
    node_with_env(dir, nats, id, &[])
}

/// [`node`] with environment variables set for the server.
pub fn node_with_env(
    dir: &std::path::Path,
    nats: &NatsServer,
    id: &str,
    env: &[(&str, &str)],
) -> super::ServerProcess {
    super::ServerProcess::spawn_with_env(
        &dir.join(format!("{id}.log")),
        &[
            "--cluster",
            &nats.url(),
            "--node-id",
            id,
            "--lease-secs",
            "2",
        ],
        env,
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

/// The buckets a Tandem node keeps in NATS (each a `KV_<bucket>` stream).
pub const BUCKETS: [&str; 7] = [
    "tandem_channels",
    "tandem_snapshots",
    "tandem_turns",
    "tandem_providers",
    "tandem_nodes",
    "tandem_leases",
    "tandem_settings",
];

/// A nats-server configuration an operator would write for Tandem: TLS
/// with `cert`/`key`, an account `TANDEM` (JetStream on) whose user
/// `tandem` (password `password`) may publish and subscribe to exactly
/// what `docs/operating.md` lists, and an account `OTHERS` with a user
/// `other` (password `other`) for everyone else.
pub fn secured_config(cert: &std::path::Path, key: &std::path::Path, password: &str) -> String {
    let mut publish: Vec<String> = [
        "tandem.>",
        "_INBOX.>",
        "$JS.API.INFO",
        "$JS.FC.>",
        "$JS.API.STREAM.*.TANDEM_JOURNAL",
        "$JS.API.STREAM.*.TANDEM_AUDIT",
        "$JS.API.STREAM.MSG.GET.TANDEM_JOURNAL",
        "$JS.API.STREAM.MSG.GET.TANDEM_AUDIT",
        "$JS.API.CONSUMER.*.TANDEM_JOURNAL.>",
        "$JS.API.CONSUMER.CREATE.TANDEM_JOURNAL",
        "$JS.API.CONSUMER.MSG.NEXT.TANDEM_JOURNAL.*",
        "$JS.API.CONSUMER.*.TANDEM_AUDIT.>",
        "$JS.API.CONSUMER.CREATE.TANDEM_AUDIT",
        "$JS.API.CONSUMER.MSG.NEXT.TANDEM_AUDIT.*",
        "$JS.API.DIRECT.GET.TANDEM_JOURNAL",
        "$JS.API.DIRECT.GET.TANDEM_JOURNAL.>",
        "$JS.API.DIRECT.GET.TANDEM_AUDIT",
        "$JS.API.DIRECT.GET.TANDEM_AUDIT.>",
    ]
    .map(String::from)
    .to_vec();
    for b in BUCKETS {
        publish.push(format!("$KV.{b}.>"));
        publish.push(format!("$JS.API.STREAM.*.KV_{b}"));
        publish.push(format!("$JS.API.STREAM.MSG.GET.KV_{b}"));
        publish.push(format!("$JS.API.CONSUMER.*.KV_{b}.>"));
        publish.push(format!("$JS.API.CONSUMER.CREATE.KV_{b}"));
        publish.push(format!("$JS.API.CONSUMER.MSG.NEXT.KV_{b}.*"));
        publish.push(format!("$JS.API.DIRECT.GET.KV_{b}"));
        publish.push(format!("$JS.API.DIRECT.GET.KV_{b}.>"));
    }
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let subscribe = ["_INBOX.>", "tandem.node.*", "tandem.announce"].map(String::from);
    format!(
        r#"
tls {{
  cert_file: "{cert}"
  key_file: "{key}"
}}
accounts {{
  TANDEM {{
    jetstream: enabled
    users: [
      {{ user: tandem, password: "{password}",
         permissions: {{ publish: {{ allow: [{publish}] }}, subscribe: {{ allow: [{subscribe}] }} }} }}
    ]
  }}
  OTHERS {{
    users: [ {{ user: other, password: other }} ]
  }}
}}
"#,
        cert = cert.display(),
        key = key.display(),
        publish = list(&publish),
        subscribe = list(&subscribe),
    )
}

/// Three `nats-server -js` routed into one NATS cluster (`tandem`), each
/// with its own store; ready once JetStream has elected its meta leader.
pub fn nats_cluster() -> Vec<NatsServer> {
    let free = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port()
    };
    let routes: Vec<u16> = (0..3).map(|_| free()).collect();
    let servers: Vec<NatsServer> = (0..3)
        .map(|k| {
            let others: Vec<String> = (0..3)
                .filter(|j| *j != k)
                .map(|j| format!("nats://127.0.0.1:{}", routes[j]))
                .collect();
            NatsServer::start_with(&[
                "-n",
                &format!("n{k}"),
                "--cluster_name",
                "tandem",
                "--cluster",
                &format!("nats://127.0.0.1:{}", routes[k]),
                "--routes",
                &others.join(","),
            ])
        })
        .collect();
    let deadline = std::time::Instant::now() + super::WAIT;
    while !servers
        .iter()
        .any(|s| std::fs::read_to_string(s.log()).is_ok_and(|l| l.contains("new metadata leader")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the NATS cluster elected no JetStream leader"
        );
        // The poll interval of a log that announces itself to nobody.
        std::thread::sleep(Duration::from_millis(20));
    }
    servers
}
