//! Store apply: uncontended, across 1, 2 and 4 threads on distinct keys,
//! and a hot key claimed and settled by many threads at once; and encoding
//! a snapshot of 1M records.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_protocol::cmd::{Claim, Complete};
use idem_protocol::{ClaimReply, Command, Reply};
use idem_server::store::{Applied, Defaults, Op, Read, Store, StoreConfig};

const DEFAULTS: Defaults = Defaults {
    lease_ms: 30_000,
    retain_ms: 86_400_000,
};

/// A CLAIM of `k` with the defaults, as a node submits it.
fn claim(s: &Store, k: Bytes, now: u64) -> Applied {
    let op = Op::from_command(Command::Claim(Claim::new(k)), &DEFAULTS).unwrap();
    s.apply_op(now, &op)
}

fn key(t: usize, i: u64) -> Bytes {
    Bytes::from(format!("k{t:04}{i:027}"))
}

fn store() -> Store {
    Store::new(StoreConfig {
        shards: 64,
        seed: None,
    })
}

/// One claim + complete of a fresh key, then a replay: the common cycle.
fn cycle(s: &Store, k: Bytes, now: u64) {
    let Reply::Claim(ClaimReply::Acquired { fence }) = claim(s, k.clone(), now).reply else {
        panic!("fresh key")
    };
    let value = Bytes::from_static(&[b'v'; 64]);
    s.apply_op(
        now,
        &Op::Complete(Complete {
            key: k.clone(),
            fence,
            value,
            retain_ms: None,
            error: false,
        }),
    );
    claim(s, k, now);
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    g.bench_function("claim_fresh", |b| {
        let s = store();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            claim(&s, key(0, i), 1)
        })
    });
    g.bench_function("claim_replay", |b| {
        let s = store();
        for i in 0..100_000 {
            cycle(&s, key(0, i), 1);
        }
        let mut i = 0u64;
        b.iter(|| {
            i = (i + 7919) % 100_000;
            claim(&s, key(0, i), 2)
        })
    });
    g.bench_function("cycle_claim_complete_replay", |b| {
        let s = store();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            cycle(&s, key(0, i), 1)
        })
    });
    g.finish();

    let mut g = c.benchmark_group("store_threads_distinct_keys");
    for threads in [1usize, 2, 4] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let s = Arc::new(store());
                let start = Instant::now();
                std::thread::scope(|scope| {
                    for t in 0..threads {
                        let s = s.clone();
                        scope.spawn(move || {
                            for i in 0..iters {
                                cycle(&s, key(t, i), 1);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("store_hot_key");
    for threads in [1usize, 2, 4, 8] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(format!("{threads}_threads_claim_settle_one_key"), |b| {
            let s = Arc::new(store());
            let k = Bytes::from_static(b"the-hot-key");
            claim(&s, k.clone(), 1);
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|scope| {
                    for _ in 0..threads {
                        let s = s.clone();
                        let k = k.clone();
                        scope.spawn(move || {
                            for _ in 0..iters {
                                claim(&s, k.clone(), 2);
                                s.read(Read::Settle(&k), 2);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// Encoding a snapshot of 1M in-flight records into a sink (the copy, the
/// sort into key order and the encoding, without the disk), for three
/// shapes of 32-byte keys: random (hex, as a UUID-like idempotency key),
/// a fixed part and a zero-padded counter, and the load generator's (a
/// fixed part, one of 50 connections, a zero-padded counter).
fn snapshot(c: &mut Criterion) {
    /// A shape's name, and its `i`th key.
    type Shape = (&'static str, fn(u64) -> String);
    let shapes: [Shape; 3] = [
        ("random", |i| {
            format!(
                "{:032x}",
                u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            )
        }),
        ("counter", |i| format!("k0007{i:027}")),
        ("per_connection", |i| {
            format!("k00042000001{:04}{:016}", i % 50, i / 50)
        }),
    ];
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1_000_000));
    for (name, key) in shapes {
        let s = store();
        for i in 0..1_000_000u64 {
            claim(&s, Bytes::from(key(i)), 1);
        }
        g.bench_function(format!("encode_1m_{name}"), |b| {
            b.iter(|| s.snapshot_copy().encode_to(&mut std::io::sink()).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = bench, snapshot
}
criterion_main!(benches);
