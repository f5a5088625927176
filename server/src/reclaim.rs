//! A hook through which threads the library starts give freed memory
//! back.
//!
//! The allocator is the binary's choice, so is how to ask it for memory
//! back: the binary sets a collector ([`set_collector`]), and long-lived
//! threads of the library that allocate (the log writer) call it when they
//! have been idle a while ([`collect`]). With no collector set, nothing
//! happens.

use std::sync::OnceLock;
use std::time::Duration;

static COLLECTOR: OnceLock<fn()> = OnceLock::new();

/// How long a library thread waits idle before it calls the collector
/// (and again after each such wait).
pub const IDLE_COLLECT_AFTER: Duration = Duration::from_secs(1);

/// Sets the function idle threads call to give the memory they freed back
/// (once; later calls are ignored). It is called often (once a second per
/// idle thread) and must be cheap when there is nothing to do.
pub fn set_collector(f: fn()) {
    let _ = COLLECTOR.set(f);
}

/// Calls the collector on this thread, if one is set.
pub fn collect() {
    if let Some(f) = COLLECTOR.get() {
        f();
    }
}
