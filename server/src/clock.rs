//! The node's clock: milliseconds since the Unix epoch, read once at start
//! and advanced by the runtime's monotonic clock (`tokio::time`), so it
//! never jumps back when the wall clock is set back, and tests can pause and
//! advance it (`tokio::time::pause`). The store only ever receives its
//! readings as input, as the stamp of an entry; the waiters' timers run on
//! the same clock.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The system clock `id` now, µs (`CLOCK_BOOTTIME`, `CLOCK_MONOTONIC_COARSE`
/// and the like, which std and tokio do not read).
pub fn clock_us(id: rustix::time::ClockId) -> u64 {
    let t = rustix::time::clock_gettime(id);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000
}

/// A monotonic millisecond clock anchored to the wall clock at start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    epoch_ms: u64,
}

impl Clock {
    /// A clock reading the current time.
    pub fn new() -> Self {
        let epoch_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock::starting_at(epoch_ms.saturating_add_signed(test_skew_ms()))
    }

    /// A clock that reads `epoch_ms` now (for tests).
    pub fn starting_at(epoch_ms: u64) -> Self {
        Clock {
            start: Instant::now(),
            epoch_ms,
        }
    }

    /// Milliseconds now.
    pub fn now_ms(&self) -> u64 {
        self.epoch_ms + self.start.elapsed().as_millis() as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Debug builds only, for fault tests: `IDEMD_TEST_WALL_SKEW_MS` (signed)
/// shifts this process's wall clock, as a host whose clock is off would.
#[cfg(debug_assertions)]
fn test_skew_ms() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        std::env::var("IDEMD_TEST_WALL_SKEW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

#[cfg(not(debug_assertions))]
fn test_skew_ms() -> i64 {
    0
}
