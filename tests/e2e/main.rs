//! End-to-end tests against a real server on `127.0.0.1:0`, with the
//! official `ahp` client and raw WebSocket frames.
//!
//! One test binary holds them all: each file under `tests/` used to be a
//! binary of its own, linking the server and the client stack again, and that
//! linking was most of a clean build. The tests that measure time or
//! resources (`pacing`, `hostile`, `soak`) share a binary of their own
//! (`tests/measured`, one test at a time) and the browser test has one, so
//! nothing else runs beside them.

#[path = "../common/mod.rs"]
mod common;

mod acp_agent;
mod acp_bridge;
mod admission;
mod bad_input;
mod cluster;
mod cluster_nodes;
mod coediting;
mod collaboration;
mod commands;
mod config_file;
mod durability;
mod invariants;
mod lifecycle;
mod logs;
mod metrics;
mod ordering_and_recovery;
mod providers;
mod readiness;
mod scripted;
mod security;
mod security_access;
mod security_agents;
mod security_limits;
mod tls;
mod validation;
