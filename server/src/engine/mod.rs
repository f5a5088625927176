//! Engines: how ops reach the store.
//!
//! [`Engine::submit`] takes a replicated [`Op`], stamps it with the node's
//! clock, orders it and applies it, and resolves to what applying it
//! returned. The `memory` engine applies at once and returns a ready
//! future; a replicated engine resolves once the entry is committed and
//! applied. The op is proposed when `submit` is called: dropping the future
//! drops only the reply. Reads ([`Engine::read`]) are served from the local
//! store and never change it.
//!
//! Every applied op's key events (keys that left the in-flight state) are
//! published, in apply order, to the subscribed [`EventSink`] (the
//! waiters), outside every store lock. Expiry is proposed here too: a local
//! search picks keys whose deadline passed and submits `Op::Expire` for
//! them, so memory is freed at the same point of every replica's history.

mod memory;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use idem_protocol::{ErrorCode, ServerError};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::EngineKind;
use crate::store::{Applied, KeyEvent, Observed, Op, Read, StoreConfig, StoreStats};
use memory::MemoryEngine;

/// Why an op could not be applied here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Another node leads: send writes there (Redis Cluster's redirect).
    #[error("MOVED {slot} {addr}")]
    Moved {
        /// The hash slot of the key.
        slot: u16,
        /// The client address of the node to ask.
        addr: String,
    },
    /// Not possible right now (no leader, leadership changing, shutting
    /// down): retry shortly.
    #[error("TRYAGAIN {0}")]
    TryAgain(&'static str),
    /// The cluster cannot serve (no quorum).
    #[error("CLUSTERDOWN {0}")]
    ClusterDown(&'static str),
}

impl EngineError {
    /// The error reply for the client.
    pub fn to_server_error(&self) -> ServerError {
        match self {
            EngineError::Moved { slot, addr } => {
                ServerError::owned(ErrorCode::Moved, format!("{slot} {addr}"))
            }
            EngineError::TryAgain(why) => ServerError::new(ErrorCode::TryAgain, why),
            EngineError::ClusterDown(why) => ServerError::new(ErrorCode::ClusterDown, why),
        }
    }
}

/// What a submitted op resolves to.
pub type Submitted = Result<Applied, EngineError>;

/// The future of a submitted op: ready at once for the memory engine.
// The ready variant is the memory engine's hot path: boxing it would cost
// an allocation per op, to save moving a few hundred bytes.
#[allow(clippy::large_enum_variant)]
pub enum Submission {
    /// Already applied.
    Ready(Option<Submitted>),
    /// Applied later.
    Pending(Pin<Box<dyn Future<Output = Submitted> + Send>>),
}

impl Submission {
    /// The result if it is there already, else the submission itself.
    #[allow(clippy::result_large_err)]
    pub fn into_ready(self) -> Result<Submitted, Submission> {
        match self {
            Submission::Ready(Some(r)) => Ok(r),
            other => Err(other),
        }
    }
}

impl Future for Submission {
    type Output = Submitted;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Submitted> {
        match self.get_mut() {
            Submission::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(EngineError::TryAgain(
                "submission polled after completion",
            )))),
            Submission::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

/// Receives the key events of every applied op, in apply order.
pub trait EventSink: Send + Sync {
    /// Called after ops were applied, outside every store lock.
    fn on_events(self: Arc<Self>, events: &[KeyEvent]);
}

enum Inner {
    Memory(MemoryEngine),
}

/// The engine of a node.
pub struct Engine {
    inner: Inner,
    clock: Clock,
    sink: OnceLock<Weak<dyn EventSink>>,
}

impl Engine {
    /// An in-memory engine on `clock`.
    pub fn memory(cfg: StoreConfig, clock: Clock) -> Self {
        Engine {
            inner: Inner::Memory(MemoryEngine::new(cfg)),
            clock,
            sink: OnceLock::new(),
        }
    }

    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        match self.inner {
            Inner::Memory(_) => EngineKind::Memory,
        }
    }

    /// The node's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Subscribes `sink` to the key events (once; later calls are ignored).
    pub fn subscribe(&self, sink: Weak<dyn EventSink>) {
        let _ = self.sink.set(sink);
    }

    fn publish(&self, applied: &Applied) {
        if applied.events.is_empty() {
            return;
        }
        if let Some(sink) = self.sink.get().and_then(Weak::upgrade) {
            sink.on_events(&applied.events);
        }
    }

    /// Stamps, orders and applies `op`.
    pub fn submit(&self, op: Op) -> Submission {
        match &self.inner {
            Inner::Memory(m) => {
                let applied = m.apply(self.clock.now_ms(), &op);
                self.publish(&applied);
                Submission::Ready(Some(Ok(applied)))
            }
        }
    }

    /// Answers a read from the local store, now.
    pub fn read(&self, read: Read<'_>) -> Observed {
        let now = self.clock.now_ms();
        match &self.inner {
            Inner::Memory(m) => m.store.read(read, now),
        }
    }

    /// Submits an `Op::Expire` of `key` (for a deadline a read saw pass),
    /// without waiting for it.
    pub fn expire_soon(&self, key: &Bytes) {
        drop(self.submit(Op::Expire {
            keys: vec![key.clone()],
        }));
    }

    /// Records stored.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Memory(m) => m.store.len(),
        }
    }

    /// Whether no record is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StoreStats {
        match &self.inner {
            Inner::Memory(m) => m.store.stats(),
        }
    }

    /// One round of expiry: finds keys whose deadline passed (examining at
    /// most `scan_per_shard` slots per shard) and submits `Op::Expire`s of
    /// at most `batch` keys each. Returns true if more are likely due.
    pub async fn expire_round(&self, scan_per_shard: usize, batch: usize) -> bool {
        let found = match &self.inner {
            Inner::Memory(m) => {
                m.store
                    .expiry_candidates(self.clock.now_ms(), scan_per_shard, batch)
            }
        };
        if found.keys.is_empty() {
            return found.more;
        }
        let _ = self.submit(Op::Expire { keys: found.keys }).await;
        found.more
    }

    /// Proposes expiry every `interval` until `stop` changes: a bounded
    /// round each tick, more rounds (yielding in between) while they find
    /// many keys due.
    pub async fn run_expiry(
        self: Arc<Self>,
        interval: Duration,
        scan_per_shard: usize,
        batch: usize,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            while self.expire_round(scan_per_shard, batch).await {
                tokio::task::yield_now().await;
            }
        }
    }
}
