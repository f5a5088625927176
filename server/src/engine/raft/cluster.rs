//! The cluster: member addresses, bootstrap, and who serves.
//!
//! # Member addresses
//!
//! openraft's `BasicNode { addr }` of each member holds
//! `CLIENT_ADDR@PEER_ADDR` (Redis's `ip:port@busport` notation, with the
//! whole peer address), then ` retired=ID,FIRST-LAST,...` once members were
//! removed: every member's entry carries the ids removed so far, so the
//! membership itself (replicated, in every snapshot) remembers them and an
//! id is never accepted again. Runs of consecutive ids are kept as one
//! range ([`IdSet`]), so a cluster whose nodes were replaced one after
//! another for years carries a few bytes, not a list that every change of
//! membership copies into every member's entry. A data directory written by a single-node release
//! holds an empty `addr`: the node records its addresses once it leads with
//! a peer address.
//!
//! # Who serves
//!
//! Only the leader serves record commands, and only once it has applied
//! every entry of earlier terms (its term's first entry applied, as
//! `ensure_linearizable` waits for). It then stamps entries with the
//! applied clock plus its own monotonic time since (see the engine's
//! time rule): the replicated clock never goes back when leadership moves,
//! never jumps with a new leader's wall clock, and pauses while there is no
//! leader, so no lease is cut short by a failover. Everything else gets a
//! redirect: `-MOVED slot leader-addr` when a leader is known,
//! `-TRYAGAIN` while an election runs, `-CLUSTERDOWN` once no leader was
//! known for longer than an election timeout.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use parking_lot::{Mutex, RwLock};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use super::peer::{PeerClient, Peers, ProbeInfo, cluster_hex, random16};
use super::types::{NodeId, TypeConfig};
use crate::clock::{Clock, clock_us};
use crate::engine::EngineError;
use crate::store::Store;

/// The address a client should be sent to, from a member's advertised
/// client address: `HOST:PORT`, or `HOST:PORT+TLSHOST:TLSPORT` when the
/// member has a TLS listener (TLS clients get the second; a member without
/// one gives them its plain address).
pub fn client_addr_for(advertised: &str, tls: bool) -> &str {
    match advertised.split_once('+') {
        Some((_, t)) if tls => t,
        Some((plain, _)) => plain,
        None => advertised,
    }
}

/// A member's two addresses (and the ids removed from the cluster, which
/// every member's entry carries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberAddr {
    /// Where clients connect (what `-MOVED` names).
    pub client: String,
    /// Where peers connect (Raft traffic).
    pub peer: String,
    /// Ids removed from the cluster, never accepted again.
    pub retired: IdSet,
    /// The incarnation of the member's data directory (a random number
    /// made when the directory was created), recorded once the leader
    /// first reaches it: a member that answers with another one lost its
    /// data and is kept out.
    pub inc: Option<u64>,
}

impl MemberAddr {
    /// Reads `CLIENT@PEER[ inc=HEX][ retired=ID,FIRST-LAST,...]` (empty
    /// parts when absent).
    pub fn parse(addr: &str) -> MemberAddr {
        let mut words = addr.split_whitespace();
        let first = words.next().unwrap_or("");
        let (mut retired, mut inc) = (IdSet::default(), None);
        for w in words {
            if let Some(ids) = w.strip_prefix("retired=") {
                retired = IdSet::parse(ids);
            } else if let Some(hex) = w.strip_prefix("inc=") {
                inc = u64::from_str_radix(hex, 16).ok();
            }
        }
        let (client, peer) = first.split_once('@').unwrap_or((first, ""));
        MemberAddr {
            client: client.to_owned(),
            peer: peer.to_owned(),
            retired,
            inc,
        }
    }

    /// `CLIENT@PEER[ inc=HEX][ retired=ID,FIRST-LAST,...]`, as kept in the
    /// membership.
    pub fn node(&self) -> BasicNode {
        let mut addr = format!("{}@{}", self.client, self.peer);
        if let Some(inc) = self.inc {
            addr.push_str(&format!(" inc={inc:016x}"));
        }
        if !self.retired.is_empty() {
            addr.push_str(&format!(" retired={}", self.retired));
        }
        BasicNode { addr }
    }
}

/// A set of node ids kept as sorted, disjoint, non-adjacent ranges:
/// written `ID,FIRST-LAST,...` (`2,5-9`), the form a list of single ids
/// (`2,4`) already has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSet {
    /// `(first, last)` inclusive, sorted, with gaps between them.
    ranges: Vec<(NodeId, NodeId)>,
}

impl IdSet {
    /// Reads `ID,FIRST-LAST,...`; a part that does not parse (or a range
    /// whose last id is below its first) is skipped.
    pub fn parse(s: &str) -> IdSet {
        let mut set = IdSet::default();
        for part in s.split(',') {
            let range = match part.split_once('-') {
                Some((a, b)) => a.parse().ok().zip(b.parse().ok()),
                None => part.parse().ok().map(|id| (id, id)),
            };
            if let Some((a, b)) = range.filter(|(a, b)| a <= b) {
                set.insert_range(a, b);
            }
        }
        set
    }

    /// Whether no id is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: NodeId) -> bool {
        let i = self.ranges.partition_point(|&(_, last)| last < id);
        self.ranges.get(i).is_some_and(|&(first, _)| first <= id)
    }

    /// Adds `id`.
    pub fn insert(&mut self, id: NodeId) {
        self.insert_range(id, id);
    }

    /// Adds every id in `other`.
    pub fn extend(&mut self, other: &IdSet) {
        for &(a, b) in &other.ranges {
            self.insert_range(a, b);
        }
    }

    /// Adds `first..=last` (`first <= last`), merging it with the ranges
    /// it overlaps or touches.
    fn insert_range(&mut self, mut first: NodeId, mut last: NodeId) {
        // The ranges that end at or after `first - 1` and start at or
        // before `last + 1` merge with it.
        let lo = self
            .ranges
            .partition_point(|&(_, l)| l.saturating_add(1) < first);
        let hi = self
            .ranges
            .partition_point(|&(f, _)| f <= last.saturating_add(1));
        if lo < hi {
            first = first.min(self.ranges[lo].0);
            last = last.max(self.ranges[hi - 1].1);
        }
        self.ranges.splice(lo..hi, [(first, last)]);
    }
}

impl std::fmt::Display for IdSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(a, b)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// Every id the membership records as removed.
pub fn retired_ids<'a>(nodes: impl Iterator<Item = (&'a NodeId, &'a BasicNode)>) -> IdSet {
    let mut set = IdSet::default();
    for (_, n) in nodes {
        set.extend(&MemberAddr::parse(&n.addr).retired);
    }
    set
}

/// The cluster settings of a node.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Where to listen for peers; `None`: a single node, no peer traffic.
    pub peer_listen: Option<SocketAddr>,
    /// The peer address other nodes use (default: `peer_listen`).
    pub peer_advertise: String,
    /// The client address other nodes redirect to.
    pub client_advertise: String,
    /// `--initial-cluster`: the members to bootstrap with, id and peer
    /// address. Empty: join an existing cluster (or, without
    /// `peer_listen`, run a single node).
    pub initial_cluster: Vec<(NodeId, String)>,
    /// The shared secret peers prove they hold.
    pub secret: Option<Vec<u8>>,
    /// `CLUSTER PROMOTE` refuses a learner further behind than this.
    pub promote_max_lag_entries: u64,
    /// Peer connections served at once, at most.
    pub max_peer_connections: usize,
    /// Peer connections from one source address that have not completed
    /// the handshake, at most.
    pub max_peer_handshakes_per_source: usize,
    /// Bytes of peer frames being received at once, at most.
    pub max_peer_receive_bytes: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            peer_listen: None,
            peer_advertise: String::new(),
            client_advertise: String::new(),
            initial_cluster: Vec::new(),
            secret: None,
            promote_max_lag_entries: 1000,
            max_peer_connections: super::peer::MAX_PEER_CONNECTIONS,
            max_peer_handshakes_per_source: super::peer::MAX_PEER_HANDSHAKES_PER_SOURCE,
            max_peer_receive_bytes: super::peer::MAX_FRAME,
        }
    }
}

/// The largest node id: ids show as signed 64-bit integers (`CLUSTER
/// MEMBERS`).
pub const MAX_NODE_ID: NodeId = i64::MAX as NodeId;

/// Parses `1=HOST:PORT,2=HOST:PORT,...`.
pub fn parse_initial_cluster(s: &str) -> Result<Vec<(NodeId, String)>, String> {
    let mut out: Vec<(NodeId, String)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not ID=HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0 && n <= MAX_NODE_ID)
            .ok_or_else(|| {
                format!("'{id}' is not a node id (an integer from 1 to {MAX_NODE_ID})")
            })?;
        let addr = addr.trim();
        if addr
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(format!("'{addr}' (node {id}) is not HOST:PORT"));
        }
        if out.iter().any(|(i, _)| *i == id) {
            return Err(format!("node {id} is listed twice"));
        }
        if let Some((other, _)) = out.iter().find(|(_, a)| a == addr) {
            return Err(format!(
                "nodes {other} and {id} are both listed at {addr}: each node needs a peer address of its own"
            ));
        }
        out.push((id, addr.to_owned()));
    }
    Ok(out)
}

/// Growth of the host's suspended time below this is taken for the noise
/// of reading two clocks one after the other, µs.
const SUSPENSION_NOISE_US: u64 = 1_000;

/// How long the host has been suspended since it booted, µs: the
/// difference between `CLOCK_BOOTTIME`, which counts a suspension, and
/// `CLOCK_MONOTONIC`, which does not (and is tokio's clock). The two are
/// read one after the other: a read that straddled a preemption is taken
/// again.
fn suspended_us() -> u64 {
    use rustix::time::ClockId;
    let mut best = u64::MAX;
    for _ in 0..4 {
        let before = clock_us(ClockId::Monotonic);
        let boot = clock_us(ClockId::Boottime);
        let after = clock_us(ClockId::Monotonic);
        // Between `before` and `after`: `boot - after` is never more than
        // the time suspended.
        best = best.min(boot.saturating_sub(after));
        if after - before < 50 {
            break;
        }
    }
    best
}

/// [`suspended_us`] read fast, for every command: `CLOCK_BOOTTIME`, then
/// `CLOCK_MONOTONIC`, once each. Never more than the time suspended (a
/// preemption between the two reads only makes it less), so it tells when
/// the careful read is worth taking: its three reads of the clocks for
/// every command were a few percent of a busy leader's CPU.
fn suspended_us_fast() -> u64 {
    use rustix::time::ClockId;
    let boot = clock_us(ClockId::Boottime);
    boot.saturating_sub(clock_us(ClockId::Monotonic))
}

/// Who serves, shared by the engine, the proposer and the role watcher.
///
/// A leader serves only while a majority of the voters acknowledged it
/// recently (within [`Role::lease`], four fifths of `election_timeout_ms`,
/// of the time openraft sent the acknowledged heartbeat or entry): no other
/// node can have been elected in that time, since each follower that
/// acknowledged it refuses to vote for another candidate for
/// `election_timeout_ms` after it received that message (openraft's
/// `Config::leader_lease`). The fifth between the two covers clocks that
/// run at slightly different rates and the time between checking the
/// lease and answering. A leader cut off from its peers therefore stops
/// serving reads and taking writes within the lease, answering
/// `-TRYAGAIN`, while the majority elects another.
pub struct Role {
    /// This node leads and has applied every earlier entry.
    serving: AtomicBool,
    /// When a majority last acknowledged this leader: µs since `base` on
    /// tokio's clock.
    acked_at_us: AtomicU64,
    /// Voters in the membership.
    voters: AtomicUsize,
    base: Instant,
    /// The host's suspended time as last read, µs, and how to read it
    /// ([`suspended_us`], or a test's).
    suspended_seen: AtomicU64,
    suspended: fn() -> u64,
    /// A read of it that may show less, never more ([`suspended_us_fast`]):
    /// the careful one is taken only when this one shows a suspension.
    suspended_fast: fn() -> u64,
    /// When this node last found that the host had been suspended: µs
    /// since `base`. Acknowledgements from before it do not count.
    woke_at_us: AtomicU64,
    /// When the role watcher last looked (µs since `base`; every quarter
    /// lease), and when it last found it had not run for an election
    /// timeout (a process paused: SIGSTOP, a frozen VM): a leader cannot
    /// tell the cluster is down from a silence it slept through.
    ticked_us: AtomicU64,
    resumed_us: AtomicU64,
    /// Signalled when an acknowledgement moves the lease on, and when this
    /// node stops serving: what requests held through a lapse wait for.
    lease_changed: tokio::sync::Notify,
    /// Times the lease lapsed while this node served, since start.
    lease_lapses: AtomicU64,
    /// Times a leader became known that differs from the last one known
    /// (the first included), since start.
    leader_changes: AtomicU64,
    /// Requests held while the lease had lapsed, and of those the ones
    /// that were not served after all, since start.
    lease_held: AtomicU64,
    lease_held_failed: AtomicU64,
    lease: Duration,
    /// The lease as shortened by a voter's smaller `election_timeout_ms`
    /// (four fifths of it), µs; `u64::MAX` while none is smaller than this
    /// node's ([`Role::cap_lease`]).
    lease_cap_us: AtomicU64,
    /// Signalled when that cap changes.
    lease_cap_changed: tokio::sync::Notify,
    /// How long after its lease lapsed a leader holds requests.
    hold: Duration,
    inner: RwLock<RoleInner>,
    /// The term a promotion runs for.
    promoting: Mutex<Option<u64>>,
    /// Held through every membership change this node makes (each reads
    /// the membership, then writes it back changed): one at a time.
    changes: tokio::sync::Mutex<()>,
    election_timeout: Duration,
}

struct RoleInner {
    /// The clock entries are stamped with (and reads compare with).
    clock: Clock,
    leader: Option<NodeId>,
    /// The last leader known (kept while an election runs).
    last_leader: Option<NodeId>,
    term: u64,
    /// The term this node serves as leader, once promoted in it.
    serving_term: Option<u64>,
    /// Since when no leader is known.
    leaderless_since: Option<Instant>,
    /// Since when this node leads, in its current term.
    led_since: Option<Instant>,
}

impl Role {
    /// Not serving yet; `clock` until the first promotion. A leader of
    /// several voters serves for `lease` after a majority acknowledged it.
    /// Requests that come while the lease has lapsed are held for up to
    /// `hold` after it lapsed; `election_timeout` is how long no leader may
    /// be known before the cluster is reported down.
    pub fn new(
        clock: Clock,
        election_timeout: Duration,
        lease: Duration,
        hold: Duration,
    ) -> Arc<Role> {
        Role::with_suspension(
            clock,
            election_timeout,
            lease,
            hold,
            suspended_us,
            suspended_us_fast,
        )
    }

    /// [`Role::new`], reading the host's time suspended with `suspended`,
    /// and first with `suspended_fast` (which never shows more).
    fn with_suspension(
        clock: Clock,
        election_timeout: Duration,
        lease: Duration,
        hold: Duration,
        suspended: fn() -> u64,
        suspended_fast: fn() -> u64,
    ) -> Arc<Role> {
        Arc::new(Role {
            serving: AtomicBool::new(false),
            acked_at_us: AtomicU64::new(0),
            voters: AtomicUsize::new(1),
            base: Instant::now(),
            suspended_seen: AtomicU64::new(suspended()),
            suspended,
            suspended_fast,
            woke_at_us: AtomicU64::new(0),
            ticked_us: AtomicU64::new(0),
            resumed_us: AtomicU64::new(0),
            lease_changed: tokio::sync::Notify::new(),
            lease_lapses: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
            lease_held: AtomicU64::new(0),
            lease_held_failed: AtomicU64::new(0),
            lease,
            lease_cap_us: AtomicU64::new(u64::MAX),
            lease_cap_changed: tokio::sync::Notify::new(),
            hold,
            inner: RwLock::new(RoleInner {
                clock,
                leader: None,
                last_leader: None,
                term: 0,
                serving_term: None,
                leaderless_since: Some(Instant::now()),
                led_since: None,
            }),
            promoting: Mutex::new(None),
            changes: tokio::sync::Mutex::new(()),
            election_timeout,
        })
    }

    /// Whether this node leads (and has applied the log of earlier terms).
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Whether the membership has more than one voter: a write is
    /// committed once a majority has it, not on this node's disk alone.
    pub fn replicated(&self) -> bool {
        self.voters.load(Ordering::Relaxed) > 1
    }

    /// Whether the leader's lease holds: a single voter always; several
    /// while a majority acknowledged it within the lease (and since the
    /// host last woke from a suspension).
    pub fn lease_holds(&self) -> bool {
        if !self.replicated() {
            return true;
        }
        self.note_suspension();
        let acked = self.acked_at_us.load(Ordering::Acquire);
        acked != 0
            && acked >= self.woke_at_us.load(Ordering::Acquire)
            && self.us(Instant::now()).saturating_sub(acked) < self.lease().as_micros() as u64
    }

    /// How long this leader serves on a majority's answers: four fifths of
    /// its `election_timeout_ms`, or of a voter's if that is smaller (a
    /// follower keeps its vote for the leader it heard from for its own
    /// value only).
    pub fn lease(&self) -> Duration {
        self.lease.min(Duration::from_micros(
            self.lease_cap_us.load(Ordering::Acquire),
        ))
    }

    /// Caps the lease at four fifths of `voter_election_timeout`, the
    /// smallest `election_timeout_ms` the other voters gave (`None`: no
    /// cap); whether the lease is now shorter than this node's own.
    pub fn cap_lease(&self, voter_election_timeout: Option<Duration>) -> bool {
        let cap = voter_election_timeout
            .map(|t| t * 4 / 5)
            .filter(|c| *c < self.lease)
            .map_or(u64::MAX, |c| c.as_micros() as u64);
        if self.lease_cap_us.swap(cap, Ordering::AcqRel) != cap {
            self.lease_cap_changed.notify_waiters();
        }
        cap != u64::MAX
    }

    /// The latest instant a majority acknowledgement counts from: the
    /// last one, or the host's last wake from a suspension if later (µs
    /// since `base`; 0: neither), as last noted (the clocks are not read
    /// here).
    fn acked_or_woke_us(&self) -> u64 {
        self.acked_at_us
            .load(Ordering::Acquire)
            .max(self.woke_at_us.load(Ordering::Acquire))
    }

    /// When a write this leader proposed and a majority has not committed
    /// yet stops waiting for one: `hold` after the lease lapses (as a
    /// request that comes then is held no longer). `None` on a single
    /// voter, whose writes need no majority.
    ///
    /// Read on every write: the clocks are not read again here (the
    /// request's route just did); a suspension noticed later moves
    /// `woke_at_us` on, and [`Role::cut_off`] reads them.
    pub fn cut_off_at(&self) -> Option<Instant> {
        self.replicated().then(|| {
            self.base + Duration::from_micros(self.acked_or_woke_us()) + self.lease() + self.hold
        })
    }

    /// Whether this leader is cut off: it serves several voters, and no
    /// majority has acknowledged it since its lease lapsed and `hold`
    /// after ([`Role::cut_off_at`]).
    pub fn cut_off(&self) -> bool {
        self.serving()
            && !self.lease_holds()
            && self.cut_off_at().is_some_and(|at| Instant::now() >= at)
    }

    /// Whether this leader has gone without a majority for longer than
    /// its lease and `election_timeout` (as long as a follower goes
    /// without a leader before it reports the cluster down): the cluster
    /// is down as seen from here, and this node says so. That holds for a
    /// leader that does not serve yet too, counted from its election: one
    /// that no majority answered since could not commit its first entry
    /// (one voter down, the other installing a snapshot), and told clients
    /// for 21 s that it was "just elected". A leader applying a long log
    /// with a majority behind it is answered meanwhile.
    pub fn quorum_lost(&self) -> bool {
        if !self.replicated() || self.lease_holds() {
            return false;
        }
        let elected = if self.serving() {
            0
        } else {
            match self.inner.read().led_since {
                Some(at) => self.us(at),
                None => return false,
            }
        };
        let now = self.us(Instant::now());
        let paused = self.election_timeout.as_micros() as u64;
        // Not looked for that long: this process did not run (and has not
        // heard what came meanwhile yet).
        if now.saturating_sub(self.ticked_us.load(Ordering::Acquire)) > paused {
            return false;
        }
        let from = self
            .acked_or_woke_us()
            .max(self.resumed_us.load(Ordering::Acquire))
            .max(elected);
        now.saturating_sub(from) >= (self.lease + self.election_timeout).as_micros() as u64
    }

    /// Whether a learner that last heard from the leader it follows
    /// `heard` ago has lost it: for four times its lease and election
    /// timeout (3.4 s by default; a voter campaigns after one, and so
    /// learns there is no leader; a learner never campaigns, and went on
    /// naming a dead leader, `cluster_state:ok`, for as long as the voters
    /// could not elect another). Four, since a learner hears nothing while
    /// the leader prepares a snapshot for it, or while its own disk is
    /// slow to take the last entries. A learner that has not heard from
    /// it since it started counts from its start: one that heard it only
    /// before it knew its members (its first entries), or that was
    /// restarted while the leader was down, named a dead leader for good.
    pub fn leader_lost(&self, heard: Option<Duration>) -> bool {
        heard.unwrap_or_else(|| self.base.elapsed()) >= (self.lease + self.election_timeout) * 4
    }

    /// Notes that the role watcher looks now (see `ticked_us`).
    fn ticked(&self) {
        let now = self.us(Instant::now()).max(1);
        let last = self.ticked_us.swap(now, Ordering::AcqRel);
        if last != 0 && now.saturating_sub(last) > self.election_timeout.as_micros() as u64 {
            self.resumed_us.fetch_max(now, Ordering::AcqRel);
        }
    }

    /// How long ago a majority acknowledged this leader, ms (None if never).
    pub fn since_quorum_ack_ms(&self) -> Option<u64> {
        let acked = self.acked_at_us.load(Ordering::Acquire);
        (acked != 0).then(|| self.us(Instant::now()).saturating_sub(acked) / 1000)
    }

    /// Until when a request that comes now is held for the lease to hold
    /// again: `None` unless this node serves, its lease has lapsed, and
    /// lapsed less than `hold` ago (a leader cut off for longer answers at
    /// once).
    pub fn lease_hold_until(&self) -> Option<Instant> {
        if !self.serving() || self.lease_holds() {
            return None;
        }
        let acked = self.acked_at_us.load(Ordering::Acquire);
        if acked == 0 || acked < self.woke_at_us.load(Ordering::Acquire) {
            return None;
        }
        let until = self.base + Duration::from_micros(acked) + self.lease() + self.hold;
        (Instant::now() < until).then_some(until)
    }

    /// Resolves once this node does not serve (at once if it does not).
    pub async fn stopped_serving(&self) {
        loop {
            let changed = self.lease_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.serving() {
                return;
            }
            changed.await;
        }
    }

    /// Waits until the lease holds again (a majority answered), at most
    /// until `until`; whether it does while this node still serves.
    pub async fn lease_regained(&self, until: Instant) -> bool {
        self.lease_held.fetch_add(1, Ordering::Relaxed);
        loop {
            let changed = self.lease_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.serving() {
                break;
            }
            if self.lease_holds() {
                return true;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                if self.serving() && self.lease_holds() {
                    return true;
                }
                break;
            }
        }
        self.lease_held_failed.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Times a leader became known that differs from the last one known
    /// (the first included), since start.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// Lease lapses, requests held while one had lapsed, and of those the
    /// ones that were not served after all: since start.
    pub fn lease_counts(&self) -> (u64, u64, u64) {
        (
            self.lease_lapses.load(Ordering::Relaxed),
            self.lease_held.load(Ordering::Relaxed),
            self.lease_held_failed.load(Ordering::Relaxed),
        )
    }

    /// Records that a majority acknowledged what this leader sent at `at`
    /// (an instant seen again is a no-op).
    fn acknowledged(&self, at: Instant) {
        self.note_suspension();
        let at = self.us(at).max(1);
        if at < self.woke_at_us.load(Ordering::Acquire) {
            // Sent before the host was suspended: it says nothing of now.
            return;
        }
        if self.acked_at_us.fetch_max(at, Ordering::AcqRel) < at {
            self.lease_changed.notify_waiters();
        }
    }

    /// Notes whether the host was suspended since last looked: tokio's
    /// clock (the monotonic one, which openraft stamps acknowledgements
    /// with) does not count that time, so the acknowledgements from before
    /// a suspension stop counting at once. A leader whose host was
    /// suspended (a laptop's lid, a host suspended to memory) then does
    /// not serve on them when it wakes, however little time its own clock
    /// shows: its followers' leases on their votes ran on meanwhile.
    fn note_suspension(&self) {
        let seen = self.suspended_seen.load(Ordering::Acquire);
        if (self.suspended_fast)() <= seen.saturating_add(SUSPENSION_NOISE_US) {
            return;
        }
        let now = (self.suspended)();
        if now > seen.saturating_add(SUSPENSION_NOISE_US) {
            self.suspended_seen.fetch_max(now, Ordering::AcqRel);
            self.woke_at_us
                .fetch_max(self.us(Instant::now()).max(1), Ordering::AcqRel);
        }
    }

    /// `at` as µs since `base`.
    fn us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_micros() as u64
    }

    /// The clock of the current term.
    pub fn clock(&self) -> Clock {
        self.inner.read().clock
    }

    /// Serializes this node's membership changes: hold the guard while
    /// reading the membership and writing the change.
    pub async fn membership_changes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.changes.lock().await
    }

    /// The last leader known, even while an election runs.
    pub fn last_leader(&self) -> Option<NodeId> {
        self.inner.read().last_leader
    }

    /// Records `id` as the last leader known, unless one is: a node that
    /// led when it stopped (and rejoins as a follower) shows itself in
    /// the slot map until it hears of a leader, as a restarted Redis
    /// Cluster master shows the slots its saved configuration gives it.
    /// (A follower's saved vote names its leader already.)
    pub fn recall_leader(&self, id: NodeId) {
        let mut r = self.inner.write();
        if r.last_leader.is_none() {
            r.last_leader = Some(id);
        }
    }
}

/// Whether node `me`'s removal is half done in `membership`: recorded as
/// retired, still a voter of a uniform membership (a leader died between
/// the two steps of `CLUSTER REMOVE`). It still votes and counts towards
/// a majority until the next leader finishes the removal.
fn half_removed(
    membership: &openraft::Membership<NodeId, BasicNode>,
    retired: &IdSet,
    me: NodeId,
) -> bool {
    retired.contains(me)
        && membership.get_joint_config().len() == 1
        && membership.voter_ids().any(|v| v == me)
}

/// Whether this node was removed from the cluster: its own log says so (a
/// removed leader), or the members it asks for votes do (a removed voter
/// never hears of its removal) while it knows no other leader. It serves
/// no one, and may still believe it leads. Not while its removal is
/// [`half_removed`]: it answers as any other voter then (it said "stop
/// this one", which could leave the others without a majority).
fn removed(peers: &Peers, retired: &IdSet, leader: Option<NodeId>, half_removed: bool) -> bool {
    let me = peers.node_id();
    if half_removed {
        return false;
    }
    retired.contains(me) || (peers.told_removed() && leader.is_none_or(|l| l == me))
}

/// What a node that does not serve answers a command on `key`.
pub fn not_serving(
    role: &Role,
    raft: &Raft<TypeConfig>,
    peers: &Peers,
    key: Option<&[u8]>,
) -> EngineError {
    let (leader, since) = {
        let r = role.inner.read();
        (r.leader, r.leaderless_since)
    };
    let me = peers.node_id();
    let membership = raft.metrics().borrow().membership_config.clone();
    let member = membership.membership().get_node(&me).is_some();
    let retired = retired_ids(membership.membership().nodes());
    if removed(
        peers,
        &retired,
        leader,
        half_removed(membership.membership(), &retired, me),
    ) {
        return EngineError::ClusterDown(
            "this node was removed from the cluster (CLUSTER REMOVE): it serves no one; ask another node, and stop this one",
        );
    }
    // Not a member yet: waiting for the bootstrap or for CLUSTER ADD, or
    // added and catching up from a snapshot taken before it was; unless
    // a member said it keeps this node out.
    if !member {
        if peers.kept_out() {
            return EngineError::ClusterDown(
                "this node's data directory is not the one the cluster recorded for its id (its data was lost or replaced): the members keep it out for good; remove the id (CLUSTER REMOVE on the leader) and add this node under a new id",
            );
        }
        return EngineError::TryAgain(
            "this node is not a member of a cluster yet: it waits for the bootstrap (--initial-cluster) or for CLUSTER ADD on the leader, or catches up (an id that was a member before and lost its data directory is kept out for good: give the node a new id)",
        );
    }
    match leader {
        Some(id) if id == me && role.quorum_lost() => EngineError::ClusterDown(if role.serving() {
            "this node leads but no majority of the voters has answered it for longer than an election takes: the cluster is down from here"
        } else {
            "this node was elected but no majority of the voters has answered it since, for longer than an election takes: the cluster is down from here until they answer"
        }),
        Some(id) if id == me && role.serving() => EngineError::TryAgain(
            "this node leads but a majority of the voters has not answered it lately: it may be cut off",
        ),
        Some(id) if id == me => {
            EngineError::TryAgain("this node was just elected: it applies the log first")
        }
        Some(id)
            if !membership.membership().voter_ids().any(|v| v == me)
                && role.leader_lost(peers.heard_ago(id)) =>
        {
            EngineError::ClusterDown(
                "this learner has not heard from the leader for longer than an election takes: no leader may be reachable",
            )
        }
        Some(id) => match client_addr_of(raft, peers, id) {
            Some(addr) if !addr.is_empty() => EngineError::Moved {
                slot: key.map_or(0, idem_protocol::key_slot),
                addr,
            },
            _ if retired.contains(id) => EngineError::TryAgain(
                "the leader was removed from the cluster (CLUSTER REMOVE): electing a new one",
            ),
            _ => EngineError::TryAgain("the leader's client address is not known yet"),
        },
        None if since.is_some_and(|s| s.elapsed() > role.election_timeout) => {
            EngineError::ClusterDown("no leader: a majority of the voters is not reachable")
        }
        None => EngineError::TryAgain("electing a leader"),
    }
}

/// The client address of member `id`: what it last advertised, else what
/// the membership recorded.
pub fn client_addr_of(raft: &Raft<TypeConfig>, peers: &Peers, id: NodeId) -> Option<String> {
    if id == peers.node_id() {
        return Some(peers.client_addr().to_owned());
    }
    if let Some(a) = peers.advertised(id) {
        return Some(a);
    }
    let m = raft.metrics().borrow().membership_config.clone();
    m.membership()
        .get_node(&id)
        .map(|n| MemberAddr::parse(&n.addr).client)
}

/// What the role watcher needs.
pub struct Watch {
    /// The Raft handle.
    pub raft: Raft<TypeConfig>,
    /// Who serves.
    pub role: Arc<Role>,
    /// This node's identity.
    pub peers: Arc<Peers>,
    /// The store (its applied clock anchors a new term).
    pub store: Arc<Store>,
    /// This node's addresses, recorded in the membership once it leads.
    pub me: MemberAddr,
    /// Called when this node stops serving.
    pub on_demoted: Arc<dyn Fn() + Send + Sync>,
    /// Told on every look at the metrics whether this node follows a
    /// leader other than itself.
    pub on_follower: Arc<dyn Fn(bool) + Send + Sync>,
}

/// Follows openraft's metrics: serves once this node leads and has applied
/// the log; stops serving (and calls `on_demoted`) as soon as it does not
/// lead.
pub async fn watch_role(w: Arc<Watch>) {
    let mut rx = w.raft.metrics();
    let mut lease = LeaseState::Holds;
    // One timer for the life of the watcher: metrics change often (every
    // pass of the Raft core), and must not keep pushing the lease check
    // back.
    let mut tick = tokio::time::interval(w.role.lease / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let me = w.peers.node_id();
    // Whether this node's own log removed it, by the membership entry it
    // was read from: parsed once an entry, not at every pass of the core.
    let mut retired: (Option<openraft::LogId<NodeId>>, bool) = (None, false);
    // The leader this node followed when the membership recorded it as
    // removed (read when the membership changes).
    let mut leader_retired: Option<NodeId> = None;
    // The voters' election timeouts the lease was last capped by: looked
    // at again when the membership or a value given changes.
    let mut capped: (Option<openraft::LogId<NodeId>>, u64) = (None, u64::MAX);
    let _heartbeats = AbortOnDropHandle::new(tokio::spawn(heartbeat_capped_lease(
        w.raft.clone(),
        Arc::clone(&w.role),
    )));
    loop {
        let (state, leader, term) = {
            let m = rx.borrow_and_update();
            // The cap first: an acknowledgement counted below is never
            // read with a lease longer than its voters allow.
            let at = m.membership_config.log_id();
            let version = w.peers.election_timeouts_version();
            if capped.0.as_ref() != at.as_ref() || capped.1 != version {
                // (A value given after the version was read moves it
                // again: looked at on the next pass.)
                let smallest = w
                    .peers
                    .election_timeouts(m.membership_config.membership().voter_ids());
                let was = w.role.lease();
                let shortened = w.role.cap_lease(smallest.map(Duration::from_millis));
                let lease = w.role.lease();
                let now = lease.as_millis() as u64;
                if lease != was && shortened {
                    warn!(
                        lease_ms = now,
                        smallest_election_timeout_ms = ?smallest,
                        "a voter has a smaller election_timeout_ms than this node: a leader here serves on a majority's answers for {now} ms (four fifths of it), and heartbeats every third of that if its own heartbeats are too far apart to keep it"
                    );
                } else if lease != was {
                    info!(
                        lease_ms = now,
                        "no voter has a smaller election_timeout_ms than this node any more: its lease is its own again"
                    );
                }
                capped = (*at, version);
            }
            // The lease: when a majority last acknowledged this leader
            // (the instant itself: an age would grow stale while these
            // metrics wait to be read, and lengthen the lease by as much).
            if let Some(at) = m.quorum_acked_at {
                w.role.acknowledged(at);
            }
            let voters = m.membership_config.membership().voter_ids().count();
            w.role.voters.store(voters.max(1), Ordering::Relaxed);
            if retired.0.as_ref() != at.as_ref() {
                let ids = retired_ids(m.membership_config.membership().nodes());
                retired = (*at, ids.contains(me));
                leader_retired = m.current_leader.filter(|&l| l != me && ids.contains(l));
            }
            (m.state, m.current_leader, m.current_term)
        };
        // The leader it follows removed itself: campaign as soon as it
        // has been silent for its lease.
        if let Some(l) =
            leader_retired.filter(|&l| state == ServerState::Follower && leader == Some(l))
        {
            w.peers.leader_removed(&w.raft, l);
        }
        (w.on_follower)(state == ServerState::Follower && leader.is_some_and(|l| l != me));
        let leads = state == ServerState::Leader && leader == Some(me);
        let demoted = {
            let mut r = w.role.inner.write();
            if leader.is_none() && r.leader.is_some() {
                r.leaderless_since = Some(Instant::now());
            } else if leader.is_some() {
                r.leaderless_since = None;
            }
            // This node campaigned (it may have won already): when it last
            // heard from the leader it followed.
            if matches!(state, ServerState::Candidate | ServerState::Leader)
                && let Some(was) = r.leader.filter(|&l| l != me && leader != Some(l))
            {
                let heard_ms = w.peers.heard_ago(was).map(|d| d.as_millis());
                info!(
                    leader = was,
                    heard_ms = ?heard_ms,
                    term,
                    "campaigning: this node no longer follows its leader"
                );
            }
            // A new leader, or a leader in a new term; terms that pass
            // with no leader (campaigns that fail, twice a second in a
            // minority) are not news.
            if r.leader != leader || (leader.is_some() && r.term != term) {
                info!(leader = ?leader, term, "leader changed");
            } else if r.term != term {
                debug!(term, "a term passed with no leader");
            }
            r.leader = leader;
            if leader.is_some() {
                if r.last_leader != leader {
                    w.role.leader_changes.fetch_add(1, Ordering::Relaxed);
                }
                r.last_leader = leader;
            }
            if !leads {
                r.led_since = None;
            } else if r.led_since.is_none() || r.term != term {
                r.led_since = Some(Instant::now());
            }
            r.term = term;
            // Serving holds only in the term it was promoted in: any change
            // of term (even one the watcher saw only the end of) ends it.
            let keep = leads && r.serving_term == Some(term);
            if !keep {
                r.serving_term = None;
            }
            !keep && w.role.serving.swap(false, Ordering::AcqRel)
        };
        // Removed (by its own log), and no longer leading: it lets go of
        // its peers, so that they campaign at once if it led them.
        if retired.1 && !leads {
            w.peers.leave();
        }
        if demoted {
            info!(term, leader = ?leader, state = ?state, "this node no longer serves: clients are redirected or told to try again");
            w.role.lease_changed.notify_waiters();
            (w.on_demoted)();
        }
        if leads && !w.role.serving() {
            let mut p = w.role.promoting.lock();
            if *p != Some(term) {
                *p = Some(term);
                tokio::spawn(promote(Arc::clone(&w), term));
            }
        }
        // On every change of the metrics and a few times per lease: a
        // leader cut off from the majority hears nothing, yet its parked
        // requests must not wait in silence.
        check_lease(&w, &mut lease);
        loop {
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                _ = tick.tick() => check_lease(&w, &mut lease),
            }
        }
    }
}

/// While a voter's smaller `election_timeout_ms` shortens the lease
/// ([`Role::cap_lease`]) below what this node's heartbeats (every third
/// of its own) keep alive, a serving leader sends heartbeats every third
/// of the shortened lease, so that it does not lapse between them.
async fn heartbeat_capped_lease(raft: Raft<TypeConfig>, role: Arc<Role>) {
    let own = Duration::from_millis(raft.config().heartbeat_interval);
    loop {
        let changed = role.lease_cap_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let lease = role.lease();
        // Its own heartbeats keep a lease at least twice their interval
        // (this node's own lease is 2.4 times it).
        if lease >= own * 2 {
            changed.await;
            continue;
        }
        tokio::time::sleep((lease / 3).max(Duration::from_millis(1))).await;
        // While it leads, serving or not yet (a new leader applying the
        // log of earlier terms must not leave its followers silent past
        // their own timeout either).
        let leads = raft.metrics().borrow().state == ServerState::Leader;
        if leads && raft.trigger().heartbeat().await.is_err() {
            return;
        }
    }
}

/// Where a serving leader's lease stands, as the role watcher last saw it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    Holds,
    /// Lapsed: requests are held, for up to `hold` after it lapsed.
    Lapsed,
    /// Lapsed longer than that: requests are refused, parked ones answered.
    Refusing,
}

/// Notes a lapse of the lease (requests are held meanwhile); once it has
/// lapsed for longer than requests are held, answers the parked ones
/// (once per loss); notes when a majority answers again.
fn check_lease(w: &Watch, state: &mut LeaseState) {
    w.role.ticked();
    let serving = w.role.serving();
    let holds = w.role.lease_holds();
    if serving && !holds {
        if *state == LeaseState::Holds {
            *state = LeaseState::Lapsed;
            w.role.lease_lapses.fetch_add(1, Ordering::Relaxed);
            info!(
                since_ack_ms = ?w.role.since_quorum_ack_ms(),
                hold_ms = w.role.hold.as_millis() as u64,
                "no majority has answered this leader within its lease: holding requests until one does"
            );
        }
        if *state == LeaseState::Lapsed && w.role.lease_hold_until().is_none() {
            *state = LeaseState::Refusing;
            warn!(
                since_ack_ms = ?w.role.since_quorum_ack_ms(),
                "no majority has answered this leader within its lease and the hold after it: refusing requests until one does"
            );
            (w.on_demoted)();
        }
    } else if holds && *state != LeaseState::Holds {
        if *state == LeaseState::Refusing {
            info!("a majority answers this leader again");
        }
        *state = LeaseState::Holds;
    }
}

/// Becomes the serving leader of `term` once every entry of its log is
/// applied, the last of them of `term`. After an election that last entry
/// is the blank one a new leader appends (its commit also shows that a
/// majority follows this leader). It matters for a node alone in its
/// membership that restarts: openraft resumes its leadership in the same
/// term (a leader of other members comes back as a follower instead: see
/// `step_down_at_restart`),
/// with entries of that term applied before the crash already, and the
/// entries after them (acknowledged to clients before the crash) known
/// committed again only once it has flushed them; a node alone writes
/// each entry before it replicates or commits it, so its log holds them
/// all, and waiting for its whole log to be applied is enough.
async fn promote(w: Arc<Watch>, term: u64) {
    let me = w.peers.node_id();
    let mut rx = w.raft.metrics();
    loop {
        let (still, applied_in_term) = {
            let m = rx.borrow_and_update();
            let last = m.last_log_index.unwrap_or(0);
            (
                m.state == ServerState::Leader && m.current_term == term,
                m.last_applied
                    .is_some_and(|l| l.leader_id.term == term && l.index >= last),
            )
        };
        if !still {
            break;
        }
        if applied_in_term {
            let applied = w.store.stats().clock;
            let anchor = if applied == 0 {
                Clock::new().now_ms()
            } else {
                applied
            };
            {
                // Checked again under the lock the watcher demotes under:
                // never serve a term the watcher has left.
                let mut r = w.role.inner.write();
                if r.leader != Some(me) || r.term != term {
                    break;
                }
                r.clock = Clock::starting_at(anchor);
                r.serving_term = Some(term);
                w.role.serving.store(true, Ordering::Release);
            }
            info!(term, clock_ms = anchor, "leading: serving clients");
            record_own_address(&w).await;
            finish_half_done_changes(&w, term).await;
            break;
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    let mut p = w.role.promoting.lock();
    if *p == Some(term) {
        *p = None;
    }
}

/// Finishes a change of membership that a leader died in the middle of,
/// as the first thing a new leader does (and again every second while it
/// cannot, as long as it leads in `term`):
///
/// - a joint configuration (openraft's change of voters commits the joint
///   configuration, then the new one; a leader that died between the two
///   left the cluster needing a majority of both for good, so it went
///   down with a majority of the voters the operator sees up): the new
///   configuration is committed;
/// - a member recorded as retired but still in the membership (`CLUSTER
///   REMOVE` records the id as retired, then removes the member): it is
///   removed.
async fn finish_half_done_changes(w: &Watch, term: u64) {
    let me = w.peers.node_id();
    loop {
        let leads = {
            let m = w.raft.metrics().borrow().clone();
            m.state == ServerState::Leader && m.current_term == term
        };
        if !leads {
            return;
        }
        let result = {
            let _one_at_a_time = w.role.membership_changes().await;
            let m = w.raft.metrics().borrow().membership_config.clone();
            let answers = |v: NodeId| v == me || w.peers.reach(v).is_some_and(|(ok, _)| ok);
            match half_done(m.membership(), answers) {
                HalfDone::Nothing => return,
                HalfDone::Wait => None,
                // Proposed only while this node is a voter of what it
                // holds (see `still_a_voter`).
                HalfDone::Finish(_) if !still_a_voter(&w.raft, me) => return,
                HalfDone::Finish(change) => {
                    info!(change = ?change, "finishing a change of membership a leader left halfway");
                    Some(w.raft.change_membership(change, false).await)
                }
            }
        };
        match result {
            Some(Ok(_)) => {
                info!("finished it");
                continue;
            }
            Some(Err(e)) => debug!(error = %e, "cannot finish the change yet"),
            None => debug!("the removal waits for a majority of the voters left to answer"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What [`finish_half_done_changes`] finds in a membership.
#[derive(Debug)]
enum HalfDone {
    /// No change was left halfway.
    Nothing,
    /// A removal of a voter, until a majority of the voters left answers.
    Wait,
    /// The change that finishes it.
    Finish(ChangeMembers<NodeId, BasicNode>),
}

/// The change left halfway in `membership`, if any; `answers` tells
/// whether a voter answers this leader.
fn half_done(
    membership: &openraft::Membership<NodeId, BasicNode>,
    answers: impl Fn(NodeId) -> bool,
) -> HalfDone {
    let configs = membership.get_joint_config();
    if configs.len() > 1 {
        let goal = configs.last().cloned().unwrap_or_default();
        return HalfDone::Finish(ChangeMembers::ReplaceAllVoters(goal));
    }
    let retired = retired_ids(membership.nodes());
    let Some(id) = membership
        .nodes()
        .map(|(id, _)| *id)
        .find(|id| retired.contains(*id))
    else {
        return HalfDone::Nothing;
    };
    if !membership.voter_ids().any(|v| v == id) {
        return HalfDone::Finish(ChangeMembers::RemoveNodes([id].into()));
    }
    // Removing a voter goes through a joint configuration that needs a
    // majority of the voters left too: proposed while one of them is down
    // (the leader that died, say), it would stop every write until that
    // node is back, where the cluster serves as it is. So only once a
    // majority of them answers this leader.
    let left: Vec<NodeId> = membership.voter_ids().filter(|v| *v != id).collect();
    if left.is_empty() {
        return HalfDone::Nothing;
    }
    if left.iter().filter(|v| answers(**v)).count() * 2 <= left.len() {
        return HalfDone::Wait;
    }
    HalfDone::Finish(ChangeMembers::RemoveVoters([id].into()))
}

/// Whether node `id` is a voter of the membership it holds (the latest
/// appended). A leader that removed itself leads on until that change is
/// committed and applied, and must propose no change of its own meanwhile:
/// openraft takes a membership entry only from a leader of its own
/// membership (a debug build stopped on the assertion: seen when the
/// incarnation recorder ran just after `CLUSTER REMOVE` of the leader).
/// Checked under [`Role::membership_changes`], which a removal holds to
/// its end.
fn still_a_voter(raft: &Raft<TypeConfig>, id: NodeId) -> bool {
    let m = raft.metrics().borrow().membership_config.clone();
    m.membership().voter_ids().any(|v| v == id)
}

/// On the serving leader, records in the membership the incarnation of
/// every member reached since (and its own), so that a member that comes
/// back with another data directory is recognised and kept out (see
/// `Peers::check_incarnation`). Looks every half second.
pub async fn record_incarnations(w: Arc<Watch>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        if !w.role.serving() {
            continue;
        }
        let _one_at_a_time = w.role.membership_changes().await;
        if !still_a_voter(&w.raft, w.peers.node_id()) {
            continue;
        }
        let todo = w.peers.to_record();
        if todo.is_empty() {
            continue;
        }
        let nodes: BTreeMap<NodeId, BasicNode> = {
            let m = w.raft.metrics().borrow().membership_config.clone();
            todo.iter()
                .filter_map(|(id, inc)| {
                    let node = m.membership().get_node(id)?;
                    let addr = MemberAddr {
                        inc: Some(*inc),
                        ..MemberAddr::parse(&node.addr)
                    };
                    Some((*id, addr.node()))
                })
                .collect()
        };
        if nodes.is_empty() {
            continue;
        }
        match w
            .raft
            .change_membership(ChangeMembers::SetNodes(nodes), true)
            .await
        {
            Ok(_) => {
                info!(nodes = ?todo.iter().map(|(id, _)| id).collect::<Vec<_>>(), "recorded the data directories of members")
            }
            // Another change runs, or leadership moved: next time.
            Err(e) => tracing::debug!(error = %e, "cannot record incarnations yet"),
        }
    }
}

/// Records this node's addresses in the membership when they differ from
/// what it holds (a single-node directory grown into a cluster, or a new
/// `--advertise`).
async fn record_own_address(w: &Watch) {
    if w.me.peer.is_empty() {
        return;
    }
    let id = w.peers.node_id();
    let _one_at_a_time = w.role.membership_changes().await;
    if !still_a_voter(&w.raft, id) {
        return;
    }
    let current = {
        let m = w.raft.metrics().borrow().membership_config.clone();
        m.membership()
            .get_node(&id)
            .map(|n| MemberAddr::parse(&n.addr))
    };
    let Some(current) = current else {
        return;
    };
    if current.client == w.me.client && current.peer == w.me.peer {
        return;
    }
    let want = MemberAddr {
        client: w.me.client.clone(),
        peer: w.me.peer.clone(),
        ..current
    }
    .node();
    let mut nodes = BTreeMap::new();
    nodes.insert(id, want.clone());
    match w
        .raft
        .change_membership(ChangeMembers::SetNodes(nodes), true)
        .await
    {
        Ok(_) => info!(addr = %want.addr, "recorded this node's addresses in the membership"),
        Err(e) => warn!(error = %e, "cannot record this node's addresses"),
    }
}

/// Why a node refuses to bootstrap or join.
pub fn refuse(msg: String) -> super::StartError {
    super::StartError::Cluster(msg)
}

/// Bootstraps or joins, for a node whose data directory holds no
/// membership. Returns once this node has initialized the cluster (the
/// lowest id of `--initial-cluster`) or may wait to be contacted.
pub async fn bootstrap(
    raft: &Raft<TypeConfig>,
    peers: &Arc<Peers>,
    cfg: &ClusterConfig,
) -> Result<(), super::StartError> {
    let me = peers.node_id();
    let others: Vec<(NodeId, String)> = cfg
        .initial_cluster
        .iter()
        .filter(|(id, _)| *id != me)
        .cloned()
        .collect();
    if cfg.initial_cluster.is_empty() {
        info!(
            node = me,
            "no membership and no --initial-cluster: waiting to be added (CLUSTER ADD on the leader)"
        );
        return Ok(());
    }
    match cfg.initial_cluster.iter().find(|(id, _)| *id == me) {
        // Not one of the nodes that start the cluster: one added later
        // (given the same list as the others).
        None => {
            info!(
                node = me,
                "no membership, and --initial-cluster does not list this node: waiting to be added (CLUSTER ADD on the leader)"
            );
            return Ok(());
        }
        Some((_, a)) if *a != cfg.peer_advertise => {
            return Err(refuse(format!(
                "--initial-cluster lists node {me} at {a}, but its peer address is {}",
                cfg.peer_advertise
            )));
        }
        Some(_) => {}
    }
    let lowest = cfg.initial_cluster.iter().map(|(id, _)| *id).min() == Some(me);
    let mut clients: BTreeMap<NodeId, String> = BTreeMap::new();
    let mut waited = Instant::now() - Duration::from_secs(60);
    loop {
        for (id, addr) in &others {
            if clients.contains_key(id) {
                continue;
            }
            let mut c = PeerClient::new(Arc::clone(peers), *id, addr.clone());
            match c.probe().await {
                Ok(info) => {
                    check_probe(me, *id, &info, lowest)?;
                    clients.insert(*id, info.client_addr);
                }
                Err(e)
                    if e.contains("data was lost")
                        || e.contains("was removed from this cluster") =>
                {
                    // The peers know this id, and this data directory is
                    // not the one they knew.
                    return Err(refuse(format!(
                        "node {id} refused this node: {e}. This data directory is empty or new: node {me}'s data was lost, and its id is never reused (or --initial-cluster names node {id} at the address of another cluster's node: check the addresses)"
                    )));
                }
                Err(e) if !lowest => {
                    // Only the bootstrapping node needs every answer.
                    tracing::debug!(peer = id, error = %e, "peer not reachable yet");
                }
                Err(e) => {
                    if waited.elapsed() > Duration::from_secs(5) {
                        info!(peer = id, addr = %addr, error = %e, "waiting for every node of --initial-cluster to start before bootstrapping");
                        waited = Instant::now();
                    }
                }
            }
        }
        if !lowest {
            info!(
                node = me,
                "waiting for the lowest id of --initial-cluster to bootstrap the cluster"
            );
            return Ok(());
        }
        if clients.len() == others.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let id = random16();
    peers
        .set_cluster(id)
        .map_err(|e| refuse(format!("cannot record the cluster id: {e}")))?;
    let mut members = BTreeMap::new();
    members.insert(
        me,
        MemberAddr {
            client: cfg.client_advertise.clone(),
            peer: cfg.peer_advertise.clone(),
            retired: Default::default(),
            inc: None,
        }
        .node(),
    );
    for (pid, addr) in &others {
        members.insert(
            *pid,
            MemberAddr {
                client: clients.get(pid).cloned().unwrap_or_default(),
                peer: addr.clone(),
                retired: Default::default(),
                inc: None,
            }
            .node(),
        );
    }
    raft.initialize(members)
        .await
        .map_err(|e| super::StartError::Raft(e.to_string()))?;
    info!(cluster = %cluster_hex(&id), nodes = cfg.initial_cluster.len(), "bootstrapped a new cluster");
    Ok(())
}

fn check_probe(
    me: NodeId,
    peer: NodeId,
    info: &ProbeInfo,
    lowest: bool,
) -> Result<(), super::StartError> {
    if let Some(m) = info.your_match {
        return Err(refuse(format!(
            "node {peer} already holds a cluster in which node {me} took part (replicated up to index {m}), but this data directory is empty: node {me}'s data was lost, and its id is never reused. Remove it (CLUSTER REMOVE {me} on the leader) and add this node under a new id (CLUSTER ADD)"
        )));
    }
    if lowest && info.initialized {
        return Err(refuse(format!(
            "node {peer} already holds a cluster (voters {:?}): this node will not bootstrap another. If this node's data was lost, remove its id from the cluster and add it again under a new id; to join, start it without --initial-cluster and run CLUSTER ADD on the leader",
            info.voters
        )));
    }
    Ok(())
}

/// One member as `CLUSTER` commands show it.
#[derive(Debug, Clone)]
pub struct MemberView {
    /// Its id.
    pub id: NodeId,
    /// Its addresses (the client one as it last advertised it).
    pub addr: MemberAddr,
    /// A voter (else a learner).
    pub voter: bool,
    /// The log index replicated to it (known on the leader only; the
    /// leader's own last index for itself).
    pub matched: Option<u64>,
    /// Whether it answered this node's last call, and how long ago it last
    /// answered one: known on the leader only (`None` for the leader
    /// itself, on other nodes, and for a member not called yet).
    pub reach: Option<(bool, Option<Duration>)>,
}

impl MemberView {
    /// Known on the leader: whether this member answers it, as `ROLE` and
    /// `INFO replication` list replicas. It answered the last call, or
    /// one within [`ANSWERING_WITHIN`], so that a call that timed out
    /// under load does not take it off the list for a moment.
    pub fn answering(&self) -> bool {
        match self.reach {
            Some((true, _)) => true,
            Some((false, Some(ago))) => ago <= ANSWERING_WITHIN,
            _ => false,
        }
    }
}

/// See [`MemberView::answering`].
pub const ANSWERING_WITHIN: Duration = Duration::from_secs(1);

/// The cluster as this node sees it.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// This node's id.
    pub me: NodeId,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// The last leader it knew (while an election runs, the one that
    /// failed): what the slot map shows, as Redis Cluster keeps showing a
    /// failed master until its replacement is elected.
    pub last_leader: Option<NodeId>,
    /// Whether this node serves (leads, log applied).
    pub serving: bool,
    /// Its Raft state.
    pub state: ServerState,
    /// The current term.
    pub term: u64,
    /// The cluster id, in hex.
    pub cluster_id: Option<String>,
    /// The last log index.
    pub last_log_index: u64,
    /// The last applied index.
    pub applied_index: u64,
    /// Members, by id.
    pub members: Vec<MemberView>,
    /// Ids removed from the cluster (never accepted again).
    pub retired: IdSet,
    /// This node is a learner that has not heard from the leader it
    /// follows for longer than an election takes ([`Role::leader_lost`]).
    pub leader_lost: bool,
    /// The membership is in joint consensus: a change of voters was
    /// committed halfway (its leader died between the two steps); the
    /// next leader finishes it ([`finish_half_done_changes`]).
    pub joint: bool,
    /// This node was removed: its membership says so, or the members
    /// refuse it as removed (see [`not_serving`]).
    pub removed: bool,
    /// This node leads but has gone without a majority for longer than an
    /// election takes ([`Role::quorum_lost`]): the cluster is down as
    /// seen from here.
    pub quorum_lost: bool,
    /// How long ago the leader this node follows (or last followed) last
    /// sent it an AppendEntries: `None` on the leader, and on a node that
    /// has heard from none since it started.
    pub leader_heard: Option<Duration>,
}

impl ClusterView {
    /// The view from `raft`'s metrics.
    pub fn of(raft: &Raft<TypeConfig>, role: &Role, peers: &Peers) -> ClusterView {
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let retired = retired_ids(membership.nodes());
        let mut members: Vec<MemberView> = membership
            .nodes()
            .map(|(id, node)| {
                let mut addr = MemberAddr::parse(&node.addr);
                if *id == peers.node_id() {
                    addr.client = peers.client_addr().to_owned();
                } else if let Some(a) = peers.advertised(*id) {
                    addr.client = a;
                }
                let matched = if *id == m.id && m.state == ServerState::Leader {
                    m.last_log_index
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id).copied().flatten())
                        .map(|l| l.index)
                };
                MemberView {
                    id: *id,
                    addr,
                    voter: voters.contains(id),
                    matched,
                    // Fresh on the leader only (it calls every member at
                    // least every heartbeat); a follower's calls are the
                    // votes of its last election.
                    reach: (*id != peers.node_id() && m.state == ServerState::Leader)
                        .then(|| peers.reach(*id))
                        .flatten(),
                }
            })
            .collect();
        members.sort_by_key(|v| v.id);
        let removed = removed(
            peers,
            &retired,
            m.current_leader,
            half_removed(m.membership_config.membership(), &retired, m.id),
        );
        ClusterView {
            me: m.id,
            leader: m.current_leader,
            // A removed node that led when it stopped does not show itself
            // as the leader it was: it will never hear of another.
            last_leader: m
                .current_leader
                .or(role.last_leader())
                .filter(|l| !(removed && *l == m.id)),
            serving: role.serving(),
            state: m.state,
            term: m.current_term,
            cluster_id: peers.cluster().map(|c| cluster_hex(&c)),
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            removed,
            quorum_lost: role.quorum_lost(),
            leader_heard: m
                .current_leader
                .or(role.last_leader())
                .filter(|l| *l != m.id)
                .and_then(|l| peers.heard_ago(l)),
            leader_lost: !voters.contains(&m.id)
                && m.current_leader.is_some_and(|l| l != m.id)
                && role.leader_lost(m.current_leader.and_then(|l| peers.heard_ago(l))),
            members,
            retired,
            joint: membership.get_joint_config().len() > 1,
        }
    }
}

/// Why a membership change failed.
#[derive(Debug, Clone)]
pub enum ChangeError {
    /// Not here: the redirect.
    NotLeader(EngineError),
    /// Refused (the message says why).
    Refused(String),
    /// Cut off after it may have been proposed: it may have been applied
    /// (in part, for a removal), or may not; the message says what to do.
    Unsure(String),
}

/// What a membership change that openraft failed tells the operator: a
/// leader that stopped leading meanwhile, or a change a leader before left
/// under way, may have applied it (or part of it): not a refusal.
fn raft_err(
    e: openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, BasicNode>>,
) -> ChangeError {
    use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
    match &e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            let now = match f.leader_id {
                Some(l) => format!(" (node {l} leads now)"),
                None => String::new(),
            };
            ChangeError::Unsure(format!(
                "this node stopped leading during the change{now}: it may have been applied; see CLUSTER MEMBERS on the leader, and send it there again if not"
            ))
        }
        // Checked before anything is proposed: this step was not made
        // (a CLUSTER REMOVE's first step, recording the id as removed, may
        // have been).
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => ChangeError::Unsure(
            "another change of membership is being committed: this one was not made (a CLUSTER REMOVE may have recorded the id as removed already); send it again once CLUSTER INFO shows idem_membership:uniform"
                .into(),
        ),
        RaftError::Fatal(f) => ChangeError::Unsure(format!(
            "this node's Raft core stopped ({f}): the change may have been applied; see CLUSTER MEMBERS on another node"
        )),
        _ => ChangeError::Refused(e.to_string()),
    }
}

/// Whether a node can be reached at `ip`: not an unspecified, multicast or
/// broadcast address (IPv4-mapped ones included).
fn reachable(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
    !(ip.is_unspecified() || ip.is_multicast() || broadcast)
}

/// `CLUSTER ADD`: adds `id` as a learner at `addr`; returns once the change
/// is committed (the learner then catches up, by snapshot if it is far
/// behind).
pub async fn add_member(
    raft: &Raft<TypeConfig>,
    view: &ClusterView,
    id: NodeId,
    addr: MemberAddr,
) -> Result<(), ChangeError> {
    if id == 0 || id > MAX_NODE_ID {
        return Err(ChangeError::Refused(format!(
            "node ids are from 1 to {MAX_NODE_ID}"
        )));
    }
    if view.members.iter().any(|m| m.id == id) {
        return Err(ChangeError::Refused(format!(
            "node {id} is already a member (a node whose data directory was lost is kept out under its old id: CLUSTER REMOVE it, and add it under a new id)"
        )));
    }
    if view.retired.contains(id) {
        return Err(ChangeError::Refused(format!(
            "node {id} was removed from this cluster, and ids are never reused: give the node a new id"
        )));
    }
    // Every member's entry carries the retired ids.
    let addr = MemberAddr {
        retired: view.retired.clone(),
        ..addr
    };
    let (plain, tls) = match addr.client.split_once('+') {
        Some((p, t)) => (p, Some(t)),
        None => (addr.client.as_str(), None),
    };
    for (what, a) in [
        ("peer", Some(addr.peer.as_str())),
        ("client", Some(plain)),
        ("TLS client", tls),
    ] {
        if let Some(a) = a {
            match a.parse::<SocketAddr>() {
                Err(_) => {
                    return Err(ChangeError::Refused(format!(
                        "'{a}' is not a {what} address (IP:PORT)"
                    )));
                }
                // Nothing listens on port 0 (binding it picks a port):
                // the learner would never be reached.
                Ok(s) if s.port() == 0 || !reachable(s.ip()) => {
                    return Err(ChangeError::Refused(format!(
                        "'{a}' is not a {what} address a node can be reached at (port 0, an unspecified host such as 0.0.0.0, a multicast or broadcast address name none)"
                    )));
                }
                Ok(_) => {}
            }
        }
    }
    // Raft messages for the new member would reach another one (which
    // refuses them: wrong node id), and the learner would never catch up.
    let peer: Option<SocketAddr> = addr.peer.parse().ok();
    if let Some(m) = view
        .members
        .iter()
        .find(|m| m.addr.peer.parse::<SocketAddr>().ok() == peer)
    {
        return Err(ChangeError::Refused(format!(
            "peer address {} is node {}'s",
            addr.peer, m.id
        )));
    }
    raft.add_learner(id, addr.node(), false)
        .await
        .map_err(raft_err)?;
    info!(node = id, peer = %addr.peer, client = %addr.client, "added a learner");
    Ok(())
}

/// `CLUSTER PROMOTE`: makes learner `id` a voter, unless it lags more than
/// `max_lag` entries.
pub async fn promote_member(
    raft: &Raft<TypeConfig>,
    view: &ClusterView,
    id: NodeId,
    max_lag: u64,
) -> Result<(), ChangeError> {
    let Some(m) = view.members.iter().find(|m| m.id == id) else {
        return Err(ChangeError::Refused(format!(
            "node {id} is not a member: add it first (CLUSTER ADD)"
        )));
    };
    if m.voter {
        return Err(ChangeError::Refused(format!(
            "node {id} is already a voter"
        )));
    }
    if m.addr.inc.is_none() {
        return Err(ChangeError::Refused(format!(
            "node {id} has not been reached yet (its data directory is not recorded): start it, and wait until it catches up"
        )));
    }
    let lag = match m.matched {
        Some(i) => view.last_log_index.saturating_sub(i),
        None => view.last_log_index + 1,
    };
    if lag > max_lag {
        return Err(ChangeError::Refused(format!(
            "node {id} lags {lag} entries behind (promote_max_lag_entries is {max_lag}): wait until it catches up"
        )));
    }
    let ids: std::collections::BTreeSet<NodeId> = [id].into();
    raft.change_membership(ChangeMembers::AddVoterIds(ids), false)
        .await
        .map_err(raft_err)?;
    info!(node = id, "promoted a learner to voter");
    Ok(())
}

/// `CLUSTER REMOVE`: removes `id` (a voter through joint consensus),
/// unless no voter would remain.
pub async fn remove_member(
    raft: &Raft<TypeConfig>,
    view: &ClusterView,
    id: NodeId,
) -> Result<(), ChangeError> {
    let Some(m) = view.members.iter().find(|m| m.id == id) else {
        return Err(ChangeError::Refused(format!("node {id} is not a member")));
    };
    let ids: std::collections::BTreeSet<NodeId> = [id].into();
    if m.voter && view.members.iter().filter(|m| m.voter).count() <= 1 {
        return Err(ChangeError::Refused(format!(
            "node {id} is the last voter: a cluster needs at least one"
        )));
    }
    // First every remaining member's entry records the id as retired (so
    // the membership remembers it whatever happens next), then it goes.
    let mut retired = view.retired.clone();
    retired.insert(id);
    let marked: BTreeMap<NodeId, BasicNode> = {
        let m = raft.metrics().borrow().membership_config.clone();
        m.membership()
            .nodes()
            .filter(|(n, _)| **n != id)
            .map(|(n, node)| {
                let addr = MemberAddr {
                    retired: retired.clone(),
                    ..MemberAddr::parse(&node.addr)
                };
                (*n, addr.node())
            })
            .collect()
    };
    raft.change_membership(ChangeMembers::SetNodes(marked), true)
        .await
        .map_err(raft_err)?;
    super::crash_point("retired");
    if m.voter {
        raft.change_membership(ChangeMembers::RemoveVoters(ids), false)
            .await
            .map_err(raft_err)?;
    } else {
        raft.change_membership(ChangeMembers::RemoveNodes(ids), false)
            .await
            .map_err(raft_err)?;
    }
    info!(node = id, "removed a member");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change cut off by a change of leader, or by a change a leader
    /// before left under way, may have been applied: `-TRYAGAIN` with what
    /// to check, where it was `-ERR` with openraft's words (an operator
    /// took it for a refusal); a refusal stays one.
    #[test]
    fn a_change_cut_off_may_have_been_applied_and_says_so() {
        use openraft::error::{
            ChangeMembershipError, ClientWriteError, EmptyMembership, ForwardToLeader, InProgress,
            RaftError,
        };
        let moved = raft_err(RaftError::APIError(ClientWriteError::ForwardToLeader(
            ForwardToLeader::new(3, BasicNode::new("127.0.0.1:7003")),
        )));
        let ChangeError::Unsure(why) = moved else {
            panic!("{moved:?}")
        };
        assert!(
            why.contains("node 3 leads now") && why.contains("may have been applied"),
            "{why}"
        );
        let unknown = raft_err(RaftError::APIError(ClientWriteError::ForwardToLeader(
            ForwardToLeader::empty(),
        )));
        assert!(matches!(unknown, ChangeError::Unsure(_)), "{unknown:?}");
        let busy = raft_err(RaftError::APIError(
            ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(
                InProgress {
                    committed: None,
                    membership_log_id: None,
                },
            )),
        ));
        assert!(
            matches!(&busy, ChangeError::Unsure(why) if why.contains("this one was not made")),
            "{busy:?}"
        );
        let refused = raft_err(RaftError::APIError(
            ClientWriteError::ChangeMembershipError(ChangeMembershipError::EmptyMembership(
                EmptyMembership {},
            )),
        ));
        assert!(matches!(refused, ChangeError::Refused(_)), "{refused:?}");
    }

    #[test]
    fn member_addresses_round_trip_with_retired_ids() {
        let a = MemberAddr::parse("10.0.0.1:7379@10.0.0.1:17379");
        assert_eq!(a.client, "10.0.0.1:7379");
        assert_eq!(a.peer, "10.0.0.1:17379");
        assert!(a.retired.is_empty());
        assert_eq!(a.node().addr, "10.0.0.1:7379@10.0.0.1:17379");
        let mut retired = IdSet::default();
        retired.insert(4);
        retired.insert(2);
        let b = MemberAddr {
            retired,
            ..a.clone()
        };
        assert_eq!(b.node().addr, "10.0.0.1:7379@10.0.0.1:17379 retired=2,4");
        assert_eq!(MemberAddr::parse(&b.node().addr), b);
        // A single-node release's empty address.
        assert_eq!(MemberAddr::parse(""), MemberAddr::default());
        let nodes = [(1, b.node()), (3, a.node())];
        assert_eq!(
            retired_ids(nodes.iter().map(|(i, n)| (i, n))),
            IdSet::parse("2,4")
        );
    }

    #[test]
    fn retired_ids_keep_runs_as_ranges() {
        let mut set = IdSet::default();
        // Nodes replaced one after another: 2,000 removals in a few bytes.
        for id in (4..2004).rev() {
            set.insert(id);
        }
        set.insert(1);
        assert_eq!(set.to_string(), "1,4-2003");
        // Filling the gap joins the ranges on both sides.
        set.insert(3);
        set.insert(2);
        assert_eq!(set.to_string(), "1-2003");
        set.insert(2005);
        set.insert(1000);
        assert_eq!(set.to_string(), "1-2003,2005");
        for (id, expect) in [
            (0, false),
            (1, true),
            (2003, true),
            (2004, false),
            (2005, true),
        ] {
            assert_eq!(set.contains(id), expect, "{id}");
        }
        assert_eq!(IdSet::parse(&set.to_string()), set);
        // Overlapping, unsorted parts and parts that do not parse.
        let parsed = IdSet::parse("9-12,3,x,7-5,10-20,4,,21");
        assert_eq!(parsed.to_string(), "3-4,9-21");
        let mut other = IdSet::parse("5-8");
        other.extend(&parsed);
        assert_eq!(other.to_string(), "3-21");
        let edge = IdSet::parse("18446744073709551614-18446744073709551615,0");
        assert!(edge.contains(u64::MAX) && edge.contains(0) && !edge.contains(1));
        // Each member's entry carries the ranges.
        let a = MemberAddr {
            retired: set,
            ..MemberAddr::parse("h:1@h:2")
        };
        assert_eq!(a.node().addr, "h:1@h:2 retired=1-2003,2005");
        assert_eq!(MemberAddr::parse(&a.node().addr), a);
    }

    static SUSPENDED_US: AtomicU64 = AtomicU64::new(5_000_000);

    fn test_role(suspended: fn() -> u64) -> Arc<Role> {
        test_role_reading(suspended, suspended)
    }

    fn test_role_reading(suspended: fn() -> u64, fast: fn() -> u64) -> Arc<Role> {
        let role = Role::with_suspension(
            Clock::starting_at(0),
            Duration::from_millis(600),
            Duration::from_millis(240),
            Duration::from_millis(300),
            suspended,
            fast,
        );
        role.voters.store(3, Ordering::Relaxed);
        role
    }

    /// A learner that has not heard from its leader since it started
    /// (restarted while the leader was down, or it heard it only before it
    /// knew its members) counts from its start: it named a dead leader,
    /// `cluster_state:ok`, for good.
    #[test]
    fn a_learner_that_never_heard_its_leader_counts_from_its_start() {
        let role = Role::new(
            Clock::starting_at(0),
            Duration::from_millis(10),
            Duration::from_millis(8),
            Duration::from_millis(10),
        );
        assert!(!role.leader_lost(None), "just started");
        assert!(!role.leader_lost(Some(Duration::from_millis(10))));
        assert!(role.leader_lost(Some(Duration::from_millis(80))));
        std::thread::sleep(Duration::from_millis(80));
        assert!(role.leader_lost(None), "never heard since its start");
        assert!(!role.leader_lost(Some(Duration::from_millis(10))));
    }

    /// A leader elected while no majority could answer it (one voter
    /// down, the other installing a snapshot) told clients for 21 s that it
    /// was "just elected" and about to serve. Past its lease and an
    /// election timeout since its election, and since a majority last
    /// answered, it says the cluster is down, as a serving leader does; a
    /// majority's answer, or a single voter, keeps it "just elected".
    #[tokio::test(start_paused = true)]
    async fn a_leader_no_majority_answers_since_its_election_says_the_cluster_is_down() {
        static NONE_US: AtomicU64 = AtomicU64::new(0);
        let role = test_role(|| NONE_US.load(Ordering::Relaxed));
        tokio::time::advance(Duration::from_millis(1)).await;
        // An answer from an earlier term does not count.
        role.acknowledged(Instant::now());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!role.quorum_lost(), "not leading");
        role.inner.write().led_since = Some(Instant::now());
        // Lease 240 ms and election timeout 600 ms, from the election.
        tokio::time::advance(Duration::from_millis(800)).await;
        role.ticked();
        assert!(!role.quorum_lost(), "not yet that long");
        tokio::time::advance(Duration::from_millis(100)).await;
        role.ticked();
        assert!(role.quorum_lost());
        role.acknowledged(Instant::now());
        assert!(
            !role.quorum_lost(),
            "a majority answered: it applies the log"
        );
        tokio::time::advance(Duration::from_millis(300)).await;
        role.ticked();
        assert!(
            !role.quorum_lost(),
            "one late answer is not the cluster down"
        );
        tokio::time::advance(Duration::from_millis(600)).await;
        role.ticked();
        assert!(role.quorum_lost(), "no answer for 900 ms");
        role.voters.store(1, Ordering::Relaxed);
        assert!(!role.quorum_lost(), "a single voter");
    }

    #[tokio::test(start_paused = true)]
    async fn the_careful_read_of_suspended_time_waits_for_the_fast_one_to_show_a_suspension() {
        static CAREFUL_US: AtomicU64 = AtomicU64::new(0);
        static CAREFUL_READS: AtomicU64 = AtomicU64::new(0);
        static FAST_US: AtomicU64 = AtomicU64::new(0);
        let role = test_role_reading(
            || {
                CAREFUL_READS.fetch_add(1, Ordering::Relaxed);
                CAREFUL_US.load(Ordering::Relaxed)
            },
            || FAST_US.load(Ordering::Relaxed),
        );
        let at_start = CAREFUL_READS.load(Ordering::Relaxed);
        tokio::time::advance(Duration::from_millis(1)).await;
        role.acknowledged(Instant::now());
        for _ in 0..100 {
            assert!(role.lease_holds());
        }
        assert_eq!(
            CAREFUL_READS.load(Ordering::Relaxed),
            at_start,
            "nothing suspended: the fast read alone"
        );
        // The fast read shows less than the careful one, never more: a
        // careful read that shows nothing new keeps the lease...
        FAST_US.store(5_000, Ordering::Relaxed);
        assert!(role.lease_holds());
        assert_eq!(CAREFUL_READS.load(Ordering::Relaxed), at_start + 1);
        // ...and one that confirms the suspension ends it.
        tokio::time::advance(Duration::from_millis(1)).await;
        CAREFUL_US.store(5_200, Ordering::Relaxed);
        assert!(!role.lease_holds(), "a lease outlived a suspension");
        tokio::time::advance(Duration::from_millis(1)).await;
        role.acknowledged(Instant::now());
        assert!(role.lease_holds(), "an acknowledgement after it counts");
        let reads = CAREFUL_READS.load(Ordering::Relaxed);
        for _ in 0..100 {
            assert!(role.lease_holds());
        }
        assert_eq!(CAREFUL_READS.load(Ordering::Relaxed), reads);
    }

    #[test]
    fn the_fast_read_of_suspended_time_never_shows_more_than_the_careful_one() {
        for _ in 0..1000 {
            let fast = suspended_us_fast();
            // Read after it: the time suspended only grows.
            let careful = suspended_us();
            assert!(
                fast <= careful + SUSPENSION_NOISE_US,
                "fast {fast} µs, careful {careful} µs"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_does_not_outlive_a_suspension_of_the_host() {
        let lease = Duration::from_millis(240);
        let role = test_role(|| SUSPENDED_US.load(Ordering::Relaxed));
        assert!(!role.lease_holds(), "never acknowledged");
        tokio::time::advance(Duration::from_millis(1)).await;
        role.acknowledged(Instant::now());
        assert!(role.lease_holds());
        // The lease runs out on tokio's clock...
        tokio::time::advance(lease).await;
        assert!(!role.lease_holds());
        let before = Instant::now();
        role.acknowledged(before);
        tokio::time::advance(lease / 2).await;
        assert!(role.lease_holds());
        assert_eq!(role.since_quorum_ack_ms(), Some(120));
        // ...and across a suspension, which tokio's clock does not count.
        SUSPENDED_US.fetch_add(1_000_000, Ordering::Relaxed);
        assert!(!role.lease_holds(), "a lease outlived a suspension");
        // The same acknowledgement, seen again after the wake-up (the
        // metrics repeat it), does not bring it back.
        role.acknowledged(before);
        assert!(
            !role.lease_holds(),
            "an acknowledgement from before the suspension counted"
        );
        // One sent after the wake-up does.
        tokio::time::advance(Duration::from_millis(1)).await;
        role.acknowledged(Instant::now());
        assert!(role.lease_holds());
    }

    /// A leader whose election timeout was larger than a follower's
    /// served reads on a majority's answers for four fifths of its own
    /// while that follower kept its vote for it for its smaller value
    /// only: once the follower's vote was free, another leader could be
    /// elected while this one still served. The lease is four fifths of
    /// the smallest value the voters gave, and its own again once none
    /// is smaller.
    #[tokio::test(start_paused = true)]
    async fn the_lease_is_capped_by_the_smallest_election_timeout_of_the_voters() {
        let role = test_role(|| 0);
        role.serving.store(true, Ordering::Release);
        assert_eq!(role.lease(), Duration::from_millis(240));
        // A voter's larger value leaves it alone.
        assert!(!role.cap_lease(Some(Duration::from_millis(3000))));
        assert_eq!(role.lease(), Duration::from_millis(240));
        // A smaller one shortens it, and what holds, holds that long.
        assert!(role.cap_lease(Some(Duration::from_millis(100))));
        assert_eq!(role.lease(), Duration::from_millis(80));
        tokio::time::advance(Duration::from_millis(1)).await;
        let acked = Instant::now();
        role.acknowledged(acked);
        tokio::time::advance(Duration::from_millis(79)).await;
        assert!(role.lease_holds());
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!role.lease_holds(), "served past a voter's vote");
        assert_eq!(
            role.lease_hold_until(),
            Some(acked + Duration::from_millis(80 + 300))
        );
        assert_eq!(
            role.cut_off_at(),
            Some(acked + Duration::from_millis(80 + 300))
        );
        // No value given (voters of an earlier release): its own.
        assert!(!role.cap_lease(None));
        assert_eq!(role.lease(), Duration::from_millis(240));
        assert!(role.lease_holds());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_held_for_a_bounded_time_after_a_lapse() {
        let role = test_role(|| 0);
        role.serving.store(true, Ordering::Release);
        tokio::time::advance(Duration::from_millis(1)).await;
        let acked = Instant::now();
        role.acknowledged(acked);
        assert_eq!(role.lease_hold_until(), None, "the lease holds");
        tokio::time::advance(Duration::from_millis(250)).await;
        // Lapsed: held until lease + hold after the acknowledgement.
        let until = role.lease_hold_until().expect("held");
        assert_eq!(until, acked + Duration::from_millis(240 + 300));
        // An answer within the hold: the request is served.
        let waiting = {
            let role = Arc::clone(&role);
            tokio::spawn(async move { role.lease_regained(until).await })
        };
        tokio::time::advance(Duration::from_millis(10)).await;
        role.acknowledged(Instant::now());
        assert!(waiting.await.unwrap());
        // No answer within it: refused at its end, and requests that come
        // later are not held at all.
        tokio::time::advance(Duration::from_millis(250)).await;
        let until = role.lease_hold_until().expect("held");
        assert!(!role.lease_regained(until).await);
        assert!(Instant::now() >= until);
        assert_eq!(role.lease_hold_until(), None, "held again after the hold");
        assert_eq!(role.lease_counts(), (0, 2, 1));
    }

    #[test]
    fn initial_cluster_is_parsed_strictly() {
        assert_eq!(
            parse_initial_cluster("1=10.0.0.1:17379, 2=h2:17379").unwrap(),
            vec![(1, "10.0.0.1:17379".into()), (2, "h2:17379".into())]
        );
        assert_eq!(parse_initial_cluster("").unwrap(), vec![]);
        for (bad, why) in [
            ("1", "ID=HOST:PORT"),
            ("0=h:1", "from 1 to"),
            ("9223372036854775808=h:1", "from 1 to"),
            ("x=h:1", "node id"),
            ("1=h", "HOST:PORT"),
            ("1=:5", "HOST:PORT"),
            ("1=h:1,1=h:2", "twice"),
        ] {
            let e = parse_initial_cluster(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
