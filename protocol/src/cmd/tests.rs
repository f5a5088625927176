use bytes::{Bytes, BytesMut};

use super::*;
use crate::frame::{Limits, Version, decode, encode};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn parse(s: &str) -> Result<Command, CommandError> {
    Command::from_args(s.split(' ').map(b).collect())
}

/// Every command survives command -> frame -> wire -> frame -> command.
pub(crate) fn all_commands() -> Vec<Command> {
    vec![
        Command::Claim(Claim::new("k")),
        Command::Claim(Claim {
            key: b("order-1"),
            lease_ms: Some(5000),
            retain_ms: Some(86_400_000),
            wait_ms: Some(0),
            fingerprint: Some(Bytes::from_static(b"\x00\xff\r\n")),
            on_expire: Some(OnExpire::Recover),
            attempt: Some(b("a-1")),
        }),
        Command::Settle(Settle {
            key: b("k"),
            wait_ms: None,
        }),
        Command::Settle(Settle {
            key: b("k"),
            wait_ms: Some(100),
        }),
        Command::Complete(Complete {
            key: b("k"),
            fence: 7,
            value: b(""),
            retain_ms: None,
            error: false,
        }),
        Command::Complete(Complete {
            key: b("k"),
            fence: 7,
            value: b("v"),
            retain_ms: Some(9),
            error: true,
        }),
        Command::Renew(Renew {
            key: b("k"),
            fence: 1,
            lease_ms: 10,
        }),
        Command::Journal(Journal {
            key: b("k"),
            fence: 1,
            journal: b("step 2"),
        }),
        Command::Release(Release {
            key: b("k"),
            fence: u64::MAX,
        }),
        Command::Abandon(Abandon {
            key: b("k"),
            fence: 3,
        }),
        Command::Inspect(Inspect { key: b("k") }),
        Command::Forget(Forget { key: b("k") }),
        Command::Ping(Ping { message: None }),
        Command::Ping(Ping {
            message: Some(b("hi")),
        }),
        Command::Echo(Echo { message: b("hi") }),
        Command::Hello(Hello::default()),
        Command::Hello(Hello {
            version: Some(3),
            auth: Some((b("u"), b("p"))),
            setname: Some(b("n")),
        }),
        Command::Auth(Auth {
            username: None,
            password: b("p"),
        }),
        Command::Auth(Auth {
            username: Some(b("u")),
            password: b("p"),
        }),
        Command::Quit,
        Command::Info(Info { sections: vec![] }),
        Command::Info(Info {
            sections: vec![b("server"), b("stats")],
        }),
        Command::DbSize,
        Command::Client(ClientCmd::Id),
        Command::Client(ClientCmd::SetName(b("worker-1"))),
        Command::Client(ClientCmd::GetName),
        Command::Client(ClientCmd::List),
        Command::Client(ClientCmd::Info),
        Command::Command(CommandCmd::All),
        Command::Command(CommandCmd::Count),
        Command::Command(CommandCmd::Docs(vec![])),
        Command::Command(CommandCmd::Info(vec![b("claim")])),
        Command::Config(ConfigCmd::Get(vec![b("max*")])),
        Command::Cluster(ClusterCmd::Info),
        Command::Cluster(ClusterCmd::Nodes),
        Command::Cluster(ClusterCmd::MyId),
        Command::Cluster(ClusterCmd::Slots),
        Command::Cluster(ClusterCmd::Shards),
        Command::Cluster(ClusterCmd::KeySlot(b("{user}.a"))),
        Command::Cluster(ClusterCmd::Members),
        Command::Cluster(ClusterCmd::Add {
            id: 4,
            peer: b("10.0.0.4:17379"),
            client: b("10.0.0.4:7379"),
        }),
        Command::Cluster(ClusterCmd::Promote(4)),
        Command::Cluster(ClusterCmd::Remove(4)),
        Command::Client(ClientCmd::SetInfo {
            attr: "lib-name",
            value: b("redis-rs"),
        }),
        Command::Client(ClientCmd::Kill(ClientKill {
            addr: Some(b("127.0.0.1:5000")),
            skip_me: false,
            old_form: true,
            ..ClientKill::default()
        })),
        Command::Client(ClientCmd::Kill(ClientKill {
            skip_me: true,
            ..ClientKill::default()
        })),
        Command::Client(ClientCmd::Kill(ClientKill {
            id: Some(7),
            addr: Some(b("127.0.0.1:5000")),
            laddr: Some(b("127.0.0.1:7379")),
            user: Some(b("tenant-a")),
            skip_me: false,
            old_form: false,
        })),
        Command::Client(ClientCmd::Kill(ClientKill {
            user: Some(b("default")),
            skip_me: true,
            ..ClientKill::default()
        })),
        Command::Select(0),
        Command::Config(ConfigCmd::ReloadTls),
        Command::Config(ConfigCmd::ResetStat),
        Command::Scan(Scan::default()),
        Command::Role,
        Command::Scan(Scan {
            cursor: 1 << 40 | 7,
            pattern: Some(b("tenant-a:*")),
            count: Some(500),
        }),
        Command::Latency(LatencyCmd::Latest),
        Command::Latency(LatencyCmd::History(b("command"))),
        Command::Latency(LatencyCmd::Reset(vec![])),
        Command::Latency(LatencyCmd::Reset(vec![b("command"), b("fork")])),
        Command::Latency(LatencyCmd::Histogram(vec![])),
        Command::Latency(LatencyCmd::Histogram(vec![b("claim")])),
        Command::Latency(LatencyCmd::Doctor),
        Command::Latency(LatencyCmd::Help),
        Command::Acl(AclCmd::WhoAmI),
        Command::Acl(AclCmd::List),
        Command::Acl(AclCmd::Users),
        Command::Acl(AclCmd::Cat(None)),
        Command::Acl(AclCmd::Cat(Some(b("idem")))),
        Command::Acl(AclCmd::Load),
        Command::Acl(AclCmd::Log(None)),
        Command::Acl(AclCmd::Log(Some(5))),
        Command::Acl(AclCmd::LogReset),
        Command::ReadOnly,
        Command::ReadWrite,
    ]
}

/// Declares one marker per command shape, and `marker`, which maps a command
/// to its marker with an exhaustive match (no wildcard arm): a new variant
/// of [`Command`] or of a subcommand enum does not compile until it gets a
/// marker here, and [`all_commands_covers_every_variant`] then fails until
/// [`all_commands`] holds an example of it.
macro_rules! variants {
    ($($marker:literal => $pat:pat,)*) => {
        const MARKERS: &[&str] = &[$($marker),*];

        fn marker(cmd: &Command) -> &'static str {
            match cmd {
                $($pat => $marker,)*
            }
        }
    };
}

variants! {
    "claim" => Command::Claim(_),
    "settle" => Command::Settle(_),
    "complete" => Command::Complete(_),
    "renew" => Command::Renew(_),
    "journal" => Command::Journal(_),
    "release" => Command::Release(_),
    "abandon" => Command::Abandon(_),
    "inspect" => Command::Inspect(_),
    "forget" => Command::Forget(_),
    "ping" => Command::Ping(_),
    "echo" => Command::Echo(_),
    "hello" => Command::Hello(_),
    "auth" => Command::Auth(_),
    "quit" => Command::Quit,
    "info" => Command::Info(_),
    "dbsize" => Command::DbSize,
    "client id" => Command::Client(ClientCmd::Id),
    "client setname" => Command::Client(ClientCmd::SetName(_)),
    "client getname" => Command::Client(ClientCmd::GetName),
    "client list" => Command::Client(ClientCmd::List),
    "client info" => Command::Client(ClientCmd::Info),
    "command" => Command::Command(CommandCmd::All),
    "command count" => Command::Command(CommandCmd::Count),
    "command docs" => Command::Command(CommandCmd::Docs(_)),
    "command info" => Command::Command(CommandCmd::Info(_)),
    "config get" => Command::Config(ConfigCmd::Get(_)),
    "cluster info" => Command::Cluster(ClusterCmd::Info),
    "cluster nodes" => Command::Cluster(ClusterCmd::Nodes),
    "cluster myid" => Command::Cluster(ClusterCmd::MyId),
    "cluster slots" => Command::Cluster(ClusterCmd::Slots),
    "cluster shards" => Command::Cluster(ClusterCmd::Shards),
    "cluster keyslot" => Command::Cluster(ClusterCmd::KeySlot(_)),
    "cluster members" => Command::Cluster(ClusterCmd::Members),
    "cluster add" => Command::Cluster(ClusterCmd::Add { .. }),
    "cluster promote" => Command::Cluster(ClusterCmd::Promote(_)),
    "cluster remove" => Command::Cluster(ClusterCmd::Remove(_)),
    "client setinfo" => Command::Client(ClientCmd::SetInfo { .. }),
    "client kill" => Command::Client(ClientCmd::Kill(_)),
    "select" => Command::Select(_),
    "config reload-tls" => Command::Config(ConfigCmd::ReloadTls),
    "config resetstat" => Command::Config(ConfigCmd::ResetStat),
    "scan" => Command::Scan(_),
    "role" => Command::Role,
    "latency latest" => Command::Latency(LatencyCmd::Latest),
    "latency history command" => Command::Latency(LatencyCmd::History(_)),
    "latency reset" => Command::Latency(LatencyCmd::Reset(_)),
    "latency histogram claim settle" => Command::Latency(LatencyCmd::Histogram(_)),
    "latency doctor" => Command::Latency(LatencyCmd::Doctor),
    "latency help" => Command::Latency(LatencyCmd::Help),
    "acl whoami" => Command::Acl(AclCmd::WhoAmI),
    "acl list" => Command::Acl(AclCmd::List),
    "acl users" => Command::Acl(AclCmd::Users),
    "acl cat" => Command::Acl(AclCmd::Cat(_)),
    "acl load" => Command::Acl(AclCmd::Load),
    "acl log" => Command::Acl(AclCmd::Log(_)),
    "acl log reset" => Command::Acl(AclCmd::LogReset),
    "readonly" => Command::ReadOnly,
    "readwrite" => Command::ReadWrite,
}

#[test]
fn all_commands_covers_every_variant() {
    let listed: Vec<&str> = all_commands().iter().map(marker).collect();
    for (i, m) in MARKERS.iter().enumerate() {
        assert!(!MARKERS[..i].contains(m), "marker {m:?} used twice");
        assert!(
            listed.contains(m),
            "all_commands() has no {m:?} command: add one so it is round-tripped"
        );
    }
}

#[test]
fn command_table_describes_every_command() {
    let cmds = all_commands();
    for cmd in &cmds {
        let spec = cmd.spec();
        // Arity counts the name: exact when positive, a minimum when not.
        let Frame::Array(args) = cmd.to_frame() else {
            panic!("{cmd:?} is not sent as an array")
        };
        let n = args.len() as i64;
        let arity = spec.arity;
        assert!(
            if arity > 0 { n == arity } else { n >= -arity },
            "{cmd:?} has {n} arguments, the table says {arity}"
        );
        // The name on the wire finds this spec, and the key is where the
        // table says it is.
        let Frame::Bulk(name) = &args[0] else {
            panic!("{cmd:?}: name is not a bulk string")
        };
        assert_eq!(crate::spec::lookup(name), Some(spec));
        match cmd.key() {
            Some(key) => assert_eq!(args[spec.key_pos as usize], Frame::Bulk(key.clone())),
            None => assert_eq!(spec.key_pos, 0, "{cmd:?} has no key"),
        }
    }
    for spec in crate::spec::COMMANDS {
        assert!(
            cmds.iter().any(|c| c.name() == spec.name),
            "the table lists {}, which no command in all_commands() has",
            spec.name
        );
    }
}

#[test]
fn every_command_round_trips() {
    for cmd in all_commands() {
        for version in [Version::Resp2, Version::Resp3] {
            let mut wire = BytesMut::new();
            encode(&cmd.to_frame(), version, &mut wire);
            let frame = decode(&mut wire, &Limits::default()).unwrap().unwrap();
            assert!(wire.is_empty());
            assert_eq!(Command::from_frame(frame).unwrap(), cmd);
        }
    }
}

#[test]
fn names_and_options_are_case_insensitive_and_unordered() {
    let a = parse("claim k onexpire recover Lease 5 fp x").unwrap();
    let b = parse("CLAIM k FP x LEASE 5 ONEXPIRE RECOVER").unwrap();
    assert_eq!(a, b);
    assert_eq!(
        parse("complete k 1 v error retain 5").unwrap(),
        parse("COMPLETE k 1 v RETAIN 5 ERROR").unwrap()
    );
}

#[test]
fn bad_commands_get_clear_errors() {
    use CommandError as E;
    assert_eq!(parse("NOPE x"), Err(E::Unknown(b("NOPE"))));
    assert_eq!(parse("CLAIM"), Err(E::WrongArity("claim")));
    assert_eq!(parse("CLAIM k LEASE"), Err(E::MissingValue("LEASE")));
    assert_eq!(parse("CLAIM k LEASE -1"), Err(E::NotAnInteger("LEASE")));
    assert_eq!(parse("CLAIM k LEASE 1x"), Err(E::NotAnInteger("LEASE")));
    assert_eq!(
        parse("CLAIM k LEASE 1 LEASE 2"),
        Err(E::DuplicateOption("LEASE"))
    );
    assert_eq!(
        parse("CLAIM k COLOR red"),
        Err(E::UnknownOption {
            command: "claim",
            option: b("COLOR")
        })
    );
    assert!(matches!(
        parse("CLAIM k ONEXPIRE LATER"),
        Err(E::BadValue { .. })
    ));
    assert_eq!(parse("COMPLETE k 0 v"), Err(E::NotAnInteger("fence")));
    assert_eq!(parse("COMPLETE k x v"), Err(E::NotAnInteger("fence")));
    assert_eq!(parse("COMPLETE k 1"), Err(E::WrongArity("complete")));
    assert_eq!(
        parse("COMPLETE k 1 v ERROR ERROR"),
        Err(E::DuplicateOption("ERROR"))
    );
    assert_eq!(
        parse("RENEW k 1 5"),
        Err(E::Syntax("RENEW key fence LEASE ms"))
    );
    assert_eq!(parse("RENEW k 1 LEASE 5 6"), Err(E::WrongArity("renew")));
    assert_eq!(parse("RELEASE k"), Err(E::WrongArity("release")));
    assert_eq!(parse("INSPECT k x"), Err(E::WrongArity("inspect")));
    assert_eq!(parse("SETTLE k WAIT"), Err(E::MissingValue("WAIT")));
    assert!(matches!(
        parse("CLIENT PAUSE 10"),
        Err(E::UnknownSubcommand { .. })
    ));
    assert!(matches!(
        parse("CONFIG SET a b"),
        Err(E::UnknownSubcommand { .. })
    ));
    assert_eq!(parse("CONFIG GET"), Err(E::WrongArity("config|get")));
    assert_eq!(parse("SELECT x"), Err(E::NotAnInteger("DB index")));
    assert_eq!(parse("SELECT 0 1"), Err(E::WrongArity("select")));
    assert_eq!(parse("ACL LOG x"), Err(E::NotAnInteger("count")));
    assert_eq!(parse("ACL WHOAMI x"), Err(E::WrongArity("acl")));
    assert_eq!(
        parse("LATENCY HISTORY"),
        Err(E::WrongArity("latency|history"))
    );
    assert_eq!(parse("LATENCY LATEST x"), Err(E::WrongArity("latency")));
    assert_eq!(parse("SCAN"), Err(E::WrongArity("scan")));
    assert_eq!(parse("ROLE x"), Err(E::WrongArity("role")));
    assert_eq!(parse("CLIENT KILL"), Err(E::WrongArity("client")));
    assert!(matches!(parse("CLIENT KILL ID 1 ADDR"), Err(E::Syntax(_))));
    assert!(matches!(parse("CLIENT KILL NAME x"), Err(E::Syntax(_))));
    assert_eq!(parse("CLIENT KILL ID x"), Err(E::NotAnInteger("ID")));
    assert!(matches!(
        parse("CLIENT KILL SKIPME maybe"),
        Err(E::BadValue { what: "SKIPME", .. })
    ));
    assert_eq!(parse("SCAN -1"), Err(E::NotAnInteger("cursor")));
    assert_eq!(parse("SCAN 0 COUNT 0"), Err(E::NotAnInteger("COUNT")));
    assert_eq!(parse("SCAN 0 COUNT"), Err(E::MissingValue("COUNT")));
    assert_eq!(
        parse("SCAN 0 MATCH a MATCH b"),
        Err(E::DuplicateOption("MATCH"))
    );
    assert!(matches!(
        parse("SCAN 0 TYPE string"),
        Err(E::UnknownOption {
            command: "scan",
            ..
        })
    ));
    assert!(matches!(
        parse("LATENCY DOCTORX"),
        Err(E::UnknownSubcommand {
            command: "latency",
            ..
        })
    ));
    assert!(matches!(
        parse("ACL SETUSER x"),
        Err(E::UnknownSubcommand { .. })
    ));
    assert!(matches!(
        parse("CLIENT SETINFO LIB-COLOR red"),
        Err(E::Syntax(_))
    ));
    assert!(matches!(
        Command::from_args(vec![b("CLIENT"), b("SETINFO"), b("LIB-NAME"), b("a b")]),
        Err(E::Syntax(_))
    ));
    assert_eq!(
        parse("client setinfo lib-ver 1.8.1"),
        Ok(Command::Client(ClientCmd::SetInfo {
            attr: "lib-ver",
            value: b("1.8.1")
        }))
    );
    assert!(Command::from_args(vec![]).is_err());
    assert_eq!(
        Command::from_frame(crate::Frame::Integer(1)),
        Err(E::NotAnArray)
    );
    assert_eq!(
        Command::from_frame(crate::Frame::Array(vec![crate::Frame::Integer(1)])),
        Err(E::NotAnArray)
    );
}

#[test]
fn error_messages_read_well_and_stay_on_one_line() {
    let e = parse("NOPE\r\nx").unwrap_err().to_string();
    assert_eq!(e, "unknown command 'NOPE\\x0d\\x0ax'");
    assert_eq!(
        parse("CLAIM").unwrap_err().to_string(),
        "wrong number of arguments for 'claim' command"
    );
    assert_eq!(
        parse("CLAIM k LEASE x").unwrap_err().to_string(),
        "LEASE is not an integer or out of range"
    );
}

#[test]
fn scan_takes_a_cursor_match_and_count_in_any_order() {
    assert_eq!(
        parse("SCAN 0"),
        Ok(Command::Scan(Scan {
            cursor: 0,
            pattern: None,
            count: None
        }))
    );
    assert_eq!(
        parse("scan 12 count 5 match a*"),
        Ok(Command::Scan(Scan {
            cursor: 12,
            pattern: Some(b("a*")),
            count: Some(5)
        }))
    );
}
