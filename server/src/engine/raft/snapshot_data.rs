//! A snapshot's bytes as openraft reads and writes them: in memory (one
//! being received, or just built), or a window of the snapshot file (one
//! sent to a follower), read a chunk at a time as openraft sends it.
//!
//! Sending from the file keeps the leader's state machine from reading
//! (or copying) the whole snapshot before the first chunk goes out: openraft
//! asks the state machine for the snapshot on the task that applies
//! entries, so that read held every apply back.

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
}

/// A read-only window of a file.
#[derive(Debug)]
pub struct FileWindow {
    /// The file, limited to what is left of the window from where it is
    /// (the file goes on past the window: its checksum).
    file: Take<tokio::fs::File>,
    base: u64,
    len: u64,
}

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

    /// Bytes `base .. base + len` of `file`, which is positioned at `base`.
    pub fn file(file: std::fs::File, base: u64, len: u64) -> SnapshotData {
        SnapshotData::File(FileWindow {
            file: tokio::fs::File::from_std(file).take(len),
            base,
            len,
        })
    }

    /// All the bytes, in memory.
    pub async fn into_bytes(self) -> io::Result<Vec<u8>> {
        match self {
            SnapshotData::Mem(c) => Ok(c.into_inner()),
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
        Pin::new(&mut self.get_mut().file).poll_read(cx, buf)
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
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).start_seek(position),
            SnapshotData::File(w) => Pin::new(w).start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_complete(cx),
            SnapshotData::File(w) => Pin::new(w).poll_complete(cx),
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_flush(cx),
            SnapshotData::File(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Mem(c) => Pin::new(c).poll_shutdown(cx),
            SnapshotData::File(_) => Poll::Ready(Ok(())),
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
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"HEADERabcdefghijCRC").unwrap();
        drop(f);
        let open = || {
            let mut f = std::fs::File::open(&path).unwrap();
            std::io::Seek::seek(&mut f, SeekFrom::Start(6)).unwrap();
            f
        };
        // Read from where the file is, without a seek first.
        let mut w = SnapshotData::file(open(), 6, 10);
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
        let all = SnapshotData::file(open(), 6, 10)
            .into_bytes()
            .await
            .unwrap();
        assert_eq!(all, b"abcdefghij");
        std::fs::remove_file(&path).unwrap();
    }
}
