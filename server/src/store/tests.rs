//! Store rules, one test per rule, and a model-based property test.

use std::collections::BTreeMap;

use bytes::Bytes;
use idem_protocol::cmd::*;
use idem_protocol::{
    ClaimReply, Command, ErrorCode, Frame, OnExpire, Outcome, RecordState, Reply, SettleReply,
};
use proptest::prelude::*;

use super::{Store, StoreConfig};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn store() -> Store {
    Store::new(StoreConfig {
        shards: 4,
        default_lease_ms: 1000,
        default_retain_ms: 5000,
        max_memory_bytes: 1 << 20,
    })
}

fn claim(key: &str) -> Claim {
    Claim::new(b(key))
}

fn run(s: &Store, cmd: Command, now: u64) -> Reply {
    s.apply(&cmd, now).reply
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
    let applied = s.apply(&complete("k", f, "v1"), 1);
    assert_eq!(applied.reply, Reply::Ok);
    assert!(applied.wake);
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
    let a = s.apply(
        &Command::Release(Release {
            key: b("k"),
            fence: f,
        }),
        1,
    );
    assert_eq!(a.reply, Reply::Ok);
    assert!(a.wake);
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
    let s = Store::new(StoreConfig {
        shards: 2,
        default_lease_ms: 1000,
        default_retain_ms: 5000,
        max_memory_bytes: 2000,
    });
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
    assert_eq!(s.poke(b"k", 1999), Some(1));
    assert_eq!(s.poke(b"k", 2000), None);
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
    assert!(s.sweep(1000, 10));
    assert!(s.len() >= 1000 - 40, "one call did unbounded work");
    let mut calls = 1;
    while s.len() > 500 {
        s.sweep(1000, 10);
        calls += 1;
        assert!(calls < 10_000);
    }
    assert!(calls > 10);
    assert_eq!(s.len(), 500);
    assert_eq!(s.stats().in_flight, 0);
    assert!(s.stats().memory < mem_full);
    s.sweep(5000, 100_000);
    assert_eq!(s.len(), 0);
    assert_eq!(s.stats().memory, 0);
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

// ---------------------------------------------------------------------
// Model-based property test: a plain map with the rules written out
// again, compared reply for reply with the sharded store.

#[derive(Clone, Debug)]
struct MRec {
    state: MState,
    fence: u64,
    deadline: u64,
    body: Bytes,
    fp: Option<Bytes>,
    attempt: Option<Bytes>,
    recover: bool,
    retain: u64,
    recovered: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum MState {
    Flight,
    Abandoned,
    Done(Outcome),
}

#[derive(Default)]
struct Model {
    recs: BTreeMap<Bytes, MRec>,
    clock: u64,
    fence: u64,
}

const LEASE: u64 = 1000;
const RETAIN: u64 = 5000;

impl Model {
    fn get(&mut self, key: &Bytes) -> Option<&mut MRec> {
        let now = self.clock;
        let r = self.recs.get_mut(key)?;
        if r.deadline <= now {
            if r.state == MState::Flight && r.recover && r.deadline + r.retain > now {
                r.state = MState::Abandoned;
                r.deadline += r.retain;
                r.recovered = false;
            } else {
                self.recs.remove(key);
                return None;
            }
        }
        self.recs.get_mut(key)
    }

    fn apply(&mut self, cmd: &Command, now: u64) -> Reply {
        use ClaimReply as C;
        self.clock = self.clock.max(now);
        let now = self.clock;
        let fenced = Reply::Error(super::FENCED);
        match cmd {
            Command::Claim(c) => {
                let mismatch =
                    |r: &MRec| matches!((&r.fp, &c.fingerprint), (Some(a), Some(b)) if a != b);
                let next = self.fence + 1;
                let lease = c.lease_ms.unwrap_or(LEASE);
                let retain = c.retain_ms.unwrap_or(RETAIN);
                let recover = c.on_expire == Some(OnExpire::Recover);
                match self.get(&c.key) {
                    Some(r) if mismatch(r) => Reply::Error(super::MISMATCH),
                    Some(r) => match r.state {
                        MState::Done(o) => Reply::Claim(C::Completed {
                            outcome: o,
                            value: r.body.clone(),
                        }),
                        MState::Flight if c.attempt.is_some() && r.attempt == c.attempt => {
                            r.deadline = r.deadline.max(now + lease);
                            if r.recovered {
                                Reply::Claim(C::Recover {
                                    fence: r.fence,
                                    journal: r.body.clone(),
                                })
                            } else {
                                Reply::Claim(C::Acquired { fence: r.fence })
                            }
                        }
                        MState::Flight => Reply::Claim(C::InFlight {
                            remaining_ms: r.deadline - now,
                        }),
                        MState::Abandoned => {
                            *r = MRec {
                                state: MState::Flight,
                                fence: next,
                                deadline: now + lease,
                                body: r.body.clone(),
                                fp: r.fp.clone(),
                                attempt: c.attempt.clone(),
                                recover,
                                retain,
                                recovered: true,
                            };
                            self.fence = next;
                            Reply::Claim(C::Recover {
                                fence: next,
                                journal: self.recs[&c.key].body.clone(),
                            })
                        }
                    },
                    None => {
                        self.fence = next;
                        self.recs.insert(
                            c.key.clone(),
                            MRec {
                                state: MState::Flight,
                                fence: next,
                                deadline: now + lease,
                                body: Bytes::new(),
                                fp: c.fingerprint.clone(),
                                attempt: c.attempt.clone(),
                                recover,
                                retain,
                                recovered: false,
                            },
                        );
                        Reply::Claim(C::Acquired { fence: next })
                    }
                }
            }
            Command::Settle(c) => Reply::Settle(match self.get(&c.key) {
                None => SettleReply::Absent,
                Some(r) => match r.state {
                    MState::Flight => SettleReply::InFlight {
                        remaining_ms: r.deadline - now,
                    },
                    MState::Abandoned => SettleReply::Abandoned {
                        journal: r.body.clone(),
                    },
                    MState::Done(o) => SettleReply::Completed {
                        outcome: o,
                        value: r.body.clone(),
                    },
                },
            }),
            Command::Complete(c) => match self.get(&c.key) {
                Some(r) if r.fence == c.fence => {
                    if !matches!(r.state, MState::Done(_)) {
                        r.state = MState::Done(if c.error { Outcome::Err } else { Outcome::Ok });
                        r.body = c.value.clone();
                        r.attempt = None;
                        r.deadline = now + c.retain_ms.unwrap_or(r.retain);
                    }
                    Reply::Ok
                }
                _ => fenced,
            },
            Command::Renew(c) => match self.get(&c.key) {
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    r.deadline = now + c.lease_ms;
                    Reply::Ok
                }
                _ => fenced,
            },
            Command::Journal(c) => match self.get(&c.key) {
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    r.body = c.journal.clone();
                    Reply::Ok
                }
                _ => fenced,
            },
            Command::Release(c) => match self.get(&c.key) {
                None => Reply::Ok,
                Some(r) if r.fence == c.fence && !matches!(r.state, MState::Done(_)) => {
                    self.recs.remove(&c.key);
                    Reply::Ok
                }
                _ => fenced,
            },
            Command::Abandon(c) => match self.get(&c.key) {
                Some(r) if r.fence == c.fence && r.state == MState::Abandoned => Reply::Ok,
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    r.state = MState::Abandoned;
                    r.recovered = false;
                    r.deadline = now + r.retain;
                    Reply::Ok
                }
                _ => fenced,
            },
            Command::Inspect(c) => Reply::Inspect(self.get(&c.key).map(|r| {
                let left = r.deadline - now;
                let (state, lease, retain, outcome, value, journal, attempt) = match r.state {
                    MState::Flight => (
                        RecordState::InFlight,
                        Some(left),
                        None,
                        None,
                        None,
                        Some(r.body.clone()),
                        r.attempt.clone(),
                    ),
                    MState::Abandoned => (
                        RecordState::Abandoned,
                        None,
                        Some(left),
                        None,
                        None,
                        Some(r.body.clone()),
                        r.attempt.clone(),
                    ),
                    MState::Done(o) => (
                        RecordState::Completed,
                        None,
                        Some(left),
                        Some(o),
                        Some(r.body.clone()),
                        None,
                        None,
                    ),
                };
                idem_protocol::RecordInfo {
                    state,
                    fence: r.fence,
                    lease_ms: lease,
                    retain_ms: retain,
                    outcome,
                    value,
                    fingerprint: r.fp.clone(),
                    journal,
                    attempt,
                }
            })),
            Command::Forget(c) => {
                let found = self.get(&c.key).is_some();
                self.recs.remove(&c.key);
                Reply::Frame(Frame::Integer(found as i64))
            }
            _ => unreachable!(),
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    Sweep,
    Cmd(Command),
}

fn key_s() -> impl Strategy<Value = Bytes> {
    prop_oneof![Just(b("a")), Just(b("b")), Just(b("c"))]
}

fn opt_small<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![Just(None), s.prop_map(Some)]
}

fn step_s() -> impl Strategy<Value = Step> {
    let fence = 1u64..12;
    // Values and journals both small (inline) and large (kept aside).
    let small = || {
        prop_oneof![
            Just(b("x")),
            Just(b("y")),
            Just(Bytes::from(vec![b'z'; 600]))
        ]
    };
    prop_oneof![
        (0u64..700).prop_map(Step::Advance),
        Just(Step::Sweep),
        (
            key_s(),
            opt_small(1u64..2000),
            opt_small(1u64..3000),
            opt_small(small()),
            opt_small(prop_oneof![Just(OnExpire::Free), Just(OnExpire::Recover)]),
            opt_small(prop_oneof![Just(b("a1")), Just(b("a2"))])
        )
            .prop_map(
                |(key, lease_ms, retain_ms, fingerprint, on_expire, attempt)| Step::Cmd(
                    Command::Claim(Claim {
                        key,
                        lease_ms,
                        retain_ms,
                        wait_ms: None,
                        fingerprint,
                        on_expire,
                        attempt
                    })
                )
            ),
        key_s().prop_map(|key| Step::Cmd(Command::Settle(Settle { key, wait_ms: None }))),
        (
            key_s(),
            fence.clone(),
            small(),
            opt_small(1u64..3000),
            any::<bool>()
        )
            .prop_map(|(key, fence, value, retain_ms, error)| Step::Cmd(
                Command::Complete(Complete {
                    key,
                    fence,
                    value,
                    retain_ms,
                    error
                })
            )),
        (key_s(), fence.clone(), 1u64..2000).prop_map(|(key, fence, lease_ms)| Step::Cmd(
            Command::Renew(Renew {
                key,
                fence,
                lease_ms
            })
        )),
        (key_s(), fence.clone(), small()).prop_map(|(key, fence, journal)| Step::Cmd(
            Command::Journal(Journal {
                key,
                fence,
                journal
            })
        )),
        (key_s(), fence.clone())
            .prop_map(|(key, fence)| Step::Cmd(Command::Release(Release { key, fence }))),
        (key_s(), fence)
            .prop_map(|(key, fence)| Step::Cmd(Command::Abandon(Abandon { key, fence }))),
        key_s().prop_map(|key| Step::Cmd(Command::Inspect(Inspect { key }))),
        key_s().prop_map(|key| Step::Cmd(Command::Forget(Forget { key }))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(steps in proptest::collection::vec(step_s(), 1..120)) {
        let s = Store::new(StoreConfig { shards: 2, default_lease_ms: LEASE, default_retain_ms: RETAIN, max_memory_bytes: usize::MAX });
        let mut m = Model::default();
        let mut now = 0;
        for step in steps {
            match step {
                Step::Advance(d) => now += d,
                Step::Sweep => { s.sweep(now, 2); }
                Step::Cmd(cmd) => {
                    let got = s.apply(&cmd, now).reply;
                    let want = m.apply(&cmd, now);
                    prop_assert_eq!(got, want, "{:?} at {}", cmd, now);
                }
            }
        }
        // Everything the store holds is accounted; after every deadline
        // passes and a full sweep, nothing is left and nothing is charged.
        s.sweep(u64::MAX / 2, usize::MAX);
        prop_assert_eq!(s.len(), 0);
        prop_assert_eq!(s.stats().memory, 0);
    }
}
