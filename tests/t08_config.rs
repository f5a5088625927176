//! Configuration: file, environment, flags, and clear refusals.

use std::process::Command;

use idem_protocol::Frame;

use crate::support::*;

fn idemd(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemd"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("idemd runs")
}

#[test]
fn invalid_settings_exit_with_a_clear_message() {
    let out = idemd(&["--listen", "nowhere"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value for listen"));
    let out = idemd(&["--engine", "paper"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine 'paper'"));
    let out = idemd(&[], &[("IDEM_MAX_WAIT_MS", "soon")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_wait_ms"));
    let out = idemd(&["--config", "/nonexistent/idem.toml"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
    // A count that wrapped past the open-files check panicked at start; a
    // terabyte segment filled the disk before the start failed.
    for (var, value, key) in [
        (
            "IDEM_MAX_CONNECTIONS",
            "18446744073709551615",
            "max_connections",
        ),
        (
            "IDEM_WAL_SEGMENT_BYTES",
            "1099511627776",
            "wal_segment_bytes",
        ),
        (
            "IDEM_WORKER_THREADS",
            "18446744073709551615",
            "worker_threads",
        ),
    ] {
        let out = idemd(&["--data-dir", "/nonexistent/idem-data"], &[(var, value)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}: {err}");
        assert!(err.contains(&format!("invalid value for {key}")), "{err}");
    }
    // 5,000 threads were started without a word; a RUST_LOG that does not
    // parse was ignored in silence (a bad `log` is refused).
    for (var, value, says) in [
        (
            "IDEM_WORKER_THREADS",
            "5000",
            "invalid value for worker_threads",
        ),
        ("RUST_LOG", "bad=[[", "invalid log filter in RUST_LOG"),
    ] {
        let out = idemd(&[], &[(var, value)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: {err}");
        assert!(err.contains(says), "{err}");
    }
}

/// A refusal is one line naming the setting and every cause, whatever
/// `RUST_BACKTRACE` says: a configuration mistake is not a crash, and a
/// backtrace after it only buries the message.
#[test]
fn a_refusal_is_one_line_with_its_causes_and_no_backtrace() {
    let out = idemd(
        &["--config", "/nonexistent/idem.toml"],
        &[("RUST_BACKTRACE", "1"), ("RUST_LIB_BACKTRACE", "1")],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("idemd: error: cannot read config file /nonexistent/idem.toml: "),
        "{stderr}"
    );
    // The cause (the OS error) is on the same line.
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");

    let out = idemd(&["--listen", "127.0.0.1:99999"], &[("RUST_BACKTRACE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        "idemd: error: invalid value for listen: '127.0.0.1:99999' is not IP:PORT (an IP address and a port; host names are not resolved)"
    );
}

#[tokio::test]
async fn file_then_env_then_flags() {
    let dir = std::env::temp_dir().join(format!("idem-t08-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("idem.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:1\"\nmax_wait_ms = 111\nmax_key_bytes = 100\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    // The flag --listen 127.0.0.1:0 (added by the helper) beats the file;
    // the environment beats the file for max_key_bytes.
    let s = Idemd::start_with(&[("IDEM_MAX_KEY_BYTES", "200")], &["--config", path]).await;
    let mut c = s.conn().await;
    let Frame::Array(v) = c
        .cmd(&["CONFIG", "GET", "max_wait_ms", "max_key_bytes"])
        .await
    else {
        panic!("array")
    };
    assert_eq!(
        v,
        vec![
            Frame::bulk("max_wait_ms"),
            Frame::bulk("111"),
            Frame::bulk("max_key_bytes"),
            Frame::bulk("200")
        ]
    );
    assert!(
        err(&c.cmd(&["CLAIM", "k", "WAIT", "112"]).await)
            .contains("WAIT must be between 0 and 111")
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// An application's own `IDEM_*` variable (`IDEM_ADDR` for its client,
/// say) made idemd refuse to start; it is now ignored with a warning.
#[tokio::test]
async fn an_unknown_idem_variable_does_not_stop_idemd() {
    let s = Idemd::start_with(&[("IDEM_ADDR", "127.0.0.1:7379")], &[]).await;
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
}
