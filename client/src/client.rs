//! The client handle and the typed commands.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_protocol::cmd::{
    Abandon, Claim as ClaimCmd, Complete, Forget, Inspect, Journal, Ping, Release, Renew, Settle,
};
use idem_protocol::{
    ClaimReply, Command, ErrorCode, Frame, OnExpire, Outcome, RecordInfo, ServerError, SettleReply,
};
use tokio::sync::Mutex as AsyncMutex;

use crate::claim::Claim;
use crate::config::{ClientConfig, Credentials};
use crate::connection::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Key;

/// A connection to an Idem server (or cluster): a cheap `Clone` handle.
///
/// All clones share one multiplexed, pipelined connection per node, driven
/// by one task. Behavior:
///
/// - Claims and settles that WAIT first ask without waiting, on the shared
///   connection; only those that find the key in flight wait, on
///   connections of their own (kept in a small idle pool), because the
///   server holds back the replies of later requests on a connection while
///   one of its requests waits. (So a waiting claim may take a key just
///   freed ahead of requests already parked on it, as any claim without
///   WAIT may.)
/// - Requests from many tasks are pipelined on the shared connection and
///   answered in order.
/// - When the connection fails, pending requests get a connection error and
///   the next request reconnects, with exponential backoff between attempts.
/// - Requests are retried after connection failures, timeouts and
///   `-TRYAGAIN` (up to [`ClientConfig::retries`]); every Idem request is safe
///   to retry: a claim carries an attempt id, owner calls carry a fence, a
///   repeated COMPLETE is acknowledged without change. (A retried RELEASE or
///   ABANDON whose first try landed may report `FENCED` if another owner took
///   over in between.)
/// - `-MOVED slot host:port` (a cluster follower naming the leader)
///   switches the client to that node, at most
///   [`ClientConfig::max_redirects`] times per call. A redirect to the
///   node itself, a redirect cycle or a node that cannot be reached makes
///   the client ask its seed nodes again (the addresses given to
///   [`connect`](Client::connect), comma-separated), with backoff, until
///   the call's deadline. `-TRYAGAIN` and `-CLUSTERDOWN` (an election runs)
///   are retried the same way. A claim retried keeps its attempt id, so a
///   lost reply never makes a second owner; a claim or settle that was
///   waiting is sent again with the wait time it has left.
///
/// # Cancellation
///
/// Every method is cancellation-safe for the connection: dropping a future
/// mid-request leaves the request in the pipeline; its reply is read and
/// discarded, and other callers are not affected. A claim is also safe for
/// the key: it runs in a task of its own, so when its caller goes away
/// (dropped future, timeout, client hang-up) a grant that arrives later is
/// settled at once (`ACQUIRED` released, `RECOVER` abandoned again with its
/// journal), and a claim waiting server-side is withdrawn (its connection
/// is closed; a grant that raced the close is found by its attempt id and
/// settled). A claim that fails with its outcome unknown (its deadline
/// passed, the connection broke) is looked for the same way. All of this
/// is best effort: when the server cannot be reached to settle a grant,
/// its lease lapses as `on_expire` says. A [`Claim`] guard dropped before
/// it is finished abandons its claim.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("target", &self.target())
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    /// The addresses the client was given (a cluster's nodes).
    seeds: Vec<String>,
    target: parking::Mutex<String>,
    conns: parking::Mutex<HashMap<String, Connection>>,
    /// One connect at a time per node (a node that does not answer holds
    /// up only those who need it).
    connecting: parking::Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// A `-MOVED` was seen: the client talks to a cluster, even through
    /// one seed (a virtual address), and rides out its failovers.
    seen_moved: AtomicBool,
    /// Idle connections for waiting requests, by node.
    waiting: parking::Mutex<Vec<(String, Connection)>>,
    /// Waiting requests in progress, at most `max_waiting_connections`.
    waiting_slots: Arc<tokio::sync::Semaphore>,
    pub(crate) stats: Counters,
    /// TLS, if the client talks it (built once from the config).
    tls: Option<Arc<crate::tls::Tls>>,
    /// Claims being sent or settled, by attempt id (see [`send_claim`]).
    claims: parking::Mutex<HashMap<Bytes, Arc<Settling>>>,
}

/// The clean-up of one claim: a grant nobody will use (its caller left, or
/// its outcome was unknown to the caller) is released under `step`, unless
/// a later claim with the same attempt id, which would get that grant back,
/// has `stopped` it.
#[derive(Default)]
struct Settling {
    stopped: AtomicBool,
    step: AsyncMutex<()>,
}

/// The client's counters (see [`ClientStats`]).
#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    redirects: AtomicU64,
    failures: AtomicU64,
    pub(crate) run_once_calls: AtomicU64,
    pub(crate) effects_run: AtomicU64,
    pub(crate) replays: AtomicU64,
    orphans_settled: AtomicU64,
}

/// What a [`Client`] (all its clones) has done since it was made, for a
/// service to export as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Calls to the server (a call retried counts once).
    pub requests: u64,
    /// Retries after connection failures, timeouts and `-TRYAGAIN`.
    pub retries: u64,
    /// `-MOVED` redirects followed.
    pub redirects: u64,
    /// Requests that failed for good (retries or deadline exhausted),
    /// the background renewals of held claims included (a guard tries
    /// again at its next period).
    pub failures: u64,
    /// `run_once` calls.
    pub run_once_calls: u64,
    /// Effects `run_once` ran.
    pub effects_run: u64,
    /// Completed outcomes replayed instead of run.
    pub replays: u64,
    /// Grants settled for callers that went away (released or abandoned).
    pub orphans_settled: u64,
}

/// Idle connections kept for waiting requests.
const IDLE_WAIT_CONNECTIONS: usize = 16;

/// The least time a last try before a call's deadline is given.
const MIN_LAST_TRY: Duration = Duration::from_millis(20);

/// The `host:port` of each seed of `addrs`: `host:port` or
/// `idem://host:port[/]`, several separated by commas (the nodes of a
/// cluster: `idem://h1:7379,h2:7379,h3:7379`).
#[cfg(test)]
fn parse_addresses(addrs: &str) -> Result<Vec<String>> {
    Ok(parse_target(addrs)?.0)
}

/// What an address or URL names: the nodes, the credentials of an
/// `idem://user:password@...` URL, and whether it is `idems://` (TLS).
type Target = (Vec<String>, Option<Credentials>, bool);

/// The addresses, and the credentials of an `idem://user:password@...`
/// URL (percent-decoded; an empty user is the default user).
pub(crate) fn parse_target(addrs: &str) -> Result<Target> {
    let (scheme, rest) = match addrs.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, addrs),
    };
    let mut credentials = None;
    // Hosts hold no '@': the last one ends the user and password, which
    // may hold anything (percent-encoding is decoded). Errors never quote
    // them.
    let rest = match (scheme, rest.rsplit_once('@')) {
        (Some("idem" | "idems"), Some((userinfo, hosts))) => {
            let bad = |why: &str| {
                Error::new(
                    ErrorKind::InvalidAddress,
                    format!("the URL's user and password: {why}"),
                )
            };
            let Some((user, password)) = userinfo.split_once(':') else {
                return Err(bad(
                    "no password (idem://user:password@host:port, or idem://:password@host:port)",
                ));
            };
            let user = percent_decode(user).ok_or_else(|| bad("bad percent-encoding"))?;
            let password = percent_decode(password).ok_or_else(|| bad("bad percent-encoding"))?;
            credentials = Some(Credentials {
                user: (!user.is_empty()).then_some(user),
                password,
            });
            hosts
        }
        (_, Some(_)) => {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                "credentials need an idem:// URL (idem://user:password@host:port)",
            ));
        }
        _ => rest,
    };
    let mut out = Vec::new();
    for one in rest.split(',').map(str::trim) {
        let one = match scheme {
            Some(scheme) => parse_address(&format!("{scheme}://{one}"))?,
            None => parse_address(one)?,
        };
        if !out.contains(&one) {
            out.push(one);
        }
    }
    Ok((out, credentials, scheme == Some("idems")))
}

/// `%XX` escapes decoded (UTF-8).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `host:port` of an address given as `host:port` or
/// `idem://host:port[/]`.
fn parse_address(addr: &str) -> Result<String> {
    let invalid = |why: &str| {
        Error::new(
            ErrorKind::InvalidAddress,
            format!("'{addr}': {why} (expected host:port, idem://host:port or idems://host:port)"),
        )
    };
    let rest = match addr.split_once("://") {
        None => addr,
        Some(("idem" | "idems", rest)) => rest,
        Some((scheme, _)) => return Err(invalid(&format!("unknown scheme '{scheme}'"))),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(invalid("a path or options after host:port"));
    }
    match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(rest.to_owned())
        }
        _ => Err(invalid("no host:port")),
    }
}

/// What a failed call was: named in its error.
struct CallContext<'a> {
    cmd: &'a Command,
    addr: &'a str,
    attempts: u32,
    elapsed: Duration,
}

impl std::fmt::Display for CallContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cmd.name().to_ascii_uppercase())?;
        if let Some(key) = self.cmd.key() {
            let shown = String::from_utf8_lossy(&key[..key.len().min(64)]);
            write!(f, " {shown:?}")?;
        }
        if let Command::Claim(c) = self.cmd
            && let Some(attempt) = &c.attempt
        {
            write!(f, " (attempt {})", String::from_utf8_lossy(attempt))?;
        }
        write!(
            f,
            " to {} failed after {} attempt{} in {:.1?}",
            self.addr,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.elapsed
        )
    }
}

/// Aborts a waiting request's connection when dropped armed.
struct AbortOnDrop(Option<Connection>);

impl AbortOnDrop {
    fn disarm(mut self) -> Option<Connection> {
        self.0.take()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.abort();
        }
    }
}

/// Small std-mutex wrapper: never held across `.await`.
mod parking {
    pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Mutex(std::sync::Mutex::new(v))
        }

        pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

/// A completed outcome, as replayed by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// OK, or ERR for a permanent error.
    pub outcome: Outcome,
    /// The stored value.
    pub value: Bytes,
    /// True when this outcome was stored by an earlier call (a replay);
    /// false when this call ran the effect.
    pub replayed: bool,
}

impl Completed {
    /// Whether the outcome is OK.
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// Decodes the value as JSON.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::de::DeserializeOwned>(
        &self,
    ) -> std::result::Result<T, serde_json::Error> {
        serde_json::from_slice(&self.value)
    }
}

/// The outcome of a claim.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// You own the key: run the effect, then finish the guard.
    Acquired(Claim),
    /// The outcome is known: do not run the effect.
    Completed(Completed),
    /// A live owner holds the key (and the wait, if any, ran out).
    InFlight {
        /// Lease left on the owner's claim.
        remaining: Duration,
    },
    /// The previous owner abandoned mid-effect; you own the key now and must
    /// find out from the journal what happened before acting.
    Recover {
        /// The guard of your ownership.
        claim: Claim,
        /// The previous owner's journal.
        journal: Bytes,
    },
}

/// What `SETTLE` found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The outcome is known.
    Completed(Completed),
    /// No record.
    Absent,
    /// The owner gave up mid-effect.
    Abandoned {
        /// Its journal.
        journal: Bytes,
    },
    /// Still in flight.
    InFlight {
        /// Lease left.
        remaining: Duration,
    },
}

fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// A fresh attempt id: 128 random bits in hex.
pub(crate) fn attempt_id() -> Bytes {
    use std::hash::{BuildHasher, RandomState};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let a = RandomState::new().hash_one((n, std::process::id()));
    let b = RandomState::new().hash_one((a, n));
    Bytes::from(format!("{a:016x}{b:016x}"))
}

fn typed<T>(
    r: std::result::Result<T, std::result::Result<ServerError, idem_protocol::ReplyError>>,
) -> Result<T> {
    r.map_err(|e| match e {
        Ok(server) => Error::server(server),
        Err(bad) => Error::new(ErrorKind::Protocol, bad.to_string()),
    })
}

fn expect_ok(frame: Frame) -> Result<()> {
    match frame {
        Frame::Simple(s) if &s[..] == b"OK" => Ok(()),
        Frame::Error(e) => Err(Error::server(ServerError::parse(&e))),
        other => Err(Error::new(
            ErrorKind::Protocol,
            format!("expected +OK, got {other:?}"),
        )),
    }
}

impl Client {
    /// Connects to `addr` with the default configuration: `host:port` or
    /// an `idem://host:port` URL, with credentials if the server has a
    /// password: `idem://:password@host:port` or
    /// `idem://user:password@host:port` (percent-encoded). `idems://...`
    /// talks TLS (feature `tls`; the CA comes from
    /// [`ClientConfig::tls_ca_pem`]). For a
    /// cluster, give several nodes separated by commas
    /// (`h1:7379,h2:7379,h3:7379`): the client starts with the first that
    /// answers and follows `-MOVED` to the leader.
    pub async fn connect(addr: impl Into<String>) -> Result<Client> {
        Client::connect_with_config(addr, ClientConfig::default()).await
    }

    /// Connects to `addr` with `config`. Fails if the server cannot be
    /// reached now; later failures are retried as the config says.
    pub async fn connect_with_config(
        addr: impl Into<String>,
        config: ClientConfig,
    ) -> Result<Client> {
        let (seeds, credentials, tls) = parse_target(&addr.into())?;
        let mut config = config;
        if config.credentials.is_none() {
            config.credentials = credentials;
        }
        if tls {
            config.tls.enabled = true;
        }
        let tls = crate::tls::Tls::new(&config.tls)?;
        let addr = seeds[0].clone();
        let client = Client {
            inner: Arc::new(Inner {
                seeds,
                target: parking::Mutex::new(addr.clone()),
                conns: parking::Mutex::new(HashMap::new()),
                connecting: parking::Mutex::new(HashMap::new()),
                seen_moved: AtomicBool::new(false),
                waiting: parking::Mutex::new(Vec::new()),
                waiting_slots: Arc::new(tokio::sync::Semaphore::new(
                    config.max_waiting_connections,
                )),
                stats: Counters::default(),
                tls,
                claims: parking::Mutex::new(HashMap::new()),
                config,
            }),
        };
        if !client.inner.config.lazy_connect {
            // The first seed that answers.
            let mut first_err = None;
            for seed in client.inner.seeds.clone() {
                match client.connection(&seed).await {
                    Ok(_) => {
                        *client.inner.target.lock() = seed;
                        first_err = None;
                        break;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
        }
        Ok(client)
    }

    /// What this client (all its clones) has done so far.
    pub fn stats(&self) -> ClientStats {
        let c = &self.inner.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            requests: get(&c.requests),
            retries: get(&c.retries),
            redirects: get(&c.redirects),
            failures: get(&c.failures),
            run_once_calls: get(&c.run_once_calls),
            effects_run: get(&c.effects_run),
            replays: get(&c.replays),
            orphans_settled: get(&c.orphans_settled),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The node requests go to now (changes after `-MOVED`).
    pub fn target(&self) -> String {
        self.inner.target.lock().clone()
    }

    /// Registers a claim with `attempt` about to be sent. A clean-up still
    /// running for an earlier claim with that id is stopped first (after a
    /// step of it under way, a release, is done; waited for up to
    /// `within`): otherwise it could release the very grant this claim
    /// gets back (the server answers a claim by the attempt id that owns
    /// the key with its grant). Nothing changes if this is cancelled or
    /// times out before the clean-up stops.
    async fn claim_sent(&self, attempt: &Bytes, within: Duration) -> Result<Arc<Settling>> {
        let earlier = self.inner.claims.lock().get(attempt).cloned();
        if let Some(earlier) = earlier {
            let Ok(step) = tokio::time::timeout(within, earlier.step.lock()).await else {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "the clean-up of an earlier claim with this attempt id did not finish in time",
                )
                .with_attempt(Some(attempt.clone())));
            };
            earlier.stopped.store(true, Ordering::Release);
            drop(step);
        }
        let token = Arc::new(Settling::default());
        self.inner
            .claims
            .lock()
            .insert(attempt.clone(), Arc::clone(&token));
        Ok(token)
    }

    /// Forgets the claim `token` of `attempt` (once nothing of it is left
    /// to settle), unless a later claim with that id took its place.
    fn claim_done(&self, attempt: &Bytes, token: &Arc<Settling>) {
        let mut claims = self.inner.claims.lock();
        if claims.get(attempt).is_some_and(|t| Arc::ptr_eq(t, token)) {
            claims.remove(attempt);
        }
    }

    /// The seeds this client was given.
    pub fn seeds(&self) -> &[String] {
        &self.inner.seeds
    }

    /// Moves to the seed after `from` (the first if `from` is not one):
    /// after a refused connection, a redirect to the node itself or a
    /// redirect cycle.
    fn next_seed(&self, from: &str) {
        let seeds = &self.inner.seeds;
        let next = match seeds.iter().position(|s| s == from) {
            Some(i) => &seeds[(i + 1) % seeds.len()],
            None => &seeds[0],
        };
        *self.inner.target.lock() = next.clone();
    }

    async fn connection(&self, addr: &str) -> Result<Connection> {
        if let Some(c) = self.inner.conns.lock().get(addr).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let lock = Arc::clone(
            self.inner
                .connecting
                .lock()
                .entry(addr.to_owned())
                .or_default(),
        );
        let _one_at_a_time = lock.lock().await;
        if let Some(c) = self.inner.conns.lock().get(addr).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let conn = self.open_checked(addr).await?;
        self.inner
            .conns
            .lock()
            .insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    /// Opens a connection to `addr` and checks that it is an Idem server.
    async fn open_checked(&self, addr: &str) -> Result<Connection> {
        let conn = Connection::open(
            addr,
            self.inner.config.connect_timeout,
            self.inner.tls.as_deref(),
        )
        .await?;
        if let Some(c) = &self.inner.config.credentials {
            let mut args = vec![Bytes::from_static(b"AUTH")];
            if let Some(user) = &c.user {
                args.push(Bytes::copy_from_slice(user.as_bytes()));
            }
            args.push(Bytes::copy_from_slice(c.password.as_bytes()));
            let authed = conn
                .call(Frame::command(args), self.inner.config.request_timeout)
                .await
                .and_then(expect_ok);
            if let Err(e) = authed {
                conn.abort();
                return Err(e);
            }
        }
        handshake(&conn, addr, self.inner.config.request_timeout).await?;
        Ok(conn)
    }

    /// Sends a waiting request (CLAIM or SETTLE with WAIT) on a connection
    /// of its own: the server holds back later replies on a connection while
    /// a request waits, so it must not share the multiplexed one.
    async fn call_waiting(&self, addr: &str, frame: Frame, timeout: Duration) -> Result<Frame> {
        let _slot = Arc::clone(&self.inner.waiting_slots)
            .acquire_owned()
            .await
            .map_err(|_| Error::new(ErrorKind::ConnectionClosed, "client closed"))?;
        let idle = {
            let mut pool = self.inner.waiting.lock();
            // Those the server closed (it restarted, or left) go: kept,
            // they filled the pool for good, and every waiting request
            // opened a connection of its own from then on.
            pool.retain(|(_, c)| !c.is_closed());
            let pos = pool.iter().position(|(a, _)| a == addr);
            // In order: the first is the one idle longest (see below).
            pos.map(|i| pool.remove(i).1)
        };
        let conn = match idle {
            Some(c) => c,
            None => self.open_checked(addr).await?,
        };
        // If this future is dropped before the reply (the caller gave up),
        // the connection is closed at once, so the server withdraws the
        // parked request instead of handing it the key later.
        let abort = AbortOnDrop(Some(conn.clone()));
        let reply = conn.call(frame, timeout).await;
        let conn = abort.disarm().unwrap_or(conn);
        // Only a connection whose request was answered is reused: one that
        // timed out may still have the request parked on the server, so it
        // is closed (the server withdraws the request; a retry sends it
        // again with the same attempt id).
        if reply.is_err() {
            conn.abort();
        } else {
            let mut pool = self.inner.waiting.lock();
            pool.retain(|(_, c)| !c.is_closed());
            if pool.len() >= IDLE_WAIT_CONNECTIONS {
                // The one idle longest goes (to a node that no longer
                // leads, say): the newest are those most likely of use.
                pool.remove(0).1.abort();
            }
            pool.push((addr.to_owned(), conn));
        }
        reply
    }

    /// Sends a command, following redirects and retrying as configured.
    /// Error replies other than MOVED, TRYAGAIN and CLUSTERDOWN are returned
    /// as frames.
    pub(crate) async fn request(&self, cmd: &Command, extra: Duration) -> Result<Frame> {
        self.request_within(cmd, extra, None).await
    }

    /// [`request`](Self::request) within `budget` (the configured deadline
    /// if `None`), plus `extra` (a server-side wait).
    ///
    /// Runs in a tracing span `idem.request` (command, key), which records
    /// how many attempts the call took.
    pub(crate) async fn request_within(
        &self,
        cmd: &Command,
        extra: Duration,
        budget: Option<Duration>,
    ) -> Result<Frame> {
        use tracing::Instrument;
        let span = tracing::debug_span!(
            "idem.request",
            cmd = cmd.name(),
            key = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        if let Some(key) = cmd.key().filter(|_| !span.is_disabled()) {
            span.record("key", tracing::field::display(String::from_utf8_lossy(key)));
        }
        let attempts = std::sync::atomic::AtomicU32::new(0);
        self.inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        let result = self
            .ask_then_wait(cmd, extra, budget, &attempts)
            .instrument(span.clone())
            .await;
        span.record("attempts", attempts.load(Ordering::Relaxed));
        result
    }

    /// A waiting request (CLAIM or SETTLE with WAIT) first asks without
    /// waiting, pipelined on the shared connection like any request: most
    /// find the key free or settled and are answered in that one round
    /// trip. Only one that finds the key in flight waits, on a connection
    /// of its own, for what is left of its WAIT. Sent with WAIT at once,
    /// every such request took a connection of its own, and past the few
    /// kept idle, a new one: the HTTP layer (which claims every request
    /// with WAIT) opened a connection for one request in five.
    async fn ask_then_wait(
        &self,
        cmd: &Command,
        extra: Duration,
        budget: Option<Duration>,
        attempts: &std::sync::atomic::AtomicU32,
    ) -> Result<Frame> {
        let Some((asked, wait_ms)) = without_wait(cmd) else {
            return self.request_attempts(cmd, extra, budget, attempts).await;
        };
        let started = tokio::time::Instant::now();
        let first = self
            .request_attempts(&asked, Duration::ZERO, budget, attempts)
            .await;
        let used = started.elapsed();
        let left = wait_ms.saturating_sub(used.as_millis() as u64);
        if left == 0 || !matches!(&first, Ok(frame) if in_flight(frame)) {
            return first;
        }
        let waiting = with_wait(cmd, Some(left));
        let budget = budget
            .unwrap_or(self.inner.config.deadline)
            .saturating_sub(used);
        self.request_attempts(
            &waiting,
            Duration::from_millis(left).min(extra),
            Some(budget),
            attempts,
        )
        .await
    }

    async fn request_attempts(
        &self,
        cmd: &Command,
        extra: Duration,
        budget: Option<Duration>,
        attempts: &std::sync::atomic::AtomicU32,
    ) -> Result<Frame> {
        let cfg = &self.inner.config;
        let counters = &self.inner.stats;
        let frame = cmd.to_frame();
        let started = tokio::time::Instant::now();
        let deadline = started + budget.unwrap_or(cfg.deadline) + extra;
        let wait_total = wait_of(cmd);
        let waits = wait_total.is_some_and(|w| w > 0);
        let claim_attempt = match cmd {
            Command::Claim(c) => c.attempt.clone(),
            _ => None,
        };
        let (mut attempt, mut redirects, mut sent) = (0u32, 0u32, false);
        // Whether a try so far may have run (timed out, lost its
        // connection, or was refused after it was proposed): the error
        // that ends the call says so even if its own try was refused
        // before it could run.
        let mut may_have_run = false;
        // Retries while a cluster fails over (refused connections, MOVED to
        // a node that is gone, TRYAGAIN, CLUSTERDOWN) are bounded by the
        // deadline, not by `retries`: with several seeds, one of them
        // takes over.
        let cluster = self.inner.seeds.len() > 1 || self.inner.seen_moved.load(Ordering::Relaxed);
        loop {
            attempts.fetch_add(1, Ordering::Relaxed);
            let addr = self.target();
            let context = |attempts: u32| CallContext {
                cmd,
                addr: &addr,
                attempts,
                elapsed: started.elapsed(),
            };
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let timeout = (cfg.request_timeout + extra).min(remaining);
            // A waiting request sent again (retried, or redirected by a
            // node that stopped leading while it waited) waits only for
            // what is left.
            let frame = match wait_total {
                Some(total) if waits && sent => {
                    let left = total.saturating_sub(started.elapsed().as_millis() as u64);
                    with_wait(cmd, Some(left)).to_frame()
                }
                _ => frame.clone(),
            };
            sent = true;
            let call = async {
                if waits {
                    self.call_waiting(&addr, frame, timeout).await
                } else {
                    match self.connection(&addr).await {
                        Ok(conn) => conn.call(frame, timeout).await,
                        Err(e) => Err(e),
                    }
                }
            };
            let result = match tokio::time::timeout_at(deadline, call).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(ErrorKind::Timeout, "the call's deadline passed")),
            };
            let failover;
            let mut restart = false;
            let retry_err = match result {
                Ok(Frame::Error(text)) => {
                    let err = ServerError::parse(&text);
                    match err.code {
                        ErrorCode::Moved => {
                            let to = err.message.split_whitespace().nth(1).unwrap_or("");
                            if !to.is_empty() && to != addr && redirects < cfg.max_redirects {
                                redirects += 1;
                                self.inner.seen_moved.store(true, Ordering::Relaxed);
                                counters.redirects.fetch_add(1, Ordering::Relaxed);
                                *self.inner.target.lock() = to.to_owned();
                                continue;
                            }
                            // To itself, a cycle, or too many: ask the
                            // seeds again, after a backoff.
                            redirects = 0;
                            self.next_seed(&addr);
                            failover = cluster;
                            Error::server(err)
                        }
                        ErrorCode::TryAgain | ErrorCode::ClusterDown => {
                            if cluster {
                                // An election runs, or this node is cut
                                // off from the others: another may lead.
                                self.next_seed(&addr);
                            }
                            failover = cluster;
                            Error::server(err)
                        }
                        // An earlier try may have run (it timed out, or
                        // its connection broke after it was sent): this
                        // refusal does not say it did not, so the call
                        // ends with its outcome unknown (and a claim is
                        // looked for and settled).
                        _ if may_have_run => {
                            counters.failures.fetch_add(1, Ordering::Relaxed);
                            return Err(Error::server(err)
                                .or_may_have_run(true)
                                .with_context(context(attempt + 1))
                                .with_attempt(claim_attempt));
                        }
                        _ => return Ok(Frame::Error(text)),
                    }
                }
                Ok(frame) => return Ok(frame),
                // A connection refused, reset or closed is retried until
                // the deadline, as a failover is: a node restarting takes a
                // moment (~1-2 s), and giving up after `retries` quick
                // tries (0.6 s) left the calls of a client of one address
                // unrecorded across every restart. (With one address the
                // backoff still grows to `backoff_max`.)
                Err(e)
                    if e.is_retryable()
                        && (attempt < cfg.retries || cluster || e.is_restart_like()) =>
                {
                    if cluster && (e.is_connection() || e.is_timeout()) {
                        // The node is gone (or its host is: no answer at
                        // all): another seed leads or knows who does.
                        self.next_seed(&addr);
                    }
                    failover = cluster;
                    restart = e.is_restart_like();
                    e
                }
                Err(e) => {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    return Err(e
                        .or_may_have_run(may_have_run)
                        .with_context(context(attempt + 1))
                        .with_attempt(claim_attempt));
                }
            };
            may_have_run |= retry_err.may_have_run();
            if !failover && !restart && attempt >= cfg.retries {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                return Err(retry_err
                    .or_may_have_run(may_have_run)
                    .with_context(context(attempt + 1))
                    .with_attempt(claim_attempt));
            }
            // The backoff is cut short so that a last try has at least
            // MIN_LAST_TRY before the deadline, rather than no try.
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let backoff = cfg
                .backoff_for(attempt, failover)
                .min(left.saturating_sub(MIN_LAST_TRY));
            if left < MIN_LAST_TRY * 2 {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                return Err(retry_err
                    .or_may_have_run(may_have_run)
                    .with_context(context(attempt + 1))
                    .with_attempt(claim_attempt));
            }
            counters.retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(cmd = cmd.name(), error = %retry_err, attempt, "retrying request");
            tokio::time::sleep(backoff).await;
            attempt += 1;
        }
    }

    /// Starts a claim of `key`; set options, then `.await` it.
    pub fn claim(&self, key: impl Into<Key>) -> ClaimBuilder {
        ClaimBuilder {
            client: self.clone(),
            key: key.into().to_bytes(),
            opts: ClaimOptions::default(),
            attempt: attempt_id(),
        }
    }

    /// Waits up to `wait` (no wait if `None`) until `key` is not in flight,
    /// without claiming it.
    pub async fn settle(&self, key: impl Into<Key>, wait: Option<Duration>) -> Result<Settled> {
        let cmd = Command::Settle(Settle {
            key: key.into().to_bytes(),
            wait_ms: wait.map(|d| d.as_millis() as u64),
        });
        let frame = self.request(&cmd, wait.unwrap_or_default()).await?;
        Ok(match typed(SettleReply::from_frame(frame))? {
            SettleReply::Completed { outcome, value } => Settled::Completed(Completed {
                outcome,
                value,
                replayed: true,
            }),
            SettleReply::Absent => Settled::Absent,
            SettleReply::Abandoned { journal } => Settled::Abandoned { journal },
            SettleReply::InFlight { remaining_ms } => Settled::InFlight {
                remaining: Duration::from_millis(remaining_ms),
            },
        })
    }

    /// Completes `key` owned under `fence` with a successful result.
    pub async fn complete(
        &self,
        key: impl Into<Key>,
        fence: u64,
        value: impl Into<Bytes>,
        retain: Option<Duration>,
    ) -> Result<()> {
        self.finish(key.into().to_bytes(), fence, value.into(), retain, false)
            .await
    }

    /// Completes `key` with a permanent error, replayed to later callers.
    pub async fn complete_error(
        &self,
        key: impl Into<Key>,
        fence: u64,
        value: impl Into<Bytes>,
        retain: Option<Duration>,
    ) -> Result<()> {
        self.finish(key.into().to_bytes(), fence, value.into(), retain, true)
            .await
    }

    pub(crate) async fn finish(
        &self,
        key: Bytes,
        fence: u64,
        value: Bytes,
        retain: Option<Duration>,
        error: bool,
    ) -> Result<()> {
        let cmd = Command::Complete(Complete {
            key,
            fence,
            value,
            retain_ms: retain.map(ms),
            error,
        });
        expect_ok(self.request(&cmd, Duration::ZERO).await?)
    }

    /// Extends the lease of `key` owned under `fence` to `lease` from now.
    pub async fn renew(&self, key: impl Into<Key>, fence: u64, lease: Duration) -> Result<()> {
        let cmd = Command::Renew(Renew {
            key: key.into().to_bytes(),
            fence,
            lease_ms: ms(lease),
        });
        expect_ok(self.request(&cmd, Duration::ZERO).await?)
    }

    /// [`renew`](Self::renew) within `budget`, retries included (each try
    /// within it too).
    pub(crate) async fn renew_within(
        &self,
        key: impl Into<Key>,
        fence: u64,
        lease: Duration,
        budget: Duration,
    ) -> Result<()> {
        let cmd = Command::Renew(Renew {
            key: key.into().to_bytes(),
            fence,
            lease_ms: ms(lease),
        });
        expect_ok(
            self.request_within(&cmd, Duration::ZERO, Some(budget))
                .await?,
        )
    }

    /// Replaces the journal of `key` owned under `fence`.
    pub async fn journal(
        &self,
        key: impl Into<Key>,
        fence: u64,
        journal: impl Into<Bytes>,
    ) -> Result<()> {
        let cmd = Command::Journal(Journal {
            key: key.into().to_bytes(),
            fence,
            journal: journal.into(),
        });
        expect_ok(self.request(&cmd, Duration::ZERO).await?)
    }

    /// Gives up `key` owned under `fence`: the effect did not happen.
    pub async fn release(&self, key: impl Into<Key>, fence: u64) -> Result<()> {
        let cmd = Command::Release(Release {
            key: key.into().to_bytes(),
            fence,
        });
        expect_ok(self.request(&cmd, Duration::ZERO).await?)
    }

    /// Gives up `key` owned under `fence`: the effect may have happened.
    pub async fn abandon(&self, key: impl Into<Key>, fence: u64) -> Result<()> {
        let cmd = Command::Abandon(Abandon {
            key: key.into().to_bytes(),
            fence,
        });
        expect_ok(self.request(&cmd, Duration::ZERO).await?)
    }

    /// Reads a record without changing it.
    pub async fn inspect(&self, key: impl Into<Key>) -> Result<Option<RecordInfo>> {
        let frame = self
            .request(
                &Command::Inspect(Inspect {
                    key: key.into().to_bytes(),
                }),
                Duration::ZERO,
            )
            .await?;
        typed(RecordInfo::from_frame(frame))
    }

    /// Deletes a record (administrative); true if there was one.
    ///
    /// Retried like every call (a lost reply, a `-TRYAGAIN` during a
    /// failover). FORGET is not fenced: if an attempt whose reply was lost
    /// had deleted the record and another client claimed the key before the
    /// retry, the retry deletes that claim's record too. Use it on keys
    /// that are not busy.
    pub async fn forget(&self, key: impl Into<Key>) -> Result<bool> {
        match self
            .request(
                &Command::Forget(Forget {
                    key: key.into().to_bytes(),
                }),
                Duration::ZERO,
            )
            .await?
        {
            Frame::Integer(n) => Ok(n == 1),
            Frame::Error(e) => Err(Error::server(ServerError::parse(&e))),
            other => Err(Error::new(
                ErrorKind::Protocol,
                format!("expected an integer, got {other:?}"),
            )),
        }
    }

    /// Checks the server answers.
    pub async fn ping(&self) -> Result<()> {
        match self
            .request(&Command::Ping(Ping { message: None }), Duration::ZERO)
            .await?
        {
            Frame::Simple(s) if &s[..] == b"PONG" => Ok(()),
            Frame::Error(e) => Err(Error::server(ServerError::parse(&e))),
            other => Err(Error::new(
                ErrorKind::Protocol,
                format!("expected PONG, got {other:?}"),
            )),
        }
    }
}

/// Options of a claim; `.await` it (or call [`ClaimBuilder::send`]).
///
/// A random attempt id is chosen when the builder is made and reused when
/// the client retries after a lost reply, so a retry that finds its own
/// claim gets `Acquired` with the same fence instead of `InFlight`.
#[must_use = "a claim does nothing until awaited"]
pub struct ClaimBuilder {
    client: Client,
    key: Bytes,
    pub(crate) opts: ClaimOptions,
    attempt: Bytes,
}

/// The options of a claim a caller may set; those left unset take the
/// client's defaults when the claim is sent. Shared by [`ClaimBuilder`] and
/// [`RunOptions`](crate::RunOptions).
#[derive(Debug, Clone, Default)]
pub(crate) struct ClaimOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) retain: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) fingerprint: Option<Bytes>,
    pub(crate) on_expire: Option<OnExpire>,
    pub(crate) deadline: Option<Duration>,
}

impl ClaimBuilder {
    /// Lease length (default 30 s or the config's); renewed in the
    /// background while the guard lives.
    pub fn lease(mut self, d: Duration) -> Self {
        self.opts.lease = Some(d);
        self
    }

    /// Retention of the completed record (default: the config's
    /// [`default_retain`](ClientConfig::default_retain), else the
    /// server's).
    pub fn retain(mut self, d: Duration) -> Self {
        self.opts.retain = Some(d);
        self
    }

    /// Wait server-side this long for a live owner to finish (default:
    /// the config's [`default_wait`](ClientConfig::default_wait), else no
    /// wait).
    pub fn wait(mut self, d: Duration) -> Self {
        self.opts.wait = Some(d);
        self
    }

    /// Fingerprint of the request payload (default none: any payload
    /// matches).
    pub fn fingerprint(mut self, fp: impl Into<Bytes>) -> Self {
        self.opts.fingerprint = Some(fp.into());
        self
    }

    /// What a lapsed lease leaves behind (default [`OnExpire::Free`] for a
    /// plain claim; [`Client::run_once`] defaults to [`OnExpire::Recover`]).
    pub fn on_expire(mut self, policy: OnExpire) -> Self {
        self.opts.on_expire = Some(policy);
        self
    }

    /// Overall time the claim may take, retries included (default: the
    /// client's [`ClientConfig::deadline`]); its WAIT is added to it.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.opts.deadline = Some(d);
        self
    }

    /// Use this attempt id instead of the generated one (to resume a claim
    /// across processes).
    pub fn attempt(mut self, id: impl Into<Bytes>) -> Self {
        self.attempt = id.into();
        self
    }

    /// The attempt id this claim is sent with (generated, or set with
    /// [`attempt`](Self::attempt)): `INSPECT` shows it on the record of the
    /// claim that owns the key, so a caller that lost track of a claim can
    /// find out whether it owns the key.
    pub fn attempt_id(&self) -> &Bytes {
        &self.attempt
    }

    /// Sends the claim.
    pub async fn send(self) -> Result<ClaimOutcome> {
        let cfg = &self.client.inner.config;
        let lease = self
            .opts
            .lease
            .or(cfg.default_lease)
            .unwrap_or(Duration::from_secs(30));
        let retain = self.opts.retain.or(cfg.default_retain);
        let wait = self.opts.wait.or(cfg.default_wait).filter(|w| !w.is_zero());
        let cmd = Command::Claim(ClaimCmd {
            key: self.key.clone(),
            lease_ms: Some(ms(lease)),
            retain_ms: retain.map(ms),
            wait_ms: wait.map(|d| d.as_millis() as u64),
            fingerprint: self.opts.fingerprint.clone(),
            on_expire: self.opts.on_expire,
            attempt: Some(self.attempt.clone()),
        });
        let frame = send_claim(
            &self.client,
            cmd,
            wait.is_some(),
            self.attempt.clone(),
            self.opts.deadline,
        )
        .await?;
        Ok(match typed(ClaimReply::from_frame(frame))? {
            ClaimReply::Acquired { fence } => {
                ClaimOutcome::Acquired(Claim::new(self.client, self.key, fence, lease))
            }
            ClaimReply::Completed { outcome, value } => ClaimOutcome::Completed(Completed {
                outcome,
                value,
                replayed: true,
            }),
            ClaimReply::InFlight { remaining_ms } => ClaimOutcome::InFlight {
                remaining: Duration::from_millis(remaining_ms),
            },
            ClaimReply::Recover { fence, journal } => ClaimOutcome::Recover {
                claim: Claim::new(self.client, self.key, fence, lease),
                journal,
            },
        })
    }
}

impl IntoFuture for ClaimBuilder {
    type Output = Result<ClaimOutcome>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<ClaimOutcome>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.send())
    }
}

/// `cmd` without its WAIT, and the WAIT, if it is a request that waits.
fn without_wait(cmd: &Command) -> Option<(Command, u64)> {
    let wait = wait_of(cmd).filter(|&w| w > 0)?;
    Some((with_wait(cmd, None), wait))
}

/// The WAIT of a CLAIM or SETTLE, if it has one.
fn wait_of(cmd: &Command) -> Option<u64> {
    match cmd {
        Command::Claim(c) => c.wait_ms,
        Command::Settle(s) => s.wait_ms,
        _ => None,
    }
}

/// `cmd` with its WAIT set to `wait_ms` (a CLAIM or SETTLE; any other
/// command as it is).
fn with_wait(cmd: &Command, wait_ms: Option<u64>) -> Command {
    let mut changed = cmd.clone();
    match &mut changed {
        Command::Claim(c) => c.wait_ms = wait_ms,
        Command::Settle(s) => s.wait_ms = wait_ms,
        _ => {}
    }
    changed
}

/// Whether `frame` is an `INFLIGHT` reply (to a CLAIM or a SETTLE).
fn in_flight(frame: &Frame) -> bool {
    match frame {
        Frame::Array(items) if items.len() == 2 => matches!(
            &items[0],
            Frame::Simple(w) | Frame::Bulk(w) if w.as_ref() == b"INFLIGHT"
        ),
        _ => false,
    }
}

/// Sends a CLAIM from a task of its own, so that a caller who stops waiting
/// (its future dropped: a timeout, a client hang-up) never leaves the key
/// owned by nobody:
///
/// - a reply that comes after the caller left is settled at once:
///   `ACQUIRED` is released (the effect never started), `RECOVER` is
///   abandoned again, keeping the journal (the earlier owner's effect may
///   have happened);
/// - a claim that waits server-side is withdrawn: its connection is closed,
///   and a grant that raced the close (the key handed over just before) is
///   found with `INSPECT` by its attempt id and settled as above;
/// - a claim that failed with its outcome unknown (deadline, broken
///   connection, `-TRYAGAIN` after it was sent) is looked for and settled
///   the same way, while its caller may retry it with its attempt id: such
///   a retry from this client stops the clean-up first, so the grant it
///   gets back is never released under it.
async fn send_claim(
    client: &Client,
    cmd: Command,
    waits: bool,
    attempt: Bytes,
    budget: Option<Duration>,
) -> Result<Frame> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let client = client.clone();
    let Command::Claim(ref c) = cmd else {
        return Err(Error::new(ErrorKind::InvalidRequest, "not a CLAIM"));
    };
    let (key, wait) = (c.key.clone(), Duration::from_millis(c.wait_ms.unwrap_or(0)));
    let token = client
        .claim_sent(&attempt, budget.unwrap_or(client.inner.config.deadline))
        .await?;
    let (caller_client, caller_key) = (client.clone(), key.clone());
    let (caller_attempt, caller_token) = (attempt.clone(), Arc::clone(&token));
    // After this no grant can come: the last try's server-side wait is over.
    let until = tokio::time::Instant::now()
        + wait
        + budget.unwrap_or(client.inner.config.deadline)
        + client.inner.config.request_timeout;
    tokio::spawn(async move {
        let mut tx = tx;
        let reply = {
            // Boxed, so dropping it (and the waiting connection with it)
            // happens on the spot.
            let mut request = Box::pin(client.request_within(&cmd, wait, budget));
            tokio::select! {
                r = &mut request => r,
                () = tx.closed(), if waits => {
                    // Dropping the request aborts its connection.
                    drop(request);
                    settle_lost_claim(&client, &key, &cmd, &attempt, until, &token).await;
                    client.claim_done(&attempt, &token);
                    return;
                }
            }
        };
        // Only a claim that may have run is looked for: one refused before
        // it was proposed at every try (`-MOVED`, `-CLUSTERDOWN`, a
        // `-TRYAGAIN` of a node with too many writes pending) holds
        // nothing, and looking would only add load to a busy cluster.
        let unknown = matches!(&reply, Err(e) if e.may_have_run());
        let grant_possible = reply.is_ok();
        match tx.send(reply) {
            Err(Ok(frame)) => settle_orphan(&client, &key, frame, &token).await,
            // Given up on (deadline, connection lost, TRYAGAIN) with the
            // outcome unknown: a grant may still have been made, or be on
            // its way; it is looked for and settled.
            _ if unknown => {
                settle_lost_claim(&client, &key, &cmd, &attempt, until, &token).await;
            }
            // The caller has the reply (or its guard does): it lets go.
            Ok(()) if grant_possible => return,
            _ => {}
        }
        client.claim_done(&attempt, &token);
    });
    // A reply handed over just as the caller goes away is settled too.
    let mut guard = OrphanGuard {
        rx: Some(rx),
        client: caller_client,
        key: caller_key,
        attempt: caller_attempt,
        token: caller_token,
    };
    let stopped = || {
        Err(Error::new(
            ErrorKind::ConnectionClosed,
            "the claim's task stopped before the reply",
        ))
    };
    let reply = match guard.rx.as_mut() {
        Some(rx) => rx.await.unwrap_or_else(|_| stopped()),
        None => stopped(),
    };
    guard.rx = None;
    if reply.is_ok() {
        guard.client.claim_done(&guard.attempt, &guard.token);
    }
    reply
}

/// Settles a claim reply that reached the caller's channel but not the
/// caller (its future was dropped between the two).
struct OrphanGuard {
    rx: Option<tokio::sync::oneshot::Receiver<Result<Frame>>>,
    client: Client,
    key: Bytes,
    attempt: Bytes,
    token: Arc<Settling>,
}

impl Drop for OrphanGuard {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        match rx.try_recv() {
            Ok(Ok(frame)) => {
                let (client, key) = (self.client.clone(), self.key.clone());
                let (attempt, token) = (self.attempt.clone(), Arc::clone(&self.token));
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        settle_orphan(&client, &key, frame, &token).await;
                        client.claim_done(&attempt, &token);
                    });
                } else {
                    self.client.claim_done(&self.attempt, &self.token);
                }
            }
            // An error the task settles itself, if it has to.
            Ok(Err(_)) => {}
            // Not sent yet: the task settles what comes.
            Err(_) => {}
        }
    }
}

/// Settles a claim reply nobody will read: releases an `ACQUIRED`,
/// abandons a `RECOVER` again (unless a later claim with the same attempt
/// id stopped the clean-up: it got that grant back).
async fn settle_orphan(client: &Client, key: &Bytes, frame: Frame, token: &Settling) {
    let _step = token.step.lock().await;
    if token.stopped.load(Ordering::Acquire) {
        return;
    }
    settle_frame(client, key, frame).await;
}

/// Releases an `ACQUIRED`, abandons a `RECOVER` again.
async fn settle_frame(client: &Client, key: &Bytes, frame: Frame) {
    let result = match ClaimReply::from_frame(frame) {
        Ok(ClaimReply::Acquired { fence }) => client.release(key.clone(), fence).await,
        Ok(ClaimReply::Recover { fence, .. }) => client.abandon(key.clone(), fence).await,
        _ => return,
    };
    match result {
        Ok(()) => {
            client
                .inner
                .stats
                .orphans_settled
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?key, "settled the claim of a caller that left");
        }
        Err(e) => tracing::warn!(
            ?key,
            error = %e,
            "could not settle the claim of a caller that left; its lease will lapse"
        ),
    }
}

/// After withdrawing a waiting claim: if the key was handed to this
/// attempt before the server saw the withdrawal, the same claim sent again
/// (without waiting) gets that grant back, which is then settled.
///
/// The server normally sees the connection close within a millisecond,
/// but nothing orders that against requests on other connections, so the
/// key is looked at again a few times, the last once the server-side wait
/// (`until`) is over and no grant can come any more.
async fn settle_lost_claim(
    client: &Client,
    key: &Bytes,
    cmd: &Command,
    attempt: &Bytes,
    until: tokio::time::Instant,
    token: &Settling,
) {
    let mut looks = [
        tokio::time::Instant::now(),
        tokio::time::Instant::now() + Duration::from_millis(50),
        tokio::time::Instant::now() + Duration::from_millis(500),
        until,
    ];
    looks.sort();
    for at in looks {
        tokio::time::sleep_until(at).await;
        if token.stopped.load(Ordering::Acquire) {
            return;
        }
        let ours = match client.inspect(key.clone()).await {
            Ok(Some(info)) => {
                info.state == idem_protocol::RecordState::InFlight
                    && info.attempt.as_ref() == Some(attempt)
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(?key, error = %e, "cannot check a withdrawn claim");
                continue;
            }
        };
        if ours {
            // Claimed again and settled in one step: a retry by the caller
            // either stops this first or waits until the release is done
            // (and then claims afresh).
            let _step = token.step.lock().await;
            if token.stopped.load(Ordering::Acquire) {
                return;
            }
            let again = with_wait(cmd, None);
            if let Ok(frame) = client.request(&again, Duration::ZERO).await {
                settle_frame(client, key, frame).await;
            }
            return;
        }
    }
}

/// Checks with `HELLO` that the peer at `addr` is an Idem server: its
/// reply names the server (`server` = `idem`). Anything else (Redis, an
/// HTTP server, garbage) is a clear error instead of a failure later.
async fn handshake(conn: &Connection, addr: &str, timeout: Duration) -> Result<()> {
    let not_idem = |why: String| {
        conn.abort();
        Error::new(
            ErrorKind::NotIdem,
            format!("{addr} is not an Idem server: {why}"),
        )
    };
    let reply = match conn.call(Frame::command(["HELLO"]), timeout).await {
        Ok(r) => r,
        Err(e) if e.kind() == ErrorKind::Protocol => return Err(not_idem(e.detail().to_owned())),
        Err(e) => {
            // The reply may still come: the connection is not kept.
            conn.abort();
            return Err(e);
        }
    };
    let pairs: Vec<Frame> = match reply {
        Frame::Array(items) => items,
        Frame::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        Frame::Error(e) if e.starts_with(b"NOAUTH") => {
            conn.abort();
            return Err(Error::new(
                ErrorKind::Auth,
                format!(
                    "{addr} requires a password: set ClientConfig::password or connect to idem://:password@{addr}"
                ),
            ));
        }
        Frame::Error(e) => {
            return Err(not_idem(format!(
                "HELLO answered {}",
                String::from_utf8_lossy(&e)
            )));
        }
        other => return Err(not_idem(format!("HELLO answered {other:?}"))),
    };
    let server = pairs.chunks(2).find_map(|kv| match kv {
        [
            Frame::Bulk(k) | Frame::Simple(k),
            Frame::Bulk(v) | Frame::Simple(v),
        ] if &k[..] == b"server" => Some(v.clone()),
        _ => None,
    });
    match server {
        Some(name) if &name[..] == b"idem" => Ok(()),
        Some(name) => Err(not_idem(format!(
            "it says it is '{}'",
            String::from_utf8_lossy(&name)
        ))),
        None => Err(not_idem("HELLO named no server".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_address, parse_addresses, parse_target};

    #[test]
    fn addresses_and_urls() {
        for (given, want) in [
            ("127.0.0.1:7379", "127.0.0.1:7379"),
            ("idem://127.0.0.1:7379", "127.0.0.1:7379"),
            ("idem://localhost:7379/", "localhost:7379"),
            ("idem://[::1]:7379", "[::1]:7379"),
            ("idems://localhost:7379", "localhost:7379"),
        ] {
            assert_eq!(parse_address(given).unwrap(), want, "{given}");
        }
        for (given, why) in [
            ("localhost", "no host:port"),
            ("redis://localhost:6379", "unknown scheme 'redis'"),
            ("idem://:p%zz@localhost:7379", "percent-encoding"),
            ("idem://svc@localhost:7379", "no password"),
            ("user:pw@localhost:7379", "need an idem:// URL"),
            ("idem://localhost:7379/0", "path"),
            ("idem://localhost:port", "no host:port"),
            ("idem://a:7379,b", "no host:port"),
        ] {
            let e = parse_addresses(given).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidAddress);
            assert!(e.to_string().contains(why), "{given}: {e}");
        }
        // A cluster's seeds: commas, one scheme for all, duplicates once.
        assert_eq!(
            parse_addresses("idem://a:7379, b:7380,a:7379/").unwrap(),
            ["a:7379", "b:7380"]
        );
        assert_eq!(
            parse_addresses("10.0.0.1:7379,10.0.0.2:7379").unwrap(),
            ["10.0.0.1:7379", "10.0.0.2:7379"]
        );
    }

    #[test]
    fn credentials_in_urls() {
        let (seeds, c, tls) = parse_target("idem://svc:p%40ss%3Aw@a:7379,b:7379").unwrap();
        assert_eq!(seeds, ["a:7379", "b:7379"]);
        assert!(!tls);
        let (seeds, c2, tls) = parse_target("idems://u:p@a:7379").unwrap();
        assert_eq!(
            (seeds.len(), c2.unwrap().password.as_str(), tls),
            (1, "p", true)
        );
        let c = c.unwrap();
        assert_eq!(
            (c.user.as_deref(), c.password.as_str()),
            (Some("svc"), "p@ss:w")
        );
        let (_, c, _) = parse_target("idem://:secret@a:7379").unwrap();
        let c = c.unwrap();
        assert_eq!((c.user, c.password.as_str()), (None, "secret"));
        assert!(parse_target("a:7379").unwrap().1.is_none());
        // '@' and ',' in a password; errors never quote it.
        let (seeds, c, _) = parse_target("idem://:p@s,s@a:7379,b:7379").unwrap();
        assert_eq!((seeds.len(), c.unwrap().password.as_str()), (2, "p@s,s"));
        for bad in [
            "idem://:hunter2@a",
            "idem://u:hunter2@",
            "idem://:hunter2%zz@a:1",
        ] {
            let e = parse_target(bad).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
        // Never shown by Debug, nor a TLS key.
        let cfg = crate::ClientConfig::default()
            .password("hunter2")
            .tls_client_cert_pem("CERT", "hunter3-key");
        let shown = format!("{cfg:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter3"),
            "{shown}"
        );
    }

    /// TLS without what it needs is refused at once, saying what is
    /// missing (the feature, or the CA to trust).
    #[tokio::test]
    async fn tls_without_what_it_needs_is_refused() {
        let e = crate::Client::connect("idems://localhost:1")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidAddress);
        let want = if cfg!(feature = "tls") {
            "tls_ca_pem"
        } else {
            "`tls` feature"
        };
        assert!(e.to_string().contains(want), "{e}");
    }
}
