//! Load: many connections, deep pipelines, slow and non-reading clients.

use std::time::{Duration, Instant};

use idem_protocol::{ClaimReply, Frame};
use tokio::io::AsyncWriteExt;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_connections() {
    let s = Idemd::start().await;
    // Client and server each hold one descriptor per connection.
    let n = 2000.min(open_files_limit().saturating_sub(300));
    assert!(
        n >= 500,
        "open file limit too low for this test: {}",
        open_files_limit()
    );
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(s.conn().await);
    }
    let mut tasks = Vec::new();
    for (i, mut c) in conns.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let k = key(&format!("conn{i}"));
            let f = c.acquire(&["CLAIM", &k]).await;
            assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
            c
        }));
    }
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.expect("task"));
    }
    let mut c = s.conn().await;
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), n as i64);
    assert!(info_field(&mut c, "connected_clients").await >= n as u64);
}

#[tokio::test]
async fn pipeline_of_thousands_of_commands() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let prefix = key("pipe");
    let mut wire = bytes::BytesMut::new();
    for i in 0..5000 {
        idem_protocol::encode(
            &cmd_frame(&["CLAIM", &format!("{prefix}-{i}")]),
            idem_protocol::Version::Resp2,
            &mut wire,
        );
    }
    c.write_raw(&wire).await;
    let mut last = 0;
    for _ in 0..5000 {
        match claim(c.reply().await) {
            ClaimReply::Acquired { fence } => {
                assert!(fence > last, "replies out of order");
                last = fence;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn half_open_client_blocks_nobody() {
    let s = Idemd::start().await;
    let mut slow = s.conn().await;
    // Half a frame, then silence.
    slow.write_raw(b"*3\r\n$5\r\nCLAIM\r\n$3\r\nabc\r\n$5\r\nLE")
        .await;
    let mut other = s.conn().await;
    let t = Instant::now();
    for i in 0..100 {
        other.acquire(&["CLAIM", &key(&format!("fast{i}"))]).await;
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    // The slow client finishes its frame and is answered.
    slow.write_raw(b"ASE\r\n").await;
    let e = err(&slow.reply().await);
    assert_eq!(e, "ERR option LEASE needs a value");
}

#[tokio::test]
async fn client_that_never_reads_is_disconnected_at_the_output_limit() {
    let s = Idemd::start_with(
        &[
            ("IDEM_MAX_VALUE_BYTES", "65536"),
            ("IDEM_MAX_OUTPUT_BUFFER_BYTES", "1048576"),
            ("IDEM_MAX_FRAME_BYTES", "1048576"),
        ],
        &[],
    )
    .await;
    let mut setup = s.conn().await;
    let k = key("big");
    let f = setup.acquire(&["CLAIM", &k]).await;
    let value = "v".repeat(60_000);
    assert_eq!(
        setup.cmd(&["COMPLETE", &k, &f.to_string(), &value]).await,
        ok()
    );
    // Ask for the 60 KB replay 2,000 times (120 MB of replies) and never read.
    let mut hog = s.conn().await;
    let mut wire = bytes::BytesMut::new();
    for _ in 0..100 {
        idem_protocol::encode(
            &cmd_frame(&["CLAIM", &k]),
            idem_protocol::Version::Resp2,
            &mut wire,
        );
    }
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_secs(2), hog.stream.write_all(&wire))
            .await
            .map_or(true, |r| r.is_err())
        {
            break;
        }
    }
    // Either a write failed (the server closed) or it blocked; in both cases
    // the server must have let go of the client, exactly once.
    wait_for_info(&mut setup, "output_limit_disconnects", 1).await;
    assert_eq!(setup.cmd(&["PING"]).await, Frame::simple("PONG"));
}
