//! A snapshot's bytes as openraft reads and writes them: in memory (one
//! being received, or just built), or a window of the snapshot file (one
//! sent to a follower), read a chunk at a time as openraft sends it.
//!
//! Sending from the file keeps the leader's state machine from reading
//! (or copying) the whole snapshot before the first chunk goes out: openraft
//! asks the state machine for the snapshot on the task that applies
//! entries, so that read held every apply back.

use std::future::Future;
use std::io::{self, Cursor, SeekFrom};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWrite, ReadBuf, Take};

/// A snapshot's bytes.
#[derive(Debug)]
pub enum SnapshotData {
    /// Held in memory.
    Mem(Cursor<Vec<u8>>),
    /// Bytes `base .. base + len` of a file, read on demand.
    File(FileWindow),
    /// Being received from the leader, into a file of its own (a snapshot
    /// as large as the store is not held in memory beside it).
    Incoming(Incoming),
}

/// A file a snapshot is received into, removed with it unless it is
/// taken ([`Incoming::into_path`]): a reception given up (another leader
/// sends another snapshot) leaves no file behind.
#[derive(Debug)]
pub struct Incoming {
    file: tokio::fs::File,
    path: std::path::PathBuf,
    taken: bool,
    /// The check of what was received, under way ([`Incoming::poll_check`]).
    check: Option<tokio::task::JoinHandle<Result<(), String>>>,
    /// What was received loads.
    checked: bool,
}

impl Incoming {
    /// Where the snapshot is, now the caller's to remove.
    pub fn into_path(mut self) -> std::path::PathBuf {
        self.taken = true;
        std::mem::take(&mut self.path)
    }
}

impl Incoming {
    /// Checks what was received as a load will, off the runtime thread (a
    /// large snapshot takes seconds to read): its header, every record and
    /// its checksum. A snapshot that would not load is refused here, where
    /// the reception ends, and its sender is answered with the error;
    /// handed to openraft, its failed install would stop this node (a
    /// failed install is a storage failure to openraft).
    fn poll_check(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.checked {
            return Poll::Ready(Ok(()));
        }
        let path = self.path.clone();
        let check = self.check.get_or_insert_with(|| {
            tokio::task::spawn_blocking(move || {
                let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
                let len = file.metadata().map_err(|e| e.to_string())?.len();
                crate::store::check_snapshot_from(
                    std::io::BufReader::with_capacity(super::state_machine::READ_PART, file),
                    len,
                )
                .map_err(|e| e.to_string())
            })
        });
        let checked = ready!(Pin::new(check).poll(cx));
        self.check = None;
        match checked {
            Ok(Ok(())) => {
                self.checked = true;
                Poll::Ready(Ok(()))
            }
            Ok(Err(why)) => Poll::Ready(Err(io::Error::other(format!(
                "the snapshot received would not load: {why}"
            )))),
            Err(e) => Poll::Ready(Err(io::Error::other(e))),
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.taken {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A read-only window of a file.
#[derive(Debug)]
pub struct FileWindow {
    /// The file, limited to what is left of the window from where it is
    /// (the file goes on past the window: its checksum).
    file: Take<tokio::fs::File>,
    base: u64,
    len: u64,
    check: Check,
}

/// The file's checksum, checked as the window is read through: the
/// window's bytes are hashed as they are read in order, and the read that
/// reaches its end fails if the file's checksum does not match, so a file
/// damaged on disk after it was written is never sent whole. A part read
/// again (openraft seeks back to the start of a chunk to send it again)
/// is hashed again from where it starts, so what is checked is what was
/// last read.
pub struct Check {
    /// Every byte of the file before the window, then the window's bytes
    /// `0 .. upto`, hashed.
    hasher: crc32fast::Hasher,
    /// How far the window's bytes are hashed.
    upto: u64,
    /// The hash as it was at the latest places a seek went to (the
    /// start of a chunk), so that reading from there again hashes again.
    marks: Vec<(u64, crc32fast::Hasher)>,
    /// The checksum the file holds.
    want: u32,
    /// The file, for the error.
    what: String,
    /// Found damaged: every later read fails too.
    damaged: bool,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("upto", &self.upto)
            .field("marks", &self.marks.iter().map(|m| m.0).collect::<Vec<_>>())
            .field("want", &self.want)
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl Check {
    /// A check of a file named `what` whose bytes before the window hash
    /// into `hasher`, and whose checksum (of those bytes and the window's)
    /// is `want`.
    pub fn new(hasher: crc32fast::Hasher, want: u32, what: String) -> Check {
        Check {
            marks: vec![(0, hasher.clone())],
            hasher,
            upto: 0,
            want,
            what,
            damaged: false,
        }
    }

    /// A seek to window position `to`: a place to hash again from if it
    /// is read again, or one hashed before (to hash again from there).
    fn seek(&mut self, to: u64) {
        if to == self.upto {
            if self.marks.last().is_none_or(|m| m.0 != to) {
                if self.marks.len() == MARKS {
                    // The window's start stays.
                    self.marks.remove(1);
                }
                self.marks.push((to, self.hasher.clone()));
            }
        } else if to < self.upto
            && let Some(i) = self.marks.iter().rposition(|m| m.0 == to)
        {
            self.hasher = self.marks[i].1.clone();
            self.upto = to;
            self.marks.truncate(i + 1);
        }
    }

    /// Takes in `bytes`, read at window position `at`; at the window's
    /// end (`len`), whether the checksum matches.
    fn read(&mut self, at: u64, bytes: &[u8], len: u64) -> io::Result<()> {
        let end = at + bytes.len() as u64;
        if !self.damaged && at <= self.upto && end > self.upto {
            let fresh = usize::try_from(self.upto - at).unwrap_or(usize::MAX);
            self.hasher.update(&bytes[fresh.min(bytes.len())..]);
            self.upto = end;
            self.damaged = end >= len && self.hasher.clone().finalize() != self.want;
        }
        if self.damaged {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the snapshot file {} is damaged (checksum mismatch): its data directory can no longer be trusted",
                    self.what
                ),
            ));
        }
        Ok(())
    }
}

/// How many places [`Check`] can hash again from: the start of the window,
/// and those of the latest chunks.
const MARKS: usize = 4;

impl FileWindow {
    /// The position within the window.
    fn pos(&self) -> u64 {
        self.len.saturating_sub(self.file.limit())
    }
}

impl SnapshotData {
    /// `bytes`, in memory.
    pub fn mem(bytes: Vec<u8>) -> SnapshotData {
        SnapshotData::Mem(Cursor::new(bytes))
    }

    /// Bytes `base .. base + len` of `file`, which is positioned at `base`,
    /// its checksum checked by `check` as they are read.
    pub fn file(file: std::fs::File, base: u64, len: u64, check: Check) -> SnapshotData {
        SnapshotData::File(FileWindow {
            file: tokio::fs::File::from_std(file).take(len),
            base,
            len,
            check,
        })
    }

    /// A snapshot to be received into the new file `path` (made empty).
    pub fn incoming(path: std::path::PathBuf) -> io::Result<SnapshotData> {
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(SnapshotData::Incoming(Incoming {
            file: tokio::fs::File::from_std(file),
            path,
            taken: false,
            check: None,
            checked: false,
        }))
    }

    /// All the bytes, in memory.
    pub async fn into_bytes(self) -> io::Result<Vec<u8>> {
        match self {
            SnapshotData::Mem(c) => Ok(c.into_inner()),
            SnapshotData::Incoming(mut i) => {
                let mut out = Vec::new();
                i.file.seek(SeekFrom::Start(0)).await?;
                i.file.read_to_end(&mut out).await?;
                Ok(out)
            }
            SnapshotData::File(mut w) => {
                let mut out = Vec::with_capacity(usize::try_from(w.len).unwrap_or(0));
                w.seek(SeekFrom::Start(0)).await?;
                w.read_to_end(&mut out).await?;
                Ok(out)
            }
        }
    }
}

impl AsyncRead for FileWindow {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (at, before) = (this.pos(), buf.filled().len());
        ready!(Pin::new(&mut this.file).poll_read(cx, buf))?;
        if buf.filled().len() == before && buf.remaining() > 0 && at < this.len {
            // The file was cut short after it was opened.
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the snapshot file {} is cut short", this.check.what),
            )));
        }
        let checked = this.check.read(at, &buf.filled()[before..], this.len);
        if checked.is_err() {
            // A failed read gives no bytes.
            buf.set_filled(before);
        }
        Poll::Ready(checked)
    }
}

impl AsyncSeek for FileWindow {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let to = match position {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => this.len.checked_add_signed(d),
            SeekFrom::Current(d) => this.pos().checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        let abs = this
            .base
            .checked_add(to)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        Pin::new(this.file.get_mut()).start_seek(SeekFrom::Start(abs))?;
        this.file.set_limit(this.len.saturating_sub(to));
        this.check.seek(to);
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        ready!(Pin::new(this.file.get_mut()).poll_complete(cx))?;
        Poll::Ready(Ok(this.pos()))
    }
}

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "a snapshot read from its file is not written to",
    )
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_read(cx, buf),
            SnapshotData::File(w) => Pin::new(w).poll_read(cx, buf),
            SnapshotData::Incoming(i) => Pin::new(&mut i.file).poll_read(cx, buf),
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).start_seek(position),
            SnapshotData::File(w) => Pin::new(w).start_seek(position),
            SnapshotData::Incoming(i) => Pin::new(&mut i.file).start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_complete(cx),
            SnapshotData::File(w) => Pin::new(w).poll_complete(cx),
            SnapshotData::Incoming(i) => Pin::new(&mut i.file).poll_complete(cx),
        }
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_write(cx, buf),
            SnapshotData::File(_) => Poll::Ready(Err(read_only())),
            SnapshotData::Incoming(i) => Pin::new(&mut i.file).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_flush(cx),
            SnapshotData::File(_) => Poll::Ready(Ok(())),
            SnapshotData::Incoming(i) => Pin::new(&mut i.file).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_shutdown(cx),
            SnapshotData::File(_) => Poll::Ready(Ok(())),
            SnapshotData::Incoming(i) => {
                ready!(Pin::new(&mut i.file).poll_shutdown(cx))?;
                i.poll_check(cx)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_file_window_reads_and_seeks_within_its_bytes_only() {
        let path = std::env::temp_dir().join(format!("idem-window-{}", std::process::id()));
        write_checked(&path, b"HEADERabcdefghij");
        let open = || opened_at(&path, 6);
        // Read from where the file is, without a seek first.
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        let mut first = [0u8; 3];
        w.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"abc");
        // As openraft's sender does: the length from the end, then chunks.
        assert_eq!(
            tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::End(0))
                .await
                .unwrap(),
            10
        );
        tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(4))
            .await
            .unwrap();
        let mut chunk = Vec::with_capacity(4);
        w.read_buf(&mut chunk).await.unwrap();
        assert_eq!(chunk, b"efgh");
        let mut rest = Vec::new();
        w.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"ij");
        // Back from the current position, then past the end.
        assert_eq!(
            tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Current(-3))
                .await
                .unwrap(),
            7
        );
        let mut tail = Vec::new();
        w.read_to_end(&mut tail).await.unwrap();
        assert_eq!(tail, b"hij");
        tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(50))
            .await
            .unwrap();
        let mut none = Vec::new();
        w.read_to_end(&mut none).await.unwrap();
        assert!(none.is_empty());
        assert!(w.write_all(b"x").await.is_err());
        let all = SnapshotData::file(open(), 6, 10, check(&path))
            .into_bytes()
            .await
            .unwrap();
        assert_eq!(all, b"abcdefghij");
        std::fs::remove_file(&path).unwrap();
    }

    /// The file `path`, positioned at `at`.
    fn opened_at(path: &std::path::Path, at: u64) -> std::fs::File {
        let mut f = std::fs::File::open(path).unwrap();
        std::io::Seek::seek(&mut f, SeekFrom::Start(at)).unwrap();
        f
    }

    /// `bytes` and their CRC-32 in `path`.
    fn write_checked(path: &std::path::Path, bytes: &[u8]) {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(bytes).unwrap();
        f.write_all(&crc32fast::hash(bytes).to_le_bytes()).unwrap();
    }

    /// The check of the window `6 .. 16` of the file `path` (its first 6
    /// bytes hashed, its checksum read from its end).
    fn check(path: &std::path::Path) -> Check {
        let bytes = std::fs::read(path).unwrap();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&bytes[..6]);
        let want = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        Check::new(hasher, want, path.display().to_string())
    }

    /// A snapshot file damaged on disk after it was written (the leader
    /// had checked it only when it started) was sent to followers, whose
    /// Raft core stopped on it. Now the read that reaches the end of a
    /// damaged window fails, and so does every read after it.
    #[tokio::test]
    async fn a_damaged_file_fails_the_read_that_reaches_its_end() {
        let path = std::env::temp_dir().join(format!("idem-window-bad-{}", std::process::id()));
        write_checked(&path, b"HEADERabcdefghij");
        let open = || opened_at(&path, 6);
        // Whole: read in chunks as openraft sends it, with a chunk read
        // again (a resend) on the way.
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        let mut got = Vec::new();
        for (at, n) in [(0u64, 4usize), (4, 4), (4, 4), (8, 4)] {
            tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(at))
                .await
                .unwrap();
            let mut chunk = vec![0u8; n];
            let read = w.read(&mut chunk).await.unwrap();
            if at >= got.len() as u64 {
                got.extend_from_slice(&chunk[..read]);
            }
        }
        assert_eq!(got, b"abcdefghij");
        // One bit flipped in the window.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        let mut first = [0u8; 8];
        w.read_exact(&mut first).await.unwrap();
        let e = w.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("damaged"), "{e}");
        tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(0))
            .await
            .unwrap();
        assert!(w.read(&mut [0u8; 4]).await.is_err(), "stays failed");
        assert!(
            SnapshotData::file(open(), 6, 10, check(&path))
                .into_bytes()
                .await
                .is_err()
        );
        // Damaged between two sends of the first chunk (read, then sent
        // again after a failed send): what is checked is what was read
        // last.
        write_checked(&path, b"HEADERabcdefghij");
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        let mut chunk = [0u8; 4];
        w.read_exact(&mut chunk).await.unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[7] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        for at in [0u64, 4, 0, 4] {
            tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(at))
                .await
                .unwrap();
            w.read_exact(&mut chunk).await.unwrap();
        }
        tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(8))
            .await
            .unwrap();
        assert!(
            w.read(&mut chunk).await.is_err(),
            "the resent chunk is checked"
        );
        // Read out of order, nothing is checked (and nothing fails).
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        tokio::io::AsyncSeekExt::seek(&mut w, SeekFrom::Start(2))
            .await
            .unwrap();
        let mut rest = Vec::new();
        w.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest.len(), 8);
        // Cut short after it was opened: an error, not endless empty
        // reads (openraft would send empty chunks for ever).
        write_checked(&path, b"HEADERabcdefghij");
        let mut w = SnapshotData::file(open(), 6, 10, check(&path));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(10)
            .unwrap();
        let mut all = Vec::new();
        let e = w.read_to_end(&mut all).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        std::fs::remove_file(&path).unwrap();
    }
}
