//! `CLUSTER`: the cluster's state in Redis Cluster's formats (so stock
//! cluster clients route to the leader) and Idem's membership changes.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// A `CLUSTER` subcommand.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterCmd {
    /// `CLUSTER INFO`: Redis's `field:value` lines, then Idem's.
    Info,
    /// `CLUSTER NODES`: Redis's node lines.
    Nodes,
    /// `CLUSTER MYID`: this node's 40-hex id.
    MyId,
    /// `CLUSTER SLOTS`: the leader owns every slot, followers replicate.
    Slots,
    /// `CLUSTER SHARDS`: the same in Redis 7's shape.
    Shards,
    /// `CLUSTER KEYSLOT key`: the hash slot of a key.
    KeySlot(Bytes),
    /// `CLUSTER MEMBERS`: id, addresses, voter or learner, match index, lag.
    Members,
    /// `CLUSTER ADD id peer-addr client-addr`: add a node as a learner.
    Add {
        /// The new node's id.
        id: u64,
        /// Its peer (Raft) address.
        peer: Bytes,
        /// Its client address.
        client: Bytes,
    },
    /// `CLUSTER PROMOTE id`: make a learner a voter.
    Promote(u64),
    /// `CLUSTER REMOVE id`: remove a node.
    Remove(u64),
}

impl ClusterCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let sub = args.required()?;
        let is = |w: &str| sub.eq_ignore_ascii_case(w.as_bytes());
        let cmd = if is("INFO") {
            ClusterCmd::Info
        } else if is("NODES") {
            ClusterCmd::Nodes
        } else if is("MYID") {
            ClusterCmd::MyId
        } else if is("SLOTS") {
            ClusterCmd::Slots
        } else if is("SHARDS") {
            ClusterCmd::Shards
        } else if is("MEMBERS") {
            ClusterCmd::Members
        } else if is("KEYSLOT") {
            ClusterCmd::KeySlot(args.required()?)
        } else if is("ADD") {
            ClusterCmd::Add {
                id: args.u64("node id")?,
                peer: args.required()?,
                client: args.required()?,
            }
        } else if is("PROMOTE") {
            ClusterCmd::Promote(args.u64("node id")?)
        } else if is("REMOVE") {
            ClusterCmd::Remove(args.u64("node id")?)
        } else {
            return Err(CommandError::UnknownSubcommand {
                command: "cluster",
                sub,
            });
        };
        args.finish_ref()?;
        Ok(cmd)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("CLUSTER"));
        match self {
            ClusterCmd::Info => out.push(word("INFO")),
            ClusterCmd::Nodes => out.push(word("NODES")),
            ClusterCmd::MyId => out.push(word("MYID")),
            ClusterCmd::Slots => out.push(word("SLOTS")),
            ClusterCmd::Shards => out.push(word("SHARDS")),
            ClusterCmd::Members => out.push(word("MEMBERS")),
            ClusterCmd::KeySlot(k) => out.extend([word("KEYSLOT"), Frame::Bulk(k.clone())]),
            ClusterCmd::Add { id, peer, client } => out.extend([
                word("ADD"),
                num(*id),
                Frame::Bulk(peer.clone()),
                Frame::Bulk(client.clone()),
            ]),
            ClusterCmd::Promote(id) => out.extend([word("PROMOTE"), num(*id)]),
            ClusterCmd::Remove(id) => out.extend([word("REMOVE"), num(*id)]),
        }
    }
}
