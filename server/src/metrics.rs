//! Counters kept by the connection layer (the store and the waiters keep
//! their own; `admin` renders them all as INFO).

use std::sync::atomic::{AtomicU64, Ordering};

/// Connection-layer counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused at `max_connections`.
    pub rejected: AtomicU64,
    /// Commands processed.
    pub commands: AtomicU64,
    /// Requests refused with TOOBIG.
    pub toobig: AtomicU64,
    /// Malformed frames (connection closed).
    pub protocol_errors: AtomicU64,
    /// Clients disconnected at `max_output_buffer_bytes`.
    pub output_limit_disconnects: AtomicU64,
    /// Clients disconnected at `client_write_timeout_ms`.
    pub write_timeouts: AtomicU64,
    /// `AUTH` (and `HELLO ... AUTH`) refused with WRONGPASS.
    pub auth_failures: AtomicU64,
    /// Commands refused with NOPERM: the command (or a wait) not allowed.
    pub acl_denied_cmd: AtomicU64,
    /// Commands refused with NOPERM: a key outside the user's patterns.
    pub acl_denied_key: AtomicU64,
    /// TLS handshakes that failed or timed out (a wrong CA, no client
    /// certificate where one is required, a plain-text client).
    pub tls_handshake_failures: AtomicU64,
    /// Clients refused by protected mode.
    pub protected_mode_refusals: AtomicU64,
    /// The second (since start) of the current AUTH failure window, and
    /// the failures in it (see `dispatch`): `second << 32 | failures`.
    pub auth_window: AtomicU64,
}

/// Adds one to a counter.
pub fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// A counter's value.
pub fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}
