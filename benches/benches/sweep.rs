//! The expiry sweep over a store of 1M records: one bounded tick when
//! nothing is due, and reclaiming 1M expired records tick by tick.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_protocol::Command;
use idem_protocol::cmd::Claim;
use idem_server::store::{Store, StoreConfig};

const RECORDS: u64 = 1_000_000;
const BATCH: usize = 2000;

fn filled(lease_ms: u64) -> Store {
    let s = Store::new(StoreConfig {
        shards: 32,
        max_memory_bytes: usize::MAX,
        ..StoreConfig::default()
    });
    for i in 0..RECORDS {
        s.apply(
            &Command::Claim(Claim {
                lease_ms: Some(lease_ms),
                ..Claim::new(Bytes::from(format!("k{i:031}")))
            }),
            0,
        );
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sweep_1m_records");
    g.sample_size(10);
    let live = filled(3_600_000);
    let mut now = 1;
    g.bench_function("one_tick_nothing_due", |b| {
        b.iter(|| {
            now += 1;
            live.sweep(now, BATCH)
        })
    });
    g.bench_function("reclaim_all_expired", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = filled(10);
                let start = Instant::now();
                while !s.is_empty() {
                    s.sweep(1000, BATCH);
                }
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
