//! Real Redis tools against idemd: redis-cli and redis-benchmark (Debian
//! package redis-tools; CI installs it).

use std::process::Command;

use crate::support::*;

pub(crate) fn tool(name: &str) -> Option<&'static str> {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success());
    match found {
        Ok(true) => Some(if name == "redis-cli" {
            "redis-cli"
        } else {
            "redis-benchmark"
        }),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{name} is required in CI (apt-get install redis-tools)"
            );
            eprintln!("skipping: {name} is not installed (apt-get install redis-tools)");
            None
        }
    }
}

fn cli(addr: std::net::SocketAddr, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8")
        .trim_end()
        .to_owned()
}

#[tokio::test]
async fn redis_cli_claim_complete_claim() {
    if tool("redis-cli").is_none() {
        return;
    }
    let s = Idemd::start().await;
    let k = key("cli");
    let acquired = cli(s.addr, &["CLAIM", &k, "LEASE", "5000"]);
    let mut lines = acquired.lines();
    assert_eq!(lines.next(), Some("ACQUIRED"));
    let fence = lines.next().expect("fence line");
    assert_eq!(cli(s.addr, &["COMPLETE", &k, fence, "receipt-42"]), "OK");
    assert_eq!(cli(s.addr, &["CLAIM", &k]), "COMPLETED\nOK\nreceipt-42");
    assert_eq!(cli(s.addr, &["PING"]), "PONG");
    // RESP3 through redis-cli -3.
    let inspect = cli(s.addr, &["-3", "INSPECT", &k]);
    assert!(
        inspect.contains("completed") && inspect.contains("receipt-42"),
        "{inspect}"
    );
    let err = cli(s.addr, &["CLAIM", &k, "LEASE", "0"]);
    assert!(err.contains("LEASE must be between"), "{err}");
}

#[tokio::test]
async fn redis_benchmark_drives_idemd() {
    if tool("redis-benchmark").is_none() {
        return;
    }
    let s = Idemd::start().await;
    let port = s.addr.port().to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-q",
            "-n",
            "2000",
            "-c",
            "10",
            "-P",
            "4",
            "-r",
            "1000000",
        ])
        .args(["CLAIM", "bench:__rand_int__", "LEASE", "60000"])
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("requests per second"),
        "{text}"
    );
    let mut c = s.conn().await;
    assert!(info_field(&mut c, "claims_acquired").await > 1000);
}
