//! `ABANDON`: give up ownership; the key becomes abandoned (the effect may have happened).

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `ABANDON key fence`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Abandon {
    /// The key.
    pub key: Bytes,
    /// The owner's fence.
    pub fence: u64,
}

impl Abandon {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let c = Abandon {
            key: args.required()?,
            fence: args.fence()?,
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([
            word("ABANDON"),
            Frame::Bulk(self.key.clone()),
            num(self.fence),
        ]);
    }
}
