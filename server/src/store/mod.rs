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
//! Records are found by one keyed hash: its bits 40 and up pick the shard,
//! the table uses the same hash for buckets (low bits) and tags (top bits).
//! Expiry is lazy (any access past a deadline sees the lapse) plus an
//! active sweep ([`Store::sweep`]) that does bounded work per shard per call.

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

use record::{RECORD_OVERHEAD, Record, State, own};
pub use shard::ShardStats;
use shard::{Aux, Shard, state_index};

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
        let sh = &mut *guard;
        let mut ctx = Ctx {
            store: self,
            table: &mut sh.table,
            aux: &mut sh.aux,
            hash,
            now,
            wake: false,
        };
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
        let wake = ctx.wake;
        if guard.needs_rebuild() {
            guard.rebuild_heap();
        }
        Applied { reply, wake }
    }

    /// Applies pending lapses of `key` at `now_ms`. Returns the lease time
    /// left if the key is still in flight, `None` if it is not.
    pub fn poke(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        let now = self.tick(now_ms);
        let hash = self.hash(key);
        let mut guard = self.shard(hash).lock();
        let sh = &mut *guard;
        let mut ctx = Ctx {
            store: self,
            table: &mut sh.table,
            aux: &mut sh.aux,
            hash,
            now,
            wake: false,
        };
        let rec = ctx.lookup(key)?;
        match rec.state {
            State::InFlight => Some(rec.deadline - now),
            _ => None,
        }
    }

    /// Expires records whose deadlines have passed, examining at most
    /// `budget` heap entries per shard. Returns how many entries were
    /// examined in all; a result of `budget * shards` or more means work is
    /// left.
    pub fn sweep(&self, now_ms: u64, budget: usize) -> usize {
        let now = self.tick(now_ms);
        let mut examined = 0;
        for shard in self.shards.iter() {
            let mut guard = shard.lock();
            let sh = &mut *guard;
            let mut n = 0;
            while n < budget {
                let Some(&std::cmp::Reverse((deadline, hash, fence))) = sh.aux.heap.peek() else {
                    break;
                };
                if deadline > now {
                    break;
                }
                sh.aux.heap.pop();
                n += 1;
                let Ok(entry) = sh.table.find_entry(hash, |r| r.fence == fence) else {
                    continue;
                };
                if entry.get().heap_at != deadline {
                    continue;
                }
                let rec = entry.into_mut();
                rec.heap_at = u64::MAX;
                if rec.deadline > now {
                    Shard::schedule(&mut sh.aux.heap, rec);
                    continue;
                }
                let key = rec.key.clone();
                let mut ctx = Ctx {
                    store: self,
                    table: &mut sh.table,
                    aux: &mut sh.aux,
                    hash,
                    now,
                    wake: false,
                };
                ctx.lookup(&key);
            }
            examined += n;
            if guard.needs_rebuild() {
                guard.rebuild_heap();
            }
        }
        examined
    }

    /// Number of records stored.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
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
            st.records += sh.table.len();
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

/// Finds the record of `key`, applying any deadline that has passed: a
/// lapsed lease frees the key (FREE) or abandons it (RECOVER); a completed
/// or abandoned record past retention is dropped. Sets `wake` on a lapse.
fn lookup<'t>(
    table: &'t mut HashTable<Record>,
    aux: &mut Aux,
    store: &Store,
    hash: u64,
    now: u64,
    wake: &mut bool,
    key: &[u8],
) -> Option<&'t mut Record> {
    let entry = table.find_entry(hash, |r| r.key == key).ok()?;
    let rec = entry.get();
    if rec.deadline > now {
        return Some(entry.into_mut());
    }
    let mut abandon = false;
    if rec.state == State::InFlight {
        *wake = true;
        aux.stats.lapses += 1;
        // Retention runs from the moment the lease ran out, whoever
        // notices it, so every replica computes the same deadline.
        abandon =
            rec.on_expire == OnExpire::Recover && rec.deadline.saturating_add(rec.retain_ms) > now;
    }
    if abandon {
        let rec = entry.into_mut();
        rec.deadline = rec.deadline.saturating_add(rec.retain_ms);
        rec.state = State::Abandoned;
        rec.recovered = false;
        Shard::schedule(&mut aux.heap, rec);
        aux.by_state[0] -= 1;
        aux.by_state[1] += 1;
        return Some(rec);
    }
    if rec.state != State::InFlight || rec.on_expire == OnExpire::Recover {
        aux.stats.expired += 1;
    }
    let (removed, _) = entry.remove();
    aux.by_state[state_index(removed.state)] -= 1;
    store.charge(removed.cost(), 0);
    None
}

/// Calls [`lookup`] borrowing only the fields it needs, so the record it
/// returns can be used beside the shard's heap and counters.
macro_rules! lookup {
    ($ctx:ident, $key:expr) => {
        lookup(
            &mut *$ctx.table,
            &mut *$ctx.aux,
            $ctx.store,
            $ctx.hash,
            $ctx.now,
            &mut $ctx.wake,
            $key,
        )
    };
}

/// One command's view of its shard.
struct Ctx<'a> {
    store: &'a Store,
    table: &'a mut HashTable<Record>,
    aux: &'a mut Aux,
    hash: u64,
    now: u64,
    wake: bool,
}

impl Ctx<'_> {
    /// Finds the record of `key`, applying any deadline that has passed:
    /// a lapsed lease frees the key (FREE) or abandons it (RECOVER); a
    /// completed or abandoned record past retention is dropped.
    fn lookup(&mut self, key: &[u8]) -> Option<&mut Record> {
        lookup(
            self.table,
            self.aux,
            self.store,
            self.hash,
            self.now,
            &mut self.wake,
            key,
        )
    }

    fn remove(&mut self, key: &[u8]) {
        if let Ok(entry) = self.table.find_entry(self.hash, |r| r.key == key) {
            let (removed, _) = entry.remove();
            self.aux.by_state[state_index(removed.state)] -= 1;
            self.store.charge(removed.cost(), 0);
        }
    }

    fn next_fence(&self) -> u64 {
        self.store.next_fence.fetch_add(1, Ordering::AcqRel)
    }

    fn claim(&mut self, c: &Claim) -> Reply {
        let now = self.now;
        let cfg = &self.store.cfg;
        let lease = c.lease_ms.unwrap_or(cfg.default_lease_ms);
        let retain = c.retain_ms.unwrap_or(cfg.default_retain_ms);
        let on_expire = c.on_expire.unwrap_or_default();
        let fp = c.fingerprint.as_ref();
        if let Some(rec) = lookup!(self, &c.key) {
            if rec.mismatches(fp) {
                self.aux.stats.mismatches += 1;
                return MISMATCH.into();
            }
            return match rec.state {
                State::InFlight => {
                    if c.attempt.is_some() && rec.attempt == c.attempt {
                        // A retry of the claim that owns the key.
                        if rec.recovered {
                            Reply::Claim(ClaimReply::Recover {
                                fence: rec.fence,
                                journal: rec.body.clone(),
                            })
                        } else {
                            Reply::Claim(ClaimReply::Acquired { fence: rec.fence })
                        }
                    } else {
                        let remaining_ms = rec.deadline - now;
                        self.aux.stats.conflicts += 1;
                        Reply::Claim(ClaimReply::InFlight { remaining_ms })
                    }
                }
                State::Completed(outcome) => {
                    let value = rec.body.clone();
                    self.aux.stats.replays += 1;
                    Reply::Claim(ClaimReply::Completed { outcome, value })
                }
                State::Abandoned => {
                    let fence = self.store.next_fence.fetch_add(1, Ordering::AcqRel);
                    let before = rec.cost();
                    rec.fence = fence;
                    rec.state = State::InFlight;
                    rec.deadline = now.saturating_add(lease);
                    rec.heap_at = u64::MAX;
                    rec.attempt = c.attempt.as_ref().map(own);
                    rec.on_expire = on_expire;
                    rec.retain_ms = retain;
                    rec.recovered = true;
                    let journal = rec.body.clone();
                    let after = rec.cost();
                    Shard::schedule(&mut self.aux.heap, rec);
                    self.aux.by_state[1] -= 1;
                    self.aux.by_state[0] += 1;
                    self.aux.stats.recovered += 1;
                    self.store.charge(before, after);
                    Reply::Claim(ClaimReply::Recover { fence, journal })
                }
            };
        }
        let cost = RECORD_OVERHEAD
            + c.key.len()
            + fp.map_or(0, Bytes::len)
            + c.attempt.as_ref().map_or(0, Bytes::len);
        if self.store.memory.load(Ordering::Relaxed) + cost > cfg.max_memory_bytes {
            self.aux.stats.oom += 1;
            return OOM.into();
        }
        let fence = self.next_fence();
        let mut rec = Record {
            key: own(&c.key),
            hash: self.hash,
            fence,
            state: State::InFlight,
            deadline: now.saturating_add(lease),
            heap_at: u64::MAX,
            body: Bytes::new(),
            fingerprint: fp.map(own),
            attempt: c.attempt.as_ref().map(own),
            on_expire,
            retain_ms: retain,
            recovered: false,
        };
        Shard::schedule(&mut self.aux.heap, &mut rec);
        self.store.charge(0, rec.cost());
        let hasher = |r: &Record| r.hash;
        self.table.insert_unique(self.hash, rec, hasher);
        self.aux.by_state[0] += 1;
        self.aux.stats.acquired += 1;
        Reply::Claim(ClaimReply::Acquired { fence })
    }

    fn settle(&mut self, c: &Settle) -> Reply {
        let now = self.now;
        Reply::Settle(match lookup!(self, &c.key) {
            None => SettleReply::Absent,
            Some(rec) => match rec.state {
                State::InFlight => SettleReply::InFlight {
                    remaining_ms: rec.deadline - now,
                },
                State::Abandoned => SettleReply::Abandoned {
                    journal: rec.body.clone(),
                },
                State::Completed(outcome) => SettleReply::Completed {
                    outcome,
                    value: rec.body.clone(),
                },
            },
        })
    }

    fn fenced(&mut self) -> Reply {
        self.aux.stats.fenced += 1;
        FENCED.into()
    }

    fn complete(&mut self, c: &Complete) -> Reply {
        let now = self.now;
        let Some(rec) = lookup!(self, &c.key) else {
            return self.fenced();
        };
        if rec.fence != c.fence {
            return self.fenced();
        }
        let from = match rec.state {
            // A retry of the COMPLETE that already landed: change nothing.
            State::Completed(_) => return Reply::Ok,
            State::InFlight => 0,
            // The owner's lease lapsed under RECOVER (or it abandoned) and
            // nobody took over: the outcome it reports is still the truth.
            State::Abandoned => 1,
        };
        let before = rec.cost();
        let outcome = if c.error { Outcome::Err } else { Outcome::Ok };
        rec.state = State::Completed(outcome);
        rec.body = own(&c.value);
        rec.attempt = None;
        rec.deadline = now.saturating_add(c.retain_ms.unwrap_or(rec.retain_ms));
        let after = rec.cost();
        Shard::schedule(&mut self.aux.heap, rec);
        self.aux.by_state[from] -= 1;
        self.aux.by_state[2] += 1;
        self.aux.stats.completed += 1;
        self.store.charge(before, after);
        self.wake = true;
        Reply::Ok
    }

    fn renew(&mut self, c: &Renew) -> Reply {
        let now = self.now;
        match lookup!(self, &c.key) {
            Some(rec) if rec.fence == c.fence && rec.state == State::InFlight => {
                rec.deadline = now.saturating_add(c.lease_ms);
                Shard::schedule(&mut self.aux.heap, rec);
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    fn journal(&mut self, c: &Journal) -> Reply {
        match lookup!(self, &c.key) {
            Some(rec) if rec.fence == c.fence && rec.state == State::InFlight => {
                let before = rec.cost();
                rec.body = own(&c.journal);
                let after = rec.cost();
                self.store.charge(before, after);
                Reply::Ok
            }
            _ => self.fenced(),
        }
    }

    fn release(&mut self, c: &Release) -> Reply {
        match lookup!(self, &c.key) {
            None => Reply::Ok,
            Some(rec) if rec.fence == c.fence && !matches!(rec.state, State::Completed(_)) => {
                self.wake = rec.state == State::InFlight;
                self.remove(&c.key);
                Reply::Ok
            }
            Some(_) => self.fenced(),
        }
    }

    fn abandon(&mut self, c: &Abandon) -> Reply {
        let now = self.now;
        match lookup!(self, &c.key) {
            Some(rec) if rec.fence == c.fence => match rec.state {
                State::Abandoned => Reply::Ok,
                State::Completed(_) => self.fenced(),
                State::InFlight => {
                    rec.state = State::Abandoned;
                    rec.recovered = false;
                    rec.deadline = now.saturating_add(rec.retain_ms);
                    Shard::schedule(&mut self.aux.heap, rec);
                    self.aux.by_state[0] -= 1;
                    self.aux.by_state[1] += 1;
                    self.wake = true;
                    Reply::Ok
                }
            },
            _ => self.fenced(),
        }
    }

    fn inspect(&mut self, c: &Inspect) -> Reply {
        let now = self.now;
        Reply::Inspect(lookup!(self, &c.key).map(|r| r.info(now)))
    }

    fn forget(&mut self, c: &Forget) -> Reply {
        let in_flight = match lookup!(self, &c.key) {
            None => return Reply::Frame(idem_protocol::Frame::Integer(0)),
            Some(rec) => rec.state == State::InFlight,
        };
        self.remove(&c.key);
        self.wake |= in_flight;
        Reply::Frame(idem_protocol::Frame::Integer(1))
    }
}

#[cfg(test)]
mod tests;
