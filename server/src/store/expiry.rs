//! Choosing what to expire. The search is node-local (a cursor over each
//! shard's slab, bounded per call); what it finds is only proposed, as an
//! [`Op::Expire`](super::Op::Expire) of those keys, which every replica
//! applies at the same point of its history, re-checking each deadline.

use bytes::Bytes;

use super::Store;

/// What one search found.
#[derive(Debug, Default)]
pub struct Candidates {
    /// Keys whose deadline has passed.
    pub keys: Vec<Bytes>,
    /// More are likely due: search again after applying these.
    pub more: bool,
}

impl Store {
    /// Keys whose deadline has passed at `now_ms`: each shard's slab is
    /// walked from where the last search stopped, examining at most
    /// `scan_per_shard` slots per shard; at most `max` keys are returned.
    /// Changes nothing but the (node-local) cursors.
    pub fn expiry_candidates(&self, now_ms: u64, scan_per_shard: usize, max: usize) -> Candidates {
        let (mut seen, mut found) = (0usize, Candidates::default());
        for shard in self.shards.iter() {
            if found.keys.len() >= max {
                found.more = true;
                break;
            }
            let mut guard = shard.lock();
            let sh = &mut *guard;
            let slots = sh.slab.slots();
            if sh.slab.len() == 0 {
                continue;
            }
            for _ in 0..scan_per_shard.min(slots) {
                if found.keys.len() >= max {
                    found.more = true;
                    break;
                }
                let id = (sh.aux.cursor % slots) as u32;
                sh.aux.cursor = (sh.aux.cursor + 1) % slots;
                let Some(rec) = sh.slab.get(id) else { continue };
                seen += 1;
                if rec.deadline <= now_ms {
                    found.keys.push(Bytes::copy_from_slice(rec.key()));
                }
            }
        }
        found.more |= seen > 0 && found.keys.len() * 4 > seen;
        found
    }
}
