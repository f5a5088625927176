//! The wire protocol of Idem, a shared idempotency server.
//!
//! Idem speaks RESP (the Redis protocol): RESP2 by default, RESP3 after
//! `HELLO 3`, and inline commands for telnet. This crate has no runtime; the
//! server and the client share it.
//!
//! # Layout
//!
//! - [`frame`]: the [`Frame`] type, a two-pass decoder (completeness check,
//!   then a zero-copy parse into `Bytes` slices of the read buffer) bounded
//!   by [`Limits`], and an encoder for both versions.
//! - [`codec`]: a tokio-util codec over the two.
//! - [`cmd`]: the typed [`Command`] enum, one file per command.
//! - [`out`]: [`OutBuf`], reply bytes owed to a client, sharing large
//!   stored values instead of copying them.
//! - [`reply`]: typed replies ([`ClaimReply`], [`SettleReply`],
//!   [`RecordInfo`], [`ServerError`]).
//! - [`slot`]: Redis Cluster's hash slot of a key ([`key_slot`]).
//! - [`spec`]: the command table (name, arity, flags, key position).
//! - [`error`]: frame and command errors.
//!
//! # Example
//!
//! ```
//! use bytes::BytesMut;
//! use idem_protocol::{decode, Command, Limits};
//!
//! let mut buf = BytesMut::from(&b"*4\r\n$5\r\nCLAIM\r\n$7\r\norder-1\r\n$5\r\nLEASE\r\n$4\r\n5000\r\n"[..]);
//! let frame = decode(&mut buf, &Limits::default()).unwrap().unwrap();
//! let Command::Claim(claim) = Command::from_frame(frame).unwrap() else { unreachable!() };
//! assert_eq!(&claim.key[..], b"order-1");
//! assert_eq!(claim.lease_ms, Some(5000));
//! ```
//!
//! The whole protocol, with an example exchange per command, is in
//! `protocol/PROTOCOL.md`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cmd;
pub mod codec;
pub mod error;
pub mod frame;
pub mod out;
pub mod reply;
pub mod slot;
pub mod spec;

pub use cmd::{ClusterCmd, Command, OnExpire};
pub use codec::RespCodec;
pub use error::{CommandError, FrameError, ReplyError};
pub use frame::{Decoder, Frame, Limits, Version, decode, encode};
pub use out::OutBuf;
pub use reply::{
    ClaimReply, ErrorCode, Outcome, RecordInfo, RecordState, Reply, ServerError, SettleReply,
};
pub use slot::key_slot;
pub use spec::{CommandId, CommandSpec, Flags};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod reply_tests;
