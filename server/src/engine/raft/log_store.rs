//! openraft's log storage over the write-ahead log: every entry appended
//! is on disk (one `fdatasync` per append) before openraft is told it is
//! flushed; the vote and the purge point live in the atomically replaced
//! metadata file. Entries not yet purged are also kept in memory, so reads
//! of the log never touch the disk.

// openraft's `StorageError` is what its traits return; it is large, and
// not ours to shrink.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageIOError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::types::{LogEntry, LogId, StorageError, TypeConfig, Vote, storage_err};
use super::wal::{Wal, WalError, read_meta, write_meta};

/// What the metadata file holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

struct Inner {
    wal: Wal,
    entries: BTreeMap<u64, LogEntry>,
    meta: Meta,
    /// The committed id reported last (saved with the next metadata write:
    /// it is a hint, recomputed by the leader after a restart).
    committed: Option<LogId>,
    dir: PathBuf,
}

/// The log store (a cheap handle; clones share the log).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// Sync count and percentiles, copied after each append so that INFO
    /// never waits on the log's lock during a sync.
    sync_stats: Arc<Mutex<(u64, u64, u64)>>,
    /// The committed index openraft reported last (0: none), for INFO.
    committed_index: Arc<std::sync::atomic::AtomicU64>,
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
}

impl LogStore {
    /// Opens the log in `dir` (created if missing).
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<LogStore, OpenError> {
        let meta: Meta = match read_meta(dir)? {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(|e| OpenError::Entry {
                path: dir.join("meta"),
                index: 0,
                reason: e.to_string(),
            })?,
            None => Meta::default(),
        };
        let (wal, records) = Wal::open(dir, segment_bytes)?;
        let purged = meta.purged.map_or(0, |l| l.index);
        let mut entries = BTreeMap::new();
        for (index, payload) in records {
            if meta.purged.is_some() && index <= purged {
                continue;
            }
            let entry: LogEntry = postcard::from_bytes(&payload).map_err(|e| OpenError::Entry {
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
            entries.insert(index, entry);
        }
        let committed = meta.committed;
        Ok(LogStore {
            sync_stats: Arc::new(Mutex::new((0, 0, 0))),
            committed_index: Arc::new(std::sync::atomic::AtomicU64::new(
                committed.map_or(0, |l| l.index),
            )),
            inner: Arc::new(Mutex::new(Inner {
                wal,
                entries,
                meta,
                committed,
                dir: dir.to_owned(),
            })),
        })
    }

    /// `fdatasync`s done by the log so far, and their 50th and 99th
    /// percentile times in µs.
    pub fn syncs(&self) -> (u64, u64, u64) {
        *self.sync_stats.lock()
    }

    /// The committed index openraft reported last (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.committed_index
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the log on a blocking thread (file I/O and syncs).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&mut inner.lock()))
            .await
            .map_err(|e| storage_err(StorageIOError::write_logs, e))?
    }
}

/// A write or sync of the log that failed: nothing after it can be
/// acknowledged, and what the OS did with the failed write is unknown (a
/// failed fsync may have dropped dirty pages). The process stops; a restart
/// recovers the prefix that was synced.
fn fatal(e: &WalError) -> ! {
    tracing::error!(error = %e, "the log cannot be written: stopping (a restart recovers what was synced)");
    eprintln!("idemd: fatal: the log cannot be written: {e}");
    std::process::exit(70)
}

/// Turns a log error into a storage error; an I/O error is fatal.
fn checked(e: WalError, kind: fn(openraft::AnyError) -> StorageIOError<u64>) -> StorageError {
    if matches!(e, WalError::Io { .. }) {
        fatal(&e);
    }
    storage_err(kind, e)
}

fn save_meta(inner: &mut Inner) -> Result<(), StorageError> {
    inner.meta.committed = inner.committed;
    let bytes = postcard::to_allocvec(&inner.meta)
        .map_err(|e| storage_err(StorageIOError::write_vote, e))?;
    write_meta(&inner.dir, &bytes).map_err(|e| checked(e, StorageIOError::write_vote))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, StorageError> {
        let inner = self.inner.lock();
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.inner.lock();
        let last = inner
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(inner.meta.purged);
        Ok(LogState {
            last_purged_log_id: inner.meta.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.blocking(move |inner| {
            inner.meta.vote = Some(vote);
            save_meta(inner)
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.committed_index.store(
            committed.map_or(0, |l| l.index),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.inner.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().meta.committed)
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
        let entries: Vec<LogEntry> = entries.into_iter().collect();
        let mut encoded = Vec::with_capacity(entries.len());
        for e in &entries {
            let bytes = postcard::to_allocvec(e)
                .map_err(|err| storage_err(StorageIOError::write_logs, err))?;
            encoded.push((e.log_id.index, bytes));
        }
        let sync_stats = Arc::clone(&self.sync_stats);
        let result = self
            .blocking(move |inner| {
                let first = encoded.first().map(|e| e.0);
                if inner.entries.is_empty()
                    && !inner.wal.is_empty()
                    && first.is_some_and(|f| f != inner.wal.next_index())
                {
                    // Everything held was purged (a snapshot moved the log
                    // on): start the files afresh at the new index.
                    inner
                        .wal
                        .reset()
                        .map_err(|e| checked(e, StorageIOError::write_logs))?;
                }
                inner
                    .wal
                    .append(encoded.iter().map(|(i, b)| (*i, &b[..])))
                    .map_err(|e| checked(e, StorageIOError::write_logs))?;
                for e in entries {
                    inner.entries.insert(e.log_id.index, e);
                }
                let (p50, p99) = inner.wal.sync_percentiles();
                *sync_stats.lock() = (inner.wal.syncs, p50, p99);
                Ok(())
            })
            .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.blocking(move |inner| {
            inner
                .wal
                .truncate_from(log_id.index)
                .map_err(|e| checked(e, StorageIOError::write_logs))?;
            inner.entries.split_off(&log_id.index);
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.blocking(move |inner| {
            inner.meta.purged = Some(log_id);
            save_meta(inner)?;
            let keep = inner.entries.split_off(&(log_id.index + 1));
            inner.entries = keep;
            inner
                .wal
                .purge_upto(log_id.index)
                .map_err(|e| checked(e, StorageIOError::write_logs))?;
            Ok(())
        })
        .await
    }
}
