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
//! - [`types`]: the entry and reply types;
//! - [`peer`]: the transport between nodes;
//! - [`cluster`]: member addresses, bootstrap, and who serves.
//!
//! Group commit: proposals from every connection queue up (at most
//! `max_pending_proposals`); a proposer task takes all that are pending
//! (at most [`MAX_BATCH_OPS`] or `max_batch_bytes`), stamps them with one
//! time and writes them as one log entry, so many commands share one
//! `fdatasync`. Nothing waits for a timer: an idle node proposes at once.
//!
//! Time (the rule of leases under Raft): when a node starts serving as
//! leader (at start for a single node, after every election in a cluster),
//! it first applies everything committed before, then anchors its stamps
//! to the replicated clock, `stamp = applied_clock + monotonic time since`,
//! never to the wall clock (only a brand-new cluster starts from the wall
//! clock). So a restart, a failover or a wall-clock step never lapses or
//! shortens a lease: leases and retention pause while no node leads.

pub mod cluster;
pub mod format;
pub mod log_store;
pub mod peer;
mod queue;
mod quick_elect;
pub mod snapshot_data;
pub mod state_machine;
pub mod types;
pub mod wal;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use openraft::{Raft, SnapshotPolicy};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::{EngineError, Submitted};
use crate::clock::Clock;
use crate::store::{Entry, Op, Store};
use log_store::LogStore;
use state_machine::StateMachine;
use types::{Batch, LogId, NodeId, TypeConfig};

/// Snapshot chunk size on the peer network.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;
/// How long one snapshot chunk may take (the last one installs it), ms.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 30_000;
/// How long a leader may wait, ms, before it tells a follower of a newer
/// commit with an AppendEntries of its own: the next entries it sends carry
/// that news, so a follower then only applies a little later. (openraft
/// `Config::commit_send_delay`.)
pub const COMMIT_SEND_DELAY_MS: u64 = 5;
/// Log entries in one AppendEntries, at most.
pub const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// Log bytes below which a quiet server does not snapshot to free them.
pub const QUIET_SNAPSHOT_MIN_BYTES: u64 = 1 << 20;

/// Most ops in one log entry.
pub const MAX_BATCH_OPS: usize = 65_535;

/// A single node, and a follower, write and sync an append smaller than
/// this themselves, on openraft's core task, when the log writer thread is
/// idle and the latest sync was fast (see [`log_store`]). An append is
/// small when few commands gathered while the previous one was written:
/// the node is lightly loaded, little waits to be served during the sync,
/// and the two thread wakeups of a hand-off are a large share of each
/// command's latency (`benches/RESULTS.md`: pipeline 1 gains throughput and
/// a lower p99, pipeline 16's entries are larger and are handed over as
/// before). A follower does it only while `max_inflight_appends` is 1: its
/// leader then sends the next entries after this append's answer, so
/// nothing else waits to be written meanwhile (with several in flight, the
/// thread syncs the appends that arrive during one sync with the next).
/// A leader never does: its runtime sends the entries to the followers,
/// and a sync written there would hold that up.
pub const INLINE_APPEND_BELOW: usize = 4096;

/// What the raft engine needs of the configuration.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// Where the log and snapshots live.
    pub data_dir: PathBuf,
    /// This node's id.
    pub node_id: NodeId,
    /// Ops waiting to be proposed, at most.
    pub max_pending_proposals: usize,
    /// Bytes of ops waiting to be proposed, at most (a single larger op
    /// counts as that many).
    pub max_pending_proposal_bytes: usize,
    /// Bytes of ops in one log entry, at most (a single larger op goes
    /// alone).
    pub max_batch_bytes: usize,
    /// The largest request a client may send, bytes (`max_frame_bytes`):
    /// the op it makes, alone in its entry, is no larger.
    pub max_request_bytes: usize,
    /// A proposal not applied within this gets `-TRYAGAIN`, ms.
    pub proposal_timeout_ms: u64,
    /// Log entries since the last snapshot that trigger a new one.
    pub snapshot_entries: u64,
    /// Bytes of log since the last snapshot that trigger a new one
    /// (whichever comes first), at least; see `snapshot_log_percent`.
    pub snapshot_log_bytes: u64,
    /// The bytes of log that trigger a snapshot grow to this percentage of
    /// the latest snapshot file's size, when that is more than
    /// `snapshot_log_bytes` (0: never).
    pub snapshot_log_percent: u64,
    /// The voters' turns to snapshot, ms (0: no turns); see
    /// [`SnapshotTurns`].
    pub snapshot_turn_ms: u64,
    /// Size at which a log segment is closed and a new one started.
    pub segment_bytes: u64,
    /// Below this much free space on the data directory's filesystem,
    /// writes get `-TRYAGAIN` (reads and replays keep working).
    pub min_free_disk_bytes: u64,
    /// The shortest election timeout, ms: a follower that hears no leader
    /// for this (the old leader's lease on its vote) plus a random time
    /// between this and twice this starts an election. The leader
    /// sends heartbeats every third of it, and serves for four fifths of it
    /// after a majority last acknowledged it.
    pub election_timeout_ms: u64,
    /// The leader's deadline for one AppendEntries, ms: the follower
    /// answers once the entries are on its disk, so a slow disk needs
    /// longer than a heartbeat. Past it the leader retries (after a
    /// backoff of half a second).
    pub append_timeout_ms: u64,
    /// AppendEntries the leader may have sent to one follower and not yet
    /// had answered (at least one; at most [`peer::READ_AHEAD`], what a
    /// follower reads ahead): entries proposed while others are on their
    /// way are sent at once. As many entries may be in flight.
    pub max_inflight_appends: usize,
    /// How long a leader with followers keeps polling its sockets after
    /// proposing an entry, while the entry awaits its quorum, instead of
    /// letting its thread sleep, µs (0: it sleeps at once). See
    /// [`LEADER_POLL_US`].
    pub leader_poll_us: u64,
    /// A leader with followers that answered N writes since its last
    /// entry gathers the next one until N writes are waiting, or none
    /// arrived for this long, µs (0: it takes what has arrived). See
    /// [`GATHER_IDLE_US`].
    pub gather_idle_us: u64,
    /// Peers, addresses and bootstrap.
    pub cluster: cluster::ClusterConfig,
    /// TLS between peers (`tls_cluster`): connections made and accepted
    /// are TLS, certificates checked both ways against the CA.
    pub tls: Option<Arc<crate::tls::Tls>>,
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
    /// The node may not bootstrap or join (see the message).
    #[error("cluster: {0}")]
    Cluster(String),
    /// The peer address cannot be listened on.
    #[error("cannot listen for peers on {addr}: {source}")]
    PeerListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// How a raft engine reaches its peers and writes its log. The default is
/// idemd's: TCP (listening on `peer_listen`) and a log writer thread. A
/// simulation gives its own network and writes the log inline.
#[derive(Default)]
pub struct EngineIo {
    /// Opens connections to peers (default: [`peer::TcpDialer`]).
    pub dialer: Option<Arc<dyn peer::Dialer>>,
    /// Peer connections the caller accepts; when given, the engine does
    /// not listen on `peer_listen` itself.
    pub incoming: Option<peer::Incoming>,
    /// How the log is written.
    pub writing: log_store::Writing,
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

/// The answer to a write whose leader was cut off from the majority
/// before the write was committed ([`cluster::Role::cut_off`]): withdrawn
/// if the proposer had not taken it yet (so certainly not applied), its
/// outcome if that has just come, else unknown.
fn cut_off(state: &AtomicU8, rx: &mut oneshot::Receiver<Submitted>) -> Submitted {
    if state
        .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        return Err(EngineError::TryAgain(
            "this node lost its majority before proposing the write (withdrawn: not applied)",
        ));
    }
    if let Ok(r) = rx.try_recv() {
        return r;
    }
    Err(EngineError::TryAgain(
        "this node lost its majority after proposing the write: it may have been applied",
    ))
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
    /// The stamp of the latest entry proposed, ms.
    pub last_stamp_ms: AtomicU64,
    /// Entries whose answer the leader polled for (`leader_poll_us`).
    pub polls: AtomicU64,
    /// Of those, the ones answered while it polled.
    pub polls_answered: AtomicU64,
    /// Whether an entry's answer is being polled for now: one at a time.
    polling: std::sync::atomic::AtomicBool,
    /// Entries gathered until as many writes as were answered since the
    /// previous one came (`gather_idle_us`).
    pub gathers_expecting: AtomicU64,
    /// Of those, the ones for which they all came.
    pub gathers_expecting_met: AtomicU64,
    /// Snapshots that fell due and waited for this node's turn
    /// (`snapshot_turn_ms`).
    pub snapshot_turn_waits: AtomicU64,
    /// Writes refused because the data directory's filesystem had less
    /// than `min_free_disk_bytes` free.
    pub disk_full_refusals: AtomicU64,
    /// Times the writes waited for a snapshot, the log at its cap
    /// ([`LogCap`]).
    pub log_full_waits: AtomicU64,
}

/// The default `leader_poll_us`. A thread that sleeps until a follower's
/// answer arrives must be woken, and waking an idle core costs tens of µs
/// (more in a virtual machine, where an idle vCPU is halted); an entry's
/// answer comes one quorum fsync and round trip after it was proposed. So
/// after it proposes, a leader with followers keeps its runtime polling
/// its sockets (a poll is a yield: other tasks run meanwhile) until the
/// answer comes or this much time has passed, then sleeps. It costs the
/// leader CPU while an entry is out, nothing while it is idle; one entry at
/// a time is polled for. Three nodes on loopback sharing two cores, 50
/// connections at pipeline 1, alternating runs of 5 s: claims 40.5k/s
/// sleeping against 43.2k polling 600 µs and 41.8k polling 1,000 µs (eight
/// rounds; ten rounds of a trial build polling the same way: 41.7k
/// against 47.1k); the leader's wakeup after its follower's answer fell
/// from 54 to 17 µs (median) and its CPU rose from 75% to 94% of a core.
/// Polling 300 µs, shorter than a round here, gained nothing; polling past
/// a slow round takes CPU the followers then need. At pipeline 16 the
/// runtime has work anyway (186k either way), and claim + complete at
/// pipeline 1 made 19.4k either way.
pub const LEADER_POLL_US: u64 = 600;

/// How long a cluster's leader lets the replicated clock stand still while
/// leases are live: past it, it proposes an empty entry (a tick).
pub const TICK_MS: u64 = 100;

/// The same for a single node, whose logged clock only serves its next
/// start: a lease comes back at most about this much longer than it had
/// left when the node stopped (plus the expiry sweep's interval, which
/// checks it, and a sync).
pub const SINGLE_TICK_MS: u64 = 1_000;

/// A running raft engine.
pub struct RaftEngine {
    raft: Raft<TypeConfig>,
    role: Arc<cluster::Role>,
    peers: Arc<peer::Peers>,
    cluster: cluster::ClusterConfig,
    proposals: Arc<queue::Queue>,
    log: LogStore,
    sm: StateMachine,
    data_dir: PathBuf,
    stats: Arc<RaftStats>,
    proposal_timeout: Duration,
    /// Follower reads waiting for the leader's read index.
    read_rounds: Arc<ReadRounds>,
    /// Whether this node has given a follower a read index.
    read_index_given: Arc<ReadIndexGiven>,
    /// Held while running: a second idemd on the directory is refused.
    _lock: File,
}

/// The follower reads waiting for a read index, and whether a round of
/// asking the leader runs. Reads that come while one is out wait for the
/// next: one request to the leader serves every read that came before it
/// was sent (so its index covers every write acknowledged before each of
/// them), however many connections read at once.
#[derive(Default)]
struct ReadRounds {
    /// The reads waiting, and whether a round runs.
    state: parking_lot::Mutex<(Vec<ReadIndexTx>, bool)>,
    /// When a round last got no answer from the leader: for a second
    /// after, reads do not ask (a leader of an earlier build cannot read
    /// the request and closes the connection; each round would open
    /// another).
    unanswered_at: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Reads that asked for an index, and the requests sent to the
    /// leader for them, since start.
    reads: AtomicU64,
    rounds: AtomicU64,
    /// Of the reads, those that could not be made current here (no read
    /// index came, or it was not applied in time): they went to the
    /// leader instead.
    redirected: AtomicU64,
}

impl ReadRounds {
    /// Joins the next round: its answer, the leader's read index asked for
    /// after this call, comes on the receiver. At once, so that reads
    /// pipelined on one connection join the same round, though each is
    /// awaited only once the one before it is answered.
    fn enroll(
        self: &Arc<Self>,
        raft: &Raft<TypeConfig>,
        peers: &Arc<peer::Peers>,
    ) -> Result<oneshot::Receiver<Result<u64, String>>, String> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self
            .unanswered_at
            .lock()
            .is_some_and(|at| at.elapsed() < READ_INDEX_BACKOFF)
        {
            self.redirected.fetch_add(1, Ordering::Relaxed);
            return Err("the leader did not answer the last request for a read index".into());
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock();
            s.0.push(tx);
            !std::mem::replace(&mut s.1, true)
        };
        if start {
            let (rounds, raft, peers) = (Arc::clone(self), raft.clone(), Arc::clone(peers));
            tokio::spawn(async move {
                let run = std::panic::AssertUnwindSafe(Arc::clone(&rounds).run(raft, peers));
                if futures_util::FutureExt::catch_unwind(run).await.is_err() {
                    // Its reads are told (their senders dropped), and the
                    // next read starts a round again.
                    let mut s = rounds.state.lock();
                    s.0.clear();
                    s.1 = false;
                }
            });
        }
        Ok(rx)
    }

    /// Asks the leader once for every read waiting, until none is.
    async fn run(self: Arc<Self>, raft: Raft<TypeConfig>, peers: Arc<peer::Peers>) {
        loop {
            let waiting = {
                let mut s = self.state.lock();
                if s.0.is_empty() {
                    s.1 = false;
                    return;
                }
                std::mem::take(&mut s.0)
            };
            self.rounds.fetch_add(1, Ordering::Relaxed);
            let got = match leader_peer(&raft) {
                Ok((leader, addr)) => {
                    let ttl = election_timeout(&raft);
                    match peer::PeerClient::new(Arc::clone(&peers), leader, addr)
                        .read_index(ttl)
                        .await
                    {
                        Ok(index) => Ok(index),
                        Err((answered, why)) => {
                            if !answered {
                                *self.unanswered_at.lock() = Some(std::time::Instant::now());
                            }
                            Err(why)
                        }
                    }
                }
                Err(why) => Err(why),
            };
            for tx in waiting {
                let _ = tx.send(got.clone());
            }
        }
    }
}

/// Whether this leader has given a follower a read index since it
/// started: from then on followers may show what was committed before
/// this leader applied it, and its own reads wait for its apply to catch
/// up with its commits ([`RaftEngine::leader_read_wait`]). A cluster
/// whose clients never read from followers pays nothing for it.
#[derive(Default)]
struct ReadIndexGiven(AtomicBool);

impl ReadIndexGiven {
    fn now(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    fn ever(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// How long after a request for a read index got no answer follower reads
/// do not ask again ([`ReadRounds`]).
const READ_INDEX_BACKOFF: Duration = Duration::from_secs(1);

/// Where a follower read waiting for a read index is told it.
type ReadIndexTx = oneshot::Sender<Result<u64, String>>;

/// `election_timeout_ms`: how long a follower read, or a leader's read
/// waiting for its apply, waits at most.
fn election_timeout(raft: &Raft<TypeConfig>) -> Duration {
    Duration::from_millis(raft.config().election_timeout_min)
}

/// The index of the last entry this node's state machine applied.
fn applied_index(raft: &Raft<TypeConfig>) -> u64 {
    raft.metrics().borrow().last_applied.map_or(0, |l| l.index)
}

/// The leader this node follows and its peer address.
fn leader_peer(raft: &Raft<TypeConfig>) -> Result<(NodeId, String), String> {
    let m = raft.metrics();
    let m = m.borrow();
    let Some(leader) = m.current_leader.filter(|l| *l != m.id) else {
        return Err("no other leader known".into());
    };
    // A learner applies the same log: its reads are as good.
    if !matches!(
        m.state,
        openraft::ServerState::Follower | openraft::ServerState::Learner
    ) {
        return Err("not a follower".into());
    }
    let Some(node) = m.membership_config.membership().get_node(&leader) else {
        return Err("the leader is not a member".into());
    };
    Ok((leader, cluster::MemberAddr::parse(&node.addr).peer))
}

/// Debug builds only, for fault tests: with `IDEMD_TEST_CRASH=POINT:FILE`,
/// the process exits at once (no clean-up, as under kill -9) the first
/// time any node reaches `point` while FILE does not exist (it is created
/// first: one node of a cluster started with it crashes there, once).
/// Points: `retired` (`CLUSTER REMOVE` recorded the id as retired and has
/// not removed the member yet), `uniform` (a uniform membership is about
/// to be appended after a joint one: the second step of a change of
/// voters).
#[cfg(debug_assertions)]
pub(crate) fn crash_point(point: &str) {
    let Ok(v) = std::env::var("IDEMD_TEST_CRASH") else {
        return;
    };
    if let Some((p, file)) = v.split_once(':')
        && p == point
        && std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
            .is_ok()
    {
        eprintln!("IDEMD_TEST_CRASH: exiting at {point}");
        std::process::exit(137);
    }
}

#[cfg(not(debug_assertions))]
pub(crate) fn crash_point(_point: &str) {}

/// Starts serving peer connections (from the listener, or those accepted
/// by the caller), once.
fn serve_peers(
    listener: &mut Option<tokio::net::TcpListener>,
    incoming: &mut Option<peer::Incoming>,
    peers: &Arc<peer::Peers>,
    tls: Option<&Arc<crate::tls::Tls>>,
) {
    if let Some(l) = listener.take() {
        let tls = tls.filter(|t| t.settings().cluster).cloned();
        tokio::spawn(peer::serve(l, Arc::clone(peers), tls));
    }
    if let Some(rx) = incoming.take() {
        tokio::spawn(peer::serve_incoming(rx, Arc::clone(peers)));
    }
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
    /// and starts the Raft node. A single node (no peer address) returns
    /// once it leads and has applied its log; a cluster node returns once
    /// it listens for peers (and, if its data directory is new, has
    /// bootstrapped or may be added), whether or not a leader is known.
    pub async fn start(
        cfg: RaftConfig,
        store: Arc<Store>,
        io: EngineIo,
    ) -> Result<RaftEngine, StartError> {
        fs::create_dir_all(&cfg.data_dir).map_err(|e| StartError::DataDir {
            path: cfg.data_dir.clone(),
            // (`File exists` for a file where the directory should be.)
            reason: match fs::metadata(&cfg.data_dir) {
                Ok(m) if !m.is_dir() => "is not a directory (a file is there)".to_owned(),
                _ => e.to_string(),
            },
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
        let log = LogStore::open(&log_dir, cfg.segment_bytes, io.writing)?;
        if cfg.cluster.peer_listen.is_none() {
            log.inline_below(INLINE_APPEND_BELOW);
        }
        let mut sm = StateMachine::open(Arc::clone(&store), &data_dir)?
            .snapshots_on_own_thread(io.writing == log_store::Writing::Thread)
            .reporting_to(log.clone())
            .replaying_upto(log.replay_boundary());
        own_directory(
            &log,
            &mut sm,
            cfg.node_id,
            &data_dir,
            cfg.cluster.peer_listen.is_none(),
        )
        .await?;
        keep_earlier_votes(
            &data_dir,
            cfg.election_timeout_ms,
            cfg.cluster.peer_listen.is_some(),
        )
        .await?;
        let stepped_down = step_down_at_restart(&log, &mut sm, cfg.node_id).await?;
        let peers = peer::Peers::new(
            cfg.node_id,
            cfg.cluster.client_advertise.clone(),
            cfg.cluster.secret.clone(),
            data_dir.clone(),
            io.dialer
                .unwrap_or_else(|| match cfg.tls.clone().filter(|t| t.settings().cluster) {
                    Some(tls) => Arc::new(peer::TlsDialer(tls)),
                    None => Arc::new(peer::TcpDialer),
                }),
            peer::PeerLimits {
                max_connections: cfg.cluster.max_peer_connections,
                max_handshakes_per_source: cfg.cluster.max_peer_handshakes_per_source,
                max_receive_bytes: cfg.cluster.max_peer_receive_bytes,
            },
        )
        .map_err(|reason| StartError::DataDir {
            path: data_dir.clone(),
            reason,
        })?;
        let raft_config = openraft::Config {
            cluster_name: "idem".into(),
            heartbeat_interval: (cfg.election_timeout_ms / 3).max(1),
            // openraft's own deadline; the peer client gives up at its
            // soft deadline, three quarters of it: append_timeout_ms.
            append_entries_timeout: cfg.append_timeout_ms.saturating_mul(4) / 3,
            // Under load the next batch follows a commit within a fraction
            // of this and carries it to the followers: an AppendEntries of
            // its own for every commit would double their messages.
            commit_send_delay: COMMIT_SEND_DELAY_MS,
            // Followers answer in the order they read (peer::serve_conn).
            max_inflight_appends: cfg.max_inflight_appends.clamp(1, peer::READ_AHEAD) as u64,
            election_timeout_min: cfg.election_timeout_ms,
            election_timeout_max: cfg.election_timeout_ms * 2,
            // A follower keeps a leader it heard from for this long (it
            // refuses other candidates, and campaigns only after this
            // plus an election timeout): longer than the leader serves on
            // a majority's answer (four fifths of it, counted from when
            // the leader sent what they answered), so two leaders never
            // serve at once. openraft's default, election_timeout_max,
            // twice this, made every failover wait 300 ms more.
            leader_lease: cfg.election_timeout_ms,
            // Asked for by `snapshot_when_due`, by entries and bytes.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: 0,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            max_payload_entries: payload_entries(cfg.max_batch_bytes, cfg.max_request_bytes),
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let raft = Raft::new(
            cfg.node_id,
            Arc::new(raft_config),
            peer::PeerNetwork {
                peers: Arc::clone(&peers),
            },
            log.clone(),
            sm.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        peers.set_raft(raft.clone());
        if stepped_down {
            // No campaign of its own until it hears of a leader, or a
            // leader's lease and the longest election timeout have
            // passed: a campaign in the term the others elected a leader
            // in meanwhile would outrank that leader whenever this node's
            // id is the higher, and depose it. The leader reaches it well
            // within that time.
            raft.runtime_config().elect(false);
            let (raft, peers) = (raft.clone(), Arc::clone(&peers));
            let hold = Duration::from_millis(cfg.election_timeout_ms.saturating_mul(3));
            tokio::spawn(async move {
                let _ = raft
                    .wait(Some(hold))
                    .metrics(|m| m.current_leader.is_some(), "a leader heard of")
                    .await;
                // (A node the members refuse as removed campaigns no more.)
                raft.runtime_config().elect(!peers.told_removed());
            });
        }
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let clustered = cfg.cluster.peer_listen.is_some();
        let me = cluster::MemberAddr {
            client: cfg.cluster.client_advertise.clone(),
            peer: cfg.cluster.peer_advertise.clone(),
            retired: Default::default(),
            inc: None,
        };
        if initialized && peers.cluster().is_none() {
            // A directory from before cluster ids: this node's group is
            // the cluster.
            peers
                .set_cluster(peer::random16())
                .map_err(|e| cluster::refuse(format!("cannot record the cluster id: {e}")))?;
        }
        let mut incoming = io.incoming;
        let listener = match cfg.cluster.peer_listen {
            _ if incoming.is_some() => None,
            Some(addr) => Some(
                crate::server::bind_listener(addr, 511)
                    .map_err(|source| StartError::PeerListen { addr, source })?,
            ),
            None => None,
        };
        let lowest =
            cfg.cluster.initial_cluster.iter().map(|(id, _)| *id).min() == Some(cfg.node_id);
        // A new node that does not bootstrap asks the others first, before
        // it answers Raft traffic (so what it finds is not its own doing).
        let mut listener = listener;
        if initialized || lowest {
            serve_peers(&mut listener, &mut incoming, &peers, cfg.tls.as_ref());
        }
        if !initialized {
            if clustered {
                cluster::bootstrap(&raft, &peers, &cfg.cluster).await?;
            } else {
                let mut members = BTreeMap::new();
                members.insert(cfg.node_id, me.node());
                raft.initialize(members)
                    .await
                    .map_err(|e| StartError::Raft(e.to_string()))?;
                peers
                    .set_cluster(peer::random16())
                    .map_err(|e| cluster::refuse(format!("cannot record the cluster id: {e}")))?;
                info!(dir = %data_dir.display(), "initialized a new single-node raft group");
            }
        }
        serve_peers(&mut listener, &mut incoming, &peers, cfg.tls.as_ref());
        let clock = store.stats().clock;
        let role = cluster::Role::new(
            Clock::starting_at(if clock == 0 {
                Clock::new().now_ms()
            } else {
                clock
            }),
            Duration::from_millis(cfg.election_timeout_ms * 2),
            // Below the shortest election timeout, with room for clocks
            // that run at slightly different rates.
            Duration::from_millis(cfg.election_timeout_ms * 4 / 5),
            // Requests wait out a lapse of the lease this long.
            Duration::from_millis(cfg.election_timeout_ms),
        );
        if stepped_down {
            role.recall_leader(cfg.node_id);
        }
        // A follower's linearizable read asks the leader for this index
        // and applies up to it first: every write acknowledged here was
        // committed, at or below it; and only while the lease holds, so
        // that no other leader can have acknowledged one meanwhile.
        let read_index_given = Arc::new(ReadIndexGiven::default());
        peers.set_read_index({
            let (role, raft, log) = (Arc::clone(&role), raft.clone(), log.clone());
            let given = Arc::clone(&read_index_given);
            Box::new(move || {
                let (role, raft, log, given) = (
                    Arc::clone(&role),
                    raft.clone(),
                    log.clone(),
                    Arc::clone(&given),
                );
                Box::pin(async move {
                    // A lapse of the lease holds the request, as it holds
                    // the leader's own (a redirect would send a replica
                    // reader back to a replica).
                    if let Some(until) = role.lease_hold_until() {
                        role.lease_regained(until).await;
                    }
                    if !role.serving() || !role.lease_holds() {
                        return Err("this node does not serve as leader now".into());
                    }
                    given.now();
                    Ok(log.committed_index().max(applied_index(&raft)))
                })
            })
        });
        let on_demoted: Arc<dyn Fn() + Send + Sync> = {
            let (sink, role, raft, peers) = (
                sm.sink(),
                Arc::clone(&role),
                raft.clone(),
                Arc::clone(&peers),
            );
            Arc::new(move || {
                if let Some(sink) = sink.get().and_then(std::sync::Weak::upgrade) {
                    sink.on_demoted(&|key: &[u8]| {
                        cluster::not_serving(&role, &raft, &peers, Some(key))
                    });
                }
            })
        };
        let watch = Arc::new(cluster::Watch {
            raft: raft.clone(),
            role: Arc::clone(&role),
            peers: Arc::clone(&peers),
            store: Arc::clone(&store),
            me,
            on_demoted,
            on_follower: {
                // A follower that gets one AppendEntries at a time writes
                // small ones itself (INLINE_APPEND_BELOW); a leader, and a
                // follower sent several at once, hand them to the thread.
                let log = log.clone();
                let one_at_a_time = clustered && cfg.max_inflight_appends <= 1;
                // Its answers to the leader go out before its applies.
                let sm = sm.clone();
                Arc::new(move |follower: bool| {
                    sm.answers_first(follower);
                    if one_at_a_time {
                        log.inline_below(if follower { INLINE_APPEND_BELOW } else { 0 });
                    }
                })
            },
        });
        tokio::spawn(cluster::watch_role(Arc::clone(&watch)));
        if clustered {
            tokio::spawn(cluster::record_incarnations(watch));
        }
        let stats = Arc::new(RaftStats::default());
        tokio::spawn(snapshot_when_due(
            raft.clone(),
            log.clone(),
            sm.clone(),
            SnapshotEvery {
                entries: cfg.snapshot_entries,
                bytes: cfg.snapshot_log_bytes,
                percent: cfg.snapshot_log_percent,
            },
            SnapshotTurns {
                turn: Duration::from_millis(cfg.snapshot_turn_ms),
            },
            Arc::clone(&stats),
        ));
        if !clustered {
            // A single node serves once it leads and has applied its log.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while !role.serving() {
                if tokio::time::Instant::now() > deadline {
                    return Err(StartError::Raft(
                        "the single node did not become leader within 30 s".into(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // Its membership is there now (a first start bootstraps it):
            // the directory is recorded as this node's.
            let m = raft.metrics().borrow().membership_config.clone();
            directory_of(m.membership(), cfg.node_id, &data_dir, true)?;
            #[cfg(debug_assertions)]
            if std::env::var("IDEMD_UNSAFE_TEST_REUSE_FENCES").is_ok_and(|v| v == "1") {
                tracing::error!(
                    "IDEMD_UNSAFE_TEST_REUSE_FENCES=1: fences handed out before are handed out again (test mode)"
                );
                store.unsafe_rewind_fences(8);
            }
        }
        let proposals = Arc::new(queue::Queue::new(
            cfg.max_pending_proposals,
            cfg.max_pending_proposal_bytes,
        ));
        tokio::spawn(propose(
            Proposer {
                raft: raft.clone(),
                role: Arc::clone(&role),
                peers: Arc::clone(&peers),
            },
            Arc::clone(&proposals),
            Limits {
                max_bytes: cfg.max_batch_bytes,
                min_free_disk: cfg.min_free_disk_bytes,
                dir: data_dir.clone(),
                proposal_timeout: Duration::from_millis(cfg.proposal_timeout_ms),
                inflight_appends: cfg.max_inflight_appends.clamp(1, peer::READ_AHEAD),
                poll: Duration::from_micros(cfg.leader_poll_us),
                gather_idle: Duration::from_micros(cfg.gather_idle_us),
                log: LogCap {
                    log: log.clone(),
                    sm: sm.clone(),
                    every: SnapshotEvery {
                        entries: cfg.snapshot_entries,
                        bytes: cfg.snapshot_log_bytes,
                        percent: cfg.snapshot_log_percent,
                    },
                },
            },
            Arc::clone(&stats),
        ));
        // What the snapshot and the entries known committed gave so far;
        // the log's other entries are applied once a leader commits them
        // (after an election, in a cluster).
        info!(
            dir = %data_dir.display(),
            node = cfg.node_id,
            applied = ?sm.last_applied(),
            records = store.len(),
            log_entries = log.held().0,
            "raft engine started (entries in the log not yet known committed are applied once a leader commits them)"
        );
        Ok(RaftEngine {
            raft,
            role,
            peers,
            cluster: cfg.cluster.clone(),
            proposals,
            log,
            sm,
            data_dir,
            stats,
            proposal_timeout: Duration::from_millis(cfg.proposal_timeout_ms),
            read_rounds: Arc::default(),
            read_index_given,
            _lock: lock,
        })
    }

    /// Where key events go.
    pub fn sink(&self) -> Arc<std::sync::OnceLock<std::sync::Weak<dyn super::EventSink>>> {
        self.sm.sink()
    }

    /// Proposes `op`; resolves once it is applied (its entry fsynced).
    ///
    /// When `max_pending_proposals` ops, or `max_pending_proposal_bytes`
    /// of them, are already queued, the op waits for room (its connection
    /// keeps at most `max_pending_per_connection` requests in progress,
    /// then stops reading, and its requests count toward
    /// `max_client_memory_bytes` meanwhile), within the proposal timeout.
    pub fn submit(&self, op: Op) -> super::Submission {
        // Not the serving leader (or cut off from the majority): answered
        // at once, never proposed.
        if let Err(e) = self.route(op.key().map(|k| &k[..])) {
            return super::Submission::Ready(Some(Err(e)));
        }
        self.submit_routed(op)
    }

    /// [`RaftEngine::submit`] for a caller that has just found that this
    /// node serves `op`'s key ([`RaftEngine::route`]), with nothing in
    /// between that could wait: the check is not made twice (each reads
    /// the clocks, for every command).
    pub fn submit_routed(&self, op: Op) -> super::Submission {
        let (tx, rx) = oneshot::channel();
        let bytes = op_size(&op);
        let state = Arc::new(AtomicU8::new(QUEUED));
        let proposal = Proposal {
            op,
            bytes,
            tx,
            state: Arc::clone(&state),
        };
        let waiting = match self.proposals.try_push(proposal) {
            Ok(()) => None,
            Err(queue::Refused::Full(p)) => Some((Arc::clone(&self.proposals), p)),
            Err(queue::Refused::Closed) => {
                return super::Submission::Ready(Some(Err(EngineError::TryAgain(
                    "the engine is stopping",
                ))));
            }
        };
        let timeout = self.proposal_timeout;
        let clustered = self.clustered();
        // A leader of several voters stops waiting for a majority once it
        // is cut off from it (answered below), not at the deadline only.
        let role = self.role.replicated().then(|| Arc::clone(&self.role));
        let full = waiting.is_some();
        let fut = Box::pin(async move {
            let now = tokio::time::Instant::now();
            let deadline = now + timeout;
            if let Some((proposals, p)) = waiting {
                match tokio::time::timeout_at(deadline, proposals.push(p)).await {
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
            // The engine stopped without an answer: once the proposer took
            // the write, it may be in the log.
            let stopped = |state: &AtomicU8| {
                EngineError::TryAgain(if state.load(Ordering::Acquire) == QUEUED {
                    "the engine is stopping"
                } else {
                    "the engine stopped after taking the write: it may have been applied"
                })
            };
            let mut now = now;
            loop {
                // Until the deadline, or until this leader would be cut
                // off if no majority answers it meanwhile.
                let wake = match role.as_ref().and_then(|r| r.cut_off_at()) {
                    Some(at) if at > now => at.min(deadline),
                    Some(_) if role.as_ref().is_some_and(|r| r.cut_off()) => {
                        return cut_off(&state, &mut rx);
                    }
                    _ => deadline,
                };
                match tokio::time::timeout_at(wake, &mut rx).await {
                    Ok(Ok(r)) => return r,
                    Ok(Err(_)) => return Err(stopped(&state)),
                    Err(_) if wake >= deadline => break,
                    Err(_) => now = tokio::time::Instant::now(),
                }
            }
            // Timed out: withdrawn if the proposer has not taken it yet (so
            // it is certainly not applied). Once taken into an entry, a
            // single node's outcome comes soon (a sync and an apply away),
            // and is the one to report; a cluster's may never come (no
            // majority), so it is reported unknown.
            if state
                .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Err(EngineError::TryAgain(
                    "not proposed within proposal_timeout_ms (withdrawn: not applied)",
                ));
            }
            if clustered {
                // An outcome that arrived right at the deadline is the one
                // to report.
                if let Ok(r) = rx.try_recv() {
                    return r;
                }
                // Proposed, but no majority committed it in time (this
                // node may be cut off): it may still be applied.
                return Err(EngineError::TryAgain(
                    "not committed within proposal_timeout_ms: it may have been applied",
                ));
            }
            rx.await.unwrap_or_else(|_| Err(stopped(&state)))
        });
        if full {
            super::Submission::Waiting(fut)
        } else {
            super::Submission::Pending(fut)
        }
    }

    /// The time now on the current term's stamp clock.
    pub fn now_ms(&self) -> u64 {
        self.role.clock().now_ms()
    }

    /// Until when a request is held for a lapsed lease to hold again
    /// ([`cluster::Role::lease_hold_until`]).
    pub fn lease_hold_until(&self) -> Option<tokio::time::Instant> {
        self.role.lease_hold_until()
    }

    /// Waits until the lease holds again, at most until `until`
    /// ([`cluster::Role::lease_regained`]).
    pub async fn lease_regained(&self, until: tokio::time::Instant) -> bool {
        self.role.lease_regained(until).await
    }

    /// Makes this follower's store current for a linearizable read: asks
    /// the leader for its read index ([`peer::Peers::read_index`]) and
    /// waits until this node has applied up to it, within
    /// `election_timeout_ms`. An error (no leader known, the leader does
    /// not serve or cannot be reached, this node is not a follower, or it
    /// did not apply in time) says only that the read must go to the
    /// leader.
    ///
    /// The read joins a round of asking the leader when this is called,
    /// not when the future is first polled: a connection awaits its
    /// pipelined reads one after the other, and they share rounds this way
    /// (each took a round of its own).
    pub fn follower_read_barrier(
        &self,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send + 'static + use<> {
        let raft = self.raft.clone();
        let ttl = election_timeout(&raft);
        // One deadline for all of it: a round already out, its own, and
        // the apply.
        let deadline = tokio::time::Instant::now() + ttl;
        // Not a follower of a known leader: not worth a round.
        let enrolled = leader_peer(&raft).and_then(|_| self.read_rounds.enroll(&raft, &self.peers));
        let rounds = Arc::clone(&self.read_rounds);
        async move {
            let rx = enrolled?;
            let current = tokio::time::timeout_at(deadline, async {
                let index = rx.await.unwrap_or_else(|_| Err("stopped".into()))?;
                raft.wait(None)
                    .applied_index_at_least(Some(index), "a follower's read")
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|_| Err("no read index applied within election_timeout_ms".into()));
            if current.is_err() {
                rounds.redirected.fetch_add(1, Ordering::Relaxed);
            }
            current
        }
    }

    /// On a leader whose state machine has not applied everything
    /// committed yet: waits until it has (at most `election_timeout_ms`),
    /// so that its reads never miss a write a follower, applying on its
    /// own, may already have shown. `None` when nothing is to wait for.
    pub fn leader_read_wait(&self) -> Option<impl std::future::Future<Output = ()> + use<>> {
        if !self.read_index_given.ever() {
            return None;
        }
        let committed = self.log.committed_index();
        (applied_index(&self.raft) < committed).then(|| {
            let raft = self.raft.clone();
            let ttl = election_timeout(&raft);
            async move {
                let _ = raft
                    .wait(Some(ttl))
                    .applied_index_at_least(Some(committed), "a leader's read")
                    .await;
            }
        })
    }

    /// Whether this node serves commands on `key`; otherwise where to go.
    pub fn route(&self, key: Option<&[u8]>) -> Result<(), EngineError> {
        if self.role.serving() && self.role.lease_holds() {
            return Ok(());
        }
        Err(cluster::not_serving(
            &self.role,
            &self.raft,
            &self.peers,
            key,
        ))
    }

    /// The cluster as this node sees it.
    pub fn cluster_view(&self) -> cluster::ClusterView {
        cluster::ClusterView::of(&self.raft, &self.role, &self.peers)
    }

    /// Whether this node leads and serves clients now.
    pub fn serving(&self) -> bool {
        self.role.serving()
    }

    /// Whether this node has a peer address (is, or may become, one of
    /// several).
    pub fn clustered(&self) -> bool {
        self.cluster.peer_listen.is_some()
    }

    /// Runs a membership change on the leader.
    pub async fn change(&self, change: MembershipChange) -> Result<(), cluster::ChangeError> {
        self.route(None).map_err(cluster::ChangeError::NotLeader)?;
        if !self.clustered() {
            return Err(cluster::ChangeError::Refused(
                "this node has no peer address: restart it with --peer-listen (node id 1) to grow it into a cluster".into(),
            ));
        }
        // As for peer_listen: the log goes to no address off this host
        // unless peers prove they hold the secret.
        if let MembershipChange::Add { addr, .. } = &change
            && let Ok(peer) = addr.peer.parse::<std::net::SocketAddr>()
            && !peer.ip().to_canonical().is_loopback()
            && self.cluster.secret.is_none()
        {
            return Err(cluster::ChangeError::Refused(format!(
                "peer address {peer} is not a loopback address: set cluster_secret (the same on every node) before adding a member off this host"
            )));
        }
        // The change runs in a task of its own, to its end: openraft's
        // two-step change (joint, then uniform) is driven by the caller,
        // and cut off after the first it would leave the cluster in joint
        // consensus. Only the wait for it is bounded (a change without a
        // majority would hold this connection for good).
        let (raft, role, peers) = (
            self.raft.clone(),
            Arc::clone(&self.role),
            Arc::clone(&self.peers),
        );
        let max_lag = self.cluster.promote_max_lag_entries;
        let task = tokio::spawn(async move {
            // One change at a time on this node, each on the membership as
            // it is once the previous one is done.
            let _one_at_a_time = role.membership_changes().await;
            let view = cluster::ClusterView::of(&raft, &role, &peers);
            match change {
                MembershipChange::Add { id, addr } => {
                    cluster::add_member(&raft, &view, id, addr).await
                }
                MembershipChange::Promote(id) => {
                    cluster::promote_member(&raft, &view, id, max_lag).await
                }
                MembershipChange::Remove(id) => cluster::remove_member(&raft, &view, id).await,
            }
        });
        match tokio::time::timeout(self.proposal_timeout, task).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => Err(cluster::ChangeError::Unsure(format!(
                "the change stopped: {e}; it may have been applied: see CLUSTER MEMBERS"
            ))),
            Err(_) => Err(cluster::ChangeError::Unsure(
                "the change was not committed within proposal_timeout_ms (is a majority of the voters up?); it goes on, and may still be applied: see CLUSTER MEMBERS".into(),
            )),
        }
    }

    /// While leases are live (`in_flight()`) and nothing was stamped for
    /// [`TICK_MS`] ([`SINGLE_TICK_MS`] on a single node), proposes an empty
    /// entry, so the logged clock follows the serving node's: a lease that
    /// reads on this leader saw run out is not in flight again on the next
    /// leader (which continues from the clock last applied), and a single
    /// node restarted continues from where its clock was when it stopped,
    /// not from its last write (its leases came back longer by the time it
    /// sat idle before the stop). Returns whether it proposed one.
    pub fn tick_if_idle(&self, in_flight: impl FnOnce() -> bool) -> bool {
        if !self.role.serving() {
            return false;
        }
        let last = self.stats.last_stamp_ms.load(Ordering::Relaxed);
        let now = self.now_ms();
        // A stamp ahead of the clock is from an earlier term's entry that
        // may never commit: it does not count.
        // Whether leases are live is asked last: it looks at every shard.
        let tick = if self.clustered() {
            TICK_MS
        } else {
            SINGLE_TICK_MS
        };
        if (last <= now && now - last < tick) || !in_flight() {
            return false;
        }
        if let super::Submission::Pending(f) | super::Submission::Waiting(f) =
            self.submit(Op::Expire { keys: Vec::new() })
        {
            tokio::spawn(f);
        }
        true
    }

    /// The data directory (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Resolves once the Raft core has stopped on an error (a storage
    /// error: a snapshot that cannot be installed or read, say) or
    /// panicked, with that error; never if it runs on or stops because it
    /// was shut down. A core that failed takes no more entries and leads
    /// no more: the node only answers errors until it is restarted, so
    /// idemd exits (see the `idemd` binary).
    pub async fn failure(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state
                && !matches!(fatal, openraft::error::Fatal::Stopped)
            {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                // The core is gone. A shutdown says so first; a core that
                // panicked says nothing.
                if matches!(
                    metrics.borrow().running_state,
                    Err(openraft::error::Fatal::Stopped)
                ) {
                    return std::future::pending().await;
                }
                return "the raft core ended without a word (it panicked)".into();
            }
        }
    }

    /// What INFO reports of the engine.
    pub fn info(&self) -> RaftInfo {
        let m = self.raft.metrics().borrow().clone();
        let snapshots = self.sm.snapshot_stats();
        let (entries, ops) = self.log.appended();
        let (fsyncs, fsync_p50_us, fsync_p99_us) = self.log.syncs();
        let fsyncs_inline = self.log.inlined();
        let (log_entries, log_bytes) = self.log.held();
        let (appends_sent, appends_empty) = self.peers.appends();
        let appends_pipelined = self.peers.appends_pipelined();
        let (lease_lapses, lease_held, lease_held_failed) = self.role.lease_counts();
        RaftInfo {
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            // What openraft last saved as committed; an applied entry is
            // committed too (a follower that caught up by a snapshot saves
            // nothing until the next commit).
            commit_index: self
                .log
                .committed_index()
                .max(m.last_applied.map_or(0, |l| l.index)),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: snapshots.last_log_id.map_or(0, |l| l.index),
            snapshots_built: snapshots.built,
            snapshot_secs: snapshots.last_secs,
            snapshot_pause_ms: snapshots.last_pause_ms,
            snapshot_pause_max_ms: snapshots.max_pause_ms,
            leader: m.current_leader == Some(m.id),
            leader_known: m.current_leader.is_some(),
            quorum_lost: self.role.quorum_lost(),
            // openraft lists the leader among its replication targets.
            followers: m
                .replication
                .as_ref()
                .map_or(0, |r| r.keys().filter(|id| **id != m.id).count() as u64),
            fsyncs,
            fsyncs_inline,
            fsync_p50_us,
            fsync_p99_us,
            fsync_total_us: self.log.syncs_total_us(),
            entries,
            ops,
            log_entries,
            log_bytes,
            peer_timeouts: self.peers.timeouts(),
            quick_elections: self.peers.quick_campaigns(),
            appends_sent,
            appends_empty,
            appends_pipelined,
            leader_polls: self.stats.polls.load(Ordering::Relaxed),
            leader_polls_answered: self.stats.polls_answered.load(Ordering::Relaxed),
            gathers_expecting: self.stats.gathers_expecting.load(Ordering::Relaxed),
            gathers_expecting_met: self.stats.gathers_expecting_met.load(Ordering::Relaxed),
            snapshot_turn_waits: self.stats.snapshot_turn_waits.load(Ordering::Relaxed),
            disk_full_refusals: self.stats.disk_full_refusals.load(Ordering::Relaxed),
            log_full_waits: self.stats.log_full_waits.load(Ordering::Relaxed),
            lease_lapses,
            lease_held,
            lease_held_failed,
            leader_changes: self.role.leader_changes(),
            lease_ms: self.role.lease().as_millis() as u64,
            follower_reads: self.read_rounds.reads.load(Ordering::Relaxed),
            read_index_rounds: self.read_rounds.rounds.load(Ordering::Relaxed),
            follower_reads_redirected: self.read_rounds.redirected.load(Ordering::Relaxed),
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

    /// Lets go of what the proposal queue kept from a burst (called when
    /// the server has gone quiet).
    pub fn trim(&self) {
        self.proposals.trim();
    }

    /// Stops the Raft core.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "raft did not shut down cleanly");
        }
        let sm = self.sm.clone();
        if tokio::task::spawn_blocking(move || sm.stop())
            .await
            .is_err()
        {
            self.sm.stop();
        }
    }
}

impl Drop for RaftEngine {
    fn drop(&mut self) {
        // The proposer answers what is queued, then stops.
        self.proposals.close();
        // No snapshot is written once the directory's lock is let go of.
        self.sm.stop();
    }
}

/// A membership change (`CLUSTER ADD|PROMOTE|REMOVE`).
#[derive(Debug, Clone)]
pub enum MembershipChange {
    /// Add a learner.
    Add {
        /// Its id.
        id: NodeId,
        /// Its addresses.
        addr: cluster::MemberAddr,
    },
    /// Make a learner a voter.
    Promote(NodeId),
    /// Remove a member.
    Remove(NodeId),
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
    /// Whether this node leads but has gone without a majority for longer
    /// than an election takes ([`cluster::Role::quorum_lost`]).
    pub quorum_lost: bool,
    /// Nodes the leader replicates to (0 on a follower).
    pub followers: u64,
    /// Log `fdatasync`s since start.
    pub fsyncs: u64,
    /// Of those, the ones done by the task that appended instead of the
    /// log writer thread ([`INLINE_APPEND_BELOW`]).
    pub fsyncs_inline: u64,
    /// Their median time, µs.
    pub fsync_p50_us: u64,
    /// Their 99th percentile time, µs.
    pub fsync_p99_us: u64,
    /// Their total time, µs.
    pub fsync_total_us: u64,
    /// Entries appended to this node's log since start (on a follower,
    /// the ones its leader sent).
    pub entries: u64,
    /// The commands in them.
    pub ops: u64,
    /// Log entries held (not yet covered by a snapshot and purged).
    pub log_entries: u64,
    /// Their size: what the log takes in memory, bytes.
    pub log_bytes: u64,
    /// Calls to peers that got no answer by their deadline, since start.
    pub peer_timeouts: u64,
    /// Campaigns started because the leader's connection closed and
    /// nothing came from it for its lease, since start.
    pub quick_elections: u64,
    /// AppendEntries sent to peers since start.
    pub appends_sent: u64,
    /// Of those, the ones with no entries: heartbeats, and news of a
    /// commit that no entries followed within `COMMIT_SEND_DELAY_MS`.
    pub appends_empty: u64,
    /// Of those, the ones with entries sent while another to the same peer
    /// was not answered yet (`max_inflight_appends`).
    pub appends_pipelined: u64,
    /// Entries whose answer this leader polled for (`leader_poll_us`),
    /// since start.
    pub leader_polls: u64,
    /// Of those, the ones answered while it polled.
    pub leader_polls_answered: u64,
    /// Entries this leader gathered until as many writes as it answered
    /// since its previous entry came (`gather_idle_us`), since start.
    pub gathers_expecting: u64,
    /// Of those, the ones for which they all came.
    pub gathers_expecting_met: u64,
    /// Snapshots that fell due and waited for this node's turn, since
    /// start.
    pub snapshot_turn_waits: u64,
    /// Writes refused for lack of disk space (`min_free_disk_bytes`),
    /// since start.
    pub disk_full_refusals: u64,
    /// Times writes waited for a snapshot, the log held at its cap (four
    /// times what makes a snapshot due), since start.
    pub log_full_waits: u64,
    /// Times this leader's lease lapsed (no majority answered it within
    /// it), since start.
    pub lease_lapses: u64,
    /// Times a leader became known that differs from the last one known
    /// (the first included), since start.
    pub leader_changes: u64,
    /// Requests held while it had lapsed, until a majority answered again
    /// (at most `election_timeout_ms`), since start.
    pub lease_held: u64,
    /// Of those, the ones not served after all (no majority answered in
    /// time, or this node stopped leading): answered as routing says.
    pub lease_held_failed: u64,
    /// How long a leader here serves on a majority's answers, ms: four
    /// fifths of `election_timeout_ms`, or of a voter's if smaller.
    pub lease_ms: u64,
    /// Reads on this follower after READONLY that asked for the leader's
    /// read index (answered here once it came and was applied, else
    /// redirected), since start.
    pub follower_reads: u64,
    /// Requests for the leader's read index sent for them (one serves
    /// every read waiting when it is sent), since start.
    pub read_index_rounds: u64,
    /// Of the follower reads, those that went to the leader after all (no
    /// read index came, or it was not applied within
    /// `election_timeout_ms`), since start.
    pub follower_reads_redirected: u64,
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

/// How often a node looks at the log since its last snapshot.
const SNAPSHOT_CHECK: Duration = Duration::from_millis(100);

/// A snapshot asked for that did not start (openraft was busy) is asked
/// for again after this.
const SNAPSHOT_ASK_AGAIN: Duration = Duration::from_secs(10);

/// When a snapshot is due: once the log applied past the latest one holds
/// `entries` entries, or `bytes` bytes, or `percent` of the latest
/// snapshot file's size if that is more. Every node counts its own log (a
/// follower's grows with what its leader sends), since each holds it in
/// memory until a snapshot covers it. Bytes, not only entries: entries
/// are up to `max_batch_bytes` each. Growing with the store, as Redis
/// spaces its AOF rewrites (`auto-aof-rewrite-percentage`): a snapshot
/// writes the whole store, so at a fixed spacing a large store spent most
/// of its CPU on snapshots (three nodes of 2-3M records, claims at
/// pipeline 16: one node's snapshot every 5 s, each taking most of a
/// core); the log then takes at most `percent` of the snapshot's size in
/// memory.
#[derive(Debug, Clone, Copy)]
struct SnapshotEvery {
    entries: u64,
    bytes: u64,
    percent: u64,
}

impl SnapshotEvery {
    /// The entries and bytes of log past the latest snapshot, of
    /// `latest_file_bytes`, at which the next is due.
    fn thresholds(&self, latest_file_bytes: u64) -> (u64, u64) {
        let grown = latest_file_bytes.saturating_mul(self.percent) / 100;
        (self.entries.max(1), self.bytes.max(grown).max(1))
    }

    /// Whether a snapshot is due with `entries` entries of `bytes` logged
    /// past the latest snapshot, of `latest_file_bytes`.
    fn due(&self, entries: u64, bytes: u64, latest_file_bytes: u64) -> bool {
        let (max_entries, max_bytes) = self.thresholds(latest_file_bytes);
        entries >= max_entries || bytes >= max_bytes
    }

    /// Whether the log has grown to twice what makes a snapshot due: it
    /// is then taken without waiting for this node's turn.
    fn overdue(&self, entries: u64, bytes: u64, latest_file_bytes: u64) -> bool {
        let (max_entries, max_bytes) = self.thresholds(latest_file_bytes);
        entries >= max_entries.saturating_mul(2) || bytes >= max_bytes.saturating_mul(2)
    }
}

/// The voters of a cluster take their snapshots in turns of
/// `snapshot_turn_ms`, in the order of their ids, by the wall clock (one
/// turn in `voters` is each one's): a due snapshot waits for its node's
/// turn, at most one round, and not at all once the log has grown to
/// twice what made it due (or for a learner, or a single node, or with
/// `snapshot_turn_ms` 0).
///
/// Every node applies the same log, so every node's snapshot fell due at
/// the same moment, and all of them wrote the whole store at once, on the
/// same machines' cores and disks, slowing the very nodes a commit waits
/// for (three nodes on two cores, claims at pipeline 16: each snapshot
/// took 2.5-6.4 s together, 0.5-3 s in turns). In turns, a quorum of
/// nodes that are not snapshotting remains. The clocks only spread the
/// turns: nodes whose clocks disagree snapshot together at worst, as
/// before.
#[derive(Debug, Clone, Copy)]
struct SnapshotTurns {
    turn: Duration,
}

impl SnapshotTurns {
    /// Whether the voter at `rank` (by id) of `voters` has its turn at
    /// `now` (since the Unix epoch).
    fn mine(&self, now: Duration, rank: usize, voters: usize) -> bool {
        let turn = self.turn.as_millis();
        if turn == 0 || voters <= 1 {
            return true;
        }
        (now.as_millis() / turn) % voters as u128 == rank as u128
    }

    /// One round of turns: the longest a due snapshot waits for its own.
    fn round(&self, voters: usize) -> Duration {
        self.turn
            .saturating_mul(u32::try_from(voters).unwrap_or(u32::MAX))
    }
}

/// On every node, whatever its role: asks openraft for a snapshot when
/// one is due (see [`SnapshotEvery`]) and, in a cluster, it is this
/// voter's turn (see [`SnapshotTurns`]), looking after each append to the
/// log and every [`SNAPSHOT_CHECK`]; not while one is being built, and
/// not twice for the same log unless the first ask did not start one
/// within [`SNAPSHOT_ASK_AGAIN`]. Ends with the Raft core.
async fn snapshot_when_due(
    raft: Raft<TypeConfig>,
    log: LogStore,
    sm: StateMachine,
    every: SnapshotEvery,
    turns: SnapshotTurns,
    stats: Arc<RaftStats>,
) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let metrics = raft.metrics();
    let grown = log.grown();
    // What the latest snapshot covered when one was last asked for, and
    // when.
    let mut asked: Option<(Option<LogId>, tokio::time::Instant)> = None;
    // Since when a snapshot has been due, and whether its wait for this
    // node's turn was counted.
    let mut due_since: Option<(tokio::time::Instant, bool)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = grown.notified() => {}
        }
        // The core stopped: its metrics' sender is gone, or it failed.
        if metrics.has_changed().is_err() || metrics.borrow().running_state.is_err() {
            return;
        }
        let latest = sm.snapshot_stats();
        if latest.building {
            continue;
        }
        if let Some((covered, at)) = asked
            && covered == latest.last_log_id
            && at.elapsed() < SNAPSHOT_ASK_AGAIN
        {
            continue;
        }
        // What a snapshot would cover now beyond the latest: the entries
        // applied since (a follower catching up holds many more, which no
        // snapshot can cover yet).
        let applied = sm.last_applied();
        if applied <= latest.last_log_id {
            continue;
        }
        let (entries, bytes) = log.held_between(
            latest.last_log_id.map(|l| l.index),
            applied.map_or(0, |l| l.index),
        );
        if !every.due(entries, bytes, latest.file_bytes) {
            due_since = None;
            continue;
        }
        let (since, counted) = due_since.get_or_insert((tokio::time::Instant::now(), false));
        let (rank, voters) = {
            let m = metrics.borrow();
            let ids: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
            (ids.iter().position(|&id| id == m.id), ids.len())
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        if let Some(rank) = rank
            && !every.overdue(entries, bytes, latest.file_bytes)
            && since.elapsed() < turns.round(voters)
            && !turns.mine(now, rank, voters)
        {
            if !*counted {
                *counted = true;
                stats.snapshot_turn_waits.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        due_since = None;
        asked = Some((latest.last_log_id, tokio::time::Instant::now()));
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// What the proposer checks before writing, and how it waits.
struct Limits {
    max_bytes: usize,
    min_free_disk: u64,
    dir: PathBuf,
    /// `proposal_timeout_ms`: past it an entry no longer holds its place
    /// in flight.
    proposal_timeout: Duration,
    /// `max_inflight_appends`: entries in flight at most when replicated.
    inflight_appends: usize,
    /// `leader_poll_us`.
    poll: Duration,
    /// `gather_idle_us`.
    gather_idle: Duration,
    /// How much log may be held before the writes wait for a snapshot.
    log: LogCap,
}

/// The log the node that takes the writes holds (in memory and on disk;
/// a follower's is not bounded here) is bounded: at
/// [`LOG_CAP_FACTOR`] times the bytes that make a snapshot due, the
/// proposer takes no more writes until a snapshot lets the log be purged
/// (they wait in the queue, within `proposal_timeout_ms`). A snapshot that
/// took long (a large store written while large values poured in at
/// 110 MB/s: 11 s) let the log grow at the write rate meanwhile: 1.16 GB
/// held against a 64 MiB threshold, the process peaking at 2.57 GB for
/// 370 MB of records.
struct LogCap {
    log: LogStore,
    sm: StateMachine,
    every: SnapshotEvery,
}

/// See [`LogCap`]: four times what makes a snapshot due (at twice, one is
/// taken without waiting for this node's turn).
const LOG_CAP_FACTOR: u64 = 4;

impl LogCap {
    /// Whether the log held has reached the cap.
    fn full(&self) -> bool {
        let (_, held) = self.log.held();
        let (_, due) = self.every.thresholds(self.sm.snapshot_stats().file_bytes);
        held >= due.saturating_mul(LOG_CAP_FACTOR)
    }
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

/// A node that led other members when it stopped does not lead again under the
/// same vote. openraft restores a node whose saved vote is its own
/// committed one as leader at once, in the same term; but a leader sends
/// its entries to the followers while it writes them itself (the vendored
/// openraft's `append_to_log_in_background`), so after a kill -9 its log can
/// lack entries the followers hold under that very term, and leading again
/// under it would hand the same log ids to other entries. Its vote is kept
/// (the same term, for itself) but no longer committed: it starts as a
/// follower, and an election in a later term decides (the most up-to-date
/// log wins). It still records the one vote this node cast in that term,
/// so it grants no vote Raft's rules would not. It was raised to the next
/// term once, which outranked the leader elected meanwhile in that very
/// term whenever this node's id was the higher (votes of a term are
/// ordered by node id): the restarted node refused that leader's
/// AppendEntries, and the leader stepped down, a second failover for
/// nothing. For the same reason it does not campaign until it hears of a
/// leader (or a lease and an election timeout pass): its own campaign in
/// that term would outrank the new leader too. Returns whether it stepped
/// down. A node alone in its membership waits for each flush before it
/// commits (and replicates to no one), so it leads again at once as
/// before.
/// Refuses a data directory that is another node's (see
/// [`peer::check_node_id`]), before anything is written to it.
async fn own_directory(
    log: &LogStore,
    sm: &mut StateMachine,
    me: NodeId,
    dir: &std::path::Path,
    alone: bool,
) -> Result<(), StartError> {
    use openraft::storage::StorageHelper;
    let mut log = log.clone();
    let membership = StorageHelper::new(&mut log, sm)
        .get_membership()
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    directory_of(membership.effective().membership(), me, dir, alone)
}

/// [`peer::check_node_id`] against `membership`'s members and the data
/// directories it recorded for them; `alone`: the node has no peer
/// address.
fn directory_of(
    membership: &openraft::Membership<NodeId, openraft::BasicNode>,
    me: NodeId,
    dir: &std::path::Path,
    alone: bool,
) -> Result<(), StartError> {
    let members: Vec<(NodeId, Option<u64>)> = membership
        .nodes()
        .map(|(id, n)| (*id, cluster::MemberAddr::parse(&n.addr).inc))
        .collect();
    peer::check_node_id(dir, me, &members, alone).map_err(|reason| StartError::DataDir {
        path: dir.to_owned(),
        reason,
    })
}

/// The file in the data directory holding the `election_timeout_ms` the
/// node last started with.
const ELECTION_TIMEOUT_FILE: &str = "election-timeout-ms";

/// Keeps the promise this node made before it stopped. A follower that
/// answered its leader votes for no other candidate (and does not
/// campaign) for its `election_timeout_ms` after that, and its leader
/// serves on those answers for four fifths of it; after a restart
/// openraft counts that time again from the start, with the value given
/// now. Started with a smaller value than the one it last ran with (in a
/// cluster), it could help elect another leader while its old leader, cut
/// off, still served reads on what it answered before (a leader given
/// 3000 ms whose followers came back with 300 answered reads with what a
/// new leader had overwritten). So it first waits out the difference:
/// from its restart, which came after its last answer, that makes the old
/// value at least. Then it records the value it runs with. A larger value
/// than before, or a first start, starts at once; so does a node started
/// without a peer address (whose vote nobody waits for meanwhile), which
/// never lowers the record: started in a cluster again, it still waits.
/// A directory from a build before this record has none: such a node
/// starts at once (the docs ask for the value to be kept on that restart).
async fn keep_earlier_votes(dir: &Path, now_ms: u64, clustered: bool) -> Result<(), StartError> {
    let path = dir.join(ELECTION_TIMEOUT_FILE);
    let bad = |reason: String| StartError::DataDir {
        path: path.clone(),
        reason,
    };
    let before = match fs::read_to_string(&path) {
        // (A value past the largest taken waits no longer than that.)
        Ok(s) => Some(
            s.trim()
                .parse::<u64>()
                .map_err(|_| {
                    bad(format!(
                        "not a number of milliseconds ({s:?}); it holds the election_timeout_ms this node last ran with: write that value there, or a larger one"
                    ))
                })?
                .min(*crate::config::ELECTION_TIMEOUT_MS.end()),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(bad(e.to_string())),
    };
    if let Some(before) = before.filter(|&b| clustered && b > now_ms) {
        let wait = before - now_ms;
        warn!(
            before_ms = before,
            now_ms,
            wait_ms = wait,
            "election_timeout_ms is smaller than this node last ran with: it joins its cluster only after the difference, while its earlier promise not to vote for another leader may still run"
        );
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
    let record = if clustered {
        now_ms
    } else {
        before.map_or(now_ms, |b| b.max(now_ms))
    };
    if before != Some(record) {
        wal::replace_file(dir, ELECTION_TIMEOUT_FILE, format!("{record}\n").as_bytes())
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

async fn step_down_at_restart(
    log: &LogStore,
    sm: &mut StateMachine,
    me: NodeId,
) -> Result<bool, StartError> {
    use openraft::storage::{RaftLogStorage, StorageHelper};
    let mut log = log.clone();
    let vote = log
        .read_vote()
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    let Some(v) = vote.filter(|v| v.is_committed() && v.leader_id().voted_for() == Some(me)) else {
        return Ok(false);
    };
    // The membership it led (the last in its log, else the applied one):
    // the same test as the one that sends a leader's writes beside its own.
    let membership = StorageHelper::new(&mut log, sm)
        .get_membership()
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    if membership.effective().nodes().nth(1).is_some() {
        let term = v.leader_id().get_term();
        log.save_vote(&types::Vote::new(term, me))
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        info!(
            term,
            "this node led when it stopped: it rejoins as a follower, and an election in a later term decides who leads"
        );
        return Ok(true);
    }
    Ok(false)
}

/// What the proposer writes through.
struct Proposer {
    raft: Raft<TypeConfig>,
    role: Arc<cluster::Role>,
    peers: Arc<peer::Peers>,
}

/// The proposer: takes every pending proposal (up to the caps), stamps
/// them, writes them as one entry, and answers each with its own reply.
/// While this node does not serve (it does not lead, or has not applied
/// the log of earlier terms yet), proposals are answered with the redirect
/// instead: they were never proposed.
async fn propose(p: Proposer, proposals: Arc<queue::Queue>, limits: Limits, stats: Arc<RaftStats>) {
    let raft = &p.raft;
    let mut disk_full = false;
    // Places: a single voter's entry takes `depth` of them (two in
    // flight), a replicated one MAX_INFLIGHT_ENTRIES (`depth` in flight).
    let depth = limits.inflight_appends;
    let inflight = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_ENTRIES * depth));
    // Writes answered since the latest gather began: as many are expected
    // back (see GATHER_IDLE_US).
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The queue's arrivals when the first of those writes was answered:
    // the requests they bring back are the ones queued after it.
    let answered_mark = Arc::new(AtomicU64::new(0));
    loop {
        // At most MAX_INFLIGHT_ENTRIES entries in flight
        // (max_inflight_appends when replicated): while they are written
        // and applied, proposals gather for the next one.
        let places = if p.role.replicated() {
            MAX_INFLIGHT_ENTRIES as u32
        } else {
            depth as u32
        };
        let Ok(permit) = Arc::clone(&inflight).acquire_many_owned(places).await else {
            return;
        };
        let expect = answered.swap(0, Ordering::AcqRel);
        let since = answered_mark.load(Ordering::Acquire);
        if p.role.replicated() && !limits.gather_idle.is_zero() && expect > 0 {
            stats.gathers_expecting.fetch_add(1, Ordering::Relaxed);
            if proposals
                .gather_expected(expect, since, limits.gather_idle, GATHER_MAX)
                .await
            {
                stats.gathers_expecting_met.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            proposals.gather(GATHER_POLLS).await;
        }
        if limits.log.full() {
            stats.log_full_waits.fetch_add(1, Ordering::Relaxed);
            static LOGGED: crate::metrics::LogEvery = crate::metrics::LogEvery::new();
            if let Some(times) = LOGGED.due() {
                warn!(
                    times,
                    "the log holds four times what makes a snapshot due: writes wait until a snapshot is written (logged at most every 10 s)"
                );
            }
            // Not while this node stops leading (its writes are then
            // answered with the redirect) or stops.
            while limits.log.full() && p.role.serving() && !proposals.is_closed() {
                tokio::time::sleep(LOG_FULL_RECHECK).await;
            }
        }
        let Some(queue::Batch { ops, txs, .. }) =
            proposals.next_batch(MAX_BATCH_OPS, limits.max_bytes).await
        else {
            return;
        };
        if !p.role.serving() {
            for (op, tx) in ops.iter().zip(txs) {
                let _ = tx.send(Err(cluster::not_serving(
                    &p.role,
                    raft,
                    &p.peers,
                    op.key().map(|k| &k[..]),
                )));
            }
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
            stats
                .disk_full_refusals
                .fetch_add(txs.len() as u64, Ordering::Relaxed);
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
        // Stamped as it goes to the log, not while it waited: leases and
        // retention start no earlier than the write does.
        let entry = Entry {
            stamp_ms: p.role.clock().now_ms(),
            ops,
        };
        stats.last_stamp_ms.store(entry.stamp_ms, Ordering::Relaxed);
        let rx = match raft.client_write_ff(Batch::new(&entry)).await {
            Ok(rx) => rx,
            Err(e) => {
                warn!(error = %e, "the raft core stopped");
                fail(txs, "the log could not take the write");
                continue;
            }
        };
        let hold = limits.proposal_timeout;
        let poll = if p.role.replicated() {
            limits.poll
        } else {
            Duration::ZERO
        };
        let stats = Arc::clone(&stats);
        let answered = Arc::clone(&answered);
        let answered_mark = Arc::clone(&answered_mark);
        let queue = Arc::clone(&proposals);
        let role = Arc::clone(&p.role);
        tokio::spawn(async move {
            // The entry's place in flight is given back at its answer, or
            // after proposal_timeout_ms without one (in a cluster its
            // callers have had their -TRYAGAIN by then; a single node's
            // wait for the answer): an answer that never comes must not
            // stop this node's writes for good.
            let mut rx = rx;
            let mut permit = Some(permit);
            let answer = match poll_for(&mut rx, poll, &stats).await {
                Some(answer) => answer,
                None => match tokio::select! {
                    a = tokio::time::timeout(hold, &mut rx) => Some(a),
                    // A leader that stops serving first (it removed
                    // itself: openraft keeps it leader of a membership
                    // without it, and the entry is never answered) tells
                    // the callers at once, and the writes queued behind
                    // it get their redirect, instead of all waiting out
                    // proposal_timeout_ms.
                    () = role.stopped_serving() => None,
                } {
                    Some(Ok(answer)) => answer,
                    None => match rx.try_recv() {
                        // Answered right as it stopped: that answer stands.
                        Ok(answer) => Ok(answer),
                        Err(_) => {
                            fail(
                                txs,
                                "this node stopped leading after the write was proposed: it may have been applied",
                            );
                            return;
                        }
                    },
                    Some(Err(_)) => {
                        warn!(
                            proposal_timeout_ms = hold.as_millis() as u64,
                            "an entry is not answered within proposal_timeout_ms: later writes no longer wait for it"
                        );
                        permit = None;
                        rx.await
                    }
                },
            };
            // Answered, whatever the outcome: its callers may write again,
            // and their requests are the ones queued from now on.
            let mark = queue.arrived();
            if answered.load(Ordering::Acquire) == 0 {
                answered_mark.store(mark, Ordering::Release);
            }
            answered.fetch_add(txs.len(), Ordering::AcqRel);
            match answer {
                Ok(Ok(resp)) => {
                    for (tx, applied) in txs.into_iter().zip(resp.data.0) {
                        let _ = tx.send(Ok(applied));
                    }
                }
                Ok(Err(openraft::error::ClientWriteError::ForwardToLeader(_))) => {
                    // Proposed, then leadership moved: the entry may still
                    // be committed by the next leader.
                    fail(
                        txs,
                        "leadership changed after the write was proposed: it may have been applied",
                    );
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "a proposal failed");
                    fail(txs, "the log could not take the write");
                }
                Err(_) => fail(
                    txs,
                    "the raft core stopped after the write was proposed: it may have been applied",
                ),
            }
            drop(permit);
        });
    }
}

/// How often writes held at the log's cap ([`LogCap`]) look again.
const LOG_FULL_RECHECK: Duration = Duration::from_millis(5);

/// Entries written and not yet applied, at most, on a single voter. Two:
/// while one is applied and answered, the next is already being written
/// (measured at 50 connections: pipeline 1 went from 18k to 24k claims/s
/// and pipeline 16 from 138k to 160k against one). More are worse at
/// pipeline 1 (with the log writer thread, 5 alternating runs each: two
/// 25.4k, four 21.8k, eight 20.5k): smaller entries cost more Raft work
/// per command. A leader with followers keeps `max_inflight_appends`
/// (default one): with one AppendEntries at a time to each follower, a
/// second entry would only wait for the first's answer, and splitting the
/// writes that gathered meanwhile over two entries costs more per command
/// (three nodes on loopback, 50 connections at pipeline 1, alternating:
/// claims 20.4k/s against 18.5k over six runs each, claim + complete 10.4k
/// against 8.9k over three; pipeline 16 the same within the noise).
const MAX_INFLIGHT_ENTRIES: usize = 2;

/// Times the proposer lets the runtime poll its sockets before it takes a
/// batch, at most, while each poll brings more proposals
/// ([`queue::Queue::gather`]). An entry's answers go out together, and the
/// clients they answer send their next requests at once; without these
/// polls the proposer took the queue before those requests were read, so
/// the clients split into two groups that took turns, each waiting a whole
/// round for the other's entry. Three nodes on loopback, 50 connections at
/// pipeline 1 (alternating builds): 24.8 claims an entry became 39-45, and
/// claims went from 29.2k and 36.0k to 45.3k and 46.4k a second.
const GATHER_POLLS: usize = 4;

/// The default `gather_idle_us`. An entry's answers go out together and
/// the clients they answer write again, but their next requests reach the
/// leader spread over a few hundred µs (its own replies go out one by
/// one): taking the queue once the polls of [`GATHER_POLLS`] bring nothing
/// left a few of them behind each time (at 50 connections, pipeline 1, an
/// entry carried 41 claims on average), and those waited a whole round for
/// the entry after. So a leader with followers that answered N writes
/// since its last entry keeps polling (yields: its sockets are read
/// meanwhile) until N more were queued after the first of those answers
/// (what was queued before it joins the entry but is not counted: those
/// come from clients answered earlier, and counting them sent the entry
/// with only some of the clients just answered, so that the clients
/// stayed split in two groups, each waiting a whole round for the
/// other's entry; driven by redis-benchmark, entries carried 32 claims
/// where they now carry 41), or none arrived for this long, or
/// [`GATHER_MAX`] passed: entries then carried 48. Three nodes on loopback
/// sharing two cores, 50 connections, pipeline 1, alternating 5 s runs:
/// claims 53.6k/s taking what had arrived against 61.0k waiting up to
/// 25 µs for the next (five rounds), 56.5k against 59.2k (six), 54.6k
/// against 57.3k (eight, ahead in six pairs of eight); 10 µs
/// (55.8k against 56.5k) is shorter than the gaps between requests, 50 µs
/// (57.4k against 55.0k, eight rounds) and 100 µs (54.7k against 53.6k)
/// wait on stragglers longer than they gain. Claim + complete at pipeline 1
/// 26.1k against 29.2k (six rounds; four rounds before, 24.4k against
/// 23.4k), claims at pipeline 16 within the noise (240.5k against 232.6k
/// at 50 µs, 244.0k against 252.2k at 25 µs, four or five rounds).
/// Measured again on a later build (fresh clusters, `redis-benchmark` at
/// 50 connections, alternating 200k-claim turns): at 25 µs a gather ended
/// early on one entry in seven (entries carried 45.8 claims), at 80 µs
/// on one in fifty (49.5: every client in every entry), and claims went
/// from 61.6k-65.6k to 65.8k-68.1k a second (50 µs in between; 70.0k at
/// 80 µs with 600 µs as the most a gather waits, within the noise of
/// 300 µs); `idem-bench` 63.4k-66.6k against 68.0k-68.7k, claim +
/// complete, pipeline 16, and 5 or 200 connections within the noise.
/// Nothing waits when no writes were answered (a lone request goes at
/// once), nor on a single node, whose log write is not a network round.
pub const GATHER_IDLE_US: u64 = 80;

/// How long a gather waits for the writes its answers bring back, at
/// most ([`GATHER_IDLE_US`]): a third of a round on the cluster above.
const GATHER_MAX: Duration = Duration::from_micros(300);

/// Entries in one AppendEntries, at most: 64 MiB of them, well under the
/// peer frame limit, counting each as large as the largest entry can be
/// (`max_batch_bytes` of ops, or one op as large as the largest request:
/// a single op over the batch cap goes alone).
fn payload_entries(max_batch_bytes: usize, max_request_bytes: usize) -> u64 {
    // What an op adds to the request's bytes, and the entry's header.
    const ENTRY_SLACK: usize = 4096;
    let largest = max_batch_bytes.max(max_request_bytes + ENTRY_SLACK);
    ((64 << 20) / largest.max(1) as u64).clamp(1, MAX_PAYLOAD_ENTRIES)
}

/// Polls for `rx`'s answer for up to `poll` ([`LEADER_POLL_US`]): yields
/// until it comes (each yield lets the runtime poll its sockets and run
/// what they woke), unless another entry's answer is being polled for.
/// `None` if it has not come (or nothing was polled).
async fn poll_for<T>(
    rx: &mut oneshot::Receiver<T>,
    poll: Duration,
    stats: &RaftStats,
) -> Option<Result<T, oneshot::error::RecvError>> {
    if poll.is_zero() || stats.polling.swap(true, Ordering::Acquire) {
        return None;
    }
    stats.polls.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let mut answer = None;
    while started.elapsed() < poll {
        tokio::task::yield_now().await;
        if let Some(a) = futures_util::FutureExt::now_or_never(&mut *rx) {
            stats.polls_answered.fetch_add(1, Ordering::Relaxed);
            answer = Some(a);
            break;
        }
    }
    stats.polling.store(false, Ordering::Release);
    answer
}

fn fail(txs: Vec<oneshot::Sender<Submitted>>, why: &'static str) {
    for tx in txs {
        let _ = tx.send(Err(EngineError::TryAgain(why)));
    }
}

#[cfg(test)]
mod tests;
