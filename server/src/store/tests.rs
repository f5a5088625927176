//! Store rules, one test per rule, and a model-based property test.

use bytes::Bytes;
use idem_protocol::cmd::*;
use idem_protocol::{
    ClaimReply, Command, ErrorCode, Frame, OnExpire, Outcome, RecordState, Reply, SettleReply,
};

use super::{Applied, Defaults, KeyEvents, MemoryLimits, Op, Read, Store, StoreConfig};

const DEFAULTS: Defaults = Defaults {
    lease_ms: 1000,
    retain_ms: 5000,
};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn limits(max: u64, headroom: u64) -> Op {
    Op::SetLimits(MemoryLimits {
        max_memory_bytes: max,
        headroom_bytes: headroom,
    })
}

fn store_with(shards: usize, seed: Option<u64>, max_memory: u64) -> Store {
    let s = Store::new(StoreConfig { shards, seed });
    s.apply_op(0, &limits(max_memory, 0));
    s
}

fn store() -> Store {
    store_with(4, None, 1 << 20)
}

/// Runs a wire command the way a node does: SETTLE and INSPECT are reads,
/// everything else an op with the defaults resolved.
fn exec(s: &Store, cmd: &Command, now: u64) -> Applied {
    match cmd {
        Command::Settle(c) => read(s, Read::Settle(&c.key), now),
        Command::Inspect(c) => read(s, Read::Inspect(&c.key), now),
        _ => {
            let op = Op::from_command(cmd.clone(), &DEFAULTS).unwrap();
            s.apply_op(now, &op)
        }
    }
}

fn read(s: &Store, r: Read<'_>, now: u64) -> Applied {
    let seen = s.read(r, now);
    Applied {
        reply: seen.reply.unwrap(),
        events: KeyEvents::new(),
        index: seen.index,
    }
}

/// One local search for expired keys at `now`, applied as an expiry op.
fn sweep(s: &Store, now: u64, budget: usize) -> bool {
    let found = s.expiry_candidates(now, budget, usize::MAX);
    if !found.keys.is_empty() {
        s.apply_op(now, &Op::Expire { keys: found.keys });
    }
    found.more
}

fn claim(key: &str) -> Claim {
    Claim::new(b(key))
}

fn run(s: &Store, cmd: Command, now: u64) -> Reply {
    exec(s, &cmd, now).reply
}

fn acquired(r: Reply) -> u64 {
    match r {
        Reply::Claim(ClaimReply::Acquired { fence }) => fence,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

fn code(r: Reply) -> ErrorCode {
    match r {
        Reply::Error(e) => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn complete(key: &str, fence: u64, value: &str) -> Command {
    Command::Complete(Complete {
        key: b(key),
        fence,
        value: b(value),
        retain_ms: None,
        error: false,
    })
}

#[test]
fn fresh_claim_acquires_and_second_sees_in_flight() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    assert!(f >= 1);
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 10),
        Reply::Claim(ClaimReply::InFlight { remaining_ms: 990 })
    );
}

#[test]
fn completion_is_replayed_and_complete_is_idempotent() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    let applied = exec(&s, &complete("k", f, "v1"), 1);
    assert_eq!(applied.reply, Reply::Ok);
    assert_eq!(applied.events.len(), 1);
    assert_eq!(applied.events[0].key, b("k"));
    assert_eq!(applied.events[0].index, applied.index);
    // A retry of the same COMPLETE (lost reply) is OK and changes nothing.
    assert_eq!(run(&s, complete("k", f, "other"), 2), Reply::Ok);
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 3),
        Reply::Claim(ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: b("v1")
        })
    );
    assert_eq!(
        code(run(&s, complete("k", f + 1, "x"), 4)),
        ErrorCode::Fenced
    );
}

#[test]
fn permanent_errors_are_replayed_as_errors() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    let cmd = Command::Complete(Complete {
        key: b("k"),
        fence: f,
        value: b("declined"),
        retain_ms: None,
        error: true,
    });
    assert_eq!(run(&s, cmd, 1), Reply::Ok);
    assert_eq!(
        run(
            &s,
            Command::Settle(Settle {
                key: b("k"),
                wait_ms: None
            }),
            2
        ),
        Reply::Settle(SettleReply::Completed {
            outcome: Outcome::Err,
            value: b("declined")
        })
    );
}

#[test]
fn fences_strictly_increase() {
    let s = store();
    let mut last = 0;
    for i in 0..100 {
        let f = acquired(run(&s, Command::Claim(claim(&format!("k{i}"))), 0));
        assert!(f > last);
        last = f;
    }
    let f = acquired(run(&s, Command::Claim(claim("k0-again")), 0));
    assert!(f > last);
}

#[test]
fn lease_lapse_free_makes_key_absent() {
    let s = store();
    let f1 = acquired(run(&s, Command::Claim(claim("k")), 0));
    let f2 = acquired(run(&s, Command::Claim(claim("k")), 1000));
    assert!(f2 > f1);
    // The stale owner is fenced everywhere.
    assert_eq!(
        code(run(&s, complete("k", f1, "v"), 1001)),
        ErrorCode::Fenced
    );
    let renew = Command::Renew(Renew {
        key: b("k"),
        fence: f1,
        lease_ms: 10,
    });
    assert_eq!(code(run(&s, renew, 1001)), ErrorCode::Fenced);
    assert_eq!(s.stats().counters.lapses, 1);
}

#[test]
fn expiry_counts_lapses_and_removed_records_apart() {
    let s = store();
    acquired(run(&s, Command::Claim(claim("free")), 0));
    let mut c = claim("recover");
    c.on_expire = Some(OnExpire::Recover);
    acquired(run(&s, Command::Claim(c), 0));
    let f = acquired(run(&s, Command::Claim(claim("done")), 0));
    assert_eq!(run(&s, complete("done", f, "v"), 10), Reply::Ok);
    // Both leases run out at 1000: under FREE the record goes (the next
    // claim finds the key absent); under RECOVER it stays, abandoned.
    acquired(run(&s, Command::Claim(claim("free")), 1000));
    assert!(matches!(
        run(&s, Command::Claim(claim("recover")), 1000),
        Reply::Claim(ClaimReply::Recover { .. })
    ));
    let c = s.stats().counters;
    assert_eq!((c.lapses, c.expired, c.dropped), (2, 0, 1));
    // The completed record's retention (5 s) ends at 5010.
    acquired(run(&s, Command::Claim(claim("done")), 5010));
    let c = s.stats().counters;
    assert_eq!((c.lapses, c.expired, c.dropped), (2, 1, 2));
}

#[test]
fn lease_lapse_recover_abandons_and_next_claim_recovers() {
    let s = store();
    let mut c = claim("k");
    c.on_expire = Some(OnExpire::Recover);
    let f1 = acquired(run(&s, Command::Claim(c), 0));
    let j = Command::Journal(Journal {
        key: b("k"),
        fence: f1,
        journal: b("charged:ch_1"),
    });
    assert_eq!(run(&s, j, 10), Reply::Ok);
    assert_eq!(
        run(
            &s,
            Command::Settle(Settle {
                key: b("k"),
                wait_ms: None
            }),
            1000
        ),
        Reply::Settle(SettleReply::Abandoned {
            journal: b("charged:ch_1")
        })
    );
    match run(&s, Command::Claim(claim("k")), 1001) {
        Reply::Claim(ClaimReply::Recover { fence, journal }) => {
            assert!(fence > f1);
            assert_eq!(journal, b("charged:ch_1"));
        }
        other => panic!("expected RECOVER, got {other:?}"),
    }
}

#[test]
fn late_complete_of_lapsed_recover_claim_is_accepted_until_someone_takes_over() {
    let s = store();
    let mut c = claim("k");
    c.on_expire = Some(OnExpire::Recover);
    let f1 = acquired(run(&s, Command::Claim(c), 0));
    assert_eq!(run(&s, complete("k", f1, "done"), 2000), Reply::Ok);
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 2001),
        Reply::Claim(ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: b("done")
        })
    );
}

#[test]
fn release_and_abandon() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    assert_eq!(
        code(run(
            &s,
            Command::Release(Release {
                key: b("k"),
                fence: f + 7
            }),
            1
        )),
        ErrorCode::Fenced
    );
    let a = exec(
        &s,
        &Command::Release(Release {
            key: b("k"),
            fence: f,
        }),
        1,
    );
    assert_eq!(a.reply, Reply::Ok);
    assert_eq!(a.events.len(), 1);
    // Releasing an absent key is OK.
    assert_eq!(
        run(
            &s,
            Command::Release(Release {
                key: b("k"),
                fence: f
            }),
            2
        ),
        Reply::Ok
    );
    let f2 = acquired(run(&s, Command::Claim(claim("k")), 3));
    assert_eq!(
        run(
            &s,
            Command::Abandon(Abandon {
                key: b("k"),
                fence: f2
            }),
            4
        ),
        Reply::Ok
    );
    assert_eq!(
        run(
            &s,
            Command::Abandon(Abandon {
                key: b("k"),
                fence: f2
            }),
            4
        ),
        Reply::Ok
    );
    assert!(matches!(
        run(&s, Command::Claim(claim("k")), 5),
        Reply::Claim(ClaimReply::Recover { .. })
    ));
    // Completed records cannot be released or abandoned.
    let f3 = acquired(run(&s, Command::Claim(claim("j")), 6));
    assert_eq!(run(&s, complete("j", f3, "v"), 7), Reply::Ok);
    assert_eq!(
        code(run(
            &s,
            Command::Release(Release {
                key: b("j"),
                fence: f3
            }),
            8
        )),
        ErrorCode::Fenced
    );
    assert_eq!(
        code(run(
            &s,
            Command::Abandon(Abandon {
                key: b("j"),
                fence: f3
            }),
            8
        )),
        ErrorCode::Fenced
    );
}

#[test]
fn attempt_retry_gets_the_same_fence() {
    let s = store();
    let mut c = claim("k");
    c.attempt = Some(b("attempt-1"));
    let f = acquired(run(&s, Command::Claim(c.clone()), 0));
    assert_eq!(acquired(run(&s, Command::Claim(c.clone()), 5)), f);
    // The retry restarts the lease (the owner learns of it only now).
    assert_eq!(acquired(run(&s, Command::Claim(c.clone()), 900)), f);
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 1500),
        Reply::Claim(ClaimReply::InFlight { remaining_ms: 400 })
    );
    let mut other = c.clone();
    other.attempt = Some(b("attempt-2"));
    assert!(matches!(
        run(&s, Command::Claim(other), 5),
        Reply::Claim(ClaimReply::InFlight { .. })
    ));
    // A retried recovery is answered RECOVER again, journal included.
    assert_eq!(
        run(
            &s,
            Command::Abandon(Abandon {
                key: b("k"),
                fence: f
            }),
            6
        ),
        Reply::Ok
    );
    let mut r = claim("k");
    r.attempt = Some(b("attempt-3"));
    let first = run(&s, Command::Claim(r.clone()), 7);
    assert!(matches!(first, Reply::Claim(ClaimReply::Recover { .. })));
    assert_eq!(run(&s, Command::Claim(r), 8), first);
}

#[test]
fn fingerprint_checked_on_every_path_and_never_changes() {
    let s = store();
    let mut c = claim("k");
    c.fingerprint = Some(b("fp-a"));
    let f = acquired(run(&s, Command::Claim(c.clone()), 0));
    let mut bad = c.clone();
    bad.fingerprint = Some(b("fp-b"));
    assert_eq!(
        code(run(&s, Command::Claim(bad.clone()), 1)),
        ErrorCode::Mismatch
    );
    // Without a fingerprint the request is not checked.
    assert!(matches!(
        run(&s, Command::Claim(claim("k")), 1),
        Reply::Claim(ClaimReply::InFlight { .. })
    ));
    assert_eq!(
        run(
            &s,
            Command::Abandon(Abandon {
                key: b("k"),
                fence: f
            }),
            2
        ),
        Reply::Ok
    );
    assert_eq!(
        code(run(&s, Command::Claim(bad.clone()), 3)),
        ErrorCode::Mismatch
    );
    let f2 = match run(&s, Command::Claim(c.clone()), 4) {
        Reply::Claim(ClaimReply::Recover { fence, .. }) => fence,
        other => panic!("{other:?}"),
    };
    assert_eq!(run(&s, complete("k", f2, "v"), 5), Reply::Ok);
    assert_eq!(code(run(&s, Command::Claim(bad), 6)), ErrorCode::Mismatch);
    match run(&s, Command::Inspect(Inspect { key: b("k") }), 7) {
        Reply::Inspect(Some(info)) => assert_eq!(info.fingerprint, Some(b("fp-a"))),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.stats().counters.mismatches, 3);
}

#[test]
fn retention_ends_and_inspect_reports_fields() {
    let s = store();
    let mut c = claim("k");
    c.retain_ms = Some(100);
    c.attempt = Some(b("a"));
    let f = acquired(run(&s, Command::Claim(c), 0));
    match run(&s, Command::Inspect(Inspect { key: b("k") }), 10) {
        Reply::Inspect(Some(i)) => {
            assert_eq!(i.state, RecordState::InFlight);
            assert_eq!(i.fence, f);
            assert_eq!(i.lease_ms, Some(990));
            assert_eq!(i.attempt, Some(b("a")));
            assert_eq!(i.journal, Some(Bytes::new()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run(&s, complete("k", f, "v"), 20), Reply::Ok);
    match run(&s, Command::Inspect(Inspect { key: b("k") }), 70) {
        Reply::Inspect(Some(i)) => {
            assert_eq!(i.state, RecordState::Completed);
            assert_eq!(i.retain_ms, Some(50));
            assert_eq!(i.value, Some(b("v")));
            assert_eq!(i.outcome, Some(Outcome::Ok));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        run(&s, Command::Inspect(Inspect { key: b("k") }), 120),
        Reply::Inspect(None)
    );
    assert!(matches!(
        run(&s, Command::Claim(claim("k")), 121),
        Reply::Claim(ClaimReply::Acquired { .. })
    ));
}

#[test]
fn forget_deletes_any_record() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    assert_eq!(
        run(&s, Command::Forget(Forget { key: b("k") }), 1),
        Reply::Frame(Frame::Integer(1))
    );
    assert_eq!(
        run(&s, Command::Forget(Forget { key: b("k") }), 1),
        Reply::Frame(Frame::Integer(0))
    );
    assert_eq!(code(run(&s, complete("k", f, "v"), 2)), ErrorCode::Fenced);
}

#[test]
fn renew_extends_the_lease() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 0));
    assert_eq!(
        run(
            &s,
            Command::Renew(Renew {
                key: b("k"),
                fence: f,
                lease_ms: 5000
            }),
            900
        ),
        Reply::Ok
    );
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 1500),
        Reply::Claim(ClaimReply::InFlight { remaining_ms: 4400 })
    );
    assert_eq!(run(&s, complete("k", f, "v"), 5000), Reply::Ok);
}

#[test]
fn oom_refuses_new_claims_but_serves_replays() {
    let s = store_with(2, None, 2000);
    let f = acquired(run(&s, Command::Claim(claim("done")), 0));
    assert_eq!(run(&s, complete("done", f, "v"), 0), Reply::Ok);
    let mut refused = false;
    for i in 0..100 {
        if let Reply::Error(e) = run(&s, Command::Claim(claim(&format!("k{i}"))), 1) {
            assert_eq!(e.code, ErrorCode::Oom);
            refused = true;
            break;
        }
    }
    assert!(refused, "the memory limit was never reached");
    assert!(matches!(
        run(&s, Command::Claim(claim("done")), 2),
        Reply::Claim(ClaimReply::Completed { .. })
    ));
    assert!(s.stats().memory <= 2000);
}

#[test]
fn time_never_runs_backwards() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("k")), 1000));
    // A command stamped earlier than the store clock is applied at the clock.
    assert_eq!(
        run(&s, Command::Claim(claim("k")), 10),
        Reply::Claim(ClaimReply::InFlight { remaining_ms: 1000 })
    );
    assert_eq!(
        run(
            &s,
            Command::Settle(Settle {
                key: b("k"),
                wait_ms: None
            }),
            1999
        ),
        Reply::Settle(SettleReply::InFlight { remaining_ms: 1 })
    );
    // A read sees the lapse (and reports it) without applying it.
    let seen = s.read(Read::Settle(&b("k")), 2000);
    assert_eq!(seen.reply, Some(Reply::Settle(SettleReply::Absent)));
    assert!(seen.due);
    assert_eq!(s.stats().in_flight, 1);
    // Applying it moves the store clock: later stamps cannot go back.
    let applied = s.apply_op(2000, &Op::Expire { keys: vec![b("k")] });
    assert_eq!(applied.reply, Reply::Frame(Frame::Integer(1)));
    assert_eq!(applied.events.len(), 1);
    assert_eq!(code(run(&s, complete("k", f, "v"), 0)), ErrorCode::Fenced);
}

#[test]
fn sweep_reclaims_expired_records_with_bounded_work() {
    let s = store();
    for i in 0..1000 {
        let f = acquired(run(&s, Command::Claim(claim(&format!("k{i}"))), 0));
        if i % 2 == 0 {
            assert_eq!(run(&s, complete(&format!("k{i}"), f, "v"), 0), Reply::Ok);
        }
    }
    assert_eq!(s.len(), 1000);
    let mem_full = s.stats().memory;
    // At 1000 the 500 leases lapse; completed records live until 5000.
    // Each call examines at most 10 slots in each of the 4 shards.
    assert!(sweep(&s, 1000, 10));
    assert!(s.len() >= 1000 - 40, "one call did unbounded work");
    let mut calls = 1;
    while s.len() > 500 {
        sweep(&s, 1000, 10);
        calls += 1;
        assert!(calls < 10_000);
    }
    assert!(calls > 10);
    assert_eq!(s.len(), 500);
    assert_eq!(s.stats().in_flight, 0);
    assert!(s.stats().memory < mem_full);
    sweep(&s, 5000, 100_000);
    assert_eq!(s.len(), 0);
    assert_eq!(s.stats().memory, 0);
}

#[test]
fn a_search_for_expired_keys_resumes_in_the_shard_the_last_one_stopped_in() {
    // A wave of expiry: in each of four shards, the leases of about 100
    // records lapse at 1000 beside 100 live ones; each search takes at
    // most 10 keys, walking a whole shard if need be. Starting every search
    // in the first shard walked again each shard whose lapsed records were
    // already taken (15,492 slots here for 1,024); resuming where the last
    // search stopped walks each about once (1,159).
    let s = store_with(4, None, 64 << 20);
    for i in 0..400 {
        acquired(run(&s, Command::Claim(claim(&format!("lapsed{i}"))), 0));
    }
    for i in 0..400 {
        acquired(run(&s, Command::Claim(claim(&format!("live{i}"))), 900));
    }
    let slots: usize = s.shards.iter().map(|sh| sh.lock().slab.slots()).sum();
    let (mut examined, mut searches) = (0, 0);
    while s.len() > 400 {
        let found = s.expiry_candidates(1000, usize::MAX, 10);
        assert!(found.keys.len() <= 10);
        examined += found.examined;
        searches += 1;
        assert!(searches < 1000, "the lapsed records are not reclaimed");
        s.apply_op(1000, &Op::Expire { keys: found.keys });
    }
    assert_eq!(s.stats().in_flight, 400);
    assert!(searches >= 40);
    assert!(
        examined <= 3 * slots + searches,
        "{examined} slots examined for {slots} slots in {searches} searches"
    );
}

#[test]
fn fields_over_the_record_format_are_refused() {
    let s = store();
    let mut c = claim("k");
    c.attempt = Some(Bytes::from(vec![b'a'; 256]));
    assert_eq!(code(run(&s, Command::Claim(c), 0)), ErrorCode::TooBig);
    let c = claim(&"k".repeat(70_000));
    assert_eq!(code(run(&s, Command::Claim(c), 0)), ErrorCode::TooBig);
    assert_eq!(s.len(), 0);
}

#[test]
fn large_values_are_shared_not_copied() {
    let s = store();
    let f = acquired(run(&s, Command::Claim(claim("big")), 0));
    let value = Bytes::from(vec![7u8; 4096]);
    let c = Command::Complete(Complete {
        key: b("big"),
        fence: f,
        value: value.clone(),
        retain_ms: None,
        error: false,
    });
    assert_eq!(run(&s, c, 1), Reply::Ok);
    let replay = |r: Reply| match r {
        Reply::Claim(ClaimReply::Completed { value, .. }) => value,
        other => panic!("{other:?}"),
    };
    let a = replay(run(&s, Command::Claim(claim("big")), 2));
    let b2 = replay(run(&s, Command::Claim(claim("big")), 3));
    assert_eq!(a, value);
    assert_eq!(
        a.as_ptr(),
        b2.as_ptr(),
        "replays of a large value share one buffer"
    );
    assert!(s.stats().memory >= 4096);
    assert_eq!(
        run(&s, Command::Forget(Forget { key: b("big") }), 4),
        Reply::Frame(Frame::Integer(1))
    );
    assert_eq!(s.stats().memory, 0);
}

#[test]
fn slots_are_reused_under_churn() {
    let s = store();
    for i in 0..20_000u64 {
        let k = format!("churn{i}");
        let f = acquired(run(&s, Command::Claim(claim(&k)), i));
        assert_eq!(
            run(
                &s,
                Command::Release(Release {
                    key: b(&k),
                    fence: f
                }),
                i
            ),
            Reply::Ok
        );
    }
    let slots: usize = s.shards.iter().map(|sh| sh.lock().slab.slots()).sum();
    assert!(
        slots <= 4 * 4096,
        "slab grew to {slots} slots for at most one live record"
    );
    assert_eq!(s.stats().memory, 0);
}

/// A snapshot copy shares the slabs copy-on-write: changes made after it
/// was taken (to records in shared chunks, new ones, removed ones) leave it
/// exactly as the store was.
#[test]
fn a_snapshot_copy_is_unchanged_by_later_applies() {
    let s = store_with(4, None, u64::MAX);
    let mut fences = Vec::new();
    for i in 0..2_000u64 {
        fences.push(acquired(run(
            &s,
            Command::Claim(claim(&format!("cow{i}"))),
            2_000,
        )));
    }
    let expected = s.snapshot();
    let copy = s.snapshot_copy();
    assert_eq!(copy.len(), 2_000);
    for (i, f) in fences.iter().enumerate() {
        let key = b(&format!("cow{i}"));
        let cmd = if i % 2 == 0 {
            Command::Release(Release { key, fence: *f })
        } else {
            Command::Complete(Complete {
                key,
                fence: *f,
                value: Bytes::from(vec![b'v'; 600 * (i % 3)]),
                retain_ms: None,
                error: false,
            })
        };
        assert_eq!(run(&s, cmd, 2_001), Reply::Ok);
    }
    for i in 0..500u64 {
        acquired(run(&s, Command::Claim(claim(&format!("new{i}"))), 2_002));
    }
    assert_ne!(s.snapshot(), expected);
    assert_eq!(copy.encode(), expected);
}

/// A snapshot was encoded whole into memory beside the store it copied
/// (a second copy of every record at its peak). Now it is written out a
/// part at a time, none much over 1 MiB, to a writer that may take less
/// than it is offered; what arrives restores a store whose own snapshot
/// is the same bytes.
#[test]
fn a_snapshot_is_written_out_in_parts_that_make_the_same_bytes() {
    /// Keeps what it is given, and how much it was offered at most.
    struct Parts {
        bytes: Vec<u8>,
        largest: usize,
    }
    impl std::io::Write for Parts {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.largest = self.largest.max(buf.len());
            // Takes at most 100 KiB a call, as a file may.
            let n = buf.len().min(100 << 10);
            self.bytes.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let s = store_with(4, None, u64::MAX);
    for i in 0..40_000u64 {
        let f = acquired(run(&s, Command::Claim(claim(&format!("part{i}"))), 1));
        if i % 1_000 == 0 {
            // Some large bodies among them.
            let value = Bytes::from(vec![b'v'; 300 << 10]);
            let key = b(&format!("part{i}"));
            let done = Command::Complete(Complete {
                key,
                fence: f,
                value,
                retain_ms: None,
                error: false,
            });
            assert_eq!(run(&s, done, 2), Reply::Ok);
        }
    }
    let copy = s.snapshot_copy();
    let whole = copy.encode();
    assert!(whole.len() > 8 << 20, "{} bytes", whole.len());
    let mut parts = Parts {
        bytes: Vec::new(),
        largest: 0,
    };
    let len = copy.encode_to(&mut parts).unwrap();
    assert_eq!(len, whole.len() as u64);
    assert!(parts.bytes == whole, "the same bytes");
    // A part is about 1 MiB (a large body goes whole into its part).
    assert!(parts.largest < 2 << 20, "{} bytes at once", parts.largest);
    let restored = Store::restore(
        StoreConfig {
            shards: 2,
            seed: Some(3),
        },
        &parts.bytes,
    )
    .unwrap();
    assert!(restored.snapshot() == whole, "the same store");
}

/// Records gone gave back none of their slab or index memory (1M expired
/// records left about 100 MB). Now both shrink once mostly empty.
#[test]
fn the_memory_of_records_gone_is_given_back() {
    let s = store_with(1, None, u64::MAX);
    let mut fences = Vec::new();
    for i in 0..20_000u64 {
        fences.push(acquired(run(
            &s,
            Command::Claim(claim(&format!("g{i}"))),
            1,
        )));
    }
    {
        let sh = s.shards[0].lock();
        assert!(sh.slab.slots() >= 20_000 && sh.index.capacity() >= 20_000);
    }
    for (i, f) in fences.iter().enumerate() {
        let release = Command::Release(Release {
            key: b(&format!("g{i}")),
            fence: *f,
        });
        assert_eq!(run(&s, release, 2), Reply::Ok);
    }
    let sh = s.shards[0].lock();
    assert!(sh.slab.slots() <= 256, "{} slots left", sh.slab.slots());
    assert!(
        sh.index.capacity() <= 1024,
        "index capacity {}",
        sh.index.capacity()
    );
    drop(sh);
    // Trimmed when quiet: an empty shard holds nothing at all.
    s.trim();
    let sh = s.shards[0].lock();
    assert_eq!((sh.slab.slots(), sh.index.capacity()), (0, 0));
    drop(sh);
    // And the store still works, from an empty slab.
    let f = acquired(run(&s, Command::Claim(claim("again")), 3));
    assert!(f > fences[fences.len() - 1]);
    assert_eq!(s.len(), 1);
}

/// A snapshot lists its records in key order (restoring one checks it,
/// and refuses any pair out of order), sorted 8 bytes at a time with each
/// group's shared prefix skipped, whatever the keys look like: sharing a
/// long prefix, one starting another, zero bytes, keys each one byte
/// longer than the last, a lone key, nothing shared at all.
#[test]
fn a_snapshot_lists_its_keys_in_order_whatever_they_share() {
    let shared: Vec<Vec<u8>> = [
        &b"same-prefix-AAAAAAAA-2"[..],
        b"same-prefix-AAAAAAAA-10",
        b"same-prefix-AAAAAAAA-1",
        b"same-prefix-AAAAAAAA",
        b"same-prefix-AAAAAAA",
        b"same-prefix-AAAAAAAA\0",
        b"same-prefix-AAAAAAA\0\0",
        b"same-prefix-\0",
        b"same-prefix-",
        b"same-prefix-\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"same-prefix-B",
    ]
    .iter()
    .map(|k| k.to_vec())
    .chain((0..500u32).map(|i| format!("same-prefix-{}", i * 7919 % 1000).into_bytes()))
    // A service's keys: a fixed part, a connection, a zero-padded counter.
    .chain((0..600u32).map(|i| format!("k00042000001{:04}{:016}", i % 7, i).into_bytes()))
    // Each one byte longer than the last: a group split over many levels.
    .chain((1..200usize).map(|n| format!("same-prefix-{}", "a".repeat(n)).into_bytes()))
    // Zero bytes past the first 8 compared.
    .chain((0..20usize).map(|n| {
        let mut k = b"same-prefix-zeros".to_vec();
        k.resize(k.len() + n, 0);
        k
    }))
    .collect();
    let mut apart = shared.clone();
    apart.extend([b"A".to_vec(), b"\0".to_vec(), b"zz".to_vec()]);
    for keys in [shared, apart, vec![b"lonely".to_vec()], Vec::new()] {
        snapshot_of_claims(&keys, 4, 1, 9);
    }
}

/// The snapshot of a store of `shards` shards that claimed `keys`, checked
/// to restore (the records in key order) into `restored_shards` shards
/// seeded with `seed`, holding every key and writing the same bytes.
fn snapshot_of_claims(
    keys: &[Vec<u8>],
    shards: usize,
    restored_shards: usize,
    seed: u64,
) -> Vec<u8> {
    let s = store_with(shards, None, u64::MAX);
    for k in keys {
        acquired(run(
            &s,
            Command::Claim(Claim::new(Bytes::from(k.clone()))),
            1,
        ));
    }
    let snap = s.snapshot();
    let restored = Store::restore(
        StoreConfig {
            shards: restored_shards,
            seed: Some(seed),
        },
        &snap,
    )
    .expect("the records are in key order");
    assert_eq!(restored.snapshot(), snap);
    assert_eq!(restored.stats().records, keys.len());
    snap
}

#[test]
fn a_snapshot_keeps_key_order_when_one_key_parts_early_among_many_alike() {
    // The snapshot's sort guesses from a few keys how far a group's keys
    // go on alike; the one key here that parts from the rest early sits
    // where those few are not read (one shard: records in the order
    // claimed), so only the check of every key finds it.
    let mut keys: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| format!("service-orders-2026-{i:06}").into_bytes())
        .collect();
    keys.insert(1, b"service-z".to_vec());
    let snapshots: Vec<_> = [1, 4]
        .into_iter()
        .map(|shards| snapshot_of_claims(&keys, shards, 2, 3))
        .collect();
    assert!(
        snapshots[0] == snapshots[1],
        "the same bytes whatever the shards"
    );
}

/// Walks the whole store with SCAN steps of `count`, `step` running
/// between the calls; every key returned, in order.
fn scan_all(
    s: &Store,
    count: usize,
    now: u64,
    until: impl Fn() -> std::time::Instant,
    mut step: impl FnMut(usize),
) -> Vec<Bytes> {
    let (mut cursor, mut keys, mut calls) = (0, Vec::new(), 0);
    loop {
        let (next, got) = s.scan(cursor, count, now, until(), None, &|_| true);
        keys.extend(got);
        calls += 1;
        assert!(calls < 100_000, "the walk never ended");
        if next == 0 {
            return keys;
        }
        assert_ne!(next, cursor, "the cursor did not move");
        cursor = next;
        step(calls);
    }
}

fn later() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(60)
}

#[test]
fn scan_returns_every_record_there_throughout_exactly_once() {
    let s = store_with(4, Some(7), 1 << 30);
    for i in 0..3000 {
        acquired(run(&s, Command::Claim(claim(&format!("k{i}"))), 0));
    }
    // Records come and go while the walk runs: the 3,000 there all along
    // are each returned once; the others may or may not be.
    let mut next = 3000;
    let keys = scan_all(&s, 7, 1, later, |call| {
        for _ in 0..3 {
            acquired(run(&s, Command::Claim(claim(&format!("k{next}"))), 1));
            next += 1;
        }
        let gone = format!("k{}", 3000 + call);
        if call % 2 == 0 {
            run(&s, Command::Forget(Forget { key: b(&gone) }), 1);
        }
    });
    let mut seen = std::collections::HashMap::new();
    for k in &keys {
        *seen.entry(k.clone()).or_insert(0) += 1;
    }
    for i in 0..3000 {
        assert_eq!(seen.get(&b(&format!("k{i}"))), Some(&1), "k{i}");
    }
    assert!(seen.values().all(|n| *n == 1), "a key returned twice");
}

#[test]
fn scan_leaves_out_records_past_their_deadline_and_what_keep_refuses() {
    let s = store();
    for (key, lease) in [("a:1", 100), ("a:2", 10_000), ("b:1", 10_000)] {
        let mut c = claim(key);
        c.lease_ms = Some(lease);
        acquired(run(&s, Command::Claim(c), 0));
    }
    // At 500 ms a:1's lease has run out (FREE: the key is gone).
    let (cursor, keys) = s.scan(0, 100, 500, later(), None, &|k| k.starts_with(b"a:"));
    assert_eq!(cursor, 0);
    assert_eq!(keys, vec![b("a:2")]);
}

#[test]
fn scan_out_of_time_still_moves_on() {
    let s = store_with(2, Some(3), 1 << 30);
    for i in 0..500 {
        acquired(run(&s, Command::Claim(claim(&format!("t{i}"))), 0));
    }
    // A deadline already passed: each call looks at a few records only,
    // and the walk still ends with all of them.
    let past = std::time::Instant::now;
    let keys = scan_all(&s, 10_000, 1, past, |_| {});
    assert_eq!(keys.len(), 500);
    let (_, first) = s.scan(0, 10_000, 1, past(), None, &|_| true);
    assert_eq!(
        first.len(),
        1,
        "{} records in a call out of time",
        first.len()
    );
}

#[test]
fn scan_bounds_the_empty_slots_it_walks_at_a_time() {
    // One shard of 10,000 slots where only the last record is left: a call
    // out of time stops after a bounded stretch of empty slots, and the
    // walk still finds the survivor once.
    let s = store_with(1, Some(5), 1 << 30);
    for i in 0..10_000 {
        acquired(run(&s, Command::Claim(claim(&format!("e{i}"))), 0));
    }
    // Slots fill in order: the last claim's record is in slot 9,999.
    let (_, at_end) = s.scan(9_999, 1, 1, later(), None, &|_| true);
    let last = at_end[0].clone();
    for i in 0..10_000 {
        let k = b(&format!("e{i}"));
        if k != last {
            run(&s, Command::Forget(Forget { key: k }), 1);
        }
    }
    let (cursor, keys) = s.scan(0, 1, 1, std::time::Instant::now(), None, &|_| true);
    assert!(keys.is_empty());
    assert!(
        cursor & u64::from(u32::MAX) <= 4 * super::SCAN_BATCH as u64,
        "one call walked to slot {cursor}"
    );
    let keys = scan_all(&s, 1, 1, std::time::Instant::now, |_| {});
    assert_eq!(keys, vec![last]);
}

#[test]
fn scan_for_a_confined_user_counts_and_matches_only_what_it_may_see() {
    let s = store_with(1, Some(9), 1 << 30);
    // One shard: the records sit in slots in claim order, a:0..a:4 between
    // 100 records of another tenant each.
    for i in 0..5 {
        for j in 0..100 {
            acquired(run(&s, Command::Claim(claim(&format!("b:{i}-{j}"))), 0));
        }
        acquired(run(&s, Command::Claim(claim(&format!("a:{i}"))), 0));
    }
    let visible = |k: &[u8]| k.starts_with(b"a:");
    let tried = std::cell::RefCell::new(Vec::new());
    let matches = |k: &[u8]| {
        tried.borrow_mut().push(b(std::str::from_utf8(k).unwrap()));
        true
    };
    // COUNT 1: each call returns the next visible key, whatever lies
    // between; the walk takes a call per visible key (and one to end),
    // not one per record.
    let (mut cursor, mut keys, mut calls) = (0, Vec::new(), 0);
    loop {
        let (next, got) = s.scan(cursor, 1, 1, later(), Some(&visible), &matches);
        assert!(got.len() <= 1, "{got:?}");
        keys.extend(got);
        calls += 1;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(
        keys,
        (0..5).map(|i| b(&format!("a:{i}"))).collect::<Vec<_>>()
    );
    assert!(calls <= 6, "{calls} calls for 5 visible keys");
    // The pattern never met another tenant's key.
    assert!(
        tried.borrow().iter().all(|k| k.starts_with(b"a:")),
        "{:?}",
        tried.borrow()
    );
    // Unconfined, COUNT counts every record.
    let (_, got) = s.scan(0, 50, 1, later(), None, &|_| true);
    assert_eq!(got.len(), 50);
}

/// A reader of `bytes` that, with `gate` set, tells `started` once half of
/// them are read and then waits for `go`: a snapshot load held mid-way.
struct Held<'a> {
    bytes: &'a [u8],
    read: usize,
    gate: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
}

impl std::io::Read for Held<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.read >= self.bytes.len() / 2
            && let Some((started, go)) = self.gate.take()
        {
            started.send(()).unwrap();
            go.recv().unwrap();
        }
        let most = buf.len().min(64);
        let n = (&self.bytes[self.read..]).read(&mut buf[..most])?;
        self.read += n;
        Ok(n)
    }
}

/// Loading a snapshot held every shard's lock for the whole load (4-7 s
/// for 10M records): a node's one runtime thread that looked at the store
/// meanwhile (its check for quiet counts the records) stopped with it,
/// peers and clients unanswered, and the follower campaigned once it went
/// on. The store now loads into shards of its own and is seen empty
/// until they take its place.
#[test]
fn a_store_being_loaded_from_a_snapshot_keeps_answering() {
    let from = store();
    for i in 0..1000 {
        acquired(run(&from, Command::Claim(claim(&format!("k{i}"))), 1));
    }
    let snap = from.snapshot();
    let into = std::sync::Arc::new(store());
    acquired(run(&into, Command::Claim(claim("old")), 1));
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let mut gate = Some((started_tx, go_rx));
    let loader = {
        let (into, snap) = (std::sync::Arc::clone(&into), snap.clone());
        std::thread::spawn(move || {
            let mut opened = 0;
            into.load_snapshot_from(
                || {
                    opened += 1;
                    // The second read, which loads, is held.
                    let gate = if opened == 2 { gate.take() } else { None };
                    Ok(Held {
                        bytes: &snap,
                        read: 0,
                        gate,
                    })
                },
                snap.len() as u64,
            )
        })
    };
    started.recv().unwrap();
    // The loader is now held half way. A look at the store must
    // not wait for it (a bound only to end the test if it does).
    let (seen_tx, seen) = std::sync::mpsc::channel();
    {
        let into = std::sync::Arc::clone(&into);
        std::thread::spawn(move || seen_tx.send(into.len()).unwrap());
    }
    let during = seen
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the store did not answer while a snapshot was loading");
    assert_eq!(during, 0, "the old records are gone, the new not yet in");
    go.send(()).unwrap();
    loader.join().unwrap().expect("the snapshot loads");
    assert_eq!(into.len(), 1000);
    assert_eq!(into.snapshot(), snap);
    assert_eq!(into.stats().memory, from.stats().memory, "memory accounted");
}
