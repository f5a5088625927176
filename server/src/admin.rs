//! Connection and server commands: HELLO, CLIENT, COMMAND, CONFIG GET and
//! INFO. Nothing here touches records.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use idem_protocol::cmd::{AclCmd, ClientCmd, CommandCmd, ConfigCmd, Hello, LatencyCmd};
use idem_protocol::spec::{COMMANDS, CommandSpec};
use idem_protocol::{ErrorCode, Frame, Reply, ServerError, Version};

use std::sync::Arc;

use crate::acl::{Denial, User};
use crate::cluster_admin::Replication;
use crate::metrics::get;
use crate::node::Node;
use crate::session::Session;

fn err(message: &'static str) -> Reply {
    Reply::Error(ServerError::new(ErrorCode::Err, message))
}

/// The reply to `AUTH` (and `HELLO ... AUTH`) while no password is set.
pub const NO_PASSWORD: &str =
    "AUTH <password> called without any password configured for the default user";

/// `-NOAUTH` for a command before authentication.
pub const NOAUTH: &str = "Authentication required.";

/// `-NOAUTH` for `HELLO` without `AUTH` before authentication.
pub const NOAUTH_HELLO: &str = "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time";

/// `-WRONGPASS`, as Redis words it (clients match on it).
pub const WRONGPASS: &str = "invalid username-password pair or user is disabled.";

/// The user `user` (`None`: the default user) if `password` is one of
/// its own and it is on; else the error to reply with (a refusal is
/// logged for `ACL LOG`).
pub fn check_password(
    node: &Node,
    session: &Session,
    user: Option<&[u8]>,
    password: &[u8],
) -> Result<Arc<User>, ServerError> {
    let acl = node.acl();
    // As in Redis: `AUTH x` while the default user takes no password is a
    // configuration mistake worth saying so (`AUTH default x` is fine).
    if user.is_none() && acl.open() {
        return Err(ServerError::new(ErrorCode::Err, NO_PASSWORD));
    }
    acl.authenticate(user, password).ok_or_else(|| {
        node.log_denial(Denial {
            reason: "auth",
            object: "AUTH".into(),
            username: String::from_utf8_lossy(user.unwrap_or(b"default")).into_owned(),
            client_info: session.info.line(),
        });
        ServerError::new(ErrorCode::WrongPass, WRONGPASS)
    })
}

/// `HELLO`: switches the protocol version and names the connection
/// (authenticating it first when `AUTH` is given).
pub fn hello(node: &Node, session: &mut Session, h: Hello) -> Reply {
    // The version is checked first: a HELLO refused changes nothing.
    if h.version.is_some_and(|v| v != 2 && v != 3) {
        return Reply::Error(ServerError::new(
            ErrorCode::NoProto,
            "unsupported protocol version",
        ));
    }
    if let Some(name) = &h.setname
        && let Err(e) = check_name_len(node, name)
    {
        return e;
    }
    if let Some((user, password)) = &h.auth {
        let epoch = node.acl_epoch();
        match check_password(node, session, Some(user), password) {
            Ok(u) => session.log_in(u, epoch),
            Err(e) => return Reply::Error(e),
        }
    } else if session.user.is_none() {
        return Reply::Error(ServerError::new(ErrorCode::NoAuth, NOAUTH_HELLO));
    }
    match h.version {
        None => {}
        Some(3) => session.version = Version::Resp3,
        // 2: the versions other than 2 and 3 were refused above.
        Some(_) => session.version = Version::Resp2,
    }
    let proto = if session.version == Version::Resp3 {
        3
    } else {
        2
    };
    session.info.resp.store(proto, Ordering::Relaxed);
    if let Some(name) = h.setname {
        *session.info.name.lock() = Some(name);
    }
    let s = |v: &'static str| Frame::Bulk(Bytes::from_static(v.as_bytes()));
    Reply::Frame(Frame::Map(vec![
        (s("server"), s("idem")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Frame::Integer(proto as i64)),
        (s("id"), Frame::Integer(session.info.id as i64)),
        // As INFO's `redis_mode` and `ROLE` say: the raft engine is a
        // cluster (of one or more), and only its leader a master.
        (
            s("mode"),
            s(if node.engine().raft_engine().is_some() {
                "cluster"
            } else {
                "standalone"
            }),
        ),
        (
            s("role"),
            s(match node.engine().raft_engine() {
                Some(raft) if !raft.serving() => "replica",
                _ => "master",
            }),
        ),
        (s("engine"), s(node.engine().kind().as_str())),
        (s("modules"), Frame::Array(vec![])),
    ]))
}

/// `CLIENT ID|SETNAME|GETNAME|LIST|INFO`.
pub fn client(node: &Node, session: &mut Session, c: ClientCmd) -> Reply {
    match c {
        ClientCmd::Id => Reply::Frame(Frame::Integer(session.info.id as i64)),
        ClientCmd::SetName(name) => {
            if let Err(e) = check_name_len(node, &name) {
                return e;
            }
            *session.info.name.lock() = if name.is_empty() { None } else { Some(name) };
            Reply::Ok
        }
        ClientCmd::GetName => Reply::Frame(
            session
                .info
                .name
                .lock()
                .clone()
                .map_or(Frame::Null, Frame::Bulk),
        ),
        ClientCmd::List => Reply::Frame(Frame::Bulk(Bytes::from(node.clients().list()))),
        ClientCmd::Info => Reply::Frame(Frame::Bulk(Bytes::from(session.info.line() + "\n"))),
        ClientCmd::SetInfo { attr, value } => {
            if let Err(e) = check_name_len(node, &value) {
                return e;
            }
            let mut lib = session.info.lib.lock();
            if attr == "lib-name" {
                lib.0 = Some(value);
            } else {
                lib.1 = Some(value);
            }
            Reply::Ok
        }
        ClientCmd::Kill(k) => {
            let me = session.info.id;
            let text =
                |b: &Option<Bytes>| b.as_ref().map(|v| String::from_utf8_lossy(v).into_owned());
            let (addr, laddr, user) = (text(&k.addr), text(&k.laddr), text(&k.user));
            let n = node.clients().kill(|c| {
                !(k.skip_me && c.id == me)
                    && k.id.is_none_or(|id| c.id == id)
                    && addr.as_ref().is_none_or(|a| c.addr.to_string() == *a)
                    && laddr.as_ref().is_none_or(|a| c.laddr.to_string() == *a)
                    && user.as_ref().is_none_or(|u| **c.user.lock() == **u)
            });
            match (k.old_form, n) {
                (true, 0) => err("No such client"),
                (true, _) => Reply::Ok,
                (false, n) => Reply::Frame(Frame::Integer(n as i64)),
            }
        }
        _ => err("unsupported CLIENT subcommand"),
    }
}

/// A connection name, library name or version is kept for the
/// connection's life and shows in every `CLIENT LIST`: at most
/// `max_client_name_bytes`.
fn check_name_len(node: &Node, name: &[u8]) -> Result<(), Reply> {
    let max = node.config().max_client_name_bytes;
    if name.len() > max {
        return Err(Reply::Error(ServerError::owned(
            ErrorCode::Err,
            format!(
                "client names and library info are limited to {max} bytes (max_client_name_bytes)"
            ),
        )));
    }
    Ok(())
}

fn bulk(s: impl Into<Bytes>) -> Frame {
    Frame::Bulk(s.into())
}

fn bulk_str(s: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

/// `ACL WHOAMI|LIST|USERS|CAT|LOAD|LOG`.
pub fn acl(node: &Node, session: &Session, c: AclCmd) -> Reply {
    match c {
        AclCmd::WhoAmI => Reply::Frame(
            session
                .user
                .as_ref()
                .map_or(Frame::Null, |u| bulk_str(u.name())),
        ),
        AclCmd::List => Reply::Frame(Frame::Array(
            node.acl().users().map(|u| bulk(u.describe())).collect(),
        )),
        AclCmd::Users => Reply::Frame(Frame::Array(
            node.acl().users().map(|u| bulk_str(u.name())).collect(),
        )),
        AclCmd::Cat(None) => Reply::Frame(Frame::Array(
            crate::acl::category_names().map(bulk_str).collect(),
        )),
        AclCmd::Cat(Some(name)) => {
            match crate::acl::category_commands(&String::from_utf8_lossy(&name)) {
                Some(cmds) => Reply::Frame(Frame::Array(cmds.into_iter().map(bulk_str).collect())),
                None => Reply::Error(ServerError::owned(
                    ErrorCode::Err,
                    format!("Unknown category '{}'", String::from_utf8_lossy(&name)),
                )),
            }
        }
        AclCmd::Load => {
            // One load at a time: the file read last is the one in force.
            let _one = node.acl_loading().lock();
            match node.config().reload_acl() {
                Ok(acl) => {
                    node.set_acl(acl);
                    Reply::Ok
                }
                Err(e) => Reply::Error(ServerError::owned(ErrorCode::Err, e)),
            }
        }
        AclCmd::LogReset => {
            node.acl_log().lock().reset();
            Reply::Ok
        }
        AclCmd::Log(n) => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let log = node.acl_log().lock();
            let entries = log
                .latest(n.map_or(10, |n| usize::try_from(n).unwrap_or(usize::MAX)))
                .map(|e| {
                    let d = &e.denial;
                    let s = |k: &'static str| Frame::Bulk(Bytes::from_static(k.as_bytes()));
                    Frame::Map(vec![
                        (s("count"), Frame::Integer(e.count as i64)),
                        (s("reason"), bulk_str(d.reason)),
                        (s("context"), s("toplevel")),
                        (s("object"), bulk_str(&d.object)),
                        (s("username"), bulk_str(&d.username)),
                        (
                            s("age-seconds"),
                            Frame::Double(now_ms.saturating_sub(e.created_ms) as f64 / 1000.0),
                        ),
                        (s("client-info"), bulk_str(&d.client_info)),
                        (s("entry-id"), Frame::Integer(e.entry_id as i64)),
                        (s("timestamp-created"), Frame::Integer(e.created_ms as i64)),
                        (
                            s("timestamp-last-updated"),
                            Frame::Integer(e.updated_ms as i64),
                        ),
                    ])
                })
                .collect();
            Reply::Frame(Frame::Array(entries))
        }
        _ => err("unsupported ACL subcommand"),
    }
}

fn command_entry(spec: &CommandSpec) -> Frame {
    let k = i64::from(spec.key_pos);
    Frame::Array(vec![
        Frame::Bulk(Bytes::from_static(spec.name.as_bytes())),
        Frame::Integer(spec.arity),
        Frame::Array(spec.flags.names().map(Frame::simple).collect()),
        Frame::Integer(k),
        Frame::Integer(k),
        Frame::Integer(i64::from(k > 0)),
    ])
}

/// `COMMAND [COUNT|DOCS|INFO ...]`, from the command table.
pub fn command(c: CommandCmd) -> Reply {
    Reply::Frame(match c {
        CommandCmd::All => Frame::Array(COMMANDS.iter().map(command_entry).collect()),
        CommandCmd::Count => Frame::Integer(COMMANDS.len() as i64),
        // No documentation entries: redis-cli then simply shows no hints.
        CommandCmd::Docs(_) => Frame::Map(vec![]),
        CommandCmd::Info(names) => Frame::Array(
            names
                .iter()
                .map(|n| idem_protocol::spec::lookup(n).map_or(Frame::Null, command_entry))
                .collect(),
        ),
        _ => Frame::Array(vec![]),
    })
}

/// `CONFIG GET pattern ...`.
pub fn config(node: &Node, c: ConfigCmd) -> Reply {
    let patterns = match c {
        ConfigCmd::Get(p) => p,
        ConfigCmd::ReloadTls => return reload_tls(node),
        ConfigCmd::ResetStat => {
            node.cmdstats().reset();
            return Reply::Ok;
        }
        _ => return err("unsupported CONFIG subcommand"),
    };
    // Prepared once: lowercased, runs of `*` collapsed, and the count of
    // bytes a key must have at least; so a huge pattern costs one pass, not
    // one per key.
    let patterns: Vec<(Vec<u8>, usize)> = patterns.iter().map(|p| prepare_glob(p)).collect();
    let mut pairs = Vec::new();
    for (k, v) in node.config().raw.entries() {
        if patterns
            .iter()
            .any(|(p, fixed)| *fixed <= k.len() && glob(p, k.as_bytes()))
        {
            pairs.push((
                Frame::Bulk(Bytes::from_static(k.as_bytes())),
                Frame::Bulk(Bytes::from(v)),
            ));
        }
    }
    Reply::Frame(Frame::Map(pairs))
}

/// `LATENCY ...`. There is no latency monitor (Redis's is off by default
/// too), so there are no events; `HISTOGRAM` reads the per-command
/// statistics.
pub fn latency(node: &Node, c: LatencyCmd) -> Reply {
    Reply::Frame(match c {
        LatencyCmd::Latest | LatencyCmd::History(_) => Frame::Array(vec![]),
        LatencyCmd::Reset(_) => Frame::Integer(0),
        LatencyCmd::Histogram(names) => {
            let wanted: Vec<&CommandSpec> = if names.is_empty() {
                COMMANDS.iter().collect()
            } else {
                // Unknown names are left out, as Redis does.
                names
                    .iter()
                    .filter_map(|n| idem_protocol::spec::lookup(n))
                    .collect()
            };
            let mut out = Vec::new();
            for spec in wanted {
                let Some((calls, points)) = node.cmdstats().histogram(spec.id) else {
                    continue;
                };
                let buckets = points
                    .into_iter()
                    .map(|(us, n)| (Frame::Integer(us as i64), Frame::Integer(n as i64)))
                    .collect();
                out.push((
                    Frame::bulk(spec.name),
                    Frame::Map(vec![
                        (Frame::bulk("calls"), Frame::Integer(calls as i64)),
                        (Frame::bulk("histogram_usec"), Frame::Map(buckets)),
                    ]),
                ));
            }
            Frame::Map(out)
        }
        LatencyCmd::Doctor => Frame::Bulk(Bytes::from_static(
            b"Idem has no latency monitor, so there are no latency events to report. \
              Each command's calls and latency percentiles are in INFO commandstats and \
              INFO latencystats, its latency distribution in LATENCY HISTOGRAM; the log's \
              fsync times in INFO persistence (wal_fsync_p50_us, wal_fsync_p99_us).\n",
        )),
        LatencyCmd::Help => Frame::Array(
            [
                "LATENCY <subcommand> [<arg> ...]. Subcommands are:",
                "LATEST",
                "    No events: Idem has no latency monitor.",
                "HISTORY <event>",
                "    No events: Idem has no latency monitor.",
                "RESET [<event> ...]",
                "    Nothing to reset; answers 0.",
                "DOCTOR",
                "    Where to look for latencies.",
                "HISTOGRAM [<command> ...]",
                "    Calls and cumulative latency counts (µs) of the commands named, or of",
                "    every command called. CONFIG RESETSTAT zeroes them.",
                "HELP",
                "    Print this help.",
            ]
            .into_iter()
            .map(Frame::simple)
            .collect(),
        ),
        _ => return err("unsupported LATENCY subcommand"),
    })
}

/// `CONFIG RELOAD-TLS` (and SIGHUP): reads the TLS files again; new
/// connections use them, open ones keep theirs.
pub fn reload_tls(node: &Node) -> Reply {
    let Some(tls) = &node.config().tls else {
        return err("TLS is not configured (tls_listen, tls_cluster)");
    };
    match tls.reload() {
        Ok(()) => {
            tracing::info!("TLS certificates reloaded");
            Reply::Ok
        }
        Err(e) => {
            tracing::warn!(error = %e, "TLS certificates not reloaded: the ones in force stay");
            Reply::Error(ServerError::owned(ErrorCode::Err, e))
        }
    }
}

/// `INFO [section ...]`.
pub fn info(node: &Node, sections: &[Bytes], tls: bool) -> Reply {
    let wanted: Vec<String> = sections
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    Reply::Frame(Frame::Bulk(Bytes::from(info_text(node, &wanted, tls))))
}

/// The sections INFO knows, in the order it gives them.
pub const SECTIONS: [&str; 12] = [
    "server",
    "clients",
    "memory",
    "persistence",
    "replication",
    "stats",
    "cpu",
    "commandstats",
    "errorstats",
    "latencystats",
    "keyspace",
    "cluster",
];

/// The sections left out of a plain `INFO` (and `INFO default`), as Redis
/// leaves them out: they are long.
const NOT_BY_DEFAULT: [&str; 2] = ["commandstats", "latencystats"];

/// The INFO text for the sections asked for: every one for `all` or
/// `everything`, all but [`NOT_BY_DEFAULT`] when `wanted` is empty or holds
/// `default`.
pub fn info_text(node: &Node, wanted: &[String], tls: bool) -> String {
    let every = wanted.iter().any(|w| w == "all" || w == "everything");
    let default = wanted.is_empty() || wanted.iter().any(|w| w == "default");
    let st = node.engine().stats();
    let w = &node.waiters().stats;
    let m = node.metrics();
    let cfg = node.config();
    let mut out = String::new();
    let mut section = |name: &str, body: &dyn Fn(&mut String)| {
        if every || wanted.iter().any(|w| w == name) || (default && !NOT_BY_DEFAULT.contains(&name))
        {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            if name == "cpu" {
                out.push_str("# CPU\r\n");
            } else {
                let _ = write!(out, "# {}{}\r\n", name[..1].to_uppercase(), &name[1..]);
            }
            body(&mut out);
        }
    };
    section("server", &|o| {
        let _ = write!(
            o,
            "idem_version:{}\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:{}\r\nengine:{}\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nshards:{}\r\nworker_threads:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            // What Redis calls it: the raft engine is a cluster (of one or
            // more), as `cluster_enabled` says.
            if node.engine().raft_engine().is_some() {
                "cluster"
            } else {
                "standalone"
            },
            node.engine().kind().as_str(),
            std::process::id(),
            node.run_id(),
            node.local_addr().port(),
            node.started().elapsed().as_secs(),
            cfg.store.shards,
            cfg.worker_threads,
        );
    });
    section("clients", &|o| {
        let _ = write!(
            o,
            "connected_clients:{}\r\nblocked_clients:{}\r\nmaxclients:{}\r\n",
            node.clients().count(),
            node.waiters().parked(),
            cfg.max_connections
        );
    });
    section("memory", &|o| {
        let max = st.limits.map_or(u64::MAX, |l| l.max_memory_bytes);
        let _ = write!(
            o,
            "used_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\nmem_clients_normal:{}\r\nmaxmemory_clients:{}\r\n",
            st.memory,
            max,
            node.clients().owed(),
            cfg.max_client_memory_bytes
        );
        if let Some(rss) = process_rss() {
            let _ = write!(o, "used_memory_rss:{rss}\r\n");
        }
    });
    let raft = node.engine().raft_info();
    section("persistence", &|o| {
        let _ = write!(o, "engine:{}\r\n", node.engine().kind().as_str());
        if let Some((r, dir)) = &raft {
            let per_sync = if r.fsyncs == 0 {
                0.0
            } else {
                r.ops as f64 / r.fsyncs as f64
            };
            let _ = write!(
                o,
                "data_dir:{}\r\nwal_fsyncs:{}\r\nwal_fsyncs_inline:{}\r\nwal_entries:{}\r\nwal_cmds:{}\r\nwal_cmds_per_fsync:{:.2}\r\nwal_fsync_p50_us:{}\r\nwal_fsync_p99_us:{}\r\n",
                dir.display(),
                r.fsyncs,
                r.fsyncs_inline,
                r.entries,
                r.ops,
                per_sync,
                r.fsync_p50_us,
                r.fsync_p99_us
            );
            // Read now (a statvfs): writes are refused below the minimum.
            if let Ok(free) = fs4::available_space(dir) {
                let _ = write!(o, "disk_free_bytes:{free}\r\n");
            }
            let _ = write!(
                o,
                "min_free_disk_bytes:{}\r\ndisk_full_refusals:{}\r\nlog_full_waits:{}\r\n",
                cfg.raft.min_free_disk_bytes, r.disk_full_refusals, r.log_full_waits
            );
        }
    });
    section("replication", &|o| {
        // Redis's fields where the meaning matches: a leader is a master
        // and the members that answered its last call its replicas; any
        // other member a replica of the leader it follows, its link up
        // while it knows one. Offsets are log indexes, not bytes.
        match crate::cluster_admin::replication(node, tls) {
            Replication::Master { offset, replicas } => {
                let _ = write!(o, "role:master\r\nconnected_slaves:{}\r\n", replicas.len());
                for (i, r) in replicas.iter().enumerate() {
                    let _ = write!(
                        o,
                        "slave{i}:ip={},port={},state=online,offset={},lag={}\r\n",
                        r.ip, r.port, r.offset, r.lag_secs
                    );
                }
                let _ = write!(o, "master_repl_offset:{offset}\r\n");
            }
            Replication::Replica {
                host,
                port,
                link_up,
                last_io_secs,
                offset,
                applied,
            } => {
                let _ = write!(
                    o,
                    "role:slave\r\nmaster_host:{host}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\n\
                     master_last_io_seconds_ago:{}\r\nslave_repl_offset:{applied}\r\nslave_read_only:1\r\n\
                     connected_slaves:0\r\nmaster_repl_offset:{offset}\r\n",
                    if link_up { "up" } else { "down" },
                    last_io_secs.map_or(-1, |s| s as i64),
                );
            }
        }
        if let Some((r, _)) = &raft {
            let _ = write!(
                o,
                "raft_term:{}\r\nraft_leader:{}\r\nraft_last_log_index:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\n\
                 raft_snapshot_index:{}\r\nraft_snapshots_built:{}\r\nraft_snapshot_time_sec:{:.3}\r\n\
                 raft_snapshot_pause_ms:{}\r\nraft_snapshot_pause_max_ms:{}\r\n\
                 raft_log_entries:{}\r\nraft_log_bytes:{}\r\nraft_peer_timeouts:{}\r\nraft_quick_elections:{}\r\n\
                 raft_appends_sent:{}\r\nraft_appends_empty:{}\r\nraft_appends_pipelined:{}\r\n\
                 raft_leader_polls:{}\r\nraft_leader_polls_answered:{}\r\n\
                 raft_gathers_expecting:{}\r\nraft_gathers_expecting_met:{}\r\nraft_snapshot_turn_waits:{}\r\n\
                 raft_lease_lapses:{}\r\nraft_lease_held:{}\r\nraft_lease_held_failed:{}\r\nraft_leader_changes:{}\r\nraft_lease_ms:{}\r\n\
                 raft_follower_reads:{}\r\nraft_read_index_rounds:{}\r\nraft_follower_reads_redirected:{}\r\n",
                r.term,
                u8::from(r.leader),
                r.last_log_index,
                r.commit_index,
                r.applied_index,
                r.snapshot_index,
                r.snapshots_built,
                r.snapshot_secs,
                r.snapshot_pause_ms,
                r.snapshot_pause_max_ms,
                r.log_entries,
                r.log_bytes,
                r.peer_timeouts,
                r.quick_elections,
                r.appends_sent,
                r.appends_empty,
                r.appends_pipelined,
                r.leader_polls,
                r.leader_polls_answered,
                r.gathers_expecting,
                r.gathers_expecting_met,
                r.snapshot_turn_waits,
                r.lease_lapses,
                r.lease_held,
                r.lease_held_failed,
                r.leader_changes,
                r.lease_ms,
                r.follower_reads,
                r.read_index_rounds,
                r.follower_reads_redirected
            );
        }
    });
    section("stats", &|o| {
        let c = &st.counters;
        let _ = write!(
            o,
            "total_connections_received:{}\r\nrejected_connections:{}\r\ntotal_commands_processed:{}\r\n\
             claims_acquired:{}\r\nclaims_recovered:{}\r\nreplays:{}\r\nhits_after_wait:{}\r\nwaits_parked:{}\r\n\
             waits_timed_out:{}\r\nwaits_refused:{}\r\ninflight_conflicts:{}\r\nfenced:{}\r\nlease_lapses:{}\r\nmismatches:{}\r\n\
             oom_refusals:{}\r\nrecords_completed:{}\r\nexpired_records:{}\r\nexpired_keys:{}\r\nevicted_keys:0\r\n\
             toobig_refusals:{}\r\n\
             protocol_errors:{}\r\nhttp_refusals:{}\r\noutput_limit_disconnects:{}\r\nclient_budget_disconnects:{}\r\n\
             client_write_timeouts:{}\r\nauth_failures:{}\r\nprotected_mode_refusals:{}\r\n\
             acl_access_denied_auth:{}\r\nacl_access_denied_cmd:{}\r\nacl_access_denied_key:{}\r\n\
             tls_handshake_failures:{}\r\ntotal_error_replies:{}\r\n\
             keyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\n",
            get(&m.connections),
            get(&m.rejected),
            get(&m.commands),
            c.acquired,
            c.recovered,
            c.replays,
            w.hits_after_wait.load(Ordering::Relaxed),
            w.parked_total.load(Ordering::Relaxed),
            w.timed_out.load(Ordering::Relaxed),
            w.refused.load(Ordering::Relaxed),
            c.conflicts,
            c.fenced,
            c.lapses,
            c.mismatches,
            c.oom,
            c.completed,
            c.expired,
            c.dropped,
            get(&m.toobig),
            get(&m.protocol_errors),
            get(&m.http_refusals),
            get(&m.output_limit_disconnects),
            node.clients().evictions(),
            get(&m.write_timeouts),
            get(&m.auth_failures),
            get(&m.protected_mode_refusals),
            get(&m.auth_failures),
            get(&m.acl_denied_cmd),
            get(&m.acl_denied_key),
            get(&m.tls_handshake_failures),
            node.cmdstats().error_replies(),
            // A claim that found a record (a duplicate: replayed, in
            // flight, recovered, mismatched) is a hit; one that found none
            // and took the key is a miss.
            c.replays + c.conflicts + c.recovered + c.mismatches,
            c.acquired,
            node.cmdstats().net().0,
            node.cmdstats().net().1,
        );
    });
    section("cpu", &|o| {
        if let Some((user, sys)) = process_cpu() {
            let _ = write!(
                o,
                "used_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n\
                 used_cpu_sys_children:0.000000\r\nused_cpu_user_children:0.000000\r\n"
            );
        }
    });
    section("commandstats", &|o| node.cmdstats().write_commandstats(o));
    section("errorstats", &|o| node.cmdstats().write_errorstats(o));
    section("latencystats", &|o| node.cmdstats().write_latencystats(o));
    section("keyspace", &|o| {
        let _ = write!(
            o,
            "records:{}\r\nrecords_in_flight:{}\r\nrecords_abandoned:{}\r\nrecords_completed_now:{}\r\nlast_fence:{}\r\napplied_index:{}\r\n",
            st.records, st.in_flight, st.abandoned, st.completed, st.last_fence, st.applied_index
        );
        // Redis's line, which monitoring (redis_exporter's
        // `redis_db_keys`) reads. Every record expires (its lease or its
        // retention ends), and Redis leaves an empty database out.
        if st.records > 0 {
            let _ = write!(o, "db0:keys={0},expires={0},avg_ttl=0\r\n", st.records);
        }
    });
    // Redis's field: cluster clients (redis-py's RedisCluster) check it
    // before CLUSTER SLOTS. The raft engine is a cluster, of one or more.
    section("cluster", &|o| {
        let _ = write!(
            o,
            "cluster_enabled:{}\r\n",
            u8::from(node.engine().raft_engine().is_some())
        );
    });
    out
}

/// This process's user and system CPU time since start, in seconds (from
/// `/proc/self/stat`; `None` where there is none).
pub(crate) fn process_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name (in parentheses, which may hold spaces) come
    // the state (field 3) and on: utime is field 14, stime field 15.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let user: u64 = fields.nth(11)?.parse().ok()?;
    let sys: u64 = fields.next()?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
    Some((user as f64 / hz, sys as f64 / hz))
}

/// This process's resident memory in bytes (from `/proc/self/statm`).
pub(crate) fn process_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

/// The Redis version INFO reports, for tools that check it.
const REDIS_VERSION: &str = "7.0.0";

/// Glob matching with `*` and `?` (as `CONFIG GET` patterns use).
/// A pattern lowercased with runs of `*` collapsed, and how many bytes a
/// text must have to match it.
fn prepare_glob(pattern: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(pattern.len().min(256));
    for &c in pattern {
        if !(c == b'*' && out.last() == Some(&b'*')) {
            out.push(c.to_ascii_lowercase());
        }
    }
    let fixed = out.iter().filter(|&&c| c != b'*').count();
    (out, fixed)
}

fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = t;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            t = mark;
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_like_redis() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"max_*_ms", b"max_wait_ms"));
        assert!(glob(b"max_?ait_ms", b"max_wait_ms"));
        assert!(!glob(b"max_*", b"listen"));
        assert!(glob(b"listen", b"listen"));
        assert!(!glob(b"liste", b"listen"));
    }

    /// A 1 MiB pattern is looked at once, not once per key: stars collapse
    /// to one, and a pattern needing more bytes than a key has is skipped.
    #[test]
    fn a_huge_config_get_pattern_is_cheap() {
        let (p, fixed) = super::prepare_glob(&vec![b'*'; 1 << 20]);
        assert_eq!((p.as_slice(), fixed), (&b"*"[..], 0));
        assert!(glob(&p, b"max_wait_ms"));
        let mut long = vec![b'A'; 1 << 20];
        long.push(b'*');
        let (p, fixed) = super::prepare_glob(&long);
        assert_eq!(fixed, 1 << 20);
        assert_eq!(p[0], b'a');
        let (p, _) = super::prepare_glob(b"MAX_**_MS");
        assert_eq!(p, b"max_*_ms");
        assert!(glob(&p, b"max_wait_ms"));
    }
}
