//! Reply bytes owed to one client, written with vectored writes.
//!
//! Small replies are copied into one growing buffer. A stored value or
//! journal of [`SHARE_MIN`] bytes or more is not copied: the buffer keeps a
//! clone of its `Bytes` (a reference count), so a herd of clients replaying
//! one large value shares that value instead of each holding a copy.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

use crate::frame::{encode, line_out, number_out};
use crate::reply::{ClaimReply, Reply, SettleReply};
use crate::{Frame, Version};

/// Bodies at least this long are referenced, not copied, into the output.
pub const SHARE_MIN: usize = 4096;

/// At most this many pieces go into one vectored write.
pub const MAX_SLICES: usize = 64;

/// Reply bytes owed to a client, in order: frozen pieces (copied bytes and
/// shared bodies) followed by the buffer replies are being copied into.
#[derive(Debug, Default)]
pub struct OutBuf {
    /// Pieces before `tail`, in order, none of them empty.
    pieces: VecDeque<Bytes>,
    /// Bytes in `pieces`.
    queued: usize,
    /// Bytes written off the front piece: its allocation holds them until
    /// the whole piece is written.
    front_dead: usize,
    /// Where small replies are copied.
    tail: BytesMut,
    /// Bytes written off the front of `tail`: still allocated (writing
    /// does not shrink the buffer), no longer in its `capacity()`. They
    /// count while the buffer's data starts where the last write left it
    /// (`tail_dead_at`); once a copy into it moved its data (back to the
    /// start of its allocation, or to a new one), they are gone.
    tail_dead: usize,
    tail_dead_at: usize,
}

/// Once more than this much of the copy buffer has been written while the
/// rest is still owed, and more than the rest, the rest moves to a buffer
/// of its own size and the large one is let go of (a client that reads
/// slowly holds what it owes, not the largest buffer it ever owed). Each
/// byte is moved at most once per as many bytes written.
pub const COMPACT_AFTER: usize = 64 * 1024;

impl OutBuf {
    /// An empty buffer, holding no memory.
    pub fn new() -> OutBuf {
        OutBuf::default()
    }

    /// Bytes owed.
    pub fn len(&self) -> usize {
        self.queued + self.tail.len()
    }

    /// Whether nothing is owed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory the owed bytes stand for: the copy buffer's capacity plus
    /// every piece's length. A shared body is counted in full by every
    /// buffer that references it, an upper bound of what it holds alive
    /// (the store may drop its own reference while replies are owed).
    pub fn memory(&self) -> usize {
        self.queued + self.front_dead + self.tail.capacity() + self.dead_in_tail()
    }

    /// [`OutBuf::tail_dead`], if the buffer's data has not moved since.
    fn dead_in_tail(&self) -> usize {
        if self.tail.as_ptr() as usize == self.tail_dead_at {
            self.tail_dead
        } else {
            0
        }
    }

    /// Copies `bytes` in.
    pub fn put(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
    }

    /// The buffer small replies are copied into (what goes into it follows
    /// every piece already owed).
    pub fn tail_mut(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Appends a reply in `version`'s wire form: a large stored value or
    /// journal is referenced, everything else copied. The bytes are the same
    /// as [`Reply::encode`]'s.
    pub fn push_reply(&mut self, version: Version, reply: &Reply) {
        match reply {
            Reply::Claim(ClaimReply::Completed { outcome, value })
            | Reply::Settle(SettleReply::Completed { outcome, value })
                if value.len() >= SHARE_MIN =>
            {
                self.put(b"*3\r\n+COMPLETED\r\n");
                line_out(&mut self.tail, b'+', outcome.as_str().as_bytes());
                self.push_bulk(value);
            }
            Reply::Claim(ClaimReply::Recover { fence, journal }) if journal.len() >= SHARE_MIN => {
                self.put(b"*3\r\n+RECOVER\r\n");
                number_out(&mut self.tail, b':', *fence as i64);
                self.push_bulk(journal);
            }
            Reply::Settle(SettleReply::Abandoned { journal }) if journal.len() >= SHARE_MIN => {
                self.put(b"*2\r\n+ABANDONED\r\n");
                self.push_bulk(journal);
            }
            // INSPECT shows the value or journal too: a herd inspecting
            // one large record held a copy per reply.
            Reply::Inspect(Some(info))
                if [&info.value, &info.journal]
                    .iter()
                    .any(|b| b.as_ref().is_some_and(|b| b.len() >= SHARE_MIN)) =>
            {
                self.push_frame(version, &info.to_frame());
            }
            other => other.encode(version, &mut self.tail),
        }
    }

    /// Appends `frame` as [`encode`] writes it, its bulk strings of
    /// [`SHARE_MIN`] bytes or more referenced.
    fn push_frame(&mut self, version: Version, frame: &Frame) {
        match frame {
            Frame::Bulk(body) if body.len() >= SHARE_MIN => self.push_bulk(body),
            Frame::Array(items) => {
                number_out(&mut self.tail, b'*', items.len() as i64);
                for item in items {
                    self.push_frame(version, item);
                }
            }
            Frame::Map(pairs) => {
                match version {
                    Version::Resp2 => number_out(&mut self.tail, b'*', pairs.len() as i64 * 2),
                    Version::Resp3 => number_out(&mut self.tail, b'%', pairs.len() as i64),
                }
                for (k, v) in pairs {
                    self.push_frame(version, k);
                    self.push_frame(version, v);
                }
            }
            other => encode(other, version, &mut self.tail),
        }
    }

    /// Appends a bulk string whose body is referenced.
    fn push_bulk(&mut self, body: &Bytes) {
        number_out(&mut self.tail, b'$', body.len() as i64);
        self.freeze_tail();
        self.queued += body.len();
        self.pieces.push_back(body.clone());
        self.put(b"\r\n");
    }

    /// Moves what the copy buffer holds into the pieces: copied, so that
    /// the piece owns its memory (a split would share the buffer's
    /// allocation, which would then stay alive uncounted after the piece
    /// was written), and the buffer keeps its room.
    fn freeze_tail(&mut self) {
        if !self.tail.is_empty() {
            let piece = Bytes::copy_from_slice(&self.tail);
            self.tail.clear();
            self.queued += piece.len();
            self.pieces.push_back(piece);
        }
    }

    /// The owed bytes when they are all in the copy buffer (the common
    /// case: one plain write then does).
    pub fn as_contiguous(&self) -> Option<&[u8]> {
        self.pieces.is_empty().then_some(&self.tail[..])
    }

    /// Fills `dst` with the owed bytes in order (at most `dst.len()`
    /// pieces) and returns how many it filled.
    pub fn slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let tail = (!self.tail.is_empty()).then_some(&self.tail[..]);
        for piece in self.pieces.iter().map(|p| &p[..]).chain(tail) {
            if n == dst.len() {
                break;
            }
            dst[n] = IoSlice::new(piece);
            n += 1;
        }
        n
    }

    /// Drops the first `n` owed bytes (they were written).
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                let n = n.min(self.tail.len());
                let dead = self.dead_in_tail();
                self.tail.advance(n);
                self.tail_dead = dead + n;
                self.tail_dead_at = self.tail.as_ptr() as usize;
                self.compact_tail();
                return;
            };
            if n < front.len() {
                front.advance(n);
                self.queued -= n;
                self.front_dead += n;
                return;
            }
            n -= front.len();
            self.queued -= front.len();
            self.pieces.pop_front();
            self.front_dead = 0;
        }
    }

    /// Lets go of the copy buffer's written part once it is large and
    /// larger than what is still owed ([`COMPACT_AFTER`]).
    fn compact_tail(&mut self) {
        let dead = self.dead_in_tail();
        if dead <= COMPACT_AFTER || dead <= self.tail.len() {
            return;
        }
        self.tail = if self.tail.is_empty() {
            BytesMut::new()
        } else {
            BytesMut::from(&self.tail[..])
        };
        self.tail_dead = 0;
    }

    /// Lets go of the buffer's memory once nothing is owed: an idle client
    /// then holds none, and one large reply does not stay allocated after
    /// it was written.
    pub fn release_if_empty(&mut self) {
        if self.is_empty() {
            // Even with no room left: written out to its last byte, the
            // tail still holds its allocation.
            self.tail = BytesMut::new();
            self.tail_dead = 0;
            self.front_dead = 0;
            if self.pieces.capacity() > 0 {
                self.pieces = VecDeque::new();
            }
        }
    }

    /// The owed bytes, copied into one buffer (for tests and diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for p in &self.pieces {
            v.extend_from_slice(p);
        }
        v.extend_from_slice(&self.tail);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;
    use crate::reply::{RecordInfo, RecordState};

    fn replies(value: Bytes) -> Vec<Reply> {
        vec![
            Reply::Ok,
            Reply::Claim(ClaimReply::Completed {
                outcome: Outcome::Ok,
                value: value.clone(),
            }),
            Reply::Claim(ClaimReply::Recover {
                fence: 7,
                journal: value.clone(),
            }),
            Reply::Settle(SettleReply::Completed {
                outcome: Outcome::Err,
                value: value.clone(),
            }),
            Reply::Settle(SettleReply::Abandoned {
                journal: value.clone(),
            }),
            Reply::Frame(Frame::Integer(3)),
            Reply::Inspect(Some(Box::new(RecordInfo {
                state: RecordState::Completed,
                fence: 2,
                lease_ms: None,
                retain_ms: Some(5),
                outcome: Some(Outcome::Ok),
                value: Some(value.clone()),
                fingerprint: Some(Bytes::from_static(b"fp")),
                journal: None,
                attempt: None,
            }))),
            Reply::Inspect(Some(Box::new(RecordInfo {
                state: RecordState::InFlight,
                fence: 3,
                lease_ms: Some(9),
                retain_ms: None,
                outcome: None,
                value: None,
                fingerprint: None,
                journal: Some(value.clone()),
                attempt: Some(Bytes::from_static(b"a")),
            }))),
            Reply::Inspect(None),
        ]
    }

    /// Whatever the size of the body, the bytes are the same as a copying
    /// encode's.
    #[test]
    fn bytes_match_the_copying_encoder() {
        for len in [0, 10, SHARE_MIN - 1, SHARE_MIN, 100_000] {
            let value = Bytes::from(vec![b'v'; len]);
            for v in [Version::Resp2, Version::Resp3] {
                let mut out = OutBuf::new();
                let mut copied = BytesMut::new();
                for r in replies(value.clone()) {
                    out.push_reply(v, &r);
                    r.encode(v, &mut copied);
                }
                assert_eq!(out.len(), copied.len());
                assert_eq!(out.to_vec(), copied.to_vec(), "len {len}");
            }
        }
    }

    /// What was written off a buffer is still allocated until the buffer
    /// goes: `memory()` counts it (it counted only the capacity left, a
    /// fifth of what a slow reader held), and past [`COMPACT_AFTER`] the
    /// rest moves to a buffer of its own size.
    #[test]
    fn memory_counts_what_is_allocated_until_it_is_let_go_of() {
        let mut out = OutBuf::new();
        for _ in 0..10_000 {
            out.put(&[b'x'; 100]);
        }
        let held = out.memory();
        assert!(held >= 1_000_000, "{held}");
        // Written below the threshold: still allocated, still counted.
        out.advance(COMPACT_AFTER - 1);
        assert_eq!(out.len(), 1_000_000 - (COMPACT_AFTER - 1));
        assert_eq!(out.memory(), held);
        // Most of it written: the rest moves, and the memory goes.
        out.advance(800_000);
        let rest = 1_000_000 - (COMPACT_AFTER - 1) - 800_000;
        assert_eq!(out.len(), rest);
        assert!(out.tail.capacity() < 2 * rest, "{}", out.tail.capacity());
        assert!(out.memory() < 2 * rest, "{}", out.memory());
        let mut expected = vec![b'x'; rest];
        assert_eq!(out.to_vec(), std::mem::take(&mut expected));
        // A shared body written in part is held whole until it is done.
        let value = Bytes::from(vec![b'v'; 1 << 20]);
        let mut out = OutBuf::new();
        out.push_reply(
            Version::Resp2,
            &Reply::Claim(ClaimReply::Completed {
                outcome: Outcome::Ok,
                value,
            }),
        );
        out.advance(600_000);
        assert!(out.memory() >= 1 << 20, "{}", out.memory());
        // Written out whole, then written into again: the buffer takes its
        // room back (its data moves to the start) and is counted once.
        let mut out = OutBuf::new();
        out.put(&[b'x'; 10_000]);
        let held = out.memory();
        out.advance(10_000);
        assert_eq!(out.memory(), held);
        out.put(&[b'y'; 5_000]);
        out.put(&[b'z'; 5_000]);
        assert!(out.memory() <= held + 64, "{} for {held}", out.memory());
    }

    /// A large body is referenced: the piece points into the stored value.
    #[test]
    fn large_values_are_shared_not_copied() {
        let value = Bytes::from(vec![b'v'; 1 << 20]);
        let mut out = OutBuf::new();
        for _ in 0..30 {
            out.push_reply(
                Version::Resp2,
                &Reply::Claim(ClaimReply::Completed {
                    outcome: Outcome::Ok,
                    value: value.clone(),
                }),
            );
        }
        assert!(out.len() > 30 << 20);
        assert!(
            out.tail.capacity() < 4096,
            "the copy buffer holds only headers"
        );
        let shared = out
            .pieces
            .iter()
            .filter(|p| p.as_ptr() == value.as_ptr())
            .count();
        assert_eq!(shared, 30);
    }

    /// INSPECT's value or journal is referenced as a replay's is (a herd
    /// inspecting one 1 MiB record held a copy per reply).
    #[test]
    fn an_inspected_large_body_is_shared_not_copied() {
        let value = Bytes::from(vec![b'v'; 1 << 20]);
        let mut out = OutBuf::new();
        for r in replies(value.clone()).iter().skip(6).cycle().take(30) {
            out.push_reply(Version::Resp3, r);
        }
        assert!(out.len() > 20 << 20);
        assert!(
            out.memory() < out.len() + 64 * 1024,
            "{} held for {} owed",
            out.memory(),
            out.len()
        );
        let shared = out
            .pieces
            .iter()
            .filter(|p| p.as_ptr() == value.as_ptr())
            .count();
        assert_eq!(shared, 20, "the value of ten, the journal of ten");
    }

    /// Writing in arbitrary cuts, through the slices, yields the same bytes
    /// in order, and an emptied buffer holds no memory.
    #[test]
    fn advancing_in_any_cut_keeps_the_order() {
        let value = Bytes::from((0..20_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let mut expected = BytesMut::new();
        let mut out = OutBuf::new();
        for r in replies(value) {
            out.push_reply(Version::Resp2, &r);
            r.encode(Version::Resp2, &mut expected);
        }
        let mut got = Vec::new();
        let mut cut = 1;
        while !out.is_empty() {
            let mut slices = [IoSlice::new(&[]); 3];
            let n = out.slices(&mut slices);
            assert!(n > 0);
            let mut take = cut;
            let mut written = 0;
            for s in &slices[..n] {
                let k = take.min(s.len());
                got.extend_from_slice(&s[..k]);
                written += k;
                take -= k;
                if take == 0 {
                    break;
                }
            }
            out.advance(written);
            cut = cut * 3 + 1;
        }
        assert_eq!(got, expected.to_vec());
        out.release_if_empty();
        assert_eq!(out.memory(), 0);
    }
}
