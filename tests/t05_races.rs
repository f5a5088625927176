//! Races: concurrent fresh claims, herds of waiters.

use std::time::{Duration, Instant};

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
    // N connections race for one key with a long WAIT; one acquires, the
    // others park. Once every one of them is parked the owner completes,
    // and every parked waiter must be woken by that COMPLETE with its
    // value: not time out, not be left behind.
    let s = Idemd::start().await;
    let k = key("herd");
    const N: usize = 500;
    const WAIT_MS: u64 = 20_000;
    // The bound on how long after the COMPLETE the last waiter may be
    // answered. Far below WAIT_MS: a waiter answered only when its wait
    // runs out gets the same COMPLETED reply, so only the time tells a
    // wake-up from a time-out.
    const WOKEN_WITHIN: Duration = Duration::from_secs(5);
    let mut stats = s.conn().await;
    let parked_before = info_field(&mut stats, "waits_parked").await;
    let hits_before = info_field(&mut stats, "hits_after_wait").await;
    let timed_out_before = info_field(&mut stats, "waits_timed_out").await;
    let mut conns = Vec::new();
    for _ in 0..N {
        conns.push(s.conn().await);
    }
    // What each task saw: `Err` for the owner, with when it sent the
    // COMPLETE; `Ok` for a waiter, with when it was answered.
    let addr = s.addr;
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
                let wait = WAIT_MS.to_string();
                match claim(c.cmd(&["CLAIM", &k, "WAIT", &wait, "LEASE", "30000"]).await) {
                    ClaimReply::Acquired { fence } => {
                        // The one owner completes once all the others wait.
                        let mut stats = Conn::connect(addr).await;
                        wait_for_info(&mut stats, "blocked_clients", N as u64 - 1).await;
                        let completed_at = Instant::now();
                        assert_eq!(
                            c.cmd(&["COMPLETE", &k, &fence.to_string(), "effect-ran"])
                                .await,
                            ok()
                        );
                        Err(completed_at)
                    }
                    ClaimReply::Completed {
                        outcome: Outcome::Ok,
                        value,
                    } => {
                        assert_eq!(&value[..], b"effect-ran");
                        Ok(Instant::now())
                    }
                    other => panic!("waiter got {other:?}"),
                }
            })
        })
        .collect();
    let mut answered = Vec::new();
    let mut completions = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(at) => answered.push(at),
            Err(at) => completions.push(at),
        }
    }
    let [completed_at] = completions[..] else {
        panic!("{} owners", completions.len())
    };
    assert_eq!(answered.len(), N - 1);
    let slowest = answered
        .iter()
        .map(|at| at.saturating_duration_since(completed_at))
        .max()
        .expect("waiters");
    assert!(
        slowest < WOKEN_WITHIN,
        "the last waiter was answered {slowest:?} after the COMPLETE"
    );
    let waiters = N as u64 - 1;
    assert_eq!(
        info_field(&mut stats, "waits_parked").await - parked_before,
        waiters
    );
    assert_eq!(
        info_field(&mut stats, "hits_after_wait").await - hits_before,
        waiters
    );
    assert_eq!(
        info_field(&mut stats, "waits_timed_out").await - timed_out_before,
        0
    );
    assert_eq!(info_field(&mut stats, "blocked_clients").await, 0);
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
