//! A "payments" service behind the idempotency layer.
//!
//! ```sh
//! cargo run --release --bin idemd &
//! cargo run -p idem-http --example payments
//! curl -i -X POST localhost:3000/payments -H 'content-type: application/json' \
//!      -H 'X-Account-Id: acct-1' -H 'Idempotency-Key: order-1' -d '{"amount":42}'
//! curl -i -X POST localhost:3000/payments -H 'content-type: application/json' \
//!      -H 'X-Account-Id: acct-1' -H 'Idempotency-Key: order-1' -d '{"amount":42}'   # replayed
//! ```
//!
//! Keys are scoped by `X-Account-Id`, which stands for what a gateway in
//! front sets from the authenticated caller (it must drop any the client
//! sent: the layer trusts it). A request without a valid one is refused
//! (`400`) before the layer: it must not fall into a key space shared with
//! other callers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_http::{Idempotency, IdempotencyLayer};

#[derive(Clone, Default)]
struct Ledger {
    next: Arc<AtomicU64>,
}

async fn pay(
    State(ledger): State<Ledger>,
    Extension(idem): Extension<Idempotency>,
    Json(req): Json<serde_json::Value>,
) -> (StatusCode, Json<serde_json::Value>) {
    let amount = req["amount"].as_u64().unwrap_or(0);
    if amount == 0 {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "amount must be positive"})),
        );
    }
    let id = ledger.next.fetch_add(1, Ordering::Relaxed) + 1;
    // The fence orders this run after every earlier one: a downstream
    // ledger can refuse writes from a smaller fence.
    let _ = idem.journal(format!("charging payment {id}")).await;
    (
        StatusCode::CREATED,
        Json(serde_json::json!({"id": id, "amount": amount, "fence": idem.fence()})),
    )
}

/// The caller's account: 1 to 64 letters, digits, `-` or `_`.
fn account(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get("x-account-id")
        .and_then(|v| v.to_str().ok())
        .filter(|a| {
            (1..=64).contains(&a.len())
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Refuses a request without a valid account before the idempotency
/// layer sees it.
async fn require_account(req: Request, next: Next) -> Response {
    if account(req.headers()).is_some() {
        return next.run(req).await;
    }
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": "X-Account-Id is missing or invalid"})),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let idem_addr = std::env::var("IDEM_ADDR").unwrap_or_else(|_| "127.0.0.1:7379".into());
    let idem = idem_client::Client::connect(idem_addr).await?;
    let app = Router::new()
        .route("/payments", post(pay))
        .with_state(Ledger::default())
        // Keys are scoped by the caller's account (here a header a gateway
        // in front sets; an auth layer's extension works the same), so
        // one account can never replay another's payment. The account is
        // checked first (the outer layer): every request that reaches the
        // idempotency layer has one.
        .layer(
            IdempotencyLayer::new(idem)
                .scope(|parts| account(&parts.headers).unwrap_or_default().to_owned()),
        )
        .layer(middleware::from_fn(require_account));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("payments on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
