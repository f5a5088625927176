//! The store: a deterministic, lock-sharded state machine of records.
//!
//! [`Store::apply`] takes a command and the time it was stamped with and
//! returns the reply and whether waiters of the key must be woken. It reads
//! no clock and draws no random numbers, so replicas applying the same
//! commands in the same order reach the same state and give the same
//! replies. (The hash seed is random, but it only decides where a record
//! lives, never what a reply says.)
//!
//! Time: the store keeps `clock = max(clock, now_ms)`, so time never runs
//! backwards even if the commands' stamps do. Fences come from one counter
//! advanced by every grant of ownership, so they strictly increase.
//!
//! Records live in a per-shard slab of 40-byte slots (key, fingerprint,
//! attempt and small bodies share one allocation); an index of slot numbers
//! finds them by one keyed hash: its bits 40 and up pick the shard, its low
//! 32 bits are kept in the index entry and give the index its buckets and
//! tags, so the index grows without reading a record.
//! Expiry is lazy (any access past a deadline sees the lapse) plus an
//! active sweep ([`Store::sweep`]) that walks each slab from a cursor,
//! examining a bounded number of slots per call.

mod record;
mod shard;

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use foldhash::SharedSeed;
use foldhash::fast::SeedableRandomState;
use hashbrown::HashTable;
use idem_protocol::cmd::{
    Abandon, Claim, Complete, Forget, Inspect, Journal, Release, Renew, Settle,
};
use idem_protocol::{
    ClaimReply, Command, ErrorCode, OnExpire, Outcome, Reply, ServerError, SettleReply,
};
use parking_lot::Mutex;

use record::{LARGE_BODY, Parts, RECORD_OVERHEAD, Record, State, initial_flags};
pub use shard::ShardStats;
use shard::{Aux, Shard, Slab, state_index};

/// `-FENCED`: the caller's fence does not own the key.
pub const FENCED: ServerError =
    ServerError::new(ErrorCode::Fenced, "key is not held by this fence");
/// `-MISMATCH`: the fingerprint differs from the first request's.
pub const MISMATCH: ServerError = ServerError::new(
    ErrorCode::Mismatch,
    "fingerprint differs from the first request for this key",
);
/// `-OOM`: the store is full.
pub const OOM: ServerError = ServerError::new(
    ErrorCode::Oom,
    "store is at max_memory_bytes; new claims are refused, replays still work",
);

/// `-TOOBIG`: a field is over what a record can hold (the configuration
/// keeps requests within it; this guards the state machine itself).
pub const TOOBIG_FIELD: ServerError = ServerError::new(
    ErrorCode::TooBig,
    "key or fingerprint over 65535 bytes, or attempt id over 255 bytes",
);

/// What the store needs to know of the configuration.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Number of shards (rounded up to a power of two).
    pub shards: usize,
    /// Lease when CLAIM gives no LEASE, in ms.
    pub default_lease_ms: u64,
    /// Retention when neither CLAIM nor COMPLETE gives RETAIN, in ms.
    pub default_retain_ms: u64,
    /// Accounted bytes at which new claims are refused.
    pub max_memory_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            shards: 64,
            default_lease_ms: 30_000,
            default_retain_ms: 86_400_000,
            max_memory_bytes: 1 << 30,
        }
    }
}

/// The result of applying one command.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The reply to send.
    pub reply: Reply,
    /// The key left the in-flight state (completed, released, abandoned,
    /// forgotten or lapsed): its waiters must be served.
    pub wake: bool,
}

impl Applied {
    fn new(reply: Reply) -> Self {
        Applied { reply, wake: false }
    }
}

/// A summary for INFO.
#[derive(Debug, Default, Clone, Copy)]
pub struct StoreStats {
    /// Records stored (including ones past their deadline not yet swept).
    pub records: usize,
    /// Records in flight.
    pub in_flight: usize,
    /// Records abandoned.
    pub abandoned: usize,
    /// Records completed.
    pub completed: usize,
    /// Accounted bytes.
    pub memory: usize,
    /// Event counters.
    pub counters: ShardStats,
    /// The store clock (ms).
    pub clock: u64,
    /// The last fence handed out.
    pub last_fence: u64,
}

/// The sharded record store. Share it behind an `Arc`.
pub struct Store {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    mask: usize,
    hasher: SeedableRandomState,
    clock: AtomicU64,
    next_fence: AtomicU64,
    memory: AtomicUsize,
    cfg: StoreConfig,
}

fn shared_seed() -> &'static SharedSeed {
    static SEED: OnceLock<SharedSeed> = OnceLock::new();
    SEED.get_or_init(|| SharedSeed::from_u64(RandomState::new().hash_one(0x1de3_u64)))
}

impl Store {
    /// An empty store.
    pub fn new(cfg: StoreConfig) -> Self {
        let n = cfg.shards.max(1).next_power_of_two();
        let shards = (0..n)
            .map(|_| CachePadded::new(Mutex::new(Shard::default())))
            .collect();
        Store {
            shards,
            mask: n - 1,
            hasher: SeedableRandomState::with_seed(
                RandomState::new().hash_one(0x5eed_u64),
                shared_seed(),
            ),
            clock: AtomicU64::new(0),
            next_fence: AtomicU64::new(1),
            memory: AtomicUsize::new(0),
            cfg,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash >> 40) as usize & self.mask]
    }

    fn tick(&self, now_ms: u64) -> u64 {
        self.clock.fetch_max(now_ms, Ordering::AcqRel).max(now_ms)
    }

    /// Applies a record command stamped with `now_ms`. Commands that are not
    /// about records get an `ERR`.
    pub fn apply(&self, cmd: &Command, now_ms: u64) -> Applied {
        let now = self.tick(now_ms);
        let Some(key) = cmd.key() else {
            return Applied::new(Reply::Error(ServerError::new(
                ErrorCode::Err,
                "not a record command",
            )));
        };
        let hash = self.hash(key);
        let mut guard = self.shard(hash).lock();
        let mut ctx = Ctx::new(self, &mut guard, hash, now);
        let reply = match cmd {
            Command::Claim(c) => ctx.claim(c),
            Command::Settle(c) => ctx.settle(c),
            Command::Complete(c) => ctx.complete(c),
            Command::Renew(c) => ctx.renew(c),
            Command::Journal(c) => ctx.journal(c),
            Command::Release(c) => ctx.release(c),
            Command::Abandon(c) => ctx.abandon(c),
            Command::Inspect(c) => ctx.inspect(c),
            Command::Forget(c) => ctx.forget(c),
            _ => Reply::Error(ServerError::new(ErrorCode::Err, "not a record command")),
        };
        Applied {
            reply,
            wake: ctx.wake,
        }
    }

    /// Applies pending lapses of `key` at `now_ms`. Returns the lease time
    /// left if the key is still in flight, `None` if it is not.
    pub fn poke(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        let now = self.tick(now_ms);
        let hash = self.hash(key);
        let mut guard = self.shard(hash).lock();
        let mut ctx = Ctx::new(self, &mut guard, hash, now);
        let id = ctx.lookup(key)?;
        let rec = ctx.rec(id);
        match rec.state() {
            State::InFlight => Some(rec.deadline - now),
            _ => None,
        }
    }

    /// Expires records whose deadlines have passed, examining at most
    /// `budget` slots per shard, each shard resuming where the last call
    /// stopped. Returns true when more than a quarter of the occupied slots
    /// examined had expired: more are likely due, call again.
    pub fn sweep(&self, now_ms: u64, budget: usize) -> bool {
        let now = self.tick(now_ms);
        let (mut seen, mut expired) = (0usize, 0usize);
        for shard in self.shards.iter() {
            let mut guard = shard.lock();
            let sh = &mut *guard;
            let slots = sh.slab.slots();
            if sh.slab.len() == 0 {
                continue;
            }
            for _ in 0..budget.min(slots) {
                let id = (sh.aux.cursor % slots) as u32;
                sh.aux.cursor = (sh.aux.cursor + 1) % slots;
                let Some(rec) = sh.slab.get(id) else { continue };
                seen += 1;
                if rec.deadline > now {
                    continue;
                }
                let hash = self.hash(rec.key());
                if Ctx::new(self, sh, hash, now).expire_if_due(id) {
                    expired += 1;
                }
            }
        }
        seen > 0 && expired * 4 > seen
    }

    /// Number of records stored.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slab.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters and sizes for INFO.
    pub fn stats(&self) -> StoreStats {
        let mut st = StoreStats {
            memory: self.memory.load(Ordering::Relaxed),
            clock: self.clock.load(Ordering::Relaxed),
            last_fence: self.next_fence.load(Ordering::Relaxed) - 1,
            ..StoreStats::default()
        };
        for shard in self.shards.iter() {
            let sh = shard.lock();
            st.records += sh.slab.len();
            st.in_flight += sh.aux.by_state[0];
            st.abandoned += sh.aux.by_state[1];
            st.completed += sh.aux.by_state[2];
            st.counters.add(&sh.aux.stats);
        }
        st
    }

    fn charge(&self, before: usize, after: usize) {
        if after > before {
            self.memory.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.memory.fetch_sub(before - after, Ordering::Relaxed);
        }
    }
}

/// An index entry: a slab slot and the low 32 bits of its key's hash, kept
/// so that the index grows without reading any record and most probes
/// that do not match are rejected without touching the slab.
pub(crate) type IndexEntry = (u32, u32);

/// The index's hash of a key, from the low 32 bits of the keyed hash: the
/// index takes its buckets from the low bits and its tags from the top
/// bits, both of which this repeats; the shard comes from bits 40 and up of
/// the full hash, which the index never sees.
fn table_hash(h32: u32) -> u64 {
    ((h32 as u64) << 32) | h32 as u64
}

/// One command's view of its shard.
struct Ctx<'a> {
    store: &'a Store,
    index: &'a mut HashTable<IndexEntry>,
    slab: &'a mut Slab,
    aux: &'a mut Aux,
    /// The hash of the key the command addresses.
    hash: u64,
    now: u64,
    wake: bool,
}

fn ms32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

impl<'a> Ctx<'a> {
    fn new(store: &'a Store, sh: &'a mut Shard, hash: u64, now: u64) -> Self {
        Ctx {
            store,
            index: &mut sh.index,
            slab: &mut sh.slab,
            aux: &mut sh.aux,
            hash,
            now,
            wake: false,
        }
    }

    /// The record in slot `id`, which the caller just found.
    fn rec(&mut self, id: u32) -> &mut Record {
        self.slab
            .get_mut(id)
            .expect("slot found under the shard lock is occupied")
    }

    /// Finds the slot of `key`, applying any deadline that has passed.
    fn lookup(&mut self, key: &[u8]) -> Option<u32> {
        let (slab, h32) = (&*self.slab, self.hash as u32);
        let &(id, _) = self.index.find(table_hash(h32), |&(id, h)| {
            h == h32 && slab.get(id).is_some_and(|r| r.key() == key)
        })?;
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
            self.wake = true;
            self.aux.stats.lapses += 1;
            if rec.on_expire() == OnExpire::Recover {
                // Retention runs from the moment the lease ran out, whoever
                // notices it, so every replica computes the same deadline.
                let until = rec.deadline.saturating_add(rec.retain_ms() as u64);
                if until > now {
                    rec.deadline = until;
                    rec.set_state(State::Abandoned);
                    rec.set_recovered(false);
                    self.aux.by_state[0] -= 1;
                    self.aux.by_state[1] += 1;
                    return false;
                }
                self.aux.stats.expired += 1;
            }
        } else {
            self.aux.stats.expired += 1;
        }
        self.remove(id);
        true
    }

    /// Removes slot `id` (whose key hashes to `self.hash`).
    fn remove(&mut self, id: u32) {
        let cost = self.slab.cost(id);
        if let Ok(entry) = self
            .index
            .find_entry(table_hash(self.hash as u32), |&(x, _)| x == id)
        {
            entry.remove();
        }
        if let Some(rec) = self.slab.remove(id) {
            self.aux.by_state[state_index(rec.state())] -= 1;
            self.store.charge(cost, 0);
        }
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

    fn claim(&mut self, c: &Claim) -> Reply {
        let now = self.now;
        let cfg = &self.store.cfg;
        let lease = c.lease_ms.unwrap_or(cfg.default_lease_ms);
        let retain = ms32(c.retain_ms.unwrap_or(cfg.default_retain_ms));
        let on_expire = c.on_expire.unwrap_or_default();
        let fp = c.fingerprint.as_ref();
        if let Some(id) = self.lookup(&c.key) {
            let rec = self.rec(id);
            if rec.mismatches(fp) {
                self.aux.stats.mismatches += 1;
                return MISMATCH.into();
            }
            return match rec.state() {
                State::InFlight if rec.attempt_is(c.attempt.as_ref()) => {
                    // A retry of the claim that owns the key (its reply was
                    // lost): same fence, and the lease runs from now at
                    // least, so the owner does not start out of time.
                    rec.deadline = rec.deadline.max(now.saturating_add(lease));
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
                State::Abandoned => {
                    // Take over: new fence, lease, policy and attempt; the
                    // journal stays for the new owner to recover from.
                    let fence = self.store.next_fence.fetch_add(1, Ordering::AcqRel);
                    let journal = self.slab.body(id);
                    self.rewrite(id, State::InFlight, retain, c.attempt.as_deref(), &journal);
                    let rec = self.rec(id);
                    rec.fence = fence;
                    rec.deadline = now.saturating_add(lease);
                    rec.set_on_expire(on_expire);
                    rec.set_recovered(true);
                    self.aux.by_state[1] -= 1;
                    self.aux.by_state[0] += 1;
                    self.aux.stats.recovered += 1;
                    Reply::Claim(ClaimReply::Recover { fence, journal })
                }
            };
        }
        let attempt = c.attempt.as_deref();
        if c.key.len() > u16::MAX as usize
            || fp.is_some_and(|f| f.len() > u16::MAX as usize)
            || attempt.is_some_and(|a| a.len() > u8::MAX as usize)
        {
            return TOOBIG_FIELD.into();
        }
        let cost = RECORD_OVERHEAD
            + 4
            + c.key.len()
            + fp.map_or(0, Bytes::len)
            + attempt.map_or(0, <[u8]>::len);
        if self.store.memory.load(Ordering::Relaxed) + cost > cfg.max_memory_bytes {
            self.aux.stats.oom += 1;
            return OOM.into();
        }
        let fence = self.store.next_fence.fetch_add(1, Ordering::AcqRel);
        let parts = Parts {
            key: &c.key,
            fingerprint: fp.map(|f| &f[..]),
            attempt,
        };
        let mut rec = Record::new(
            parts,
            State::InFlight,
            retain,
            &[],
            initial_flags(on_expire),
        );
        rec.fence = fence;
        rec.deadline = now.saturating_add(lease);
        let id = self.slab.insert(rec);
        self.store.charge(0, self.slab.cost(id));
        let h32 = self.hash as u32;
        self.index
            .insert_unique(table_hash(h32), (id, h32), |&(_, h)| table_hash(h));
        self.aux.by_state[0] += 1;
        self.aux.stats.acquired += 1;
        Reply::Claim(ClaimReply::Acquired { fence })
    }

    fn settle(&mut self, c: &Settle) -> Reply {
        let now = self.now;
        let Some(id) = self.lookup(&c.key) else {
            return Reply::Settle(SettleReply::Absent);
        };
        let rec = self.rec(id);
        Reply::Settle(match rec.state() {
            State::InFlight => SettleReply::InFlight {
                remaining_ms: rec.deadline - now,
            },
            State::Abandoned => SettleReply::Abandoned {
                journal: self.slab.body(id),
            },
            State::Completed(outcome) => SettleReply::Completed {
                outcome,
                value: self.slab.body(id),
            },
        })
    }

    /// The slot of `key` if it is held under `fence`.
    fn owned(&mut self, key: &[u8], fence: u64) -> Option<u32> {
        let id = self.lookup(key)?;
        (self.rec(id).fence == fence).then_some(id)
    }

    fn complete(&mut self, c: &Complete) -> Reply {
        let now = self.now;
        let Some(id) = self.owned(&c.key, c.fence) else {
            return self.fenced();
        };
        let rec = self.rec(id);
        let from = match rec.state() {
            // A retry of the COMPLETE that already landed: change nothing.
            State::Completed(_) => return Reply::Ok,
            State::InFlight => 0,
            // The owner's lease lapsed under RECOVER (or it abandoned) and
            // nobody took over: the outcome it reports is still the truth.
            State::Abandoned => 1,
        };
        let retain = c.retain_ms.unwrap_or(rec.retain_ms() as u64);
        let outcome = if c.error { Outcome::Err } else { Outcome::Ok };
        self.rewrite(id, State::Completed(outcome), 0, None, &c.value);
        let rec = self.rec(id);
        rec.set_recovered(false);
        rec.deadline = now.saturating_add(retain);
        self.aux.by_state[from] -= 1;
        self.aux.by_state[2] += 1;
        self.aux.stats.completed += 1;
        self.wake = true;
        Reply::Ok
    }

    fn renew(&mut self, c: &Renew) -> Reply {
        let now = self.now;
        match self.owned(&c.key, c.fence) {
            Some(id) if self.rec(id).state() == State::InFlight => {
                self.rec(id).deadline = now.saturating_add(c.lease_ms);
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    fn journal(&mut self, c: &Journal) -> Reply {
        match self.owned(&c.key, c.fence) {
            Some(id) if self.rec(id).state() == State::InFlight => {
                let rec = self.rec(id);
                let retain = rec.retain_ms();
                let attempt = rec.parts().attempt.map(<[u8]>::to_vec);
                self.rewrite(id, State::InFlight, retain, attempt.as_deref(), &c.journal);
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    fn release(&mut self, c: &Release) -> Reply {
        let Some(id) = self.lookup(&c.key) else {
            return Reply::Ok;
        };
        let rec = self.rec(id);
        let state = rec.state();
        if rec.fence != c.fence || matches!(state, State::Completed(_)) {
            return self.fenced();
        }
        self.wake |= state == State::InFlight;
        self.remove(id);
        Reply::Ok
    }

    fn abandon(&mut self, c: &Abandon) -> Reply {
        let now = self.now;
        let Some(id) = self.owned(&c.key, c.fence) else {
            return self.fenced();
        };
        let rec = self.rec(id);
        match rec.state() {
            State::Abandoned => Reply::Ok,
            State::Completed(_) => self.fenced(),
            State::InFlight => {
                rec.set_state(State::Abandoned);
                rec.set_recovered(false);
                rec.deadline = now.saturating_add(rec.retain_ms() as u64);
                self.aux.by_state[0] -= 1;
                self.aux.by_state[1] += 1;
                self.wake = true;
                Reply::Ok
            }
        }
    }

    fn inspect(&mut self, c: &Inspect) -> Reply {
        let now = self.now;
        let id = self.lookup(&c.key);
        Reply::Inspect(id.and_then(|id| self.slab.info(id, now)))
    }

    fn forget(&mut self, c: &Forget) -> Reply {
        let Some(id) = self.lookup(&c.key) else {
            return Reply::Frame(idem_protocol::Frame::Integer(0));
        };
        self.wake |= self.rec(id).state() == State::InFlight;
        self.remove(id);
        Reply::Frame(idem_protocol::Frame::Integer(1))
    }
}

#[cfg(test)]
mod tests;
