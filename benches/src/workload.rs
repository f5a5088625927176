//! Workloads and the runner: N connections, each sending `pipeline`
//! requests at a time and reading their replies, until the duration or the
//! request count is reached. Latency is the time from sending a batch to
//! reading each reply of it, in microseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use idem_protocol::Frame;
use serde::Serialize;

use crate::conn::Conn;
use crate::scripts;

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// PING (the network floor).
    Ping,
    /// Claims of fresh keys.
    Claim,
    /// Claim then complete with the fence (one op = the pair).
    Cycle,
    /// Claims of completed keys (replays).
    Replay,
    /// 60% replays, 30% fresh claims, 10% reads (SETTLE / GET).
    Mixed,
}

/// How the workload is expressed on the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Flavor {
    /// idemd, Idem protocol.
    Idem,
    /// Redis `SET key 1 NX PX` (a claim without fence or result).
    RedisSetNx,
    /// Redis Lua scripts through EVALSHA (claim with result, fenced complete).
    RedisLua,
    /// Redis PING.
    RedisPing,
    /// etcd: a put-if-absent transaction with a lease (claim), a
    /// transaction fenced by the claim's revision (complete).
    Etcd,
}

impl Flavor {
    /// The label in reports.
    pub fn label(self) -> &'static str {
        match self {
            Flavor::Idem => "idem",
            Flavor::RedisSetNx => "redis SET NX PX",
            Flavor::RedisLua => "redis EVALSHA",
            Flavor::RedisPing => "redis",
            Flavor::Etcd => "etcd txn",
        }
    }

    /// Whether the target is Redis.
    pub fn is_redis(self) -> bool {
        matches!(
            self,
            Flavor::RedisSetNx | Flavor::RedisLua | Flavor::RedisPing
        )
    }
}

/// One benchmark run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Server address.
    pub addr: String,
    /// How the workload is expressed.
    pub flavor: Flavor,
    /// The workload.
    pub workload: Workload,
    /// Connections.
    pub connections: usize,
    /// Requests in flight per connection.
    pub pipeline: usize,
    /// How long to run.
    pub duration: Duration,
    /// Stop after this many operations instead (if set).
    pub requests: Option<u64>,
    /// Completed keys for replay and mixed.
    pub keyspace: u64,
    /// Value size in bytes.
    pub value_size: usize,
    /// Distinguishes this invocation's keys from earlier invocations'.
    pub run_id: u64,
    /// Distinguishes this measurement's fresh keys from other measurements'.
    pub round: u64,
    /// Print progress to stderr.
    pub progress: bool,
    /// Redis only: `WAIT n 0` after every write (acknowledged by `n`
    /// replicas).
    pub redis_wait: Option<u32>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Operations done.
    pub ops: u64,
    /// Error replies.
    pub errors: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Latency histogram (µs).
    pub hist: Histogram<u64>,
}

impl Measured {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Pools `other` (another round of the same measurement) into this
    /// one: operations, errors and time add up, latencies join one
    /// histogram.
    pub fn merge(&mut self, other: &Measured) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        // Both histograms come from `latency_histogram` (same bounds), so
        // adding one to the other cannot fail; a value out of range would
        // be a bug here, not a property of the load.
        self.hist
            .add(&other.hist)
            .expect("histograms of the same bounds");
    }
}

/// An empty latency histogram (µs, 1 µs to 60 s, 3 significant digits):
/// every driver records into one, so that they pool.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}

/// Per-target state prepared once: script hashes, populated keys.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    claim_sha: Bytes,
    complete_sha: Bytes,
    populated: u64,
}

/// A 32-byte key no other measurement uses.
pub(crate) fn fresh_key(spec: &Spec, conn: usize, seq: u64) -> Vec<u8> {
    format!(
        "k{:05}{:06}{:04}{:016}",
        spec.run_id % 100_000,
        spec.round % 1_000_000,
        conn % 10_000,
        seq
    )
    .into_bytes()
}

fn replay_key(run: u64, i: u64) -> Vec<u8> {
    format!("r{:05}{:026}", run % 100_000, i).into_bytes()
}

/// Loads the scripts (Redis) and the completed keys for replay workloads.
pub async fn prepare(spec: &Spec, prepared: &mut Prepared) -> anyhow::Result<()> {
    let mut c = Conn::connect(&spec.addr)
        .await
        .with_context(|| format!("connecting to {}", spec.addr))?;
    if spec.flavor.is_redis() && prepared.claim_sha.is_empty() {
        for (script, slot) in [
            (scripts::CLAIM, &mut prepared.claim_sha),
            (scripts::COMPLETE, &mut prepared.complete_sha),
        ] {
            match c.call(&[b"SCRIPT", b"LOAD", script.as_bytes()]).await? {
                Frame::Bulk(sha) => *slot = sha,
                other => bail!("SCRIPT LOAD failed: {other:?}"),
            }
        }
    }
    let need = match spec.workload {
        Workload::Replay | Workload::Mixed => spec.keyspace,
        _ => 0,
    };
    if prepared.populated >= need {
        return Ok(());
    }
    let value = vec![b'v'; spec.value_size];
    let mut i = prepared.populated;
    while i < need {
        let batch = (need - i).min(1000);
        populate(
            &mut c,
            spec.flavor,
            (i..i + batch).map(|j| replay_key(spec.run_id, j)).collect(),
            &value,
        )
        .await?;
        i += batch;
    }
    prepared.populated = need;
    Ok(())
}

/// Stores completed records for `keys` (a pipelined batch).
pub async fn populate(
    c: &mut Conn,
    flavor: Flavor,
    keys: Vec<Vec<u8>>,
    value: &[u8],
) -> anyhow::Result<()> {
    if flavor.is_redis() {
        let mut stored = Vec::with_capacity(2 + value.len());
        stored.extend_from_slice(b"C:");
        stored.extend_from_slice(value);
        for k in &keys {
            c.push(&[b"SET", k, &stored, b"PX", b"86400000"]);
        }
        c.flush().await?;
        for _ in &keys {
            if let Frame::Error(e) = c.read().await? {
                bail!("populate: {}", String::from_utf8_lossy(&e));
            }
        }
        return Ok(());
    }
    for k in &keys {
        c.push(&[b"CLAIM", k]);
    }
    c.flush().await?;
    let mut fences = Vec::with_capacity(keys.len());
    for _ in &keys {
        match idem_protocol::ClaimReply::from_frame(c.read().await?) {
            Ok(idem_protocol::ClaimReply::Acquired { fence }) => fences.push(Some(fence)),
            Ok(_) => fences.push(None),
            Err(e) => bail!("populate: {e:?}"),
        }
    }
    let mut sent = 0;
    for (k, f) in keys.iter().zip(&fences) {
        if let Some(f) = f {
            c.push(&[b"COMPLETE", k, f.to_string().as_bytes(), value]);
            sent += 1;
        }
    }
    c.flush().await?;
    for _ in 0..sent {
        if let Frame::Error(e) = c.read().await? {
            bail!("populate: {}", String::from_utf8_lossy(&e));
        }
    }
    Ok(())
}

/// Where a run stands, shared by its drivers: whether to stop, and the
/// operations done so far.
#[derive(Debug, Default)]
pub struct Progress {
    stop: AtomicBool,
    ops: AtomicU64,
}

impl Progress {
    /// Whether the run is over (its duration or request count reached).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Counts `n` more operations done.
    pub fn done(&self, n: u64) {
        self.ops.fetch_add(n, Ordering::Relaxed);
    }
}

/// What one driver measured: its latencies, errors and operations.
pub type Driven = (Histogram<u64>, u64, u64);

/// Runs `drive` on every connection of `conns` (with its index) until
/// `spec`'s duration or request count is reached, and pools what the
/// drivers measured. The clock starts once every connection is open.
pub async fn drive_all<C, F, Fut>(spec: &Spec, conns: Vec<C>, drive: F) -> anyhow::Result<Measured>
where
    F: Fn(C, usize, Arc<Progress>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Driven>> + Send + 'static,
{
    let progress = Arc::new(Progress::default());
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| tokio::spawn(drive(conn, i, Arc::clone(&progress))))
        .collect();
    let ticker = {
        let progress = Arc::clone(&progress);
        let spec = spec.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let ops = progress.ops.load(Ordering::Relaxed);
                let done =
                    start.elapsed() >= spec.duration || spec.requests.is_some_and(|r| ops >= r);
                if done {
                    progress.stop.store(true, Ordering::Relaxed);
                    return;
                }
                let secs = start.elapsed().as_secs();
                if spec.progress && secs > last && secs.is_multiple_of(2) {
                    last = secs;
                    eprintln!(
                        "  ... {} {:?}: {} ops in {}s",
                        spec.flavor.label(),
                        spec.workload,
                        ops,
                        secs
                    );
                }
            }
        })
    };
    let mut hist = latency_histogram();
    let mut errors = 0;
    let mut ops = 0;
    for t in tasks {
        let (h, e, o) = t.await??;
        hist.add(&h)?;
        errors += e;
        ops += o;
    }
    let elapsed = start.elapsed();
    ticker.abort();
    Ok(Measured {
        ops,
        errors,
        elapsed,
        hist,
    })
}

/// Runs one benchmark.
pub async fn run(spec: &Spec, prepared: &Prepared) -> anyhow::Result<Measured> {
    let mut conns = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        conns.push(
            Conn::connect(&spec.addr)
                .await
                .with_context(|| format!("connecting to {}", spec.addr))?,
        );
    }
    drive_all(spec, conns, |conn, i, progress| {
        let (spec, prepared) = (spec.clone(), prepared.clone());
        async move { drive(conn, i, &spec, &prepared, &progress).await }
    })
    .await
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn is_error(f: &Frame) -> bool {
    if let Frame::Error(e) = f {
        note_error(e);
        true
    } else {
        false
    }
}

/// The error replies seen since [`take_seen_errors`] last ran: up to four
/// distinct messages, each with how often it came.
static SEEN_ERRORS: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());

fn note_error(e: &[u8]) {
    let msg: String = String::from_utf8_lossy(e).chars().take(100).collect();
    let mut seen = SEEN_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = seen.iter_mut().find(|(m, _)| *m == msg) {
        s.1 += 1;
    } else if seen.len() < 4 {
        seen.push((msg, 1));
    }
}

/// The error replies seen since the last call (up to four distinct
/// messages with their counts), so that a run's errors can be named.
pub fn take_seen_errors() -> Vec<(String, u64)> {
    std::mem::take(&mut *SEEN_ERRORS.lock().unwrap_or_else(|p| p.into_inner()))
}

async fn drive(
    mut c: Conn,
    idx: usize,
    spec: &Spec,
    prep: &Prepared,
    progress: &Progress,
) -> anyhow::Result<Driven> {
    let mut hist = latency_histogram();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (idx as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let value = vec![b'v'; spec.value_size];
    let mut seq = 0u64;
    let (mut errors, mut ops) = (0u64, 0u64);
    let lease = b"60000";
    let p = spec.pipeline;
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(p);
    let wait = spec.redis_wait.map(|n| n.to_string().into_bytes());
    while !progress.stopped() {
        let t0 = Instant::now();
        match spec.workload {
            Workload::Cycle => {
                keys.clear();
                for _ in 0..p {
                    seq += 1;
                    keys.push(fresh_key(spec, idx, seq));
                }
                for k in &keys {
                    match spec.flavor {
                        Flavor::Idem => c.push(&[b"CLAIM", k, b"LEASE", lease]),
                        _ => c.push(&[b"EVALSHA", &prep.claim_sha, b"1", k, lease]),
                    }
                    push_wait(&mut c, &wait);
                }
                c.flush().await?;
                let mut fences = Vec::with_capacity(p);
                for _ in 0..p {
                    let f = c.read().await?;
                    errors += read_wait(&mut c, &wait).await?;
                    fences.push(match &f {
                        Frame::Array(items) => match items.get(1) {
                            Some(Frame::Integer(n)) => Some(*n),
                            _ => None,
                        },
                        Frame::Error(e) => {
                            note_error(e);
                            None
                        }
                        _ => None,
                    });
                }
                let mut sent = 0;
                for (k, f) in keys.iter().zip(&fences) {
                    let Some(f) = f else {
                        errors += 1;
                        continue;
                    };
                    let fence = f.to_string();
                    match spec.flavor {
                        Flavor::Idem => c.push(&[b"COMPLETE", k, fence.as_bytes(), &value]),
                        _ => c.push(&[
                            b"EVALSHA",
                            &prep.complete_sha,
                            b"1",
                            k,
                            fence.as_bytes(),
                            &value,
                            b"86400000",
                        ]),
                    }
                    push_wait(&mut c, &wait);
                    sent += 1;
                }
                c.flush().await?;
                for _ in 0..sent {
                    if is_error(&c.read().await?) {
                        errors += 1;
                    }
                    errors += read_wait(&mut c, &wait).await?;
                }
            }
            w => {
                // Only fresh claims write (replays and reads do not).
                let wait = if w == Workload::Claim {
                    wait.clone()
                } else {
                    None
                };
                for _ in 0..p {
                    seq += 1;
                    push_simple(&mut c, w, spec, prep, idx, seq, &mut rng, lease);
                    push_wait(&mut c, &wait);
                }
                c.flush().await?;
                for _ in 0..p {
                    if is_error(&c.read().await?) {
                        errors += 1;
                    }
                    errors += read_wait(&mut c, &wait).await?;
                }
            }
        }
        let us = t0.elapsed().as_micros() as u64;
        hist.record_n(us.max(1), p as u64)?;
        ops += p as u64;
        progress.done(p as u64);
    }
    Ok((hist, errors, ops))
}

/// Pushes `WAIT n 0` when the run waits for replicas.
fn push_wait(c: &mut Conn, wait: &Option<Vec<u8>>) {
    if let Some(n) = wait {
        c.push(&[b"WAIT", n, b"0"]);
    }
}

/// Reads the reply of a pushed `WAIT`: 1 (an error) if fewer replicas
/// acknowledged than asked for.
async fn read_wait(c: &mut Conn, wait: &Option<Vec<u8>>) -> anyhow::Result<u64> {
    let Some(n) = wait else {
        return Ok(0);
    };
    let want: i64 = std::str::from_utf8(n)?.parse()?;
    Ok(match c.read().await? {
        Frame::Integer(got) if got >= want => 0,
        _ => 1,
    })
}

#[allow(clippy::too_many_arguments)]
fn push_simple(
    c: &mut Conn,
    w: Workload,
    spec: &Spec,
    prep: &Prepared,
    idx: usize,
    seq: u64,
    rng: &mut Rng,
    lease: &[u8],
) {
    let replay = |rng: &mut Rng| replay_key(spec.run_id, rng.next() % spec.keyspace.max(1));
    let w = match w {
        Workload::Mixed => match rng.next() % 10 {
            0..=5 => Workload::Replay,
            6..=8 => Workload::Claim,
            _ => {
                let k = replay(rng);
                match spec.flavor {
                    Flavor::Idem => c.push(&[b"SETTLE", &k]),
                    _ => c.push(&[b"GET", &k]),
                }
                return;
            }
        },
        w => w,
    };
    match (w, spec.flavor) {
        (Workload::Ping, _) => c.push(&[b"PING"]),
        (Workload::Claim, Flavor::Idem) => {
            c.push(&[b"CLAIM", &fresh_key(spec, idx, seq), b"LEASE", lease])
        }
        (Workload::Claim, Flavor::RedisSetNx) => c.push(&[
            b"SET",
            &fresh_key(spec, idx, seq),
            b"1",
            b"NX",
            b"PX",
            lease,
        ]),
        (Workload::Claim, _) => c.push(&[
            b"EVALSHA",
            &prep.claim_sha,
            b"1",
            &fresh_key(spec, idx, seq),
            lease,
        ]),
        (Workload::Replay, Flavor::Idem) => c.push(&[b"CLAIM", &replay(rng)]),
        (Workload::Replay, Flavor::RedisSetNx) => c.push(&[b"GET", &replay(rng)]),
        (Workload::Replay, _) => c.push(&[b"EVALSHA", &prep.claim_sha, b"1", &replay(rng), lease]),
        (Workload::Cycle | Workload::Mixed, _) => unreachable!("handled by the caller"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(ops: u64, errors: u64, secs: u64, latencies: &[u64]) -> Measured {
        let mut hist = latency_histogram();
        for &l in latencies {
            hist.record(l).expect("in range");
        }
        Measured {
            ops,
            errors,
            elapsed: Duration::from_secs(secs),
            hist,
        }
    }

    #[test]
    fn rounds_pool_into_one_measurement() {
        // A fast round and a slow one: the pooled rate is total operations
        // over total time, not the mean of the two rates.
        let mut all = measured(9_000, 1, 1, &[100, 100, 100]);
        all.merge(&measured(1_000, 2, 1, &[10_000]));
        assert_eq!((all.ops, all.errors), (10_000, 3));
        assert_eq!(all.elapsed, Duration::from_secs(2));
        assert!((all.ops_per_sec() - 5_000.0).abs() < 1e-9);
        assert_eq!(all.hist.len(), 4);
        assert_eq!(all.hist.max(), all.hist.highest_equivalent(10_000));
        assert_eq!(
            all.hist.value_at_quantile(0.5),
            all.hist.highest_equivalent(100)
        );
    }
}
