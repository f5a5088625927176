//! Engines: how ops reach the store.
//!
//! [`Engine::submit`] takes a replicated [`Op`], stamps it with the node's
//! clock, orders it and applies it, and resolves to what applying it
//! returned. The `memory` engine applies at once and returns a ready
//! future; a replicated engine resolves once the entry is committed and
//! applied. The op is proposed when `submit` is called (or, while the
//! proposal queue is full, when the future first finds room): to carry an
//! op out without waiting for its reply, use [`Engine::detach`]. Reads
//! ([`Engine::read`]) are served from the local store and never change it.
//!
//! Every applied op's key events (keys that left the in-flight state) are
//! published, in apply order, to the subscribed [`EventSink`] (the
//! waiters), outside every store lock. Expiry is proposed here too: a local
//! search picks keys whose deadline passed and submits `Op::Expire` for
//! them, so memory is freed at the same point of every replica's history.

mod memory;
pub mod raft;

use std::collections::HashSet;
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
    /// Waiting for room in a full proposal queue before it is even
    /// proposed: later writes of the same connection must wait for it (so
    /// they cannot overtake it), as after a blocking command.
    Waiting(Pin<Box<dyn Future<Output = Submitted> + Send>>),
}

impl Future for Submission {
    type Output = Submitted;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Submitted> {
        match self.get_mut() {
            Submission::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(EngineError::TryAgain(
                "submission polled after completion",
            )))),
            Submission::Pending(f) | Submission::Waiting(f) => f.as_mut().poll(cx),
        }
    }
}

/// Receives the key events of every applied op, in apply order.
pub trait EventSink: Send + Sync {
    /// Called after ops were applied, outside every store lock.
    fn on_events(self: Arc<Self>, events: &[KeyEvent]);

    /// Called when this node stops serving (it no longer leads): requests
    /// waiting here are answered with `redirect(key)` at once.
    fn on_demoted(self: Arc<Self>, redirect: &dyn Fn(&[u8]) -> EngineError) {
        let _ = redirect;
    }
}

enum Inner {
    Memory(MemoryEngine),
    Raft {
        engine: Box<raft::RaftEngine>,
        store: Arc<crate::store::Store>,
    },
}

/// The engine of a node.
pub struct Engine {
    inner: Inner,
    clock: Clock,
    sink: OnceLock<Weak<dyn EventSink>>,
    /// Keys whose expiry a read asked for that is not applied yet: a hot
    /// key read many times once its deadline passed is proposed once.
    expiring: Arc<parking_lot::Mutex<HashSet<Bytes>>>,
}

/// Keys [`Engine::expire_soon`] tracks at once, at most; past that, the
/// expiry sweep finds the rest.
const MAX_EXPIRING: usize = 4096;

impl Engine {
    /// An in-memory engine on `clock`.
    pub fn memory(cfg: StoreConfig, clock: Clock) -> Self {
        Engine {
            inner: Inner::Memory(MemoryEngine::new(cfg)),
            clock,
            sink: OnceLock::new(),
            expiring: Arc::default(),
        }
    }

    /// A raft engine over the data directory of `cfg`, reaching its peers
    /// and writing its log as `io` says: the log is replayed over the
    /// latest snapshot before this returns. Its clock continues
    /// the replicated one (see [`raft`]).
    ///
    /// # Errors
    ///
    /// [`raft::StartError`] when the data directory cannot be used.
    pub async fn raft(
        cfg: raft::RaftConfig,
        store_cfg: StoreConfig,
        io: raft::EngineIo,
    ) -> Result<Self, raft::StartError> {
        let store = Arc::new(crate::store::Store::new(store_cfg));
        let engine = raft::RaftEngine::start(cfg, Arc::clone(&store), io).await?;
        Ok(Engine {
            inner: Inner::Raft {
                engine: Box::new(engine),
                store,
            },
            clock: Clock::new(),
            sink: OnceLock::new(),
            expiring: Arc::default(),
        })
    }

    fn store(&self) -> &crate::store::Store {
        match &self.inner {
            Inner::Memory(m) => &m.store,
            Inner::Raft { store, .. } => store,
        }
    }

    /// The memory limits in force (replicated state).
    pub fn limits(&self) -> crate::store::MemoryLimits {
        self.store().limits()
    }

    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        match self.inner {
            Inner::Memory(_) => EngineKind::Memory,
            Inner::Raft { .. } => EngineKind::Raft,
        }
    }

    /// Whether writes go through a log (so answering from the store, when
    /// nothing changes, saves a round through it).
    pub fn has_log(&self) -> bool {
        matches!(self.inner, Inner::Raft { .. })
    }

    /// The raft engine, if this is one.
    pub fn raft_engine(&self) -> Option<&raft::RaftEngine> {
        match &self.inner {
            Inner::Raft { engine, .. } => Some(engine),
            Inner::Memory(_) => None,
        }
    }

    /// The time now on the clock entries are stamped with (for the raft
    /// engine: the current term's).
    pub fn now_ms(&self) -> u64 {
        match &self.inner {
            Inner::Memory(_) => self.clock.now_ms(),
            Inner::Raft { engine, .. } => engine.now_ms(),
        }
    }

    /// Whether this node serves commands on `key` (any key if `None`):
    /// always for the memory engine; for raft, only the leader, once it
    /// has applied the log. Otherwise the error says where to go
    /// (`-MOVED`) or why not now (`-TRYAGAIN`, `-CLUSTERDOWN`).
    pub fn route(&self, key: Option<&[u8]>) -> Result<(), EngineError> {
        match &self.inner {
            Inner::Memory(_) => Ok(()),
            Inner::Raft { engine, .. } => engine.route(key),
        }
    }

    /// Makes this follower's store current for a linearizable read (see
    /// [`raft::RaftEngine::follower_read_barrier`]); an error for the
    /// memory engine, which has no leader to ask.
    /// The read joins a round of asking the leader at this call.
    pub fn follower_read_barrier(
        &self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        match &self.inner {
            Inner::Memory(_) => Box::pin(std::future::ready(Err("not a cluster".into()))),
            Inner::Raft { engine, .. } => Box::pin(engine.follower_read_barrier()),
        }
    }

    /// On a raft leader whose state machine lags what was committed: a
    /// wait until it has caught up (see
    /// [`raft::RaftEngine::leader_read_wait`]).
    pub fn leader_read_wait(&self) -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
        match &self.inner {
            Inner::Memory(_) => None,
            Inner::Raft { engine, .. } => engine
                .leader_read_wait()
                .map(|f| -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> { Box::pin(f) }),
        }
    }

    /// Whether this node serves records now: always for the memory engine;
    /// for the raft engine, while it leads (even in a lapse of its lease,
    /// which holds requests rather than refusing them). Once false in a
    /// term it stays false: the waiters it parked are answered after it
    /// turns false, so one parked after seeing it true is answered too.
    pub fn serving(&self) -> bool {
        match &self.inner {
            Inner::Memory(_) => true,
            Inner::Raft { engine, .. } => engine.serving(),
        }
    }

    /// Until when a request that this node refuses now is held instead,
    /// for its lease to hold again: only on a leader no majority answered
    /// within its lease, for `election_timeout_ms` after it lapsed.
    pub fn lease_hold_until(&self) -> Option<tokio::time::Instant> {
        match &self.inner {
            Inner::Memory(_) => None,
            Inner::Raft { engine, .. } => engine.lease_hold_until(),
        }
    }

    /// Waits until the lease holds again, at most until `until`; whether
    /// it does.
    pub async fn lease_regained(&self, until: tokio::time::Instant) -> bool {
        match &self.inner {
            Inner::Memory(_) => true,
            Inner::Raft { engine, .. } => engine.lease_regained(until).await,
        }
    }

    /// The raft engine's state, if this is one.
    pub fn raft_info(&self) -> Option<(raft::RaftInfo, std::path::PathBuf)> {
        match &self.inner {
            Inner::Raft { engine, .. } => Some((engine.info(), engine.data_dir().to_owned())),
            Inner::Memory(_) => None,
        }
    }

    /// Stops the engine (the raft core); the memory engine has nothing to
    /// stop.
    pub async fn shutdown(&self) {
        if let Inner::Raft { engine, .. } = &self.inner {
            engine.shutdown().await;
        }
    }

    /// Called when the server has gone quiet, to give memory back: empty
    /// store shards let go of what they keep ([`Store::trim`]), and the
    /// raft engine trims its proposal queue and snapshots if the log it
    /// holds in memory is worth freeing (see
    /// [`raft::RaftEngine::snapshot_if_worth`]).
    ///
    /// [`Store::trim`]: crate::store::Store::trim
    pub async fn when_quiet(&self) {
        self.store().trim();
        if let Inner::Raft { engine, store } = &self.inner {
            engine.trim();
            engine.snapshot_if_worth(store.stats().memory).await;
        }
    }

    /// Subscribes `sink` to the key events (once; later calls are ignored).
    pub fn subscribe(&self, sink: Weak<dyn EventSink>) {
        if let Inner::Raft { engine, .. } = &self.inner {
            // Applied entries publish from the state machine.
            let _ = engine.sink().set(sink.clone());
        }
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
            Inner::Raft { engine, .. } => engine.submit(op),
            Inner::Memory(_) => self.submit_routed(op),
        }
    }

    /// [`Engine::submit`] right after [`Engine::route`] found that this
    /// node serves `op`'s key (nothing awaited in between): the routing
    /// is not checked again.
    pub fn submit_routed(&self, op: Op) -> Submission {
        match &self.inner {
            Inner::Memory(m) => {
                let applied = m.apply(self.now_ms(), &op);
                self.publish(&applied);
                Submission::Ready(Some(Ok(applied)))
            }
            Inner::Raft { engine, .. } => engine.submit_routed(op),
        }
    }

    /// Answers a read from the local store, now. In a cluster "now" is the
    /// replicated clock as last applied (the leader keeps it within
    /// [`raft::TICK_MS`] of its own while leases are live): a read never
    /// sees time that a next leader, which continues from the clock
    /// applied, could give back. A lease may so look live to reads up to
    /// that long after it ran out; writes are stamped with the leader's
    /// clock.
    pub fn read(&self, read: Read<'_>) -> Observed {
        self.store().read(read, self.read_now())
    }

    /// The time reads are answered at (see [`Engine::read`]).
    fn read_now(&self) -> u64 {
        match &self.inner {
            Inner::Raft { engine, store } if engine.clustered() => store.clock_ms(),
            _ => self.now_ms(),
        }
    }

    /// One step of a walk over the local store's keys (`SCAN`; see
    /// [`crate::store::Store::scan`]), at the time reads use.
    pub fn scan(
        &self,
        cursor: u64,
        count: usize,
        until: std::time::Instant,
        visible: Option<crate::store::KeyTest<'_>>,
        matches: crate::store::KeyTest<'_>,
    ) -> (u64, Vec<Bytes>) {
        self.store()
            .scan(cursor, count, self.read_now(), until, visible, matches)
    }

    /// Submits `op` without waiting for its reply (it is still carried out
    /// when the proposal queue is full and must wait for room).
    pub fn detach(&self, op: Op) {
        if let Submission::Pending(f) | Submission::Waiting(f) = self.submit(op) {
            tokio::spawn(f);
        }
    }

    /// Submits an `Op::Expire` of `key` (for a deadline a read saw pass),
    /// without waiting for it; not again while one for the key is on its
    /// way.
    pub fn expire_soon(&self, key: &Bytes) {
        {
            let mut expiring = self.expiring.lock();
            if expiring.len() >= MAX_EXPIRING || !expiring.insert(key.clone()) {
                return;
            }
        }
        let op = Op::Expire {
            keys: vec![key.clone()],
        };
        match self.submit(op) {
            Submission::Pending(f) | Submission::Waiting(f) => {
                let (expiring, key) = (Arc::clone(&self.expiring), key.clone());
                tokio::spawn(async move {
                    let _ = f.await;
                    expiring.lock().remove(&key);
                });
            }
            Submission::Ready(_) => {
                self.expiring.lock().remove(key);
            }
        }
    }

    /// The store in its canonical snapshot encoding: replicas that applied
    /// the same log give the same bytes (simulations compare them).
    pub fn state_bytes(&self) -> Vec<u8> {
        self.store().snapshot()
    }

    /// Records stored.
    pub fn len(&self) -> usize {
        self.store().len()
    }

    /// Whether no record is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StoreStats {
        self.store().stats()
    }

    /// One round of expiry: finds keys whose deadline passed (examining at
    /// most `scan_per_shard` slots per shard) and submits `Op::Expire`s of
    /// at most `batch` keys each. Returns true if more are likely due.
    pub async fn expire_round(&self, scan_per_shard: usize, batch: usize) -> bool {
        // Only the serving leader proposes expiry.
        if self.route(None).is_err() {
            return false;
        }
        let found = self
            .store()
            .expiry_candidates(self.now_ms(), scan_per_shard, batch);
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
            if let Inner::Raft { engine, store } = &self.inner {
                engine.tick_if_idle(|| store.stats().in_flight > 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use idem_protocol::{Reply, Version};

    use super::EngineError;

    fn wire(e: &EngineError) -> String {
        let mut out = BytesMut::new();
        Reply::Error(e.to_server_error()).encode(Version::Resp2, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn engine_errors_are_the_redis_cluster_replies() {
        let moved = EngineError::Moved {
            slot: 3999,
            addr: "10.0.0.7:7379".into(),
        };
        assert_eq!(wire(&moved), "-MOVED 3999 10.0.0.7:7379\r\n");
        assert_eq!(
            wire(&EngineError::TryAgain("no leader yet")),
            "-TRYAGAIN no leader yet\r\n"
        );
        assert_eq!(
            wire(&EngineError::ClusterDown("no quorum")),
            "-CLUSTERDOWN no quorum\r\n"
        );
    }
}
