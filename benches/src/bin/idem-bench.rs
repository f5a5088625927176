//! `idem-bench`: a load generator for idemd, and for Redis side by side.
//!
//! ```text
//! idem-bench --idem 127.0.0.1:7379 --redis 127.0.0.1:6379 \
//!     --workloads claim,cycle,replay,mixed,ping --connections 1,50 --pipeline 1,16 \
//!     --duration 5 --herd 1000 --memory 1000000 --json results.json
//! ```
//!
//! Targets alternate within each configuration (Idem, then each Redis
//! variant), so both see the same machine state; with `--rounds N` they
//! take N turns each and each target's turns are pooled, so that a slow
//! drift of a shared machine falls on all of them. The Idem/Redis ratios
//! are printed after the table.
//!
//! Built with `--features etcd`, `--etcd host:port,...` also runs claim and
//! cycle against an etcd cluster's leader, as the put-if-absent
//! transaction with a lease that replicated locks on etcd use (see
//! `idem_benches::etcd`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use idem_benches::report::{Goals, Report, Row};
use idem_benches::workload::{Flavor, Measured, Prepared, Spec, Workload, prepare, run};
use idem_benches::{herd, memory};

/// Load generator for Idem (and Redis).
#[derive(Parser, Debug)]
#[command(name = "idem-bench", version, about)]
struct Args {
    /// idemd address.
    #[arg(long, default_value = "127.0.0.1:7379")]
    idem: String,
    /// Redis address; when given, every workload also runs against Redis.
    #[arg(long)]
    redis: Option<String>,
    /// etcd client endpoints (`host:port,...`); when given, claim and cycle
    /// also run against etcd's leader as put-if-absent transactions with a
    /// lease (needs a build with `--features etcd`).
    #[arg(long)]
    etcd: Option<String>,
    /// Workloads to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ping,claim,cycle,replay,mixed"
    )]
    workloads: Vec<Workload>,
    /// Connection counts to try.
    #[arg(long, value_delimiter = ',', default_value = "50")]
    connections: Vec<usize>,
    /// Pipeline depths to try.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pipeline: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop each measurement after this many operations instead.
    #[arg(long)]
    requests: Option<u64>,
    /// Rounds per measurement: the targets (idemd, then Redis) take turns
    /// this many times, each turn for the full duration, and each
    /// target's turns are pooled into its row. A slow drift of a shared
    /// machine then falls on every target alike instead of on whichever
    /// ran during it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Completed keys for replay and mixed.
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Run the herd comparison with this many waiters (0: skip).
    #[arg(long, default_value_t = 0)]
    herd: usize,
    /// Polling interval of the Redis herd, ms.
    #[arg(long, default_value_t = 50)]
    poll_ms: u64,
    /// Load this many completed records into each server and report
    /// resident bytes per record (0: skip).
    #[arg(long, default_value_t = 0)]
    memory: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Load generator threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Skip the throughput workloads (herd and memory only).
    #[arg(long)]
    no_throughput: bool,
    /// After every Redis write, `WAIT N 0`: the write is acknowledged once
    /// N replicas have it (a replicated Redis, to compare with a cluster).
    #[arg(long)]
    redis_wait: Option<u32>,
    /// The goals the printed ratios are held to: the memory engine's
    /// (against Redis without persistence) or a replicated cluster's
    /// (against Redis with `appendfsync always`).
    #[arg(long, value_enum, default_value_t = Goals::Memory)]
    goals: Goals,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(bench(args))
}

fn flavors(w: Workload, redis: bool, etcd: bool) -> Vec<Flavor> {
    let mut v = vec![Flavor::Idem];
    if redis {
        v.extend(match w {
            Workload::Ping => vec![Flavor::RedisPing],
            Workload::Claim | Workload::Replay => vec![Flavor::RedisLua, Flavor::RedisSetNx],
            Workload::Cycle | Workload::Mixed => vec![Flavor::RedisLua],
        });
    }
    if etcd && matches!(w, Workload::Claim | Workload::Cycle) {
        v.push(Flavor::Etcd);
    }
    v
}

/// The etcd leader's endpoint, when etcd is asked for.
#[cfg(feature = "etcd")]
async fn etcd_leader(endpoints: Option<&str>) -> anyhow::Result<Option<String>> {
    match endpoints {
        Some(e) => Ok(Some(idem_benches::etcd::leader(e).await?)),
        None => Ok(None),
    }
}

#[cfg(not(feature = "etcd"))]
async fn etcd_leader(endpoints: Option<&str>) -> anyhow::Result<Option<String>> {
    match endpoints {
        Some(_) => anyhow::bail!(
            "--etcd needs idem-bench built with the etcd feature: \
             cargo build --release -p idem-benches --features etcd"
        ),
        None => Ok(None),
    }
}

/// Prepares the target (RESP targets: scripts, populated keys) and runs
/// one measurement against it.
async fn measure(spec: &Spec, prep: &mut Prepared) -> anyhow::Result<Measured> {
    #[cfg(feature = "etcd")]
    if spec.flavor == Flavor::Etcd {
        return idem_benches::etcd::run(spec).await;
    }
    prepare(spec, prep).await?;
    run(spec, prep).await
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let mut report = Report::default();
    let mut prep_idem = Prepared::default();
    let mut prep_redis = Prepared::default();
    let etcd = etcd_leader(args.etcd.as_deref()).await?;
    if !args.no_throughput {
        // Every measurement claims keys no other one used.
        let mut measurements = 0u64;
        for &c in &args.connections {
            for &p in &args.pipeline {
                for &w in &args.workloads {
                    let targets = flavors(w, args.redis.is_some(), etcd.is_some());
                    let mut pooled: Vec<Option<Measured>> = vec![None; targets.len()];
                    for turn in 0..args.rounds {
                        for (i, &flavor) in targets.iter().enumerate() {
                            let addr = match flavor {
                                Flavor::Etcd => etcd.clone().unwrap_or_default(),
                                f if f.is_redis() => args.redis.clone().unwrap_or_default(),
                                _ => args.idem.clone(),
                            };
                            let spec = Spec {
                                addr,
                                flavor,
                                workload: w,
                                connections: c,
                                pipeline: p,
                                duration: Duration::from_secs_f64(args.duration),
                                requests: args.requests,
                                keyspace: args.keyspace,
                                value_size: args.value_size,
                                run_id,
                                round: measurements,
                                progress: args.duration >= 10.0,
                                redis_wait: args.redis_wait.filter(|_| flavor.is_redis()),
                            };
                            measurements += 1;
                            let prep = if flavor.is_redis() {
                                &mut prep_redis
                            } else {
                                &mut prep_idem
                            };
                            // Errors seen before this turn are not its own.
                            idem_benches::workload::take_seen_errors();
                            let m = measure(&spec, prep)
                                .await
                                .with_context(|| format!("{} {w:?}", flavor.label()))?;
                            let row = Row::new(flavor, w, c, p, &m);
                            eprintln!(
                                "{:<16} {:<7} c={:<3} p={:<3} {:>10.0} ops/s  p99 {} µs{}{}",
                                row.target,
                                format!("{w:?}").to_lowercase(),
                                c,
                                p,
                                row.ops_per_sec,
                                row.p99_us,
                                if args.rounds > 1 {
                                    format!("  (round {}/{})", turn + 1, args.rounds)
                                } else {
                                    String::new()
                                },
                                if row.errors > 0 {
                                    format!("  ({} errors)", row.errors)
                                } else {
                                    String::new()
                                }
                            );
                            for (msg, n) in idem_benches::workload::take_seen_errors() {
                                eprintln!("    {n} x -{msg}");
                            }
                            match &mut pooled[i] {
                                Some(all) => all.merge(&m),
                                slot => *slot = Some(m),
                            }
                        }
                    }
                    for (flavor, m) in targets.into_iter().zip(pooled) {
                        if let Some(m) = m {
                            report.rows.push(Row::new(flavor, w, c, p, &m));
                        }
                    }
                }
            }
        }
        report.compute_ratios_for(args.goals);
    }
    if args.herd > 0 {
        report.herds.push(
            herd::idem(&args.idem, args.herd, run_id)
                .await
                .context("idem herd")?,
        );
        if let Some(redis) = &args.redis {
            report.herds.push(
                herd::redis_publish(redis, args.herd, run_id)
                    .await
                    .context("redis publish herd")?,
            );
            report.herds.push(
                herd::redis_poll(
                    redis,
                    args.herd,
                    Duration::from_millis(args.poll_ms),
                    run_id,
                )
                .await
                .context("redis poll herd")?,
            );
        }
        for h in &report.herds {
            eprintln!(
                "herd {:<24} last answer {} µs, {} requests",
                h.label, h.last_answer_us, h.requests
            );
        }
    }
    if args.memory > 0 {
        report.memory.push(
            memory::measure(
                &args.idem,
                Flavor::Idem,
                args.memory,
                args.value_size,
                run_id,
            )
            .await?,
        );
        if let Some(redis) = &args.redis {
            report.memory.push(
                memory::measure(
                    redis,
                    Flavor::RedisLua,
                    args.memory,
                    args.value_size,
                    run_id,
                )
                .await?,
            );
        }
    }
    println!("{}", report.to_text());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
