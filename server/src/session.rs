//! Per-connection state that commands can change.

use std::sync::Arc;

use idem_protocol::Version;

use crate::clients::ClientInfo;

/// Per-connection state.
pub struct Session {
    /// The registry entry of this connection.
    pub info: Arc<ClientInfo>,
    /// The protocol version (HELLO).
    pub version: Version,
}
