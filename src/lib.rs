//! Tandem — an Agent Host Protocol (AHP) 1.0 server that lets many people and
//! devices share one agent session.
//!
//! # Layout
//!
//! | module | job |
//! |---|---|
//! | [`protocol`] | JSON-RPC framing, method names, error codes |
//! | [`channels`] | root, session and chat actors; their one commit path; registry; validation rules; session roll-up; the agent API a chat calls (`channels::agent`) |
//! | [`publish`] | `serverSeq`, ordered fan-out, replay ring, byte-bounded outbound queues |
//! | [`store`] | the `Journal` trait between actors and storage; in-memory journal |
//! | [`interactions`] | the neutral "wait for a person" API: interactions and settlements; the approval policy (`interactions::policy`) |
//! | [`providers`] | agents behind the host (implementing `channels::agent`); the built-in `scripted` agent |
//! | [`server`] | actix-web app: `/ahp` WebSocket connections, `/healthz`, the embedded browser client (`web/`) at `/` |
//! | [`auth`] | bearer tokens (JWT, HS256), roles, session scopes |
//! | [`config`] | tunables and limits |
//! | [`rate`] | token buckets: dispatches per connection, bytes of actions per subject |
//!
//! The flow of one client action: a connection decodes `dispatchAction` and
//! routes it by `params.channel` to the channel's actor; the actor validates
//! it, reduces it with the official `ahp::reducers`, appends it to the
//! journal, and once that returns publishes it — assigning the next
//! `serverSeq` and pushing it to every subscriber's queue under one lock.

pub mod auth;
pub mod channels;
pub mod config;
pub mod interactions;
pub mod protocol;
pub mod providers;
pub mod publish;
pub mod rate;
pub mod server;
pub mod store;
pub mod time;

pub use config::{Config, Limits};
pub use server::run;
