//! Tandem's load generator: real AHP over WebSocket, many connections per
//! process on tokio, against a URL or a server it starts itself.
//!
//! # Layout
//!
//! | module | job |
//! |---|---|
//! | [`conn`] | lean raw AHP client (tokio-tungstenite + serde_json) |
//! | [`proto`] | hand-built frames and the send-time stamp every action carries |
//! | [`engine`] | open/closed-loop publishers, checking receivers, the phase runner |
//! | [`readers`] | the subscribers' reading threads (epoll, one `recv` per readiness) |
//! | [`stats`] | HDR latency histograms; loss / duplicate / order checker |
//! | [`report`] | result JSON, terminal table, latency SVG |
//! | [`server`] | the server under test: spawned child, in-process, or `--url` |
//! | [`nats`] | the `nats-server -js` started for the `jetstream` store |
//! | [`cluster`] | the servers of a comparison target: one node on SQLite, or N nodes on one nats-server |
//! | [`baseline`] | minimal tokio + tungstenite broadcast server (the fan-out yardstick) |
//! | [`scenarios`] | `fanout`, `drafts`, `durable`, `connections`, `reconnect-storm`, `recovery`, `agent-stream`, `cluster` |
//! | [`clock`], [`sys`], [`progress`] | process clock, rlimit and /proc readings, progress bars |

pub mod baseline;
pub mod clock;
pub mod cluster;
pub mod conn;
pub mod engine;
pub mod nats;
pub mod progress;
pub mod proto;
pub mod readers;
pub mod report;
pub mod scenarios;
pub mod server;
pub mod stats;
pub mod sys;
