//! The node: everything a connection needs, behind one cheap `Clone`
//! handle with private fields (the engine, the waiters, the configuration,
//! the client registry and the counters).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::acl::{Acl, AclLog, Denial};

use crate::clients::Clients;
use crate::clock::Clock;
use crate::cmdstats::CmdStats;
use crate::config::{Config, EngineKind};
use crate::engine::Engine;
use crate::engine::raft::{EngineIo, StartError};
use crate::metrics::Metrics;
use crate::store::Op;
use crate::waiters::Waiters;

struct Inner {
    engine: Arc<Engine>,
    waiters: Arc<Waiters>,
    config: Config,
    clients: Clients,
    metrics: Metrics,
    /// Calls, time and errors by command (INFO commandstats, errorstats,
    /// latencystats).
    cmdstats: CmdStats,
    started: Instant,
    /// 40 random hex digits, new at each start (INFO's `run_id`).
    run_id: String,
    /// The address configured, until the listener is bound.
    configured: SocketAddr,
    bound: OnceLock<SocketAddr>,
    /// The users in force (`ACL LOAD` replaces them).
    acl: RwLock<Arc<Acl>>,
    /// Bumped at each `ACL LOAD`: connections then look their user up again.
    acl_epoch: AtomicU64,
    /// The latest denials (`ACL LOG`).
    acl_log: Mutex<AclLog>,
    /// Held while `ACL LOAD` reads the file and puts it in force.
    acl_loading: Mutex<()>,
}

/// A node of Idem: a cheap handle.
#[derive(Clone)]
pub struct Node(Arc<Inner>);

impl Node {
    /// A node serving on `local_addr` with `config`, its engine started
    /// (for raft: the log replayed) and its memory limits applied.
    ///
    /// # Errors
    ///
    /// When the raft engine cannot start (its data directory).
    pub async fn start(config: Config, local_addr: SocketAddr) -> Result<Node, StartError> {
        Node::start_with(config, local_addr, EngineIo::default()).await
    }

    /// [`Node::start`], the raft engine reaching its peers and writing its
    /// log as `io` says (a simulation's network; see [`EngineIo`]).
    ///
    /// # Errors
    ///
    /// When the raft engine cannot start (its data directory).
    pub async fn start_with(
        config: Config,
        local_addr: SocketAddr,
        io: EngineIo,
    ) -> Result<Node, StartError> {
        let engine = match config.engine {
            EngineKind::Memory => Engine::memory(config.store.clone(), Clock::new()),
            EngineKind::Raft => Engine::raft(config.raft.clone(), config.store.clone(), io).await?,
        };
        Ok(Node::with_engine(config, local_addr, engine))
    }

    /// A node over a memory engine on a given clock.
    pub fn with_clock(config: Config, local_addr: SocketAddr, clock: Clock) -> Node {
        let engine = Engine::memory(config.store.clone(), clock);
        Node::with_engine(config, local_addr, engine)
    }

    fn with_engine(config: Config, local_addr: SocketAddr, engine: Engine) -> Node {
        let engine = Arc::new(engine);
        // The limits are replicated state: they take effect through the
        // engine like any write (when they differ from what is in force).
        if engine.limits() != config.memory {
            engine.detach(Op::SetLimits(config.memory));
        }
        // A cluster's node does not lead when it starts (that write is
        // refused), and the leader may change: whichever node serves
        // writes its own limits whenever they are not the ones in force.
        if engine.raft_engine().is_some_and(|r| r.clustered())
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(keep_limits(Arc::downgrade(&engine), config.memory));
        }
        let waiters = Waiters::new(Arc::clone(&engine), config.defaults, config.wait_limits);
        let clients = Clients::with_budget(config.max_client_memory_bytes);
        let acl = RwLock::new(Arc::clone(&config.acl));
        let cmdstats = CmdStats::new(config.worker_threads);
        Node(Arc::new(Inner {
            engine,
            waiters,
            acl,
            acl_epoch: AtomicU64::new(0),
            acl_log: Mutex::new(AclLog::default()),
            acl_loading: Mutex::new(()),
            config,
            clients,
            metrics: Metrics::default(),
            cmdstats,
            started: Instant::now(),
            run_id: new_run_id(),
            configured: local_addr,
            bound: OnceLock::new(),
        }))
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.0.engine
    }

    /// Parked requests.
    pub fn waiters(&self) -> &Arc<Waiters> {
        &self.0.waiters
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.0.config
    }

    /// Connected clients.
    pub fn clients(&self) -> &Clients {
        &self.0.clients
    }

    /// Connection-layer counters.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// Calls, time and errors by command.
    pub fn cmdstats(&self) -> &CmdStats {
        &self.0.cmdstats
    }

    /// When the node started.
    pub fn started(&self) -> Instant {
        self.0.started
    }

    /// This process's run id: 40 random hex digits, new at each start, as
    /// Redis's INFO `run_id` (monitoring tells a restart by it).
    pub fn run_id(&self) -> &str {
        &self.0.run_id
    }

    /// The address actually bound (the configured one until then).
    pub fn local_addr(&self) -> SocketAddr {
        self.0.bound.get().copied().unwrap_or(self.0.configured)
    }

    /// Records the address the listener got (once).
    pub fn set_bound(&self, addr: SocketAddr) {
        let _ = self.0.bound.set(addr);
    }

    /// The users in force.
    pub fn acl(&self) -> Arc<Acl> {
        Arc::clone(&self.0.acl.read())
    }

    /// Which generation of users is in force (bumped by [`Node::set_acl`]).
    pub fn acl_epoch(&self) -> u64 {
        self.0.acl_epoch.load(Ordering::Acquire)
    }

    /// Puts `acl` in force: connections look their user up again before
    /// their next command.
    pub fn set_acl(&self, acl: Acl) {
        *self.0.acl.write() = Arc::new(acl);
        self.0.acl_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Logs a denial (`ACL LOG`).
    pub fn log_denial(&self, denial: Denial) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.0.acl_log.lock().add(denial, now_ms);
    }

    /// Held by `ACL LOAD` from reading the file to putting it in force.
    pub fn acl_loading(&self) -> &Mutex<()> {
        &self.0.acl_loading
    }

    /// The denial log.
    pub fn acl_log(&self) -> &Mutex<AclLog> {
        &self.0.acl_log
    }
}

/// How often a cluster node checks that the limits in force are its own
/// while it leads.
const KEEP_LIMITS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// On a cluster node: while it leads and serves, proposes its configured
/// memory limits whenever they are not the ones in force (after it is
/// elected, and after a leader configured otherwise). Ends with the engine.
async fn keep_limits(engine: std::sync::Weak<Engine>, wanted: crate::store::MemoryLimits) {
    let mut tick = tokio::time::interval(KEEP_LIMITS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(e) = engine.upgrade() else {
            return;
        };
        if !e.raft_engine().is_some_and(|r| r.serving()) || e.limits() == wanted {
            continue;
        }
        let proposed = e.submit(Op::SetLimits(wanted));
        drop(e);
        if let crate::engine::Submission::Pending(f) | crate::engine::Submission::Waiting(f) =
            proposed
        {
            if let Err(err) = f.await {
                tracing::warn!(error = %err, "cannot write this node's memory limits: trying again");
            } else {
                tracing::info!(
                    max_memory_bytes = wanted.max_memory_bytes,
                    headroom_bytes = wanted.headroom_bytes,
                    "memory limits in force"
                );
            }
        }
    }
}

/// 40 random hex digits.
fn new_run_id() -> String {
    let (a, b) = (
        crate::engine::raft::peer::random16(),
        crate::engine::raft::peer::random16(),
    );
    a.iter()
        .chain(&b[..4])
        .map(|x| format!("{x:02x}"))
        .collect()
}
