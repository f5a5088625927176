//! One COMPLETE waking 1,000 and 10,000 parked waiters: the time from the
//! COMPLETE until the last waiter has its answer.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_protocol::cmd::{Claim, Complete};
use idem_protocol::{ClaimReply, Command, Reply};
use idem_server::engine::Engine;
use idem_server::store::StoreConfig;
use idem_server::waiters::{Parked, Waiters};

async fn herd(waiters: &Arc<Waiters>, engine: &Engine, n: usize, round: u64) -> Duration {
    let key = Bytes::from(format!("herd-{round}"));
    let Reply::Claim(ClaimReply::Acquired { fence }) =
        engine.apply(&Command::Claim(Claim::new(key.clone()))).reply
    else {
        panic!("fresh key")
    };
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let cmd = Command::Claim(Claim {
            wait_ms: Some(60_000),
            ..Claim::new(key.clone())
        });
        let Parked::Waiting(mut handle) = waiters.apply_or_park(&cmd, 60_000) else {
            panic!("should park")
        };
        tasks.push(tokio::spawn(async move {
            let reply = handle.wait().await;
            assert!(matches!(reply, Reply::Claim(ClaimReply::Completed { .. })));
            Instant::now()
        }));
    }
    assert_eq!(waiters.parked(), n as u64);
    let t0 = Instant::now();
    let value = Bytes::from_static(&[b'v'; 64]);
    let applied = engine.apply(&Command::Complete(Complete {
        key: key.clone(),
        fence,
        value,
        retain_ms: None,
        error: false,
    }));
    assert!(applied.wake);
    waiters.wake(&key);
    let mut last = t0;
    for t in tasks {
        last = last.max(t.await.unwrap());
    }
    last - t0
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let engine = Arc::new(Engine::memory(StoreConfig::default()));
    let waiters = Waiters::new(engine.clone());
    let mut g = c.benchmark_group("herd_complete_wakes_all");
    g.sample_size(20);
    let mut round = 0u64;
    for n in [1_000usize, 10_000] {
        g.bench_function(format!("{n}_waiters"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    round += 1;
                    total += rt.block_on(herd(&waiters, &engine, n, round));
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
