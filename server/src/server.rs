//! The listener: accepts connections, caps their number, runs the expiry
//! proposer, and shuts down gracefully when the `shutdown` future resolves.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics::bump;
use crate::node::Node;

/// Backoff after a failed accept (out of descriptors, say), so the loop
/// does not spin; doubled while accepts keep failing, up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Failed accepts are logged at most this often.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);
/// Descriptors idemd needs beside its connections (listener, epoll, event
/// fds, log segments, snapshot, lock, stdio), as Redis reserves 32.
pub const RESERVED_FDS: u64 = 64;

/// Makes room for `max_connections` in the open files limit: raises the
/// soft limit (up to the hard one) to what they need, or, when the hard
/// limit is too low, lowers `max_connections` to what fits, with a warning,
/// so that every connection accepted can be served.
pub fn reconcile_fd_limit(config: &mut Config) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let want = config.max_connections as u64 + RESERVED_FDS;
    let limit = getrlimit(Resource::Nofile);
    let mut have = limit.current.unwrap_or(u64::MAX);
    if have >= want {
        return;
    }
    let target = want.min(limit.maximum.unwrap_or(u64::MAX));
    if target > have {
        let raised = Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                info!(from = have, to = target, "raised the open files limit");
                have = target;
            }
            Err(e) => warn!(error = %e, "cannot raise the open files limit"),
        }
    }
    if have < want {
        let fit = usize::try_from(have.saturating_sub(RESERVED_FDS).max(1)).unwrap_or(1);
        warn!(
            open_files_limit = have,
            max_connections = fit,
            configured = config.max_connections,
            "the open files limit is too low for max_connections: lowered to what fits (raise `ulimit -n` to serve more)"
        );
        config.max_connections = fit;
        config.raw.max_connections = fit;
    }
}
/// How long a refused connection may take to receive its error.
const REJECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What protected mode answers a client from another host (Redis's reply,
/// in Idem's terms), before closing the connection.
pub const DENIED: &str = "-DENIED Idem is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from other computers, do one of the following: 1) set a password for the default user (requirepass, --requirepass or IDEM_REQUIREPASS) and have clients AUTH with it; 2) if this server is reachable only from a trusted network, turn protected mode off (protected_mode = false, --protected-mode no or IDEM_PROTECTED_MODE=no) and restart.\r\n";

/// Whether `ip` is this host (IPv4-mapped loopback included).
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Listens on `addr` (with `SO_REUSEADDR`, so a restart can bind at once)
/// with a backlog of `backlog` connections.
///
/// # Errors
///
/// When the address cannot be bound.
pub fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    /// The TLS listener (`tls_listen`).
    tls_listener: Option<TcpListener>,
    /// The Prometheus listener (`metrics_listen`).
    metrics_listener: Option<TcpListener>,
    node: Node,
}

/// How long a TLS client may take to finish its handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts from `l`, or never when there is none.
async fn accept_from(l: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

impl Server {
    /// Starts the engine (for raft: replays the log over the latest
    /// snapshot), then binds the listen address: nothing is accepted before
    /// the node can serve.
    ///
    /// # Errors
    ///
    /// When the engine cannot start or the address cannot be bound.
    pub async fn bind(mut config: Config) -> io::Result<Server> {
        reconcile_fd_limit(&mut config);
        let listen = config.listen;
        let backlog = config.tcp_backlog;
        // On port 0 the port is known only once bound: bound first, so the
        // address the node advertises (CLUSTER SLOTS, MOVED) is the real
        // one. Otherwise the port opens only once the log is replayed.
        let early = if listen.port() == 0 {
            let l = bind_listener(listen, backlog)?;
            if config.raw.advertise.trim().is_empty() {
                let adv = &mut config.raft.cluster.client_advertise;
                let tls = adv.split_once('+').map(|(_, t)| format!("+{t}"));
                *adv = format!("{}{}", l.local_addr()?, tls.unwrap_or_default());
            }
            Some(l)
        } else {
            None
        };
        let node = Node::start(config, listen)
            .await
            .map_err(io::Error::other)?;
        let listener = match early {
            Some(l) => l,
            None => bind_listener(listen, backlog)?,
        };
        node.set_bound(listener.local_addr()?);
        let tls_listener = match node.config().tls.as_ref().and_then(|t| t.settings().listen) {
            Some(addr) => Some(bind_listener(addr, backlog)?),
            None => None,
        };
        let metrics_listener = match node.config().metrics_listen {
            Some(addr) => Some(bind_listener(addr, backlog)?),
            None => None,
        };
        Ok(Server {
            listener,
            tls_listener,
            metrics_listener,
            node,
        })
    }

    /// The node this server serves.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.node.local_addr()
    }

    /// Serves until `shutdown` resolves, then stops accepting, answers
    /// parked requests with `-TRYAGAIN`, lets every connection write what it
    /// owes, and returns once all have closed.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let Server {
            listener,
            tls_listener,
            metrics_listener,
            node,
        } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        if let Some(l) = metrics_listener {
            tokio::spawn(crate::prom::serve(node.clone(), l, stop_rx.clone()));
        }
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        let config = node.config();
        let limit = Arc::new(Semaphore::new(config.max_connections));
        let expiry = tokio::spawn(Arc::clone(node.engine()).run_expiry(
            Duration::from_millis(config.sweep_interval_ms),
            config.sweep_batch,
            config.expire_batch,
            stop_rx.clone(),
        ));
        info!(addr = %node.local_addr(), engine = config.engine.as_str(), "idemd listening");
        if let Some(l) = &tls_listener {
            info!(addr = %l.local_addr()?, "idemd listening for TLS clients");
        }
        tokio::pin!(shutdown);
        let mut backoff = ACCEPT_BACKOFF;
        let mut failures = 0u64;
        let mut warned: Option<tokio::time::Instant> = None;
        loop {
            let (accepted, secure) = tokio::select! {
                _ = &mut shutdown => break,
                a = listener.accept() => (a, false),
                a = accept_from(tls_listener.as_ref()) => (a, true),
            };
            let (mut socket, addr) = match accepted {
                Ok(a) => {
                    backoff = ACCEPT_BACKOFF;
                    a
                }
                Err(e) => {
                    // Out of descriptors or a transient network error: do not
                    // spin, and do not flood the log; back off.
                    failures += 1;
                    if warned.is_none_or(|t| t.elapsed() >= ACCEPT_WARN_EVERY) {
                        warn!(error = %e, failures, "accept failed (logged at most every 10 s)");
                        warned = Some(tokio::time::Instant::now());
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            };
            bump(&node.metrics().connections);
            if secure {
                // Refused before the handshake (no reply: it would be clear
                // text on a TLS port) and before taking a connection slot.
                if config.protected_mode && node.acl().open() && !is_loopback(addr.ip()) {
                    bump(&node.metrics().protected_mode_refusals);
                    continue;
                }
                let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
                    bump(&node.metrics().rejected);
                    continue;
                };
                let node = node.clone();
                let stop = stop_rx.clone();
                let done = done_tx.clone();
                tokio::spawn(async move {
                    serve_tls(node, socket, addr, stop).await;
                    drop(permit);
                    drop(done);
                });
                continue;
            }
            if config.protected_mode && node.acl().open() && !is_loopback(addr.ip()) {
                bump(&node.metrics().protected_mode_refusals);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REJECT_TIMEOUT, async {
                        let _ = socket.write_all(DENIED.as_bytes()).await;
                        let _ = socket.shutdown().await;
                    })
                    .await;
                });
                continue;
            }
            let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
                bump(&node.metrics().rejected);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REJECT_TIMEOUT, async {
                        let _ = socket
                            .write_all(b"-ERR max number of clients reached\r\n")
                            .await;
                        let _ = socket.shutdown().await;
                    })
                    .await;
                });
                continue;
            };
            let node = node.clone();
            let stop = stop_rx.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                crate::connection::serve(node, socket, addr, stop).await;
                drop(permit);
                drop(done);
            });
        }
        info!("shutting down: draining connections");
        drop(listener);
        drop(tls_listener);
        let _ = stop_tx.send(true);
        drop(done_tx);
        let _ = done_rx.recv().await;
        expiry.abort();
        node.engine().shutdown().await;
        info!("shutdown complete");
        Ok(())
    }
}

/// Completes a TLS client's handshake (bounded in time, abandoned at
/// shutdown) and serves it.
async fn serve_tls(node: Node, socket: TcpStream, addr: SocketAddr, stop: watch::Receiver<bool>) {
    let Some(tls) = node.config().tls.clone() else {
        return;
    };
    let laddr = socket.local_addr().unwrap_or(node.local_addr());
    let _ = socket.set_nodelay(true);
    let mut stop_early = stop.clone();
    let handshake = tokio::select! {
        h = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(socket)) => h,
        _ = stop_early.wait_for(|stopping| *stopping) => return,
    };
    let why = match handshake {
        Ok(Ok(s)) => return crate::connection::serve_tls(node, s, addr, laddr, stop).await,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    bump(&node.metrics().tls_handshake_failures);
    // Logged (the latest, with how many since the last line) at most every
    // 10 s: a client with a bad certificate learns little from the
    // connection closing, and its operator looks here.
    static LOGGED: crate::metrics::LogEvery = crate::metrics::LogEvery::new();
    match LOGGED.due() {
        Some(failures) => {
            warn!(client = %addr, error = %why, failures, "TLS handshake failed (logged at most every 10 s)")
        }
        None => tracing::debug!(client = %addr, error = %why, "TLS handshake failed"),
    }
}
