//! Bad input: clear errors, no panics, nothing huge buffered.

use idem_protocol::{ClaimReply, Frame};

use crate::support::*;

#[tokio::test]
async fn command_errors_keep_the_connection_open() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("bad");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["NOPE"], "ERR unknown command 'NOPE'"),
        (
            vec!["CLAIM"],
            "ERR wrong number of arguments for 'claim' command",
        ),
        (
            vec!["CLAIM", &k, "LEASE", "abc"],
            "ERR LEASE is not an integer or out of range",
        ),
        (
            vec!["CLAIM", &k, "LEASE", "-5"],
            "ERR LEASE is not an integer or out of range",
        ),
        (
            vec!["CLAIM", &k, "LEASE", "0"],
            "ERR LEASE must be between 1 and 3600000 ms",
        ),
        (
            vec!["CLAIM", &k, "LEASE", "3600001"],
            "ERR LEASE must be between 1 and 3600000 ms",
        ),
        (
            vec!["CLAIM", &k, "RETAIN", "0"],
            "ERR RETAIN must be between 1 and 2592000000 ms",
        ),
        (
            vec!["CLAIM", &k, "WAIT", "300001"],
            "ERR WAIT must be between 0 and 300000 ms",
        ),
        (
            vec!["CLAIM", &k, "COLOR", "red"],
            "ERR unknown option 'COLOR' for 'claim'",
        ),
        (
            vec!["CLAIM", &k, "LEASE", "1", "LEASE", "2"],
            "ERR option LEASE given more than once",
        ),
        (
            vec!["CLAIM", &k, "ONEXPIRE", "NEVER"],
            "ERR ONEXPIRE must be one of FREE or RECOVER",
        ),
        (vec!["CLAIM", ""], "ERR key must not be empty"),
        (
            vec!["COMPLETE", &k, "0", "v"],
            "ERR fence is not an integer or out of range",
        ),
        (
            vec!["COMPLETE", &k, "1"],
            "ERR wrong number of arguments for 'complete' command",
        ),
        (
            vec!["RENEW", &k, "1", "100"],
            "ERR syntax error: RENEW key fence LEASE ms",
        ),
        (vec!["SETTLE", &k, "WAIT"], "ERR option WAIT needs a value"),
        (
            vec!["CLIENT", "PAUSE", "10"],
            "ERR unknown subcommand 'PAUSE' for 'client'",
        ),
        (
            vec!["CLIENT", "KILL"],
            "ERR wrong number of arguments for 'client' command",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(err(&c.cmd(&args).await), want, "{args:?}");
    }
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn oversized_arguments_get_toobig_and_the_connection_stays() {
    let s = Idemd::start_with(
        &[
            ("IDEM_MAX_KEY_BYTES", "16"),
            ("IDEM_MAX_JOURNAL_BYTES", "32"),
        ],
        &[],
    )
    .await;
    let mut c = s.conn().await;
    let long_key = "k".repeat(17);
    assert!(err(&c.cmd(&["CLAIM", &long_key]).await).starts_with("TOOBIG key"));
    let k = key("tb");
    let f = c.acquire(&["CLAIM", &k]).await;
    assert!(
        err(&c
            .cmd(&["JOURNAL", &k, &f.to_string(), &"j".repeat(33)])
            .await)
        .starts_with("TOOBIG journal")
    );
    assert!(
        err(&c.cmd(&["CLAIM", &k, "FP", &"f".repeat(257)]).await).starts_with("TOOBIG fingerprint")
    );
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn oversized_value_is_refused_before_it_is_read() {
    let s = Idemd::start_with(&[("IDEM_MAX_VALUE_BYTES", "1024")], &[]).await;
    let mut c = s.conn().await;
    // Announce a 2 GB value and send none of it: the server answers at once
    // and closes, instead of waiting for (or buffering) the payload.
    c.write_raw(b"*4\r\n$8\r\nCOMPLETE\r\n$1\r\nk\r\n$1\r\n1\r\n$2000000000\r\n")
        .await;
    let e = err(&c.reply().await);
    assert!(
        e.starts_with("TOOBIG bulk length of 2000000000") && e.contains("max_value_bytes"),
        "{e}"
    );
    assert!(c.closed().await);
    // The server is fine.
    let mut d = s.conn().await;
    assert_eq!(d.cmd(&["PING"]).await, Frame::simple("PONG"));
    assert_eq!(info_field(&mut d, "toobig_refusals").await, 1);
}

/// A web page can make a browser POST to idemd's port: the request's
/// header lines were answered `-ERR unknown command` one by one, and the
/// lines of its body ran as commands (a FORGET deleted a record). The
/// connection now closes at the request's first line, as Redis does.
#[tokio::test]
async fn an_http_request_closes_the_connection_before_its_body_runs() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let fence = c.acquire(&["CLAIM", "victim"]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", "victim", &fence.to_string(), "v"])
            .await,
        ok()
    );
    for first in ["POST / HTTP/1.1", "Host: 127.0.0.1:7379"] {
        let mut web = s.conn().await;
        web.write_raw(
            format!(
                "{first}\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n\r\nFORGET victim\r\nCLAIM planted\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(web.closed().await, "{first}: the connection stayed open");
    }
    let r = claim(c.cmd(&["CLAIM", "victim"]).await);
    assert!(matches!(r, ClaimReply::Completed { .. }), "{r:?}");
    assert_eq!(c.cmd(&["INSPECT", "planted"]).await, Frame::Null);
    assert_eq!(info_field(&mut c, "http_refusals").await, 2);
}

#[tokio::test]
async fn huge_array_header_is_refused_without_allocating() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    c.write_raw(b"*2147483647\r\n").await;
    let e = err(&c.reply().await);
    assert!(
        e.starts_with("TOOBIG array length") && e.ends_with("(max_args)"),
        "{e}"
    );
    assert!(c.closed().await);
}

/// An inline command line was split into as many arguments as it held
/// (32K in a 64 KiB line): `COMMAND INFO` of ten thousand names in 60 KB
/// was answered with 550 KB. It holds no more than an array does.
#[tokio::test]
async fn an_inline_command_holds_no_more_arguments_than_max_args() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let mut line = b"COMMAND INFO".to_vec();
    for _ in 0..2000 {
        line.extend_from_slice(b" claim");
    }
    line.extend_from_slice(b"\r\n");
    c.write_raw(&line).await;
    let e = err(&c.reply().await);
    assert!(
        e.starts_with("TOOBIG array length of 2002") && e.ends_with("(max_args)"),
        "{e}"
    );
    assert!(c.closed().await);
    // Within the limit, as before.
    let mut c = s.conn().await;
    c.write_raw(b"COMMAND INFO claim settle\r\n").await;
    let Frame::Array(info) = c.reply().await else {
        panic!("COMMAND INFO answers an array")
    };
    assert_eq!(info.len(), 2);
}

/// A request with nothing in it (an empty or null array, an empty inline
/// line) gets no reply and leaves the connection open, as with Redis: an
/// error for it added a reply the client did not expect (every later
/// reply then answered the wrong request), and `*-1` closed the
/// connection.
#[tokio::test]
async fn empty_requests_are_skipped_without_a_reply() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    c.write_raw(b"*0\r\n*1\r\n$4\r\nPING\r\n*-1\r\n\r\n  \r\nPING x\r\n*0\r\n")
        .await;
    assert_eq!(c.reply().await, Frame::simple("PONG"));
    assert_eq!(c.reply().await, Frame::bulk("x"));
    assert_eq!(c.cmd(&["ECHO", "after"]).await, Frame::bulk("after"));
    let mut stats = s.conn().await;
    assert_eq!(info_field(&mut stats, "protocol_errors").await, 0);
}

#[tokio::test]
async fn malformed_frames_get_protocol_error_and_close() {
    let s = Idemd::start().await;
    let mut stats = s.conn().await;
    let protocol_errors = info_field(&mut stats, "protocol_errors").await;
    let toobig = info_field(&mut stats, "toobig_refusals").await;
    let malformed = [
        &b"*1\r\n$x\r\n"[..],
        b"*1\r\n:1\r\n",
        b"$3\r\nabcXY",
        b"$3\r\nabc\r\n",
        b"*1\r\n$1\r\nabc",
    ];
    for bad in malformed {
        // Each on its own connection: the server answers with one error and
        // closes, so `closed` also proves no second reply followed.
        let mut c = s.conn().await;
        c.write_raw(bad).await;
        let e = err(&c.reply().await);
        assert!(e.starts_with("ERR protocol error"), "{bad:?}: {e}");
        assert!(c.closed().await, "{bad:?}: connection left open");
    }
    assert_eq!(
        info_field(&mut stats, "protocol_errors").await - protocol_errors,
        malformed.len() as u64,
        "one protocol error counted per malformed frame"
    );
    // Requests are flat: a nested array is refused as too deep, which is
    // counted as TOOBIG, not as a protocol error.
    let mut c = s.conn().await;
    c.write_raw(b"*2\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n").await;
    assert!(err(&c.reply().await).starts_with("TOOBIG nesting depth"));
    assert!(c.closed().await);
    assert_eq!(info_field(&mut stats, "toobig_refusals").await - toobig, 1);
    assert_eq!(
        info_field(&mut stats, "protocol_errors").await - protocol_errors,
        malformed.len() as u64
    );
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn random_garbage_never_kills_the_server() {
    let s = Idemd::start().await;
    let mut seed = 0x9e3779b97f4a7c15u64;
    for _ in 0..200 {
        let mut c = s.conn().await;
        let mut junk = Vec::new();
        for _ in 0..(seed % 300) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let alphabet = b"*$:+-\r\n0123456789abcCLAIM ";
            junk.push(alphabet[(seed % alphabet.len() as u64) as usize]);
        }
        c.write_raw(&junk).await;
        drop(c);
    }
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}
