//! A checkout service: charge each order at most once.
//!
//! A declined card is a permanent error: it is recorded and replayed to
//! every retry. A gateway timeout is transient: the claim is released and
//! the next retry charges again.
//!
//! Run idemd, then: `cargo run -p idem-client --features serde --example checkout [HOST:PORT]`

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_client::{Client, Failure, Key, RunError, RunOptions, fingerprint};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct ChargeRequest<'a> {
    order: &'a str,
    amount_cents: u64,
    card: &'a str,
}

#[derive(Serialize, Deserialize, Debug)]
struct Receipt {
    charge_id: String,
}

#[derive(Debug)]
enum GatewayError {
    Declined(&'static str),
    Timeout,
}

/// A fake payment gateway: card "4000" is declined; the first call for
/// "4111" times out, later ones succeed.
async fn gateway(req: &ChargeRequest<'_>, calls: &AtomicU32) -> Result<Receipt, GatewayError> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    match req.card {
        "4000" => Err(GatewayError::Declined("card_declined")),
        "4111" if n == 0 => Err(GatewayError::Timeout),
        _ => Ok(Receipt {
            charge_id: format!("ch_{}_{n}", req.order),
        }),
    }
}

async fn checkout(
    client: &Client,
    req: &ChargeRequest<'_>,
    calls: &AtomicU32,
) -> anyhow::Result<String> {
    let key = Key::new(req.order).namespace("shop").version("1");
    let opts = RunOptions::new()
        .fingerprint(fingerprint(req)?)
        .wait(Duration::from_secs(5))
        .classify(|e: &GatewayError| match e {
            GatewayError::Declined(code) => Failure::Permanent(Bytes::from_static(code.as_bytes())),
            GatewayError::Timeout => Failure::Transient,
        });
    let result = client
        .run_once(key, opts, |_ctx| async {
            let receipt = gateway(req, calls).await?;
            Ok(Bytes::from(
                serde_json::to_vec(&receipt).expect("serializable"),
            ))
        })
        .await;
    Ok(match result {
        Ok(done) if done.is_ok() => {
            let receipt: Receipt = done.json()?;
            format!(
                "charged {} (replayed: {})",
                receipt.charge_id, done.replayed
            )
        }
        Ok(done) => format!(
            "declined: {} (replayed: {})",
            String::from_utf8_lossy(&done.value),
            done.replayed
        ),
        Err(RunError::Effect { error, failure }) => {
            format!("gateway said {error:?}; recorded as {failure:?}")
        }
        Err(e) => return Err(e.into()),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7379".into());
    let client = Client::connect(addr).await?;
    let run = std::process::id();
    let ok_order = format!("order-ok-{run}");
    let declined_order = format!("order-declined-{run}");
    let flaky_order = format!("order-flaky-{run}");
    let calls = AtomicU32::new(0);
    let declined_calls = AtomicU32::new(0);
    let flaky_calls = AtomicU32::new(0);

    let ok = ChargeRequest {
        order: &ok_order,
        amount_cents: 4200,
        card: "4242",
    };
    println!("1st try: {}", checkout(&client, &ok, &calls).await?);
    println!("retry:   {}", checkout(&client, &ok, &calls).await?);

    let declined = ChargeRequest {
        order: &declined_order,
        amount_cents: 999,
        card: "4000",
    };
    println!(
        "1st try: {}",
        checkout(&client, &declined, &declined_calls).await?
    );
    println!(
        "retry:   {}",
        checkout(&client, &declined, &declined_calls).await?
    );

    let flaky = ChargeRequest {
        order: &flaky_order,
        amount_cents: 100,
        card: "4111",
    };
    println!(
        "1st try: {}",
        checkout(&client, &flaky, &flaky_calls).await?
    );
    println!(
        "retry:   {}",
        checkout(&client, &flaky, &flaky_calls).await?
    );

    // Same order key, different payload: refused instead of replaying.
    let tampered = ChargeRequest {
        order: &ok_order,
        amount_cents: 1,
        card: "4242",
    };
    match checkout(&client, &tampered, &calls).await {
        Err(e) => println!("tampered retry refused: {e}"),
        Ok(s) => println!("unexpected: {s}"),
    }
    println!(
        "gateway calls: ok order {}, declined order {}, flaky order {}",
        calls.load(Ordering::SeqCst),
        declined_calls.load(Ordering::SeqCst),
        flaky_calls.load(Ordering::SeqCst)
    );
    Ok(())
}
