//! The servers of one comparison target: a single Tandem on SQLite, or a
//! cluster of N Tandem nodes on one `nats-server -js` the load generator
//! starts (`tandem serve --cluster nats://… --node-id nodeK --lease-secs …`).
//!
//! Node 0 is started first and the scenarios create every session through
//! it, so it owns them all; the other nodes keep follower copies (they read
//! the owner's batches back from JetStream) and forward their clients'
//! dispatches to it. The CPU of a target is the sum over its Tandem
//! processes plus nats-server's (which the phase runner reads through
//! [`crate::nats::store_pid`]).

use std::sync::Arc;

use crate::conn::Endpoint;
use crate::nats::NatsServer;
use crate::progress::note;
use crate::scenarios::store::{self, StoreArgs, StorePlan};
use crate::server::{tandem_supports, Server, ServerOpts, StopHow};

/// What the servers of a target are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One node, SQLite `--durability full` (the default durable store).
    Sqlite,
    /// N nodes on NATS JetStream.
    Cluster { nodes: usize },
}

impl Target {
    /// Short name for notes and JSON keys.
    pub fn name(self) -> String {
        match self {
            Target::Sqlite => "sqlite".into(),
            Target::Cluster { nodes } => format!("cluster{nodes}"),
        }
    }
}

/// The running servers of one target.
pub struct Nodes {
    /// Node 0 owns every session the scenario creates.
    pub servers: Vec<Server>,
    /// What runs, for the report.
    pub label: String,
    /// The SQLite node's scratch store (removed by [`Nodes::stop`]).
    plan: Option<StorePlan>,
    /// The cluster's nats-server (stopped by [`Nodes::stop`] or on drop).
    nats: Option<NatsServer>,
}

impl Nodes {
    /// Start the servers of `target`. `lease_secs` is the cluster nodes'
    /// `--lease-secs`.
    pub async fn start(target: Target, opts: &ServerOpts, lease_secs: f64) -> anyhow::Result<Self> {
        if opts.url.is_some() || opts.in_process {
            anyhow::bail!("`cluster` spawns its own servers: drop --url / --in-process");
        }
        match target {
            Target::Sqlite => {
                let store = StoreArgs {
                    durability: "full".into(),
                    data_dir: None,
                    keep_data: false,
                };
                let plan = store::plan(&store, opts, "cluster")?;
                let server = Server::tandem(opts, &plan.args).await?;
                let label = format!("1 node, {}", plan.label);
                Ok(Self {
                    servers: vec![server],
                    label,
                    plan: Some(plan),
                    nats: None,
                })
            }
            Target::Cluster { nodes } => {
                if !tandem_supports(opts, "--lease-secs")? {
                    anyhow::bail!(
                        "this tandem binary has no --cluster/--lease-secs: rebuild it with \
                         `cargo build --release --bin tandem`"
                    );
                }
                let dir = crate::server::scratch_dir().join("nats-cluster");
                let nats = NatsServer::start(&dir)?;
                let url = nats.url();
                let mut me = Self {
                    servers: Vec::with_capacity(nodes),
                    label: format!(
                        "{nodes} nodes on NATS JetStream (nats-server -js at {url}, store {})",
                        dir.display()
                    ),
                    plan: None,
                    nats: Some(nats),
                };
                // Each session stays on the node the scenario makes it
                // through (which node owns what is the scenario's choice);
                // a build without placement keeps it there anyway.
                let local = tandem_supports(opts, "--place-sessions")?;
                for k in 0..nodes.max(1) {
                    let mut args = vec![
                        "--cluster".to_owned(),
                        url.clone(),
                        "--node-id".to_owned(),
                        format!("node{k}"),
                        "--lease-secs".to_owned(),
                        lease_secs.to_string(),
                    ];
                    if local {
                        args.extend(["--place-sessions".to_owned(), "local".to_owned()]);
                    }
                    match Server::tandem(opts, &args).await {
                        Ok(s) => me.servers.push(s),
                        Err(e) => {
                            me.stop().await;
                            return Err(e.context(format!("starting cluster node{k}")));
                        }
                    }
                }
                Ok(me)
            }
        }
    }

    /// Pids of every Tandem process (node order).
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().filter_map(|s| s.pid).collect()
    }

    /// One endpoint per node, node order.
    pub async fn endpoints(&self, source_ips: usize) -> anyhow::Result<Vec<Arc<Endpoint>>> {
        let mut out = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            out.push(Arc::new(Endpoint::new(&s.url, source_ips).await?));
        }
        Ok(out)
    }

    /// Log files of the nodes, for a failure report.
    pub fn logs(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter_map(|s| s.log.as_ref().map(|l| l.display().to_string()))
            .collect()
    }

    /// Stop every node (SIGINT), then nats-server, then remove scratch
    /// stores.
    pub async fn stop(mut self) {
        for s in self.servers.drain(..) {
            if let Err(e) = s.stop(StopHow::Term).await {
                note(format!("stopping a node: {e:#}"));
            }
        }
        if let Some(mut n) = self.nats.take() {
            n.stop();
            let _ = std::fs::remove_dir_all(&n.dir);
        }
        if let Some(p) = self.plan.take() {
            p.cleanup();
        }
    }
}
