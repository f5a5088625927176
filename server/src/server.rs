//! The listener: accepts connections, caps their number, runs the expiry
//! sweeper, and shuts down gracefully when the `shutdown` future resolves.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{info, warn};

use crate::clients::Clients;
use crate::config::{Config, EngineKind};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::waiters::Waiters;

/// State shared by every connection: a cheap handle behind an `Arc`.
pub struct Shared {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Parked requests.
    pub waiters: Arc<Waiters>,
    /// The configuration.
    pub config: Config,
    /// Connected clients.
    pub clients: Clients,
    /// Counters.
    pub metrics: Metrics,
    /// Start time.
    pub started: Instant,
    /// The address actually bound.
    pub local_addr: SocketAddr,
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds the listen address and builds the engine.
    pub async fn bind(config: Config) -> io::Result<Server> {
        let listener = TcpListener::bind(config.listen).await?;
        let local_addr = listener.local_addr()?;
        let engine = Arc::new(match config.engine {
            EngineKind::Memory => Engine::memory(config.store.clone()),
        });
        let waiters = Waiters::new(Arc::clone(&engine));
        let shared = Arc::new(Shared {
            engine,
            waiters,
            config,
            clients: Clients::default(),
            metrics: Metrics::default(),
            started: Instant::now(),
            local_addr,
        });
        Ok(Server { listener, shared })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Serves until `shutdown` resolves, then stops accepting, answers
    /// parked requests with `-TRYAGAIN`, lets every connection write what it
    /// owes, and returns once all have closed.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let Server { listener, shared } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        let limit = Arc::new(Semaphore::new(shared.config.max_connections));
        let sweeper = tokio::spawn(sweep(Arc::clone(&shared), stop_rx.clone()));
        info!(addr = %shared.local_addr, engine = ?shared.config.engine, "idemd listening");
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
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            shared
                .metrics
                .connections
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Ok(permit) = Arc::clone(&limit).try_acquire_owned() else {
                shared
                    .metrics
                    .rejected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        let _ = socket
                            .write_all(b"-ERR max number of clients reached\r\n")
                            .await;
                        let _ = socket.shutdown().await;
                    })
                    .await;
                });
                continue;
            };
            let shared = Arc::clone(&shared);
            let stop = stop_rx.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                crate::connection::serve(shared, socket, addr, stop).await;
                drop(permit);
                drop(done);
            });
        }
        info!("shutting down: draining connections");
        drop(listener);
        let _ = stop_tx.send(true);
        drop(done_tx);
        let _ = done_rx.recv().await;
        sweeper.abort();
        info!("shutdown complete");
        Ok(())
    }
}

/// The active expiry sweep: every interval, a bounded pass over each
/// shard; while passes hit their bound, more follow, yielding in between.
async fn sweep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(shared.config.sweep_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        while shared.engine.sweep(shared.config.sweep_batch) {
            tokio::task::yield_now().await;
        }
    }
}
