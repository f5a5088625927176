//! `FORGET`: administrative delete of a record.

use bytes::Bytes;

use super::{Args, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `FORGET key`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Forget {
    /// The key.
    pub key: Bytes,
}

impl Forget {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let c = Forget {
            key: args.required()?,
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([word("FORGET"), Frame::Bulk(self.key.clone())]);
    }
}
