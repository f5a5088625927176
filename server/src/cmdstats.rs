//! Per-command statistics, as Redis reports them (and monitoring built for
//! Redis, such as prometheus-redis-exporter, reads them): calls, time,
//! refusals and failures by command for `INFO commandstats`, error replies
//! by code for `INFO errorstats`, latency percentiles by command for
//! `INFO latencystats`. `CONFIG RESETSTAT` sets them back to zero.
//!
//! A command's time runs from its dispatch until its reply is known (a
//! reply that comes later is counted when it reaches the front of the
//! connection's replies, which leave in request order): for a write that
//! is after the log's fsync (on a majority, in a cluster), and for a
//! request that waits (`WAIT`) it includes the wait, where Redis counts
//! only the time its thread spends on the command.
//!
//! Counting stays off shared cache lines: each thread counts into a stripe
//! of its own (threads beyond the stripes share them, still exactly, as
//! every count is an atomic add), and INFO adds the stripes up.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use idem_protocol::spec::COMMANDS;
use idem_protocol::{CommandId, ErrorCode, Reply};

/// Latencies below this many µs have a bucket each.
const EXACT: usize = 16;
/// Above them, each power of two is cut into `1 << SUB_BITS` buckets: a
/// percentile is known within 1/16 (6.25%) of its value.
const SUB_BITS: u32 = 4;
/// The largest power of two of µs with buckets of its own (2^36 µs is
/// 19 hours); longer times count in the last bucket.
const MAX_EXP: u32 = 36;
/// Buckets in a latency histogram.
const BUCKETS: usize = EXACT + (((MAX_EXP - SUB_BITS + 1) as usize) << SUB_BITS);

/// The percentiles `INFO latencystats` reports (Redis's default
/// `latency-tracking-info-percentiles`).
pub const PERCENTILES: [f64; 3] = [50.0, 99.0, 99.9];

/// The histogram bucket of a latency of `us` µs.
fn bucket(us: u64) -> usize {
    if us < EXACT as u64 {
        return us as usize;
    }
    let us = us.min((1 << (MAX_EXP + 1)) - 1);
    let exp = 63 - us.leading_zeros();
    let sub = (us >> (exp - SUB_BITS)) as usize & ((1 << SUB_BITS) - 1);
    EXACT + (((exp - SUB_BITS) as usize) << SUB_BITS) + sub
}

/// The latency (µs) a bucket stands for: its value where it holds one,
/// else the middle of its range.
fn bucket_value(i: usize) -> f64 {
    if i < EXACT {
        return i as f64;
    }
    let exp = ((i - EXACT) >> SUB_BITS) as u32 + SUB_BITS;
    let sub = ((i - EXACT) & ((1 << SUB_BITS) - 1)) as u64;
    let width = 1u64 << (exp - SUB_BITS);
    let low = ((1u64 << SUB_BITS) + sub) << (exp - SUB_BITS);
    low as f64 + (width as f64 - 1.0) / 2.0
}

/// Whether an error reply with `code` refused the command before it ran
/// (Redis's `rejected_calls`); any other error reply is a failed call.
fn refused(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NoAuth
            | ErrorCode::NoPerm
            | ErrorCode::Moved
            | ErrorCode::ClusterDown
            | ErrorCode::TooBig
            | ErrorCode::Oom
    )
}

/// One command's counts in one stripe.
#[derive(Default)]
struct Cmd {
    calls: AtomicU64,
    usec: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    /// Made on the command's first call.
    latencies: OnceLock<Box<[AtomicU64]>>,
}

/// One thread's counts.
#[repr(align(128))]
struct Stripe {
    cmds: [Cmd; COMMANDS.len()],
    errors: [AtomicU64; ErrorCode::ALL.len()],
    /// Bytes read from and written to clients.
    net_in: AtomicU64,
    net_out: AtomicU64,
}

impl Stripe {
    fn new() -> Self {
        Stripe {
            cmds: std::array::from_fn(|_| Cmd::default()),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            net_in: AtomicU64::new(0),
            net_out: AtomicU64::new(0),
        }
    }
}

/// Per-command statistics of one server.
pub struct CmdStats {
    stripes: Box<[Stripe]>,
}

impl std::fmt::Debug for CmdStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmdStats")
            .field("stripes", &self.stripes.len())
            .finish_non_exhaustive()
    }
}

/// Which stripe the calling thread counts into (before the modulo).
fn thread_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Relaxed);
    }
    STRIPE.with(|s| *s)
}

/// A command's totals over every stripe.
struct Totals {
    calls: u64,
    usec: u64,
    rejected: u64,
    failed: u64,
}

impl CmdStats {
    /// Statistics counted in `stripes` stripes (at least one): as many as
    /// the runtime has worker threads.
    pub fn new(stripes: usize) -> Self {
        CmdStats {
            stripes: (0..stripes.max(1)).map(|_| Stripe::new()).collect(),
        }
    }

    fn stripe(&self) -> &Stripe {
        &self.stripes[thread_stripe() % self.stripes.len()]
    }

    /// Counts the reply to command `id`, `took` after its dispatch. An
    /// error reply that refused it (see [`refused`]) counts as a refusal, not
    /// a call.
    pub fn record(&self, id: CommandId, took: Duration, reply: &Reply) {
        let stripe = self.stripe();
        let mut failed = false;
        if let Reply::Error(e) = reply {
            // Every code is in `ErrorCode::ALL` (a protocol test checks it);
            // one that were not would go uncounted, not panic.
            if let Some(n) = stripe.errors.get(e.code.index()) {
                n.fetch_add(1, Relaxed);
            }
            failed = true;
            if refused(e.code) {
                stripe.cmds[id as usize].rejected.fetch_add(1, Relaxed);
                return;
            }
        }
        let cmd = &stripe.cmds[id as usize];
        let us = took
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(took.subsec_micros()));
        cmd.calls.fetch_add(1, Relaxed);
        cmd.usec.fetch_add(us, Relaxed);
        if failed {
            cmd.failed.fetch_add(1, Relaxed);
        }
        cmd.latencies
            .get_or_init(|| (0..BUCKETS).map(|_| AtomicU64::new(0)).collect())[bucket(us)]
        .fetch_add(1, Relaxed);
    }

    /// Counts an error reply to a request refused before it ran: a
    /// malformed request, an unknown command (`id` is `None`), a command
    /// with arguments it cannot take (counted in its `rejected_calls`).
    pub fn refuse(&self, id: Option<CommandId>, reply: &Reply) {
        let stripe = self.stripe();
        if let Reply::Error(e) = reply {
            // Every code is in `ErrorCode::ALL` (a protocol test checks it);
            // one that were not would go uncounted, not panic.
            if let Some(n) = stripe.errors.get(e.code.index()) {
                n.fetch_add(1, Relaxed);
            }
        }
        if let Some(id) = id {
            stripe.cmds[id as usize].rejected.fetch_add(1, Relaxed);
        }
    }

    /// Counts `n` bytes read from a client.
    pub fn read(&self, n: usize) {
        self.stripe().net_in.fetch_add(n as u64, Relaxed);
    }

    /// Counts `n` bytes written to a client.
    pub fn written(&self, n: usize) {
        self.stripe().net_out.fetch_add(n as u64, Relaxed);
    }

    /// Bytes read from and written to clients (Redis's
    /// `total_net_input_bytes` and `total_net_output_bytes`).
    pub fn net(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(i, o), s| {
            (i + s.net_in.load(Relaxed), o + s.net_out.load(Relaxed))
        })
    }

    /// Sets every count back to zero (`CONFIG RESETSTAT`).
    pub fn reset(&self) {
        for stripe in &*self.stripes {
            stripe.net_in.store(0, Relaxed);
            stripe.net_out.store(0, Relaxed);
            for cmd in &stripe.cmds {
                for a in [&cmd.calls, &cmd.usec, &cmd.rejected, &cmd.failed] {
                    a.store(0, Relaxed);
                }
                for a in cmd.latencies.get().into_iter().flat_map(|l| l.iter()) {
                    a.store(0, Relaxed);
                }
            }
            for a in &stripe.errors {
                a.store(0, Relaxed);
            }
        }
    }

    /// Command `i`'s latency histogram, summed over the stripes (all zeros
    /// if it was never called).
    fn buckets(&self, i: usize) -> Vec<u64> {
        let mut counts = vec![0u64; BUCKETS];
        for l in self
            .stripes
            .iter()
            .filter_map(|s| s.cmds[i].latencies.get())
        {
            for (c, a) in counts.iter_mut().zip(l.iter()) {
                *c += a.load(Relaxed);
            }
        }
        counts
    }

    fn totals(&self, i: usize) -> Totals {
        let mut t = Totals {
            calls: 0,
            usec: 0,
            rejected: 0,
            failed: 0,
        };
        for stripe in &*self.stripes {
            let c = &stripe.cmds[i];
            t.calls += c.calls.load(Relaxed);
            t.usec += c.usec.load(Relaxed);
            t.rejected += c.rejected.load(Relaxed);
            t.failed += c.failed.load(Relaxed);
        }
        t
    }

    /// Error replies sent, of every code (Redis's `total_error_replies`).
    pub fn error_replies(&self) -> u64 {
        self.stripes
            .iter()
            .flat_map(|s| s.errors.iter())
            .map(|a| a.load(Relaxed))
            .sum()
    }

    /// The `# Commandstats` lines: one per command called or refused since
    /// start (or `CONFIG RESETSTAT`).
    pub fn write_commandstats(&self, out: &mut String) {
        for (i, spec) in COMMANDS.iter().enumerate() {
            let t = self.totals(i);
            if t.calls == 0 && t.rejected == 0 {
                continue;
            }
            let per_call = if t.calls == 0 {
                0.0
            } else {
                t.usec as f64 / t.calls as f64
            };
            let _ = write!(
                out,
                "cmdstat_{}:calls={},usec={},usec_per_call={per_call:.2},rejected_calls={},failed_calls={}\r\n",
                spec.name, t.calls, t.usec, t.rejected, t.failed
            );
        }
    }

    /// The `# Errorstats` lines: error replies by code, for the codes sent
    /// since start (or `CONFIG RESETSTAT`).
    pub fn write_errorstats(&self, out: &mut String) {
        for (code, n) in self.errors() {
            if n > 0 {
                let _ = write!(out, "errorstat_{}:count={n}\r\n", code.as_str());
            }
        }
    }

    /// The `# Latencystats` lines: p50, p99 and p99.9 in µs of every
    /// command called since start (or `CONFIG RESETSTAT`).
    pub fn write_latencystats(&self, out: &mut String) {
        for (i, spec) in COMMANDS.iter().enumerate() {
            let counts = self.buckets(i);
            let total: u64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let _ = write!(out, "latency_percentiles_usec_{}:", spec.name);
            for (n, p) in PERCENTILES.iter().enumerate() {
                let v = percentile(&counts, total, *p);
                let sep = if n == 0 { "" } else { "," };
                let _ = write!(out, "{sep}p{p}={v:.3}");
            }
            out.push_str("\r\n");
        }
    }
}

impl CmdStats {
    /// Command `id`'s calls and latency distribution for `LATENCY
    /// HISTOGRAM`, as Redis gives it: at each power of two of µs (1, 2, 4,
    /// ...) where the count grows, the calls that took about that long or
    /// less (within the histogram's 1/16). `None` if it was never called.
    pub fn histogram(&self, id: CommandId) -> Option<(u64, Vec<(u64, u64)>)> {
        let counts = self.buckets(id as usize);
        let calls: u64 = counts.iter().sum();
        if calls == 0 {
            return None;
        }
        let mut points = Vec::new();
        let (mut upto, mut seen, mut last) = (0, 0, 0);
        for exp in 0..=MAX_EXP + 1 {
            let us = 1u64 << exp;
            let through = bucket(us).min(BUCKETS - 1);
            while upto <= through {
                seen += counts[upto];
                upto += 1;
            }
            if seen > last {
                points.push((us, seen));
                last = seen;
            }
            if seen == calls {
                break;
            }
        }
        if seen < calls {
            points.push((1 << (MAX_EXP + 1), calls));
        }
        Some((calls, points))
    }
}

/// One command's figures, for the Prometheus exposition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandFigures {
    /// The command's name.
    pub name: &'static str,
    /// Calls (refusals left out).
    pub calls: u64,
    /// Calls in the latency histogram: `calls` read with the buckets (the
    /// histogram's count, consistent with [`CommandFigures::below`]).
    pub observed: u64,
    /// Their time, µs.
    pub usec: u64,
    /// Refused before running.
    pub rejected: u64,
    /// Calls answered with an error.
    pub failed: u64,
    /// For each bound of [`HISTOGRAM_BOUNDS_US`], the calls that took less.
    pub below: Vec<u64>,
}

/// The bounds (µs) of the Prometheus latency histogram: powers of two from
/// 16 µs to about 1 s, where the histogram's buckets begin exactly.
pub const HISTOGRAM_BOUNDS_US: [u64; 17] = {
    let mut b = [0; 17];
    let mut i = 0;
    while i < 17 {
        b[i] = 16 << i;
        i += 1;
    }
    b
};

impl CmdStats {
    /// The figures of every command called or refused since start (or
    /// `CONFIG RESETSTAT`).
    pub fn figures(&self) -> Vec<CommandFigures> {
        let mut out = Vec::new();
        for (i, spec) in COMMANDS.iter().enumerate() {
            let t = self.totals(i);
            if t.calls == 0 && t.rejected == 0 {
                continue;
            }
            let counts = self.buckets(i);
            let below = HISTOGRAM_BOUNDS_US
                .iter()
                .map(|&us| counts[..bucket(us)].iter().sum())
                .collect();
            out.push(CommandFigures {
                name: spec.name,
                calls: t.calls,
                observed: counts.iter().sum(),
                usec: t.usec,
                rejected: t.rejected,
                failed: t.failed,
                below,
            });
        }
        out
    }

    /// Error replies by code, for every code.
    pub fn errors(&self) -> Vec<(ErrorCode, u64)> {
        ErrorCode::ALL
            .iter()
            .map(|&code| {
                let n = self
                    .stripes
                    .iter()
                    .map(|s| s.errors[code.index()].load(Relaxed))
                    .sum();
                (code, n)
            })
            .collect()
    }
}

/// The value (µs) at percentile `p` of a histogram holding `total` counts.
fn percentile(counts: &[u64], total: u64, p: f64) -> f64 {
    // The rank of the count at `p`, from 1 (in thousandths of a percent:
    // 99.9% of 1,000 is the 999th, not the 1,000th of a float's rounding).
    let per_100k = (p * 1000.0).round() as u64;
    let rank = (per_100k * total).div_ceil(100_000).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_value(i);
        }
    }
    bucket_value(counts.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_protocol::{Frame, ServerError};

    #[test]
    fn buckets_cover_every_latency_in_order_within_a_sixteenth() {
        let mut last = 0;
        for us in (0..5000u64).chain((13..=40).map(|e| (1u64 << e) - 1)) {
            let b = bucket(us);
            assert!(b >= last, "{us} µs went back to bucket {b}");
            assert!(b < BUCKETS);
            last = b;
            let v = bucket_value(b);
            if us < (1 << (MAX_EXP + 1)) {
                assert!(
                    (v - us as f64).abs() <= (us as f64 / 16.0).max(0.0),
                    "{us} µs stands as {v}"
                );
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket(7), 7);
        assert_eq!(bucket_value(bucket(7)), 7.0);
    }

    #[test]
    fn percentiles_come_from_the_calls_counted() {
        let stats = CmdStats::new(2);
        let ok = Reply::Ok;
        // 980 calls of 10 µs, 19 of 1 ms, 1 of 100 ms.
        for _ in 0..980 {
            stats.record(CommandId::Claim, Duration::from_micros(10), &ok);
        }
        for _ in 0..19 {
            stats.record(CommandId::Claim, Duration::from_millis(1), &ok);
        }
        stats.record(CommandId::Claim, Duration::from_millis(100), &ok);
        let mut out = String::new();
        stats.write_latencystats(&mut out);
        let line = out.trim_end();
        let rest = line
            .strip_prefix("latency_percentiles_usec_claim:")
            .unwrap();
        let values: Vec<f64> = rest
            .split(',')
            .map(|kv| kv.split_once('=').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(values[0], 10.0, "{line}");
        assert!((values[1] - 1000.0).abs() <= 1000.0 / 16.0, "{line}");
        assert!((values[2] - 1000.0).abs() <= 1000.0 / 16.0, "{line}");
        assert!(rest.starts_with("p50=10.000,p99="), "{line}");
        let mut out = String::new();
        stats.write_commandstats(&mut out);
        assert_eq!(
            out,
            format!(
                "cmdstat_claim:calls=1000,usec={},usec_per_call={:.2},rejected_calls=0,failed_calls=0\r\n",
                980 * 10 + 19 * 1000 + 100_000,
                (980.0 * 10.0 + 19_000.0 + 100_000.0) / 1000.0
            )
        );
    }

    #[test]
    fn histograms_count_calls_up_to_each_power_of_two() {
        let stats = CmdStats::new(3);
        assert_eq!(stats.histogram(CommandId::Claim), None);
        for us in [0, 1, 1, 3, 40, 40, 1000] {
            stats.record(CommandId::Claim, Duration::from_micros(us), &Reply::Ok);
        }
        let (calls, points) = stats.histogram(CommandId::Claim).unwrap();
        assert_eq!(calls, 7);
        assert_eq!(
            points,
            vec![(1, 3), (4, 4), (64, 6), (1024, 7)],
            "cumulative counts where they grow"
        );
    }

    #[test]
    fn figures_count_calls_below_each_bound() {
        let stats = CmdStats::new(2);
        for us in [5, 15, 16, 100, 5000, 2_000_000] {
            stats.record(CommandId::Settle, Duration::from_micros(us), &Reply::Ok);
        }
        let f = stats.figures();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].name, "settle");
        assert_eq!(f[0].calls, 6);
        assert_eq!(f[0].observed, 6);
        // Below 16, 32, 64, 128, ... µs; the 2 s call is below none.
        assert_eq!(f[0].below[..5], [2, 3, 3, 4, 4]);
        assert_eq!(f[0].below[9], 5, "below 8,192 µs");
        assert_eq!(*f[0].below.last().unwrap(), 5);
        assert_eq!(HISTOGRAM_BOUNDS_US[16], 1 << 20);
    }

    #[test]
    fn refusals_and_failures_are_counted_apart_and_reset() {
        let stats = CmdStats::new(1);
        let t = Duration::from_micros(3);
        let moved = Reply::Error(ServerError::new(ErrorCode::Moved, "1 127.0.0.1:1"));
        let fenced = Reply::Error(ServerError::new(ErrorCode::Fenced, "not the owner"));
        stats.record(CommandId::Complete, t, &moved);
        stats.record(CommandId::Complete, t, &fenced);
        stats.record(CommandId::Complete, t, &Reply::Ok);
        stats.record(CommandId::Ping, t, &Reply::Frame(Frame::simple("PONG")));
        // Not a command: counted as an error reply alone.
        stats.refuse(None, &Reply::Error(ServerError::new(ErrorCode::Err, "x")));
        // A command refused before it ran.
        stats.refuse(
            Some(CommandId::Ping),
            &Reply::Error(ServerError::new(
                ErrorCode::Err,
                "wrong number of arguments",
            )),
        );
        let mut out = String::new();
        stats.write_commandstats(&mut out);
        assert_eq!(
            out,
            "cmdstat_complete:calls=2,usec=6,usec_per_call=3.00,rejected_calls=1,failed_calls=1\r\n\
             cmdstat_ping:calls=1,usec=3,usec_per_call=3.00,rejected_calls=1,failed_calls=0\r\n"
        );
        let mut out = String::new();
        stats.write_errorstats(&mut out);
        assert_eq!(
            out,
            "errorstat_ERR:count=2\r\nerrorstat_FENCED:count=1\r\nerrorstat_MOVED:count=1\r\n"
        );
        assert_eq!(stats.error_replies(), 4);
        stats.read(10);
        stats.written(7);
        assert_eq!(stats.net(), (10, 7));
        stats.reset();
        assert_eq!(stats.net(), (0, 0));
        let mut out = String::new();
        stats.write_commandstats(&mut out);
        stats.write_errorstats(&mut out);
        stats.write_latencystats(&mut out);
        assert_eq!(out, "");
        assert_eq!(stats.error_replies(), 0);
    }
}
