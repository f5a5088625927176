//! The claim as etcd users write it: a put-if-absent transaction with a
//! lease (built with `--features etcd`).
//!
//! - **claim**: `Txn(If create_revision(key) == 0, Then put(key, owner,
//!   lease))`; the lease is one per connection, granted before the clock
//!   starts (the run's duration plus 60 s, so that it outlives the run as
//!   the Idem and Redis claims' 60 s leases do), as a session's locks share
//!   its lease; it is revoked after the run.
//! - **cycle** (claim then complete): the claim above, then
//!   `Txn(If mod_revision(key) == the claim's revision, Then put(key,
//!   result, lease))`: the revision is the fence, so a complete by a
//!   former owner fails, as Idem's COMPLETE with a stale fence does.
//!
//! Each connection is one gRPC channel (one HTTP/2 connection) with
//! `pipeline` transactions in flight at a time, sent together and awaited
//! together, as the RESP pipeline sends a batch and reads its replies. A
//! transaction whose condition fails, or that errs, counts as an error.
//! Requests go to the leader (found with `Status` among the endpoints
//! given), as the Idem runs go to the Idem leader.

use std::time::Instant;

use crate::workload::{Driven, Measured, Progress, Spec, Workload, drive_all, latency_histogram};
use anyhow::Context;
use etcd_client::{Client, Compare, CompareOp, KvClient, PutOptions, Txn, TxnOp};

/// The lease of each connection's claims beyond the run's duration, s
/// (60 s, like the Idem and Redis claims' leases; nothing renews it, so it
/// also covers the run itself).
const LEASE_SECS: u64 = 60;

/// The endpoint among `endpoints` (comma-separated `host:port`) that leads
/// the etcd cluster.
pub async fn leader(endpoints: &str) -> anyhow::Result<String> {
    let list: Vec<&str> = endpoints.split(',').filter(|e| !e.is_empty()).collect();
    for ep in &list {
        let Ok(mut c) = Client::connect([*ep], None).await else {
            continue;
        };
        let Ok(status) = c.status().await else {
            continue;
        };
        let me = status.header().map(|h| h.member_id());
        if me.is_some() && me == Some(status.leader()) {
            return Ok((*ep).to_owned());
        }
    }
    anyhow::bail!("no etcd endpoint among {endpoints} reports itself as leader")
}

/// Runs `spec` (claim or cycle) against the etcd endpoint `spec.addr`.
pub async fn run(spec: &Spec) -> anyhow::Result<Measured> {
    anyhow::ensure!(
        matches!(spec.workload, Workload::Claim | Workload::Cycle),
        "etcd runs claim and cycle only"
    );
    let ttl = i64::try_from(LEASE_SECS + spec.duration.as_secs() + 1)?;
    // Every lease granted is revoked below, whether the run got as far as
    // measuring or not.
    let mut clients: Vec<(Client, i64)> = Vec::with_capacity(spec.connections);
    let measured = async {
        for _ in 0..spec.connections {
            let mut client = Client::connect([spec.addr.as_str()], None)
                .await
                .with_context(|| format!("connecting to etcd at {}", spec.addr))?;
            let lease = client
                .lease_grant(ttl, None)
                .await
                .context("granting a lease")?
                .id();
            clients.push((client, lease));
        }
        let conns = clients.iter().map(|(c, l)| (c.kv_client(), *l)).collect();
        drive_all(spec, conns, |(kv, lease), i, progress| {
            let spec = spec.clone();
            async move { drive(kv, lease, i, &spec, &progress).await }
        })
        .await
    }
    .await;
    // Off the clock, best effort: the run's keys go with their leases
    // now, instead of expiring under a later measurement.
    for (mut client, lease) in clients {
        if let Err(e) = client.lease_revoke(lease).await {
            eprintln!("etcd: cannot revoke lease {lease:x}: {e}");
        }
    }
    measured
}

/// What one transaction of a batch gave: its revision if it succeeded.
type Outcome = anyhow::Result<Option<i64>>;

async fn txn(mut kv: KvClient, t: Txn) -> Outcome {
    let resp = kv.txn(t).await?;
    Ok(resp
        .succeeded()
        .then(|| resp.header().map(|h| h.revision()))
        .flatten())
}

/// Sends every transaction of `batch` at once on the connection and waits
/// for all of them.
async fn all(kv: &KvClient, batch: Vec<Txn>) -> Vec<Outcome> {
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in batch.into_iter().enumerate() {
        let kv = kv.clone();
        set.spawn(async move { (i, txn(kv, t).await) });
    }
    let mut out: Vec<Option<Outcome>> = Vec::new();
    out.resize_with(set.len(), || None);
    while let Some(joined) = set.join_next().await {
        // A transaction whose task failed keeps no outcome: an error.
        if let Ok((i, r)) = joined {
            out[i] = Some(r);
        }
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(anyhow::anyhow!("lost"))))
        .collect()
}

async fn drive(
    kv: KvClient,
    lease: i64,
    idx: usize,
    spec: &Spec,
    progress: &Progress,
) -> anyhow::Result<Driven> {
    let mut hist = latency_histogram();
    let value = vec![b'v'; spec.value_size];
    let owner = format!("owner-{idx}");
    let put = || PutOptions::new().with_lease(lease);
    let (mut seq, mut errors, mut ops) = (0u64, 0u64, 0u64);
    let p = spec.pipeline;
    while !progress.stopped() {
        let t0 = Instant::now();
        let keys: Vec<Vec<u8>> = (0..p)
            .map(|_| {
                seq += 1;
                crate::workload::fresh_key(spec, idx, seq)
            })
            .collect();
        let claims = keys
            .iter()
            .map(|k| {
                Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k.clone(), owner.clone(), Some(put()))])
            })
            .collect();
        let claimed = all(&kv, claims).await;
        if spec.workload == Workload::Cycle {
            let mut completes = Vec::with_capacity(p);
            for (k, r) in keys.iter().zip(&claimed) {
                match r {
                    Ok(Some(rev)) => completes.push(
                        Txn::new()
                            .when([Compare::mod_revision(k.clone(), CompareOp::Equal, *rev)])
                            .and_then([TxnOp::put(k.clone(), value.clone(), Some(put()))]),
                    ),
                    _ => errors += 1,
                }
            }
            for r in all(&kv, completes).await {
                if !matches!(r, Ok(Some(_))) {
                    errors += 1;
                }
            }
        } else {
            errors += claimed.iter().filter(|r| !matches!(r, Ok(Some(_)))).count() as u64;
        }
        let us = t0.elapsed().as_micros() as u64;
        hist.record_n(us.max(1), p as u64)?;
        ops += p as u64;
        progress.done(p as u64);
    }
    Ok((hist, errors, ops))
}
