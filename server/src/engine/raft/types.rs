//! The Raft type configuration: what a log entry carries and what applying
//! it answers.

use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::store::codec::{decode_entry, encode_entry};
use crate::store::{Applied, Entry};

/// A batch of ops stamped by the leader: the application data of one Raft
/// log entry. Serialized in the store's own versioned entry format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch(pub Entry);

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = Vec::with_capacity(64);
        encode_entry(&self.0, &mut out);
        s.serialize_bytes(&out)
    }
}

struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = Batch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an encoded Idem entry")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Batch, E> {
        decode_entry(Bytes::copy_from_slice(v))
            .map(Batch)
            .map_err(E::custom)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Batch, E> {
        decode_entry(Bytes::from(v)).map(Batch).map_err(E::custom)
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
