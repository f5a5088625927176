//! The client crate against a real idemd (and small fake servers).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_client::{
    ClaimOutcome, Client, ClientConfig, ErrorKind, Failure, Key, Outcome, RecordState, Recovery,
    RunError, RunOptions, Settled,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::*;

async fn client(s: &Idemd) -> Client {
    Client::connect(s.addr.to_string()).await.expect("connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_and_can_run_again() {
    let s = Idemd::start().await;
    for _ in 0..2 {
        let report = idem_client::conformance::run(&s.addr.to_string())
            .await
            .expect("reachable");
        assert!(report.passed(), "{report}");
        assert_eq!(report.checks.len(), idem_client::conformance::CHECKS.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_concurrent_run_once_over_ten_keys_run_each_effect_once() {
    let s = Idemd::start().await;
    // Each waiting call holds a connection on both sides.
    assert!(
        open_files_limit() > 2300,
        "open file limit too low: {}",
        open_files_limit()
    );
    let c = client(&s).await;
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..10).map(|_| AtomicUsize::new(0)).collect());
    let prefix = key("thousand");
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let c = c.clone();
        let runs = runs.clone();
        let k = Key::new(format!("{prefix}-{}", i % 10)).namespace("tests");
        tasks.push(tokio::spawn(async move {
            let opts = RunOptions::<std::io::Error>::new().wait(Duration::from_secs(30));
            c.run_once(k, opts, |_ctx| async move {
                runs[i % 10].fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(Bytes::from(format!("result-{}", i % 10)))
            })
            .await
            .map(|done| (i, done))
        }));
    }
    let mut replays = 0;
    for t in tasks {
        let (i, done) = t.await.expect("task").expect("run_once");
        assert_eq!(done.value, Bytes::from(format!("result-{}", i % 10)));
        replays += done.replayed as usize;
    }
    for r in runs.iter() {
        assert_eq!(r.load(Ordering::SeqCst), 1);
    }
    assert_eq!(replays, 990);
}

#[tokio::test]
async fn slow_effect_keeps_ownership_thanks_to_renewal() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("slow");
    let ClaimOutcome::Acquired(claim) = c
        .claim(k.as_str())
        .lease(Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(matches!(
            c.claim(k.as_str()).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ));
    }
    assert!(!claim.is_lost());
    claim
        .complete("slow-done")
        .await
        .expect("still the owner after 1 s on a 300 ms lease");
}

#[tokio::test]
async fn lost_ownership_is_reported_to_the_owner() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("lost");
    let ClaimOutcome::Acquired(claim) = c
        .claim(k.as_str())
        .lease(Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    // An operator forgets the record: the next renewal is FENCED.
    assert!(c.forget(k.as_str()).await.unwrap());
    let err = tokio::time::timeout(Duration::from_secs(2), claim.lost())
        .await
        .expect("loss reported");
    assert!(err.is_fenced());
    assert!(claim.complete("late").await.unwrap_err().is_fenced());
}

#[tokio::test]
async fn client_recovers_after_the_server_restarts() {
    let mut s = Idemd::start().await;
    let addr = s.addr.to_string();
    let c = Client::connect_with_config(
        addr.clone(),
        ClientConfig::default()
            .retries(20)
            .backoff(Duration::from_millis(20), Duration::from_millis(200)),
    )
    .await
    .unwrap();
    c.ping().await.unwrap();
    s.kill().await;
    let restarted = Idemd::start_with(&[], &["--listen", &addr]).await;
    c.ping().await.expect("reconnected");
    let k = key("after-restart");
    assert!(matches!(
        c.claim(k.as_str()).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    drop(restarted);
}

/// A server that takes a moment to come back (a restart takes 1-2 s) is
/// waited for within the call's deadline, with the default settings: the
/// client of one address gave up after its five quick retries (0.6 s), so
/// every call across a restart failed, and `run_once` left its key
/// unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_ridden_out_within_the_deadline() {
    let mut s = Idemd::start().await;
    let addr = s.addr.to_string();
    let c = Client::connect(addr.clone()).await.unwrap();
    c.ping().await.unwrap();
    s.kill().await;
    let back = {
        let addr = addr.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Idemd::start_with(&[], &["--listen", &addr]).await
        })
    };
    let k = key("slow-restart");
    let started = std::time::Instant::now();
    let got = c.claim(k.as_str()).await;
    assert!(
        matches!(got, Ok(ClaimOutcome::Acquired(_))),
        "{got:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_millis(1400));
    drop(back.await.unwrap());
}

/// The connections kept idle for waiting requests are replaced once the
/// server closed them: kept, the closed ones filled the pool for good,
/// and after a restart every waiting request opened a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_connections_are_kept_again_after_a_restart() {
    let mut s = Idemd::start().await;
    let addr = s.addr.to_string();
    let c = Client::connect(addr.clone()).await.unwrap();
    let prefix = key("pool-restart");
    // A claim that waits for the owner of `k`, and the owner completing.
    async fn waited(c: &Client, k: String) {
        let ClaimOutcome::Acquired(owner) = c.claim(k.as_str()).await.unwrap() else {
            panic!("not acquired");
        };
        let waiter = waiting_claim(c, &k);
        tokio::time::sleep(Duration::from_millis(100)).await;
        owner.complete(Bytes::from_static(b"v")).await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert!(matches!(got, ClaimOutcome::Completed(_)), "{got:?}");
    }
    // Enough at once to fill the pool (16).
    let all: Vec<_> = (0..20)
        .map(|i| {
            let (c, k) = (c.clone(), format!("{prefix}-a{i}"));
            tokio::spawn(async move { waited(&c, k).await })
        })
        .collect();
    for t in all {
        t.await.unwrap();
    }
    s.kill().await;
    let s = Idemd::start_with(&[], &["--listen", &addr]).await;
    c.ping().await.expect("reconnected");
    let mut info = s.conn().await;
    let before = info_field(&mut info, "total_connections_received").await;
    for i in 0..5 {
        waited(&c, format!("{prefix}-b{i}")).await;
    }
    let opened = info_field(&mut info, "total_connections_received").await - before;
    assert!(
        opened <= 1,
        "{opened} connections for 5 waiting claims one after another"
    );
}

#[tokio::test]
async fn dropped_guard_abandons() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("dropped");
    let ClaimOutcome::Acquired(claim) = c.claim(k.as_str()).await.unwrap() else {
        panic!("fresh key")
    };
    claim.journal("half-way").await.unwrap();
    drop(claim);
    // The drop abandons in the background.
    let journal = eventually("the dropped claim to be abandoned", async || {
        match c.settle(k.as_str(), None).await.unwrap() {
            Settled::Abandoned { journal } => Some(journal),
            _ => None,
        }
    })
    .await;
    assert_eq!(journal, Bytes::from_static(b"half-way"));
    assert!(matches!(
        c.claim(k.as_str()).await.unwrap(),
        ClaimOutcome::Recover { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_callers_do_not_corrupt_the_shared_connection() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let prefix = key("cancel");
    for i in 0..50 {
        let k = format!("{prefix}-{i}");
        let ClaimOutcome::Acquired(claim) = c.claim(k.as_str()).await.unwrap() else {
            panic!("fresh")
        };
        claim.complete(format!("v{i}")).await.unwrap();
    }
    // Start many requests and drop most of them mid-flight.
    let mut handles = Vec::new();
    for i in 0..200 {
        let c = c.clone();
        let k = format!("{prefix}-{}", i % 50);
        handles.push(tokio::spawn(async move { c.inspect(k.as_str()).await }));
    }
    for (i, h) in handles.iter().enumerate() {
        if i % 3 != 0 {
            h.abort();
        }
    }
    for h in handles {
        let _ = h.await;
    }
    for _ in 0..20 {
        let _ = tokio::time::timeout(
            Duration::from_micros(50),
            c.inspect(format!("{prefix}-1").as_str()),
        )
        .await;
    }
    // Every later reply still belongs to its own request.
    for i in 0..50 {
        match c.claim(format!("{prefix}-{i}").as_str()).await.unwrap() {
            ClaimOutcome::Completed(done) => assert_eq!(done.value, Bytes::from(format!("v{i}"))),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn run_once_classifies_failures() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    #[derive(Debug)]
    enum E {
        Declined,
        Timeout,
        Unknown,
    }
    let opts = || {
        RunOptions::new().classify(|e: &E| match e {
            E::Declined => Failure::Permanent(Bytes::from_static(b"declined")),
            E::Timeout => Failure::Transient,
            E::Unknown => Failure::Unknown,
        })
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let effect = |result: Result<&'static str, E>| {
        let calls = calls.clone();
        move |_ctx| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            result.map(|s| Bytes::from_static(s.as_bytes()))
        }
    };

    // The record as the server holds it (`None`: no record).
    let mut raw = s.conn().await;
    let mut inspect = async |k: &str| {
        idem_protocol::RecordInfo::from_frame(raw.cmd(&["INSPECT", k]).await)
            .expect("an INSPECT reply")
    };

    // Permanent: recorded, replayed to the next caller without running.
    let k = key("permanent");
    // The first run answers in the shape of its replays.
    let first = c
        .run_once(k.as_str(), opts(), effect(Err(E::Declined)))
        .await
        .unwrap();
    assert_eq!(
        (first.outcome, first.value.clone(), first.replayed),
        (Outcome::Err, Bytes::from_static(b"declined"), false)
    );
    let rec = inspect(&k).await.expect("a completed record");
    assert_eq!(
        (rec.state, rec.outcome, rec.value),
        (
            RecordState::Completed,
            Some(Outcome::Err),
            Some(Bytes::from_static(b"declined"))
        )
    );
    let replay = c
        .run_once(k.as_str(), opts(), effect(Ok("never")))
        .await
        .unwrap();
    assert_eq!(
        (replay.outcome, replay.value.clone(), replay.replayed),
        (Outcome::Err, Bytes::from_static(b"declined"), true)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Transient: released, the retry runs again.
    let k = key("transient");
    match c
        .run_once(k.as_str(), opts(), effect(Err(E::Timeout)))
        .await
    {
        Err(RunError::Effect {
            error: E::Timeout,
            failure: Failure::Transient,
        }) => {}
        other => panic!("expected a transient effect error, got {other:?}"),
    }
    assert_eq!(inspect(&k).await, None, "a released key has no record");
    let done = c
        .run_once(k.as_str(), opts(), effect(Ok("second-try")))
        .await
        .unwrap();
    assert_eq!(
        (done.value, done.replayed),
        (Bytes::from_static(b"second-try"), false)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // Unknown: abandoned; the next caller must recover, not re-run.
    let k = key("unknown");
    match c
        .run_once(k.as_str(), opts(), effect(Err(E::Unknown)))
        .await
    {
        Err(RunError::Effect {
            error: E::Unknown,
            failure: Failure::Unknown,
        }) => {}
        other => panic!("expected an unknown effect error, got {other:?}"),
    }
    let rec = inspect(&k).await.expect("an abandoned record");
    assert_eq!(rec.state, RecordState::Abandoned);
    assert_eq!(rec.journal, Some(Bytes::new()));
    match c
        .run_once(k.as_str(), opts(), effect(Ok("blind-rerun")))
        .await
    {
        Err(RunError::NeedsRecovery { .. }) => {}
        other => panic!("expected NeedsRecovery, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // A recovery callback reads the journal and settles it.
    let recovered = c
        .run_once(
            k.as_str(),
            opts().on_recover(|ctx, journal| async move {
                assert!(ctx.fence() > 0);
                assert_eq!(journal, Bytes::new());
                Recovery::Completed(Bytes::from_static(b"found-downstream"))
            }),
            effect(Ok("blind-rerun")),
        )
        .await
        .unwrap();
    assert_eq!(recovered.value, Bytes::from_static(b"found-downstream"));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn run_once_panic_and_cancellation_abandon() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("panic");
    let c2 = c.clone();
    let k2 = k.clone();
    let joined = tokio::spawn(async move {
        c2.run_once(k2.as_str(), RunOptions::<()>::new(), |ctx| async move {
            ctx.journal("before-panic").await.unwrap();
            panic!("effect blew up");
        })
        .await
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert!(matches!(
        c.settle(k.as_str(), None).await.unwrap(),
        Settled::Abandoned { .. }
    ));

    let k = key("cancelled");
    let fut = c.run_once(k.as_str(), RunOptions::<()>::new(), |_ctx| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(Bytes::new())
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), fut)
            .await
            .is_err()
    );
    eventually("the cancelled call's claim to be abandoned", async || {
        matches!(
            c.settle(k.as_str(), None).await.unwrap(),
            Settled::Abandoned { .. }
        )
        .then_some(())
    })
    .await;
}

/// A fake node that answers every request with `reply`.
async fn fake(reply: impl Fn(usize) -> String + Send + Sync + 'static) -> String {
    fake_with(move |n, _| (Duration::ZERO, reply(n))).await
}

/// A fake node that answers each request (after the client's HELLO) with
/// what `reply` gives for its number and frame, after the delay it gives.
async fn fake_with(
    reply: impl Fn(usize, &idem_protocol::Frame) -> (Duration, String) + Send + Sync + 'static,
) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let reply = Arc::new(reply);
    let count = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            let reply = reply.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = bytes::BytesMut::new();
                loop {
                    match idem_protocol::decode(&mut buf, &idem_protocol::Limits::default()) {
                        Ok(Some(frame)) => {
                            // The client's handshake: answered as Idem.
                            if command_name(&frame).eq_ignore_ascii_case("HELLO") {
                                let hello = "*2\r\n$6\r\nserver\r\n$4\r\nidem\r\n";
                                if sock.write_all(hello.as_bytes()).await.is_err() {
                                    return;
                                }
                                continue;
                            }
                            let n = count.fetch_add(1, Ordering::SeqCst);
                            let (delay, text) = reply(n, &frame);
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            if sock.write_all(text.as_bytes()).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        Ok(None) => {}
                        Err(_) => return,
                    }
                    if sock.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A request's arguments as text.
fn args_of(frame: &idem_protocol::Frame) -> Vec<String> {
    match frame {
        idem_protocol::Frame::Array(items) => items
            .iter()
            .map(|f| match f {
                idem_protocol::Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A request's command name.
fn command_name(frame: &idem_protocol::Frame) -> String {
    args_of(frame).into_iter().next().unwrap_or_default()
}

/// A waiting CLAIM parked on a node that stopped leading is answered
/// `-MOVED` there and sent to the leader. It was parked there with its
/// whole WAIT again (following MOVED did not count as a retry), so a
/// waiter could wait up to twice as long as it asked, and with a tight
/// deadline failed instead of being answered INFLIGHT.
#[tokio::test]
async fn a_waiting_claim_redirected_waits_only_for_the_time_left() {
    let waits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = waits.clone();
    let leader = fake_with(move |_, frame| {
        let args = args_of(frame);
        let wait = args
            .iter()
            .position(|a| a.eq_ignore_ascii_case("WAIT"))
            .and_then(|i| args.get(i + 1))
            .and_then(|w| w.parse::<u64>().ok());
        seen.lock().unwrap().push(wait);
        (Duration::ZERO, "*2\r\n+INFLIGHT\r\n:5000\r\n".into())
    })
    .await;
    let to = leader.clone();
    // The node the claim first waits on stops leading after 1 s.
    let former =
        fake_with(move |_, _| (Duration::from_secs(1), format!("-MOVED 1 {to}\r\n"))).await;
    let c = Client::connect(former).await.unwrap();
    let got = c
        .claim(key("redirected-wait").as_str())
        .wait(Duration::from_secs(3))
        .await
        .unwrap();
    assert!(matches!(got, ClaimOutcome::InFlight { .. }), "{got:?}");
    assert_eq!(c.stats().redirects, 1);
    // The leader is first asked without waiting (the key might be free),
    // then, the key being in flight, with the time left.
    let waits = waits.lock().unwrap().clone();
    let [None, Some(wait)] = waits[..] else {
        panic!("the leader got {waits:?}")
    };
    assert!(
        (1_000..=2_000).contains(&wait),
        "parked again with WAIT {wait} ms of 3,000, a second of them spent"
    );
}

/// Waiting claims and settles first ask without waiting, pipelined on the
/// shared connection: those that find the key free (or settled) are
/// answered there, and only those that find it in flight wait, each on a
/// connection of its own. Every waiting request took a connection of its
/// own, and past the few kept idle, a new one (the HTTP layer, which
/// claims with WAIT, opened one for one request in five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_that_need_not_wait_share_the_connection() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let mut info = s.conn().await;
    let before = info_field(&mut info, "total_connections_received").await;
    let prefix = key("shared-wait");
    let mut tasks = Vec::new();
    for i in 0..200 {
        let c = c.clone();
        let k = format!("{prefix}-{i}");
        tasks.push(tokio::spawn(async move {
            let claimed = c.claim(k.as_str()).wait(Duration::from_secs(5)).await?;
            let ClaimOutcome::Acquired(guard) = claimed else {
                panic!("a fresh key was not acquired: {claimed:?}");
            };
            guard.complete(Bytes::from_static(b"done")).await?;
            let settled = c.settle(k.as_str(), Some(Duration::from_secs(5))).await?;
            assert!(matches!(settled, Settled::Completed(_)), "{settled:?}");
            Ok::<(), idem_client::Error>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("claimed, completed and settled");
    }
    let opened = info_field(&mut info, "total_connections_received").await - before;
    assert!(
        opened == 0,
        "{opened} connections for 200 waiting claims and settles that did not wait"
    );
    // One that finds its key in flight still waits, and is served when
    // the owner completes.
    let k = format!("{prefix}-busy");
    let ClaimOutcome::Acquired(owner) = c.claim(k.as_str()).await.unwrap() else {
        panic!("not acquired");
    };
    let waiter = waiting_claim(&c, &k);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "did not wait for the owner");
    owner.complete(Bytes::from_static(b"theirs")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("not served when the owner completed")
        .unwrap()
        .unwrap();
    let ClaimOutcome::Completed(done) = got else {
        panic!("expected the owner's outcome, got {got:?}");
    };
    assert_eq!(done.value, Bytes::from_static(b"theirs"));
}

/// A claim of `k` that waits up to 10 s for its owner, in a task.
fn waiting_claim(
    c: &Client,
    k: &str,
) -> tokio::task::JoinHandle<idem_client::Result<ClaimOutcome>> {
    let (c, k) = (c.clone(), k.to_owned());
    tokio::spawn(async move { c.claim(k.as_str()).wait(Duration::from_secs(10)).await })
}

/// A fake node that answers every CLAIM with `claim_reply` and counts the
/// INSPECTs the client sends (a lost claim's clean-up looks with them).
async fn claim_refusing_node(claim_reply: &'static str) -> (String, Arc<AtomicUsize>) {
    let inspects = Arc::new(AtomicUsize::new(0));
    let seen = inspects.clone();
    let node = fake_with(move |_, frame| {
        let reply = match command_name(frame).to_ascii_uppercase().as_str() {
            "CLAIM" => claim_reply,
            "INSPECT" => {
                seen.fetch_add(1, Ordering::SeqCst);
                "$-1\r\n"
            }
            _ => "+OK\r\n",
        };
        (Duration::ZERO, reply.into())
    })
    .await;
    (node, inspects)
}

async fn refused_claim(node: String, name: &str) -> (idem_client::Error, Bytes) {
    let c = Client::connect_with_config(
        node,
        ClientConfig::default()
            .retries(1)
            .backoff(Duration::from_millis(1), Duration::from_millis(2)),
    )
    .await
    .unwrap();
    let claim = c.claim(key(name).as_str());
    let attempt = claim.attempt_id().clone();
    (claim.await.unwrap_err(), attempt)
}

/// A CLAIM answered `-TRYAGAIN` to its last try (on a node that had it
/// proposed: it may have been applied) came back as a plain server error,
/// without its attempt id and without the clean-up of a grant that may
/// have been made.
#[tokio::test]
async fn a_claim_refused_with_tryagain_to_the_end_is_an_unknown_outcome() {
    let (node, inspects) = claim_refusing_node(
        "-TRYAGAIN leadership changed after the write was proposed: it may have been applied\r\n",
    )
    .await;
    let (e, attempt) = refused_claim(node, "tryagain-claim").await;
    assert_eq!(e.kind(), ErrorKind::TryAgain, "{e}");
    assert!(e.is_retryable());
    assert!(e.may_have_run(), "{e}");
    assert_eq!(e.attempt(), Some(&attempt), "{e}");
    eventually("the clean-up looks for the grant", async || {
        (inspects.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
}

/// A claim refused with `-TRYAGAIN` before it was proposed, at every try (a
/// node with too many writes pending), still started the background
/// clean-up of a grant that cannot exist: INSPECTs sent to a cluster that
/// is already overloaded, for every claim it refused.
#[tokio::test]
async fn a_claim_refused_before_it_was_proposed_is_not_looked_for() {
    let (node, inspects) = claim_refusing_node(
        "-TRYAGAIN too many writes pending: not proposed within proposal_timeout_ms\r\n",
    )
    .await;
    let (e, attempt) = refused_claim(node, "overloaded-claim").await;
    assert_eq!(e.kind(), ErrorKind::TryAgain, "{e}");
    assert!(e.is_retryable());
    assert!(!e.may_have_run(), "{e}");
    assert_eq!(e.attempt(), Some(&attempt), "{e}");
    // The clean-up would look at once, after 50 ms and after 500 ms.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(inspects.load(Ordering::SeqCst), 0, "no grant to look for");
}

/// A claim guard stopped renewing once no renewal had landed for a whole
/// lease (ownership presumed lost). A cluster's lease clock stands still
/// while no node leads, so after a longer election the lease was still
/// live, but nothing renewed it any more. Now renewals go on, and one that
/// lands clears the presumption.
#[tokio::test]
async fn a_guard_keeps_renewing_after_presuming_its_claim_lost() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewals = Arc::new(AtomicUsize::new(0));
    let (is_down, renewed) = (down.clone(), renewals.clone());
    let node = fake_with(move |_, frame| {
        let reply = match command_name(frame).to_ascii_uppercase().as_str() {
            "CLAIM" => "*2\r\n+ACQUIRED\r\n:1\r\n",
            "RENEW" if is_down.load(Ordering::SeqCst) => "-TRYAGAIN no leader yet\r\n",
            "RENEW" => {
                renewed.fetch_add(1, Ordering::SeqCst);
                "+OK\r\n"
            }
            _ => "+OK\r\n",
        };
        (Duration::ZERO, reply.into())
    })
    .await;
    let c = Client::connect_with_config(
        node,
        ClientConfig::default().backoff(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let ClaimOutcome::Acquired(guard) = c
        .claim(key("presumed-lost").as_str())
        .lease(Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("the fake grants every claim")
    };
    down.store(true, Ordering::SeqCst);
    eventually("ownership presumed lost", async || {
        guard.is_lost().then_some(())
    })
    .await;
    let before = renewals.load(Ordering::SeqCst);
    down.store(false, Ordering::SeqCst);
    eventually("a renewal landed and cleared the presumption", async || {
        (!guard.is_lost() && renewals.load(Ordering::SeqCst) > before).then_some(())
    })
    .await;
}

#[tokio::test]
async fn follows_moved_to_the_leader() {
    let s = Idemd::start().await;
    let leader = s.addr.to_string();
    let l2 = leader.clone();
    let follower = fake(move |_| format!("-MOVED 1234 {l2}\r\n")).await;
    let c = Client::connect(follower.clone()).await.unwrap();
    let k = key("redirect");
    assert!(matches!(
        c.claim(k.as_str()).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    assert_eq!(c.target(), leader);
}

#[tokio::test]
async fn retries_tryagain_with_backoff() {
    let flaky = fake(|n| {
        if n < 2 {
            "-TRYAGAIN no leader yet\r\n".into()
        } else {
            "+PONG\r\n".into()
        }
    })
    .await;
    let c = Client::connect_with_config(
        flaky,
        ClientConfig::default().backoff(Duration::from_millis(5), Duration::from_millis(50)),
    )
    .await
    .unwrap();
    c.ping().await.expect("third try answers");
    let always = fake(|_| "-TRYAGAIN still electing\r\n".into()).await;
    let c = Client::connect_with_config(
        always,
        ClientConfig::default()
            .retries(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(2)),
    )
    .await
    .unwrap();
    let e = c.ping().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TryAgain);
    assert!(e.is_retryable());
}

#[tokio::test]
async fn errors_are_classified_not_matched_by_text() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let k = key("errs");
    let e = c.complete(k.as_str(), 999, "x", None).await.unwrap_err();
    assert!(e.is_fenced() && !e.is_retryable());
    let ClaimOutcome::Acquired(g) = c.claim(k.as_str()).fingerprint("a").await.unwrap() else {
        panic!()
    };
    let e = c.claim(k.as_str()).fingerprint("b").await.unwrap_err();
    assert!(e.is_mismatch());
    let e = c.claim("k".repeat(5000)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooBig);
    g.release().await.unwrap();
    let unreachable =
        Client::connect_with_config("127.0.0.1:1", ClientConfig::default().retries(0))
            .await
            .unwrap_err();
    assert!(unreachable.is_connection());
}

#[tokio::test]
async fn key_builder_and_fingerprint_reach_the_server() {
    let s = Idemd::start().await;
    let c = client(&s).await;
    let name = key("order");
    let k = Key::new(name.as_str()).namespace("tenant:a").version("2");
    let fp = idem_client::fingerprint(&[("amount", 42)]).unwrap();
    assert_eq!(fp.len(), 64);
    let ClaimOutcome::Acquired(g) = c.claim(&k).fingerprint(fp.clone()).await.unwrap() else {
        panic!()
    };
    g.complete("ok").await.unwrap();
    let raw = format!("tenant\\:a:2:{name}");
    let info = c
        .inspect(raw.as_str())
        .await
        .unwrap()
        .expect("stored under the encoded key");
    assert_eq!(info.fingerprint, Some(fp));
}

#[tokio::test]
async fn ownership_is_presumed_lost_when_renewals_fail_for_a_whole_lease() {
    let mut s = Idemd::start().await;
    let c = Client::connect_with_config(
        s.addr.to_string(),
        ClientConfig::default()
            .retries(0)
            .request_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let k = key("unreachable");
    let ClaimOutcome::Acquired(claim) = c
        .claim(k.as_str())
        .lease(Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    s.kill().await;
    let err = tokio::time::timeout(Duration::from_secs(3), claim.lost())
        .await
        .expect("loss presumed");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(claim.is_lost());
}

/// A listener that answers anything with `reply`, then closes.
async fn impostor(reply: &'static [u8]) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = l.accept().await {
            let mut buf = [0u8; 1024];
            let _ = sock.read(&mut buf).await;
            let _ = sock.write_all(reply).await;
        }
    });
    addr
}

/// `connect` "succeeded" against an HTTP server or Redis and failed later.
/// Now it checks with HELLO that the peer is an Idem server; a lazy client
/// connects (and checks) on its first request.
#[tokio::test]
async fn connect_checks_that_the_peer_is_an_idem_server() {
    let http = impostor(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
    let e = Client::connect(http.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotIdem, "{e}");
    assert!(e.to_string().contains("is not an Idem server"), "{e}");
    let redis = impostor(b"*2\r\n$6\r\nserver\r\n$5\r\nredis\r\n").await;
    let e = Client::connect(redis).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotIdem, "{e}");
    assert!(e.to_string().contains("'redis'"), "{e}");
    // Lazy: no connection until the first request, which checks too.
    let c =
        Client::connect_with_config(http, ClientConfig::default().lazy_connect(true).retries(0))
            .await
            .expect("a lazy connect does not connect");
    assert_eq!(c.ping().await.unwrap_err().kind(), ErrorKind::NotIdem);
    // And a real server passes.
    let s = Idemd::start().await;
    client(&s).await.ping().await.unwrap();
}

#[tokio::test]
async fn a_redirect_to_itself_or_a_cycle_falls_back_to_the_seeds() {
    let s = Idemd::start().await;
    let real = s.addr.to_string();
    // A node that names itself as the leader (a stale view of the
    // cluster), and two that name each other.
    let me = Arc::new(std::sync::Mutex::new(String::new()));
    let me2 = me.clone();
    let selfish = fake(move |_| format!("-MOVED 12 {}\r\n", me2.lock().unwrap())).await;
    *me.lock().unwrap() = selfish.clone();
    let (a_to, b_to) = (
        Arc::new(std::sync::Mutex::new(String::new())),
        Arc::new(std::sync::Mutex::new(String::new())),
    );
    let (a2, b2) = (a_to.clone(), b_to.clone());
    let a = fake(move |_| format!("-MOVED 12 {}\r\n", a2.lock().unwrap())).await;
    let b = fake(move |_| format!("-MOVED 12 {}\r\n", b2.lock().unwrap())).await;
    *a_to.lock().unwrap() = b.clone();
    *b_to.lock().unwrap() = a.clone();
    let c = Client::connect_with_config(
        format!("{selfish},{a},{b},{real}"),
        ClientConfig::default()
            .backoff(Duration::from_millis(1), Duration::from_millis(10))
            .retries(0),
    )
    .await
    .unwrap();
    assert_eq!(c.seeds().len(), 4);
    let k = key("seeds");
    assert!(matches!(
        c.claim(k.as_str()).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
    assert_eq!(c.target(), real, "the client ends on the real node");
    assert!(c.stats().redirects >= 5, "{:?}", c.stats());
    // A client of one node that redirects to itself gives up within its
    // retries, with the server's error.
    let lone = Client::connect_with_config(
        selfish.clone(),
        ClientConfig::default()
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .retries(2),
    )
    .await
    .unwrap();
    let e = lone.claim(key("lone").as_str()).await.unwrap_err();
    assert_eq!(e.kind(), idem_client::ErrorKind::Moved, "{e}");
}
