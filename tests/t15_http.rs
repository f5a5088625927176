//! idem-http: a real axum server with the layer, a real HTTP client
//! (hyper) and a real idemd.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idem_http::{Idempotency, IdempotencyLayer, OnRecover, Recovering};

use crate::support::Idemd;

/// Handler runs, by route.
#[derive(Clone, Default)]
struct Runs {
    pay: Arc<AtomicU64>,
    flaky: Arc<AtomicU64>,
    boom: Arc<AtomicU64>,
    slow: Arc<AtomicU64>,
    any: Arc<AtomicU64>,
    fragile: Arc<AtomicU64>,
    guarded: Arc<AtomicU64>,
}

async fn pay(
    State(runs): State<Runs>,
    Extension(idem): Extension<Idempotency>,
    body: Bytes,
) -> (StatusCode, String) {
    let n = runs.pay.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (
        StatusCode::CREATED,
        format!(
            "run {n} fence {} key {} body {}",
            idem.fence(),
            idem.key(),
            String::from_utf8_lossy(&body)
        ),
    )
}

/// 503 on its first run, 200 after.
async fn flaky(State(runs): State<Runs>) -> (StatusCode, String) {
    match runs.flaky.fetch_add(1, Ordering::SeqCst) {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "try later".into()),
        n => (StatusCode::OK, format!("flaky run {}", n + 1)),
    }
}

/// Journals, then fails with 500 (first run) or panics (`?panic`); a
/// recovery run answers what the journal said.
async fn boom(
    State(runs): State<Runs>,
    Extension(idem): Extension<Idempotency>,
    recovering: Option<Extension<Recovering>>,
    uri: axum::http::Uri,
) -> (StatusCode, String) {
    runs.boom.fetch_add(1, Ordering::SeqCst);
    if let Some(Extension(r)) = recovering {
        return (
            StatusCode::OK,
            format!("recovered from {}", String::from_utf8_lossy(&r.journal)),
        );
    }
    idem.journal(format!("charged by fence {}", idem.fence()))
        .await
        .unwrap();
    if uri.query() == Some("panic") {
        panic!("the handler fails");
    }
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "downstream failed".into(),
    )
}

/// Journals and fails with 500 on its first run; its first recovery run
/// answers 503 (it cannot check downstream yet), the next one what the
/// journal said.
async fn fragile(
    State(runs): State<Runs>,
    Extension(idem): Extension<Idempotency>,
    recovering: Option<Extension<Recovering>>,
) -> (StatusCode, String) {
    let n = runs.fragile.fetch_add(1, Ordering::SeqCst) + 1;
    match recovering {
        None => {
            idem.journal(format!("charged in run {n}")).await.unwrap();
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "downstream failed".into(),
            )
        }
        Some(_) if n == 2 => (
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot check downstream yet".into(),
        ),
        Some(Extension(r)) => (
            StatusCode::OK,
            format!("recovered from {}", String::from_utf8_lossy(&r.journal)),
        ),
    }
}

/// 401 without `authorization: ok`, else 201.
async fn guarded(State(runs): State<Runs>, headers: HeaderMap) -> (StatusCode, String) {
    if headers.get("authorization").is_none_or(|v| v != "ok") {
        return (StatusCode::UNAUTHORIZED, "who are you?".into());
    }
    let n = runs.guarded.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("created in run {n}"))
}

async fn slow(State(runs): State<Runs>) -> &'static str {
    runs.slow.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    "slow done"
}

/// 300 kB in 30 chunks.
async fn big() -> axum::body::Body {
    let chunks = (0..30).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 10_000])));
    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
}

/// 200 kB, then the body fails.
async fn big_fail() -> axum::body::Body {
    let chunks = (0..21).map(|i| {
        if i < 20 {
            Ok(Bytes::from(vec![b'y'; 10_000]))
        } else {
            Err(std::io::Error::other("the source went away"))
        }
    });
    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
}

async fn any(State(runs): State<Runs>) -> String {
    format!("any run {}", runs.any.fetch_add(1, Ordering::SeqCst) + 1)
}

struct App {
    addr: SocketAddr,
    runs: Runs,
    idemd: Idemd,
}

/// An axum app on 127.0.0.1:0 with the layer as `configure` sets it up.
async fn app(configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> App {
    let idemd = Idemd::start().await;
    let client = idem_client::Client::connect(idemd.addr.to_string())
        .await
        .unwrap();
    let runs = Runs::default();
    let layer = configure(IdempotencyLayer::new(client).max_response_bytes(100_000));
    let router = Router::new()
        .route("/pay", post(pay))
        .route("/flaky", post(flaky))
        .route("/boom", post(boom))
        .route("/slow", post(slow))
        .route("/fragile", post(fragile))
        .route("/guarded", post(guarded))
        .route("/big", post(big))
        .route("/big-fail", post(big_fail))
        .route("/any", get(any).post(any))
        .with_state(runs.clone())
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    App { addr, runs, idemd }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn problem(&self) -> String {
        assert_eq!(
            self.headers.get("content-type").unwrap(),
            "application/problem+json",
            "{}",
            self.body
        );
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        assert_eq!(v["status"], self.status.as_u16(), "{}", self.body);
        v["type"].as_str().unwrap().to_owned()
    }
}

/// One request on a fresh connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::from_static(b"(the body failed)"),
    };
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Waits until the handler counted by `runs` has started.
async fn running(runs: &AtomicU64) {
    for _ in 0..200 {
        if runs.load(Ordering::SeqCst) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the handler did not start");
}

async fn post_key(addr: SocketAddr, path: &str, key: &str, body: &str) -> Answer {
    send(addr, "POST", path, &[("idempotency-key", key)], body).await
}

#[tokio::test]
async fn a_hundred_concurrent_duplicates_run_the_handler_once() {
    let a = app(|l| l).await;
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let addr = a.addr;
        tasks.push(tokio::spawn(async move {
            post_key(addr, "/pay", "order-1", "42").await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 1, "the handler ran once");
    let originals = answers.iter().filter(|x| !x.replayed()).count();
    assert_eq!(originals, 1, "one original answer, 99 replays");
    for x in &answers {
        assert_eq!(x.status, StatusCode::CREATED);
        assert_eq!(x.body, answers[0].body);
        assert!(x.body.starts_with("run 1 fence "), "{}", x.body);
        assert!(x.body.ends_with("key order-1 body 42"), "{}", x.body);
        assert_eq!(
            x.headers.get("content-type").unwrap(),
            "text/plain; charset=utf-8"
        );
    }
    // A later retry replays too; another key runs again.
    let again = post_key(a.addr, "/pay", "order-1", "42").await;
    assert!(again.replayed());
    assert_eq!(again.body, answers[0].body);
    let other = post_key(a.addr, "/pay", "order-2", "42").await;
    assert!(!other.replayed());
    assert!(other.body.starts_with("run 2 "), "{}", other.body);
}

#[tokio::test]
async fn a_key_reused_with_another_payload_gets_422() {
    let a = app(|l| l).await;
    assert_eq!(
        post_key(a.addr, "/pay", "k", "42").await.status,
        StatusCode::CREATED
    );
    let reused = post_key(a.addr, "/pay", "k", "43").await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem(), "urn:idem:problem:key-reused");
    // The query is part of the request too.
    let query = post_key(a.addr, "/pay?currency=eur", "k", "42").await;
    assert_eq!(query.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 1);
    // Another route (or method) with the same key is another key.
    let other = post_key(a.addr, "/any", "k", "42").await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(!other.replayed());
}

#[tokio::test]
async fn a_duplicate_gets_409_with_retry_after_once_the_wait_runs_out() {
    let a = app(|l| l.wait(Duration::from_millis(200))).await;
    let addr = a.addr;
    let first = tokio::spawn(async move { post_key(addr, "/slow", "s", "").await });
    running(&a.runs.slow).await;
    let dup = post_key(a.addr, "/slow", "s", "").await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem(), "urn:idem:problem:in-flight");
    let after: u64 = dup
        .headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // A second: the retry waits server-side again. (It was the lease
    // left, ~25 s, long after most handlers finished.)
    assert_eq!(after, 1, "Retry-After");
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "slow done");
    let later = post_key(a.addr, "/slow", "s", "").await;
    assert!(later.replayed());
    assert_eq!(later.body, "slow done");
    assert_eq!(a.runs.slow.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_503_releases_the_key_so_the_retry_runs_again() {
    let a = app(|l| l).await;
    let first = post_key(a.addr, "/flaky", "f", "").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    let retry = post_key(a.addr, "/flaky", "f", "").await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(!retry.replayed());
    assert_eq!(retry.body, "flaky run 2");
    let replay = post_key(a.addr, "/flaky", "f", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, "flaky run 2");
    assert_eq!(a.runs.flaky.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_500_or_a_panic_abandons_the_key_and_the_retry_must_recover() {
    // By default the retry is refused: the outcome is unknown.
    let a = app(|l| l).await;
    for (key, path) in [("b1", "/boom"), ("b2", "/boom?panic")] {
        let first = post_key(a.addr, path, key, "").await;
        assert_eq!(
            first.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{}",
            first.body
        );
        let retry = post_key(a.addr, path, key, "").await;
        assert_eq!(retry.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry.problem(), "urn:idem:problem:outcome-unknown");
        // Still unresolved on the next try.
        let again = post_key(a.addr, path, key, "").await;
        assert_eq!(again.problem(), "urn:idem:problem:outcome-unknown");
    }
    assert_eq!(
        a.runs.boom.load(Ordering::SeqCst),
        2,
        "no retry ran the handler"
    );
    let first = post_key(a.addr, "/boom?panic", "b3", "").await;
    assert_eq!(first.problem(), "urn:idem:problem:handler-panicked");

    // With recovery, the retry runs with the journal of the failed run.
    let a = app(|l| l.on_recover(OnRecover::RunWithRecovery)).await;
    for (key, path) in [("r1", "/boom"), ("r2", "/boom?panic")] {
        let first = post_key(a.addr, path, key, "").await;
        assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
        let retry = post_key(a.addr, path, key, "").await;
        assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
        assert!(
            retry.body.starts_with("recovered from charged by fence "),
            "{}",
            retry.body
        );
        let replay = post_key(a.addr, path, key, "").await;
        assert!(replay.replayed());
        assert_eq!(replay.body, retry.body);
    }
}

/// A client that went away mid-request (the usual reason to retry) left
/// its key abandoned: hyper dropped the request's future, the handler
/// stopped at an await point, and every retry got `500 outcome-unknown`.
/// The handler now runs to its end on its own, and the retry replays it.
#[tokio::test]
async fn a_request_whose_client_went_away_still_finishes_and_the_retry_replays_it() {
    let a = app(|l| l).await;
    let addr = a.addr;
    let first = tokio::spawn(async move { post_key(addr, "/slow", "gone", "").await });
    running(&a.runs.slow).await;
    // The client goes away; hyper drops the request's future.
    first.abort();
    let _ = first.await;
    // The retry waits for the first run and replays it.
    let retry = post_key(a.addr, "/slow", "gone", "").await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert!(retry.replayed());
    assert_eq!(retry.body, "slow done");
    assert_eq!(a.runs.slow.load(Ordering::SeqCst), 1);
}

/// A recovery run that answered 503 (it could not check downstream yet)
/// released the key, and with it the record of the abandoned run: the
/// next retry ran the handler afresh, without the journal, and could pay
/// twice. A recovery run now leaves the key abandoned instead.
#[tokio::test]
async fn a_recovery_run_that_cannot_finish_keeps_the_journal() {
    let a = app(|l| l.on_recover(OnRecover::RunWithRecovery)).await;
    let first = post_key(a.addr, "/fragile", "fr", "").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    let recovery = post_key(a.addr, "/fragile", "fr", "").await;
    assert_eq!(recovery.status, StatusCode::SERVICE_UNAVAILABLE);
    let again = post_key(a.addr, "/fragile", "fr", "").await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body, "recovered from charged in run 1");
    let replay = post_key(a.addr, "/fragile", "fr", "").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, again.body);
}

/// A 401 (or a 400 for a body that did not validate) was stored and
/// replayed for the key's whole retention: the request corrected as the
/// draft asks (credentials, body) got the stale 401, or 422 for its new
/// body. Refused requests now release the key.
#[tokio::test]
async fn a_request_refused_before_it_ran_can_be_corrected_under_its_key() {
    let a = app(|l| l).await;
    let refused = post_key(a.addr, "/guarded", "g", "order 1").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let with_credentials = async || {
        let headers = [("idempotency-key", "g"), ("authorization", "ok")];
        send(a.addr, "POST", "/guarded", &headers, "order 1").await
    };
    let fixed = with_credentials().await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{}", fixed.body);
    assert!(!fixed.replayed());
    assert_eq!(fixed.body, "created in run 1");
    let replay = with_credentials().await;
    assert!(replay.replayed());
    assert_eq!(replay.body, "created in run 1");
}

#[tokio::test]
async fn quoted_and_bare_keys_are_one_key_and_bad_keys_get_400() {
    let a = app(|l| l).await;
    let quoted = post_key(a.addr, "/pay", "\"q-1\"", "1").await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    let bare = post_key(a.addr, "/pay", "q-1", "1").await;
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);
    assert!(quoted.body.contains("key q-1 "), "{}", quoted.body);
    for bad in ["\"\"", "\"unterminated", "a\\b", &"k".repeat(256)] {
        let r = post_key(a.addr, "/pay", bad, "1").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.problem(), "urn:idem:problem:invalid-key");
    }
    let two = send(
        a.addr,
        "POST",
        "/pay",
        &[("idempotency-key", "a"), ("idempotency-key", "b")],
        "1",
    )
    .await;
    assert_eq!(two.problem(), "urn:idem:problem:invalid-key");
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missing_key_is_refused_or_passed_through_as_configured() {
    let a = app(|l| l).await;
    let missing = send(a.addr, "POST", "/any", &[], "").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem(), "urn:idem:problem:missing-key");
    // GET is not protected (POST and PATCH by default).
    assert_eq!(send(a.addr, "GET", "/any", &[], "").await.body, "any run 1");
    assert_eq!(send(a.addr, "GET", "/any", &[], "").await.body, "any run 2");

    let a = app(|l| l.require_key(false)).await;
    assert_eq!(
        send(a.addr, "POST", "/any", &[], "").await.body,
        "any run 1"
    );
    assert_eq!(
        send(a.addr, "POST", "/any", &[], "").await.body,
        "any run 2"
    );
    // With a key, still protected.
    assert_eq!(post_key(a.addr, "/any", "x", "").await.body, "any run 3");
    assert!(post_key(a.addr, "/any", "x", "").await.replayed());
}

#[tokio::test]
async fn scopes_keep_tenants_apart() {
    let a = app(|l| {
        l.scope(|parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        })
    })
    .await;
    let t = |tenant: &'static str| [("idempotency-key", "same"), ("x-tenant", tenant)];
    let a1 = send(a.addr, "POST", "/pay", &t("a"), "1").await;
    let b1 = send(a.addr, "POST", "/pay", &t("b"), "1").await;
    assert!(!a1.replayed() && !b1.replayed());
    assert_eq!(
        a.runs.pay.load(Ordering::SeqCst),
        2,
        "two tenants, two executions"
    );
    let a2 = send(a.addr, "POST", "/pay", &t("a"), "1").await;
    assert!(a2.replayed());
    assert_eq!(a2.body, a1.body);
    // Without a scope (the default) every caller shares the key space.
    let a = app(|l| l).await;
    let a1 = send(a.addr, "POST", "/pay", &t("a"), "1").await;
    let b1 = send(a.addr, "POST", "/pay", &t("b"), "1").await;
    assert!(!a1.replayed() && b1.replayed());
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bodies_are_bounded() {
    let a = app(|l| l.max_request_bytes(1000)).await;
    let big = post_key(a.addr, "/pay", "big-req", &"y".repeat(1001)).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(big.problem(), "urn:idem:problem:body-too-large");
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 0);
    // A response over the stored limit (100 kB here) goes to its caller
    // whole; replays say it was not stored.
    let first = post_key(a.addr, "/big", "big-resp", "").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.len(), 300_000);
    let replay = post_key(a.addr, "/big", "big-resp", "").await;
    assert_eq!(replay.status, StatusCode::GONE);
    assert!(replay.replayed());
    assert_eq!(replay.problem(), "urn:idem:problem:response-not-stored");
    assert!(replay.body.contains("status 200"), "{}", replay.body);
    // One that fails after the limit: its caller sees it fail, and the
    // key is abandoned (not completed with a marker).
    let first = post_key(a.addr, "/big-fail", "big-fail", "").await;
    assert_eq!(first.body, "(the body failed)");
    let retry = post_key(a.addr, "/big-fail", "big-fail", "").await;
    assert_eq!(retry.problem(), "urn:idem:problem:outcome-unknown");
}

/// A body declared larger than `max_request_bytes` was read up to the
/// limit first: with `Expect: 100-continue` the caller was even told to
/// send it, and one that then sent little waited out `body_timeout` for a
/// 408. Now the declared length alone gets the 413, at once, with no
/// `100 Continue` and nothing claimed.
#[tokio::test]
async fn a_body_declared_too_large_is_refused_before_it_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = app(|l| l.max_request_bytes(1000)).await;
    let mut s = tokio::net::TcpStream::connect(a.addr).await.unwrap();
    s.write_all(
        b"POST /pay HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
          Idempotency-Key: declared-big\r\nExpect: 100-continue\r\nContent-Length: 5000000000\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let started = std::time::Instant::now();
    while !String::from_utf8_lossy(&got).contains("body-too-large") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("no answer to a body declared too large")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(!text.contains("100 Continue"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 0);
}

/// A caller that trickled its body held a buffer of up to
/// `max_request_bytes` for as long as it liked (the body was read with no
/// time limit). Now the body must arrive within `body_timeout`: `408`,
/// and nothing is claimed, so the same key runs once the body comes whole.
#[tokio::test]
async fn a_trickled_body_times_out_and_claims_nothing() {
    let a = app(|l| l.body_timeout(Duration::from_millis(300))).await;
    let stream = tokio::net::TcpStream::connect(a.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(4);
    tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(
        b"{\"amount\":",
    ))))
    .await
    .unwrap();
    let body =
        http_body_util::StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        }));
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/pay")
        .header("host", "test")
        .header("idempotency-key", "trickled")
        .body(body)
        .unwrap();
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("no answer to a body that never ends")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() < Duration::from_secs(3));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("urn:idem:problem:body-timed-out"),
        "{body:?}"
    );
    drop(tx);
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 0);
    // Nothing was claimed: the key runs when the body comes whole.
    let whole = post_key(a.addr, "/pay", "trickled", "{\"amount\":1}").await;
    assert_eq!(whole.status, StatusCode::CREATED, "{}", whole.body);
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_the_store_nothing_runs() {
    let mut a = app(|l| l).await;
    a.idemd.kill().await;
    let r = post_key(a.addr, "/pay", "no-store", "1").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem(), "urn:idem:problem:store-unavailable");
    assert!(r.headers.get("retry-after").is_some());
    assert_eq!(a.runs.pay.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_handler_past_its_timeout_gets_504_and_abandons_the_key() {
    let a = app(|l| l.handler_timeout(Duration::from_millis(300))).await;
    let first = post_key(a.addr, "/slow", "late", "").await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(first.problem(), "urn:idem:problem:handler-timed-out");
    let retry = post_key(a.addr, "/slow", "late", "").await;
    assert_eq!(retry.problem(), "urn:idem:problem:outcome-unknown");
    assert_eq!(a.runs.slow.load(Ordering::SeqCst), 1);
}

/// The store went down while the handler ran and came back after the
/// client's deadline: the layer gave up on recording the response at
/// once (and could not abandon the key either), so the lease lapsed and
/// every retry of a request that had succeeded got `500 outcome-unknown`.
/// The layer now answers the caller, and keeps trying to record the
/// response while the key is still its own; the retry replays it.
#[tokio::test]
async fn a_store_outage_as_the_handler_ends_does_not_lose_its_response() {
    let dir = crate::support::DataDir::new("http-outage");
    let port = crate::support::cluster::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut idemd = Idemd::start_raft_at(&dir, &listen).await;
    let config = idem_client::ClientConfig::default().deadline(Duration::from_millis(800));
    let client = idem_client::Client::connect_with_config(listen.clone(), config)
        .await
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let go = Arc::new(tokio::sync::Notify::new());
    let (r, g) = (runs.clone(), go.clone());
    let router = Router::new()
        .route(
            "/charge",
            post(move || async move {
                let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                g.notified().await;
                (StatusCode::CREATED, format!("charged in run {n}"))
            }),
        )
        .layer(
            IdempotencyLayer::new(client)
                .shared_key_space()
                .lease(Duration::from_secs(8))
                .wait(Duration::from_secs(5)),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let first = tokio::spawn(post_key(addr, "/charge", "outage", "1"));
    running(&runs).await;
    // The store dies while the handler runs; the handler then succeeds.
    idemd.kill().await;
    go.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(first.body, "charged in run 1");
    // Back after the client's deadline, with its records.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _idemd = Idemd::start_raft_at(&dir, &listen).await;
    let retry = post_key(addr, "/charge", "outage", "1").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert_eq!(retry.body, "charged in run 1");
    assert!(retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
