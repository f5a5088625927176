//! The raft engine on real processes: what was acknowledged survives a
//! kill -9, and one data directory serves one idemd at a time.

use std::path::PathBuf;

use idem_protocol::{ClaimReply, Frame, Outcome};

use crate::support::*;

/// Field `name` of an INFO text, as a number.
fn info_num(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} in {text}"))
        .trim()
        .parse()
        .unwrap()
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
    raft_with(dir, &[]).await
}

/// idemd on the raft engine in `dir`, with environment `env`.
async fn raft_with(dir: &DataDir, env: &[(&str, &str)]) -> Idemd {
    Idemd::start_with(env, &["--engine", "raft", "--data-dir", dir.arg()]).await
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

/// The time a single node sat idle before it stopped counts against its
/// leases: its clock continues from where it was when it stopped, not from
/// its last write (a lease with 57 s left came back with 59 s).
#[tokio::test]
async fn a_lease_keeps_the_time_it_had_left_after_an_idle_spell_and_a_restart() {
    let dir = DataDir::new("idle-lease");
    let mut s = raft(&dir).await;
    let mut c = s.conn().await;
    let k = key("idle");
    c.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let before = c.cmd(&["INSPECT", &k]).await;
    let Frame::Integer(before) = field(&before, "lease_ms") else {
        panic!("lease_ms")
    };
    assert!(before <= 57_100, "lease left before the stop: {before}");
    s.kill().await;
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    let after = c.cmd(&["INSPECT", &k]).await;
    let Frame::Integer(after) = field(&after, "lease_ms") else {
        panic!("lease_ms")
    };
    // At most a single node's tick (1 s) and the requests' time more.
    assert!(
        after <= before + 1_500,
        "lease left {before} ms at the stop, {after} ms after the restart"
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

/// A file where the data directory should be is named for what it is
/// (it was `File exists (os error 17)`).
#[test]
fn a_file_given_as_the_data_dir_is_refused_as_such() {
    let dir = DataDir::new("a-file");
    std::fs::write(&dir.0, b"not a directory").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(["--listen", "127.0.0.1:0", "--data-dir", dir.arg()])
        .output()
        .expect("idemd runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a directory"), "{err}");
    std::fs::remove_file(&dir.0).unwrap();
}

/// A data directory written by a newer idemd (or not by idemd at all) is
/// refused with the reason, and left untouched.
#[tokio::test]
async fn a_data_dir_of_a_newer_or_foreign_format_is_refused() {
    let dir = DataDir::new("newer");
    raft(&dir).await.kill().await;
    let format = dir.0.join("FORMAT");
    assert_eq!(
        std::fs::read_to_string(&format).unwrap(),
        "idem-data-format 1\n"
    );
    for (content, says) in [
        (
            "idem-data-format 99\n",
            "format 99 is newer than this idemd reads",
        ),
        ("hello\n", "not an Idem data directory format file"),
    ] {
        std::fs::write(&format, content).unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
            .args(["--listen", "127.0.0.1:0", "--data-dir", dir.arg()])
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("idemd runs");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
        assert_eq!(std::fs::read_to_string(&format).unwrap(), content);
    }
}

/// idemd run to its exit on `dir`: its status and what it printed.
async fn idemd_exit(dir: &str) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(["--listen", "127.0.0.1:0", "--data-dir", dir])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), out)
        .await
        .expect("idemd gave up in time")
        .expect("idemd runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A data directory that cannot be used is a clear startup error naming
/// it: a path through a file, and a read-only filesystem (where mounting
/// one is permitted).
#[tokio::test]
async fn an_unusable_data_dir_is_a_clear_startup_error() {
    let file = std::env::temp_dir().join(format!("idem-it-{}", key("file")));
    std::fs::write(&file, b"not a directory").unwrap();
    let under = file.join("data");
    let (ok, err) = idemd_exit(under.to_str().unwrap()).await;
    assert!(!ok);
    assert!(
        err.contains("data directory") && err.contains(under.to_str().unwrap()),
        "{err}"
    );
    std::fs::remove_file(&file).unwrap();

    let Some(fs) = Tmpfs::mount("ro", 16 << 20) else {
        return;
    };
    // A data directory written once, then its filesystem made read-only.
    let data = fs.0.join("data");
    let env = [
        ("IDEM_MIN_FREE_DISK_BYTES", "0"),
        ("IDEM_WAL_SEGMENT_BYTES", "1048576"),
    ];
    let s = Idemd::start_with(
        &env,
        &["--engine", "raft", "--data-dir", data.to_str().unwrap()],
    )
    .await;
    let mut c = s.conn().await;
    c.acquire(&["CLAIM", &key("ro")]).await;
    drop(c);
    let mut s = s;
    s.kill().await;
    let remounted = std::process::Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&fs.0)
        .status()
        .is_ok_and(|st| st.success());
    assert!(remounted, "cannot remount the tmpfs read-only");
    let (ok, err) = idemd_exit(data.to_str().unwrap()).await;
    assert!(!ok);
    assert!(err.contains(data.to_str().unwrap()), "{err}");
    assert!(err.to_lowercase().contains("read-only"), "{err}");
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
    let get = |name: &str| info_num(&text, name);
    assert!(get("wal_cmds") >= 800.0, "{text}");
    assert!(get("wal_cmds_per_fsync") > 1.0, "{text}");
    assert!(get("wal_fsync_p99_us") >= get("wal_fsync_p50_us"), "{text}");
    assert!(get("wal_fsync_p50_us") > 0.0, "{text}");
}

/// INFO's replication section reports the log and snapshots: a snapshot
/// every 20 entries here, so a few hundred writes build several.
#[tokio::test]
async fn info_reports_the_log_and_its_snapshots() {
    let dir = DataDir::new("info");
    let s = raft_with(&dir, &[("IDEM_SNAPSHOT_ENTRIES", "20")]).await;
    let mut c = s.conn().await;
    for i in 0..200 {
        c.acquire(&["CLAIM", &key(&format!("info-{i}"))]).await;
    }
    let text = eventually("a snapshot built", async || {
        let text = bulk(&c.cmd(&["INFO", "replication"]).await);
        (!text.contains("raft_snapshots_built:0\r\n")).then_some(text)
    })
    .await;
    let get = |name: &str| info_num(&text, name);
    assert!(
        text.contains("role:master\r\nconnected_slaves:0\r\n"),
        "{text}"
    );
    assert_eq!(
        get("master_repl_offset"),
        get("raft_last_log_index"),
        "{text}"
    );
    // ROLE: a primary without replicas, at its last log index.
    let Frame::Array(role) = c.cmd(&["ROLE"]).await else {
        panic!("ROLE is an array")
    };
    assert_eq!(role[0], Frame::Bulk("master".into()));
    assert_eq!(int(&role[1]) as f64, get("raft_last_log_index"));
    assert_eq!(role[2], Frame::Array(vec![]));
    assert_eq!(get("raft_leader"), 1.0, "{text}");
    assert!(get("raft_term") >= 1.0, "{text}");
    // One entry per write here (sequential), plus the leader's blank
    // entry and the membership.
    assert!(get("raft_last_log_index") >= 200.0, "{text}");
    assert_eq!(
        get("raft_commit_index"),
        get("raft_last_log_index"),
        "{text}"
    );
    assert_eq!(
        get("raft_applied_index"),
        get("raft_commit_index"),
        "{text}"
    );
    assert!(get("raft_snapshots_built") >= 1.0, "{text}");
    let index = get("raft_snapshot_index");
    assert!(
        index >= 20.0 && index <= get("raft_applied_index"),
        "{text}"
    );
    assert!(get("raft_snapshot_time_sec") >= 0.0, "{text}");
    assert!(
        get("raft_snapshot_pause_max_ms") >= get("raft_snapshot_pause_ms"),
        "{text}"
    );
}

/// What a crash run exercised.
#[derive(Debug, Default)]
struct Exercised {
    calls: usize,
    unknown: usize,
    completes: usize,
    recovers: usize,
    fenced: usize,
}

/// Runs the owner load from eight clients against idemd (started with
/// `env`) on one data directory, killing it (SIGKILL) at a random moment,
/// `rounds` times. After every restart a prober claims every key used so
/// far (acknowledged COMPLETEs must replay, leases cut by the crash must
/// still hold, abandoned keys hand over their journals), and the whole
/// history is checked (see `support::history`). Returns what was
/// exercised, or the violations found.
async fn crash_history(env: &[(&str, &str)], rounds: usize) -> Result<Exercised, String> {
    use history::{History, Recorder};
    let dir = DataDir::new("kill-load");
    let args = ["--engine", "raft", "--data-dir", dir.arg()];
    let history = History::default();
    let seed = std::process::id() as u64 ^ 0x9e37_79b9;
    let mut rng = history::Rng(seed);
    let prefix = key("h");
    for round in 0..=rounds {
        let mut s = Idemd::start_with(env, &args).await;
        let mut prober = Recorder::new(usize::MAX, s.conn().await, &history);
        history::probe_and_check(&mut prober, &history, seed, round).await?;
        if round == rounds {
            break;
        }
        let mut tasks = Vec::new();
        for t in 0..8 {
            let mut rec = Recorder::new(t, s.conn().await, &history);
            let prefix = format!("{prefix}-r{round}");
            let mut load_rng = history::Rng(rng.below(u64::MAX));
            let load = async move {
                history::owner_load(&mut rec, &prefix, &[150, 250], &mut load_rng).await
            };
            tasks.push(tokio::spawn(load));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100 + rng.below(500))).await;
        s.kill().await;
        for t in tasks {
            t.await.unwrap();
        }
    }
    let events = history.events();
    let grants_of = |e: &history::Event, recover: bool| {
        matches!(&e.reply, Some((_, r)) if matches!(
            ClaimReply::from_frame(r.clone()),
            Ok(ClaimReply::Recover { .. }) if recover
        ))
    };
    Ok(Exercised {
        calls: events.len(),
        unknown: events.iter().filter(|e| e.reply.is_none()).count(),
        completes: history.completed().len(),
        recovers: events.iter().filter(|e| grants_of(e, true)).count(),
        fenced: events
            .iter()
            .filter(|e| matches!(&e.reply, Some((_, Frame::Error(m))) if m.starts_with(b"FENCED")))
            .count(),
    })
}

/// Twenty kill -9 cycles at random moments under owner load: the whole
/// history keeps every promise (`support::history`).
#[tokio::test]
async fn kill_9_under_load_keeps_every_promise_over_the_whole_history() {
    let ran = crash_history(&[], 20)
        .await
        .unwrap_or_else(|violations| panic!("{violations}"));
    eprintln!("{ran:?}");
    // The run must have exercised what the checker checks.
    assert!(ran.completes > 100, "{ran:?}");
    assert!(ran.recovers > 0, "{ran:?}");
    assert!(ran.fenced > 0, "{ran:?}");
    assert!(ran.unknown > 0, "{ran:?}");
    assert!(ran.calls > ran.completes, "{ran:?}");
}

/// The same check against a build that acknowledges writes before they are
/// written (a switch of debug builds): it must find the loss.
#[cfg(debug_assertions)]
#[tokio::test]
async fn the_crash_check_catches_a_server_that_acknowledges_before_writing() {
    let result = crash_history(&[("IDEMD_UNSAFE_TEST_ACK_BEFORE_WRITE", "1")], 20).await;
    assert!(
        result.is_err(),
        "acknowledging before writing went unnoticed: {result:?}"
    );
    eprintln!("found as expected: {}", result.unwrap_err());
}

/// The same check against a build that hands out fences again after a
/// restart (a switch of debug builds): it must find the reuse.
#[cfg(debug_assertions)]
#[tokio::test]
async fn the_crash_check_catches_a_server_that_reuses_fences() {
    let result = crash_history(&[("IDEMD_UNSAFE_TEST_REUSE_FENCES", "1")], 20).await;
    let found = result.expect_err("reused fences went unnoticed");
    assert!(found.contains("fence"), "{found}");
    eprintln!("found as expected: {found}");
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
    let persistence = async |c: &mut Conn| bulk(&c.cmd(&["INFO", "persistence"]).await);
    let text = persistence(&mut c).await;
    assert!(info_num(&text, "disk_free_bytes") >= 4194304.0, "{text}");
    assert_eq!(info_num(&text, "min_free_disk_bytes"), 4194304.0, "{text}");
    assert_eq!(info_num(&text, "disk_full_refusals"), 0.0, "{text}");
    let filler = fs.fill(2 << 20);
    let r = c.cmd(&["CLAIM", &key("new")]).await;
    assert!(err(&r).starts_with("TRYAGAIN disk full"), "{r:?}");
    // INFO shows why: the free space below the minimum, the refusal.
    let text = persistence(&mut c).await;
    assert!(info_num(&text, "disk_free_bytes") < 4194304.0, "{text}");
    assert_eq!(info_num(&text, "disk_full_refusals"), 1.0, "{text}");
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
    let s = raft_with(&dir, &[("IDEM_MAX_PENDING_PROPOSALS", "1")]).await;
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

/// What the fixtures' first commands left (see their READMEs): a
/// completed key, a permanent error with a fingerprint, an owner in flight
/// with a journal and an attempt id.
async fn assert_first_release_records(c: &mut Conn) {
    assert_replays(c, "fixture:paid", "receipt-42").await;
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
    assert_first_release_records(&mut c).await;
    // The owner's retry gets its key back; the released key is free; fences
    // continue after the last one handed out.
    assert_eq!(
        c.acquire(&["CLAIM", "fixture:charging", "ATTEMPT", "a-7"])
            .await,
        3
    );
    assert_eq!(c.acquire(&["CLAIM", "fixture:released"]).await, 5);
}

/// The data directory with a snapshot written by the first durable release
/// (`tests/fixtures/data-v1-snapshot`) opens from its snapshot plus the log
/// after it, and replays identically.
#[tokio::test]
async fn a_data_dir_with_a_snapshot_of_the_first_durable_release_replays_identically() {
    let dir = DataDir::new("fixture-snap");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/data-v1-snapshot/data");
    std::fs::create_dir_all(dir.0.join("log")).unwrap();
    for f in [
        "FORMAT",
        "snapshot",
        "log/00000000000000000000.wal",
        "log/meta",
    ] {
        std::fs::copy(fixture.join(f), dir.0.join(f)).unwrap();
    }
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    assert_eq!(info_field(&mut c, "raft_snapshot_index").await, 7);
    assert_first_release_records(&mut c).await;
    assert_replays(&mut c, "fixture:late", "after-snapshot").await;
    let open = c.cmd(&["INSPECT", "fixture:open"]).await;
    assert_eq!(field(&open, "state"), Frame::simple("in_flight"));
    assert_eq!(field(&open, "fence"), Frame::Integer(6));
    assert_eq!(
        c.acquire(&["CLAIM", "fixture:charging", "ATTEMPT", "a-7"])
            .await,
        3
    );
    assert_eq!(c.acquire(&["CLAIM", "fixture:released"]).await, 7);
}

/// `n` claims of fresh 40-byte keys (`prefix` and a number) written at
/// once: each must be acquired.
async fn burst_of_claims(c: &mut Conn, prefix: &str, n: i64) {
    let mut wire = Vec::new();
    for i in 0..n {
        let k = format!("{}-{i:030}", key(prefix));
        wire.extend_from_slice(format!("*2\r\n$5\r\nCLAIM\r\n${}\r\n{k}\r\n", k.len()).as_bytes());
    }
    c.write_raw(&wire).await;
    for _ in 0..n {
        assert!(matches!(
            claim(c.reply().await),
            ClaimReply::Acquired { .. }
        ));
    }
}

/// After a burst of 1M claims the log stayed in memory, decoded (about
/// 280 MB for 45 MB of log), until a later burst reached the snapshot
/// thresholds. Now the log is held encoded, and once the server goes quiet
/// it snapshots and purges it: INFO's `raft_log_bytes` falls to a few
/// bytes (the clock's ticks while the claims' leases are live).
#[tokio::test]
async fn a_quiet_server_snapshots_so_a_bursts_log_leaves_memory() {
    let dir = DataDir::new("quiet");
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    // 30,000 claims of 40-byte keys: over a MiB of log, far below the
    // snapshot thresholds (10,000 entries: they are batched; 64 MiB).
    let n = 30_000;
    burst_of_claims(&mut c, "q", n).await;
    let text = bulk(&c.cmd(&["INFO", "replication"]).await);
    let held = info_num(&text, "raft_log_bytes");
    assert!(held > 1_048_576.0, "{text}");
    let built = info_num(&text, "raft_snapshots_built");
    // Quiet (no command for a second or more): snapshotted and purged.
    // Looked at seldom, since each look is a command.
    let mut text = String::new();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        text = bulk(&c.cmd(&["INFO", "replication"]).await);
        if info_num(&text, "raft_log_bytes") < 4096.0 {
            break;
        }
    }
    assert!(info_num(&text, "raft_log_bytes") < 4096.0, "{text}");
    assert!(info_num(&text, "raft_snapshots_built") > built, "{text}");
    // Nothing was lost on the way: a restart still knows every owner.
    drop(c);
    let mut s = s;
    s.kill().await;
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), n);
}

/// A trickle of requests after a burst (a health check twice a second)
/// kept the server from ever counting as quiet: the burst's log stayed in
/// memory, unpurged, for as long as the trickle went on (160 MB held for
/// a burst of 1M claims whose records were all gone). A trickle now
/// counts as quiet.
#[tokio::test]
async fn a_trickle_of_requests_does_not_keep_a_bursts_log_in_memory() {
    let dir = DataDir::new("trickle");
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    burst_of_claims(&mut c, "t", 30_000).await;
    let text = bulk(&c.cmd(&["INFO", "replication"]).await);
    assert!(info_num(&text, "raft_log_bytes") > 1_048_576.0, "{text}");
    // A health check every 300 ms, and a short claim now and then.
    let mut hc = s.conn().await;
    let trickle = tokio::spawn(async move {
        for i in 0u64.. {
            assert_eq!(hc.cmd(&["PING"]).await, Frame::simple("PONG"));
            if i % 5 == 0 {
                hc.cmd(&["CLAIM", &format!("trickle-{i}"), "LEASE", "100"])
                    .await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    });
    let mut text = String::new();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        text = bulk(&c.cmd(&["INFO", "replication"]).await);
        if info_num(&text, "raft_log_bytes") < 65_536.0 {
            break;
        }
    }
    trickle.abort();
    assert!(info_num(&text, "raft_log_bytes") < 65_536.0, "{text}");
}

/// A snapshot that took long (a large store on a busy disk: 11 s) let the
/// log grow at the write rate meanwhile: 1.16 GB held against a 64 MiB
/// threshold, the process peaking at 2.57 GB. Writes now wait once the
/// log holds four times what makes a snapshot due. Here each snapshot
/// takes 3 s to build, the threshold is 1 MiB, and claims are completed
/// with 16 KB values as fast as the server takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_bounded_while_a_snapshot_is_slow() {
    if !cfg!(debug_assertions) {
        return; // The slow snapshots are a debug build's.
    }
    let dir = DataDir::new("slow-snapshot-log");
    let env = [
        ("IDEM_SNAPSHOT_LOG_BYTES", "1048576"),
        ("IDEM_SNAPSHOT_LOG_PERCENT", "0"),
        ("IDEM_MAX_BATCH_BYTES", "262144"),
        ("IDEMD_TEST_SNAPSHOT_BUILD_MS", "3000"),
    ];
    let s = raft_with(&dir, &env).await;
    let writer = {
        let mut c = s.conn().await;
        tokio::spawn(async move {
            let journal = "v".repeat(16_000);
            let started = tokio::time::Instant::now();
            let mut i = 0u64;
            while started.elapsed() < std::time::Duration::from_secs(8) {
                let keys: Vec<String> = (0..32)
                    .map(|j| format!("slow-snap-{}", i * 32 + j))
                    .collect();
                let mut out = bytes::BytesMut::new();
                for k in &keys {
                    idem_protocol::encode(
                        &cmd_frame(&["CLAIM", k, "LEASE", "60000"]),
                        idem_protocol::Version::Resp2,
                        &mut out,
                    );
                }
                c.write_raw(&out).await;
                let mut fences = Vec::new();
                for _ in &keys {
                    match claim(c.reply().await) {
                        ClaimReply::Acquired { fence } => fences.push(fence.to_string()),
                        other => panic!("{other:?}"),
                    }
                }
                let mut out = bytes::BytesMut::new();
                for (k, f) in keys.iter().zip(&fences) {
                    idem_protocol::encode(
                        &cmd_frame(&["COMPLETE", k, f, &journal, "RETAIN", "1000"]),
                        idem_protocol::Version::Resp2,
                        &mut out,
                    );
                }
                c.write_raw(&out).await;
                for _ in &keys {
                    assert_eq!(c.reply().await, ok());
                }
                i += 1;
            }
            i * 32
        })
    };
    let mut info = s.conn().await;
    let mut most = 0.0f64;
    while !writer.is_finished() {
        let text = bulk(&info.cmd(&["INFO", "replication"]).await);
        most = most.max(info_num(&text, "raft_log_bytes"));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let claims = writer.await.unwrap();
    let text = bulk(&info.cmd(&["INFO"]).await);
    assert!(claims > 100, "{claims} claims");
    // Four times the 1 MiB threshold, plus the entries in flight.
    assert!(most < 5.0 * 1_048_576.0, "the log reached {most} bytes");
    assert!(info_num(&text, "log_full_waits") > 0.0, "{text}");
}

/// A restart read the whole snapshot file into memory and decoded every
/// record into a list before loading it: a node of 3.2M small records
/// that ran at 332 MB peaked at 852 MB to start again, so a node sized
/// for its limit could not restart. Now the file is read a part at a
/// time, and the records are checked, then loaded, one at a time.
#[tokio::test]
async fn a_restart_does_not_hold_the_snapshot_beside_the_store() {
    let dir = DataDir::new("restart-peak");
    let env = [
        ("IDEM_SNAPSHOT_LOG_BYTES", "1048576"),
        ("IDEM_SNAPSHOT_LOG_PERCENT", "0"),
        // The default 64 MiB log segment, which holds the whole fill's
        // log: a restart copied every record out of it, the ones the
        // snapshot covers too (38-62 MB here); now only those it keeps
        // (the unit test `records_a_snapshot_covers_are_checked_but_not_
        // copied_out` pins that down; this peak swings too much to).
    ];
    let s = raft_with(&dir, &env).await;
    let mut c = s.conn().await;
    fill(&mut c, "r", 300_000).await;
    // Snapshotted, the log left small.
    eventually("a snapshot of nearly all of it", async || {
        (info_field(&mut c, "raft_log_bytes").await < 4 << 20
            && info_field(&mut c, "raft_snapshots_built").await >= 1)
            .then_some(())
    })
    .await;
    let used = info_field(&mut c, "used_memory").await;
    let mut s = s;
    s.kill().await;
    // What a server holds with nothing in it.
    let base = raft_with(&DataDir::new("restart-peak-empty"), &env)
        .await
        .rss();
    let s = raft_with(&dir, &env).await;
    let mut c = s.conn().await;
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), 300_000);
    // Measured (debug build): the restart's peak grew the server by 1.5
    // times the records' accounted bytes (the store's own overhead and up
    // to 4 MiB of log replayed; 33-37 MB for 24 MB); with the log the
    // snapshot covers copied out too, 1.6-2.6; with the file and the
    // decoded records held, 3.4.
    let peak = s.peak_rss().saturating_sub(base);
    eprintln!("restart peak: {peak} bytes past an empty server for {used} bytes of records");
    assert!(
        peak < used * 11 / 5,
        "loading {used} bytes of records took the server {peak} bytes past an empty one"
    );
}

/// The state machine kept the latest snapshot's bytes in memory, besides
/// the file (for a follower that might need it): with 100 MiB of values
/// the server held about 200 MiB once quiet, and sat at about 1.7 times
/// `max_memory_bytes` when it refused claims for memory. Now the snapshot
/// lives in its file alone, read when a follower needs it. And it was
/// encoded whole in memory before it was written, taking the server's
/// peak to twice the records' bytes; now it is encoded straight into the
/// file, a part at a time.
#[tokio::test]
async fn a_snapshot_is_not_held_in_memory_beside_its_file() {
    let dir = DataDir::new("snap-mem");
    let s = raft_with(
        &dir,
        &[
            ("IDEM_SNAPSHOT_LOG_BYTES", "16777216"),
            ("IDEM_SNAPSHOT_LOG_PERCENT", "0"),
        ],
    )
    .await;
    let mut c = s.conn().await;
    let before = s.rss();
    let value = "v".repeat(1 << 20);
    for i in 0..100 {
        let k = format!("{}-{i}", key("big"));
        let fence = c.acquire(&["CLAIM", &k]).await;
        assert_eq!(
            c.cmd(&["COMPLETE", &k, &fence.to_string(), &value]).await,
            ok()
        );
    }
    let used = info_field(&mut c, "used_memory").await;
    assert!(used >= 100 << 20, "{used}");
    // Snapshots were built (by log bytes). Looked at seldom, since each
    // look is a command and a server is quiet after a second without one.
    let mut text = String::new();
    for _ in 0..12 {
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        text = bulk(&c.cmd(&["INFO", "all"]).await);
        if info_num(&text, "raft_snapshots_built") >= 1.0 {
            break;
        }
    }
    assert!(info_num(&text, "raft_snapshots_built") >= 1.0, "{text}");
    // Quiet, so that every thread gives back what it freed; RSS is read
    // from /proc, not by a command.
    let mut grown = u64::MAX;
    for _ in 0..6 {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        grown = grown.min(s.rss().saturating_sub(before));
    }
    // The log not yet covered by a snapshot is held in memory too (up to
    // about twice snapshot_log_bytes under load): it is not counted here.
    let log = info_field(&mut c, "raft_log_bytes").await;
    assert!(
        grown.saturating_sub(log) < used + used * 2 / 5,
        "{used} bytes of records and {log} of log grew the server by {grown} bytes"
    );
    // At its peak (VmHWM: while a snapshot was written, with the log not
    // yet covered and the values being read in beside the records) the
    // server grew by about 1.7 times the records' bytes; encoded whole in
    // memory first, by 3.7 times.
    let peak = s.peak_rss().saturating_sub(before);
    let log_max = 2 * (16 << 20);
    assert!(
        peak < 2 * used + log_max,
        "{used} bytes of records took the server's peak up by {peak} bytes"
    );
    // The snapshot still serves a restart.
    drop(c);
    let mut s = s;
    s.kill().await;
    let s = raft(&dir).await;
    let mut c = s.conn().await;
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), 100);
}

/// A restart's counters start from zero: the log it applies again at
/// start rebuilds the store, and its events were counted by the process
/// before (a restarted node said it had just lapsed every lease its log
/// had, which a rate over the counters took for a burst). What happens
/// after the restart is counted.
#[tokio::test]
async fn a_restart_does_not_count_its_log_again() {
    let dir = DataDir::new("recount");
    let mut s = raft(&dir).await;
    let mut c = s.conn().await;
    for i in 0..12 {
        c.acquire(&["CLAIM", &key(&format!("lapse{i}")), "LEASE", "100"])
            .await;
    }
    let k = key("done");
    let f = c.acquire(&["CLAIM", &k]).await;
    assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
    wait_for_info(&mut c, "lease_lapses", 12).await;
    assert_eq!(info_field(&mut c, "claims_acquired").await, 13);
    assert_eq!(info_field(&mut c, "records_completed").await, 1);
    s.kill().await;

    let s = raft(&dir).await;
    let mut c = s.conn().await;
    // The store is back...
    assert_replays(&mut c, &k, "v").await;
    // ...its history is not counted again (the replay above is a hit).
    for field in [
        "claims_acquired",
        "lease_lapses",
        "expired_keys",
        "records_completed",
        "keyspace_misses",
    ] {
        assert_eq!(info_field(&mut c, field).await, 0, "{field}");
    }
    assert_eq!(info_field(&mut c, "keyspace_hits").await, 1);
    // What happens now is.
    c.acquire(&["CLAIM", &key("after"), "LEASE", "100"]).await;
    wait_for_info(&mut c, "lease_lapses", 1).await;
    assert_eq!(info_field(&mut c, "claims_acquired").await, 1);
}
