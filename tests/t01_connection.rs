//! Connection and server commands.

use idem_protocol::Frame;
use tokio::io::AsyncReadExt;

use crate::support::*;

#[tokio::test]
async fn ping_echo_quit() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
    assert_eq!(bulk(&c.cmd(&["ping", "hi"]).await), "hi");
    assert_eq!(bulk(&c.cmd(&["ECHO", "a\r\nb"]).await), "a\r\nb");
    assert_eq!(c.cmd(&["QUIT"]).await, ok());
    assert!(c.closed().await);
}

#[tokio::test]
async fn inline_commands_work_like_telnet() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    c.write_raw(b"PING\r\n\r\nCLAIM inline-key LEASE 1000\r\nECHO x\n")
        .await;
    assert_eq!(c.reply().await, Frame::simple("PONG"));
    assert!(matches!(
        claim(c.reply().await),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
    assert_eq!(bulk(&c.reply().await), "x");
}

#[tokio::test]
async fn hello_switches_to_resp3() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let k = key("hello");
    c.acquire(&["CLAIM", &k]).await;
    // RESP2: INSPECT is a flat array, nulls are $-1.
    let Frame::Array(items) = c.cmd(&["INSPECT", &k]).await else {
        panic!("RESP2 INSPECT is an array")
    };
    assert_eq!(items.len(), 18);
    let Frame::Map(hello) = c.cmd(&["HELLO", "3", "SETNAME", "w1"]).await else {
        panic!("HELLO 3 answers a map")
    };
    assert!(hello.contains(&(Frame::bulk("proto"), Frame::Integer(3))));
    assert!(hello.contains(&(Frame::bulk("server"), Frame::bulk("idem"))));
    let Frame::Map(fields) = c.cmd(&["INSPECT", &k]).await else {
        panic!("RESP3 INSPECT is a map")
    };
    assert!(fields.contains(&(Frame::simple("retain_ms"), Frame::Null)));
    assert_eq!(bulk(&c.cmd(&["CLIENT", "GETNAME"]).await), "w1");
    assert!(err(&c.cmd(&["HELLO", "4"]).await).starts_with("NOPROTO"));
    let Frame::Array(_) = c.cmd(&["HELLO", "2"]).await else {
        panic!("HELLO 2 answers in RESP2: a flat array")
    };
}

#[tokio::test]
async fn hello_2_is_a_flat_array() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let id = int(&c.cmd(&["CLIENT", "ID"]).await);
    let Frame::Array(cfg) = c.cmd(&["CONFIG", "GET", "engine"]).await else {
        panic!("CONFIG GET is an array in RESP2")
    };
    let [name, engine] = &cfg[..] else {
        panic!("CONFIG GET engine: {cfg:?}")
    };
    assert_eq!(bulk(name), "engine");
    let Frame::Array(items) = c.cmd(&["HELLO", "2"]).await else {
        panic!("RESP2 map is an array")
    };
    // The map flattened to name, value, name, value, ...
    assert_eq!(
        items,
        vec![
            Frame::bulk("server"),
            Frame::bulk("idem"),
            Frame::bulk("version"),
            Frame::bulk(env!("CARGO_PKG_VERSION")),
            Frame::bulk("proto"),
            Frame::Integer(2),
            Frame::bulk("id"),
            Frame::Integer(id),
            Frame::bulk("mode"),
            Frame::bulk("standalone"),
            Frame::bulk("role"),
            Frame::bulk("master"),
            Frame::bulk("engine"),
            engine.clone(),
            Frame::bulk("modules"),
            Frame::Array(vec![]),
        ]
    );
    assert_eq!(bulk(engine), "memory", "the default engine");
}

#[tokio::test]
async fn client_list_shows_how_long_each_connection_has_been_idle() {
    let s = Idemd::start().await;
    let mut quiet = s.conn().await;
    let quiet_id = int(&quiet.cmd(&["CLIENT", "ID"]).await);
    let mut busy = s.conn().await;
    let busy_id = int(&busy.cmd(&["CLIENT", "ID"]).await);
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let list = bulk(&busy.cmd(&["CLIENT", "LIST"]).await);
    let field = |id: i64, name: &str| -> String {
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("id={id} ")))
            .unwrap_or_else(|| panic!("no line for {id} in {list}"));
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_owned()
    };
    let seconds = |id: i64, name: &str| -> u64 { field(id, name).parse().unwrap() };
    assert_eq!(seconds(busy_id, "idle"), 0, "{list}");
    assert_eq!(field(busy_id, "cmd"), "client", "{list}");
    // At least the sleep (a loaded machine may add to it), never more
    // than the connection's age.
    let (idle, age) = (seconds(quiet_id, "idle"), seconds(quiet_id, "age"));
    assert!(idle >= 1 && idle <= age, "{list}");
}

#[tokio::test]
async fn client_info_dbsize_command_config() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let id = int(&c.cmd(&["CLIENT", "ID"]).await);
    assert!(id > 0);
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]).await, Frame::Null);
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "svc-a"]).await, ok());
    assert!(err(&c.cmd(&["CLIENT", "SETNAME", "has space"]).await).starts_with("ERR"));
    let list = bulk(&c.cmd(&["CLIENT", "LIST"]).await);
    assert!(
        list.contains(&format!("id={id} ")) && list.contains("name=svc-a"),
        "{list}"
    );
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), 0);
    // ROLE, as a Redis primary without replicas answers it (the memory
    // engine has no log: offset 0).
    assert_eq!(
        c.cmd(&["ROLE"]).await,
        Frame::Array(vec![
            Frame::Bulk("master".into()),
            Frame::Integer(0),
            Frame::Array(vec![])
        ])
    );
    assert!(err(&c.cmd(&["ROLE", "x"]).await).starts_with("ERR wrong number of arguments"));
    c.acquire(&["CLAIM", &key("db")]).await;
    assert_eq!(int(&c.cmd(&["DBSIZE"]).await), 1);
    let info = bulk(&c.cmd(&["INFO"]).await);
    for section in ["# Server", "# Clients", "# Memory", "# Stats", "# Keyspace"] {
        assert!(info.contains(section), "{section} missing");
    }
    let stats = bulk(&c.cmd(&["INFO", "stats"]).await);
    assert!(
        stats.contains("claims_acquired:1") && !stats.contains("# Server"),
        "{stats}"
    );
    // The runtime's workers: 0 (the default) is one per CPU, one on a
    // machine of two CPUs or fewer; a number set is kept.
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = if cpus <= 2 { 1 } else { cpus };
    assert!(
        info.contains(&format!("\r\nworker_threads:{workers}\r\n")),
        "{info}"
    );
    let three = Idemd::start_with(&[("IDEM_WORKER_THREADS", "3")], &[]).await;
    let info = bulk(&three.conn().await.cmd(&["INFO", "server"]).await);
    assert!(info.contains("\r\nworker_threads:3\r\n"), "{info}");
    // Every command the protocol defines, written out here rather than read
    // from the table the server uses, so a command missing from it fails.
    let expected = [
        "claim",
        "settle",
        "complete",
        "renew",
        "journal",
        "release",
        "abandon",
        "inspect",
        "forget",
        "ping",
        "echo",
        "hello",
        "auth",
        "quit",
        "info",
        "dbsize",
        "client",
        "command",
        "config",
        "cluster",
        "select",
        "acl",
        "readonly",
        "readwrite",
        "latency",
        "scan",
        "role",
    ];
    assert_eq!(
        int(&c.cmd(&["COMMAND", "COUNT"]).await),
        expected.len() as i64
    );
    let Frame::Array(all) = c.cmd(&["COMMAND"]).await else {
        panic!("COMMAND is an array")
    };
    let mut listed: Vec<String> = all
        .iter()
        .map(|e| match e {
            Frame::Array(f) => match &f[0] {
                Frame::Bulk(n) => String::from_utf8_lossy(n).into_owned(),
                other => panic!("name {other:?}"),
            },
            other => panic!("entry {other:?}"),
        })
        .collect();
    listed.sort();
    let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(listed, want);
    let Frame::Array(claim) = c.cmd(&["COMMAND", "INFO", "CLAIM"]).await else {
        panic!("array")
    };
    let Frame::Array(entry) = &claim[0] else {
        panic!("entry")
    };
    assert_eq!(entry[1], Frame::Integer(-2));
    assert_eq!(
        entry[2],
        Frame::Array(vec![Frame::simple("write"), Frame::simple("blocking")])
    );
    assert_eq!(
        &entry[3..],
        &[Frame::Integer(1), Frame::Integer(1), Frame::Integer(1)]
    );
    let Frame::Array(one) = c.cmd(&["COMMAND", "INFO", "claim", "nope"]).await else {
        panic!("array")
    };
    assert_eq!(one[1], Frame::Null);
    let Frame::Array(cfg) = c.cmd(&["CONFIG", "GET", "max_*_ms"]).await else {
        panic!("array")
    };
    assert_eq!(cfg.len(), 6, "{cfg:?}");
    assert!(cfg.contains(&Frame::bulk("max_wait_ms")) && cfg.contains(&Frame::bulk("300000")));
    let Frame::Array(none) = c.cmd(&["CONFIG", "GET", "save"]).await else {
        panic!("array")
    };
    assert!(none.is_empty());
    assert!(err(&c.cmd(&["AUTH", "pw"]).await).starts_with("ERR"));
}

#[tokio::test]
async fn max_connections_refuses_extra_clients_with_an_error() {
    let s = Idemd::start_with(&[("IDEM_MAX_CONNECTIONS", "2")], &[]).await;
    let mut a = s.conn().await;
    let mut b = s.conn().await;
    assert_eq!(a.cmd(&["PING"]).await, Frame::simple("PONG"));
    assert_eq!(b.cmd(&["PING"]).await, Frame::simple("PONG"));
    let mut c = s.conn().await;
    assert_eq!(err(&c.reply().await), "ERR max number of clients reached");
    assert!(c.closed().await);
    drop(a);
    // The slot is freed once the server notices the close.
    eventually("a freed connection slot", async || {
        let mut d = s.conn().await;
        d.write(&["PING"]).await;
        (d.read().await == Some(Frame::simple("PONG"))).then_some(())
    })
    .await;
    assert_eq!(b.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn idle_timeout_closes_quiet_connections_but_not_parked_ones() {
    let s = Idemd::start_with(&[("IDEM_IDLE_TIMEOUT_MS", "200")], &[]).await;
    let mut quiet = s.conn().await;
    let mut owner = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("idle");
    let fence = owner.acquire(&["CLAIM", &k, "LEASE", "5000"]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "600"]).await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(
        std::time::Duration::from_secs(3),
        quiet.stream.read(&mut buf),
    )
    .await;
    assert!(
        matches!(n, Ok(Ok(0))),
        "quiet connection was not closed: {n:?}"
    );
    // The waiter was parked past the idle timeout and still gets its answer.
    assert!(matches!(
        claim(waiter.reply().await),
        idem_protocol::ClaimReply::InFlight { .. }
    ));
    // Answering it counts as activity: the connection is not closed at once
    // for the time it spent parked.
    assert_eq!(
        waiter.cmd(&["PING"]).await,
        Frame::Simple(bytes::Bytes::from_static(b"PONG"))
    );
    let _ = fence;
}

/// The `name:a=1,b=2` line of an INFO text, as a map.
fn info_line(info: &str, name: &str) -> std::collections::HashMap<String, String> {
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in\n{info}"));
    line.trim()
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn info_counts_calls_errors_and_latency_by_command() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let mut waiter = s.conn().await;
    let k = key("cmdstats");
    let f = c.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
    waiter.write(&["CLAIM", &k, "WAIT", "10000"]).await;
    wait_for_info(&mut c, "blocked_clients", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // A failed call (the fence does not own the key), then the owner's.
    assert!(err(&c.cmd(&["COMPLETE", &k, &(f + 1).to_string(), "r"]).await).starts_with("FENCED"));
    assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "r"]).await, ok());
    assert!(matches!(
        claim(waiter.reply().await),
        idem_protocol::ClaimReply::Completed { .. }
    ));
    // Refused before running (no key), and not a command at all.
    assert!(err(&c.cmd(&["CLAIM"]).await).starts_with("ERR wrong number"));
    assert!(err(&c.cmd(&["NOSUCH", "x"]).await).starts_with("ERR unknown command"));

    let stats = bulk(&c.cmd(&["INFO", "commandstats"]).await);
    assert!(stats.starts_with("# Commandstats\r\n"), "{stats}");
    let claims = info_line(&stats, "cmdstat_claim");
    assert_eq!(claims["calls"], "2", "{stats}");
    assert_eq!(claims["rejected_calls"], "1", "{stats}");
    assert_eq!(claims["failed_calls"], "0", "{stats}");
    // The waiter's claim took the 300 ms it was parked.
    assert!(claims["usec"].parse::<u64>().unwrap() >= 300_000, "{stats}");
    let completes = info_line(&stats, "cmdstat_complete");
    assert_eq!(completes["calls"], "2", "{stats}");
    assert_eq!(completes["failed_calls"], "1", "{stats}");
    assert_eq!(completes["rejected_calls"], "0", "{stats}");
    assert!(!stats.contains("nosuch"), "{stats}");

    let errors = bulk(&c.cmd(&["INFO", "errorstats"]).await);
    assert_eq!(
        errors,
        "# Errorstats\r\nerrorstat_ERR:count=2\r\nerrorstat_FENCED:count=1\r\n"
    );
    assert_eq!(info_field(&mut c, "total_error_replies").await, 3);

    // Of the two claims, the slower one waited 300 ms: p50 is the first
    // one's time, p99 the waiter's (within the histogram's 1/16).
    let latency = bulk(&c.cmd(&["INFO", "latencystats"]).await);
    let claims = info_line(&latency, "latency_percentiles_usec_claim");
    let p = |q: &str| claims[q].parse::<f64>().unwrap();
    assert!(p("p50") < 300_000.0, "{latency}");
    assert!(p("p99") >= 300_000.0 * 15.0 / 16.0, "{latency}");
    assert!(p("p99.9") >= p("p99"), "{latency}");
    // The same calls as a distribution: cumulative counts at powers of two
    // of µs, the last one all of them, past the waiter's 300 ms.
    let Frame::Array(h) = c.cmd(&["LATENCY", "HISTOGRAM", "claim", "nosuch"]).await else {
        panic!("LATENCY HISTOGRAM is a map")
    };
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h[0], Frame::bulk("claim"));
    let Frame::Array(fields) = &h[1] else {
        panic!("{h:?}")
    };
    assert_eq!(fields[..2], [Frame::bulk("calls"), Frame::Integer(2)]);
    let Frame::Array(points) = &fields[3] else {
        panic!("{fields:?}")
    };
    let points: Vec<i64> = points.iter().map(int).collect();
    assert_eq!(points.last(), Some(&2), "{points:?}");
    assert!(points[points.len() - 2] >= 262_144, "{points:?}");
    // No latency monitor, as Redis by default: no events.
    assert_eq!(c.cmd(&["LATENCY", "LATEST"]).await, Frame::Array(vec![]));
    assert_eq!(c.cmd(&["LATENCY", "RESET"]).await, Frame::Integer(0));

    // As with Redis, a plain INFO leaves the long sections out.
    let info = bulk(&c.cmd(&["INFO"]).await);
    assert!(info.contains("# Errorstats\r\n"), "{info}");
    assert!(!info.contains("# Commandstats") && !info.contains("# Latencystats"));
    let every = bulk(&c.cmd(&["INFO", "everything"]).await);
    for section in [
        "# Commandstats",
        "# Errorstats",
        "# Latencystats",
        "# CPU",
        "# Keyspace",
    ] {
        assert!(every.contains(section), "{section} missing from {every}");
    }

    // The process's CPU time and resident memory, as /proc has them.
    let pid = s.child.id().expect("running");
    let ticks = || -> (f64, f64) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<f64> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        let hz = rustix::param::clock_ticks_per_second() as f64;
        (f[11] / hz, f[12] / hz)
    };
    let before = ticks();
    let cpu = bulk(&c.cmd(&["INFO", "cpu"]).await);
    let after = ticks();
    assert!(cpu.starts_with("# CPU\r\n"), "{cpu}");
    let seconds = |name: &str| -> f64 {
        cpu.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in {cpu}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (user, sys) = (seconds("used_cpu_user"), seconds("used_cpu_sys"));
    assert!(
        before.0 <= user && user <= after.0,
        "{before:?} {after:?} {cpu}"
    );
    assert!(
        before.1 <= sys && sys <= after.1,
        "{before:?} {after:?} {cpu}"
    );
    let rss = info_field(&mut c, "used_memory_rss").await;
    let real = s.rss();
    assert!(
        rss > real / 2 && rss < real * 2,
        "used_memory_rss {rss}, VmRSS {real}"
    );

    assert_eq!(c.cmd(&["CONFIG", "RESETSTAT"]).await, ok());
    let stats = bulk(&c.cmd(&["INFO", "commandstats", "errorstats"]).await);
    assert!(!stats.contains("cmdstat_claim"), "{stats}");
    assert!(!stats.contains("errorstat_"), "{stats}");
    assert_eq!(info_field(&mut c, "total_error_replies").await, 0);
}

#[tokio::test]
async fn scan_walks_the_keys_with_match_and_count() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let (a, b) = (key("scan-a"), key("scan-b"));
    for i in 0..50 {
        c.acquire(&["CLAIM", &format!("{a}:{i}")]).await;
    }
    for i in 0..20 {
        c.acquire(&["CLAIM", &format!("{b}:{i}")]).await;
    }
    let pattern = format!("{a}:*");
    let (mut cursor, mut keys, mut steps) = ("0".to_owned(), Vec::new(), 0);
    loop {
        let Frame::Array(step) = c
            .cmd(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "7"])
            .await
        else {
            panic!("SCAN answers an array")
        };
        cursor = bulk(&step[0]);
        let Frame::Array(got) = &step[1] else {
            panic!("{step:?}")
        };
        assert!(got.len() <= 7, "{got:?}");
        keys.extend(got.iter().map(bulk));
        steps += 1;
        if cursor == "0" {
            break;
        }
    }
    assert!(
        steps >= 10,
        "70 records looked at 7 a step took {steps} steps"
    );
    keys.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("{a}:{i}")).collect();
    want.sort();
    assert_eq!(keys, want);
    assert!(err(&c.cmd(&["SCAN", "0", "COUNT", "0"]).await).starts_with("ERR"));
    assert!(err(&c.cmd(&["SCAN", "x"]).await).starts_with("ERR"));
    let long = "*".repeat(2000);
    assert!(err(&c.cmd(&["SCAN", "0", "MATCH", &long]).await).starts_with("TOOBIG"));
    // redis-cli's own walk.
    if let Some(cli) = crate::t07_redis_tools::tool("redis-cli") {
        let out = std::process::Command::new(cli)
            .args(["-p", &s.addr.port().to_string(), "--scan", "--pattern"])
            .arg(format!("{b}:*"))
            .output()
            .unwrap();
        let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        listed.sort();
        let mut want: Vec<String> = (0..20).map(|i| format!("{b}:{i}")).collect();
        want.sort();
        assert_eq!(listed, want);
    }
}

#[tokio::test]
async fn info_counts_duplicates_as_hits_and_every_byte_in_and_out() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    let (k, other) = (key("hits"), key("hits-other"));
    let f = c.acquire(&["CLAIM", &k]).await; // a miss: the key is taken
    assert!(matches!(
        claim(c.cmd(&["CLAIM", &k]).await), // a hit: in flight
        idem_protocol::ClaimReply::InFlight { .. }
    ));
    assert_eq!(c.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
    assert!(matches!(
        claim(c.cmd(&["CLAIM", &k]).await), // a hit: replayed
        idem_protocol::ClaimReply::Completed { .. }
    ));
    c.acquire(&["CLAIM", &other]).await; // a miss
    assert_eq!(info_field(&mut c, "keyspace_hits").await, 2);
    assert_eq!(info_field(&mut c, "keyspace_misses").await, 2);

    // Bytes: between two INFOs on this one connection, the server read
    // a PING and the second INFO, and wrote a PONG and the first INFO.
    let first = bulk(&c.cmd(&["INFO", "stats"]).await);
    let field = |info: &str, name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(c.cmd(&["PING"]).await, Frame::simple("PONG"));
    let second = bulk(&c.cmd(&["INFO", "stats"]).await);
    let read = field(&second, "total_net_input_bytes") - field(&first, "total_net_input_bytes");
    assert_eq!(read, 14 + 25, "*1 PING and *2 INFO stats");
    let written =
        field(&second, "total_net_output_bytes") - field(&first, "total_net_output_bytes");
    let first_reply = format!("${}\r\n{first}\r\n", first.len()).len() as u64;
    assert_eq!(written, first_reply + 7, "the first INFO and +PONG");
}

#[tokio::test]
async fn client_kill_closes_the_connections_picked() {
    let s = Idemd::start().await;
    let mut admin = s.conn().await;
    let mut a = s.conn().await;
    let mut b = s.conn().await;
    let mut parked = s.conn().await;
    let a_id = int(&a.cmd(&["CLIENT", "ID"]).await);
    let kill = admin
        .cmd(&["CLIENT", "KILL", "ID", &a_id.to_string()])
        .await;
    assert_eq!(int(&kill), 1);
    assert!(a.closed().await, "killed by id");
    // The old form, by address.
    let line = bulk(&b.cmd(&["CLIENT", "INFO"]).await);
    let addr = line
        .split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .unwrap()
        .to_owned();
    assert_eq!(admin.cmd(&["CLIENT", "KILL", &addr]).await, ok());
    assert!(b.closed().await, "killed by address");
    let e = err(&admin.cmd(&["CLIENT", "KILL", &addr]).await);
    assert!(e.contains("No such client"), "{e}");
    assert_eq!(
        int(&admin.cmd(&["CLIENT", "KILL", "ID", "999999"]).await),
        0
    );
    // A parked request goes with its connection; the caller is skipped.
    let k = key("kill");
    admin.acquire(&["CLAIM", &k]).await;
    parked.write(&["CLAIM", &k, "WAIT", "10000"]).await;
    wait_for_info(&mut admin, "blocked_clients", 1).await;
    let kill = admin.cmd(&["CLIENT", "KILL", "USER", "default"]).await;
    assert_eq!(int(&kill), 1);
    assert!(parked.closed().await, "killed while parked");
    wait_for_info(&mut admin, "blocked_clients", 0).await;
    // SKIPME no: the caller too, after its answer; a request pipelined
    // behind the kill does not run.
    let after = key("kill-after");
    let mut pipeline = b"CLIENT KILL USER default SKIPME no\r\n".to_vec();
    pipeline.extend_from_slice(format!("CLAIM {after}\r\n").as_bytes());
    admin.write_raw(&pipeline).await;
    assert_eq!(int(&admin.reply().await), 1);
    assert!(admin.closed().await, "killed itself");
    let mut other = s.conn().await;
    assert_eq!(info_field(&mut other, "connected_clients").await, 1);
    assert_eq!(other.cmd(&["INSPECT", &after]).await, Frame::Null);
}
