//! A conformance suite for any server speaking the Idem protocol.
//!
//! [`run`] exercises fresh claims, live-owner waiting, abandoned-work
//! recovery, completion and replay, explicit release, cancellation, lease
//! lapse under both policies, fencing of stale owners, fingerprints,
//! attempt retries and per-key concurrency. Every run uses fresh random
//! keys, so it can be pointed again and again at a long-lived server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_client::Error> {
//! let report = idem_client::conformance::run("127.0.0.1:7379").await?;
//! println!("{report}");
//! assert!(report.passed());
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use idem_protocol::{OnExpire, Outcome};

use crate::ClientConfig;
use crate::client::{ClaimOutcome, Client, Settled, attempt_id};
use crate::error::Result;

/// The result of one check.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// `Err` with what went wrong.
    pub result: std::result::Result<(), String>,
}

/// The results of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Every check, in order.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.result.is_ok())
    }

    /// The checks that failed.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| c.result.is_err()).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match &c.result {
                Ok(()) => writeln!(f, "ok    {}", c.name)?,
                Err(e) => writeln!(f, "FAIL  {}: {e}", c.name)?,
            }
        }
        let failed = self.failures().len();
        write!(
            f,
            "{} checks, {} passed, {} failed",
            self.checks.len(),
            self.checks.len() - failed,
            failed
        )
    }
}

type CheckResult = std::result::Result<(), String>;
type CheckFn =
    for<'a> fn(&'a Client, &'a str) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn e(err: crate::Error) -> String {
    err.to_string()
}

async fn acquire(client: &Client, key: &str) -> std::result::Result<crate::Claim, String> {
    match client.claim(key).send().await.map_err(e)? {
        ClaimOutcome::Acquired(c) => Ok(c),
        other => Err(format!("expected Acquired for a fresh key, got {other:?}")),
    }
}

fn fresh_claims<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:fresh");
        let guard = acquire(c, &key).await?;
        ensure!(guard.fence() > 0, "fence must be positive");
        match c.claim(key.as_str()).send().await.map_err(e)? {
            ClaimOutcome::InFlight { remaining } => {
                ensure!(remaining > Duration::ZERO, "remaining lease is zero")
            }
            other => return Err(format!("second claim should be InFlight, got {other:?}")),
        }
        guard.release().await.map_err(e)
    })
}

fn completion_and_replay<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:replay");
        let guard = acquire(c, &key).await?;
        let fence = guard.fence();
        guard.complete("result-1").await.map_err(e)?;
        // A lost-reply retry of COMPLETE is acknowledged and changes nothing.
        c.complete(key.as_str(), fence, "other", None)
            .await
            .map_err(e)?;
        match c.claim(key.as_str()).send().await.map_err(e)? {
            ClaimOutcome::Completed(done) => {
                ensure!(
                    done.outcome == Outcome::Ok && &done.value[..] == b"result-1",
                    "wrong replay {done:?}"
                )
            }
            other => return Err(format!("expected Completed, got {other:?}")),
        }
        let key2 = format!("{p}:declined");
        acquire(c, &key2)
            .await?
            .complete_error("declined")
            .await
            .map_err(e)?;
        match c.settle(key2.as_str(), None).await.map_err(e)? {
            Settled::Completed(done) => ensure!(
                done.outcome == Outcome::Err,
                "permanent error not replayed as ERR"
            ),
            other => return Err(format!("expected Completed(ERR), got {other:?}")),
        }
        Ok(())
    })
}

fn live_owner_waiting<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:wait");
        let guard = acquire(c, &key).await?;
        let waiter = {
            let c = c.clone();
            let key = key.clone();
            tokio::spawn(async move {
                c.claim(key.as_str())
                    .wait(Duration::from_secs(10))
                    .send()
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.complete("shared").await.map_err(e)?;
        match waiter.await.map_err(|j| j.to_string())?.map_err(e)? {
            ClaimOutcome::Completed(done) => {
                ensure!(&done.value[..] == b"shared", "waiter got {done:?}")
            }
            other => {
                return Err(format!(
                    "waiter should get the owner's result, got {other:?}"
                ));
            }
        }
        Ok(())
    })
}

fn explicit_release<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:release");
        let guard = acquire(c, &key).await?;
        let f1 = guard.fence();
        guard.release().await.map_err(e)?;
        let again = acquire(c, &key).await?;
        ensure!(again.fence() > f1, "fence did not increase after release");
        again.release().await.map_err(e)
    })
}

fn abandoned_recovery<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:abandon");
        let guard = acquire(c, &key).await?;
        guard.journal("step-2").await.map_err(e)?;
        guard.abandon().await.map_err(e)?;
        match c.claim(key.as_str()).send().await.map_err(e)? {
            ClaimOutcome::Recover { claim, journal } => {
                ensure!(
                    &journal[..] == b"step-2",
                    "journal not handed over: {journal:?}"
                );
                claim.complete("recovered").await.map_err(e)
            }
            other => Err(format!("expected Recover, got {other:?}")),
        }
    })
}

fn cancellation<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:cancel");
        let guard = acquire(c, &key).await?;
        drop(guard);
        for _ in 0..50 {
            if let Settled::Abandoned { .. } = c.settle(key.as_str(), None).await.map_err(e)? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err("a dropped claim was not abandoned".into())
    })
}

fn lease_lapse<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let free = format!("{p}:lapse-free");
        let recover = format!("{p}:lapse-recover");
        // Raw commands: a guard would renew the lease.
        let raw = |key: &str, policy| {
            let c = c.clone();
            let key = key.to_owned();
            async move {
                let cmd = idem_protocol::Command::Claim(idem_protocol::cmd::Claim {
                    lease_ms: Some(100),
                    on_expire: Some(policy),
                    ..idem_protocol::cmd::Claim::new(Bytes::from(key))
                });
                c.request(&cmd, Duration::ZERO).await
            }
        };
        let f1 = raw(&free, OnExpire::Free).await.map_err(e)?;
        raw(&recover, OnExpire::Recover).await.map_err(e)?;
        let fence1 = match idem_protocol::ClaimReply::from_frame(f1) {
            Ok(idem_protocol::ClaimReply::Acquired { fence }) => fence,
            other => return Err(format!("expected ACQUIRED, got {other:?}")),
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
        let guard = acquire(c, &free)
            .await
            .map_err(|m| format!("FREE lapse: {m}"))?;
        ensure!(
            guard.fence() > fence1,
            "fence did not increase after a lapse"
        );
        guard.release().await.map_err(e)?;
        match c.claim(recover.as_str()).send().await.map_err(e)? {
            ClaimOutcome::Recover { claim, .. } => claim.release().await.map_err(e),
            other => Err(format!(
                "RECOVER lapse should hand over recovery, got {other:?}"
            )),
        }
    })
}

fn stale_owner_fencing<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:fence");
        let guard = acquire(c, &key).await?;
        let stale = guard.fence();
        guard.release().await.map_err(e)?;
        let owner = acquire(c, &key).await?;
        let checks = [
            ("COMPLETE", c.complete(key.as_str(), stale, "x", None).await),
            (
                "RENEW",
                c.renew(key.as_str(), stale, Duration::from_secs(1)).await,
            ),
            ("JOURNAL", c.journal(key.as_str(), stale, "x").await),
            ("ABANDON", c.abandon(key.as_str(), stale).await),
            ("RELEASE", c.release(key.as_str(), stale).await),
        ];
        for (what, r) in checks {
            ensure!(
                r.as_ref().is_err_and(|e| e.is_fenced()),
                "stale {what} was not fenced: {r:?}"
            );
        }
        owner.complete("owner-wins").await.map_err(e)
    })
}

fn fingerprints<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:fp");
        let guard = match c
            .claim(key.as_str())
            .fingerprint("payload-a")
            .send()
            .await
            .map_err(e)?
        {
            ClaimOutcome::Acquired(g) => g,
            other => return Err(format!("expected Acquired, got {other:?}")),
        };
        let r = c.claim(key.as_str()).fingerprint("payload-b").send().await;
        ensure!(
            r.as_ref().is_err_and(|e| e.is_mismatch()),
            "in-flight mismatch not refused: {r:?}"
        );
        guard.complete("v").await.map_err(e)?;
        let r = c.claim(key.as_str()).fingerprint("payload-b").send().await;
        ensure!(
            r.as_ref().is_err_and(|e| e.is_mismatch()),
            "replay mismatch not refused: {r:?}"
        );
        match c
            .claim(key.as_str())
            .fingerprint("payload-a")
            .send()
            .await
            .map_err(e)?
        {
            ClaimOutcome::Completed(_) => Ok(()),
            other => Err(format!("same fingerprint should replay, got {other:?}")),
        }
    })
}

fn attempt_retries<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:attempt");
        let id = attempt_id();
        let first = match c
            .claim(key.as_str())
            .attempt(id.clone())
            .send()
            .await
            .map_err(e)?
        {
            ClaimOutcome::Acquired(g) => g,
            other => return Err(format!("expected Acquired, got {other:?}")),
        };
        match c.claim(key.as_str()).attempt(id).send().await.map_err(e)? {
            ClaimOutcome::Acquired(again) => {
                ensure!(
                    again.fence() == first.fence(),
                    "retry got a different fence"
                );
                // Both guards name the same ownership: finish one, forget the other.
                std::mem::forget(again);
            }
            other => {
                return Err(format!(
                    "retry of the same attempt should re-acquire, got {other:?}"
                ));
            }
        }
        first.release().await.map_err(e)
    })
}

fn per_key_concurrency<'a>(
    c: &'a Client,
    p: &'a str,
) -> Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>> {
    Box::pin(async move {
        let key = format!("{p}:race");
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let c = c.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(
                async move { c.claim(key.as_str()).send().await },
            ));
        }
        let mut owners = Vec::new();
        for t in tasks {
            if let ClaimOutcome::Acquired(g) = t.await.map_err(|j| j.to_string())?.map_err(e)? {
                owners.push(g);
            }
        }
        ensure!(
            owners.len() == 1,
            "{} concurrent claims acquired one key",
            owners.len()
        );
        for o in owners {
            o.release().await.map_err(e)?;
        }
        // Different keys do not wait for each other.
        let mut tasks = Vec::new();
        for i in 0..16 {
            let c = c.clone();
            let key = format!("{p}:par{i}");
            tasks.push(tokio::spawn(
                async move { c.claim(key.as_str()).send().await },
            ));
        }
        for t in tasks {
            match t.await.map_err(|j| j.to_string())?.map_err(e)? {
                ClaimOutcome::Acquired(g) => g.release().await.map_err(e)?,
                other => return Err(format!("independent key not acquired: {other:?}")),
            }
        }
        Ok(())
    })
}

/// Every check, by name.
pub const CHECKS: &[(&str, CheckFn)] = &[
    ("fresh claims", fresh_claims),
    ("completion and replay", completion_and_replay),
    ("live-owner waiting", live_owner_waiting),
    ("explicit release", explicit_release),
    ("abandoned-work recovery", abandoned_recovery),
    ("cancellation abandons", cancellation),
    ("lease lapse (FREE and RECOVER)", lease_lapse),
    ("fencing of stale owners", stale_owner_fencing),
    ("fingerprints", fingerprints),
    ("attempt retries", attempt_retries),
    ("per-key concurrency", per_key_concurrency),
];

/// Runs every check against the server at `addr`, with fresh keys.
pub async fn run(addr: &str) -> Result<Report> {
    let client = Client::connect_with_config(addr, ClientConfig::default()).await?;
    Ok(run_with(&client).await)
}

/// Runs every check with an existing client.
pub async fn run_with(client: &Client) -> Report {
    let prefix = format!(
        "idem-conformance:{}",
        String::from_utf8_lossy(&attempt_id())
    );
    let mut checks = Vec::new();
    for (name, check) in CHECKS {
        let result = check(client, &prefix).await;
        checks.push(Check { name, result });
    }
    Report { checks }
}
