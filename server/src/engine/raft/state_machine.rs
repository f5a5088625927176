//! openraft's state machine over the store: applies each committed batch
//! with the store's rules, publishes the key events, and keeps snapshots
//! on disk (written to a file of its own, synced, renamed over the
//! current one).
//!
//! # Snapshot file (version 1)
//!
//! ```text
//! "IDEMSNAP" ... is the store's own format (store/snapshot.rs); the file
//! `snapshot` wraps it:
//! "IDEMRSNP" u32:version u32:meta_len meta(postcard SnapshotMeta) store_snapshot u32:crc32
//! ```

// openraft's `StorageError` is what its traits return; it is large, and
// not ours to shrink.
#![allow(clippy::result_large_err)]

use std::fs;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, Snapshot, StorageIOError};
use parking_lot::Mutex;

use super::snapshot_data::{Check, SnapshotData};
use super::types::{
    LogEntry, LogId, Replies, SnapshotMeta, StorageError, StoredMembership, TypeConfig, storage_err,
};
use super::wal::{rename_synced, write_synced};
use crate::engine::EventSink;
use crate::store::{SnapshotCopy, Store};

const MAGIC: &[u8; 8] = b"IDEMRSNP";
const VERSION: u32 = 1;

struct Inner {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// What the snapshot on disk covers. Its data is not kept in memory
    /// (it is a third of the store's size, or more): the file is read when
    /// a follower needs it.
    snapshot: Option<SnapshotMeta>,
    /// The size of the snapshot file, bytes.
    file_bytes: u64,
    stats: SnapshotStats,
}

/// What INFO reports of snapshots.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotStats {
    /// The log id the latest snapshot covers.
    pub last_log_id: Option<LogId>,
    /// Snapshots built since start.
    pub built: u64,
    /// How long the latest one took, from the copy to the synced file, s.
    pub last_secs: f64,
    /// How long applies waited while the latest one copied the store, ms.
    pub last_pause_ms: u64,
    /// The longest such wait since start, ms.
    pub max_pause_ms: u64,
    /// The size of the snapshot file on disk, bytes (0: none).
    pub file_bytes: u64,
    /// Whether a snapshot is being built (from the store's copy until its
    /// file is current or dropped).
    pub building: bool,
}

/// The state machine (a cheap handle; the snapshot builder shares it).
#[derive(Clone)]
pub struct StateMachine {
    store: Arc<Store>,
    inner: Arc<Mutex<Inner>>,
    sink: Arc<OnceLock<Weak<dyn EventSink>>>,
    dir: PathBuf,
    /// Snapshots are built on a thread of their own (see
    /// [`on_own_thread`]); off, on the runtime's blocking pool, which a
    /// simulated runtime keeps inside its simulated time.
    own_thread: bool,
    /// Held while a written snapshot file is made current (a rename; see
    /// [`StateMachine::make_current`]) and by [`StateMachine::stop`], not
    /// while it is written: a build that finishes after a newer snapshot
    /// was installed (openraft builds in a task of its own) must not
    /// replace it as the current snapshot.
    saving: Arc<Mutex<()>>,
    /// Set (under `saving`) when the engine stops: a build or an install
    /// still running then makes nothing current (its file is removed). The data directory's lock goes
    /// with the engine, and a write finishing later (a build runs on a
    /// thread of its own, and openraft does not wait for its state machine
    /// task) could put a snapshot newer than what the next engine on the
    /// directory loaded under it.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    /// The log, told when a snapshot is on disk (it purges on disk only
    /// what a snapshot on disk covers).
    log: Option<super::log_store::LogStore>,
    /// How many [`SnapshotBuilder`]s live (openraft drops one only after
    /// it reported its build, and may have made the next by then).
    building: Arc<std::sync::atomic::AtomicUsize>,
    /// Set while this node follows a leader: [`StateMachine::answers_first`].
    answers_first: Arc<std::sync::atomic::AtomicBool>,
    /// The last entry of the log this process started with, until it is
    /// applied: [`StateMachine::replaying_upto`].
    replaying_upto: Arc<std::sync::atomic::AtomicU64>,
}

/// Why the state machine could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotFileError {
    /// Reading the file failed.
    #[error("read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a snapshot this build reads.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The file's bytes before the store's snapshot: its header and `meta`.
fn file_head_bytes(meta: &SnapshotMeta) -> Result<Vec<u8>, postcard::Error> {
    let meta = postcard::to_allocvec(meta)?;
    let mut head = Vec::with_capacity(16 + meta.len());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    head.extend_from_slice(&meta);
    Ok(head)
}

fn invalid(path: &Path, reason: &str) -> SnapshotFileError {
    SnapshotFileError::Invalid {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Checks the first 16 bytes of a snapshot file (magic, version) and
/// returns the length of the meta that follows them.
fn file_head(path: &Path, head: &[u8]) -> Result<usize, SnapshotFileError> {
    if head.len() < 16 || &head[..8] != MAGIC {
        return Err(invalid(path, "not an Idem snapshot file"));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != VERSION {
        return Err(invalid(
            path,
            &format!(
                "snapshot file version {version} is not supported (this build reads {VERSION})"
            ),
        ));
    }
    Ok(u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize)
}

/// A snapshot file's layout, from its header.
struct FileHead {
    meta: SnapshotMeta,
    /// Where the store's snapshot starts, and its length.
    base: u64,
    len: u64,
    /// The file's bytes before the store's snapshot, hashed.
    hasher: crc32fast::Hasher,
    /// The file's checksum.
    want: u32,
}

/// The snapshot file at `path` (if there is one), positioned where the
/// store's snapshot starts, and its layout.
fn read_head(path: &Path) -> Result<Option<(fs::File, FileHead)>, SnapshotFileError> {
    let io = |source| SnapshotFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let file_len = f.metadata().map_err(io)?.len();
    let mut head = [0u8; 16];
    f.read_exact(&mut head)
        .map_err(|_| invalid(path, "not an Idem snapshot file"))?;
    let meta_len = file_head(path, &head)?;
    let base = 16 + meta_len as u64;
    let len = file_len
        .checked_sub(base + 4)
        .ok_or_else(|| invalid(path, "cut short"))?;
    let mut meta = vec![0u8; meta_len];
    f.read_exact(&mut meta).map_err(io)?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&head);
    hasher.update(&meta);
    let meta: SnapshotMeta =
        postcard::from_bytes(&meta).map_err(|e| invalid(path, &e.to_string()))?;
    let mut want = [0u8; 4];
    f.seek(std::io::SeekFrom::Start(base + len)).map_err(io)?;
    f.read_exact(&mut want).map_err(io)?;
    f.seek(std::io::SeekFrom::Start(base)).map_err(io)?;
    Ok(Some((
        f,
        FileHead {
            meta,
            base,
            len,
            hasher,
            want: u32::from_le_bytes(want),
        },
    )))
}

/// The current snapshot, its data read from the file at `path` as it
/// is sent: the header is read here, the rest a chunk at a time.
fn open_file(path: &Path) -> Result<Option<Snapshot<TypeConfig>>, SnapshotFileError> {
    let Some((f, head)) = read_head(path)? else {
        return Ok(None);
    };
    let check = Check::new(head.hasher, head.want, path.display().to_string());
    Ok(Some(Snapshot {
        meta: head.meta,
        snapshot: Box::new(SnapshotData::file(f, head.base, head.len, check)),
    }))
}

/// Loads the snapshot file at `path` (if there is one) into `store`; its
/// meta. The file is read a part at a time, three times (its checksum,
/// then the store's check and load), never whole into memory: a store
/// loading beside a copy of itself would need twice its memory to start.
fn load_file(store: &Store, path: &Path) -> Result<Option<SnapshotMeta>, SnapshotFileError> {
    let io = |source| SnapshotFileError::Io {
        path: path.to_owned(),
        source,
    };
    let Some((f, head)) = read_head(path)? else {
        return Ok(None);
    };
    let mut data = std::io::BufReader::with_capacity(READ_PART, f.take(head.len));
    let mut hasher = head.hasher;
    let mut chunk = vec![0u8; READ_PART];
    loop {
        let n = data.read(&mut chunk).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
    }
    drop(chunk);
    if data.get_ref().limit() != 0 || hasher.finalize() != head.want {
        return Err(invalid(path, "checksum mismatch"));
    }
    let open = || {
        let mut f = fs::File::open(path)?;
        f.seek(std::io::SeekFrom::Start(head.base))?;
        Ok(std::io::BufReader::with_capacity(
            READ_PART,
            f.take(head.len),
        ))
    };
    store
        .load_snapshot_from(open, head.len)
        .map_err(|e| invalid(path, &e.to_string()))?;
    Ok(Some(head.meta))
}

/// A run of entries is applied in slices of about this long, the runtime
/// given back between them: openraft's state machine task shares its
/// runtime thread with the node's Raft core, peers and clients, and a long
/// run (a follower catching up after a snapshot or a partition, thousands
/// of entries of hundreds of writes each) held it for seconds, long enough
/// for heartbeats to stop and elections to fail.
const APPLY_SLICE: std::time::Duration = std::time::Duration::from_millis(2);

/// How much of a snapshot file is read at a time.
pub(super) const READ_PART: usize = 1 << 20;

/// Files snapshots are received into are named this, then a number.
const INCOMING_PREFIX: &str = "snapshot.incoming-";

/// Snapshot files being written (built, or installed from what was
/// received) are named this, then a number, until they are renamed to
/// `snapshot`.
const WRITING_PREFIX: &str = "snapshot.writing-";

/// The number of the next file a snapshot is received into or written to.
static NEXT_FILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A written snapshot file is synced each time this many more bytes are
/// written to it, as well as at its end: a snapshot of a large store
/// otherwise leaves gigabytes of dirty pages for the one sync at its end
/// (or for the kernel's writeback) to write at once, and the log's syncs
/// queue behind them on the same disk.
const SYNC_EVERY: u64 = 8 << 20;

/// How many bytes a snapshot file is written with at a time when it is
/// written directly ([`SyncingAsItGoes::new`]): a multiple of
/// [`DIRECT_ALIGN`].
const DIRECT_CHUNK: usize = 1 << 20;

/// A snapshot of fewer records than this is written through the page
/// cache: too small for direct writes to save much, and the buffer they
/// gather in (a [`DIRECT_CHUNK`]) would be most of what its write
/// allocates. A snapshot installed from the leader: below [`SYNC_EVERY`]
/// bytes.
const DIRECT_MIN_RECORDS: usize = 100_000;

/// What direct writes are aligned to: their file offsets, lengths and
/// buffer addresses (the largest logical block size of common disks).
const DIRECT_ALIGN: usize = 4096;

/// Opens `file` for direct writes (`O_DIRECT`), or closes it to them.
///
/// # Errors
///
/// What `fcntl` returns: `EINVAL` where the file system takes no direct
/// writes (tmpfs).
fn set_direct(file: &fs::File, on: bool) -> std::io::Result<()> {
    let fl = rustix::fs::fcntl_getfl(file)?;
    let fl = match on {
        true => fl | rustix::fs::OFlags::DIRECT,
        false => fl - rustix::fs::OFlags::DIRECT,
    };
    Ok(rustix::fs::fcntl_setfl(file, fl)?)
}

/// Bytes gathered for the next direct write, in a buffer whose window
/// `at..at + DIRECT_CHUNK` starts at an aligned address.
struct Staged {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Staged {
    fn new() -> Staged {
        let buf = vec![0u8; DIRECT_CHUNK + DIRECT_ALIGN];
        let at = buf.as_ptr().align_offset(DIRECT_ALIGN);
        Staged { buf, at, len: 0 }
    }
}

/// A file writer that syncs its file's data every [`SYNC_EVERY`] bytes,
/// and gives up there once `stopped` is set (a snapshot of a large store
/// takes seconds to write, and one the engine will not keep need not be
/// written to its end).
///
/// Where the file system allows it, the file is written directly
/// (`O_DIRECT`) a [`DIRECT_CHUNK`] at a time, its last partial block
/// through the page cache: a snapshot is written once and read rarely, and
/// copying it into new page-cache pages was the kernel's share of a
/// snapshot's CPU, taken from the serving threads on a small machine. [`SyncingAsItGoes::finish`] writes what is
/// still gathered; a file system that refuses a direct write makes the
/// rest go through the page cache.
struct SyncingAsItGoes<'a> {
    file: &'a mut fs::File,
    unsynced: u64,
    stopped: &'a std::sync::atomic::AtomicBool,
    /// Gathered bytes, while the file is written directly.
    direct: Option<Staged>,
}

impl<'a> SyncingAsItGoes<'a> {
    /// Writes `file` (empty) directly if `direct` and its file system
    /// allows it, else through the page cache.
    fn new(
        file: &'a mut fs::File,
        stopped: &'a std::sync::atomic::AtomicBool,
        direct: bool,
    ) -> SyncingAsItGoes<'a> {
        let direct = direct && set_direct(file, true).is_ok();
        SyncingAsItGoes {
            file,
            unsynced: 0,
            stopped,
            direct: direct.then(Staged::new),
        }
    }

    /// Counts `n` bytes written; syncs at a stretch's end, or gives up
    /// there if the engine stopped.
    fn wrote(&mut self, n: usize) -> std::io::Result<()> {
        self.unsynced += n as u64;
        if self.unsynced >= SYNC_EVERY {
            if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
                return Err(std::io::Error::other(
                    "the engine stopped: the snapshot is not written",
                ));
            }
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Writes the whole blocks gathered directly; keeps the rest gathered.
    /// A file system that refuses (`EINVAL`) ends direct writing: the
    /// bytes gathered go through the page cache, as everything after.
    fn write_staged(&mut self) -> std::io::Result<()> {
        let Some(st) = self.direct.as_mut() else {
            return Ok(());
        };
        let whole = st.len / DIRECT_ALIGN * DIRECT_ALIGN;
        if whole == 0 {
            return Ok(());
        }
        match self.file.write_all(&st.buf[st.at..st.at + whole]) {
            Ok(()) => {
                st.buf.copy_within(st.at + whole..st.at + st.len, st.at);
                st.len -= whole;
                self.wrote(whole)
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                // Nothing of a refused direct write is written (the file
                // system checks alignment first).
                self.end_direct()
            }
            Err(e) => Err(e),
        }
    }

    /// Stops writing directly: clears `O_DIRECT`, then writes what was
    /// gathered through the page cache.
    fn end_direct(&mut self) -> std::io::Result<()> {
        let Some(st) = self.direct.take() else {
            return Ok(());
        };
        set_direct(self.file, false)?;
        self.file.write_all(&st.buf[st.at..st.at + st.len])?;
        self.wrote(st.len)
    }

    /// Writes everything gathered: the file then holds every byte written
    /// to this writer (and is written through the page cache from now on).
    fn finish(&mut self) -> std::io::Result<()> {
        self.write_staged()?;
        self.end_direct()
    }
}

impl Write for SyncingAsItGoes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(st) = self.direct.as_mut() {
            let n = buf.len().min(DIRECT_CHUNK - st.len);
            st.buf[st.at + st.len..st.at + st.len + n].copy_from_slice(&buf[..n]);
            st.len += n;
            if st.len == DIRECT_CHUNK {
                self.write_staged()?;
            }
            return Ok(n);
        }
        let n = self.file.write(buf)?;
        self.wrote(n)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A received snapshot, loaded.
enum Received {
    Mem(Vec<u8>),
    File(ReceivedFile),
}

/// The file a snapshot was received into, removed when dropped (once it
/// is written as the snapshot file, or when it could not be installed).
struct ReceivedFile(PathBuf);

impl Drop for ReceivedFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

impl StateMachine {
    /// The state machine over `store`, loading the snapshot in `dir` if
    /// there is one.
    pub fn open(store: Arc<Store>, dir: &Path) -> Result<StateMachine, SnapshotFileError> {
        let path = dir.join("snapshot");
        let mut inner = Inner {
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: None,
            file_bytes: 0,
            stats: SnapshotStats::default(),
        };
        // Snapshots being received or written when the process stopped
        // (and `snapshot.tmp`, where earlier releases wrote them).
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(INCOMING_PREFIX)
                    || name.starts_with(WRITING_PREFIX)
                    || name == "snapshot.tmp"
                {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        if let Some(meta) = load_file(&store, &path)? {
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.snapshot = Some(meta);
            inner.file_bytes = fs::metadata(&path).map_or(0, |m| m.len());
        }
        Ok(StateMachine {
            store,
            inner: Arc::new(Mutex::new(inner)),
            sink: Arc::new(OnceLock::new()),
            dir: dir.to_owned(),
            own_thread: true,
            saving: Arc::default(),
            stopped: Arc::default(),
            log: None,
            building: Arc::default(),
            answers_first: Arc::default(),
            replaying_upto: Arc::default(),
        })
    }

    /// Whether each apply first lets the tasks already woken on its
    /// runtime run (one yield). For a follower: a follower learns of a
    /// commit from its leader's next AppendEntries, and openraft applies
    /// it while that request's entries are written; when the write is
    /// done on the runtime thread itself ([`super::INLINE_APPEND_BELOW`]),
    /// the apply would otherwise run between the sync and the answer the
    /// leader waits for. A follower's applies serve no one until it leads
    /// (a new leader applies its whole log before it serves).
    pub fn answers_first(&self, on: bool) {
        self.answers_first
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The log this process started with ends at `last`: its entries were
    /// applied (and counted) by the process before, and applying them again
    /// rebuilds the store, not events. Once entry `last` is applied the
    /// store's counters are set back to zero, so that a restart's counters
    /// start from zero like every other count of `INFO` (a restarted node
    /// said it had just lapsed every lease its log recorded lapsing, which
    /// a rate over its counters took for a burst).
    ///
    /// `upto` is shared with the log store, which brings it down when it
    /// cuts its tail: the entries that replace the cut ones are new (and a
    /// reset when the old last index came back would wipe their counts).
    #[must_use]
    pub fn replaying_upto(mut self, upto: Arc<std::sync::atomic::AtomicU64>) -> StateMachine {
        let applied = self.inner.lock().last_applied.map_or(0, |l| l.index);
        if upto.load(std::sync::atomic::Ordering::Acquire) <= applied {
            upto.store(0, std::sync::atomic::Ordering::Release);
        }
        self.replaying_upto = upto;
        self
    }

    /// Entry `index` is about to be applied, or was (`done`): the replay
    /// ends once the last entry of the log this process started with is
    /// applied, or when one past it comes first (that one was cut, and
    /// replaced by a leader's).
    fn replayed(&self, index: u64, done: bool) {
        let upto = self
            .replaying_upto
            .load(std::sync::atomic::Ordering::Acquire);
        if upto != 0 && (index > upto || (done && index == upto)) {
            self.replaying_upto
                .store(0, std::sync::atomic::Ordering::Release);
            self.store.reset_counters();
        }
    }

    /// Tells `log` what the snapshot on disk covers, now and after each
    /// snapshot written.
    #[must_use]
    pub fn reporting_to(mut self, log: super::log_store::LogStore) -> StateMachine {
        log.snapshot_on_disk(
            self.inner
                .lock()
                .snapshot
                .as_ref()
                .and_then(|m| m.last_log_id),
        );
        self.log = Some(log);
        self
    }

    /// Stops writing snapshots: a build or an install under way (openraft
    /// does not wait for its state machine task when it shuts down) makes
    /// nothing current from now on. Waits for a snapshot being made
    /// current (a rename), not for one being written, which gives up
    /// within [`SYNC_EVERY`] bytes.
    pub fn stop(&self) {
        let _saving = self.saving.lock();
        self.stopped
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a snapshot at or past `last` is the current one already.
    fn has_newer(&self, last: Option<LogId>) -> bool {
        self.inner
            .lock()
            .snapshot
            .as_ref()
            .is_some_and(|m| m.last_log_id >= last)
    }

    /// Reports the snapshot file now on disk to the log.
    fn report_saved(&self, last: Option<LogId>) {
        if let Some(log) = &self.log {
            log.snapshot_on_disk(last);
        }
    }

    /// Whether snapshots are built on a thread of their own (the default)
    /// or on the runtime's blocking pool (for simulations: a thread of its
    /// own runs outside simulated time, and could outlive a simulated
    /// crash of its node).
    #[must_use]
    pub fn snapshots_on_own_thread(mut self, own: bool) -> StateMachine {
        self.own_thread = own;
        self
    }

    /// Where key events go (set once).
    pub fn sink(&self) -> Arc<OnceLock<Weak<dyn EventSink>>> {
        Arc::clone(&self.sink)
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogId> {
        self.inner.lock().last_applied
    }

    /// The last snapshot's log id and size, whether one is being built,
    /// and how many were built by this process.
    pub fn snapshot_stats(&self) -> SnapshotStats {
        let inner = self.inner.lock();
        SnapshotStats {
            last_log_id: inner.snapshot.as_ref().and_then(|m| m.last_log_id),
            file_bytes: inner.file_bytes,
            building: self.building.load(std::sync::atomic::Ordering::Acquire) > 0,
            ..inner.stats
        }
    }

    /// Writes a snapshot file under `meta` (its header, the store's
    /// snapshot that `body` writes, hashed as it goes, the checksum) to a
    /// file of its own, synced; its path. Nothing is held meanwhile: a
    /// build takes seconds on a large store, and an install, a stop or
    /// another build does not wait for it ([`StateMachine::make_current`]
    /// decides which is kept). The file is removed if it cannot be
    /// written. Written directly if `direct` (a large snapshot) and the
    /// file system allows it ([`SyncingAsItGoes`]).
    pub(super) fn write_file(
        &self,
        meta: &SnapshotMeta,
        direct: bool,
        body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<WrittenFile, String> {
        let head = file_head_bytes(meta).map_err(|e| e.to_string())?;
        let n = NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = WrittenFile {
            path: self.dir.join(format!("{WRITING_PREFIX}{n}")),
            current: false,
        };
        write_synced(&file.path, |f| {
            let mut out = SyncingAsItGoes::new(f, &self.stopped, direct);
            let mut crc = crc32fast::Hasher::new();
            crc.update(&head);
            out.write_all(&head)?;
            body(&mut Hashing {
                out: &mut out,
                crc: &mut crc,
            })?;
            out.write_all(&crc.finalize().to_le_bytes())?;
            out.finish()
        })
        .map_err(|e| e.to_string())?;
        Ok(file)
    }

    /// Makes `file`, written under `meta`, the current snapshot (renamed
    /// over `snapshot`, the directory synced), unless the engine stopped
    /// or, for a build (`built`), a snapshot as new is current already;
    /// then it is removed. Whether it was made current. Holds the save
    /// lock, so a build and an install come wholly before or after each
    /// other, and a stop after both.
    pub(super) fn make_current(
        &self,
        mut file: WrittenFile,
        meta: &SnapshotMeta,
        built: bool,
    ) -> Result<bool, String> {
        let _saving = self.saving.lock();
        if self.is_stopped() || (built && self.has_newer(meta.last_log_id)) {
            return Ok(false);
        }
        let file_bytes = fs::metadata(&file.path).map_or(0, |m| m.len());
        rename_synced(&file.path, &self.dir, "snapshot").map_err(|e| e.to_string())?;
        file.current = true;
        {
            let mut inner = self.inner.lock();
            inner.file_bytes = file_bytes;
            if !built {
                inner.last_applied = meta.last_log_id;
                inner.membership = meta.last_membership.clone();
            }
            inner.snapshot = Some(meta.clone());
        }
        self.report_saved(meta.last_log_id);
        Ok(true)
    }

    /// Installs a snapshot received from the leader: loads it into the
    /// store, then writes it as the current snapshot file.
    async fn install(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError> {
        let refused = |e: String| {
            storage_err(
                StorageIOError::write_snapshot_any,
                format!(
                    "cannot install the snapshot {} received from the leader: {e}",
                    meta.snapshot_id
                ),
            )
        };
        #[cfg(debug_assertions)]
        slow_snapshot_install().await;
        // Loaded off the runtime thread: a large snapshot takes seconds,
        // and this node's peers and clients are answered meanwhile.
        let store = Arc::clone(&self.store);
        let data = match *snapshot {
            SnapshotData::Incoming(incoming) => {
                // Removed however this ends.
                let file = ReceivedFile(incoming.into_path());
                let load = tokio::task::spawn_blocking(move || {
                    let len = fs::metadata(&file.0).map_err(|e| e.to_string())?.len();
                    let open = || {
                        Ok(std::io::BufReader::with_capacity(
                            READ_PART,
                            fs::File::open(&file.0)?,
                        ))
                    };
                    store
                        .load_snapshot_from(open, len)
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(Received::File(file))
                });
                load.await
                    .map_err(|e| refused(e.to_string()))?
                    .map_err(refused)?
            }
            other => {
                let bytes = other
                    .into_bytes()
                    .await
                    .map_err(|e| storage_err(StorageIOError::read_snapshot_any, e))?;
                let load = tokio::task::spawn_blocking(move || {
                    store
                        .load_snapshot(&bytes)
                        .map(|()| Received::Mem(bytes))
                        .map_err(|e| e.to_string())
                });
                load.await
                    .map_err(|e| refused(e.to_string()))?
                    .map_err(refused)?
            }
        };
        // Written off the runtime thread too, and without waiting for a
        // build writing its (older) snapshot: the build then finds this
        // one newer and drops its own.
        let (sm, meta) = (self.clone(), meta.clone());
        tokio::task::spawn_blocking(move || {
            let stopped = || {
                storage_err(
                    StorageIOError::write_snapshot_any,
                    "the engine stopped: the snapshot was not installed",
                )
            };
            if sm.is_stopped() {
                return Err(stopped());
            }
            let written = match data {
                Received::Mem(data) => sm.write_file(&meta, data.len() as u64 >= SYNC_EVERY, |w| {
                    w.write_all(&data)
                }),
                Received::File(file) => match fs::File::open(&file.0) {
                    Ok(mut from) => {
                        let large = from.metadata().is_ok_and(|m| m.len() >= SYNC_EVERY);
                        sm.write_file(&meta, large, |w| std::io::copy(&mut from, w).map(drop))
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            let file = written.map_err(|e| storage_err(StorageIOError::write_snapshot_any, e))?;
            match sm.make_current(file, &meta, false) {
                Ok(true) => Ok(()),
                Ok(false) => Err(stopped()),
                Err(e) => Err(storage_err(StorageIOError::write_snapshot_any, e)),
            }
        })
        .await
        .map_err(|e| storage_err(StorageIOError::write_snapshot_any, e))?
    }
}

/// A snapshot file being written, removed when dropped unless it was made
/// current.
pub(super) struct WrittenFile {
    path: PathBuf,
    /// Renamed to `snapshot`: nothing is left to remove.
    current: bool,
}

impl Drop for WrittenFile {
    fn drop(&mut self) {
        if !self.current {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A writer that hashes what it writes.
struct Hashing<'a, W> {
    out: W,
    crc: &'a mut crc32fast::Hasher,
}

impl<W: Write> Write for Hashing<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// `StorageIOError::write_snapshot` without a signature.
trait WriteSnapshotAny {
    fn write_snapshot_any(e: openraft::AnyError) -> Self;
}

impl WriteSnapshotAny for StorageIOError<u64> {
    fn write_snapshot_any(e: openraft::AnyError) -> Self {
        StorageIOError::write_snapshot(None, e)
    }
}

/// `StorageIOError::read_snapshot` without a signature.
trait ReadSnapshotAny {
    fn read_snapshot_any(e: openraft::AnyError) -> Self;
}

impl ReadSnapshotAny for StorageIOError<u64> {
    fn read_snapshot_any(e: openraft::AnyError) -> Self {
        StorageIOError::read_snapshot(None, e)
    }
}

/// A snapshot taken between two applies (so its records and its last
/// applied id agree), written to disk when openraft asks for it.
pub struct SnapshotBuilder {
    sm: StateMachine,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    copy: Option<SnapshotCopy>,
    /// When the copy started, and how long applies waited for it.
    started: std::time::Instant,
    pause_ms: u64,
}

impl Drop for SnapshotBuilder {
    fn drop(&mut self) {
        self.sm
            .building
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (last_applied, membership) = (self.last_applied, self.membership.clone());
        // Encoding (sorting by key, checksumming) runs here, while applies
        // go on.
        let Some(copy) = self.copy.take() else {
            return Err(storage_err(
                StorageIOError::write_snapshot_any,
                "a snapshot builder was used twice",
            ));
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: format!(
                "{}-{}",
                last_applied.map_or(0, |l| l.leader_id.term),
                last_applied.map_or(0, |l| l.index)
            ),
        };
        // Encoding, writing and syncing run on a thread of their own. A
        // snapshot that cannot be written (a full disk, say) keeps the
        // previous one and the whole log: openraft purges the log only once
        // this returns, so it returns only once the file is on disk.
        let sm = self.sm.clone();
        let file_meta = meta.clone();
        // `None`: the engine stopped, and nothing was written.
        let work = move || {
            if sm.is_stopped() {
                return None;
            }
            #[cfg(debug_assertions)]
            slow_snapshot_build();
            let mut failures = 0u64;
            loop {
                if sm.is_stopped() {
                    return None;
                }
                if sm.has_newer(file_meta.last_log_id) {
                    // A newer snapshot was installed (or built) meanwhile:
                    // this one is not kept, and openraft ignores it (it
                    // takes only the meta of what a build returns, so its
                    // data is not encoded).
                    return Some((SnapshotData::mem(Vec::new()), false));
                }
                // Encoded straight into its file, a part at a time: the
                // snapshot is never whole in memory beside the store.
                let saved = sm
                    .write_file(&file_meta, copy.len() >= DIRECT_MIN_RECORDS, |mut w| {
                        copy.encode_to(&mut w).map(drop)
                    })
                    .and_then(|file| sm.make_current(file, &file_meta, true));
                match saved {
                    Ok(true) => {
                        if failures > 0 {
                            tracing::info!(attempts = failures + 1, "snapshot written");
                        }
                        // The snapshot's data, read from its file.
                        let path = sm.dir.join("snapshot");
                        let data = match open_file(&path) {
                            Ok(Some(s)) => *s.snapshot,
                            other => {
                                if let Err(e) = other {
                                    tracing::warn!(error = %e, "cannot read the snapshot just written");
                                }
                                SnapshotData::mem(Vec::new())
                            }
                        };
                        return Some((data, true));
                    }
                    // Stopped, or a newer one was made current meanwhile.
                    Ok(false) => continue,
                    // Given up part way: the engine stopped.
                    Err(_) if sm.is_stopped() => return None,
                    Err(e) => {
                        if failures == 0 {
                            tracing::warn!(
                                error = %e,
                                "cannot write a snapshot: keeping the previous one and the log; retrying"
                            );
                        }
                        failures += 1;
                    }
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        };
        let (data, kept) = if self.sm.own_thread {
            on_own_thread("idem-snapshot", work).await
        } else {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| e.to_string())
        }
        .map_err(|e| storage_err(StorageIOError::write_snapshot_any, e))?
        .ok_or_else(|| {
            storage_err(
                StorageIOError::write_snapshot_any,
                "the engine stopped: the snapshot was not written",
            )
        })?;
        if kept {
            let mut inner = self.sm.inner.lock();
            let stats = &mut inner.stats;
            stats.built += 1;
            stats.last_secs = self.started.elapsed().as_secs_f64();
            stats.last_pause_ms = self.pause_ms;
            stats.max_pause_ms = stats.max_pause_ms.max(self.pause_ms);
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.inner.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Replies>, StorageError>
    where
        I: IntoIterator<Item = LogEntry> + Send,
        I::IntoIter: Send,
    {
        if self
            .answers_first
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            // The tasks already woken run first: on a follower, the answer
            // to the AppendEntries whose flush let this apply run.
            tokio::task::yield_now().await;
        }
        let mut out = Vec::new();
        let mut slice = std::time::Instant::now();
        for entry in entries {
            let index = entry.log_id.index;
            self.replayed(index, false);
            let reply = match entry.payload {
                EntryPayload::Blank => Replies::default(),
                EntryPayload::Normal(batch) => {
                    let started = std::time::Instant::now();
                    // Checked as it came in; decoded only here.
                    let decoded = batch.entry().map_err(|e| StorageError::IO {
                        source: StorageIOError::apply(entry.log_id, openraft::AnyError::error(e)),
                    })?;
                    let applied = self.store.apply(&decoded);
                    let took = started.elapsed();
                    if took > std::time::Duration::from_millis(2) {
                        tracing::debug!(
                            index = entry.log_id.index,
                            ops = applied.len(),
                            took_us = took.as_micros() as u64,
                            "slow apply"
                        );
                    }
                    if let Some(sink) = self.sink.get().and_then(Weak::upgrade) {
                        let events: Vec<_> = applied
                            .iter()
                            .flat_map(|a| a.events.iter().cloned())
                            .collect();
                        if !events.is_empty() {
                            sink.on_events(&events);
                        }
                    }
                    Replies(applied)
                }
                EntryPayload::Membership(m) => {
                    self.inner.lock().membership = StoredMembership::new(Some(entry.log_id), m);
                    Replies::default()
                }
            };
            self.inner.lock().last_applied = Some(entry.log_id);
            self.replayed(index, true);
            out.push(reply);
            if slice.elapsed() >= APPLY_SLICE {
                tokio::task::yield_now().await;
                slice = std::time::Instant::now();
            }
        }
        Ok(out)
    }

    /// Called between applies: the copy taken here is consistent with the
    /// last applied id (apply waits while the store is copied).
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let (last_applied, membership) = {
            let inner = self.inner.lock();
            (inner.last_applied, inner.membership.clone())
        };
        self.building
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let started = std::time::Instant::now();
        let copy = self.store.snapshot_copy();
        let pause_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            records = copy.len(),
            applies_paused_ms = pause_ms,
            "store copied for a snapshot"
        );
        SnapshotBuilder {
            sm: self.clone(),
            last_applied,
            membership,
            copy: Some(copy),
            started,
            pause_ms,
        }
    }

    /// Into a file of its own in the data directory: a snapshot as large
    /// as the store is not held in memory beside it.
    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        let n = NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{INCOMING_PREFIX}{n}"));
        let data = tokio::task::spawn_blocking(move || SnapshotData::incoming(path))
            .await
            .map_err(|e| storage_err(StorageIOError::write_snapshot_any, e))?
            .map_err(|e| storage_err(StorageIOError::write_snapshot_any, e))?;
        Ok(Box::new(data))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError> {
        let installed = self.install(meta, snapshot).await;
        if let (Err(e), Some(log)) = (&installed, &self.log) {
            log.snapshot_install_failed(&e.to_string());
        }
        if installed.is_ok()
            && let Some(last) = meta.last_log_id
        {
            // Past the log this process started with: its replay is over.
            self.replayed(last.index, true);
        }
        installed
    }

    /// Its data read from the file as it is sent (openraft asks for it to
    /// send it to a follower that needs it, and once at start). The store's
    /// snapshot within carries its own checksum, which the follower checks.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        if self.inner.lock().snapshot.is_none() {
            return Ok(None);
        }
        // Not under the save lock: the file is replaced by a rename, so
        // the one opened here is whole, the current one or the one about
        // to be, and stays as it is while it is sent.
        let path = self.dir.join("snapshot");
        let snapshot = tokio::task::spawn_blocking(move || open_file(&path))
            .await
            .map_err(|e| storage_err(StorageIOError::read_snapshot_any, e))?
            .map_err(|e| storage_err(StorageIOError::read_snapshot_any, e))?;
        Ok(snapshot)
    }
}

/// The niceness of a snapshot's thread. A snapshot writes the whole
/// store, and on a busy node it competed with the threads that serve: on
/// three nodes sharing two cores, with 4M records and claims at pipeline
/// 16, claims fell from about 220k to 50k-140k a second for the seconds
/// each node's snapshot ran. At nice 10 (as RocksDB lowers its compaction
/// threads) a snapshot takes what CPU the serving threads leave: 162k and
/// 162k claims/s over 20 s against 131k and 137k at the usual priority,
/// alternating. A snapshot then takes longer on a saturated node, and the
/// log it will cover (held in memory until then) grows meanwhile.
const BACKGROUND_NICE: i32 = 10;

/// Runs `work` on a thread of its own that ends with it, so the memory the
/// work freed goes back at once (a pooled blocking thread keeps its
/// allocator pages until it ends, idle, seconds later), at
/// [`BACKGROUND_NICE`]; on the blocking pool if no thread can be started.
async fn on_own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let work = Arc::new(Mutex::new(Some(work)));
    let theirs = Arc::clone(&work);
    let (done, result) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Best effort: at worst the thread runs at the usual priority.
            let _ = rustix::process::setpriority_process(
                Some(rustix::thread::gettid()),
                BACKGROUND_NICE,
            );
            let work = theirs.lock().take();
            if let Some(work) = work {
                let _ = done.send(work());
            }
        });
    match spawned {
        Ok(_) => result
            .await
            .map_err(|_| format!("the {name} thread failed")),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a thread: running on the blocking pool");
            let work = work.lock().take().ok_or("the work was lost")?;
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| e.to_string())
        }
    }
}

/// Debug builds only, for fault tests: with `IDEMD_TEST_SNAPSHOT_BUILD_MS`
/// set, each snapshot build first waits that many ms (a slow disk, a
/// large store).
#[cfg(debug_assertions)]
fn slow_snapshot_build() {
    std::thread::sleep(test_delay("IDEMD_TEST_SNAPSHOT_BUILD_MS"));
}

/// Debug builds only, for fault tests: with `IDEMD_TEST_SNAPSHOT_INSTALL_MS`
/// set, each snapshot received first waits that many ms before it is
/// installed (a large store to load).
#[cfg(debug_assertions)]
async fn slow_snapshot_install() {
    tokio::time::sleep(test_delay("IDEMD_TEST_SNAPSHOT_INSTALL_MS")).await;
}

/// The delay the environment variable `var` asks for, in ms (none if unset).
#[cfg(debug_assertions)]
fn test_delay(var: &str) -> std::time::Duration {
    let ms = std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    std::time::Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot file written directly (where the file system allows it)
    /// holds every byte written to it, in order, whatever the sizes of the
    /// writes: whole chunks, bytes left over across them, and a last
    /// partial block; the same through the page cache. Once finished, the
    /// file is no longer open for direct writes.
    #[test]
    fn a_snapshot_file_holds_every_byte_whether_written_directly_or_not() {
        for direct in [true, false] {
            let path = std::env::temp_dir()
                .join(format!("idem-sm-direct-{}-{direct}", std::process::id()));
            let mut file = fs::File::create(&path).unwrap();
            // Whether this file system takes direct writes at all.
            let allowed = {
                let probe = fs::File::create(path.with_extension("probe")).unwrap();
                let ok = set_direct(&probe, true).is_ok();
                drop(probe);
                let _ = fs::remove_file(path.with_extension("probe"));
                ok
            };
            let stopped = std::sync::atomic::AtomicBool::new(false);
            let mut out = SyncingAsItGoes::new(&mut file, &stopped, direct);
            assert_eq!(out.direct.is_some(), direct && allowed);
            let mut want = Vec::new();
            let mut seed = 12345u64;
            // Sizes from one byte to past a chunk, ~11 MiB in all (past a
            // sync stretch), ending off a block boundary.
            for i in 0..60u64 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let len = match i % 4 {
                    0 => 1 + (seed >> 50) as usize % 10,
                    1 => DIRECT_CHUNK + 7,
                    _ => (seed >> 40) as usize % 300_000,
                };
                let piece: Vec<u8> = (0..len).map(|j| (j as u64 ^ seed) as u8).collect();
                out.write_all(&piece).unwrap();
                want.extend_from_slice(&piece);
            }
            out.write_all(&[1, 2, 3]).unwrap();
            want.extend_from_slice(&[1, 2, 3]);
            out.finish().unwrap();
            assert!(out.direct.is_none());
            let fl = rustix::fs::fcntl_getfl(&*out.file).unwrap();
            assert!(!fl.contains(rustix::fs::OFlags::DIRECT), "still direct");
            file.sync_all().unwrap();
            drop(file);
            let got = fs::read(&path).unwrap();
            let _ = fs::remove_file(&path);
            assert_eq!(got.len(), want.len(), "direct {direct}");
            assert!(got == want, "the bytes differ (direct {direct})");
        }
    }

    /// A snapshot file is written a stretch of [`SYNC_EVERY`] bytes at a
    /// time, each synced; once the engine stopped, the next stretch's end
    /// gives the write up (a snapshot of a large store that nothing will
    /// keep is not written to its end).
    #[test]
    fn a_snapshot_s_write_stops_within_a_stretch_of_the_engine_stopping() {
        let path = std::env::temp_dir().join(format!("idem-sm-stretch-{}", std::process::id()));
        let mut file = fs::File::create(&path).unwrap();
        let stopped = std::sync::atomic::AtomicBool::new(false);
        let mut out = SyncingAsItGoes::new(&mut file, &stopped, false);
        let part = vec![7u8; 1 << 20];
        for _ in 0..SYNC_EVERY / (1 << 20) + 2 {
            out.write_all(&part).unwrap();
        }
        assert_eq!(out.unsynced, 2 << 20, "synced at the stretch's end");
        stopped.store(true, std::sync::atomic::Ordering::Release);
        let mut written = 0u64;
        let e = loop {
            match out.write_all(&part) {
                Ok(()) => written += part.len() as u64,
                Err(e) => break e,
            }
            assert!(
                written <= SYNC_EVERY,
                "written on past a stretch after the stop"
            );
        };
        assert!(e.to_string().contains("stopped"), "{e}");
        drop(file);
        let _ = fs::remove_file(&path);
    }

    /// A snapshot's thread runs at a lower priority than the threads that
    /// serve (see [`BACKGROUND_NICE`]).
    #[tokio::test]
    async fn a_snapshot_s_thread_gives_way_to_the_serving_threads() {
        let own = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let before = own().unwrap();
        let nice = on_own_thread("idem-snapshot", own).await.unwrap().unwrap();
        assert!(nice >= BACKGROUND_NICE, "niceness {nice}");
        assert_eq!(own().unwrap(), before, "the caller's own priority changed");
    }
}
