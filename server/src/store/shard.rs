//! One lock's worth of the store: a hash table of records and a heap of
//! their deadlines.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashbrown::HashTable;

use super::record::{Record, State};

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
        self.oom += o.oom;
        self.completed += o.completed;
    }
}

/// A deadline in the heap: `(deadline, hash, fence)`; the fence tells the
/// record it was pushed for from a later record of the same key.
pub(crate) type HeapEntry = Reverse<(u64, u64, u64)>;

#[derive(Default)]
pub(crate) struct Shard {
    pub(crate) table: HashTable<Record>,
    pub(crate) aux: Aux,
}

/// Everything of a shard beside its table (borrowed separately from it).
#[derive(Default)]
pub(crate) struct Aux {
    pub(crate) heap: BinaryHeap<HeapEntry>,
    /// Records by state: in flight, abandoned, completed.
    pub(crate) by_state: [usize; 3],
    pub(crate) stats: ShardStats,
}

pub(crate) fn state_index(s: State) -> usize {
    match s {
        State::InFlight => 0,
        State::Abandoned => 1,
        State::Completed(_) => 2,
    }
}

impl Shard {
    /// Schedules `rec`'s deadline in the heap if it is earlier than the
    /// entry it already has. A later deadline needs no entry: when the
    /// earlier one pops, the sweep pushes the current deadline. Stale entries
    /// (records gone or rescheduled) are dropped when they pop.
    pub(crate) fn schedule(heap: &mut BinaryHeap<HeapEntry>, rec: &mut Record) {
        if rec.deadline < rec.heap_at {
            rec.heap_at = rec.deadline;
            heap.push(Reverse((rec.deadline, rec.hash, rec.fence)));
        }
    }

    /// Rebuilds the heap from the table: one entry per record.
    pub(crate) fn rebuild_heap(&mut self) {
        self.aux.heap.clear();
        for rec in self.table.iter_mut() {
            rec.heap_at = rec.deadline;
            self.aux
                .heap
                .push(Reverse((rec.deadline, rec.hash, rec.fence)));
        }
    }

    /// Whether stale entries outnumber live ones; rebuilding then keeps the
    /// heap within about twice the table whatever clients do, at amortized
    /// constant cost per push.
    pub(crate) fn needs_rebuild(&self) -> bool {
        self.aux.heap.len() > 2 * self.table.len() + 64
    }
}
