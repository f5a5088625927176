//! The raft engine on real processes: what was acknowledged survives a
//! kill -9, and one data directory serves one idemd at a time.

use std::path::PathBuf;

use idem_protocol::{ClaimReply, Frame, Outcome};

use crate::support::*;

struct DataDir(PathBuf);

impl DataDir {
    fn new(name: &str) -> DataDir {
        let p = std::env::temp_dir().join(format!("idem-it-{}", key(name)));
        let _ = std::fs::remove_dir_all(&p);
        DataDir(p)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CLAIM of `key` replays the completed `value`.
async fn assert_replays(c: &mut Conn, key: &str, value: &str) {
    assert_eq!(
        claim(c.cmd(&["CLAIM", key]).await),
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: value.to_owned().into()
        },
        "the acknowledged COMPLETE of {key} is not replayed"
    );
}

async fn raft(dir: &DataDir) -> Idemd {
    Idemd::start_with(&[], &["--engine", "raft", "--data-dir", dir.arg()]).await
}

/// Field `name` of an INSPECT reply (RESP2: a flat array of pairs).
fn field(f: &Frame, name: &str) -> Frame {
    let Frame::Array(items) = f else {
        panic!("INSPECT reply {f:?}")
    };
    items
        .chunks(2)
        .find(|p| matches!(&p[0], Frame::Bulk(b) | Frame::Simple(b) if b == name.as_bytes()))
        .map(|p| p[1].clone())
        .unwrap_or_else(|| panic!("no {name} in {f:?}"))
}

#[tokio::test]
async fn acknowledged_records_survive_kill_9() {
    let dir = DataDir::new("kill9");
    let mut s = raft(&dir).await;
    let mut c = s.conn().await;
    let (done, rec, owned) = (key("done"), key("rec"), key("owned"));
    let f1 = c.acquire(&["CLAIM", &done]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", &done, &f1.to_string(), "charged"])
            .await,
        ok()
    );
    let f2 = c
        .acquire(&["CLAIM", &rec, "LEASE", "60000", "ONEXPIRE", "RECOVER"])
        .await;
    assert_eq!(
        c.cmd(&["JOURNAL", &rec, &f2.to_string(), "step-3"]).await,
        ok()
    );
    let f3 = c.acquire(&["CLAIM", &owned, "LEASE", "60000"]).await;
    assert!(f1 < f2 && f2 < f3);
    s.kill().await;

    let s = raft(&dir).await;
    let mut c = s.conn().await;
    // The completed outcome is replayed.
    assert_replays(&mut c, &done, "charged").await;
    // The journal is there for whoever recovers, and the lease kept the
    // time it had left (the clock does not run while the node is down).
    let info = c.cmd(&["INSPECT", &rec]).await;
    assert_eq!(field(&info, "journal"), Frame::Bulk("step-3".into()));
    let Frame::Integer(left) = field(&info, "lease_ms") else {
        panic!("lease_ms")
    };
    assert!((50_000..=60_000).contains(&left), "lease left {left}");
    // The owner whose node restarted under it still owns its key.
    assert_eq!(
        c.cmd(&["COMPLETE", &owned, &f3.to_string(), "late"]).await,
        ok()
    );
    // Fences are never reused.
    let f4 = c.acquire(&["CLAIM", &key("after")]).await;
    assert!(f4 > f3, "fence {f4} after {f3}");
    let persistence = bulk(&c.cmd(&["INFO", "persistence"]).await);
    assert!(persistence.contains("engine:raft"), "{persistence}");
    assert!(
        persistence.contains(&format!(
            "data_dir:{}",
            std::fs::canonicalize(&dir.0).unwrap().display()
        )),
        "{persistence}"
    );
}

#[tokio::test]
async fn a_second_idemd_on_one_data_dir_is_refused() {
    let dir = DataDir::new("lock");
    let _first = raft(&dir).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--engine",
            "raft",
            "--data-dir",
            dir.arg(),
        ])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("idemd runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another idemd"), "{err}");
}

/// Many connections writing at once share log entries and fsyncs.
#[tokio::test]
async fn concurrent_writes_share_fsyncs() {
    let dir = DataDir::new("group");
    let s = raft(&dir).await;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            for i in 0..50 {
                let k = key(&format!("g{t}-{i}"));
                c.write(&["CLAIM", &k]).await;
            }
            for _ in 0..50 {
                assert!(matches!(
                    claim(c.reply().await),
                    ClaimReply::Acquired { .. }
                ));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut c = s.conn().await;
    let text = bulk(&c.cmd(&["INFO", "persistence"]).await);
    let get = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(get("wal_cmds") >= 800.0, "{text}");
    assert!(get("wal_cmds_per_fsync") > 1.0, "{text}");
    assert!(get("wal_fsync_p99_us") >= get("wal_fsync_p50_us"), "{text}");
    assert!(get("wal_fsync_p50_us") > 0.0, "{text}");
}

/// What the clients were told, over a run with crashes.
#[derive(Default)]
struct History {
    /// Keys whose COMPLETE was acknowledged, with the value.
    completed: Vec<(String, String)>,
    /// The largest fence acknowledged so far.
    max_fence: u64,
}

/// Runs claim/complete cycles from eight clients against idemd (started
/// with `env`) on one data dir, killing it (SIGKILL) at a random moment,
/// `rounds` times. After every restart it checks that every COMPLETE
/// acknowledged before replays with its value and that no fence
/// acknowledged before is handed out again; a lost reply counts as unknown.
/// Returns the number of acknowledged COMPLETEs, or the first violation.
async fn crash_history(env: &[(&str, &str)], rounds: usize) -> Result<usize, String> {
    use std::sync::{Arc, Mutex};
    let dir = DataDir::new("kill-load");
    let args = ["--engine", "raft", "--data-dir", dir.arg()];
    let history = Arc::new(Mutex::new(History::default()));
    let mut seed = std::process::id() as u64;
    for round in 0..rounds {
        let mut s = Idemd::start_with(env, &args).await;
        let mut c = s.conn().await;
        let (done, max_fence) = {
            let h = history.lock().unwrap();
            (h.completed.clone(), h.max_fence)
        };
        for (k, v) in &done {
            let got = claim(c.cmd(&["CLAIM", k]).await);
            let want = ClaimReply::Completed {
                outcome: Outcome::Ok,
                value: v.clone().into(),
            };
            if got != want {
                return Err(format!(
                    "round {round}: the acknowledged COMPLETE of {k} is lost: CLAIM answers {got:?}"
                ));
            }
        }
        let fresh = c.acquire(&["CLAIM", &key("probe")]).await;
        if fresh <= max_fence {
            return Err(format!(
                "round {round}: fence {fresh} handed out again (acknowledged up to {max_fence})"
            ));
        }
        // Load, then a kill at a random moment.
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (addr, history) = (s.addr, Arc::clone(&history));
            tasks.push(tokio::spawn(async move {
                let mut c = Conn::connect(addr).await;
                for i in 0.. {
                    let k = key(&format!("r{round}-t{t}-{i}"));
                    let Some(reply) = c.try_cmd(&["CLAIM", &k]).await else {
                        return;
                    };
                    let ClaimReply::Acquired { fence } = claim(reply) else {
                        panic!("fresh key not acquired")
                    };
                    {
                        let mut h = history.lock().unwrap();
                        h.max_fence = h.max_fence.max(fence);
                    }
                    let v = format!("v-{fence}");
                    match c.try_cmd(&["COMPLETE", &k, &fence.to_string(), &v]).await {
                        Some(r) if r == ok() => history.lock().unwrap().completed.push((k, v)),
                        Some(r) => panic!("COMPLETE answered {r:?}"),
                        // The reply was lost in the crash: unknown.
                        None => return,
                    }
                }
            }));
        }
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(std::time::Duration::from_millis(50 + (seed >> 33) % 300)).await;
        s.kill().await;
        for t in tasks {
            t.await.unwrap();
        }
    }
    let n = history.lock().unwrap().completed.len();
    Ok(n)
}

#[tokio::test]
async fn kill_9_under_load_loses_no_acknowledged_complete() {
    let completed = crash_history(&[], 6)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert!(completed > 100, "only {completed} completes");
}

/// The same check against a build that acknowledges writes before they are
/// written (a switch of debug builds): it must find the loss.
#[cfg(debug_assertions)]
#[tokio::test]
async fn the_crash_check_catches_a_server_that_acknowledges_before_writing() {
    let result = crash_history(&[("IDEMD_UNSAFE_TEST_ACK_BEFORE_WRITE", "1")], 6).await;
    assert!(
        result.is_err(),
        "acknowledging before writing went unnoticed: {result:?}"
    );
    eprintln!("found as expected: {}", result.unwrap_err());
}

/// A small tmpfs, unmounted when dropped (`None` where mounting is not
/// permitted, e.g. without root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(name: &str, bytes: u64) -> Option<Tmpfs> {
        let p = std::env::temp_dir().join(format!("idem-fs-{}", key(name)));
        std::fs::create_dir_all(&p).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(&p)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("cannot mount a tmpfs here (needs root): disk-full test not run");
            let _ = std::fs::remove_dir(&p);
            return None;
        }
        Some(Tmpfs(p))
    }

    /// Fills the filesystem to within `leave` bytes of full.
    fn fill(&self, leave: u64) -> PathBuf {
        let free = fs4::available_space(&self.0).unwrap();
        let filler = self.0.join("filler");
        let f = std::fs::File::create(&filler).unwrap();
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        let chunk = vec![0u8; 4096];
        let mut left = free.saturating_sub(leave);
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if w.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
        let _ = w.flush();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_nearly_full_disk_refuses_writes_serves_replays_and_recovers() {
    let Some(fs) = Tmpfs::mount("full", 16 << 20) else {
        return;
    };
    let data = fs.0.join("data");
    let s = Idemd::start_with(
        &[("IDEM_MIN_FREE_DISK_BYTES", "4194304")],
        &["--engine", "raft", "--data-dir", data.to_str().unwrap()],
    )
    .await;
    let mut c = s.conn().await;
    let done = key("done");
    let f = c.acquire(&["CLAIM", &done]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", &done, &f.to_string(), "kept"]).await,
        ok()
    );
    let filler = fs.fill(2 << 20);
    let r = c.cmd(&["CLAIM", &key("new")]).await;
    assert!(err(&r).starts_with("TRYAGAIN disk full"), "{r:?}");
    // Replays and reads do not need the log.
    assert_replays(&mut c, &done, "kept").await;
    assert!(matches!(c.cmd(&["INSPECT", &done]).await, Frame::Array(_)));
    // Space returns: writes resume by themselves.
    std::fs::remove_file(filler).unwrap();
    c.acquire(&["CLAIM", &key("after")]).await;
}

#[tokio::test]
async fn a_failed_log_write_stops_idemd_and_a_restart_recovers_the_synced_prefix() {
    let Some(fs) = Tmpfs::mount("enospc", 16 << 20) else {
        return;
    };
    let data = fs.0.join("data");
    let args = ["--engine", "raft", "--data-dir", data.to_str().unwrap()];
    let env = [("IDEM_MIN_FREE_DISK_BYTES", "0")];
    let mut s = Idemd::start_with(&env, &args).await;
    let mut c = s.conn().await;
    let done = key("done");
    let f = c.acquire(&["CLAIM", &done]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", &done, &f.to_string(), "kept"]).await,
        ok()
    );
    let filler = fs.fill(0);
    // Writes until the log cannot take one: the write is never
    // acknowledged, and idemd stops.
    let big = "x".repeat(512 * 1024);
    let mut refused = false;
    for i in 0..64 {
        let k = key(&format!("w{i}"));
        match c.try_cmd(&["CLAIM", &k]).await {
            Some(r) if matches!(claim_or_none(&r), Some(ClaimReply::Acquired { .. })) => {
                let ClaimReply::Acquired { fence } = claim(r) else {
                    unreachable!()
                };
                if c.try_cmd(&["COMPLETE", &k, &fence.to_string(), &big])
                    .await
                    .is_none()
                {
                    refused = true;
                    break;
                }
            }
            _ => {
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "the full disk never stopped a write");
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), s.child.wait())
        .await
        .expect("idemd stopped")
        .unwrap();
    assert_eq!(status.code(), Some(70), "{status:?}");
    std::fs::remove_file(filler).unwrap();
    let s = Idemd::start_with(&env, &args).await;
    let mut c = s.conn().await;
    assert_replays(&mut c, &done, "kept").await;
}

fn claim_or_none(f: &Frame) -> Option<ClaimReply> {
    match f {
        Frame::Array(_) => Some(claim(f.clone())),
        _ => None,
    }
}

/// With the proposal queue at its smallest, pipelined writes of one
/// connection still take effect in order, and a read behind them sees them.
#[tokio::test]
async fn pipelined_writes_keep_their_order_when_the_queue_is_full() {
    let dir = DataDir::new("order");
    let s = Idemd::start_with(
        &[("IDEM_MAX_PENDING_PROPOSALS", "1")],
        &["--engine", "raft", "--data-dir", dir.arg()],
    )
    .await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            for i in 0..20 {
                let k = key(&format!("o{t}-{i}"));
                let f = c.acquire(&["CLAIM", &k]).await.to_string();
                c.write(&["JOURNAL", &k, &f, "first"]).await;
                c.write(&["JOURNAL", &k, &f, "second"]).await;
                c.write(&["INSPECT", &k]).await;
                c.write(&["COMPLETE", &k, &f, "done"]).await;
                c.write(&["SETTLE", &k, "WAIT", "1000"]).await;
                assert_eq!(c.reply().await, ok());
                assert_eq!(c.reply().await, ok());
                let info = c.reply().await;
                assert_eq!(field(&info, "journal"), Frame::Bulk("second".into()));
                assert_eq!(c.reply().await, ok());
                assert_eq!(
                    settle(c.reply().await),
                    idem_protocol::SettleReply::Completed {
                        outcome: Outcome::Ok,
                        value: "done".into()
                    }
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// The data directory written by the first durable release
/// (`tests/fixtures/data-v1`) opens and replays identically.
#[tokio::test]
async fn a_data_dir_of_the_first_durable_release_replays_identically() {
    let dir = DataDir::new("fixture");
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data-v1");
    std::fs::create_dir_all(dir.0.join("log")).unwrap();
    for f in ["log/00000000000000000000.wal", "log/meta"] {
        std::fs::copy(fixture.join(f), dir.0.join(f)).unwrap();
    }
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    assert_replays(&mut c, "fixture:paid", "receipt-42").await;
    assert_eq!(
        claim(c.cmd(&["CLAIM", "fixture:declined", "FP", "fp-1"]).await),
        ClaimReply::Completed {
            outcome: Outcome::Err,
            value: "card declined".into()
        }
    );
    assert!(
        err(&c.cmd(&["CLAIM", "fixture:declined", "FP", "fp-2"]).await).starts_with("MISMATCH")
    );
    let info = c.cmd(&["INSPECT", "fixture:charging"]).await;
    assert_eq!(field(&info, "state"), Frame::simple("in_flight"));
    assert_eq!(field(&info, "fence"), Frame::Integer(3));
    assert_eq!(field(&info, "journal"), Frame::Bulk("gateway-req-9".into()));
    assert_eq!(field(&info, "attempt"), Frame::Bulk("a-7".into()));
    // The owner's retry gets its key back; the released key is free; fences
    // continue after the last one handed out.
    assert_eq!(
        c.acquire(&["CLAIM", "fixture:charging", "ATTEMPT", "a-7"])
            .await,
        3
    );
    assert_eq!(c.acquire(&["CLAIM", "fixture:released"]).await, 5);
}
