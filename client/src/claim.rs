//! The claim guard: ownership of a key while the effect runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};

/// Ownership of a key, from ACQUIRED (or RECOVER) until finished.
///
/// While it lives, the lease is renewed in the background every third of
/// the lease, and keeps being renewed until the request that finishes it
/// is answered. If the server refuses a renewal as FENCED (the lease lapsed
/// and the key moved on), or no renewal succeeds for a whole lease (the
/// server was unreachable that long), the guard is marked lost: check
/// [`Claim::is_lost`] or await [`Claim::lost`] before committing anything
/// that depends on still owning the key.
///
/// Finish it with [`complete`](Claim::complete),
/// [`complete_error`](Claim::complete_error), [`release`](Claim::release)
/// or [`abandon`](Claim::abandon). Dropping it unfinished abandons the
/// claim (the outcome is unknown) and logs a warning.
#[derive(Debug)]
pub struct Claim {
    ctx: ClaimCtx,
    renewer: Option<JoinHandle<()>>,
    finished: bool,
    /// Dropped unfinished: release (the effect is known not to have
    /// happened) instead of abandon.
    release_on_drop: bool,
}

/// A cheap view of a claim for the code running the effect: its key and
/// fence, its journal, and whether ownership was lost.
#[derive(Debug, Clone)]
pub struct ClaimCtx {
    client: Client,
    key: Bytes,
    fence: u64,
    lost: watch::Receiver<Option<Arc<Error>>>,
    /// Set once a journal was asked for: downstream may have been reached.
    journaled: Arc<std::sync::atomic::AtomicBool>,
}

impl ClaimCtx {
    /// The key.
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// The client the claim was made with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The fence of this ownership (a fencing token for downstream systems).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Records progress for whoever must recover if this owner dies.
    pub async fn journal(&self, journal: impl Into<Bytes>) -> Result<()> {
        self.journaled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.client
            .journal(self.key.clone(), self.fence, journal)
            .await
    }

    /// Whether ownership is lost or presumed lost: a renewal was refused
    /// (`FENCED`: for good), or none landed for a whole lease (someone
    /// else may own the key now; renewals go on, and one that lands
    /// clears this).
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves when ownership is lost or presumed lost (see
    /// [`is_lost`](Self::is_lost); never, if it is not).
    pub async fn lost(&self) -> Arc<Error> {
        let mut rx = self.lost.clone();
        loop {
            if let Some(e) = rx.borrow_and_update().clone() {
                return e;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Claim {
    pub(crate) fn new(client: Client, key: Bytes, fence: u64, lease: Duration) -> Claim {
        let (tx, rx) = watch::channel(None);
        let renewer = tokio::spawn(renew_loop(client.clone(), key.clone(), fence, lease, tx));
        Claim {
            ctx: ClaimCtx {
                client,
                key,
                fence,
                lost: rx,
                journaled: Arc::default(),
            },
            renewer: Some(renewer),
            finished: false,
            release_on_drop: false,
        }
    }

    /// The key.
    pub fn key(&self) -> &Bytes {
        &self.ctx.key
    }

    /// The fence.
    pub fn fence(&self) -> u64 {
        self.ctx.fence
    }

    /// A view for the effect's code.
    pub fn ctx(&self) -> ClaimCtx {
        self.ctx.clone()
    }

    /// Whether ownership is lost or presumed lost (see
    /// [`ClaimCtx::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.ctx.is_lost()
    }

    /// Resolves when ownership is lost.
    pub async fn lost(&self) -> Arc<Error> {
        self.ctx.lost().await
    }

    /// Records progress for a later recovery.
    pub async fn journal(&self, journal: impl Into<Bytes>) -> Result<()> {
        self.ctx.journal(journal).await
    }

    fn stop(&mut self) {
        self.finished = true;
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
    }

    /// Sends the request that finishes the claim, renewing the lease until
    /// its answer is in (a finishing request that retries must not outlive
    /// the lease it is finishing).
    async fn end(mut self, request: impl Future<Output = Result<()>>) -> Result<()> {
        let result = request.await;
        self.stop();
        result
    }

    fn target(&self) -> (Client, Bytes, u64) {
        (
            self.ctx.client.clone(),
            self.ctx.key.clone(),
            self.ctx.fence,
        )
    }

    /// Completes with a successful result.
    pub async fn complete(self, value: impl Into<Bytes>) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(client.finish(key, fence, value.into(), None, false))
            .await
    }

    /// Completes with a successful result kept for `retain`.
    pub async fn complete_retain(self, value: impl Into<Bytes>, retain: Duration) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(client.finish(key, fence, value.into(), Some(retain), false))
            .await
    }

    /// Completes with a permanent error, replayed to later callers.
    pub async fn complete_error(self, value: impl Into<Bytes>) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(client.finish(key, fence, value.into(), None, true))
            .await
    }

    /// Completes with a permanent error kept for `retain`.
    pub async fn complete_error_retain(
        self,
        value: impl Into<Bytes>,
        retain: Duration,
    ) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(client.finish(key, fence, value.into(), Some(retain), true))
            .await
    }

    /// Completes with a JSON value.
    #[cfg(feature = "serde")]
    pub async fn complete_json<T: serde::Serialize>(self, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Error::new(ErrorKind::InvalidRequest, e.to_string()))?;
        self.complete(bytes).await
    }

    /// Completes with `outcome` (kept for `retain`, or the server's
    /// retention), and unlike [`complete`](Self::complete) does not give
    /// up at the call's deadline: a failure that a retry may mend (the
    /// server unreachable or restarting, a failover) is retried, the lease
    /// renewed meanwhile, for as long as the claim is not lost or presumed
    /// lost ([`ClaimCtx::is_lost`]: a renewal refused, or none landed for
    /// a whole lease). For an outcome that has no caller left to hand it
    /// to (a response already sent): an outage shorter than the lease no
    /// longer leaves the key abandoned with the outcome unrecorded. A
    /// repeat of a COMPLETE that did land is acknowledged.
    pub async fn complete_patiently(
        self,
        outcome: idem_protocol::Outcome,
        value: impl Into<Bytes>,
        retain: Option<Duration>,
    ) -> Result<()> {
        let (client, key, fence) = self.target();
        let (value, ctx) = (value.into(), self.ctx.clone());
        let error = outcome == idem_protocol::Outcome::Err;
        let (mut pause, most) = client.config().backoff_range();
        self.end(async move {
            loop {
                match client
                    .finish(key.clone(), fence, value.clone(), retain, error)
                    .await
                {
                    Err(e) if e.is_retryable() && !ctx.is_lost() => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(most);
                    }
                    done => return done,
                }
            }
        })
        .await
    }

    /// Releases: the effect did not happen; a retry may run it.
    pub async fn release(self) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(async move { client.release(key, fence).await })
            .await
    }

    /// Abandons: the effect may have happened; the next caller recovers.
    pub async fn abandon(self) -> Result<()> {
        let (client, key, fence) = self.target();
        self.end(async move { client.abandon(key, fence).await })
            .await
    }
}

impl Claim {
    /// Whether a drop of the unfinished guard releases the key instead of
    /// abandoning it (as long as nothing was journaled): for effects that
    /// journal before any downstream call, so one interrupted before its
    /// journal is known not to have happened.
    pub(crate) fn release_when_dropped(&mut self, yes: bool) {
        self.release_on_drop = yes;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.stop();
        // Released only while the effect has not journaled: a journal
        // means downstream may have been reached.
        let release = self.release_on_drop
            && !self
                .ctx
                .journaled
                .load(std::sync::atomic::Ordering::Relaxed);
        warn!(
            key = ?self.ctx.key,
            fence = self.ctx.fence,
            "claim dropped unfinished: {}",
            if release { "releasing it" } else { "abandoning it" }
        );
        let client = self.ctx.client.clone();
        let (key, fence) = (self.ctx.key.clone(), self.ctx.fence);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let done = if release {
                    client.release(key, fence).await
                } else {
                    client.abandon(key, fence).await
                };
                if let Err(e) = done {
                    warn!(error = %e, "settling a dropped claim failed; its lease will lapse instead");
                }
            });
        }
    }
}

async fn renew_loop(
    client: Client,
    key: Bytes,
    fence: u64,
    lease: Duration,
    lost: watch::Sender<Option<Arc<Error>>>,
) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut last_ok = tokio::time::Instant::now();
    let mut presumed_lost = false;
    let mut pause = period;
    loop {
        tokio::time::sleep(pause).await;
        // Each renewal gets one period, retries included, and each try
        // less than that: a node whose host vanished (its connection open,
        // nothing answering) costs one period, not the client's request
        // timeout, so a failover within the lease keeps the claim.
        match client.renew_within(key.clone(), fence, lease, period).await {
            Ok(()) => {
                last_ok = tokio::time::Instant::now();
                pause = period;
                if presumed_lost {
                    // The lease outlived the outage (a cluster's lease
                    // clock stands still while no node leads).
                    warn!(key = ?key, fence, "lease renewed again: ownership kept after all");
                    presumed_lost = false;
                    let _ = lost.send(None);
                }
            }
            Err(e) if e.kind() == ErrorKind::Fenced => {
                warn!(key = ?key, fence, "lease renewal refused: ownership lost");
                let _ = lost.send(Some(Arc::new(e)));
                return;
            }
            Err(e) => {
                // Tried again soon: the time of a failed renewal already
                // ate into the lease.
                pause = (period / 3).max(Duration::from_millis(1));
                if !presumed_lost && last_ok.elapsed() >= lease {
                    // No renewal has landed for a whole lease: the lease
                    // may have run out and someone else may own the key.
                    // Renewals go on: the server has the last word.
                    warn!(key = ?key, fence, error = %e, "lease renewals failed for a whole lease: ownership presumed lost");
                    presumed_lost = true;
                    let error = Error::new(
                        ErrorKind::Timeout,
                        format!("no lease renewal succeeded for {lease:?}; last error: {e}"),
                    );
                    let _ = lost.send(Some(Arc::new(error)));
                } else {
                    warn!(key = ?key, fence, error = %e, "lease renewal failed; retrying");
                }
            }
        }
    }
}
