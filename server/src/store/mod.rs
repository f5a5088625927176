//! The store: a deterministic, lock-sharded state machine of records.
//!
//! The store is changed only by applying [`Op`]s (in [`Entry`]s), each
//! stamped with a time by the node that proposed it. Applying reads no
//! clock, draws no random numbers and reads no node configuration (the
//! defaults are resolved into the op; the memory limits are replicated
//! state set by [`Op::SetLimits`]), so replicas applying the same entries in
//! the same order reach the same state and give the same replies. Reads
//! ([`Store::read`]) never change anything: a deadline that has passed is
//! shown as applied and reported (`due`), and applied later by an
//! [`Op::Expire`] of the key, so records are freed at the same point of
//! every replica's history.
//!
//! Time: the store keeps `clock = max(clock, stamp_ms)`, so time never runs
//! backwards even if the stamps do. Fences come from one counter advanced
//! by every grant of ownership, so they strictly increase. Every key an op
//! touches takes the next number of one apply sequence (the op's *index*):
//! waiters compare it with the index at which they saw the key in flight.
//!
//! Admission at the memory limit: a fresh CLAIM that would take the store
//! over `max_memory_bytes` gets `-OOM`; an owner's COMPLETE or JOURNAL, and
//! a take-over of an abandoned key, that grow the store are admitted up to
//! `max_memory_bytes + headroom_bytes` and get `-OOM` beyond; RENEW,
//! RELEASE, ABANDON, FORGET and expiry are never refused.
//!
//! Layout: records live in a per-shard slab of 40-byte slots (key,
//! fingerprint, attempt and small bodies share one allocation); an index of
//! slot numbers finds them by one keyed hash: its bits 40 and up pick the
//! shard, its low 32 bits are kept in the index entry and give the index its
//! buckets and tags, so the index grows without reading a record. The hash
//! seed and the shard count decide only where a record lives: replies,
//! events and [`Store::snapshot`] (written in key order) do not depend on
//! them.

pub mod codec;
mod expiry;
mod op;
mod record;
mod rules;
mod shard;
mod snapshot;

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use foldhash::SharedSeed;
use foldhash::fast::SeedableRandomState;
use hashbrown::HashTable;
use idem_protocol::{ClaimReply, ErrorCode, Frame, OnExpire, Reply, ServerError, SettleReply};
use parking_lot::Mutex;

pub use expiry::Candidates;
pub use op::{
    Applied, ClaimOp, Defaults, Entry, KeyEvent, KeyEvents, MemoryLimits, Observed, Op, Read,
};
use record::State;
use rules::Ctx;
pub use shard::ShardStats;
use shard::{Shard, Slab, state_index};
pub use snapshot::{SNAPSHOT_VERSION, SnapshotCopy, SnapshotError, check_snapshot_from};

/// Records a scan looks at under one hold of a shard's lock (some tens of
/// µs): applies wait no longer than that for a scan.
pub const SCAN_BATCH: usize = 1024;

/// The fewest live records a SCAN step for a user confined to some keys
/// copies under a shard's lock at a time (see [`Store::scan`]).
pub const SCAN_MIN_CONFINED_BATCH: usize = 64;

/// A test a SCAN step applies to a key (see [`Store::scan`]).
pub type KeyTest<'a> = &'a dyn Fn(&[u8]) -> bool;

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

/// How a store is laid out in memory (node-local: it never changes what
/// the store answers).
#[derive(Debug, Clone, Default)]
pub struct StoreConfig {
    /// Number of shards (rounded up to a power of two; 0 means 1).
    pub shards: usize,
    /// The hash seed; `None` draws a random one (HashDoS).
    pub seed: Option<u64>,
}

/// A summary for INFO.
#[derive(Debug, Default, Clone, Copy)]
pub struct StoreStats {
    /// Records stored (including ones past their deadline not yet expired).
    pub records: usize,
    /// Records in flight.
    pub in_flight: usize,
    /// Records abandoned.
    pub abandoned: usize,
    /// Records completed.
    pub completed: usize,
    /// Accounted bytes.
    pub memory: u64,
    /// The memory limits in force.
    pub limits: Option<MemoryLimits>,
    /// Event counters (node-local, not replicated).
    pub counters: ShardStats,
    /// The store clock (ms).
    pub clock: u64,
    /// The last fence handed out.
    pub last_fence: u64,
    /// The last apply index.
    pub applied_index: u64,
}

/// The sharded record store. Share it behind an `Arc`.
pub struct Store {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    mask: usize,
    hasher: SeedableRandomState,
    clock: AtomicU64,
    next_fence: AtomicU64,
    /// The last apply index handed out.
    seq: AtomicU64,
    memory: AtomicU64,
    max_memory: AtomicU64,
    headroom: AtomicU64,
    /// The shard the next search for expiry candidates starts in (where
    /// the last one stopped). Node-local.
    expiry_shard: AtomicUsize,
}

fn shared_seed() -> &'static SharedSeed {
    static SEED: OnceLock<SharedSeed> = OnceLock::new();
    SEED.get_or_init(|| SharedSeed::from_u64(RandomState::new().hash_one(0x1de3_u64)))
}

impl Store {
    /// An empty store, without memory limits until [`Op::SetLimits`].
    pub fn new(cfg: StoreConfig) -> Self {
        let n = cfg.shards.max(1).next_power_of_two();
        let shards = (0..n)
            .map(|_| CachePadded::new(Mutex::new(Shard::default())))
            .collect();
        let seed = cfg
            .seed
            .unwrap_or_else(|| RandomState::new().hash_one(0x5eed_u64));
        Store {
            shards,
            mask: n - 1,
            hasher: SeedableRandomState::with_seed(seed, shared_seed()),
            clock: AtomicU64::new(0),
            next_fence: AtomicU64::new(1),
            seq: AtomicU64::new(0),
            memory: AtomicU64::new(0),
            max_memory: AtomicU64::new(MemoryLimits::UNLIMITED.max_memory_bytes),
            headroom: AtomicU64::new(MemoryLimits::UNLIMITED.headroom_bytes),
            expiry_shard: AtomicUsize::new(0),
        }
    }

    /// Sets the fence counter back by `n` (never below 1), so fences are
    /// handed out again: a deliberately broken store, for showing that the
    /// crash tests catch fence reuse. Debug builds only.
    #[cfg(debug_assertions)]
    #[doc(hidden)]
    pub fn unsafe_rewind_fences(&self, n: u64) {
        let next = self.next_fence.load(Ordering::Acquire);
        self.next_fence
            .store(next.saturating_sub(n).max(1), Ordering::Release);
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Which shard holds keys of `hash`.
    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 40) as usize & self.mask
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)]
    }

    /// The store clock: the latest stamp applied, ms.
    pub fn clock_ms(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    fn tick(&self, now_ms: u64) -> u64 {
        self.clock.fetch_max(now_ms, Ordering::AcqRel).max(now_ms)
    }

    /// The next apply index (taken under the lock of the key it numbers,
    /// so a key's changes are numbered in the order they happen).
    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn memory(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    /// The memory limits in force.
    pub fn limits(&self) -> MemoryLimits {
        MemoryLimits {
            max_memory_bytes: self.max_memory.load(Ordering::Relaxed),
            headroom_bytes: self.headroom.load(Ordering::Relaxed),
        }
    }

    /// Applies an entry: its ops in order, all at the entry's stamp.
    pub fn apply(&self, entry: &Entry) -> Vec<Applied> {
        entry
            .ops
            .iter()
            .map(|op| self.apply_op(entry.stamp_ms, op))
            .collect()
    }

    /// Applies one op stamped `stamp_ms`: an entry of that op alone.
    pub fn apply_op(&self, stamp_ms: u64, op: &Op) -> Applied {
        let now = self.tick(stamp_ms);
        match op {
            Op::Expire { keys } => {
                let mut events = KeyEvents::new();
                let mut changed = 0;
                let mut index = 0;
                for key in keys {
                    let hash = self.hash(key);
                    let mut guard = self.shard(hash).lock();
                    index = self.next_seq();
                    let mut ctx = Ctx::new(self, &mut guard, hash, now, index);
                    changed += i64::from(ctx.expire(key));
                    events.extend(ctx.events(key));
                }
                if keys.is_empty() {
                    index = self.next_seq();
                }
                Applied {
                    reply: Reply::Frame(Frame::Integer(changed)),
                    events,
                    index,
                }
            }
            Op::SetLimits(l) => {
                self.max_memory.store(l.max_memory_bytes, Ordering::Relaxed);
                self.headroom.store(l.headroom_bytes, Ordering::Relaxed);
                Applied {
                    reply: Reply::Ok,
                    events: KeyEvents::new(),
                    index: self.next_seq(),
                }
            }
            Op::Claim(_)
            | Op::Complete(_)
            | Op::Renew(_)
            | Op::Journal(_)
            | Op::Release(_)
            | Op::Abandon(_)
            | Op::Forget(_) => {
                let Some(key) = op.key() else {
                    return Applied {
                        reply: Reply::Error(ServerError::new(ErrorCode::Err, "op without a key")),
                        events: KeyEvents::new(),
                        index: self.next_seq(),
                    };
                };
                let hash = self.hash(key);
                let mut guard = self.shard(hash).lock();
                let index = self.next_seq();
                let mut ctx = Ctx::new(self, &mut guard, hash, now, index);
                let reply = match op {
                    Op::Claim(c) => ctx.claim(c),
                    Op::Complete(c) => ctx.complete(c),
                    Op::Renew(c) => ctx.renew(c),
                    Op::Journal(c) => ctx.journal(c),
                    Op::Release(c) => ctx.release(c),
                    Op::Abandon(c) => ctx.abandon(c),
                    Op::Forget(c) => ctx.forget(c),
                    Op::Expire { .. } | Op::SetLimits(_) => Reply::Ok,
                };
                Applied {
                    reply,
                    events: ctx.events(key),
                    index,
                }
            }
        }
    }

    /// Answers a read from the store as it is at `now_ms`, changing
    /// nothing of the replicated state (only node-local counters).
    pub fn read(&self, read: Read<'_>, now_ms: u64) -> Observed {
        let key = match read {
            Read::Settle(k) | Read::Inspect(k) => k,
            Read::Claim(c) => &c.key,
        };
        let now = self.clock.load(Ordering::Acquire).max(now_ms);
        let hash = self.hash(key);
        let mut guard = self.shard(hash).lock();
        let index = self.seq.load(Ordering::Acquire);
        let sh = &mut *guard;
        let found = find(&sh.index, &sh.slab, hash, key);
        let view = found.and_then(|id| Some((id, view(sh.slab.get(id)?, now))));
        let due = matches!(view, Some((_, v)) if v.due);
        let seen = view.and_then(|(id, v)| Some((id, v.state?, v.deadline)));
        let reply = match read {
            Read::Settle(_) => Some(Reply::Settle(match seen {
                None => SettleReply::Absent,
                Some((_, State::InFlight, deadline)) => SettleReply::InFlight {
                    remaining_ms: deadline - now,
                },
                Some((id, State::Abandoned, _)) => SettleReply::Abandoned {
                    journal: sh.slab.body(id),
                },
                Some((id, State::Completed(outcome), _)) => SettleReply::Completed {
                    outcome,
                    value: sh.slab.body(id),
                },
            })),
            Read::Inspect(_) => Some(Reply::Inspect(seen.and_then(|(id, state, deadline)| {
                sh.slab.info(id, state, deadline, now).map(Box::new)
            }))),
            Read::Claim(c) => peek_claim(sh, seen, c, now),
        };
        Observed { reply, due, index }
    }

    /// One step of a walk over the records (`SCAN`): from `cursor` (0 to
    /// start), the keys of the records live at `now_ms` that the caller
    /// may see (`visible`; `None`: all) and `matches` accepts, among at
    /// most `count` records looked at (fewer once `until` has passed), and
    /// the cursor to go on from (0 once the walk is done). With `visible`
    /// given, only the live records it accepts count toward `count`, and
    /// `matches` (a client's pattern, whose cost the client chooses) never
    /// sees the others' keys, so no pattern times them. The cursor is a
    /// slot position, so the distance between two still shows roughly how
    /// many slots lie between, and a call's time grows with the records it
    /// skips. A record that is there for the whole walk is returned
    /// exactly once: a record keeps its slot for life (until the store is
    /// rebuilt from a snapshot), and the cursor (shard << 32 | slot) only
    /// moves forward. Under a shard's lock the walk only copies keys, at
    /// most [`SCAN_BATCH`] records and four times as many slots at a time;
    /// `visible` and `matches` run with no lock held, and the time is
    /// checked after each record.
    pub fn scan(
        &self,
        cursor: u64,
        count: usize,
        now_ms: u64,
        until: std::time::Instant,
        visible: Option<KeyTest<'_>>,
        matches: KeyTest<'_>,
    ) -> (u64, Vec<bytes::Bytes>) {
        let now = self.clock.load(Ordering::Acquire).max(now_ms);
        let count = count.max(1);
        let (mut shard, mut slot) = ((cursor >> 32) as usize, cursor & u64::from(u32::MAX));
        let at = |shard: usize, slot: u64| (shard as u64) << 32 | slot;
        let mut keys = Vec::new();
        let mut looked = 0;
        let mut live: Vec<(u64, bytes::Bytes)> = Vec::new();
        while shard < self.shards.len() {
            live.clear();
            let end = {
                let sh = self.shards[shard].lock();
                let end = sh.slab.slots() as u64;
                let (mut batch, mut visited) = (0, 0);
                // Every record counts when all are visible; otherwise only
                // the visible ones, known once the lock is let go: as many
                // live records as could still count (a few dozen at least,
                // so that a small COUNT does not take the lock per record).
                let want = count
                    .saturating_sub(looked)
                    .clamp(SCAN_MIN_CONFINED_BATCH, SCAN_BATCH);
                while slot < end
                    && batch < SCAN_BATCH
                    && visited < 4 * SCAN_BATCH
                    && match visible {
                        None => looked < count,
                        Some(_) => live.len() < want,
                    }
                {
                    if let Some(rec) = sh.slab.get(slot as u32) {
                        batch += 1;
                        if visible.is_none() {
                            looked += 1;
                        }
                        if view(rec, now).state.is_some() {
                            live.push((slot, bytes::Bytes::copy_from_slice(rec.key())));
                        }
                    }
                    slot += 1;
                    visited += 1;
                }
                end
            };
            for (i, (s, key)) in live.iter().enumerate() {
                let seen = visible.is_none_or(|v| v(key));
                if seen && matches(key) {
                    keys.push(key.clone());
                }
                if seen && visible.is_some() {
                    looked += 1;
                    if looked >= count && i + 1 < live.len() {
                        // The rest of this batch comes next call.
                        return (at(shard, s + 1), keys);
                    }
                }
                if i + 1 < live.len() && std::time::Instant::now() >= until {
                    // Out of time: the rest of this batch comes next call.
                    return (at(shard, s + 1), keys);
                }
            }
            if slot >= end {
                shard += 1;
                slot = 0;
            }
            if looked >= count || std::time::Instant::now() >= until {
                break;
            }
        }
        if shard >= self.shards.len() {
            return (0, keys);
        }
        (at(shard, slot), keys)
    }

    /// Number of records stored (including ones past their deadline that
    /// no `Op::Expire` has reached yet).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slab.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets go of the memory of shards left empty: the slab chunk and the
    /// small index a shard keeps while it churns (so a shard going between
    /// zero and one record does not allocate each time) are dropped once
    /// the server is quiet. A shard's kept chunk alone (10 KB) pins a whole
    /// allocator page, which a burst may have filled with records long
    /// gone. Changes no record: replicas need not agree on it.
    pub fn trim(&self) {
        for shard in self.shards.iter() {
            let mut sh = shard.lock();
            if sh.slab.len() == 0 {
                sh.slab = shard::Slab::default();
                sh.index = hashbrown::HashTable::new();
                sh.aux.cursor = 0;
            }
        }
    }

    /// Counters and sizes for INFO.
    pub fn stats(&self) -> StoreStats {
        let mut st = StoreStats {
            memory: self.memory(),
            limits: Some(self.limits()),
            clock: self.clock.load(Ordering::Relaxed),
            last_fence: self.next_fence.load(Ordering::Relaxed) - 1,
            applied_index: self.seq.load(Ordering::Relaxed),
            ..StoreStats::default()
        };
        for shard in self.shards.iter() {
            let sh = shard.lock();
            st.records += sh.slab.len();
            st.in_flight += sh.aux.by_state[state_index(State::InFlight)];
            st.abandoned += sh.aux.by_state[state_index(State::Abandoned)];
            st.completed +=
                sh.aux.by_state[state_index(State::Completed(idem_protocol::Outcome::Ok))];
            st.counters.add(&sh.aux.stats);
        }
        st
    }

    /// Sets the counters ([`StoreStats::counters`]) back to zero.
    pub fn reset_counters(&self) {
        for shard in self.shards.iter() {
            shard.lock().aux.stats = ShardStats::default();
        }
    }

    fn charge(&self, before: usize, after: usize) {
        if after > before {
            self.memory
                .fetch_add((after - before) as u64, Ordering::Relaxed);
        } else {
            self.memory
                .fetch_sub((before - after) as u64, Ordering::Relaxed);
        }
    }
}

/// What a record looks like at `now` once its passed deadline is applied.
#[derive(Debug, Clone, Copy)]
struct View {
    /// `None`: gone.
    state: Option<State>,
    deadline: u64,
    /// A deadline has passed that is not applied yet.
    due: bool,
}

fn view(rec: &record::Record, now: u64) -> View {
    let state = rec.state();
    if rec.deadline > now {
        return View {
            state: Some(state),
            deadline: rec.deadline,
            due: false,
        };
    }
    if state == State::InFlight && rec.on_expire() == OnExpire::Recover {
        let until = rec.deadline.saturating_add(rec.retain_ms() as u64);
        if until > now {
            return View {
                state: Some(State::Abandoned),
                deadline: until,
                due: true,
            };
        }
    }
    View {
        state: None,
        deadline: rec.deadline,
        due: true,
    }
}

/// What a CLAIM would answer from the state seen, if it would change
/// nothing; `None` if it would take the key (or extend its own lease).
fn peek_claim(
    sh: &mut Shard,
    seen: Option<(u32, State, u64)>,
    c: &ClaimOp,
    now: u64,
) -> Option<Reply> {
    let (id, state, deadline) = seen?;
    let rec = sh.slab.get(id)?;
    if rec.mismatches(c.fingerprint.as_ref()) {
        sh.aux.stats.mismatches += 1;
        return Some(MISMATCH.into());
    }
    match state {
        State::InFlight if rec.attempt_is(c.attempt.as_ref()) => None,
        State::InFlight => {
            sh.aux.stats.conflicts += 1;
            Some(Reply::Claim(ClaimReply::InFlight {
                remaining_ms: deadline - now,
            }))
        }
        State::Completed(outcome) => {
            sh.aux.stats.replays += 1;
            Some(Reply::Claim(ClaimReply::Completed {
                outcome,
                value: sh.slab.body(id),
            }))
        }
        State::Abandoned => None,
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

/// The slot of `key` (whose keyed hash is `hash`) in a shard's index.
fn find(index: &HashTable<IndexEntry>, slab: &Slab, hash: u64, key: &[u8]) -> Option<u32> {
    let h32 = hash as u32;
    index
        .find(table_hash(h32), |&(id, h)| {
            h == h32 && slab.get(id).is_some_and(|r| r.key() == key)
        })
        .map(|&(id, _)| id)
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
