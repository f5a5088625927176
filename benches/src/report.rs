//! The results table, the Idem/Redis ratios, and JSON.

use serde::Serialize;

use crate::herd::HerdResult;
use crate::memory::MemoryResult;
use crate::workload::{Flavor, Measured, Workload};

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Target and flavor.
    pub target: String,
    /// Workload.
    pub workload: Workload,
    /// Connections.
    pub connections: usize,
    /// Pipeline depth.
    pub pipeline: usize,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Median latency (µs).
    pub p50_us: u64,
    /// 99th percentile (µs).
    pub p99_us: u64,
    /// 99.9th percentile (µs).
    pub p999_us: u64,
    /// Error replies.
    pub errors: u64,
    /// Operations.
    pub ops: u64,
}

impl Row {
    /// A row from a measurement.
    pub fn new(
        flavor: Flavor,
        workload: Workload,
        connections: usize,
        pipeline: usize,
        m: &Measured,
    ) -> Row {
        Row {
            target: flavor.label().into(),
            workload,
            connections,
            pipeline,
            ops_per_sec: m.ops_per_sec(),
            p50_us: m.hist.value_at_quantile(0.5),
            p99_us: m.hist.value_at_quantile(0.99),
            p999_us: m.hist.value_at_quantile(0.999),
            errors: m.errors,
            ops: m.ops,
        }
    }
}

/// A ratio of two rows' throughput.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// What is compared.
    pub what: String,
    /// Connections.
    pub connections: usize,
    /// Pipeline depth.
    pub pipeline: usize,
    /// Numerator / denominator.
    pub ratio: f64,
    /// The target asked for, if any.
    pub target: Option<f64>,
}

/// Everything one invocation measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Throughput rows.
    pub rows: Vec<Row>,
    /// Ratios.
    pub ratios: Vec<Ratio>,
    /// Herd results.
    pub herds: Vec<HerdResult>,
    /// Memory results.
    pub memory: Vec<MemoryResult>,
}

/// Which goals the ratios are held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Goals {
    /// The memory engine's against Redis without persistence: claims 1.5x
    /// an EVALSHA claim and 1.0x `SET NX PX`, claim + complete 1.5x the
    /// Lua pair, replays 1.0x, a claim 0.9x a PING at pipeline 16.
    #[default]
    Memory,
    /// A replicated cluster's against Redis with `appendfsync always`:
    /// claims and claim + complete at least 1.0x each Redis counterpart.
    Replicated,
}

fn find<'a>(rows: &'a [Row], target: &str, w: Workload, c: usize, p: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.target == target && r.workload == w && r.connections == c && r.pipeline == p)
}

impl Report {
    /// Computes the ratios from the rows, against the memory engine's
    /// goals.
    pub fn compute_ratios(&mut self) {
        self.compute_ratios_for(Goals::Memory);
    }

    /// Computes the ratios from the rows, against `goals`.
    pub fn compute_ratios_for(&mut self, goals: Goals) {
        let mut shapes: Vec<(usize, usize)> = self
            .rows
            .iter()
            .map(|r| (r.connections, r.pipeline))
            .collect();
        shapes.dedup();
        shapes.sort();
        shapes.dedup();
        let comparisons: [(&str, Workload, &str, Workload, Option<f64>); 10] = [
            (
                "claim: idem / redis EVALSHA claim",
                Workload::Claim,
                "redis EVALSHA",
                Workload::Claim,
                Some(1.5),
            ),
            (
                "claim: idem / redis SET NX PX",
                Workload::Claim,
                "redis SET NX PX",
                Workload::Claim,
                Some(1.0),
            ),
            (
                "claim: idem / idem PING",
                Workload::Claim,
                "idem",
                Workload::Ping,
                None,
            ),
            (
                "cycle: idem / redis Lua pair",
                Workload::Cycle,
                "redis EVALSHA",
                Workload::Cycle,
                Some(1.5),
            ),
            (
                "replay: idem / redis EVALSHA",
                Workload::Replay,
                "redis EVALSHA",
                Workload::Replay,
                Some(1.0),
            ),
            (
                "replay: idem / redis GET",
                Workload::Replay,
                "redis SET NX PX",
                Workload::Replay,
                None,
            ),
            (
                "mixed: idem / redis Lua mix",
                Workload::Mixed,
                "redis EVALSHA",
                Workload::Mixed,
                None,
            ),
            (
                "ping: idem / redis",
                Workload::Ping,
                "redis",
                Workload::Ping,
                None,
            ),
            (
                "claim: idem / etcd txn",
                Workload::Claim,
                "etcd txn",
                Workload::Claim,
                None,
            ),
            (
                "cycle: idem / etcd txn pair",
                Workload::Cycle,
                "etcd txn",
                Workload::Cycle,
                None,
            ),
        ];
        self.ratios.clear();
        for (c, p) in shapes {
            for (what, wn, den, wd, target) in comparisons {
                let (Some(n), Some(d)) = (
                    find(&self.rows, "idem", wn, c, p),
                    find(&self.rows, den, wd, c, p),
                ) else {
                    continue;
                };
                let target = match goals {
                    Goals::Memory if what.starts_with("claim: idem / idem PING") && p >= 16 => {
                        Some(0.9)
                    }
                    Goals::Memory => target,
                    Goals::Replicated => {
                        let counterpart = matches!(
                            (wn, den),
                            (Workload::Claim, "redis EVALSHA" | "redis SET NX PX")
                                | (Workload::Cycle, "redis EVALSHA")
                        );
                        counterpart.then_some(1.0)
                    }
                };
                self.ratios.push(Ratio {
                    what: what.into(),
                    connections: c,
                    pipeline: p,
                    ratio: n.ops_per_sec / d.ops_per_sec,
                    target,
                });
            }
        }
    }

    /// The report as text tables.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if !self.rows.is_empty() {
            let _ = writeln!(
                s,
                "{:<18} {:<7} {:>5} {:>4} {:>12} {:>9} {:>9} {:>9} {:>7}",
                "target",
                "work",
                "conns",
                "pipe",
                "ops/s",
                "p50 µs",
                "p99 µs",
                "p99.9 µs",
                "errors"
            );
            for r in &self.rows {
                let _ = writeln!(
                    s,
                    "{:<18} {:<7} {:>5} {:>4} {:>12.0} {:>9} {:>9} {:>9} {:>7}",
                    r.target,
                    format!("{:?}", r.workload).to_lowercase(),
                    r.connections,
                    r.pipeline,
                    r.ops_per_sec,
                    r.p50_us,
                    r.p99_us,
                    r.p999_us,
                    r.errors
                );
            }
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<38} {:>5} {:>4} {:>7} {:>8}",
                "ratio", "conns", "pipe", "value", "target"
            );
            for r in &self.ratios {
                let target = r.target.map_or(String::new(), |t| {
                    format!(">= {t:.1} {}", if r.ratio >= t { "ok" } else { "MISS" })
                });
                let _ = writeln!(
                    s,
                    "{:<38} {:>5} {:>4} {:>7.2} {:>8}",
                    r.what, r.connections, r.pipeline, r.ratio, target
                );
            }
        }
        if !self.herds.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<24} {:>8} {:>14} {:>14} {:>10}",
                "herd", "waiters", "last ans. µs", "median µs", "requests"
            );
            for h in &self.herds {
                let _ = writeln!(
                    s,
                    "{:<24} {:>8} {:>14} {:>14} {:>10}",
                    h.label, h.waiters, h.last_answer_us, h.median_answer_us, h.requests
                );
            }
        }
        if !self.memory.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<8} {:>10} {:>14} {:>14} {:>12}",
                "memory", "records", "rss before", "rss after", "bytes/rec"
            );
            for m in &self.memory {
                let _ = writeln!(
                    s,
                    "{:<8} {:>10} {:>14} {:>14} {:>12.1}",
                    m.label, m.records, m.rss_before, m.rss_after, m.bytes_per_record
                );
            }
            if let (Some(i), Some(r)) = (
                self.memory.iter().find(|m| m.label == "idem"),
                self.memory.iter().find(|m| m.label == "redis"),
            ) {
                let ratio = i.bytes_per_record / r.bytes_per_record;
                let _ = writeln!(
                    s,
                    "memory ratio idem/redis: {ratio:.2} (target <= 0.75 {})",
                    if ratio <= 0.75 { "ok" } else { "MISS" }
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{Goals, Report, Row};
    use crate::workload::Workload;

    fn row(target: &str, workload: Workload, pipeline: usize, ops_per_sec: f64) -> Row {
        Row {
            target: target.into(),
            workload,
            connections: 50,
            pipeline,
            ops_per_sec,
            p50_us: 0,
            p99_us: 0,
            p999_us: 0,
            errors: 0,
            ops: 0,
        }
    }

    fn report() -> Report {
        Report {
            rows: vec![
                row("idem", Workload::Claim, 16, 300.0),
                row("redis EVALSHA", Workload::Claim, 16, 120.0),
                row("redis SET NX PX", Workload::Claim, 16, 250.0),
                row("idem", Workload::Cycle, 16, 100.0),
                row("redis EVALSHA", Workload::Cycle, 16, 80.0),
                row("idem", Workload::Ping, 16, 600.0),
            ],
            ..Report::default()
        }
    }

    fn targets(r: &Report) -> Vec<(&str, Option<f64>)> {
        r.ratios
            .iter()
            .map(|r| (r.what.as_str(), r.target))
            .collect()
    }

    #[test]
    fn ratios_are_held_to_the_goals_asked_for() {
        let mut r = report();
        r.compute_ratios();
        assert_eq!(
            targets(&r),
            [
                ("claim: idem / redis EVALSHA claim", Some(1.5)),
                ("claim: idem / redis SET NX PX", Some(1.0)),
                ("claim: idem / idem PING", Some(0.9)),
                ("cycle: idem / redis Lua pair", Some(1.5)),
            ]
        );
        assert!((r.ratios[0].ratio - 2.5).abs() < 1e-9);
        // A cluster is held to 1.0 of each Redis counterpart, and to
        // nothing against its own PING.
        r.compute_ratios_for(Goals::Replicated);
        assert_eq!(
            targets(&r),
            [
                ("claim: idem / redis EVALSHA claim", Some(1.0)),
                ("claim: idem / redis SET NX PX", Some(1.0)),
                ("claim: idem / idem PING", None),
                ("cycle: idem / redis Lua pair", Some(1.0)),
            ]
        );
    }
}
