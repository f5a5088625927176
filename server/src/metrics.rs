//! Server-wide counters, and the INFO text built from them.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::server::Shared;

/// Counters kept by the connection layer (the store and the waiters keep
/// their own).
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
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The sections INFO knows, in order.
pub const SECTIONS: [&str; 5] = ["server", "clients", "memory", "stats", "keyspace"];

/// The INFO text for the sections asked for (all when `wanted` is empty or
/// holds `all`, `default` or `everything`).
pub fn info(shared: &Shared, wanted: &[String]) -> String {
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "default" || w == "everything");
    let st = shared.engine.stats();
    let w = &shared.waiters.stats;
    let m = &shared.metrics;
    let mut out = String::new();
    let mut section = |name: &str, body: &dyn Fn(&mut String)| {
        if all || wanted.iter().any(|w| w == name) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            let _ = write!(out, "# {}{}\r\n", name[..1].to_uppercase(), &name[1..]);
            body(&mut out);
        }
    };
    section("server", &|o| {
        let _ = write!(
            o,
            "idem_version:{}\r\nredis_version:7.0.0\r\nengine:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nshards:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            format!("{:?}", shared.engine.kind()).to_lowercase(),
            std::process::id(),
            shared.local_addr.port(),
            shared.started.elapsed().as_secs(),
            shared.config.store.shards,
        );
    });
    section("clients", &|o| {
        let _ = write!(
            o,
            "connected_clients:{}\r\nblocked_clients:{}\r\nmaxclients:{}\r\n",
            shared.clients.count(),
            shared.waiters.parked(),
            shared.config.max_connections
        );
    });
    section("memory", &|o| {
        let _ = write!(
            o,
            "used_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\n",
            st.memory, shared.config.store.max_memory_bytes
        );
    });
    section("stats", &|o| {
        let c = &st.counters;
        let _ = write!(
            o,
            "total_connections_received:{}\r\nrejected_connections:{}\r\ntotal_commands_processed:{}\r\n\
             claims_acquired:{}\r\nclaims_recovered:{}\r\nreplays:{}\r\nhits_after_wait:{}\r\nwaits_parked:{}\r\n\
             waits_timed_out:{}\r\ninflight_conflicts:{}\r\nfenced:{}\r\nlease_lapses:{}\r\nmismatches:{}\r\n\
             oom_refusals:{}\r\nrecords_completed:{}\r\nexpired_records:{}\r\ntoobig_refusals:{}\r\n\
             protocol_errors:{}\r\noutput_limit_disconnects:{}\r\n",
            get(&m.connections),
            get(&m.rejected),
            get(&m.commands),
            c.acquired,
            c.recovered,
            c.replays,
            get(&w.hits_after_wait),
            get(&w.parked_total),
            get(&w.timed_out),
            c.conflicts,
            c.fenced,
            c.lapses,
            c.mismatches,
            c.oom,
            c.completed,
            c.expired,
            get(&m.toobig),
            get(&m.protocol_errors),
            get(&m.output_limit_disconnects),
        );
    });
    section("keyspace", &|o| {
        let _ = write!(
            o,
            "records:{}\r\nrecords_in_flight:{}\r\nrecords_abandoned:{}\r\nrecords_completed_now:{}\r\nlast_fence:{}\r\n",
            st.records, st.in_flight, st.abandoned, st.completed, st.last_fence
        );
    });
    out
}
