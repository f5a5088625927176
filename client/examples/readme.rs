//! The client snippet of the README, compiled: `client/tests/readme.rs`
//! checks that the lines between the markers are the README's, so the
//! README's example always builds. Run against a local idemd:
//! `cargo run -p idem-client --example readme`.

use idem_client::Bytes;

/// What the payment gateway of the snippet can answer.
#[derive(Debug)]
#[allow(dead_code)]
enum GatewayError {
    /// The decline code, as the gateway's SDK gives it.
    Declined(String),
    Timeout,
    Other,
}

/// The snippet's effect: a charge that succeeds.
async fn charge(fence: u64) -> Result<Bytes, GatewayError> {
    Ok(Bytes::from(format!("ch_{fence}")))
}

async fn readme() -> Result<(), Box<dyn std::error::Error>> {
    // README BEGIN
    use idem_client::{Client, Failure, Key, RunOptions};
    use std::time::Duration;

    let client = Client::connect("127.0.0.1:7379").await?;
    let key = Key::new("order-1234").namespace("tenant-a").version("1"); // "tenant-a:1:order-1234"
    let opts = RunOptions::new()
        .wait(Duration::from_secs(5)) // wait server-side for a live owner
        .classify(|e: &GatewayError| match e {
            GatewayError::Declined(code) => Failure::Permanent(code.clone().into()), // completed ERR, replayed
            GatewayError::Timeout => Failure::Transient, // released, retry runs again
            _ => Failure::Unknown,                       // abandoned, next caller recovers
        });
    let done = client
        .run_once(key, opts, |ctx| charge(ctx.fence()))
        .await?;
    println!("{:?} replayed={}", done.value, done.replayed);
    // README END
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(e) = readme().await {
        eprintln!("readme example: {e}");
        std::process::exit(1);
    }
}
