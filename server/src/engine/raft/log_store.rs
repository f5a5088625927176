//! openraft's log storage over the write-ahead log.
//!
//! A dedicated writer thread owns the log files. `append` hands the
//! encoded entries to it and returns at once; the thread writes everything
//! handed to it since its last sync and syncs it with one `fdatasync`, then
//! tells openraft those entries are flushed (`LogFlushed`). So syncs follow
//! each other back to back, whatever the async runtime is busy with, and
//! entries appended while one sync runs share the next. (A follower's
//! openraft core waits for each append's flush before it answers the
//! leader; a cluster's leader does not wait: it replicates the entries
//! while the thread writes them, and counts itself towards the quorum once
//! they are flushed. A single node's core waits, so the writes that arrive
//! meanwhile gather in the proposer's next entry.) An append smaller
//! than [`LogStore::inline_below`] (a lightly loaded single node, or a
//! follower sent one AppendEntries at a time) is
//! written and synced by the caller itself instead (openraft's core task,
//! on its runtime thread, which serves nothing else meanwhile) when the
//! thread has nothing to do and the latest sync was fast: it keeps its
//! place, since every job handed over before it is done, and it saves the
//! two thread wakeups of a hand-off. Truncation, purging
//! and the metadata file (vote, committed index, purge point; replaced
//! atomically) go through the same thread, in order with the appends;
//! all but purging are awaited. So a saved vote is also a barrier: when `save_vote`
//! returns, every entry appended before it is on disk. A leader that steps
//! down saves the higher vote it saw before it answers anyone as a
//! follower, so it never reports as matching an entry it has not flushed;
//! and a leader of other members that restarts after a crash comes back
//! as a follower, its vote no longer committed, and leads again only if
//! elected in a later term (`step_down_at_restart`), since its log may
//! lack entries it had sent.
//! Entries not yet purged are also kept in memory, so reads of
//! the log never touch the disk or wait for a sync: in their encoded form,
//! the bytes written to the files, so the log costs its size in memory
//! (decoded entries weigh several times more, and their keys and values
//! would hold on to the read buffers of the connections they came from);
//! reads decode them.

// openraft's `StorageError` is what its traits return; it is large, and
// not ours to shrink.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;

use bytes::Bytes;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageIOError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::types::{
    LogEntry, LogId, StorageError, TypeConfig, Vote, decode_sharing, encoded_size_hint, storage_err,
};
use super::wal::{SyncTimes, Wal, WalError, read_meta, write_meta};

/// What the metadata file holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

/// An entry held in memory: its log id and its encoded form.
struct Held {
    log_id: LogId,
    bytes: Bytes,
    /// The bytes of the held entries up to this one, inclusive, counted
    /// from wherever the entries held after a purge began: the bytes of a
    /// run of entries are two lookups (see [`LogStore::held_between`]).
    end: u64,
}

/// Holds `bytes`, the entry `log_id` encoded, in `entries`; the entry it
/// replaced, if any.
fn hold(entries: &mut BTreeMap<u64, Held>, log_id: LogId, bytes: Bytes) -> Option<Held> {
    let before = log_id
        .index
        .checked_sub(1)
        .and_then(|i| entries.get(&i))
        .map_or(0, |h| h.end);
    let end = before + bytes.len() as u64;
    entries.insert(log_id.index, Held { log_id, bytes, end })
}

/// What the log holds, as openraft sees it (appended entries are here at
/// once, before they are synced).
struct State {
    entries: BTreeMap<u64, Held>,
    /// Bytes of the entries held.
    bytes: u64,
    /// The metadata as openraft sees it (`purged` included).
    meta: Meta,
    /// The purge the files may show (saved, or queued to be): what a
    /// snapshot on disk covers. openraft purges the log as soon as it has
    /// asked for a snapshot to be installed, before the state machine has
    /// written it: a crash in between must not find the log purged past
    /// the snapshot file, which nothing could then replay.
    disk_purged: Option<LogId>,
    /// A purge held back until a snapshot on disk covers it.
    held_purge: Option<LogId>,
    /// Entries below this index are covered by the snapshot on disk; `None`
    /// while nobody reports snapshots (every purge is saved at once).
    snapshot_covers: Option<u64>,
    /// Why the snapshot being installed failed, if it did: the entries
    /// that wait for it (see [`LogStore::append`]) fail with this.
    install_failed: Option<String>,
}

impl State {
    /// Holds `bytes`, the entry `log_id` encoded (in place of any entry
    /// held at its index).
    fn hold(&mut self, log_id: LogId, bytes: Bytes) {
        self.bytes += bytes.len() as u64;
        if let Some(old) = hold(&mut self.entries, log_id, bytes) {
            self.bytes -= old.bytes.len() as u64;
        }
    }

    /// Drops the entries from `index` on.
    fn drop_from(&mut self, index: u64) {
        let gone = self.entries.split_off(&index);
        self.bytes -= gone.values().map(|h| h.bytes.len() as u64).sum::<u64>();
    }

    /// Drops the entries up to `index`, inclusive.
    fn drop_upto(&mut self, index: u64) {
        let keep = self.entries.split_off(&(index + 1));
        let gone = std::mem::replace(&mut self.entries, keep);
        self.bytes -= gone.values().map(|h| h.bytes.len() as u64).sum::<u64>();
    }
}

/// Encoded records (index, bytes) of one append, whether the files may be
/// started afresh, and who to tell once they are synced.
type Append = (Vec<(u64, Bytes)>, bool, Flushed);

/// Who to tell once an append is synced (or could not be): openraft's
/// `LogFlushed`, wrapped.
type Flushed = Box<dyn FnOnce(Result<(), std::io::Error>) + Send>;

/// Work for the writer thread.
enum Job {
    /// Write and sync these records, then report them flushed. `reset`:
    /// the log held nothing unpurged when they were appended, so files
    /// whose records were all purged may be started afresh.
    Append {
        records: Vec<(u64, Bytes)>,
        reset: bool,
        callback: Flushed,
    },
    /// Remove every record from this index on.
    Truncate {
        index: u64,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
    /// Save the metadata, then remove the records up to this index. Not
    /// awaited (see [`LogStore::purge`](RaftLogStorage::purge)).
    Purge { index: u64, meta: Vec<u8> },
    /// Save the metadata.
    Meta {
        meta: Vec<u8>,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
}

/// Where the log's jobs go.
#[derive(Clone)]
enum Jobs {
    /// To the writer thread.
    Thread(Handoff),
    /// Done by the caller, at once (simulations: no thread runs outside
    /// the simulated time).
    Inline(Arc<Mutex<Writer>>),
}

/// The way to the writer thread, and to the writer itself for appends
/// small enough to be written at once by whoever makes them.
#[derive(Clone)]
struct Handoff {
    tx: mpsc::Sender<Job>,
    writer: Arc<Mutex<Writer>>,
    /// Jobs sent and not yet done by the thread.
    queued: Arc<AtomicUsize>,
    /// Appends of fewer bytes are written by the caller when the writer is
    /// free and nothing waits for the thread (0: never).
    inline_below: Arc<AtomicUsize>,
    /// Appends written that way so far.
    inlined: Arc<AtomicU64>,
}

/// A sync slower than this (µs) sends the appends after it to the thread
/// until a sync is fast again: a disk that stalls holds up the caller's
/// runtime thread once, not for every write.
const INLINE_MAX_SYNC_US: u64 = 1_000;

impl Handoff {
    fn send(&self, job: Job) -> Result<(), ()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(job).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        })
    }

    /// Writes `job` (an append of `bytes`) at once if it is small and
    /// nothing is ahead of it; otherwise hands it to the thread.
    fn append(&self, job: Job, bytes: usize) -> Result<(), ()> {
        if bytes < self.inline_below.load(Ordering::Relaxed)
            && let Some(mut writer) = self.writer.try_lock()
            // Every job sent before is done (the thread counts a job done
            // while it holds the writer): this one keeps its place.
            && self.queued.load(Ordering::Acquire) == 0
            && writer.wal.last_sync_us < INLINE_MAX_SYNC_US
        {
            writer.handle(&mut vec![job]);
            self.inlined.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.send(job)
    }
}

impl Jobs {
    fn send(&self, job: Job) -> Result<(), ()> {
        match self {
            Jobs::Thread(h) => h.send(job),
            Jobs::Inline(w) => {
                w.lock().handle(&mut vec![job]);
                Ok(())
            }
        }
    }
}

/// How the log is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Writing {
    /// By a dedicated writer thread, which syncs back to back (idemd).
    #[default]
    Thread,
    /// By whoever appends, before `append` returns: for simulations, where
    /// nothing may run outside the simulated runtime.
    Inline,
}

/// The log store (a cheap handle; clones share the log).
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<State>>,
    /// Notified when a held-back purge is queued (see
    /// [`LogStore::snapshot_on_disk`]).
    purge_released: Arc<tokio::sync::Notify>,
    /// Notified after each append (see [`LogStore::grown`]).
    grown: Arc<tokio::sync::Notify>,
    jobs: Jobs,
    /// The log's `fdatasync` times, recorded by the writer.
    sync_times: SyncTimes,
    /// Entries appended since start, and the commands in them (on every
    /// node: a follower's are the ones its leader sent).
    appended: Arc<(AtomicU64, AtomicU64)>,
    /// The last entry of the log this process opened, until the state
    /// machine has applied it (0: none, or applied): entries up to it are
    /// replays ([`StateMachine::replaying_upto`](super::state_machine::StateMachine::replaying_upto)).
    /// A truncation brings it down: what follows the cut is new.
    replay_upto: Arc<AtomicU64>,
}

/// Why the log could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The log files.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// A record that is not an entry this build can read.
    #[error("{path}: log entry {index} cannot be read: {reason}")]
    Entry {
        /// The log directory.
        path: PathBuf,
        /// The entry's index.
        index: u64,
        /// Why.
        reason: String,
    },
    /// The writer thread could not be started.
    #[error("cannot start the log writer thread: {0}")]
    Thread(std::io::Error),
}

impl LogStore {
    /// Opens the log in `dir` (created if missing) and, when `writing` is
    /// [`Writing::Thread`], starts its writer thread (which ends once every
    /// handle is dropped).
    pub fn open(dir: &Path, segment_bytes: u64, writing: Writing) -> Result<LogStore, OpenError> {
        let meta: Meta = match read_meta(dir)? {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(|e| OpenError::Entry {
                path: dir.join("meta"),
                index: 0,
                reason: e.to_string(),
            })?,
            None => Meta::default(),
        };
        // Records a snapshot covers (up to the purge) are not copied out.
        let keep_from = meta.purged.map_or(0, |l| l.index + 1);
        let (wal, records) = Wal::open_from(dir, segment_bytes, keep_from)?;
        let mut entries = BTreeMap::new();
        let mut bytes = 0;
        for (index, payload) in records {
            let payload = Bytes::from(payload);
            let entry: LogEntry = decode_sharing(&payload).map_err(|e| OpenError::Entry {
                path: dir.to_owned(),
                index,
                reason: e.to_string(),
            })?;
            if entry.log_id.index != index {
                return Err(OpenError::Entry {
                    path: dir.to_owned(),
                    index,
                    reason: format!("holds log id {}", entry.log_id),
                });
            }
            bytes += payload.len() as u64;
            hold(&mut entries, entry.log_id, payload);
        }
        let sync_times = wal.sync_times();
        let writer = Writer::new(wal, dir.to_owned());
        let jobs = match writing {
            Writing::Thread => {
                let (tx, rx) = mpsc::channel();
                let handoff = Handoff {
                    tx,
                    writer: Arc::new(Mutex::new(writer)),
                    queued: Arc::new(AtomicUsize::new(0)),
                    inline_below: Arc::new(AtomicUsize::new(0)),
                    inlined: Arc::default(),
                };
                let (writer, queued) = (Arc::clone(&handoff.writer), Arc::clone(&handoff.queued));
                std::thread::Builder::new()
                    .name("idem-log".into())
                    .spawn(move || Writer::run(&writer, &queued, &rx))
                    .map_err(OpenError::Thread)?;
                Jobs::Thread(handoff)
            }
            Writing::Inline => Jobs::Inline(Arc::new(Mutex::new(writer))),
        };
        let last = entries.last_key_value().map_or(0, |(&i, _)| i);
        Ok(LogStore {
            replay_upto: Arc::new(AtomicU64::new(last)),
            state: Arc::new(Mutex::new(State {
                entries,
                bytes,
                disk_purged: meta.purged,
                meta,
                held_purge: None,
                install_failed: None,
                snapshot_covers: None,
            })),
            jobs,
            sync_times,
            purge_released: Arc::default(),
            grown: Arc::default(),
            appended: Arc::default(),
        })
    }

    /// Entries appended since start, and the commands in them.
    pub fn appended(&self) -> (u64, u64) {
        (
            self.appended.0.load(Ordering::Relaxed),
            self.appended.1.load(Ordering::Relaxed),
        )
    }

    /// Lets appends of fewer than `bytes` be written and synced by the
    /// caller itself when the writer thread is idle, instead of being
    /// handed to it (0: never; no effect without a writer thread).
    pub fn inline_below(&self, bytes: usize) {
        if let Jobs::Thread(h) = &self.jobs {
            h.inline_below.store(bytes, Ordering::Relaxed);
        }
    }

    /// Appends written and synced by their caller instead of the writer
    /// thread so far ([`LogStore::inline_below`]; 0 without a writer
    /// thread).
    pub fn inlined(&self) -> u64 {
        match &self.jobs {
            Jobs::Thread(h) => h.inlined.load(Ordering::Relaxed),
            Jobs::Inline(_) => 0,
        }
    }

    /// `fdatasync`s done by the log so far, and their 50th and 99th
    /// percentile times in µs.
    pub fn syncs(&self) -> (u64, u64, u64) {
        self.sync_times.summary()
    }

    /// The `fdatasync`s' total time since start, µs.
    pub fn syncs_total_us(&self) -> u64 {
        self.sync_times.total_us()
    }

    /// Notified after each append: what waits for the log to grow (a
    /// snapshot that comes due) need not poll it.
    pub fn grown(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.grown)
    }

    /// The entries held past `after` (all of them for `None`) up to
    /// `upto`, inclusive, and their encoded size in bytes: what a snapshot
    /// covering the log up to `upto` would cover beyond one covering it up
    /// to `after`. Two lookups, whatever the length of the log.
    pub fn held_between(&self, after: Option<u64>, upto: u64) -> (u64, u64) {
        let state = self.state.lock();
        let (Some((&first, _)), Some((&last, _))) = (
            state.entries.first_key_value(),
            state.entries.last_key_value(),
        ) else {
            return (0, 0);
        };
        let from = after.map_or(first, |a| a.saturating_add(1).max(first));
        let to = upto.min(last);
        if to < from {
            return (0, 0);
        }
        // Held entries follow each other without a gap.
        let end = state.entries.get(&to).map_or(0, |h| h.end);
        let start = state
            .entries
            .get(&from)
            .map_or(0, |h| h.end.saturating_sub(h.bytes.len() as u64));
        (to - from + 1, end.saturating_sub(start))
    }

    /// Entries held (not purged) and their encoded size in bytes, which is
    /// what they take in memory.
    pub fn held(&self) -> (u64, u64) {
        let state = self.state.lock();
        (state.entries.len() as u64, state.bytes)
    }

    /// The end of the replay of the log this process opened (see
    /// `replay_upto`), shared with the state machine.
    pub fn replay_boundary(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.replay_upto)
    }

    /// The committed index openraft reported last (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.state.lock().meta.committed.map_or(0, |l| l.index)
    }

    /// Blocks until the writer has done every job handed to it (tests:
    /// a purge is not awaited, and a test's directory must outlive it).
    #[cfg(test)]
    pub(super) fn wait_idle(&self) {
        if let Jobs::Thread(h) = &self.jobs {
            while h.queued.load(Ordering::Acquire) > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// Hands `job` (made with a completion sender) to the writer and waits
    /// for it to be done.
    async fn run(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<(), StorageError>>) -> Job,
    ) -> Result<(), StorageError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(job(tx))
            .map_err(|_| storage_err(StorageIOError::write_logs, "the log writer stopped"))?;
        rx.await
            .map_err(|_| storage_err(StorageIOError::write_logs, "the log writer stopped"))?
    }

    /// The metadata to save, encoded: as it is now, with the purge the
    /// files may show.
    fn encoded_meta(state: &State) -> Result<Vec<u8>, StorageError> {
        let meta = Meta {
            purged: state.disk_purged,
            ..state.meta.clone()
        };
        postcard::to_allocvec(&meta).map_err(|e| storage_err(StorageIOError::write_vote, e))
    }

    /// Notes that the snapshot on disk covers the log up to `last`
    /// (inclusive), and queues the purge held back until one did.
    pub fn snapshot_on_disk(&self, last: Option<LogId>) {
        let released = {
            let mut state = self.state.lock();
            let covers = last.map_or(0, |l| l.index + 1);
            state.snapshot_covers = Some(state.snapshot_covers.unwrap_or(0).max(covers));
            match state.held_purge {
                Some(p) if p.index < covers => {
                    state.held_purge = None;
                    // The snapshot the entries waited for is on disk (a
                    // build's, covering less, leaves a failure standing).
                    state.install_failed = None;
                    state.disk_purged = Some(p);
                    // Queued under the lock (a send that does not block),
                    // so no metadata encoded after this one is saved
                    // before it.
                    match LogStore::encoded_meta(&state) {
                        Ok(meta) => {
                            if self
                                .jobs
                                .send(Job::Purge {
                                    index: p.index,
                                    meta,
                                })
                                .is_err()
                            {
                                tracing::warn!("the log writer stopped: a purge is not saved");
                            }
                        }
                        // Saved with the next metadata written instead.
                        Err(e) => tracing::warn!(error = %e, "cannot encode the log's metadata"),
                    }
                    true
                }
                _ => false,
            }
        };
        if released {
            self.purge_released.notify_waiters();
        }
    }

    /// The state machine failed to install a snapshot (`why`): entries
    /// that wait for it fail instead, so the Raft core, which waits for
    /// their append, stops with the error (and the node with it) instead
    /// of waiting for good, never reading the install's answer.
    pub fn snapshot_install_failed(&self, why: &str) {
        self.state.lock().install_failed = Some(why.to_owned());
        self.purge_released.notify_waiters();
    }
}

/// The writer thread's side: it alone touches the log files.
struct Writer {
    wal: Wal,
    dir: PathBuf,
    /// The first write or sync that failed, once one has: every write
    /// after it is refused with it (see [`Writer::write`]).
    failed: Option<String>,
}

/// Jobs taken in one round, at most (so callbacks of a long queue are not
/// held back behind a very large write).
const MAX_JOBS_PER_SYNC: usize = 1024;

impl Writer {
    fn new(wal: Wal, dir: PathBuf) -> Self {
        Writer {
            wal,
            dir,
            failed: None,
        }
    }

    /// Runs one write of the log files, unless one failed before. A write
    /// or sync that fails with an I/O error stops the log: nothing after
    /// it can be acknowledged, and what the OS did with the failed write is
    /// unknown (a failed fsync may have dropped dirty pages, and a later
    /// one may then succeed without them). So it and every later write
    /// fail; openraft's core takes a failed write as fatal and stops, and
    /// idemd, seeing its core stopped, exits (code 70). A restart recovers
    /// the prefix that was synced.
    fn write<T>(
        &mut self,
        op: impl FnOnce(&mut Self) -> Result<T, WalError>,
    ) -> Result<T, WalError> {
        if let Some(failed) = &self.failed {
            return Err(WalError::Io {
                op: "write (refused: an earlier write of the log failed)",
                path: self.dir.clone(),
                source: std::io::Error::other(failed.clone()),
            });
        }
        let result = op(self);
        if let Err(e @ WalError::Io { .. }) = &result {
            tracing::error!(error = %e, "the log cannot be written: no more writes are taken (a restart recovers what was synced)");
            self.failed = Some(e.to_string());
        }
        result
    }

    fn run(writer: &Mutex<Writer>, queued: &AtomicUsize, rx: &mpsc::Receiver<Job>) {
        let mut jobs = Vec::new();
        loop {
            let first = match rx.recv_timeout(crate::reclaim::IDLE_COLLECT_AFTER) {
                Ok(job) => job,
                // Idle: memory this thread freed is given back (only the
                // thread that allocated it can).
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    crate::reclaim::collect();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            jobs.push(first);
            let mut w = writer.lock();
            while jobs.len() < MAX_JOBS_PER_SYNC {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            let n = jobs.len();
            w.handle(&mut jobs);
            queued.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Does `jobs` in order, the appends among them with one sync.
    fn handle(&mut self, jobs: &mut Vec<Job>) {
        let mut appends = Vec::new();
        for job in jobs.drain(..) {
            match job {
                Job::Append {
                    records,
                    reset,
                    callback,
                } => appends.push((records, reset, callback)),
                other => {
                    // Appends before it are written first.
                    self.append(std::mem::take(&mut appends));
                    self.other(other);
                }
            }
        }
        self.append(appends);
    }

    /// Writes every record of `appends` with one sync and reports each
    /// append flushed, in order.
    fn append(&mut self, appends: Vec<Append>) {
        let Some((first, reset, _)) = appends.first() else {
            return;
        };
        let first_index = first.first().map(|r| r.0);
        let reset = *reset;
        let result = self.write(|w| {
            if reset && !w.wal.is_empty() && first_index.is_some_and(|f| f != w.wal.next_index()) {
                // Everything held was purged (a snapshot moved the log on):
                // start the files afresh at the new index.
                w.wal.reset()?;
            }
            w.wal.append(
                appends
                    .iter()
                    .flat_map(|(records, _, _)| records.iter().map(|(i, b)| (*i, &b[..]))),
            )
        });
        for (_, _, callback) in appends {
            callback(
                result
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| std::io::Error::other(e.to_string())),
            );
        }
    }

    fn other(&mut self, job: Job) {
        let (result, done) = match job {
            Job::Append { .. } => return,
            Job::Truncate { index, done } => (
                self.write(|w| w.wal.truncate_from(index))
                    .map_err(|e| storage_err(StorageIOError::write_logs, e)),
                done,
            ),
            Job::Purge { index, meta } => {
                // An I/O error stops the log (`write`); anything else
                // leaves the records in place, to be purged with the next
                // one.
                if let Err(e) = self.write(|w| {
                    write_meta(&w.dir, &meta)?;
                    w.wal.purge_upto(index).map(|_| ())
                }) {
                    tracing::error!(index, error = %e, "cannot purge the log");
                }
                return;
            }
            Job::Meta { meta, done } => (
                self.write(|w| write_meta(&w.dir, &meta))
                    .map_err(|e| storage_err(StorageIOError::write_vote, e)),
                done,
            ),
        };
        let _ = done.send(result);
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, StorageError> {
        // An empty range that ends before it starts has no entries
        // (`BTreeMap::range` panics on it).
        use std::ops::Bound::{Excluded, Included};
        match (range.start_bound(), range.end_bound()) {
            (Included(s) | Excluded(s), Included(e) | Excluded(e)) if s > e => {
                return Ok(Vec::new());
            }
            (Excluded(s), Excluded(e)) if s == e => return Ok(Vec::new()),
            _ => {}
        }
        // Copied out under the lock (cheap: reference counts), decoded
        // outside it; the batches share the held bytes (nothing is copied
        // or decoded to replicate an entry).
        let held: Vec<Bytes> = {
            let state = self.state.lock();
            state
                .entries
                .range(range)
                .map(|(_, h)| h.bytes.clone())
                .collect()
        };
        held.iter()
            .map(|b| decode_sharing(b).map_err(|e| storage_err(StorageIOError::read_logs, e)))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = self.state.lock();
        let last = state
            .entries
            .last_key_value()
            .map(|(_, h)| h.log_id)
            .or(state.meta.purged);
        Ok(LogState {
            last_purged_log_id: state.meta.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let meta = {
            let mut state = self.state.lock();
            state.meta.vote = Some(*vote);
            LogStore::encoded_meta(&state)?
        };
        self.run(|done| Job::Meta { meta, done }).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.state.lock().meta.vote)
    }

    /// Kept in memory and saved with the next metadata write: it is a hint,
    /// recomputed by the leader after a restart.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.state.lock().meta.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.state.lock().meta.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = LogEntry> + Send,
        I::IntoIter: Send,
    {
        let mut records = Vec::new();
        let mut held = Vec::new();
        let mut commands = 0u64;
        for e in entries {
            if let openraft::EntryPayload::Normal(batch) = &e.payload {
                commands += u64::from(batch.op_count());
            }
            #[cfg(debug_assertions)]
            if let openraft::EntryPayload::Membership(m) = &e.payload {
                // The second step of a change of voters: a uniform
                // membership after a joint one.
                static JOINT: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                let joint = m.get_joint_config().len() > 1;
                if !joint && JOINT.load(Ordering::Relaxed) {
                    super::crash_point("uniform");
                }
                JOINT.store(joint, Ordering::Relaxed);
            }
            // Sized up front (a batch's bytes and a few more), so not grown
            // as it is written; held in memory until purged, so cut to size
            // where the room left over is more than an eighth of it (small
            // entries: a large one's few spare bytes are not worth a copy).
            let encoded = postcard::to_extend(&e, Vec::with_capacity(encoded_size_hint(&e)))
                .map_err(|err| storage_err(StorageIOError::write_logs, err))?;
            let bytes = if encoded.capacity() - encoded.len() > encoded.len() / 8 {
                Bytes::from(encoded.into_boxed_slice())
            } else {
                Bytes::from(encoded)
            };
            records.push((e.log_id.index, bytes.clone()));
            held.push((e.log_id, bytes));
        }
        // Entries after a purge that is held back until its snapshot is on
        // disk would start the files afresh: they wait for that snapshot
        // (only entries that arrive while a snapshot is being installed).
        loop {
            let released = self.purge_released.notified();
            {
                let state = self.state.lock();
                if !(state.entries.is_empty() && state.held_purge.is_some()) {
                    break;
                }
                if let Some(why) = &state.install_failed {
                    return Err(storage_err(
                        StorageIOError::write_logs,
                        format!("these entries follow a snapshot that was not installed: {why}"),
                    ));
                }
            }
            released.await;
        }
        let reset = {
            let mut state = self.state.lock();
            let reset = state.entries.is_empty();
            for (log_id, bytes) in held {
                state.hold(log_id, bytes);
            }
            reset
        };
        let bytes = records.iter().map(|(_, b)| b.len()).sum();
        self.appended
            .0
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        self.appended.1.fetch_add(commands, Ordering::Relaxed);
        self.grown.notify_one();
        let job = Job::Append {
            records,
            reset,
            callback: Box::new(move |r| callback.log_io_completed(r)),
        };
        match &self.jobs {
            Jobs::Thread(h) => h.append(job, bytes),
            Jobs::Inline(_) => self.jobs.send(job),
        }
        .map_err(|_| storage_err(StorageIOError::write_logs, "the log writer stopped"))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Entries from the cut on were never applied (only committed ones
        // are, and those are never cut): the ones that replace them are
        // new, and the replay ends before the first of them.
        let cut = log_id.index.saturating_sub(1);
        let _ = self
            .replay_upto
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u > cut).then_some(cut)
            });
        self.state.lock().drop_from(log_id.index);
        self.run(|done| Job::Truncate {
            index: log_id.index,
            done,
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let meta = {
            let mut state = self.state.lock();
            state.meta.purged = Some(log_id);
            state.drop_upto(log_id.index);
            if state.snapshot_covers.is_some_and(|c| log_id.index >= c) {
                // Saved once the snapshot that covers it is on disk
                // (`snapshot_on_disk`); until then a restart finds the log
                // as it was, and the snapshot file that goes with it.
                state.held_purge = Some(log_id);
                return Ok(());
            }
            state.held_purge = None;
            state.disk_purged = Some(log_id);
            LogStore::encoded_meta(&state)?
        };
        // Handed to the writer, in order with the appends, and not waited
        // for: openraft needs no purge on disk (a restart before it is
        // finds those entries still in the log, under the snapshot that
        // covers them, and purges them again), and waiting would stop the
        // Raft core for as long as the writer is busy: behind a sync, or
        // for good on a stalled disk, which a leader otherwise rides out
        // on its followers' disks.
        self.jobs
            .send(Job::Purge {
                index: log_id.index,
                meta,
            })
            .map_err(|_| storage_err(StorageIOError::write_logs, "the log writer stopped"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh log directory, removed afterwards.
    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A hand-off whose thread is the test: it holds the receiving end.
    fn handoff(name: &str) -> (Dir, Handoff, mpsc::Receiver<Job>) {
        let dir =
            Dir(std::env::temp_dir().join(format!("idem-log-store-{name}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        let (wal, _) = Wal::open(&dir.0, 1 << 16).unwrap();
        let writer = Writer::new(wal, dir.0.clone());
        let (tx, rx) = mpsc::channel();
        let h = Handoff {
            tx,
            writer: Arc::new(Mutex::new(writer)),
            queued: Arc::default(),
            inline_below: Arc::new(AtomicUsize::new(4096)),
            inlined: Arc::default(),
        };
        (dir, h, rx)
    }

    /// A job that saves `byte` as the metadata file, and its completion.
    fn save(byte: u8) -> (Job, oneshot::Receiver<Result<(), StorageError>>) {
        let (done, rx) = oneshot::channel();
        (
            Job::Meta {
                meta: vec![byte],
                done,
            },
            rx,
        )
    }

    fn saved(dir: &Dir) -> Vec<u8> {
        read_meta(&dir.0).unwrap().unwrap()
    }

    fn meta_of(job: &Job) -> u8 {
        match job {
            Job::Meta { meta, .. } => meta[0],
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_small_append_on_an_idle_writer_is_written_by_the_caller() {
        let (dir, h, rx) = handoff("inline");
        let (job, mut done) = save(1);
        h.append(job, 100).unwrap();
        // Done before append returned; nothing was handed over.
        assert!(matches!(done.try_recv(), Ok(Ok(()))));
        assert!(rx.try_recv().is_err());
        assert_eq!(saved(&dir), [1]);
    }

    /// A write that fails stops the log, not the process: it and every
    /// write after it fail (openraft's core stops on them, and idemd exits),
    /// even once the files could be written again.
    #[test]
    fn a_failed_write_refuses_every_later_one() {
        let (dir, h, _rx) = handoff("failed");
        std::fs::remove_dir_all(&dir.0).unwrap();
        let (job, mut done) = save(1);
        h.append(job, 100).unwrap();
        assert!(matches!(done.try_recv(), Ok(Err(_))));
        std::fs::create_dir_all(&dir.0).unwrap();
        let (job, mut done) = save(2);
        h.append(job, 100).unwrap();
        let Ok(Err(e)) = done.try_recv() else {
            panic!("a save after a failed one was not refused")
        };
        assert!(e.to_string().contains("an earlier write"), "{e}");
        let (reported, report) = oneshot::channel();
        let job = Job::Append {
            records: vec![(1, Bytes::from_static(b"entry"))],
            reset: false,
            callback: Box::new(move |r: Result<(), std::io::Error>| {
                let _ = reported.send(r.is_err());
            }),
        };
        h.append(job, 100).unwrap();
        assert_eq!(
            report.blocking_recv(),
            Ok(true),
            "an append was not refused"
        );
        assert_eq!(read_meta(&dir.0).unwrap(), None, "nothing was written");
    }

    #[test]
    fn a_large_append_goes_to_the_thread() {
        let (_dir, h, rx) = handoff("large");
        let (job, mut done) = save(2);
        h.append(job, 4096).unwrap();
        assert!(done.try_recv().is_err());
        assert_eq!(meta_of(&rx.try_recv().unwrap()), 2);
        assert_eq!(h.queued.load(Ordering::Acquire), 1);
    }

    #[test]
    fn a_small_append_behind_a_handed_over_job_keeps_its_place() {
        let (_dir, h, rx) = handoff("queued");
        let (first, _) = save(3);
        h.send(first).unwrap();
        // The first waits for the thread: the second, small as it is,
        // follows it there rather than being written before it.
        let (second, mut done) = save(4);
        h.append(second, 10).unwrap();
        assert!(done.try_recv().is_err());
        assert_eq!(meta_of(&rx.try_recv().unwrap()), 3);
        assert_eq!(meta_of(&rx.try_recv().unwrap()), 4);
    }

    #[test]
    fn a_small_append_while_the_thread_writes_goes_to_the_thread() {
        let (_dir, h, rx) = handoff("busy");
        // The thread holds the writer (and has counted its jobs done, as it
        // does before letting go of it).
        let busy = h.writer.lock();
        let (job, mut done) = save(5);
        h.append(job, 10).unwrap();
        drop(busy);
        assert!(done.try_recv().is_err());
        assert_eq!(meta_of(&rx.try_recv().unwrap()), 5);
    }

    #[test]
    fn the_thread_does_what_is_handed_over_in_order() {
        let (dir, h, rx) = handoff("thread");
        let (first, first_done) = save(6);
        let (second, second_done) = save(7);
        h.send(first).unwrap();
        h.send(second).unwrap();
        let (writer, queued) = (Arc::clone(&h.writer), Arc::clone(&h.queued));
        drop(h);
        // Ends once every sender is gone and the jobs are done.
        let thread_queued = Arc::clone(&queued);
        std::thread::spawn(move || Writer::run(&writer, &thread_queued, &rx))
            .join()
            .unwrap();
        assert!(matches!(first_done.blocking_recv(), Ok(Ok(()))));
        assert!(matches!(second_done.blocking_recv(), Ok(Ok(()))));
        assert_eq!(saved(&dir), [7]);
        assert_eq!(queued.load(Ordering::Acquire), 0);
    }

    /// Every metadata save (a vote) is written after the appends handed
    /// over before it are synced and reported, and before those handed
    /// over after it: a saved vote is a barrier (see the module docs: a
    /// leader that steps down relies on it).
    #[test]
    fn a_saved_vote_follows_every_append_handed_over_before_it() {
        let (dir, h, rx) = handoff("barrier");
        // Each append's report notes whether the vote was saved by then.
        let reports = Arc::new(Mutex::new(Vec::new()));
        let append = |index: u64| {
            let (reports, dir) = (Arc::clone(&reports), dir.0.clone());
            Job::Append {
                records: vec![(index, Bytes::from(vec![index as u8; 64]))],
                reset: false,
                callback: Box::new(move |r: Result<(), std::io::Error>| {
                    r.unwrap();
                    let saved = read_meta(&dir).unwrap().is_some_and(|m| m == [9]);
                    reports.lock().push((index, saved));
                }),
            }
        };
        h.send(append(1)).unwrap();
        h.send(append(2)).unwrap();
        let (vote, vote_done) = save(9);
        h.send(vote).unwrap();
        h.send(append(3)).unwrap();
        let (writer, queued) = (Arc::clone(&h.writer), Arc::clone(&h.queued));
        drop(h);
        std::thread::spawn(move || Writer::run(&writer, &queued, &rx))
            .join()
            .unwrap();
        assert!(matches!(vote_done.blocking_recv(), Ok(Ok(()))));
        assert_eq!(
            *reports.lock(),
            [(1, false), (2, false), (3, true)],
            "(append, vote saved when it was reported)"
        );
        assert_eq!(saved(&dir), [9]);
    }

    /// A purge is handed to the writer and not waited for: a writer held
    /// up (a stalled disk) does not hold up the Raft core that purges, and
    /// the purge is saved once the writer goes on.
    #[tokio::test]
    async fn a_purge_does_not_wait_for_a_busy_writer() {
        let dir =
            Dir(std::env::temp_dir().join(format!("idem-log-store-purge-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        let mut store = LogStore::open(&dir.0, 1 << 16, Writing::Thread).unwrap();
        let Jobs::Thread(h) = &store.jobs else {
            unreachable!("opened with a writer thread")
        };
        // Another thread holds the writer, as a sync that does not return
        // would, until told to let go.
        let writer = Arc::clone(&h.writer);
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let busy = std::thread::spawn(move || {
            let _writer = writer.lock();
            held_tx.send(()).unwrap();
            let _ = go_rx.recv();
        });
        held_rx.recv().unwrap();
        let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 1), 5);
        let purged =
            tokio::time::timeout(std::time::Duration::from_secs(5), store.purge(log_id)).await;
        // Let go of the writer before the directory goes.
        drop(go_tx);
        busy.join().unwrap();
        purged
            .expect("the purge waited for the busy writer")
            .unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id));
        // The writer saves it once it goes on.
        store.wait_idle();
        let meta: Meta = postcard::from_bytes(&read_meta(&dir.0).unwrap().unwrap()).unwrap();
        assert_eq!(meta.purged, Some(log_id));
        drop(store);
    }

    /// What a snapshot must cover next is the log past the latest one:
    /// entries it covers and not yet purged are left out.
    #[test]
    fn the_log_past_a_snapshot_leaves_out_what_it_covers() {
        let dir =
            Dir(std::env::temp_dir().join(format!("idem-log-store-past-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        let store = LogStore::open(&dir.0, 1 << 16, Writing::Inline).unwrap();
        assert_eq!(store.held_between(None, 10), (0, 0));
        {
            let mut state = store.state.lock();
            // Entries 5..=9 of 50..=90 bytes (1..=4 purged).
            for index in 5..=9u64 {
                let bytes = Bytes::from(vec![0; index as usize * 10]);
                let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
                state.hold(log_id, bytes);
            }
        }
        assert_eq!(store.held(), (5, 350));
        assert_eq!(store.held_between(None, 9), (5, 350));
        assert_eq!(store.held_between(Some(2), 9), (5, 350));
        assert_eq!(store.held_between(Some(6), 9), (3, 240));
        assert_eq!(store.held_between(Some(6), 8), (2, 150));
        assert_eq!(store.held_between(Some(6), 100), (3, 240));
        assert_eq!(store.held_between(None, 5), (1, 50));
        assert_eq!(store.held_between(Some(9), 9), (0, 0));
        assert_eq!(store.held_between(Some(12), 20), (0, 0));
        assert_eq!(store.held_between(Some(7), 6), (0, 0));
        assert_eq!(store.held_between(None, 3), (0, 0));
        // Ranges that end before they start hold nothing (and do not
        // panic).
        let mut reader = store.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (start, end) = (std::hint::black_box(8u64), std::hint::black_box(6u64));
            assert_eq!(
                reader.try_get_log_entries(start..end).await.unwrap().len(),
                0
            );
            assert_eq!(
                reader.try_get_log_entries(start..=end).await.unwrap().len(),
                0
            );
            let open = (
                std::ops::Bound::Excluded(7u64),
                std::ops::Bound::Excluded(7u64),
            );
            assert_eq!(reader.try_get_log_entries(open).await.unwrap().len(), 0);
        });
        // After a purge the rest still count the same.
        store.state.lock().drop_upto(6);
        assert_eq!(store.held_between(Some(6), 9), (3, 240));
        assert_eq!(store.held_between(None, 8), (2, 150));
    }

    /// openraft purges the log as soon as it asks the state machine to
    /// install a snapshot, before that snapshot is written. The purge was
    /// saved at once: a crash in between left a log purged past the
    /// snapshot file, and a node that could not start. Now a purge past
    /// the snapshot on disk is saved (with every metadata write meanwhile)
    /// only once the snapshot that covers it is.
    #[tokio::test]
    async fn a_purge_past_the_snapshot_on_disk_waits_for_it() {
        let dir =
            Dir(std::env::temp_dir()
                .join(format!("idem-log-store-held-purge-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        let mut store = LogStore::open(&dir.0, 1 << 16, Writing::Thread).unwrap();
        let id = |index| LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        let on_disk = |dir: &Dir| -> Option<LogId> {
            postcard::from_bytes::<Meta>(&read_meta(&dir.0).unwrap().unwrap_or_default())
                .unwrap_or_default()
                .purged
        };
        store.snapshot_on_disk(Some(id(2)));
        // Covered by the snapshot on disk: saved at once.
        store.purge(id(2)).await.unwrap();
        store.wait_idle();
        assert_eq!(on_disk(&dir), Some(id(2)));
        // Past it (a snapshot being installed): openraft sees it purged,
        // the files do not, nor after a vote is saved.
        store.purge(id(9)).await.unwrap();
        assert_eq!(
            store.get_log_state().await.unwrap().last_purged_log_id,
            Some(id(9))
        );
        let vote = Vote::new(2, 1);
        store.save_vote(&vote).await.unwrap();
        store.wait_idle();
        assert_eq!(
            on_disk(&dir),
            Some(id(2)),
            "purged before its snapshot is on disk"
        );
        // The snapshot is on disk: the purge is saved.
        store.snapshot_on_disk(Some(id(9)));
        store.wait_idle();
        assert_eq!(on_disk(&dir), Some(id(9)));
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        drop(store);
    }

    /// The replay a restart does ends at the last entry the log was opened
    /// with, unless a truncation cuts below it: the entries that replace
    /// the cut ones are new, and must be counted.
    #[tokio::test]
    async fn a_truncation_ends_the_replay_before_what_replaces_the_cut() {
        use openraft::storage::RaftLogStorageExt;
        let dir =
            Dir(std::env::temp_dir().join(format!("idem-log-store-replay-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        let id = |index| LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        let mut store = LogStore::open(&dir.0, 1 << 16, Writing::Thread).unwrap();
        assert_eq!(
            store.replay_boundary().load(Ordering::Acquire),
            0,
            "nothing to replay"
        );
        store
            .blocking_append((1..=6).map(|i| openraft::Entry {
                log_id: id(i),
                payload: openraft::EntryPayload::Blank,
            }))
            .await
            .unwrap();
        // Appended by this process: not a replay.
        assert_eq!(store.replay_boundary().load(Ordering::Acquire), 0);
        store.wait_idle();
        drop(store);
        let mut store = LogStore::open(&dir.0, 1 << 16, Writing::Thread).unwrap();
        let upto = store.replay_boundary();
        assert_eq!(upto.load(Ordering::Acquire), 6);
        store.truncate(id(4)).await.unwrap();
        assert_eq!(upto.load(Ordering::Acquire), 3, "4 on are new");
        // A cut above it changes nothing.
        store.truncate(id(5)).await.unwrap();
        assert_eq!(upto.load(Ordering::Acquire), 3);
        store.wait_idle();
        drop(store);
    }

    /// Entries that arrive while a snapshot is installed wait for it to be
    /// on disk (the log is purged past it). An install that failed left
    /// them waiting for good, and the Raft core with them, which then
    /// never read the install's error: the node neither served nor
    /// stopped. They fail with the install's error now.
    #[tokio::test]
    async fn entries_waiting_for_a_snapshot_that_failed_to_install_fail_too() {
        use openraft::storage::RaftLogStorageExt;
        let dir = Dir(std::env::temp_dir().join(format!(
            "idem-log-store-failed-install-{}",
            std::process::id()
        )));
        let _ = std::fs::remove_dir_all(&dir.0);
        let mut store = LogStore::open(&dir.0, 1 << 16, Writing::Thread).unwrap();
        let id = |index| LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        store.snapshot_on_disk(Some(id(2)));
        // A snapshot up to 9 is being installed.
        store.purge(id(9)).await.unwrap();
        let mut appender = store.clone();
        let append = tokio::spawn(async move {
            appender
                .blocking_append([openraft::Entry {
                    log_id: id(10),
                    payload: openraft::EntryPayload::Blank,
                }])
                .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!append.is_finished(), "did not wait for the snapshot");
        store.snapshot_install_failed("no space left on device");
        let appended = tokio::time::timeout(std::time::Duration::from_secs(10), append)
            .await
            .expect("still waits for a snapshot that will never be on disk")
            .unwrap();
        let e = appended.expect_err("appended past a snapshot never installed");
        assert!(e.to_string().contains("no space left on device"), "{e}");
        // A snapshot built meanwhile, covering less than the install would
        // have, leaves the failure standing.
        store.snapshot_on_disk(Some(id(5)));
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            store.clone().blocking_append([openraft::Entry {
                log_id: id(10),
                payload: openraft::EntryPayload::Blank,
            }]),
        )
        .await
        .expect("waits again for the snapshot that failed");
        assert!(again.is_err(), "appended past a snapshot never installed");
        drop(store);
    }

    #[test]
    fn after_a_slow_sync_small_appends_go_to_the_thread() {
        let (_dir, h, rx) = handoff("slow");
        h.writer.lock().wal.last_sync_us = INLINE_MAX_SYNC_US + 1;
        let (job, mut done) = save(8);
        h.append(job, 10).unwrap();
        assert!(done.try_recv().is_err());
        assert_eq!(meta_of(&rx.try_recv().unwrap()), 8);
    }
}
