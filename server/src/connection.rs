//! One client connection: decode requests, dispatch them in order, write
//! replies in the same order.
//!
//! Reading and writing proceed together, so a client that pipelines
//! without reading does not deadlock against the server; replies it does
//! not read accumulate up to `max_output_buffer_bytes`, and past that the
//! client is disconnected. A parked request (WAIT) holds back the replies
//! of later requests on this connection only, as Redis blocking commands
//! do; while parked, the connection still notices the client leaving.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use idem_protocol::{
    Command, CommandError, ErrorCode, FrameError, Reply, ServerError, Version, decode,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::dispatch::{Action, Session, dispatch};
use crate::server::Shared;
use crate::waiters::WaitHandle;

/// Bytes read ahead while a request is parked (to notice a disconnect).
const PARKED_READ_AHEAD: usize = 64 * 1024;

/// Serves a connection until it closes, the client leaves, or shutdown.
pub async fn serve(
    shared: Arc<Shared>,
    socket: TcpStream,
    addr: SocketAddr,
    stop: watch::Receiver<bool>,
) {
    let laddr = socket.local_addr().unwrap_or(shared.local_addr);
    let info = shared.clients.register(addr, laddr);
    let id = info.id;
    let session = Session {
        info,
        version: Version::Resp2,
    };
    if let Err(e) = run(&shared, socket, session, stop).await {
        debug!(client = id, error = %e, "connection ended with an error");
    }
    shared.clients.unregister(id);
}

fn push(out: &mut BytesMut, version: Version, reply: &Reply) {
    reply.encode(version, out);
}

async fn wait_parked(parked: &mut Option<WaitHandle>) -> Reply {
    match parked {
        Some(h) => h.wait().await,
        None => std::future::pending().await,
    }
}

async fn idle(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Reads what the socket has into `buf`.
///
/// A read that returns less than the room it was given has drained the
/// socket; the readiness it started from is then cleared at once, instead
/// of by a further read that would only return `WouldBlock` (one system
/// call per request saved). The clear uses the readiness observed before
/// the read, so data arriving after it still wakes the connection.
async fn read_some(socket: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    loop {
        socket.readable().await?;
        buf.reserve(8 * 1024);
        let room = buf.capacity() - buf.len();
        let mut got = None;
        let result = socket.try_io(Interest::READABLE, || {
            let n = socket.try_read_buf(buf)?;
            got = Some(n);
            if n > 0 && n < room {
                Err(std::io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        });
        match (result, got) {
            (_, Some(n)) => return Ok(n),
            (Err(e), None) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            (Err(e), None) => return Err(e),
            (Ok(n), None) => return Ok(n),
        }
    }
}

/// Writes as much of `out` as the socket takes.
async fn write_some(socket: &TcpStream, out: &[u8]) -> std::io::Result<usize> {
    loop {
        socket.writable().await?;
        match socket.try_write(out) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn run(
    shared: &Arc<Shared>,
    mut socket: TcpStream,
    mut session: Session,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    let limits = shared.config.limits.frame;
    let max_out = shared.config.max_output_buffer_bytes;
    let idle_for = (shared.config.idle_timeout_ms > 0)
        .then(|| Duration::from_millis(shared.config.idle_timeout_ms));
    let mut inbuf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut parked: Option<WaitHandle> = None;
    let mut closing = *stop.borrow();
    let mut last_read = Instant::now();
    // Registered once: a fresh `changed()` per turn would lock the shared
    // notifier every time.
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        // Answer every complete request already buffered, unless one is parked.
        while parked.is_none() && !closing {
            let frame = match decode(&mut inbuf, &limits) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    let reply = match e {
                        FrameError::TooBig { .. } => {
                            shared.metrics.toobig.fetch_add(1, Ordering::Relaxed);
                            ServerError::owned(ErrorCode::TooBig, e.to_string())
                        }
                        _ => {
                            shared
                                .metrics
                                .protocol_errors
                                .fetch_add(1, Ordering::Relaxed);
                            ServerError::owned(ErrorCode::Err, e.to_string())
                        }
                    };
                    push(&mut out, session.version, &Reply::Error(reply));
                    closing = true;
                    break;
                }
            };
            let action = match Command::from_frame(frame) {
                Ok(cmd) => dispatch(shared, &mut session, cmd),
                Err(e) => {
                    // A frame that is not an array of strings breaks the
                    // protocol: answer and close, like a malformed frame.
                    if e == CommandError::NotAnArray {
                        shared
                            .metrics
                            .protocol_errors
                            .fetch_add(1, Ordering::Relaxed);
                        Action::Close(Reply::Error(ServerError::owned(
                            ErrorCode::Err,
                            e.to_string(),
                        )))
                    } else {
                        Action::Reply(Reply::Error(ServerError::owned(
                            ErrorCode::Err,
                            e.to_string(),
                        )))
                    }
                }
            };
            match action {
                Action::Reply(reply) => push(&mut out, session.version, &reply),
                Action::Park(handle) => parked = Some(handle),
                Action::Close(reply) => {
                    push(&mut out, session.version, &reply);
                    closing = true;
                }
            }
            if out.len() > max_out {
                break;
            }
        }
        if out.len() > max_out {
            shared
                .metrics
                .output_limit_disconnects
                .fetch_add(1, Ordering::Relaxed);
            warn!(
                client = session.info.id,
                bytes = out.len(),
                "client output over max_output_buffer_bytes: disconnecting"
            );
            return Ok(());
        }
        if closing && parked.is_none() {
            // Write what is owed (bounded in time), then close.
            let _ = tokio::time::timeout(Duration::from_secs(5), socket.write_all(&out)).await;
            let _ = socket.shutdown().await;
            return Ok(());
        }
        // Write eagerly: the socket almost always takes the replies at once,
        // which saves a turn through the select below.
        if !out.is_empty() {
            match socket.try_write(&out) {
                Ok(n) => out.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let can_read = !closing && (parked.is_none() || inbuf.len() < PARKED_READ_AHEAD);
        let idle_deadline = match idle_for {
            Some(d) if parked.is_none() && out.is_empty() => Some(last_read + d),
            _ => None,
        };
        tokio::select! {
            biased;
            _ = &mut stopped, if !closing => {
                if parked.take().is_some() {
                    let e = ServerError::new(ErrorCode::TryAgain, "server is shutting down");
                    push(&mut out, session.version, &Reply::Error(e));
                }
                closing = true;
            }
            reply = wait_parked(&mut parked) => {
                push(&mut out, session.version, &reply);
                parked = None;
                continue;
            }
            n = write_some(&socket, &out), if !out.is_empty() => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                out.advance(n);
            }
            n = read_some(&socket, &mut inbuf), if can_read => {
                if n? == 0 {
                    // The client is gone (or half-closed): a parked request
                    // is withdrawn; replies already due are still written.
                    parked = None;
                    closing = true;
                }
                last_read = Instant::now();
            }
            _ = idle(idle_deadline) => {
                debug!(client = session.info.id, "idle timeout");
                return Ok(());
            }
        }
    }
}
