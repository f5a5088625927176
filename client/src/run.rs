//! `run_once`: claim, run the effect only when owning the key, record the
//! outcome, classify failures.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
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
    /// ERR and this value, and replayed to later callers.
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

    /// Lease of the claim (renewed while the effect runs).
    pub fn lease(mut self, d: Duration) -> Self {
        self.claim.lease = Some(d);
        self
    }

    /// Retention of the outcome.
    pub fn retain(mut self, d: Duration) -> Self {
        self.claim.retain = Some(d);
        self
    }

    /// How long to wait for a live owner (default 10 s; zero: do not wait).
    pub fn wait(mut self, d: Duration) -> Self {
        self.claim.wait = Some(d);
        self
    }

    /// Fingerprint of the request payload.
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
    /// The effect ran here and failed; it was recorded as `failure` says
    /// (permanent errors are replayed to later callers as `Completed` with
    /// outcome ERR).
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
        let mut claim = self.claim(key);
        claim.opts = opts.claim.clone();
        let guard = match claim.send().await? {
            ClaimOutcome::Completed(done) => return Ok(done),
            ClaimOutcome::InFlight { remaining } => return Err(RunError::InFlight { remaining }),
            ClaimOutcome::Acquired(guard) => guard,
            ClaimOutcome::Recover {
                claim: guard,
                journal,
            } => {
                let Some(recover) = &opts.recover else {
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
    guard: Claim,
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
    match result {
        Ok(Ok(value)) => finish(guard, value, Outcome::Ok).await,
        Ok(Err(error)) => {
            let failure = classify(&error);
            match &failure {
                Failure::Permanent(v) => guard.complete_error(v.clone()).await?,
                Failure::Transient => guard.release().await?,
                Failure::Unknown => guard.abandon().await?,
            }
            Err(RunError::Effect { error, failure })
        }
        Err(panic) => {
            let _ = guard.abandon().await;
            std::panic::resume_unwind(panic)
        }
    }
}
