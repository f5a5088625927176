//! idemd, the Idem idempotency server.
//!
//! # Layout
//!
//! - [`config`]: raw configuration with defaults, validated into [`Config`].
//! - [`server`]: the listener, connection cap, sweeper and shutdown.
//! - [`connection`]: one client: decode, dispatch in order, write back.
//! - [`dispatch`]: the one place commands are routed.
//! - [`store`]: the deterministic, lock-sharded state machine of records.
//! - [`waiters`]: server-side waiting beside the store.
//! - [`engine`]: how commands reach the store (`memory`).
//! - [`clock`], [`clients`], [`metrics`]: time, the client registry, INFO.
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

pub mod clients;
pub mod clock;
pub mod config;
pub mod connection;
pub mod dispatch;
pub mod engine;
pub mod metrics;
pub mod server;
pub mod store;
pub mod waiters;

pub use config::Config;
