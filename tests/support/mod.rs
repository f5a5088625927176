//! Shared helpers: start a real idemd process, talk to it over TCP.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

pub mod cluster;
pub mod history;
pub mod pki;

use bytes::{Bytes, BytesMut};
use idem_protocol::{ClaimReply, Frame, Limits, SettleReply, Version, decode, encode};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A running idemd, killed when dropped.
pub struct Idemd {
    pub child: Child,
    pub addr: SocketAddr,
    /// The latest lines it logged (stderr), at most [`LOG_LINES_KEPT`].
    pub logs: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// Log lines of a server kept for [`Idemd::logged`].
pub const LOG_LINES_KEPT: usize = 2000;

impl Idemd {
    /// idemd with defaults on a free loopback port (memory engine).
    pub async fn start() -> Idemd {
        Idemd::start_with(&[], &[]).await
    }

    /// idemd with extra environment variables and arguments.
    pub async fn start_with(env: &[(&str, &str)], args: &[&str]) -> Idemd {
        Idemd::start_wrapped(&[], env, args).await
    }

    /// idemd run by `wrapper` (a command that ends by running the rest of
    /// its arguments, e.g. `sh -c 'ulimit -n 256 && exec "$0" "$@"'`).
    pub async fn start_wrapped(wrapper: &[&str], env: &[(&str, &str)], args: &[&str]) -> Idemd {
        let bin = env!("CARGO_BIN_EXE_idemd");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        if !args.contains(&"--listen") {
            cmd.arg("--listen").arg("127.0.0.1:0");
        }
        // Tests of the protocol run on the memory engine, said explicitly;
        // the raft engine's tests pass --engine raft and a data dir of
        // their own.
        if !args.contains(&"--engine") {
            cmd.arg("--engine").arg("memory");
        }
        cmd.args(args);
        cmd.env("RUST_LOG", "warn,openraft=off");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("idemd starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("idemd announced its address in time")
            .expect("stdout readable")
            .expect("idemd printed a line");
        let addr = line
            .rsplit(' ')
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("bad line: {line}"));
        // Keep draining stdout so the child never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        // Its log goes on to the test's stderr, the latest lines kept.
        let logs = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let kept = logs.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                let mut kept = kept.lock().unwrap();
                if kept.len() == LOG_LINES_KEPT {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        Idemd { child, addr, logs }
    }

    /// idemd on the raft engine in `dir`, listening on `listen`: a fixed
    /// address, where a restart on the same directory is found again.
    pub async fn start_raft_at(dir: &DataDir, listen: &str) -> Idemd {
        let args = [
            "--engine",
            "raft",
            "--data-dir",
            dir.arg(),
            "--listen",
            listen,
        ];
        Idemd::start_with(&[], &args).await
    }

    /// The lines logged so far (of the latest [`LOG_LINES_KEPT`]) that
    /// contain `needle`, once at least one does or `within` has passed.
    pub async fn logged(&self, needle: &str, within: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let found: Vec<String> = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect();
            if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn conn(&self) -> Conn {
        Conn::connect(self.addr).await
    }

    /// The server's resident memory, in bytes (from /proc).
    pub fn rss(&self) -> u64 {
        self.proc_bytes("status", "VmRSS")
    }

    /// The server's peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        self.proc_bytes("status", "VmHWM")
    }

    /// The server's anonymous memory (heap and stacks, not the binary's
    /// code pages, which fault in as code paths first run), in bytes.
    pub fn anonymous(&self) -> u64 {
        self.proc_bytes("smaps_rollup", "Anonymous")
    }

    /// A `field: N kB` line of `/proc/PID/file`, in bytes.
    fn proc_bytes(&self, file: &str, field: &str) -> u64 {
        let pid = self.child.id().expect("running");
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/{file}: {e}"));
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/{file}"))
            * 1024
    }

    /// Sends SIGKILL and waits for the process to end.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill");
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("running");
        std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
    }
}

/// A raw RESP connection.
pub struct Conn {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).ok();
        Conn {
            stream,
            buf: BytesMut::new(),
        }
    }

    /// A connection from the local address `from` (any port): on
    /// loopback, another source address than 127.0.0.1.
    pub async fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> Conn {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::new(from, 0)).expect("bind");
        let stream = socket.connect(addr).await.expect("connect");
        stream.set_nodelay(true).ok();
        Conn {
            stream,
            buf: BytesMut::new(),
        }
    }

    /// A connection, or `None` if `addr` refuses it (within 1 s).
    pub async fn try_connect(addr: SocketAddr) -> Option<Conn> {
        let stream = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
        stream.set_nodelay(true).ok();
        Some(Conn {
            stream,
            buf: BytesMut::new(),
        })
    }

    /// Writes one command (arguments as bulk strings).
    pub async fn write<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        let mut out = BytesMut::new();
        encode(&cmd_frame(args), Version::Resp2, &mut out);
        self.stream.write_all(&out).await.expect("write");
    }

    /// Sends a command and reads its reply; `None` if the connection broke
    /// on the way (the server died): the outcome is unknown.
    pub async fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Option<Frame> {
        let mut out = BytesMut::new();
        encode(&cmd_frame(args), Version::Resp2, &mut out);
        self.stream.write_all(&out).await.ok()?;
        self.read().await
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Reads one reply; `None` when the server closed the connection.
    pub async fn read(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) =
                decode(&mut self.buf, &Limits::for_replies()).expect("server sends valid RESP")
            {
                return Some(f);
            }
            match tokio::time::timeout(Duration::from_secs(30), self.stream.read_buf(&mut self.buf))
                .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(_)) => {}
                Err(_) => panic!("no reply within 30 s"),
            }
        }
    }

    /// Reads one reply, which must come.
    pub async fn reply(&mut self) -> Frame {
        self.read()
            .await
            .expect("a reply before the connection closed")
    }

    /// Sends a command and reads its reply.
    pub async fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Frame {
        self.write(args).await;
        self.reply().await
    }

    /// Sends a command whose reply must be ACQUIRED; returns the fence.
    pub async fn acquire(&mut self, args: &[&str]) -> u64 {
        match claim(self.cmd(args).await) {
            ClaimReply::Acquired { fence } => fence,
            other => panic!("expected ACQUIRED for {args:?}, got {other:?}"),
        }
    }

    /// Whether the server closed the connection (EOF within 5 s).
    pub async fn closed(&mut self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.read()).await,
            Ok(None)
        )
    }
}

pub fn cmd_frame<A: AsRef<[u8]>>(args: &[A]) -> Frame {
    Frame::Array(
        args.iter()
            .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_ref())))
            .collect(),
    )
}

pub fn claim(f: Frame) -> ClaimReply {
    ClaimReply::from_frame(f).unwrap_or_else(|e| panic!("not a CLAIM reply: {e:?}"))
}

pub fn settle(f: Frame) -> SettleReply {
    SettleReply::from_frame(f).unwrap_or_else(|e| panic!("not a SETTLE reply: {e:?}"))
}

pub fn ok() -> Frame {
    Frame::simple("OK")
}

/// The error text of an error frame.
pub fn err(f: &Frame) -> String {
    match f {
        Frame::Error(e) => String::from_utf8_lossy(e).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    }
}

pub fn int(f: &Frame) -> i64 {
    match f {
        Frame::Integer(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

pub fn bulk(f: &Frame) -> String {
    match f {
        Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("expected a bulk string, got {other:?}"),
    }
}

/// A key no other test (or earlier run) uses.
pub fn key(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The soft limit on open files of this process.
pub fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

/// How long [`eventually`] and [`wait_for_info`] poll before giving up:
/// generous, since reaching the condition only takes milliseconds on a
/// healthy server and a loaded CI machine may be slow.
pub const POLL_DEADLINE: Duration = Duration::from_secs(10);

/// Polls `check` every few milliseconds until it returns `Some`, and returns
/// that; panics naming `what` if that does not happen within
/// [`POLL_DEADLINE`]. Used instead of fixed sleeps to order events.
pub async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(POLL_DEADLINE, what, check).await
}

/// [`eventually`] with a deadline of its own: for a step that waits on a
/// cluster's membership changing, which takes several rounds among
/// several processes.
pub async fn eventually_within<T>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls INFO on `conn` until `field` reads `want`.
pub async fn wait_for_info(conn: &mut Conn, field: &str, want: u64) {
    let mut last = None;
    let found = tokio::time::timeout(POLL_DEADLINE, async {
        loop {
            let v = info_field(conn, field).await;
            if v == want {
                return;
            }
            last = Some(v);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "INFO {field} did not reach {want} within {POLL_DEADLINE:?} (last {last:?})"
    );
}

/// Sleeps until `span` has surely passed on the server's clock since it
/// handled a request whose reply had arrived by `answered_at` (the server's
/// millisecond rounding included): for letting a lease or retention that
/// the request started run out, and no longer.
pub async fn outlast(answered_at: std::time::Instant, span: Duration) {
    tokio::time::sleep_until((answered_at + span + Duration::from_millis(5)).into()).await;
}

/// An INFO field as a number.
pub async fn info_field(conn: &mut Conn, field: &str) -> u64 {
    let text = bulk(&conn.cmd(&["INFO"]).await);
    text.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().parse().expect("numeric field"))
        })
        .unwrap_or_else(|| panic!("INFO has no {field}"))
}

/// A temporary data directory, removed when dropped.
pub struct DataDir(pub std::path::PathBuf);

impl DataDir {
    /// A fresh directory (nothing in it yet) named after `name`.
    pub fn new(name: &str) -> DataDir {
        let p = std::env::temp_dir().join(format!("idem-it-{}", key(name)));
        let _ = std::fs::remove_dir_all(&p);
        DataDir(p)
    }

    /// The path, as an argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts idemd (memory engine, port 0) with `args`, which must make it
/// refuse to start; its stderr (the error it gave).
pub fn refused_start(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(["--engine", "memory", "--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .expect("idemd runs");
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// redis-cli with `args`: its stdout, then its stderr.
pub fn redis_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Claims `n` fresh keys `prefix-i` through `conn` (attempt `fill`,
/// 60 s leases), pipelined a thousand at a time.
pub async fn fill(conn: &mut Conn, prefix: &str, n: usize) {
    let batch = 1000;
    for start in (0..n).step_by(batch) {
        let end = (start + batch).min(n);
        let mut out = bytes::BytesMut::new();
        for i in start..end {
            let k = format!("{prefix}-{i}");
            idem_protocol::encode(
                &cmd_frame(&["CLAIM", &k, "LEASE", "60000", "ATTEMPT", "fill"]),
                idem_protocol::Version::Resp2,
                &mut out,
            );
        }
        conn.write_raw(&out).await;
        for _ in start..end {
            assert!(matches!(
                claim(conn.reply().await),
                ClaimReply::Acquired { .. }
            ));
        }
    }
}
