//! One lock's worth of the store: a slab of records and a hash index of
//! slot numbers into it.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use hashbrown::HashTable;
use idem_protocol::{RecordInfo, RecordState};

use super::record::{RECORD_OVERHEAD, Record, State};

/// Extra bytes charged for a body kept aside (map entry, `Bytes` header).
const LARGE_OVERHEAD: usize = 64;

/// Counters kept under the shard lock (no atomics on the hot path).
#[derive(Debug, Default, Clone, Copy)]
pub struct ShardStats {
    /// CLAIMs that acquired a key (fresh).
    pub acquired: u64,
    /// CLAIMs that took over an abandoned key (RECOVER).
    pub recovered: u64,
    /// CLAIMs answered with a stored outcome.
    pub replays: u64,
    /// CLAIMs answered INFLIGHT.
    pub conflicts: u64,
    /// Owner calls refused with FENCED.
    pub fenced: u64,
    /// Requests refused with MISMATCH.
    pub mismatches: u64,
    /// Leases that ran out.
    pub lapses: u64,
    /// Completed or abandoned records dropped at the end of retention.
    pub expired: u64,
    /// Records removed because their deadline passed: a lease that ran out
    /// under FREE, or the end of retention (Redis's `expired_keys`).
    pub dropped: u64,
    /// CLAIMs refused with OOM.
    pub oom: u64,
    /// Records completed.
    pub completed: u64,
}

impl ShardStats {
    pub(crate) fn add(&mut self, o: &ShardStats) {
        self.acquired += o.acquired;
        self.recovered += o.recovered;
        self.replays += o.replays;
        self.conflicts += o.conflicts;
        self.fenced += o.fenced;
        self.mismatches += o.mismatches;
        self.lapses += o.lapses;
        self.expired += o.expired;
        self.dropped += o.dropped;
        self.oom += o.oom;
        self.completed += o.completed;
    }
}

/// Bytes a record with `data_len` bytes of allocation costs, plus a large
/// body of the given length kept aside.
pub(crate) fn cost_of(data_len: usize, large_body: Option<usize>) -> usize {
    RECORD_OVERHEAD + data_len + large_body.map_or(0, |n| LARGE_OVERHEAD + n)
}

/// Slots per slab chunk. Chunks are allocated whole and never moved, so
/// growing the slab never copies records. They are shared copy-on-write
/// with snapshots ([`Slab::copy`]): the first change to a chunk after a
/// snapshot copies that chunk alone (256 records, some µs), so a snapshot
/// never holds applies back for long.
const CHUNK: usize = 256;

type Chunk = Arc<[Option<Record>]>;

/// The record in slot `id` of `chunks`.
fn slot(chunks: &[Chunk], id: u32) -> Option<&Record> {
    chunks.get(id as usize / CHUNK)?[id as usize % CHUNK].as_ref()
}

/// Records by slot number, with a free list, and the large bodies kept
/// aside by slot number.
#[derive(Default)]
pub(crate) struct Slab {
    chunks: Vec<Chunk>,
    /// Occupied slots of each chunk.
    used: Vec<u32>,
    free: Vec<u32>,
    len: usize,
    large: HashMap<u32, Bytes>,
}

/// A point-in-time copy of a slab's records, sharing its chunks until the
/// slab changes them.
pub(crate) struct SlabCopy {
    chunks: Vec<Chunk>,
    large: HashMap<u32, Bytes>,
    len: usize,
}

impl SlabCopy {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The records, with their slots.
    pub(crate) fn records(&self) -> impl Iterator<Item = (u32, &Record)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .filter_map(move |(i, r)| Some(((c * CHUNK + i) as u32, r.as_ref()?)))
        })
    }

    /// The large bodies, by slot.
    pub(crate) fn large_bodies(&self) -> impl Iterator<Item = (u32, &Bytes)> {
        self.large.iter().map(|(id, b)| (*id, b))
    }

    /// The record in slot `id`.
    pub(crate) fn get(&self, id: u32) -> Option<&Record> {
        slot(&self.chunks, id)
    }
}

impl Slab {
    pub(crate) fn get(&self, id: u32) -> Option<&Record> {
        slot(&self.chunks, id)
    }

    /// The slot, its chunk first copied if a snapshot still shares it.
    fn slot_mut(&mut self, id: u32) -> Option<&mut Option<Record>> {
        let chunk = self.chunks.get_mut(id as usize / CHUNK)?;
        Some(&mut Arc::make_mut(chunk)[id as usize % CHUNK])
    }

    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut Record> {
        self.slot_mut(id)?.as_mut()
    }

    /// A copy sharing every chunk (a reference count each) and the large
    /// bodies.
    pub(crate) fn copy(&self) -> SlabCopy {
        SlabCopy {
            chunks: self.chunks.clone(),
            large: self.large.clone(),
            len: self.len,
        }
    }

    pub(crate) fn insert(&mut self, rec: Record) -> u32 {
        self.len += 1;
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = (self.chunks.len() * CHUNK) as u32;
                self.chunks.push((0..CHUNK).map(|_| None).collect());
                self.used.push(0);
                self.free.extend((id + 1..id + CHUNK as u32).rev());
                id
            }
        };
        if let Some(slot) = self.slot_mut(id) {
            *slot = Some(rec);
        }
        self.used[id as usize / CHUNK] += 1;
        id
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<Record> {
        let rec = self.slot_mut(id)?.take()?;
        if rec.is_large() {
            self.large.remove(&id);
        }
        self.free.push(id);
        self.len -= 1;
        self.used[id as usize / CHUNK] -= 1;
        self.shrink();
        Some(rec)
    }

    /// Gives back the memory of records gone: once three quarters of the
    /// slots are free, the empty chunks at the end are dropped (the first
    /// is kept), with their free slots, and the side table and lists are
    /// cut to size. Amortized: a shrink that drops slots needs a quarter
    /// of them to be filled and emptied again before the next.
    fn shrink(&mut self) {
        let chunks = self.chunks.len();
        if chunks <= 1 || self.len * 4 >= chunks * CHUNK {
            return;
        }
        let mut keep = chunks;
        while keep > 1 && self.used[keep - 1] == 0 {
            keep -= 1;
        }
        if keep == chunks {
            return;
        }
        self.chunks.truncate(keep);
        self.used.truncate(keep);
        let limit = (keep * CHUNK) as u32;
        self.free.retain(|&id| id < limit);
        if self.chunks.capacity() > 2 * keep {
            self.chunks.shrink_to_fit();
            self.used.shrink_to_fit();
        }
        if self.free.capacity() > 2 * self.free.len().max(CHUNK) {
            self.free.shrink_to_fit();
        }
        if self.large.capacity() > 4 * self.large.len().max(16) {
            self.large.shrink_to_fit();
        }
    }

    /// Keeps `body` aside as the large body of slot `id`.
    pub(crate) fn set_large(&mut self, id: u32, body: Bytes) {
        self.large.insert(id, body);
    }

    /// Puts `rec` in occupied slot `id`; `large_body` is its body when the
    /// record is large and the body changed.
    pub(crate) fn replace(&mut self, id: u32, rec: Record, large_body: Option<Bytes>) {
        match large_body {
            Some(b) => {
                self.large.insert(id, b);
            }
            None if !rec.is_large() => {
                self.large.remove(&id);
            }
            None => {}
        }
        if let Some(slot) = self.slot_mut(id) {
            *slot = Some(rec);
        }
    }

    /// The body of slot `id`: shared when large, copied when small (a copy
    /// of a few hundred bytes is cheaper than sharing it).
    pub(crate) fn body(&self, id: u32) -> Bytes {
        match self.get(id) {
            Some(r) if r.is_large() => self.large.get(&id).cloned().unwrap_or_default(),
            Some(r) => Bytes::copy_from_slice(r.inline_body()),
            None => Bytes::new(),
        }
    }

    /// Bytes slot `id` is charged against the memory limit.
    pub(crate) fn cost(&self, id: u32) -> usize {
        match self.get(id) {
            Some(r) if r.is_large() => cost_of(
                r.data_len(),
                Some(self.large.get(&id).map_or(0, Bytes::len)),
            ),
            Some(r) => cost_of(r.data_len(), None),
            None => 0,
        }
    }

    /// What INSPECT shows of slot `id` at `now`, seen as being in `state`
    /// until `deadline` (a lapse not yet applied is shown as applied).
    pub(crate) fn info(
        &self,
        id: u32,
        state: State,
        deadline: u64,
        now: u64,
    ) -> Option<RecordInfo> {
        let r = self.get(id)?;
        let left = deadline.saturating_sub(now);
        let p = r.parts();
        let attempt = p.attempt.map(Bytes::copy_from_slice);
        let body = Some(self.body(id));
        let (state, lease_ms, retain_ms, outcome, value, journal, attempt) = match state {
            State::InFlight => (
                RecordState::InFlight,
                Some(left),
                None,
                None,
                None,
                body,
                attempt,
            ),
            State::Abandoned => (
                RecordState::Abandoned,
                None,
                Some(left),
                None,
                None,
                body,
                attempt,
            ),
            State::Completed(o) => (
                RecordState::Completed,
                None,
                Some(left),
                Some(o),
                body,
                None,
                None,
            ),
        };
        Some(RecordInfo {
            state,
            fence: r.fence,
            lease_ms,
            retain_ms,
            outcome,
            value,
            fingerprint: p.fingerprint.map(Bytes::copy_from_slice),
            journal,
            attempt,
        })
    }

    /// Number of slots (occupied or free).
    pub(crate) fn slots(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[derive(Default)]
pub(crate) struct Shard {
    /// Slot numbers (with hash bits), found by the key's hash.
    pub(crate) index: HashTable<super::IndexEntry>,
    pub(crate) slab: Slab,
    pub(crate) aux: Aux,
}

/// Everything of a shard beside its index and slab.
#[derive(Default)]
pub(crate) struct Aux {
    /// Records by state: in flight, abandoned, completed.
    pub(crate) by_state: [usize; 3],
    pub(crate) stats: ShardStats,
    /// Where the local search for expiry candidates resumes.
    pub(crate) cursor: usize,
}

pub(crate) fn state_index(s: State) -> usize {
    match s {
        State::InFlight => 0,
        State::Abandoned => 1,
        State::Completed(_) => 2,
    }
}
