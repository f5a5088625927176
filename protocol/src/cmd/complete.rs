//! `COMPLETE`: record the outcome of the effect.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `COMPLETE key fence value [RETAIN ms] [ERROR]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Complete {
    /// The key.
    pub key: Bytes,
    /// The fence of the claim being completed.
    pub fence: u64,
    /// The result to replay.
    pub value: Bytes,
    /// Retention in ms (default: the claim's, else the server default).
    pub retain_ms: Option<u64>,
    /// The outcome is a permanent error, replayed like a success.
    pub error: bool,
}

impl Complete {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let key = args.required()?;
        let fence = args.fence()?;
        let value = args.required()?;
        let mut c = Complete {
            key,
            fence,
            value,
            retain_ms: None,
            error: false,
        };
        while let Some(opt) = args.next() {
            if opt.eq_ignore_ascii_case(b"RETAIN") {
                c.retain_ms = Some(args.option_ms("RETAIN", c.retain_ms.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"ERROR") {
                if c.error {
                    return Err(CommandError::DuplicateOption("ERROR"));
                }
                c.error = true;
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
        out.extend([
            word("COMPLETE"),
            Frame::Bulk(self.key.clone()),
            num(self.fence),
            Frame::Bulk(self.value.clone()),
        ]);
        if let Some(v) = self.retain_ms {
            out.extend([word("RETAIN"), num(v)]);
        }
        if self.error {
            out.push(word("ERROR"));
        }
    }
}
