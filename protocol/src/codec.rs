//! A tokio-util codec: frames in, frames out.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use crate::error::FrameError;
use crate::frame::{Frame, Limits, Version, decode, encode};

/// Decodes RESP frames under [`Limits`] and encodes frames in the
/// connection's protocol [`Version`].
#[derive(Debug, Clone, Default)]
pub struct RespCodec {
    limits: Limits,
    version: Version,
}

impl RespCodec {
    /// A codec with the given limits, speaking RESP2.
    pub fn new(limits: Limits) -> Self {
        RespCodec {
            limits,
            version: Version::Resp2,
        }
    }

    /// Switches the encoding version (after `HELLO`).
    pub fn set_version(&mut self, version: Version) {
        self.version = version;
    }

    /// The encoding version in force.
    pub fn version(&self) -> Version {
        self.version
    }
}

/// An error from the codec: I/O or a bad frame.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The transport failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer sent a bad frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

impl Decoder for RespCodec {
    type Item = Frame;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        Ok(decode(src, &self.limits)?)
    }
}

impl Encoder<&Frame> for RespCodec {
    type Error = CodecError;

    fn encode(&mut self, item: &Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        encode(item, self.version, dst);
        Ok(())
    }
}

impl Encoder<Frame> for RespCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        encode(&item, self.version, dst);
        Ok(())
    }
}
