//! Expiry over a store of 1M records: one bounded search when nothing is
//! due, and reclaiming 1M expired records round by round (search, then an
//! expiry op of the keys found, as the node proposes it).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_server::store::{ClaimOp, Op, Store, StoreConfig};

const RECORDS: u64 = 1_000_000;
const BATCH: usize = 2000;
const EXPIRE_BATCH: usize = 1000;

fn filled(lease_ms: u64) -> Store {
    let s = Store::new(StoreConfig {
        shards: 32,
        seed: None,
    });
    for i in 0..RECORDS {
        s.apply_op(
            0,
            &Op::Claim(ClaimOp {
                key: Bytes::from(format!("k{i:031}")),
                lease_ms,
                retain_ms: 86_400_000,
                fingerprint: None,
                on_expire: Default::default(),
                attempt: None,
            }),
        );
    }
    s
}

/// One expiry round: search, then apply what was found.
fn round(s: &Store, now: u64) -> bool {
    let found = s.expiry_candidates(now, BATCH, EXPIRE_BATCH);
    let more = found.more;
    if !found.keys.is_empty() {
        s.apply_op(now, &Op::Expire { keys: found.keys });
    }
    more
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sweep_1m_records");
    g.sample_size(10);
    let live = filled(3_600_000);
    let mut now = 1;
    g.bench_function("one_tick_nothing_due", |b| {
        b.iter(|| {
            now += 1;
            round(&live, now)
        })
    });
    g.bench_function("reclaim_all_expired", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = filled(10);
                let start = Instant::now();
                while !s.is_empty() {
                    round(&s, 1000);
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
