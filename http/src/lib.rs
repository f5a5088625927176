//! idem-http: an `Idempotency-Key` layer for tower and axum services, on
//! the Idem idempotency server.
//!
//! ```no_run
//! # async fn app() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use idem_http::IdempotencyLayer;
//!
//! let idem = idem_client::Client::connect("127.0.0.1:7379").await?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "paid" }))
//!     // Scoped by the caller: here an account header that a gateway sets
//!     // on every request. Refuse requests without one before this layer
//!     // (as `examples/payments.rs` does): the empty scope below would be
//!     // one key space shared by all of them.
//!     .layer(IdempotencyLayer::new(idem).scope(|parts| {
//!         let account = parts.headers.get("x-account-id");
//!         account.and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
//!     }));
//! # Ok(()) }
//! ```
//!
//! For each POST or PATCH (by default) carrying an `Idempotency-Key`, the
//! layer claims the key in Idem before the handler runs, so of any number
//! of concurrent duplicates exactly one runs the handler; the others wait
//! (server-side, up to [`wait`](IdempotencyLayer::wait)) and replay its
//! response, or get `409` with `Retry-After` if it is still running. The
//! handler's response is stored (status, an allow-list of headers, body)
//! and replayed to every later request with the key, marked
//! `Idempotent-Replayed: true`. A key reused with another request gets
//! `422`. What the handler's status means is a policy table
//! ([`default_policy`], replaceable with [`policy`](IdempotencyLayer::policy)):
//!
//! | the handler answers | the key is | a retry |
//! |---|---|---|
//! | 2xx, 3xx | completed | replays the response |
//! | 400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 422, 431 (refused before anything happened) | released | runs the handler again (the corrected request) |
//! | 408, 425, 429, 503 | released | runs the handler again |
//! | other 4xx (402, 409, 410, 412, ...) | completed as an error | replays the response |
//! | other 5xx, a panic, a timeout, a 1xx (not a final response to store: hyper answers `500`, or switches protocols on a `101`) | abandoned (outcome unknown) | gets `500 outcome-unknown`, or runs with [`Recovering`] under [`OnRecover::RunWithRecovery`] |
//!
//! A recovery run ([`Recovering`]) never releases: the key keeps what the
//! earlier run journaled until an outcome is recorded. The handler runs
//! to its end in a task of its own, and the key is settled, even if the
//! client goes away meanwhile (its retry then replays the outcome), and
//! if the store does not answer as the handler ends, the caller gets its
//! response after the client's deadline while the layer keeps trying to
//! store it for as long as the key is still the request's. Use
//! [`handler_timeout`](IdempotencyLayer::handler_timeout) rather than a
//! timeout layer inside this one: a timeout layer inside answers `408` or
//! `503` for a handler it cut off midway, which this layer would take for
//! "nothing happened" and release.
//!
//! Keys are scoped by [`scope`](IdempotencyLayer::scope) (a tenant or
//! principal): set one wherever callers are different principals, or one
//! could replay another's response by using its key. A layer without one
//! logs a warning when it is built, unless
//! [`shared_key_space`](IdempotencyLayer::shared_key_space) says that all
//! callers are one.
//!
//! The layer's own errors are RFC 9457 problem details ([`Problem`]).
//! Nothing is buffered without a bound: request bodies up to
//! [`max_request_bytes`](IdempotencyLayer::max_request_bytes) (`413`
//! beyond) received within
//! [`body_timeout`](IdempotencyLayer::body_timeout) (`408`), responses up to
//! [`max_response_bytes`](IdempotencyLayer::max_response_bytes) (a larger
//! one streams to its caller and replays answer `410
//! response-not-stored`).

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod header;
mod problem;
mod stored;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, request};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited, StreamBody};
use idem_client::{ClaimCtx, ClaimOutcome, Client, Completed, Key, OnExpire, Outcome};
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_service::Service;
use tracing::{Instrument, info, warn};

pub use problem::Problem;
use stored::Stored;

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header on replayed responses (`true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A boxed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of the layer's responses: the handler's, a replayed one, or a
/// problem.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// What a handler's response does to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Store the response as the outcome; replay it to every later request.
    Complete,
    /// Store it as a permanent error outcome; replay it likewise.
    CompleteError,
    /// Nothing happened: drop the claim, so a retry runs the handler again.
    Release,
    /// The outcome is unknown: a retry must recover (see [`OnRecover`]).
    Abandon,
}

/// The default policy: 1xx, 2xx and 3xx complete. A 4xx that refuses the
/// request before anything happened releases, so that the corrected
/// request (the draft asks clients to correct it before retrying) runs
/// under the same key: 400 (bad request), 401 and 403 (credentials), 404,
/// 405, 406, 411, 413, 414, 415, 422 (validation), 431; so do 408
/// (timeout), 425 (too early), 429 (too many requests) and 503
/// (unavailable). Other 4xx (402, 409, 410, 412, ...: an answer the
/// handler gave after looking) complete as errors; other 5xx abandon (the
/// handler may have had an effect before failing).
pub fn default_policy(status: StatusCode) -> Decision {
    match status.as_u16() {
        400 | 401 | 403..=406 | 408 | 411 | 413..=415 | 422 | 425 | 429 | 431 | 503 => {
            Decision::Release
        }
        // Not a final response to store: hyper answers `500` for it, with
        // no body (or switches protocols on a `101`), and neither is a
        // response to replay.
        100..=199 => Decision::Abandon,
        500..=599 => Decision::Abandon,
        400..=499 => Decision::CompleteError,
        _ => Decision::Complete,
    }
}

/// What a request does when it finds its key abandoned (an earlier request
/// ended without a known outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRecover {
    /// Answer `500 outcome-unknown` and leave the key abandoned, until an
    /// operator resolves it (`FORGET`, or a `COMPLETE` after checking).
    #[default]
    Refuse,
    /// Run the handler with a [`Recovering`] extension carrying the
    /// earlier request's journal: it finds out what happened and finishes.
    RunWithRecovery,
}

/// A request extension while the handler runs: the key's fence (a fencing
/// token for downstream systems) and its journal.
#[derive(Debug, Clone)]
pub struct Idempotency {
    ctx: ClaimCtx,
    key: String,
}

impl Idempotency {
    /// The `Idempotency-Key` as the client sent it (unquoted).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fence of this run: larger than every earlier run's.
    pub fn fence(&self) -> u64 {
        self.ctx.fence()
    }

    /// Records progress (replacing the earlier journal): a recovery after a
    /// crash is handed the last one.
    ///
    /// # Errors
    ///
    /// When Idem refuses it (`-FENCED`: the lease was lost) or cannot be
    /// reached.
    pub async fn journal(&self, journal: impl Into<Bytes>) -> idem_client::Result<()> {
        self.ctx.journal(journal).await
    }

    /// Whether ownership of the key was lost (the lease lapsed and another
    /// request may run): do not commit anything that depends on it.
    pub fn is_lost(&self) -> bool {
        self.ctx.is_lost()
    }
}

/// A request extension on a recovery run ([`OnRecover::RunWithRecovery`]):
/// the journal the abandoned request left (empty if none).
#[derive(Debug, Clone)]
pub struct Recovering {
    /// The last journal of the request that was abandoned.
    pub journal: Bytes,
}

type ScopeFn = dyn Fn(&request::Parts) -> String + Send + Sync;
type FingerprintFn = dyn Fn(&request::Parts, &Bytes) -> Bytes + Send + Sync;
type PolicyFn = dyn Fn(StatusCode) -> Decision + Send + Sync;

#[derive(Clone)]
struct Settings {
    client: Client,
    methods: Vec<Method>,
    required: bool,
    scope: Option<Arc<ScopeFn>>,
    lease: Duration,
    retention: Duration,
    wait: Duration,
    max_request_bytes: usize,
    body_timeout: Duration,
    max_response_bytes: usize,
    max_key_len: usize,
    policy: Arc<PolicyFn>,
    fingerprint: Option<Arc<FingerprintFn>>,
    ignore_query: Vec<String>,
    replay_headers: Vec<HeaderName>,
    handler_timeout: Option<Duration>,
    on_recover: OnRecover,
    namespace: String,
    /// All callers are one principal: no scope needed.
    shared: bool,
}

/// The layer; see the crate docs. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
    /// Whether the missing-scope warning was logged: once for a layer and
    /// its clones (a router applies one layer to each of its routes).
    warned: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &s.methods)
            .field("required", &s.required)
            .field("lease", &s.lease)
            .field("retention", &s.retention)
            .field("wait", &s.wait)
            .field("max_request_bytes", &s.max_request_bytes)
            .field("body_timeout", &s.body_timeout)
            .field("max_response_bytes", &s.max_response_bytes)
            .field("on_recover", &s.on_recover)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer storing outcomes through `client`, with the defaults: POST
    /// and PATCH, key required, no scope, lease 30 s (renewed while the
    /// handler runs), retention 24 h, wait 5 s, request bodies up to 1 MiB
    /// received within 30 s, stored responses up to 1 MiB (Idem's default `max_value_bytes`),
    /// keys up to 255 characters, [`default_policy`], replayed headers
    /// `content-type` and `location`, no handler timeout,
    /// [`OnRecover::Refuse`], keys under the namespace `http`.
    pub fn new(client: Client) -> Self {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                client,
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                scope: None,
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 3600),
                wait: Duration::from_secs(5),
                max_request_bytes: 1 << 20,
                body_timeout: Duration::from_secs(30),
                max_response_bytes: 1 << 20,
                max_key_len: 255,
                policy: Arc::new(default_policy),
                fingerprint: None,
                ignore_query: Vec::new(),
                replay_headers: vec![http::header::CONTENT_TYPE, http::header::LOCATION],
                handler_timeout: None,
                on_recover: OnRecover::Refuse,
                namespace: "http".into(),
                shared: false,
            }),
            warned: Arc::default(),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// The methods the layer applies to (others pass through).
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|s| s.methods = methods)
    }

    /// Whether a request without the header is refused with `400
    /// missing-key` (default) or passed through unprotected.
    pub fn require_key(self, required: bool) -> Self {
        self.with(|s| s.required = required)
    }

    /// The scope of keys: a tenant or principal taken from the request
    /// (an auth header, an extension set by an auth layer). Two scopes
    /// never share a key, so one tenant cannot read another's responses.
    /// Without a scope (the default) every caller shares one key space:
    /// set one wherever callers are different principals. Scope by the
    /// principal (a user or account id), not by a raw credential: a token
    /// refreshed between a request and its retry would make the retry a
    /// new key, and run the handler again.
    pub fn scope(self, f: impl Fn(&request::Parts) -> String + Send + Sync + 'static) -> Self {
        self.with(|s| s.scope = Some(Arc::new(f)))
    }

    /// Says that all callers are one principal (a service behind an API
    /// gateway that scopes keys itself, an internal queue): keys are not
    /// scoped, and the layer does not warn about it.
    pub fn shared_key_space(self) -> Self {
        self.with(|s| s.shared = true)
    }

    /// The lease of a running handler (renewed in the background while it
    /// runs); if the service dies, the key is abandoned once it lapses.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|s| s.lease = lease)
    }

    /// How long an outcome is kept and replayed.
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|s| s.retention = retention)
    }

    /// How long a duplicate waits (server-side) for the first request to
    /// finish before it gets `409`.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|s| s.wait = wait)
    }

    /// The largest request body read (`413 body-too-large` beyond).
    pub fn max_request_bytes(self, n: usize) -> Self {
        self.with(|s| s.max_request_bytes = n)
    }

    /// How long a request body may take to arrive whole (`408
    /// body-timed-out` beyond; nothing is claimed or run): a caller that
    /// trickles its body cannot hold a buffer of up to `max_request_bytes`
    /// for ever. Default 30 s.
    pub fn body_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.body_timeout = timeout)
    }

    /// The largest stored response (status, replayed headers and body);
    /// keep it at most Idem's `max_value_bytes`. A larger response goes to
    /// its caller unchanged, and replays answer `410 response-not-stored`.
    pub fn max_response_bytes(self, n: usize) -> Self {
        self.with(|s| s.max_response_bytes = n)
    }

    /// The longest `Idempotency-Key` accepted (`400 invalid-key` beyond).
    pub fn max_key_len(self, n: usize) -> Self {
        self.with(|s| s.max_key_len = n)
    }

    /// Replaces the outcome policy ([`default_policy`]).
    pub fn policy(self, f: impl Fn(StatusCode) -> Decision + Send + Sync + 'static) -> Self {
        self.with(|s| s.policy = Arc::new(f))
    }

    /// Replaces the request fingerprint (default: SHA-256 over the method,
    /// the path, the query with its parameters sorted by name, and the
    /// body), e.g. to leave out a field of a JSON body that changes on
    /// every retry. A fingerprint longer than 32 bytes is hashed (SHA-256),
    /// so returning the filtered body itself is fine. The default takes
    /// the body as sent: a body whose bytes change between retries of the
    /// same request (a multipart body with a fresh boundary, a compressed
    /// body with a timestamp) needs a fingerprint of its own, or every
    /// retry gets `422 key-reused`.
    pub fn fingerprint_with(
        self,
        f: impl Fn(&request::Parts, &Bytes) -> Bytes + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.fingerprint = Some(Arc::new(f)))
    }

    /// Query parameters the default fingerprint leaves out (compared with
    /// the names as sent, not percent-decoded).
    pub fn fingerprint_ignore_query(
        self,
        names: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let names = names.into_iter().map(Into::into).collect();
        self.with(|s| s.ignore_query = names)
    }

    /// The response headers stored and replayed (default `content-type`
    /// and `location`); others go only to the first caller.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with(|s| s.replay_headers = names)
    }

    /// Abandons the key and answers `504 handler-timed-out` when the
    /// handler has not answered within `timeout`. Use this rather than a
    /// timeout layer inside this one (see the crate docs).
    pub fn handler_timeout(self, timeout: Duration) -> Self {
        self.with(|s| s.handler_timeout = Some(timeout))
    }

    /// What a request that finds its key abandoned does.
    pub fn on_recover(self, on_recover: OnRecover) -> Self {
        self.with(|s| s.on_recover = on_recover)
    }

    /// The namespace of the layer's keys in Idem (default `http`).
    pub fn namespace(self, ns: impl Into<String>) -> Self {
        let ns = ns.into();
        self.with(|s| s.namespace = ns)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        if self.settings.scope.is_none()
            && !self.settings.shared
            && !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            warn!(
                "IdempotencyLayer without a scope: all callers share one key space, so one can replay another's response by using its key; set .scope(...) by principal, or .shared_key_space() if all callers are one"
            );
        }
        IdempotencyService {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service the layer wraps around another.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    /// Always ready: the inner service's readiness is awaited only when a
    /// request is about to reach it, so requests that wait for a claim (or
    /// are answered by the layer) hold none of its capacity.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        Box::pin(handle(Arc::clone(&self.settings), self.inner.clone(), req))
    }
}

fn boxed<B>(r: Response<B>) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    r.map(|b| b.map_err(Into::into).boxed_unsync())
}

fn full(b: Bytes) -> ResponseBody {
    Full::new(b).map_err(|never| match never {}).boxed_unsync()
}

fn retry_after(mut r: Response<ResponseBody>, secs: u64) -> Response<ResponseBody> {
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    r
}

/// Hands `req` to the inner service unprotected, once it is ready.
async fn pass<S, ReqB, ResB>(
    mut inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    futures_util::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    inner.call(req).await.map(boxed)
}

async fn handle<S, ReqB, ResB>(
    s: Arc<Settings>,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    if !s.methods.contains(req.method()) {
        return pass(inner, req).await;
    }
    let mut values = req.headers().get_all(IDEMPOTENCY_KEY).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if s.required => {
            return Ok(Problem::MissingKey.response(&format!(
                "{} requests to this resource need an Idempotency-Key header",
                req.method()
            )));
        }
        (None, _) => return pass(inner, req).await,
        (Some(_), Some(_)) => {
            return Ok(Problem::InvalidKey.response(&header::BadKey::Repeated.to_string()));
        }
        (Some(v), None) => match header::parse(v, s.max_key_len) {
            Ok(k) => k,
            Err(e) => return Ok(Problem::InvalidKey.response(&e.to_string())),
        },
    };
    let (parts, body) = req.into_parts();
    // A body declared larger than the limit (Content-Length) is refused
    // before a byte of it is read: no `100 Continue` invites it, and the
    // caller does not wait for a timeout.
    if body.size_hint().lower() > s.max_request_bytes as u64 {
        return Ok(Problem::BodyTooLarge.response(&format!(
            "the request body is larger than {} bytes",
            s.max_request_bytes
        )));
    }
    let read = tokio::time::timeout(
        s.body_timeout,
        Limited::new(body, s.max_request_bytes).collect(),
    )
    .await;
    let Ok(read) = read else {
        return Ok(Problem::BodyTimedOut.response(&format!(
            "the request body did not arrive whole within {} ms",
            s.body_timeout.as_millis()
        )));
    };
    let body = match read {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(Problem::BodyTooLarge.response(&format!(
                "the request body is larger than {} bytes",
                s.max_request_bytes
            )));
        }
        Err(e) => return Ok(Problem::UnreadableBody.response(&e.to_string())),
    };
    let fingerprint = match &s.fingerprint {
        Some(f) => bounded_fingerprint(f(&parts, &body)),
        None => default_fingerprint(&parts, &body, &s.ignore_query),
    };
    let scope = s.scope.as_ref().map(|f| f(&parts)).unwrap_or_default();
    let store_key = store_key(&s.namespace, &scope, &parts.method, &route_of(&parts), &key);
    let claimed = s
        .client
        .claim(store_key)
        .fingerprint(fingerprint)
        .lease(s.lease)
        .retain(s.retention)
        .wait(s.wait)
        // A service that dies mid-request leaves the key abandoned: its
        // effect may have happened.
        .on_expire(OnExpire::Recover)
        .send()
        .await;
    match claimed {
        Err(e) if e.is_mismatch() => Ok(Problem::KeyReused.response(
            "this Idempotency-Key was used with a different request (method, path, query or body)",
        )),
        // Retrying cannot help: no Retry-After.
        Err(e) if e.kind() == idem_client::ErrorKind::TooBig => {
            warn!(error = %e, "the idempotency store refused the key or fingerprint as too large");
            Ok(Problem::StoreRefused.response(
                "the idempotency store refused this request's key or fingerprint as too large; nothing was run",
            ))
        }
        Err(e) => {
            warn!(error = %e, "idempotency store unavailable: request refused");
            Ok(retry_after(
                Problem::StoreUnavailable
                    .response("the idempotency store cannot be reached; nothing was run"),
                1,
            ))
        }
        Ok(ClaimOutcome::Completed(c)) => Ok(replay(c, &s.replay_headers)),
        // Retry in a second: the retry waits again, server-side, for up to
        // `wait`. (What is left of the lease only says when the key would
        // be abandoned: a client that waited that long, ~25 s, waited
        // long after most handlers finished.)
        Ok(ClaimOutcome::InFlight { .. }) => Ok(retry_after(
            Problem::InFlight.response(
                "a request with this Idempotency-Key is still being processed; retry it unchanged",
            ),
            1,
        )),
        Ok(ClaimOutcome::Acquired(claim)) => {
            spawn_run(s, inner, parts, body, key, claim, None).await
        }
        Ok(ClaimOutcome::Recover { claim, journal }) => match s.on_recover {
            OnRecover::RunWithRecovery => {
                spawn_run(s, inner, parts, body, key, claim, Some(journal)).await
            }
            OnRecover::Refuse => {
                if let Err(e) = claim.abandon().await {
                    warn!(error = %e, "could not leave the key abandoned; its lease will lapse");
                }
                Ok(Problem::OutcomeUnknown.response(
                    "an earlier request with this Idempotency-Key ended without a known outcome; it must be resolved before the key can be used",
                ))
            }
        },
        Ok(_) => Ok(retry_after(
            Problem::StoreUnavailable
                .response("the idempotency store gave an answer this layer does not know"),
            1,
        )),
    }
}

/// [`run`] in a task of its own: the handler runs to its end and the key is
/// settled even if the caller goes away (hyper drops the request's future
/// when its client disconnects, and a handler stopped at an await point
/// would leave the key abandoned, so the client's retry, the reason it
/// reconnects, got `500 outcome-unknown`). The retry waits for it instead
/// and replays its response.
async fn spawn_run<S, ReqB, ResB>(
    s: Arc<Settings>,
    inner: S,
    parts: request::Parts,
    body: Bytes,
    key: String,
    claim: idem_client::Claim,
    journal: Option<Bytes>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: From<Bytes> + Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let task = tokio::spawn(
        async move { run(&s, inner, parts, body, key, claim, journal).await }.in_current_span(),
    );
    match task.await {
        Ok(answer) => answer,
        // `run` catches the handler's panics: this is a runtime shutting
        // down (the claim, dropped unfinished, is abandoned).
        Err(e) => {
            warn!(error = %e, "the request's task ended without an answer");
            Ok(Problem::HandlerPanicked.response("the request failed; its outcome is unknown"))
        }
    }
}

/// Runs the handler as the key's owner, then settles the key by the
/// policy. A recovery run (`journal`) abandons where another would
/// release: the earlier run's effect may have happened, and its record
/// (journal included) must stay until an outcome is recorded.
async fn run<S, ReqB, ResB>(
    s: &Settings,
    mut inner: S,
    mut parts: request::Parts,
    body: Bytes,
    key: String,
    claim: idem_client::Claim,
    journal: Option<Bytes>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: From<Bytes>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    parts.extensions.insert(Idempotency {
        ctx: claim.ctx(),
        key,
    });
    let recovering = journal.is_some();
    if let Some(journal) = journal {
        parts.extensions.insert(Recovering { journal });
    }
    let abandon = |claim: idem_client::Claim| async move {
        if let Err(e) = claim.abandon().await {
            warn!(error = %e, "could not abandon the key; its lease will lapse instead");
        }
    };
    // Nothing happened in this run: the key is released, or on a recovery
    // run left abandoned (the earlier run's effect may have happened).
    let release = |claim: idem_client::Claim| async move {
        if recovering {
            abandon(claim).await;
        } else if let Err(e) = claim.release().await {
            warn!(error = %e, "could not release the key; its lease will lapse instead");
        }
    };
    if let Err(e) = futures_util::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        release(claim).await;
        return Err(e);
    }
    let req = Request::from_parts(parts, ReqB::from(body));
    // A panic in the synchronous part of `call` is caught too.
    let called = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.call(req))) {
        Ok(fut) => AssertUnwindSafe(fut).catch_unwind().left_future(),
        Err(panic) => futures_util::future::ready(Err(panic)).right_future(),
    };
    let answered = match s.handler_timeout {
        Some(t) => tokio::time::timeout(t, called).await.ok(),
        None => Some(called.await),
    };
    let resp = match answered {
        None => {
            abandon(claim).await;
            return Ok(Problem::HandlerTimedOut
                .response("the request did not finish in time; its outcome is unknown"));
        }
        Some(Err(_panic)) => {
            abandon(claim).await;
            return Ok(
                Problem::HandlerPanicked.response("the request failed; its outcome is unknown")
            );
        }
        Some(Ok(Err(e))) => {
            abandon(claim).await;
            return Err(e);
        }
        Some(Ok(Ok(resp))) => resp,
    };
    let decision = (s.policy)(resp.status());
    let error = match decision {
        Decision::Complete => false,
        Decision::CompleteError => true,
        Decision::Release => {
            release(claim).await;
            return Ok(boxed(resp));
        }
        Decision::Abandon => {
            abandon(claim).await;
            return Ok(boxed(resp));
        }
    };
    let (rparts, rbody) = resp.into_parts();
    let mut rbody: ResponseBody = rbody.map_err(Into::into).boxed_unsync();
    let mut headers = Stored::pick(&rparts.headers, &s.replay_headers);
    if Stored::header_bytes(&headers) >= s.max_response_bytes {
        // The replayed headers alone are over the limit: none are stored.
        headers.clear();
    }
    let budget = s.max_response_bytes - Stored::header_bytes(&headers).min(s.max_response_bytes);
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    let mut trailers = None;
    let overflow = loop {
        match rbody.frame().await {
            None => break false,
            Some(Err(e)) => {
                abandon(claim).await;
                warn!(error = %e, "the response body failed; the key is abandoned");
                return Ok(Problem::HandlerPanicked
                    .response("the response failed midway; the outcome is unknown"));
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => {
                    size += d.len();
                    chunks.push(d);
                    if size > budget {
                        break true;
                    }
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                    }
                }
            },
        }
    };
    if overflow {
        // Too large to store: the caller gets it as it streams, and the key
        // is settled when the stream ends (a marker that replays answer
        // 410), or abandoned if it fails. If the caller goes away first,
        // the rest is read (and dropped) to its end, then settled the same
        // way.
        let marker = Stored {
            status: rparts.status,
            headers,
            body: None,
        }
        .encode();
        let prefix = futures_util::stream::iter(chunks.into_iter().map(|d| Ok(Frame::data(d))));
        let settle = SettleAtEnd {
            body: rbody,
            claim: Some(claim),
            marker,
            error,
            retention: s.retention,
        };
        let rest = futures_util::stream::unfold(settle, SettleAtEnd::next);
        return Ok(Response::from_parts(
            rparts,
            StreamBody::new(prefix.chain(rest)).boxed_unsync(),
        ));
    }
    let body = concat(&chunks, size);
    let stored = Stored {
        status: rparts.status,
        headers,
        body: Some(body.clone()),
    }
    .encode();
    settle(claim, stored, error, s.retention).await;
    let body = match trailers {
        None => full(body),
        Some(t) => StreamBody::new(futures_util::stream::iter([
            Ok::<_, BoxError>(Frame::data(body)),
            Ok(Frame::trailers(t)),
        ]))
        .boxed_unsync(),
    };
    Ok(Response::from_parts(rparts, body))
}

/// Completes the key with `stored`, waiting for it up to the client's call
/// deadline. Past that the caller is answered (it has its response) and
/// the key keeps being completed in a task of its own for as long as it
/// is still this request's ([`idem_client::Claim::complete_patiently`]):
/// the store down or failing over for less than a lease does not lose the
/// outcome, and retries meanwhile wait for it (or get `409`) and then
/// replay it. If it cannot be recorded, the key is abandoned (the outcome
/// must not be lost silently: retries get outcome-unknown or recover).
async fn settle(claim: idem_client::Claim, stored: Bytes, error: bool, retention: Duration) {
    let ctx = claim.ctx();
    let first_try = ctx.client().config().call_deadline();
    let outcome = if error { Outcome::Err } else { Outcome::Ok };
    let mut task = tokio::spawn(
        async move {
            let started = tokio::time::Instant::now();
            match claim
                .complete_patiently(outcome, stored, Some(retention))
                .await
            {
                Ok(()) if started.elapsed() > first_try => {
                    info!(took = ?started.elapsed(), "recorded the outcome once the store answered again");
                }
                Ok(()) => {}
                Err(e) => {
                    warn!(error = %e, "could not store the outcome: abandoning the key (retries get outcome-unknown or recover)");
                    if let Err(e) = ctx.client().abandon(ctx.key().clone(), ctx.fence()).await {
                        warn!(error = %e, "could not abandon the key either; its lease will lapse (it is then abandoned)");
                    }
                }
            }
        }
        .in_current_span(),
    );
    if tokio::time::timeout(first_try, &mut task).await.is_err() {
        warn!(
            "the outcome is not stored yet (the store does not answer): answering the caller, and still trying while the key is this request's"
        );
    }
}

/// The rest of a response too large to store, settling its key at the end.
struct SettleAtEnd {
    body: ResponseBody,
    claim: Option<idem_client::Claim>,
    marker: Bytes,
    error: bool,
    retention: Duration,
}

impl SettleAtEnd {
    /// The next frame. The key is settled in a task of its own, so that a
    /// caller who stops reading cannot cut the settling short.
    async fn next(mut self) -> Option<(Result<Frame<Bytes>, BoxError>, SettleAtEnd)> {
        self.claim.as_ref()?;
        match self.body.frame().await {
            Some(Ok(frame)) => Some((Ok(frame), self)),
            Some(Err(e)) => {
                warn!(error = %e, "the response body failed midway; the key is abandoned");
                if let Some(claim) = self.claim.take() {
                    tokio::spawn(async move {
                        if let Err(e) = claim.abandon().await {
                            warn!(error = %e, "could not abandon the key; its lease will lapse instead");
                        }
                    });
                }
                Some((Err(e), self))
            }
            // The end: the marker is recorded (replays answer `410
            // response-not-stored` with the status).
            None => {
                if let Some(claim) = self.claim.take() {
                    let (marker, error, retention) =
                        (self.marker.clone(), self.error, self.retention);
                    tokio::spawn(settle(claim, marker, error, retention));
                }
                None
            }
        }
    }
}

impl Drop for SettleAtEnd {
    /// The caller stopped reading: the rest of the body (which the handler
    /// may still be producing) is read to its end in a task of its own,
    /// then the key is settled as at the end (or abandoned if the body
    /// fails).
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = SettleAtEnd {
            body: std::mem::replace(&mut self.body, full(Bytes::new())),
            claim: Some(claim),
            marker: self.marker.clone(),
            error: self.error,
            retention: self.retention,
        };
        rt.spawn(async move {
            while let Some((_, more)) = rest.next().await {
                rest = more;
            }
        });
    }
}

fn concat(chunks: &[Bytes], size: usize) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => {
            let mut b = Vec::with_capacity(size);
            for c in many {
                b.extend_from_slice(c);
            }
            Bytes::from(b)
        }
    }
}

/// The response a completed key replays (only headers in `allow`: a value
/// written under the key by anything else cannot inject others).
fn replay(c: Completed, allow: &[HeaderName]) -> Response<ResponseBody> {
    let mut r = match Stored::decode(&c.value) {
        Some(Stored {
            status,
            headers,
            body: Some(body),
        }) => {
            let mut r = Response::new(full(body));
            *r.status_mut() = status;
            for (n, v) in headers.into_iter().filter(|(n, _)| allow.contains(n)) {
                r.headers_mut().append(n, v);
            }
            r
        }
        Some(Stored { status, .. }) => Problem::ResponseNotStored.response(&format!(
            "the original request completed with status {}, but its response was too large to store",
            status.as_u16()
        )),
        None => Problem::ResponseNotStored
            .response("the key holds an outcome that is not an HTTP response"),
    };
    r.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    r
}

/// The route: axum's matched route template when present (feature `axum`),
/// else the path.
fn route_of(parts: &request::Parts) -> String {
    #[cfg(feature = "axum")]
    if let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return m.as_str().to_owned();
    }
    parts.uri.path().to_owned()
}

/// The key in Idem, through the client's [`Key`] builder (which escapes
/// every part, so two different requests never share a key): namespace
/// `<namespace>/<scope>`, version `<METHOD> <route>`, name the
/// `Idempotency-Key`. A scope or route part longer than 200 bytes once
/// escaped, or a key longer than 510, is replaced by its SHA-256, so the
/// whole key stays within Idem's default key limit (1,024 bytes).
fn store_key(ns: &str, scope: &str, method: &Method, route: &str, key: &str) -> Key {
    let bounded = |part: String, max: usize| {
        // What the Key builder's escaping makes of it.
        let escaped = part.len() + part.bytes().filter(|b| matches!(b, b':' | b'\\')).count();
        if escaped <= max {
            return part;
        }
        let mut hashed = String::from("#");
        for b in Sha256::digest(part.as_bytes()) {
            hashed.push_str(&format!("{b:02x}"));
        }
        hashed
    };
    Key::new(bounded(key.to_owned(), 510))
        .namespace(bounded(format!("{ns}/{scope}"), 200))
        .version(bounded(format!("{method} {route}"), 200))
}

/// A fingerprint of at most 32 bytes: a longer one (a custom fingerprint
/// returning the filtered body itself) is hashed, since Idem keeps
/// fingerprints small (`max_fingerprint_bytes`, 256 by default).
fn bounded_fingerprint(fp: Bytes) -> Bytes {
    if fp.len() <= 32 {
        return fp;
    }
    Bytes::copy_from_slice(&Sha256::digest(&fp))
}

/// SHA-256 over the method, the path, the query (its parameters sorted by
/// name, those in `ignore` left out) and the body.
fn default_fingerprint(parts: &request::Parts, body: &Bytes, ignore: &[String]) -> Bytes {
    let mut h = Sha256::new();
    h.update(parts.method.as_str().as_bytes());
    h.update([0]);
    h.update(parts.uri.path().as_bytes());
    h.update([0]);
    let mut params: Vec<&str> = parts
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let name = p.split('=').next().unwrap_or("");
            !ignore.iter().any(|i| i == name)
        })
        .collect();
    // By name only, and stable: the values of a repeated parameter keep
    // their order (`a=1&a=2` is not `a=2&a=1`).
    params.sort_by_key(|p| p.split('=').next().unwrap_or(""));
    for p in params {
        h.update(p.as_bytes());
        h.update([b'&']);
    }
    h.update([0]);
    h.update(body);
    Bytes::copy_from_slice(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> request::Parts {
        Request::post(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_policy_table() {
        let d = |s: u16| default_policy(StatusCode::from_u16(s).unwrap());
        assert_eq!(d(200), Decision::Complete);
        assert_eq!(d(201), Decision::Complete);
        assert_eq!(d(303), Decision::Complete);
        for s in [402, 409, 410, 412, 418, 451] {
            assert_eq!(d(s), Decision::CompleteError, "{s}");
        }
        // Refused before anything happened: the corrected request (or the
        // same one, later) runs under the same key.
        for s in [
            400, 401, 403, 404, 405, 406, 408, 411, 413, 414, 415, 422, 425, 429, 431, 503,
        ] {
            assert_eq!(d(s), Decision::Release, "{s}");
        }
        for s in [500, 502, 504] {
            assert_eq!(d(s), Decision::Abandon, "{s}");
        }
        // Not a final status: the caller got hyper's bare 500, which a
        // replay would repeat for the key's whole retention.
        for s in [100, 102, 103] {
            assert_eq!(d(s), Decision::Abandon, "{s}");
        }
    }

    #[test]
    fn keys_do_not_collide_across_scopes_routes_and_methods() {
        let k = |scope: &str, m: Method, route: &str, key: &str| {
            store_key("http", scope, &m, route, key).to_bytes()
        };
        let a = k("tenant-a", Method::POST, "/pay", "k1");
        assert_eq!(a, "http/tenant-a:POST /pay:k1");
        assert_ne!(a, k("tenant-b", Method::POST, "/pay", "k1"));
        assert_ne!(a, k("tenant-a", Method::PATCH, "/pay", "k1"));
        assert_ne!(a, k("tenant-a", Method::POST, "/refund", "k1"));
        // ':' in a part cannot shift the boundaries.
        assert_ne!(
            k("a:POST", Method::POST, "/x", "k"),
            k("a", Method::POST, "POST:/x", "k")
        );
        let long = "/x".repeat(300);
        let hashed = k("t", Method::POST, &long, "k1");
        assert!(hashed.len() < 100, "{hashed:?}");
        assert_ne!(hashed, k("t", Method::POST, &"/y".repeat(300), "k1"));
        // Parts of colons double when escaped: bounded after escaping, so
        // the key stays within Idem's default 1,024 bytes.
        let (colons, scope) = (":".repeat(255), ":".repeat(190));
        let route = format!("/{colons}");
        let worst = k(&scope, Method::POST, &route, &colons);
        assert!(worst.len() <= 1024, "{} bytes", worst.len());
        assert_ne!(worst, k(&scope, Method::POST, &route, "k"));
    }

    #[test]
    fn long_fingerprints_are_hashed() {
        let short = Bytes::from_static(b"0123456789abcdef");
        assert_eq!(bounded_fingerprint(short.clone()), short);
        let body = Bytes::from(vec![b'x'; 10_000]);
        let fp = bounded_fingerprint(body.clone());
        assert_eq!(fp.len(), 32);
        assert_ne!(fp, bounded_fingerprint(Bytes::from(vec![b'y'; 10_000])));
    }

    #[test]
    fn the_fingerprint_sorts_the_query_and_covers_the_body() {
        let fp = |uri: &str, body: &'static str, ignore: &[String]| {
            default_fingerprint(&parts(uri), &Bytes::from_static(body.as_bytes()), ignore)
        };
        assert_eq!(fp("/p?a=1&b=2", "x", &[]), fp("/p?b=2&a=1", "x", &[]));
        // A repeated parameter's values keep their order.
        assert_ne!(fp("/p?a=1&a=2", "x", &[]), fp("/p?a=2&a=1", "x", &[]));
        assert_eq!(
            fp("/p?a=1&b=0&a=2", "x", &[]),
            fp("/p?b=0&a=1&a=2", "x", &[])
        );
        assert_ne!(fp("/p?a=1", "x", &[]), fp("/p?a=2", "x", &[]));
        assert_ne!(fp("/p", "x", &[]), fp("/p", "y", &[]));
        assert_ne!(fp("/p", "x", &[]), fp("/q", "x", &[]));
        let ignore = ["ts".to_owned()];
        assert_eq!(
            fp("/p?a=1&ts=5", "x", &ignore),
            fp("/p?a=1&ts=9", "x", &ignore)
        );
    }
}
