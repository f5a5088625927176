//! Canonical snapshots: the replicated state written in key order, so two
//! replicas that applied the same entries write the same bytes whatever
//! their hash seed, shard count or allocation history.
//!
//! # Format (version 1, integers little-endian)
//!
//! ```text
//! "IDEMSNAP" u32:version
//! u64:clock u64:next_fence u64:applied_index u64:max_memory_bytes u64:headroom_bytes
//! u64:record_count
//! record_count × (in ascending key order)
//!   u32:key_len key u8:state u8:on_expire u8:recovered u64:fence u64:deadline
//!   u32:retain_ms u8:has_fp [u32:fp_len fp] u8:has_attempt [u8:attempt_len attempt]
//!   u32:body_len body
//! u32:crc32 (of every byte before it)
//! ```
//!
//! `state`: 0 in flight, 1 abandoned, 2 completed OK, 3 completed ERR.
//! `on_expire`: 0 FREE, 1 RECOVER. Node-local counters and cursors are not
//! part of a snapshot.

use std::io::Read;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use idem_protocol::{OnExpire, Outcome};

use super::record::{LARGE_BODY, Parts, Record, State, restored_flags};
use super::shard::{Shard, SlabCopy, state_index};
use super::{Store, StoreConfig, table_hash};

const MAGIC: &[u8; 8] = b"IDEMSNAP";
/// The snapshot format this build writes and reads.
pub const SNAPSHOT_VERSION: u32 = 1;

/// A snapshot that cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Not an Idem snapshot.
    #[error("not an Idem snapshot (bad magic)")]
    BadMagic,
    /// Written by a newer or unknown format.
    #[error("snapshot format version {found} is not supported (this build reads {supported})")]
    Version {
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The checksum does not match: the snapshot is damaged.
    #[error("snapshot checksum mismatch: the snapshot is damaged")]
    Checksum,
    /// The snapshot ends early or holds an impossible value.
    #[error("snapshot is malformed: {0}")]
    Malformed(&'static str),
    /// The snapshot could not be read.
    #[error("cannot read the snapshot: {0}")]
    Io(String),
}

/// One record, as a snapshot holds it.
struct Rec<'a> {
    key: &'a [u8],
    state: State,
    on_expire: OnExpire,
    recovered: bool,
    fence: u64,
    deadline: u64,
    retain_ms: u32,
    fingerprint: Option<&'a [u8]>,
    attempt: Option<&'a [u8]>,
    body: &'a [u8],
}

fn state_byte(s: State) -> u8 {
    match s {
        State::InFlight => 0,
        State::Abandoned => 1,
        State::Completed(Outcome::Ok) => 2,
        State::Completed(Outcome::Err) => 3,
    }
}

fn put_record(out: &mut Vec<u8>, r: &Rec<'_>) {
    out.extend_from_slice(&(r.key.len() as u32).to_le_bytes());
    out.extend_from_slice(r.key);
    out.push(state_byte(r.state));
    out.push(u8::from(r.on_expire == OnExpire::Recover));
    out.push(u8::from(r.recovered));
    out.extend_from_slice(&r.fence.to_le_bytes());
    out.extend_from_slice(&r.deadline.to_le_bytes());
    out.extend_from_slice(&r.retain_ms.to_le_bytes());
    match r.fingerprint {
        Some(fp) => {
            out.push(1);
            out.extend_from_slice(&(fp.len() as u32).to_le_bytes());
            out.extend_from_slice(fp);
        }
        None => out.push(0),
    }
    match r.attempt {
        Some(a) => {
            out.push(1);
            out.push(a.len() as u8);
            out.extend_from_slice(a);
        }
        None => out.push(0),
    }
    out.extend_from_slice(&(r.body.len() as u32).to_le_bytes());
    out.extend_from_slice(r.body);
}

/// A copy of the store's replicated state taken at one point
/// ([`Store::snapshot_copy`]).
pub struct SnapshotCopy {
    header: [u64; 6],
    shards: Vec<SlabCopy>,
}

impl SnapshotCopy {
    /// Number of records copied.
    pub fn len(&self) -> usize {
        self.header[5] as usize
    }

    /// Whether no record was copied.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The snapshot, in the canonical format above.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_to(&mut out)
            .expect("writing to a Vec does not fail");
        out
    }

    /// The snapshot, in the canonical format above, written to `out` a
    /// part of about [`ENCODE_PART`] bytes at a time (a snapshot as large as
    /// the store is never held whole in memory); its length.
    ///
    /// # Errors
    ///
    /// What `out` returns.
    pub fn encode_to(&self, out: &mut impl std::io::Write) -> std::io::Result<u64> {
        let order = self.key_order();
        let mut part = Vec::with_capacity(ENCODE_PART + 64);
        let mut crc = crc32fast::Hasher::new();
        let mut len = 0u64;
        let mut flush = |part: &mut Vec<u8>| -> std::io::Result<()> {
            crc.update(part);
            out.write_all(part)?;
            len += part.len() as u64;
            part.clear();
            Ok(())
        };
        part.extend_from_slice(MAGIC);
        part.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        for v in self.header {
            part.extend_from_slice(&v.to_le_bytes());
        }
        // The few large bodies, by their records.
        let large_bodies: std::collections::HashMap<*const Record, &Bytes> = self
            .shards
            .iter()
            .flat_map(|shard| {
                shard
                    .large_bodies()
                    .filter_map(|(id, body)| Some((shard.get(id)? as *const Record, body)))
            })
            .collect();
        for i in 0..order.len() {
            ahead(&order, i);
            let rec = order[i].1;
            let p = rec.parts();
            let large = match rec.is_large() {
                true => large_bodies.get(&(rec as *const Record)).copied(),
                false => None,
            };
            let body = match large {
                Some(b) => &b[..],
                None => rec.inline_body(),
            };
            if part.len() >= ENCODE_PART {
                flush(&mut part)?;
            }
            put_record(
                &mut part,
                &Rec {
                    key: p.key,
                    state: rec.state(),
                    on_expire: rec.on_expire(),
                    recovered: rec.recovered(),
                    fence: rec.fence,
                    deadline: rec.deadline,
                    retain_ms: rec.retain_ms(),
                    fingerprint: p.fingerprint,
                    attempt: p.attempt,
                    body,
                },
            );
        }
        flush(&mut part)?;
        let sum = crc.finalize().to_le_bytes();
        out.write_all(&sum)?;
        Ok(len + sum.len() as u64)
    }

    /// Every record, in key order (the first field is scratch).
    ///
    /// Sorting references by their keys read both keys from their records
    /// at every comparison, and keys that share a long prefix (a service's
    /// own, a zero-padded counter) were compared byte by byte over it each
    /// time: most of a snapshot's time. This sorts by 8 bytes of the keys
    /// at a time instead, a radix sort from the most significant bytes:
    /// all records by the 8 bytes after the prefix every key shares (as a
    /// big-endian number, zero-padded), then each group equal there by the
    /// 8 bytes after the prefix its own keys share, and so on; a group
    /// whose keys all end within the bytes compared differs only in
    /// trailing zero bytes, and goes shortest first. Zero padding never
    /// puts a key after a longer one it starts, so the order is the keys'.
    /// Each entry takes 16 bytes, as the references and slots did.
    fn key_order(&self) -> Vec<(u64, &Record)> {
        let mut order: Vec<(u64, &Record)> = self
            .shards
            .iter()
            .flat_map(|shard| shard.records().map(|(_, r)| (0, r)))
            .collect();
        fn key<'a>(e: &(u64, &'a Record)) -> &'a [u8] {
            e.1.key()
        }
        // Groups still to sort: their range, and how many bytes every key
        // in them is known to share (zero-padded).
        let mut groups = vec![(0, order.len(), 0)];
        while let Some((lo, hi, depth)) = groups.pop() {
            let group = &mut order[lo..hi];
            let Some(first) = group.first().map(key) else {
                continue;
            };
            // How far past `depth` the keys go on alike, as a few of them
            // spread over the group go on like the first; then one pass
            // takes every key's 8 bytes from there, and checks it does
            // start like the first that far (if one does not, a second
            // pass takes them from `depth`). A scan of every key for the
            // bytes they share made each read wait for the one before.
            let mut at = first.len().max(depth);
            let step = (group.len() / SAMPLES).max(1);
            for e in group.iter().step_by(step).take(SAMPLES) {
                at = depth
                    + common_prefix(
                        first.get(depth..at).unwrap_or_default(),
                        key(e).get(depth..).unwrap_or_default(),
                    );
            }
            // Takes each key's window at `at`; whether every key starts
            // like the first up to it.
            let windows = |group: &mut [(u64, &Record)], at: usize| {
                let claimed = first.get(depth..at).unwrap_or_default();
                let mut alike = true;
                for i in 0..group.len() {
                    ahead(group, i);
                    let k = key(&group[i]);
                    group[i].0 = window(k, at);
                    alike &= at == depth || k.get(depth..at) == Some(claimed);
                }
                alike
            };
            if !windows(group, at) {
                at = depth;
                windows(group, at);
            }
            group.sort_unstable_by_key(|e| e.0);
            let mut i = 0;
            while i < group.len() {
                let run = group[i..].iter().take_while(|e| e.0 == group[i].0).count();
                let equal = &mut group[i..i + run];
                if run > 1 {
                    if equal.iter().all(|e| key(e).len() <= at + 8) {
                        equal.sort_unstable_by_key(|e| key(e).len());
                    } else {
                        groups.push((lo + i, lo + i + run, at + 8));
                    }
                }
                i += run;
            }
        }
        order
    }
}

/// How many records ahead of the one read [`ahead`] asks for: the record's
/// slot this far ahead, and its bytes half as far (their address is in the
/// slot).
const AHEAD: usize = 16;

/// Asks the CPU for what the loop reading `order[i]` will read soon (see
/// [`AHEAD`]): records taken in key order are spread over the whole store.
#[inline(always)]
fn ahead(order: &[(u64, &Record)], i: usize) {
    if let Some(e) = order.get(i + AHEAD) {
        super::record::prefetch(e.1);
    }
    if let Some(e) = order.get(i + AHEAD / 2) {
        e.1.prefetch_data();
    }
}

/// How many keys of a group [`SnapshotCopy::key_order`] reads first to
/// guess how far they all go on alike.
const SAMPLES: usize = 16;

/// How many bytes `a` and `b` start with alike.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The (at most) 8 bytes of `key` from `skip` on, zero-padded, as a
/// big-endian number: keys that start alike up to `skip` compare as their
/// windows do, unless their windows are equal.
fn window(key: &[u8], skip: usize) -> u64 {
    let tail = key.get(skip..).unwrap_or_default();
    let n = tail.len().min(8);
    let mut w = [0u8; 8];
    w[..n].copy_from_slice(&tail[..n]);
    u64::from_be_bytes(w)
}

/// About how many bytes [`SnapshotCopy::encode_to`] writes at a time (a
/// large body goes in the same part as its record).
const ENCODE_PART: usize = 1 << 20;

impl Store {
    /// The replicated state, in the canonical format above.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_copy().encode()
    }

    /// A point-in-time copy of the replicated state, to be encoded later
    /// ([`SnapshotCopy::encode`]). Every shard's lock is held while the
    /// copy is taken (so it is consistent): the slabs' chunks are shared
    /// (copy-on-write) and each shard's map of large bodies is cloned (a
    /// reference count per large body); the records are not copied, and not
    /// sorted, encoded or checksummed under the locks.
    pub fn snapshot_copy(&self) -> SnapshotCopy {
        let guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let shards: Vec<SlabCopy> = guards.iter().map(|sh| sh.slab.copy()).collect();
        let count: usize = shards.iter().map(SlabCopy::len).sum();
        let limits = self.limits();
        let header = [
            self.clock.load(Ordering::Acquire),
            self.next_fence.load(Ordering::Acquire),
            self.seq.load(Ordering::Acquire),
            limits.max_memory_bytes,
            limits.headroom_bytes,
            count as u64,
        ];
        drop(guards);
        SnapshotCopy { header, shards }
    }

    /// A store holding the state of `snapshot`, laid out by `cfg`.
    ///
    /// # Errors
    ///
    /// [`SnapshotError`] if the bytes are not a snapshot this build reads,
    /// are damaged, or hold an impossible record.
    pub fn restore(cfg: StoreConfig, snapshot: &[u8]) -> Result<Store, SnapshotError> {
        let store = Store::new(cfg);
        store.load_snapshot(snapshot)?;
        Ok(store)
    }

    /// Replaces everything this store holds with the state of `snapshot`
    /// (checked in full first: on error the store is unchanged).
    ///
    /// # Errors
    ///
    /// As [`Store::restore`].
    pub fn load_snapshot(&self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        self.load_snapshot_from(|| Ok(snapshot), snapshot.len() as u64)
    }

    /// [`load_snapshot`](Self::load_snapshot) from the `len` bytes that
    /// `open` reads (a file, say), read twice: once to check all of it,
    /// then to load it. Neither the snapshot nor its records are held
    /// whole in memory meanwhile: only one record at a time.
    ///
    /// # Errors
    ///
    /// As [`Store::restore`], and [`SnapshotError::Io`] if a read fails.
    /// An error in the first read leaves the store unchanged; one in the
    /// second (the bytes changed, or could not be read again) leaves it
    /// empty, which its caller must treat as fatal. While it loads, the
    /// store reads as empty (its memory counts what is loaded so far).
    pub fn load_snapshot_from<R: Read>(
        &self,
        mut open: impl FnMut() -> std::io::Result<R>,
        len: u64,
    ) -> Result<(), SnapshotError> {
        let io = |e: std::io::Error| SnapshotError::Io(e.to_string());
        // Every record checked first, none kept.
        check_snapshot_from(open().map_err(io)?, len)?;
        // Then read again, as checked, into shards of its own with no lock
        // held: millions of records take seconds to load, and whatever
        // looks at the store meanwhile (INFO, a client, a node's check
        // for quiet on its one runtime thread) must not wait that long;
        // it sees an empty store until the loaded shards take its place,
        // all at once. What the store held is dropped first, so that the
        // two are never in memory together.
        let mut r = Stream::new(open().map_err(io)?, len)?;
        let header = r.header()?;
        let held: Vec<Shard> = {
            let mut guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
            self.memory.store(0, Ordering::Release);
            guards
                .iter_mut()
                .map(|g| std::mem::take(&mut **g))
                .collect()
        };
        drop(held);
        let mut loaded: Vec<Shard> = (0..self.shards.len()).map(|_| Shard::default()).collect();
        for _ in 0..header.count {
            let rec = r.record()?;
            let hash = self.hash(rec.key);
            let sh = &mut loaded[self.shard_index(hash)];
            self.insert_restored(sh, hash, &rec);
        }
        let mut guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        for (g, sh) in guards.iter_mut().zip(loaded) {
            **g = sh;
        }
        self.clock.store(header.clock, Ordering::Release);
        self.next_fence.store(header.next_fence, Ordering::Release);
        self.seq.store(header.seq, Ordering::Release);
        self.max_memory.store(header.max_memory, Ordering::Release);
        self.headroom.store(header.headroom, Ordering::Release);
        Ok(())
    }

    fn insert_restored(&self, sh: &mut Shard, hash: u64, r: &Rec<'_>) {
        let large = r.body.len() > LARGE_BODY;
        let parts = Parts {
            key: r.key,
            fingerprint: r.fingerprint,
            attempt: r.attempt,
        };
        let mut rec = Record::new(
            parts,
            r.state,
            r.retain_ms,
            if large { &[] } else { r.body },
            restored_flags(r.on_expire, r.recovered, large),
        );
        rec.fence = r.fence;
        rec.deadline = r.deadline;
        let id = sh.slab.insert(rec);
        if large {
            sh.slab.set_large(id, Bytes::copy_from_slice(r.body));
        }
        let h32 = hash as u32;
        sh.index
            .insert_unique(table_hash(h32), (id, h32), |&(_, h)| table_hash(h));
        sh.aux.by_state[state_index(r.state)] += 1;
        self.charge(0, sh.slab.cost(id));
    }
}

/// A snapshot's header fields.
struct Header {
    clock: u64,
    next_fence: u64,
    seq: u64,
    max_memory: u64,
    headroom: u64,
    count: u64,
}

/// A snapshot read from a reader a record at a time, its checksum taken
/// as it goes.
struct Stream<R> {
    inner: R,
    /// Bytes not read yet.
    left: u64,
    crc: crc32fast::Hasher,
    /// The bytes of the record being read.
    buf: Vec<u8>,
}

impl<R: Read> Stream<R> {
    fn new(inner: R, len: u64) -> Result<Stream<R>, SnapshotError> {
        Ok(Stream {
            inner,
            left: len,
            crc: crc32fast::Hasher::new(),
            buf: Vec::new(),
        })
    }

    /// Reads `n` more bytes onto `buf` (the checksum excluded: the last 4
    /// bytes are left for [`end`](Self::end)).
    fn fill(&mut self, n: usize) -> Result<(), SnapshotError> {
        if n as u64 > self.left.saturating_sub(4) {
            return Err(SnapshotError::Malformed("ends early"));
        }
        let at = self.buf.len();
        self.buf.resize(at + n, 0);
        self.inner
            .read_exact(&mut self.buf[at..])
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => SnapshotError::Malformed("ends early"),
                _ => SnapshotError::Io(e.to_string()),
            })?;
        self.crc.update(&self.buf[at..]);
        self.left -= n as u64;
        Ok(())
    }

    /// The last byte read, which must be 0 or 1.
    fn flag(&self) -> Result<bool, SnapshotError> {
        match self.buf.last() {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => Err(SnapshotError::Malformed("flag byte")),
        }
    }

    /// The little-endian integer in the last `N` bytes read.
    fn last<const N: usize>(&self) -> u64 {
        let mut a = [0u8; 8];
        a[..N].copy_from_slice(&self.buf[self.buf.len() - N..]);
        u64::from_le_bytes(a)
    }

    fn header(&mut self) -> Result<Header, SnapshotError> {
        // The magic first, whatever the length: anything else is not a
        // snapshot at all.
        let mut magic = [0u8; 8];
        let n = usize::try_from(self.left).map_or(8, |l| l.min(8));
        self.inner
            .read_exact(&mut magic[..n])
            .map_err(|e| SnapshotError::Io(e.to_string()))?;
        if &magic != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        self.crc.update(&magic);
        self.left -= 8;
        self.buf.clear();
        self.fill(4 + 48)?;
        let mut r = Reader { buf: &self.buf };
        let version = r.u32()?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version {
                found: version,
                supported: SNAPSHOT_VERSION,
            });
        }
        Ok(Header {
            clock: r.u64()?,
            next_fence: r.u64()?,
            seq: r.u64()?,
            max_memory: r.u64()?,
            headroom: r.u64()?,
            count: r.u64()?,
        })
    }

    /// The next record (in the format above), read whole.
    fn record(&mut self) -> Result<Rec<'_>, SnapshotError> {
        self.buf.clear();
        self.fill(4)?;
        let key_len = self.last::<4>() as usize;
        // The key, state, on_expire, recovered, fence, deadline, retain_ms
        // and the fingerprint's flag.
        self.fill(key_len + 3 + 8 + 8 + 4 + 1)?;
        if self.flag()? {
            self.fill(4)?;
            let n = self.last::<4>() as usize;
            self.fill(n)?;
        }
        self.fill(1)?;
        if self.flag()? {
            self.fill(1)?;
            let n = self.last::<1>() as usize;
            self.fill(n)?;
        }
        self.fill(4)?;
        let n = self.last::<4>() as usize;
        self.fill(n)?;
        let mut r = Reader { buf: &self.buf };
        let rec = r.record()?;
        debug_assert!(r.buf.is_empty());
        Ok(rec)
    }

    /// Checks the checksum: what is left of the snapshot is read through
    /// (its records unread); then, that nothing but the checksum was left.
    fn end(&mut self) -> Result<(), SnapshotError> {
        let trailing = self.left > 4;
        let mut chunk = vec![0u8; 64 << 10];
        while self.left > 4 {
            let n = usize::try_from(self.left - 4).map_or(chunk.len(), |l| l.min(chunk.len()));
            if self.inner.read_exact(&mut chunk[..n]).is_err() {
                // Cut short: it cannot match.
                return Err(SnapshotError::Checksum);
            }
            self.crc.update(&chunk[..n]);
            self.left -= n as u64;
        }
        let mut sum = [0u8; 4];
        self.inner
            .read_exact(&mut sum)
            .map_err(|e| SnapshotError::Io(e.to_string()))?;
        if self.crc.clone().finalize() != u32::from_le_bytes(sum) {
            return Err(SnapshotError::Checksum);
        }
        if trailing {
            return Err(SnapshotError::Malformed("bytes after the last record"));
        }
        Ok(())
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.buf.len() < n {
            return Err(SnapshotError::Malformed("ends early"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn flag(&mut self) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotError::Malformed("flag byte")),
        }
    }

    fn record(&mut self) -> Result<Rec<'a>, SnapshotError> {
        let key_len = self.u32()? as usize;
        let key = self.take(key_len)?;
        let state = match self.u8()? {
            0 => State::InFlight,
            1 => State::Abandoned,
            2 => State::Completed(Outcome::Ok),
            3 => State::Completed(Outcome::Err),
            _ => return Err(SnapshotError::Malformed("state byte")),
        };
        let on_expire = if self.flag()? {
            OnExpire::Recover
        } else {
            OnExpire::Free
        };
        let recovered = self.flag()?;
        let fence = self.u64()?;
        let deadline = self.u64()?;
        let retain_ms = self.u32()?;
        let fingerprint = if self.flag()? {
            let n = self.u32()? as usize;
            Some(self.take(n)?)
        } else {
            None
        };
        let attempt = if self.flag()? {
            let n = self.u8()? as usize;
            Some(self.take(n)?)
        } else {
            None
        };
        let body_len = self.u32()? as usize;
        let body = self.take(body_len)?;
        Ok(Rec {
            key,
            state,
            on_expire,
            recovered,
            fence,
            deadline,
            retain_ms,
            fingerprint,
            attempt,
            body,
        })
    }
}

/// Checks the snapshot `reader` holds (`len` bytes) as a load does before
/// it touches the store: its header, every record and the checksum.
///
/// # Errors
///
/// Why it would not load; [`SnapshotError::Checksum`] for a damaged one,
/// whatever else it looked like.
pub fn check_snapshot_from<R: Read>(reader: R, len: u64) -> Result<(), SnapshotError> {
    let mut r = Stream::new(reader, len)?;
    let header = r.header()?;
    let mut last: Vec<u8> = Vec::new();
    let mut records = || {
        for i in 0..header.count {
            let rec = r.record()?;
            if i > 0 && last.as_slice() >= rec.key {
                return Err(SnapshotError::Malformed("records out of key order"));
            }
            if rec.key.is_empty() || rec.key.len() > u16::MAX as usize {
                return Err(SnapshotError::Malformed("key length"));
            }
            if rec.fingerprint.is_some_and(|f| f.len() > u16::MAX as usize) {
                return Err(SnapshotError::Malformed("fingerprint length"));
            }
            last.clear();
            last.extend_from_slice(rec.key);
        }
        Ok(())
    };
    match records() {
        Ok(()) => r.end(),
        // A damaged snapshot is called so, whatever it looked like.
        Err(SnapshotError::Malformed(why)) => Err(match r.end() {
            Err(e @ (SnapshotError::Checksum | SnapshotError::Io(_))) => e,
            _ => SnapshotError::Malformed(why),
        }),
        Err(e) => Err(e),
    }
}
