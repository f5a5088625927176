//! Real Redis tools against idemd: redis-cli and redis-benchmark (Debian
//! package redis-tools) and prometheus-redis-exporter; and the alerting
//! rules shipped for Prometheus, checked with promtool (Debian package
//! prometheus). CI installs all three.

use std::process::Command;

use crate::support::*;

/// Debian's prometheus-redis-exporter.
const EXPORTER: &str = "prometheus-redis-exporter";

/// Prometheus's rule checker (Debian package prometheus).
const PROMTOOL: &str = "promtool";

/// `name` if it is installed; CI must have it (it installs redis-tools and
/// the exporter).
pub(crate) fn tool(name: &'static str) -> Option<&'static str> {
    let package = match name {
        EXPORTER => EXPORTER,
        PROMTOOL => "prometheus",
        _ => "redis-tools",
    };
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(name);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{name} is required in CI (apt-get install {package})"
    );
    eprintln!("skipping: {name} is not installed (apt-get install {package})");
    None
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

/// prometheus-redis-exporter (Debian's package of the usual way to watch
/// Redis from Prometheus; CI installs it) scrapes a durable idemd with no
/// Idem-specific setting: it is up, its records are db0's keys, a record
/// removed by its lease running out counts as an expired key, and the
/// instance carries idemd's run id and mode.
#[tokio::test]
async fn redis_exporter_scrapes_idemd() {
    if tool(EXPORTER).is_none() {
        return;
    }
    let dir = DataDir::new("exporter");
    let s = Idemd::start_with(&[], &["--engine", "raft", "--data-dir", dir.arg()]).await;
    let mut c = s.conn().await;
    let k = key("exp");
    for i in 0..3 {
        let r = claim(
            c.cmd(&["CLAIM", &format!("{k}-{i}"), "LEASE", "60000"])
                .await,
        );
        assert!(matches!(r, idem_protocol::ClaimReply::Acquired { .. }));
    }
    let r = claim(c.cmd(&["CLAIM", &format!("{k}-short"), "LEASE", "1"]).await);
    assert!(matches!(r, idem_protocol::ClaimReply::Acquired { .. }));
    // A completion by a fence that does not own the key: a failed call.
    let fenced = c.cmd(&["COMPLETE", &format!("{k}-0"), "999999", "x"]).await;
    assert!(err(&fenced).starts_with("FENCED"), "{fenced:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while info_field(&mut c, "expired_keys").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the short lease never lapsed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let info = bulk(&c.cmd(&["INFO", "server"]).await);
    let run_id = info
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .expect("INFO has run_id")
        .trim()
        .to_owned();
    assert_eq!(run_id.len(), 40, "{run_id}");
    assert!(run_id.bytes().all(|b| b.is_ascii_hexdigit()), "{run_id}");

    let (page, log) = exporter_scrape(s.addr).await.unwrap();
    let value = |name: &str| sample(&page, name);
    assert_eq!(value("redis_up"), 1.0);
    assert_eq!(value("redis_db_keys{db=\"db0\"}"), 3.0);
    assert_eq!(value("redis_db_keys_expiring{db=\"db0\"}"), 3.0);
    assert!(value("redis_expired_keys_total") >= 1.0);
    assert_eq!(value("redis_evicted_keys_total"), 0.0);
    assert!(value("redis_connected_clients") >= 1.0);
    assert!(value("redis_memory_used_rss_bytes") > 1e6);
    assert_eq!(value("redis_keyspace_misses_total"), 4.0);
    assert_eq!(value("redis_keyspace_hits_total"), 0.0);
    assert!(value("redis_net_input_bytes_total") > 0.0);
    assert!(value("redis_net_output_bytes_total") > 0.0);
    assert!(value("redis_cpu_user_seconds_total") >= 0.0);
    assert!(value("redis_cpu_sys_seconds_total") >= 0.0);
    // Per-command statistics (INFO commandstats, errorstats, latencystats).
    assert_eq!(value("redis_commands_total{cmd=\"claim\"}"), 4.0);
    assert_eq!(
        value("redis_commands_failed_calls_total{cmd=\"complete\"}"),
        1.0
    );
    assert!(value("redis_commands_duration_seconds_total{cmd=\"claim\"}") > 0.0);
    assert_eq!(value("redis_errors_total{err=\"FENCED\"}"), 1.0);
    assert!(value("redis_latency_percentiles_usec{cmd=\"claim\",quantile=\"50\"}") > 0.0);
    let instance = page
        .lines()
        .find(|l| l.starts_with("redis_instance_info{"))
        .unwrap_or_else(|| panic!("no redis_instance_info in\n{page}"));
    assert!(instance.contains("redis_mode=\"cluster\""), "{instance}");
    assert!(
        instance.contains(&format!("run_id=\"{run_id}\"")),
        "{instance}"
    );
    // Every command the exporter sends is known (it logs an error for one
    // that is not, such as LATENCY LATEST).
    assert!(!log.contains("unknown command"), "{log}");
}

/// One scrape of prometheus-redis-exporter pointed at the idemd on
/// `redis`: the page and what the exporter logged until then. `None`
/// where the exporter is not installed.
pub(crate) async fn exporter_scrape(redis: std::net::SocketAddr) -> Option<(String, String)> {
    tool(EXPORTER)?;
    let web = std::net::SocketAddr::from(([127, 0, 0, 1], crate::support::cluster::free_port()));
    let logs = DataDir::new("exporter-log");
    std::fs::create_dir_all(&logs.0).unwrap();
    let log = logs.0.join("exporter.log");
    let mut exporter = tokio::process::Command::new(EXPORTER)
        .arg(format!("--redis.addr=redis://{redis}"))
        .arg(format!("--web.listen-address={web}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("the exporter starts");
    let page = scrape(web).await;
    let _ = exporter.kill().await;
    Some((page, std::fs::read_to_string(&log).unwrap()))
}

/// The value of the sample `name` (with its labels, as written) on an
/// exporter's `page`.
pub(crate) fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{page}"))
}

/// `GET /metrics` from `addr`, retried until the server there answers.
pub(crate) async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            if out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200") {
                return out;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the exporter never answered on {addr}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// One HTTP exchange with `addr`: `request` sent as is, the whole answer.
async fn http(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("the metrics listener answers and closes")
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// A durable idemd on `dir` serving /metrics, and that address.
async fn with_metrics(dir: &DataDir) -> (Idemd, std::net::SocketAddr) {
    let web = std::net::SocketAddr::from(([127, 0, 0, 1], crate::support::cluster::free_port()));
    let web_arg = web.to_string();
    let s = Idemd::start_with(
        &[],
        &[
            "--engine",
            "raft",
            "--data-dir",
            dir.arg(),
            "--metrics-listen",
            &web_arg,
        ],
    )
    .await;
    (s, web)
}

#[tokio::test]
async fn prometheus_scrapes_metrics_listen() {
    let dir = DataDir::new("metrics");
    let (s, web) = with_metrics(&dir).await;
    let mut c = s.conn().await;
    let k = key("prom");
    let mut fences = Vec::new();
    for i in 0..5 {
        fences.push(
            c.acquire(&["CLAIM", &format!("{k}-{i}"), "LEASE", "60000"])
                .await,
        );
    }
    assert_eq!(
        c.cmd(&["COMPLETE", &format!("{k}-0"), &fences[0].to_string(), "v"])
            .await,
        ok()
    );
    let r = claim(c.cmd(&["CLAIM", &format!("{k}-0")]).await);
    assert!(
        matches!(r, idem_protocol::ClaimReply::Completed { .. }),
        "{r:?}"
    );
    let fenced = c.cmd(&["COMPLETE", &format!("{k}-1"), "999999", "x"]).await;
    assert!(err(&fenced).starts_with("FENCED"));

    let page = scrape(web).await;
    let (head, body) = page.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    // Every sample is `name{labels} value` of a family declared before it.
    let mut declared = std::collections::HashSet::new();
    let mut samples = std::collections::HashMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                ["counter", "gauge", "histogram", "summary"].contains(&kind),
                "{line}"
            );
            assert!(declared.insert(name.to_owned()), "{name} declared twice");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "{line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
            .unwrap_or(name);
        assert!(declared.contains(family), "{line} before its # TYPE");
        if name.ends_with("_total") {
            assert!(value >= 0.0, "{line}");
        }
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    let v = |series: &str| -> f64 {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
    };
    assert_eq!(v("idem_claims_total{outcome=\"acquired\"}"), 5.0);
    assert_eq!(v("idem_claims_total{outcome=\"replayed\"}"), 1.0);
    assert_eq!(v("idem_fenced_total"), 1.0);
    // INFO's expired_keys (expired_records counts the ends of retention).
    assert_eq!(v("idem_expired_keys_total"), 0.0);
    assert_eq!(v("idem_records{state=\"in_flight\"}"), 4.0);
    assert_eq!(v("idem_records{state=\"completed\"}"), 1.0);
    assert_eq!(v("idem_commands_total{cmd=\"claim\"}"), 6.0);
    assert_eq!(
        v("idem_command_errors_total{cmd=\"complete\",kind=\"failed\"}"),
        1.0
    );
    assert_eq!(v("idem_error_replies_total{code=\"FENCED\"}"), 1.0);
    assert_eq!(v("idem_raft_is_leader"), 1.0);
    assert_eq!(v("idem_raft_has_leader"), 1.0);
    assert_eq!(v("idem_raft_leader_changes_seen_total"), 1.0);
    // Four fifths of the default election_timeout_ms (300).
    assert_eq!(v("idem_raft_lease_seconds"), 0.24);
    assert_eq!(v("idem_raft_follower_reads_total"), 0.0);
    assert_eq!(v("idem_raft_read_index_rounds_total"), 0.0);
    assert_eq!(v("idem_raft_follower_reads_redirected_total"), 0.0);
    assert!(v("idem_wal_fsyncs_total") >= 6.0);
    assert!(v("process_resident_memory_bytes") > 1e6);
    // The latency histogram: cumulative, ending at the count.
    let mut by_le: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(s, _)| s.starts_with("idem_command_duration_seconds_bucket{cmd=\"claim\","))
        .map(|(s, n)| {
            let le = s.split("le=\"").nth(1).unwrap().trim_end_matches("\"}");
            (le.parse::<f64>().unwrap_or(f64::INFINITY), *n)
        })
        .collect();
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    let buckets: Vec<f64> = by_le.into_iter().map(|(_, n)| n).collect();
    assert_eq!(buckets.len(), 18);
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(
        *buckets.last().unwrap(),
        v("idem_command_duration_seconds_count{cmd=\"claim\"}")
    );
    // The same counters as INFO.
    assert_eq!(info_field(&mut c, "claims_acquired").await, 5);

    // Anything else is refused; a request that never ends is cut off.
    let other = http(web, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    let post = http(web, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n", "a".repeat(8000));
    let big = http(web, huge.as_bytes()).await;
    assert!(big.starts_with("HTTP/1.1 400"), "{big}");
    // A listen address that is not one stops the start.
    let e = refused_start(&["--metrics-listen", "localhost"]);
    assert!(e.contains("metrics_listen") && e.contains("IP:PORT"), "{e}");
    let t = std::time::Instant::now();
    let silent = http(web, b"GET /metrics HTTP/1.1\r\n").await;
    assert!(silent.starts_with("HTTP/1.1 400"), "{silent}");
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(4),
        "{:?}",
        t.elapsed()
    );
}

/// The alerting rules in config/prometheus hold together: every idem_*
/// series they read is one a node serves on /metrics (a rule on a series
/// that does not exist never fires), promtool accepts them, and their unit
/// tests (each alert fires on its condition, and none on a healthy
/// cluster) pass.
#[tokio::test]
async fn the_alerting_rules_read_series_idemd_serves_and_pass_their_tests() {
    let rules_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/prometheus");
    let rules = std::fs::read_to_string(rules_dir.join("idem-alerts.yml")).unwrap();
    let dir = DataDir::new("rules");
    let (_s, web) = with_metrics(&dir).await;
    let page = scrape(web).await;
    let mut read = std::collections::BTreeSet::new();
    for (i, _) in rules.match_indices("idem_") {
        let name: String = rules[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        read.insert(name);
    }
    assert!(read.len() >= 10, "{read:?}");
    for name in &read {
        // A summary's `_sum` and `_count` are typed under its own name.
        let family = ["_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| page.contains(&format!("\n# TYPE {f} summary")))
            .unwrap_or(name);
        assert!(
            page.contains(&format!("\n# TYPE {family} "))
                && (family == name || page.contains(&format!("\n{name} "))),
            "the rules read {name}, which /metrics does not serve"
        );
    }
    let Some(promtool) = tool(PROMTOOL) else {
        return;
    };
    // The page passes Prometheus's own lint (a quantile label on a gauge
    // did not).
    let mut lint = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    {
        use std::io::Write;
        let body = page.split_once("\r\n\r\n").map_or(&page[..], |(_, b)| b);
        lint.stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
    }
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        ["check", "rules", "idem-alerts.yml"],
        ["test", "rules", "idem-alerts.test.yml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(&rules_dir)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
