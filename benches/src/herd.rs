//! Herds: one owner, N waiters on one key. The time from the owner's
//! COMPLETE (or SET, or PUBLISH) until the last waiter has its answer, and
//! the requests it took.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_protocol::Frame;
use serde::Serialize;
use tokio::sync::Barrier;

use crate::conn::{Conn, info_field};

/// What a herd run measured.
#[derive(Debug, Clone, Serialize)]
pub struct HerdResult {
    /// Which mechanism.
    pub label: String,
    /// Waiters.
    pub waiters: usize,
    /// From the owner's write until the last waiter had its answer (µs).
    pub last_answer_us: u64,
    /// Median waiter (µs).
    pub median_answer_us: u64,
    /// Requests sent by owner and waiters, from the first wait to the last answer.
    pub requests: u64,
}

async fn connect_all(addr: &str, n: usize) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(
            Conn::connect(addr)
                .await
                .with_context(|| format!("connecting to {addr}"))?,
        );
    }
    Ok(conns)
}

fn summarize(label: &str, t0: Instant, mut times: Vec<Instant>, requests: u64) -> HerdResult {
    times.sort();
    let us = |t: &Instant| t.saturating_duration_since(t0).as_micros() as u64;
    HerdResult {
        label: label.into(),
        waiters: times.len(),
        last_answer_us: times.last().map_or(0, us),
        median_answer_us: times.get(times.len() / 2).map_or(0, us),
        requests,
    }
}

/// Idem: N `CLAIM key WAIT` parked server-side; one COMPLETE answers all.
pub async fn idem(addr: &str, waiters: usize, run_id: u64) -> anyhow::Result<HerdResult> {
    let key = format!("herd:{run_id}:{}", Instant::now().elapsed().as_nanos()).into_bytes();
    let mut owner = Conn::connect(addr).await?;
    let fence = match owner.call(&[b"CLAIM", &key, b"LEASE", b"60000"]).await? {
        Frame::Array(items) => match items.get(1) {
            Some(Frame::Integer(f)) => *f,
            other => bail!("owner claim: {other:?}"),
        },
        other => bail!("owner claim: {other:?}"),
    };
    let conns = connect_all(addr, waiters).await?;
    let mut tasks = Vec::with_capacity(waiters);
    for mut c in conns {
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            c.push(&[b"CLAIM", &key, b"WAIT", b"60000"]);
            c.flush().await?;
            let reply = c.read().await?;
            let at = Instant::now();
            match reply {
                Frame::Array(items) if items.first() == Some(&Frame::simple("COMPLETED")) => Ok(at),
                other => bail!("waiter got {other:?}"),
            }
        }));
    }
    // Wait until every waiter is parked.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = owner.call(&[b"INFO", b"clients"]).await?;
        if info_field(&info, "blocked_clients").unwrap_or(0) >= waiters as u64 {
            break;
        }
        if Instant::now() > deadline {
            bail!("waiters did not all park");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    let done = owner
        .call(&[
            b"COMPLETE",
            &key,
            fence.to_string().as_bytes(),
            b"herd-result",
        ])
        .await?;
    if done != Frame::simple("OK") {
        bail!("complete: {done:?}");
    }
    let mut times = Vec::with_capacity(waiters);
    for t in tasks {
        times.push(t.await??);
    }
    Ok(summarize("idem CLAIM WAIT", t0, times, waiters as u64 + 2))
}

/// Redis polling, as idempotency libraries do: every waiter GETs the key
/// every `poll` until it holds a result.
pub async fn redis_poll(
    addr: &str,
    waiters: usize,
    poll: Duration,
    run_id: u64,
) -> anyhow::Result<HerdResult> {
    let key = format!("herd-poll:{run_id}:{}", Instant::now().elapsed().as_nanos()).into_bytes();
    let mut owner = Conn::connect(addr).await?;
    owner.call(&[b"SET", &key, b"F:1", b"PX", b"60000"]).await?;
    let conns = connect_all(addr, waiters).await?;
    let requests = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(waiters + 1));
    let mut tasks = Vec::with_capacity(waiters);
    for mut c in conns {
        let key = key.clone();
        let requests = requests.clone();
        let ready = ready.clone();
        tasks.push(tokio::spawn(async move {
            let mut first = true;
            loop {
                let v = c.call(&[b"GET", &key]).await?;
                requests.fetch_add(1, Ordering::Relaxed);
                if first {
                    ready.wait().await;
                    first = false;
                }
                if let Frame::Bulk(b) = &v
                    && b.starts_with(b"C:")
                {
                    return Ok::<_, anyhow::Error>(Instant::now());
                }
                tokio::time::sleep(poll).await;
            }
        }));
    }
    ready.wait().await;
    // Let the pollers spread out over their interval, as they would in life.
    tokio::time::sleep(poll * 2).await;
    let t0 = Instant::now();
    owner
        .call(&[b"SET", &key, b"C:herd-result", b"PX", b"60000"])
        .await?;
    let mut times = Vec::with_capacity(waiters);
    for t in tasks {
        times.push(t.await??);
    }
    Ok(summarize(
        &format!("redis GET poll {}ms", poll.as_millis()),
        t0,
        times,
        requests.load(Ordering::Relaxed) + 2,
    ))
}

/// Redis PUBLISH fan-out to N subscribers: the floor for push on Redis.
pub async fn redis_publish(addr: &str, waiters: usize, run_id: u64) -> anyhow::Result<HerdResult> {
    let channel = format!("herd-pub:{run_id}:{}", Instant::now().elapsed().as_nanos()).into_bytes();
    let mut conns = connect_all(addr, waiters).await?;
    for c in conns.iter_mut() {
        c.push(&[b"SUBSCRIBE", &channel]);
        c.flush().await?;
        c.read().await?;
    }
    let mut tasks = Vec::with_capacity(waiters);
    for mut c in conns {
        tasks.push(tokio::spawn(async move {
            let msg = c.read().await?;
            let at = Instant::now();
            match msg {
                Frame::Array(items) if items.len() == 3 => Ok::<_, anyhow::Error>(at),
                other => bail!("subscriber got {other:?}"),
            }
        }));
    }
    let mut publisher = Conn::connect(addr).await?;
    let t0 = Instant::now();
    let n = publisher
        .call(&[b"PUBLISH", &channel, b"herd-result"])
        .await?;
    if n != Frame::Integer(waiters as i64) {
        bail!("PUBLISH reached {n:?}");
    }
    let mut times = Vec::with_capacity(waiters);
    for t in tasks {
        times.push(t.await??);
    }
    Ok(summarize(
        "redis PUBLISH fan-out",
        t0,
        times,
        waiters as u64 + 1,
    ))
}
