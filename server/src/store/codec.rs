//! The binary form of an [`Entry`], as a replicated log stores it.
//!
//! # Format (version 1, integers little-endian)
//!
//! ```text
//! u8:format_version u16:state_machine_version u64:stamp_ms u32:op_count ops…
//! op = u8:tag fields…
//!   1 CLAIM     bytes:key u64:lease_ms u64:retain_ms opt(bytes):fingerprint u8:on_expire opt(bytes):attempt
//!   2 COMPLETE  bytes:key u64:fence bytes:value opt(u64):retain_ms u8:error
//!   3 RENEW     bytes:key u64:fence u64:lease_ms
//!   4 JOURNAL   bytes:key u64:fence bytes:journal
//!   5 RELEASE   bytes:key u64:fence
//!   6 ABANDON   bytes:key u64:fence
//!   7 FORGET    bytes:key
//!   8 EXPIRE    u32:count bytes:key × count
//!   9 SETLIMITS u64:max_memory_bytes u64:headroom_bytes
//! bytes = u32:len data; opt(x) = u8:0 | u8:1 x; on_expire: 0 FREE, 1 RECOVER
//! ```
//!
//! `state_machine_version` names the rules an entry is to be applied
//! with: a change to what applying an existing op does gets a new version,
//! and entries keep the version they were proposed under, so replaying a
//! log gives the replies given the first time.

use bytes::{Buf, BufMut, Bytes};
use idem_protocol::OnExpire;
use idem_protocol::cmd::{Abandon, Complete, Forget, Journal, Release, Renew};

use super::op::{ClaimOp, Entry, MemoryLimits, Op};

/// The entry format this build writes.
pub const ENTRY_FORMAT: u8 = 1;
/// The state-machine rules this build applies.
pub const STATE_MACHINE_VERSION: u16 = 1;

/// An entry that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Written by a newer or unknown format.
    #[error("entry format {0} is not supported (this build reads {ENTRY_FORMAT})")]
    Format(u8),
    /// To be applied with rules this build does not have.
    #[error(
        "entry needs state machine version {0} (this build applies up to {STATE_MACHINE_VERSION})"
    )]
    StateMachine(u16),
    /// Cut short or holding an impossible value.
    #[error("malformed entry: {0}")]
    Malformed(&'static str),
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.put_u32_le(b.len() as u32);
    out.put_slice(b);
}

fn put_opt_bytes(out: &mut Vec<u8>, b: Option<&Bytes>) {
    match b {
        Some(b) => {
            out.put_u8(1);
            put_bytes(out, b);
        }
        None => out.put_u8(0),
    }
}

/// Checks that `buf` starts like an entry this build can apply: its
/// format and state-machine version (what tells a newer build's entries).
///
/// # Errors
///
/// [`CodecError::Format`] or [`CodecError::StateMachine`] for an entry
/// this build cannot read, [`CodecError::Malformed`] if `buf` is shorter
/// than the header.
pub fn check_entry_header(buf: &[u8]) -> Result<(), CodecError> {
    let (&format, rest) = buf
        .split_first()
        .ok_or(CodecError::Malformed("cut short"))?;
    if format != ENTRY_FORMAT {
        return Err(CodecError::Format(format));
    }
    let sm = rest
        .get(..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(CodecError::Malformed("cut short"))?;
    if sm == 0 || sm > STATE_MACHINE_VERSION {
        return Err(CodecError::StateMachine(sm));
    }
    Ok(())
}

/// Appends the encoding of `entry` to `out`.
pub fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    out.put_u8(ENTRY_FORMAT);
    out.put_u16_le(STATE_MACHINE_VERSION);
    out.put_u64_le(entry.stamp_ms);
    out.put_u32_le(entry.ops.len() as u32);
    for op in &entry.ops {
        encode_op(op, out);
    }
}

fn encode_op(op: &Op, out: &mut Vec<u8>) {
    match op {
        Op::Claim(c) => {
            out.put_u8(1);
            put_bytes(out, &c.key);
            out.put_u64_le(c.lease_ms);
            out.put_u64_le(c.retain_ms);
            put_opt_bytes(out, c.fingerprint.as_ref());
            out.put_u8(u8::from(c.on_expire == OnExpire::Recover));
            put_opt_bytes(out, c.attempt.as_ref());
        }
        Op::Complete(c) => {
            out.put_u8(2);
            put_bytes(out, &c.key);
            out.put_u64_le(c.fence);
            put_bytes(out, &c.value);
            match c.retain_ms {
                Some(r) => {
                    out.put_u8(1);
                    out.put_u64_le(r);
                }
                None => out.put_u8(0),
            }
            out.put_u8(u8::from(c.error));
        }
        Op::Renew(c) => {
            out.put_u8(3);
            put_bytes(out, &c.key);
            out.put_u64_le(c.fence);
            out.put_u64_le(c.lease_ms);
        }
        Op::Journal(c) => {
            out.put_u8(4);
            put_bytes(out, &c.key);
            out.put_u64_le(c.fence);
            put_bytes(out, &c.journal);
        }
        Op::Release(c) => {
            out.put_u8(5);
            put_bytes(out, &c.key);
            out.put_u64_le(c.fence);
        }
        Op::Abandon(c) => {
            out.put_u8(6);
            put_bytes(out, &c.key);
            out.put_u64_le(c.fence);
        }
        Op::Forget(c) => {
            out.put_u8(7);
            put_bytes(out, &c.key);
        }
        Op::Expire { keys } => {
            out.put_u8(8);
            out.put_u32_le(keys.len() as u32);
            for k in keys {
                put_bytes(out, k);
            }
        }
        Op::SetLimits(l) => {
            out.put_u8(9);
            out.put_u64_le(l.max_memory_bytes);
            out.put_u64_le(l.headroom_bytes);
        }
    }
}

/// Reads an entry from `buf`: decoding from [`Bytes`] (keys and values
/// share it), or only walking through a slice ([`check_entry`]).
struct Reader<B> {
    buf: B,
}

impl<B: Buf> Reader<B> {
    fn need(&self, n: usize) -> Result<(), CodecError> {
        if self.buf.remaining() < n {
            Err(CodecError::Malformed("cut short"))
        } else {
            Ok(())
        }
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    fn u16(&mut self) -> Result<u16, CodecError> {
        self.need(2)?;
        Ok(self.buf.get_u16_le())
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        self.need(4)?;
        Ok(self.buf.get_u32_le())
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        self.need(8)?;
        Ok(self.buf.get_u64_le())
    }

    fn flag(&mut self) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CodecError::Malformed("flag byte")),
        }
    }

    fn skip(&mut self, n: usize) -> Result<(), CodecError> {
        self.need(n)?;
        self.buf.advance(n);
        Ok(())
    }
}

impl Reader<Bytes> {
    fn bytes(&mut self) -> Result<Bytes, CodecError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        Ok(self.buf.split_to(n))
    }

    fn opt_bytes(&mut self) -> Result<Option<Bytes>, CodecError> {
        Ok(if self.flag()? {
            Some(self.bytes()?)
        } else {
            None
        })
    }

    fn op(&mut self) -> Result<Op, CodecError> {
        Ok(match self.u8()? {
            1 => Op::Claim(ClaimOp {
                key: self.bytes()?,
                lease_ms: self.u64()?,
                retain_ms: self.u64()?,
                fingerprint: self.opt_bytes()?,
                on_expire: if self.flag()? {
                    OnExpire::Recover
                } else {
                    OnExpire::Free
                },
                attempt: self.opt_bytes()?,
            }),
            2 => Op::Complete(Complete {
                key: self.bytes()?,
                fence: self.u64()?,
                value: self.bytes()?,
                retain_ms: if self.flag()? {
                    Some(self.u64()?)
                } else {
                    None
                },
                error: self.flag()?,
            }),
            3 => Op::Renew(Renew {
                key: self.bytes()?,
                fence: self.u64()?,
                lease_ms: self.u64()?,
            }),
            4 => Op::Journal(Journal {
                key: self.bytes()?,
                fence: self.u64()?,
                journal: self.bytes()?,
            }),
            5 => Op::Release(Release {
                key: self.bytes()?,
                fence: self.u64()?,
            }),
            6 => Op::Abandon(Abandon {
                key: self.bytes()?,
                fence: self.u64()?,
            }),
            7 => Op::Forget(Forget { key: self.bytes()? }),
            8 => {
                let n = self.u32()? as usize;
                // Each key takes at least its length prefix.
                self.need(n.saturating_mul(4))?;
                let mut keys = Vec::with_capacity(n);
                for _ in 0..n {
                    keys.push(self.bytes()?);
                }
                Op::Expire { keys }
            }
            9 => Op::SetLimits(MemoryLimits {
                max_memory_bytes: self.u64()?,
                headroom_bytes: self.u64()?,
            }),
            _ => return Err(CodecError::Malformed("unknown op tag")),
        })
    }
}

/// Decodes an entry (sharing `buf` for keys and values), checking that
/// this build can apply it.
pub fn decode_entry(buf: Bytes) -> Result<Entry, CodecError> {
    check_entry_header(&buf)?;
    let mut r = Reader { buf };
    r.u8()?;
    r.u16()?;
    let stamp_ms = r.u64()?;
    let n = r.u32()? as usize;
    // Each op takes at least its tag.
    r.need(n)?;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        ops.push(r.op()?);
    }
    if r.buf.has_remaining() {
        return Err(CodecError::Malformed("bytes after the last op"));
    }
    Ok(Entry { stamp_ms, ops })
}

/// Checks that [`decode_entry`] decodes `buf`, without building the entry
/// (what a node checks of each entry a peer sends it before its log takes
/// it: one that does not decode would stop the node that applies it).
///
/// # Errors
///
/// The error [`decode_entry`] gives.
pub fn check_entry(buf: &[u8]) -> Result<(), CodecError> {
    check_entry_header(buf)?;
    let mut r = Reader { buf };
    r.skip(3)?;
    r.skip(8)?;
    let n = r.u32()? as usize;
    r.need(n)?;
    for _ in 0..n {
        r.skip_op()?;
    }
    if !r.buf.is_empty() {
        return Err(CodecError::Malformed("bytes after the last op"));
    }
    Ok(())
}

impl Reader<&[u8]> {
    fn skip_bytes(&mut self) -> Result<(), CodecError> {
        let n = self.u32()? as usize;
        self.skip(n)
    }

    fn skip_opt_bytes(&mut self) -> Result<(), CodecError> {
        if self.flag()? {
            self.skip_bytes()?;
        }
        Ok(())
    }

    /// Past an op, its fields taken as [`Reader::op`] reads them.
    fn skip_op(&mut self) -> Result<(), CodecError> {
        match self.u8()? {
            1 => {
                self.skip_bytes()?;
                self.skip(16)?;
                self.skip_opt_bytes()?;
                self.flag()?;
                self.skip_opt_bytes()
            }
            2 => {
                self.skip_bytes()?;
                self.skip(8)?;
                self.skip_bytes()?;
                if self.flag()? {
                    self.skip(8)?;
                }
                self.flag().map(drop)
            }
            3 => {
                self.skip_bytes()?;
                self.skip(16)
            }
            4 => {
                self.skip_bytes()?;
                self.skip(8)?;
                self.skip_bytes()
            }
            5 | 6 => {
                self.skip_bytes()?;
                self.skip(8)
            }
            7 => self.skip_bytes(),
            8 => {
                let n = self.u32()? as usize;
                self.need(n.saturating_mul(4))?;
                for _ in 0..n {
                    self.skip_bytes()?;
                }
                Ok(())
            }
            9 => self.skip(16),
            _ => Err(CodecError::Malformed("unknown op tag")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn every_op() -> Vec<Op> {
        vec![
            Op::Claim(ClaimOp {
                key: b("k"),
                lease_ms: 30_000,
                retain_ms: 86_400_000,
                fingerprint: Some(b("fp")),
                on_expire: OnExpire::Recover,
                attempt: Some(b("a-1")),
            }),
            Op::Claim(ClaimOp {
                key: b("k2"),
                lease_ms: 1,
                retain_ms: 2,
                fingerprint: None,
                on_expire: OnExpire::Free,
                attempt: None,
            }),
            Op::Complete(Complete {
                key: b("k"),
                fence: 7,
                value: Bytes::from(vec![0u8; 1000]),
                retain_ms: Some(5),
                error: true,
            }),
            Op::Complete(Complete {
                key: b("k"),
                fence: 7,
                value: Bytes::new(),
                retain_ms: None,
                error: false,
            }),
            Op::Renew(Renew {
                key: b("k"),
                fence: 3,
                lease_ms: 9,
            }),
            Op::Journal(Journal {
                key: b("k"),
                fence: 3,
                journal: b("step"),
            }),
            Op::Release(Release {
                key: b("k"),
                fence: 3,
            }),
            Op::Abandon(Abandon {
                key: b("k"),
                fence: 3,
            }),
            Op::Forget(Forget { key: b("k") }),
            Op::Expire {
                keys: vec![b("a"), b("bb")],
            },
            Op::Expire { keys: vec![] },
            Op::SetLimits(MemoryLimits {
                max_memory_bytes: 1 << 30,
                headroom_bytes: 1 << 20,
            }),
        ]
    }

    #[test]
    fn every_op_round_trips() {
        let entry = Entry {
            stamp_ms: 1_700_000_000_123,
            ops: every_op(),
        };
        // Every variant is covered (a new op must be added here).
        for op in &entry.ops {
            match op {
                Op::Claim(_)
                | Op::Complete(_)
                | Op::Renew(_)
                | Op::Journal(_)
                | Op::Release(_)
                | Op::Abandon(_)
                | Op::Forget(_)
                | Op::Expire { .. }
                | Op::SetLimits(_) => {}
            }
        }
        let mut out = Vec::new();
        encode_entry(&entry, &mut out);
        assert_eq!(decode_entry(Bytes::from(out.clone())).unwrap(), entry);
        // Every cut short is refused, never misread.
        for cut in 0..out.len() {
            assert!(decode_entry(Bytes::copy_from_slice(&out[..cut])).is_err());
            assert_eq!(
                check_entry(&out[..cut]),
                decode_entry(Bytes::copy_from_slice(&out[..cut])).map(drop)
            );
        }
        assert_eq!(check_entry(&out), Ok(()));
        // Whatever a byte is changed to, the check says what decoding does.
        for at in 0..out.len() {
            for v in [0u8, 1, 2, 9, 10, 0x7f, 0xff] {
                let mut changed = out.clone();
                changed[at] = v;
                assert_eq!(
                    check_entry(&changed),
                    decode_entry(Bytes::from(changed.clone())).map(drop),
                    "byte {at} set to {v}"
                );
            }
        }
    }

    #[test]
    fn newer_formats_and_rules_are_refused() {
        let mut out = Vec::new();
        encode_entry(
            &Entry {
                stamp_ms: 1,
                ops: vec![],
            },
            &mut out,
        );
        let mut newer = out.clone();
        newer[0] = 2;
        assert_eq!(decode_entry(Bytes::from(newer)), Err(CodecError::Format(2)));
        let mut rules = out.clone();
        rules[1] = 2;
        assert_eq!(
            decode_entry(Bytes::from(rules)),
            Err(CodecError::StateMachine(2))
        );
    }
}
