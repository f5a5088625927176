//! Client configuration, built with by-value setters.

use std::time::Duration;

/// How a [`Client`](crate::Client) connects, waits and retries.
///
/// ```
/// use std::time::Duration;
/// let config = idem_client::ClientConfig::default()
///     .request_timeout(Duration::from_secs(2))
///     .default_lease(Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) failover_backoff_max: Duration,
    pub(crate) retries: u32,
    pub(crate) max_redirects: u32,
    pub(crate) default_lease: Option<Duration>,
    pub(crate) default_retain: Option<Duration>,
    pub(crate) default_wait: Option<Duration>,
    pub(crate) lazy_connect: bool,
    pub(crate) deadline: Duration,
    pub(crate) max_waiting_connections: usize,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) tls: TlsOptions,
}

/// TLS settings (feature `tls`): whether to use it, what to trust, what to
/// present.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    pub(crate) enabled: bool,
    /// CA certificates to trust, PEM.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its key, PEM.
    pub(crate) client_cert: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry (default: the host of
    /// the address).
    pub(crate) server_name: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("enabled", &self.enabled)
            .field("ca_pem", &self.ca_pem.as_ref().map(|p| p.len()))
            .field("client_cert", &self.client_cert.as_ref().map(|_| "(set)"))
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// A user and password sent with `AUTH` on every new connection.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// `None`: the default user (`AUTH password`).
    pub(crate) user: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"(hidden)")
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            failover_backoff_max: Duration::from_millis(100),
            retries: 5,
            max_redirects: 5,
            default_lease: None,
            default_retain: None,
            default_wait: None,
            lazy_connect: false,
            deadline: Duration::from_secs(10),
            max_waiting_connections: 256,
            credentials: None,
            tls: TlsOptions::default(),
        }
    }
}

impl ClientConfig {
    /// Time allowed to open a connection (default 2 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time allowed for a reply, not counting a claim's WAIT (default 5 s).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Reconnect and retry backoff: starts at `min`, doubles up to `max`
    /// (defaults 20 ms and 1 s).
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }

    /// The longest wait between tries while a cluster changes leader (a
    /// seed refuses the connection, answers `-TRYAGAIN` or `-CLUSTERDOWN`,
    /// or redirects to a node that is gone): default 100 ms, so that a
    /// call finds the new leader within a tenth of a second of its
    /// election (about 0.3 s after a leader's process dies) rather than
    /// after a doubled backoff. The backoff still starts at its minimum
    /// and doubles up to this.
    pub fn failover_backoff_max(mut self, d: Duration) -> Self {
        self.failover_backoff_max = d;
        self
    }

    /// How many times a request is retried after a timeout, `-TRYAGAIN` or
    /// another connection failure (default 5; 0 disables those retries). A
    /// connection refused, reset or closed (a server restarting, a node
    /// failing) is retried until the call's [`deadline`](Self::deadline)
    /// whatever this is, backing off up to `backoff_max`; so is every
    /// failure of a client of several seed nodes (a cluster), or of one
    /// that was sent `-MOVED` (a cluster behind one address), backing off
    /// up to [`failover_backoff_max`](Self::failover_backoff_max): a
    /// restart or a failover takes a moment.
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// How many `-MOVED` redirects one request follows before it asks the
    /// seed nodes again (default 5).
    pub fn max_redirects(mut self, n: u32) -> Self {
        self.max_redirects = n;
        self
    }

    /// Lease for claims that set none (default 30 s; the server's own
    /// default is not used: the client sends the lease it renews).
    pub fn default_lease(mut self, d: Duration) -> Self {
        self.default_lease = Some(d);
        self
    }

    /// Retention for claims that set none (default: the server's).
    pub fn default_retain(mut self, d: Duration) -> Self {
        self.default_retain = Some(d);
        self
    }

    /// The overall time one call may take (see [`deadline`](Self::deadline)).
    pub fn call_deadline(&self) -> Duration {
        self.deadline
    }

    /// The reconnect and retry backoff, shortest and longest (see
    /// [`backoff`](Self::backoff)).
    pub fn backoff_range(&self) -> (Duration, Duration) {
        (self.backoff_min, self.backoff_max)
    }

    /// Overall time one call may take, retries and reconnects included
    /// (default 10 s); a claim's or settle's server-side WAIT is added to
    /// it. Past it the call fails with a timeout that says how many
    /// attempts were made. Per call: [`ClaimBuilder::deadline`],
    /// [`RunOptions::deadline`].
    ///
    /// [`ClaimBuilder::deadline`]: crate::ClaimBuilder::deadline
    /// [`RunOptions::deadline`]: crate::RunOptions::deadline
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }

    /// Requests that wait server-side (a claim or settle with WAIT) use a
    /// connection each; at most this many are open at once (default 256).
    /// Past it, waiting requests queue for one (within their deadline).
    pub fn max_waiting_connections(mut self, n: usize) -> Self {
        self.max_waiting_connections = n.max(1);
        self
    }

    /// Whether [`Client::connect`](crate::Client::connect) returns without
    /// connecting (default false): the first request connects, and checks
    /// the server then. By default `connect` opens a connection and checks
    /// with `HELLO` that the peer is an Idem server, so a wrong address
    /// fails with a clear error ([`NotIdem`](crate::ErrorKind::NotIdem)
    /// when the peer answers something else, such as Redis or an HTTP
    /// error; a timeout when it does not answer at all).
    pub fn lazy_connect(mut self, lazy: bool) -> Self {
        self.lazy_connect = lazy;
        self
    }

    /// Authenticates every connection with `AUTH password` (the server's
    /// `requirepass`), before anything else; also after every reconnect.
    /// A wrong password fails with [`ErrorKind::Auth`](crate::ErrorKind::Auth),
    /// never retried. The password is not shown by `Debug`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: None,
            password: password.into(),
        });
        self
    }

    /// Like [`password`](Self::password), with `AUTH user password`.
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: Some(user.into()),
            password: password.into(),
        });
        self
    }

    /// Talks TLS to the server (as an `idems://` URL does); needs the
    /// `tls` feature (without it, connecting fails with
    /// [`InvalidAddress`](crate::ErrorKind::InvalidAddress)). The server's
    /// certificate must be signed by a CA given with
    /// [`tls_ca_pem`](Self::tls_ca_pem) and name the host connected to
    /// (or [`tls_server_name`](Self::tls_server_name)).
    pub fn tls(mut self, enabled: bool) -> Self {
        self.tls.enabled = enabled;
        self
    }

    /// The CA certificates (PEM) that sign the server's certificate; turns
    /// TLS on.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.enabled = true;
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// A client certificate chain and its private key (PEM), for servers
    /// that require one (`tls_auth_clients`); turns TLS on. The key is not
    /// shown by `Debug`.
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.enabled = true;
        self.tls.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// The name the server's certificate must carry, when it is not the
    /// host connected to (a DNS name or an IP address).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls.server_name = Some(name.into());
        self
    }

    /// Server-side wait for claims that set none (default: no wait).
    pub fn default_wait(mut self, d: Duration) -> Self {
        self.default_wait = Some(d);
        self
    }

    /// The wait before retry `attempt + 1`: doubling from the minimum, at
    /// most the maximum, or the failover maximum while a cluster changes
    /// leader.
    pub(crate) fn backoff_for(&self, attempt: u32, failover: bool) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        let max = if failover {
            self.failover_backoff_max.min(self.backoff_max)
        } else {
            self.backoff_max
        };
        self.backoff_min.saturating_mul(factor).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_maximum_and_to_less_while_a_cluster_fails_over() {
        let cfg = ClientConfig::default();
        let ms = |attempt, failover| cfg.backoff_for(attempt, failover).as_millis();
        let plain: Vec<_> = (0..8).map(|a| ms(a, false)).collect();
        assert_eq!(plain, [20, 40, 80, 160, 320, 640, 1000, 1000]);
        let failover: Vec<_> = (0..8).map(|a| ms(a, true)).collect();
        assert_eq!(failover, [20, 40, 80, 100, 100, 100, 100, 100]);
        // Never above the plain maximum, and set apart from it.
        let cfg = ClientConfig::default()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .failover_backoff_max(Duration::from_millis(200));
        assert_eq!(cfg.backoff_for(9, true), Duration::from_millis(50));
        let cfg = ClientConfig::default().failover_backoff_max(Duration::from_millis(30));
        assert_eq!(cfg.backoff_for(9, true), Duration::from_millis(30));
        assert_eq!(cfg.backoff_for(9, false), Duration::from_secs(1));
    }
}
