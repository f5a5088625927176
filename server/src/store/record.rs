//! One key's record, packed: 48 bytes in the shard's slab plus one
//! allocation holding its variable-length fields.

use std::sync::Arc;

use bytes::Bytes;
use idem_protocol::{OnExpire, Outcome, RecordInfo, RecordState};

/// Bytes a record costs beyond its data allocation, counted against
/// `max_memory_bytes` (slab slot, index bucket, allocation header).
pub(crate) const RECORD_OVERHEAD: usize = 80;

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

/// A record. `data` holds `key | fingerprint | attempt | body`, where the
/// body is the value once completed and the journal before.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    data: Arc<[u8]>,
    pub(crate) fence: u64,
    /// In flight: lease deadline. Completed or abandoned: drop deadline.
    pub(crate) deadline: u64,
    /// The retention asked for by the claim (ms), used by COMPLETE without
    /// RETAIN and for how long an abandoned record is kept.
    pub(crate) retain_ms: u32,
    key_len: u16,
    fp_len: u16,
    attempt_len: u8,
    flags: u8,
}

/// The variable-length parts of a record.
pub(crate) struct Parts<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) fingerprint: Option<&'a [u8]>,
    pub(crate) attempt: Option<&'a [u8]>,
    pub(crate) body: &'a [u8],
}

fn pack(p: &Parts<'_>) -> Arc<[u8]> {
    let fp = p.fingerprint.unwrap_or_default();
    let at = p.attempt.unwrap_or_default();
    let mut v = Vec::with_capacity(p.key.len() + fp.len() + at.len() + p.body.len());
    v.extend_from_slice(p.key);
    v.extend_from_slice(fp);
    v.extend_from_slice(at);
    v.extend_from_slice(p.body);
    Arc::from(v)
}

impl Record {
    /// A new in-flight record. Lengths must fit the record's fields (the
    /// configuration bounds keys to 64 KiB, fingerprints to 64 KiB and
    /// attempt ids to 255 bytes).
    pub(crate) fn in_flight(
        parts: Parts<'_>,
        fence: u64,
        deadline: u64,
        retain_ms: u32,
        on_expire: OnExpire,
    ) -> Record {
        let mut flags = ST_IN_FLIGHT;
        if on_expire == OnExpire::Recover {
            flags |= RECOVER_ON_EXPIRY;
        }
        if parts.fingerprint.is_some() {
            flags |= HAS_FP;
        }
        if parts.attempt.is_some() {
            flags |= HAS_ATTEMPT;
        }
        Record {
            key_len: parts.key.len() as u16,
            fp_len: parts.fingerprint.map_or(0, <[u8]>::len) as u16,
            attempt_len: parts.attempt.map_or(0, <[u8]>::len) as u8,
            data: pack(&parts),
            fence,
            deadline,
            retain_ms,
            flags,
        }
    }

    pub(crate) fn parts(&self) -> Parts<'_> {
        let k = self.key_len as usize;
        let f = k + self.fp_len as usize;
        let a = f + self.attempt_len as usize;
        Parts {
            key: &self.data[..k],
            fingerprint: (self.flags & HAS_FP != 0).then(|| &self.data[k..f]),
            attempt: (self.flags & HAS_ATTEMPT != 0).then(|| &self.data[f..a]),
            body: &self.data[a..],
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.data[..self.key_len as usize]
    }

    /// The body (value or journal) as shared bytes: no copy, the reply
    /// holds a reference to the record's allocation.
    pub(crate) fn body(&self) -> Bytes {
        let start = self.key_len as usize + self.fp_len as usize + self.attempt_len as usize;
        if start == self.data.len() {
            return Bytes::new();
        }
        Bytes::from_owner(Arc::clone(&self.data)).slice(start..)
    }

    pub(crate) fn state(&self) -> State {
        match self.flags & STATE_MASK {
            ST_IN_FLIGHT => State::InFlight,
            ST_ABANDONED => State::Abandoned,
            ST_DONE_OK => State::Completed(Outcome::Ok),
            _ => State::Completed(Outcome::Err),
        }
    }

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

    /// Replaces the body (journal or value), keeping key and fingerprint;
    /// `attempt` replaces the attempt id.
    pub(crate) fn rewrite(&mut self, attempt: Option<&[u8]>, body: &[u8]) {
        let p = self.parts();
        let data = pack(&Parts {
            key: p.key,
            fingerprint: p.fingerprint,
            attempt,
            body,
        });
        self.attempt_len = attempt.map_or(0, <[u8]>::len) as u8;
        if attempt.is_some() {
            self.flags |= HAS_ATTEMPT;
        } else {
            self.flags &= !HAS_ATTEMPT;
        }
        self.data = data;
    }

    /// A takeover of an abandoned record: new fence, lease, policy, attempt.
    pub(crate) fn take_over(
        &mut self,
        fence: u64,
        deadline: u64,
        retain_ms: u32,
        on_expire: OnExpire,
        attempt: Option<&[u8]>,
    ) {
        let journal = self.body();
        self.rewrite(attempt, &journal);
        self.fence = fence;
        self.deadline = deadline;
        self.retain_ms = retain_ms;
        self.flags &= !RECOVER_ON_EXPIRY;
        if on_expire == OnExpire::Recover {
            self.flags |= RECOVER_ON_EXPIRY;
        }
        self.set_state(State::InFlight);
        self.set_recovered(true);
    }

    /// Bytes counted against the memory limit.
    pub(crate) fn cost(&self) -> usize {
        RECORD_OVERHEAD + self.data.len()
    }

    /// What INSPECT shows at `now`.
    pub(crate) fn info(&self, now: u64) -> RecordInfo {
        let left = self.deadline.saturating_sub(now);
        let p = self.parts();
        let attempt = p.attempt.map(Bytes::copy_from_slice);
        let fingerprint = p.fingerprint.map(Bytes::copy_from_slice);
        let (state, lease_ms, retain_ms, outcome, value, journal, attempt) = match self.state() {
            State::InFlight => (
                RecordState::InFlight,
                Some(left),
                None,
                None,
                None,
                Some(self.body()),
                attempt,
            ),
            State::Abandoned => (
                RecordState::Abandoned,
                None,
                Some(left),
                None,
                None,
                Some(self.body()),
                attempt,
            ),
            State::Completed(o) => (
                RecordState::Completed,
                None,
                Some(left),
                Some(o),
                Some(self.body()),
                None,
                None,
            ),
        };
        RecordInfo {
            state,
            fence: self.fence,
            lease_ms,
            retain_ms,
            outcome,
            value,
            fingerprint,
            journal,
            attempt,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_small() {
        assert_eq!(std::mem::size_of::<Record>(), 48);
        assert_eq!(std::mem::size_of::<Option<Record>>(), 48);
    }

    #[test]
    fn parts_round_trip() {
        let mut r = Record::in_flight(
            Parts {
                key: b"key",
                fingerprint: Some(b"fp"),
                attempt: None,
                body: b"",
            },
            7,
            100,
            5,
            OnExpire::Recover,
        );
        assert_eq!(r.key(), b"key");
        assert_eq!(r.parts().fingerprint, Some(&b"fp"[..]));
        assert_eq!(r.parts().attempt, None);
        assert!(r.body().is_empty());
        assert_eq!(r.on_expire(), OnExpire::Recover);
        r.rewrite(Some(b"att"), b"journal");
        assert_eq!(r.parts().attempt, Some(&b"att"[..]));
        assert_eq!(&r.body()[..], b"journal");
        assert_eq!(r.parts().fingerprint, Some(&b"fp"[..]));
        r.set_state(State::Completed(Outcome::Err));
        assert_eq!(r.state(), State::Completed(Outcome::Err));
        assert_eq!(r.on_expire(), OnExpire::Recover);
        r.take_over(9, 200, 6, OnExpire::Free, None);
        assert_eq!(
            (r.fence, r.state(), r.recovered(), r.on_expire()),
            (9, State::InFlight, true, OnExpire::Free)
        );
        assert_eq!(&r.body()[..], b"journal");
    }
}
