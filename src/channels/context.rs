//! The application context every channel actor (and the transport above
//! them) works in: tunables, the publisher, the registry, the journal, the
//! agents, and the threads actors run on.
//!
//! Only what the channels themselves need lives here; the transport's own
//! tables (token verification, open connections, rate buckets) belong to
//! [`crate::server`]'s state, which holds an `Arc<Shared>` — never the other
//! way round.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::prelude::*;

use super::agent::AgentDirectory;
use super::registry::Registry;
use crate::config::Config;
use crate::ids::ServerSeq;
use crate::publish::{Publisher, SeqRefused};
use crate::store::{ClusterLink, Journal};

/// Application context handed to every actor and connection.
pub struct Shared {
    /// Tunables.
    pub config: Config,
    /// `serverSeq`, replay ring, ordered fan-out.
    pub publisher: Publisher,
    /// What `/metrics` exports.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Channel URI → actor.
    pub registry: Registry,
    /// Durable action log.
    pub journal: Arc<dyn Journal>,
    /// Agents by provider id (`providers::Providers` behind a trait, so
    /// channels do not depend on providers).
    pub providers: Arc<dyn AgentDirectory>,
    /// The other nodes of the cluster, when this node is one
    /// ([`crate::store::cluster`]); `None` for a single node.
    pub cluster: Option<Arc<dyn ClusterLink>>,
    /// The threads serving connections, where clients' new sessions run.
    pub homes: super::homes::Homes,
    /// Who may do what in the sessions on this node.
    pub access: super::access::AccessBook,
    /// Who is told when a request for a person waits.
    pub notify: crate::notify::Notifier,
    /// A cluster node that is stopping hands its sessions to the others
    /// (`server::drain`): not ready for new clients meanwhile.
    pub draining: std::sync::atomic::AtomicBool,
    /// The threads restored and followed actors are spread on.
    arbiters: Vec<ArbiterHandle>,
    /// Round-robin position in `arbiters`.
    next_arbiter: AtomicUsize,
}

impl Shared {
    /// Assemble the context. `arbiters` are the threads actors are spread
    /// on; `start_seq` is the stored `serverSeq` floor. On a cluster journal
    /// the publisher starts on a fresh block (the floor may be another
    /// node's last number); refused if the store cannot reserve one.
    pub fn new(
        config: Config,
        journal: Arc<dyn Journal>,
        providers: Arc<dyn AgentDirectory>,
        arbiters: Vec<ArbiterHandle>,
        start_seq: ServerSeq,
    ) -> Result<Self, SeqRefused> {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        journal.observe_commits(metrics.commits());
        let reserving = journal.clone();
        let publisher = Publisher::with_reserver(
            start_seq,
            config.replay_ring_len,
            config.replay_ring_bytes,
            Box::new(move |next, count| {
                reserving
                    .reserve_seq(next, count)
                    .map_err(|e| e.to_string())
            }),
        )
        .with_deliveries(metrics.deliveries.clone())
        .with_fanout(config.fanout_threads, config.io_uring);
        if journal.shared_seq() {
            publisher.fresh_block()?;
        }
        Ok(Self {
            publisher,
            metrics,
            config,
            registry: Registry::default(),
            journal,
            providers,
            cluster: None,
            homes: Default::default(),
            access: Default::default(),
            notify: crate::notify::Notifier::off(),
            draining: std::sync::atomic::AtomicBool::new(false),
            arbiters,
            next_arbiter: AtomicUsize::new(0),
        })
    }

    /// A cluster node's context: channels other nodes own are followed.
    pub fn with_cluster(mut self, link: Option<Arc<dyn ClusterLink>>) -> Self {
        self.cluster = link;
        self
    }

    /// Start telling people of the requests that wait for them, the web
    /// client being at `base` for the links; `guard`: the server listens
    /// beyond loopback ([`crate::notify::target`]).
    pub fn with_notifier(mut self, base: String, guard: bool) -> anyhow::Result<Self> {
        self.notify = crate::notify::Notifier::start(
            &self.config.notify,
            base,
            guard,
            &self.metrics,
            self.journal.settings(),
        )?;
        Ok(self)
    }

    /// Whether another node writes `channel` (this one follows it).
    pub fn follows(&self, channel: &crate::ids::ChannelUri) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.owns(channel))
    }

    /// Every thread actors run on: the connection-serving threads and the
    /// actor threads.
    pub fn all_arbiters(&self) -> Vec<ArbiterHandle> {
        let mut all = self.homes.arbiters();
        all.extend(self.arbiters.iter().cloned());
        all
    }

    /// The arbiter for the next new actor (round robin), so chats run in
    /// parallel across threads.
    pub fn next_arbiter(&self) -> ArbiterHandle {
        if self.arbiters.is_empty() {
            return Arbiter::current();
        }
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        self.arbiters[i].clone()
    }
}
