//! Counters kept by the connection layer (the store and the waiters keep
//! their own; `admin` renders them all as INFO).

use std::sync::atomic::{AtomicU64, Ordering};

/// Events of one kind that are logged at most every
/// [`LogEvery::INTERVAL`], with how many there were since the last line.
#[derive(Debug, Default)]
pub struct LogEvery(parking_lot::Mutex<(u64, Option<std::time::Instant>)>);

impl LogEvery {
    /// The least time between two lines.
    pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

    /// None logged yet.
    pub const fn new() -> LogEvery {
        LogEvery(parking_lot::Mutex::new((0, None)))
    }

    /// Counts one more event: the number to log (this one included) if a
    /// line is due.
    pub fn due(&self) -> Option<u64> {
        let mut l = self.0.lock();
        l.0 += 1;
        l.1.is_none_or(|t| t.elapsed() >= Self::INTERVAL).then(|| {
            let n = l.0;
            *l = (0, Some(std::time::Instant::now()));
            n
        })
    }
}

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
    /// Connections closed for sending `POST` or `Host:` as a command: an
    /// HTTP request, as a web page may have a browser send to this port
    /// (cross-protocol scripting).
    pub http_refusals: AtomicU64,
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
