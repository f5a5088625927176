//! Load generation for Idem and Redis, side by side.
//!
//! The `idem-bench` binary drives the same workloads against idemd (with
//! the Idem protocol) and against Redis (the way idempotency is deployed on
//! Redis today: `SET NX PX`, Lua scripts through EVALSHA, polling, and
//! PUBLISH as the floor for push), alternating targets in one run and
//! printing the Idem/Redis ratio per workload.
//!
//! # Layout
//!
//! - [`conn`]: a raw RESP connection with a fast request encoder.
//! - [`scripts`]: the Redis Lua scripts (claim with result, fenced
//!   complete).
//! - [`workload`]: the workloads and the runner (connections, pipeline
//!   depth, duration, key space, value size, latency histograms).
//! - [`herd`]: one owner, N waiters: Idem WAIT vs Redis polling vs Redis
//!   PUBLISH.
//! - [`memory`]: load completed records and measure resident bytes.
//! - [`report`]: the table, the ratios and JSON.
//! - `etcd` (with the `etcd` feature): the claim as a put-if-absent
//!   transaction with a lease, against an etcd cluster.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod conn;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod herd;
pub mod memory;
pub mod report;
pub mod scripts;
pub mod workload;
