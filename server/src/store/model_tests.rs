//! Model-based property tests: a plain ordered map with the rules written
//! out again (replies, key events, apply indices, memory accounting and the
//! `-OOM` admission rule), compared op for op with the sharded store; and
//! determinism across hash seeds and shard counts, down to snapshot bytes.

use std::collections::BTreeMap;

use bytes::Bytes;
use idem_protocol::cmd::*;
use idem_protocol::{
    ClaimReply, Command, Frame, OnExpire, Outcome, RecordState, Reply, SettleReply,
};
use proptest::prelude::*;

use super::{ClaimOp, Entry, KeyEvent, MemoryLimits, Op, Read, SnapshotError, Store, StoreConfig};

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

/// Bytes a record is charged, written out from the documented layout:
/// overhead, retention (unless completed), key, fingerprint, attempt, and
/// the body inline up to 512 bytes or aside with its own overhead.
fn cost(key: &Bytes, r: &MRec) -> u64 {
    let done = matches!(r.state, MState::Done(_));
    let body = r.body.len() as u64;
    64 + if done { 0 } else { 4 }
        + key.len() as u64
        + r.fp.as_ref().map_or(0, |f| f.len() as u64)
        + r.attempt.as_ref().map_or(0, |a| a.len() as u64)
        + if body > 512 { 64 + body } else { body }
}

struct Model {
    recs: BTreeMap<Bytes, MRec>,
    clock: u64,
    fence: u64,
    seq: u64,
    limits: MemoryLimits,
}

impl Model {
    fn new() -> Self {
        Model {
            recs: BTreeMap::new(),
            clock: 0,
            fence: 0,
            seq: 0,
            limits: MemoryLimits::UNLIMITED,
        }
    }

    fn memory(&self) -> u64 {
        self.recs.iter().map(|(k, r)| cost(k, r)).sum()
    }

    /// The record as it is once its passed deadline is applied, without
    /// applying it.
    fn view(&self, key: &Bytes, now: u64) -> Option<MRec> {
        let mut r = self.recs.get(key)?.clone();
        if r.deadline <= now {
            if r.state == MState::Flight && r.recover && r.deadline + r.retain > now {
                r.state = MState::Abandoned;
                r.deadline += r.retain;
                r.recovered = false;
            } else {
                return None;
            }
        }
        Some(r)
    }

    /// Applies a passed deadline of `key`; returns whether it left flight.
    fn lapse(&mut self, key: &Bytes) -> bool {
        let now = self.clock;
        let Some(r) = self.recs.get(key) else {
            return false;
        };
        if r.deadline > now {
            return false;
        }
        let left = r.state == MState::Flight;
        match self.view(key, now) {
            Some(v) => {
                self.recs.insert(key.clone(), v);
            }
            None => {
                self.recs.remove(key);
            }
        }
        left
    }

    /// Whether growing a record from `before` to `after` bytes is admitted.
    fn admits(&self, before: u64, after: u64) -> bool {
        after <= before
            || self.memory() + (after - before)
                <= self
                    .limits
                    .max_memory_bytes
                    .saturating_add(self.limits.headroom_bytes)
    }

    fn read(&self, cmd: &Command, now: u64) -> Reply {
        let now = self.clock.max(now);
        match cmd {
            Command::Settle(c) => Reply::Settle(match self.view(&c.key, now) {
                None => SettleReply::Absent,
                Some(r) => match r.state {
                    MState::Flight => SettleReply::InFlight {
                        remaining_ms: r.deadline - now,
                    },
                    MState::Abandoned => SettleReply::Abandoned { journal: r.body },
                    MState::Done(o) => SettleReply::Completed {
                        outcome: o,
                        value: r.body,
                    },
                },
            }),
            Command::Inspect(c) => Reply::Inspect(self.view(&c.key, now).map(|r| {
                Box::new({
                    let left = r.deadline - now;
                    let body = Some(r.body.clone());
                    let (state, lease, retain, outcome, value, journal, attempt) = match r.state {
                        MState::Flight => (
                            RecordState::InFlight,
                            Some(left),
                            None,
                            None,
                            None,
                            body,
                            r.attempt.clone(),
                        ),
                        MState::Abandoned => (
                            RecordState::Abandoned,
                            None,
                            Some(left),
                            None,
                            None,
                            body,
                            r.attempt.clone(),
                        ),
                        MState::Done(o) => (
                            RecordState::Completed,
                            None,
                            Some(left),
                            Some(o),
                            body,
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
                })
            })),
            _ => unreachable!(),
        }
    }

    /// Applies `op` at `now`: the reply and the key events.
    fn apply(&mut self, op: &Op, now: u64) -> (Reply, Vec<KeyEvent>) {
        self.clock = self.clock.max(now);
        match op {
            Op::SetLimits(l) => {
                self.seq += 1;
                self.limits = *l;
                (Reply::Ok, vec![])
            }
            Op::Expire { keys } => {
                let mut events = vec![];
                let mut changed = 0;
                if keys.is_empty() {
                    self.seq += 1;
                }
                for k in keys {
                    self.seq += 1;
                    let due = self.recs.get(k).is_some_and(|r| r.deadline <= self.clock);
                    if due {
                        changed += 1;
                        if self.lapse(k) {
                            events.push(KeyEvent {
                                key: k.clone(),
                                index: self.seq,
                            });
                        }
                    }
                }
                (Reply::Frame(Frame::Integer(changed)), events)
            }
            _ => {
                self.seq += 1;
                let key = op.key().cloned().unwrap_or_default();
                let mut left = self.lapse(&key);
                let reply = self.apply_keyed(op, &key, &mut left);
                let events = if left {
                    vec![KeyEvent {
                        key,
                        index: self.seq,
                    }]
                } else {
                    vec![]
                };
                (reply, events)
            }
        }
    }

    fn apply_keyed(&mut self, op: &Op, key: &Bytes, left: &mut bool) -> Reply {
        use ClaimReply as C;
        let now = self.clock;
        let fenced = Reply::Error(super::FENCED);
        let oom = Reply::Error(super::OOM);
        let existing = self.recs.get(key).cloned();
        match op {
            Op::Claim(c) => {
                let Some(r) = existing else {
                    let rec = MRec {
                        state: MState::Flight,
                        fence: self.fence + 1,
                        deadline: now + c.lease_ms,
                        body: Bytes::new(),
                        fp: c.fingerprint.clone(),
                        attempt: c.attempt.clone(),
                        recover: c.on_expire == OnExpire::Recover,
                        retain: c.retain_ms,
                        recovered: false,
                    };
                    if self.memory() + cost(key, &rec) > self.limits.max_memory_bytes {
                        return oom;
                    }
                    self.fence += 1;
                    self.recs.insert(key.clone(), rec);
                    return Reply::Claim(C::Acquired { fence: self.fence });
                };
                if matches!((&r.fp, &c.fingerprint), (Some(a), Some(b)) if a != b) {
                    return Reply::Error(super::MISMATCH);
                }
                match r.state {
                    MState::Done(o) => Reply::Claim(C::Completed {
                        outcome: o,
                        value: r.body,
                    }),
                    MState::Flight if c.attempt.is_some() && r.attempt == c.attempt => {
                        let rec = self.recs.get_mut(key).unwrap();
                        rec.deadline = rec.deadline.max(now + c.lease_ms);
                        if r.recovered {
                            Reply::Claim(C::Recover {
                                fence: r.fence,
                                journal: r.body,
                            })
                        } else {
                            Reply::Claim(C::Acquired { fence: r.fence })
                        }
                    }
                    MState::Flight => Reply::Claim(C::InFlight {
                        remaining_ms: r.deadline - now,
                    }),
                    MState::Abandoned => {
                        let rec = MRec {
                            state: MState::Flight,
                            fence: self.fence + 1,
                            deadline: now + c.lease_ms,
                            body: r.body.clone(),
                            fp: r.fp.clone(),
                            attempt: c.attempt.clone(),
                            recover: c.on_expire == OnExpire::Recover,
                            retain: c.retain_ms,
                            recovered: true,
                        };
                        if !self.admits(cost(key, &r), cost(key, &rec)) {
                            return oom;
                        }
                        self.fence += 1;
                        self.recs.insert(key.clone(), rec);
                        Reply::Claim(C::Recover {
                            fence: self.fence,
                            journal: r.body,
                        })
                    }
                }
            }
            Op::Complete(c) => match existing {
                Some(r) if r.fence == c.fence => {
                    if matches!(r.state, MState::Done(_)) {
                        return Reply::Ok;
                    }
                    let mut done = r.clone();
                    done.state = MState::Done(if c.error { Outcome::Err } else { Outcome::Ok });
                    done.body = c.value.clone();
                    done.attempt = None;
                    done.recovered = false;
                    done.deadline = now + c.retain_ms.unwrap_or(r.retain);
                    if !self.admits(cost(key, &r), cost(key, &done)) {
                        return oom;
                    }
                    *left |= r.state == MState::Flight;
                    self.recs.insert(key.clone(), done);
                    Reply::Ok
                }
                _ => fenced,
            },
            Op::Renew(c) => match self.recs.get_mut(key) {
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    *left |= now + c.lease_ms < r.deadline;
                    r.deadline = now + c.lease_ms;
                    Reply::Ok
                }
                _ => fenced,
            },
            Op::Journal(c) => match existing {
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    let mut j = r.clone();
                    j.body = c.journal.clone();
                    if !self.admits(cost(key, &r), cost(key, &j)) {
                        return oom;
                    }
                    self.recs.insert(key.clone(), j);
                    Reply::Ok
                }
                _ => fenced,
            },
            Op::Release(c) => match existing {
                None => Reply::Ok,
                Some(r) if r.fence == c.fence && !matches!(r.state, MState::Done(_)) => {
                    *left |= r.state == MState::Flight;
                    self.recs.remove(key);
                    Reply::Ok
                }
                _ => fenced,
            },
            Op::Abandon(c) => match self.recs.get_mut(key) {
                Some(r) if r.fence == c.fence && r.state == MState::Abandoned => Reply::Ok,
                Some(r) if r.fence == c.fence && r.state == MState::Flight => {
                    r.state = MState::Abandoned;
                    r.recovered = false;
                    r.deadline = now + r.retain;
                    *left = true;
                    Reply::Ok
                }
                _ => fenced,
            },
            Op::Forget(_) => {
                let found = existing.is_some();
                *left |= existing.is_some_and(|r| r.state == MState::Flight);
                self.recs.remove(key);
                Reply::Frame(Frame::Integer(found as i64))
            }
            Op::Expire { .. } | Op::SetLimits(_) => unreachable!(),
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    /// A local search for expired keys, proposed as one expiry op.
    Sweep,
    /// An expiry op of keys the proposer picked.
    Expire(Vec<Bytes>),
    Limits(u64, u64),
    Cmd(Command),
}

fn key_s() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        Just(Bytes::from_static(b"a")),
        Just(Bytes::from_static(b"b")),
        Just(Bytes::from_static(b"c")),
        Just(Bytes::from_static(b"dd")),
    ]
}

fn opt_small<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![Just(None), s.prop_map(Some)]
}

fn cmd_s() -> impl Strategy<Value = Command> {
    let fence = 1u64..12;
    // Values and journals both small (inline) and large (kept aside).
    let small = || {
        prop_oneof![
            Just(Bytes::from_static(b"x")),
            Just(Bytes::from_static(b"yyyy")),
            Just(Bytes::from(vec![b'z'; 600]))
        ]
    };
    prop_oneof![
        (
            key_s(),
            opt_small(1u64..2000),
            opt_small(1u64..3000),
            opt_small(small()),
            opt_small(prop_oneof![Just(OnExpire::Free), Just(OnExpire::Recover)]),
            opt_small(prop_oneof![
                Just(Bytes::from_static(b"a1")),
                Just(Bytes::from_static(b"a2"))
            ])
        )
            .prop_map(
                |(key, lease_ms, retain_ms, fingerprint, on_expire, attempt)| {
                    Command::Claim(Claim {
                        key,
                        lease_ms,
                        retain_ms,
                        wait_ms: None,
                        fingerprint,
                        on_expire,
                        attempt,
                    })
                }
            ),
        key_s().prop_map(|key| Command::Settle(Settle { key, wait_ms: None })),
        (
            key_s(),
            fence.clone(),
            small(),
            opt_small(1u64..3000),
            any::<bool>()
        )
            .prop_map(|(key, fence, value, retain_ms, error)| {
                Command::Complete(Complete {
                    key,
                    fence,
                    value,
                    retain_ms,
                    error,
                })
            }),
        (key_s(), fence.clone(), 1u64..2000).prop_map(|(key, fence, lease_ms)| {
            Command::Renew(Renew {
                key,
                fence,
                lease_ms,
            })
        }),
        (key_s(), fence.clone(), small()).prop_map(|(key, fence, journal)| {
            Command::Journal(Journal {
                key,
                fence,
                journal,
            })
        }),
        (key_s(), fence.clone()).prop_map(|(key, fence)| Command::Release(Release { key, fence })),
        (key_s(), fence).prop_map(|(key, fence)| Command::Abandon(Abandon { key, fence })),
        key_s().prop_map(|key| Command::Inspect(Inspect { key })),
        key_s().prop_map(|key| Command::Forget(Forget { key })),
    ]
}

fn step_s() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..700).prop_map(Step::Advance),
        1 => Just(Step::Sweep),
        1 => proptest::collection::vec(key_s(), 0..3).prop_map(Step::Expire),
        1 => (0u64..1500, 0u64..800).prop_map(|(m, h)| Step::Limits(m, h)),
        12 => cmd_s().prop_map(Step::Cmd),
    ]
}

const DEFAULTS: super::Defaults = super::Defaults {
    lease_ms: 1000,
    retain_ms: 5000,
};

fn is_read(cmd: &Command) -> bool {
    matches!(cmd, Command::Settle(_) | Command::Inspect(_))
}

fn read_store(s: &Store, cmd: &Command, now: u64) -> Reply {
    let r = match cmd {
        Command::Settle(c) => Read::Settle(&c.key),
        Command::Inspect(c) => Read::Inspect(&c.key),
        _ => unreachable!(),
    };
    s.read(r, now).reply.unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(
        max in 300u64..3000,
        headroom in 0u64..1000,
        steps in proptest::collection::vec(step_s(), 1..150),
    ) {
        let s = Store::new(StoreConfig { shards: 2, seed: None });
        let mut m = Model::new();
        let mut now = 0;
        let set = Op::SetLimits(MemoryLimits { max_memory_bytes: max, headroom_bytes: headroom });
        s.apply_op(0, &set);
        m.apply(&set, 0);
        for step in steps {
            let op = match step {
                Step::Advance(d) => { now += d; continue; }
                Step::Sweep => {
                    let found = s.expiry_candidates(now, 2, 2);
                    Op::Expire { keys: found.keys }
                }
                Step::Expire(keys) => Op::Expire { keys },
                Step::Limits(max, headroom) => Op::SetLimits(MemoryLimits {
                    max_memory_bytes: max,
                    headroom_bytes: headroom,
                }),
                Step::Cmd(cmd) if is_read(&cmd) => {
                    prop_assert_eq!(read_store(&s, &cmd, now), m.read(&cmd, now), "{:?} at {}", cmd, now);
                    continue;
                }
                Step::Cmd(cmd) => Op::from_command(cmd, &DEFAULTS).unwrap(),
            };
            let got = s.apply_op(now, &op);
            let (reply, events) = m.apply(&op, now);
            prop_assert_eq!(&got.reply, &reply, "{:?} at {}", op, now);
            prop_assert_eq!(got.events.to_vec(), events, "events of {:?} at {}", op, now);
            prop_assert_eq!(got.index, m.seq, "index of {:?}", op);
            prop_assert_eq!(s.stats().memory, m.memory(), "memory after {:?}", op);
        }
        // After every deadline passes and every key is expired, nothing is
        // left and nothing is charged.
        let keys: Vec<Bytes> = ["a", "b", "c", "dd"].iter().map(|k| Bytes::from_static(k.as_bytes())).collect();
        s.apply_op(u64::MAX / 2, &Op::Expire { keys: keys.clone() });
        s.apply_op(u64::MAX / 2, &Op::Expire { keys });
        prop_assert_eq!(s.len(), 0);
        prop_assert_eq!(s.stats().memory, 0);
    }

    /// The same entries applied to stores with different hash seeds and
    /// shard counts give the same replies, key events and indices, and the
    /// same snapshot bytes; a snapshot restored elsewhere carries on alike.
    #[test]
    fn replicas_agree_whatever_their_seed_and_shards(
        max in 300u64..4000,
        entries in proptest::collection::vec(
            (0u64..600, proptest::collection::vec(step_s(), 1..5)), 1..60),
    ) {
        let a = Store::new(StoreConfig { shards: 2, seed: Some(1) });
        let b = Store::new(StoreConfig { shards: 64, seed: Some(0xdead_beef) });
        let set = Entry { stamp_ms: 0, ops: vec![Op::SetLimits(MemoryLimits { max_memory_bytes: max, headroom_bytes: max / 4 })] };
        prop_assert_eq!(a.apply(&set), b.apply(&set));
        let mut now = 0;
        let mut restored: Option<Store> = None;
        for (i, (advance, steps)) in entries.into_iter().enumerate() {
            now += advance;
            let mut ops = Vec::new();
            for step in steps {
                match step {
                    Step::Cmd(cmd) if is_read(&cmd) => {
                        prop_assert_eq!(read_store(&a, &cmd, now), read_store(&b, &cmd, now));
                    }
                    Step::Cmd(cmd) => ops.push(Op::from_command(cmd, &DEFAULTS).unwrap()),
                    // The leader's pick, whatever it is, is what replicas apply.
                    Step::Sweep => ops.push(Op::Expire { keys: a.expiry_candidates(now, 3, 2).keys }),
                    Step::Expire(keys) => ops.push(Op::Expire { keys }),
                    Step::Limits(m, h) => ops.push(Op::SetLimits(MemoryLimits { max_memory_bytes: m, headroom_bytes: h })),
                    Step::Advance(_) => {}
                }
            }
            let entry = Entry { stamp_ms: now, ops };
            let ra = a.apply(&entry);
            prop_assert_eq!(&ra, &b.apply(&entry));
            if let Some(r) = &restored {
                prop_assert_eq!(&ra, &r.apply(&entry));
            }
            prop_assert_eq!(a.stats().memory, b.stats().memory);
            if i == 10 {
                let snap = a.snapshot();
                let r = Store::restore(StoreConfig { shards: 8, seed: Some(7) }, &snap).unwrap();
                prop_assert_eq!(r.snapshot(), snap);
                prop_assert_eq!(r.stats().memory, a.stats().memory);
                restored = Some(r);
            }
        }
        let snap = a.snapshot();
        prop_assert_eq!(&snap, &b.snapshot());
        if let Some(r) = &restored {
            prop_assert_eq!(&snap, &r.snapshot());
        }
    }
}

#[test]
fn snapshots_refuse_damage_and_other_versions() {
    let s = Store::new(StoreConfig::default());
    s.apply_op(
        5,
        &Op::Claim(ClaimOp {
            key: Bytes::from_static(b"k"),
            lease_ms: 100,
            retain_ms: 1000,
            fingerprint: Some(Bytes::from_static(b"fp")),
            on_expire: OnExpire::Recover,
            attempt: Some(Bytes::from_static(b"at")),
        }),
    );
    let snap = s.snapshot();
    let cfg = StoreConfig::default;
    assert!(Store::restore(cfg(), &snap).is_ok());
    let mut bad = snap.clone();
    bad[30] ^= 1;
    assert_eq!(
        Store::restore(cfg(), &bad).err(),
        Some(SnapshotError::Checksum)
    );
    let mut newer = snap.clone();
    newer[8] = 2;
    assert!(matches!(
        Store::restore(cfg(), &newer).err(),
        Some(SnapshotError::Version {
            found: 2,
            supported: 1
        })
    ));
    assert_eq!(
        Store::restore(cfg(), b"REDIS0011").err(),
        Some(SnapshotError::BadMagic)
    );
    assert!(matches!(
        Store::restore(cfg(), &snap[..snap.len() - 9]).err(),
        Some(SnapshotError::Checksum | SnapshotError::Malformed(_))
    ));
    // What was restored behaves as the original: the lapse under RECOVER
    // abandons, and the journal, attempt and fingerprint survive.
    let r = Store::restore(cfg(), &snap).unwrap();
    let seen = r.read(Read::Inspect(&Bytes::from_static(b"k")), 200);
    let Some(Reply::Inspect(Some(info))) = seen.reply else {
        panic!("{seen:?}")
    };
    assert_eq!(info.state, RecordState::Abandoned);
    assert_eq!(info.attempt.as_deref(), Some(&b"at"[..]));
    assert_eq!(info.fingerprint.as_deref(), Some(&b"fp"[..]));
    assert!(seen.due);
}
