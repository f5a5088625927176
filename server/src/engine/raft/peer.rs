//! The peer transport: Raft traffic between idemd nodes over our own framed
//! TCP (length-delimited frames of postcard).
//!
//! # Connection
//!
//! ```text
//! server -> client  Challenge { protocol, nonce_s }
//! client -> server  Hello { protocol, cluster, from, to, client_addr, nonce_c, mac }
//! server -> client  Welcome { cluster, node, client_addr, incarnation, mac,
//!                             election_timeout_ms } | Refused(reason) | Removed(reason)
//! then, one at a time: client -> server Request, server -> client Response
//! ```
//!
//! - Every connection names the cluster id (generated at bootstrap, kept in
//!   the data directory) and both node ids: a node reached at the wrong
//!   address, or one of another cluster, is refused and the refusal logged.
//!   A node that has not joined a cluster yet (no id) takes the id of the
//!   first member that sends it Raft traffic, and keeps it.
//! - With `cluster_secret` set, both sides prove they hold it: the MACs are
//!   HMAC-SHA256 over both nonces and both node ids, so a recorded
//!   handshake cannot be replayed. Without it the MACs are zeros (allowed
//!   only on loopback peer addresses, which the configuration checks).
//! - The Welcome says the server's `election_timeout_ms` (a node of an
//!   earlier release says nothing): a leader serves reads on a majority's
//!   answers for four fifths of the smallest value among the voters that
//!   gave one (its own if none is smaller), since a follower keeps its
//!   vote for the leader it heard from for its own value only. The value
//!   is not covered by the MACs (earlier releases check those without
//!   it): like the frames after the handshake, it is as safe as the
//!   network between the peers (TLS: `tls_cluster`).
//! - A client holds one connection per target and reuses it; a failed or
//!   timed-out call drops it (the next call reconnects). Frames are capped
//!   ([`MAX_FRAME`], and [`MAX_HANDSHAKE_FRAME`] before the handshake), and
//!   so are the frames being received over all connections together
//!   (`max_peer_receive_bytes`: see [`ReceiveBudget`]). A
//!   node serves at most `max_peer_connections` peer connections (default
//!   [`MAX_PEER_CONNECTIONS`]), and of those at most
//!   `max_peer_handshakes_per_source` (default
//!   [`MAX_PEER_HANDSHAKES_PER_SOURCE`]) from one source address before
//!   they complete the handshake, so one host that opens connections and
//!   never completes them cannot take the places the members need; a TLS
//!   handshake takes its place first. Refusals are logged at most every
//!   10 s, with their count.
//! - Snapshots travel in chunks (openraft's `InstallSnapshotRequest`, at
//!   most `snapshot_max_chunk_size` each), one request per chunk, so a
//!   large snapshot neither fills a buffer nor holds up the leader.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, SnapshotMismatch,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft, SnapshotSegmentId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use super::types::{NodeId, TypeConfig, decode_sharing, encoded_size_hint};
use crate::metrics::LogEvery;

/// The peer protocol version.
pub const PEER_PROTOCOL: u32 = 2;
/// The largest frame after the handshake (an AppendEntries of
/// `max_payload_entries` entries, or a snapshot chunk).
pub const MAX_FRAME: usize = 512 << 20;
/// The largest frame before the handshake is done.
pub const MAX_HANDSHAKE_FRAME: usize = 4096;
/// Peer connections served at once, at most (`max_peer_connections`).
pub const MAX_PEER_CONNECTIONS: usize = 256;
/// Peer connections from one source address that have not completed the
/// handshake, at most (`max_peer_handshakes_per_source`). A member opens a
/// few at a time (its pool keeps four per peer).
pub const MAX_PEER_HANDSHAKES_PER_SOURCE: usize = 32;
/// Terms at or above this are refused, in requests and in answers. A peer
/// that sent a term near `u64::MAX` left the next election no term to
/// take: openraft panicked there, on every node, and again at every
/// restart, since the term is saved. Below it there is room for 2^32 more
/// elections (at ten a second, thirteen years) whatever term was reached,
/// so a term a peer pushes up to it can still not stop elections; no
/// cluster gets near it on its own.
pub const MAX_TERM: u64 = u64::MAX - (1 << 32);

/// What this node knows of a peer's answers to its calls.
#[derive(Debug, Default)]
struct Reach {
    /// It answered the last call.
    ok: bool,
    /// When it last answered one.
    last_ok: Option<std::time::Instant>,
    /// "peer unreachable" was logged, and not "reachable again" since.
    logged_down: bool,
}

/// How long a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// A peer connection with no request for this long is closed (a peer that
/// crashed or was cut off does not hold a connection slot for ever).
const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per peer for reuse.
const POOL_PER_PEER: usize = 4;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A cluster id: 16 random bytes made at bootstrap.
pub type ClusterId = [u8; 16];

/// A byte stream to or from a peer: a TCP connection, or any other
/// transport (a simulated network).
pub trait PeerStream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> PeerStream for T {}

/// Dials over TLS (`tls_cluster`): the peer's certificate must be signed
/// by the CA and name the host of its peer address; this node presents its
/// own.
#[derive(Debug, Clone)]
pub struct TlsDialer(pub Arc<crate::tls::Tls>);

impl Dialer for TlsDialer {
    fn dial(&self, addr: &str) -> Dialing {
        let addr = addr.to_owned();
        let connector = self.0.peer_connector();
        Box::pin(async move {
            let connector = connector.ok_or_else(|| std::io::Error::other("tls_cluster is off"))?;
            let host = match addr.parse::<SocketAddr>() {
                Ok(a) => rustls_pki_types::ServerName::IpAddress(a.ip().into()),
                Err(_) => {
                    let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                    rustls_pki_types::ServerName::try_from(host.to_owned())
                        .map_err(|e| std::io::Error::other(format!("peer address {addr}: {e}")))?
                }
            };
            let stream = TcpStream::connect(&addr).await?;
            let _ = stream.set_nodelay(true);
            let tls = connector.connect(host, stream).await?;
            Ok(Box::new(tls) as Box<dyn PeerStream>)
        })
    }
}

/// How long a peer may take to finish its TLS handshake.
const PEER_TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// A connection being made to a peer.
pub type Dialing = Pin<Box<dyn Future<Output = std::io::Result<Box<dyn PeerStream>>> + Send>>;

/// How this node opens connections to peer addresses.
pub trait Dialer: Send + Sync + 'static {
    /// Connects to `addr` (a peer address as the membership records it).
    fn dial(&self, addr: &str) -> Dialing;
}

/// Dials over TCP (with `TCP_NODELAY`): the dialer idemd uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpDialer;

impl Dialer for TcpDialer {
    fn dial(&self, addr: &str) -> Dialing {
        let addr = addr.to_owned();
        Box::pin(async move {
            let stream = TcpStream::connect(&addr).await?;
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream) as Box<dyn PeerStream>)
        })
    }
}

/// Peer connections accepted elsewhere (by a simulated network's listener),
/// with the address each came from.
pub type Incoming = mpsc::Receiver<(Box<dyn PeerStream>, SocketAddr)>;

/// The cluster id in hex.
pub fn cluster_hex(id: &ClusterId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_cluster_hex(s: &str) -> Option<ClusterId> {
    let s = s.trim();
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Sixteen random bytes.
pub fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // No OS randomness: still unique enough for a nonce or an id
        // (time and pid), though not secret.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b[..16].copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    }
    b
}

#[derive(Debug, Serialize, Deserialize)]
struct Challenge {
    protocol: u32,
    nonce: [u8; 16],
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    protocol: u32,
    cluster: Option<ClusterId>,
    from: NodeId,
    to: NodeId,
    client_addr: String,
    /// The incarnation of the sender's data directory.
    incarnation: u64,
    nonce: [u8; 16],
    mac: [u8; 32],
}

#[derive(Debug, Serialize, Deserialize)]
enum Welcome {
    Ok {
        cluster: Option<ClusterId>,
        node: NodeId,
        client_addr: String,
        incarnation: u64,
        mac: [u8; 32],
        /// The server's `election_timeout_ms` (0: not known yet). Last, so
        /// that a node of an earlier release reads the rest (postcard
        /// leaves trailing bytes unread); one of those sends none
        /// ([`WelcomeBefore`]).
        election_timeout_ms: u64,
    },
    Refused(String),
    /// Refused: the connecting node was removed from the cluster (last, so
    /// that the variants before keep their encoding).
    Removed(String),
}

/// A [`Welcome`] as nodes of earlier releases send it: without the
/// election timeout.
#[derive(Debug, Serialize, Deserialize)]
enum WelcomeBefore {
    Ok {
        cluster: Option<ClusterId>,
        node: NodeId,
        client_addr: String,
        incarnation: u64,
        mac: [u8; 32],
    },
    Refused(String),
    Removed(String),
}

impl From<WelcomeBefore> for Welcome {
    fn from(w: WelcomeBefore) -> Welcome {
        match w {
            WelcomeBefore::Ok {
                cluster,
                node,
                client_addr,
                incarnation,
                mac,
            } => Welcome::Ok {
                cluster,
                node,
                client_addr,
                incarnation,
                mac,
                election_timeout_ms: 0,
            },
            WelcomeBefore::Refused(why) => Welcome::Refused(why),
            WelcomeBefore::Removed(why) => Welcome::Removed(why),
        }
    }
}

impl Welcome {
    /// Reads a Welcome of this release or of an earlier one.
    fn decode(frame: &[u8]) -> postcard::Result<Welcome> {
        postcard::from_bytes::<Welcome>(frame)
            .or_else(|_| postcard::from_bytes::<WelcomeBefore>(frame).map(Welcome::from))
    }
}

/// What one node asks another.
#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    Probe,
    /// The asker, a member, keeps this node out, and why: its data
    /// directory is not the one recorded for its id (its data was lost or
    /// replaced). Sent once, in place of any other request; the
    /// connection ends.
    KeptOut(String),
    /// A follower asks its leader for the index its reads must have
    /// applied to be linearizable ([`Peers::read_index`]). Last, so that
    /// the variants before keep their encoding (a node of an earlier
    /// release cannot read it, and closes the connection: the follower
    /// then redirects the read).
    ReadIndex,
}

impl Request {
    /// About how many bytes it takes encoded: a buffer of this capacity
    /// is seldom grown (entries can make a request megabytes long).
    fn size_hint(&self) -> usize {
        match self {
            Request::Append(r) => r.entries.iter().map(encoded_size_hint).sum::<usize>() + 256,
            Request::Snapshot(r) => r.data.len() + 512,
            Request::Vote(_) | Request::Probe | Request::ReadIndex => 256,
            Request::KeptOut(why) => why.len() + 16,
        }
    }
}

type SnapshotResult =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

#[derive(Debug, Serialize, Deserialize)]
enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(SnapshotResult),
    Probe(ProbeInfo),
    Failed(String),
    /// The answer to [`Request::ReadIndex`]: the index, or why this node
    /// cannot give one (it does not lead, or its lease has lapsed).
    ReadIndex(Result<u64, String>),
}

/// What a node says of itself when probed (before a bootstrap, and by
/// `CLUSTER` commands).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeInfo {
    /// Whether it holds a membership (is part of a cluster).
    pub initialized: bool,
    /// Its cluster id, if it has joined one.
    pub cluster: Option<ClusterId>,
    /// Voters of its membership.
    pub voters: Vec<NodeId>,
    /// Learners of its membership.
    pub learners: Vec<NodeId>,
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// If it leads: the log index replicated to the node that asks (None if
    /// it never replicated to it).
    pub your_match: Option<u64>,
    /// Its client address.
    pub client_addr: String,
    /// Its last log index.
    pub last_log_index: u64,
}

/// What one side of a handshake signs: both nonces (the other side's
/// first, so a recorded handshake cannot be replayed), who sends to whom,
/// and what the sender says of itself.
struct Signed<'a> {
    /// `C` for the connecting side's Hello, `S` for the server's Welcome.
    side: &'a [u8],
    nonces: [&'a [u8; 16]; 2],
    sender: NodeId,
    receiver: NodeId,
    cluster: Option<ClusterId>,
    client_addr: &'a str,
    incarnation: u64,
}

/// The limits on the peer connections a node serves.
#[derive(Debug, Clone, Copy)]
pub struct PeerLimits {
    /// Connections served at once, at most.
    pub max_connections: usize,
    /// Connections from one source address in their handshake, at most.
    pub max_handshakes_per_source: usize,
    /// Bytes of frames being received at once, over every connection, at
    /// most (see [`ReceiveBudget`]).
    pub max_receive_bytes: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            max_connections: MAX_PEER_CONNECTIONS,
            max_handshakes_per_source: MAX_PEER_HANDSHAKES_PER_SOURCE,
            max_receive_bytes: MAX_FRAME,
        }
    }
}

/// Frames at most this long are received without counting them against
/// the [`ReceiveBudget`] (requests and answers other than entries and
/// snapshot chunks are this small).
const UNCOUNTED_FRAME: usize = 64 << 10;

/// The least room a frame's buffer is given ahead of its bytes (it then
/// grows as they arrive: see [`PeerCodec`]'s decoding).
const RECEIVE_STEP: usize = 64 << 10;

/// The bytes of peer frames being received at once, over every peer
/// connection of a node, and their bound (`max_peer_receive_bytes`).
///
/// A frame's header announces its length, and the connection buffers the
/// frame until it is whole: a peer announcing large frames and sending
/// them slowly, on many connections, held that much memory for each
/// (hundreds of MB per connection, without a bound). What is buffered of a
/// frame longer than [`UNCOUNTED_FRAME`] counts until it is whole (or its
/// connection ends): the room allocated for it, grown as its bytes come
/// (not to the announced length at once: a 4-byte header announcing 512
/// MiB took the whole bound for a minute; and counted as allocated, not
/// as received: a buffer grown by doubling held twice what was counted);
/// a frame whose room would pass the bound ends its connection instead,
/// logged at most every 10 s.
#[derive(Debug)]
pub struct ReceiveBudget {
    limit: usize,
    used: std::sync::atomic::AtomicUsize,
    refusals: LogEvery,
}

impl ReceiveBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        ReceiveBudget {
            limit,
            used: std::sync::atomic::AtomicUsize::new(0),
            refusals: LogEvery::new(),
        }
    }

    /// The bytes counted now.
    pub fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `n` more bytes of a frame of `frame` bytes.
    fn take(&self, n: usize, frame: usize) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        let taken = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&u| u <= self.limit)
            });
        match taken {
            Ok(_) => Ok(()),
            Err(used) => {
                let why = format!(
                    "a peer frame of {frame} bytes would pass max_peer_receive_bytes ({}; {used} being received): connection closed",
                    self.limit
                );
                if let Some(count) = self.refusals.due() {
                    warn!(refused = count, "{why} (logged at most every 10 s)");
                }
                Err(std::io::Error::other(why))
            }
        }
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Length-delimited frames (a 4-byte big-endian length, then the frame),
/// the long ones counted against a node's [`ReceiveBudget`] while they are
/// received.
#[derive(Debug)]
pub struct PeerCodec {
    inner: LengthDelimitedCodec,
    budget: Option<Arc<ReceiveBudget>>,
    /// The length of the frame whose header was read, until it is whole.
    want: Option<usize>,
    /// A long frame's bytes so far, in a buffer of its own.
    body: Option<bytes::BytesMut>,
    /// What that buffer counts against the budget: its room.
    held: usize,
}

impl PeerCodec {
    fn new(max: usize, budget: Option<Arc<ReceiveBudget>>) -> Self {
        PeerCodec {
            inner: LengthDelimitedCodec::builder()
                .max_frame_length(max)
                .new_codec(),
            budget,
            want: None,
            body: None,
            held: 0,
        }
    }

    fn set_max_frame_length(&mut self, max: usize) {
        self.inner.set_max_frame_length(max);
    }

    fn release(&mut self) {
        if let Some(b) = &self.budget {
            b.give_back(std::mem::take(&mut self.held));
        }
    }
}

impl Drop for PeerCodec {
    fn drop(&mut self) {
        self.release();
    }
}

impl tokio_util::codec::Decoder for PeerCodec {
    type Item = bytes::BytesMut;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut bytes::BytesMut) -> std::io::Result<Option<bytes::BytesMut>> {
        use bytes::Buf;
        let len = match self.want {
            Some(len) => len,
            None => {
                let Some(head) = src.get(..4) else {
                    return Ok(None);
                };
                let len = u32::from_be_bytes(head.try_into().expect("four bytes")) as usize;
                let max = self.inner.max_frame_length();
                if len > max {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a peer frame of {len} bytes is over the limit of {max}"),
                    ));
                }
                src.advance(4);
                self.want = Some(len);
                if len > UNCOUNTED_FRAME && self.budget.is_some() {
                    self.body = Some(bytes::BytesMut::new());
                }
                len
            }
        };
        let Some(body) = self.body.as_mut() else {
            // A short frame (or one not counted): gathered where it is read.
            if src.len() < len {
                src.reserve((len - src.len()).min(RECEIVE_STEP));
                return Ok(None);
            }
            self.want = None;
            return Ok(Some(src.split_to(len)));
        };
        // A long frame: moved out of the read buffer as it arrives, into a
        // buffer of its own whose room is grown here and counted against
        // the budget: what is counted is what is allocated for it. Grown
        // fourfold (up to the frame's length), so that the buffers it
        // outgrew, which the allocator may keep, come to a third of it at
        // most (doubling, a frame held twice what was counted: 1.05 GB for
        // 510 MiB sent).
        let take = src.len().min(len - body.len());
        if body.capacity() - body.len() < take {
            let need = body.len() + take;
            let room = need.max(body.capacity() * 4).max(RECEIVE_STEP).min(len);
            if let Some(b) = &self.budget {
                b.take(room - self.held, len)?;
            }
            self.held = room;
            let mut grown = bytes::BytesMut::with_capacity(room);
            grown.extend_from_slice(body);
            *body = grown;
        }
        body.extend_from_slice(&src[..take]);
        src.advance(take);
        if body.len() < len {
            // Room to read the next bytes into (the emptied read buffer
            // went back to its first few KiB: each read then took 8 KiB).
            src.reserve((len - body.len()).min(RECEIVE_STEP));
            return Ok(None);
        }
        let frame = self.body.take();
        self.want = None;
        self.release();
        Ok(frame)
    }
}

impl tokio_util::codec::Encoder<Bytes> for PeerCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Bytes, dst: &mut bytes::BytesMut) -> std::io::Result<()> {
        self.inner.encode(item, dst)
    }
}

/// How a leader answers a follower's [`Request::ReadIndex`].
pub type ReadIndexFn =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

/// This node's identity on the peer network, shared by the server, the
/// clients and the cluster code.
pub struct Peers {
    node_id: NodeId,
    /// A random number made with the data directory: a node that lost its
    /// data comes back with another one.
    incarnation: u64,
    /// Incarnations other nodes gave in handshakes.
    learned: Mutex<HashMap<NodeId, u64>>,
    client_addr: String,
    secret: Option<Vec<u8>>,
    data_dir: PathBuf,
    cluster: Mutex<Option<ClusterId>>,
    /// Client addresses other nodes gave in handshakes (fresher than the
    /// ones recorded in the membership).
    advertised: Mutex<HashMap<NodeId, String>>,
    /// What this node answers a follower's [`Request::ReadIndex`] with
    /// (set once the engine has its role).
    read_index: OnceLock<ReadIndexFn>,
    /// The `election_timeout_ms` other nodes gave in handshakes, and how
    /// many times one of them changed (see [`Peers::election_timeouts`]).
    election_timeouts: Mutex<HashMap<NodeId, u64>>,
    election_timeouts_changed: std::sync::atomic::AtomicU64,
    raft: OnceLock<Raft<TypeConfig>>,
    slots: Arc<Semaphore>,
    /// Whether each peer answered this node's last call to it (changes
    /// are logged once: openraft's own per-call errors are too many to
    /// log), and when it last answered one.
    reachable: Mutex<HashMap<NodeId, Reach>>,
    /// Idle connections by peer and address, for the clients openraft
    /// makes per election and per leadership check.
    pool: Mutex<HashMap<PoolKey, Vec<Conn>>>,
    /// How connections to peers are opened.
    dialer: Arc<dyn Dialer>,
    /// Calls to peers that got no answer by their deadline.
    timeouts: std::sync::atomic::AtomicU64,
    /// AppendEntries sent to peers, and those of them with no entries
    /// (heartbeats and news of a commit).
    appends: [std::sync::atomic::AtomicU64; 2],
    /// AppendEntries with entries sent to a peer while another sent to it
    /// was not answered yet (pipelined).
    appends_pipelined: std::sync::atomic::AtomicU64,
    /// Connections in their handshake, oldest first.
    handshaking: Mutex<Handshakes>,
    /// `max_peer_handshakes_per_source`.
    max_handshakes_per_source: usize,
    /// Connections refused, logged at most every [`LogEvery::INTERVAL`].
    refusals: LogEvery,
    /// The same for the refusals of this node by others.
    refused_by: LogEvery,
    /// The same for peers this node refused once they answered.
    refused_answers: LogEvery,
    /// A member refused this node as removed from the cluster, and none
    /// has welcomed it since (only what clients are told depends on it).
    removed: std::sync::atomic::AtomicBool,
    /// This node's own log says it was removed from the cluster: it keeps
    /// no connection to its former peers (see [`Peers::leave`]).
    left: std::sync::atomic::AtomicBool,
    /// A member said it keeps this node out: its data directory is not
    /// the one recorded for its id.
    kept_out: std::sync::atomic::AtomicBool,
    /// Those refusals, logged at most every [`LogEvery::INTERVAL`].
    kept_out_logged: LogEvery,
    /// The snapshot being received, and how far (see
    /// [`Peers::check_snapshot_chunk`]).
    snapshot_in: Mutex<Option<(String, u64)>>,
    /// What came from the leader, for campaigning as soon as it is gone.
    watch: Arc<super::quick_elect::LeaderWatch>,
    /// The bytes of peer frames being received, over every connection.
    receiving: Arc<ReceiveBudget>,
}

/// Tells the leader watch that a peer's connection closed, however its
/// serving ended.
struct ConnClosed<'a> {
    peers: &'a Arc<Peers>,
    from: NodeId,
}

impl Drop for ConnClosed<'_> {
    fn drop(&mut self) {
        if let Some(raft) = self.peers.raft.get() {
            self.peers.watch.connection_closed(raft, self.from);
        }
    }
}

/// A peer connection let in: its place among the connections served and,
/// until its handshake completes, among the connections in their
/// handshake.
struct Admitted {
    slot: OwnedSemaphorePermit,
    handshake: Handshaking,
}

/// The connections in their handshake, oldest first. When a source has
/// `max_peer_handshakes_per_source` of them, or every place among the
/// connections served is taken, a new connection does not wait for one to
/// finish or time out: the oldest (from that source, or of all) is closed
/// for it. A member completes its handshake within milliseconds, so a host
/// that opens connections and never completes them (from the members' own
/// address, or from many) cannot keep the members out: it only closes its
/// own connections faster.
#[derive(Debug, Default)]
struct Handshakes {
    next: u64,
    queue: std::collections::VecDeque<Pending>,
}

/// A connection in its handshake.
#[derive(Debug)]
struct Pending {
    id: u64,
    addr: SocketAddr,
    /// Told when the connection must give up its place.
    evict: Arc<tokio::sync::Notify>,
}

impl Handshakes {
    /// Closes the oldest connection in its handshake (from `ip` only, if
    /// given): its address, if there was one.
    fn evict_oldest(&mut self, ip: Option<IpAddr>) -> Option<SocketAddr> {
        let at = self
            .queue
            .iter()
            .position(|p| ip.is_none_or(|ip| p.addr.ip() == ip))?;
        let p = self.queue.remove(at)?;
        p.evict.notify_one();
        Some(p.addr)
    }
}

/// A place among the connections in their handshake, given back when
/// dropped (the handshake done, or the connection gone).
struct Handshaking {
    peers: Arc<Peers>,
    id: u64,
    evict: Arc<tokio::sync::Notify>,
}

impl Handshaking {
    /// Resolves once this connection was closed to make room for a newer
    /// one.
    async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut all = self.peers.handshaking.lock();
        if let Some(at) = all.queue.iter().position(|p| p.id == self.id) {
            all.queue.remove(at);
        }
    }
}

/// How long a connection that closed another's handshake to get a place
/// among the connections served waits for that place to be given back.
const EVICTED_PLACE_WAIT: Duration = Duration::from_secs(1);

/// Lets a connection from `addr` in: a place among the connections served
/// (closing the oldest connection in its handshake if none is free) and
/// one among the connections in their handshake (closing the oldest from
/// the same source if it has `max_peer_handshakes_per_source`). `None`
/// when every place is held by a connection past its handshake.
async fn admit(peers: &Arc<Peers>, addr: SocketAddr) -> Option<Admitted> {
    let slot = match Arc::clone(&peers.slots).try_acquire_owned() {
        Ok(slot) => slot,
        Err(_) => {
            let Some(old) = peers.handshaking.lock().evict_oldest(None) else {
                peers.refused(
                    addr,
                    "too many peer connections past their handshake (max_peer_connections)",
                );
                return None;
            };
            peers.refused(
                old,
                "closed in its handshake to make room for a newer connection (max_peer_connections)",
            );
            match tokio::time::timeout(EVICTED_PLACE_WAIT, Arc::clone(&peers.slots).acquire_owned())
                .await
            {
                Ok(Ok(slot)) => slot,
                _ => {
                    peers.refused(addr, "too many peer connections (max_peer_connections)");
                    return None;
                }
            }
        }
    };
    let ip = addr.ip();
    let evict = Arc::new(tokio::sync::Notify::new());
    let (id, evicted) = {
        let mut all = peers.handshaking.lock();
        let from_ip = all.queue.iter().filter(|p| p.addr.ip() == ip).count();
        let evicted = if from_ip >= peers.max_handshakes_per_source {
            all.evict_oldest(Some(ip))
        } else {
            None
        };
        let id = all.next;
        all.next += 1;
        all.queue.push_back(Pending {
            id,
            addr,
            evict: Arc::clone(&evict),
        });
        (id, evicted)
    };
    if let Some(old) = evicted {
        peers.refused(
            old,
            "closed in its handshake to make room for a newer connection from the same address (max_peer_handshakes_per_source)",
        );
    }
    Some(Admitted {
        slot,
        handshake: Handshaking {
            peers: Arc::clone(peers),
            id,
            evict,
        },
    })
}

const CLUSTER_FILE: &str = "cluster-id";
const INCARNATION_FILE: &str = "incarnation";
const NODE_ID_FILE: &str = "node-id";

/// Checks that `dir` is node `id`'s: its log, vote and membership are
/// that node's, and started under another id it served, kept out by its
/// peers with hints that pointed elsewhere. `members` are the ids of the
/// membership the directory holds, with the data directory (incarnation)
/// recorded for each. The membership says whose the directory is once it
/// recorded this directory's incarnation; the `node-id` file does for a
/// directory whose membership has not (a single node's), and is written
/// once the membership lists `id` (not before: a fresh directory started
/// once under a mistyped id would keep the typo). A file that disagrees
/// with the membership's record is put right (an earlier release wrote
/// whatever id a directory was first started under). `alone`: the node
/// has no peer address, so it serves only as a member of the membership
/// the directory holds (nothing can add it to one): a directory whose
/// membership does not list `id` is refused too (one written before there
/// was a `node-id` file, started under another id, never served).
pub(super) fn check_node_id(
    dir: &std::path::Path,
    id: NodeId,
    members: &[(NodeId, Option<u64>)],
    alone: bool,
) -> Result<(), String> {
    let mine = read_incarnation(dir)?;
    let path = dir.join(NODE_ID_FILE);
    if let Some(owner) = members
        .iter()
        .find(|(_, inc)| inc.is_some() && *inc == mine)
        .map(|(m, _)| *m)
    {
        if owner != id {
            return Err(format!(
                "this data directory is node {owner}'s (its cluster recorded it under that id), and node_id (--node-id) is {id}: start node {owner} on it, or give node {id} a data directory of its own"
            ));
        }
        // The membership's record decides.
        let recorded = std::fs::read_to_string(&path).ok();
        if recorded.as_deref().map(str::trim) != Some(id.to_string().as_str()) {
            if let Some(other) = recorded {
                tracing::warn!(
                    file = %path.display(),
                    said = other.trim(),
                    node_id = id,
                    "the node-id file disagreed with the cluster's record of this data directory: rewritten"
                );
            }
            super::wal::replace_file(dir, NODE_ID_FILE, format!("{id}\n").as_bytes())
                .map_err(|e| e.to_string())?;
        }
        return Ok(());
    }
    // (Not with a peer address: a learner added to a cluster that grew
    // from a single node holds that node's membership alone, with no
    // directory recorded, until the entry that records it arrives.)
    if alone && !members.is_empty() && !members.iter().any(|(m, _)| *m == id) {
        let ids: Vec<String> = members.iter().map(|(m, _)| m.to_string()).collect();
        return Err(if let [only] = ids.as_slice() {
            format!(
                "this data directory is node {only}'s (the only member it records), and node_id (--node-id) is {id}: start node {only} on it, or give node {id} a data directory of its own"
            )
        } else {
            format!(
                "this data directory is a cluster member's (its members are {}), and node_id (--node-id) is {id}, which is none of them: start it under its own id, with peer_listen, or give node {id} a data directory of its own",
                ids.join(", ")
            )
        });
    }
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let recorded: NodeId = s
                .trim()
                .parse()
                .map_err(|_| format!("{}: not a node id", path.display()))?;
            if recorded != id {
                return Err(format!(
                    "this data directory is node {recorded}'s, and node_id (--node-id) is {id}: start node {recorded} on it, or give node {id} a data directory of its own"
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if members.iter().any(|(m, _)| *m == id) {
                super::wal::replace_file(dir, NODE_ID_FILE, format!("{id}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The incarnation recorded in `dir`, made (and synced) if there is none.
fn incarnation(dir: &std::path::Path) -> Result<u64, String> {
    if let Some(inc) = read_incarnation(dir)? {
        return Ok(inc);
    }
    let r = random16();
    let inc = u64::from_le_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]).max(1);
    super::wal::replace_file(dir, INCARNATION_FILE, format!("{inc:016x}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(inc)
}

/// The incarnation recorded in `dir`, if there is one.
fn read_incarnation(dir: &std::path::Path) -> Result<Option<u64>, String> {
    let path = dir.join(INCARNATION_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => u64::from_str_radix(s.trim(), 16)
            .map(Some)
            .map_err(|_| format!("{}: not an incarnation (16 hex digits)", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl Peers {
    /// The identity of node `node_id`, its cluster id read from `data_dir`
    /// if it has one.
    pub fn new(
        node_id: NodeId,
        client_addr: String,
        secret: Option<Vec<u8>>,
        data_dir: PathBuf,
        dialer: Arc<dyn Dialer>,
        limits: PeerLimits,
    ) -> Result<Arc<Peers>, String> {
        let path = data_dir.join(CLUSTER_FILE);
        let cluster =
            match std::fs::read_to_string(&path) {
                Ok(s) => Some(parse_cluster_hex(&s).ok_or_else(|| {
                    format!("{}: not a cluster id (32 hex digits)", path.display())
                })?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            };
        let incarnation = incarnation(&data_dir)?;
        Ok(Arc::new(Peers {
            node_id,
            incarnation,
            learned: Mutex::new(HashMap::new()),
            client_addr,
            secret,
            data_dir,
            cluster: Mutex::new(cluster),
            advertised: Mutex::new(HashMap::new()),
            read_index: OnceLock::new(),
            election_timeouts: Mutex::new(HashMap::new()),
            election_timeouts_changed: std::sync::atomic::AtomicU64::new(0),
            raft: OnceLock::new(),
            slots: Arc::new(Semaphore::new(
                limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            reachable: Mutex::new(HashMap::new()),
            pool: Mutex::new(HashMap::new()),
            dialer,
            timeouts: std::sync::atomic::AtomicU64::new(0),
            appends: Default::default(),
            appends_pipelined: Default::default(),
            handshaking: Mutex::new(Handshakes::default()),
            max_handshakes_per_source: limits.max_handshakes_per_source.max(1),
            refusals: LogEvery::new(),
            refused_by: LogEvery::new(),
            refused_answers: LogEvery::new(),
            removed: std::sync::atomic::AtomicBool::new(false),
            left: std::sync::atomic::AtomicBool::new(false),
            kept_out: std::sync::atomic::AtomicBool::new(false),
            kept_out_logged: LogEvery::new(),
            snapshot_in: Mutex::new(None),
            watch: Arc::default(),
            receiving: Arc::new(ReceiveBudget::new(limits.max_receive_bytes)),
        }))
    }

    /// Logs a refused connection, at most every [`LogEvery::INTERVAL`]
    /// (with the count of those not logged since).
    fn refused(&self, addr: SocketAddr, why: &str) {
        if let Some(n) = self.refusals.due() {
            warn!(%addr, refused = n, "refusing a peer connection: {why} (logged at most every 10 s)");
        }
    }

    /// This node's own log says it was removed from the cluster: it closes
    /// the connections it keeps to its former peers, and keeps none from
    /// now on. A leader that removes itself leaves its followers without
    /// a leader; with its connections closed they campaign as soon as
    /// their lease on it runs out, as when a leader's process dies
    /// ([`LeaderWatch`](super::quick_elect::LeaderWatch)), instead of
    /// after a random election timeout more (~0.9 s without a leader).
    pub fn leave(&self) {
        if !self.left.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let closed: usize = self.pool.lock().drain().map(|(_, v)| v.len()).sum();
            info!(
                closed,
                "this node was removed from the cluster: its connections to its former peers are closed"
            );
        }
    }

    /// Member `by` keeps this node out (`why`): noted (and logged, at most
    /// every 10 s) if this node is not a member itself, so that its
    /// clients are told why it gets nothing. A member ignores it.
    fn kept_out_by(&self, by: NodeId, why: &str) {
        let member = self.raft.get().is_some_and(|r| {
            r.metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&self.node_id)
                .is_some()
        });
        if member {
            return;
        }
        self.kept_out
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(count) = self.kept_out_logged.due() {
            warn!(
                by,
                count, "a member keeps this node out: {why} (logged at most every 10 s)"
            );
        }
    }

    /// Whether a member said it keeps this node out (see
    /// [`Request::KeptOut`]).
    pub fn kept_out(&self) -> bool {
        self.kept_out.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a member refused this node as removed from the cluster (and
    /// none has welcomed it since).
    pub fn told_removed(&self) -> bool {
        self.removed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Logs a refusal of this node by `target`, at most every
    /// [`LogEvery::INTERVAL`] (a removed node's elections are refused
    /// several times a second).
    fn refused_by(&self, target: NodeId, addr: &str, why: &str) {
        if let Some(n) = self.refused_by.due() {
            warn!(target, %addr, refused = n, reason = %why, "a peer refused this node (logged at most every 10 s)");
        }
    }

    /// Logs this node's refusal of a peer that answered its call, at most
    /// every [`LogEvery::INTERVAL`] (a member kept out is called several
    /// times a second).
    fn refused_answer(&self, target: NodeId, addr: &str, why: &str) {
        if let Some(n) = self.refused_answers.due() {
            warn!(target, %addr, refused = n, reason = %why, "refused a peer (logged at most every 10 s)");
        }
    }

    /// Campaigns this node started because the connection from the leader
    /// it followed closed and nothing came from it for its lease, since
    /// start.
    pub fn quick_campaigns(&self) -> u64 {
        self.watch.campaigns()
    }

    /// Calls to peers (AppendEntries, votes, snapshots) that got no answer
    /// by their deadline, since start.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// AppendEntries sent to peers since start, and how many of them
    /// carried no entries.
    pub fn appends(&self) -> (u64, u64) {
        let [all, empty] = &self.appends;
        (
            all.load(std::sync::atomic::Ordering::Relaxed),
            empty.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// AppendEntries with entries sent to a peer since start while another
    /// sent to it was not answered yet.
    pub fn appends_pipelined(&self) -> u64 {
        self.appends_pipelined
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// This node's client address.
    pub fn client_addr(&self) -> &str {
        &self.client_addr
    }

    /// The cluster id, once joined or bootstrapped.
    pub fn cluster(&self) -> Option<ClusterId> {
        *self.cluster.lock()
    }

    /// Records the cluster id in the data directory (synced) before it is
    /// used.
    pub fn set_cluster(&self, id: ClusterId) -> Result<(), String> {
        let mut c = self.cluster.lock();
        if *c == Some(id) {
            return Ok(());
        }
        super::wal::replace_file(
            &self.data_dir,
            CLUSTER_FILE,
            format!("{}\n", cluster_hex(&id)).as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        *c = Some(id);
        Ok(())
    }

    /// Lets a snapshot chunk through if it starts a snapshot (offset 0) or
    /// continues the one openraft took chunks of, at or before where it
    /// got to. openraft writes a chunk at its offset into the snapshot's
    /// buffer, so a chunk far past the end (a peer's bug) would grow the
    /// buffer to that offset: an allocation of up to 2^64 bytes. Refused,
    /// the sender is told to start over (as openraft tells it when a
    /// chunk belongs to no snapshot it is receiving).
    fn check_snapshot_chunk(&self, id: &str, offset: u64) -> Result<(), SnapshotMismatch> {
        if offset == 0 {
            return Ok(());
        }
        match &*self.snapshot_in.lock() {
            Some((current, upto)) if current == id && offset <= *upto => Ok(()),
            _ => Err(SnapshotMismatch {
                expect: SnapshotSegmentId {
                    id: id.to_owned(),
                    offset: 0,
                },
                got: SnapshotSegmentId {
                    id: id.to_owned(),
                    offset,
                },
            }),
        }
    }

    /// Notes a chunk openraft took.
    fn snapshot_chunk_taken(&self, id: &str, offset: u64, len: usize) {
        let end = offset.saturating_add(len as u64);
        let mut s = self.snapshot_in.lock();
        match &mut *s {
            Some((current, upto)) if offset > 0 && current == id => *upto = (*upto).max(end),
            _ => *s = Some((id.to_owned(), end)),
        }
    }

    /// The IP address of member `id`'s recorded peer address, if `id` is a
    /// member and its peer address is an IP one.
    fn member_peer_ip(&self, id: NodeId) -> Option<std::net::IpAddr> {
        let raft = self.raft.get()?;
        let m = raft.metrics().borrow().membership_config.clone();
        let node = m.membership().get_node(&id)?;
        let peer = super::cluster::MemberAddr::parse(&node.addr).peer;
        peer.parse::<SocketAddr>().ok().map(|a| a.ip())
    }

    /// The incarnation the membership records for `id`, if any.
    fn recorded_incarnation(&self, id: NodeId) -> Option<u64> {
        let raft = self.raft.get()?;
        let m = raft.metrics().borrow().membership_config.clone();
        m.membership()
            .get_node(&id)
            .and_then(|n| super::cluster::MemberAddr::parse(&n.addr).inc)
    }

    /// Checks the incarnation `id` answered with against the membership's
    /// record, and learns it: an error when the member lost its data.
    fn check_incarnation(&self, id: NodeId, inc: u64) -> Result<(), String> {
        if let Some(recorded) = self.recorded_incarnation(id)
            && recorded != inc
        {
            return Err(format!(
                "node {id} answers with a new data directory (incarnation {inc:016x}, recorded {recorded:016x}): its data was lost or replaced, and it is kept out. Remove it (CLUSTER REMOVE {id}) and add the machine under a new id"
            ));
        }
        Ok(())
    }

    /// Learns the incarnation of `id`: only from a node this one reached
    /// at the member's recorded peer address, once every check of the
    /// handshake passed (a refused or stray connection teaches nothing).
    fn learn_incarnation(&self, id: NodeId, inc: u64) {
        self.learned.lock().insert(id, inc);
    }

    /// Members whose incarnation is known here but not recorded in the
    /// membership yet (this node's own included).
    pub fn to_record(&self) -> Vec<(NodeId, u64)> {
        let Some(raft) = self.raft.get() else {
            return Vec::new();
        };
        let m = raft.metrics().borrow().membership_config.clone();
        let learned = self.learned.lock();
        m.membership()
            .nodes()
            .filter(|(_, n)| super::cluster::MemberAddr::parse(&n.addr).inc.is_none())
            .filter_map(|(id, _)| {
                if *id == self.node_id {
                    Some((*id, self.incarnation))
                } else {
                    learned.get(id).map(|inc| (*id, *inc))
                }
            })
            .collect()
    }

    /// The leader this node follows is recorded as removed: campaign once
    /// nothing comes from it for its lease (see
    /// [`LeaderWatch::leader_removed`](super::quick_elect::LeaderWatch::leader_removed)).
    pub fn leader_removed(&self, raft: &Raft<TypeConfig>, leader: NodeId) {
        self.watch.leader_removed(raft, leader);
    }

    /// How long ago member `id` last sent this node an AppendEntries
    /// (`None`: never, since this node started).
    pub fn heard_ago(&self, id: NodeId) -> Option<std::time::Duration> {
        self.watch.heard_ago(id)
    }

    /// Whether `id` answered this node's last call to it, and how long ago
    /// it last answered one (`None`: never called, or never answered).
    pub fn reach(&self, id: NodeId) -> Option<(bool, Option<std::time::Duration>)> {
        self.reachable
            .lock()
            .get(&id)
            .map(|r| (r.ok, r.last_ok.map(|t| t.elapsed())))
    }

    /// The client address node `id` gave when it last connected, if any.
    pub fn advertised(&self, id: NodeId) -> Option<String> {
        self.advertised.lock().get(&id).cloned()
    }

    /// Sets how this node answers a follower's [`Request::ReadIndex`]
    /// (once; later calls are ignored).
    pub fn set_read_index(&self, f: ReadIndexFn) {
        let _ = self.read_index.set(f);
    }

    /// The index a follower's read must have applied to be linearizable:
    /// every write this leader acknowledged is at or below it. Only a
    /// leader that serves and whose lease holds gives one (so no other
    /// leader can have acknowledged a write meanwhile).
    async fn read_index(&self) -> Result<u64, String> {
        match self.read_index.get() {
            Some(f) => f().await,
            None => Err("starting".into()),
        }
    }

    /// Records the `election_timeout_ms` node `id` gave in a handshake (0:
    /// none, from an earlier release or a node not started yet); warns
    /// when it differs from this node's by more than a tenth (once per
    /// value a node gives).
    fn learn_election_timeout(&self, id: NodeId, ms: u64) {
        if ms == 0 {
            // None given (a node of an earlier build: rolled back, say):
            // a value it gave before no longer holds.
            if self.election_timeouts.lock().remove(&id).is_some() {
                self.election_timeouts_changed
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            return;
        }
        // At most what a node's configuration takes (a value over it came
        // from no idemd); a smaller one is taken as it is, since it can
        // only shorten the lease.
        let ms = ms.min(*crate::config::ELECTION_TIMEOUT_MS.end());
        let before = self.election_timeouts.lock().insert(id, ms);
        if before == Some(ms) {
            return;
        }
        self.election_timeouts_changed
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let Some(own) = self.raft.get().map(|r| r.config().leader_lease) else {
            return;
        };
        if ms.abs_diff(own) * 10 > own {
            warn!(
                node = id,
                its_election_timeout_ms = ms,
                election_timeout_ms = own,
                "node {id} has another election_timeout_ms ({ms} against this node's {own}): set the same on every node; while they differ, a leader serves reads on a majority's answers for four fifths of the smallest value among its voters, and heartbeats more often if that is shorter than its own"
            );
        }
    }

    /// A count that moves whenever a value given for
    /// [`Peers::election_timeouts`] changes.
    pub fn election_timeouts_version(&self) -> u64 {
        self.election_timeouts_changed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The smallest `election_timeout_ms` the members `ids` gave in their
    /// handshakes (those that gave one, this node excluded).
    pub fn election_timeouts(&self, ids: impl Iterator<Item = NodeId>) -> Option<u64> {
        let given = self.election_timeouts.lock();
        ids.filter(|id| *id != self.node_id)
            .filter_map(|id| given.get(&id).copied())
            .min()
    }

    /// Records whether `id` answered; logs the changes.
    fn mark(&self, id: NodeId, addr: &str, ok: Result<(), &std::io::Error>) {
        self.note(id, addr, ok, true);
    }

    /// Records whether `id` answered; logs the changes when `log` (a call
    /// that only ran out of time is recorded, not logged: a slow peer
    /// would flap in the log; `raft_peer_timeouts` counts those).
    fn note(&self, id: NodeId, addr: &str, ok: Result<(), &std::io::Error>, log: bool) {
        let (went_down, came_back) = {
            let mut r = self.reachable.lock();
            let e = r.entry(id).or_default();
            e.ok = ok.is_ok();
            if e.ok {
                e.last_ok = Some(std::time::Instant::now());
            }
            let went_down = !e.ok && log && !e.logged_down;
            let came_back = e.ok && e.logged_down;
            if went_down {
                e.logged_down = true;
            }
            if came_back {
                e.logged_down = false;
            }
            (went_down, came_back)
        };
        match ok {
            Err(e) if went_down => warn!(peer = id, %addr, error = %e, "peer unreachable"),
            Ok(()) if came_back => info!(peer = id, %addr, "peer reachable again"),
            _ => {}
        }
    }

    /// Gives the server the Raft handle it answers with.
    pub fn set_raft(&self, raft: Raft<TypeConfig>) {
        let _ = self.raft.set(raft);
    }

    /// The HMAC of `what` keyed with `cluster_secret` (None without one).
    fn hmac(&self, what: &Signed<'_>) -> Option<Hmac<Sha256>> {
        let mut m = Hmac::<Sha256>::new_from_slice(self.secret.as_ref()?).ok()?;
        m.update(b"idem-peer-1");
        let cluster = what.cluster.as_ref().map_or(&[][..], |c| &c[..]);
        for part in [
            what.side,
            &what.nonces[0][..],
            &what.nonces[1][..],
            &what.sender.to_le_bytes(),
            &what.receiver.to_le_bytes(),
            cluster,
            what.client_addr.as_bytes(),
            &what.incarnation.to_le_bytes(),
        ] {
            m.update(&(part.len() as u32).to_le_bytes());
            m.update(part);
        }
        Some(m)
    }

    /// The MAC this node puts on `what` (zeros without a secret).
    fn mac(&self, what: &Signed<'_>) -> [u8; 32] {
        self.hmac(what)
            .map_or([0; 32], |m| m.finalize().into_bytes().into())
    }

    /// Whether `mac` proves the sender of `what` holds the secret (always,
    /// without one).
    fn check_mac(&self, what: &Signed<'_>, mac: &[u8; 32]) -> bool {
        if self.secret.is_none() {
            return true;
        }
        self.hmac(what).is_some_and(|m| m.verify_slice(mac).is_ok())
    }

    /// Whether `id` was removed from the cluster (the membership says so).
    fn is_retired(&self, id: NodeId) -> bool {
        let Some(raft) = self.raft.get() else {
            return false;
        };
        let m = raft.metrics().borrow().membership_config.clone();
        super::cluster::retired_ids(m.membership().nodes()).contains(id)
    }

    /// What this node says of itself to a probe from `asker`.
    pub fn probe_info(&self, asker: NodeId) -> ProbeInfo {
        let Some(raft) = self.raft.get() else {
            return ProbeInfo {
                initialized: false,
                cluster: self.cluster(),
                voters: Vec::new(),
                learners: Vec::new(),
                leader: None,
                your_match: None,
                client_addr: self.client_addr.clone(),
                last_log_index: 0,
            };
        };
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let learners: Vec<NodeId> = membership.learner_ids().collect();
        ProbeInfo {
            initialized: !voters.is_empty(),
            cluster: self.cluster(),
            voters,
            learners,
            leader: m.current_leader,
            your_match: m
                .replication
                .as_ref()
                .and_then(|r| r.get(&asker).copied().flatten())
                .map(|l| l.index),
            client_addr: self.client_addr.clone(),
            last_log_index: m.last_log_index.unwrap_or(0),
        }
    }
}

type Conn = Framed<Box<dyn PeerStream>, PeerCodec>;

/// Pooled connections are kept by peer, address and the cluster id this
/// node had when it opened them.
type PoolKey = (NodeId, String, Option<ClusterId>);

/// For the fuzz target of the peer protocol: splits `data` into frames as
/// a peer connection does, and reads each as every message a peer may send
/// (none may panic, whatever the bytes).
pub fn decode_for_fuzzing(data: &[u8]) {
    use tokio_util::codec::Decoder;
    let mut codec = PeerCodec::new(MAX_HANDSHAKE_FRAME, None);
    let mut buf = bytes::BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode(&mut buf) {
        let _ = postcard::from_bytes::<Challenge>(&frame);
        let _ = postcard::from_bytes::<Hello>(&frame);
        let _ = Welcome::decode(&frame);
        let _ = postcard::from_bytes::<Request>(&frame);
        let _ = postcard::from_bytes::<Response>(&frame);
    }
}

async fn send<T: Serialize>(conn: &mut Conn, msg: &T) -> std::io::Result<()> {
    let bytes = postcard::to_allocvec(msg).map_err(std::io::Error::other)?;
    conn.send(Bytes::from(bytes)).await
}

async fn recv<T: for<'de> Deserialize<'de>>(conn: &mut Conn) -> std::io::Result<T> {
    postcard::from_bytes(&recv_frame(conn).await?).map_err(std::io::Error::other)
}

/// The next frame on `conn`; an error once the peer closed it.
async fn recv_frame(conn: &mut Conn) -> std::io::Result<bytes::BytesMut> {
    match conn.next().await {
        Some(frame) => frame,
        None => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed the connection",
        )),
    }
}

/// Debug builds only, for fault tests: while the file `isolate-<node id>`
/// exists in the directory named by `IDEMD_TEST_ISOLATE_DIR`, this node
/// drops all peer traffic, in and out, as if cut off from the network.
#[cfg(debug_assertions)]
fn isolated(node: NodeId) -> bool {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("IDEMD_TEST_ISOLATE_DIR").map(PathBuf::from))
        .as_ref()
        .is_some_and(|d| d.join(format!("isolate-{node}")).exists())
}

#[cfg(not(debug_assertions))]
fn isolated(_node: NodeId) -> bool {
    false
}

fn cut_off() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "isolated (test fault)",
    )
}

/// Serves peer connections on `listener` until the process ends.
///
/// With `tls` (`tls_cluster`), each connection completes a TLS handshake
/// (a certificate of the CA required) before the cluster secret is checked
/// inside it.
pub async fn serve(listener: TcpListener, peers: Arc<Peers>, tls: Option<Arc<crate::tls::Tls>>) {
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "peer accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = tls.as_ref().and_then(|t| t.peer_acceptor());
        let peers = Arc::clone(&peers);
        tokio::spawn(async move {
            // Let in (or closed) before anything else is spent on it, its
            // TLS handshake included.
            let Some(admitted) = admit(&peers, addr).await else {
                return;
            };
            let Some(acceptor) = acceptor else {
                return serve_admitted(Box::new(stream), addr, &peers, admitted).await;
            };
            let accepted = tokio::select! {
                r = tokio::time::timeout(PEER_TLS_HANDSHAKE, acceptor.accept(stream)) => r,
                () = admitted.handshake.evicted() => {
                    debug!(%addr, "peer TLS handshake closed for a newer connection");
                    return;
                }
            };
            match accepted {
                Ok(Ok(s)) => serve_admitted(Box::new(s), addr, &peers, admitted).await,
                Ok(Err(e)) => debug!(%addr, error = %e, "peer TLS handshake failed"),
                Err(_) => debug!(%addr, "peer TLS handshake timed out"),
            }
        });
    }
}

/// Serves peer connections accepted elsewhere (see [`Incoming`]) until
/// their sender is dropped.
pub async fn serve_incoming(mut incoming: Incoming, peers: Arc<Peers>) {
    while let Some((stream, addr)) = incoming.recv().await {
        let peers = Arc::clone(&peers);
        tokio::spawn(async move {
            if let Some(admitted) = admit(&peers, addr).await {
                serve_admitted(stream, addr, &peers, admitted).await;
            }
        });
    }
}

/// Serves one admitted peer connection.
async fn serve_admitted(
    stream: Box<dyn PeerStream>,
    addr: SocketAddr,
    peers: &Arc<Peers>,
    admitted: Admitted,
) {
    let Admitted { slot, handshake } = admitted;
    if let Err(e) = serve_conn(stream, addr, peers, handshake).await {
        debug!(%addr, error = %e, "peer connection ended");
    }
    drop(slot);
}

/// Serves one peer connection: the handshake (its place among its source's
/// handshakes given back once done), then requests.
async fn serve_conn(
    stream: Box<dyn PeerStream>,
    addr: SocketAddr,
    peers: &Arc<Peers>,
    handshake: Handshaking,
) -> std::io::Result<()> {
    let mut conn = Framed::new(
        stream,
        PeerCodec::new(MAX_HANDSHAKE_FRAME, Some(Arc::clone(&peers.receiving))),
    );
    let nonce_s = random16();
    let hello: Hello = tokio::select! {
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            send(
                &mut conn,
                &Challenge {
                    protocol: PEER_PROTOCOL,
                    nonce: nonce_s,
                },
            )
            .await?;
            recv(&mut conn).await
        }) => r.map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out"))??,
        () = handshake.evicted() => {
            return Err(std::io::Error::other("closed in its handshake for a newer connection"));
        }
    };
    // Its part done: no longer one that can be closed for a newer
    // connection (an eviction from here on would free no place).
    drop(handshake);
    let refuse = |why: String| {
        peers.refused(addr, &format!("from node {}: {why}", hello.from));
        why
    };
    let mine = peers.cluster();
    let refusal = if hello.protocol != PEER_PROTOCOL {
        Some(refuse(format!(
            "peer protocol {} is not {PEER_PROTOCOL}",
            hello.protocol
        )))
    } else if !peers.check_mac(
        &Signed {
            side: b"C",
            nonces: [&nonce_s, &hello.nonce],
            sender: hello.from,
            receiver: hello.to,
            cluster: hello.cluster,
            client_addr: &hello.client_addr,
            incarnation: hello.incarnation,
        },
        &hello.mac,
    ) {
        Some(refuse(
            "cluster_secret does not match (or is not set on the connecting node)".into(),
        ))
    } else if let (Some(a), Some(b)) = (mine, hello.cluster)
        && a != b
    {
        // Before anything that reads this cluster's records of the
        // sender's id: a node of another cluster shares ids with this one,
        // and what is recorded for them says nothing of it.
        Some(refuse(format!(
            "cluster id {} is not this node's cluster {}: check the peer addresses",
            cluster_hex(&b),
            cluster_hex(&a)
        )))
    } else if hello.to != peers.node_id {
        Some(refuse(format!(
            "this is node {}, not node {}: check the peer addresses",
            peers.node_id, hello.to
        )))
    } else if let Err(why) = peers.check_incarnation(hello.from, hello.incarnation) {
        Some(refuse(why))
    } else if peers.is_retired(hello.from) {
        let why = refuse(format!(
            "node {} was removed from this cluster; its id is never accepted again",
            hello.from
        ));
        let _ = send(&mut conn, &Welcome::Removed(why)).await;
        return Ok(());
    } else if hello.from == peers.node_id {
        Some(refuse(format!(
            "the connecting node claims this node's own id {}",
            peers.node_id
        )))
    } else {
        None
    };
    if let Some(why) = refusal {
        let _ = send(&mut conn, &Welcome::Refused(why)).await;
        return Ok(());
    }
    send(
        &mut conn,
        &Welcome::Ok {
            cluster: mine,
            node: peers.node_id,
            client_addr: peers.client_addr.clone(),
            incarnation: peers.incarnation,
            mac: peers.mac(&Signed {
                side: b"S",
                nonces: [&hello.nonce, &nonce_s],
                sender: peers.node_id,
                receiver: hello.from,
                cluster: mine,
                client_addr: &peers.client_addr,
                incarnation: peers.incarnation,
            }),
            election_timeout_ms: peers.raft.get().map_or(0, |r| r.config().leader_lease),
        },
    )
    .await?;
    // Only from a member connecting from its recorded host: any process
    // that can complete a handshake (on loopback without a secret, any
    // local one) could otherwise send this cluster's clients, and the
    // passwords they send, to an address of its choosing, and grow the
    // map by an entry per id it claims.
    // From anyone else it drops what was learned: the membership's record
    // is used instead.
    if !hello.client_addr.is_empty() {
        let member = peers.member_peer_ip(hello.from).map(|ip| ip.to_canonical())
            == Some(addr.ip().to_canonical());
        let mut advertised = peers.advertised.lock();
        if member {
            advertised.insert(hello.from, hello.client_addr.clone());
        } else {
            advertised.remove(&hello.from);
        }
    }
    conn.codec_mut().set_max_frame_length(MAX_FRAME);
    let asker = hello.from;
    let _closed = ConnClosed { peers, from: asker };
    // AppendEntries read ahead of their answers (a leader pipelines them):
    // handed to Raft in the order read, answered in that order.
    let mut pending = std::collections::VecDeque::<(usize, Answering)>::new();
    let mut pending_bytes = 0;
    loop {
        let idle = pending.is_empty();
        let read_more = pending.len() < READ_AHEAD && pending_bytes < READ_AHEAD_BYTES;
        let got = tokio::select! {
            biased;
            resp = async { (&mut pending.front_mut().expect("not empty").1).await }, if !idle => {
                let (bytes, _) = pending.pop_front().expect("not empty");
                pending_bytes -= bytes;
                send(&mut conn, &resp).await?;
                continue;
            }
            got = async {
                if idle {
                    tokio::time::timeout(PEER_IDLE_TIMEOUT, conn.next()).await.ok()
                } else {
                    Some(conn.next().await)
                }
            }, if read_more => got,
        };
        let (req, bytes): (Request, usize) = match got {
            None => return Ok(()),
            Some(Some(Ok(frame))) => {
                // The batches it carries share the frame's bytes.
                let frame = frame.freeze();
                (
                    decode_sharing(&frame).map_err(std::io::Error::other)?,
                    frame.len(),
                )
            }
            Some(Some(Err(e))) => return Err(e),
            Some(None) => return Ok(()),
        };
        // Never handed to Raft: the connection ends (a member never sends
        // one).
        if let Some(why) = implausible(&req, asker) {
            peers.refused(addr, &format!("from node {asker}: {why}"));
            let _ = send(&mut conn, &Response::Failed(why)).await;
            return Ok(());
        }
        if isolated(peers.node_id) {
            return Err(cut_off());
        }
        // A node that has not joined takes the cluster id of the first
        // member that sends it Raft traffic.
        if let Request::KeptOut(why) = req {
            peers.kept_out_by(asker, &why);
            return Ok(());
        }
        if !matches!(req, Request::Probe | Request::ReadIndex)
            && peers.cluster().is_none()
            && let Some(id) = hello.cluster
        {
            if let Err(e) = peers.set_cluster(id) {
                answer_pending(&mut conn, &mut pending).await?;
                pending_bytes = 0;
                send(&mut conn, &Response::Failed(e)).await?;
                continue;
            }
            info!(cluster = %cluster_hex(&id), from = asker, "joined a cluster");
        }
        let raft = peers.raft.get();
        let req = match (req, raft) {
            (Request::Append(r), Some(raft)) => {
                peers.watch.heard(raft, asker);
                let answer = raft.submit_append_entries(r);
                pending.push_back((
                    bytes,
                    Box::pin(async move { Response::Append(answer.await) }),
                ));
                pending_bytes += bytes;
                continue;
            }
            (req, _) => req,
        };
        // Anything else once what was read before it is answered.
        answer_pending(&mut conn, &mut pending).await?;
        pending_bytes = 0;
        if let Request::Probe = req {
            send(&mut conn, &Response::Probe(peers.probe_info(asker))).await?;
            continue;
        }
        if let Request::ReadIndex = req {
            send(&mut conn, &Response::ReadIndex(peers.read_index().await)).await?;
            continue;
        }
        let Some(raft) = raft else {
            send(&mut conn, &Response::Failed("starting".into())).await?;
            continue;
        };
        let resp = match req {
            Request::Append(r) => Response::Append(raft.append_entries(r).await),
            Request::Vote(r) => Response::Vote(raft.vote(r).await),
            Request::Snapshot(r) => {
                peers.watch.heard(raft, asker);
                let (id, offset, len) = (r.meta.snapshot_id.clone(), r.offset, r.data.len());
                match peers.check_snapshot_chunk(&id, offset) {
                    Ok(()) => {
                        let vote = r.vote;
                        let work = raft.install_snapshot(r);
                        let taken = from_leader_meanwhile(peers, raft, asker, vote, work).await;
                        if taken.is_ok() {
                            peers.snapshot_chunk_taken(&id, offset, len);
                        }
                        Response::Snapshot(taken)
                    }
                    Err(mismatch) => {
                        warn!(from = asker, %mismatch, "refused a snapshot chunk that does not follow what was received");
                        Response::Snapshot(Err(RaftError::APIError(
                            InstallSnapshotError::SnapshotMismatch(mismatch),
                        )))
                    }
                }
            }
            Request::Probe => Response::Probe(peers.probe_info(asker)),
            Request::ReadIndex => Response::ReadIndex(peers.read_index().await),
            // Handled as it was read.
            Request::KeptOut(_) => return Ok(()),
        };
        send(&mut conn, &resp).await?;
    }
}

/// Runs `work`, the taking of a snapshot chunk from `leader`, whose vote
/// is `vote`, counting it as word from that leader, as an AppendEntries
/// is: once as it starts and every heartbeat interval until it is done.
///
/// openraft takes the chunks outside its core, so they did not restart the
/// follower's election timer, and the leader's heartbeats did not stand in
/// for them while the last chunk installed the snapshot: the follower's
/// openraft answers every AppendEntries only after a pending install, so a
/// heartbeat sent meanwhile waited until the leader gave up on it
/// (`append_timeout_ms`), and the leader sent the next one only after that
/// and a backoff, about one every 2.5 s where a follower campaigns after
/// 0.6-0.9 s. A follower whose snapshot took longer than that to load
/// campaigned, and its higher term deposed the leader. An empty
/// AppendEntries with no previous entry matches any log and commits
/// nothing: it only takes the vote (refused if it is not at least this
/// node's) and restarts the timer. Its answer is not waited for: openraft
/// gives it only after the install, behind the install's own answer. The
/// quick campaign ([`LeaderWatch`](super::quick_elect::LeaderWatch)) hears
/// of it too.
async fn from_leader_meanwhile<T>(
    peers: &Peers,
    raft: &Raft<TypeConfig>,
    leader: NodeId,
    vote: openraft::Vote<NodeId>,
    work: impl Future<Output = T>,
) -> T {
    let heartbeat = || {
        peers.watch.heard(raft, leader);
        let raft = raft.clone();
        // Ended with the work (dropping it drops the answer, unread).
        AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = raft
                .append_entries(AppendEntriesRequest {
                    vote,
                    prev_log_id: None,
                    entries: Vec::new(),
                    leader_commit: None,
                })
                .await;
        }))
    };
    let config = raft.config();
    let every = Duration::from_millis(config.heartbeat_interval.max(1));
    // One a heartbeat interval, for as long as the leader waits for the
    // chunk's answer (`install_snapshot_timeout`): past that it has given up
    // on this call (it sends the chunk again, or is gone), and this node no
    // longer speaks for it.
    let until = tokio::time::Instant::now() + config.install_snapshot_timeout();
    let mut sent = vec![heartbeat()];
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => {
                if tokio::time::Instant::now() >= until {
                    drop(sent);
                    return work.await;
                }
                sent.retain(|h| !h.is_finished());
                sent.push(heartbeat());
            }
        }
    }
}

/// Why a request from node `asker` is not one a member sends, if it is
/// not: a term at or past [`MAX_TERM`], a vote in another node's name,
/// log ids of a later term than the sender's vote, or entries that do not
/// follow each other (see [`unfit_entries`]).
fn implausible(req: &Request, asker: NodeId) -> Option<String> {
    let vote = match req {
        Request::Append(r) => &r.vote,
        Request::Vote(r) => &r.vote,
        Request::Snapshot(r) => &r.vote,
        Request::Probe | Request::KeptOut(_) | Request::ReadIndex => return None,
    };
    let term = vote.leader_id.term;
    if term >= MAX_TERM {
        return Some(format!(
            "term {term} is past the largest accepted ({MAX_TERM})"
        ));
    }
    if vote.leader_id.node_id != asker {
        return Some(format!(
            "a vote for node {} sent by node {asker}",
            vote.leader_id.node_id
        ));
    }
    // Entries and snapshots come from a leader, whose vote is committed; a
    // candidate's is not (yet).
    if !vote.committed && matches!(req, Request::Append(_) | Request::Snapshot(_)) {
        return Some(format!("entries sent under an uncommitted vote ({vote})"));
    }
    let mut logged: Vec<&openraft::LogId<NodeId>> = Vec::new();
    match req {
        Request::Append(r) => {
            logged.extend(r.prev_log_id.iter().chain(r.leader_commit.iter()));
            logged.extend(r.entries.iter().map(|e| &e.log_id));
        }
        Request::Vote(r) => logged.extend(r.last_log_id.iter()),
        Request::Snapshot(r) => logged.extend(r.meta.last_log_id.iter()),
        Request::Probe | Request::KeptOut(_) | Request::ReadIndex => {}
    }
    if let Some(later) = logged.into_iter().find(|l| l.leader_id.term > term) {
        return Some(format!(
            "log id {later} is of a later term than the sender's vote ({term})"
        ));
    }
    match req {
        Request::Append(r) => unfit_entries(r),
        _ => None,
    }
}

/// Why an AppendEntries' entries could not have come from a leader's log,
/// if they could not: each follows the one before it (the first, the entry
/// they are sent after) at the next index and in no earlier term, and each
/// batch decodes as this node will apply it. A log takes such entries as
/// they come, and applying one that does not decode stops the node (and
/// every node it would later replicate it to).
fn unfit_entries(r: &AppendEntriesRequest<TypeConfig>) -> Option<String> {
    let mut prev = r.prev_log_id;
    for e in &r.entries {
        let next = prev.map_or(0, |p| p.index.saturating_add(1));
        if e.log_id.index != next {
            return Some(format!("entry {} where index {next} comes next", e.log_id));
        }
        if let Some(p) = prev
            && e.log_id.leader_id.term < p.leader_id.term
        {
            return Some(format!("entry {} follows {p}, of a later term", e.log_id));
        }
        if let openraft::EntryPayload::Normal(batch) = &e.payload
            && let Err(err) = batch.check()
        {
            return Some(format!("entry {}: {err}", e.log_id));
        }
        prev = Some(e.log_id);
    }
    None
}

/// Whether an answer's vote, if it carries one, has a term below
/// [`MAX_TERM`].
fn plausible(resp: &Response) -> bool {
    let vote = match resp {
        Response::Append(Ok(AppendEntriesResponse::HigherVote(v))) => v,
        Response::Vote(Ok(r)) => &r.vote,
        Response::Snapshot(Ok(r)) => &r.vote,
        _ => return true,
    };
    vote.leader_id.term < MAX_TERM
}

/// The answer to come to an AppendEntries read ahead.
type Answering = Pin<Box<dyn Future<Output = Response> + Send>>;

/// AppendEntries a peer connection reads ahead of their answers, at most
/// (and so the most `max_inflight_appends` may be).
pub const READ_AHEAD: usize = 16;
/// Bytes of AppendEntries read ahead of their answers past which a peer
/// connection reads no more until some are answered.
const READ_AHEAD_BYTES: usize = 64 << 20;

/// Sends the answers to the AppendEntries read ahead, in order.
async fn answer_pending(
    conn: &mut Conn,
    pending: &mut std::collections::VecDeque<(usize, Answering)>,
) -> std::io::Result<()> {
    while let Some((_, answer)) = pending.pop_front() {
        let resp = answer.await;
        send(conn, &resp).await?;
    }
    Ok(())
}

/// Why a call to a peer failed.
#[derive(Debug)]
enum CallError {
    /// Could not connect, or was refused at the handshake: openraft backs
    /// off.
    Unreachable(std::io::Error),
    /// Failed part way.
    Network(std::io::Error),
}

impl CallError {
    fn into_rpc<E: std::error::Error>(self) -> RPCError<NodeId, BasicNode, E> {
        match self {
            CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallError::Network(e) => RPCError::Network(NetworkError::new(&e)),
        }
    }
}

/// A client to one peer: one connection, reused.
pub struct PeerClient {
    peers: Arc<Peers>,
    target: NodeId,
    addr: String,
    /// The connection, and the cluster id this node had when it opened it.
    conn: Option<(Conn, Option<ClusterId>)>,
    /// The connection pipelined AppendEntries go on, once there is one.
    pipe: Option<mpsc::Sender<Piped>>,
}

/// An AppendEntries handed to a pipe ([`run_pipe`]).
struct Piped {
    /// The encoded request.
    bytes: Bytes,
    /// Whether it carries entries (not only news of a commit).
    entries: bool,
    /// When its answer is due.
    deadline: tokio::time::Instant,
    /// Where the answer goes.
    answer: tokio::sync::oneshot::Sender<std::io::Result<Response>>,
}

impl PeerClient {
    /// A client to node `target` at peer address `addr` (not connected
    /// until the first call).
    pub fn new(peers: Arc<Peers>, target: NodeId, addr: String) -> PeerClient {
        PeerClient {
            peers,
            target,
            addr,
            conn: None,
            pipe: None,
        }
    }

    /// The pipe to send pipelined AppendEntries on: the one open, or one
    /// made of the connection kept from the last call. `None` when there
    /// is neither: the next call is made alone, and connects.
    fn pipe(&mut self) -> Option<&mpsc::Sender<Piped>> {
        if self.pipe.as_ref().is_some_and(|p| !p.is_closed()) {
            return self.pipe.as_ref();
        }
        self.pipe = None;
        let cluster = self.peers.cluster();
        let (conn, opened) = self.conn.take()?;
        if opened != cluster {
            return None;
        }
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        tokio::spawn(run_pipe(conn, rx, Arc::clone(&self.peers)));
        self.pipe = Some(tx);
        self.pipe.as_ref()
    }

    /// This node refused by the peer in its handshake: logged (rate
    /// limited), and the peer counts as unreachable.
    fn refused(&self, why: &str) -> CallError {
        self.peers.refused_by(self.target, &self.addr, why);
        CallError::Unreachable(std::io::Error::other(format!("refused: {why}")))
    }

    async fn connect(&self) -> Result<Conn, CallError> {
        let unreachable = |e: std::io::Error| CallError::Unreachable(e);
        if self.addr.is_empty() {
            return Err(unreachable(std::io::Error::other(format!(
                "node {} has no peer address",
                self.target
            ))));
        }
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, self.peers.dialer.dial(&self.addr))
            .await
            .map_err(|_| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connect timed out",
                ))
            })?
            .map_err(unreachable)?;
        let mut conn = Framed::new(
            stream,
            PeerCodec::new(MAX_HANDSHAKE_FRAME, Some(Arc::clone(&self.peers.receiving))),
        );
        let welcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let ch: Challenge = recv(&mut conn).await?;
            if ch.protocol != PEER_PROTOCOL {
                return Err(std::io::Error::other(format!(
                    "peer protocol {} is not {PEER_PROTOCOL}",
                    ch.protocol
                )));
            }
            let nonce_c = random16();
            let cluster = self.peers.cluster();
            let mac = self.peers.mac(&Signed {
                side: b"C",
                nonces: [&ch.nonce, &nonce_c],
                sender: self.peers.node_id,
                receiver: self.target,
                cluster,
                client_addr: &self.peers.client_addr,
                incarnation: self.peers.incarnation,
            });
            send(
                &mut conn,
                &Hello {
                    protocol: PEER_PROTOCOL,
                    cluster,
                    from: self.peers.node_id,
                    to: self.target,
                    client_addr: self.peers.client_addr.clone(),
                    incarnation: self.peers.incarnation,
                    nonce: nonce_c,
                    mac,
                },
            )
            .await?;
            let w =
                Welcome::decode(&recv_frame(&mut conn).await?).map_err(std::io::Error::other)?;
            Ok((w, ch.nonce, nonce_c))
        })
        .await
        .map_err(|_| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "handshake timed out",
            ))
        })?
        .map_err(unreachable)?;
        match welcome {
            (Welcome::Refused(why), _, _) => Err(self.refused(&why)),
            (Welcome::Removed(why), _, _) => {
                if !self
                    .peers
                    .removed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    warn!(target = self.target, reason = %why, "this node was removed from the cluster: it serves no one and no longer campaigns; stop it");
                }
                // Its campaigns can never win (the members refuse it), and
                // each would raise its term and log a leader change, twice
                // a second for as long as it is left running. (A member
                // that welcomes it later turns them back on: see below.)
                if let Some(raft) = self.peers.raft.get() {
                    raft.runtime_config().elect(false);
                }
                Err(self.refused(&why))
            }
            (
                Welcome::Ok {
                    cluster,
                    node,
                    client_addr,
                    incarnation,
                    mac,
                    election_timeout_ms,
                },
                nonce_s,
                nonce_c,
            ) => {
                let why = if node != self.target {
                    Some(format!(
                        "node {node} answered at the address of node {}",
                        self.target
                    ))
                } else if !self.peers.check_mac(
                    &Signed {
                        side: b"S",
                        nonces: [&nonce_c, &nonce_s],
                        sender: node,
                        receiver: self.peers.node_id,
                        cluster,
                        client_addr: &client_addr,
                        incarnation,
                    },
                    &mac,
                ) {
                    Some("the peer does not hold cluster_secret".into())
                } else if let (Some(a), Some(b)) = (self.peers.cluster(), cluster)
                    && a != b
                {
                    Some(format!(
                        "the peer belongs to cluster {}, not {}",
                        cluster_hex(&b),
                        cluster_hex(&a)
                    ))
                } else if let Err(why) = self.peers.check_incarnation(node, incarnation) {
                    // Told, so that it can say why it gets nothing (it
                    // knows of no cluster, and would only wait).
                    let _ = tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        send(&mut conn, &Request::KeptOut(why.clone())),
                    )
                    .await;
                    Some(why)
                } else {
                    None
                };
                if let Some(why) = why {
                    self.peers.refused_answer(self.target, &self.addr, &why);
                    return Err(unreachable(std::io::Error::other(why)));
                }
                self.peers.learn_incarnation(node, incarnation);
                self.peers.learn_election_timeout(node, election_timeout_ms);
                // Welcomed: a refusal as removed came from a membership
                // change not committed after all (it was cut from the log
                // when another leader took over): campaign again.
                if self
                    .peers
                    .removed
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                    && let Some(raft) = self.peers.raft.get()
                {
                    raft.runtime_config().elect(true);
                }
                if !client_addr.is_empty() {
                    self.peers.advertised.lock().insert(node, client_addr);
                }
                conn.codec_mut().set_max_frame_length(MAX_FRAME);
                Ok(conn)
            }
        }
    }

    /// One call, answered by `ttl` (openraft's soft deadline: its own hard
    /// one comes later, so a call that runs out of time is counted here).
    /// One that gets no answer in time is reported as unreachable, so
    /// openraft backs off before it sends to that peer again, and the idle
    /// connections kept for the peer are dropped (a host that vanished
    /// would leave each to run out of time in turn).
    async fn call(&mut self, req: Request, ttl: Duration) -> Result<Response, CallError> {
        match self.call_once(req, ttl).await {
            Err(CallError::Unreachable(e) | CallError::Network(e))
                if e.kind() == std::io::ErrorKind::TimedOut =>
            {
                self.peers
                    .timeouts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.peers
                    .pool
                    .lock()
                    .retain(|(target, _, _), _| *target != self.target);
                Err(CallError::Unreachable(e))
            }
            other => other,
        }
    }

    async fn call_once(&mut self, req: Request, ttl: Duration) -> Result<Response, CallError> {
        if isolated(self.peers.node_id) {
            self.conn = None;
            return Err(CallError::Unreachable(cut_off()));
        }
        let bytes = Bytes::from(
            postcard::to_extend(&req, Vec::with_capacity(req.size_hint()))
                .map_err(|e| CallError::Network(std::io::Error::other(e)))?,
        );
        let deadline = tokio::time::Instant::now() + ttl;
        // A kept connection first; if it fails (the peer closed it while it
        // was idle), a fresh one.
        // Connections opened before this node had its cluster id named
        // none: they are not reused once it has one.
        let cluster = self.peers.cluster();
        let kept = self
            .conn
            .take()
            .filter(|(_, c)| *c == cluster)
            .map(|(conn, _)| conn)
            .or_else(|| {
                self.peers
                    .pool
                    .lock()
                    .get_mut(&(self.target, self.addr.clone(), cluster))
                    .and_then(Vec::pop)
            });
        if let Some(conn) = kept {
            match exchange(conn, bytes.clone(), deadline).await {
                Ok((conn, resp)) => {
                    self.peers.mark(self.target, &self.addr, Ok(()));
                    self.conn = Some((conn, cluster));
                    return Ok(resp);
                }
                // No answer by the deadline: a fresh connection would have
                // no time left either (openraft is told the peer is slow,
                // not unreachable; CLUSTER MEMBERS shows it did not answer).
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    self.peers.note(self.target, &self.addr, Err(&e), false);
                    return Err(CallError::Network(e));
                }
                Err(_) => {}
            }
        }
        let conn = match tokio::time::timeout_at(deadline, self.connect()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let (CallError::Unreachable(io) | CallError::Network(io)) = &e;
                self.peers.mark(self.target, &self.addr, Err(io));
                return Err(e);
            }
            Err(_) => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("cannot connect within {} ms", ttl.as_millis()),
                );
                self.peers.mark(self.target, &self.addr, Err(&e));
                return Err(CallError::Unreachable(e));
            }
        };
        match exchange(conn, bytes, deadline).await {
            Ok((conn, resp)) => {
                self.peers.mark(self.target, &self.addr, Ok(()));
                self.conn = Some((conn, cluster));
                Ok(resp)
            }
            Err(e) => {
                let log = e.kind() != std::io::ErrorKind::TimedOut;
                self.peers.note(self.target, &self.addr, Err(&e), log);
                Err(CallError::Network(e))
            }
        }
    }

    /// Asks this peer, the leader, for the index a linearizable read must
    /// have applied ([`Request::ReadIndex`]), within `ttl`. `Err((true,
    /// why))`: it answered, with a refusal; `Err((false, why))`: no answer
    /// (it is unreachable, or of an earlier build that cannot read the
    /// request and closes the connection).
    pub async fn read_index(&mut self, ttl: Duration) -> Result<u64, (bool, String)> {
        match self.call(Request::ReadIndex, ttl).await {
            Ok(Response::ReadIndex(r)) => r.map_err(|why| (true, why)),
            Ok(Response::Failed(why)) => Err((true, why)),
            Ok(_) => Err((true, "unexpected answer".into())),
            Err(CallError::Unreachable(e) | CallError::Network(e)) => Err((false, e.to_string())),
        }
    }

    /// Asks the peer what it holds.
    pub async fn probe(&mut self) -> Result<ProbeInfo, String> {
        match self.call(Request::Probe, CONNECT_TIMEOUT).await {
            Ok(Response::Probe(p)) => Ok(p),
            Ok(Response::Failed(why)) => Err(why),
            Ok(_) => Err("unexpected answer".into()),
            Err(CallError::Unreachable(e) | CallError::Network(e)) => Err(e.to_string()),
        }
    }
}

/// Writes the AppendEntries handed to it on `conn` as they come, without
/// waiting for the answers, and hands each answer to its sender in order
/// (the peer answers in the order it reads). Ends, failing every request
/// still unanswered, when the connection fails, when the oldest request's
/// answer is not in by its deadline, or when its client is dropped.
async fn run_pipe(mut conn: Conn, mut rx: mpsc::Receiver<Piped>, peers: Arc<Peers>) {
    let node = peers.node_id;
    type Waiting = std::collections::VecDeque<(
        tokio::time::Instant,
        tokio::sync::oneshot::Sender<std::io::Result<Response>>,
    )>;
    fn fail(waiting: &mut Waiting, e: &std::io::Error) {
        for (_, w) in waiting.drain(..) {
            let _ = w.send(Err(std::io::Error::new(e.kind(), e.to_string())));
        }
    }
    let mut waiting = Waiting::new();
    loop {
        let due = waiting.front().map(|(d, _)| *d);
        tokio::select! {
            biased;
            got = recv::<Response>(&mut conn) => match (got, waiting.pop_front()) {
                (Ok(resp), Some((_, w))) => {
                    let _ = w.send(Ok(resp));
                }
                (Ok(_), None) => {
                    warn!(peer_node = node, "a peer answered what was not asked: connection dropped");
                    return;
                }
                (Err(e), first) => {
                    waiting.extend(first);
                    fail(&mut waiting, &e);
                    return;
                }
            },
            () = async {
                match due {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                fail(
                    &mut waiting,
                    &std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"),
                );
                return;
            }
            next = rx.recv() => {
                let Some(first) = next else {
                    return;
                };
                // This request and any others queued meanwhile, then one
                // flush; all by the oldest deadline (a peer that stops
                // reading does not hold the pipe).
                let due = waiting
                    .front()
                    .map_or(first.deadline, |(d, _)| *d)
                    .min(first.deadline);
                let written = tokio::time::timeout_at(due, async {
                    let mut next = Some(first);
                    let mut written = Ok(());
                    while let Some(p) = next.take() {
                        if p.entries && !waiting.is_empty() {
                            peers
                                .appends_pipelined
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        waiting.push_back((p.deadline, p.answer));
                        if isolated(node) {
                            written = Err(cut_off());
                        }
                        if written.is_ok() {
                            written = conn.feed(p.bytes).await;
                        }
                        next = rx.try_recv().ok();
                    }
                    if written.is_ok() {
                        written = SinkExt::<Bytes>::flush(&mut conn).await;
                    }
                    written
                })
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the peer took no more in time",
                    ))
                });
                if let Err(e) = written {
                    fail(&mut waiting, &e);
                    return;
                }
            }
        }
    }
}

/// Sends an encoded request on `conn` and reads the response, by
/// `deadline`.
async fn exchange(
    mut conn: Conn,
    req: Bytes,
    deadline: tokio::time::Instant,
) -> std::io::Result<(Conn, Response)> {
    let result = tokio::time::timeout_at(deadline, async {
        conn.send(req).await?;
        recv::<Response>(&mut conn).await
    })
    .await;
    match result {
        Ok(Ok(resp)) => Ok((conn, resp)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer in time",
        )),
    }
}

impl Drop for PeerClient {
    /// Keeps the connection for the next client to this peer.
    fn drop(&mut self) {
        if let Some((conn, cluster)) = self.conn.take() {
            if self.peers.left.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let mut pool = self.peers.pool.lock();
            let kept = pool
                .entry((self.target, self.addr.clone(), cluster))
                .or_default();
            if kept.len() < POOL_PER_PEER {
                kept.push(conn);
            }
        }
    }
}

/// What a response carries for one kind of RPC: its result, or the
/// response itself when it is another kind.
type Picked<T, E> = Result<Result<T, RaftError<NodeId, E>>, Response>;

/// The typed answer to one RPC: `pick` takes the variant that answers it
/// (any other response, or `Failed`, is a network error). openraft's error
/// types are what its traits return: large, and not ours to shrink.
#[allow(clippy::result_large_err)]
fn answer<T, E: std::error::Error>(
    target: NodeId,
    got: Result<Response, CallError>,
    pick: fn(Response) -> Picked<T, E>,
) -> Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>> {
    let got = match got {
        Ok(resp) if !plausible(&resp) => Ok(Response::Failed(format!(
            "node {target} answered with a term past the largest accepted ({MAX_TERM})"
        ))),
        got => got,
    };
    match got.map(pick) {
        Ok(Ok(Ok(r))) => Ok(r),
        Ok(Ok(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(target, e))),
        Ok(Err(other)) => {
            let why = match other {
                Response::Failed(why) => why,
                _ => "unexpected answer".into(),
            };
            Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(why),
            )))
        }
        Err(e) => Err(e.into_rpc()),
    }
}

#[allow(clippy::result_large_err)]
impl openraft::RaftNetwork<TypeConfig> for PeerClient {
    /// After a call the target did not answer, the next one waits a
    /// heartbeat interval (a third of the election timeout), not
    /// openraft's 500 ms: a follower restarted meanwhile waited that long
    /// and more to hear from the leader, and could campaign first (its log
    /// behind, it cannot win, but its higher term deposed the leader). A
    /// call to a node that is down costs a refused connection, or a
    /// connection attempt that times out.
    fn backoff(&self) -> openraft::network::Backoff {
        let every = self
            .peers
            .raft
            .get()
            .map_or(100, |r| r.config().heartbeat_interval)
            .clamp(10, 500);
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(every)))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let counted = if rpc.entries.is_empty() { 2 } else { 1 };
        for c in &self.peers.appends[..counted] {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let got = self.call(Request::Append(rpc), option.soft_ttl()).await;
        answer(self.target, got, |r| match r {
            Response::Append(a) => Ok(a),
            other => Err(other),
        })
    }

    fn append_entries_pipelined(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<openraft::network::PipelinedAppend<TypeConfig>, AppendEntriesRequest<TypeConfig>>
    {
        if isolated(self.peers.node_id) {
            return Err(rpc);
        }
        let req = Request::Append(rpc);
        let bytes = match postcard::to_extend(&req, Vec::with_capacity(req.size_hint())) {
            Ok(b) => Bytes::from(b),
            Err(_) => {
                let Request::Append(rpc) = req else {
                    unreachable!("built above")
                };
                return Err(rpc);
            }
        };
        let peers = Arc::clone(&self.peers);
        let Some(pipe) = self.pipe() else {
            let Request::Append(rpc) = req else {
                unreachable!("built above")
            };
            return Err(rpc);
        };
        let Request::Append(rpc) = &req else {
            unreachable!("built above")
        };
        let counted = if rpc.entries.is_empty() { 2 } else { 1 };
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Full (more than a follower reads ahead) or just closed: sent
        // alone once what is in flight is answered.
        if pipe
            .try_send(Piped {
                bytes,
                entries: counted == 1,
                deadline: tokio::time::Instant::now() + option.soft_ttl(),
                answer: tx,
            })
            .is_err()
        {
            let Request::Append(rpc) = req else {
                unreachable!("built above")
            };
            return Err(rpc);
        }
        for c in &peers.appends[..counted] {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let target = self.target;
        let addr = self.addr.clone();
        Ok(Box::pin(async move {
            let got = rx
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("the connection closed")));
            let got = match got {
                Ok(resp) => {
                    peers.mark(target, &addr, Ok(()));
                    Ok(resp)
                }
                // As `call` does with a call that gets no answer in time.
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    peers
                        .timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    peers.pool.lock().retain(|(t, _, _), _| *t != target);
                    peers.note(target, &addr, Err(&e), false);
                    Err(CallError::Unreachable(e))
                }
                Err(e) => {
                    peers.note(target, &addr, Err(&e), true);
                    Err(CallError::Network(e))
                }
            };
            answer(target, got, |r| match r {
                Response::Append(a) => Ok(a),
                other => Err(other),
            })
        }))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let got = self.call(Request::Snapshot(rpc), option.soft_ttl()).await;
        answer(self.target, got, |r| match r {
            Response::Snapshot(a) => Ok(a),
            other => Err(other),
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let got = self.call(Request::Vote(rpc), option.soft_ttl()).await;
        answer(self.target, got, |r| match r {
            Response::Vote(a) => Ok(a),
            other => Err(other),
        })
    }
}

/// openraft's network: a [`PeerClient`] per target, at the peer address
/// recorded in the membership.
pub struct PeerNetwork {
    /// This node's identity.
    pub peers: Arc<Peers>,
}

impl openraft::RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let addr = super::cluster::MemberAddr::parse(&node.addr).peer;
        PeerClient::new(Arc::clone(&self.peers), target, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header announcing 512 MiB took the whole `max_peer_receive_bytes`
    /// at once, and held it until the idle timeout (a minute): the
    /// members' own frames were refused meanwhile. What is buffered of a
    /// frame counts, as its bytes arrive, and the buffer is not grown to
    /// the announced length ahead of them.
    #[test]
    fn a_frame_counts_what_has_arrived_of_it() {
        use tokio_util::codec::{Decoder, Encoder};
        let budget = Arc::new(ReceiveBudget::new(1 << 20));
        let mut codec = PeerCodec::new(MAX_FRAME, Some(Arc::clone(&budget)));
        let mut src = bytes::BytesMut::new();
        src.extend_from_slice(&(MAX_FRAME as u32).to_be_bytes());
        assert!(codec.decode(&mut src).unwrap().is_none());
        assert_eq!(budget.used(), 0, "a header alone holds nothing");
        assert!(src.capacity() <= 2 * RECEIVE_STEP, "{}", src.capacity());
        src.extend_from_slice(&[1; 300 << 10]);
        assert!(codec.decode(&mut src).unwrap().is_none());
        assert_eq!(budget.used(), 300 << 10);
        // What is counted is what is allocated for it.
        assert_eq!(codec.body.as_ref().unwrap().capacity(), 300 << 10);
        assert!(src.is_empty(), "moved out of the read buffer");
        assert!(
            src.capacity() >= RECEIVE_STEP,
            "room to read the next bytes into: {}",
            src.capacity()
        );
        // Another connection's frame fits beside it, and is whole.
        let mut other = PeerCodec::new(MAX_FRAME, Some(Arc::clone(&budget)));
        let mut wire = bytes::BytesMut::new();
        other
            .encode(Bytes::from(vec![2; 500 << 10]), &mut wire)
            .unwrap();
        let got = other.decode(&mut wire).unwrap().expect("whole");
        assert_eq!(got.len(), 500 << 10);
        assert_eq!(budget.used(), 300 << 10, "given back once whole");
        // Past the bound: the connection ends.
        src.extend_from_slice(&[1; 800 << 10]);
        let e = codec.decode(&mut src).unwrap_err();
        assert!(e.to_string().contains("max_peer_receive_bytes"), "{e}");
        drop(codec);
        assert_eq!(budget.used(), 0, "given back when the connection ends");
        // Over the frame limit: refused at its header.
        let mut small = PeerCodec::new(1000, None);
        let mut src = bytes::BytesMut::from(&1001u32.to_be_bytes()[..]);
        assert!(small.decode(&mut src).is_err());
    }

    /// The Welcome says the server's election timeout; nodes of earlier
    /// releases, which send none, are still read (the value unknown), and
    /// they read this release's Welcome (postcard leaves the trailing
    /// field unread).
    #[test]
    fn a_welcome_says_the_election_timeout_and_earlier_releases_still_understand_each_other() {
        use WelcomeBefore as Before;
        let cluster = Some([7u8; 16]);
        let old = postcard::to_allocvec(&Before::Ok {
            cluster,
            node: 2,
            client_addr: "127.0.0.1:7002".into(),
            incarnation: 9,
            mac: [3; 32],
        })
        .unwrap();
        match Welcome::decode(&old).unwrap() {
            Welcome::Ok {
                cluster: c,
                node: 2,
                client_addr,
                incarnation: 9,
                mac,
                election_timeout_ms: 0,
            } => {
                assert_eq!(c, cluster);
                assert_eq!(client_addr, "127.0.0.1:7002");
                assert_eq!(mac, [3; 32]);
            }
            other => panic!("an earlier release's Welcome read as {other:?}"),
        }
        for (before, now) in [
            (Before::Refused("no".into()), "Refused(\"no\")"),
            (Before::Removed("gone".into()), "Removed(\"gone\")"),
        ] {
            let w = Welcome::decode(&postcard::to_allocvec(&before).unwrap()).unwrap();
            assert_eq!(format!("{w:?}"), now);
        }
        let new = postcard::to_allocvec(&Welcome::Ok {
            cluster,
            node: 2,
            client_addr: "127.0.0.1:7002".into(),
            incarnation: 9,
            mac: [3; 32],
            election_timeout_ms: 3000,
        })
        .unwrap();
        assert!(matches!(
            Welcome::decode(&new).unwrap(),
            Welcome::Ok {
                election_timeout_ms: 3000,
                ..
            }
        ));
        // What an earlier release reads of it.
        let read: WelcomeBefore = postcard::from_bytes(&new).unwrap();
        assert!(
            matches!(
                read,
                WelcomeBefore::Ok {
                    node: 2,
                    incarnation: 9,
                    ..
                }
            ),
            "{read:?}"
        );
    }

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "idem-peer-{name}-{}-{}",
                std::process::id(),
                cluster_hex(&random16())
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A peer announcing long frames and sending them slowly, on many
    /// connections, made the node hold each (+307 MB per 300 MiB sent, 3.3
    /// GB over eight connections): what is received of frames now counts
    /// against one bound (a header alone counts nothing), and a frame
    /// whose bytes would pass it ends its connection; what was counted is
    /// given back when a frame is whole or its connection ends, and small
    /// frames are never refused.
    #[tokio::test]
    async fn frames_being_received_are_bounded_over_all_connections() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const KIB: usize = 1 << 10;
        let dir = Dir::new("budget");
        let c = random16();
        let limits = PeerLimits {
            max_receive_bytes: 1024 * KIB,
            ..PeerLimits::default()
        };
        let (p2, a2) = node_limited(&dir, 2, None, Some(c), limits).await;
        let me = member_of(&dir, "me", c);
        let client = PeerClient::new(Arc::clone(&me), 2, a2.clone());
        // A frame of 700 KiB announced, `sent` KiB of it sent.
        let start = |mut conn: Conn, sent: usize| async move {
            let s = conn.get_mut();
            s.write_all(&(700 * KIB as u32).to_be_bytes())
                .await
                .unwrap();
            s.write_all(&vec![0u8; sent * KIB]).await.unwrap();
            conn
        };
        // What is counted: the room allocated for what arrived, between
        // what arrived and the frame's length (the room grows fourfold, as
        // reads bring the bytes).
        let counted = async |lo: usize, hi: usize| {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let used = p2.receiving.used();
                if (lo..=hi).contains(&used) {
                    return used;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{used} bytes counted, not {lo}..={hi}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let _announced = start(client.connect().await.unwrap(), 0).await;
        let first = start(client.connect().await.unwrap(), 600).await;
        let held = counted(600 * KIB, 700 * KIB).await;
        // Another's would pass the bound: its connection ends.
        let mut second = start(client.connect().await.unwrap(), 500).await;
        let mut buf = [0u8; 64];
        let end = tokio::time::timeout(Duration::from_secs(5), second.get_mut().read(&mut buf))
            .await
            .expect("the connection over the bound was not closed");
        assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
        counted(held, held).await;
        // Small frames still pass.
        assert!(
            PeerClient::new(Arc::clone(&me), 2, a2.clone())
                .probe()
                .await
                .is_ok()
        );
        // The first connection ends: what it held is given back, and as
        // much fits again.
        drop(first);
        counted(0, 0).await;
        let _third = start(client.connect().await.unwrap(), 600).await;
        counted(600 * KIB, 700 * KIB).await;
    }

    #[tokio::test]
    async fn snapshot_chunks_must_follow_what_was_received() {
        let dir = Dir::new("chunks");
        let (p, _) = node(&dir, 1, None, None).await;
        // A chunk past the start of a snapshot never begun: the sender is
        // told to start over.
        let e = p.check_snapshot_chunk("s1", 1 << 40).unwrap_err();
        assert_eq!((e.expect.offset, e.got.offset), (0, 1 << 40));
        // A start is always let through; what openraft took counts.
        assert!(p.check_snapshot_chunk("s1", 0).is_ok());
        assert!(
            p.check_snapshot_chunk("s1", 100).is_err(),
            "the start was not taken yet"
        );
        p.snapshot_chunk_taken("s1", 0, 100);
        assert!(p.check_snapshot_chunk("s1", 100).is_ok());
        p.snapshot_chunk_taken("s1", 100, 100);
        // A chunk sent again (its answer was lost) is fine.
        assert!(p.check_snapshot_chunk("s1", 100).is_ok());
        // A gap, or another snapshot's chunk past its start: refused.
        assert!(p.check_snapshot_chunk("s1", 1 << 40).is_err());
        assert!(p.check_snapshot_chunk("s2", 200).is_err());
        assert!(p.check_snapshot_chunk("s1", 200).is_ok());
        // A new snapshot taken starts over.
        p.snapshot_chunk_taken("s2", 0, 10);
        assert!(p.check_snapshot_chunk("s1", 200).is_err());
        assert!(p.check_snapshot_chunk("s2", 10).is_ok());
    }

    /// A node `id` serving the peer protocol (no Raft behind it: probes
    /// only), with `secret` and `cluster`.
    async fn node(
        dir: &Dir,
        id: NodeId,
        secret: Option<&str>,
        cluster: Option<ClusterId>,
    ) -> (Arc<Peers>, String) {
        node_limited(dir, id, secret, cluster, PeerLimits::default()).await
    }

    /// [`node`] with `limits`.
    async fn node_limited(
        dir: &Dir,
        id: NodeId,
        secret: Option<&str>,
        cluster: Option<ClusterId>,
        limits: PeerLimits,
    ) -> (Arc<Peers>, String) {
        let d = dir.0.join(format!("n{id}"));
        std::fs::create_dir_all(&d).unwrap();
        let peers = Peers::new(
            id,
            format!("127.0.0.1:{}", 7000 + id),
            secret.map(|s| s.as_bytes().to_vec()),
            d,
            Arc::new(TcpDialer),
            limits,
        )
        .unwrap();
        if let Some(c) = cluster {
            peers.set_cluster(c).unwrap();
        }
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(serve(l, Arc::clone(&peers), None));
        (peers, addr)
    }

    /// A pipe and the far end of its connection, which the test plays.
    fn pipe_to_fake_peer(dir: &Dir) -> (Arc<Peers>, mpsc::Sender<Piped>, Conn) {
        let peers = Peers::new(
            1,
            "127.0.0.1:7001".into(),
            None,
            dir.0.clone(),
            Arc::new(TcpDialer),
            PeerLimits::default(),
        )
        .unwrap();
        let (near, far) = tokio::io::duplex(1 << 16);
        let conn: Conn = Framed::new(Box::new(near), PeerCodec::new(MAX_FRAME, None));
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        tokio::spawn(run_pipe(conn, rx, Arc::clone(&peers)));
        let far: Conn = Framed::new(Box::new(far), PeerCodec::new(MAX_FRAME, None));
        (peers, tx, far)
    }

    fn piped(
        n: u8,
        within: Duration,
    ) -> (
        Piped,
        tokio::sync::oneshot::Receiver<std::io::Result<Response>>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let p = Piped {
            bytes: Bytes::from(vec![n]),
            entries: true,
            deadline: tokio::time::Instant::now() + within,
            answer: tx,
        };
        (p, rx)
    }

    #[tokio::test]
    async fn a_pipe_sends_without_waiting_and_gives_each_answer_to_its_request() {
        let dir = Dir::new("pipe-order");
        let (peers, pipe, mut far) = pipe_to_fake_peer(&dir);
        let mut answers = Vec::new();
        for n in 1..=3 {
            let (p, rx) = piped(n, Duration::from_secs(30));
            pipe.try_send(p).unwrap();
            answers.push(rx);
        }
        // All three arrive before any is answered.
        for n in 1..=3u8 {
            let frame = far.next().await.unwrap().unwrap();
            assert_eq!(&frame[..], &[n]);
        }
        for n in 1..=3 {
            send(&mut far, &Response::Failed(format!("answer {n}")))
                .await
                .unwrap();
        }
        for (n, rx) in (1..=3).zip(answers) {
            match rx.await.unwrap().unwrap() {
                Response::Failed(got) => assert_eq!(got, format!("answer {n}")),
                _ => panic!("not the answer sent"),
            }
        }
        // The second and third went while the first was unanswered.
        assert_eq!(peers.appends_pipelined(), 2);
        assert!(!pipe.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pipe_whose_oldest_request_is_not_answered_in_time_fails_them_all_and_ends() {
        let dir = Dir::new("pipe-timeout");
        let (_peers, pipe, mut far) = pipe_to_fake_peer(&dir);
        let (p1, rx1) = piped(1, Duration::from_millis(100));
        let (p2, rx2) = piped(2, Duration::from_secs(30));
        pipe.try_send(p1).unwrap();
        pipe.try_send(p2).unwrap();
        assert_eq!(&far.next().await.unwrap().unwrap()[..], &[1]);
        assert_eq!(&far.next().await.unwrap().unwrap()[..], &[2]);
        tokio::time::sleep(Duration::from_millis(150)).await;
        for rx in [rx1, rx2] {
            let Err(e) = rx.await.unwrap() else {
                panic!("answered in spite of the timeout")
            };
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        }
        // The pipe is gone: its client opens another connection.
        pipe.closed().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_pipe_whose_peer_stops_reading_fails_by_the_deadline_and_ends() {
        let dir = Dir::new("pipe-stuck");
        let (_peers, pipe, _far) = pipe_to_fake_peer(&dir);
        // Far more than the connection buffers, and nobody reads it.
        let (tx, rx) = tokio::sync::oneshot::channel();
        pipe.try_send(Piped {
            bytes: Bytes::from(vec![0u8; 4 << 20]),
            entries: true,
            deadline: tokio::time::Instant::now() + Duration::from_millis(100),
            answer: tx,
        })
        .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("the pipe is still stuck writing past the deadline");
        let Err(e) = got.unwrap() else {
            panic!("answered though nothing was read")
        };
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        pipe.closed().await;
    }

    #[tokio::test]
    async fn a_pipe_whose_peer_closes_fails_what_is_unanswered() {
        let dir = Dir::new("pipe-closed");
        let (_peers, pipe, mut far) = pipe_to_fake_peer(&dir);
        let (p1, rx1) = piped(1, Duration::from_secs(30));
        let (p2, rx2) = piped(2, Duration::from_secs(30));
        pipe.try_send(p1).unwrap();
        pipe.try_send(p2).unwrap();
        assert_eq!(&far.next().await.unwrap().unwrap()[..], &[1]);
        send(&mut far, &Response::Failed("one".into()))
            .await
            .unwrap();
        drop(far);
        assert!(matches!(rx1.await.unwrap(), Ok(Response::Failed(_))));
        let Err(e) = rx2.await.unwrap() else {
            panic!("answered though the peer closed")
        };
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        pipe.closed().await;
    }

    #[tokio::test]
    async fn the_handshake_checks_secret_cluster_and_node_id() {
        let dir = Dir::new("handshake");
        let c1 = random16();
        let (p2, a2) = node(&dir, 2, Some("0123456789abcdef-secret"), Some(c1)).await;
        let me = |secret: Option<&str>, cluster: Option<ClusterId>| {
            let d = dir.0.join(format!("me-{}", cluster_hex(&random16())));
            std::fs::create_dir_all(&d).unwrap();
            let p = Peers::new(
                1,
                "127.0.0.1:7001".into(),
                secret.map(|s| s.as_bytes().to_vec()),
                d,
                Arc::new(TcpDialer),
                PeerLimits::default(),
            )
            .unwrap();
            if let Some(c) = cluster {
                p.set_cluster(c).unwrap();
            }
            p
        };
        // The right secret, the right node, the same cluster: answered,
        // and the client address learned.
        let good = me(Some("0123456789abcdef-secret"), Some(c1));
        let info = PeerClient::new(Arc::clone(&good), 2, a2.clone())
            .probe()
            .await
            .unwrap();
        assert_eq!(info.client_addr, "127.0.0.1:7002");
        assert_eq!(info.cluster, Some(c1));
        assert_eq!(good.advertised(2).as_deref(), Some("127.0.0.1:7002"));
        // The other way, a connecting node's client address is taken only
        // from a member (node 2 has no membership here): a handshake alone
        // cannot redirect node 2's clients.
        assert_eq!(p2.advertised(1), None);
        // A fresh node (no cluster yet) may probe.
        let fresh = me(Some("0123456789abcdef-secret"), None);
        assert!(PeerClient::new(fresh, 2, a2.clone()).probe().await.is_ok());
        // A wrong or missing secret, another cluster, or the wrong node id
        // at that address: refused.
        for (who, peers, target) in [
            ("wrong secret", me(Some("another-secret-0000"), Some(c1)), 2),
            ("no secret", me(None, Some(c1)), 2),
            (
                "other cluster",
                me(Some("0123456789abcdef-secret"), Some(random16())),
                2,
            ),
            (
                "wrong node",
                me(Some("0123456789abcdef-secret"), Some(c1)),
                3,
            ),
        ] {
            let r = PeerClient::new(peers, target, a2.clone()).probe().await;
            assert!(r.is_err(), "{who}: {r:?}");
        }
        // A client that holds the secret refuses a server that does not.
        let (_, open) = node(&dir, 4, None, Some(c1)).await;
        let r = PeerClient::new(me(Some("0123456789abcdef-secret"), Some(c1)), 4, open)
            .probe()
            .await;
        assert!(r.is_err(), "a server without the secret was trusted: {r:?}");
    }

    #[tokio::test]
    async fn garbage_and_oversized_handshakes_are_dropped() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = Dir::new("garbage");
        let (peers, addr) = node(&dir, 2, None, None).await;
        // A frame header announcing 1 GiB before the handshake.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut closed = false;
        for _ in 0..10 {
            match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                Ok(Ok(_)) => continue,
                Err(_) => break,
            }
        }
        assert!(closed, "the oversized frame was not refused");
        // Junk bytes: the connection ends, the server keeps serving.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&[0, 0, 0, 5, 1, 2, 3, 4, 5]).await.unwrap();
        drop(s);
        let d = dir.0.join("prober");
        std::fs::create_dir_all(&d).unwrap();
        let me = Peers::new(
            1,
            String::new(),
            None,
            d,
            Arc::new(TcpDialer),
            PeerLimits::default(),
        )
        .unwrap();
        assert!(PeerClient::new(me, 2, addr).probe().await.is_ok());
        drop(peers);
    }

    /// Node 1 of cluster `c`, no secret, its data under `dir`/`name`: a
    /// client of the node the test serves.
    fn member_of(dir: &Dir, name: &str, c: ClusterId) -> Arc<Peers> {
        let d = dir.0.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let me = Peers::new(
            1,
            "127.0.0.1:7001".into(),
            None,
            d,
            Arc::new(TcpDialer),
            PeerLimits::default(),
        )
        .unwrap();
        me.set_cluster(c).unwrap();
        me
    }

    fn append(term: u64, leader: NodeId, entry_terms: &[u64]) -> Request {
        Request::Append(AppendEntriesRequest {
            vote: openraft::Vote::new_committed(term, leader),
            prev_log_id: None,
            entries: entry_terms
                .iter()
                .enumerate()
                .map(|(i, t)| openraft::Entry {
                    log_id: openraft::LogId::new(
                        openraft::CommittedLeaderId::new(*t, leader),
                        i as u64,
                    ),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        })
    }

    #[test]
    fn requests_no_member_sends_are_told_apart() {
        assert_eq!(implausible(&append(5, 2, &[3, 5]), 2), None);
        assert_eq!(implausible(&Request::Probe, 9), None);
        let huge = implausible(&append(u64::MAX, 2, &[]), 2).unwrap();
        assert!(huge.contains("past the largest"), "{huge}");
        assert!(implausible(&append(MAX_TERM, 2, &[]), 2).is_some());
        assert!(implausible(&append(MAX_TERM - 1, 2, &[]), 2).is_none());
        assert!(implausible(&append(1 << 62, 2, &[]), 2).is_none());
        let other = implausible(&append(5, 3, &[]), 2).unwrap();
        assert!(
            other.contains("a vote for node 3 sent by node 2"),
            "{other}"
        );
        let later = implausible(&append(5, 2, &[5, 6]), 2).unwrap();
        assert!(later.contains("later term"), "{later}");
        // Entries that do not follow each other, or do not decode.
        let entries = |prev: Option<(u64, u64)>, ids: &[(u64, u64)], batch: Option<Vec<u8>>| {
            let id = |(t, i): (u64, u64)| {
                openraft::LogId::new(openraft::CommittedLeaderId::new(t, 2), i)
            };
            implausible(
                &Request::Append(AppendEntriesRequest {
                    vote: openraft::Vote::new_committed(5, 2),
                    prev_log_id: prev.map(id),
                    entries: ids
                        .iter()
                        .map(|&l| openraft::Entry {
                            log_id: id(l),
                            payload: match &batch {
                                Some(b) => openraft::EntryPayload::Normal(
                                    // (postcard writes bytes as it writes a
                                    // sequence of u8.)
                                    decode_sharing(&Bytes::from(postcard::to_allocvec(b).unwrap()))
                                        .unwrap(),
                                ),
                                None => openraft::EntryPayload::Blank,
                            },
                        })
                        .collect(),
                    leader_commit: None,
                }),
                2,
            )
        };
        assert_eq!(entries(Some((1, 3)), &[(2, 4), (2, 5), (5, 6)], None), None);
        assert_eq!(entries(None, &[(1, 0), (1, 1)], None), None);
        let gap = entries(Some((1, 3)), &[(2, 8)], None).unwrap();
        assert!(gap.contains("where index 4 comes next"), "{gap}");
        let back = entries(Some((1, 3)), &[(2, 4), (2, 20), (2, 15)], None).unwrap();
        assert!(back.contains("where index 5 comes next"), "{back}");
        assert!(entries(None, &[(1, 1)], None).is_some());
        let earlier = entries(Some((3, 3)), &[(2, 4)], None).unwrap();
        assert!(earlier.contains("of a later term"), "{earlier}");
        let earlier = entries(Some((1, 3)), &[(3, 4), (2, 5)], None).unwrap();
        assert!(earlier.contains("of a later term"), "{earlier}");
        let mut good = Vec::new();
        crate::store::codec::encode_entry(
            &crate::store::Entry {
                stamp_ms: 1,
                ops: vec![],
            },
            &mut good,
        );
        assert_eq!(entries(Some((1, 3)), &[(2, 4)], Some(good.clone())), None);
        // A header this build reads, and a body cut short.
        let mut bad = good.clone();
        bad.truncate(good.len() - 1);
        let cut = entries(Some((1, 3)), &[(2, 4)], Some(bad)).unwrap();
        assert!(cut.contains("malformed entry"), "{cut}");
        let mut bad = good;
        bad.extend_from_slice(&[1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(entries(Some((1, 3)), &[(2, 4)], Some(bad)).is_some());
        let Request::Append(mut r) = append(5, 2, &[]) else {
            unreachable!()
        };
        r.vote = openraft::Vote::new(5, 2);
        let uncommitted = implausible(&Request::Append(r), 2).unwrap();
        assert!(uncommitted.contains("uncommitted vote"), "{uncommitted}");
        let vote = |term, last: Option<u64>| {
            Request::Vote(VoteRequest {
                vote: openraft::Vote::new(term, 4),
                last_log_id: last
                    .map(|t| openraft::LogId::new(openraft::CommittedLeaderId::new(t, 1), 10)),
            })
        };
        assert_eq!(implausible(&vote(7, Some(6)), 4), None);
        assert!(implausible(&vote(7, Some(8)), 4).is_some());
        assert!(implausible(&vote(u64::MAX - 1, None), 4).is_some());
        // Answers: a vote past MAX_TERM is not believed.
        let answer = |term| {
            Response::Vote(Ok(VoteResponse {
                vote: openraft::Vote::new(term, 4),
                vote_granted: false,
                last_log_id: None,
            }))
        };
        assert!(plausible(&answer(12)));
        assert!(!plausible(&answer(u64::MAX)));
        assert!(!plausible(&Response::Append(Ok(
            AppendEntriesResponse::HigherVote(openraft::Vote::new_committed(MAX_TERM, 4))
        ))));
    }

    /// A peer that completes the handshake (no secret: loopback) and sends
    /// an AppendEntries of term u64::MAX: the request never reaches Raft
    /// (the next election would have no term to take, and openraft
    /// panicked), the connection ends, and the node goes on serving.
    #[tokio::test]
    async fn a_request_with_a_term_past_max_term_ends_its_connection() {
        let dir = Dir::new("term");
        let c = random16();
        let (_p2, a2) = node(&dir, 2, None, Some(c)).await;
        let me = member_of(&dir, "me", c);
        let mut client = PeerClient::new(Arc::clone(&me), 2, a2.clone());
        match client
            .call(append(u64::MAX, 1, &[]), Duration::from_secs(5))
            .await
        {
            Ok(Response::Failed(why)) => assert!(why.contains("past the largest"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Another node's vote: refused too.
        let mut client = PeerClient::new(Arc::clone(&me), 2, a2.clone());
        match client.call(append(3, 7, &[]), Duration::from_secs(5)).await {
            Ok(Response::Failed(why)) => assert!(why.contains("sent by node 1"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(PeerClient::new(me, 2, a2).probe().await.is_ok());
    }

    /// Connections from one address that never complete the handshake do
    /// not keep a member at that address out: once the address has
    /// `max_peer_handshakes_per_source` of them, each new one closes the
    /// oldest; and once every place is taken, the oldest of all.
    #[tokio::test]
    async fn connections_stuck_in_their_handshake_make_room_for_newer_ones() {
        use tokio::io::AsyncReadExt;
        let dir = Dir::new("evict");
        let c = random16();
        let limits = PeerLimits {
            max_connections: 12,
            max_handshakes_per_source: 4,
            ..PeerLimits::default()
        };
        let (_p2, a2) = node_limited(&dir, 2, None, Some(c), limits).await;
        let a2: SocketAddr = a2.parse().unwrap();
        let stuck = |src: &'static str| async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(src.parse().unwrap()).unwrap();
            socket.connect(a2).await.unwrap()
        };
        // Closed: read returns 0 (after the challenge) or an error.
        async fn closed_soon(s: &mut TcpStream) -> bool {
            let mut buf = [0u8; 256];
            let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
            loop {
                match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return true,
                    Ok(Ok(_)) => continue,
                    Err(_) => return false,
                }
            }
        }
        let mut first = Vec::new();
        for _ in 0..4 {
            first.push(stuck("127.0.0.1:0").await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A fifth from the same address closes the oldest.
        let _fifth = stuck("127.0.0.1:0").await;
        assert!(closed_soon(&mut first[0]).await, "the oldest was kept");
        assert!(!closed_soon(&mut first[1]).await, "a newer one was closed");
        // A member at that address still gets through, and is answered
        // (each probe from a node of its own: a pooled connection would
        // not be let in again).
        let member = |name: &str| member_of(&dir, name, c);
        assert!(
            PeerClient::new(member("me1"), 2, a2.to_string())
                .probe()
                .await
                .is_ok()
        );
        // Every place taken (12 in all: the four still in their handshake
        // from 127.0.0.1 and four each from 127.0.0.2 and .3): a new
        // connection closes the oldest still in its handshake of all, and
        // a member gets through.
        let mut others = Vec::new();
        for src in ["127.0.0.2:0", "127.0.0.3:0"] {
            for _ in 0..4 {
                others.push(stuck(src).await);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            PeerClient::new(member("me2"), 2, a2.to_string())
                .probe()
                .await
                .is_ok(),
            "a member was kept out by connections stuck in their handshake"
        );
        assert!(
            closed_soon(&mut first[1]).await,
            "the oldest of all was kept"
        );
        assert!(!closed_soon(&mut others[7]).await, "the newest was closed");
    }
}
