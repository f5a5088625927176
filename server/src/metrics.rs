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
    /// Wrong passwords in the current second, by source (see `dispatch`).
    pub auth_window: parking_lot::Mutex<AuthWindow>,
}

/// Sources tracked in one second's [`AuthWindow`], at most: past it, a new
/// source's failures are counted in the total only.
const AUTH_SOURCES_TRACKED: usize = 65_536;

/// The source an AUTH is counted against: an IPv4 address, or an IPv6
/// address's /64 (one host is commonly given a whole /64, and would
/// otherwise have as many fresh sources as it likes).
fn auth_source(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            let s = v6.segments();
            std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Wrong passwords given in the current second (since start), in all and
/// by source address: what decides whether an `AUTH` is checked.
#[derive(Debug, Default)]
pub struct AuthWindow {
    second: u64,
    total: u64,
    by_source: std::collections::HashMap<std::net::IpAddr, u64>,
}

impl AuthWindow {
    fn roll(&mut self, second: u64) {
        if self.second != second {
            self.second = second;
            self.total = 0;
            self.by_source.clear();
            if self.by_source.capacity() > 1024 {
                self.by_source.shrink_to(1024);
            }
        }
    }

    /// Whether a password from `source` in `second` goes unchecked: the
    /// source gave `max` wrong ones in this second, or gave one while all
    /// sources together gave `max`. A source that gave none this second is
    /// always checked, so that guessers cannot lock everyone else out.
    pub fn throttled(&mut self, second: u64, source: std::net::IpAddr, max: u64) -> bool {
        self.roll(second);
        let mine = self
            .by_source
            .get(&auth_source(source))
            .copied()
            .unwrap_or(0);
        mine >= max || (mine > 0 && self.total >= max)
    }

    /// Counts a wrong password from `source` in `second`.
    pub fn failed(&mut self, second: u64, source: std::net::IpAddr) {
        self.roll(second);
        self.total += 1;
        let source = auth_source(source);
        if self.by_source.len() < AUTH_SOURCES_TRACKED || self.by_source.contains_key(&source) {
            *self.by_source.entry(source).or_default() += 1;
        }
    }
}

/// Adds one to a counter.
pub fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// A counter's value.
pub fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    /// A source is held back after `max` wrong passwords, or after one
    /// once all together gave `max`; a source that gave none never is.
    #[test]
    fn guessing_is_counted_per_source() {
        let mut w = AuthWindow::default();
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        for _ in 0..3 {
            assert!(!w.throttled(7, a, 3));
            w.failed(7, a);
        }
        assert!(w.throttled(7, a, 3));
        assert!(!w.throttled(7, b, 3), "a clean source is checked");
        w.failed(7, b);
        assert!(w.throttled(7, b, 3), "one wrong, with the total past max");
        assert!(!w.throttled(7, c, 3));
        // A new second starts clean.
        assert!(!w.throttled(8, a, 3));
    }

    /// An IPv6 host's /64 is one source; an IPv4-mapped address is its
    /// IPv4 one.
    #[test]
    fn an_ipv6_slash_64_is_one_source() {
        let mut w = AuthWindow::default();
        for i in 0..3 {
            w.failed(1, ip(&format!("2001:db8:1:2::{i:x}")));
        }
        assert!(w.throttled(1, ip("2001:db8:1:2:ffff::9"), 3));
        assert!(!w.throttled(1, ip("2001:db8:1:3::1"), 3));
        for _ in 0..3 {
            w.failed(1, ip("::ffff:10.0.0.9"));
        }
        assert!(w.throttled(1, ip("10.0.0.9"), 3));
    }

    /// Past the sources tracked, a new source is still checked: the map
    /// never locks clean sources out.
    #[test]
    fn a_full_map_locks_no_clean_source_out() {
        let mut w = AuthWindow::default();
        for i in 0..AUTH_SOURCES_TRACKED as u32 + 10 {
            w.failed(1, std::net::IpAddr::V4(std::net::Ipv4Addr::from(i)));
        }
        assert!(w.by_source.len() <= AUTH_SOURCES_TRACKED);
        assert!(!w.throttled(1, ip("192.0.2.200"), 100));
    }
}
