//! The registry of connected clients, for `CLIENT LIST` and INFO.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

/// What the server shows of one connection.
#[derive(Debug)]
pub struct ClientInfo {
    /// Connection id (`CLIENT ID`).
    pub id: u64,
    /// Peer address.
    pub addr: SocketAddr,
    /// Local address.
    pub laddr: SocketAddr,
    /// When it connected.
    pub since: Instant,
    /// `CLIENT SETNAME`.
    pub name: Mutex<Option<Bytes>>,
    /// The last command's name and when it ran (ms since `since`).
    pub last: Mutex<(&'static str, u64)>,
    /// Protocol version (2 or 3).
    pub resp: AtomicU64,
}

impl ClientInfo {
    /// One `CLIENT LIST` line (without the newline).
    pub fn line(&self) -> String {
        let name = self.name.lock().clone().unwrap_or_default();
        let (cmd, at) = *self.last.lock();
        let age = self.since.elapsed();
        let idle = (age.as_millis() as u64).saturating_sub(at) / 1000;
        format!(
            "id={} addr={} laddr={} name={} age={} idle={} cmd={} resp={}",
            self.id,
            self.addr,
            self.laddr,
            String::from_utf8_lossy(&name),
            age.as_secs(),
            idle,
            cmd,
            self.resp.load(Ordering::Relaxed)
        )
    }
}

/// All connected clients.
#[derive(Default)]
pub struct Clients {
    next_id: AtomicU64,
    map: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
}

impl Clients {
    /// Registers a new connection.
    pub fn register(&self, addr: SocketAddr, laddr: SocketAddr) -> Arc<ClientInfo> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let info = Arc::new(ClientInfo {
            id,
            addr,
            laddr,
            since: Instant::now(),
            name: Mutex::new(None),
            last: Mutex::new(("NULL", 0)),
            resp: AtomicU64::new(2),
        });
        self.map.lock().insert(id, Arc::clone(&info));
        info
    }

    /// Removes a connection.
    pub fn unregister(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// Connections now.
    pub fn count(&self) -> usize {
        self.map.lock().len()
    }

    /// `CLIENT LIST`.
    pub fn list(&self) -> String {
        let clients: Vec<Arc<ClientInfo>> = self.map.lock().values().cloned().collect();
        let mut out = String::new();
        for c in clients {
            out.push_str(&c.line());
            out.push('\n');
        }
        out
    }
}
