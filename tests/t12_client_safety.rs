//! The client under cancellation, crashes and lost outcomes: every case
//! reproduces a way a caller could leave a key owned by nobody, or lose an
//! effect's result, and checks the key's state on the server right after.

use std::time::Duration;

use bytes::Bytes;
use idem_client::{ClaimOutcome, Client, RecordState, RunError, RunOptions};

use crate::support::*;

async fn client(s: &Idemd) -> Client {
    Client::connect(s.addr.to_string()).await.expect("connects")
}

/// This test binary run again as a child process, running only the
/// ignored test `name` of this module, with `var` set to `value`.
fn child_test(name: &str, var: &str, value: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        &format!("t12_client_safety::{name}"),
        "--nocapture",
    ])
    .env(var, value);
    cmd
}

/// The value and error of a `run_once` whose outcome could not be
/// recorded (anything else fails the test).
fn unrecorded(result: Result<idem_client::Completed, RunError<()>>) -> (Bytes, idem_client::Error) {
    match result {
        Err(RunError::Unrecorded { value, error, .. }) => (value, error),
        other => panic!("expected Unrecorded, got {other:?}"),
    }
}

/// Polls `fut` once (a claim goes out on its first poll), then drops it,
/// as a caller that gives up does.
fn sent_then_dropped<F: std::future::Future>(fut: F) {
    let mut fut = Box::pin(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    drop(fut);
}

/// A claim whose caller went away right after sending it left the key in
/// flight for the whole lease (the ACQUIRED was read and dropped). Now the
/// grant is released at once.
#[tokio::test]
async fn a_claim_dropped_after_it_was_sent_releases_the_key() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("dropped-claim");
    let builder = c.claim(k.as_str());
    assert!(!builder.attempt_id().is_empty());
    sent_then_dropped(builder.into_future());
    let mut raw = s.conn().await;
    wait_for_info(&mut raw, "claims_acquired", 1).await;
    eventually("the orphaned grant to be released", async || {
        c.inspect(k.as_str()).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// A duplicate waiting for the owner, dropped after 200 ms (an HTTP client
/// timeout), later inherited the key when the owner released it, and the
/// key stayed stuck for a lease. Now the wait is withdrawn when the caller
/// leaves.
#[tokio::test]
async fn a_waiting_claim_dropped_is_withdrawn_and_never_handed_the_key() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("dropped-waiter");
    let ClaimOutcome::Acquired(owner) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is fresh")
    };
    let waiter = tokio::spawn(
        c.claim(k.as_str())
            .wait(Duration::from_secs(10))
            .into_future(),
    );
    let mut raw = s.conn().await;
    wait_for_info(&mut raw, "blocked_clients", 1).await;
    // The caller gives up (an HTTP client timeout drops the future).
    waiter.abort();
    wait_for_info(&mut raw, "blocked_clients", 0).await;
    owner.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        c.inspect(k.as_str()).await.unwrap(),
        None,
        "the released key went to a caller that had left"
    );

    // A waiting SETTLE whose caller leaves is withdrawn too.
    let ClaimOutcome::Acquired(owner) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is free again")
    };
    let c2 = c.clone();
    let k2 = k.clone();
    let settler =
        tokio::spawn(async move { c2.settle(k2.as_str(), Some(Duration::from_secs(10))).await });
    wait_for_info(&mut raw, "blocked_clients", 1).await;
    settler.abort();
    wait_for_info(&mut raw, "blocked_clients", 0).await;
    owner.release().await.unwrap();

    // The owner releases right as the waiter leaves: whichever the server
    // sees first, the key ends up free, not held by the departed waiter.
    for round in 0..5 {
        let k = key(&format!("dropped-waiter-race-{round}"));
        let ClaimOutcome::Acquired(owner) = c.claim(k.as_str()).await.unwrap() else {
            panic!("the key is fresh")
        };
        let waiter = tokio::spawn(
            c.claim(k.as_str())
                .wait(Duration::from_secs(10))
                .into_future(),
        );
        wait_for_info(&mut raw, "blocked_clients", 1).await;
        waiter.abort();
        owner.release().await.unwrap();
        eventually("the key free again", async || {
            c.inspect(k.as_str()).await.unwrap().is_none().then_some(())
        })
        .await;
        wait_for_info(&mut raw, "blocked_clients", 0).await;
    }
}

/// A RECOVER handed to a caller that went away must not be left to the
/// lease, and must not be released either (the earlier owner's effect may
/// have happened): it is abandoned again, with its journal.
#[tokio::test]
async fn a_recover_for_a_dropped_caller_is_abandoned_again_keeping_the_journal() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("dropped-recover");
    let ClaimOutcome::Acquired(first) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is fresh")
    };
    let first_fence = first.fence();
    first.journal("charged ch_1?").await.unwrap();
    first.abandon().await.unwrap();
    sent_then_dropped(c.claim(k.as_str()).into_future());
    let info = eventually("the recovery abandoned again", async || {
        let info = c.inspect(k.as_str()).await.unwrap()?;
        (info.state == RecordState::Abandoned && info.fence > first_fence).then_some(info)
    })
    .await;
    assert_eq!(info.fence, first_fence + 1, "{info:?}");
    assert_eq!(info.journal, Some(Bytes::from("charged ch_1?")), "{info:?}");
}

/// Environment variable that turns [`crashing_service`] on, naming the
/// server.
const CRASH_CHILD: &str = "X_CRASH_CHILD_ADDR";

/// Not a test of its own: the "service" that
/// `a_crash_mid_effect_is_recovered_not_run_again` runs as a child process
/// and kills. With `X_CRASH_CHILD_ADDR` set it runs `run_once` with the
/// default options, journals, says so on stdout, and hangs in the effect.
#[tokio::test]
#[ignore = "run as a child process by a_crash_mid_effect_is_recovered_not_run_again"]
async fn crashing_service() {
    let addr = std::env::var(CRASH_CHILD).expect("run by the crash test");
    let c = Client::connect(addr).await.unwrap();
    let _ = c
        .run_once(
            "crash-order-1",
            RunOptions::<()>::new().lease(Duration::from_millis(600)),
            |ctx| async move {
                ctx.journal("calling the gateway").await.unwrap();
                println!("EFFECT STARTED");
                std::future::pending::<()>().await;
                Ok(Bytes::new())
            },
        )
        .await;
}

/// A service killed with SIGKILL mid-charge, restarted, retried: with the
/// old default (ONEXPIRE FREE) the lease lapsed to nothing and the charge
/// ran a second time. Now `run_once` claims with ONEXPIRE RECOVER: the
/// retry is told to recover from the journal, and the effect does not run.
#[tokio::test]
async fn a_crash_mid_effect_is_recovered_not_run_again() {
    use tokio::io::AsyncBufReadExt;
    let s = Idemd::start().await;
    let mut child = child_test("crashing_service", CRASH_CHILD, &s.addr.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("EFFECT STARTED") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        started,
        Ok(true),
        "the child service never started its effect"
    );
    child.kill().await.unwrap();
    // The lease (600 ms) lapses with nobody renewing it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let c = client(&s).await;
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran2 = ran.clone();
    let result = c
        .run_once(
            "crash-order-1",
            RunOptions::<()>::new(),
            |_ctx| async move {
                ran2.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(Bytes::from("charged again"))
            },
        )
        .await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the effect ran a second time after the crash"
    );
    match result {
        Err(RunError::NeedsRecovery { journal }) => {
            assert_eq!(journal, Bytes::from("calling the gateway"));
        }
        other => panic!("expected NeedsRecovery, got {other:?}"),
    }
}

/// When the outcome could not be recorded (ownership lost while the effect
/// ran), `run_once` returned only the error: the caller could not answer,
/// and its retry ran the effect again. Now the error carries the value.
#[tokio::test]
async fn an_effect_whose_outcome_cannot_be_recorded_still_returns_its_value() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("unrecorded");
    let admin = client(&s).await;
    let k2 = k.clone();
    let result = c
        .run_once(k.as_str(), RunOptions::<()>::new(), |_ctx| async move {
            // Meanwhile an operator forgets the key and someone else takes
            // it: this owner's COMPLETE will be FENCED.
            assert!(admin.forget(k2.as_str()).await.unwrap());
            let ClaimOutcome::Acquired(other) = admin.claim(k2.as_str()).await.unwrap() else {
                panic!("the key was forgotten")
            };
            std::mem::forget(other);
            Ok(Bytes::from("ch_42"))
        })
        .await;
    let (value, error) = unrecorded(result);
    assert_eq!(value, Bytes::from("ch_42"));
    assert!(error.is_fenced(), "{error}");
}

/// A payload with a map field, parsed twenty times from one body, gave 18
/// different fingerprints (HashMap order is random per map), so legitimate
/// retries got `-MISMATCH`. Now maps are fingerprinted with sorted keys.
#[tokio::test]
async fn fingerprints_of_map_payloads_are_deterministic() {
    use std::collections::HashMap;
    let body = [("amount", 4200u64), ("currency", 978), ("merchant", 7)];
    let build = || {
        let fields: HashMap<String, u64> =
            body.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let mut outer: HashMap<String, HashMap<String, u64>> = HashMap::new();
        outer.insert("charge".into(), fields.clone());
        outer.insert("metadata".into(), fields);
        outer
    };
    let first = idem_client::fingerprint(&build()).unwrap();
    for _ in 0..20 {
        assert_eq!(idem_client::fingerprint(&build()).unwrap(), first);
    }
    let mut other = build();
    other
        .get_mut("charge")
        .unwrap()
        .insert("amount".into(), 4201);
    assert_ne!(idem_client::fingerprint(&other).unwrap(), first);
    // And the server accepts a retry carrying it.
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("fp-map");
    let ClaimOutcome::Acquired(g) = c
        .claim(k.as_str())
        .fingerprint(idem_client::fingerprint(&build()).unwrap())
        .await
        .unwrap()
    else {
        panic!("the key is fresh")
    };
    g.complete("done").await.unwrap();
    let again = c
        .claim(k.as_str())
        .fingerprint(idem_client::fingerprint(&build()).unwrap())
        .await
        .unwrap();
    assert!(matches!(again, ClaimOutcome::Completed(_)), "{again:?}");
}

/// A server that answers the client's HELLO as Idem, then never answers
/// anything else (a hung node).
async fn silent_node() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    if buf[..n]
                        .windows(5)
                        .any(|w| w.eq_ignore_ascii_case(b"HELLO"))
                    {
                        let hello = b"*2\r\n$6\r\nserver\r\n$4\r\nidem\r\n";
                        if sock.write_all(hello).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Against a hung server a claim failed after 30.6 s and `run_once` after
/// 90.6 s, saying only "no reply within 15s". Now one deadline covers the
/// whole call, and the error names the command, key, address, attempts
/// and time taken.
#[tokio::test]
async fn a_call_keeps_one_deadline_and_its_error_says_what_failed() {
    let addr = silent_node().await;
    let c = Client::connect_with_config(
        addr.clone(),
        idem_client::ClientConfig::default()
            .request_timeout(Duration::from_millis(300))
            .deadline(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let e = c.claim("order-9").await.unwrap_err();
    let took = started.elapsed();
    assert!(e.is_timeout(), "{e}");
    assert!(took < Duration::from_millis(1800), "took {took:?}");
    let text = e.to_string();
    for part in ["CLAIM", "order-9", addr.as_str(), "attempts"] {
        assert!(text.contains(part), "'{part}' missing from: {text}");
    }
    // Per call, shorter.
    let started = std::time::Instant::now();
    let e = c
        .claim("order-10")
        .deadline(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(started.elapsed() < Duration::from_millis(1000));
    let started = std::time::Instant::now();
    let r = c
        .run_once(
            "order-11",
            RunOptions::<()>::new()
                .wait(Duration::ZERO)
                .deadline(Duration::from_millis(400)),
            |_| async { Ok(Bytes::new()) },
        )
        .await;
    assert!(
        matches!(r, Err(RunError::Client(ref e)) if e.is_timeout()),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1000));
}

/// A client hang-up mid-effect abandoned the key, and every retry got
/// `NeedsRecovery` until retention ended. An effect that journals before
/// any downstream call can opt in to release on cancel; and to run again
/// on RECOVER when the journal is empty.
#[tokio::test]
async fn opt_ins_for_effects_that_journal_first() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    // Release on cancel.
    let k = key("release-on-cancel");
    let call = c.run_once(
        k.as_str(),
        RunOptions::<()>::new().release_on_cancel(true),
        |_ctx| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Bytes::new())
        },
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), call)
            .await
            .is_err()
    );
    eventually("the cancelled call's claim released", async || {
        c.inspect(k.as_str()).await.unwrap().is_none().then_some(())
    })
    .await;
    // Once the effect journaled, downstream may have been reached: a
    // cancellation abandons, keeping the journal.
    let k = key("release-on-cancel-journaled");
    let call = c.run_once(
        k.as_str(),
        RunOptions::<()>::new().release_on_cancel(true),
        |ctx| async move {
            ctx.journal("calling the gateway").await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Bytes::new())
        },
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    let info = eventually("the journaled call's claim abandoned", async || {
        let info = c.inspect(k.as_str()).await.unwrap()?;
        (info.state == RecordState::Abandoned).then_some(info)
    })
    .await;
    assert_eq!(info.journal, Some(Bytes::from("calling the gateway")));

    // Run again if the journal is empty; the default refuses.
    let k = key("no-journal");
    let ClaimOutcome::Acquired(first) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is fresh")
    };
    first.abandon().await.unwrap();
    let refused = c
        .run_once(k.as_str(), RunOptions::<()>::new(), |_| async {
            Ok(Bytes::from("must not run"))
        })
        .await;
    assert!(
        matches!(refused, Err(RunError::NeedsRecovery { ref journal }) if journal.is_empty()),
        "{refused:?}"
    );
    let opts = RunOptions::<()>::new().run_again_if_no_journal(true);
    let done = c
        .run_once(k.as_str(), opts.clone(), |_| async {
            Ok(Bytes::from("ran again"))
        })
        .await
        .unwrap();
    assert_eq!(
        (done.value, done.replayed),
        (Bytes::from("ran again"), false)
    );
    // With a journal, it is never re-run silently.
    let k = key("with-journal");
    let ClaimOutcome::Acquired(first) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is fresh")
    };
    first.journal("called the gateway").await.unwrap();
    first.abandon().await.unwrap();
    let refused = c
        .run_once(k.as_str(), opts, |_| async {
            Ok(Bytes::from("must not run"))
        })
        .await;
    assert!(
        matches!(refused, Err(RunError::NeedsRecovery { .. })),
        "{refused:?}"
    );
}

/// Every waiting request opened a connection of its own, without a cap.
/// Now at most `max_waiting_connections` wait at once; the rest queue.
#[tokio::test]
async fn waiting_requests_are_capped() {
    let s = Idemd::start().await;
    let c = Client::connect_with_config(
        s.addr.to_string(),
        idem_client::ClientConfig::default().max_waiting_connections(1),
    )
    .await
    .unwrap();
    let (k1, k2) = (key("cap-1"), key("cap-2"));
    let ClaimOutcome::Acquired(o1) = c.claim(k1.as_str()).await.unwrap() else {
        panic!("fresh")
    };
    let ClaimOutcome::Acquired(o2) = c.claim(k2.as_str()).await.unwrap() else {
        panic!("fresh")
    };
    let w1 = tokio::spawn(
        c.claim(k1.as_str())
            .wait(Duration::from_secs(5))
            .into_future(),
    );
    let w2 = tokio::spawn(
        c.claim(k2.as_str())
            .wait(Duration::from_secs(5))
            .into_future(),
    );
    let mut raw = s.conn().await;
    wait_for_info(&mut raw, "blocked_clients", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        info_field(&mut raw, "blocked_clients").await,
        1,
        "the cap was passed"
    );
    o1.release().await.unwrap();
    o2.release().await.unwrap();
    for w in [w1, w2] {
        let got = w.await.unwrap().unwrap();
        let ClaimOutcome::Acquired(g) = got else {
            panic!("{got:?}")
        };
        g.release().await.unwrap();
    }
}

/// The counters a service exports: calls, effects run, replays, and the
/// grants settled for callers that left.
#[tokio::test]
async fn client_stats_count_what_happened() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("stats");
    for _ in 0..3 {
        c.run_once(k.as_str(), RunOptions::<()>::new(), |_| async {
            Ok(Bytes::from("v"))
        })
        .await
        .unwrap();
    }
    sent_then_dropped(c.claim(key("stats-orphan").as_str()).into_future());
    let stats = eventually("the orphan settled", async || {
        let st = c.stats();
        (st.orphans_settled == 1).then_some(st)
    })
    .await;
    assert_eq!(
        (stats.run_once_calls, stats.effects_run, stats.replays),
        (3, 1, 2),
        "{stats:?}"
    );
    assert!(stats.requests >= 5, "{stats:?}");
    assert_eq!(stats.failures, 0, "{stats:?}");
}

/// Values were raw `Bytes`: each service encoded and decoded its own, and
/// the first run and replays could disagree. `run_once_json` stores the
/// effect's value as JSON and gives the same `T` on every replay.
#[tokio::test]
async fn run_once_json_gives_the_same_typed_value_on_replay() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("typed");
    let first = c
        .run_once_json(k.as_str(), RunOptions::<()>::new(), |ctx| async move {
            Ok((format!("ch_{}", ctx.fence()), 4200u64))
        })
        .await
        .unwrap();
    assert!(!first.replayed);
    let again = c
        .run_once_json::<(String, u64), _, _, ()>(k.as_str(), RunOptions::new(), |_| async {
            panic!("a replay does not run the effect")
        })
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);
    assert_eq!(first.value.unwrap().1, 4200);
}

/// A cancelled recovery (the call dropped while `on_recover` looks
/// downstream) is abandoned again with the journal, never released.
#[tokio::test]
async fn a_cancelled_recovery_is_abandoned_again() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("cancelled-recovery");
    let ClaimOutcome::Acquired(first) = c.claim(k.as_str()).await.unwrap() else {
        panic!("the key is fresh")
    };
    let first_fence = first.fence();
    first.journal("charge ch_7 sent").await.unwrap();
    first.abandon().await.unwrap();
    let call = c.run_once(
        k.as_str(),
        RunOptions::<()>::new().on_recover(|_ctx, _journal| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            idem_client::Recovery::RunEffect
        }),
        |_| async { Ok(Bytes::from("must not run")) },
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err()
    );
    let info = eventually("the recovery abandoned again", async || {
        let info = c.inspect(k.as_str()).await.unwrap()?;
        (info.state == RecordState::Abandoned && info.fence > first_fence).then_some(info)
    })
    .await;
    assert_eq!(info.journal, Some(Bytes::from("charge ch_7 sent")));
}

/// A proxy to `upstream` that delays every byte the server sends by
/// `delay` (a slow network on the way back).
async fn slow_replies(upstream: std::net::SocketAddr, delay: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let chunk = buf[..n].to_vec();
                    tokio::time::sleep(delay).await;
                    if cw.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A client of `s` whose replies come 0.7 s late, and the error of a
/// claim of `k` that gave up after 300 ms (the server grants it): a
/// timeout naming the claim's attempt id.
async fn timed_out_claim(s: &Idemd, k: &str) -> (Client, idem_client::Error) {
    let slow = slow_replies(s.addr, Duration::from_millis(700)).await;
    let c = Client::connect_with_config(
        slow,
        idem_client::ClientConfig::default()
            .retries(0)
            .request_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let e = c
        .claim(k)
        .deadline(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(e.attempt().is_some(), "the claim's attempt id: {e}");
    (c, e)
}

/// A claim that gave up (its deadline passed before the reply) left the
/// key owned by nobody for a lease, then (with ONEXPIRE RECOVER) abandoned.
/// Now a grant that arrives after the caller gave up is found by its
/// attempt id and released.
#[tokio::test]
async fn a_claim_that_times_out_does_not_leave_its_grant_behind() {
    let s = Idemd::start().await;
    let k = key("timed-out-claim");
    let (_c, e) = timed_out_claim(&s, &k).await;
    let attempt = e.attempt().expect("the claim's attempt id").clone();
    assert!(
        e.to_string().contains(&*String::from_utf8_lossy(&attempt)),
        "the attempt id is named: {e}"
    );
    let direct = client(&s).await;
    // The server did grant it ...
    let mut raw = s.conn().await;
    wait_for_info(&mut raw, "claims_acquired", 1).await;
    // ... and the grant is released, not left to the lease.
    eventually("the late grant released", async || {
        direct
            .inspect(k.as_str())
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// A claim that timed out is cleaned up in the background (its grant
/// looked for by attempt id and released), while its error tells the
/// caller to retry with that attempt id. A caller that did got its grant
/// back, and then the clean-up released it under the caller: the key was
/// free while the caller's effect ran. Now a retry with the attempt id
/// stops the clean-up first.
#[tokio::test]
async fn a_retry_with_the_attempt_id_keeps_its_grant_from_the_clean_up() {
    let s = Idemd::start().await;
    let k = key("retried-claim");
    let (c, e) = timed_out_claim(&s, &k).await;
    let attempt = e.attempt().expect("the claim's attempt id").clone();
    // Retried at once, as the error says: the same grant comes back.
    let ClaimOutcome::Acquired(claim) = c
        .claim(k.as_str())
        .attempt(attempt.clone())
        .deadline(Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("the retry got its grant back")
    };
    // The clean-up would have released it within a few round trips of
    // 0.7 s; the key stays in flight under the retry's fence meanwhile.
    let direct = client(&s).await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = direct.inspect(k.as_str()).await.unwrap();
        let info = info.expect("the key was freed under its owner");
        assert_eq!(info.state, idem_client::RecordState::InFlight);
        assert_eq!(info.fence, claim.fence());
        assert_eq!(info.attempt.as_ref(), Some(&attempt));
    }
    claim.complete("charged once").await.unwrap();
}

/// A proxy to `upstream` that passes the first CLAIM on and then closes
/// the client's connection (the reply is lost), answers the second CLAIM
/// itself with `reply` (without passing it on), and passes everything
/// else through.
async fn first_claim_cut_second_refused(
    upstream: std::net::SocketAddr,
    reply: &'static str,
) -> String {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let claims = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let (mut cr, cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let cw = Arc::new(tokio::sync::Mutex::new(cw));
            let (claims, to_client) = (Arc::clone(&claims), Arc::clone(&cw));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    // Each request of the client comes in a read of its own
                    // (it waits for the reply before the next).
                    let claim = buf[..n].windows(9).any(|w| w == b"\r\nCLAIM\r\n");
                    let nth = if claim {
                        claims.fetch_add(1, Ordering::SeqCst)
                    } else {
                        u32::MAX
                    };
                    if nth == 1 {
                        if to_client
                            .lock()
                            .await
                            .write_all(reply.as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if nth == 0 {
                        // Sent on: the server takes it, its reply is lost.
                        let _ = to_client.lock().await.shutdown().await;
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if cw.lock().await.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A claim whose first try lost its connection after it was sent (the
/// server granted it; the reply was lost) and whose retry was refused
/// (`-OOM`: memory ran out meanwhile, or the first try was not yet
/// applied) ended with the refusal as if nothing had run: the first try's
/// grant held the key for its whole lease, and the error did not say the
/// claim may have run. Now the error says so, names the attempt id, and
/// the grant is found and released.
#[tokio::test]
async fn a_claim_refused_after_an_earlier_try_was_lost_does_not_leave_its_grant_behind() {
    let s = Idemd::start().await;
    let k = key("refused-after-lost-try");
    let proxy = first_claim_cut_second_refused(
        s.addr,
        "-OOM command not allowed when used memory > 'max_memory_bytes'\r\n",
    )
    .await;
    let c = Client::connect_with_config(
        proxy,
        idem_client::ClientConfig::default()
            .retries(1)
            .deadline(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let e = c
        .claim(k.as_str())
        .lease(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), idem_client::ErrorKind::Oom, "{e}");
    assert!(e.may_have_run(), "the first try may have run: {e}");
    let attempt = e.attempt().expect("the claim's attempt id").clone();
    let direct = client(&s).await;
    // The first try did take the key ...
    let mut raw = s.conn().await;
    wait_for_info(&mut raw, "claims_acquired", 1).await;
    // ... and its grant is released, not left for the 60 s lease.
    eventually("the first try's grant released", async || {
        match direct.inspect(k.as_str()).await.unwrap() {
            None => Some(()),
            Some(info) => {
                assert_eq!(info.attempt.as_ref(), Some(&attempt), "{info:?}");
                None
            }
        }
    })
    .await;
}

/// Errors printed their kind twice (`Protocol: Protocol: ...`); a server
/// error printed `Fenced: FENCED ...`.
#[tokio::test]
async fn error_messages_do_not_repeat_their_kind() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let e = c
        .complete(key("no-owner").as_str(), 99, "x", None)
        .await
        .unwrap_err();
    assert!(e.is_fenced());
    let text = e.to_string();
    assert!(text.starts_with("FENCED"), "{text}");
    assert_eq!(
        text.matches("FENCED").count() + text.matches("Fenced").count(),
        1,
        "{text}"
    );
}

/// The request channel was unbounded: against a server that stops reading,
/// every request was buffered in the client. Now requests in flight and
/// queued are bounded, and callers past the bound wait and time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_a_stuck_server_are_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Answers the handshake, then never reads again.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut sock, _)) = l.accept().await {
            let mut buf = [0u8; 64];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"*2\r\n$6\r\nserver\r\n$4\r\nidem\r\n")
                .await;
            held.push(sock);
        }
    });
    let c = Client::connect_with_config(
        addr,
        idem_client::ClientConfig::default()
            .retries(0)
            .request_timeout(Duration::from_millis(800))
            .deadline(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let calls: Vec<_> = (0..10_000)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.ping().await })
        })
        .collect();
    let mut queue_full = 0;
    for call in calls {
        let e = call.await.unwrap().unwrap_err();
        assert!(e.is_timeout(), "{e}");
        if e.to_string().contains("queue stayed full") {
            queue_full += 1;
        }
    }
    // 4,096 in flight and 4,096 queued at most: the rest waited for room.
    assert!(
        queue_full >= 10_000 - 2 * 4096,
        "{queue_full} waited for room"
    );
}

/// The COMPLETE could not reach the server (it died while the effect ran):
/// the value still comes back, in `Unrecorded`.
#[tokio::test]
async fn an_effect_whose_server_went_away_still_returns_its_value() {
    let mut s = Idemd::start().await;
    let c = Client::connect_with_config(
        s.addr.to_string(),
        idem_client::ClientConfig::default()
            .retries(1)
            .deadline(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let k = key("server-gone");
    let result = c
        .run_once(k.as_str(), RunOptions::<()>::new(), |_ctx| async {
            // The server dies while the effect runs.
            s.kill().await;
            Ok(Bytes::from("ch_99"))
        })
        .await;
    let (value, error) = unrecorded(result);
    assert_eq!(value, Bytes::from("ch_99"));
    assert!(error.is_retryable(), "{error}");
}

/// Not a test of its own: run by `calls_run_in_tracing_spans_with_their_fields`
/// in a process of its own, where its subscriber is the global one (a
/// scoped subscriber misses spans whose callsites other test threads
/// registered first). Prints every span and recorded field.
#[tokio::test]
#[ignore = "run as a child process by calls_run_in_tracing_spans_with_their_fields"]
async fn spans_child() {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::{Context, SubscriberExt};

    #[derive(Default, Clone)]
    struct Seen(Arc<Mutex<Vec<String>>>);
    struct Fields<'a>(&'a mut String);
    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: Context<'_, S>,
        ) {
            let mut line = attrs.metadata().name().to_owned();
            attrs.record(&mut Fields(&mut line));
            self.0.lock().unwrap().push(line);
        }
        fn on_record(
            &self,
            _id: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _ctx: Context<'_, S>,
        ) {
            let mut line = "record".to_owned();
            values.record(&mut Fields(&mut line));
            self.0.lock().unwrap().push(line);
        }
    }

    if std::env::var_os(SPANS_CHILD).is_none() {
        return;
    }
    let seen = Seen::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(seen.clone()))
        .unwrap();
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("spans");
    for _ in 0..2 {
        c.run_once(k.as_str(), RunOptions::<()>::new(), |_| async {
            Ok(Bytes::from("v"))
        })
        .await
        .unwrap();
    }
    for line in seen.0.lock().unwrap().iter() {
        println!("SPAN {line}");
    }
}

/// Environment variable that turns [`spans_child`] on.
const SPANS_CHILD: &str = "X_SPANS_CHILD";

/// Spans a service can see: `idem.run_once` with the key, fence, outcome
/// and whether it was replayed; `idem.request` with the command and the
/// attempts it took.
#[tokio::test]
async fn calls_run_in_tracing_spans_with_their_fields() {
    let out = child_test("spans_child", SPANS_CHILD, "1")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout);
    for want in [
        "SPAN idem.run_once key=",
        "SPAN record fence=",
        "SPAN record outcome=\"OK\"",
        "SPAN record replayed=false",
        "SPAN record replayed=true",
        "SPAN idem.request cmd=\"claim\"",
        "SPAN record attempts=1",
    ] {
        assert!(lines.contains(want), "'{want}' not in:\n{lines}");
    }
}

/// A caller that lost track of its claim (a restart between the claim and
/// the effect) retries with the same attempt id and gets its own grant
/// back, where a fresh attempt would wait on itself.
#[tokio::test]
async fn run_once_can_resume_its_own_attempt() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("resume");
    let ClaimOutcome::Acquired(lost) = c.claim(k.as_str()).attempt("attempt-7").await.unwrap()
    else {
        panic!("the key is fresh")
    };
    // The process that held it is gone (no abandon, no renewals).
    std::mem::forget(lost);
    let other = c
        .run_once(
            k.as_str(),
            RunOptions::<()>::new().wait(Duration::ZERO),
            |_| async { Ok(Bytes::from("must not run")) },
        )
        .await;
    assert!(matches!(other, Err(RunError::InFlight { .. })), "{other:?}");
    let done = c
        .run_once(
            k.as_str(),
            RunOptions::<()>::new().attempt("attempt-7"),
            |_| async { Ok(Bytes::from("resumed")) },
        )
        .await
        .unwrap();
    assert_eq!((done.value, done.replayed), (Bytes::from("resumed"), false));
}

/// `complete_patiently` outlasts the call's deadline: the server down and
/// back (same address and data) gets the outcome recorded; down for good,
/// it gives up once the claim is presumed lost (a lease without a renewal
/// landing), not before, and not never.
#[tokio::test]
async fn a_patient_complete_outlasts_an_outage_and_gives_up_once_the_claim_is_lost() {
    let dir = DataDir::new("patient-complete");
    let port = crate::support::cluster::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut s = Idemd::start_raft_at(&dir, &listen).await;
    let config = idem_client::ClientConfig::default().deadline(Duration::from_millis(500));
    let c = Client::connect_with_config(listen.clone(), config)
        .await
        .unwrap();
    let ClaimOutcome::Acquired(owned) = c
        .claim("patient")
        .lease(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    s.kill().await;
    let done =
        tokio::spawn(owned.complete_patiently(idem_client::Outcome::Ok, "recorded late", None));
    // Past the deadline it is still trying; the server comes back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!done.is_finished());
    let s = Idemd::start_raft_at(&dir, &listen).await;
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("recorded once the server was back")
        .unwrap()
        .unwrap();
    let mut conn = s.conn().await;
    assert_eq!(
        claim(conn.cmd(&["CLAIM", "patient"]).await),
        idem_protocol::ClaimReply::Completed {
            outcome: idem_protocol::Outcome::Ok,
            value: Bytes::from_static(b"recorded late")
        }
    );

    // Down for good: it stops once the lease passed without a renewal.
    let ClaimOutcome::Acquired(owned) = c
        .claim("patient-2")
        .lease(Duration::from_secs(2))
        .send()
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    drop(conn);
    drop(s);
    let started = tokio::time::Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        owned.complete_patiently(idem_client::Outcome::Ok, "never", None),
    )
    .await
    .expect("gave up")
    .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "gave up after {took:?}"
    );
}
