//! One multiplexed, pipelined connection: many callers send requests over
//! one socket, driven by one task; replies are matched to requests in
//! order.
//!
//! A caller that stops waiting (its future dropped, or timed out) leaves
//! its request in the pipeline; the task reads the reply when it comes and
//! discards it, so the connection stays in step for everyone else. A
//! connection of its own (for a request that waits server-side) can be
//! aborted instead: the socket is closed at once, so the server withdraws
//! the parked request.
//!
//! Requests queue for the task in a bounded channel
//! ([`REQUEST_QUEUE`] deep), and the task takes them only while fewer than
//! [`MAX_IN_FLIGHT`] are unanswered and its write buffer is small: a
//! server that does not keep up makes callers wait (and time out) rather
//! than buffers grow without bound.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use idem_protocol::{Frame, Limits, Version, decode, encode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::debug;

use crate::error::{Error, ErrorKind, Result};
use crate::tls::Tls;

type Reply = oneshot::Sender<Result<Frame>>;

struct Request {
    frame: Frame,
    reply: Reply,
}

/// Requests queued for one connection's task, at most.
pub(crate) const REQUEST_QUEUE: usize = 4096;

/// Requests sent and not yet answered on one connection, at most: past it
/// the task stops taking requests from the queue, so a server that does
/// not keep up holds callers back instead of growing buffers here.
const MAX_IN_FLIGHT: usize = 4096;

/// Bytes encoded and not yet written, at most, before the task stops
/// taking requests.
const MAX_UNWRITTEN: usize = 4 << 20;

/// A handle to a connection's task; cheap to clone.
#[derive(Clone)]
pub(crate) struct Connection {
    tx: mpsc::Sender<Request>,
    kill: Arc<Notify>,
}

impl Connection {
    /// Connects to `addr` (with TLS when `tls` is given: handshake
    /// included) within `timeout` and starts the driving task.
    pub(crate) async fn open(
        addr: &str,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<Connection> {
        let timed_out = || {
            Error::new(
                ErrorKind::Timeout,
                format!("connecting to {addr} timed out"),
            )
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::io(e)),
            Err(_) => return Err(timed_out()),
        };
        stream.set_nodelay(true).map_err(Error::io)?;
        let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
        let kill = Arc::new(Notify::new());
        match tls {
            None => {
                let (rd, wr) = stream.into_split();
                tokio::spawn(drive(rd, wr, false, rx, Arc::clone(&kill)));
            }
            #[cfg(feature = "tls")]
            Some(tls) => {
                let stream = tokio::time::timeout_at(deadline, tls.connect(addr, stream))
                    .await
                    .map_err(|_| timed_out())??;
                let (rd, wr) = tokio::io::split(stream);
                tokio::spawn(drive(rd, wr, true, rx, Arc::clone(&kill)));
            }
            #[cfg(not(feature = "tls"))]
            Some(_) => unreachable!("a Tls exists only with the tls feature"),
        }
        Ok(Connection { tx, kill })
    }

    /// Closes the socket at once: requests pending on it get a connection
    /// error, and the server sees the client leave (a parked request is
    /// withdrawn).
    pub(crate) fn abort(&self) {
        self.kill.notify_one();
    }

    /// Whether the task has stopped (the connection failed or closed).
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends a request and waits up to `timeout` for its reply.
    pub(crate) async fn call(&self, frame: Frame, timeout: Duration) -> Result<Frame> {
        let (reply, rx) = oneshot::channel();
        let sent = tokio::time::timeout(timeout, self.tx.send(Request { frame, reply })).await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(Error::new(ErrorKind::ConnectionClosed, "connection closed"));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("the request queue stayed full for {timeout:?}"),
                ));
            }
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::new(
                ErrorKind::ConnectionClosed,
                "connection closed before the reply",
            )),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("no reply within {timeout:?}"),
            )),
        }
    }
}

/// Writes what it can of `out` (none if empty), after pushing out what a
/// previous write left buffered when `dirty` (TLS records not yet on the
/// socket). `None`: only pushed. Cancel-safe: a write returns as soon as
/// bytes are taken.
async fn write_or_flush<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &[u8],
    dirty: bool,
) -> std::io::Result<Option<usize>> {
    if dirty {
        wr.flush().await?;
    }
    if out.is_empty() {
        return Ok(None);
    }
    wr.write(out).await.map(Some)
}

/// Drives one connection. `buffers`: the writer may keep bytes it took
/// (TLS), so they are flushed once nothing else is to be written.
async fn drive<R, W>(
    mut rd: R,
    mut wr: W,
    buffers: bool,
    mut rx: mpsc::Receiver<Request>,
    kill: Arc<Notify>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut dirty = false;
    let limits = Limits::for_replies();
    let mut pending: VecDeque<Reply> = VecDeque::new();
    let mut out = BytesMut::with_capacity(8 * 1024);
    let mut inbuf = BytesMut::with_capacity(8 * 1024);
    let mut accepting = true;
    let failure: Error = loop {
        if !accepting && pending.is_empty() && out.is_empty() {
            return;
        }
        tokio::select! {
            () = kill.notified() => break Error::new(ErrorKind::ConnectionClosed, "connection aborted"),
            req = rx.recv(), if accepting && pending.len() < MAX_IN_FLIGHT && out.len() < MAX_UNWRITTEN => match req {
                Some(req) => {
                    encode(&req.frame, Version::Resp2, &mut out);
                    pending.push_back(req.reply);
                    // Batch whatever else is queued into the same write.
                    while pending.len() < MAX_IN_FLIGHT && out.len() < MAX_UNWRITTEN
                        && let Ok(req) = rx.try_recv()
                    {
                        encode(&req.frame, Version::Resp2, &mut out);
                        pending.push_back(req.reply);
                    }
                }
                None => accepting = false,
            },
            n = write_or_flush(&mut wr, &out, dirty), if !out.is_empty() || dirty => match n {
                Ok(None) => dirty = false,
                Ok(Some(0)) => break Error::new(ErrorKind::ConnectionClosed, "server closed the connection"),
                Ok(Some(n)) => {
                    out.advance(n);
                    dirty = buffers;
                }
                Err(e) => break Error::io(e),
            },
            n = rd.read_buf(&mut inbuf) => match n {
                Ok(0) => break Error::new(ErrorKind::ConnectionClosed, "server closed the connection"),
                Ok(_) => loop {
                    match decode(&mut inbuf, &limits) {
                        Ok(Some(frame)) => match pending.pop_front() {
                            // The caller may have gone: the reply is dropped.
                            Some(reply) => { let _ = reply.send(Ok(frame)); }
                            None => {
                                debug!("reply without a request: closing");
                                return;
                            }
                        },
                        Ok(None) => break,
                        Err(e) => {
                            for reply in pending.drain(..) {
                                let _ = reply.send(Err(Error::new(ErrorKind::Protocol, e.to_string())));
                            }
                            return;
                        }
                    }
                },
                Err(e) => break Error::io(e),
            },
        }
    };
    debug!(error = %failure, "connection lost");
    rx.close();
    for reply in pending.drain(..) {
        let _ = reply.send(Err(failure.shallow_clone()));
    }
    while let Ok(req) = rx.try_recv() {
        let _ = req.reply.send(Err(failure.shallow_clone()));
    }
}
