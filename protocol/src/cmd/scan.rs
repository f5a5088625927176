//! `SCAN`: walk the keys a node holds, a few at a time.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::{Frame, parse_u64};

/// `SCAN cursor [MATCH pattern] [COUNT count]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    /// Where to go on from: 0 to start, else the cursor the previous call
    /// returned.
    pub cursor: u64,
    /// Only keys matching this glob (Redis's syntax).
    pub pattern: Option<Bytes>,
    /// About how many records to look at (a hint, at least 1).
    pub count: Option<u64>,
}

impl Scan {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let cursor = args.required()?;
        let cursor = parse_u64(&cursor).ok_or(CommandError::NotAnInteger("cursor"))?;
        let mut c = Scan {
            cursor,
            ..Scan::default()
        };
        while let Some(opt) = args.next() {
            if opt.eq_ignore_ascii_case(b"MATCH") {
                c.pattern = Some(args.option_value("MATCH", c.pattern.is_some())?);
            } else if opt.eq_ignore_ascii_case(b"COUNT") {
                let v = args.option_value("COUNT", c.count.is_some())?;
                c.count = Some(
                    parse_u64(&v)
                        .filter(|n| *n > 0)
                        .ok_or(CommandError::NotAnInteger("COUNT"))?,
                );
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
        out.extend([word("SCAN"), num(self.cursor)]);
        if let Some(p) = &self.pattern {
            out.extend([word("MATCH"), Frame::Bulk(p.clone())]);
        }
        if let Some(n) = self.count {
            out.extend([word("COUNT"), num(n)]);
        }
    }
}
