//! The write-ahead log: append-only segment files of checksummed records,
//! one `fdatasync` per appended batch, and a small metadata file replaced
//! atomically.
//!
//! # Format (version 1, integers little-endian)
//!
//! A segment is named after the index of its first record,
//! `{first_index:020}.wal`, and holds:
//!
//! ```text
//! "IDEMWAL\0" u32:version u64:first_index          (the header, 20 bytes)
//! records × ( u32:len u32:crc32 u64:index payload ) (len = 8 + payload length;
//!                                                    crc over index and payload)
//! ```
//!
//! Indexes are consecutive across records and segments. The segment being
//! written is zeroed ahead of its records (1 MiB at a time), so a
//! batch overwrites bytes the file already has and its `fdatasync` has no
//! file size to commit (measured on ext4: a third less per sync than
//! appending); a segment is cut to its records when the next one starts,
//! so zeros after the records mark the end of the log in the last segment
//! only.
//!
//! The metadata file
//! `meta` holds `"IDEMMETA" u32:version u32:len u32:crc32 payload`, written
//! to `meta.tmp`, synced, renamed over `meta`, and the directory synced.
//!
//! # Recovery
//!
//! Zeros after the last record are the room zeroed ahead of it, not damage.
//! A record that does not check out at the end of the last segment, with
//! nothing valid after it, is a write cut short by a crash: it is cut off
//! (and logged). Anything else that does not check out — a bad record
//! followed by valid ones, a bad header, a gap in the indexes, damage in a
//! segment that is not the last — is a startup error naming the file and
//! offset: the log is never skipped over silently.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::warn;

const SEGMENT_MAGIC: &[u8; 8] = b"IDEMWAL\0";
const META_MAGIC: &[u8; 8] = b"IDEMMETA";
/// The log format this build writes and reads.
pub const WAL_VERSION: u32 = 1;
const HEADER_LEN: u64 = 20;
/// How far ahead of its records the segment being written is zeroed.
const ZERO_AHEAD: u64 = 1 << 20;
/// Zeros to write from.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
/// `len` + `crc`.
const RECORD_HEAD: usize = 8;
/// The longest record payload accepted (a batch of commands is capped well
/// below this).
const MAX_RECORD: u32 = 256 << 20;

/// A log that cannot be opened or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A file holds something that is not a valid log.
    #[error("{path} at offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A file was written by a newer (or unknown) format.
    #[error("{path}: log format version {found} is not supported (this build reads {WAL_VERSION})")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WalError + 'a {
    move |source| WalError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> WalError {
    WalError::Corrupt {
        path: path.to_owned(),
        offset,
        reason: reason.into(),
    }
}

/// Syncs a directory, so that files created or renamed in it survive a
/// crash.
pub fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync directory", dir))
}

/// Records read back from the log: index and payload, in index order.
pub type Records = Vec<(u64, Vec<u8>)>;

#[derive(Debug, Clone)]
struct Segment {
    first: u64,
    path: PathBuf,
}

/// Where a record lives.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Position of its segment in `segments`.
    segment: usize,
    offset: u64,
}

/// The segment being written.
#[derive(Debug)]
struct Active {
    file: File,
    /// Where its records end.
    len: u64,
    /// The file's length: from `len` up to it, zeros.
    zeroed: u64,
}

impl Active {
    /// Opens the segment at `path` to write after its first `len` bytes
    /// (those after them are zeros).
    fn open(path: &Path, len: u64) -> Result<Active, WalError> {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err("open", path))?;
        let size = file.metadata().map_err(io_err("stat", path))?.len();
        Ok(Active {
            file,
            len,
            zeroed: size.max(len),
        })
    }
}

/// The log.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segments: Vec<Segment>,
    /// The last segment, open for writing.
    active: Option<Active>,
    /// The first index held (its segment's first record on disk).
    first: u64,
    /// Where every record from `base` on starts. A purge drops the slots
    /// of the records it covers, also those of the segment being written
    /// (never read or cut again), so `base` may be past `first`.
    base: u64,
    slots: Vec<Slot>,
    segment_bytes: u64,
    /// `fdatasync`s done.
    pub syncs: u64,
    /// How long the latest took, in µs.
    pub last_sync_us: u64,
    /// How long they took, in µs (shared with whoever reports them, who
    /// computes percentiles only when asked).
    sync_us: SyncTimes,
    /// The batches held back by the deliberately broken mode (debug builds).
    #[cfg(debug_assertions)]
    deferred: Vec<u8>,
    #[cfg(debug_assertions)]
    deferred_batches: u32,
    /// Where the held-back batches go in the file.
    #[cfg(debug_assertions)]
    deferred_at: u64,
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

fn crc(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// One record parsed at `at` in `buf`: its index, payload and length.
fn parse_record(buf: &[u8], at: usize) -> Option<(u64, &[u8], usize)> {
    let head = buf.get(at..at + RECORD_HEAD)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let sum = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if !(8..=MAX_RECORD).contains(&len) {
        return None;
    }
    let body = buf.get(at + RECORD_HEAD..at + RECORD_HEAD + len as usize)?;
    let mut ix = [0u8; 8];
    ix.copy_from_slice(&body[..8]);
    let index = u64::from_le_bytes(ix);
    let payload = &body[8..];
    (crc(index, payload) == sum).then_some((index, payload, RECORD_HEAD + len as usize))
}

impl Wal {
    /// Opens (or creates) the log in `dir`, returning it and every record
    /// it holds, in index order. A torn tail is cut off; any other damage
    /// is an error.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<(Wal, Records), WalError> {
        Wal::open_from(dir, segment_bytes, 0)
    }

    /// [`Wal::open`], returning only the records from index `keep_from`
    /// on: those before it (a snapshot covers them) are checked like every
    /// other, but not copied out, so a restart holds only the records it
    /// keeps beside the segment it is reading.
    pub fn open_from(
        dir: &Path,
        segment_bytes: u64,
        keep_from: u64,
    ) -> Result<(Wal, Records), WalError> {
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let mut firsts = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err("read directory", dir))? {
            let entry = entry.map_err(io_err("read directory", dir))?;
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".wal")) else {
                continue;
            };
            let first: u64 = stem
                .parse()
                .map_err(|_| corrupt(&entry.path(), 0, "not a log segment name"))?;
            firsts.push(first);
        }
        firsts.sort_unstable();
        let mut wal = Wal {
            dir: dir.to_owned(),
            segments: Vec::new(),
            active: None,
            first: firsts.first().copied().unwrap_or(0),
            base: firsts.first().copied().unwrap_or(0),
            slots: Vec::new(),
            segment_bytes: segment_bytes.max(HEADER_LEN + 64),
            syncs: 0,
            last_sync_us: 0,
            sync_us: SyncTimes::default(),
            #[cfg(debug_assertions)]
            deferred: Vec::new(),
            #[cfg(debug_assertions)]
            deferred_batches: 0,
            #[cfg(debug_assertions)]
            deferred_at: 0,
        };
        let mut records = Vec::new();
        let count = firsts.len();
        for (n, first) in firsts.into_iter().enumerate() {
            let path = dir.join(segment_name(first));
            let last = n + 1 == count;
            // Indexes run on from one segment to the next: a missing or
            // stray segment is an error, not a gap to skip.
            if !wal.slots.is_empty() {
                let next = wal.next_index();
                if first != next {
                    return Err(corrupt(
                        &path,
                        0,
                        format!("segment starts at index {first} where {next} was expected"),
                    ));
                }
            }
            let valid_len = wal.load_segment(&path, first, last, keep_from, &mut records)?;
            wal.segments.push(Segment {
                first,
                path: path.clone(),
            });
            if last {
                let active = Active::open(&path, valid_len)?;
                // What a crash left in the page cache but not on disk is
                // made durable before anything is served from it.
                active.file.sync_all().map_err(io_err("sync", &path))?;
                preallocate(&active.file, &path, wal.segment_bytes);
                wal.active = Some(active);
            }
        }
        sync_dir(dir)?;
        Ok((wal, records))
    }

    /// Reads one segment, checking every record; returns the length of its
    /// valid prefix (cutting a torn tail of the last segment).
    fn load_segment(
        &mut self,
        path: &Path,
        first: u64,
        last: bool,
        keep_from: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<u64, WalError> {
        let mut buf = Vec::new();
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(io_err("read", path))?;
        let header_only = buf.len() <= HEADER_LEN as usize;
        if last && header_only && buf.iter().all(|&b| b == 0) && !buf.is_empty() {
            // Created by a crash before its header reached the disk (the
            // file was extended, its bytes not written): nothing in it was
            // ever acknowledged.
            warn!(file = %path.display(), "removing a log segment whose header was never written");
            fs::remove_file(path).map_err(io_err("remove", path))?;
            return self.recreate_header(path, first);
        }
        if buf.len() < HEADER_LEN as usize {
            if last && SEGMENT_MAGIC.starts_with(&buf[..buf.len().min(8)]) {
                // Cut while its header was written: nothing in it was ever
                // acknowledged.
                warn!(file = %path.display(), "removing a log segment cut short while it was created");
                fs::remove_file(path).map_err(io_err("remove", path))?;
                return self.recreate_header(path, first);
            }
            return Err(corrupt(path, 0, "segment header is cut short"));
        }
        if &buf[..8] != SEGMENT_MAGIC {
            return Err(corrupt(path, 0, "not an Idem log segment"));
        }
        let version = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if version != WAL_VERSION {
            return Err(WalError::Version {
                path: path.to_owned(),
                found: version,
            });
        }
        let mut f = [0u8; 8];
        f.copy_from_slice(&buf[12..20]);
        if u64::from_le_bytes(f) != first {
            return Err(corrupt(path, 12, "header does not match the file name"));
        }
        let segment = self.segments.len();
        let mut at = HEADER_LEN as usize;
        let mut expect = first;
        while at < buf.len() {
            match parse_record(&buf, at) {
                Some((index, payload, len)) => {
                    if index != expect {
                        return Err(corrupt(
                            path,
                            at as u64,
                            format!("record index {index} where {expect} was expected"),
                        ));
                    }
                    if self.slots.is_empty() {
                        self.first = index;
                        self.base = index;
                    }
                    self.slots.push(Slot {
                        segment,
                        offset: at as u64,
                    });
                    if index >= keep_from {
                        out.push((index, payload.to_vec()));
                    }
                    expect += 1;
                    at += len;
                }
                None if last && buf[at..].iter().all(|&b| b == 0) => {
                    // The room zeroed ahead of the records: the end of the
                    // log. (An earlier segment was cut to its records, and
                    // synced, before the next one was created: zeros there
                    // are damage.)
                    break;
                }
                None => {
                    // Valid records after it mean damage, not a torn
                    // write; only indexes that could follow count.
                    let later = (at + 1..buf.len()).any(|p| {
                        parse_record(&buf, p)
                            .is_some_and(|(i, _, _)| i >= expect && i - expect < 1 << 20)
                    });
                    if !last || later {
                        return Err(corrupt(
                            path,
                            at as u64,
                            "damaged record with valid records after it",
                        ));
                    }
                    warn!(
                        file = %path.display(),
                        offset = at,
                        bytes = buf.len() - at,
                        "cutting off a torn write at the end of the log"
                    );
                    let f = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(io_err("open", path))?;
                    f.set_len(at as u64).map_err(io_err("truncate", path))?;
                    f.sync_all().map_err(io_err("sync", path))?;
                    return Ok(at as u64);
                }
            }
        }
        Ok(at as u64)
    }

    fn recreate_header(&mut self, path: &Path, first: u64) -> Result<u64, WalError> {
        write_header(path, first)?;
        sync_dir(&self.dir)?;
        Ok(HEADER_LEN)
    }

    /// Writes the deliberately broken mode's held-back batches to the
    /// segment they were appended to (before it is cut or left).
    fn flush_deferred(&mut self) {
        #[cfg(debug_assertions)]
        if let Some(active) = &self.active
            && !self.deferred.is_empty()
        {
            let held = std::mem::take(&mut self.deferred);
            self.deferred_batches = 0;
            if let Err(e) = active.file.write_all_at(&held, self.deferred_at) {
                warn!(error = %e, "cannot write the held-back batches (test mode)");
            }
        }
    }

    /// Forgets the deliberately broken mode's held-back batches (the files
    /// they belong to are removed).
    fn drop_deferred(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.deferred.clear();
            self.deferred_batches = 0;
        }
    }

    /// The first index held (meaningful when not empty).
    pub fn first_index(&self) -> u64 {
        self.first
    }

    /// The index after the last record.
    pub fn next_index(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Whether the log holds no record: no slot, and none forgotten (the
    /// records before `base` are still in the files).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.base == self.first
    }

    /// Appends records (whose indexes must continue the log) and syncs them
    /// with one `fdatasync` before returning.
    pub fn append<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<(), WalError> {
        let mut buf = Vec::new();
        let mut pending: Vec<u64> = Vec::new();
        for (index, payload) in records {
            let expected = self.next_index() + pending.len() as u64;
            if !(self.is_empty() && pending.is_empty()) && index != expected {
                return Err(corrupt(
                    &self.dir,
                    0,
                    format!("append of index {index} where {expected} was expected"),
                ));
            }
            if self.is_empty() && pending.is_empty() {
                self.first = index;
                self.base = index;
            }
            if self.active.is_none()
                || self
                    .active
                    .as_ref()
                    .is_some_and(|a| a.len + buf.len() as u64 >= self.segment_bytes)
            {
                self.write_out(&buf, &pending)?;
                buf.clear();
                pending.clear();
                self.start_segment(index)?;
            }
            if payload.len() + 8 > MAX_RECORD as usize {
                return Err(corrupt(
                    &self.dir,
                    0,
                    format!(
                        "a record of {} bytes is over the largest accepted",
                        payload.len()
                    ),
                ));
            }
            let len = (payload.len() + 8) as u32;
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&crc(index, payload).to_le_bytes());
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(payload);
            pending.push(buf.len() as u64);
        }
        self.write_out(&buf, &pending)
    }

    /// Writes `buf` (records ending at the offsets in `ends`) to the
    /// active segment and syncs it.
    fn write_out(&mut self, buf: &[u8], ends: &[u64]) -> Result<(), WalError> {
        if buf.is_empty() {
            return Ok(());
        }
        let segment = self.segments.len() - 1;
        let path = self.segments[segment].path.clone();
        let Some(active) = self.active.as_mut() else {
            return Err(corrupt(&path, 0, "no active segment"));
        };
        let base = active.len;
        let end = base + buf.len() as u64;
        // Room zeroed ahead: this batch's sync commits the file's new
        // length (with the zeros), the next batches' syncs have none to.
        let zeroed = if end > active.zeroed {
            let to = end + ZERO_AHEAD.min(self.segment_bytes.saturating_sub(end));
            // The batch itself covers up to `end`.
            let zeroed = zero(&active.file, end, to);
            if zeroed.is_ok() {
                active.zeroed = to;
            }
            zeroed
        } else {
            Ok(())
        };
        let file = &active.file;
        #[cfg(debug_assertions)]
        let written = if faults::defer_writes() {
            // Deliberately broken (debug builds, for the crash tests' own
            // test): batches are acknowledged while they are only in
            // memory; they reach the file eight at a time.
            if self.deferred.is_empty() {
                self.deferred_at = base;
            }
            self.deferred.extend_from_slice(buf);
            self.deferred_batches += 1;
            if self.deferred_batches >= 8 {
                self.deferred_batches = 0;
                let held = std::mem::take(&mut self.deferred);
                zeroed.and_then(|()| file.write_all_at(&held, self.deferred_at))
            } else {
                zeroed
            }
        } else {
            zeroed.and_then(|()| file.write_all_at(buf, base))
        };
        #[cfg(not(debug_assertions))]
        let written = zeroed.and_then(|()| file.write_all_at(buf, base));
        let started = std::time::Instant::now();
        #[cfg(debug_assertions)]
        faults::slow_sync();
        if let Err(e) = written.and_then(|()| file.sync_data()) {
            // Whatever of the batch reached the file must not be read back
            // after a restart as if it were durable: cut it (best effort).
            let _ = file.set_len(base).and_then(|()| file.sync_all());
            active.zeroed = base;
            return Err(io_err("write or sync", &path)(e));
        }
        self.last_sync_us = started.elapsed().as_micros() as u64;
        self.sync_us.0.lock().saturating_record(self.last_sync_us);
        self.syncs += 1;
        active.len = end;
        let mut start = 0;
        for &end in ends {
            self.slots.push(Slot {
                segment,
                offset: base + start,
            });
            start = end;
        }
        Ok(())
    }

    /// Starts a new segment whose first record is `first`; its directory
    /// entry is synced before anything in it is written.
    fn start_segment(&mut self, first: u64) -> Result<(), WalError> {
        self.flush_deferred();
        // The segment written so far is cut to its records: only the last
        // segment has room zeroed after them.
        if let (Some(active), Some(seg)) = (self.active.take(), self.segments.last())
            && active.zeroed > active.len
        {
            active
                .file
                .set_len(active.len)
                .and_then(|()| active.file.sync_all())
                .map_err(io_err("cut", &seg.path))?;
        }
        let path = self.dir.join(segment_name(first));
        write_header(&path, first)?;
        sync_dir(&self.dir)?;
        let active = Active::open(&path, HEADER_LEN)?;
        preallocate(&active.file, &path, self.segment_bytes);
        self.segments.push(Segment { first, path });
        self.active = Some(active);
        Ok(())
    }

    /// Removes every record from `index` on (a conflicting suffix).
    pub fn truncate_from(&mut self, index: u64) -> Result<(), WalError> {
        self.flush_deferred();
        if index >= self.next_index() {
            return Ok(());
        }
        let keep = index.saturating_sub(self.base) as usize;
        // Below the slots kept (records a purge covers are never cut):
        // nothing to cut that the log still tracks.
        let Some(&cut) = self.slots.get(keep) else {
            return Ok(());
        };
        // Whole segments after the cut go.
        while self.segments.len() > cut.segment + 1 {
            if let Some(seg) = self.segments.pop() {
                fs::remove_file(&seg.path).map_err(io_err("remove", &seg.path))?;
            }
        }
        let seg = &self.segments[cut.segment];
        let path = seg.path.clone();
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        f.set_len(cut.offset).map_err(io_err("truncate", &path))?;
        f.sync_all().map_err(io_err("sync", &path))?;
        sync_dir(&self.dir)?;
        self.slots.truncate(keep);
        self.active = Some(Active::open(&path, cut.offset)?);
        Ok(())
    }

    /// Removes segments that hold only records up to `index` (inclusive),
    /// and forgets where the records up to it start in the segment left
    /// (they are never read or cut again). Returns how many records were
    /// removed with their segments.
    pub fn purge_upto(&mut self, index: u64) -> Result<u64, WalError> {
        let mut dropped = 0u64;
        while self.segments.len() > 1 {
            let next_first = self.segments[1].first;
            if next_first > index + 1 {
                break;
            }
            let seg = self.segments.remove(0);
            fs::remove_file(&seg.path).map_err(io_err("remove", &seg.path))?;
            let n = next_first.saturating_sub(self.base) as usize;
            self.slots.drain(..n.min(self.slots.len()));
            for s in &mut self.slots {
                s.segment -= 1;
            }
            dropped += next_first - self.first;
            self.first = next_first;
            self.base = self.base.max(next_first);
        }
        if dropped > 0 {
            sync_dir(&self.dir)?;
        }
        // Within the segment left too, all but the last record's slot (an
        // empty log would take its next record at any index; a log purged
        // whole starts afresh with its next append, see `reset`): a quiet
        // server kept 16 bytes for each record of the segment being
        // written, 5-13 MB with 64 MiB segments, until the segment was full.
        let covered = ((index + 1).saturating_sub(self.base) as usize)
            .min(self.slots.len().saturating_sub(1));
        let forgot = covered > 0;
        if forgot {
            self.slots.drain(..covered);
            self.base += covered as u64;
        }
        if dropped > 0 || forgot {
            // A burst's slots are not kept once their records are gone.
            self.slots.shrink_to(self.slots.len().max(64) * 2);
        }
        Ok(dropped)
    }

    /// The `fdatasync` times, shared: reading them does not stop the
    /// writer for longer than one copy of the counters.
    pub fn sync_times(&self) -> SyncTimes {
        self.sync_us.clone()
    }

    /// Removes every segment: the next append starts the log afresh at its
    /// index (after everything was purged and the log moves on past it).
    pub fn reset(&mut self) -> Result<(), WalError> {
        self.drop_deferred();
        self.active = None;
        for seg in self.segments.drain(..) {
            fs::remove_file(&seg.path).map_err(io_err("remove", &seg.path))?;
        }
        self.slots.clear();
        self.base = self.first;
        sync_dir(&self.dir)
    }

    /// Names of the segment files, oldest first.
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|s| s.path.clone()).collect()
    }
}

/// Writes zeros over `from..to` of `f`.
fn zero(f: &File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        f.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Reserves the disk blocks of a whole segment ahead of its writes (the
/// file's length stays that of what was written, so reading and recovery
/// are unchanged): a segment's appends do not run out of space half way,
/// and the free-space guard sees the space as taken. A filesystem that
/// cannot preallocate, or has no room left, is logged; the writes then
/// find out for themselves.
fn preallocate(f: &File, path: &Path, bytes: u64) {
    use rustix::fs::{FallocateFlags, fallocate};
    match fallocate(f, FallocateFlags::KEEP_SIZE, 0, bytes) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::OPNOTSUPP => {}
        Err(e) => {
            warn!(file = %path.display(), bytes, error = %e, "cannot preallocate a log segment")
        }
    }
}

/// A deliberately broken log, for showing that the crash tests catch one:
/// debug builds only, and only when `IDEMD_UNSAFE_TEST_ACK_BEFORE_WRITE=1`.
#[cfg(debug_assertions)]
mod faults {
    use std::sync::OnceLock;

    /// Acknowledge batches before they are written (they are written eight
    /// at a time): a crash loses acknowledged writes.
    pub(super) fn defer_writes() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| {
            let on = std::env::var("IDEMD_UNSAFE_TEST_ACK_BEFORE_WRITE").is_ok_and(|v| v == "1");
            if on {
                tracing::error!(
                    "IDEMD_UNSAFE_TEST_ACK_BEFORE_WRITE=1: writes are acknowledged before they are written (test mode)"
                );
            }
            on
        })
    }

    /// A disk that stalls: with `IDEMD_UNSAFE_TEST_SLOW_SYNC_FILE` naming a
    /// file, each log sync first sleeps the milliseconds that file holds
    /// (none while it is missing or empty). Read at every sync, so a test
    /// can slow one node's disk once it knows which node leads.
    pub(super) fn slow_sync() {
        static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
        let Some(path) = FILE.get_or_init(|| {
            let path = std::env::var_os("IDEMD_UNSAFE_TEST_SLOW_SYNC_FILE")?;
            tracing::error!(
                file = ?path,
                "IDEMD_UNSAFE_TEST_SLOW_SYNC_FILE is set: log syncs are slowed by the milliseconds in that file (test mode)"
            );
            Some(path.into())
        }) else {
            return;
        };
        let ms = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

/// `fdatasync` times in µs (1 µs to 100 s, 2 significant digits), recorded
/// by the log's writer and read by INFO. Percentiles are computed on
/// reading (a walk over the buckets), not after every sync.
#[derive(Clone, Debug)]
pub struct SyncTimes(Arc<Mutex<hdrhistogram::Histogram<u64>>>);

impl Default for SyncTimes {
    fn default() -> Self {
        SyncTimes(Arc::new(Mutex::new(
            hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 2)
                .expect("constant histogram bounds are valid"),
        )))
    }
}

impl SyncTimes {
    /// Syncs recorded, and their 50th and 99th percentile times in µs.
    pub fn summary(&self) -> (u64, u64, u64) {
        let h = self.0.lock();
        (h.len(), h.value_at_quantile(0.5), h.value_at_quantile(0.99))
    }

    /// The syncs' total time, µs (from the histogram's buckets: within
    /// their 1% precision).
    pub fn total_us(&self) -> u64 {
        let h = self.0.lock();
        (h.mean() * h.len() as f64) as u64
    }
}

fn write_header(path: &Path, first: u64) -> Result<(), WalError> {
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(io_err("create", path))?;
    let mut h = Vec::with_capacity(HEADER_LEN as usize);
    h.extend_from_slice(SEGMENT_MAGIC);
    h.extend_from_slice(&WAL_VERSION.to_le_bytes());
    h.extend_from_slice(&first.to_le_bytes());
    f.write_all(&h).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("sync", path))
}

/// Writes `payload` as the metadata file of `dir`, atomically.
pub fn write_meta(dir: &Path, payload: &[u8]) -> Result<(), WalError> {
    let mut out = Vec::with_capacity(20 + payload.len());
    out.extend_from_slice(META_MAGIC);
    out.extend_from_slice(&WAL_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    replace_file(dir, "meta", &out)
}

/// Replaces `dir/name` with `bytes` atomically: written to `name.tmp`,
/// synced, renamed over it, and the directory synced.
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), WalError> {
    replace_file_with(dir, name, |f| f.write_all(bytes))
}

/// [`replace_file`] with the contents `write` writes.
fn replace_file_with(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), WalError> {
    let tmp = dir.join(format!("{name}.tmp"));
    write_synced(&tmp, write)?;
    rename_synced(&tmp, dir, name)
}

/// Creates (or truncates) `path` with the contents `write` writes, and
/// syncs it: the first half of replacing a file atomically.
pub fn write_synced(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), WalError> {
    let mut f = File::create(path).map_err(io_err("create", path))?;
    write(&mut f).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("sync", path))
}

/// Renames the synced file `from` over `dir/name` and syncs the
/// directory: the second half.
pub fn rename_synced(from: &Path, dir: &Path, name: &str) -> Result<(), WalError> {
    fs::rename(from, dir.join(name)).map_err(io_err("rename", from))?;
    sync_dir(dir)
}

/// Reads the metadata file of `dir`, if there is one.
pub fn read_meta(dir: &Path) -> Result<Option<Vec<u8>>, WalError> {
    let path = dir.join("meta");
    let mut buf = Vec::new();
    match File::open(&path) {
        Ok(mut f) => {
            f.seek(SeekFrom::Start(0)).map_err(io_err("read", &path))?;
            f.read_to_end(&mut buf).map_err(io_err("read", &path))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open", &path)(e)),
    }
    if buf.len() < 20 || &buf[..8] != META_MAGIC {
        return Err(corrupt(&path, 0, "not an Idem metadata file"));
    }
    let version = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    if version != WAL_VERSION {
        return Err(WalError::Version {
            path,
            found: version,
        });
    }
    let len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
    let sum = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
    let payload = buf
        .get(20..20 + len)
        .ok_or_else(|| corrupt(&path, 20, "cut short"))?;
    if crc32fast::hash(payload) != sum {
        return Err(corrupt(&path, 16, "checksum mismatch"));
    }
    Ok(Some(payload.to_vec()))
}

#[cfg(test)]
mod tests;
