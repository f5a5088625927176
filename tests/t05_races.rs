//! Races: concurrent fresh claims, herds of waiters.

use std::time::Duration;

use idem_protocol::{ClaimReply, Outcome};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_fresh_claims_one_owner() {
    let s = Idemd::start().await;
    for round in 0..5 {
        let k = key(&format!("race{round}"));
        let mut conns = Vec::new();
        for _ in 0..64 {
            conns.push(s.conn().await);
        }
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                let k = k.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    claim(c.cmd(&["CLAIM", &k]).await)
                })
            })
            .collect();
        let mut acquired = 0;
        for t in tasks {
            match t.await.expect("task") {
                ClaimReply::Acquired { .. } => acquired += 1,
                ClaimReply::InFlight { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(acquired, 1, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn herd_of_waiters_one_owner_everyone_gets_the_result() {
    let s = Idemd::start().await;
    let k = key("herd");
    const N: usize = 500;
    let mut conns = Vec::new();
    for _ in 0..N {
        conns.push(s.conn().await);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let k = k.clone();
            tokio::spawn(async move {
                // Stagger a little so some claim after others parked.
                if i % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                match claim(
                    c.cmd(&["CLAIM", &k, "WAIT", "20000", "LEASE", "10000"])
                        .await,
                ) {
                    ClaimReply::Acquired { fence } => {
                        // The one owner runs the effect, then completes.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        assert_eq!(
                            c.cmd(&["COMPLETE", &k, &fence.to_string(), "effect-ran"])
                                .await,
                            ok()
                        );
                        true
                    }
                    ClaimReply::Completed {
                        outcome: Outcome::Ok,
                        value,
                    } => {
                        assert_eq!(&value[..], b"effect-ran");
                        false
                    }
                    other => panic!("waiter got {other:?}"),
                }
            })
        })
        .collect();
    let mut owners = 0;
    for t in tasks {
        if t.await.expect("task") {
            owners += 1;
        }
    }
    assert_eq!(owners, 1);
    let mut c = s.conn().await;
    assert!(info_field(&mut c, "hits_after_wait").await > 0);
    assert_eq!(info_field(&mut c, "blocked_clients").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_once_under_contention_runs_each_effect_once() {
    // 200 workers over 10 keys, each doing claim-wait / complete: every key
    // is completed exactly once and every worker sees that one result.
    let s = Idemd::start().await;
    let keys: Vec<String> = (0..10).map(|i| key(&format!("once{i}"))).collect();
    let effects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..200 {
        let k = keys[w % 10].clone();
        let addr = s.addr;
        let effects = effects.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            match claim(c.cmd(&["CLAIM", &k, "WAIT", "20000"]).await) {
                ClaimReply::Acquired { fence } => {
                    effects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let v = format!("done-{k}");
                    assert_eq!(c.cmd(&["COMPLETE", &k, &fence.to_string(), &v]).await, ok());
                    v
                }
                ClaimReply::Completed { value, .. } => {
                    String::from_utf8(value.to_vec()).expect("utf8")
                }
                other => panic!("{other:?}"),
            }
        }));
    }
    for (w, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.expect("task"), format!("done-{}", keys[w % 10]));
    }
    assert_eq!(effects.load(std::sync::atomic::Ordering::SeqCst), 10);
}
