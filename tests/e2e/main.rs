//! End-to-end tests against a real server on `127.0.0.1:0`, with the
//! official `ahp` client and raw WebSocket frames.
//!
//! One test binary holds them all: each file under `tests/` used to be a
//! binary of its own, linking the server and the client stack again, and that
//! linking was most of a clean build. No verdict here depends on how busy
//! the machine is (the hostile and soak tests bound memory and check what
//! clients see; latency ratios are the load generator's), so they run
//! beside the others. The browser tests have a binary of their own.

#[path = "../common/mod.rs"]
mod common;

mod acp_agent;
mod acp_bridge;
mod admission;
mod audit;
mod bad_input;
mod cluster;
mod cluster_nodes;
mod coediting;
mod collaboration;
mod commands;
mod config_file;
mod durability;
mod hostile;
mod invariants;
mod invites;
mod lifecycle;
mod logs;
mod metrics;
mod notify;
mod ordering_and_recovery;
mod pacing;
mod people;
mod providers;
mod push;
mod readiness;
mod scripted;
mod security;
mod security_access;
mod security_agents;
mod security_limits;
mod soak;
mod tls;
mod validation;
