//! Waiters on the memory engine, with the runtime's clock paused: time
//! moves only when the test advances it (or every task is idle).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_protocol::cmd::{Abandon, Claim, Complete, Release, Renew, Settle};
use idem_protocol::{ClaimReply, Command, OnExpire, Reply, SettleReply};
use tokio::task::JoinHandle;

use super::Waiters;
use crate::clock::Clock;
use crate::engine::Engine;
use crate::store::{Defaults, Op, StoreConfig};

const DEFAULTS: Defaults = Defaults {
    lease_ms: 10_000,
    retain_ms: 60_000,
};

fn setup() -> (Arc<Engine>, Arc<Waiters>) {
    let engine = Arc::new(Engine::memory(
        StoreConfig {
            shards: 4,
            seed: None,
        },
        Clock::starting_at(1_000_000),
    ));
    let waiters = Waiters::new(Arc::clone(&engine), DEFAULTS, super::WaitLimits::default());
    (engine, waiters)
}

fn key() -> Bytes {
    Bytes::from_static(b"k")
}

async fn submit(engine: &Engine, cmd: Command) -> Reply {
    let op = Op::from_command(cmd, &DEFAULTS).expect("a write");
    engine.submit(op).await.expect("applied").reply
}

async fn acquire(engine: &Engine, claim: Claim) -> u64 {
    match submit(engine, Command::Claim(claim)).await {
        Reply::Claim(ClaimReply::Acquired { fence }) => fence,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

fn claim_wait(wait_ms: u64) -> Command {
    Command::Claim(Claim {
        wait_ms: Some(wait_ms),
        ..Claim::new(key())
    })
}

/// Starts a waiting request and returns once it is parked.
async fn park(waiters: &Arc<Waiters>, cmd: Command, wait_ms: u64) -> JoinHandle<Reply> {
    let total = || count(&waiters.stats.parked_total);
    let before = total();
    let h = tokio::spawn(Arc::clone(waiters).wait(cmd, wait_ms));
    while total() == before {
        tokio::task::yield_now().await;
    }
    h
}

/// Lets spawned tasks run without moving the clock.
async fn settle_tasks() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// A waiter counter's value.
fn count(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

fn acquired(r: Reply) -> u64 {
    match r {
        Reply::Claim(ClaimReply::Acquired { fence }) => fence,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn release_hands_the_key_to_the_first_waiter_only() {
    let (engine, waiters) = setup();
    let owner = acquire(&engine, Claim::new(key())).await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    let w2 = park(&waiters, claim_wait(60_000), 60_000).await;
    let r = submit(
        &engine,
        Command::Release(Release {
            key: key(),
            fence: owner,
        }),
    )
    .await;
    assert_eq!(r, Reply::Ok);
    let f1 = acquired(w1.await.unwrap());
    assert!(f1 > owner);
    settle_tasks().await;
    assert_eq!(waiters.parked(), 1, "the second waiter keeps waiting");
    assert!(!w2.is_finished());
    // The handover carried a made-up attempt id, so it is ordered and
    // retry-safe like any claim; releasing passes the key on again.
    submit(
        &engine,
        Command::Release(Release {
            key: key(),
            fence: f1,
        }),
    )
    .await;
    assert!(acquired(w2.await.unwrap()) > f1);
    assert_eq!(waiters.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn abandon_hands_the_key_to_the_first_waiter_to_recover() {
    let (engine, waiters) = setup();
    let owner = acquire(&engine, Claim::new(key())).await;
    submit(
        &engine,
        Command::Journal(idem_protocol::cmd::Journal {
            key: key(),
            fence: owner,
            journal: Bytes::from_static(b"step-2"),
        }),
    )
    .await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    let w2 = park(&waiters, claim_wait(60_000), 60_000).await;
    submit(
        &engine,
        Command::Abandon(Abandon {
            key: key(),
            fence: owner,
        }),
    )
    .await;
    match w1.await.unwrap() {
        Reply::Claim(ClaimReply::Recover { fence, journal }) => {
            assert!(fence > owner);
            assert_eq!(&journal[..], b"step-2");
        }
        other => panic!("expected RECOVER, got {other:?}"),
    }
    settle_tasks().await;
    assert!(!w2.is_finished());
    assert_eq!(waiters.parked(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_hands_the_key_over_through_an_expiry_op() {
    let (engine, waiters) = setup();
    let owner = acquire(
        &engine,
        Claim {
            lease_ms: Some(100),
            ..Claim::new(key())
        },
    )
    .await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    let w2 = park(&waiters, claim_wait(60_000), 60_000).await;
    tokio::time::advance(Duration::from_millis(99)).await;
    settle_tasks().await;
    assert!(!w1.is_finished(), "served before the lease ran out");
    let f1 = acquired(w1.await.unwrap());
    assert!(f1 > owner);
    assert_eq!(
        engine.stats().counters.lapses,
        1,
        "the lapse was applied through the engine"
    );
    settle_tasks().await;
    assert!(!w2.is_finished());
}

#[tokio::test(start_paused = true)]
async fn an_earlier_waiter_goes_before_a_newcomer_after_a_lapse() {
    let (engine, waiters) = setup();
    let owner = acquire(
        &engine,
        Claim {
            lease_ms: Some(50),
            ..Claim::new(key())
        },
    )
    .await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    // As if the queue's timer were late: the lapse is not noticed before
    // the newcomer comes.
    if let Some(t) = waiters
        .shard(&key())
        .lock()
        .queues
        .get_mut(&key())
        .and_then(|q| q.timer.take())
    {
        t.abort();
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(!w1.is_finished());
    // The newcomer finds the key lapsed but queued for: it waits behind.
    let newcomer = park(&waiters, claim_wait(60_000), 60_000).await;
    let f1 = acquired(w1.await.unwrap());
    assert!(f1 > owner);
    settle_tasks().await;
    assert!(!newcomer.is_finished(), "the newcomer jumped the queue");
    assert_eq!(waiters.parked(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_connection_dropped_is_skipped() {
    let (engine, waiters) = setup();
    let owner = acquire(&engine, Claim::new(key())).await;
    let gone = park(&waiters, claim_wait(60_000), 60_000).await;
    let w2 = park(&waiters, claim_wait(60_000), 60_000).await;
    gone.abort();
    let _ = gone.await;
    assert_eq!(waiters.parked(), 1);
    submit(
        &engine,
        Command::Release(Release {
            key: key(),
            fence: owner,
        }),
    )
    .await;
    assert!(acquired(w2.await.unwrap()) > owner);
    assert_eq!(waiters.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_answers_with_the_state_then() {
    let (engine, waiters) = setup();
    acquire(&engine, Claim::new(key())).await;
    let w = park(
        &waiters,
        Command::Settle(Settle {
            key: key(),
            wait_ms: Some(500),
        }),
        500,
    )
    .await;
    match w.await.unwrap() {
        Reply::Settle(SettleReply::InFlight { remaining_ms }) => {
            assert_eq!(remaining_ms, 10_000 - 500);
        }
        other => panic!("expected INFLIGHT, got {other:?}"),
    }
    assert_eq!(count(&waiters.stats.timed_out), 1);
    assert_eq!(waiters.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_waiters_are_answered_by_one_complete() {
    let (engine, waiters) = setup();
    let owner = acquire(
        &engine,
        Claim {
            on_expire: Some(OnExpire::Recover),
            ..Claim::new(key())
        },
    )
    .await;
    const N: usize = 10_000;
    let mut handles = Vec::with_capacity(N);
    for i in 0..N {
        let cmd = if i % 2 == 0 {
            claim_wait(60_000)
        } else {
            Command::Settle(Settle {
                key: key(),
                wait_ms: Some(60_000),
            })
        };
        handles.push(tokio::spawn(Arc::clone(&waiters).wait(cmd, 60_000)));
    }
    while waiters.parked() < N as u64 {
        tokio::task::yield_now().await;
    }
    let value = Bytes::from(vec![b'v'; 4096]);
    submit(
        &engine,
        Command::Complete(Complete {
            key: key(),
            fence: owner,
            value: value.clone(),
            retain_ms: None,
            error: false,
        }),
    )
    .await;
    let mut first: Option<*const u8> = None;
    for h in handles {
        let got = match h.await.unwrap() {
            Reply::Claim(ClaimReply::Completed { value, .. })
            | Reply::Settle(SettleReply::Completed { value, .. }) => value,
            other => panic!("expected COMPLETED, got {other:?}"),
        };
        assert_eq!(got, value);
        // One shared buffer for everyone.
        assert_eq!(*first.get_or_insert(got.as_ptr()), got.as_ptr());
    }
    let hits = count(&waiters.stats.hits_after_wait);
    assert_eq!(hits, N as u64);
    assert_eq!(count(&waiters.stats.timed_out), 0);
    assert_eq!(waiters.parked(), 0);
}

#[tokio::test(start_paused = true)]
async fn behind_waiters_an_owner_retry_and_a_mismatch_are_answered_at_once() {
    let (engine, waiters) = setup();
    let owner = acquire(
        &engine,
        Claim {
            attempt: Some(Bytes::from_static(b"a1")),
            fingerprint: Some(Bytes::from_static(b"fp")),
            ..Claim::new(key())
        },
    )
    .await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    // The owner's reply was lost: its retry, even with WAIT, gets the key
    // back with the same fence instead of queueing behind the waiter.
    let retry = Command::Claim(Claim {
        attempt: Some(Bytes::from_static(b"a1")),
        wait_ms: Some(5_000),
        ..Claim::new(key())
    });
    assert_eq!(
        Arc::clone(&waiters).wait(retry, 5_000).await,
        Reply::Claim(ClaimReply::Acquired { fence: owner })
    );
    // A different payload is refused now, not when the key is released.
    let other = Command::Claim(Claim {
        fingerprint: Some(Bytes::from_static(b"other")),
        wait_ms: Some(5_000),
        ..Claim::new(key())
    });
    assert!(matches!(
        Arc::clone(&waiters).wait(other, 5_000).await,
        Reply::Error(e) if e.code == idem_protocol::ErrorCode::Mismatch
    ));
    assert!(!w1.is_finished());
    assert_eq!(waiters.parked(), 1);
    let stats = &waiters.stats;
    assert_eq!(
        count(&stats.timed_out),
        0,
        "answered only when its wait ran out"
    );
    assert_eq!(
        count(&stats.parked_total),
        1,
        "only the first waiter parked"
    );
}

/// A RENEW to a shorter lease wakes the queue's timer for the new end: the
/// first waiter gets the key when the shorter lease runs out, not at the
/// timer's next recheck of the longer one.
#[tokio::test(start_paused = true)]
async fn renew_to_a_shorter_lease_serves_waiters_when_it_ends() {
    let (engine, waiters) = setup();
    let owner = acquire(&engine, Claim::new(key())).await;
    let w1 = park(&waiters, claim_wait(60_000), 60_000).await;
    tokio::time::advance(Duration::from_millis(10)).await;
    submit(
        &engine,
        Command::Renew(Renew {
            key: key(),
            fence: owner,
            lease_ms: 200,
        }),
    )
    .await;
    tokio::time::advance(Duration::from_millis(150)).await;
    settle_tasks().await;
    assert!(!w1.is_finished(), "served before the shorter lease ran out");
    tokio::time::advance(Duration::from_millis(60)).await;
    settle_tasks().await;
    assert!(
        w1.is_finished(),
        "not served when the shorter lease ran out"
    );
    assert!(acquired(w1.await.unwrap()) > owner);
}

/// A node that stops leading between a waiting CLAIM's ask (the key was in
/// flight) and its parking answers it with the redirect at once, as it
/// answered the requests already parked: it used to park it after they
/// were answered, where it waited for an event or for its time to run out.
#[tokio::test(start_paused = true)]
async fn a_claim_asked_just_before_the_node_stopped_leading_is_redirected() {
    let (engine, waiters) = setup();
    acquire(&engine, Claim::new(key())).await;
    let redirect = || crate::engine::EngineError::Moved {
        slot: 0,
        addr: "127.0.0.1:1".into(),
    };
    let weak = Arc::downgrade(&waiters);
    *waiters.after_ask.lock() = Some(Box::new(move || {
        let w = weak.upgrade().expect("the waiters");
        *w.demoted.lock() = Some(redirect());
        crate::engine::EventSink::on_demoted(w, &|_| redirect());
    }));
    let reply = Arc::clone(&waiters).wait(claim_wait(60_000), 60_000).await;
    assert_eq!(
        reply,
        Reply::Error(redirect().to_server_error()),
        "not redirected"
    );
    assert_eq!(count(&waiters.stats.parked_total), 0, "parked after all");
    assert_eq!(waiters.parked(), 0);
}
