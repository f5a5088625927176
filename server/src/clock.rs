//! The node's clock: milliseconds since the Unix epoch, read once at start
//! and advanced by a monotonic timer, so it never jumps back when the wall
//! clock is set back. The store only ever receives its readings as input.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
