//! `CLAIM`: ask to own a key, or learn its outcome.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// What a lapsed lease leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpire {
    /// The key becomes absent: the effect is assumed safe to retry.
    #[default]
    Free,
    /// The key becomes abandoned: the next caller must recover.
    Recover,
}

impl OnExpire {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExpire::Free => "FREE",
            OnExpire::Recover => "RECOVER",
        }
    }
}

/// `CLAIM key [LEASE ms] [RETAIN ms] [WAIT ms] [FP bytes] [ONEXPIRE FREE|RECOVER] [ATTEMPT id]`
///
/// Options left out take the server's defaults (`WAIT` defaults to 0: do
/// not wait).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claim {
    /// The key.
    pub key: Bytes,
    /// Lease length in ms.
    pub lease_ms: Option<u64>,
    /// Retention of the completed record in ms.
    pub retain_ms: Option<u64>,
    /// How long to wait for a live owner to finish, in ms.
    pub wait_ms: Option<u64>,
    /// Request fingerprint.
    pub fingerprint: Option<Bytes>,
    /// What a lapsed lease leaves behind.
    pub on_expire: Option<OnExpire>,
    /// Client-chosen id of this attempt, for retries after a lost reply.
    pub attempt: Option<Bytes>,
}

impl Claim {
    /// A claim of `key` with every option at the server default.
    pub fn new(key: impl Into<Bytes>) -> Self {
        Claim {
            key: key.into(),
            ..Claim::default()
        }
    }

    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let mut c = Claim::new(args.required()?);
        while let Some(opt) = args.next() {
            if opt.eq_ignore_ascii_case(b"LEASE") {
                c.lease_ms = Some(args.option_ms("LEASE", c.lease_ms.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"RETAIN") {
                c.retain_ms = Some(args.option_ms("RETAIN", c.retain_ms.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"WAIT") {
                c.wait_ms = Some(args.option_ms("WAIT", c.wait_ms.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"FP") {
                c.fingerprint = Some(args.option_value("FP", c.fingerprint.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"ATTEMPT") {
                let id = args.option_value("ATTEMPT", c.attempt.is_some())?;
                // An empty id would name every attempt that left it empty.
                if id.is_empty() {
                    return Err(CommandError::Syntax("ATTEMPT id must not be empty"));
                }
                c.attempt = Some(id);
            } else if opt.eq_ignore_ascii_case(b"ONEXPIRE") {
                let v = args.option_value("ONEXPIRE", c.on_expire.is_some())?;
                c.on_expire = Some(if v.eq_ignore_ascii_case(b"FREE") {
                    OnExpire::Free
                } else if v.eq_ignore_ascii_case(b"RECOVER") {
                    OnExpire::Recover
                } else {
                    return Err(CommandError::BadValue {
                        what: "ONEXPIRE",
                        expected: "FREE or RECOVER",
                    });
                });
            } else {
                return Err(CommandError::UnknownOption {
                    command: args.cmd(),
                    option: opt,
                });
            }
        }
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("CLAIM"));
        out.push(Frame::Bulk(self.key.clone()));
        if let Some(v) = self.lease_ms {
            out.extend([word("LEASE"), num(v)]);
        }
        if let Some(v) = self.retain_ms {
            out.extend([word("RETAIN"), num(v)]);
        }
        if let Some(v) = self.wait_ms {
            out.extend([word("WAIT"), num(v)]);
        }
        if let Some(v) = &self.fingerprint {
            out.extend([word("FP"), Frame::Bulk(v.clone())]);
        }
        if let Some(v) = self.on_expire {
            out.extend([word("ONEXPIRE"), word(v.as_str())]);
        }
        if let Some(v) = &self.attempt {
            out.extend([word("ATTEMPT"), Frame::Bulk(v.clone())]);
        }
    }
}
