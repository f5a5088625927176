//! The replicated input of the store and what applying it returns.
//!
//! An [`Op`] is what replicas agree on: every default is resolved by the
//! node that accepted the command (lease, retention, expiry policy), there
//! is no WAIT (waiting happens beside the store, on the node that holds the
//! connection), and nothing of the node's configuration is needed to apply
//! it. An [`Entry`] is a batch of ops stamped with one time; a replicated
//! engine logs entries, the memory engine applies one op at a time.
//!
//! Reads ([`Read`]) are not ops: they never change the store.

use bytes::Bytes;
use idem_protocol::cmd::{Abandon, Complete, Forget, Journal, Release, Renew};
use idem_protocol::{Command, OnExpire, Reply};
use smallvec::SmallVec;

/// A `CLAIM` with its defaults resolved and without `WAIT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOp {
    /// The key.
    pub key: Bytes,
    /// Lease length in ms.
    pub lease_ms: u64,
    /// Retention of the completed (or abandoned) record in ms.
    pub retain_ms: u64,
    /// Request fingerprint.
    pub fingerprint: Option<Bytes>,
    /// What a lapsed lease leaves behind.
    pub on_expire: OnExpire,
    /// The attempt id (for retries after a lost reply).
    pub attempt: Option<Bytes>,
}

/// The memory limits every replica applies, set through the log
/// ([`Op::SetLimits`]) so that `-OOM` is decided from replicated state only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Accounted bytes at which fresh claims are refused.
    pub max_memory_bytes: u64,
    /// Bytes beyond `max_memory_bytes` within which owners already in
    /// flight may still COMPLETE, JOURNAL or take over an abandoned key.
    pub headroom_bytes: u64,
}

impl MemoryLimits {
    /// No limit at all (a new store, until limits are applied).
    pub const UNLIMITED: MemoryLimits = MemoryLimits {
        max_memory_bytes: u64::MAX,
        headroom_bytes: 0,
    };
}

/// A replicated operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// `CLAIM`, defaults resolved.
    Claim(ClaimOp),
    /// `COMPLETE`.
    Complete(Complete),
    /// `RENEW`.
    Renew(Renew),
    /// `JOURNAL`.
    Journal(Journal),
    /// `RELEASE`.
    Release(Release),
    /// `ABANDON`.
    Abandon(Abandon),
    /// `FORGET`.
    Forget(Forget),
    /// Applies the deadlines of these keys that have passed at the entry's
    /// stamp (each one re-checked: a key renewed or completed meanwhile is
    /// left alone). The proposer picks the keys, at most `expire_batch`.
    Expire {
        /// The keys to look at.
        keys: Vec<Bytes>,
    },
    /// Sets the memory limits.
    SetLimits(MemoryLimits),
}

/// The node-local defaults an accepting node resolves into an [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// Lease when CLAIM gives no LEASE, ms.
    pub lease_ms: u64,
    /// Retention when CLAIM gives no RETAIN, ms.
    pub retain_ms: u64,
}

impl Op {
    /// The op for a record command that changes the store, with `defaults`
    /// resolved (a CLAIM's WAIT is dropped). `None` for reads (SETTLE,
    /// INSPECT) and for commands that are not about records.
    pub fn from_command(cmd: Command, defaults: &Defaults) -> Option<Op> {
        Some(match cmd {
            Command::Claim(c) => Op::Claim(ClaimOp {
                key: c.key,
                lease_ms: c.lease_ms.unwrap_or(defaults.lease_ms),
                retain_ms: c.retain_ms.unwrap_or(defaults.retain_ms),
                fingerprint: c.fingerprint,
                on_expire: c.on_expire.unwrap_or_default(),
                attempt: c.attempt,
            }),
            Command::Complete(c) => Op::Complete(c),
            Command::Renew(c) => Op::Renew(c),
            Command::Journal(c) => Op::Journal(c),
            Command::Release(c) => Op::Release(c),
            Command::Abandon(c) => Op::Abandon(c),
            Command::Forget(c) => Op::Forget(c),
            _ => return None,
        })
    }

    /// The key of a single-key op.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Op::Claim(c) => Some(&c.key),
            Op::Complete(c) => Some(&c.key),
            Op::Renew(c) => Some(&c.key),
            Op::Journal(c) => Some(&c.key),
            Op::Release(c) => Some(&c.key),
            Op::Abandon(c) => Some(&c.key),
            Op::Forget(c) => Some(&c.key),
            Op::Expire { .. } | Op::SetLimits(_) => None,
        }
    }
}

/// A batch of ops stamped with one time (ms since the Unix epoch, by the
/// node that proposed it). The store's clock is `max(clock, stamp_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When the entry was proposed.
    pub stamp_ms: u64,
    /// The ops, applied in order.
    pub ops: Vec<Op>,
}

/// A key waiters must look at again: it left the in-flight state
/// (completed, released, abandoned, forgotten or lapsed) or its owner
/// shortened its lease (a RENEW to less than was left); and the apply index
/// at which that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEvent {
    /// The key.
    pub key: Bytes,
    /// The index of the op that changed it.
    pub index: u64,
}

/// Key events of one op (most ops have at most one).
pub type KeyEvents = SmallVec<[KeyEvent; 1]>;

/// The result of applying one op.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The reply to send.
    pub reply: Reply,
    /// Keys that left the in-flight state: their waiters must be served.
    pub events: KeyEvents,
    /// The apply index of the op: every key an op touches takes the next
    /// number of the store's apply sequence; this is the last one.
    pub index: u64,
}

/// A read: answered from the store as it is, never changing it.
#[derive(Debug, Clone, Copy)]
pub enum Read<'a> {
    /// `SETTLE key` (without WAIT).
    Settle(&'a Bytes),
    /// `INSPECT key`.
    Inspect(&'a Bytes),
    /// What a CLAIM would answer without changing anything: a replay, a
    /// mismatch or INFLIGHT; or nothing when it would take the key.
    Claim(&'a ClaimOp),
}

/// What a [`Read`] saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The reply; `None` for a [`Read::Claim`] that would change the store.
    pub reply: Option<Reply>,
    /// A deadline of the key had passed without being applied yet: the
    /// reply shows the key as it will be once it is (an `Op::Expire` of the
    /// key applies it).
    pub due: bool,
    /// The store's apply index when the key was read: any later change of
    /// the key has a larger index.
    pub index: u64,
}
