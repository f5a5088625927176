//! The transitions: what each op does to one key's record, under its
//! shard's lock. Everything here depends only on the op, the entry's stamp
//! and the replicated state, so every replica does the same.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use hashbrown::HashTable;
use idem_protocol::cmd::{Abandon, Complete, Forget, Journal, Release, Renew};
use idem_protocol::{ClaimReply, Frame, OnExpire, Outcome, Reply};

use super::op::{ClaimOp, KeyEvent, KeyEvents};
use super::record::{LARGE_BODY, Parts, Record, State, initial_flags};
use super::shard::{Aux, Shard, Slab, cost_of, state_index};
use super::{FENCED, IndexEntry, MISMATCH, OOM, Store, TOOBIG_FIELD, table_hash};

fn ms32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

/// One op's view of the shard holding its key.
pub(super) struct Ctx<'a> {
    store: &'a Store,
    index: &'a mut HashTable<IndexEntry>,
    slab: &'a mut Slab,
    aux: &'a mut Aux,
    /// The hash of the key the op addresses.
    hash: u64,
    /// The store clock for this entry.
    now: u64,
    /// The apply index of this op on this key.
    seq: u64,
    /// The key left the in-flight state, or its lease was shortened:
    /// waiters must look again.
    left: bool,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(store: &'a Store, sh: &'a mut Shard, hash: u64, now: u64, seq: u64) -> Self {
        Ctx {
            store,
            index: &mut sh.index,
            slab: &mut sh.slab,
            aux: &mut sh.aux,
            hash,
            now,
            seq,
            left: false,
        }
    }

    /// The key events of this op on `key`.
    pub(super) fn events(&self, key: &Bytes) -> KeyEvents {
        let mut ev = KeyEvents::new();
        if self.left {
            ev.push(KeyEvent {
                key: key.clone(),
                index: self.seq,
            });
        }
        ev
    }

    /// The record in slot `id`, which the caller just found.
    ///
    /// # Panics
    ///
    /// If the slot is empty: callers pass only slots found under the lock
    /// they still hold.
    fn rec(&mut self, id: u32) -> &mut Record {
        #[allow(clippy::expect_used)]
        self.slab
            .get_mut(id)
            .expect("slot found under the shard lock is occupied")
    }

    /// Finds the slot of `key`, applying any deadline that has passed.
    fn lookup(&mut self, key: &[u8]) -> Option<u32> {
        let id = super::find(self.index, self.slab, self.hash, key)?;
        if self.expire_if_due(id) {
            None
        } else {
            Some(id)
        }
    }

    /// Applies a passed deadline to slot `id`: a lapsed lease frees the key
    /// (FREE) or abandons it (RECOVER); a completed or abandoned record past
    /// retention is dropped. Returns true if the record is gone.
    fn expire_if_due(&mut self, id: u32) -> bool {
        let now = self.now;
        let Some(rec) = self.slab.get_mut(id) else {
            return true;
        };
        if rec.deadline > now {
            return false;
        }
        if rec.state() == State::InFlight {
            self.left = true;
            self.aux.stats.lapses += 1;
            if rec.on_expire() == OnExpire::Recover {
                // Retention runs from the moment the lease ran out, whoever
                // notices it, so every replica computes the same deadline.
                let until = rec.deadline.saturating_add(rec.retain_ms() as u64);
                if until > now {
                    rec.deadline = until;
                    rec.set_recovered(false);
                    self.move_state(id, State::InFlight, State::Abandoned);
                    return false;
                }
                self.aux.stats.expired += 1;
            }
        } else {
            self.aux.stats.expired += 1;
        }
        self.aux.stats.dropped += 1;
        self.remove(id);
        true
    }

    /// Sets the state of slot `id` (between in flight and abandoned) and
    /// keeps the per-state counts.
    fn move_state(&mut self, id: u32, from: State, to: State) {
        self.rec(id).set_state(to);
        self.recount(from, to);
    }

    fn recount(&mut self, from: State, to: State) {
        self.aux.by_state[state_index(from)] -= 1;
        self.aux.by_state[state_index(to)] += 1;
    }

    /// Removes slot `id` (whose key hashes to `self.hash`).
    fn remove(&mut self, id: u32) {
        let cost = self.slab.cost(id);
        if let Ok(entry) = self
            .index
            .find_entry(table_hash(self.hash as u32), |&(x, _)| x == id)
        {
            entry.remove();
            // Give back the index's memory once it is mostly empty
            // (amortized: it must fill again before the next shrink).
            let (len, cap) = (self.index.len(), self.index.capacity());
            if cap > 256 && len * 8 < cap {
                self.index.shrink_to(len * 2, |&(_, h)| table_hash(h));
            }
        }
        if let Some(rec) = self.slab.remove(id) {
            self.aux.by_state[state_index(rec.state())] -= 1;
            self.store.charge(cost, 0);
        }
    }

    /// What slot `id` would cost rewritten with `state`, `attempt` and a
    /// body of `body_len` bytes.
    fn cost_if(&self, id: u32, state: State, attempt: Option<&[u8]>, body_len: usize) -> usize {
        let Some(rec) = self.slab.get(id) else {
            return 0;
        };
        let p = rec.parts();
        let large = body_len > LARGE_BODY;
        let prefix = if matches!(state, State::Completed(_)) {
            0
        } else {
            4
        };
        let data = prefix
            + p.key.len()
            + p.fingerprint.map_or(0, <[u8]>::len)
            + attempt.map_or(0, <[u8]>::len)
            + if large { 0 } else { body_len };
        cost_of(data, large.then_some(body_len))
    }

    /// Whether an owner's change of slot `id` to cost `after` is admitted:
    /// a change that does not grow the record always is; growth is admitted
    /// while the store stays within `max_memory_bytes` plus the headroom.
    fn admits(&mut self, id: u32, after: usize) -> bool {
        let before = self.slab.cost(id);
        if after <= before {
            return true;
        }
        let limits = self.store.limits();
        let total = self.store.memory() + (after - before) as u64;
        if total
            <= limits
                .max_memory_bytes
                .saturating_add(limits.headroom_bytes)
        {
            return true;
        }
        self.aux.stats.oom += 1;
        false
    }

    /// Rewrites slot `id` with a new state, retention, attempt and body,
    /// keeping its identity, and charges the difference.
    fn rewrite(
        &mut self,
        id: u32,
        state: State,
        retain_ms: u32,
        attempt: Option<&[u8]>,
        body: &[u8],
    ) {
        let before = self.slab.cost(id);
        let large = body.len() > LARGE_BODY;
        let rec = self.rec(id).rebuilt(
            state,
            retain_ms,
            attempt,
            if large { &[] } else { body },
            large,
        );
        self.slab
            .replace(id, rec, large.then(|| Bytes::copy_from_slice(body)));
        let after = self.slab.cost(id);
        self.store.charge(before, after);
    }

    fn fenced(&mut self) -> Reply {
        self.aux.stats.fenced += 1;
        FENCED.into()
    }

    /// `CLAIM`: replay, conflict, retry of the owning attempt, take-over of
    /// an abandoned key, or a fresh grant.
    pub(super) fn claim(&mut self, c: &ClaimOp) -> Reply {
        let Some(id) = self.lookup(&c.key) else {
            return self.claim_fresh(c);
        };
        if self.rec(id).mismatches(c.fingerprint.as_ref()) {
            self.aux.stats.mismatches += 1;
            return MISMATCH.into();
        }
        let now = self.now;
        let rec = self.rec(id);
        match rec.state() {
            State::InFlight if rec.attempt_is(c.attempt.as_ref()) => {
                // A retry of the claim that owns the key (its reply was
                // lost): same fence, and the lease runs from now at least,
                // so the owner does not start out of time.
                rec.deadline = rec.deadline.max(now.saturating_add(c.lease_ms));
                let fence = rec.fence;
                if rec.recovered() {
                    Reply::Claim(ClaimReply::Recover {
                        fence,
                        journal: self.slab.body(id),
                    })
                } else {
                    Reply::Claim(ClaimReply::Acquired { fence })
                }
            }
            State::InFlight => {
                let remaining_ms = rec.deadline - now;
                self.aux.stats.conflicts += 1;
                Reply::Claim(ClaimReply::InFlight { remaining_ms })
            }
            State::Completed(outcome) => {
                self.aux.stats.replays += 1;
                Reply::Claim(ClaimReply::Completed {
                    outcome,
                    value: self.slab.body(id),
                })
            }
            State::Abandoned => self.take_over(id, c),
        }
    }

    /// Takes over an abandoned key: new fence, lease, policy and attempt;
    /// the journal stays for the new owner to recover from.
    fn take_over(&mut self, id: u32, c: &ClaimOp) -> Reply {
        let journal = self.slab.body(id);
        let attempt = c.attempt.as_deref();
        if attempt.is_some_and(|a| a.len() > u8::MAX as usize) {
            return TOOBIG_FIELD.into();
        }
        let after = self.cost_if(id, State::InFlight, attempt, journal.len());
        if !self.admits(id, after) {
            return OOM.into();
        }
        let fence = self.store.next_fence.fetch_add(1, Ordering::AcqRel);
        let retain = ms32(c.retain_ms);
        self.rewrite(id, State::Abandoned, retain, attempt, &journal);
        let now = self.now;
        let rec = self.rec(id);
        rec.fence = fence;
        rec.deadline = now.saturating_add(c.lease_ms);
        rec.set_on_expire(c.on_expire);
        rec.set_recovered(true);
        self.move_state(id, State::Abandoned, State::InFlight);
        self.aux.stats.recovered += 1;
        Reply::Claim(ClaimReply::Recover { fence, journal })
    }

    fn claim_fresh(&mut self, c: &ClaimOp) -> Reply {
        let fp = c.fingerprint.as_deref();
        let attempt = c.attempt.as_deref();
        if c.key.len() > u16::MAX as usize
            || fp.is_some_and(|f| f.len() > u16::MAX as usize)
            || attempt.is_some_and(|a| a.len() > u8::MAX as usize)
        {
            return TOOBIG_FIELD.into();
        }
        let cost = cost_of(
            4 + c.key.len() + fp.map_or(0, <[u8]>::len) + attempt.map_or(0, <[u8]>::len),
            None,
        );
        if self.store.memory() + cost as u64 > self.store.limits().max_memory_bytes {
            self.aux.stats.oom += 1;
            return OOM.into();
        }
        let fence = self.store.next_fence.fetch_add(1, Ordering::AcqRel);
        let parts = Parts {
            key: &c.key,
            fingerprint: fp,
            attempt,
        };
        let mut rec = Record::new(
            parts,
            State::InFlight,
            ms32(c.retain_ms),
            &[],
            initial_flags(c.on_expire),
        );
        rec.fence = fence;
        rec.deadline = self.now.saturating_add(c.lease_ms);
        let id = self.slab.insert(rec);
        self.store.charge(0, self.slab.cost(id));
        let h32 = self.hash as u32;
        self.index
            .insert_unique(table_hash(h32), (id, h32), |&(_, h)| table_hash(h));
        self.aux.by_state[state_index(State::InFlight)] += 1;
        self.aux.stats.acquired += 1;
        Reply::Claim(ClaimReply::Acquired { fence })
    }

    /// The slot of `key` if it is held under `fence`.
    fn owned(&mut self, key: &[u8], fence: u64) -> Option<u32> {
        let id = self.lookup(key)?;
        (self.rec(id).fence == fence).then_some(id)
    }

    pub(super) fn complete(&mut self, c: &Complete) -> Reply {
        let Some(id) = self.owned(&c.key, c.fence) else {
            return self.fenced();
        };
        let rec = self.rec(id);
        let from = rec.state();
        if matches!(from, State::Completed(_)) {
            // A retry of the COMPLETE that already landed: change nothing.
            return Reply::Ok;
        }
        // In flight, or abandoned: the owner's lease lapsed under RECOVER
        // (or it abandoned) and nobody took over, so the outcome it reports
        // is still the truth.
        let retain = c.retain_ms.unwrap_or(rec.retain_ms() as u64);
        let outcome = if c.error { Outcome::Err } else { Outcome::Ok };
        let to = State::Completed(outcome);
        let after = self.cost_if(id, to, None, c.value.len());
        if !self.admits(id, after) {
            return OOM.into();
        }
        self.rewrite(id, to, 0, None, &c.value);
        let now = self.now;
        let rec = self.rec(id);
        rec.set_recovered(false);
        rec.deadline = now.saturating_add(retain);
        self.recount(from, to);
        self.aux.stats.completed += 1;
        self.left |= from == State::InFlight;
        Reply::Ok
    }

    pub(super) fn renew(&mut self, c: &Renew) -> Reply {
        let now = self.now;
        match self.owned(&c.key, c.fence) {
            Some(id) if self.rec(id).state() == State::InFlight => {
                let deadline = now.saturating_add(c.lease_ms);
                // A shorter lease is news to whoever waits for the key:
                // their timer was set for the longer one.
                self.left |= deadline < self.rec(id).deadline;
                self.rec(id).deadline = deadline;
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    pub(super) fn journal(&mut self, c: &Journal) -> Reply {
        match self.owned(&c.key, c.fence) {
            Some(id) if self.rec(id).state() == State::InFlight => {
                let rec = self.rec(id);
                let retain = rec.retain_ms();
                let attempt = rec.parts().attempt.map(<[u8]>::to_vec);
                let after = self.cost_if(id, State::InFlight, attempt.as_deref(), c.journal.len());
                if !self.admits(id, after) {
                    return OOM.into();
                }
                self.rewrite(id, State::InFlight, retain, attempt.as_deref(), &c.journal);
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    pub(super) fn release(&mut self, c: &Release) -> Reply {
        let Some(id) = self.lookup(&c.key) else {
            return Reply::Ok;
        };
        let rec = self.rec(id);
        let state = rec.state();
        if rec.fence != c.fence || matches!(state, State::Completed(_)) {
            return self.fenced();
        }
        self.left |= state == State::InFlight;
        self.remove(id);
        Reply::Ok
    }

    pub(super) fn abandon(&mut self, c: &Abandon) -> Reply {
        let now = self.now;
        let Some(id) = self.owned(&c.key, c.fence) else {
            return self.fenced();
        };
        let rec = self.rec(id);
        match rec.state() {
            State::Abandoned => Reply::Ok,
            State::Completed(_) => self.fenced(),
            State::InFlight => {
                rec.set_recovered(false);
                rec.deadline = now.saturating_add(rec.retain_ms() as u64);
                self.move_state(id, State::InFlight, State::Abandoned);
                self.left = true;
                Reply::Ok
            }
        }
    }

    pub(super) fn forget(&mut self, c: &Forget) -> Reply {
        let Some(id) = self.lookup(&c.key) else {
            return Reply::Frame(Frame::Integer(0));
        };
        self.left |= self.rec(id).state() == State::InFlight;
        self.remove(id);
        Reply::Frame(Frame::Integer(1))
    }

    /// `Op::Expire` for one key: applies its deadline if it has passed.
    /// Returns whether anything changed.
    pub(super) fn expire(&mut self, key: &[u8]) -> bool {
        let Some(id) = super::find(self.index, self.slab, self.hash, key) else {
            return false;
        };
        let due = self.slab.get(id).is_some_and(|r| r.deadline <= self.now);
        due && {
            self.expire_if_due(id);
            true
        }
    }
}
