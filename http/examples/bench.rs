//! Requests per second of a trivial axum handler without the layer, with
//! it on fresh keys (every request claims, runs and completes), and with
//! it on replays (every request finds its key completed).
//!
//! ```sh
//! cargo run --release --bin idemd -- --engine memory &
//! cargo run --release -p idem-http --example bench -- [connections] [seconds]
//! ```
//!
//! The HTTP clients and the server run in this process; idemd in another.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idem_http::IdempotencyLayer;

async fn serve(router: Router) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// `conns` keep-alive connections posting for `secs`; `key(conn, n)` gives
/// the Idempotency-Key of a connection's nth request (None: no header).
async fn drive(
    addr: SocketAddr,
    conns: usize,
    secs: u64,
    key: fn(usize, u64) -> Option<String>,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut lat = Vec::new();
            let mut n = 0u64;
            while Instant::now() < until {
                let mut req = hyper::Request::post("/pay").header("host", "bench");
                if let Some(k) = key(c, n) {
                    req = req.header("idempotency-key", k);
                }
                let req = req.body(Full::new(Bytes::from_static(b"{\"amount\":42}")))?;
                let t = Instant::now();
                let resp = sender.send_request(req).await?;
                let status = resp.status();
                resp.into_body().collect().await?;
                anyhow::ensure!(status.is_success(), "status {status}");
                lat.push(t.elapsed());
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok((
        done.load(Ordering::Relaxed) as f64 / secs as f64,
        pct(0.5),
        pct(0.99),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let conns: usize = args.next().map_or(Ok(32), |a| a.parse())?;
    let secs: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let idem_addr = std::env::var("IDEM_ADDR").unwrap_or_else(|_| "127.0.0.1:7379".into());
    let client = idem_client::Client::connect(idem_addr).await?;
    let handler = post(|| async { "{\"id\":1}" });
    let plain = serve(Router::new().route("/pay", handler.clone())).await?;
    let layered = serve(
        Router::new()
            .route("/pay", handler)
            .layer(IdempotencyLayer::new(client).shared_key_space()),
    )
    .await?;
    println!("{conns} connections, {secs} s each; handler returns a constant");
    let (rps, p50, p99) = drive(plain, conns, secs, |_, _| None).await?;
    println!("no layer:          {rps:>9.0} req/s  p50 {p50:?}  p99 {p99:?}");
    let fresh: fn(usize, u64) -> Option<String> =
        |c, n| Some(format!("{}-{c}-{n}", std::process::id()));
    let (rps, p50, p99) = drive(layered, conns, secs, fresh).await?;
    println!("layer, fresh keys: {rps:>9.0} req/s  p50 {p50:?}  p99 {p99:?}");
    let (rps, p50, p99) = drive(layered, conns, secs, |c, _| Some(format!("replay-{c}"))).await?;
    println!("layer, replays:    {rps:>9.0} req/s  p50 {p50:?}  p99 {p99:?}");
    Ok(())
}
