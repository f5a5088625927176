//! Per-connection state that commands can change.

use std::sync::Arc;

use idem_protocol::Version;

use crate::acl::User;
use crate::clients::ClientInfo;
use crate::node::Node;

/// Per-connection state.
#[derive(Clone)]
pub struct Session {
    /// The registry entry of this connection.
    pub info: Arc<ClientInfo>,
    /// The protocol version (HELLO).
    pub version: Version,
    /// The user the connection acts as: `None` until it authenticates
    /// (from the start `default` when that user takes no password).
    pub user: Option<Arc<User>>,
    /// The generation of users `user` was looked up in.
    pub acl_epoch: u64,
    /// The connection came through the TLS listener: redirects name TLS
    /// addresses.
    pub tls: bool,
    /// Writes of this connection are still on their way through the log:
    /// a command that could be answered from the store must not be (it
    /// would not see them).
    pub writes_pending: bool,
    /// The client sent READONLY (Redis Cluster's replica reads): a
    /// follower answers its reads itself, linearizably, instead of
    /// redirecting them to the leader.
    pub readonly: bool,
}

impl Session {
    /// The state of a new connection of `node`.
    pub fn new(node: &Node, info: Arc<ClientInfo>) -> Session {
        let epoch = node.acl_epoch();
        let user = node.acl().initial_user();
        if let Some(u) = &user {
            info.set_user(u.name());
        }
        Session {
            info,
            version: Version::Resp2,
            user,
            acl_epoch: epoch,
            tls: false,
            writes_pending: false,
            readonly: false,
        }
    }

    /// Acts as `user` from now on.
    pub fn log_in(&mut self, user: Arc<User>, epoch: u64) {
        self.info.set_user(user.name());
        self.user = Some(user);
        self.acl_epoch = epoch;
    }
}
