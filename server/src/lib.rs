//! idemd, the Idem idempotency server.
//!
//! # Layout
//!
//! - [`config`]: raw configuration with defaults, validated into [`Config`].
//! - [`server`]: the listener, connection cap and shutdown.
//! - [`node`]: the handle every connection shares (engine, waiters,
//!   config, clients, counters).
//! - [`connection`]: one client: decode, submit in order, write replies in
//!   request order from a bounded FIFO.
//! - [`dispatch`]: the one place commands are routed; [`admin`] answers
//!   HELLO, CLIENT, COMMAND, CONFIG and INFO; [`session`] is per-connection
//!   state.
//! - [`store`]: the deterministic, lock-sharded state machine of records:
//!   replicated ops in, replies and key events out; pure reads; canonical
//!   snapshots.
//! - [`engine`]: how ops reach the store, as futures: `raft` (the default:
//!   a durable log through openraft, `engine::raft`) or `memory`; and the
//!   expiry proposer.
//! - [`waiters`]: server-side waiting beside the store, driven by the
//!   engine's key events.
//! - [`acl`]: users, their passwords, key patterns and commands.
//! - [`clock`], [`clients`], [`metrics`]: time, the client registry,
//!   counters.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use idem_server::{config::RawConfig, server::Server};
//!
//! let config = RawConfig::default().validate().expect("defaults are valid");
//! let server = Server::bind(config).await?;
//! println!("listening on {}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod acl;
pub mod admin;
pub mod clients;
pub mod clock;
pub mod cluster_admin;
pub mod cmdstats;
pub mod config;
pub mod connection;
pub mod dispatch;
pub mod engine;
pub mod fuzzing;
pub mod metrics;
pub mod node;
pub mod prom;
pub mod reclaim;
pub mod server;
pub mod session;
pub mod store;
pub mod tls;
pub mod waiters;

pub use config::Config;
