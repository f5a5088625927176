//! Every record command and rule of the protocol, over the wire.

use std::time::Duration;

use idem_protocol::{ClaimReply, Frame, Outcome, SettleReply};

use crate::support::*;

fn completed(value: &str) -> ClaimReply {
    ClaimReply::Completed {
        outcome: Outcome::Ok,
        value: bytes::Bytes::copy_from_slice(value.as_bytes()),
    }
}

#[tokio::test]
async fn claim_complete_replay() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("order");
    let fence = c.acquire(&["CLAIM", &k, "LEASE", "5000"]).await;
    assert!(
        matches!(claim(c.cmd(&["CLAIM", &k]).await), ClaimReply::InFlight { remaining_ms } if remaining_ms <= 5000 && remaining_ms > 4000)
    );
    assert_eq!(
        c.cmd(&["COMPLETE", &k, &fence.to_string(), "charged"])
            .await,
        ok()
    );
    assert_eq!(claim(c.cmd(&["CLAIM", &k]).await), completed("charged"));
    // Lost-reply retry of COMPLETE: OK, nothing changes.
    assert_eq!(
        c.cmd(&["COMPLETE", &k, &fence.to_string(), "other"]).await,
        ok()
    );
    assert_eq!(claim(c.cmd(&["CLAIM", &k]).await), completed("charged"));
    assert!(
        err(&c
            .cmd(&["COMPLETE", &k, &(fence + 1).to_string(), "x"])
            .await)
        .starts_with("FENCED")
    );
    assert_eq!(
        settle(c.cmd(&["SETTLE", &k]).await),
        SettleReply::Completed {
            outcome: Outcome::Ok,
            value: "charged".into()
        }
    );
}

#[tokio::test]
async fn permanent_error_outcome_is_replayed() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("declined");
    let f = c.acquire(&["CLAIM", &k]).await;
    assert_eq!(
        c.cmd(&[
            "COMPLETE",
            &k,
            &f.to_string(),
            "card_declined",
            "ERROR",
            "RETAIN",
            "60000"
        ])
        .await,
        ok()
    );
    assert_eq!(
        claim(c.cmd(&["CLAIM", &k]).await),
        ClaimReply::Completed {
            outcome: Outcome::Err,
            value: "card_declined".into()
        }
    );
}

#[tokio::test]
async fn fences_increase_across_keys_and_grants() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let mut last = 0;
    for i in 0..20 {
        let k = key(&format!("f{i}"));
        let f = c.acquire(&["CLAIM", &k]).await;
        assert!(f > last);
        assert_eq!(c.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
        let f2 = c.acquire(&["CLAIM", &k]).await;
        assert!(f2 > f);
        last = f2;
    }
}

#[tokio::test]
async fn release_absent_ok_and_stale_owner_fenced() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("rel");
    assert_eq!(c.cmd(&["RELEASE", &k, "12345"]).await, ok());
    let f = c.acquire(&["CLAIM", &k]).await;
    assert!(err(&c.cmd(&["RELEASE", &k, &(f + 1).to_string()]).await).starts_with("FENCED"));
    assert!(err(&c.cmd(&["ABANDON", &k, &(f + 1).to_string()]).await).starts_with("FENCED"));
    assert!(
        err(&c
            .cmd(&["RENEW", &k, &(f + 1).to_string(), "LEASE", "10"])
            .await)
        .starts_with("FENCED")
    );
    assert!(err(&c.cmd(&["JOURNAL", &k, &(f + 1).to_string(), "j"]).await).starts_with("FENCED"));
    assert_eq!(c.cmd(&["RELEASE", &k, &f.to_string()]).await, ok());
    assert_eq!(c.cmd(&["INSPECT", &k]).await, Frame::Null);
    let f2 = c.acquire(&["CLAIM", &k]).await;
    assert!(f2 > f);
}

#[tokio::test]
async fn abandon_then_recover_with_journal() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("abandon");
    let f = c.acquire(&["CLAIM", &k]).await;
    assert_eq!(
        c.cmd(&["JOURNAL", &k, &f.to_string(), "gateway-req:abc"])
            .await,
        ok()
    );
    assert_eq!(c.cmd(&["ABANDON", &k, &f.to_string()]).await, ok());
    assert_eq!(
        settle(c.cmd(&["SETTLE", &k]).await),
        SettleReply::Abandoned {
            journal: "gateway-req:abc".into()
        }
    );
    match claim(c.cmd(&["CLAIM", &k]).await) {
        ClaimReply::Recover { fence, journal } => {
            assert!(fence > f);
            assert_eq!(&journal[..], b"gateway-req:abc");
            assert!(
                err(&c.cmd(&["COMPLETE", &k, &f.to_string(), "late"]).await).starts_with("FENCED")
            );
            assert_eq!(
                c.cmd(&["COMPLETE", &k, &fence.to_string(), "recovered"])
                    .await,
                ok()
            );
        }
        other => panic!("expected RECOVER, got {other:?}"),
    }
    assert_eq!(claim(c.cmd(&["CLAIM", &k]).await), completed("recovered"));
}

#[tokio::test]
async fn lease_lapse_free_and_recover() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let free = key("lapse-free");
    let rec = key("lapse-recover");
    let f1 = c.acquire(&["CLAIM", &free, "LEASE", "50"]).await;
    let r1 = c
        .acquire(&["CLAIM", &rec, "LEASE", "50", "ONEXPIRE", "RECOVER"])
        .await;
    let leased_at = std::time::Instant::now();
    assert_eq!(
        c.cmd(&["JOURNAL", &rec, &r1.to_string(), "step-1"]).await,
        ok()
    );
    outlast(leased_at, Duration::from_millis(50)).await;
    let f2 = c.acquire(&["CLAIM", &free]).await;
    assert!(f2 > f1);
    assert!(err(&c.cmd(&["COMPLETE", &free, &f1.to_string(), "v"]).await).starts_with("FENCED"));
    match claim(c.cmd(&["CLAIM", &rec]).await) {
        ClaimReply::Recover { fence, journal } => {
            assert!(fence > r1);
            assert_eq!(&journal[..], b"step-1");
        }
        other => panic!("expected RECOVER, got {other:?}"),
    }
    assert!(info_field(&mut c, "lease_lapses").await >= 2);
}

#[tokio::test]
async fn renew_keeps_ownership_past_the_first_lease() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("renew");
    let f = c.acquire(&["CLAIM", &k, "LEASE", "100"]).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            c.cmd(&["RENEW", &k, &f.to_string(), "LEASE", "100"]).await,
            ok()
        );
    }
    assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
}

#[tokio::test]
async fn attempt_retry_after_lost_reply() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("attempt");
    let f = c.acquire(&["CLAIM", &k, "ATTEMPT", "att-1"]).await;
    assert_eq!(c.acquire(&["CLAIM", &k, "ATTEMPT", "att-1"]).await, f);
    assert!(matches!(
        claim(c.cmd(&["CLAIM", &k, "ATTEMPT", "att-2"]).await),
        ClaimReply::InFlight { .. }
    ));
    assert!(matches!(
        claim(c.cmd(&["CLAIM", &k]).await),
        ClaimReply::InFlight { .. }
    ));
}

#[tokio::test]
async fn fingerprint_mismatch_on_every_path() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("fp");
    let f = c.acquire(&["CLAIM", &k, "FP", "sha-a"]).await;
    assert!(err(&c.cmd(&["CLAIM", &k, "FP", "sha-b"]).await).starts_with("MISMATCH"));
    assert!(
        err(&c.cmd(&["CLAIM", &k, "FP", "sha-b", "WAIT", "1000"]).await).starts_with("MISMATCH")
    );
    assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
    assert!(err(&c.cmd(&["CLAIM", &k, "FP", "sha-b"]).await).starts_with("MISMATCH"));
    assert_eq!(
        claim(c.cmd(&["CLAIM", &k, "FP", "sha-a"]).await),
        completed("v")
    );
    assert_eq!(info_field(&mut c, "mismatches").await, 3);
}

#[tokio::test]
async fn inspect_and_forget() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("inspect");
    assert_eq!(c.cmd(&["INSPECT", &k]).await, Frame::Null);
    let f = c
        .acquire(&["CLAIM", &k, "FP", "fp1", "ATTEMPT", "a1", "LEASE", "9000"])
        .await;
    let info = idem_protocol::RecordInfo::from_frame(c.cmd(&["INSPECT", &k]).await)
        .unwrap()
        .unwrap();
    assert_eq!(info.state, idem_protocol::RecordState::InFlight);
    assert_eq!(info.fence, f);
    assert!(info.lease_ms.unwrap() > 8000);
    assert_eq!(info.fingerprint.as_deref(), Some(&b"fp1"[..]));
    assert_eq!(info.attempt.as_deref(), Some(&b"a1"[..]));
    assert_eq!(int(&c.cmd(&["FORGET", &k]).await), 1);
    assert_eq!(int(&c.cmd(&["FORGET", &k]).await), 0);
    assert_eq!(c.cmd(&["INSPECT", &k]).await, Frame::Null);
}

#[tokio::test]
async fn retention_ends_and_key_is_fresh_again() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("retain");
    let f = c.acquire(&["CLAIM", &k]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", &k, &f.to_string(), "v", "RETAIN", "60"])
            .await,
        ok()
    );
    let completed_at = std::time::Instant::now();
    assert_eq!(claim(c.cmd(&["CLAIM", &k]).await), completed("v"));
    outlast(completed_at, Duration::from_millis(60)).await;
    assert!(c.acquire(&["CLAIM", &k]).await > f);
}

#[tokio::test]
async fn active_sweep_reclaims_without_access() {
    let s = Idemd::start_with(&[("IDEM_SWEEP_INTERVAL_MS", "10")], &[]).await;
    let mut c = s.conn().await;
    let mut wire = bytes::BytesMut::new();
    for i in 0..200 {
        idem_protocol::encode(
            &cmd_frame(&["CLAIM", &key(&format!("sweep{i}")), "LEASE", "30"]),
            idem_protocol::Version::Resp2,
            &mut wire,
        );
    }
    c.write_raw(&wire).await;
    // Every record was created (the sweep may already have taken some, so
    // DBSIZE cannot tell).
    for _ in 0..200 {
        assert!(matches!(
            claim(c.reply().await),
            ClaimReply::Acquired { .. }
        ));
    }
    eventually("the sweep to reclaim every record", async || {
        (int(&c.cmd(&["DBSIZE"]).await) == 0).then_some(())
    })
    .await;
    // Each lease lapsed, noticed by the sweep: nothing else touched them.
    assert_eq!(info_field(&mut c, "lease_lapses").await, 200);
    assert_eq!(info_field(&mut c, "used_memory").await, 0);
}

#[tokio::test]
async fn oom_refuses_claims_but_replays_still_work() {
    let s = Idemd::start_with(&[("IDEM_MAX_MEMORY_BYTES", "20000")], &[]).await;
    let mut c = s.conn().await;
    let done = key("oom-done");
    let f = c.acquire(&["CLAIM", &done]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", &done, &f.to_string(), "kept"]).await,
        ok()
    );
    let mut refused = None;
    for i in 0..1000 {
        let r = c.cmd(&["CLAIM", &key(&format!("oom{i}"))]).await;
        if let Frame::Error(_) = r {
            refused = Some(err(&r));
            break;
        }
    }
    assert!(refused.expect("the limit was reached").starts_with("OOM"));
    assert_eq!(claim(c.cmd(&["CLAIM", &done]).await), completed("kept"));
    assert!(info_field(&mut c, "oom_refusals").await >= 1);
}

/// At the memory limit, owners already in flight keep working within the
/// headroom: RENEW, RELEASE, ABANDON and FORGET always; COMPLETE and JOURNAL
/// while the store stays within max_memory_bytes plus the headroom.
#[tokio::test]
async fn at_the_memory_limit_owners_keep_working_within_the_headroom() {
    let s = Idemd::start_with(
        &[
            ("IDEM_MAX_MEMORY_BYTES", "20000"),
            ("IDEM_MEMORY_HEADROOM_PERCENT", "10"),
        ],
        &[],
    )
    .await;
    let mut c = s.conn().await;
    let mut owners = Vec::new();
    loop {
        let k = key(&format!("full{}", owners.len()));
        let r = c.cmd(&["CLAIM", &k, "LEASE", "60000"]).await;
        match r {
            Frame::Error(_) => {
                assert!(err(&r).starts_with("OOM"), "{}", err(&r));
                break;
            }
            r => {
                let ClaimReply::Acquired { fence } = claim(r) else {
                    panic!("expected ACQUIRED")
                };
                owners.push((k, fence.to_string()));
            }
        }
        assert!(owners.len() < 1000, "the limit was never reached");
    }
    let used = info_field(&mut c, "used_memory").await;
    assert!(used <= 20_000, "{used}");
    let [(k0, f0), (k1, f1), (k2, f2), (k3, f3), ..] = &owners[..] else {
        panic!("too few owners before the limit")
    };
    // Never refused.
    assert_eq!(c.cmd(&["RENEW", k0, f0, "LEASE", "60000"]).await, ok());
    // Growth within the headroom (2,000 bytes) is admitted.
    let v500 = "v".repeat(500);
    assert_eq!(c.cmd(&["COMPLETE", k1, f1, &v500]).await, ok());
    let j1000 = "j".repeat(1000);
    assert_eq!(c.cmd(&["JOURNAL", k2, f2, &j1000]).await, ok());
    // Beyond it, refused, and the record is unchanged.
    let v5000 = "w".repeat(5000);
    let r = c.cmd(&["COMPLETE", k2, f2, &v5000]).await;
    assert!(err(&r).starts_with("OOM"), "{r:?}");
    assert!(matches!(
        settle(c.cmd(&["SETTLE", k2]).await),
        SettleReply::InFlight { .. }
    ));
    let used = info_field(&mut c, "used_memory").await;
    assert!(used <= 22_000, "{used}");
    // Never refused.
    assert_eq!(c.cmd(&["RELEASE", k2, f2]).await, ok());
    assert_eq!(c.cmd(&["ABANDON", k3, f3]).await, ok());
    assert_eq!(int(&c.cmd(&["FORGET", k1]).await), 1);
    // Room again: a fresh claim is admitted.
    c.acquire(&["CLAIM", &key("after-room")]).await;
    assert!(info_field(&mut c, "oom_refusals").await >= 2);
}
