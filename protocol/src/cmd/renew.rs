//! `RENEW`: extend the lease of an owned claim.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `RENEW key fence LEASE ms` — the new lease runs from now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Renew {
    /// The key.
    pub key: Bytes,
    /// The owner's fence.
    pub fence: u64,
    /// New lease length in ms, from now.
    pub lease_ms: u64,
}

impl Renew {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let key = args.required()?;
        let fence = args.fence()?;
        let opt = args.required()?;
        if !opt.eq_ignore_ascii_case(b"LEASE") {
            return Err(CommandError::Syntax("RENEW key fence LEASE ms"));
        }
        let lease_ms = args.u64("LEASE")?;
        args.finish_ref()?;
        Ok(Renew {
            key,
            fence,
            lease_ms,
        })
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([
            word("RENEW"),
            Frame::Bulk(self.key.clone()),
            num(self.fence),
            word("LEASE"),
            num(self.lease_ms),
        ]);
    }
}
