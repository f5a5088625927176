//! One key's record and the rules that move it between states.

use bytes::Bytes;
use idem_protocol::{OnExpire, Outcome, RecordInfo, RecordState};

/// Bytes a record costs beyond its variable-length fields, counted against
/// `max_memory_bytes` (table slot, heap entry, allocation headers).
pub(crate) const RECORD_OVERHEAD: usize = 160;

/// The state of a present record (absent records are not stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    InFlight,
    Abandoned,
    Completed(Outcome),
}

/// A record in a shard's table.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) key: Bytes,
    /// The table hash of `key` (kept to rehash and to find the record from
    /// the expiry heap without hashing again).
    pub(crate) hash: u64,
    pub(crate) fence: u64,
    pub(crate) state: State,
    /// In flight: lease deadline. Completed or abandoned: drop deadline.
    pub(crate) deadline: u64,
    /// The deadline of this record's live entry in the expiry heap.
    pub(crate) heap_at: u64,
    /// Completed: the value. Otherwise: the journal.
    pub(crate) body: Bytes,
    pub(crate) fingerprint: Option<Bytes>,
    pub(crate) attempt: Option<Bytes>,
    pub(crate) on_expire: OnExpire,
    /// The retention asked for by the claim, used by COMPLETE without RETAIN
    /// and for how long an abandoned record is kept.
    pub(crate) retain_ms: u64,
    /// This ownership was granted by taking over an abandoned record (a
    /// retried claim of the same attempt is answered RECOVER again).
    pub(crate) recovered: bool,
}

impl Record {
    /// Bytes counted against the memory limit.
    pub(crate) fn cost(&self) -> usize {
        RECORD_OVERHEAD
            + self.key.len()
            + self.body.len()
            + self.fingerprint.as_ref().map_or(0, Bytes::len)
            + self.attempt.as_ref().map_or(0, Bytes::len)
    }

    /// What INSPECT shows at `now`.
    pub(crate) fn info(&self, now: u64) -> RecordInfo {
        let left = self.deadline.saturating_sub(now);
        let (state, lease_ms, retain_ms, outcome, value, journal, attempt) = match self.state {
            State::InFlight => (
                RecordState::InFlight,
                Some(left),
                None,
                None,
                None,
                Some(self.body.clone()),
                self.attempt.clone(),
            ),
            State::Abandoned => (
                RecordState::Abandoned,
                None,
                Some(left),
                None,
                None,
                Some(self.body.clone()),
                self.attempt.clone(),
            ),
            State::Completed(o) => (
                RecordState::Completed,
                None,
                Some(left),
                Some(o),
                Some(self.body.clone()),
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
            fingerprint: self.fingerprint.clone(),
            journal,
            attempt,
        }
    }

    /// Whether the fingerprint of a new request conflicts with the record's:
    /// both are present and differ. A request without a fingerprint is not
    /// checked; a record created without one accepts any.
    pub(crate) fn mismatches(&self, fp: Option<&Bytes>) -> bool {
        matches!((&self.fingerprint, fp), (Some(a), Some(b)) if a != b)
    }
}

/// Copies client bytes into an allocation of their own, so a stored record
/// never pins the (much larger) read buffer it was parsed from.
pub(crate) fn own(b: &Bytes) -> Bytes {
    Bytes::copy_from_slice(b)
}
