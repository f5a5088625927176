//! Resident memory per completed record.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::conn::{Conn, info_field};
use crate::workload::{Flavor, populate};

/// What a memory run measured.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryResult {
    /// Which server.
    pub label: String,
    /// Records loaded.
    pub records: u64,
    /// Resident bytes before loading.
    pub rss_before: u64,
    /// Resident bytes after loading.
    pub rss_after: u64,
    /// (after - before) / records.
    pub bytes_per_record: f64,
}

/// Resident set size of a process, from /proc.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Loads `records` completed records (32-byte keys, `value_size`-byte
/// values) and measures the server's resident growth. The server's pid is
/// read from its INFO (`process_id`), so it must run on this machine.
pub async fn measure(
    addr: &str,
    flavor: Flavor,
    records: u64,
    value_size: usize,
    run_id: u64,
) -> anyhow::Result<MemoryResult> {
    let mut c = Conn::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let info = c.call(&[b"INFO", b"server"]).await?;
    let Some(pid) = info_field(&info, "process_id") else {
        bail!("no process_id in INFO")
    };
    let pid = pid as u32;
    let before = rss_bytes(pid).context("cannot read the server's RSS (is it on this machine?)")?;
    let value = vec![b'm'; value_size];
    let conns = 8u64;
    let per = records / conns;
    let mut tasks = Vec::new();
    for t in 0..conns {
        let addr = addr.to_owned();
        let value = value.clone();
        let n = if t == conns - 1 {
            records - per * (conns - 1)
        } else {
            per
        };
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(&addr).await?;
            let mut i = 0;
            while i < n {
                let batch = (n - i).min(1000);
                let keys = (i..i + batch)
                    .map(|j| format!("m{:05}{:02}{:024}", run_id % 100_000, t, j).into_bytes())
                    .collect();
                populate(&mut c, flavor, keys, &value).await?;
                i += batch;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_bytes(pid).context("cannot read the server's RSS")?;
    Ok(MemoryResult {
        label: if flavor.is_redis() {
            "redis".into()
        } else {
            "idem".into()
        },
        records,
        rss_before: before,
        rss_after: after,
        bytes_per_record: after.saturating_sub(before) as f64 / records as f64,
    })
}
