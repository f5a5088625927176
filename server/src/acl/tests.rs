use bytes::Bytes;
use idem_protocol::Command;
use idem_protocol::cmd::{Claim, Forget, Inspect, Settle};

use super::*;

fn user(rules: &str) -> User {
    let acl = Acl::build(None, [("test".to_owned(), rules)]).unwrap();
    let name = rules.split_whitespace().nth(1).unwrap();
    User::clone(acl.user(name).unwrap())
}

fn cmd(s: &str) -> Command {
    Command::from_args(
        s.split(' ')
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect(),
    )
    .unwrap()
}

#[test]
fn globs_match_like_redis() {
    let cases: &[(&str, &str, bool)] = &[
        ("*", "", true),
        ("*", "anything", true),
        ("tenant-a:*", "tenant-a:1", true),
        ("tenant-a:*", "tenant-b:1", false),
        ("tenant-a:*", "tenant-a", false),
        ("h?llo", "hello", true),
        ("h?llo", "hllo", false),
        ("h[ae]llo", "hallo", true),
        ("h[ae]llo", "hillo", false),
        ("h[^e]llo", "hallo", true),
        ("h[^e]llo", "hello", false),
        ("h[a-c]llo", "hbllo", true),
        ("h[c-a]llo", "hbllo", true),
        ("h[a-c]llo", "hdllo", false),
        ("h\\*llo", "h*llo", true),
        ("h\\*llo", "hello", false),
        ("a*b*c", "aXXbYYc", true),
        ("a*b*c", "aXXbYY", false),
        ("*:*:end", "x:y:z:end", true),
        ("**a", "bbba", true),
        ("[\\]]", "]", true),
    ];
    for &(p, t, want) in cases {
        assert_eq!(
            Glob::new(p.as_bytes()).matches(t.as_bytes()),
            want,
            "{p} ~ {t}"
        );
    }
}

/// A pattern built to backtrack is still linear-ish in practice: a long
/// hostile key against many stars finishes at once (bounded by the
/// product of lengths, not exponential).
#[test]
fn a_hostile_key_does_not_explode_a_glob() {
    let g = Glob::new(b"*a*a*a*a*a*a*a*a*b");
    let key = vec![b'a'; 1024];
    assert!(!g.matches(&key));
}

#[test]
fn new_users_start_with_nothing() {
    let u = user("user bare on nopass");
    assert_eq!(u.check(&cmd("PING")), Err(Denied::Command("ping")));
    assert_eq!(u.check(&cmd("CLAIM k")), Err(Denied::Command("claim")));
    // AUTH, HELLO and QUIT are always allowed.
    assert_eq!(u.check(&cmd("AUTH x")), Ok(()));
    assert_eq!(u.check(&cmd("QUIT")), Ok(()));
}

#[test]
fn idem_and_connection_categories() {
    let u = user("user t on >pw ~tenant-a:* +@idem +@connection");
    for ok in [
        "CLAIM tenant-a:1",
        "SETTLE tenant-a:1",
        "COMPLETE tenant-a:1 3 v",
        "INSPECT tenant-a:1",
        "PING",
        "CLIENT SETINFO LIB-NAME x",
        "CLIENT ID",
        "CLUSTER SLOTS",
        "CLUSTER NODES",
        "SELECT 0",
        "ACL WHOAMI",
        "COMMAND",
    ] {
        assert_eq!(u.check(&cmd(ok)), Ok(()), "{ok}");
    }
    assert_eq!(u.check(&cmd("CLAIM tenant-b:1")), Err(Denied::Key));
    assert_eq!(u.check(&cmd("INSPECT tenant-b:1")), Err(Denied::Key));
    assert_eq!(
        u.check(&cmd("FORGET tenant-a:1")),
        Err(Denied::Command("forget"))
    );
    assert_eq!(
        u.check(&cmd("CLIENT LIST")),
        Err(Denied::Command("client|list"))
    );
    assert_eq!(u.check(&cmd("INFO")), Err(Denied::Command("info")));
    assert_eq!(u.check(&cmd("DBSIZE")), Err(Denied::Command("dbsize")));
    assert_eq!(
        u.check(&cmd("CONFIG GET *")),
        Err(Denied::Command("config|get"))
    );
    assert_eq!(
        u.check(&cmd("CLUSTER ADD 2 a b")),
        Err(Denied::Command("cluster|add"))
    );
    assert_eq!(u.check(&cmd("ACL LIST")), Err(Denied::Command("acl|list")));
    // Waiting needs @blocking, checked per call.
    assert_eq!(u.check(&cmd("CLAIM tenant-a:1 WAIT 0")), Ok(()));
    assert_eq!(
        u.check(&cmd("CLAIM tenant-a:1 WAIT 5")),
        Err(Denied::Wait("claim"))
    );
    assert_eq!(
        u.check(&cmd("SETTLE tenant-a:1 WAIT 5")),
        Err(Denied::Wait("settle"))
    );
    let b = user("user t on >pw ~tenant-a:* +@idem +@blocking");
    assert_eq!(b.check(&cmd("SETTLE tenant-a:1 WAIT 5")), Ok(()));
    assert_eq!(b.check(&cmd("SETTLE tenant-b:1 WAIT 5")), Err(Denied::Key));
}

#[test]
fn forget_is_admin_unless_granted() {
    let admin = user("user ops on >pw allkeys +@admin");
    assert_eq!(admin.check(&cmd("FORGET any")), Ok(()));
    assert_eq!(admin.check(&cmd("INFO")), Ok(()));
    let granted = user("user t on >pw ~t:* +@idem +forget");
    assert_eq!(granted.check(&cmd("FORGET t:1")), Ok(()));
    assert_eq!(granted.check(&cmd("FORGET u:1")), Err(Denied::Key));
}

#[test]
fn rules_apply_left_to_right() {
    let u = user("user t on nopass allkeys +@all -@dangerous +client|list -claim");
    assert_eq!(u.check(&cmd("CLIENT LIST")), Ok(()));
    assert_eq!(u.check(&cmd("INFO")), Err(Denied::Command("info")));
    assert_eq!(u.check(&cmd("CLAIM k")), Err(Denied::Command("claim")));
    assert_eq!(u.check(&cmd("SETTLE k WAIT 9")), Ok(()));
    let r = user("user t on nopass allkeys +@all reset on nopass +ping");
    assert_eq!(r.check(&cmd("PING")), Ok(()));
    assert_eq!(r.check(&cmd("CLAIM k")), Err(Denied::Command("claim")));
    let c = user("user t on nopass allkeys +client -client|list");
    assert_eq!(c.check(&cmd("CLIENT ID")), Ok(()));
    assert_eq!(
        c.check(&cmd("CLIENT LIST")),
        Err(Denied::Command("client|list"))
    );
}

#[test]
fn read_and_write_key_patterns() {
    let u = user("user audit on nopass %R~* %RW~mine:* +@idem");
    assert_eq!(u.check(&cmd("INSPECT other:1")), Ok(()));
    assert_eq!(u.check(&cmd("SETTLE other:1")), Ok(()));
    assert_eq!(u.check(&cmd("CLAIM other:1")), Err(Denied::Key));
    assert_eq!(u.check(&cmd("CLAIM mine:1")), Ok(()));
    assert!(!u.may_own(b"other:1"));
    assert!(u.may_own(b"mine:1"));
    // CLAIM reads too (it answers a completed key's value): write-only
    // access is not enough; write-only suits the owner commands.
    let w = user("user w on nopass %W~* +claim +complete");
    assert_eq!(w.check(&cmd("CLAIM x")), Err(Denied::Key));
    assert_eq!(w.check(&cmd("COMPLETE x 1 v")), Ok(()));
    let reader = user("user r on nopass allkeys +@read");
    assert!(!reader.may_own(b"x"), "no @write command: not an owner");
}

#[test]
fn passwords_are_hashes_and_users_can_be_off() {
    let hash = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"; // "password"
    let acl = Acl::build(
        None,
        [
            (
                "a".to_owned(),
                format!("user p on #{hash} ~* +@all").as_str(),
            ),
            ("b".to_owned(), "user q off >secret ~* +@all"),
            ("c".to_owned(), "user r on >one >two <one ~* +@all"),
        ],
    )
    .unwrap();
    assert!(acl.authenticate(Some(b"p"), b"password").is_some());
    assert!(acl.authenticate(Some(b"p"), b"passwore").is_none());
    assert!(acl.authenticate(Some(b"q"), b"secret").is_none(), "off");
    assert!(acl.authenticate(Some(b"r"), b"one").is_none(), "removed");
    assert!(acl.authenticate(Some(b"r"), b"two").is_some());
    assert!(acl.authenticate(Some(b"nobody"), b"two").is_none());
    // The default user is open: no requirepass, no rule for it.
    assert!(acl.open());
    // So is a server whose default user is off but another user takes any
    // password.
    let other = Acl::build(
        None,
        [
            ("a".to_owned(), "user default off"),
            ("b".to_owned(), "user anyone on nopass ~* +@all"),
        ],
    )
    .unwrap();
    assert!(other.open() && other.initial_user().is_none());
    assert!(acl.authenticate(None, b"anything").is_some());
    let listed = acl.user("p").unwrap().describe();
    assert_eq!(listed, format!("user p on #{hash} ~* +@all"));
    assert!(!acl.user("r").unwrap().describe().contains("two"));
}

#[test]
fn the_default_user_follows_requirepass_or_its_rule() {
    let pw: [u8; 32] = Sha256::digest(b"pw").into();
    let acl = Acl::build(Some(pw), std::iter::empty()).unwrap();
    assert!(!acl.open());
    assert!(acl.initial_user().is_none());
    assert!(acl.authenticate(None, b"pw").is_some());
    assert!(acl.authenticate(Some(b"default"), b"pw").is_some());
    let off = Acl::build(None, [("x".to_owned(), "user default off")]).unwrap();
    assert!(!off.open());
    assert!(off.authenticate(None, b"").is_none());
    let both = Acl::build(Some(pw), [("x".to_owned(), "user default on nopass")]);
    assert!(both.unwrap_err().contains("requirepass"));
}

#[test]
fn bad_rules_are_refused_with_where_they_came_from() {
    for (line, why) in [
        ("user t on +@nosuch", "unknown category"),
        ("user t on +nosuch", "unknown command"),
        ("user t on #abc", "64 hex digits"),
        ("user t on %X~*", "key permission"),
        ("user t on what", "unknown rule"),
    ] {
        let e = Acl::build(None, [("users[0]".to_owned(), line)]).unwrap_err();
        assert!(e.contains("users[0]") && e.contains(why), "{line}: {e}");
    }
    let e = Acl::build(
        None,
        [
            ("1".to_owned(), "user t on"),
            ("2".to_owned(), "user t off"),
        ],
    )
    .unwrap_err();
    assert!(e.contains("twice"), "{e}");
    // Redis categories without Idem commands load and grant nothing.
    let u = user("user t on nopass allkeys +@string +@pubsub");
    assert_eq!(u.check(&cmd("CLAIM k")), Err(Denied::Command("claim")));
}

#[test]
fn every_command_has_a_permission() {
    for c in [
        Command::Claim(Claim::new("k")),
        Command::Settle(Settle {
            key: Bytes::from_static(b"k"),
            wait_ms: None,
        }),
        Command::Inspect(Inspect {
            key: Bytes::from_static(b"k"),
        }),
        Command::Forget(Forget {
            key: Bytes::from_static(b"k"),
        }),
    ] {
        assert!(unit_of(&c).is_some());
    }
    assert!(UNITS.len() < WAIT as usize, "the bit set has room");
    for s in [
        "ACL LOG",
        "ACL LOG RESET",
        "ACL LOAD",
        "ACL USERS",
        "ACL CAT",
        "CLUSTER MEMBERS",
        "CLUSTER PROMOTE 2",
        "CLUSTER REMOVE 2",
        "CLUSTER KEYSLOT k",
        "CLUSTER MYID",
        "CLUSTER SHARDS",
        "CLUSTER INFO",
        "CLIENT GETNAME",
        "CLIENT SETNAME n",
        "CLIENT INFO",
        "ECHO x",
        "INFO",
        "DBSIZE",
    ] {
        assert!(unit_of(&cmd(s)).is_some(), "{s}");
    }
}

#[test]
fn the_log_folds_repeats_and_is_bounded() {
    let mut log = AclLog::default();
    let d = |o: &str| Denial {
        reason: "key",
        object: o.to_owned(),
        username: "t".into(),
        client_info: "id=1".into(),
    };
    log.add(d("k"), 1000);
    log.add(d("k"), 2000);
    assert_eq!(log.latest(10).count(), 1);
    assert_eq!(log.latest(10).next().unwrap().count, 2);
    log.add(d("k"), 70_000);
    assert_eq!(log.latest(10).count(), 2, "a minute later: a new entry");
    for i in 0..500 {
        log.add(d(&i.to_string()), 80_000);
    }
    assert_eq!(log.latest(usize::MAX).count(), ACL_LOG_LEN);
    assert_eq!(log.latest(1).next().unwrap().denial.object, "499");
    log.reset();
    assert_eq!(log.latest(10).count(), 0);
}

/// A denied 1 MB key, or a failed AUTH's 1 MB user name, was kept whole:
/// 128 entries pinned over 100 MB outside every memory budget.
#[test]
fn log_entries_keep_a_bounded_part_of_large_objects() {
    let mut log = AclLog::default();
    let huge = "é".repeat(500_000);
    log.add(
        Denial {
            reason: "auth",
            object: "AUTH".into(),
            username: huge.clone(),
            client_info: huge.clone(),
        },
        1000,
    );
    let e = log.latest(1).next().unwrap();
    for field in [&e.denial.username, &e.denial.client_info] {
        assert!(
            field.len() < ACL_LOG_FIELD_BYTES + 32,
            "{} bytes",
            field.len()
        );
        assert!(field.starts_with("éé"), "cut at a character boundary");
        assert!(
            field.ends_with("...(1000000 bytes)"),
            "{}",
            &field[field.len() - 30..]
        );
    }
    // Repeats of the same large denial still fold.
    log.add(
        Denial {
            reason: "auth",
            object: "AUTH".into(),
            username: huge.clone(),
            client_info: "id=2".into(),
        },
        2000,
    );
    assert_eq!(log.latest(10).count(), 1);
    assert_eq!(log.latest(1).next().unwrap().count, 2);
}
