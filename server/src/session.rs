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
    /// Whether the connection has authenticated (true from the start when
    /// no password is set).
    pub authenticated: bool,
    /// Writes of this connection are still on their way through the log:
    /// a command that could be answered from the store must not be (it
    /// would not see them).
    pub writes_pending: bool,
}
