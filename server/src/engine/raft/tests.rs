//! The raft engine's storage against openraft's own suite, and restarts
//! over a data directory.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use idem_protocol::cmd::{Claim, Complete};
use idem_protocol::{ClaimReply, Command, Outcome, Reply};
use openraft::testing::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::snapshot_data::SnapshotData;
use super::state_machine::StateMachine;
use super::types::{StorageError, TypeConfig};
use super::{EngineIo, LEADER_POLL_US, RaftConfig, StartError, log_store};
use crate::engine::Engine;
use crate::store::{Defaults, Op, Store, StoreConfig};

/// A test's directory, removed once the log in it (if any) has done
/// everything handed to it.
struct TempDir(PathBuf, Option<LogStore>);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("idem-raft-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p, None)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(log) = self.1.take() {
            log.wait_idle();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let mut dir = TempDir::new("suite");
        let log = LogStore::open(&dir.0.join("log"), 1 << 16, log_store::Writing::Thread).unwrap();
        dir.1 = Some(log.clone());
        let store = Arc::new(Store::new(StoreConfig::default()));
        let sm = StateMachine::open(store, &dir.0).unwrap();
        Ok((dir, log, sm))
    }
}

/// openraft's storage suite (log and state machine). It builds its own
/// runtime per case, so it runs from a plain test.
#[test]
fn openraft_storage_suite_passes() {
    if let Err(e) = Suite::test_all(Builder) {
        panic!("storage suite: {e}");
    }
}

const DEFAULTS: Defaults = Defaults {
    lease_ms: 30_000,
    retain_ms: 86_400_000,
};

fn cfg(dir: &TempDir) -> RaftConfig {
    RaftConfig {
        data_dir: dir.0.clone(),
        node_id: 1,
        max_pending_proposals: 1024,
        max_pending_proposal_bytes: 64 << 20,
        max_batch_bytes: 1 << 20,
        max_request_bytes: 2 << 20,
        proposal_timeout_ms: 10_000,
        snapshot_entries: 50,
        snapshot_log_bytes: 1 << 30,
        snapshot_log_percent: 0,
        snapshot_turn_ms: 0,
        segment_bytes: 1 << 16,
        min_free_disk_bytes: 0,
        election_timeout_ms: 500,
        append_timeout_ms: 2_000,
        max_inflight_appends: 1,
        leader_poll_us: LEADER_POLL_US,
        gather_idle_us: super::GATHER_IDLE_US,
        cluster: Default::default(),
        tls: None,
    }
}

/// A single-node engine on `dir` with [`cfg`], started.
async fn started(dir: &TempDir) -> Engine {
    Engine::raft(cfg(dir), StoreConfig::default(), EngineIo::default())
        .await
        .unwrap()
}

async fn run(e: &Engine, cmd: Command) -> Reply {
    let op = Op::from_command(cmd, &DEFAULTS).unwrap();
    e.submit(op).await.unwrap().reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_restart_and_fences_keep_increasing() {
    let dir = TempDir::new("restart");
    let mut last_fence = 0;
    for round in 0..3u64 {
        let e = started(&dir).await;
        // Everything completed before is replayed.
        for r in 0..round {
            for i in 0..40 {
                let k = Bytes::from(format!("k{r}-{i}"));
                assert_eq!(
                    run(&e, Command::Claim(Claim::new(k))).await,
                    Reply::Claim(ClaimReply::Completed {
                        outcome: Outcome::Ok,
                        value: Bytes::from(format!("v{r}-{i}")),
                    }),
                    "round {round}: k{r}-{i}"
                );
            }
        }
        // Enough writes for snapshots to be taken and the log purged.
        for i in 0..40 {
            let k = Bytes::from(format!("k{round}-{i}"));
            let Reply::Claim(ClaimReply::Acquired { fence }) =
                run(&e, Command::Claim(Claim::new(k.clone()))).await
            else {
                panic!("fresh key")
            };
            assert!(fence > last_fence, "fence {fence} after {last_fence}");
            last_fence = fence;
            let done = Command::Complete(Complete {
                key: k,
                fence,
                value: Bytes::from(format!("v{round}-{i}")),
                retain_ms: None,
                error: false,
            });
            assert_eq!(run(&e, done).await, Reply::Ok);
        }
        let (info, _) = e.raft_info().unwrap();
        assert!(info.fsyncs > 0);
        e.shutdown().await;
    }
    assert!(dir.0.join("snapshot").exists(), "a snapshot was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_engine_on_one_data_dir_is_refused() {
    let dir = TempDir::new("lock");
    let first = started(&dir).await;
    let second = Engine::raft(cfg(&dir), StoreConfig::default(), EngineIo::default()).await;
    assert!(
        matches!(second, Err(StartError::Locked(_))),
        "second engine started"
    );
    first.shutdown().await;
}

/// Reads that see one key's deadline pass many times propose its expiry
/// once while that proposal is on its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_lapsed_key_is_proposed_for_expiry_once_at_a_time() {
    let dir = TempDir::new("expire-once");
    let e = started(&dir).await;
    let before = e.raft_info().unwrap().0.ops;
    let key = Bytes::from_static(b"hot");
    for _ in 0..1000 {
        e.expire_soon(&key);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !e.expiring.lock().is_empty() {
        assert!(std::time::Instant::now() < deadline, "expiry never applied");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // One proposal while one is on its way; a proposal applied before the
    // loop ends (a fast disk) lets a later read propose again, so a few at
    // most, never one per read.
    let proposed = e.raft_info().unwrap().0.ops - before;
    assert!((1..=3).contains(&proposed), "{proposed} proposals");
    // Once applied, a later read may propose it again.
    e.expire_soon(&key);
    while !e.expiring.lock().is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(e.raft_info().unwrap().0.ops - before, proposed + 1);
    e.shutdown().await;
}

/// A state machine at `dir` with claims of `keys` applied as entries
/// 1..=keys.len() of term 1.
async fn applied_state_machine(dir: &TempDir, keys: &[&str]) -> StateMachine {
    use openraft::storage::RaftStateMachine;
    let mut sm = StateMachine::open(Arc::new(Store::new(StoreConfig::default())), &dir.0).unwrap();
    sm.apply(claims(keys)).await.unwrap();
    sm
}

/// Entries 1..=keys.len() of term 1, each a claim of one of `keys`.
fn claims(keys: &[&str]) -> Vec<super::types::LogEntry> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| openraft::Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), i as u64 + 1),
            payload: openraft::EntryPayload::Normal(super::types::Batch::new(
                &crate::store::Entry {
                    stamp_ms: 1_000,
                    ops: vec![
                        Op::from_command(
                            Command::Claim(Claim {
                                key: Bytes::from(k.to_string()),
                                ..Claim::default()
                            }),
                            &DEFAULTS,
                        )
                        .unwrap(),
                    ],
                },
            )),
        })
        .collect()
}

/// Entries read back from the log share the bytes it holds: reading one to
/// send it to a follower copies and decodes nothing (each read decoded
/// every op, and the send encoded them again). What is read decodes to
/// what was written, after a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_read_back_from_the_log_share_its_bytes() {
    use openraft::storage::RaftLogReader;
    let dir = TempDir::new("sharing");
    let e = started(&dir).await;
    for i in 0..5 {
        let k = Bytes::from(format!("k{i}"));
        assert!(matches!(
            run(&e, Command::Claim(Claim::new(k))).await,
            Reply::Claim(ClaimReply::Acquired { .. })
        ));
    }
    e.shutdown().await;
    let mut log = LogStore::open(&dir.0.join("log"), 1 << 16, log_store::Writing::Thread).unwrap();
    let batches = |entries: Vec<super::types::LogEntry>| -> Vec<super::types::Batch> {
        entries
            .into_iter()
            .filter_map(|e| match e.payload {
                openraft::EntryPayload::Normal(b) => Some(b),
                _ => None,
            })
            .collect()
    };
    let first = batches(log.try_get_log_entries(0..).await.unwrap());
    let second = batches(log.try_get_log_entries(0..).await.unwrap());
    assert_eq!(first.len(), 5, "one entry per claim");
    let mut keys = Vec::new();
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(
            a.encoded().as_ptr(),
            b.encoded().as_ptr(),
            "two reads of an entry copied it"
        );
        for op in a.entry().unwrap().ops {
            keys.extend(op.key().cloned());
        }
    }
    let want: Vec<Bytes> = (0..5).map(|i| Bytes::from(format!("k{i}"))).collect();
    assert_eq!(keys, want);
    drop(log);
}

/// An entry damaged past its header (which is checked as it comes in) is
/// refused when applied, as a storage error that stops the node: never a
/// panic, never skipped.
#[tokio::test]
async fn a_batch_that_does_not_decode_is_a_storage_error_when_applied() {
    use openraft::storage::RaftStateMachine;
    let dir = TempDir::new("damaged");
    let mut sm = StateMachine::open(Arc::new(Store::new(StoreConfig::default())), &dir.0).unwrap();
    let mut entries = claims(&["a", "b"]);
    let openraft::EntryPayload::Normal(good) = &entries[1].payload else {
        panic!("a batch")
    };
    let mut damaged = good.encoded().to_vec();
    damaged.truncate(damaged.len() - 2);
    entries[1].payload =
        openraft::EntryPayload::Normal(super::types::Batch::unchecked(Bytes::from(damaged)));
    let err = sm
        .apply(entries)
        .await
        .expect_err("a damaged entry was applied");
    assert!(err.to_string().contains("cut short"), "{err}");
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(
        applied.map(|l| l.index),
        Some(1),
        "the entry before it was applied"
    );
}

/// Applying a long run of entries (a follower catching up, a restart's
/// replay) gives the runtime back every few milliseconds: it used to hold
/// its runtime thread for the whole run, and the node's heartbeats,
/// votes and client connections on that thread waited (failovers after a
/// catch-up took seconds). Here another task on the same single-threaded
/// runtime must run while the entries are applied, not only before or
/// after.
#[tokio::test(flavor = "current_thread")]
async fn a_long_apply_lets_the_runtime_s_other_tasks_run() {
    use openraft::storage::RaftStateMachine;
    let dir = TempDir::new("sm-slices");
    let mut sm = StateMachine::open(Arc::new(Store::new(StoreConfig::default())), &dir.0).unwrap();
    let keys: Vec<String> = (0..20_000).map(|i| format!("key-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let entries = claims(&keys);
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let watcher = {
        let (sm, seen) = (sm.clone(), Arc::clone(&seen));
        tokio::spawn(async move {
            loop {
                seen.lock().push(sm.last_applied().map_or(0, |l| l.index));
                tokio::task::yield_now().await;
            }
        })
    };
    tokio::task::yield_now().await;
    let started = std::time::Instant::now();
    sm.apply(entries).await.unwrap();
    let took = started.elapsed();
    watcher.abort();
    let seen = seen.lock();
    let during = seen.iter().filter(|&&i| i > 0 && i < 20_000).count();
    assert!(
        during > 0,
        "nothing else ran while 20,000 entries were applied ({took:?}); seen: {:?}",
        &seen[..seen.len().min(10)]
    );
}

/// A follower's state machine (`answers_first`) lets the tasks already
/// woken on its runtime run before it applies (the answer to the leader
/// among them); otherwise it applies at once.
#[tokio::test(flavor = "current_thread")]
async fn a_follower_s_apply_lets_the_tasks_already_woken_run_first() {
    use openraft::storage::RaftStateMachine;
    for first in [false, true] {
        let dir = TempDir::new(if first {
            "sm-answers-first"
        } else {
            "sm-applies-first"
        });
        let mut sm =
            StateMachine::open(Arc::new(Store::new(StoreConfig::default())), &dir.0).unwrap();
        sm.answers_first(first);
        let woken = {
            let sm = sm.clone();
            tokio::spawn(async move { sm.last_applied() })
        };
        sm.apply(claims(&["k"])).await.unwrap();
        let seen = woken.await.unwrap();
        assert_eq!(
            seen.is_none(),
            first,
            "answers_first {first}: the woken task saw {seen:?} applied"
        );
    }
}

/// The names of the files in `dir` that start with `prefix`, in order.
fn files_named(dir: &TempDir, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// A snapshot built by a state machine in `dir` that applied `keys`.
async fn built_snapshot(
    dir: &TempDir,
    keys: &[&str],
) -> openraft::Snapshot<super::types::TypeConfig> {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    let mut sm = applied_state_machine(dir, keys).await;
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

/// openraft builds a snapshot in a task of its own, so a follower could
/// install a newer snapshot from its leader while it built one of its
/// own. The build then wrote its older snapshot over the installed one and
/// made it the current one: after a restart the node missed what the log
/// had purged under the newer one, and a leader could send the older one.
/// Now a build that finds a newer snapshot keeps neither the file nor the
/// snapshot.
#[tokio::test]
async fn a_snapshot_built_while_a_newer_one_was_installed_is_not_kept() {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    let (leader_dir, dir) = (TempDir::new("sm-newer-src"), TempDir::new("sm-newer"));
    let newer = built_snapshot(&leader_dir, &["a", "b", "c", "d", "e"]).await;
    let mut follower = applied_state_machine(&dir, &["a", "b"]).await;
    let mut building = follower.get_snapshot_builder().await;
    follower
        .install_snapshot(&newer.meta, newer.snapshot)
        .await
        .unwrap();
    let older = building.build_snapshot().await.unwrap();
    assert!(older.meta.last_log_id < newer.meta.last_log_id);
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, newer.meta.last_log_id);
    drop(follower);
    // The file on disk is the newer one.
    let store = Arc::new(Store::new(StoreConfig::default()));
    let mut reopened = StateMachine::open(Arc::clone(&store), &dir.0).unwrap();
    let (applied, _) = reopened.applied_state().await.unwrap();
    assert_eq!(applied, newer.meta.last_log_id);
    assert_eq!(store.stats().records, 5);
}

/// A follower held a snapshot it was sent in memory, whole, while it
/// loaded its store from it (at its peak, the store twice over: a learner
/// of 3.2M small records peaked at 393 MB for 347 MB loaded). Now the
/// snapshot is received into a file of its own and loaded from there a
/// record at a time (the same learner peaked at 339 MB), and the file is
/// removed once installed; a reception given up leaves no file, and one a
/// crash cut short is removed when the node starts.
#[tokio::test]
async fn a_snapshot_is_received_into_a_file_of_its_own_and_installed_from_it() {
    use openraft::storage::RaftStateMachine;
    use tokio::io::AsyncWriteExt;
    let (leader_dir, dir) = (TempDir::new("sm-recv-src"), TempDir::new("sm-recv"));
    let sent = built_snapshot(&leader_dir, &["a", "b", "c"]).await;
    let bytes = sent.snapshot.into_bytes().await.unwrap();
    let incoming = |d: &TempDir| files_named(d, "snapshot.incoming-");
    let mut follower = applied_state_machine(&dir, &["x"]).await;
    // Given up (another leader sends another snapshot).
    let given_up = follower.begin_receiving_snapshot().await.unwrap();
    assert_eq!(incoming(&dir).len(), 1);
    drop(given_up);
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    // Received whole, in chunks, as openraft writes them.
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    assert!(matches!(*received, SnapshotData::Incoming(_)));
    for chunk in bytes.chunks(7) {
        received.write_all(chunk).await.unwrap();
    }
    received.shutdown().await.unwrap();
    follower
        .install_snapshot(&sent.meta, received)
        .await
        .unwrap();
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    let (applied, _) = follower.applied_state().await.unwrap();
    assert_eq!(applied, sent.meta.last_log_id);
    // One damaged on the way is refused as its reception ends, before
    // openraft could install it (a failed install stops the node), and
    // leaves no file.
    let mut damaged = bytes.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x40;
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    received.write_all(&damaged).await.unwrap();
    let e = received.shutdown().await.unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    drop(received);
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    // Nor one that is not a snapshot at all.
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    received.write_all(b"garbage!").await.unwrap();
    let e = received.shutdown().await.unwrap_err();
    assert!(e.to_string().contains("would not load"), "{e}");
    drop(received);
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    // A file damaged after its check still fails its install, and leaves
    // no file either.
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    received.write_all(&bytes).await.unwrap();
    received.shutdown().await.unwrap();
    let name = incoming(&dir).pop().unwrap();
    std::fs::write(dir.0.join(name), &damaged).unwrap();
    let e = follower
        .install_snapshot(&sent.meta, received)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    drop(follower);
    // A reception a crash cut short.
    std::fs::write(dir.0.join("snapshot.incoming-77"), b"half a snapshot").unwrap();
    let store = Arc::new(Store::new(StoreConfig::default()));
    let mut reopened = StateMachine::open(Arc::clone(&store), &dir.0).unwrap();
    assert!(incoming(&dir).is_empty(), "{:?}", incoming(&dir));
    let (applied, _) = reopened.applied_state().await.unwrap();
    assert_eq!(applied, sent.meta.last_log_id);
    assert_eq!(store.stats().records, 3, "a, b and c; x is gone");
}

/// openraft builds snapshots on a thread of their own, which an engine
/// being stopped did not wait for: a build finishing after the next engine
/// on the same directory had opened wrote its snapshot over that engine's,
/// newer than what the engine had loaded, and the engine's start failed
/// openraft's check that its snapshot is committed (seen as
/// `records_survive_a_restart_and_fences_keep_increasing` failing under
/// load). Now a stopped state machine writes no snapshot, built or
/// installed (openraft does not wait for its state machine task either).
#[tokio::test]
async fn a_snapshot_built_or_installed_after_the_engine_stopped_is_not_written() {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    let (leader_dir, dir) = (TempDir::new("sm-stopped-src"), TempDir::new("sm-stopped"));
    let newer = built_snapshot(&leader_dir, &["a", "b", "c", "d"]).await;
    let mut sm = applied_state_machine(&dir, &["a", "b", "c"]).await;
    let mut building = sm.get_snapshot_builder().await;
    sm.stop();
    assert!(building.build_snapshot().await.is_err());
    assert!(
        sm.install_snapshot(&newer.meta, newer.snapshot)
            .await
            .is_err()
    );
    assert!(!dir.0.join("snapshot").exists(), "written after the stop");
    assert!(sm.get_current_snapshot().await.unwrap().is_none());
}

/// A snapshot is written to a file of its own with nothing held, and only
/// its rename over the current one takes the save lock. A build used to
/// hold it while it encoded the whole store (seconds at millions of
/// records), and an install from the leader, or a stop, waited for it: a
/// failover took 11.2 s. Now both go on while a build writes; the build
/// then finds a newer snapshot current (or the engine stopped), keeps
/// nothing, and leaves no file behind.
#[tokio::test]
async fn an_install_or_a_stop_does_not_wait_for_a_snapshot_being_written() {
    use openraft::storage::RaftStateMachine;
    let (leader_dir, dir) = (TempDir::new("sm-nowait-src"), TempDir::new("sm-nowait"));
    let newer = built_snapshot(&leader_dir, &["a", "b", "c", "d"]).await;
    let mut sm = applied_state_machine(&dir, &["a", "b"]).await;
    let older = openraft::SnapshotMeta {
        last_log_id: sm.last_applied(),
        last_membership: Default::default(),
        snapshot_id: "1-2".into(),
    };
    // A build's write, held up until the test lets it go on.
    let (go_on, held) = std::sync::mpsc::channel::<()>();
    let (writing, started) = std::sync::mpsc::channel::<()>();
    let (building, meta) = (sm.clone(), older.clone());
    let write = std::thread::spawn(move || {
        building.write_file(&meta, false, |w| {
            writing.send(()).unwrap();
            held.recv().unwrap();
            std::io::Write::write_all(w, b"records")
        })
    });
    started.recv().unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        sm.install_snapshot(&newer.meta, newer.snapshot),
    )
    .await
    .expect("the install waited for the build's write")
    .unwrap();
    let stop = {
        let sm = sm.clone();
        std::thread::spawn(move || sm.stop())
    };
    for _ in 0..1000 {
        if stop.is_finished() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(stop.is_finished(), "the stop waited for the build's write");
    go_on.send(()).unwrap();
    let written = write.join().unwrap().unwrap();
    assert!(!sm.make_current(written, &older, true).unwrap());
    assert_eq!(
        files_named(&dir, "snapshot"),
        ["snapshot"],
        "the build's file was left behind"
    );
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, newer.meta.last_log_id);
}

/// A snapshot file left half written by a crash (a build's, an install's,
/// or a reception's) is removed when the node starts.
#[tokio::test]
async fn files_of_snapshots_cut_short_by_a_crash_are_removed_at_start() {
    let dir = TempDir::new("sm-leftovers");
    for name in ["snapshot.writing-7", "snapshot.incoming-3", "snapshot.tmp"] {
        std::fs::write(dir.0.join(name), b"half a snapshot").unwrap();
    }
    std::fs::write(dir.0.join("other"), b"not ours").unwrap();
    let _sm = StateMachine::open(Arc::new(Store::new(StoreConfig::default())), &dir.0).unwrap();
    assert_eq!(files_named(&dir, ""), ["other"]);
}

/// The log that triggers a snapshot grows with the latest snapshot's size
/// (`snapshot_log_percent`), never below `snapshot_log_bytes`; entries
/// count as they did.
#[test]
fn snapshot_thresholds_grow_with_the_latest_snapshot() {
    let every = super::SnapshotEvery {
        entries: 100,
        bytes: 1_000,
        percent: 50,
    };
    assert_eq!(every.thresholds(0), (100, 1_000));
    assert_eq!(every.thresholds(1_999), (100, 1_000));
    assert_eq!(every.thresholds(10_000), (100, 5_000));
    assert!(!every.due(99, 999, 0));
    assert!(every.due(100, 0, 0));
    assert!(every.due(0, 1_000, 0));
    assert!(!every.due(0, 4_999, 10_000));
    assert!(every.due(0, 5_000, 10_000));
    assert!(every.due(100, 0, 10_000));
    let fixed = super::SnapshotEvery {
        percent: 0,
        ..every
    };
    assert_eq!(fixed.thresholds(u64::MAX), (100, 1_000));
    let most = super::SnapshotEvery {
        percent: 10_000,
        ..every
    };
    assert_eq!(most.thresholds(u64::MAX), (100, u64::MAX / 100));
    // Twice the thresholds: taken without waiting for a turn.
    assert!(!every.overdue(199, 1_999, 0));
    assert!(every.overdue(200, 0, 0));
    assert!(every.overdue(0, 2_000, 0));
    assert!(!every.overdue(0, 9_999, 10_000));
    assert!(every.overdue(0, 10_000, 10_000));
    assert!(most.overdue(0, u64::MAX, u64::MAX));
}

/// The voters snapshot in turns by their rank: one turn in `voters` is
/// each one's, in order, round after round; a single node, or no turns
/// (0), always has its turn.
#[test]
fn snapshot_turns_go_round_the_voters() {
    use std::time::Duration;
    let turns = super::SnapshotTurns {
        turn: Duration::from_millis(2_000),
    };
    let at = |ms: u64| Duration::from_millis(ms);
    let owner = |ms: u64| {
        (0..3)
            .filter(|&r| turns.mine(at(ms), r, 3))
            .collect::<Vec<_>>()
    };
    assert_eq!(owner(0), [0]);
    assert_eq!(owner(1_999), [0]);
    assert_eq!(owner(2_000), [1]);
    assert_eq!(owner(5_999), [2]);
    assert_eq!(owner(6_000), [0]);
    // Whatever the time, exactly one voter of five has its turn.
    for ms in (0..100_000).step_by(700) {
        assert_eq!((0..5).filter(|&r| turns.mine(at(ms), r, 5)).count(), 1);
    }
    assert_eq!(turns.round(3), Duration::from_millis(6_000));
    assert!(turns.mine(at(2_000), 0, 1));
    let none = super::SnapshotTurns {
        turn: Duration::ZERO,
    };
    assert!((0..3).all(|r| none.mine(at(2_000), r, 3)));
    assert_eq!(none.round(3), Duration::ZERO);
}

/// A snapshot writes the whole store, so at a fixed spacing a large store
/// spent most of its time writing snapshots. With `snapshot_log_percent`
/// the next one waits for a log the size of that share of the latest
/// snapshot; at 0, `snapshot_log_bytes` alone spaces them, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_spaced_by_the_store_s_size() {
    let mut built = Vec::new();
    for percent in [0, 10_000] {
        let dir = TempDir::new("spaced");
        let mut c = cfg(&dir);
        c.snapshot_entries = 1_000_000;
        c.snapshot_log_bytes = 16 << 10;
        c.snapshot_log_percent = percent;
        let e = Engine::raft(c, StoreConfig::default(), EngineIo::default())
            .await
            .unwrap();
        // About 300 KB of log (keys of 200 bytes), 20 claims at a time.
        for round in 0..60 {
            let claims = (0..20).map(|i| {
                let k = Bytes::from(format!("{round:04}-{i:04}-{}", "k".repeat(190)));
                run(&e, Command::Claim(Claim::new(k)))
            });
            for reply in futures_util::future::join_all(claims).await {
                assert!(matches!(reply, Reply::Claim(ClaimReply::Acquired { .. })));
            }
            // Time for a snapshot that is due to be asked for and built.
            if round % 10 == 9 {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
        let (info, _) = e.raft_info().unwrap();
        built.push(info.snapshots_built);
        e.shutdown().await;
    }
    // At 0 %, one every 16 KB of log: many. At 10,000 %, the first (due
    // at 16 KB, the latest snapshot being none) and then none, since the
    // next waits for 100 times the first one's size.
    assert!(built[0] >= 5, "{built:?}");
    assert_eq!(built[1], 1, "{built:?}");
}

/// An AppendEntries holds at most 64 MiB of entries, counting each as
/// large as the largest can be: a batch, or a single op as large as the
/// largest request. Counted by batches alone, 64 entries of one request
/// each could make a message past the peer frame limit, which the
/// follower refuses: it would never catch up.
#[test]
fn append_entries_stay_under_the_peer_frame_limit() {
    use super::{MAX_PAYLOAD_ENTRIES, payload_entries};
    // The defaults: batches of 8 MiB, requests of 2 MiB.
    assert_eq!(payload_entries(8 << 20, 2 << 20), 8);
    assert_eq!(payload_entries(4096, 1 << 20), 63);
    assert_eq!(payload_entries(4096, 1024), MAX_PAYLOAD_ENTRIES);
    for (batch, request) in [(4096, 64 << 20), (64 << 20, 64 << 20), (1 << 20, 32 << 20)] {
        let entries = payload_entries(batch, request);
        let largest = batch.max(request + 4096) as u64;
        assert!(entries >= 1);
        assert!(
            entries * largest <= (64 << 20).max(largest),
            "{entries} entries of up to {largest} bytes"
        );
        assert!(entries * largest < super::peer::MAX_FRAME as u64);
    }
}

/// A node started with a smaller `election_timeout_ms` than it last ran
/// with waits out the difference (its vote may still be promised for
/// that long) before it records the new value; a larger one, a first
/// start or a single node starts at once; a damaged record is an error
/// naming the file.
#[tokio::test(start_paused = true)]
async fn a_node_started_with_a_smaller_election_timeout_waits_out_the_difference() {
    use super::{ELECTION_TIMEOUT_FILE, keep_earlier_votes};
    use tokio::time::Instant;
    let dir = TempDir::new("lowered");
    let kept = || std::fs::read_to_string(dir.0.join(ELECTION_TIMEOUT_FILE)).unwrap();
    let waited = async |now_ms: u64, clustered: bool| {
        let t = Instant::now();
        keep_earlier_votes(&dir.0, now_ms, clustered).await.unwrap();
        t.elapsed().as_millis()
    };
    assert_eq!(waited(3000, true).await, 0, "a first start");
    assert_eq!(kept(), "3000\n");
    assert_eq!(waited(300, true).await, 2700, "3000 -> 300");
    assert_eq!(kept(), "300\n");
    assert_eq!(waited(330, true).await, 0, "raised");
    assert_eq!(kept(), "330\n");
    assert_eq!(waited(330, true).await, 0, "the same");
    // Started without a peer address: at once, and the record is not
    // lowered (its next start in the cluster still waits).
    assert_eq!(waited(100, false).await, 0, "a single node");
    assert_eq!(kept(), "330\n");
    assert_eq!(waited(100, true).await, 230, "back in the cluster");
    assert_eq!(kept(), "100\n");
    assert_eq!(waited(500, false).await, 0);
    assert_eq!(kept(), "500\n", "raised alone");
    // A record past the largest value taken waits that long at most.
    std::fs::write(dir.0.join(ELECTION_TIMEOUT_FILE), "99999999999\n").unwrap();
    assert_eq!(waited(300, true).await, 60_000 - 300);
    std::fs::write(dir.0.join(ELECTION_TIMEOUT_FILE), "3O0\n").unwrap();
    let e = keep_earlier_votes(&dir.0, 300, true).await.unwrap_err();
    assert!(
        e.to_string().contains(ELECTION_TIMEOUT_FILE) && e.to_string().contains("not a number"),
        "{e}"
    );
}
