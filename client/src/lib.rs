//! The async Rust client of Idem, a shared idempotency server.
//!
//! Services call Idem before a side effect ("may I charge order 1234?") and
//! after it ("here is the result"). This crate makes the correct use the
//! easy one.
//!
//! # Quick start
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_client::{Client, Failure, Key, RunOptions};
//!
//! # async fn charge(_order: &str) -> Result<bytes::Bytes, std::io::Error> { Ok("ch_1".into()) }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("127.0.0.1:7379").await?;
//! let key = Key::new("order-1234").namespace("tenant-a").version("1");
//! let opts = RunOptions::new()
//!     .wait(Duration::from_secs(5))
//!     .classify(|e: &std::io::Error| match e.kind() {
//!         std::io::ErrorKind::TimedOut => Failure::Transient,
//!         _ => Failure::Unknown,
//!     });
//! let done = client.run_once(key, opts, |_ctx| charge("order-1234")).await?;
//! println!("charge {:?} (replayed: {})", done.value, done.replayed);
//! # Ok(()) }
//! ```
//!
//! Lower level, the claim guard:
//!
//! ```no_run
//! use idem_client::{Client, ClaimOutcome};
//! # async fn demo(client: Client) -> Result<(), idem_client::Error> {
//! match client.claim("webhook:evt_42").await? {
//!     ClaimOutcome::Acquired(claim) => {
//!         // ... perform the effect; the lease is renewed meanwhile ...
//!         claim.complete("processed").await?;
//!     }
//!     ClaimOutcome::Completed(done) => println!("already done: {:?}", done.value),
//!     ClaimOutcome::InFlight { remaining } => println!("someone else is on it ({remaining:?} left)"),
//!     ClaimOutcome::Recover { claim, journal } => {
//!         // A previous owner died mid-effect: check `journal` downstream.
//!         claim.abandon().await?;
//!     }
//!     _ => {}
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`Client`] ([`client`](crate::Client)): the cheap handle, typed commands, the
//!   claim builder; [`ClientConfig`]: timeouts, backoff, defaults.
//! - [`Claim`]: the guard that owns a key and renews its lease.
//! - [`Client::run_once`] with [`RunOptions`], [`Failure`], [`Recovery`].
//! - [`Key`]: namespaced, versioned keys with a collision-free encoding.
//! - [`Error`] with [`ErrorKind`] and predicates.
//! - [`conformance`]: a suite to run against any server.
//! - Feature `serde`: `fingerprint` and `fingerprint_bytes` (payload
//!   fingerprints), JSON values.
//!
//! # What happens when
//!
//! With [`Client::run_once`] and its defaults ([`RunOptions::new`]):
//!
//! | Event | While claiming or waiting | While the effect runs | While recording the outcome |
//! |---|---|---|---|
//! | The service crashes (kill -9) | A grant not yet delivered lapses with its lease to *abandoned*, with an empty journal ([`RunOptions::run_again_if_no_journal`] lets the next caller run it) | The lease lapses to *abandoned* (`ONEXPIRE RECOVER`): the next caller gets the journal (`on_recover`, or [`RunError::NeedsRecovery`]); the effect is not run again | As while the effect runs |
//! | The call is cancelled (future dropped, HTTP client hangs up) | The claim is withdrawn; a grant that arrives anyway is released (`ACQUIRED`) or abandoned again (`RECOVER`) | Abandoned at once (released with [`RunOptions::release_on_cancel`] if nothing was journaled yet) | Completed if the COMPLETE already sent reaches the server (the usual case), else abandoned |
//! | A reply times out | Retried with the same attempt id, which gets the same grant back, within the call's deadline ([`ClientConfig::deadline`], default 10 s, plus the wait); past it the call fails with the attempt id, and a grant that still arrives is found by attempt id and settled (best effort), unless the caller retries with that attempt id first (the retry gets the grant) | The effect is yours; renewals keep retrying, and [`ClaimCtx::is_lost`] says when the lease is presumed lost | COMPLETE retried (a repeat is acknowledged); if it cannot be recorded: [`RunError::Unrecorded`] with the value, key abandoned (best effort) |
//! | The server restarts | Requests reconnect and retry until the deadline; records are durable (raft engine) | As above | As above |
//! | The server is unreachable | Fails when the deadline passes, the error naming command, key, address, attempts and time | Renewals fail; ownership is presumed lost after a whole lease ([`ClaimCtx::is_lost`]); renewals go on, and one that lands (a cluster's lease clock stands still while no node leads) clears it | [`RunError::Unrecorded`], the lease lapses to *abandoned* |
//!
//! A key left *abandoned* stays so until a caller recovers it or its
//! retention ends. An operator resolves it with `INSPECT key` (journal,
//! attempt), then `CLAIM key` and `COMPLETE key fence value` to record what
//! happened downstream, or `FORGET key`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod claim;
mod client;
mod config;
pub mod conformance;
mod connection;
mod error;
mod key;
mod run;
mod tls;

pub use bytes::{self, Bytes};
pub use claim::{Claim, ClaimCtx};
pub use client::{ClaimBuilder, ClaimOutcome, Client, ClientStats, Completed, Settled};
pub use config::ClientConfig;
pub use error::{Error, ErrorKind, Result};
pub use idem_protocol::{ErrorCode, OnExpire, Outcome, RecordInfo, RecordState, ServerError};
pub use key::Key;
#[cfg(feature = "serde")]
pub use run::TypedCompleted;
pub use run::{Failure, Recovery, RunError, RunOptions};

/// A fingerprint of a request payload: SHA-256 of its canonical JSON
/// encoding, in hex. Pass it to [`ClaimBuilder::fingerprint`] or
/// [`RunOptions::fingerprint`] so a key reused with a different payload is
/// refused (`-MISMATCH`) instead of replaying the wrong result.
///
/// What is fingerprinted: the payload as a JSON value, with the keys of
/// every object (struct fields and maps alike, `HashMap`s included) sorted,
/// no whitespace, numbers as serde_json writes them (`1` and `1.0` differ).
/// So equal values give equal fingerprints whatever the iteration order of
/// their maps, and a retry of the same request is recognised. To
/// fingerprint the raw bytes of a request instead, use
/// [`fingerprint_bytes`].
#[cfg(feature = "serde")]
pub fn fingerprint<T: serde::Serialize + ?Sized>(payload: &T) -> Result<bytes::Bytes> {
    let value = serde_json::to_value(payload)
        .map_err(|e| Error::new(ErrorKind::InvalidRequest, e.to_string()))?;
    let json = serde_json::to_vec(&sorted(value))
        .map_err(|e| Error::new(ErrorKind::InvalidRequest, e.to_string()))?;
    Ok(fingerprint_bytes(&json))
}

/// `value` with the keys of every object in sorted order (whatever the
/// order serde_json's maps keep).
#[cfg(feature = "serde")]
fn sorted(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut pairs: Vec<(String, Value)> = map.into_iter().collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(pairs.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// A fingerprint of raw request bytes: SHA-256, in hex.
#[cfg(feature = "serde")]
pub fn fingerprint_bytes(payload: &[u8]) -> bytes::Bytes {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(payload);
    let mut hex = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    bytes::Bytes::from(hex)
}
