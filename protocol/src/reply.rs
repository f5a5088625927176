//! Typed replies: built by the server, read back by clients.
//!
//! # Format
//!
//! ```text
//! CLAIM   -> *2 +ACQUIRED :fence | *3 +COMPLETED +OK|+ERR $value
//!          | *2 +INFLIGHT :remaining_ms | *3 +RECOVER :fence $journal
//! SETTLE  -> *3 +COMPLETED +OK|+ERR $value | *1 +ABSENT
//!          | *2 +ABANDONED $journal | *2 +INFLIGHT :remaining_ms
//! INSPECT -> null | map (flat array in RESP2) of state, fence, lease_ms,
//!            retain_ms, outcome, value, fingerprint, journal, attempt
//! errors  -> -CODE message, CODE one of ERR MISMATCH FENCED TOOBIG OOM
//!            NOAUTH NOPERM WRONGPASS MOVED TRYAGAIN CLUSTERDOWN
//!            NOPROTO
//! ```

use std::borrow::Cow;
use std::fmt;

use bytes::{Bytes, BytesMut};

use crate::error::ReplyError;
use crate::frame::{Frame, Version};

/// The outcome of a completed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The effect succeeded.
    Ok,
    /// The effect failed permanently (e.g. card declined); replayed as such.
    Err,
}

impl Outcome {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Err => "ERR",
        }
    }

    fn from_word(w: &[u8]) -> Result<Outcome, ReplyError> {
        match w {
            b"OK" => Ok(Outcome::Ok),
            b"ERR" => Ok(Outcome::Err),
            _ => Err(ReplyError("outcome is neither OK nor ERR")),
        }
    }
}

/// The reply to `CLAIM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReply {
    /// The caller owns the key: run the effect.
    Acquired {
        /// The fence naming this ownership.
        fence: u64,
    },
    /// The outcome is known: replay it, do not run the effect.
    Completed {
        /// OK or ERR.
        outcome: Outcome,
        /// The stored result.
        value: Bytes,
    },
    /// A live owner holds the key (and the wait, if any, ran out).
    InFlight {
        /// Milliseconds left on the owner's lease.
        remaining_ms: u64,
    },
    /// The previous owner abandoned the key; the caller owns it now and
    /// must recover from the journal.
    Recover {
        /// The fence naming this ownership.
        fence: u64,
        /// The previous owner's journal.
        journal: Bytes,
    },
}

/// The reply to `SETTLE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleReply {
    /// The outcome is known.
    Completed {
        /// OK or ERR.
        outcome: Outcome,
        /// The stored result.
        value: Bytes,
    },
    /// No record: never claimed, released, or retention over.
    Absent,
    /// The owner gave up; the effect may or may not have happened.
    Abandoned {
        /// The last owner's journal.
        journal: Bytes,
    },
    /// Still in flight (the wait, if any, ran out).
    InFlight {
        /// Milliseconds left on the owner's lease.
        remaining_ms: u64,
    },
}

/// A record's state as `INSPECT` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// A live owner is performing the effect.
    InFlight,
    /// The owner gave up or its lease lapsed under `ONEXPIRE RECOVER`.
    Abandoned,
    /// The outcome is known.
    Completed,
}

impl RecordState {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InFlight => "in_flight",
            RecordState::Abandoned => "abandoned",
            RecordState::Completed => "completed",
        }
    }
}

/// What `INSPECT` shows of a record. Fields that do not apply to the state
/// are `None` (null on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// The state.
    pub state: RecordState,
    /// The fence of the current or last owner.
    pub fence: u64,
    /// In flight: milliseconds left on the lease.
    pub lease_ms: Option<u64>,
    /// Completed or abandoned: milliseconds until the record is dropped.
    pub retain_ms: Option<u64>,
    /// Completed: the outcome.
    pub outcome: Option<Outcome>,
    /// Completed: the value.
    pub value: Option<Bytes>,
    /// The fingerprint, if the first claim gave one.
    pub fingerprint: Option<Bytes>,
    /// In flight or abandoned: the journal.
    pub journal: Option<Bytes>,
    /// In flight or abandoned: the attempt id of the claim, if given.
    pub attempt: Option<Bytes>,
}

/// The code leading an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Syntax, arity, unknown command, bad number, protocol error.
    Err,
    /// The fingerprint differs from the first request's.
    Mismatch,
    /// The caller's fence does not own the key.
    Fenced,
    /// A key, value, journal, fingerprint or frame is over its limit.
    TooBig,
    /// The server is at its memory limit and refuses new claims.
    Oom,
    /// Authentication is required.
    NoAuth,
    /// The user may not run this command.
    NoPerm,
    /// Wrong credentials.
    WrongPass,
    /// Try again later (e.g. no leader, or the server is shutting down).
    TryAgain,
    /// The protocol version asked for by `HELLO` is not supported.
    NoProto,
    /// Ask another node: the message is `slot host:port` (Redis Cluster's
    /// redirect to the leader).
    Moved,
    /// The cluster cannot serve (no quorum).
    ClusterDown,
}

impl ErrorCode {
    /// Every code, in declaration order ([`ErrorCode::index`] is the
    /// position here).
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::Err,
        ErrorCode::Mismatch,
        ErrorCode::Fenced,
        ErrorCode::TooBig,
        ErrorCode::Oom,
        ErrorCode::NoAuth,
        ErrorCode::NoPerm,
        ErrorCode::WrongPass,
        ErrorCode::TryAgain,
        ErrorCode::NoProto,
        ErrorCode::Moved,
        ErrorCode::ClusterDown,
    ];

    /// The code's position in [`ErrorCode::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Err => "ERR",
            ErrorCode::Mismatch => "MISMATCH",
            ErrorCode::Fenced => "FENCED",
            ErrorCode::TooBig => "TOOBIG",
            ErrorCode::Oom => "OOM",
            ErrorCode::NoAuth => "NOAUTH",
            ErrorCode::NoPerm => "NOPERM",
            ErrorCode::WrongPass => "WRONGPASS",
            ErrorCode::TryAgain => "TRYAGAIN",
            ErrorCode::NoProto => "NOPROTO",
            ErrorCode::Moved => "MOVED",
            ErrorCode::ClusterDown => "CLUSTERDOWN",
        }
    }

    fn from_word(w: &str) -> Option<ErrorCode> {
        Some(match w {
            "ERR" => ErrorCode::Err,
            "MISMATCH" => ErrorCode::Mismatch,
            "FENCED" => ErrorCode::Fenced,
            "TOOBIG" => ErrorCode::TooBig,
            "OOM" => ErrorCode::Oom,
            "NOAUTH" => ErrorCode::NoAuth,
            "NOPERM" => ErrorCode::NoPerm,
            "WRONGPASS" => ErrorCode::WrongPass,
            "TRYAGAIN" => ErrorCode::TryAgain,
            "NOPROTO" => ErrorCode::NoProto,
            "MOVED" => ErrorCode::Moved,
            "CLUSTERDOWN" => ErrorCode::ClusterDown,
            _ => return None,
        })
    }
}

/// An error reply: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// The leading code.
    pub code: ErrorCode,
    /// The text after the code (static on hot paths: no allocation).
    pub message: Cow<'static, str>,
}

impl ServerError {
    /// An error with a static message.
    pub const fn new(code: ErrorCode, message: &'static str) -> Self {
        ServerError {
            code,
            message: Cow::Borrowed(message),
        }
    }

    /// An error with a formatted message.
    pub fn owned(code: ErrorCode, message: String) -> Self {
        ServerError {
            code,
            message: Cow::Owned(message),
        }
    }

    /// Reads `CODE message` from an error frame's text. An unknown code is
    /// kept as an `ERR` whose message is the whole text.
    pub fn parse(text: &[u8]) -> ServerError {
        let text = String::from_utf8_lossy(text);
        let (word, rest) = text.split_once(' ').unwrap_or((&text, ""));
        match ErrorCode::from_word(word) {
            Some(code) => ServerError::owned(code, rest.to_owned()),
            None => ServerError::owned(ErrorCode::Err, text.into_owned()),
        }
    }

    /// The error frame.
    pub fn to_frame(&self) -> Frame {
        let mut s = Vec::with_capacity(self.code.as_str().len() + 1 + self.message.len());
        s.extend_from_slice(self.code.as_str().as_bytes());
        if !self.message.is_empty() {
            s.push(b' ');
            s.extend_from_slice(self.message.as_bytes());
        }
        Frame::Error(Bytes::from(s))
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for ServerError {}

/// A reply, typed where the command has a typed reply.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// `+OK`
    Ok,
    /// The reply to `CLAIM`.
    Claim(ClaimReply),
    /// The reply to `SETTLE`.
    Settle(SettleReply),
    /// The reply to `INSPECT` (boxed: it is large and rare, and every
    /// reply is moved on the hot path).
    Inspect(Option<Box<RecordInfo>>),
    /// An error reply.
    Error(ServerError),
    /// Any other reply, as a frame.
    Frame(Frame),
}

impl From<ServerError> for Reply {
    fn from(e: ServerError) -> Self {
        Reply::Error(e)
    }
}

fn status(s: &'static str) -> Frame {
    Frame::simple(s)
}

fn opt_int(v: Option<u64>) -> Frame {
    v.map_or(Frame::Null, |n| Frame::Integer(n as i64))
}

fn opt_bulk(v: &Option<Bytes>) -> Frame {
    v.as_ref().map_or(Frame::Null, |b| Frame::Bulk(b.clone()))
}

impl Reply {
    /// The memory the reply holds while it waits to be sent: its own size
    /// and what it refers to (a stored value shared with the store is
    /// counted in full, an upper bound).
    pub fn memory(&self) -> usize {
        let held = match self {
            Reply::Ok => 0,
            Reply::Claim(ClaimReply::Completed { value, .. })
            | Reply::Settle(SettleReply::Completed { value, .. }) => value.len(),
            Reply::Claim(ClaimReply::Recover { journal, .. })
            | Reply::Settle(SettleReply::Abandoned { journal }) => journal.len(),
            Reply::Claim(_) | Reply::Settle(_) => 0,
            Reply::Inspect(None) => 0,
            Reply::Inspect(Some(r)) => {
                std::mem::size_of::<RecordInfo>()
                    + [&r.value, &r.fingerprint, &r.journal, &r.attempt]
                        .iter()
                        .map(|b| b.as_ref().map_or(0, Bytes::len))
                        .sum::<usize>()
            }
            Reply::Error(e) => match &e.message {
                Cow::Owned(m) => m.capacity(),
                Cow::Borrowed(_) => 0,
            },
            Reply::Frame(f) => f.heap_size(),
        };
        std::mem::size_of::<Reply>() + held
    }

    /// Appends the wire form of the reply to `dst`: the same bytes as
    /// encoding [`Reply::to_frame`], without building the frame for the
    /// common replies.
    pub fn encode(&self, version: Version, dst: &mut BytesMut) {
        use crate::frame::{bulk_out, line_out, number_out};
        match self {
            Reply::Ok => dst.extend_from_slice(b"+OK\r\n"),
            Reply::Claim(ClaimReply::Acquired { fence }) => {
                dst.extend_from_slice(b"*2\r\n+ACQUIRED\r\n");
                number_out(dst, b':', *fence as i64);
            }
            Reply::Claim(ClaimReply::InFlight { remaining_ms })
            | Reply::Settle(SettleReply::InFlight { remaining_ms }) => {
                dst.extend_from_slice(b"*2\r\n+INFLIGHT\r\n");
                number_out(dst, b':', *remaining_ms as i64);
            }
            Reply::Claim(ClaimReply::Completed { outcome, value })
            | Reply::Settle(SettleReply::Completed { outcome, value }) => {
                dst.extend_from_slice(b"*3\r\n+COMPLETED\r\n");
                line_out(dst, b'+', outcome.as_str().as_bytes());
                bulk_out(dst, value);
            }
            Reply::Frame(f) => crate::frame::encode(f, version, dst),
            other => crate::frame::encode(&other.to_frame(), version, dst),
        }
    }

    /// The reply as a frame.
    pub fn to_frame(&self) -> Frame {
        match self {
            Reply::Ok => status("OK"),
            Reply::Claim(c) => c.to_frame(),
            Reply::Settle(s) => s.to_frame(),
            Reply::Inspect(None) => Frame::Null,
            Reply::Inspect(Some(info)) => info.to_frame(),
            Reply::Error(e) => e.to_frame(),
            Reply::Frame(f) => f.clone(),
        }
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl ClaimReply {
    /// The reply as a frame.
    pub fn to_frame(&self) -> Frame {
        match self {
            ClaimReply::Acquired { fence } => {
                Frame::Array(vec![status("ACQUIRED"), Frame::Integer(*fence as i64)])
            }
            ClaimReply::Completed { outcome, value } => Frame::Array(vec![
                status("COMPLETED"),
                status(outcome.as_str()),
                Frame::Bulk(value.clone()),
            ]),
            ClaimReply::InFlight { remaining_ms } => Frame::Array(vec![
                status("INFLIGHT"),
                Frame::Integer(*remaining_ms as i64),
            ]),
            ClaimReply::Recover { fence, journal } => Frame::Array(vec![
                status("RECOVER"),
                Frame::Integer(*fence as i64),
                Frame::Bulk(journal.clone()),
            ]),
        }
    }

    /// Reads the reply of a `CLAIM`. An error frame is returned as `Err(Ok(e))`.
    pub fn from_frame(frame: Frame) -> Result<ClaimReply, Result<ServerError, ReplyError>> {
        let items = status_array(frame)?;
        let word = word_of(&items)?;
        Ok(match (word, items.len()) {
            (b"ACQUIRED", 2) => ClaimReply::Acquired {
                fence: uint(&items[1])?,
            },
            (b"COMPLETED", 3) => ClaimReply::Completed {
                outcome: outcome(&items[1])?,
                value: bulk(&items[2])?,
            },
            (b"INFLIGHT", 2) => ClaimReply::InFlight {
                remaining_ms: uint(&items[1])?,
            },
            (b"RECOVER", 3) => ClaimReply::Recover {
                fence: uint(&items[1])?,
                journal: bulk(&items[2])?,
            },
            _ => return Err(Err(ReplyError("unknown CLAIM reply"))),
        })
    }
}

impl SettleReply {
    /// The reply as a frame.
    pub fn to_frame(&self) -> Frame {
        match self {
            SettleReply::Completed { outcome, value } => Frame::Array(vec![
                status("COMPLETED"),
                status(outcome.as_str()),
                Frame::Bulk(value.clone()),
            ]),
            SettleReply::Absent => Frame::Array(vec![status("ABSENT")]),
            SettleReply::Abandoned { journal } => {
                Frame::Array(vec![status("ABANDONED"), Frame::Bulk(journal.clone())])
            }
            SettleReply::InFlight { remaining_ms } => Frame::Array(vec![
                status("INFLIGHT"),
                Frame::Integer(*remaining_ms as i64),
            ]),
        }
    }

    /// Reads the reply of a `SETTLE`. An error frame is returned as `Err(Ok(e))`.
    pub fn from_frame(frame: Frame) -> Result<SettleReply, Result<ServerError, ReplyError>> {
        let items = status_array(frame)?;
        let word = word_of(&items)?;
        Ok(match (word, items.len()) {
            (b"COMPLETED", 3) => SettleReply::Completed {
                outcome: outcome(&items[1])?,
                value: bulk(&items[2])?,
            },
            (b"ABSENT", 1) => SettleReply::Absent,
            (b"ABANDONED", 2) => SettleReply::Abandoned {
                journal: bulk(&items[1])?,
            },
            (b"INFLIGHT", 2) => SettleReply::InFlight {
                remaining_ms: uint(&items[1])?,
            },
            _ => return Err(Err(ReplyError("unknown SETTLE reply"))),
        })
    }
}

/// Field names of an `INSPECT` reply, in order.
pub const INSPECT_FIELDS: [&str; 9] = [
    "state",
    "fence",
    "lease_ms",
    "retain_ms",
    "outcome",
    "value",
    "fingerprint",
    "journal",
    "attempt",
];

impl RecordInfo {
    /// The reply as a map frame.
    pub fn to_frame(&self) -> Frame {
        let values = [
            status(self.state.as_str()),
            Frame::Integer(self.fence as i64),
            opt_int(self.lease_ms),
            opt_int(self.retain_ms),
            self.outcome.map_or(Frame::Null, |o| status(o.as_str())),
            opt_bulk(&self.value),
            opt_bulk(&self.fingerprint),
            opt_bulk(&self.journal),
            opt_bulk(&self.attempt),
        ];
        Frame::Map(
            INSPECT_FIELDS
                .iter()
                .map(|f| status(f))
                .zip(values)
                .collect(),
        )
    }

    /// Reads the reply of an `INSPECT` (map in RESP3, flat array in RESP2).
    pub fn from_frame(frame: Frame) -> Result<Option<RecordInfo>, Result<ServerError, ReplyError>> {
        let pairs: Vec<(Frame, Frame)> = match frame {
            Frame::Null => return Ok(None),
            Frame::Error(e) => return Err(Ok(ServerError::parse(&e))),
            Frame::Map(p) => p,
            Frame::Array(items) if items.len() % 2 == 0 => {
                let mut it = items.into_iter();
                let mut p = Vec::new();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    p.push((k, v));
                }
                p
            }
            _ => return Err(Err(ReplyError("INSPECT reply is not a map"))),
        };
        let mut info = RecordInfo {
            state: RecordState::InFlight,
            fence: 0,
            lease_ms: None,
            retain_ms: None,
            outcome: None,
            value: None,
            fingerprint: None,
            journal: None,
            attempt: None,
        };
        let mut seen_state = false;
        for (k, v) in pairs {
            let key = text(&k)?;
            let null = v == Frame::Null;
            match key {
                b"state" => {
                    info.state = match text(&v)? {
                        b"in_flight" => RecordState::InFlight,
                        b"abandoned" => RecordState::Abandoned,
                        b"completed" => RecordState::Completed,
                        _ => return Err(Err(ReplyError("unknown record state"))),
                    };
                    seen_state = true;
                }
                b"fence" => info.fence = uint(&v)?,
                b"lease_ms" if !null => info.lease_ms = Some(uint(&v)?),
                b"retain_ms" if !null => info.retain_ms = Some(uint(&v)?),
                b"outcome" if !null => info.outcome = Some(outcome(&v)?),
                b"value" if !null => info.value = Some(bulk(&v)?),
                b"fingerprint" if !null => info.fingerprint = Some(bulk(&v)?),
                b"journal" if !null => info.journal = Some(bulk(&v)?),
                b"attempt" if !null => info.attempt = Some(bulk(&v)?),
                _ => {}
            }
        }
        if !seen_state {
            return Err(Err(ReplyError("INSPECT reply has no state")));
        }
        Ok(Some(info))
    }
}

type ReadResult<T> = Result<T, Result<ServerError, ReplyError>>;

fn status_array(frame: Frame) -> ReadResult<Vec<Frame>> {
    match frame {
        Frame::Array(items) if !items.is_empty() => Ok(items),
        Frame::Error(e) => Err(Ok(ServerError::parse(&e))),
        _ => Err(Err(ReplyError("expected an array led by a status word"))),
    }
}

fn word_of(items: &[Frame]) -> ReadResult<&[u8]> {
    text(&items[0])
}

fn text(f: &Frame) -> ReadResult<&[u8]> {
    match f {
        Frame::Simple(s) | Frame::Bulk(s) => Ok(s),
        _ => Err(Err(ReplyError("expected a word"))),
    }
}

fn outcome(f: &Frame) -> ReadResult<Outcome> {
    Outcome::from_word(text(f)?).map_err(Err)
}

fn uint(f: &Frame) -> ReadResult<u64> {
    match f {
        Frame::Integer(n) if *n >= 0 => Ok(*n as u64),
        _ => Err(Err(ReplyError("expected a non-negative integer"))),
    }
}

fn bulk(f: &Frame) -> ReadResult<Bytes> {
    match f {
        Frame::Bulk(b) => Ok(b.clone()),
        _ => Err(Err(ReplyError("expected a bulk string"))),
    }
}
