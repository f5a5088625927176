//! `run_once`: claim, run the effect only when owning the key, record the
//! outcome, classify failures.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use idem_protocol::{OnExpire, Outcome};

use crate::claim::{Claim, ClaimCtx};
use crate::client::{ClaimOptions, ClaimOutcome, Client, Completed};
use crate::error::Error;
use crate::key::Key;

/// How a failed effect is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A permanent business error (card declined): completed with outcome
    /// ERR and this value. `run_once` returns it as
    /// `Ok(Completed { outcome: Outcome::Err, .. })`, on this first run
    /// and on every replay alike.
    Permanent(Bytes),
    /// A transient fault (timeout, 503) known to have had no effect:
    /// released, so a retry runs the effect again.
    Transient,
    /// Unknown: the effect may have happened. Abandoned, so the next caller
    /// recovers from the journal instead of running it blindly.
    Unknown,
}

/// What a recovery callback decided after reading the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The effect did happen, with this result: complete OK.
    Completed(Bytes),
    /// The effect failed permanently: complete ERR with this value.
    Failed(Bytes),
    /// The effect did not happen: run it now.
    RunEffect,
    /// The effect did not happen, but do not run it now: release.
    Release,
    /// Still unknown: abandon again for a later recovery.
    Abandon,
}

type Classifier<E> = Arc<dyn Fn(&E) -> Failure + Send + Sync>;
type Recoverer =
    Arc<dyn Fn(ClaimCtx, Bytes) -> Pin<Box<dyn Future<Output = Recovery> + Send>> + Send + Sync>;

/// Options of [`Client::run_once`].
pub struct RunOptions<E> {
    claim: ClaimOptions,
    classify: Classifier<E>,
    recover: Option<Recoverer>,
    release_on_cancel: bool,
    run_again_if_no_journal: bool,
    attempt: Option<Bytes>,
}

impl<E> Clone for RunOptions<E> {
    fn clone(&self) -> Self {
        RunOptions {
            claim: self.claim.clone(),
            classify: Arc::clone(&self.classify),
            recover: self.recover.clone(),
            release_on_cancel: self.release_on_cancel,
            run_again_if_no_journal: self.run_again_if_no_journal,
            attempt: self.attempt.clone(),
        }
    }
}

impl<E> fmt::Debug for RunOptions<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOptions")
            .field("claim", &self.claim)
            .field("on_recover", &self.recover.is_some())
            .field("release_on_cancel", &self.release_on_cancel)
            .field("run_again_if_no_journal", &self.run_again_if_no_journal)
            .finish()
    }
}

impl<E> Default for RunOptions<E> {
    fn default() -> Self {
        RunOptions {
            claim: ClaimOptions {
                wait: Some(Duration::from_secs(10)),
                on_expire: Some(OnExpire::Recover),
                ..ClaimOptions::default()
            },
            classify: Arc::new(|_| Failure::Unknown),
            recover: None,
            release_on_cancel: false,
            run_again_if_no_journal: false,
            attempt: None,
        }
    }
}

impl<E> RunOptions<E> {
    /// Defaults: wait up to 10 s for a live owner; a lapsed lease leaves
    /// the key to recovery ([`OnExpire::Recover`]: a process that crashed
    /// mid-effect is an unknown outcome, so its journal is handed to the
    /// next caller instead of the effect running again); every effect error
    /// is [`Failure::Unknown`]; no recovery callback.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lease of the claim, renewed while the effect runs (default: the
    /// config's `default_lease`, else 30 s).
    pub fn lease(mut self, d: Duration) -> Self {
        self.claim.lease = Some(d);
        self
    }

    /// Retention of the outcome (default: the config's `default_retain`,
    /// else the server's).
    pub fn retain(mut self, d: Duration) -> Self {
        self.claim.retain = Some(d);
        self
    }

    /// How long to wait for a live owner (default 10 s; zero: do not wait).
    pub fn wait(mut self, d: Duration) -> Self {
        self.claim.wait = Some(d);
        self
    }

    /// Fingerprint of the request payload (default none: any payload
    /// matches). See `fingerprint` (feature `serde`).
    pub fn fingerprint(mut self, fp: impl Into<Bytes>) -> Self {
        self.claim.fingerprint = Some(fp.into());
        self
    }

    /// What a lapsed lease leaves behind (default [`OnExpire::Recover`];
    /// [`OnExpire::Free`] lets the next caller run the effect again, for
    /// effects that are safe to repeat).
    pub fn on_expire(mut self, policy: OnExpire) -> Self {
        self.claim.on_expire = Some(policy);
        self
    }

    /// Overall time claiming (and waiting) may take, retries included
    /// (default: the client's [`ClientConfig::deadline`](crate::ClientConfig::deadline)
    /// plus the wait). The effect's own time is not counted, and recording
    /// the outcome has the client's deadline of its own.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.claim.deadline = Some(d);
        self
    }

    /// When the call is cancelled (its future dropped) while the effect
    /// runs and before it journaled anything, release the key instead of
    /// abandoning it (default false), so a retry may run the effect at
    /// once. For effects that journal before any downstream call: without
    /// a journal, downstream was never reached. Once the effect journaled,
    /// or returned, a cancellation abandons; a recovered claim (after
    /// `RECOVER`) is always abandoned when cancelled.
    pub fn release_on_cancel(mut self, yes: bool) -> Self {
        self.release_on_cancel = yes;
        self
    }

    /// On `RECOVER` without an [`on_recover`](Self::on_recover) callback,
    /// run the effect again if the previous owner left an empty journal
    /// (default false: abandon again and return
    /// [`RunError::NeedsRecovery`]). Only for effects that journal before
    /// any downstream call: an empty journal then means the effect never
    /// reached downstream.
    pub fn run_again_if_no_journal(mut self, yes: bool) -> Self {
        self.run_again_if_no_journal = yes;
        self
    }

    /// The attempt id to claim with (default: a fresh random one per
    /// call). A caller that retries a call whose outcome it lost (its
    /// process restarted, say) with the same id gets its own grant back
    /// instead of `InFlight`; [`Error::attempt`] names the id of a claim
    /// that failed.
    pub fn attempt(mut self, id: impl Into<Bytes>) -> Self {
        self.attempt = Some(id.into());
        self
    }

    /// How effect errors are recorded.
    pub fn classify(mut self, f: impl Fn(&E) -> Failure + Send + Sync + 'static) -> Self {
        self.classify = Arc::new(f);
        self
    }

    /// Called with the journal when a previous owner abandoned the key.
    pub fn on_recover<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(ClaimCtx, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Recovery> + Send + 'static,
    {
        self.recover = Some(Arc::new(move |ctx, journal| Box::pin(f(ctx, journal))));
        self
    }
}

/// Why `run_once` did not produce a completed outcome.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError<E> {
    /// The effect ran here and failed with a transient or unknown failure,
    /// recorded as `failure` says (released or abandoned). A permanent
    /// failure is not an error of `run_once`: it is recorded and returned
    /// as `Ok(Completed { outcome: Outcome::Err, replayed: false, .. })`,
    /// the same shape as its later replays.
    Effect {
        /// The effect's error.
        error: E,
        /// How it was recorded.
        failure: Failure,
    },
    /// A live owner still held the key when the wait ran out.
    InFlight {
        /// Lease left on the owner's claim.
        remaining: Duration,
    },
    /// A previous owner abandoned mid-effect and no recovery callback
    /// resolved it; the key was abandoned again.
    NeedsRecovery {
        /// The journal.
        journal: Bytes,
    },
    /// The effect ran here, but its outcome could not be recorded (the
    /// COMPLETE failed or ownership was lost: FENCED). The value is here so
    /// the caller can still answer its own caller. The key is abandoned on
    /// a best-effort basis (unless fenced), so a retry recovers instead of
    /// running the effect again; if the server cannot be reached for that
    /// either, the lease lapses to what `on_expire` says (recovery, by
    /// default).
    Unrecorded {
        /// OK, or ERR for a permanent failure.
        outcome: Outcome,
        /// The effect's result.
        value: Bytes,
        /// Why it could not be recorded.
        error: Error,
    },
    /// Talking to the server failed (including losing ownership: FENCED).
    Client(Error),
}

impl<E: fmt::Debug> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Effect { error, failure } => {
                write!(f, "effect failed ({failure:?}): {error:?}")
            }
            RunError::InFlight { remaining } => {
                write!(f, "still in flight ({remaining:?} of lease left)")
            }
            RunError::NeedsRecovery { journal } => {
                write!(f, "abandoned mid-effect; journal {journal:?}")
            }
            RunError::Unrecorded { outcome, error, .. } => write!(
                f,
                "the effect ran ({}) but its outcome could not be recorded: {error}",
                outcome.as_str()
            ),
            RunError::Client(e) => write!(f, "{e}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for RunError<E> {}

impl<E> RunError<E> {
    /// A short name of the variant (for logs and metrics).
    pub fn kind_name(&self) -> &'static str {
        match self {
            RunError::Effect { .. } => "effect_failed",
            RunError::InFlight { .. } => "in_flight",
            RunError::NeedsRecovery { .. } => "needs_recovery",
            RunError::Unrecorded { .. } => "unrecorded",
            RunError::Client(_) => "client_error",
        }
    }
}

impl<E> From<Error> for RunError<E> {
    fn from(e: Error) -> Self {
        RunError::Client(e)
    }
}

impl Client {
    /// Runs `effect` at most once for `key` across every caller.
    ///
    /// Claims the key (waiting for a live owner as the options say). If this
    /// call owns it, runs the effect and completes with its result, renewing
    /// the lease meanwhile; if the outcome is already known, returns it with
    /// `replayed: true` without running anything. A failed effect is
    /// recorded as the classifier says ([`Failure`]); a panic or a
    /// cancelled call (the future dropped) once the effect started abandons
    /// the claim for recovery, while a call cancelled before (claiming or
    /// waiting) leaves the key as it found it. A crash mid-effect leaves it
    /// to recovery too: the claim is made with [`OnExpire::Recover`] unless
    /// the options say otherwise. When a previous owner abandoned, the
    /// recovery callback gets the journal and decides ([`Recovery`]);
    /// without one the key is abandoned again and the call returns
    /// [`RunError::NeedsRecovery`] with the journal: the effect is never
    /// silently run again. If the effect ran but its outcome could not be
    /// recorded, [`RunError::Unrecorded`] carries its value.
    ///
    /// Each call runs in a tracing span `idem.run_once` with the key, and
    /// records the fence, the outcome and whether it was replayed;
    /// [`Client::stats`] counts calls, effects run and replays.
    pub async fn run_once<F, Fut, E>(
        &self,
        key: impl Into<Key>,
        opts: RunOptions<E>,
        effect: F,
    ) -> Result<Completed, RunError<E>>
    where
        F: FnOnce(ClaimCtx) -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
    {
        use tracing::Instrument;
        let key = key.into();
        let span = tracing::info_span!(
            "idem.run_once",
            key = %String::from_utf8_lossy(&key.to_bytes()),
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
            replayed = tracing::field::Empty,
        );
        let stats = &self.inner.stats;
        stats.run_once_calls.fetch_add(1, Ordering::Relaxed);
        let result = self
            .run_once_inner(key, opts, effect, &span)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(done) => {
                span.record("outcome", done.outcome.as_str());
                span.record("replayed", done.replayed);
                if done.replayed {
                    stats.replays.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                span.record("outcome", tracing::field::display(e.kind_name()));
            }
        }
        result
    }

    async fn run_once_inner<F, Fut, E>(
        &self,
        key: Key,
        opts: RunOptions<E>,
        effect: F,
        span: &tracing::Span,
    ) -> Result<Completed, RunError<E>>
    where
        F: FnOnce(ClaimCtx) -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
    {
        let effect = |ctx: ClaimCtx| {
            span.record("fence", ctx.fence());
            self.inner.stats.effects_run.fetch_add(1, Ordering::Relaxed);
            effect(ctx)
        };
        let mut claim = self.claim(key);
        if let Some(id) = &opts.attempt {
            claim = claim.attempt(id.clone());
        }
        claim.opts = opts.claim.clone();
        let guard = match claim.send().await? {
            ClaimOutcome::Completed(done) => return Ok(done),
            ClaimOutcome::InFlight { remaining } => return Err(RunError::InFlight { remaining }),
            ClaimOutcome::Acquired(mut guard) => {
                guard.release_when_dropped(opts.release_on_cancel);
                guard
            }
            ClaimOutcome::Recover {
                claim: guard,
                journal,
            } => {
                let Some(recover) = &opts.recover else {
                    if opts.run_again_if_no_journal && journal.is_empty() {
                        return run_effect(guard, &opts.classify, effect).await;
                    }
                    guard.abandon().await?;
                    return Err(RunError::NeedsRecovery { journal });
                };
                match recover(guard.ctx(), journal.clone()).await {
                    Recovery::Completed(v) => return finish(guard, v, Outcome::Ok).await,
                    Recovery::Failed(v) => return finish(guard, v, Outcome::Err).await,
                    Recovery::Release => {
                        guard.release().await?;
                        return Err(RunError::NeedsRecovery { journal });
                    }
                    Recovery::Abandon => {
                        guard.abandon().await?;
                        return Err(RunError::NeedsRecovery { journal });
                    }
                    Recovery::RunEffect => guard,
                }
            }
        };
        run_effect(guard, &opts.classify, effect).await
    }
}

/// Completes the claim with the outcome. If the COMPLETE cannot be
/// confirmed (retries ran out), the claim is abandoned on a best-effort
/// basis: the effect happened, so the key must not simply lapse to free and
/// be run again by the next caller.
async fn finish<E>(guard: Claim, value: Bytes, outcome: Outcome) -> Result<Completed, RunError<E>> {
    let (client, key, fence) = (
        guard.ctx().client().clone(),
        guard.key().clone(),
        guard.fence(),
    );
    let done = match outcome {
        Outcome::Ok => guard.complete(value.clone()).await,
        Outcome::Err => guard.complete_error(value.clone()).await,
    };
    if let Err(error) = done {
        if !error.is_fenced() {
            let _ = client.abandon(key, fence).await;
        }
        return Err(RunError::Unrecorded {
            outcome,
            value,
            error,
        });
    }
    Ok(Completed {
        outcome,
        value,
        replayed: false,
    })
}

async fn run_effect<F, Fut, E>(
    mut guard: Claim,
    classify: &Classifier<E>,
    effect: F,
) -> Result<Completed, RunError<E>>
where
    F: FnOnce(ClaimCtx) -> Fut,
    Fut: Future<Output = Result<Bytes, E>>,
{
    // If this future is dropped while the effect runs, `guard` is dropped
    // with it and abandons the claim.
    let result = AssertUnwindSafe(effect(guard.ctx())).catch_unwind().await;
    // The effect is over: from here a cancellation abandons whatever the
    // options said (its outcome is being recorded).
    guard.release_when_dropped(false);
    match result {
        Ok(Ok(value)) => finish(guard, value, Outcome::Ok).await,
        Ok(Err(error)) => {
            let failure = classify(&error);
            match failure {
                // Recorded, and answered in the shape its replays have.
                Failure::Permanent(v) => finish(guard, v, Outcome::Err).await,
                Failure::Transient => {
                    guard.release().await?;
                    Err(RunError::Effect { error, failure })
                }
                Failure::Unknown => {
                    guard.abandon().await?;
                    Err(RunError::Effect { error, failure })
                }
            }
        }
        Err(panic) => {
            let _ = guard.abandon().await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// The outcome of [`Client::run_once_json`]: the effect's value decoded,
/// or the recorded permanent failure.
#[cfg(feature = "serde")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedCompleted<T> {
    /// `Ok`: the effect's value (outcome OK). `Err`: the value recorded
    /// for a permanent failure (outcome ERR, see [`Failure::Permanent`]).
    pub value: Result<T, Bytes>,
    /// Whether an earlier call recorded it (a replay).
    pub replayed: bool,
}

#[cfg(feature = "serde")]
impl Client {
    /// [`run_once`](Self::run_once) for an effect that returns a typed
    /// value: it is stored as JSON and decoded on every replay, so the
    /// first run and the replays give the same `T`.
    ///
    /// # Panics
    ///
    /// If `T` cannot be written as JSON (a map with non-string keys): a
    /// programming error, found after the effect ran, so the claim is
    /// abandoned (never re-run silently) before the panic goes on.
    pub async fn run_once_json<T, F, Fut, E>(
        &self,
        key: impl Into<Key>,
        opts: RunOptions<E>,
        effect: F,
    ) -> Result<TypedCompleted<T>, RunError<E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce(ClaimCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let done = self
            .run_once(key, opts, |ctx| async move {
                let value = effect(ctx).await?;
                let json = serde_json::to_vec(&value)
                    .unwrap_or_else(|e| panic!("run_once_json: the value is not JSON: {e}"));
                Ok(Bytes::from(json))
            })
            .await?;
        let value = match done.outcome {
            Outcome::Ok => Ok(serde_json::from_slice(&done.value).map_err(|e| {
                RunError::Client(Error::new(
                    crate::ErrorKind::Protocol,
                    format!("the stored value is not valid JSON for this type: {e}"),
                ))
            })?),
            Outcome::Err => Err(done.value),
        };
        Ok(TypedCompleted {
            value,
            replayed: done.replayed,
        })
    }
}
