//! One COMPLETE waking 1,000 and 10,000 parked waiters: the time from the
//! COMPLETE until the last waiter has its answer.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_protocol::cmd::{Claim, Complete};
use idem_protocol::{ClaimReply, Command, Reply};
use idem_server::clock::Clock;
use idem_server::engine::Engine;
use idem_server::store::{Defaults, Op, StoreConfig};
use idem_server::waiters::Waiters;

const DEFAULTS: Defaults = Defaults {
    lease_ms: 30_000,
    retain_ms: 86_400_000,
};

async fn herd(waiters: &Arc<Waiters>, engine: &Engine, n: usize, round: u64) -> Duration {
    let key = Bytes::from(format!("herd-{round}"));
    let claim = Op::from_command(Command::Claim(Claim::new(key.clone())), &DEFAULTS).unwrap();
    let Reply::Claim(ClaimReply::Acquired { fence }) = engine.submit(claim).await.unwrap().reply
    else {
        panic!("fresh key")
    };
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let cmd = Command::Claim(Claim {
            wait_ms: Some(60_000),
            ..Claim::new(key.clone())
        });
        tasks.push(tokio::spawn(Arc::clone(waiters).wait(cmd, 60_000)));
    }
    while waiters.parked() < n as u64 {
        tokio::task::yield_now().await;
    }
    let t0 = Instant::now();
    let value = Bytes::from_static(&[b'v'; 64]);
    let applied = engine
        .submit(Op::Complete(Complete {
            key: key.clone(),
            fence,
            value,
            retain_ms: None,
            error: false,
        }))
        .await
        .unwrap();
    assert_eq!(applied.events.len(), 1);
    for t in tasks {
        let reply = t.await.unwrap();
        assert!(matches!(reply, Reply::Claim(ClaimReply::Completed { .. })));
    }
    t0.elapsed()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let engine = Arc::new(Engine::memory(StoreConfig::default(), Clock::new()));
    let waiters = Waiters::new(
        engine.clone(),
        DEFAULTS,
        idem_server::waiters::WaitLimits::default(),
    );
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
