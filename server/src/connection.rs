//! One client connection: decode requests, dispatch them in order, write
//! replies in the same order.
//!
//! Requests are decoded and submitted while earlier replies are still
//! pending (a write going through a replicated log takes a round trip):
//! their replies wait in a FIFO, at most `max_pending_per_connection` of
//! them, and go out strictly in request order; when the FIFO is full the
//! connection stops reading. A request that may WAIT holds back the
//! execution of later requests on this connection only, as Redis blocking
//! commands do; while it is parked the connection still reads ahead (up to
//! a bound) to notice the client leaving.
//!
//! Reading and writing proceed together, so a client that pipelines
//! without reading does not deadlock against the server; replies it does
//! not read accumulate up to `max_output_buffer_bytes`, and past that the
//! client is disconnected.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use idem_protocol::out::MAX_SLICES;
use idem_protocol::{
    Command, CommandError, CommandId, Decoder, ErrorCode, Flags, FrameError, OutBuf, Reply,
    ServerError, Version,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::clients::{Accounted, ClientInfo};
use crate::cmdstats::CmdStats;
use crate::dispatch::{Action, Later, dispatch};
use crate::metrics::bump;
use crate::node::Node;
use crate::session::Session;

/// Bytes read ahead while a request is parked (to notice a disconnect).
const PARKED_READ_AHEAD: usize = 64 * 1024;
/// Reply bytes a connection may add before counting them against the
/// server-wide client budget (it counts at least once per turn as well).
const ACCOUNT_STEP: u64 = 64 * 1024;
/// How long a connection that would grow past the client budget waits for
/// evicted clients' connections to close, at most.
const ROOM_WAIT: Duration = Duration::from_secs(1);
/// How long owed replies may take to go out when the connection closes.
const CLOSE_FLUSH: Duration = Duration::from_secs(5);
/// How long replies already made may take to go out when `CLIENT KILL`
/// closes the connection.
const KILL_FLUSH: Duration = Duration::from_secs(1);

/// Serves a connection until it closes, the client leaves, or shutdown.
pub async fn serve(node: Node, socket: TcpStream, addr: SocketAddr, stop: watch::Receiver<bool>) {
    let laddr = socket.local_addr().unwrap_or(node.local_addr());
    let info = node.clients().register(addr, laddr);
    let id = info.id;
    let session = Session::new(&node, info);
    if let Err(e) = socket.set_nodelay(true) {
        debug!(client = id, error = %e, "cannot set TCP_NODELAY");
    }
    let result = run(
        &node,
        &mut TcpRead {
            socket: &socket,
            unsignalled: false,
        },
        &mut TcpWrite(&socket),
        session,
        stop,
    )
    .await;
    if let Err(e) = result {
        debug!(client = id, error = %e, "connection ended with an error");
    }
    node.clients().unregister(id);
}

/// Serves a TLS connection (handshake done) as [`serve`] does; with
/// `tls_auth_clients_user = CN`, a client certificate whose CN names an
/// ACL user that is on logs the connection in as that user.
pub async fn serve_tls(
    node: Node,
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    addr: SocketAddr,
    laddr: SocketAddr,
    stop: watch::Receiver<bool>,
) {
    let info = node.clients().register(addr, laddr);
    let id = info.id;
    let mut session = Session::new(&node, info);
    session.tls = true;
    let by_cn = node
        .config()
        .tls
        .as_ref()
        .is_some_and(|t| t.settings().auth_clients_user_cn);
    if by_cn
        && let Some(cn) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| crate::tls::common_name(c))
    {
        let epoch = node.acl_epoch();
        if let Some(user) = node.acl().user(&cn).filter(|u| u.enabled()) {
            session.log_in(std::sync::Arc::clone(user), epoch);
        }
    }
    let (r, w) = tokio::io::split(stream);
    let mut writer = StreamWrite {
        inner: w,
        dirty: false,
    };
    let result = run(&node, &mut StreamRead(r), &mut writer, session, stop).await;
    if let Err(e) = result {
        debug!(client = id, error = %e, "connection ended with an error");
    }
    node.clients().unregister(id);
}

/// A reply owed, in request order.
enum Owed {
    /// Known, waiting for earlier ones.
    Ready(Reply),
    /// Not known yet.
    Later(Later),
    /// A request that may WAIT: later requests run after it.
    Blocking(Later),
    /// A read not known yet (a follower's linearizable read): later
    /// requests run meanwhile, and later reads are not held behind it.
    Read(Later),
}

/// When a request whose reply comes later was dispatched, and which
/// command it is (for its statistics, counted once the reply is known).
#[derive(Debug, Clone, Copy)]
struct Started {
    id: CommandId,
    at: std::time::Instant,
}

/// The replies owed, in request order, each with the protocol version in
/// force when its request was read (a later HELLO does not change it).
#[derive(Default)]
struct Pending {
    /// Each with the size of its request while its reply is not known.
    queue: VecDeque<(Owed, Version, Option<Started>, usize)>,
    /// The memory of the known replies waiting in `queue`
    /// ([`Reply::memory`]): counted as the client's, as its output is.
    ready_bytes: usize,
    /// The size of the requests whose replies are not known yet (a write
    /// on its way through the log holds its request, a value of up to
    /// `max_value_bytes` included): counted as the client's too.
    later_bytes: usize,
    /// A blocking request is in the queue.
    blocked: bool,
    /// Entries whose reply is not known yet (`Later`, `Blocking` or
    /// `Read`).
    unknown: usize,
    /// Of those, the reads.
    unknown_reads: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    /// Adds a reply that is known now: straight out if nothing is owed
    /// before it.
    fn reply(&mut self, out: &mut OutBuf, version: Version, reply: Reply) {
        if self.queue.is_empty() {
            out.push_reply(version, &reply);
        } else {
            self.ready_bytes += reply.memory();
            self.queue.push_back((Owed::Ready(reply), version, None, 0));
        }
    }

    /// The memory of the known replies waiting behind one not known yet.
    fn ready_bytes(&self) -> usize {
        self.ready_bytes
    }

    /// The size of the requests whose replies are not known yet.
    fn later_bytes(&self) -> usize {
        self.later_bytes
    }

    /// The reply at the front, once it is known (counted in `stats`).
    fn poll_front(
        &mut self,
        cx: &mut std::task::Context<'_>,
        stats: &CmdStats,
    ) -> Poll<(Reply, Version)> {
        let ready = match self.queue.front_mut() {
            None => return Poll::Pending,
            Some((Owed::Ready(_), _, _, _)) => true,
            Some((Owed::Later(f) | Owed::Blocking(f) | Owed::Read(f), v, started, _)) => {
                match f.as_mut().poll(cx) {
                    Poll::Ready(r) => {
                        let v = *v;
                        if let Some(s) = started {
                            stats.record(s.id, s.at.elapsed(), &r);
                        }
                        self.unknown -= 1;
                        if let Some((owed, _, _, request)) = self.queue.pop_front() {
                            self.later_bytes -= request;
                            match owed {
                                Owed::Blocking(_) => self.blocked = false,
                                Owed::Read(_) => self.unknown_reads -= 1,
                                _ => {}
                            }
                        }
                        return Poll::Ready((r, v));
                    }
                    Poll::Pending => false,
                }
            }
        };
        if !ready {
            return Poll::Pending;
        }
        match self.queue.pop_front() {
            Some((Owed::Ready(r), v, _, _)) => {
                self.ready_bytes = self.ready_bytes.saturating_sub(r.memory());
                Poll::Ready((r, v))
            }
            _ => Poll::Pending,
        }
    }

    /// Every reply at the front that is known now, in order (at least one,
    /// or pending): all of them go out with one write.
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
        ready: &mut Vec<(Reply, Version)>,
        stats: &CmdStats,
    ) -> Poll<()> {
        while let Poll::Ready(r) = self.poll_front(cx, stats) {
            ready.push(r);
        }
        if ready.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Whether a reply not yet known is owed (a write still in the log).
    fn awaits_write(&self) -> bool {
        self.unknown > self.unknown_reads
    }

    /// Whether `cmd` must wait before it runs: a plain read for this
    /// connection's earlier writes (so it sees them), anything else for
    /// its earlier follower reads (so it does not overtake them: a write
    /// sent after a read on a follower that had since become the leader
    /// was applied before the read, which then showed it).
    fn must_wait(&self, cmd: &Command) -> bool {
        // Nothing owed (most commands): the command table is not read.
        self.unknown > 0
            && if is_plain_read(cmd) {
                self.awaits_write()
            } else {
                self.unknown_reads > 0
            }
    }

    /// Adds a reply that comes later, for a request of `request` bytes
    /// dispatched as `started` says.
    fn later(&mut self, owed: Owed, version: Version, started: Option<Started>, request: usize) {
        match owed {
            Owed::Blocking(_) => self.blocked = true,
            Owed::Read(_) => self.unknown_reads += 1,
            _ => {}
        }
        self.unknown += 1;
        self.later_bytes += request;
        self.queue.push_back((owed, version, started, request));
    }

    /// Answers blocking requests with `reply` at once (shutdown).
    fn unblock_with(&mut self, reply: &Reply, stats: &CmdStats) {
        for (owed, _, started, request) in &mut self.queue {
            if matches!(owed, Owed::Blocking(_)) {
                self.later_bytes -= std::mem::take(request);
                self.ready_bytes += reply.memory();
                *owed = Owed::Ready(reply.clone());
                if let Some(s) = started.take() {
                    stats.record(s.id, s.at.elapsed(), reply);
                }
                self.unknown -= 1;
            }
        }
        self.blocked = false;
    }

    /// Lets go of the queue's memory once it is empty and has grown past
    /// what a short pipeline needs: a connection that once pipelined a
    /// thousand requests does not keep room for a thousand while idle.
    fn release_if_empty(&mut self) {
        if self.queue.is_empty() && self.queue.capacity() > SHORT_PIPELINE {
            self.queue.shrink_to(SHORT_PIPELINE);
        }
    }

    /// Withdraws blocking requests (the client left).
    fn withdraw_blocking(&mut self) {
        let before = self.queue.len();
        let mut freed = 0;
        self.queue.retain(|(o, _, _, request)| {
            let keep = !matches!(o, Owed::Blocking(_));
            if !keep {
                freed += request;
            }
            keep
        });
        self.later_bytes -= freed;
        self.unknown -= before - self.queue.len();
        self.blocked = false;
    }
}

/// Counts a reply known at dispatch (`started` is `None` for a request
/// that did not parse, counted as it was refused), and says when.
fn record(stats: &CmdStats, started: Option<Started>, reply: &Reply) -> Option<std::time::Instant> {
    let s = started?;
    let now = std::time::Instant::now();
    stats.record(s.id, now.saturating_duration_since(s.at), reply);
    Some(now)
}

/// A command that may be answered from the store without the log (a read,
/// or a wait, which looks first): it must see this connection's earlier
/// writes, so it runs only once they are applied.
fn is_plain_read(cmd: &Command) -> bool {
    cmd.spec().flags.contains(Flags::READ)
        || matches!(cmd, Command::Claim(c) if c.wait_ms.unwrap_or(0) > 0)
}

async fn idle(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Replies owed that a connection keeps room for while it has none (more
/// is allocated while a longer pipeline is in flight, and let go after).
const SHORT_PIPELINE: usize = 64;

/// Bytes of the per-thread buffer sockets are read into.
const SCRATCH: usize = 64 * 1024;

/// What the per-thread read buffer reserves: more than the allocator's
/// largest size class whose pages hold several blocks (512 KiB), so the
/// buffer has a page of its own. Only its first [`SCRATCH`] bytes are ever
/// written, so only those become resident. A buffer of exactly `SCRATCH`
/// would share its page with a burst's connection buffers of that size,
/// and keep the whole page (512 KiB) resident after they are freed.
const SCRATCH_RESERVED: usize = 576 * 1024;

thread_local! {
    /// Where every connection of this thread reads into: what arrived is
    /// then copied to the connection's own buffer at its exact size, so an
    /// idle connection holds a small read buffer at most (see
    /// [`KEEP_READ_BUFFER`]).
    static SCRATCH_BUF: std::cell::RefCell<BytesMut> =
        std::cell::RefCell::new(BytesMut::with_capacity(SCRATCH_RESERVED));
}

/// Allocates this thread's read buffer now; call it as a runtime thread
/// starts. Allocated on a thread's first read instead, the buffer may land
/// on memory a burst has just freed, all of it still resident, and keep
/// every page of it resident while the server is idle (576 KiB where 64 KiB
/// are used). On memory never written, only what is read into becomes
/// resident.
pub fn reserve_read_buffer() {
    SCRATCH_BUF.with(|scratch| {
        let _ = scratch.borrow().capacity();
    });
}

/// Counts the memory of `out` against the server-wide client budget, if
/// it changed since `accounted`. False when this client is evicted (it is
/// to close); when others were evicted to make room, lets them close (and
/// free their buffers) before this one adds more.
async fn charge(node: &Node, info: &ClientInfo, accounted: &mut u64, owed: u64) -> bool {
    if owed == *accounted {
        return true;
    }
    let found = node.clients().account(info, *accounted, owed);
    *accounted = owed;
    match found {
        Accounted::Evicted => false,
        Accounted::EvictedOthers | Accounted::Ok => {
            // Adding more while evicted clients still hold what they owed
            // (their turn to close has not come) would grow the server
            // by as much again: their connections close first.
            if node.clients().over_budget() {
                node.clients().room(info, ROOM_WAIT).await;
            }
            !info.evicted.load(std::sync::atomic::Ordering::Relaxed)
        }
    }
}

/// What a connection holds for its client, counted against the
/// server-wide client budget: replies owed, requests read but not run
/// yet (a partly received frame included: a client that sends most of a
/// large frame and stops holds it), and requests whose replies are not
/// known yet (writes on their way through the log: a client that
/// pipelined large writes and never read held each until it was
/// answered, past every byte limit).
fn client_bytes(out: &OutBuf, inbuf: &BytesMut, pending: &Pending) -> u64 {
    (out.memory() + read_buffer_bytes(inbuf) + pending.ready_bytes() + pending.later_bytes()) as u64
}

/// What a read buffer holds: its bytes, or the room it has grown to
/// beyond what every connection keeps ([`KEEP_READ_BUFFER`]), whichever
/// is more. A partly received frame grows the buffer by doubling: 400
/// clients each holding most of a 1 MiB frame took 83 MB with 31 MB
/// counted.
fn read_buffer_bytes(inbuf: &BytesMut) -> usize {
    inbuf
        .len()
        .max(inbuf.capacity().saturating_sub(KEEP_READ_BUFFER))
}

/// Bytes of an emptied read buffer a connection keeps for its next read,
/// so request and reply traffic does not allocate for every read; larger
/// buffers are let go of once empty.
const KEEP_READ_BUFFER: usize = 4 * 1024;

/// Lets go of the read buffer once it is empty and has been larger than
/// [`KEEP_READ_BUFFER`] (`size`: the largest it has been since it was last
/// let go of): an idle connection then holds a few KB at most, and a long
/// pipeline's buffer does not stay allocated after it was read.
///
/// The size it has been, not the room it has left: the last request read
/// may end exactly at the end of the buffer, which then has no room left
/// but still holds all of it.
fn release_if_empty(buf: &mut BytesMut, size: &mut usize) {
    if buf.is_empty() && *size > KEEP_READ_BUFFER {
        *buf = BytesMut::new();
        *size = 0;
    }
}

/// The reading side of a connection.
trait Reader {
    /// Reads what is there into `buf`, waiting until something is: 0 once
    /// the peer has closed.
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize>;
    /// Waits for news of the peer without reading: `true` once it has
    /// closed (TCP returns nothing else). (TLS cannot look without
    /// reading: it never returns, and a TLS client that leaves while its
    /// read-ahead is full is noticed when its parked request is answered.)
    async fn read_closed(&mut self) -> std::io::Result<bool>;
}

/// The writing side of a connection.
trait Writer {
    /// Writes as much of `out` as goes now (`WouldBlock` when nothing).
    fn try_write_out(&mut self, out: &OutBuf) -> std::io::Result<usize>;
    /// Writes as much of `out` as goes, waiting until some does; with
    /// `out` empty, only pushes out what is buffered (see [`Writer::dirty`]).
    /// Cancel-safe: what it returns is what was taken.
    async fn write_some(&mut self, out: &OutBuf) -> std::io::Result<usize>;
    /// Whether bytes taken are still buffered below (TLS records not yet
    /// on the socket): `write_some` with nothing pushes them.
    fn dirty(&self) -> bool {
        false
    }
    /// Closes the writing side.
    async fn shutdown(&mut self) -> std::io::Result<()>;
}

/// Plain TCP, read through readiness (both sides share the socket).
struct TcpRead<'a> {
    socket: &'a TcpStream,
    /// Bytes may wait in the socket whose readiness was let go of while
    /// the connection was parked (see [`read_closed`]): the next read takes
    /// them without waiting to be told.
    unsignalled: bool,
}
/// Plain TCP, written through readiness.
struct TcpWrite<'a>(&'a TcpStream);

impl Reader for TcpRead<'_> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        if self.unsignalled {
            match read_unsignalled(self.socket, buf) {
                Ok(n) => {
                    // Less than the room given: the socket is drained, and
                    // what arrives from now on is signalled again.
                    self.unsignalled = n == SCRATCH;
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.unsignalled = false,
                Err(e) => return Err(e),
            }
        }
        read_some(self.socket, buf).await
    }

    async fn read_closed(&mut self) -> std::io::Result<bool> {
        read_closed(self.socket, &mut self.unsignalled).await
    }
}

impl Writer for TcpWrite<'_> {
    fn try_write_out(&mut self, out: &OutBuf) -> std::io::Result<usize> {
        try_write_out(self.0, out)
    }

    async fn write_some(&mut self, out: &OutBuf) -> std::io::Result<usize> {
        write_some(self.0, out).await
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        // Shutting down the write side of a shared TcpStream needs no `&mut`.
        rustix::net::shutdown(self.0, rustix::net::Shutdown::Write).map_err(std::io::Error::from)
    }
}

/// Any byte stream (TLS), read through `AsyncRead`.
struct StreamRead<R>(R);
/// Any byte stream (TLS), written through `AsyncWrite`; `dirty` while
/// what it took may still be buffered.
struct StreamWrite<W> {
    inner: W,
    dirty: bool,
}

impl<R: tokio::io::AsyncRead + Unpin> Reader for StreamRead<R> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        use tokio::io::AsyncReadExt;
        buf.reserve(16 * 1024);
        self.0.read_buf(buf).await
    }

    async fn read_closed(&mut self) -> std::io::Result<bool> {
        // A TLS record cannot be looked at without reading it: a client
        // that leaves while its read-ahead is full is noticed when the
        // parked request is answered.
        std::future::pending().await
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> Writer for StreamWrite<W> {
    fn try_write_out(&mut self, _out: &OutBuf) -> std::io::Result<usize> {
        // Every write goes through `write_some`, which keeps track of what
        // is still to be flushed.
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    async fn write_some(&mut self, out: &OutBuf) -> std::io::Result<usize> {
        if self.dirty {
            self.inner.flush().await?;
            self.dirty = false;
        }
        if out.is_empty() {
            return Ok(0);
        }
        // Returns as soon as the bytes are taken: no await point after it,
        // so a cancelled call never loses track of bytes taken.
        let n = poll_fn(|cx| {
            std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, &out_slices(out))
        })
        .await?;
        self.dirty = true;
        Ok(n)
    }

    fn dirty(&self) -> bool {
        self.dirty
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.inner.flush().await?;
        self.inner.shutdown().await
    }
}

/// The slices of `out`, for a vectored write.
fn out_slices(out: &OutBuf) -> Vec<std::io::IoSlice<'_>> {
    if let Some(bytes) = out.as_contiguous() {
        return vec![std::io::IoSlice::new(bytes)];
    }
    let mut slices = [std::io::IoSlice::new(&[]); MAX_SLICES];
    let n = out.slices(&mut slices);
    slices[..n].to_vec()
}

/// Reads what the socket has into `buf` (through the thread's scratch
/// buffer).
///
/// A read that returns less than the room it was given has drained the
/// socket; the readiness it started from is then cleared at once, instead
/// of by a further read that would only return `WouldBlock` (one system
/// call per request saved). The clear uses the readiness observed before
/// the read, so data arriving after it still wakes the connection.
async fn read_some(socket: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    loop {
        socket.readable().await?;
        let mut got = None;
        let result = socket.try_io(Interest::READABLE, || {
            SCRATCH_BUF.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                scratch.clear();
                let n = socket.try_read_buf(&mut (&mut *scratch).limit(SCRATCH))?;
                buf.extend_from_slice(&scratch[..n]);
                got = Some(n);
                if n > 0 && n < SCRATCH {
                    Err(std::io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(n)
                }
            })
        });
        match (result, got) {
            (_, Some(n)) => return Ok(n),
            (Err(e), None) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            (Err(e), None) => return Err(e),
            (Ok(n), None) => return Ok(n),
        }
    }
}

/// Waits, without reading, until the peer has closed (or reset) the
/// socket, then returns `true`.
///
/// Data that waits unread (the client pipelined past the read-ahead) would
/// keep the socket readable and hide the peer's FIN behind it; so its
/// readiness is let go of, and only what arrives next - more data, the FIN
/// or a reset - wakes this again (readiness is edge-triggered), at once and
/// without polling. Data left unread under a cleared readiness is never
/// signalled again: `unsignalled` is set so the read that resumes once the
/// parked request is answered takes it without waiting (it would wait for
/// bytes the client never sends: it waits for its replies). Cancel-safe.
async fn read_closed(socket: &TcpStream, unsignalled: &mut bool) -> std::io::Result<bool> {
    loop {
        let ready = socket.ready(Interest::READABLE).await?;
        if ready.is_read_closed() || ready.is_error() {
            return Ok(true);
        }
        *unsignalled = true;
        let _ = socket.try_io(Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
    }
}

/// Reads what the socket has into `buf` (through the thread's scratch
/// buffer) without asking its readiness, which may have been let go of
/// with data still there (see [`read_closed`]). `WouldBlock` when nothing
/// is there.
fn read_unsignalled(socket: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    SCRATCH_BUF.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        scratch.clear();
        let room = &mut scratch.spare_capacity_mut()[..SCRATCH];
        loop {
            match rustix::net::recv(socket, &mut *room, rustix::net::RecvFlags::empty()) {
                Ok(((got, _), _)) => {
                    buf.extend_from_slice(got);
                    return Ok(got.len());
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    })
}

/// Writes as much of `out` as the socket takes now, with one vectored
/// write (`WouldBlock` when it takes nothing).
fn try_write_out(socket: &TcpStream, out: &OutBuf) -> std::io::Result<usize> {
    if let Some(bytes) = out.as_contiguous() {
        return socket.try_write(bytes);
    }
    let mut slices = [std::io::IoSlice::new(&[]); MAX_SLICES];
    let n = out.slices(&mut slices);
    socket.try_write_vectored(&slices[..n])
}

/// Writes as much of `out` as the socket takes, waiting until it takes
/// some.
async fn write_some(socket: &TcpStream, out: &OutBuf) -> std::io::Result<usize> {
    loop {
        socket.writable().await?;
        match try_write_out(socket, out) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `out`.
async fn write_all(
    writer: &mut impl Writer,
    out: &mut OutBuf,
    stats: &CmdStats,
) -> std::io::Result<()> {
    while !out.is_empty() || writer.dirty() {
        let n = writer.write_some(out).await?;
        if n == 0 && out.is_empty() {
            continue;
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        stats.written(n);
        out.advance(n);
    }
    Ok(())
}

async fn run(
    node: &Node,
    reader: &mut impl Reader,
    writer: &mut impl Writer,
    mut session: Session,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let config = node.config();
    let (limits, limits_unauthenticated) =
        (config.limits.frame, config.limits.frame_unauthenticated);
    let max_out = config.max_output_buffer_bytes;
    let max_pending = config.max_pending_per_connection;
    let write_timeout = (config.client_write_timeout_ms > 0)
        .then(|| Duration::from_millis(config.client_write_timeout_ms));
    let info = std::sync::Arc::clone(&session.info);
    let stats = node.cmdstats();
    // Reply bytes counted against the server-wide client budget, and since
    // when replies have been owed without the client taking any.
    let mut accounted = 0u64;
    let mut stalled_since: Option<Instant> = None;
    let idle_for =
        (config.idle_timeout_ms > 0).then(|| Duration::from_millis(config.idle_timeout_ms));
    let mut inbuf = BytesMut::new();
    // The largest `inbuf` has been since it was last let go of.
    let mut inbuf_size = 0;
    let mut decoder = Decoder::new();
    let mut out = OutBuf::new();
    let mut pending = Pending::default();
    // Replies that became known in one turn (reused from turn to turn).
    let mut ready: Vec<(Reply, Version)> = Vec::new();
    // A read that arrived behind writes of this connection not yet applied:
    // it runs once they are, so it sees them.
    let mut held: Option<Command> = None;
    let mut closing = *stop.borrow();
    // Idleness counts from the last whole request read or reply produced
    // (so a request that takes longer than the idle timeout to arrive ends
    // the connection too).
    let mut last_activity = Instant::now();
    // Registered once: a fresh `changed()` per turn would lock the shared
    // notifier every time.
    let stopped = stop.changed();
    tokio::pin!(stopped);
    // Registered once too: `CLIENT KILL` gives it a permit.
    let killed = info.kill.notified();
    tokio::pin!(killed);
    loop {
        // Run every complete request already buffered, unless one blocks
        // or too many replies are owed.
        let mut decoded = false;
        // When the previous command of this turn was answered: the next one
        // starts then (one clock read a command, not two).
        let mut mark: Option<std::time::Instant> = None;
        while !pending.blocked && (!closing || held.is_some()) && pending.len() < max_pending {
            if held.as_ref().is_some_and(|c| pending.must_wait(c)) {
                break;
            }
            // Killed (by itself, or by another connection meanwhile): no
            // further request runs.
            if info.killed.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            // The size of the request about to run, as read (none for a
            // held one: it was read in an earlier pass).
            let buffered = inbuf.len();
            let cmd = match held.take() {
                Some(cmd) => Ok(cmd),
                // Until the connection logs in (where it must), frames are
                // small: it holds no more than that of a partial frame.
                None => match decoder.decode(
                    &mut inbuf,
                    if session.user.is_some() {
                        &limits
                    } else {
                        &limits_unauthenticated
                    },
                ) {
                    Ok(Some(frame)) => {
                        decoded = true;
                        Command::from_frame_naming(frame)
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let reply = match e {
                            FrameError::TooBig { what, .. } => {
                                bump(&node.metrics().toobig);
                                ServerError::owned(
                                    ErrorCode::TooBig,
                                    format!("{e}{}", limit_setting(what, session.user.is_some())),
                                )
                            }
                            _ => {
                                bump(&node.metrics().protocol_errors);
                                ServerError::owned(ErrorCode::Err, e.to_string())
                            }
                        };
                        let reply = Reply::Error(reply);
                        stats.refuse(None, &reply);
                        pending.reply(&mut out, session.version, reply);
                        closing = true;
                        break;
                    }
                },
            };
            if let Ok(c) = &cmd
                && pending.must_wait(c)
            {
                held = cmd.ok();
                break;
            }
            session.writes_pending = pending.awaits_write();
            let started = cmd.as_ref().ok().map(|c| Started {
                id: c.id(),
                at: mark.take().unwrap_or_else(std::time::Instant::now),
            });
            // An HTTP request, as a web page can make a browser send to any
            // port it likes, would run its body's lines as commands: closed
            // at its first line, without an answer (as Redis does).
            if let Err((CommandError::Unknown(name), _)) = &cmd
                && (name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:"))
            {
                bump(&node.metrics().http_refusals);
                static LOGGED: crate::metrics::LogEvery = crate::metrics::LogEvery::new();
                if let Some(n) = LOGGED.due() {
                    warn!(
                        client = %session.info.addr,
                        count = n,
                        "an HTTP request (POST or Host:) came to the client port: possibly cross-protocol scripting from a web page; connection closed (logged at most every 10 s)"
                    );
                }
                closing = true;
                break;
            }
            let action = match cmd {
                Ok(cmd) => dispatch(node, &mut session, cmd),
                Err((e, named)) => {
                    let reply = Reply::Error(ServerError::owned(ErrorCode::Err, e.to_string()));
                    // Refused before it ran: counted here, not as a call.
                    stats.refuse(named, &reply);
                    // A frame that is not an array of strings breaks the
                    // protocol: answer and close, like a malformed frame.
                    if e == CommandError::NotAnArray {
                        bump(&node.metrics().protocol_errors);
                        Action::Close(reply)
                    } else {
                        Action::Reply(reply)
                    }
                }
            };
            let request = buffered.saturating_sub(inbuf.len());
            match action {
                Action::Reply(reply) => {
                    mark = record(stats, started, &reply);
                    pending.reply(&mut out, session.version, reply);
                }
                Action::Pending(later) => {
                    pending.later(Owed::Later(later), session.version, started, request);
                }
                Action::Block(later) => {
                    pending.later(Owed::Blocking(later), session.version, started, request);
                }
                Action::Read(later) => {
                    pending.later(Owed::Read(later), session.version, started, request);
                }
                Action::Close(reply) => {
                    record(stats, started, &reply);
                    pending.reply(&mut out, session.version, reply);
                    closing = true;
                }
            }
            if out.len() + pending.ready_bytes() > max_out {
                break;
            }
            // Replies are counted against the server-wide budget as they
            // pile up, not only once the batch is done.
            let holds = client_bytes(&out, &inbuf, &pending);
            if holds > accounted + ACCOUNT_STEP {
                mark = None;
                if !charge(node, &info, &mut accounted, holds).await {
                    return Ok(());
                }
            }
        }
        if decoded {
            last_activity = Instant::now();
        }
        // Replies made and waiting behind one not known yet count too.
        if out.len() + pending.ready_bytes() > max_out {
            bump(&node.metrics().output_limit_disconnects);
            warn!(
                client = session.info.id,
                bytes = out.len() + pending.ready_bytes(),
                "client output over max_output_buffer_bytes: disconnecting"
            );
            return Ok(());
        }
        if closing && pending.is_empty() && held.is_none() {
            // Write what is owed (bounded in time), then close.
            let _ = tokio::time::timeout(CLOSE_FLUSH, async {
                let _ = write_all(writer, &mut out, stats).await;
                let _ = writer.shutdown().await;
            })
            .await;
            return Ok(());
        }
        // Write eagerly: the socket almost always takes the replies at once,
        // which saves a turn through the select below.
        if !out.is_empty() {
            match writer.try_write_out(&out) {
                Ok(n) => {
                    if n > 0 {
                        stalled_since = None;
                        stats.written(n);
                    }
                    out.advance(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        // While a request is parked the connection reads ahead (bounded),
        // whatever the FIFO holds, to notice the client leaving.
        let can_read = !closing
            && held.is_none()
            && if pending.blocked {
                inbuf.len() < PARKED_READ_AHEAD
            } else {
                pending.len() < max_pending
            };
        release_if_empty(&mut inbuf, &mut inbuf_size);
        out.release_if_empty();
        pending.release_if_empty();
        if ready.is_empty() && ready.capacity() > SHORT_PIPELINE {
            ready.shrink_to(SHORT_PIPELINE);
        }
        // Evicted: the server is over its client memory budget and this
        // client owes the most.
        if !charge(
            node,
            &info,
            &mut accounted,
            client_bytes(&out, &inbuf, &pending),
        )
        .await
        {
            return Ok(());
        }
        let stall_deadline = match write_timeout {
            Some(t) if out.memory() > 0 => {
                Some(*stalled_since.get_or_insert_with(Instant::now) + t)
            }
            _ => {
                stalled_since = None;
                None
            }
        };
        let idle_deadline = match idle_for {
            Some(d) if pending.is_empty() && out.is_empty() => Some(last_activity + d),
            _ => None,
        };
        tokio::select! {
            biased;
            _ = &mut stopped, if !closing => {
                // A request held here may be a write already queued for the
                // log, which the engine still commits while connections
                // drain: say so (a retry with the same ATTEMPT is safe).
                let e = ServerError::new(
                    ErrorCode::TryAgain,
                    "server is shutting down: the request may have been applied",
                );
                pending.unblock_with(&Reply::Error(e), stats);
                closing = true;
            }
            () = &mut killed => {
                debug!(client = session.info.id, "closed by CLIENT KILL");
                // Replies already made go out first (bounded in time): a
                // `CLIENT KILL ... SKIPME no` gets its own answer.
                let _ = tokio::time::timeout(KILL_FLUSH, write_all(writer, &mut out, stats)).await;
                return Ok(());
            }
            () = poll_fn(|cx| pending.poll_ready(cx, &mut ready, stats)), if !pending.is_empty() => {
                last_activity = Instant::now();
                for (reply, v) in ready.drain(..) {
                    out.push_reply(v, &reply);
                    let holds = client_bytes(&out, &inbuf, &pending);
                    if holds > accounted + ACCOUNT_STEP
                        && !charge(node, &info, &mut accounted, holds).await
                    {
                        return Ok(());
                    }
                }
            }
            n = writer.write_some(&out), if !out.is_empty() || writer.dirty() => {
                let n = n?;
                if n == 0 && !out.is_empty() {
                    return Ok(());
                }
                if n > 0 {
                    stalled_since = None;
                    stats.written(n);
                    out.advance(n);
                }
            }
            // Reading; or, parked with its read-ahead full, not reading any
            // more but still noticing a client that leaves (over TCP the
            // peer's FIN or RST shows as read-closed readiness without
            // reading; see `Reader::read_closed` for TLS).
            gone = async {
                if can_read {
                    // Bytes alone are not activity: a request trickled in a
                    // byte at a time counts as idle until it is whole.
                    reader.read_some(&mut inbuf).await.map(|n| {
                        stats.read(n);
                        n == 0
                    })
                } else {
                    reader.read_closed().await
                }
            }, if can_read || (pending.blocked && !closing) => {
                inbuf_size = inbuf_size.max(inbuf.capacity());
                if gone? {
                    // The client is gone (or half-closed): a parked request
                    // is withdrawn; replies already due are still written.
                    pending.withdraw_blocking();
                    closing = true;
                }
            }
            _ = info.evict.notified(), if accounted > 0 => {
                return Ok(());
            }
            _ = idle(stall_deadline) => {
                bump(&node.metrics().write_timeouts);
                debug!(client = session.info.id, owed = accounted, "client write timeout");
                return Ok(());
            }
            _ = idle(idle_deadline) => {
                debug!(client = session.info.id, "idle timeout");
                return Ok(());
            }
        }
    }
}

/// The setting behind a frame limit, for the `-TOOBIG` reply: `" (key)"`,
/// or nothing for a limit no setting moves.
fn limit_setting(what: &str, authenticated: bool) -> &'static str {
    match (what, authenticated) {
        ("array length", _) => " (max_args)",
        ("nesting depth", _) => "",
        (_, false) => " (max_unauthenticated_frame_bytes: before AUTH)",
        ("bulk length", true) => {
            " (the largest argument limit: max_value_bytes, max_journal_bytes, max_key_bytes, max_fingerprint_bytes, max_attempt_bytes)"
        }
        ("inline command", true) => " (max_inline_bytes)",
        ("frame size", true) => " (max_frame_bytes)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use idem_protocol::{Frame, OutBuf, Reply, Version};
    use tokio::sync::oneshot;

    use idem_protocol::CommandId;

    use super::{KEEP_READ_BUFFER, Owed, Pending, Started, read_buffer_bytes};
    use crate::cmdstats::CmdStats;

    fn later(rx: oneshot::Receiver<Reply>) -> super::Later {
        Box::pin(async move { rx.await.unwrap_or(Reply::Ok) })
    }

    fn int(n: i64) -> Reply {
        Reply::Frame(Frame::Integer(n))
    }

    /// A queue that held a thousand owed replies keeps no room for them
    /// once they are out (it kept 1,024 slots, 57 KB, for as long as its
    /// connection stayed open); a short one keeps its room.
    #[tokio::test]
    async fn an_emptied_long_queue_lets_go_of_its_room() {
        let mut p = Pending::default();
        let v = Version::Resp2;
        let mut senders = Vec::new();
        for _ in 0..1000 {
            let (tx, rx) = oneshot::channel();
            p.later(Owed::Later(later(rx)), v, None, 0);
            senders.push(tx);
        }
        assert!(p.queue.capacity() >= 1000);
        for (i, tx) in senders.into_iter().enumerate() {
            let _ = tx.send(int(i as i64));
        }
        let mut ready = Vec::new();
        // (in turns: the runtime's budget lets a task take 128 at a time)
        while !p.is_empty() {
            poll_fn(|cx| p.poll_ready(cx, &mut ready, &CmdStats::new(1))).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(ready.len(), 1000);
        p.release_if_empty();
        assert!(
            p.queue.capacity() <= super::SHORT_PIPELINE,
            "room for {}",
            p.queue.capacity()
        );
        ready.clear();
        let (tx, rx) = oneshot::channel();
        p.later(Owed::Later(later(rx)), v, None, 0);
        let _ = tx.send(int(1));
        poll_fn(|cx| p.poll_ready(cx, &mut ready, &CmdStats::new(1))).await;
        let room = p.queue.capacity();
        p.release_if_empty();
        assert_eq!(p.queue.capacity(), room, "a short queue keeps its room");
    }

    /// Replies that become known out of order go out in request order.
    #[tokio::test]
    async fn replies_leave_in_request_order() {
        let mut p = Pending::default();
        let mut out = OutBuf::new();
        let v = Version::Resp2;
        p.reply(&mut out, v, int(1));
        assert_eq!(out.to_vec(), b":1\r\n", "nothing owed before: straight out");
        let (tx2, rx2) = oneshot::channel();
        let (tx4, rx4) = oneshot::channel();
        p.later(Owed::Later(later(rx2)), v, None, 0);
        p.reply(&mut out, v, int(3));
        p.later(Owed::Later(later(rx4)), Version::Resp3, None, 0);
        p.reply(&mut out, v, int(5));
        assert_eq!(p.len(), 4);
        // The fourth is known first: nothing can go out yet.
        tx4.send(int(4)).unwrap();
        let stats = CmdStats::new(1);
        let front = poll_fn(|cx| std::task::Poll::Ready(p.poll_front(cx, &stats))).await;
        assert!(front.is_pending());
        tx2.send(int(2)).unwrap();
        let mut got = Vec::new();
        while !p.is_empty() {
            let r = poll_fn(|cx| p.poll_front(cx, &stats)).await;
            got.push(r);
        }
        // Each in the version of its own request.
        assert_eq!(
            got,
            vec![
                (int(2), v),
                (int(3), v),
                (int(4), Version::Resp3),
                (int(5), v)
            ]
        );
    }

    /// A blocking request holds the connection until it is answered; at
    /// shutdown it is answered at once, in its place.
    #[tokio::test]
    async fn a_blocking_request_is_answered_in_its_place() {
        let mut p = Pending::default();
        let mut out = OutBuf::new();
        let (_tx, rx) = oneshot::channel::<Reply>();
        let (tx2, rx2) = oneshot::channel();
        let v = Version::Resp2;
        let started = |id| {
            Some(Started {
                id,
                at: std::time::Instant::now(),
            })
        };
        p.later(Owed::Later(later(rx2)), v, started(CommandId::Inspect), 0);
        p.later(Owed::Blocking(later(rx)), v, started(CommandId::Claim), 0);
        assert!(p.blocked);
        let stats = CmdStats::new(1);
        p.unblock_with(&int(-1), &stats);
        assert!(!p.blocked);
        tx2.send(int(1)).unwrap();
        assert_eq!(poll_fn(|cx| p.poll_front(cx, &stats)).await, (int(1), v));
        assert_eq!(poll_fn(|cx| p.poll_front(cx, &stats)).await, (int(-1), v));
        assert!(p.is_empty());
        // Each counted once, when its reply was known.
        let mut counted = String::new();
        stats.write_commandstats(&mut counted);
        assert!(counted.contains("cmdstat_claim:calls=1,"), "{counted}");
        assert!(counted.contains("cmdstat_inspect:calls=1,"), "{counted}");
        p.reply(&mut out, Version::Resp2, int(7));
        assert_eq!(out.to_vec(), b":7\r\n");
    }

    /// A read buffer counts the room it grew to, not only its bytes (a
    /// partly received frame doubles it); the room every connection keeps
    /// counts nothing.
    #[test]
    fn a_read_buffer_counts_the_room_it_grew_to() {
        let mut idle = bytes::BytesMut::with_capacity(KEEP_READ_BUFFER);
        assert_eq!(read_buffer_bytes(&idle), 0);
        idle.extend_from_slice(b"PING\r\n");
        assert_eq!(read_buffer_bytes(&idle), 6);
        let mut grown = bytes::BytesMut::new();
        grown.extend_from_slice(&vec![b'x'; 600 << 10]);
        grown.extend_from_slice(&vec![b'x'; 500 << 10]);
        assert!(grown.capacity() > 1100 << 10);
        assert_eq!(
            read_buffer_bytes(&grown),
            grown.capacity() - KEEP_READ_BUFFER
        );
    }

    /// Later requests run while a follower read waits, but only reads:
    /// anything else waits for it (a write sent after the read, on a
    /// follower that had become the leader meanwhile, was applied before
    /// the read and shown by it); a read waits for earlier writes only.
    #[test]
    fn only_reads_run_ahead_of_an_earlier_follower_read() {
        let cmd = |args: &[&'static str]| {
            idem_protocol::Command::from_frame(Frame::command(args.iter().copied())).unwrap()
        };
        let (claim, inspect) = (cmd(&["CLAIM", "k"]), cmd(&["INSPECT", "k"]));
        let v = idem_protocol::Version::Resp2;
        let mut p = Pending::default();
        assert!(!p.must_wait(&claim) && !p.must_wait(&inspect));
        let (_tx, rx) = oneshot::channel();
        p.later(Owed::Read(later(rx)), v, None, 0);
        assert!(p.must_wait(&claim), "a write behind a follower read");
        assert!(!p.must_wait(&inspect), "a read behind a follower read");
        let (_tx2, rx2) = oneshot::channel();
        p.later(Owed::Later(later(rx2)), v, None, 0);
        assert!(p.must_wait(&inspect), "a read behind a write");
    }
}
