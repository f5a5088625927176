//! Authentication (`requirepass`, AUTH, HELLO ... AUTH) and protected
//! mode, over real sockets, with redis-cli and redis-py too.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use idem_protocol::Frame;
use sha2::{Digest, Sha256};

use crate::support::*;

const PASS: &str = "correct horse battery staple";

fn error_text(f: &Frame) -> String {
    match f {
        Frame::Error(e) => String::from_utf8_lossy(e).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn every_command_waits_for_auth_when_a_password_is_set() {
    let s = Idemd::start_with(&[], &["--requirepass", PASS]).await;
    let mut c = s.conn().await;
    for cmd in [
        &["PING"][..],
        &["CLAIM", "k"],
        &["INSPECT", "k"],
        &["FORGET", "k"],
        &["CONFIG", "GET", "*"],
        &["CLIENT", "LIST"],
    ] {
        assert_eq!(
            error_text(&c.cmd(cmd).await),
            "NOAUTH Authentication required.",
            "{cmd:?}"
        );
    }
    let hello = error_text(&c.cmd(&["HELLO", "3"]).await);
    assert!(
        hello.starts_with("NOAUTH HELLO must be called with the client already authenticated"),
        "{hello}"
    );
    let wrong = "WRONGPASS invalid username-password pair or user is disabled.";
    assert_eq!(error_text(&c.cmd(&["AUTH", "guess"]).await), wrong);
    assert_eq!(error_text(&c.cmd(&["AUTH", "admin", PASS]).await), wrong);
    assert_eq!(
        error_text(&c.cmd(&["PING"]).await),
        "NOAUTH Authentication required."
    );
    assert_eq!(c.cmd(&["AUTH", PASS]).await, ok());
    assert!(matches!(
        claim(c.cmd(&["CLAIM", "k"]).await),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
    assert_eq!(bulk(&c.cmd(&["PING", "hi"]).await), "hi");
    // The password is never shown.
    let cfg = c.cmd(&["CONFIG", "GET", "requirepass"]).await;
    assert_eq!(
        cfg,
        Frame::Array(vec![
            Frame::Bulk("requirepass".into()),
            Frame::Bulk("(set)".into())
        ])
    );
    assert_eq!(info_field(&mut c, "auth_failures").await, 2);

    // AUTH default <password>, and HELLO 3 AUTH default <password>.
    let mut d = s.conn().await;
    assert_eq!(d.cmd(&["AUTH", "default", PASS]).await, ok());
    let mut h = s.conn().await;
    let hello = h
        .cmd(&["HELLO", "3", "AUTH", "default", PASS, "SETNAME", "svc"])
        .await;
    assert!(matches!(hello, Frame::Map(_)), "{hello:?}");
    assert!(matches!(
        claim(h.cmd(&["CLAIM", "k"]).await),
        idem_protocol::ClaimReply::InFlight { .. }
    ));
    // A failed HELLO AUTH leaves the connection unauthenticated.
    let mut f = s.conn().await;
    assert_eq!(
        error_text(&f.cmd(&["HELLO", "3", "AUTH", "default", "nope"]).await),
        wrong
    );
    assert_eq!(
        error_text(&f.cmd(&["PING"]).await),
        "NOAUTH Authentication required."
    );
    // QUIT is allowed before AUTH.
    let mut q = s.conn().await;
    assert_eq!(q.cmd(&["QUIT"]).await, ok());
    assert!(q.closed().await);
}

#[tokio::test]
async fn without_a_password_auth_says_none_is_set() {
    let s = Idemd::start().await;
    let mut c = s.conn().await;
    assert!(error_text(&c.cmd(&["AUTH", "x"]).await).contains("without any password configured"));
    assert_eq!(bulk(&c.cmd(&["PING", "still"]).await), "still");
    // As in Redis, the default user then takes any password.
    assert_eq!(c.cmd(&["AUTH", "default", "x"]).await, ok());
    assert!(matches!(
        c.cmd(&["HELLO", "3", "AUTH", "default", "x"]).await,
        Frame::Map(_)
    ));
    assert!(error_text(&c.cmd(&["AUTH", "someone", "x"]).await).starts_with("WRONGPASS"));
}

#[tokio::test]
async fn refused_hellos_and_pipelined_guesses_change_nothing() {
    let s = Idemd::start_with(&[], &["--requirepass", PASS]).await;
    let mut c = s.conn().await;
    // A bad version is refused before the password is looked at.
    assert!(
        error_text(&c.cmd(&["HELLO", "4", "AUTH", "default", PASS]).await).starts_with("NOPROTO")
    );
    assert_eq!(
        error_text(&c.cmd(&["PING"]).await),
        "NOAUTH Authentication required."
    );
    // A failed HELLO AUTH neither switches the protocol nor names the
    // connection.
    assert!(
        error_text(
            &c.cmd(&["HELLO", "3", "AUTH", "default", "no", "SETNAME", "x"])
                .await
        )
        .starts_with("WRONGPASS")
    );
    // A wrong AUTH pipelined with a command: the command is refused too.
    c.write_raw(b"*2\r\n$4\r\nAUTH\r\n$5\r\nguess\r\n*2\r\n$5\r\nCLAIM\r\n$1\r\nk\r\nPING\r\n")
        .await;
    assert!(error_text(&c.reply().await).starts_with("WRONGPASS"));
    assert_eq!(
        error_text(&c.reply().await),
        "NOAUTH Authentication required."
    );
    assert_eq!(
        error_text(&c.reply().await),
        "NOAUTH Authentication required."
    );
    assert_eq!(c.cmd(&["AUTH", PASS]).await, ok());
    let info = bulk(&c.cmd(&["CLIENT", "INFO"]).await);
    assert!(
        info.contains(" resp=2") && info.contains(" name= "),
        "{info}"
    );
}

/// Past `max_auth_failures_per_sec` wrong passwords in a second, every AUTH
/// on the server was refused unchecked: 150 connections guessing kept a
/// client with the right password out for as long as they went on. The
/// limit now holds per source address (and, once reached in all, for
/// sources that guessed wrong this second): a source that gives no wrong
/// password is always checked.
#[tokio::test]
async fn guessers_cannot_lock_out_the_clients_of_other_addresses() {
    let s = Idemd::start_with(
        &[("IDEM_MAX_AUTH_FAILURES_PER_SEC", "5")],
        &["--requirepass", PASS],
    )
    .await;
    let until = std::time::Instant::now() + std::time::Duration::from_millis(2500);
    let mut guessers = Vec::new();
    for i in 0..30 {
        let addr = s.addr;
        guessers.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            let mut held_back = 0;
            while std::time::Instant::now() < until {
                let e = error_text(&c.cmd(&["AUTH", &format!("guess-{i}")]).await);
                if e.starts_with("TRYAGAIN") {
                    held_back += 1;
                }
            }
            held_back
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let other: std::net::IpAddr = [127, 0, 0, 2].into();
    let mut logins = 0;
    while std::time::Instant::now() < until {
        let mut c = Conn::connect_from(other, s.addr).await;
        assert_eq!(c.cmd(&["AUTH", PASS]).await, ok(), "login {logins}");
        logins += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(logins >= 10, "{logins}");
    // The guessers themselves were held back.
    let mut held_back = 0;
    for g in guessers {
        held_back += g.await.unwrap();
    }
    assert!(held_back > 0, "no guess was held back");
}

#[tokio::test]
async fn guessing_is_limited_server_wide() {
    let s = Idemd::start_with(
        &[("IDEM_MAX_AUTH_FAILURES_PER_SEC", "2")],
        &["--requirepass", PASS],
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            error_text(&c.cmd(&["AUTH", &format!("guess-{i}")]).await)
        }));
    }
    let mut wrong = 0;
    let mut later = 0;
    for t in tasks {
        let e = t.await.unwrap();
        if e.starts_with("WRONGPASS") {
            wrong += 1;
        } else {
            assert!(e.starts_with("TRYAGAIN"), "{e}");
            later += 1;
        }
    }
    // Two per second were checked (the ten may straddle one second).
    assert!(
        (2..=4).contains(&wrong),
        "{wrong} checked, {later} held back"
    );
    // Once the second is over, the right password works.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["AUTH", PASS]).await, ok());
}

#[tokio::test]
async fn a_password_may_be_given_as_its_sha256() {
    let hash: String = Sha256::digest(PASS.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let s = Idemd::start_with(&[("IDEM_REQUIREPASS", &format!("#{hash}"))], &[]).await;
    let mut c = s.conn().await;
    assert_eq!(
        error_text(&c.cmd(&["AUTH", &format!("#{hash}")]).await)
            .split(' ')
            .next(),
        Some("WRONGPASS")
    );
    assert_eq!(c.cmd(&["AUTH", PASS]).await, ok());
    // A malformed hash stops the start with a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args([
            "--engine",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--requirepass",
            "#abc",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("requirepass") && err.contains("64 hex digits"),
        "{err}"
    );
}

#[tokio::test]
async fn redis_cli_and_redis_py_authenticate_unchanged() {
    let s = Idemd::start_with(&[], &["--requirepass", PASS]).await;
    if crate::t07_redis_tools::tool("redis-cli").is_some() {
        // stdout, then stderr, of redis-cli with `args` against the server.
        let cli = |args: &[&str]| {
            let (h, p) = (s.addr.ip().to_string(), s.addr.port().to_string());
            redis_cli(&[&["-h", &h, "-p", &p, "--no-auth-warning"][..], args].concat())
        };
        let out = cli(&["-a", PASS, "CLAIM", "cli-key"]);
        assert_eq!(out.lines().next(), Some("ACQUIRED"), "{out}");
        let out = cli(&[
            "--user", "default", "--pass", PASS, "-3", "INSPECT", "cli-key",
        ]);
        assert!(out.contains("in_flight"), "{out}");
        let text = cli(&["-a", "wrong", "PING"]);
        assert!(
            text.contains("WRONGPASS") || text.contains("NOAUTH"),
            "{text}"
        );
    }
    if let Some(py) = crate::t13_cluster::python_with_redis() {
        let script = format!(
            "import redis\n\
             r = redis.Redis(host='{ip}', port={port}, password={pw:?})\n\
             print(r.execute_command('CLAIM', 'py-key'))\n\
             r3 = redis.Redis(host='{ip}', port={port}, username='default', password={pw:?})\n\
             print(r3.execute_command('CLAIM', 'py-key'))\n\
             try:\n    redis.Redis(host='{ip}', port={port}, password='wrong').ping()\n    print('no error')\n\
             except redis.exceptions.AuthenticationError:\n    print('refused')\n\
             except redis.exceptions.ResponseError as e:\n    print('refused' if 'WRONGPASS' in str(e) else str(e))\n",
            ip = s.addr.ip(),
            port = s.addr.port(),
            pw = PASS,
        );
        let out = Command::new(py).args(["-c", &script]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(lines[0].contains("ACQUIRED"), "{stdout}");
        assert!(lines[1].contains("INFLIGHT"), "{stdout}");
        assert_eq!(lines[2], "refused", "{stdout}");
    }
}

/// An address of this host that is not loopback (the one it would use to
/// reach another host; no packet is sent).
pub(crate) fn outside_address() -> IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("192.0.2.200:9").unwrap();
    let ip = s.local_addr().unwrap().ip();
    assert!(
        !ip.is_loopback() && !ip.is_unspecified(),
        "this host needs a non-loopback address: {ip}"
    );
    ip
}

#[tokio::test]
async fn protected_mode_refuses_other_hosts_until_a_password_is_set() {
    let outside = outside_address();
    let start = |args: &'static [&'static str]| async move {
        let s = Idemd::start_with(&[], &[&["--listen", "0.0.0.0:0"][..], args].concat()).await;
        (
            SocketAddr::new("127.0.0.1".parse().unwrap(), s.addr.port()),
            SocketAddr::new(outside, s.addr.port()),
            s,
        )
    };
    // No password: loopback is served, another host is denied and dropped.
    let (local, remote, s) = start(&[]).await;
    let mut l = Conn::connect(local).await;
    assert_eq!(l.cmd(&["PING"]).await, Frame::simple("PONG"));
    let mut r = Conn::connect(remote).await;
    let denied = error_text(&r.read().await.expect("a reply"));
    assert!(
        denied.starts_with("DENIED Idem is running in protected mode"),
        "{denied}"
    );
    assert!(
        denied.contains("requirepass") && denied.contains("protected_mode"),
        "{denied}"
    );
    assert!(r.closed().await);
    assert_eq!(info_field(&mut l, "protected_mode_refusals").await, 1);
    drop(s);
    // With a password, other hosts are served (and must AUTH).
    let (_, remote, _s) = start(&["--requirepass", PASS]).await;
    let mut r = Conn::connect(remote).await;
    assert_eq!(
        error_text(&r.cmd(&["PING"]).await),
        "NOAUTH Authentication required."
    );
    assert_eq!(r.cmd(&["AUTH", PASS]).await, ok());
    // Protected mode off: served without a password.
    let (_, remote, _s) = start(&["--protected-mode", "no"]).await;
    let mut r = Conn::connect(remote).await;
    assert_eq!(r.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn idem_client_authenticates_and_again_after_reconnecting() {
    use idem_client::{ClaimOutcome, Client, ClientConfig, ErrorKind};
    let mut s = Idemd::start_with(&[], &["--requirepass", PASS]).await;
    let url = format!("idem://:{}@{}", PASS.replace(' ', "%20"), s.addr);
    let c = Client::connect(url).await.unwrap();
    // Held (a dropped claim guard abandons its key).
    let first = c.claim("client-key").await.unwrap();
    assert!(matches!(first, ClaimOutcome::Acquired(_)));
    let d = Client::connect_with_config(
        s.addr.to_string(),
        ClientConfig::default().user_password("default", PASS),
    )
    .await
    .unwrap();
    assert!(matches!(
        d.claim("client-key").await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    drop(first);
    // Wrong or missing password: an Auth error at once, not retried.
    let wrong =
        Client::connect_with_config(s.addr.to_string(), ClientConfig::default().password("nope"))
            .await
            .unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::Auth, "{wrong}");
    assert!(!wrong.is_retryable());
    let missing = Client::connect(s.addr.to_string()).await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::Auth, "{missing}");
    assert!(
        missing.to_string().contains("requires a password"),
        "{missing}"
    );
    // The server restarts on the same port: the client reconnects and
    // authenticates again.
    let addr = s.addr.to_string();
    s.kill().await;
    let _s2 = Idemd::start_with(&[], &["--requirepass", PASS, "--listen", &addr]).await;
    let mut replies = None;
    for _ in 0..50 {
        match c.claim("after-restart").await {
            Ok(r) => {
                replies = Some(r);
                break;
            }
            Err(e) => {
                assert_ne!(e.kind(), ErrorKind::Auth, "{e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        matches!(replies, Some(ClaimOutcome::Acquired(_))),
        "{replies:?}"
    );
}

/// A connection that had not logged in could send frames as large as an
/// authenticated one's (2 MB), and hold a partial one for good: 10,000
/// such connections pinned 20 GB before any password was checked. Before
/// AUTH, frames are now at most `max_unauthenticated_frame_bytes` (as
/// Redis limits unauthenticated requests); after it, the usual limits.
#[tokio::test]
async fn frames_before_auth_are_small() {
    let s = Idemd::start_with(&[], &["--requirepass", PASS]).await;
    let mut c = s.conn().await;
    // The header of a 100 kB bulk string is refused before its payload.
    c.write_raw(b"*3\r\n$4\r\nAUTH\r\n$7\r\nsomeone\r\n$100000\r\n")
        .await;
    let reply = error_text(&c.reply().await);
    // The reply names the setting behind the limit.
    assert!(
        reply.contains("over the limit of 16384")
            && reply.contains("max_unauthenticated_frame_bytes"),
        "{reply}"
    );
    assert!(c.closed().await, "the connection was kept");
    // A login fits, and after it a 100 kB value is fine.
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["AUTH", PASS]).await, ok());
    let f = c.acquire(&["CLAIM", "big"]).await;
    let value = "v".repeat(100_000);
    assert_eq!(
        c.cmd(&["COMPLETE", "big", &f.to_string(), &value]).await,
        ok()
    );
    // Without a password set, nothing changes before any AUTH.
    let open = Idemd::start().await;
    let mut c = open.conn().await;
    let f = c.acquire(&["CLAIM", "big"]).await;
    assert_eq!(
        c.cmd(&["COMPLETE", "big", &f.to_string(), &value]).await,
        ok()
    );
}
