//! The listener: accepts connections, caps their number, runs the expiry
//! proposer, and shuts down gracefully when the `shutdown` future resolves.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics::bump;
use crate::node::Node;

/// Backoff after a failed accept (out of descriptors, say), so the loop
/// does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long a refused connection may take to receive its error.
const REJECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    node: Node,
}

impl Server {
    /// Starts the engine (for raft: replays the log over the latest
    /// snapshot), then binds the listen address: nothing is accepted before
    /// the node can serve.
    ///
    /// # Errors
    ///
    /// When the engine cannot start or the address cannot be bound.
    pub async fn bind(config: Config) -> io::Result<Server> {
        let listen = config.listen;
        let node = Node::start(config, listen)
            .await
            .map_err(io::Error::other)?;
        let listener = TcpListener::bind(listen).await?;
        node.set_bound(listener.local_addr()?);
        Ok(Server { listener, node })
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
        let Server { listener, node } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
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
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                a = listener.accept() => a,
            };
            let (mut socket, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a transient network error: do not
                    // spin; try again shortly.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            bump(&node.metrics().connections);
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
        let _ = stop_tx.send(true);
        drop(done_tx);
        let _ = done_rx.recv().await;
        expiry.abort();
        node.engine().shutdown().await;
        info!("shutdown complete");
        Ok(())
    }
}
