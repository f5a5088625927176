//! The registry of connected clients, for `CLIENT LIST` and INFO.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

/// The monotonic clock as the kernel last ticked it, ms: good to a few
/// ms, and read without asking the clock hardware, so every command can
/// note when it ran (a precise read for each was over 1% of a busy
/// leader's CPU, for a `CLIENT LIST` idle time shown in seconds).
pub fn coarse_ms() -> u64 {
    crate::clock::clock_us(rustix::time::ClockId::MonotonicCoarse) / 1_000
}

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
    /// The user it acts as (empty until it authenticates).
    pub user: Mutex<Arc<str>>,
    /// `CLIENT SETINFO LIB-NAME` and `LIB-VER`.
    pub lib: Mutex<(Option<Bytes>, Option<Bytes>)>,
    /// The last command's name and when it ran ([`coarse_ms`]).
    pub last: Mutex<(&'static str, u64)>,
    /// Protocol version (2 or 3).
    pub resp: AtomicU64,
    /// Reply bytes it owes (buffered, not yet taken by the client), as
    /// counted against the server-wide budget.
    pub owed: AtomicU64,
    /// Set when it is to be disconnected to bring the server back under
    /// its client memory budget.
    pub evicted: AtomicBool,
    /// Woken when it is evicted.
    pub evict: tokio::sync::Notify,
    /// What it owed when it was evicted: counted as being freed until its
    /// connection has closed.
    freeing: AtomicU64,
    /// Set, and given a permit, when `CLIENT KILL` closes it.
    pub killed: AtomicBool,
    /// See `killed`.
    pub kill: tokio::sync::Notify,
}

impl ClientInfo {
    /// One `CLIENT LIST` line (without the newline).
    pub fn line(&self) -> String {
        let name = self.name.lock().clone().unwrap_or_default();
        let (cmd, at) = *self.last.lock();
        let age = self.since.elapsed();
        let idle = coarse_ms().saturating_sub(at) / 1000;
        let (lib_name, lib_ver) = self.lib.lock().clone();
        format!(
            "id={} addr={} laddr={} name={} age={} idle={} omem={} cmd={} user={} resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            String::from_utf8_lossy(&name),
            age.as_secs(),
            idle,
            self.owed.load(Ordering::Relaxed),
            cmd,
            self.user.lock(),
            self.resp.load(Ordering::Relaxed),
            String::from_utf8_lossy(&lib_name.unwrap_or_default()),
            String::from_utf8_lossy(&lib_ver.unwrap_or_default()),
        )
    }

    /// Records that the connection ran `cmd` now.
    pub fn ran(&self, cmd: &'static str) {
        *self.last.lock() = (cmd, coarse_ms());
    }

    /// Records the user the connection acts as.
    pub fn set_user(&self, name: &str) {
        let mut u = self.user.lock();
        if &**u != name {
            *u = Arc::from(name);
        }
    }
}

/// What [`Clients::account`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounted {
    /// Within the budget.
    Ok,
    /// Over it: other clients were evicted (the caller should let them run,
    /// so their buffers are freed before it adds more).
    EvictedOthers,
    /// This client is evicted: it is to close.
    Evicted,
}

/// All connected clients.
#[derive(Default)]
pub struct Clients {
    next_id: AtomicU64,
    map: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
    /// Reply bytes owed to all clients together.
    owed: AtomicU64,
    /// What evicted clients owed, until their connections have closed and
    /// freed it: other connections wait for it before they add more (a
    /// flag is quick, a connection's turn to close may come late).
    freeing: AtomicU64,
    /// Woken when an evicted client's connection has closed.
    freed: tokio::sync::Notify,
    /// The most they may owe together (0: no limit).
    budget: u64,
    /// Clients disconnected to keep within the budget.
    evictions: AtomicU64,
}

impl Clients {
    /// A registry whose clients may owe `budget` reply bytes together (0:
    /// no limit).
    pub fn with_budget(budget: u64) -> Clients {
        Clients {
            budget,
            ..Clients::default()
        }
    }

    /// Reply bytes owed to all clients now.
    pub fn owed(&self) -> u64 {
        self.owed.load(Ordering::Relaxed)
    }

    /// Clients disconnected so far to keep within the budget.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Records that `client` now owes `now` bytes where it owed `before`.
    /// Past the budget, the clients owing the most are evicted (their debt
    /// taken off the total at once, their connections told to close) until
    /// the total fits again.
    pub fn account(&self, client: &ClientInfo, before: u64, now: u64) -> Accounted {
        if client.evicted.load(Ordering::Relaxed) {
            return Accounted::Evicted;
        }
        let mut others = false;
        if now >= before {
            let d = now - before;
            client.owed.fetch_add(d, Ordering::Relaxed);
            let total = self.owed.fetch_add(d, Ordering::Relaxed) + d;
            if self.budget > 0 && total > self.budget {
                others = self.evict_over_budget();
            }
        } else {
            let d = before - now;
            client.owed.fetch_sub(d, Ordering::Relaxed);
            self.owed.fetch_sub(d, Ordering::Relaxed);
        }
        if client.evicted.load(Ordering::Relaxed) {
            Accounted::Evicted
        } else if others {
            Accounted::EvictedOthers
        } else {
            Accounted::Ok
        }
    }

    /// Takes what `client` owes off the total (it is closing).
    pub fn settle(&self, client: &ClientInfo) {
        let owed = client.owed.swap(0, Ordering::Relaxed);
        self.owed.fetch_sub(owed, Ordering::Relaxed);
        let freed = client.freeing.swap(0, Ordering::Relaxed);
        if freed > 0 {
            self.freeing.fetch_sub(freed, Ordering::Relaxed);
            self.freed.notify_waiters();
        }
    }

    /// Whether what clients owe, with what evicted ones still hold, is
    /// over the budget.
    pub fn over_budget(&self) -> bool {
        self.budget > 0
            && self.owed.load(Ordering::Relaxed) + self.freeing.load(Ordering::Relaxed)
                > self.budget
    }

    /// Waits, at most `max`, until evicted clients' connections have
    /// closed enough for the total to fit the budget (or `client` is
    /// evicted itself).
    pub async fn room(&self, client: &ClientInfo, max: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if !self.over_budget() || client.evicted.load(Ordering::Relaxed) {
                return;
            }
            tokio::select! {
                _ = &mut freed => {}
                _ = client.evict.notified() => {
                    // (Taken: give it back for the connection's own wait.)
                    client.evict.notify_one();
                    return;
                }
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    /// Evicts the clients owing the most until the total fits; whether
    /// any was evicted.
    fn evict_over_budget(&self) -> bool {
        let mut owing: Vec<Arc<ClientInfo>> = self
            .map
            .lock()
            .values()
            .filter(|c| !c.evicted.load(Ordering::Relaxed) && c.owed.load(Ordering::Relaxed) > 0)
            .cloned()
            .collect();
        owing.sort_by_key(|c| std::cmp::Reverse(c.owed.load(Ordering::Relaxed)));
        let mut any = false;
        for c in owing {
            if self.owed.load(Ordering::Relaxed) <= self.budget {
                break;
            }
            // Another connection evicting at the same time may have taken
            // this one since the list was made: it is counted once.
            if c.evicted.swap(true, Ordering::Relaxed) {
                continue;
            }
            any = true;
            // Off the total at once, but held until its connection closes.
            let owed = c.owed.swap(0, Ordering::Relaxed);
            self.owed.fetch_sub(owed, Ordering::Relaxed);
            c.freeing.fetch_add(owed, Ordering::Relaxed);
            self.freeing.fetch_add(owed, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            c.evict.notify_one();
            // A flood evicts thousands a second: one line per 10 s.
            static LOGGED: crate::metrics::LogEvery = crate::metrics::LogEvery::new();
            if let Some(count) = LOGGED.due() {
                tracing::warn!(
                    client = c.id,
                    addr = %c.addr,
                    count,
                    "clients over the server's max_client_memory_bytes: disconnecting the client holding the most (logged at most every 10 s; INFO client_budget_disconnects)"
                );
            }
        }
        any
    }

    /// Registers a new connection.
    pub fn register(&self, addr: SocketAddr, laddr: SocketAddr) -> Arc<ClientInfo> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let info = Arc::new(ClientInfo {
            id,
            addr,
            laddr,
            since: Instant::now(),
            name: Mutex::new(None),
            user: Mutex::new(Arc::from("")),
            lib: Mutex::new((None, None)),
            last: Mutex::new(("NULL", coarse_ms())),
            resp: AtomicU64::new(2),
            owed: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            freeing: AtomicU64::new(0),
            killed: AtomicBool::new(false),
            kill: tokio::sync::Notify::new(),
        });
        self.map.lock().insert(id, Arc::clone(&info));
        info
    }

    /// Removes a connection (and what it owed from the total).
    pub fn unregister(&self, id: u64) {
        if let Some(c) = self.map.lock().remove(&id) {
            self.settle(&c);
        }
    }

    /// Connections now.
    pub fn count(&self) -> usize {
        self.map.lock().len()
    }

    /// Closes the connections `matches` picks (`CLIENT KILL`): each ends
    /// at once, whatever it was doing (a parked request is withdrawn, as
    /// when a client leaves). How many.
    pub fn kill(&self, matches: impl Fn(&ClientInfo) -> bool) -> usize {
        let clients: Vec<Arc<ClientInfo>> = self.map.lock().values().cloned().collect();
        let mut n = 0;
        for c in clients.iter().filter(|c| matches(c)) {
            c.killed.store(true, Ordering::Relaxed);
            c.kill.notify_one();
            n += 1;
        }
        n
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_the_clients_owing_the_most_are_evicted_first() {
        let clients = Clients::with_budget(100);
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let a = clients.register(addr, addr);
        let b = clients.register(addr, addr);
        let c = clients.register(addr, addr);
        assert_eq!(clients.account(&a, 0, 50), Accounted::Ok);
        assert_eq!(clients.account(&b, 0, 30), Accounted::Ok);
        assert_eq!(clients.account(&c, 0, 15), Accounted::Ok);
        assert_eq!(clients.owed(), 95);
        // c grows past the budget: a, owing the most, goes (enough alone).
        assert_eq!(clients.account(&c, 15, 40), Accounted::EvictedOthers);
        assert!(a.evicted.load(Ordering::Relaxed));
        assert!(!b.evicted.load(Ordering::Relaxed));
        assert_eq!(clients.owed(), 70);
        assert_eq!(clients.evictions(), 1);
        // c grows again and now owes the most: it goes itself.
        assert_eq!(clients.account(&c, 40, 90), Accounted::Evicted);
        assert_eq!(clients.owed(), 30);
        assert!(!b.evicted.load(Ordering::Relaxed));
        // Leaving settles what is owed.
        clients.unregister(b.id);
        assert_eq!(clients.owed(), 0);
        // An evicted client's later accounting changes nothing.
        assert_eq!(clients.account(&a, 50, 0), Accounted::Evicted);
        assert_eq!(clients.owed(), 0);
    }
}
