//! Server-side waiting: CLAIM WAIT and SETTLE WAIT.

use std::time::{Duration, Instant};

use idem_protocol::{ClaimReply, Frame, Outcome, SettleReply};

use crate::support::*;

#[tokio::test]
async fn complete_answers_a_parked_claim_within_milliseconds() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("wait");
    let f = owner.acquire(&["CLAIM", &k]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "10000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    let t = Instant::now();
    assert_eq!(
        owner.cmd(&["COMPLETE", &k, &f.to_string(), "result"]).await,
        ok()
    );
    let r = claim(waiter.reply().await);
    let took = t.elapsed();
    assert_eq!(
        r,
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: "result".into()
        }
    );
    assert!(took < Duration::from_millis(500), "woken after {took:?}");
    assert_eq!(info_field(&mut owner, "hits_after_wait").await, 1);
}

#[tokio::test]
async fn release_hands_the_key_to_the_first_waiter_only() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut first = s.conn().await;
    let mut second = s.conn().await;
    let k = key("fifo");
    let f = owner.acquire(&["CLAIM", &k]).await;
    first.write(&["CLAIM", &k, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    second.write(&["CLAIM", &k, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 2).await;
    assert_eq!(owner.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
    let f1 = match claim(first.reply().await) {
        ClaimReply::Acquired { fence } => fence,
        other => panic!("first waiter should acquire, got {other:?}"),
    };
    assert!(f1 > f);
    // The second keeps waiting, and gets the first one's result.
    let pending = tokio::time::timeout(Duration::from_millis(150), second.read()).await;
    assert!(
        pending.is_err(),
        "second waiter answered early: {pending:?}"
    );
    assert_eq!(
        first.cmd(&["COMPLETE", &k, &f1.to_string(), "v"]).await,
        ok()
    );
    assert_eq!(
        claim(second.reply().await),
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: "v".into()
        }
    );
}

#[tokio::test]
async fn lease_lapse_wakes_waiters_promptly() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("lapse");
    owner.acquire(&["CLAIM", &k, "LEASE", "200"]).await;
    let t = Instant::now();
    let r = claim(waiter.cmd(&["CLAIM", &k, "WAIT", "5000"]).await);
    let took = t.elapsed();
    assert!(matches!(r, ClaimReply::Acquired { .. }), "{r:?}");
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(1500),
        "{took:?}"
    );
}

#[tokio::test]
async fn renewed_lease_keeps_waiters_waiting() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("renewwait");
    let f = owner.acquire(&["CLAIM", &k, "LEASE", "100"]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "2000"]).await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            owner
                .cmd(&["RENEW", &k, &f.to_string(), "LEASE", "100"])
                .await,
            ok()
        );
    }
    assert_eq!(
        owner.cmd(&["COMPLETE", &k, &f.to_string(), "done"]).await,
        ok()
    );
    assert_eq!(
        claim(waiter.reply().await),
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: "done".into()
        }
    );
}

#[tokio::test]
async fn abandon_hands_recovery_to_the_first_waiter() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut w1 = s.conn().await;
    let mut w2 = s.conn().await;
    let k = key("abwait");
    let f = owner.acquire(&["CLAIM", &k]).await;
    assert_eq!(
        owner.cmd(&["JOURNAL", &k, &f.to_string(), "sent"]).await,
        ok()
    );
    w1.write(&["CLAIM", &k, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    w2.write(&["SETTLE", &k, "WAIT", "300"]).await;
    wait_for_info(&mut owner, "blocked_clients", 2).await;
    assert_eq!(owner.cmd(&["ABANDON", &k, &f.to_string()]).await, ok());
    assert!(
        matches!(claim(w1.reply().await), ClaimReply::Recover { ref journal, .. } if &journal[..] == b"sent")
    );
    // The settle waiter now waits on the recovering owner, then times out.
    assert!(matches!(
        settle(w2.reply().await),
        SettleReply::InFlight { .. }
    ));
}

#[tokio::test]
async fn wait_runs_out_with_inflight() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("timeout");
    owner.acquire(&["CLAIM", &k, "LEASE", "10000"]).await;
    let t = Instant::now();
    let r = claim(waiter.cmd(&["CLAIM", &k, "WAIT", "150"]).await);
    assert!(
        matches!(r, ClaimReply::InFlight { remaining_ms } if remaining_ms > 9000),
        "{r:?}"
    );
    assert!(t.elapsed() >= Duration::from_millis(140));
    assert_eq!(info_field(&mut owner, "waits_timed_out").await, 1);
    // WAIT 0 does not wait.
    assert!(matches!(
        claim(waiter.cmd(&["CLAIM", &k, "WAIT", "0"]).await),
        ClaimReply::InFlight { .. }
    ));
}

#[tokio::test]
async fn settle_wait_sees_completion_and_release() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut w = s.conn().await;
    let k = key("settle");
    assert_eq!(
        settle(w.cmd(&["SETTLE", &k, "WAIT", "100"]).await),
        SettleReply::Absent
    );
    let f = owner.acquire(&["CLAIM", &k]).await;
    w.write(&["SETTLE", &k, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    assert_eq!(owner.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
    assert_eq!(settle(w.reply().await), SettleReply::Absent);
    // SETTLE never claims.
    assert_eq!(owner.cmd(&["INSPECT", &k]).await, Frame::Null);
}

#[tokio::test]
async fn parked_wait_holds_back_only_its_own_connection() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let mut other = s.conn().await;
    let k = key("order");
    let f = owner.acquire(&["CLAIM", &k]).await;
    // Pipelined: the PING after the parked CLAIM is answered after it.
    waiter.write(&["PING", "before"]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "5000"]).await;
    waiter.write(&["PING", "after"]).await;
    assert_eq!(bulk(&waiter.reply().await), "before");
    wait_for_info(&mut other, "blocked_clients", 1).await;
    let early = tokio::time::timeout(Duration::from_millis(100), waiter.read()).await;
    assert!(
        early.is_err(),
        "a reply overtook the parked request: {early:?}"
    );
    // Other connections are not held back.
    assert_eq!(other.cmd(&["PING"]).await, Frame::simple("PONG"));
    assert_eq!(
        owner.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await,
        ok()
    );
    assert!(matches!(
        claim(waiter.reply().await),
        ClaimReply::Completed { .. }
    ));
    assert_eq!(bulk(&waiter.reply().await), "after");
}

#[tokio::test]
async fn disconnected_waiter_is_withdrawn_and_does_not_steal_the_key() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let k = key("gone");
    let f = owner.acquire(&["CLAIM", &k]).await;
    {
        let mut gone = s.conn().await;
        gone.write(&["CLAIM", &k, "WAIT", "5000"]).await;
        wait_for_info(&mut owner, "blocked_clients", 1).await;
    }
    // The server notices the close and withdraws the wait.
    wait_for_info(&mut owner, "blocked_clients", 0).await;
    let mut live = s.conn().await;
    live.write(&["CLAIM", &k, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    assert_eq!(info_field(&mut owner, "waits_parked").await, 2);
    assert_eq!(owner.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
    assert!(matches!(
        claim(live.reply().await),
        ClaimReply::Acquired { .. }
    ));
}

#[tokio::test]
async fn shutdown_ends_waits_with_tryagain() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("shutdown");
    owner.acquire(&["CLAIM", &k]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "10000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    let mut s = s;
    s.terminate();
    let e = err(&waiter.reply().await);
    assert!(e.starts_with("TRYAGAIN"), "{e}");
    assert!(waiter.closed().await);
    let status = tokio::time::timeout(Duration::from_secs(10), s.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn handover_times_the_new_owners_lease_not_the_old_one() {
    // The first owner has a long lease and releases; the first waiter
    // acquires with a short lease and dies; the second waiter must get the
    // key when that short lease runs out, not when the old one would have.
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let mut w1 = s.conn().await;
    let mut w2 = s.conn().await;
    let k = key("rearm");
    let f = owner.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
    w1.write(&["CLAIM", &k, "WAIT", "10000", "LEASE", "300"])
        .await;
    wait_for_info(&mut owner, "blocked_clients", 1).await;
    w2.write(&["CLAIM", &k, "WAIT", "10000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 2).await;
    assert_eq!(owner.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
    let t = Instant::now();
    assert!(matches!(
        claim(w1.reply().await),
        ClaimReply::Acquired { .. }
    ));
    drop(w1); // the new owner never finishes
    let r = claim(w2.reply().await);
    let took = t.elapsed();
    assert!(matches!(r, ClaimReply::Acquired { .. }), "{r:?}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(2000),
        "{took:?}"
    );
}

#[tokio::test]
async fn parked_requests_are_bounded_per_key_and_in_total() {
    let s = Idemd::start_with(
        &[("IDEM_MAX_WAITERS_PER_KEY", "2"), ("IDEM_MAX_WAITERS", "3")],
        &[],
    )
    .await;
    let mut owner = s.conn().await;
    let (a, b) = (key("bounded-a"), key("bounded-b"));
    let fa = owner.acquire(&["CLAIM", &a]).await;
    owner.acquire(&["CLAIM", &b]).await;
    let mut parked = Vec::new();
    for n in 1..=2 {
        let mut c = s.conn().await;
        c.write(&["CLAIM", &a, "WAIT", "5000"]).await;
        wait_for_info(&mut owner, "blocked_clients", n).await;
        parked.push(c);
    }
    // A third on the same key: refused at once, nothing parked.
    let mut third = s.conn().await;
    let refused = err(&third.cmd(&["SETTLE", &a, "WAIT", "5000"]).await);
    assert!(
        refused.starts_with("TRYAGAIN") && refused.contains("max_waiters_per_key"),
        "{refused}"
    );
    // Another key: one more fits in the total of three, then no more.
    let mut on_b = s.conn().await;
    on_b.write(&["CLAIM", &b, "WAIT", "5000"]).await;
    wait_for_info(&mut owner, "blocked_clients", 3).await;
    let refused = err(&third.cmd(&["CLAIM", &b, "WAIT", "5000"]).await);
    assert!(refused.contains("max_waiters"), "{refused}");
    assert_eq!(info_field(&mut owner, "waits_refused").await, 2);
    // Without WAIT, nothing is bounded; and the parked ones are served.
    assert!(matches!(
        claim(third.cmd(&["CLAIM", &a]).await),
        ClaimReply::InFlight { .. }
    ));
    assert_eq!(
        owner.cmd(&["COMPLETE", &a, &fa.to_string(), "done"]).await,
        ok()
    );
    for mut c in parked {
        assert!(matches!(
            claim(c.reply().await),
            ClaimReply::Completed { .. }
        ));
    }
}

/// A parked CLAIM followed in the same write by more than the parked
/// read-ahead (64 KiB) of further requests hung its connection for good:
/// while parked, the connection cleared the socket's readiness after
/// seeing data it did not read, and once the CLAIM was answered it waited
/// for a readiness that only new bytes would bring, while the client
/// waited for its replies.
#[tokio::test]
async fn requests_pipelined_behind_a_parked_claim_are_all_answered() {
    let s = Idemd::start().await;
    let mut owner = s.conn().await;
    let k = key("parked-pipeline");
    owner.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
    let mut c = s.conn().await;
    let mut payload = Vec::new();
    let frame = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out.into_bytes()
    };
    payload.extend(frame(&["CLAIM", &k, "WAIT", "500"]));
    let filler = "p".repeat(1000);
    for _ in 0..200 {
        payload.extend(frame(&["PING", &filler]));
    }
    payload.extend(frame(&["PING", "last"]));
    c.write_raw(&payload).await;
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        assert!(matches!(
            claim(c.reply().await),
            ClaimReply::InFlight { .. }
        ));
        for _ in 0..200 {
            assert_eq!(bulk(&c.reply().await), filler);
        }
        bulk(&c.reply().await)
    })
    .await
    .expect("the connection hung behind its parked request");
    assert_eq!(answered, "last");
}
