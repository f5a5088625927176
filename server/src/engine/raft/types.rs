//! The Raft type configuration: what a log entry carries and what applying
//! it answers.

use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::store::codec::{
    CodecError, check_entry, check_entry_header, decode_entry, encode_entry,
};
use crate::store::{Applied, Entry};

/// A batch of ops stamped by the leader: the application data of one Raft
/// log entry, held in the store's own versioned entry format
/// ([`crate::store::codec`]).
///
/// It stays encoded on its way through the log and to the followers: the
/// leader encodes it once, as it proposes it, and every node decodes it
/// once, as it applies it ([`Batch::entry`]). Reading entries back from the
/// log to replicate them, and receiving them, shares the bytes they were
/// read from ([`decode_sharing`]) instead of copying them. Decoding one
/// checks only its header (format and state-machine version); the peer
/// connection also walks every batch a peer sends ([`Batch::check`]), so
/// an entry this build cannot apply is refused before it is appended.
#[derive(Clone, PartialEq, Eq)]
pub struct Batch(Bytes);

impl Batch {
    /// Encodes `entry`.
    pub fn new(entry: &Entry) -> Batch {
        let mut out = Vec::with_capacity(16 + entry.ops.len() * 64);
        encode_entry(entry, &mut out);
        Batch(Bytes::from(out))
    }

    /// Decodes the batch (keys and values share its bytes).
    ///
    /// # Errors
    ///
    /// The entry is malformed (it passed the header check, so only a
    /// damaged or wrongly built entry fails here).
    pub fn entry(&self) -> Result<Entry, CodecError> {
        decode_entry(self.0.clone())
    }

    /// Whether [`Batch::entry`] decodes it, without decoding it.
    ///
    /// # Errors
    ///
    /// The error [`Batch::entry`] gives.
    pub fn check(&self) -> Result<(), CodecError> {
        check_entry(&self.0)
    }

    /// How many commands the batch holds (read from its header; 0 if the
    /// header is cut short).
    pub fn op_count(&self) -> u32 {
        // u8 format version, u16 state machine version, u64 stamp, then
        // u32 op count (see the store's codec).
        self.0
            .get(11..15)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The encoded bytes.
    pub fn encoded(&self) -> &Bytes {
        &self.0
    }

    /// A batch of `encoded`, unchecked: a test's damaged entry.
    #[cfg(test)]
    pub(crate) fn unchecked(encoded: Bytes) -> Batch {
        Batch(encoded)
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Ok(entry) => f.debug_tuple("Batch").field(&entry).finish(),
            Err(e) => write!(f, "Batch({} bytes: {e})", self.0.len()),
        }
    }
}

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

/// About how many bytes `entry` takes encoded (postcard): its batch's and
/// room for the log id and the rest, so a buffer of this capacity is
/// seldom grown.
pub fn encoded_size_hint(entry: &LogEntry) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(batch) => batch.0.len() + 64,
        openraft::EntryPayload::Blank => 64,
        openraft::EntryPayload::Membership(_) => 512,
    }
}

thread_local! {
    /// The buffer [`decode_sharing`] is decoding from, on this thread.
    static SHARED_SOURCE: std::cell::RefCell<Option<Bytes>> =
        const { std::cell::RefCell::new(None) };
}

/// Decodes `T` from `bytes` (postcard), every [`Batch`] in it sharing
/// `bytes` rather than copying its part.
///
/// # Errors
///
/// What postcard returns.
pub fn decode_sharing<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> postcard::Result<T> {
    struct Reset(Option<Bytes>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let previous = self.0.take();
            SHARED_SOURCE.with(|s| *s.borrow_mut() = previous);
        }
    }
    let _reset = Reset(SHARED_SOURCE.with(|s| s.borrow_mut().replace(bytes.clone())));
    postcard::from_bytes(bytes)
}

/// `v` as a share of the buffer [`decode_sharing`] decodes from, if it
/// lies within it; else a copy.
fn shared_or_copied(v: &[u8]) -> Bytes {
    SHARED_SOURCE.with(|s| {
        let source = s.borrow();
        match source.as_ref() {
            Some(b)
                if !v.is_empty()
                    && b.as_ptr() <= v.as_ptr()
                    && v.as_ptr() as usize + v.len() <= b.as_ptr() as usize + b.len() =>
            {
                b.slice_ref(v)
            }
            _ => Bytes::copy_from_slice(v),
        }
    })
}

struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = Batch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an encoded Idem entry")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Batch, E> {
        check_entry_header(v).map_err(E::custom)?;
        Ok(Batch(shared_or_copied(v)))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Batch, E> {
        check_entry_header(&v).map_err(E::custom)?;
        Ok(Batch(Bytes::from(v)))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Batch, A::Error> {
        let mut v = Vec::new();
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        self.visit_byte_buf(v)
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Batch, D::Error> {
        d.deserialize_bytes(BatchVisitor)
    }
}

/// What applying a batch answered, op by op. It stays on the node that
/// applied it (it is handed to the proposer), so it is never serialized
/// with content.
#[derive(Debug, Clone, Default)]
pub struct Replies(pub Vec<Applied>);

impl Serialize for Replies {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for Replies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Replies, D::Error> {
        <()>::deserialize(d)?;
        Ok(Replies::default())
    }
}

openraft::declare_raft_types!(
    /// Idem's Raft types.
    pub TypeConfig:
        D = Batch,
        R = Replies,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = super::snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node id.
pub type NodeId = u64;
/// A Raft log entry.
pub type LogEntry = openraft::Entry<TypeConfig>;
/// A storage error.
pub type StorageError = openraft::StorageError<NodeId>;
/// A log id.
pub type LogId = openraft::LogId<NodeId>;
/// A vote.
pub type Vote = openraft::Vote<NodeId>;
/// Membership as stored.
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

/// A storage error made by `kind` (e.g. `StorageIOError::write_logs`)
/// from anything displayable.
pub fn storage_err(
    kind: fn(openraft::AnyError) -> openraft::StorageIOError<NodeId>,
    e: impl fmt::Display,
) -> StorageError {
    StorageError::IO {
        source: kind(openraft::AnyError::error(e)),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use idem_protocol::Command;
    use idem_protocol::cmd::Claim;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    use super::{Batch, LogEntry, decode_sharing};
    use crate::store::codec::{CodecError, ENTRY_FORMAT, STATE_MACHINE_VERSION};
    use crate::store::{Defaults, Entry, Op};

    fn entry(keys: &[&str]) -> Entry {
        let defaults = Defaults {
            lease_ms: 1_000,
            retain_ms: 5_000,
        };
        Entry {
            stamp_ms: 42,
            ops: keys
                .iter()
                .map(|k| {
                    Op::from_command(
                        Command::Claim(Claim::new(Bytes::from(k.to_string()))),
                        &defaults,
                    )
                    .unwrap()
                })
                .collect(),
        }
    }

    fn log_entry(batch: Batch) -> LogEntry {
        openraft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), 7),
            payload: EntryPayload::Normal(batch),
        }
    }

    fn batch_of(e: &LogEntry) -> &Batch {
        match &e.payload {
            EntryPayload::Normal(b) => b,
            _ => panic!("not a batch"),
        }
    }

    fn within(part: &Bytes, whole: &Bytes) -> bool {
        let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
        p >= w && p + part.len() <= w + whole.len()
    }

    #[test]
    fn a_batch_tells_its_command_count_from_its_header() {
        assert_eq!(Batch::new(&entry(&["a", "b", "c"])).op_count(), 3);
        assert_eq!(Batch::new(&entry(&[])).op_count(), 0);
        assert_eq!(Batch::unchecked(Bytes::from_static(b"\x01")).op_count(), 0);
    }

    #[test]
    fn a_batch_decodes_to_the_entry_it_was_made_of() {
        let e = entry(&["a", "bb", "ccc"]);
        let batch = Batch::new(&e);
        assert_eq!(batch.entry().unwrap(), e);
        let encoded = Bytes::from(postcard::to_allocvec(&log_entry(batch.clone())).unwrap());
        let back: LogEntry = decode_sharing(&encoded).unwrap();
        assert_eq!(batch_of(&back), &batch);
        assert_eq!(batch_of(&back).entry().unwrap(), e);
        assert_eq!(back.log_id.index, 7);
    }

    #[test]
    fn decoding_shares_the_source_bytes_and_copies_only_without_one() {
        let encoded = Bytes::from(
            postcard::to_allocvec(&log_entry(Batch::new(&entry(&["k1", "k2"])))).unwrap(),
        );
        let shared: LogEntry = decode_sharing(&encoded).unwrap();
        assert!(
            within(batch_of(&shared).encoded(), &encoded),
            "the batch was copied out of the buffer it was decoded from"
        );
        // Its keys, once decoded, share that buffer too.
        let ops = batch_of(&shared).entry().unwrap().ops;
        let Op::Claim(c) = &ops[1] else {
            panic!("a claim")
        };
        assert!(within(&c.key, &encoded));
        // A plain decode has nothing to share: it copies.
        let copied: LogEntry = postcard::from_bytes(&encoded).unwrap();
        assert!(!within(batch_of(&copied).encoded(), &encoded));
        assert_eq!(batch_of(&copied), batch_of(&shared));
        // The source is let go of afterwards: a later plain decode on this
        // thread does not share a buffer it was not given.
        let again: LogEntry = postcard::from_bytes(&encoded[..]).unwrap();
        assert!(!within(batch_of(&again).encoded(), &encoded));
    }

    /// Only the header is checked as a batch is decoded (from a peer or
    /// the log): a batch for rules this build does not have is refused
    /// there; one that is damaged past the header is refused by
    /// [`Batch::check`] (which the peer connection runs on what a peer
    /// sends) and by [`Batch::entry`] as it is applied.
    #[test]
    fn a_batch_this_build_cannot_apply_is_refused_as_it_comes_in() {
        let good = Batch::new(&entry(&["k"]));
        let with_header = |format: u8, sm: u16| {
            let mut b = good.encoded().to_vec();
            b[0] = format;
            b[1..3].copy_from_slice(&sm.to_le_bytes());
            b
        };
        // A log entry as a peer or the log would hand it over, with `batch`.
        let arriving = |batch: &[u8]| {
            let mut encoded = postcard::to_allocvec(&log_entry(good.clone())).unwrap();
            let at = encoded.len() - good.encoded().len();
            encoded.truncate(at - 1);
            encoded.push(u8::try_from(batch.len()).unwrap());
            encoded.extend_from_slice(batch);
            decode_sharing::<LogEntry>(&Bytes::from(encoded))
        };
        assert_eq!(batch_of(&arriving(good.encoded()).unwrap()), &good);
        let cases: [(Vec<u8>, &str); 4] = [
            (
                with_header(ENTRY_FORMAT, STATE_MACHINE_VERSION + 1),
                "a newer state machine",
            ),
            (
                with_header(ENTRY_FORMAT + 1, STATE_MACHINE_VERSION),
                "a newer entry format",
            ),
            (with_header(ENTRY_FORMAT, 0), "state machine version 0"),
            (vec![ENTRY_FORMAT, 1], "a header cut short"),
        ];
        for (bytes, why) in cases {
            assert!(arriving(&bytes).is_err(), "{why} was taken in");
        }
        // Damage past the header: taken in, refused when decoded.
        let mut damaged = good.encoded().to_vec();
        damaged.truncate(damaged.len() - 2);
        let taken = arriving(&damaged).unwrap();
        assert_eq!(
            batch_of(&taken).entry(),
            Err(CodecError::Malformed("cut short"))
        );
    }
}
