//! The raft engine: every op goes through an openraft log that is on disk
//! before anything is acknowledged, and is applied by the store's rules
//! from the committed log. One node for now; the types, the log and the
//! state machine are those a cluster uses.
//!
//! - [`format`]: the data directory's format version and migrations;
//! - [`wal`]: append-only checksummed segments and the metadata file;
//! - [`log_store`]: openraft's log storage over it;
//! - [`state_machine`]: openraft's state machine over the store, with
//!   snapshots on disk;
//! - [`types`]: the entry and reply types.
//!
//! Group commit: proposals from every connection queue up (at most
//! `max_pending_proposals`); a proposer task takes all that are pending
//! (at most [`MAX_BATCH_OPS`] or `max_batch_bytes`), stamps them with one
//! time and writes them as one log entry, so many commands share one
//! `fdatasync`. Nothing waits for a timer: an idle node proposes at once.
//!
//! Time (the rule of leases under Raft): when the node starts serving, it
//! anchors its stamps to the replicated clock, `stamp = clock_at_start +
//! monotonic time since`, never to the wall clock (only a brand-new data
//! directory starts from the wall clock). So a restart or a wall-clock step
//! never lapses or shortens a lease: leases and retention pause while the
//! node is down.

pub mod format;
pub mod log_store;
pub mod state_machine;
pub mod types;
pub mod wal;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use openraft::{BasicNode, Raft, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::{EngineError, Submitted};
use crate::clock::Clock;
use crate::store::{Entry, Op, Store};
use log_store::LogStore;
use state_machine::StateMachine;
use types::{Batch, NodeId, TypeConfig};

/// Log bytes below which a quiet server does not snapshot to free them.
pub const QUIET_SNAPSHOT_MIN_BYTES: u64 = 1 << 20;

/// Most ops in one log entry.
pub const MAX_BATCH_OPS: usize = 65_535;

/// What the raft engine needs of the configuration.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// Where the log and snapshots live.
    pub data_dir: PathBuf,
    /// This node's id.
    pub node_id: NodeId,
    /// Ops waiting to be proposed, at most.
    pub max_pending_proposals: usize,
    /// Bytes of ops in one log entry, at most (a single larger op goes
    /// alone).
    pub max_batch_bytes: usize,
    /// A proposal not applied within this gets `-TRYAGAIN`, ms.
    pub proposal_timeout_ms: u64,
    /// Log entries since the last snapshot that trigger a new one.
    pub snapshot_entries: u64,
    /// Bytes of writes logged since the last snapshot that trigger a new
    /// one (whichever comes first).
    pub snapshot_log_bytes: u64,
    /// Size at which a log segment is closed and a new one started.
    pub segment_bytes: u64,
    /// Below this much free space on the data directory's filesystem,
    /// writes get `-TRYAGAIN` (reads and replays keep working).
    pub min_free_disk_bytes: u64,
}

/// Why the raft engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data directory cannot be used.
    #[error("data directory {path}: {reason}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Another idemd holds the data directory.
    #[error(
        "data directory {0} is in use by another idemd (its lock file is held); stop it or use another --data-dir"
    )]
    Locked(PathBuf),
    /// The data directory's format is not one this build reads, or its
    /// migration failed.
    #[error(transparent)]
    Format(#[from] format::FormatError),
    /// The log cannot be opened.
    #[error(transparent)]
    Log(#[from] log_store::OpenError),
    /// The snapshot cannot be loaded.
    #[error(transparent)]
    Snapshot(#[from] state_machine::SnapshotFileError),
    /// openraft refused to start.
    #[error("raft: {0}")]
    Raft(String),
}

struct Proposal {
    op: Op,
    /// Approximate encoded size, for the batch cap.
    bytes: usize,
    tx: oneshot::Sender<Submitted>,
    /// [`QUEUED`], [`TAKEN`] (into an entry) or [`WITHDRAWN`] (timed out
    /// first: never proposed).
    state: Arc<AtomicU8>,
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Proposal {
    /// Takes the proposal into an entry, unless its submitter gave up.
    fn take(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Counters of the engine.
#[derive(Debug, Default)]
pub struct RaftStats {
    /// Log entries proposed.
    pub entries: AtomicU64,
    /// Ops proposed in them.
    pub ops: AtomicU64,
}

/// A running single-node raft engine.
pub struct RaftEngine {
    raft: Raft<TypeConfig>,
    proposals: mpsc::Sender<Proposal>,
    log: LogStore,
    sm: StateMachine,
    data_dir: PathBuf,
    stats: Arc<RaftStats>,
    proposal_timeout: Duration,
    /// Held while running: a second idemd on the directory is refused.
    _lock: File,
}

/// Takes the advisory lock of `dir` (released by the kernel when the
/// process ends, however it ends).
fn lock_dir(dir: &Path) -> Result<File, StartError> {
    let path = dir.join("LOCK");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StartError::DataDir {
            path: dir.to_owned(),
            reason: format!("cannot open {}: {e}", path.display()),
        })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(fs::TryLockError::WouldBlock) => Err(StartError::Locked(dir.to_owned())),
        Err(fs::TryLockError::Error(e)) => Err(StartError::DataDir {
            path: dir.to_owned(),
            reason: format!("cannot lock {}: {e}", path.display()),
        }),
    }
}

impl RaftEngine {
    /// Opens the data directory, replays the log over the latest snapshot
    /// and starts serving as the single voter of its group. Returns once
    /// the node leads and has applied its log.
    pub async fn start(
        cfg: RaftConfig,
        store: Arc<Store>,
        wall_ms: u64,
    ) -> Result<(RaftEngine, Clock), StartError> {
        fs::create_dir_all(&cfg.data_dir).map_err(|e| StartError::DataDir {
            path: cfg.data_dir.clone(),
            reason: e.to_string(),
        })?;
        let data_dir = fs::canonicalize(&cfg.data_dir).map_err(|e| StartError::DataDir {
            path: cfg.data_dir.clone(),
            reason: e.to_string(),
        })?;
        let lock = lock_dir(&data_dir)?;
        if let format::Prepared::Migrated { from, backup } = format::prepare(&data_dir)? {
            info!(
                dir = %data_dir.display(),
                from,
                to = format::DATA_FORMAT,
                backup = %backup.display(),
                "data directory migrated"
            );
        }
        let log_dir = data_dir.join("log");
        let log = LogStore::open(&log_dir, cfg.segment_bytes)?;
        let sm = StateMachine::open(Arc::clone(&store), &data_dir)?;
        let raft_config = openraft::Config {
            cluster_name: "idem".into(),
            heartbeat_interval: 100,
            election_timeout_min: 300,
            election_timeout_max: 600,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_entries),
            max_in_snapshot_log_to_keep: 0,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let raft = Raft::new(
            cfg.node_id,
            Arc::new(raft_config),
            NoNetwork,
            log.clone(),
            sm.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if !initialized {
            let mut members = BTreeMap::new();
            members.insert(cfg.node_id, BasicNode::default());
            raft.initialize(members)
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?;
            info!(dir = %data_dir.display(), "initialized a new single-node raft group");
        }
        // Serving starts once this node leads and has applied everything.
        raft.wait(Some(Duration::from_secs(30)))
            .state(openraft::ServerState::Leader, "leading")
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        raft.ensure_linearizable()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        #[cfg(debug_assertions)]
        if std::env::var("IDEMD_UNSAFE_TEST_REUSE_FENCES").is_ok_and(|v| v == "1") {
            tracing::error!(
                "IDEMD_UNSAFE_TEST_REUSE_FENCES=1: fences handed out before are handed out again (test mode)"
            );
            store.unsafe_rewind_fences(8);
        }
        let clock = store.stats().clock;
        let anchor = if clock == 0 { wall_ms } else { clock };
        let proposer_clock = Clock::starting_at(anchor);
        let (tx, rx) = mpsc::channel(cfg.max_pending_proposals.max(1));
        let stats = Arc::new(RaftStats::default());
        tokio::spawn(propose(
            raft.clone(),
            rx,
            proposer_clock,
            Limits {
                max_bytes: cfg.max_batch_bytes,
                min_free_disk: cfg.min_free_disk_bytes,
                snapshot_bytes: cfg.snapshot_log_bytes,
                dir: data_dir.clone(),
            },
            Arc::clone(&stats),
        ));
        info!(
            dir = %data_dir.display(),
            applied = ?sm.last_applied(),
            records = store.len(),
            "raft engine serving"
        );
        Ok((
            RaftEngine {
                raft,
                proposals: tx,
                log,
                sm,
                data_dir,
                stats,
                proposal_timeout: Duration::from_millis(cfg.proposal_timeout_ms),
                _lock: lock,
            },
            proposer_clock,
        ))
    }

    /// Where key events go.
    pub fn sink(&self) -> Arc<std::sync::OnceLock<std::sync::Weak<dyn super::EventSink>>> {
        self.sm.sink()
    }

    /// Proposes `op`; resolves once it is applied (its entry fsynced).
    ///
    /// When `max_pending_proposals` are already queued, the op waits for
    /// room (its connection keeps at most `max_pending_per_connection`
    /// requests in progress, then stops reading), within the proposal
    /// timeout.
    pub fn submit(&self, op: Op) -> super::Submission {
        let (tx, rx) = oneshot::channel();
        let bytes = op_size(&op);
        let state = Arc::new(AtomicU8::new(QUEUED));
        let proposal = Proposal {
            op,
            bytes,
            tx,
            state: Arc::clone(&state),
        };
        let waiting = match self.proposals.try_send(proposal) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(p)) => Some((self.proposals.clone(), p)),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return super::Submission::Ready(Some(Err(EngineError::TryAgain(
                    "the engine is stopping",
                ))));
            }
        };
        let timeout = self.proposal_timeout;
        let full = waiting.is_some();
        let fut = Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            if let Some((proposals, p)) = waiting {
                match tokio::time::timeout_at(deadline, proposals.send(p)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(EngineError::TryAgain("the engine is stopping")),
                    Err(_) => {
                        return Err(EngineError::TryAgain(
                            "too many writes pending: not proposed within proposal_timeout_ms",
                        ));
                    }
                }
            }
            let mut rx = rx;
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(Ok(r)) => return r,
                Ok(Err(_)) => return Err(EngineError::TryAgain("the engine is stopping")),
                Err(_) => {}
            }
            // Timed out: withdrawn if the proposer has not taken it yet (so
            // it is certainly not applied); once taken into an entry its
            // outcome comes soon (a sync and an apply away), and is the one
            // to report.
            if state
                .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Err(EngineError::TryAgain(
                    "not proposed within proposal_timeout_ms (withdrawn: not applied)",
                ));
            }
            rx.await
                .unwrap_or(Err(EngineError::TryAgain("the engine is stopping")))
        });
        if full {
            super::Submission::Waiting(fut)
        } else {
            super::Submission::Pending(fut)
        }
    }

    /// The data directory (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// What INFO reports of the engine.
    pub fn info(&self) -> RaftInfo {
        let m = self.raft.metrics().borrow().clone();
        let snapshots = self.sm.snapshot_stats();
        let entries = self.stats.entries.load(Ordering::Relaxed);
        let (fsyncs, fsync_p50_us, fsync_p99_us) = self.log.syncs();
        let (log_entries, log_bytes) = self.log.held();
        RaftInfo {
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: self.log.committed_index(),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: snapshots.last_log_id.map_or(0, |l| l.index),
            snapshots_built: snapshots.built,
            snapshot_secs: snapshots.last_secs,
            snapshot_pause_ms: snapshots.last_pause_ms,
            snapshot_pause_max_ms: snapshots.max_pause_ms,
            leader: m.current_leader == Some(m.id),
            leader_known: m.current_leader.is_some(),
            // openraft lists the leader among its replication targets.
            followers: m
                .replication
                .as_ref()
                .map_or(0, |r| r.keys().filter(|id| **id != m.id).count() as u64),
            fsyncs,
            fsync_p50_us,
            fsync_p99_us,
            entries,
            ops: self.stats.ops.load(Ordering::Relaxed),
            log_entries,
            log_bytes,
        }
    }

    /// Asks for a snapshot when the log held since the last one is worth
    /// freeing now: at least [`QUIET_SNAPSHOT_MIN_BYTES`], and a quarter of
    /// `store_bytes` (a snapshot writes the whole store). Called when the
    /// server has gone quiet, so a burst's log does not stay in memory
    /// until the next burst reaches the snapshot thresholds. Returns
    /// whether one was asked for.
    pub async fn snapshot_if_worth(&self, store_bytes: u64) -> bool {
        let (_, held) = self.log.held();
        if held < QUIET_SNAPSHOT_MIN_BYTES.max(store_bytes / 4) {
            return false;
        }
        self.raft.trigger().snapshot().await.is_ok()
    }

    /// Stops the Raft core.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "raft did not shut down cleanly");
        }
    }
}

/// A snapshot of the engine's state for INFO.
#[derive(Debug, Clone, Copy, Default)]
pub struct RaftInfo {
    /// The current term.
    pub term: u64,
    /// The last log index.
    pub last_log_index: u64,
    /// The last committed index.
    pub commit_index: u64,
    /// The last applied index.
    pub applied_index: u64,
    /// The last snapshot's index.
    pub snapshot_index: u64,
    /// Snapshots built since start.
    pub snapshots_built: u64,
    /// How long the latest snapshot took, s.
    pub snapshot_secs: f64,
    /// How long applies waited while it copied the store, ms.
    pub snapshot_pause_ms: u64,
    /// The longest such wait since start, ms.
    pub snapshot_pause_max_ms: u64,
    /// Whether this node leads.
    pub leader: bool,
    /// Whether this node knows a leader.
    pub leader_known: bool,
    /// Nodes the leader replicates to (0 on a follower).
    pub followers: u64,
    /// Log `fdatasync`s since start.
    pub fsyncs: u64,
    /// Their median time, µs.
    pub fsync_p50_us: u64,
    /// Their 99th percentile time, µs.
    pub fsync_p99_us: u64,
    /// Entries proposed since start.
    pub entries: u64,
    /// Ops proposed since start.
    pub ops: u64,
    /// Log entries held (not yet covered by a snapshot and purged).
    pub log_entries: u64,
    /// Their size: what the log takes in memory, bytes.
    pub log_bytes: u64,
}

fn op_size(op: &Op) -> usize {
    let b = |x: &bytes::Bytes| x.len() + 4;
    32 + match op {
        Op::Claim(c) => {
            b(&c.key) + c.fingerprint.as_ref().map_or(0, b) + c.attempt.as_ref().map_or(0, b)
        }
        Op::Complete(c) => b(&c.key) + b(&c.value),
        Op::Journal(c) => b(&c.key) + b(&c.journal),
        Op::Renew(c) => b(&c.key),
        Op::Release(c) => b(&c.key),
        Op::Abandon(c) => b(&c.key),
        Op::Forget(c) => b(&c.key),
        Op::Expire { keys } => keys.iter().map(b).sum(),
        Op::SetLimits(_) => 16,
    }
}

/// What the proposer checks before writing.
struct Limits {
    max_bytes: usize,
    min_free_disk: u64,
    snapshot_bytes: u64,
    dir: PathBuf,
}

impl Limits {
    /// Whether the data directory's filesystem has room for more log.
    fn disk_ok(&self) -> bool {
        match fs4::available_space(&self.dir) {
            Ok(free) => free >= self.min_free_disk,
            // Cannot tell: let the write find out.
            Err(_) => true,
        }
    }
}

/// The proposer: takes every pending proposal (up to the caps), stamps
/// them, writes them as one entry, and answers each with its own reply.
async fn propose(
    raft: Raft<TypeConfig>,
    mut rx: mpsc::Receiver<Proposal>,
    clock: Clock,
    limits: Limits,
    stats: Arc<RaftStats>,
) {
    let max_bytes = limits.max_bytes;
    let mut disk_full = false;
    let inflight = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_ENTRIES));
    // Bytes logged since the last snapshot was asked for: the log (kept in
    // memory until a snapshot covers it) stays bounded by size as well as
    // by entries.
    let mut since_snapshot = 0u64;
    let mut carry: Option<Proposal> = None;
    loop {
        // At most MAX_INFLIGHT_ENTRIES entries in flight: while they are
        // written and applied, proposals gather for the next one.
        let Ok(permit) = Arc::clone(&inflight).acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut size = 0;
        let mut ops = Vec::new();
        let mut txs = Vec::new();
        let mut next = Some(first);
        while let Some(p) = next.take() {
            // A proposal whose submitter gave up (timed out) is dropped:
            // it was answered "not applied", so it must not be.
            if p.take() {
                size += p.bytes;
                ops.push(p.op);
                txs.push(p.tx);
            }
            if ops.len() >= MAX_BATCH_OPS {
                break;
            }
            match rx.try_recv() {
                Ok(p) if !ops.is_empty() && size + p.bytes > max_bytes => carry = Some(p),
                Ok(p) => next = Some(p),
                Err(_) => {}
            }
        }
        if ops.is_empty() {
            continue;
        }
        if !limits.disk_ok() {
            if !disk_full {
                warn!(
                    dir = %limits.dir.display(),
                    min_free_disk_bytes = limits.min_free_disk,
                    "disk nearly full: refusing writes until space returns"
                );
                disk_full = true;
            }
            fail(
                txs,
                "disk full: the data directory is below min_free_disk_bytes; writes resume when space returns",
            );
            continue;
        }
        if disk_full {
            info!(dir = %limits.dir.display(), "disk space is back: accepting writes");
            disk_full = false;
        }
        since_snapshot += size as u64;
        if since_snapshot >= limits.snapshot_bytes {
            since_snapshot = 0;
            if let Err(e) = raft.trigger().snapshot().await {
                warn!(error = %e, "cannot ask for a snapshot");
            }
        }
        stats.entries.fetch_add(1, Ordering::Relaxed);
        stats.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
        // Stamped as it goes to the log, not while it waited: leases and
        // retention start no earlier than the write does.
        let entry = Entry {
            stamp_ms: clock.now_ms(),
            ops,
        };
        let rx = match raft.client_write_ff(Batch(entry)).await {
            Ok(rx) => rx,
            Err(e) => {
                warn!(error = %e, "the raft core stopped");
                fail(txs, "the log could not take the write");
                continue;
            }
        };
        tokio::spawn(async move {
            match rx.await {
                Ok(Ok(resp)) => {
                    for (tx, applied) in txs.into_iter().zip(resp.data.0) {
                        let _ = tx.send(Ok(applied));
                    }
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "a proposal failed");
                    fail(txs, "the log could not take the write");
                }
                Err(_) => fail(txs, "the raft core stopped"),
            }
            drop(permit);
        });
    }
}

/// Entries written and not yet applied, at most. Two: while one is applied
/// and answered, the next is already being written (measured at 50
/// connections: pipeline 1 went from 18k to 24k claims/s and pipeline 16
/// from 138k to 160k against one). More are worse at pipeline 1 (with the
/// log writer thread, 5 alternating runs each: two 25.4k, four 21.8k,
/// eight 20.5k): smaller entries cost more Raft work per command.
const MAX_INFLIGHT_ENTRIES: usize = 2;

fn fail(txs: Vec<oneshot::Sender<Submitted>>, why: &'static str) {
    for tx in txs {
        let _ = tx.send(Err(EngineError::TryAgain(why)));
    }
}

/// The network of a single-node group: there is nobody to talk to.
struct NoNetwork;

struct NoPeer;

impl openraft::RaftNetworkFactory<TypeConfig> for NoNetwork {
    type Network = NoPeer;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeer {
        NoPeer
    }
}

fn unreachable_peer<E: std::error::Error>() -> openraft::error::RPCError<NodeId, BasicNode, E> {
    openraft::error::RPCError::Unreachable(openraft::error::Unreachable::new(
        &std::io::Error::other("single-node group: no peers"),
    ))
}

impl openraft::RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: openraft::raft::AppendEntriesRequest<TypeConfig>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::AppendEntriesResponse<NodeId>,
        openraft::error::RPCError<NodeId, BasicNode, openraft::error::RaftError<NodeId>>,
    > {
        Err(unreachable_peer())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: openraft::raft::InstallSnapshotRequest<TypeConfig>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::InstallSnapshotResponse<NodeId>,
        openraft::error::RPCError<
            NodeId,
            BasicNode,
            openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>,
        >,
    > {
        Err(unreachable_peer())
    }

    async fn vote(
        &mut self,
        _rpc: openraft::raft::VoteRequest<NodeId>,
        _option: openraft::network::RPCOption,
    ) -> Result<
        openraft::raft::VoteResponse<NodeId>,
        openraft::error::RPCError<NodeId, BasicNode, openraft::error::RaftError<NodeId>>,
    > {
        Err(unreachable_peer())
    }
}

#[cfg(test)]
mod tests;
