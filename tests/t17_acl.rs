//! ACL users over real sockets: tenants confined to their key patterns,
//! categories, `@blocking` per call, INSPECT hiding owners' capabilities,
//! ACL WHOAMI / LIST / USERS / CAT / LOG / LOAD, the default user turned
//! off, and stock clients (redis-cli, redis-py, RedisCluster, redis-rs)
//! logging in as a tenant.

use std::process::Command;

use idem_protocol::Frame;

use crate::support::*;

fn error_text(f: &Frame) -> String {
    match f {
        Frame::Error(e) => String::from_utf8_lossy(e).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Users of the tenant tests: an admin, two tenants, an auditor who may
/// read every record, and the default user off.
const USERS: &[&str] = &[
    "default off",
    "admin on >admin-pw allkeys +@all",
    "tenant-a on >a-pw ~tenant-a:* +@idem +@connection",
    "tenant-b on >b-pw ~tenant-b:* +@idem +@connection +@blocking",
    "user audit on >audit-pw %R~* +inspect +settle",
];

async fn start_with_users() -> Idemd {
    let mut args = Vec::new();
    for u in USERS {
        args.extend(["--user", u]);
    }
    Idemd::start_with(&[], &args).await
}

async fn login(s: &Idemd, user: &str, pw: &str) -> Conn {
    let mut c = s.conn().await;
    assert_eq!(c.cmd(&["AUTH", user, pw]).await, ok(), "AUTH {user}");
    c
}

/// The value of `field` in a flat (RESP2) INSPECT reply.
fn field(f: &Frame, name: &str) -> Frame {
    let Frame::Array(items) = f else {
        panic!("INSPECT is a flat map: {f:?}")
    };
    let i = items
        .iter()
        .position(|x| matches!(x, Frame::Bulk(b) | Frame::Simple(b) if &b[..] == name.as_bytes()))
        .unwrap_or_else(|| panic!("no {name} in {f:?}"));
    items[i + 1].clone()
}

#[tokio::test]
async fn a_tenant_cannot_touch_another_tenants_keys() {
    let s = start_with_users().await;
    // The default user is off: nobody is logged in on connecting, and it
    // cannot log in.
    let mut anon = s.conn().await;
    assert_eq!(
        error_text(&anon.cmd(&["CLAIM", "tenant-a:1"]).await),
        "NOAUTH Authentication required."
    );
    assert!(error_text(&anon.cmd(&["AUTH", "anything"]).await).starts_with("WRONGPASS"));
    assert!(error_text(&anon.cmd(&["AUTH", "default", "x"]).await).starts_with("WRONGPASS"));
    assert!(error_text(&anon.cmd(&["AUTH", "tenant-a", "b-pw"]).await).starts_with("WRONGPASS"));

    let mut b = login(&s, "tenant-b", "b-pw").await;
    let fence = match claim(b.cmd(&["CLAIM", "tenant-b:1", "ATTEMPT", "try-1"]).await) {
        idem_protocol::ClaimReply::Acquired { fence } => fence,
        other => panic!("{other:?}"),
    };

    let mut a = login(&s, "tenant-a", "a-pw").await;
    assert_eq!(bulk(&a.cmd(&["ACL", "WHOAMI"]).await), "tenant-a");
    assert!(matches!(
        claim(a.cmd(&["CLAIM", "tenant-a:1"]).await),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
    let key_denied =
        "NOPERM User tenant-a has no permissions to access one of the keys used as arguments";
    let f = fence.to_string();
    for cmd in [
        &["CLAIM", "tenant-b:1"][..],
        &["INSPECT", "tenant-b:1"],
        &["SETTLE", "tenant-b:1"],
        &["COMPLETE", "tenant-b:1", &f, "stolen"],
        &["ABANDON", "tenant-b:1", &f],
        &["RENEW", "tenant-b:1", &f, "LEASE", "1000"],
        &["CLAIM", "tenant-a"],
    ] {
        assert_eq!(error_text(&a.cmd(cmd).await), key_denied, "{cmd:?}");
    }
    // Waiting needs @blocking, which tenant-a lacks: on its own keys too.
    let wait = error_text(&a.cmd(&["SETTLE", "tenant-b:1", "WAIT", "100"]).await);
    assert!(
        wait.starts_with("NOPERM") && wait.contains("WAIT"),
        "{wait}"
    );
    let wait = error_text(&a.cmd(&["SETTLE", "tenant-a:1", "WAIT", "100"]).await);
    assert!(
        wait.starts_with("NOPERM") && wait.contains("+@blocking"),
        "{wait}"
    );
    let no_wait = a.cmd(&["SETTLE", "tenant-a:1", "WAIT", "0"]).await;
    assert!(!matches!(no_wait, Frame::Error(_)), "{no_wait:?}");
    for (cmd, name) in [
        (&["FORGET", "tenant-a:1"][..], "forget"),
        (&["FORGET", "tenant-b:1"], "forget"),
        (&["CLIENT", "LIST"], "client|list"),
        (&["CONFIG", "GET", "*"], "config|get"),
        (&["DBSIZE"], "dbsize"),
        (&["ACL", "LIST"], "acl|list"),
        (&["ACL", "LOG"], "acl|log"),
        (&["CLUSTER", "REMOVE", "2"], "cluster|remove"),
    ] {
        assert_eq!(
            error_text(&a.cmd(cmd).await),
            format!("NOPERM User tenant-a has no permissions to run the '{name}' command"),
            "{cmd:?}"
        );
    }
    // INFO without the right to it: the cluster section alone.
    let info = bulk(&a.cmd(&["INFO"]).await);
    assert!(
        info.contains("cluster_enabled") && !info.contains("last_fence"),
        "{info}"
    );
    // Its own connection, yes; CLIENT SETINFO and SELECT 0 as Redis.
    assert!(bulk(&a.cmd(&["CLIENT", "INFO"]).await).contains(" user=tenant-a "));
    assert_eq!(a.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "svc"]).await, ok());
    assert_eq!(a.cmd(&["SELECT", "0"]).await, ok());
    assert!(error_text(&a.cmd(&["SELECT", "1"]).await).contains("out of range"));

    // tenant-b waits on its own key, and completes it.
    let waiter = {
        let mut w = login(&s, "tenant-b", "b-pw").await;
        tokio::spawn(async move { w.cmd(&["SETTLE", "tenant-b:1", "WAIT", "5000"]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        b.cmd(&["COMPLETE", "tenant-b:1", &f, "paid"]).await,
        Frame::simple("OK")
    );
    let settled = waiter.await.unwrap();
    assert!(format!("{settled:?}").contains("paid"), "{settled:?}");

    // The record was never touched by tenant-a.
    let seen = b.cmd(&["INSPECT", "tenant-b:1"]).await;
    assert_eq!(field(&seen, "value"), Frame::Bulk("paid".into()));
    assert_eq!(field(&seen, "fence"), Frame::Integer(fence as i64));
}

#[tokio::test]
async fn inspect_shows_fences_only_to_those_who_may_write_the_key() {
    let s = start_with_users().await;
    let mut b = login(&s, "tenant-b", "b-pw").await;
    let fence = match claim(b.cmd(&["CLAIM", "tenant-b:2", "ATTEMPT", "att-7"]).await) {
        idem_protocol::ClaimReply::Acquired { fence } => fence,
        other => panic!("{other:?}"),
    };
    let own = b.cmd(&["INSPECT", "tenant-b:2"]).await;
    assert_eq!(field(&own, "fence"), Frame::Integer(fence as i64));
    assert_eq!(field(&own, "attempt"), Frame::Bulk("att-7".into()));
    // The auditor reads every record, without what would let it act as
    // the owner.
    let mut audit = login(&s, "audit", "audit-pw").await;
    let seen = audit.cmd(&["INSPECT", "tenant-b:2"]).await;
    assert_eq!(field(&seen, "state"), Frame::simple("in_flight"));
    assert_eq!(field(&seen, "fence"), Frame::Integer(0));
    assert_eq!(field(&seen, "attempt"), Frame::Null);
    assert!(error_text(&audit.cmd(&["CLAIM", "tenant-b:2"]).await).starts_with("NOPERM"));
    // The admin sees everything.
    let mut admin = login(&s, "admin", "admin-pw").await;
    let all = admin.cmd(&["INSPECT", "tenant-b:2"]).await;
    assert_eq!(field(&all, "fence"), Frame::Integer(fence as i64));
    assert_eq!(
        admin.cmd(&["FORGET", "tenant-b:2"]).await,
        Frame::Integer(1)
    );
}

#[tokio::test]
async fn acl_list_users_cat_and_log() {
    let s = start_with_users().await;
    let mut admin = login(&s, "admin", "admin-pw").await;
    let Frame::Array(users) = admin.cmd(&["ACL", "USERS"]).await else {
        panic!("ACL USERS is an array")
    };
    let names: Vec<String> = users.iter().map(bulk).collect();
    assert_eq!(names, ["admin", "audit", "default", "tenant-a", "tenant-b"]);
    let Frame::Array(lines) = admin.cmd(&["ACL", "LIST"]).await else {
        panic!("ACL LIST is an array")
    };
    let lines: Vec<String> = lines.iter().map(bulk).collect();
    let text = lines.join("\n");
    // Passwords only as hashes.
    assert!(
        !text.contains("a-pw") && !text.contains("admin-pw"),
        "{text}"
    );
    let a_hash = sha256_hex("a-pw");
    assert!(
        lines.contains(&format!(
            "user tenant-a on #{a_hash} ~tenant-a:* -@all +claim +settle +complete +renew +journal \
             +release +abandon +inspect +ping +echo +select +readonly +readwrite +command +client|id +client|setname \
             +client|getname +client|info +client|setinfo +cluster|info +cluster|nodes \
             +cluster|myid +cluster|slots +cluster|shards +cluster|keyslot +acl|whoami +acl|cat"
        )),
        "{text}"
    );
    assert!(
        lines.contains(&"user default off resetkeys -@all".to_owned()),
        "{text}"
    );
    assert!(
        lines.contains(&format!(
            "user audit on #{} %R~* -@all +settle +inspect",
            sha256_hex("audit-pw")
        )),
        "{text}"
    );
    // ACL CAT: the categories, and the commands of one.
    let Frame::Array(cats) = admin.cmd(&["ACL", "CAT"]).await else {
        panic!("ACL CAT is an array")
    };
    assert!(cats.iter().map(bulk).any(|c| c == "idem"));
    let Frame::Array(idem) = admin.cmd(&["ACL", "CAT", "idem"]).await else {
        panic!("ACL CAT idem is an array")
    };
    let idem: Vec<String> = idem.iter().map(bulk).collect();
    assert_eq!(
        idem,
        [
            "claim", "settle", "complete", "renew", "journal", "release", "abandon", "inspect"
        ]
    );
    assert!(error_text(&admin.cmd(&["ACL", "CAT", "nosuch"]).await).contains("nosuch"));

    // Denials are logged: who, what, which key, from where.
    let mut a = login(&s, "tenant-a", "a-pw").await;
    let _ = a.cmd(&["CLAIM", "tenant-b:9"]).await;
    let _ = a.cmd(&["CLAIM", "tenant-b:9"]).await;
    let _ = a.cmd(&["FORGET", "tenant-a:1"]).await;
    let mut wrong = s.conn().await;
    let _ = wrong.cmd(&["AUTH", "tenant-a", "guess"]).await;
    let Frame::Array(log) = admin.cmd(&["ACL", "LOG"]).await else {
        panic!("ACL LOG is an array")
    };
    assert_eq!(log.len(), 3, "{log:?}");
    let entry = |i: usize, f: &str| field(&log[i], f);
    // Newest first: the wrong password, the FORGET, the two CLAIMs folded.
    assert_eq!(bulk(&entry(0, "reason")), "auth");
    assert_eq!(bulk(&entry(0, "username")), "tenant-a");
    assert_eq!(bulk(&entry(1, "reason")), "command");
    assert_eq!(bulk(&entry(1, "object")), "forget");
    assert_eq!(bulk(&entry(2, "reason")), "key");
    assert_eq!(bulk(&entry(2, "object")), "tenant-b:9");
    assert_eq!(bulk(&entry(2, "username")), "tenant-a");
    assert_eq!(entry(2, "count"), Frame::Integer(2));
    let client = bulk(&entry(2, "client-info"));
    assert!(
        client.contains(&format!("laddr={}", s.addr)) && client.contains("user=tenant-a"),
        "{client}"
    );
    let Frame::Array(one) = admin.cmd(&["ACL", "LOG", "1"]).await else {
        panic!("ACL LOG 1 is an array")
    };
    assert_eq!(one.len(), 1);
    assert_eq!(info_field(&mut admin, "acl_access_denied_key").await, 2);
    assert_eq!(info_field(&mut admin, "acl_access_denied_cmd").await, 1);
    assert_eq!(admin.cmd(&["ACL", "LOG", "RESET"]).await, ok());
    assert_eq!(admin.cmd(&["ACL", "LOG"]).await, Frame::Array(vec![]));
    // The admin sees every client and its user.
    let list = bulk(&admin.cmd(&["CLIENT", "LIST"]).await);
    assert!(
        list.contains("user=tenant-a") && list.contains("user=admin"),
        "{list}"
    );
    // Users come from the configuration: ACL LOAD says so.
    assert!(error_text(&admin.cmd(&["ACL", "LOAD"]).await).contains("no aclfile"));
}

fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn acl_load_rereads_the_file_and_applies_it_to_open_connections() {
    let dir = DataDir::new("aclfile");
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("users.acl");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    write(&format!(
        "# users of the test\n\
         user default off\n\
         user admin on #{} allkeys +@all\n\
         user t1 on >t1-pw ~t1:* +@idem\n\
         user t2 on >t2-pw ~t2:* +@idem\n",
        sha256_hex("admin-pw")
    ));
    let s = Idemd::start_with(&[], &["--aclfile", file.to_str().unwrap()]).await;
    let mut admin = login(&s, "admin", "admin-pw").await;
    let mut t1 = login(&s, "t1", "t1-pw").await;
    let mut t2 = login(&s, "t2", "t2-pw").await;
    assert!(error_text(&t1.cmd(&["CLAIM", "shared:1"]).await).starts_with("NOPERM"));

    // t1 gains shared:*, t2 is removed.
    write(&format!(
        "user default off\n\
         user admin on #{} allkeys +@all\n\
         user t1 on >t1-pw ~t1:* ~shared:* +@idem\n",
        sha256_hex("admin-pw")
    ));
    assert_eq!(admin.cmd(&["ACL", "LOAD"]).await, ok());
    assert!(matches!(
        claim(t1.cmd(&["CLAIM", "shared:1"]).await),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
    let gone = t2.cmd(&["CLAIM", "t2:1"]).await;
    assert!(error_text(&gone).contains("removed"), "{gone:?}");
    assert!(t2.closed().await);
    let mut again = s.conn().await;
    assert!(error_text(&again.cmd(&["AUTH", "t2", "t2-pw"]).await).starts_with("WRONGPASS"));

    // t1's old password is revoked: its open connection is closed (it must
    // log in with the new one); the admin's stays.
    write(&format!(
        "user default off\n\
         user admin on #{} allkeys +@all\n\
         user t1 on >t1-new ~t1:* ~shared:* +@idem\n",
        sha256_hex("admin-pw")
    ));
    assert_eq!(admin.cmd(&["ACL", "LOAD"]).await, ok());
    let gone = t1.cmd(&["CLAIM", "t1:1"]).await;
    assert!(error_text(&gone).contains("revoked"), "{gone:?}");
    assert!(t1.closed().await);
    let mut t1 = login(&s, "t1", "t1-new").await;

    // A bad file is refused with its line, and the users in force stay.
    write("user default off\nuser t1 on +@nosuch\n");
    let e = error_text(&admin.cmd(&["ACL", "LOAD"]).await);
    assert!(e.contains(":2") && e.contains("nosuch"), "{e}");
    assert!(matches!(
        claim(t1.cmd(&["CLAIM", "shared:2"]).await),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
}

#[tokio::test]
async fn bad_user_configurations_stop_the_start() {
    let run = refused_start;
    let e = run(&["--user", "t on ~* +@nosuch"]);
    assert!(e.contains("users[0]") && e.contains("@nosuch"), "{e}");
    let e = run(&["--user", "t on", "--user", "t off"]);
    assert!(e.contains("twice"), "{e}");
    let e = run(&["--requirepass", "x", "--user", "default on nopass"]);
    assert!(e.contains("requirepass"), "{e}");
    let e = run(&["--user", "t on", "--aclfile", "/nonexistent/users.acl"]);
    assert!(e.contains("keep one"), "{e}");
    let e = run(&["--aclfile", "/nonexistent/users.acl"]);
    assert!(e.contains("/nonexistent/users.acl"), "{e}");
}

#[tokio::test]
async fn protected_mode_counts_users_only_with_the_default_user_closed() {
    let outside = crate::t16_auth::outside_address();
    // Users defined, but the default user still takes no password:
    // anyone could connect, so other hosts are still refused.
    let s = Idemd::start_with(
        &[],
        &["--listen", "0.0.0.0:0", "--user", "t on >pw ~* +@all"],
    )
    .await;
    let mut r = Conn::connect(std::net::SocketAddr::new(outside, s.addr.port())).await;
    assert!(error_text(&r.read().await.expect("a reply")).starts_with("DENIED"));
    drop(s);
    // The default user off, but another user takes any password: still
    // open, still refused.
    let s = Idemd::start_with(
        &[],
        &[
            "--listen",
            "0.0.0.0:0",
            "--user",
            "default off",
            "--user",
            "anyone on nopass ~* +@all",
        ],
    )
    .await;
    let mut r = Conn::connect(std::net::SocketAddr::new(outside, s.addr.port())).await;
    assert!(error_text(&r.read().await.expect("a reply")).starts_with("DENIED"));
    drop(s);
    // The default user off: other hosts are served, and must AUTH.
    let s = Idemd::start_with(
        &[],
        &[
            "--listen",
            "0.0.0.0:0",
            "--user",
            "default off",
            "--user",
            "t on >pw ~* +@all",
        ],
    )
    .await;
    let mut r = Conn::connect(std::net::SocketAddr::new(outside, s.addr.port())).await;
    assert_eq!(
        error_text(&r.cmd(&["PING"]).await),
        "NOAUTH Authentication required."
    );
    assert_eq!(r.cmd(&["AUTH", "t", "pw"]).await, ok());
}

/// A `+@idem +@connection` user runs stock clients unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_clients_log_in_as_a_tenant() {
    let dir = DataDir::new("acl-stock");
    let s = Idemd::start_with(
        &[],
        &[
            "--engine",
            "raft",
            "--data-dir",
            dir.arg(),
            "--user",
            "default off",
            "--user",
            "tenant-a on >a-pw ~tenant-a:* +@idem +@connection",
        ],
    )
    .await;
    // redis-rs, RESP2 and RESP3, user and password in the URL.
    for (i, q) in ["", "?protocol=resp3"].iter().enumerate() {
        let url = format!("redis://tenant-a:a-pw@{}/{q}", s.addr);
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("tenant-a:rs-{i}");
        let claimed: Vec<redis::Value> = redis::cmd("CLAIM")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        let fence = match &claimed[..] {
            [_, redis::Value::Int(f)] => *f,
            other => panic!("{other:?}"),
        };
        let done: redis::Value = redis::cmd("COMPLETE")
            .arg(&key)
            .arg(fence)
            .arg("done")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(done, redis::Value::Okay);
        let refused: redis::RedisResult<redis::Value> = redis::cmd("CLAIM")
            .arg("tenant-b:1")
            .query_async(&mut con)
            .await;
        let e = refused.unwrap_err();
        assert_eq!(e.code(), Some("NOPERM"), "{e}");
        let bad = redis::Client::open(format!("redis://tenant-a:nope@{}/{q}", s.addr).as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await;
        assert!(bad.is_err());
    }
    if crate::t07_redis_tools::tool("redis-cli").is_some() {
        let (h, p) = (s.addr.ip().to_string(), s.addr.port().to_string());
        let text = redis_cli(&[
            "-h",
            &h,
            "-p",
            &p,
            "--user",
            "tenant-a",
            "--pass",
            "a-pw",
            "--no-auth-warning",
            "CLAIM",
            "tenant-a:cli",
        ]);
        assert_eq!(text.lines().next(), Some("ACQUIRED"), "{text}");
    }
    if let Some(py) = crate::t13_cluster::python_with_redis() {
        let script = format!(
            "import redis\n\
             from redis.cluster import RedisCluster\n\
             r = redis.Redis(host='{ip}', port={port}, username='tenant-a', password='a-pw')\n\
             print(r.execute_command('CLAIM', 'tenant-a:py'))\n\
             try:\n    r.execute_command('CLAIM', 'tenant-b:py')\n    print('allowed')\n\
             except redis.exceptions.NoPermissionError:\n    print('noperm')\n\
             c = RedisCluster(host='{ip}', port={port}, username='tenant-a', password='a-pw')\n\
             print(c.execute_command('CLAIM', 'tenant-a:pyc'))\n\
             print(c.execute_command('SETTLE', 'tenant-a:pyc'))\n",
            ip = s.addr.ip(),
            port = s.addr.port(),
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
        assert_eq!(lines[1], "noperm", "{stdout}");
        assert!(lines[2].contains("ACQUIRED"), "{stdout}");
        assert!(lines[3].contains("INFLIGHT"), "{stdout}");
    }
}

/// The Rust client tells a refused permission from a refused password.
#[tokio::test]
async fn idem_client_reports_noperm_as_its_own_kind() {
    use idem_client::{Client, ClientConfig, ErrorKind};
    let s = start_with_users().await;
    let c = Client::connect_with_config(
        s.addr.to_string(),
        ClientConfig::default().user_password("tenant-a", "a-pw"),
    )
    .await
    .unwrap();
    assert!(c.claim("tenant-a:client").await.is_ok());
    let e = c.claim("tenant-b:client").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoPerm, "{e}");
    assert!(!e.is_retryable());
    let url = format!("idem://tenant-a:wrong@{}", s.addr);
    let e = Client::connect(url).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
}

#[tokio::test]
async fn scan_lists_only_the_keys_a_user_may_read() {
    let s = Idemd::start_with(
        &[],
        &[
            "--user",
            "default off",
            "--user",
            "admin on >admin-pw allkeys +@all",
            "--user",
            "tenant-a on >a-pw ~tenant-a:* +@idem +@connection +scan",
            "--user",
            "no-scan on >n-pw ~tenant-a:* +@idem +@connection",
        ],
    )
    .await;
    let mut admin = login(&s, "admin", "admin-pw").await;
    for i in 0..30 {
        for tenant in ["tenant-a", "tenant-b"] {
            admin.acquire(&["CLAIM", &format!("{tenant}:{i}")]).await;
        }
    }
    let walk = |mut c: Conn| async move {
        let (mut cursor, mut keys) = ("0".to_owned(), Vec::new());
        loop {
            let Frame::Array(step) = c.cmd(&["SCAN", &cursor, "COUNT", "8"]).await else {
                panic!("SCAN answers an array")
            };
            cursor = bulk(&step[0]);
            let Frame::Array(got) = &step[1] else {
                panic!("{step:?}")
            };
            keys.extend(got.iter().map(bulk));
            if cursor == "0" {
                keys.sort();
                return keys;
            }
        }
    };
    let all = walk(login(&s, "admin", "admin-pw").await).await;
    assert_eq!(all.len(), 60, "{all:?}");
    let mine = walk(login(&s, "tenant-a", "a-pw").await).await;
    let mut want: Vec<String> = (0..30).map(|i| format!("tenant-a:{i}")).collect();
    want.sort();
    assert_eq!(mine, want);
    let mut no = login(&s, "no-scan", "n-pw").await;
    let e = error_text(&no.cmd(&["SCAN", "0"]).await);
    assert!(e.starts_with("NOPERM") && e.contains("'scan'"), "{e}");
    // COUNT counts only the keys the user may read: a walk by ones takes a
    // call per own key (and at most one to end), however many records
    // other tenants hold. Counting every record let a tenant count the
    // whole store (DBSIZE is @admin) and watch others' records come and go.
    for i in 0..200 {
        admin
            .acquire(&["CLAIM", &format!("tenant-b:more-{i}")])
            .await;
    }
    let mut a = login(&s, "tenant-a", "a-pw").await;
    let (mut cursor, mut calls, mut seen) = ("0".to_owned(), 0, 0);
    loop {
        let Frame::Array(step) = a.cmd(&["SCAN", &cursor, "COUNT", "1"]).await else {
            panic!("SCAN answers an array")
        };
        calls += 1;
        cursor = bulk(&step[0]);
        let Frame::Array(got) = &step[1] else {
            panic!("{step:?}")
        };
        assert!(got.len() <= 1, "{got:?}");
        seen += got.len();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen, 30);
    // (A call that runs out of its 10 ms may come back empty: some slack.)
    assert!(calls <= 40, "{calls} calls for 30 keys of 260 records");
}
