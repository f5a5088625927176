//! A webhook consumer: a burst of duplicate deliveries of the same event,
//! processed exactly once; every duplicate waits for and gets the result.
//!
//! Run idemd, then: `cargo run -p idem-client --example webhook [HOST:PORT]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_client::{Client, Key, RunOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7379".into());
    let client = Client::connect(addr).await?;
    let event = format!("evt_{}", std::process::id());
    let processed = Arc::new(AtomicU32::new(0));

    // The provider retries aggressively: 50 deliveries within milliseconds.
    let mut deliveries = Vec::new();
    for i in 0..50 {
        let client = client.clone();
        let processed = processed.clone();
        let key = Key::new(event.clone()).namespace("stripe-webhooks");
        deliveries.push(tokio::spawn(async move {
            let opts = RunOptions::<std::convert::Infallible>::new().wait(Duration::from_secs(10));
            let done = client
                .run_once(key, opts, |ctx| async move {
                    processed.fetch_add(1, Ordering::SeqCst);
                    ctx.journal("fulfilment-started").await.ok();
                    tokio::time::sleep(Duration::from_millis(300)).await; // the real work
                    Ok(Bytes::from(format!("fulfilled by delivery {i}")))
                })
                .await
                .expect("delivery handled");
            (i, done)
        }));
    }
    let mut replays = 0;
    for d in deliveries {
        let (_, done) = d.await?;
        if done.replayed {
            replays += 1;
        }
        assert!(done.is_ok());
    }
    println!(
        "50 deliveries: effect ran {} time(s), {} deliveries got the stored result",
        processed.load(Ordering::SeqCst),
        replays
    );
    Ok(())
}
