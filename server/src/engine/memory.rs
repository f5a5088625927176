//! The memory engine: each op is an entry of its own, stamped with the
//! node's clock and applied at once, concurrently across the store's
//! shards. Nothing survives a restart.

use crate::store::{Applied, Op, Store, StoreConfig};

/// The store, applied directly.
pub(super) struct MemoryEngine {
    pub(super) store: Store,
}

impl MemoryEngine {
    pub(super) fn new(cfg: StoreConfig) -> Self {
        MemoryEngine {
            store: Store::new(cfg),
        }
    }

    pub(super) fn apply(&self, stamp_ms: u64, op: &Op) -> Applied {
        self.store.apply_op(stamp_ms, op)
    }
}
