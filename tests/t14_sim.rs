//! A simulation of a cluster under faults (turmoil): three or five idemd
//! nodes, each the real server (its raft engine, state machine, waiters
//! and dispatch) over a simulated network and simulated time, and clients
//! whose every call is recorded. A seeded schedule crashes and restarts
//! nodes (as kill -9 does: what was written survives; power loss is not
//! simulated), cuts nodes off from the
//! others, holds and releases the messages on links (delays) and changes
//! latencies. Then the faults heal, and:
//!
//! - the history checker (`support::history`) verifies the whole history:
//!   fences increase, one live lease per key, acknowledged COMPLETEs and
//!   JOURNALs are kept, stale owners are fenced (every key is claimed once
//!   more at the end, so a lost record shows);
//! - every node converges on the same applied index and the same store
//!   (byte for byte in the canonical snapshot encoding);
//! - no node's code panicked, and every node started again after a crash.
//!
//! `IDEM_SIM_SEEDS=N` runs N seeds per cluster size (default 10: 20 runs in
//! all; `IDEM_SIM_SALT=n` picks another sequence); `IDEM_SIM_SEED=S` runs
//! seed S alone (a failure names its seed).
//! The long run (documented in the README):
//! `IDEM_SIM_SEEDS=500 cargo test --release -p idem-server --test integration t14_sim`.
//!
//! The fault schedule, the workload and the network (latencies, delivery
//! order) follow the seed. openraft draws its election timeouts from its
//! own random source, so a seed replays the same faults and load, not
//! always the same interleaving.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use idem_protocol::{
    Command, ErrorCode, Frame, Limits, Reply, ServerError, Version, decode, encode,
};
use idem_server::config::RawConfig;
use idem_server::dispatch::{Action, dispatch};
use idem_server::engine::raft::EngineIo;
use idem_server::engine::raft::log_store::Writing;
use idem_server::engine::raft::peer::{Dialer, Dialing, PeerStream};
use idem_server::node::Node;
use idem_server::session::Session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use turmoil::net::{TcpListener, TcpStream};

use crate::support::history::{self, Call, Caller, Event, History, Rng};

const CLIENT_PORT: u16 = 6379;
const PEER_PORT: u16 = 7000;
/// How long faults are injected, simulated.
const FAULT_PHASE: Duration = Duration::from_secs(6);
/// How long a new cluster may take to elect its first leader.
const FORM_LIMIT: Duration = Duration::from_secs(20);
/// How long the cluster has to heal, answer every probe and converge.
const HEAL_LIMIT: Duration = Duration::from_secs(40);
/// Leases the clients ask for, ms: some outlive a failover.
const LEASES: &[u64] = &[150, 400, 1500];
/// Clients making calls at once.
const WORKERS: usize = 6;

thread_local! {
    /// Panics on this thread (a simulation runs on one thread).
    static PANICS: Cell<u64> = const { Cell::new(0) };
    /// The run's trace (calls, faults, role changes), written to a file
    /// when the run fails.
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn trace(line: String) {
    TRACE.with(|t| t.borrow_mut().push(line));
}

/// Writes the trace of a failed run; returns where.
fn save_trace(seed: u64, nodes: u64) -> String {
    let path = std::env::temp_dir().join(format!("idem-sim-{nodes}-{seed:x}.trace"));
    let text = TRACE.with(|t| t.borrow_mut().join("\n"));
    match std::fs::write(&path, text) {
        Ok(()) => format!("trace in {}", path.display()),
        Err(e) => format!("(trace not written: {e})"),
    }
}

/// Counts panics per thread, then reports them as before.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

/// Nodes started, by id; a node's entry goes when it crashes.
type Registry = Arc<Mutex<HashMap<u64, Node>>>;

/// Removes a node from the registry when its software is dropped (a
/// crash drops every task of the host).
struct Registered(u64, Registry);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut r) = self.1.lock() {
            r.remove(&self.0);
        }
    }
}

/// Dials peers over the simulated network.
struct SimDialer;

impl Dialer for SimDialer {
    fn dial(&self, addr: &str) -> Dialing {
        let addr = addr.to_owned();
        Box::pin(async move {
            let s = TcpStream::connect(addr).await?;
            Ok(Box::new(s) as Box<dyn PeerStream>)
        })
    }
}

fn host_name(id: u64) -> String {
    format!("n{id}")
}

/// The software of node `id`: the server, as idemd runs it, on the
/// simulated network.
async fn node_main(
    id: u64,
    ips: Vec<IpAddr>,
    dir: PathBuf,
    registry: Registry,
    inflight_appends: u64,
) -> turmoil::Result {
    let _registered = Registered(id, Arc::clone(&registry));
    let me = ips[id as usize - 1];
    let initial: Vec<String> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("{}={ip}:{PEER_PORT}", i + 1))
        .collect();
    let mut raw = RawConfig::default();
    for (k, v) in [
        ("engine", "raft".to_owned()),
        ("data_dir", dir.display().to_string()),
        ("node_id", id.to_string()),
        ("listen", format!("{me}:{CLIENT_PORT}")),
        ("peer_listen", format!("{me}:{PEER_PORT}")),
        ("initial_cluster", initial.join(",")),
        ("cluster_secret", "simulated-cluster-secret".to_owned()),
        ("proposal_timeout_ms", "1000".to_owned()),
        // Small, so snapshots are built, sent and installed often.
        ("snapshot_entries", "200".to_owned()),
        ("wal_segment_bytes", "65536".to_owned()),
        ("min_free_disk_bytes", "0".to_owned()),
        ("max_inflight_appends", inflight_appends.to_string()),
        // Polling for an answer (and gathering the writes answers bring
        // back) runs on the host's clock, while the simulated network
        // moves on only between the simulation's steps: it would never see
        // the answer, and would make each run's schedule depend on the
        // host's speed.
        ("leader_poll_us", "0".to_owned()),
        ("gather_idle_us", "0".to_owned()),
        // Turns to snapshot run on the host's wall clock.
        ("snapshot_turn_ms", "0".to_owned()),
    ] {
        raw.set(k, &v)?;
    }
    let config = raw.validate()?;
    let (sweep, scan, batch) = (
        Duration::from_millis(config.sweep_interval_ms),
        config.sweep_batch,
        config.expire_batch,
    );
    let peers = TcpListener::bind((Ipv4Addr::UNSPECIFIED, PEER_PORT)).await?;
    let clients = TcpListener::bind((Ipv4Addr::UNSPECIFIED, CLIENT_PORT)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Ok((s, addr)) = peers.accept().await {
            if tx
                .send((Box::new(s) as Box<dyn PeerStream>, addr))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let io = EngineIo {
        dialer: Some(Arc::new(SimDialer)),
        incoming: Some(rx),
        writing: Writing::Inline,
    };
    let local = SocketAddr::new(me, CLIENT_PORT);
    let node = Node::start_with(config, local, io).await?;
    registry.lock().unwrap().insert(id, node.clone());
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(Arc::clone(node.engine()).run_expiry(sweep, scan, batch, stop_rx));
    loop {
        let (s, addr) = clients.accept().await?;
        let node = node.clone();
        tokio::spawn(async move {
            let _ = serve_client(node, s, addr, local).await;
        });
    }
}

/// One client connection, one request at a time (the simulated clients
/// wait for each reply).
async fn serve_client(
    node: Node,
    mut s: TcpStream,
    addr: SocketAddr,
    local: SocketAddr,
) -> std::io::Result<()> {
    let info = node.clients().register(addr, local);
    let id = info.id;
    let mut session = Session::new(&node, info);
    let mut buf = BytesMut::new();
    let limits = Limits::for_replies();
    let result = async {
        loop {
            let frame = loop {
                match decode(&mut buf, &limits) {
                    Ok(Some(f)) => break f,
                    Ok(None) => {
                        if s.read_buf(&mut buf).await? == 0 {
                            return Ok(());
                        }
                    }
                    Err(e) => return Err(std::io::Error::other(e.to_string())),
                }
            };
            let reply = match Command::from_frame(frame) {
                Ok(cmd) => match dispatch(&node, &mut session, cmd) {
                    Action::Reply(r) | Action::Close(r) => r,
                    Action::Pending(later) | Action::Block(later) | Action::Read(later) => {
                        later.await
                    }
                },
                Err(e) => Reply::Error(ServerError::owned(ErrorCode::Err, e.to_string())),
            };
            let mut out = BytesMut::new();
            reply.encode(session.version, &mut out);
            s.write_all(&out).await?;
        }
    }
    .await;
    node.clients().unregister(id);
    result
}

/// A recording client of the simulated cluster: follows `-MOVED`; a lost
/// connection, a timeout, `-TRYAGAIN` or `-CLUSTERDOWN` leave the outcome
/// unknown (recorded so), and the next call tries another node.
struct SimClient {
    client: usize,
    nodes: Vec<SocketAddr>,
    at: usize,
    conn: Option<(TcpStream, BytesMut)>,
    history: History,
    rng: Rng,
    /// After this, calls are not made (and `None` is returned).
    stop_at: Option<Instant>,
}

impl SimClient {
    fn new(client: usize, nodes: Vec<SocketAddr>, history: &History, seed: u64) -> SimClient {
        let mut rng = Rng(seed);
        SimClient {
            client,
            at: rng.below(nodes.len() as u64) as usize,
            nodes,
            conn: None,
            history: history.clone(),
            rng,
            stop_at: None,
        }
    }

    fn elsewhere(&mut self) {
        self.conn = None;
        self.at = self.rng.below(self.nodes.len() as u64) as usize;
    }

    /// One request to the current node: its reply, or `None` (the
    /// connection is dropped).
    async fn request(&mut self, args: &[String]) -> Option<Frame> {
        if self.conn.is_none() {
            let addr = self.nodes[self.at];
            let s = tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr))
                .await
                .ok()?
                .ok()?;
            self.conn = Some((s, BytesMut::new()));
        }
        let (s, buf) = self.conn.as_mut()?;
        let mut out = BytesMut::new();
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(bytes::Bytes::copy_from_slice(a.as_bytes())))
                .collect(),
        );
        encode(&frame, Version::Resp2, &mut out);
        let exchange = async {
            s.write_all(&out).await.ok()?;
            loop {
                if let Some(f) = decode(buf, &Limits::for_replies()).ok()? {
                    return Some(f);
                }
                if s.read_buf(buf).await.ok()? == 0 {
                    return None;
                }
            }
        };
        let reply = tokio::time::timeout(Duration::from_secs(3), exchange)
            .await
            .ok()
            .flatten();
        if reply.is_none() {
            self.conn = None;
        }
        reply
    }

    async fn exchange(&mut self, call: &Call) -> Option<Frame> {
        let args = call.args();
        for _ in 0..5 {
            let Some(reply) = self.request(&args).await else {
                self.elsewhere();
                return None;
            };
            let Frame::Error(e) = &reply else {
                return Some(reply);
            };
            let text = String::from_utf8_lossy(e).into_owned();
            if text.starts_with("TRYAGAIN") || text.starts_with("CLUSTERDOWN") {
                self.elsewhere();
                return None;
            }
            let Some(addr) = text
                .strip_prefix("MOVED ")
                .and_then(|m| m.split_whitespace().nth(1))
                .and_then(|a| a.parse::<SocketAddr>().ok())
            else {
                return Some(reply);
            };
            // Not applied: asked again at the node named.
            let Some(i) = self.nodes.iter().position(|n| *n == addr) else {
                return Some(reply);
            };
            self.at = i;
            self.conn = None;
        }
        None
    }
}

impl Caller for SimClient {
    async fn call(&mut self, call: Call) -> Option<Frame> {
        let invoke = Instant::now();
        if self.stop_at.is_some_and(|t| invoke >= t) {
            // Not made, so not recorded.
            return None;
        }
        let reply = self.exchange(&call).await;
        trace(format!(
            "{:.3}s c{} n{} {call:?} -> {reply:?}",
            turmoil::elapsed().as_secs_f64(),
            self.client,
            self.at + 1,
        ));
        self.history.record(Event {
            client: self.client,
            call,
            invoke,
            reply: reply.clone().map(|r| (Instant::now(), r)),
        });
        reply
    }
}

/// The faults one step of the schedule may bring.
#[derive(Debug)]
enum Fault {
    Crash(u64),
    Restart(u64),
    Bounce(u64),
    Isolate(u64),
    Hold(u64, u64),
    Latency(u64),
    Heal,
}

/// A run's data directories, removed when it ends.
struct Run {
    nodes: u64,
    dir: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sim_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("idem-sim-{}", std::process::id()))
}

/// Runs one seed; the error names every violation.
fn run(seed: u64, nodes: u64) -> Result<String, String> {
    count_panics();
    PANICS.with(|p| p.set(0));
    let r = Run {
        nodes,
        dir: sim_root().join(format!("{nodes}-{seed:x}")),
    };
    let _ = std::fs::remove_dir_all(&r.dir);
    std::fs::create_dir_all(&r.dir).map_err(|e| e.to_string())?;
    let mut plan = Rng(seed ^ 0x5eed_f1de);
    let latency = Duration::from_millis(1 + plan.below(10));
    // AppendEntries one at a time, or pipelined (a generator of its own,
    // so the faults and the load follow the seed as before).
    let inflight_appends = [1, 2, 4, 8][Rng(seed ^ 0xa9e7).below(4) as usize];
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(FORM_LIMIT + FAULT_PHASE + HEAL_LIMIT + Duration::from_secs(10))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(latency)
        .enable_random_order()
        .build();
    let ips: Vec<IpAddr> = (1..=r.nodes).map(|id| sim.lookup(host_name(id))).collect();
    let registry: Registry = Arc::default();
    for id in 1..=r.nodes {
        let (ips, dir, registry) = (
            ips.clone(),
            r.dir.join(host_name(id)),
            Arc::clone(&registry),
        );
        sim.host(host_name(id), move || {
            node_main(
                id,
                ips.clone(),
                dir.clone(),
                Arc::clone(&registry),
                inflight_appends,
            )
        });
    }
    let history = History::default();
    let addrs: Vec<SocketAddr> = ips
        .iter()
        .map(|ip| SocketAddr::new(*ip, CLIENT_PORT))
        .collect();
    let probed = Arc::new(Mutex::new(None::<Result<(), String>>));
    // Set once the cluster has its first leader: the load and the faults
    // start then.
    let formed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (history, probed, formed) = (history.clone(), Arc::clone(&probed), Arc::clone(&formed));
        let mut load = Rng(seed ^ 0x10ad);
        let seeds: Vec<u64> = (0..=WORKERS).map(|_| load.below(u64::MAX)).collect();
        sim.client("clients", async move {
            while !formed.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let start = Instant::now();
            let mut tasks = Vec::new();
            for (w, s) in seeds.iter().take(WORKERS).enumerate() {
                let mut c = SimClient::new(w, addrs.clone(), &history, *s);
                c.stop_at = Some(start + FAULT_PHASE);
                // Two groups of workers contend for the same keys.
                let prefix = format!("k{}", w % 2);
                let mut rng = Rng(*s);
                tasks.push(tokio::task::spawn_local(async move {
                    while start.elapsed() < FAULT_PHASE {
                        history::owner_load(&mut c, &prefix, LEASES, &mut rng).await;
                        tokio::time::sleep(Duration::from_millis(10 + rng.below(40))).await;
                    }
                }));
            }
            for t in tasks {
                t.await?;
            }
            // The faults heal now; every key is claimed once more.
            let mut prober = SimClient::new(usize::MAX, addrs.clone(), &history, seeds[WORKERS]);
            let outcome = history::probe_and_check(&mut prober, &history, seed, 0).await;
            *probed.lock().unwrap() = Some(outcome);
            Ok(())
        });
    }
    // The fault schedule.
    let n = r.nodes;
    let mut down: Vec<u64> = Vec::new();
    let mut started = None;
    let mut next_fault = Duration::ZERO;
    let mut held: Vec<(u64, u64)> = Vec::new();
    let mut faults = Vec::new();
    let mut healed = false;
    let mut probe_done_at = None;
    let mut last_roles = String::new();
    TRACE.with(|t| t.borrow_mut().clear());
    loop {
        let finished = sim
            .step()
            .map_err(|e| format!("seed {seed:#x}: the simulation failed: {e}"))?;
        let now = sim.elapsed();
        let roles = roles(&registry);
        if roles != last_roles {
            trace(format!("{:.3}s roles {roles}", now.as_secs_f64()));
            last_roles = roles;
        }
        let Some(start) = started else {
            if leader_of(&registry, n).is_some() {
                started = Some(now);
                next_fault = now + Duration::from_millis(100 + plan.below(700));
                formed.store(true, std::sync::atomic::Ordering::Relaxed);
            } else if now > FORM_LIMIT {
                return Err(format!(
                    "seed {seed:#x}: no leader within {FORM_LIMIT:?} of starting: {}",
                    describe(&registry)
                ));
            }
            continue;
        };
        let elapsed = now - start;
        if !healed && now >= next_fault && elapsed < FAULT_PHASE {
            let can_crash = down.len() < ((n - 1) / 2) as usize;
            let fault = match plan.below(20) {
                0..=2 if can_crash => Fault::Crash(1 + plan.below(n)),
                3..=5 if can_crash => match current_leader(&registry) {
                    Some(id) => Fault::Crash(id),
                    None => Fault::Crash(1 + plan.below(n)),
                },
                0..=7 if !down.is_empty() => {
                    Fault::Restart(down[plan.below(down.len() as u64) as usize])
                }
                0..=9 => Fault::Bounce(1 + plan.below(n)),
                10..=11 => Fault::Isolate(1 + plan.below(n)),
                12..=13 => match current_leader(&registry) {
                    Some(id) => Fault::Isolate(id),
                    None => Fault::Isolate(1 + plan.below(n)),
                },
                14..=15 => Fault::Hold(1 + plan.below(n), 1 + plan.below(n)),
                16..=17 => Fault::Latency(1 + plan.below(40)),
                _ => Fault::Heal,
            };
            match fault {
                Fault::Crash(id) if !down.contains(&id) => {
                    sim.crash(host_name(id));
                    down.push(id);
                }
                Fault::Crash(_) => {}
                Fault::Restart(id) => {
                    sim.bounce(host_name(id));
                    down.retain(|d| *d != id);
                }
                Fault::Bounce(id) => {
                    sim.bounce(host_name(id));
                    down.retain(|d| *d != id);
                }
                Fault::Isolate(id) => {
                    for other in (1..=n).filter(|o| *o != id) {
                        sim.partition(host_name(id), host_name(other));
                    }
                }
                Fault::Hold(a, b) if a != b => {
                    sim.hold(host_name(a), host_name(b));
                    held.push((a, b));
                }
                Fault::Hold(..) => {}
                Fault::Latency(ms) => sim.set_max_message_latency(Duration::from_millis(ms)),
                Fault::Heal => heal(&sim, n, &mut held, latency),
            }
            faults.push(format!("{:.3}s {fault:?}", now.as_secs_f64()));
            trace(format!("{:.3}s fault {fault:?}", now.as_secs_f64()));
            next_fault = now + Duration::from_millis(100 + plan.below(500));
        }
        if !healed && elapsed >= FAULT_PHASE {
            heal(&sim, n, &mut held, latency);
            for id in down.drain(..) {
                sim.bounce(host_name(id));
            }
            healed = true;
        }
        if finished && probe_done_at.is_none() {
            probe_done_at = Some(now);
        }
        if let Some(at) = probe_done_at {
            // Every node on the same log and the same store.
            if let Some(state) = converged(&registry, n) {
                let probed = probed.lock().unwrap().take();
                let panics = PANICS.with(Cell::get);
                if panics > 0 {
                    return Err(format!(
                        "seed {seed:#x}: {panics} panics; faults: {faults:?}"
                    ));
                }
                let events = history.events();
                let answered = events.iter().filter(|e| e.reply.is_some()).count();
                return match probed {
                    Some(Ok(())) => Ok(format!(
                        "seed {seed:#x}: max_inflight_appends {inflight_appends} ({} pipelined by the nodes up now since they started), {} calls ({answered} answered), {} faults, converged at index {state} at {:.1}s; faults: {faults:?}",
                        per_node(&registry, "+", |_, i, _| i.appends_pipelined.to_string()),
                        events.len(),
                        faults.len(),
                        now.as_secs_f64()
                    )),
                    Some(Err(e)) => Err(format!(
                        "{e}\nmax_inflight_appends {inflight_appends}, faults: {faults:?}"
                    )),
                    None => Err(format!("seed {seed:#x}: the prober did not finish")),
                };
            }
            if now - at > Duration::from_secs(10) {
                return Err(format!(
                    "seed {seed:#x}: the nodes did not converge within 10 s of healing: {}; faults: {faults:?}",
                    describe(&registry)
                ));
            }
            // The nodes keep running after the clients are done.
            continue;
        }
        if elapsed > FAULT_PHASE + HEAL_LIMIT {
            return Err(format!(
                "seed {seed:#x}: the probe did not finish within {HEAL_LIMIT:?} of healing: {}; faults: {faults:?}",
                describe(&registry)
            ));
        }
    }
}

fn heal(sim: &turmoil::Sim<'_>, n: u64, held: &mut Vec<(u64, u64)>, latency: Duration) {
    for a in 1..=n {
        for b in (1..=n).filter(|b| *b != a) {
            sim.repair(host_name(a), host_name(b));
        }
    }
    for (a, b) in held.drain(..) {
        sim.release(host_name(a), host_name(b));
    }
    sim.set_max_message_latency(latency);
}

/// The leader, once all `n` nodes run and one leads.
fn leader_of(registry: &Registry, n: u64) -> Option<u64> {
    if registry.lock().unwrap().len() as u64 != n {
        return None;
    }
    current_leader(registry)
}

/// A running node that leads (and has applied its first entry).
fn current_leader(registry: &Registry) -> Option<u64> {
    let r = registry.lock().unwrap();
    r.iter()
        .find(|(_, node)| {
            node.engine()
                .raft_info()
                .is_some_and(|(i, _)| i.leader && i.applied_index > 0)
        })
        .map(|(id, _)| *id)
}

/// The applied index every node reached, once all `n` run and agree on
/// the log and the store.
fn converged(registry: &Registry, n: u64) -> Option<u64> {
    let r = registry.lock().unwrap();
    if r.len() as u64 != n {
        return None;
    }
    let mut seen: Option<(u64, Vec<u8>)> = None;
    for node in r.values() {
        let (info, _) = node.engine().raft_info()?;
        if info.applied_index != info.last_log_index || info.applied_index != info.commit_index {
            return None;
        }
        let state = node.engine().state_bytes();
        match &seen {
            None => seen = Some((info.applied_index, state)),
            Some((i, s)) if *i == info.applied_index && *s == state => {}
            Some(_) => return None,
        }
    }
    seen.map(|(i, _)| i)
}

/// Each running node's engine state, by id, formatted by `show` and
/// joined with `sep`.
fn per_node(
    registry: &Registry,
    sep: &str,
    show: impl Fn(u64, idem_server::engine::raft::RaftInfo, &Node) -> String,
) -> String {
    let r = registry.lock().unwrap();
    let mut ids: Vec<&u64> = r.keys().collect();
    ids.sort();
    ids.iter()
        .map(|id| {
            let node = &r[*id];
            let info = node
                .engine()
                .raft_info()
                .map(|(i, _)| i)
                .unwrap_or_default();
            show(**id, info, node)
        })
        .collect::<Vec<_>>()
        .join(sep)
}

/// Who runs, who leads, in which term.
fn roles(registry: &Registry) -> String {
    per_node(registry, " ", |id, i, _| {
        format!("n{id}:t{}{}", i.term, if i.leader { "L" } else { "" })
    })
}

fn describe(registry: &Registry) -> String {
    per_node(registry, "; ", |id, info, node| {
        format!(
            "n{id}: term {} leader {} commit {} applied {} last {} records {}",
            info.term,
            info.leader,
            info.commit_index,
            info.applied_index,
            info.last_log_index,
            node.engine().len()
        )
    })
}

/// The seeds to run: `IDEM_SIM_SEED` alone, or the first `IDEM_SIM_SEEDS`
/// (default 10) of a fixed sequence.
fn seeds(salt: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("IDEM_SIM_SEED").ok().and_then(|s| {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        }
    }) {
        return vec![s];
    }
    let count = std::env::var("IDEM_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10u64);
    let base = std::env::var("IDEM_SIM_SALT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let mut rng = Rng(salt ^ base.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..count).map(|_| rng.below(u64::MAX)).collect()
}

fn run_all(nodes: u64, salt: u64) {
    let mut failed = Vec::new();
    for seed in seeds(salt) {
        match run(seed, nodes) {
            Ok(summary) => eprintln!("sim {nodes} nodes: {summary}"),
            Err(e) => {
                let e = format!("{e}\n{}", save_trace(seed, nodes));
                eprintln!("sim {nodes} nodes: FAILED {e}");
                failed.push(e);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

#[test]
fn three_nodes_keep_every_promise_under_simulated_faults() {
    run_all(3, 3);
}

#[test]
fn five_nodes_keep_every_promise_under_simulated_faults() {
    run_all(5, 5);
}
