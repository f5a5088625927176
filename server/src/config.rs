//! Configuration: a raw, serde-friendly form with defaults, validated into
//! [`Config`], the only form the server accepts.
//!
//! Precedence: command-line flags, then `IDEM_*` environment variables,
//! then the config file, then defaults. Every key is listed with its
//! default and meaning in `config/idem.toml`.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use crate::store::{Defaults, MemoryLimits, StoreConfig};

/// The storage engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// In memory; nothing survives a restart.
    Memory,
    /// Through a Raft log on disk (one node): durable.
    Raft,
}

impl EngineKind {
    /// The engine's name, as configured and reported.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Memory => "memory",
            EngineKind::Raft => "raft",
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "memory" => Ok(EngineKind::Memory),
            "raft" => Ok(EngineKind::Raft),
            _ => Err(ConfigError::Invalid {
                key: "engine",
                reason: format!("unknown engine '{s}' (available: memory, raft)"),
            }),
        }
    }
}

/// Configuration as read from a file or the environment, before checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    /// Address to listen on.
    pub listen: String,
    /// Storage engine.
    pub engine: String,
    /// Where the raft engine keeps its log and snapshots.
    pub data_dir: String,
    /// This node's id in its cluster (a positive integer, never reused).
    pub node_id: u64,
    /// Address to listen on for peers (Raft traffic), IP:PORT; empty: a
    /// single node.
    pub peer_listen: String,
    /// The client address other nodes redirect clients to (default: the
    /// listen address).
    pub advertise: String,
    /// The peer address other nodes connect to (default: `peer_listen`).
    pub peer_advertise: String,
    /// The members to bootstrap a new cluster with, `1=HOST:PEERPORT,...`.
    pub initial_cluster: String,
    /// The secret peers prove they hold (required when `peer_listen` is not
    /// loopback).
    pub cluster_secret: String,
    /// The default user's password (`AUTH password`), or `#` and its
    /// SHA-256 in hex; empty: none (every connection is authenticated).
    pub requirepass: String,
    /// Users, one Redis ACL rule line each (`payments on #<sha256> ~payments:*
    /// +@idem`, the leading `user` optional). Not with `aclfile`.
    pub users: Vec<String>,
    /// A file of users, one `user NAME rules...` line each (`ACL LOAD`
    /// rereads it). Not with `users`.
    pub aclfile: String,
    /// While anyone may connect without a password (the default user is on
    /// and `nopass`), clients connecting from other hosts than this one are
    /// refused (`-DENIED`).
    pub protected_mode: bool,
    /// Where TLS clients connect, IP:PORT; empty: no TLS listener.
    pub tls_listen: String,
    /// Where Prometheus scrapes `GET /metrics`, IP:PORT; empty: no
    /// metrics listener.
    pub metrics_listen: String,
    /// The server's certificate chain (PEM).
    pub tls_cert_file: String,
    /// Its private key (PEM).
    pub tls_key_file: String,
    /// The CA that signs client and peer certificates (PEM).
    pub tls_ca_cert_file: String,
    /// `yes`, `no` or `optional`: whether TLS clients must present a
    /// certificate signed by the CA (empty: `yes` with a CA, else `no`).
    pub tls_auth_clients: String,
    /// `CN`: a client certificate's CN logs the connection in as the ACL
    /// user of that name; `off`.
    pub tls_auth_clients_user: String,
    /// Peers talk TLS to each other, certificates checked both ways.
    pub tls_cluster: bool,
    /// The address MOVED and CLUSTER SLOTS give TLS clients (default: the
    /// TLS listen address).
    pub tls_advertise: String,
    /// `CLUSTER PROMOTE` refuses a learner further behind than this many
    /// entries.
    pub promote_max_lag_entries: u64,
    /// Peer connections a node serves at once, at most.
    pub max_peer_connections: usize,
    /// Peer connections from one source address still in their handshake,
    /// at most.
    pub max_peer_handshakes_per_source: usize,
    /// Bytes of peer frames being received at once, at most, over every
    /// peer connection (each counted at the length it announces).
    pub max_peer_receive_bytes: usize,
    /// The shortest Raft election timeout, ms (the longest is twice it).
    pub election_timeout_ms: u64,
    /// How long the leader waits for a follower to answer one
    /// AppendEntries (the follower answers once the entries are on its
    /// disk) before it retries, ms.
    pub append_timeout_ms: u64,
    /// AppendEntries the leader may have sent to one follower and not yet
    /// had answered: entries proposed while others are on their way go at
    /// once instead of after the previous answer (1: one at a time).
    pub max_inflight_appends: u64,
    /// How long a leader with followers keeps polling its sockets after it
    /// proposes an entry, while the entry awaits its quorum, instead of
    /// sleeping, µs (0: it sleeps at once).
    pub leader_poll_us: u64,
    /// A leader with followers that answered N writes since its last entry
    /// gathers the next one until N writes are waiting, or none arrived
    /// for this long, µs (0: it takes what has arrived).
    pub gather_idle_us: u64,
    /// Ops waiting to be proposed to the log, at most.
    pub max_pending_proposals: usize,
    /// Bytes of ops waiting to be proposed to the log, at most.
    pub max_pending_proposal_bytes: usize,
    /// Bytes of ops in one log entry, at most.
    pub max_batch_bytes: usize,
    /// A write not applied within this gets -TRYAGAIN, ms.
    pub proposal_timeout_ms: u64,
    /// Log entries since the last snapshot that trigger a new one.
    pub snapshot_entries: u64,
    /// Bytes of log since the last snapshot that trigger a new one, at
    /// least (see `snapshot_log_percent`).
    pub snapshot_log_bytes: u64,
    /// Percent of the latest snapshot file's size that the log since it
    /// may reach before the next, when more than `snapshot_log_bytes`
    /// (0: `snapshot_log_bytes` alone).
    pub snapshot_log_percent: u64,
    /// The voters of a cluster take their snapshots in turns of this long,
    /// ms, by the wall clock (0: each as soon as its snapshot is due).
    pub snapshot_turn_ms: u64,
    /// Size at which a log segment is closed, bytes.
    pub wal_segment_bytes: u64,
    /// Free space on the data directory's filesystem below which writes get
    /// -TRYAGAIN, bytes.
    pub min_free_disk_bytes: u64,
    /// Number of store shards (a power of two; 0 picks one from the CPU count).
    pub shards: usize,
    /// Lease when CLAIM gives none, ms.
    pub default_lease_ms: u64,
    /// Longest lease, ms.
    pub max_lease_ms: u64,
    /// Retention when neither CLAIM nor COMPLETE gives one, ms.
    pub default_retain_ms: u64,
    /// Longest retention, ms.
    pub max_retain_ms: u64,
    /// Longest WAIT, ms.
    pub max_wait_ms: u64,
    /// Requests waiting (WAIT) on one key at once, at most.
    pub max_waiters_per_key: usize,
    /// Requests waiting (WAIT) at once on the whole server, at most.
    pub max_waiters: usize,
    /// Largest key, bytes.
    pub max_key_bytes: usize,
    /// Largest value, bytes.
    pub max_value_bytes: usize,
    /// Largest journal, bytes.
    pub max_journal_bytes: usize,
    /// Largest fingerprint, bytes.
    pub max_fingerprint_bytes: usize,
    /// Largest attempt id, bytes.
    pub max_attempt_bytes: usize,
    /// Largest request frame, bytes.
    pub max_frame_bytes: usize,
    /// Most arguments in one request.
    pub max_args: usize,
    /// Longest inline command line, bytes.
    pub max_inline_bytes: usize,
    /// Largest request frame (and bulk string, and inline line) of a
    /// connection that has not authenticated yet, where authentication is
    /// required, bytes.
    pub max_unauthenticated_frame_bytes: usize,
    /// Most client connections at once.
    pub max_connections: usize,
    /// Length of the listen socket's queue of connections not yet accepted.
    pub tcp_backlog: u32,
    /// Accounted record bytes at which new claims are refused with OOM.
    pub max_memory_bytes: usize,
    /// Room beyond `max_memory_bytes`, in percent of it, within which owners
    /// already in flight may still COMPLETE and JOURNAL.
    pub memory_headroom_percent: u64,
    /// Most reply bytes held for one client before it is disconnected.
    pub max_output_buffer_bytes: usize,
    /// Most reply bytes held for all clients together (0: no limit); past
    /// it the clients owing the most are disconnected.
    pub max_client_memory_bytes: u64,
    /// A client owing replies that takes none of them for this long is
    /// disconnected, ms (0: never).
    pub client_write_timeout_ms: u64,
    /// Close connections idle this long, ms (0: never).
    pub idle_timeout_ms: u64,
    /// Interval of the active expiry sweep, ms.
    pub sweep_interval_ms: u64,
    /// Most slots examined per shard per sweep round, looking for expired
    /// records.
    pub sweep_batch: usize,
    /// Most keys one expiry op carries.
    pub expire_batch: usize,
    /// Most requests one connection may have in progress (decoded, not yet
    /// answered); when full, the connection stops reading.
    pub max_pending_per_connection: usize,
    /// Most records one `SCAN` call looks at, whatever its COUNT asks (a
    /// larger COUNT is taken as this: COUNT is a hint).
    pub max_scan_count: usize,
    /// Longest connection name (`CLIENT SETNAME`, `HELLO ... SETNAME`) and
    /// library name or version (`CLIENT SETINFO`) a connection may set.
    pub max_client_name_bytes: usize,
    /// Wrong passwords accepted per second from one source address, and
    /// from all of them for one that gave any (guessing limit).
    pub max_auth_failures_per_sec: u64,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` overrides it.
    pub log: String,
    /// Runtime worker threads (0: one per CPU, but one on a machine of
    /// [`SMALL_MACHINE_CPUS`] or fewer; see [`worker_threads_for`]).
    pub worker_threads: usize,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            listen: "127.0.0.1:7379".into(),
            engine: "raft".into(),
            data_dir: "idem-data".into(),
            node_id: 1,
            peer_listen: String::new(),
            advertise: String::new(),
            peer_advertise: String::new(),
            initial_cluster: String::new(),
            cluster_secret: String::new(),
            requirepass: String::new(),
            users: Vec::new(),
            aclfile: String::new(),
            protected_mode: true,
            tls_listen: String::new(),
            metrics_listen: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_ca_cert_file: String::new(),
            tls_auth_clients: String::new(),
            tls_auth_clients_user: "off".into(),
            tls_cluster: false,
            tls_advertise: String::new(),
            promote_max_lag_entries: 1000,
            max_peer_connections: crate::engine::raft::peer::MAX_PEER_CONNECTIONS,
            max_peer_handshakes_per_source:
                crate::engine::raft::peer::MAX_PEER_HANDSHAKES_PER_SOURCE,
            max_peer_receive_bytes: crate::engine::raft::peer::MAX_FRAME,
            election_timeout_ms: 300,
            append_timeout_ms: 2_000,
            max_inflight_appends: 1,
            leader_poll_us: crate::engine::raft::LEADER_POLL_US,
            gather_idle_us: crate::engine::raft::GATHER_IDLE_US,
            max_pending_proposals: 65_536,
            max_pending_proposal_bytes: 64 << 20,
            max_batch_bytes: 8 << 20,
            proposal_timeout_ms: 10_000,
            snapshot_entries: 100_000,
            snapshot_log_bytes: 64 << 20,
            snapshot_log_percent: 50,
            snapshot_turn_ms: 2_000,
            wal_segment_bytes: 64 << 20,
            min_free_disk_bytes: 64 << 20,
            shards: 0,
            default_lease_ms: 30_000,
            max_lease_ms: 3_600_000,
            default_retain_ms: 86_400_000,
            max_retain_ms: 30 * 86_400_000,
            max_wait_ms: 300_000,
            max_waiters_per_key: 10_000,
            max_waiters: 100_000,
            max_key_bytes: 1024,
            max_value_bytes: 1024 * 1024,
            max_journal_bytes: 4096,
            max_fingerprint_bytes: 256,
            max_attempt_bytes: 128,
            max_frame_bytes: 2 * 1024 * 1024,
            max_args: 1024,
            max_inline_bytes: 64 * 1024,
            max_unauthenticated_frame_bytes: 16 * 1024,
            max_connections: 10_000,
            tcp_backlog: 511,
            max_memory_bytes: 1 << 30,
            memory_headroom_percent: 10,
            max_output_buffer_bytes: 32 * 1024 * 1024,
            max_client_memory_bytes: 256 * 1024 * 1024,
            client_write_timeout_ms: 30_000,
            idle_timeout_ms: 0,
            sweep_interval_ms: 100,
            sweep_batch: 2000,
            expire_batch: 1000,
            max_pending_per_connection: 1024,
            max_scan_count: 10_000,
            max_client_name_bytes: 256,
            max_auth_failures_per_sec: 100,
            // openraft logs every failed call to a peer that is down:
            // idemd logs when a peer becomes unreachable and comes back.
            log: "info,openraft=off".into(),
            worker_threads: 0,
        }
    }
}

/// A configuration that failed to load or validate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The path.
        path: String,
        /// The parser's message.
        message: String,
    },
    /// A key has a value out of range or malformed.
    #[error("invalid value for {key}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Where `GET /metrics` is served (`metrics_listen`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The users (from `requirepass`, `users` or `aclfile`), as loaded at
    /// start (`ACL LOAD` replaces the node's copy).
    pub acl: std::sync::Arc<crate::acl::Acl>,
    /// The ACL file, if users come from one.
    pub aclfile: Option<std::path::PathBuf>,
    /// TLS, for clients (`tls_listen`) and peers (`tls_cluster`).
    pub tls: Option<std::sync::Arc<crate::tls::Tls>>,
    /// This node advertises a TLS client address beside its plain one
    /// (`PLAIN+TLS`): redirects are cut to each client's kind.
    pub advertises_tls: bool,
    /// Refuse clients from other hosts while anyone may connect without a
    /// password.
    pub protected_mode: bool,
    /// Storage engine.
    pub engine: EngineKind,
    /// The raft engine's settings.
    pub raft: crate::engine::raft::RaftConfig,
    /// How the store is laid out.
    pub store: StoreConfig,
    /// Defaults this node resolves into the ops it accepts.
    pub defaults: Defaults,
    /// The memory limits this node proposes (replicated state).
    pub memory: MemoryLimits,
    /// Request limits.
    pub limits: RequestLimits,
    /// Most client connections at once.
    pub max_connections: usize,
    /// Listen backlog.
    pub tcp_backlog: u32,
    /// Most reply bytes held for one client.
    pub max_output_buffer_bytes: usize,
    /// Most reply bytes held for all clients (0: no limit).
    pub max_client_memory_bytes: u64,
    /// Write timeout of a client owing replies, ms (0: off).
    pub client_write_timeout_ms: u64,
    /// Idle timeout, ms (0: off).
    pub idle_timeout_ms: u64,
    /// Sweep interval, ms.
    pub sweep_interval_ms: u64,
    /// Slots examined per shard per sweep round.
    pub sweep_batch: usize,
    /// Most keys per expiry op.
    pub expire_batch: usize,
    /// Most requests in progress per connection.
    pub max_pending_per_connection: usize,
    /// Most records one `SCAN` call looks at.
    pub max_scan_count: usize,
    /// Longest connection name, library name or version.
    pub max_client_name_bytes: usize,
    /// Bounds on parked (waiting) requests.
    pub wait_limits: crate::waiters::WaitLimits,
    /// Wrong passwords accepted per second from one source address (and
    /// from all, for an address that gave any); past it, its AUTHs wait
    /// for the next second.
    pub max_auth_failures_per_sec: u64,
    /// Log filter.
    pub log: String,
    /// Runtime worker threads, at least one (`worker_threads` 0 resolved by
    /// [`worker_threads_for`]).
    pub worker_threads: usize,
    /// The raw form, for `CONFIG GET`.
    pub raw: RawConfig,
}

impl Config {
    /// Reads the ACL file again (`ACL LOAD`): the users it defines, the
    /// default user from `requirepass` unless the file defines it.
    ///
    /// # Errors
    ///
    /// With no ACL file configured, or when it cannot be read or has a bad
    /// line (the users in force then stay).
    pub fn reload_acl(&self) -> Result<crate::acl::Acl, String> {
        let Some(path) = &self.aclfile else {
            return Err("this server has no aclfile configured: its users come from the configuration (requirepass, users) and change with a restart".into());
        };
        let password = password_hash(&self.raw.requirepass).map_err(|e| e.to_string())?;
        let lines = crate::acl::Acl::read_file(path)?;
        crate::acl::Acl::build(password, lines.iter().map(|(o, l)| (o.clone(), l.as_str())))
    }
}

/// Limits on what one request may carry.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Longest lease, ms.
    pub max_lease_ms: u64,
    /// Longest retention, ms.
    pub max_retain_ms: u64,
    /// Longest wait, ms.
    pub max_wait_ms: u64,
    /// Largest key.
    pub max_key_bytes: usize,
    /// Largest value.
    pub max_value_bytes: usize,
    /// Largest journal.
    pub max_journal_bytes: usize,
    /// Largest fingerprint.
    pub max_fingerprint_bytes: usize,
    /// Largest attempt id.
    pub max_attempt_bytes: usize,
    /// Frame decoding limits.
    pub frame: idem_protocol::Limits,
    /// Frame decoding limits before authentication (where it is
    /// required): an AUTH or HELLO needs little, and a connection that has
    /// not logged in holds no more than this of a partial frame.
    pub frame_unauthenticated: idem_protocol::Limits,
}

/// The SHA-256 of `requirepass`: given as `#` and 64 hex digits, or
/// hashed from the password (which is not kept).
fn password_hash(requirepass: &str) -> Result<Option<[u8; 32]>, ConfigError> {
    use sha2::{Digest, Sha256};
    if requirepass.is_empty() {
        return Ok(None);
    }
    if let Some(hex) = requirepass.strip_prefix('#') {
        let bad = || {
            invalid(
                "requirepass",
                "'#' must be followed by the password's SHA-256: 64 hex digits",
            )
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        return Ok(Some(out));
    }
    Ok(Some(Sha256::digest(requirepass.as_bytes()).into()))
}

fn yes_no(key: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Ok(true),
        "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(invalid(key, format!("'{value}' is not yes or no"))),
    }
}

/// Whether a rule line defines the user `name`.
fn defines(line: &str, name: &str) -> bool {
    let mut w = line.split_whitespace();
    let first = w.next();
    let n = if first == Some("user") {
        w.next()
    } else {
        first
    };
    n == Some(name)
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// The largest `max_lease_ms` accepted: 30 days.
pub const MAX_LEASE_BOUND_MS: u64 = 30 * 24 * 3_600_000;
/// The largest `max_wait_ms` accepted: one day.
pub const MAX_WAIT_BOUND_MS: u64 = 24 * 3_600_000;
/// The longest `leader_poll_us` (100 ms): polling is for the time an
/// entry's quorum takes to answer, never for a wait that long.
pub const MAX_LEADER_POLL_US: u64 = 100_000;
/// The longest `snapshot_turn_ms` (10 minutes): a due snapshot waits one
/// round of turns at most, and the log grows meanwhile.
pub const MAX_SNAPSHOT_TURN_MS: u64 = 600_000;

/// The `election_timeout_ms` values taken.
pub const ELECTION_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 50..=60_000;

/// The longest `gather_idle_us` (1 ms): a pause between requests longer
/// than that is not requests on their way.
pub const MAX_GATHER_IDLE_US: u64 = 1_000;
/// The largest timeout or interval a key may set (30 days): far beyond
/// any use, and small enough to add to a clock reading.
pub const MAX_TIMEOUT_BOUND_MS: u64 = 30 * 24 * 3_600_000;

/// The smallest `max_pending_proposal_bytes` (1 MiB).
pub const MIN_PENDING_PROPOSAL_BYTES: usize = 1 << 20;

/// The largest `max_pending_proposal_bytes` (4 GiB less a byte: what one
/// wait for room can count).
pub const MAX_PENDING_PROPOSAL_BYTES: usize = u32::MAX as usize;

/// Calls `$m!` with every numeric key: the one list that setting from text
/// and listing for `CONFIG GET` share.
macro_rules! numeric_keys {
    ($m:ident) => {
        $m!(
            node_id,
            promote_max_lag_entries,
            max_peer_connections,
            max_peer_handshakes_per_source,
            max_peer_receive_bytes,
            election_timeout_ms,
            append_timeout_ms,
            max_inflight_appends,
            leader_poll_us,
            gather_idle_us,
            max_pending_proposals,
            max_pending_proposal_bytes,
            max_batch_bytes,
            proposal_timeout_ms,
            snapshot_entries,
            snapshot_log_bytes,
            snapshot_log_percent,
            snapshot_turn_ms,
            wal_segment_bytes,
            min_free_disk_bytes,
            shards,
            default_lease_ms,
            max_lease_ms,
            default_retain_ms,
            max_retain_ms,
            max_wait_ms,
            max_waiters_per_key,
            max_waiters,
            max_key_bytes,
            max_value_bytes,
            max_journal_bytes,
            max_fingerprint_bytes,
            max_attempt_bytes,
            max_frame_bytes,
            max_args,
            max_inline_bytes,
            max_unauthenticated_frame_bytes,
            max_connections,
            tcp_backlog,
            max_memory_bytes,
            memory_headroom_percent,
            max_output_buffer_bytes,
            max_client_memory_bytes,
            client_write_timeout_ms,
            idle_timeout_ms,
            sweep_interval_ms,
            sweep_batch,
            expire_batch,
            max_pending_per_connection,
            max_scan_count,
            max_client_name_bytes,
            max_auth_failures_per_sec,
            worker_threads
        )
    };
}

impl RawConfig {
    /// The largest expiry op: `expire_batch` keys of `max_key_bytes`.
    fn largest_expiry_op(&self) -> usize {
        self.expire_batch.saturating_mul(self.max_key_bytes + 4)
    }

    /// Reads a TOML file over the defaults.
    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Applies `IDEM_<KEY>` variables from `vars` (e.g. `IDEM_MAX_WAIT_MS`).
    /// A variable naming no key (an application's own `IDEM_ADDR`, say) is
    /// left alone and returned, for a warning; a known key with a bad value
    /// is an error.
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Vec<String>, ConfigError> {
        let known: Vec<&'static str> = self.entries().into_iter().map(|(k, _)| k).collect();
        let mut ignored = Vec::new();
        for (name, value) in vars {
            let Some(key) = name.strip_prefix("IDEM_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if !known.contains(&key.as_str()) {
                ignored.push(name);
                continue;
            }
            self.set(&key, &value)?;
        }
        Ok(ignored)
    }

    /// Sets one key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        fn num<T: std::str::FromStr>(key: &'static str, v: &str) -> Result<T, ConfigError> {
            v.trim()
                .parse()
                .map_err(|_| invalid(key, format!("'{v}' is not a non-negative integer")))
        }
        macro_rules! keys {
            ($($name:ident),*) => {
                match key {
                    "listen" => self.listen = value.to_owned(),
                    "engine" => self.engine = value.to_owned(),
                    "data_dir" => self.data_dir = value.to_owned(),
                    "peer_listen" => self.peer_listen = value.to_owned(),
                    "advertise" => self.advertise = value.to_owned(),
                    "peer_advertise" => self.peer_advertise = value.to_owned(),
                    "initial_cluster" => self.initial_cluster = value.to_owned(),
                    "cluster_secret" => self.cluster_secret = value.to_owned(),
                    "requirepass" => self.requirepass = value.to_owned(),
                    // One rule line per line of the value; each setting adds.
                    "users" => self.users.extend(
                        value.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned),
                    ),
                    "aclfile" => self.aclfile = value.to_owned(),
                    "tls_listen" => self.tls_listen = value.to_owned(),
                    "metrics_listen" => self.metrics_listen = value.to_owned(),
                    "tls_cert_file" => self.tls_cert_file = value.to_owned(),
                    "tls_key_file" => self.tls_key_file = value.to_owned(),
                    "tls_ca_cert_file" => self.tls_ca_cert_file = value.to_owned(),
                    "tls_auth_clients" => self.tls_auth_clients = value.to_owned(),
                    "tls_auth_clients_user" => self.tls_auth_clients_user = value.to_owned(),
                    "tls_cluster" => self.tls_cluster = yes_no("tls_cluster", value)?,
                    "tls_advertise" => self.tls_advertise = value.to_owned(),
                    "protected_mode" => self.protected_mode = yes_no("protected_mode", value)?,
                    "log" => self.log = value.to_owned(),
                    $(stringify!($name) => self.$name = num(stringify!($name), value)?,)*
                    _ => return Err(invalid("environment", format!("unknown key IDEM_{}", key.to_ascii_uppercase()))),
                }
            };
        }
        numeric_keys!(keys);
        Ok(())
    }

    /// Every key and its value as text (for `CONFIG GET`).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        macro_rules! keys {
            ($($name:ident),*) => {
                vec![
                    ("listen", self.listen.clone()),
                    ("engine", self.engine.clone()),
                    ("data_dir", self.data_dir.clone()),
                    ("peer_listen", self.peer_listen.clone()),
                    ("advertise", self.advertise.clone()),
                    ("peer_advertise", self.peer_advertise.clone()),
                    ("initial_cluster", self.initial_cluster.clone()),
                    // Never shown: only whether one is set.
                    ("cluster_secret", if self.cluster_secret.is_empty() { String::new() } else { "(set)".into() }),
                    ("requirepass", if self.requirepass.is_empty() { String::new() } else { "(set)".into() }),
                    // Validated configurations hold them with hashed passwords.
                    ("users", self.users.join("\n")),
                    ("aclfile", self.aclfile.clone()),
                    ("tls_listen", self.tls_listen.clone()),
                    ("metrics_listen", self.metrics_listen.clone()),
                    ("tls_cert_file", self.tls_cert_file.clone()),
                    ("tls_key_file", self.tls_key_file.clone()),
                    ("tls_ca_cert_file", self.tls_ca_cert_file.clone()),
                    // In force: unset means yes once a CA is given.
                    ("tls_auth_clients", match self.tls_auth_clients.trim() {
                        "" if !self.tls_ca_cert_file.trim().is_empty() => "yes".into(),
                        "" => "no".into(),
                        v => v.to_owned(),
                    }),
                    ("tls_auth_clients_user", self.tls_auth_clients_user.clone()),
                    ("tls_cluster", if self.tls_cluster { "yes" } else { "no" }.into()),
                    ("tls_advertise", self.tls_advertise.clone()),
                    ("protected_mode", if self.protected_mode { "yes" } else { "no" }.into()),
                    ("log", self.log.clone()),
                    $((stringify!($name), self.$name.to_string()),)*
                ]
            };
        }
        numeric_keys!(keys)
    }

    /// The TLS keys: `None` when neither a TLS listener nor TLS between
    /// peers is configured.
    fn tls(&self) -> Result<Option<crate::tls::TlsSettings>, ConfigError> {
        use crate::tls::{AuthClients, TlsSettings};
        let listen = match self.tls_listen.trim() {
            "" => None,
            v => Some(v.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "tls_listen",
                    format!("'{v}' is not IP:PORT (an IP address and a port; host names are not resolved)"),
                )
            })?),
        };
        if listen.is_none() && !self.tls_advertise.trim().is_empty() {
            return Err(invalid(
                "tls_advertise",
                "needs tls_listen (a TLS listener to advertise)",
            ));
        }
        if listen.is_none() && !self.tls_cluster {
            return Ok(None);
        }
        let file = |key: &'static str, v: &str| -> Result<std::path::PathBuf, ConfigError> {
            match v.trim() {
                "" => Err(invalid(key, "TLS (tls_listen or tls_cluster) needs it")),
                p => Ok(p.into()),
            }
        };
        let ca_cert_file = match self.tls_ca_cert_file.trim() {
            "" => None,
            p => Some(std::path::PathBuf::from(p)),
        };
        let auth_clients = match self.tls_auth_clients.trim().to_ascii_lowercase().as_str() {
            "" if ca_cert_file.is_some() => AuthClients::Yes,
            "" | "no" => AuthClients::No,
            "yes" => AuthClients::Yes,
            "optional" => AuthClients::Optional,
            v => {
                return Err(invalid(
                    "tls_auth_clients",
                    format!("'{v}' is not yes, no or optional"),
                ));
            }
        };
        if auth_clients != AuthClients::No && ca_cert_file.is_none() {
            return Err(invalid(
                "tls_auth_clients",
                "checking client certificates needs tls_ca_cert_file",
            ));
        }
        let auth_clients_user_cn = match self
            .tls_auth_clients_user
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "cn" => true,
            "off" | "" => false,
            v => {
                return Err(invalid(
                    "tls_auth_clients_user",
                    format!("'{v}' is not CN or off"),
                ));
            }
        };
        let v = self.tls_advertise.trim();
        if !v.is_empty() && v.parse::<SocketAddr>().is_err() {
            return Err(invalid("tls_advertise", format!("'{v}' is not IP:PORT")));
        }
        if listen.is_some_and(|l| l.port() == 0) {
            return Err(invalid("tls_listen", "needs a port (0 is not supported)"));
        }
        if auth_clients_user_cn && auth_clients == AuthClients::No {
            return Err(invalid(
                "tls_auth_clients_user",
                "CN logins need client certificates: tls_auth_clients yes or optional",
            ));
        }
        Ok(Some(TlsSettings {
            listen,
            cert_file: file("tls_cert_file", &self.tls_cert_file)?,
            key_file: file("tls_key_file", &self.tls_key_file)?,
            ca_cert_file,
            auth_clients,
            auth_clients_user_cn,
            cluster: self.tls_cluster,
        }))
    }

    /// The users: `requirepass` and `users`, or `aclfile`.
    fn acl(
        &self,
        password: Option<[u8; 32]>,
    ) -> Result<(crate::acl::Acl, Option<std::path::PathBuf>), ConfigError> {
        use crate::acl::Acl;
        if self.aclfile.trim().is_empty() {
            let lines = self
                .users
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("users[{i}]"), l.as_str()));
            return Ok((
                Acl::build(password, lines).map_err(|e| invalid("users", e))?,
                None,
            ));
        }
        if !self.users.is_empty() {
            return Err(invalid(
                "aclfile",
                "users are defined both in `users` and in an ACL file: keep one",
            ));
        }
        let path = std::path::PathBuf::from(self.aclfile.trim());
        let lines = Acl::read_file(&path).map_err(|e| invalid("aclfile", e))?;
        let acl = Acl::build(password, lines.iter().map(|(o, l)| (o.clone(), l.as_str())))
            .map_err(|e| invalid("aclfile", e))?;
        Ok((acl, Some(path)))
    }

    /// Checks the cluster keys.
    fn cluster_config(
        &self,
        listen: SocketAddr,
        engine: EngineKind,
    ) -> Result<crate::engine::raft::cluster::ClusterConfig, ConfigError> {
        use crate::engine::raft::cluster::{ClusterConfig, parse_initial_cluster};
        if self.node_id == 0 || self.node_id > crate::engine::raft::cluster::MAX_NODE_ID {
            return Err(invalid(
                "node_id",
                format!(
                    "must be from 1 to {}",
                    crate::engine::raft::cluster::MAX_NODE_ID
                ),
            ));
        }
        let addr = |key: &'static str, v: &str| -> Result<SocketAddr, ConfigError> {
            v.trim().parse().map_err(|_| {
                invalid(
                    key,
                    format!("'{v}' is not IP:PORT (an IP address and a port; host names are not resolved)"),
                )
            })
        };
        let peer_listen = match self.peer_listen.trim() {
            "" => None,
            v => Some(addr("peer_listen", v)?),
        };
        let initial_cluster = parse_initial_cluster(&self.initial_cluster)
            .map_err(|e| invalid("initial_cluster", e))?;
        let mut client_advertise = match self.advertise.trim() {
            "" => listen.to_string(),
            v => {
                addr("advertise", v)?;
                v.to_owned()
            }
        };
        // With a TLS listener, the address TLS clients are sent to rides
        // along: `PLAIN+TLS` (see `cluster::client_addr_for`).
        let tls_addr = match (self.tls_advertise.trim(), self.tls_listen.trim()) {
            ("", "") => None,
            ("", v) => Some(addr("tls_listen", v)?.to_string()),
            (v, _) => Some(addr("tls_advertise", v)?.to_string()),
        };
        if let Some(t) = tls_addr {
            client_advertise = format!("{client_advertise}+{t}");
        }
        let peer_advertise = match (self.peer_advertise.trim(), peer_listen) {
            ("", Some(p)) => p.to_string(),
            ("", None) => String::new(),
            (v, _) => {
                addr("peer_advertise", v)?;
                v.to_owned()
            }
        };
        let Some(peer) = peer_listen else {
            if !initial_cluster.is_empty() {
                return Err(invalid(
                    "initial_cluster",
                    "needs peer_listen (--peer-listen)",
                ));
            }
            return Ok(ClusterConfig {
                client_advertise,
                promote_max_lag_entries: self.promote_max_lag_entries,
                max_peer_connections: self.max_peer_connections,
                max_peer_handshakes_per_source: self.max_peer_handshakes_per_source,
                max_peer_receive_bytes: self.max_peer_receive_bytes,
                ..ClusterConfig::default()
            });
        };
        if engine != EngineKind::Raft {
            return Err(invalid("peer_listen", "a cluster needs the raft engine"));
        }
        if listen.port() == 0 && self.advertise.trim().is_empty() {
            return Err(invalid(
                "advertise",
                "a cluster node listening on port 0 must name its client address (advertise)",
            ));
        }
        // Clients are redirected to the advertised address: a wildcard
        // (what `--listen 0.0.0.0:P` advertises unless told otherwise)
        // would send them nowhere.
        if wildcard(client_advertise.split('+').next().unwrap_or_default()) {
            let what = match self.advertise.trim() {
                "" => format!("listen {listen} is a wildcard"),
                v => format!("'{v}' is a wildcard"),
            };
            return Err(invalid(
                "advertise",
                format!(
                    "{what}: a cluster node must name the address its clients are redirected to (e.g. --advertise 10.0.0.1:7379)"
                ),
            ));
        }
        if let Some(what) = tls_wildcard(&self.tls_advertise, &self.tls_listen) {
            return Err(invalid(
                "tls_advertise",
                format!(
                    "{what}: a cluster node must name the address its TLS clients are redirected to"
                ),
            ));
        }
        if wildcard(&peer_advertise) {
            return Err(invalid(
                "peer_advertise",
                format!("'{peer_advertise}' is a wildcard: name the address peers connect to"),
            ));
        }
        // The peer listener binds before the client one: on the same
        // address the client listener then fails as if another process
        // held the port.
        // (Port 0 is two different ports; an IPv4 wildcard leaves IPv6
        // alone, an IPv6 one takes IPv4 too.)
        let covers = |wild: std::net::IpAddr, other: std::net::IpAddr| {
            wild.is_unspecified() && (wild.is_ipv6() || other.is_ipv4())
        };
        if peer.port() == listen.port()
            && peer.port() != 0
            && (peer.ip() == listen.ip()
                || covers(peer.ip(), listen.ip())
                || covers(listen.ip(), peer.ip()))
        {
            return Err(invalid(
                "peer_listen",
                format!("{peer} overlaps listen {listen}: give peers a port of their own"),
            ));
        }
        if peer.ip().is_unspecified() && self.peer_advertise.trim().is_empty() {
            return Err(invalid(
                "peer_advertise",
                format!("peer_listen {peer} is a wildcard: name the address peers connect to"),
            ));
        }
        if !peer.ip().is_loopback() && self.cluster_secret.is_empty() {
            return Err(invalid(
                "cluster_secret",
                format!(
                    "peer_listen {peer} is not a loopback address: set cluster_secret (the same on every node) so that only nodes holding it can join"
                ),
            ));
        }
        if !self.cluster_secret.is_empty() && self.cluster_secret.len() < 16 {
            return Err(invalid("cluster_secret", "must be at least 16 bytes"));
        }
        // As for CLUSTER ADD: the log goes to no address off this host
        // unless peers prove they hold the secret.
        if self.cluster_secret.is_empty()
            && let Some((id, a)) =
                initial_cluster
                    .iter()
                    .find(|(_, a)| match a.parse::<SocketAddr>() {
                        Ok(p) => !p.ip().to_canonical().is_loopback(),
                        // A host name may name any host.
                        Err(_) => !a.starts_with("localhost:"),
                    })
        {
            return Err(invalid(
                "cluster_secret",
                format!(
                    "initial_cluster lists node {id} at {a}, not a loopback address: set cluster_secret (the same on every node) so that only nodes holding it can join"
                ),
            ));
        }
        // Whether it lists this node (at its address) matters only to a
        // node that bootstraps (`cluster::bootstrap`): it is ignored once
        // the data directory holds a membership, so every node, those
        // added later included, can be given the same one.
        Ok(ClusterConfig {
            peer_listen,
            peer_advertise,
            client_advertise,
            initial_cluster,
            secret: (!self.cluster_secret.is_empty())
                .then(|| self.cluster_secret.clone().into_bytes()),
            promote_max_lag_entries: self.promote_max_lag_entries,
            max_peer_connections: self.max_peer_connections,
            max_peer_handshakes_per_source: self.max_peer_handshakes_per_source,
            max_peer_receive_bytes: self.max_peer_receive_bytes,
        })
    }

    /// Checks every key and builds the [`Config`].
    pub fn validate(self) -> Result<Config, ConfigError> {
        let listen: SocketAddr = self.listen.parse().map_err(|_| {
            invalid(
                "listen",
                format!(
                    "'{}' is not IP:PORT (an IP address and a port; host names are not resolved)",
                    self.listen
                ),
            )
        })?;
        let metrics_listen = match self.metrics_listen.trim() {
            "" => None,
            v => Some(v.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    "metrics_listen",
                    format!("'{v}' is not IP:PORT (an IP address and a port; host names are not resolved)"),
                )
            })?),
        };
        let engine: EngineKind = self.engine.parse()?;
        let positive = |key: &'static str, v: u64| {
            if v == 0 {
                Err(invalid(key, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive("max_lease_ms", self.max_lease_ms)?;
        positive("max_retain_ms", self.max_retain_ms)?;
        positive("default_lease_ms", self.default_lease_ms)?;
        positive("default_retain_ms", self.default_retain_ms)?;
        positive("max_key_bytes", self.max_key_bytes as u64)?;
        positive("max_connections", self.max_connections as u64)?;
        if self.max_connections > MAX_CONNECTIONS {
            return Err(invalid(
                "max_connections",
                format!("must be at most {MAX_CONNECTIONS}"),
            ));
        }
        positive("sweep_interval_ms", self.sweep_interval_ms)?;
        positive("sweep_batch", self.sweep_batch as u64)?;
        positive("expire_batch", self.expire_batch as u64)?;
        // One expiry op is one log entry, bounded as a request is.
        if self.largest_expiry_op() > MAX_FRAME_BYTES {
            return Err(invalid(
                "expire_batch",
                format!(
                    "{} keys of up to max_key_bytes ({}) make an expiry entry of {} bytes, over {MAX_FRAME_BYTES} (64 MiB): lower expire_batch",
                    self.expire_batch,
                    self.max_key_bytes,
                    self.largest_expiry_op()
                ),
            ));
        }
        positive("max_pending_proposals", self.max_pending_proposals as u64)?;
        positive("proposal_timeout_ms", self.proposal_timeout_ms)?;
        if !ELECTION_TIMEOUT_MS.contains(&self.election_timeout_ms) {
            return Err(invalid(
                "election_timeout_ms",
                "must be between 50 and 60000",
            ));
        }
        positive("max_peer_connections", self.max_peer_connections as u64)?;
        positive(
            "max_peer_handshakes_per_source",
            self.max_peer_handshakes_per_source as u64,
        )?;
        if self.max_peer_receive_bytes < crate::engine::raft::peer::MAX_FRAME {
            return Err(invalid(
                "max_peer_receive_bytes",
                format!(
                    "must be at least {} (512 MiB, the largest peer frame), so that any frame a member sends fits",
                    crate::engine::raft::peer::MAX_FRAME
                ),
            ));
        }
        if !(10..=600_000).contains(&self.append_timeout_ms) {
            return Err(invalid(
                "append_timeout_ms",
                "must be between 10 and 600000",
            ));
        }
        if self.leader_poll_us > MAX_LEADER_POLL_US {
            return Err(invalid(
                "leader_poll_us",
                format!("must be at most {MAX_LEADER_POLL_US} (100 ms); 0 turns polling off"),
            ));
        }
        if self.gather_idle_us > MAX_GATHER_IDLE_US {
            return Err(invalid(
                "gather_idle_us",
                format!(
                    "must be at most {MAX_GATHER_IDLE_US} (1 ms); 0 takes what has arrived at once"
                ),
            ));
        }
        if !(1..=crate::engine::raft::peer::READ_AHEAD as u64).contains(&self.max_inflight_appends)
        {
            return Err(invalid(
                "max_inflight_appends",
                format!(
                    "must be between 1 and {} (what a follower reads ahead of its answers)",
                    crate::engine::raft::peer::READ_AHEAD
                ),
            ));
        }
        positive("snapshot_entries", self.snapshot_entries)?;
        positive("snapshot_log_bytes", self.snapshot_log_bytes)?;
        if self.snapshot_turn_ms > MAX_SNAPSHOT_TURN_MS {
            return Err(invalid(
                "snapshot_turn_ms",
                format!("must be at most {MAX_SNAPSHOT_TURN_MS} (10 minutes); 0 takes no turns"),
            ));
        }
        if self.snapshot_log_percent > 10_000 {
            return Err(invalid(
                "snapshot_log_percent",
                "must be between 0 and 10000",
            ));
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(invalid(
                "worker_threads",
                format!("must be from 0 (automatic) to {MAX_WORKER_THREADS}"),
            ));
        }
        if !(MIN_PENDING_PROPOSAL_BYTES..=MAX_PENDING_PROPOSAL_BYTES)
            .contains(&self.max_pending_proposal_bytes)
        {
            return Err(invalid(
                "max_pending_proposal_bytes",
                format!(
                    "must be between {MIN_PENDING_PROPOSAL_BYTES} and {MAX_PENDING_PROPOSAL_BYTES}"
                ),
            ));
        }
        if !(4096..=64 << 20).contains(&self.max_batch_bytes) {
            return Err(invalid(
                "max_batch_bytes",
                "must be between 4096 and 67108864",
            ));
        }
        // Each segment is preallocated whole: a terabyte would fill the
        // disk before the start failed.
        if !(4096..=MAX_WAL_SEGMENT_BYTES).contains(&self.wal_segment_bytes) {
            return Err(invalid(
                "wal_segment_bytes",
                format!("must be between 4096 and {MAX_WAL_SEGMENT_BYTES}"),
            ));
        }
        if self.data_dir.trim().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        positive(
            "max_pending_per_connection",
            self.max_pending_per_connection as u64,
        )?;
        positive("max_auth_failures_per_sec", self.max_auth_failures_per_sec)?;
        positive("max_client_name_bytes", self.max_client_name_bytes as u64)?;
        positive("max_scan_count", self.max_scan_count as u64)?;
        positive("max_waiters_per_key", self.max_waiters_per_key as u64)?;
        positive("max_waiters", self.max_waiters as u64)?;
        if self.memory_headroom_percent > 100 {
            return Err(invalid(
                "memory_headroom_percent",
                format!("{} is over 100", self.memory_headroom_percent),
            ));
        }
        if !(1..=65_535).contains(&self.tcp_backlog) {
            return Err(invalid("tcp_backlog", "must be between 1 and 65535"));
        }
        // Bounds that keep times representable: a remaining lease is sent
        // as a signed 64-bit integer, and a record keeps its retention in
        // 32 bits of milliseconds.
        if self.max_lease_ms > MAX_LEASE_BOUND_MS {
            return Err(invalid(
                "max_lease_ms",
                format!("must be at most {MAX_LEASE_BOUND_MS} (30 days)"),
            ));
        }
        if self.max_retain_ms > u64::from(u32::MAX) {
            return Err(invalid(
                "max_retain_ms",
                format!("must be at most {} (about 49.7 days)", u32::MAX),
            ));
        }
        for (key, v) in [
            ("proposal_timeout_ms", self.proposal_timeout_ms),
            ("client_write_timeout_ms", self.client_write_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("sweep_interval_ms", self.sweep_interval_ms),
        ] {
            if v > MAX_TIMEOUT_BOUND_MS {
                return Err(invalid(
                    key,
                    format!("must be at most {MAX_TIMEOUT_BOUND_MS} (30 days)"),
                ));
            }
        }
        if self.max_wait_ms > MAX_WAIT_BOUND_MS {
            return Err(invalid(
                "max_wait_ms",
                format!("must be at most {MAX_WAIT_BOUND_MS} (1 day)"),
            ));
        }
        if self.default_lease_ms > self.max_lease_ms {
            return Err(invalid(
                "default_lease_ms",
                format!(
                    "{} is over max_lease_ms ({})",
                    self.default_lease_ms, self.max_lease_ms
                ),
            ));
        }
        if self.default_retain_ms > self.max_retain_ms {
            return Err(invalid(
                "default_retain_ms",
                format!(
                    "{} is over max_retain_ms ({})",
                    self.default_retain_ms, self.max_retain_ms
                ),
            ));
        }
        let biggest_arg = self
            .max_value_bytes
            .max(self.max_journal_bytes)
            .max(self.max_key_bytes);
        let need = self.max_key_bytes
            + self.max_value_bytes
            + self.max_fingerprint_bytes
            + self.max_attempt_bytes
            + 512;
        if self.max_frame_bytes < need {
            return Err(invalid(
                "max_frame_bytes",
                format!("must be at least {need} to carry the largest CLAIM and COMPLETE"),
            ));
        }
        if self.max_frame_bytes > MAX_FRAME_BYTES {
            return Err(invalid(
                "max_frame_bytes",
                format!(
                    "must be at most {MAX_FRAME_BYTES} (64 MiB): a request is written to the log as one entry, and the largest entry must fit a log record and a message to the other nodes"
                ),
            ));
        }
        if self.max_journal_bytes > MAX_FRAME_BYTES {
            return Err(invalid(
                "max_journal_bytes",
                format!("must be at most {MAX_FRAME_BYTES} (64 MiB)"),
            ));
        }
        // A record holds a value or a journal, and a reply (RECOVER,
        // SETTLE's ABANDONED, INSPECT) carries it with the fingerprint
        // and the attempt id.
        let largest_reply = self.max_value_bytes.max(self.max_journal_bytes)
            + self.max_fingerprint_bytes
            + self.max_attempt_bytes
            + 1024;
        if self.max_output_buffer_bytes < largest_reply {
            return Err(invalid(
                "max_output_buffer_bytes",
                format!(
                    "must hold at least one largest reply ({largest_reply}: the larger of max_value_bytes and max_journal_bytes, with max_fingerprint_bytes, max_attempt_bytes and 1024)"
                ),
            ));
        }
        if self.max_key_bytes > u16::MAX as usize {
            return Err(invalid("max_key_bytes", "must be at most 65535"));
        }
        if self.max_fingerprint_bytes > u16::MAX as usize {
            return Err(invalid("max_fingerprint_bytes", "must be at most 65535"));
        }
        if self.max_attempt_bytes > u8::MAX as usize {
            return Err(invalid("max_attempt_bytes", "must be at most 255"));
        }
        if self.max_retain_ms > u32::MAX as u64 {
            return Err(invalid(
                "max_retain_ms",
                format!("must be at most {} (about 49 days)", u32::MAX),
            ));
        }
        if self.max_args < 16 {
            return Err(invalid("max_args", "must be at least 16"));
        }
        if self.max_unauthenticated_frame_bytes < 1024 {
            return Err(invalid(
                "max_unauthenticated_frame_bytes",
                "must be at least 1024",
            ));
        }
        if self.max_inline_bytes < 64 {
            return Err(invalid("max_inline_bytes", "must be at least 64"));
        }
        let shards = match self.shards {
            0 => (std::thread::available_parallelism().map_or(4, |n| n.get()) * 16)
                .next_power_of_two()
                .min(1024),
            n if n.is_power_of_two() && n <= 65536 => n,
            n => {
                return Err(invalid(
                    "shards",
                    format!("{n} is not a power of two up to 65536"),
                ));
            }
        };
        let cluster = self.cluster_config(listen, engine)?;
        let advertises_tls = cluster.client_advertise.contains('+');
        let password_sha256 = password_hash(&self.requirepass)?;
        let (acl, aclfile) = self.acl(password_sha256)?;
        let tls = match self.tls()? {
            Some(t) => Some(std::sync::Arc::new(
                crate::tls::Tls::new(t).map_err(|e| invalid(e.key, e.reason))?,
            )),
            None => None,
        };
        // Passwords themselves are not kept: the configuration shown and
        // debugged holds their hashes.
        let mut kept = self.clone();
        if let Some(h) = password_sha256 {
            kept.requirepass = format!(
                "#{}",
                h.iter().map(|b| format!("{b:02x}")).collect::<String>()
            );
        }
        if !self.users.is_empty() {
            kept.users = acl
                .users()
                .filter(|u| {
                    u.name() != "default" || self.users.iter().any(|l| defines(l, "default"))
                })
                .map(|u| u.describe())
                .collect();
        }
        Ok(Config {
            listen,
            metrics_listen,
            acl: std::sync::Arc::new(acl),
            aclfile,
            tls: tls.clone(),
            advertises_tls,
            protected_mode: self.protected_mode,
            engine,
            raft: crate::engine::raft::RaftConfig {
                data_dir: self.data_dir.clone().into(),
                node_id: self.node_id,
                election_timeout_ms: self.election_timeout_ms,
                append_timeout_ms: self.append_timeout_ms,
                max_inflight_appends: self.max_inflight_appends as usize,
                leader_poll_us: self.leader_poll_us,
                gather_idle_us: self.gather_idle_us,
                cluster,
                tls,
                max_pending_proposals: self.max_pending_proposals,
                max_pending_proposal_bytes: self.max_pending_proposal_bytes,
                max_batch_bytes: self.max_batch_bytes,
                max_request_bytes: self.max_frame_bytes.max(self.largest_expiry_op()),
                proposal_timeout_ms: self.proposal_timeout_ms,
                snapshot_entries: self.snapshot_entries,
                snapshot_log_bytes: self.snapshot_log_bytes,
                snapshot_log_percent: self.snapshot_log_percent,
                snapshot_turn_ms: self.snapshot_turn_ms,
                segment_bytes: self.wal_segment_bytes,
                min_free_disk_bytes: self.min_free_disk_bytes,
            },
            store: StoreConfig { shards, seed: None },
            defaults: Defaults {
                lease_ms: self.default_lease_ms,
                retain_ms: self.default_retain_ms,
            },
            memory: MemoryLimits {
                max_memory_bytes: self.max_memory_bytes as u64,
                headroom_bytes: (self.max_memory_bytes as u128
                    * self.memory_headroom_percent as u128
                    / 100) as u64,
            },
            limits: RequestLimits {
                max_lease_ms: self.max_lease_ms,
                max_retain_ms: self.max_retain_ms,
                max_wait_ms: self.max_wait_ms,
                max_key_bytes: self.max_key_bytes,
                max_value_bytes: self.max_value_bytes,
                max_journal_bytes: self.max_journal_bytes,
                max_fingerprint_bytes: self.max_fingerprint_bytes,
                max_attempt_bytes: self.max_attempt_bytes,
                frame: idem_protocol::Limits {
                    // A bulk string over every argument limit is refused while
                    // its header is read; its payload is never buffered.
                    max_bulk: biggest_arg
                        .max(self.max_fingerprint_bytes)
                        .max(self.max_attempt_bytes),
                    max_array: self.max_args,
                    max_inline: self.max_inline_bytes,
                    max_depth: 1,
                    max_frame: self.max_frame_bytes,
                    inline: true,
                },
                frame_unauthenticated: {
                    let max = self.max_unauthenticated_frame_bytes;
                    idem_protocol::Limits {
                        max_bulk: max,
                        max_array: self.max_args,
                        max_inline: max.min(self.max_inline_bytes),
                        max_depth: 1,
                        max_frame: max,
                        inline: true,
                    }
                },
            },
            max_connections: self.max_connections,
            tcp_backlog: self.tcp_backlog,
            max_output_buffer_bytes: self.max_output_buffer_bytes,
            max_client_memory_bytes: self.max_client_memory_bytes,
            client_write_timeout_ms: self.client_write_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            sweep_interval_ms: self.sweep_interval_ms,
            sweep_batch: self.sweep_batch,
            expire_batch: self.expire_batch,
            max_pending_per_connection: self.max_pending_per_connection,
            max_scan_count: self.max_scan_count,
            max_client_name_bytes: self.max_client_name_bytes,
            max_auth_failures_per_sec: self.max_auth_failures_per_sec,
            wait_limits: crate::waiters::WaitLimits {
                per_key: self.max_waiters_per_key,
                total: self.max_waiters,
            },
            log: self.log.clone(),
            worker_threads: worker_threads_for(
                self.worker_threads,
                std::thread::available_parallelism().map_or(1, usize::from),
            ),
            raw: kept,
        })
    }
}

/// The largest `wal_segment_bytes` (1 GiB): segments are preallocated.
pub const MAX_WAL_SEGMENT_BYTES: u64 = 1 << 30;

/// The largest `max_connections` (each needs a file descriptor; far past
/// what one process serves).
pub const MAX_CONNECTIONS: usize = 1 << 24;

/// The largest `max_frame_bytes` (and `max_journal_bytes`), 64 MiB. A
/// request is written to the log as one entry, so the largest request
/// must fit a log record and, with the entries sent beside it, a message
/// to the other nodes; Redis's own default for a bulk string is 512 MB,
/// far past what an idempotency record needs.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The most runtime worker threads `worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

/// A machine of this many CPUs or fewer runs one worker thread unless
/// `worker_threads` says otherwise.
pub const SMALL_MACHINE_CPUS: usize = 2;

/// The runtime worker threads for a configured `worker_threads` on a
/// machine of `cpus` CPUs: the number configured; for 0, one per CPU, but
/// one on a machine of [`SMALL_MACHINE_CPUS`] or fewer.
///
/// One worker is the single-threaded runtime, an event loop like Redis's
/// (no work stealing, no wake-ups across threads). On a small machine a
/// second worker mostly takes CPU from what shares it (the clients, the
/// kernel's network work, other nodes): on 2 CPUs shared with the load
/// generator, one worker served more in every case measured
/// (`benches/RESULTS.md`).
pub fn worker_threads_for(configured: usize, cpus: usize) -> usize {
    match configured {
        0 if cpus <= SMALL_MACHINE_CPUS => 1,
        0 => cpus,
        n => n,
    }
}

/// Whether `addr` is an address with a wildcard IP (`0.0.0.0`, `::`).
fn wildcard(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
}

/// Why the TLS address a cluster node advertises is a wildcard, if it is:
/// `tls_advertise` itself, or `tls_listen` when that is what is
/// advertised.
fn tls_wildcard(tls_advertise: &str, tls_listen: &str) -> Option<String> {
    match (tls_advertise.trim(), tls_listen.trim()) {
        ("", l) if wildcard(l) => Some(format!("tls_listen {l} is a wildcard")),
        (a, _) if wildcard(a) => Some(format!("'{a}' is a wildcard")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `worker_threads` 0 is one per CPU, one on a small machine; a number
    /// set is kept, and what validation gives is always at least one.
    #[test]
    fn worker_threads_default_to_one_on_a_small_machine() {
        assert_eq!(worker_threads_for(0, 1), 1);
        assert_eq!(worker_threads_for(0, 2), 1);
        assert_eq!(worker_threads_for(0, 3), 3);
        assert_eq!(worker_threads_for(0, 16), 16);
        assert_eq!(worker_threads_for(1, 16), 1);
        assert_eq!(worker_threads_for(4, 2), 4);
        let c = RawConfig::default().validate().unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(c.worker_threads, worker_threads_for(0, cpus));
        assert!(c.worker_threads >= 1);
        let mut raw = RawConfig::default();
        raw.set("worker_threads", "3").unwrap();
        assert_eq!(raw.validate().unwrap().worker_threads, 3);
    }

    #[test]
    fn defaults_validate() {
        let c = RawConfig::default().validate().unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7379");
        assert!(c.store.shards.is_power_of_two());
        assert_eq!(c.limits.max_key_bytes, 1024);
        assert_eq!(c.limits.frame.max_bulk, 1024 * 1024);
        // One AppendEntries at a time unless asked (README: Entries in
        // flight); up to what a follower reads ahead.
        let mut raw = RawConfig::default();
        assert_eq!(raw.max_inflight_appends, 1);
        raw.set("max_inflight_appends", "16").unwrap();
        assert_eq!(raw.validate().unwrap().raft.max_inflight_appends, 16);
        // A leader polls for its entries' answers unless told not to.
        let mut raw = RawConfig::default();
        assert_eq!(raw.leader_poll_us, 600);
        raw.set("leader_poll_us", "0").unwrap();
        assert_eq!(raw.validate().unwrap().raft.leader_poll_us, 0);
        let mut raw = RawConfig::default();
        raw.set("leader_poll_us", "100000").unwrap();
        assert_eq!(raw.validate().unwrap().raft.leader_poll_us, 100_000);
        // A leader gathers the writes its answers bring back unless told
        // not to.
        let mut raw = RawConfig::default();
        assert_eq!(raw.gather_idle_us, 80);
        raw.set("gather_idle_us", "0").unwrap();
        assert_eq!(raw.validate().unwrap().raft.gather_idle_us, 0);
        let mut raw = RawConfig::default();
        raw.set("gather_idle_us", "1000").unwrap();
        assert_eq!(raw.validate().unwrap().raft.gather_idle_us, 1_000);
        // The voters snapshot in turns unless told not to.
        let raw = RawConfig::default();
        assert_eq!(raw.validate().unwrap().raft.snapshot_turn_ms, 2_000);
        let mut raw = RawConfig::default();
        raw.set("snapshot_turn_ms", "0").unwrap();
        assert_eq!(raw.validate().unwrap().raft.snapshot_turn_ms, 0);
        let mut raw = RawConfig::default();
        raw.set("snapshot_turn_ms", "600000").unwrap();
        assert_eq!(raw.validate().unwrap().raft.snapshot_turn_ms, 600_000);
    }

    #[test]
    fn env_overrides_and_errors() {
        let mut raw = RawConfig::default();
        raw.apply_env([
            ("IDEM_MAX_WAIT_MS".into(), "5".into()),
            ("PATH".into(), "/bin".into()),
        ])
        .unwrap();
        assert_eq!(raw.max_wait_ms, 5);
        let e = raw
            .apply_env([("IDEM_MAX_WAIT_MS".into(), "soon".into())])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value for max_wait_ms: 'soon' is not a non-negative integer"
        );
        // Not ours: left alone, reported for a warning.
        assert_eq!(
            raw.apply_env([("IDEM_ADDR".into(), "x:1".into())]).unwrap(),
            vec!["IDEM_ADDR".to_owned()]
        );
        // A config file's unknown key is still an error (a typo there is
        // ours).
        assert!(raw.set("nope", "1").is_err());
    }

    #[test]
    fn bad_values_are_refused_with_the_key_named() {
        let cases: Vec<(&str, &str, &str)> = vec![
            ("listen", "localhost", "listen"),
            ("engine", "rocks", "engine"),
            ("shards", "3", "shards"),
            ("max_lease_ms", "0", "max_lease_ms"),
            ("max_lease_ms", "18446744073709551615", "max_lease_ms"),
            ("max_retain_ms", "4294967296", "max_retain_ms"),
            ("max_wait_ms", "86400001", "max_wait_ms"),
            // Added to clock readings: a huge one panicked at the first
            // connection or write.
            ("idle_timeout_ms", "18446744073709551615", "idle_timeout_ms"),
            (
                "client_write_timeout_ms",
                "2592000001",
                "client_write_timeout_ms",
            ),
            (
                "proposal_timeout_ms",
                "18446744073709551615",
                "proposal_timeout_ms",
            ),
            (
                "sweep_interval_ms",
                "18446744073709551615",
                "sweep_interval_ms",
            ),
            ("tcp_backlog", "0", "tcp_backlog"),
            ("snapshot_log_percent", "10001", "snapshot_log_percent"),
            ("tcp_backlog", "65536", "tcp_backlog"),
            ("default_lease_ms", "7200000", "default_lease_ms"),
            ("max_frame_bytes", "1000", "max_frame_bytes"),
            // A request is one log entry: one past what the log and a
            // peer message carry stopped the node (and its cluster) when
            // it came.
            ("max_frame_bytes", "67108865", "max_frame_bytes"),
            ("max_journal_bytes", "67108865", "max_journal_bytes"),
            // A RECOVER reply carries the journal.
            ("max_journal_bytes", "40000000", "max_output_buffer_bytes"),
            // One expiry op, one log entry: 300k keys of 1 KiB stopped the
            // leader (and the next) as the request above did.
            ("expire_batch", "300000", "expire_batch"),
            ("max_output_buffer_bytes", "10", "max_output_buffer_bytes"),
            // Past what a follower reads ahead of its answers.
            ("max_inflight_appends", "0", "max_inflight_appends"),
            ("max_inflight_appends", "17", "max_inflight_appends"),
            ("leader_poll_us", "100001", "leader_poll_us"),
            ("gather_idle_us", "1001", "gather_idle_us"),
            (
                "max_pending_proposal_bytes",
                "1000",
                "max_pending_proposal_bytes",
            ),
            (
                "max_pending_proposal_bytes",
                "4294967296",
                "max_pending_proposal_bytes",
            ),
            ("snapshot_turn_ms", "600001", "snapshot_turn_ms"),
            // Less than the largest frame a member may send.
            (
                "max_peer_receive_bytes",
                "536870911",
                "max_peer_receive_bytes",
            ),
        ];
        for (key, value, named) in cases {
            let mut raw = RawConfig::default();
            let r = raw.set(key, value).and_then(|_| raw.validate().map(|_| ()));
            let e = r.unwrap_err().to_string();
            assert!(e.contains(named), "{key}={value}: {e}");
        }
    }

    /// The largest requests accepted: one as large as a frame may be.
    #[test]
    fn the_largest_frame_accepted_carries_the_largest_value() {
        let mut raw = RawConfig::default();
        for (key, value) in [
            ("max_frame_bytes", "67108864"),
            ("max_value_bytes", "66000000"),
            ("max_journal_bytes", "67108864"),
            ("max_output_buffer_bytes", "70000000"),
        ] {
            raw.set(key, value).unwrap();
        }
        let c = raw.clone().validate().unwrap();
        assert_eq!(c.limits.frame.max_frame, MAX_FRAME_BYTES);
        raw.set("max_value_bytes", "67108000").unwrap();
        let e = raw.validate().unwrap_err().to_string();
        assert!(e.contains("max_frame_bytes"), "{e}");
    }

    #[test]
    fn file_parses_and_rejects_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("idem-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(&good, "listen = \"127.0.0.1:9999\"\nmax_wait_ms = 7\n").unwrap();
        let raw = RawConfig::from_file(&good).unwrap();
        assert_eq!(raw.max_wait_ms, 7);
        assert_eq!(raw.validate().unwrap().listen.port(), 9999);
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "max_wiat_ms = 7\n").unwrap();
        assert!(matches!(
            RawConfig::from_file(&bad),
            Err(ConfigError::Parse { .. })
        ));
        // The shipped file lists every key with its default.
        let shipped = RawConfig::from_file(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/idem.toml"
        )))
        .unwrap();
        assert_eq!(
            format!("{:?}", shipped.entries()),
            format!("{:?}", RawConfig::default().entries())
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_shipped_cluster_example_validates() {
        for i in 1..=3 {
            let path = format!(
                "{}/../config/cluster/node{i}.toml",
                env!("CARGO_MANIFEST_DIR")
            );
            let c = RawConfig::from_file(Path::new(&path))
                .unwrap()
                .validate()
                .unwrap();
            assert_eq!(c.raft.node_id, i);
            assert_eq!(c.raft.cluster.initial_cluster.len(), 3);
            assert_eq!(
                c.raft.cluster.peer_advertise,
                c.raft.cluster.initial_cluster[i as usize - 1].1
            );
        }
    }

    #[test]
    fn cluster_keys_are_checked() {
        let set = |pairs: &[(&str, &str)]| {
            let mut raw = RawConfig::default();
            for (k, v) in pairs {
                raw.set(k, v).unwrap();
            }
            raw.validate()
        };
        let msg =
            |r: Result<Config, ConfigError>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(set(&[("peer_listen", "10.1.2.3:17379")])).contains("cluster_secret"));
        assert!(msg(set(&[("peer_listen", "nope")])).contains("peer_listen"));
        assert!(msg(set(&[("initial_cluster", "1=127.0.0.1:1")])).contains("needs peer_listen"));
        // Not listing this node is for the bootstrap to judge: a node
        // added later is given the same list as the others.
        assert!(
            set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("initial_cluster", "2=127.0.0.1:1,3=127.0.0.1:2")
            ])
            .is_ok()
        );
        assert!(
            msg(set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("initial_cluster", "1=127.0.0.1:17379,1=127.0.0.1:2")
            ]))
            .contains("twice")
        );
        assert!(
            msg(set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("engine", "memory")
            ]))
            .contains("raft engine")
        );
        assert!(
            msg(set(&[
                ("peer_listen", "10.1.2.3:17379"),
                ("cluster_secret", "short")
            ]))
            .contains("at least 16")
        );
        // The log goes to no other host unless peers prove they hold the
        // secret: not from a bootstrap either.
        for other in ["10.1.2.3:17380", "db2.example:17380"] {
            let e = msg(set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("initial_cluster", &format!("1=127.0.0.1:17379,2={other}")),
            ]));
            assert!(
                e.contains("cluster_secret") && e.contains(&format!("node 2 at {other}")),
                "{e}"
            );
        }
        assert!(
            set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("initial_cluster", "1=127.0.0.1:17379,2=localhost:17380"),
            ])
            .is_ok()
        );
        assert!(msg(set(&[("node_id", "0")])).contains("node_id"));
        // Addresses clients or peers could not use, or that collide.
        let wildcard = msg(set(&[
            ("listen", "0.0.0.0:7379"),
            ("peer_listen", "127.0.0.1:17379"),
        ]));
        assert!(
            wildcard.contains("advertise") && wildcard.contains("wildcard"),
            "{wildcard}"
        );
        assert!(
            msg(set(&[
                ("listen", "0.0.0.0:7379"),
                ("advertise", "0.0.0.0:7379"),
                ("peer_listen", "127.0.0.1:17379"),
            ]))
            .contains("wildcard")
        );
        assert!(
            set(&[
                ("listen", "0.0.0.0:7379"),
                ("advertise", "127.0.0.1:7379"),
                ("peer_listen", "127.0.0.1:17379"),
            ])
            .is_ok()
        );
        assert!(
            msg(set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("peer_advertise", "0.0.0.0:17379"),
            ]))
            .contains("peer_advertise")
        );
        assert!(
            msg(set(&[
                ("listen", "127.0.0.1:7379"),
                ("peer_listen", "0.0.0.0:7379"),
                ("peer_advertise", "127.0.0.1:7379"),
            ]))
            .contains("overlaps listen")
        );
        // Different families, or ports the system picks: no overlap.
        assert!(
            set(&[
                ("listen", "[::1]:7379"),
                ("peer_listen", "0.0.0.0:7379"),
                ("peer_advertise", "10.1.2.3:7379"),
                ("cluster_secret", "0123456789abcdef"),
            ])
            .is_ok()
        );
        assert!(
            set(&[
                ("listen", "127.0.0.1:0"),
                ("advertise", "127.0.0.1:7379"),
                ("peer_listen", "127.0.0.1:0"),
                ("peer_advertise", "127.0.0.1:17379"),
            ])
            .is_ok()
        );
        assert!(
            msg(set(&[
                ("peer_listen", "127.0.0.1:17379"),
                ("initial_cluster", "1=127.0.0.1:17379,2=127.0.0.1:17379")
            ]))
            .contains("both listed at")
        );
        let ok = set(&[
            ("peer_listen", "10.1.2.3:17379"),
            ("cluster_secret", "0123456789abcdef"),
            ("advertise", "10.1.2.3:7379"),
            ("node_id", "4"),
        ])
        .unwrap();
        assert_eq!(ok.raft.cluster.client_advertise, "10.1.2.3:7379");
        assert_eq!(ok.raft.cluster.peer_advertise, "10.1.2.3:17379");
        // The secret is never shown by CONFIG GET.
        let mut raw = RawConfig::default();
        raw.set("cluster_secret", "0123456789abcdef").unwrap();
        assert!(
            raw.entries()
                .iter()
                .any(|(k, v)| *k == "cluster_secret" && v == "(set)")
        );
    }
}
