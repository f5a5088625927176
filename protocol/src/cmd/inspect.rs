//! `INSPECT`: read a record without changing it.

use bytes::Bytes;

use super::{Args, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `INSPECT key`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inspect {
    /// The key.
    pub key: Bytes,
}

impl Inspect {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let c = Inspect {
            key: args.required()?,
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([word("INSPECT"), Frame::Bulk(self.key.clone())]);
    }
}
