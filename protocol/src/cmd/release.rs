//! `RELEASE`: give up ownership; the key becomes absent (the effect did not happen).

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `RELEASE key fence`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Release {
    /// The key.
    pub key: Bytes,
    /// The owner's fence.
    pub fence: u64,
}

impl Release {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let c = Release {
            key: args.required()?,
            fence: args.fence()?,
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([
            word("RELEASE"),
            Frame::Bulk(self.key.clone()),
            num(self.fence),
        ]);
    }
}
