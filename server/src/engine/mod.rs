//! Engines execute record commands against the store.
//!
//! `memory` (the only engine so far) stamps each command with the node's
//! clock and applies it directly: nothing survives a restart. A replicated
//! engine will stamp and order commands through a log and apply them on
//! every replica; callers already go through this type only.

use idem_protocol::Command;

use crate::clock::Clock;
use crate::config::EngineKind;
use crate::store::{Applied, Store, StoreConfig, StoreStats};

/// The engine of a node.
pub struct Engine {
    kind: EngineKind,
    store: Store,
    clock: Clock,
}

impl Engine {
    /// An in-memory engine.
    pub fn memory(cfg: StoreConfig) -> Self {
        Engine {
            kind: EngineKind::Memory,
            store: Store::new(cfg),
            clock: Clock::new(),
        }
    }

    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    /// The node's clock reading now.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Applies a record command now.
    pub fn apply(&self, cmd: &Command) -> Applied {
        self.store.apply(cmd, self.clock.now_ms())
    }

    /// Applies due lapses of `key`; the lease left if it is still in flight.
    pub fn poke(&self, key: &[u8]) -> Option<u64> {
        self.store.poke(key, self.clock.now_ms())
    }

    /// One bounded expiry pass; true if more expired records are likely.
    pub fn sweep(&self, batch: usize) -> bool {
        self.store.sweep(self.clock.now_ms(), batch)
    }

    /// Records stored.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no record is stored.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }
}
