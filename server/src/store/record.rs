//! One key's record, packed: a 40-byte slab slot plus one exact-size
//! allocation holding its variable-length fields.
//!
//! The allocation holds `[retain_ms] key | fingerprint | attempt | body`.
//! `retain_ms` (4 bytes) is present only while the record is in flight or
//! abandoned: a completed record no longer needs it. The body (the journal,
//! then the value) is stored inline when it is small; a body over
//! [`LARGE_BODY`] bytes lives in the slab's side table as shared `Bytes`, so
//! replies and woken waiters share it without copies.

use bytes::Bytes;
use idem_protocol::{OnExpire, Outcome};

/// Bodies longer than this are kept as shared `Bytes` beside the record.
pub(crate) const LARGE_BODY: usize = 512;

/// Bytes a record costs beyond its data, counted against
/// `max_memory_bytes` (slab slot, index bucket, allocator rounding).
pub(crate) const RECORD_OVERHEAD: usize = 64;

/// The state of a present record (absent records are not stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    InFlight,
    Abandoned,
    Completed(Outcome),
}

const STATE_MASK: u8 = 0b11;
const ST_IN_FLIGHT: u8 = 0;
const ST_ABANDONED: u8 = 1;
const ST_DONE_OK: u8 = 2;
const ST_DONE_ERR: u8 = 3;
const RECOVER_ON_EXPIRY: u8 = 1 << 2;
const RECOVERED: u8 = 1 << 3;
const HAS_FP: u8 = 1 << 4;
const HAS_ATTEMPT: u8 = 1 << 5;
const LARGE: u8 = 1 << 6;

/// Asks the CPU to start loading the cache line at `p` into its caches: a
/// hint that changes no result (a no-op where not supported). Loops that
/// read records in an order of their own (a snapshot's key order) wait for
/// memory on nearly every record otherwise, one at a time.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch neither reads nor writes anything the program
    // sees and never faults, whatever the address.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A record (see the module docs for the layout of `data`).
#[derive(Debug, Clone)]
pub(crate) struct Record {
    data: Box<[u8]>,
    pub(crate) fence: u64,
    /// In flight: lease deadline. Completed or abandoned: drop deadline.
    pub(crate) deadline: u64,
    key_len: u16,
    fp_len: u16,
    attempt_len: u8,
    flags: u8,
}

/// The variable-length parts of a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) fingerprint: Option<&'a [u8]>,
    pub(crate) attempt: Option<&'a [u8]>,
}

impl Record {
    /// Builds a record. `retain_ms` is kept unless the state is completed;
    /// `body` is stored inline (the caller keeps large bodies aside).
    /// Lengths must fit the fields: the configuration bounds keys and
    /// fingerprints to 65535 bytes and attempt ids to 255.
    pub(crate) fn new(
        parts: Parts<'_>,
        state: State,
        retain_ms: u32,
        inline_body: &[u8],
        flags: u8,
    ) -> Record {
        let fp = parts.fingerprint.unwrap_or_default();
        let at = parts.attempt.unwrap_or_default();
        let prefix = if matches!(state, State::Completed(_)) {
            0
        } else {
            4
        };
        let mut v =
            Vec::with_capacity(prefix + parts.key.len() + fp.len() + at.len() + inline_body.len());
        if prefix > 0 {
            v.extend_from_slice(&retain_ms.to_le_bytes());
        }
        v.extend_from_slice(parts.key);
        v.extend_from_slice(fp);
        v.extend_from_slice(at);
        v.extend_from_slice(inline_body);
        let mut flags = flags & (RECOVER_ON_EXPIRY | RECOVERED | LARGE);
        if parts.fingerprint.is_some() {
            flags |= HAS_FP;
        }
        if parts.attempt.is_some() {
            flags |= HAS_ATTEMPT;
        }
        let mut rec = Record {
            data: v.into_boxed_slice(),
            fence: 0,
            deadline: 0,
            key_len: parts.key.len() as u16,
            fp_len: fp.len() as u16,
            attempt_len: at.len() as u8,
            flags,
        };
        rec.set_state(state);
        rec
    }

    /// A copy of this record's identity with a new state, retention,
    /// attempt and inline body, keeping fence, deadline and flags.
    pub(crate) fn rebuilt(
        &self,
        state: State,
        retain_ms: u32,
        attempt: Option<&[u8]>,
        inline_body: &[u8],
        large: bool,
    ) -> Record {
        let p = self.parts();
        let mut flags = self.flags & (RECOVER_ON_EXPIRY | RECOVERED);
        if large {
            flags |= LARGE;
        }
        let mut rec = Record::new(
            Parts {
                key: p.key,
                fingerprint: p.fingerprint,
                attempt,
            },
            state,
            retain_ms,
            inline_body,
            flags,
        );
        rec.fence = self.fence;
        rec.deadline = self.deadline;
        rec
    }

    /// Asks the CPU to start loading this record's variable-length bytes
    /// (its key first): a hint for a loop that reads records out of slab
    /// order, issued some records ahead.
    pub(crate) fn prefetch_data(&self) {
        prefetch(self.data.as_ptr());
    }

    fn prefix(&self) -> usize {
        if matches!(self.state(), State::Completed(_)) {
            0
        } else {
            4
        }
    }

    pub(crate) fn parts(&self) -> Parts<'_> {
        let k0 = self.prefix();
        let k = k0 + self.key_len as usize;
        let f = k + self.fp_len as usize;
        let a = f + self.attempt_len as usize;
        Parts {
            key: &self.data[k0..k],
            fingerprint: (self.flags & HAS_FP != 0).then(|| &self.data[k..f]),
            attempt: (self.flags & HAS_ATTEMPT != 0).then(|| &self.data[f..a]),
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        let k0 = self.prefix();
        &self.data[k0..k0 + self.key_len as usize]
    }

    /// The inline body (empty when the body is large and kept aside).
    pub(crate) fn inline_body(&self) -> &[u8] {
        let start = self.prefix()
            + self.key_len as usize
            + self.fp_len as usize
            + self.attempt_len as usize;
        &self.data[start..]
    }

    /// Whether the body is kept aside as shared bytes.
    pub(crate) fn is_large(&self) -> bool {
        self.flags & LARGE != 0
    }

    /// The retention asked for by the claim (ms): used by COMPLETE without
    /// RETAIN and for how long an abandoned record is kept. Zero once
    /// completed (no longer needed).
    pub(crate) fn retain_ms(&self) -> u32 {
        match self.data.get(..4) {
            Some(b) if self.prefix() == 4 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            _ => 0,
        }
    }

    pub(crate) fn state(&self) -> State {
        match self.flags & STATE_MASK {
            ST_IN_FLIGHT => State::InFlight,
            ST_ABANDONED => State::Abandoned,
            ST_DONE_OK => State::Completed(Outcome::Ok),
            _ => State::Completed(Outcome::Err),
        }
    }

    /// Moves between in flight and abandoned (both keep `retain_ms`). A
    /// move to or from completed goes through [`Record::rebuilt`].
    pub(crate) fn set_state(&mut self, s: State) {
        let bits = match s {
            State::InFlight => ST_IN_FLIGHT,
            State::Abandoned => ST_ABANDONED,
            State::Completed(Outcome::Ok) => ST_DONE_OK,
            State::Completed(Outcome::Err) => ST_DONE_ERR,
        };
        self.flags = (self.flags & !STATE_MASK) | bits;
    }

    pub(crate) fn on_expire(&self) -> OnExpire {
        if self.flags & RECOVER_ON_EXPIRY != 0 {
            OnExpire::Recover
        } else {
            OnExpire::Free
        }
    }

    pub(crate) fn set_on_expire(&mut self, p: OnExpire) {
        self.flags &= !RECOVER_ON_EXPIRY;
        if p == OnExpire::Recover {
            self.flags |= RECOVER_ON_EXPIRY;
        }
    }

    pub(crate) fn recovered(&self) -> bool {
        self.flags & RECOVERED != 0
    }

    pub(crate) fn set_recovered(&mut self, yes: bool) {
        if yes {
            self.flags |= RECOVERED;
        } else {
            self.flags &= !RECOVERED;
        }
    }

    /// Bytes of the allocation.
    pub(crate) fn data_len(&self) -> usize {
        self.data.len()
    }

    /// Whether the fingerprint of a new request conflicts with the record's:
    /// both are present and differ. A request without a fingerprint is not
    /// checked; a record created without one accepts any.
    pub(crate) fn mismatches(&self, fp: Option<&Bytes>) -> bool {
        matches!((self.parts().fingerprint, fp), (Some(a), Some(b)) if a != &b[..])
    }

    pub(crate) fn attempt_is(&self, attempt: Option<&Bytes>) -> bool {
        matches!((self.parts().attempt, attempt), (Some(a), Some(b)) if a == &b[..])
    }
}

/// The flags of a record restored from a snapshot.
pub(crate) fn restored_flags(on_expire: OnExpire, recovered: bool, large: bool) -> u8 {
    let mut f = initial_flags(on_expire);
    if recovered {
        f |= RECOVERED;
    }
    if large {
        f |= LARGE;
    }
    f
}

/// The flags a new record starts with.
pub(crate) fn initial_flags(on_expire: OnExpire) -> u8 {
    if on_expire == OnExpire::Recover {
        RECOVER_ON_EXPIRY
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_small() {
        assert_eq!(std::mem::size_of::<Record>(), 40);
        assert_eq!(std::mem::size_of::<Option<Record>>(), 40);
    }

    #[test]
    fn parts_round_trip() {
        let p = Parts {
            key: b"key",
            fingerprint: Some(b"fp"),
            attempt: None,
        };
        let r = Record::new(
            p,
            State::InFlight,
            1234,
            b"",
            initial_flags(OnExpire::Recover),
        );
        assert_eq!(r.key(), b"key");
        assert_eq!(r.parts().fingerprint, Some(&b"fp"[..]));
        assert_eq!(r.parts().attempt, None);
        assert_eq!(r.retain_ms(), 1234);
        assert_eq!(r.on_expire(), OnExpire::Recover);
        let j = r.rebuilt(State::InFlight, 1234, Some(b"att"), b"journal", false);
        assert_eq!(j.parts().attempt, Some(&b"att"[..]));
        assert_eq!(j.inline_body(), b"journal");
        assert_eq!(j.retain_ms(), 1234);
        let done = j.rebuilt(State::Completed(Outcome::Err), 0, None, b"value", false);
        assert_eq!(done.key(), b"key");
        assert_eq!(done.parts().fingerprint, Some(&b"fp"[..]));
        assert_eq!(done.inline_body(), b"value");
        assert_eq!(done.retain_ms(), 0);
        assert_eq!(done.data_len(), 3 + 2 + 5);
        assert_eq!(done.state(), State::Completed(Outcome::Err));
        assert_eq!(done.on_expire(), OnExpire::Recover);
    }
}
