//! `SETTLE`: wait, without claiming, until a key is not in flight.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `SETTLE key [WAIT ms]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settle {
    /// The key.
    pub key: Bytes,
    /// How long to wait for a live owner to finish, in ms (default 0).
    pub wait_ms: Option<u64>,
}

impl Settle {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let mut s = Settle {
            key: args.required()?,
            wait_ms: None,
        };
        while let Some(opt) = args.next() {
            if opt.eq_ignore_ascii_case(b"WAIT") {
                s.wait_ms = Some(args.option_ms("WAIT", s.wait_ms.is_some())?);
            } else {
                return Err(CommandError::UnknownOption {
                    command: args.cmd(),
                    option: opt,
                });
            }
        }
        Ok(s)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([word("SETTLE"), Frame::Bulk(self.key.clone())]);
        if let Some(v) = self.wait_ms {
            out.extend([word("WAIT"), num(v)]);
        }
    }
}
