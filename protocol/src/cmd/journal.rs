//! `JOURNAL`: record progress of the effect for whoever must recover it.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `JOURNAL key fence bytes` — replaces the journal of an owned claim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Journal {
    /// The key.
    pub key: Bytes,
    /// The owner's fence.
    pub fence: u64,
    /// The new journal.
    pub journal: Bytes,
}

impl Journal {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let j = Journal {
            key: args.required()?,
            fence: args.fence()?,
            journal: args.required()?,
        };
        args.finish_ref()?;
        Ok(j)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([
            word("JOURNAL"),
            Frame::Bulk(self.key.clone()),
            num(self.fence),
            Frame::Bulk(self.journal.clone()),
        ]);
    }
}
