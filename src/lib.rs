//! Tandem — an Agent Host Protocol (AHP) 1.0 server that lets many people and
//! devices share one agent session.
//!
//! # Layout
//!
//! | module | job |
//! |---|---|
//! | [`protocol`] | JSON-RPC framing, method names, error codes |
//! | [`channels`] | root, session and chat actors; their one commit path (`channels::commit`); the application context (`channels::context`); the registry and the calls a connection makes on a channel (`channels::addr`); validation rules; session roll-up; the agent API a chat calls (`channels::agent`); on a cluster node, following another node's channels and forwarding to it (`channels::commit`, `channels::forward`) |
//! | [`publish`] | `serverSeq` (reserved in blocks before use), the replay ring, each channel's subscribers, and publishing an envelope to them in order |
//! | [`transport`] | everything between a TCP socket and an AHP message: listening, the WebSocket taken over from the HTTP dispatcher, frames in and out, each connection's byte-bounded queue with its pacing and liveness, io_uring batches, writing a big room from several threads, the heartbeat, TLS |
//! | [`store`] | the `Journal` trait between actors and storage, and the server's own settings beside it (`store::settings`); SQLite (schema, group-commit writer, recovery), NATS JetStream (`--cluster`: stream, buckets, leases and fencing, the link to the other nodes) and in-memory journals; the cluster seam (`store::cluster`) |
//! | [`coedit`] | several people typing in one text at once: operations (retain / insert / delete), their transformation, the authority's copy of a text and an editor's |
//! | [`interactions`] | the neutral "wait for a person" API: interactions and settlements; form and link rules; the approval policy as pure functions (`interactions::policy`) |
//! | [`providers`] | agents behind the host (implementing `channels::agent`): provider connections, the built-in `scripted` agent, operator-declared ACP agents (`providers::acp`: the process, the update mapping, permissions) |
//! | [`server`] | actix-web app: admission and the upgrade, one connection actor per socket with one handler per method, `/healthz`, `/readyz`, `/metrics`, `/admin/overview`, the embedded browser client (`web/`) at `/`; the server's own tables (tokens, open connections, rate buckets); a cluster node's part in the cluster (`server::cluster`) |
//! | [`auth`] | bearer tokens (JWT, HS256), roles, session scopes |
//! | [`people`] | a person's name and role in a session (viewer, participant, approver, owner), the `_meta` keys that keep who did what |
//! | [`invites`] | a session's invite links: codes, their digests, expiry, uses, revocation; who came in through one |
//! | [`notify`] | telling people who are away that a request waits: the quiet delay, webhooks (signed, retried), Web Push (VAPID key, subscriptions and choices in the store's settings, RFC 8291 payloads), who may be told (`notify::Audience`, answered by `server::notify`) |
//! | [`memory`] | what the allocator holds; shrinking sparse tables and handing freed memory back |
//! | `digest` | `sha256:<hex>` of a secret or payload the record names without holding |
//! | [`metrics`] | what `/metrics` exports: every series registered once on the server's own recorder, counted through handles |
//! | [`config`] | tunables and limits; the command line and the config file (`config::cli`: every flag a key, flags over the file) |
//! | [`rate`] | token buckets: dispatches per connection, bytes of actions per subject |
//! | [`ids`] | the newtypes every layer passes around: `ChannelUri`, `ClientId`, `ServerSeq`, `JournalPos`, `ConnId` (the wire sees their inner values) |
//!
//! ## Dependencies between modules
//!
//! Arrows point one way only (the `use crate::` lines; no two top-level
//! modules import each other). Every module may use [`ids`], which uses
//! nothing of the crate:
//!
//! ```text
//! server       ──► providers, channels, notify, metrics, coedit, interactions, invites, people, publish, transport, store, protocol, auth, rate, config
//! providers    ──► channels, interactions, publish, transport, store, protocol, auth, config, time
//! channels     ──► notify, metrics, coedit, interactions, invites, people, publish, transport, store, protocol, auth, config, time, digest
//! notify       ──► metrics, people, store, auth, time, digest
//! metrics      ──► transport, store
//! publish      ──► transport, store
//! rate         ──► config ──► notify, store, auth, people, transport
//! auth         ──► invites ──► people, digest
//! interactions ──► people, time
//! transport, store, protocol, time, coedit, people, digest: nothing above them
//! memory: helpers any module may call (it calls none)
//! ids: nothing (the bottom layer)
//! ```
//!
//! `server` reaches channels only through `channels::addr` (it names no actor
//! message); `publish` hands envelopes to subscribers' queues and knows
//! nothing of sockets or frames (`transport` does); `providers` implements `channels::agent::AgentDirectory`, so the
//! chat starts turns without knowing which kind of agent it has.
//!
//! The flow of one client action: a connection decodes `dispatchAction` and
//! routes it by `params.channel` to the channel's actor; the actor validates
//! it, reduces it with the official `ahp::reducers`, appends it to the
//! journal, and once that returns publishes it — assigning the next
//! `serverSeq` and pushing it to every subscriber's queue under one lock.

// The module docs are the developers' map of the crate and link to its
// private items too (`cargo doc --document-private-items` renders them).
#![allow(rustdoc::private_intra_doc_links)]

pub mod auth;
pub mod channels;
pub mod coedit;
pub mod config;
pub(crate) mod digest;
pub mod ids;
pub mod interactions;
pub mod invites;
pub mod memory;
pub(crate) mod metrics;
pub mod notify;
pub mod people;
pub mod protocol;
pub mod providers;
pub(crate) mod publish;
pub(crate) mod rate;
pub mod server;
pub mod store;
pub mod time;
pub(crate) mod transport;

pub use config::{Config, Limits};
pub use server::run;
pub use transport::listen::bind;
