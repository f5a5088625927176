//! Choosing what to expire. The search is node-local (a cursor over each
//! shard's slab, bounded per call); what it finds is only proposed, as an
//! [`Op::Expire`](super::Op::Expire) of those keys, which every replica
//! applies at the same point of its history, re-checking each deadline.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::Store;

/// What one search found.
#[derive(Debug, Default)]
pub struct Candidates {
    /// Keys whose deadline has passed.
    pub keys: Vec<Bytes>,
    /// More are likely due: search again after applying these.
    pub more: bool,
    /// Slots examined (the search's work).
    pub examined: usize,
}

impl Store {
    /// Keys whose deadline has passed at `now_ms`: each shard's slab is
    /// walked from where the last search stopped, examining at most
    /// `scan_per_shard` slots per shard; at most `max` keys are returned.
    /// A search starts in the shard the previous one stopped in: starting
    /// each in the first shard walked again, every time, the shards whose
    /// due records earlier searches had already taken.
    /// Changes nothing but the (node-local) cursors.
    pub fn expiry_candidates(&self, now_ms: u64, scan_per_shard: usize, max: usize) -> Candidates {
        let (mut seen, mut found) = (0usize, Candidates::default());
        let n = self.shards.len();
        let first = self.expiry_shard.load(Ordering::Relaxed) % n;
        for turn in 0..n {
            let at = (first + turn) % n;
            let mut guard = self.shards[at].lock();
            let sh = &mut *guard;
            let slots = sh.slab.slots();
            if sh.slab.len() == 0 {
                continue;
            }
            for _ in 0..scan_per_shard.min(slots) {
                if found.keys.len() >= max {
                    break;
                }
                let id = (sh.aux.cursor % slots) as u32;
                sh.aux.cursor = (sh.aux.cursor + 1) % slots;
                found.examined += 1;
                let Some(rec) = sh.slab.get(id) else { continue };
                seen += 1;
                if rec.deadline <= now_ms {
                    found.keys.push(Bytes::copy_from_slice(rec.key()));
                }
            }
            if found.keys.len() >= max {
                // This shard may hold more: the next search starts here.
                found.more = true;
                self.expiry_shard.store(at, Ordering::Relaxed);
                break;
            }
        }
        found.more |= seen > 0 && found.keys.len() * 4 > seen;
        found
    }
}
