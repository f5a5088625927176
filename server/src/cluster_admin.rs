//! `CLUSTER`: the cluster in Redis Cluster's formats, so that stock cluster
//! clients (`redis-cli -c`, redis-py's `RedisCluster`, redis-rs's cluster
//! client) find the leader, and Idem's membership commands.
//!
//! One Raft group owns the whole key space: the leader is shown as the
//! master of all 16384 slots, every other member as its replica. Node ids
//! are the member id in 40 hex digits (`000…0001` for node 1), stable for
//! the life of the member.

use std::fmt::Write;

use bytes::Bytes;
use idem_protocol::{ClusterCmd, ErrorCode, Frame, Reply, ServerError, key_slot};
use openraft::ServerState;

use crate::dispatch::Action;
use crate::engine::raft::MembershipChange;
use crate::engine::raft::cluster::{
    ChangeError, ClusterView, MemberAddr, MemberView, client_addr_for,
};
use crate::node::Node;

/// Redis's reply where cluster mode is off.
const DISABLED: &str = "This instance has cluster support disabled";

/// The 40-hex Redis Cluster id of member `id`.
pub fn hex_id(id: u64) -> String {
    format!("{id:040x}")
}

fn bulk(s: impl Into<String>) -> Frame {
    Frame::Bulk(Bytes::from(s.into()))
}

fn host_port(addr: &str) -> (String, u16) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_owned(),
            p.parse().unwrap_or(0),
        ),
        None => (addr.to_owned(), 0),
    }
}

fn role_name(v: &ClusterView, m: &MemberView) -> &'static str {
    if Some(m.id) == v.leader {
        "leader"
    } else if !m.voter {
        "learner"
    } else if m.id == v.me && v.state == ServerState::Candidate {
        "candidate"
    } else {
        "follower"
    }
}

/// A replica as the leader sees it (`ROLE`, `INFO replication`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLink {
    /// Its client address's host.
    pub ip: String,
    /// Its client address's port.
    pub port: u16,
    /// The log index replicated to it (Redis's replication offset counts
    /// bytes; Idem's counts log entries).
    pub offset: u64,
    /// Whole seconds since it last answered the leader.
    pub lag_secs: u64,
}

/// This node's part in replication, in Redis's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replication {
    /// The leader (a single node and the memory engine included): what it
    /// replicates to.
    Master {
        /// Its last log index (0 for the memory engine, which has no log).
        offset: u64,
        /// The members that answer it ([`MemberView::answering`]), in id
        /// order.
        replicas: Vec<ReplicaLink>,
    },
    /// Any other member: the leader it follows, or last followed.
    Replica {
        /// That leader's client address's host (empty if it never knew one).
        host: String,
        /// That leader's client address's port (0 if it never knew one).
        port: u16,
        /// Whether it knows a leader now.
        link_up: bool,
        /// Whole seconds since that leader last sent it an AppendEntries
        /// (`None`: while no leader is known, or none was heard from).
        last_io_secs: Option<u64>,
        /// Its last log index.
        offset: u64,
        /// Its last applied index.
        applied: u64,
    },
}

/// This node's [`Replication`]; `tls`: for a client of the TLS listener
/// (addresses shown are the TLS ones).
pub fn replication(node: &Node, tls: bool) -> Replication {
    let Some(raft) = node.engine().raft_engine() else {
        return Replication::Master {
            offset: 0,
            replicas: Vec::new(),
        };
    };
    let v = raft.cluster_view();
    let addr_of = |id| {
        v.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| host_port(client_addr_for(&m.addr.client, tls)))
    };
    // The leader once it serves (as HELLO says); a removed node may still
    // believe it leads: it is no one's master.
    if v.state == ServerState::Leader && v.serving && !v.removed {
        let replicas = v
            .members
            .iter()
            .filter(|m| m.id != v.me && !m.addr.client.is_empty() && m.answering())
            .map(|m| {
                let (ip, port) = host_port(client_addr_for(&m.addr.client, tls));
                ReplicaLink {
                    ip,
                    port,
                    offset: m.matched.unwrap_or(0),
                    lag_secs: m.reach.and_then(|(_, ago)| ago).map_or(0, |d| d.as_secs()),
                }
            })
            .collect();
        return Replication::Master {
            offset: v.last_log_index,
            replicas,
        };
    }
    // Never itself (a leader that stepped down, a removed node).
    let (host, port) = v
        .last_leader
        .filter(|l| *l != v.me)
        .and_then(addr_of)
        .unwrap_or_default();
    let link_up = !v.removed && v.leader.is_some_and(|l| l != v.me);
    Replication::Replica {
        host,
        port,
        link_up,
        last_io_secs: v.leader_heard.filter(|_| link_up).map(|d| d.as_secs()),
        offset: v.last_log_index,
        applied: v.applied_index,
    }
}

/// `ROLE`, in Redis's shape: `master`, its offset and its replicas (host,
/// port and offset as bulk strings), or `slave`, its leader's host and
/// port, `connected` (or `connect` while no leader is known) and its
/// offset (the last applied index).
pub fn role(node: &Node, tls: bool) -> Reply {
    Reply::Frame(match replication(node, tls) {
        Replication::Master { offset, replicas } => Frame::Array(vec![
            bulk("master"),
            Frame::Integer(offset as i64),
            Frame::Array(
                replicas
                    .into_iter()
                    .map(|r| {
                        Frame::Array(vec![
                            bulk(r.ip),
                            bulk(r.port.to_string()),
                            bulk(r.offset.to_string()),
                        ])
                    })
                    .collect(),
            ),
        ]),
        Replication::Replica {
            host,
            port,
            link_up,
            applied,
            ..
        } => Frame::Array(vec![
            bulk("slave"),
            bulk(host),
            Frame::Integer(i64::from(port)),
            bulk(if link_up { "connected" } else { "connect" }),
            Frame::Integer(applied as i64),
        ]),
    })
}

/// Runs a `CLUSTER` subcommand; `tls`: for a client of the TLS listener
/// (addresses shown are the TLS ones).
pub fn cluster(node: &Node, c: ClusterCmd, tls: bool) -> Action {
    if let ClusterCmd::KeySlot(key) = &c {
        return Action::Reply(Reply::Frame(Frame::Integer(i64::from(key_slot(key)))));
    }
    let Some(raft) = node.engine().raft_engine() else {
        return Action::Reply(Reply::Error(ServerError::new(ErrorCode::Err, DISABLED)));
    };
    let mut view = raft.cluster_view();
    for m in &mut view.members {
        m.addr.client = client_addr_for(&m.addr.client, tls).to_owned();
    }
    let reply = match c {
        ClusterCmd::Info => {
            let info = raft.info();
            Frame::Bulk(Bytes::from(info_text(&view, info.commit_index)))
        }
        ClusterCmd::Nodes => Frame::Bulk(Bytes::from(nodes_text(&view))),
        ClusterCmd::MyId => bulk(hex_id(view.me)),
        ClusterCmd::Slots => slots(&view),
        ClusterCmd::Shards => shards(&view),
        ClusterCmd::Members => members(&view),
        ClusterCmd::Add { id, peer, client } => {
            let addr = MemberAddr {
                client: String::from_utf8_lossy(&client).into_owned(),
                peer: String::from_utf8_lossy(&peer).into_owned(),
                retired: Default::default(),
                inc: None,
            };
            return change(node, MembershipChange::Add { id, addr });
        }
        ClusterCmd::Promote(id) => return change(node, MembershipChange::Promote(id)),
        ClusterCmd::Remove(id) => return change(node, MembershipChange::Remove(id)),
        // KEYSLOT is answered above, by every engine.
        _ => {
            return Action::Reply(Reply::Error(ServerError::new(
                ErrorCode::Err,
                "unknown CLUSTER subcommand",
            )));
        }
    };
    Action::Reply(Reply::Frame(reply))
}

fn change(node: &Node, change: MembershipChange) -> Action {
    let node = node.clone();
    Action::Pending(Box::pin(async move {
        let Some(raft) = node.engine().raft_engine() else {
            return Reply::Error(ServerError::new(ErrorCode::Err, DISABLED));
        };
        match raft.change(change).await {
            Ok(()) => Reply::Ok,
            Err(ChangeError::NotLeader(e)) => Reply::Error(e.to_server_error()),
            Err(ChangeError::Refused(why)) => Reply::Error(ServerError::owned(ErrorCode::Err, why)),
            Err(ChangeError::Unsure(why)) => {
                Reply::Error(ServerError::owned(ErrorCode::TryAgain, why))
            }
        }
    }))
}

/// `CLUSTER INFO`: Redis's fields first, then Idem's.
pub fn info_text(v: &ClusterView, commit_index: u64) -> String {
    let me = v
        .members
        .iter()
        .find(|m| m.id == v.me)
        .filter(|_| !v.removed);
    // A node outside the membership (removed, or not added yet) is not
    // part of a working cluster, whatever leader it last knew.
    // Nor is a leader no majority has answered for longer than an
    // election takes.
    let ok = v.leader.is_some() && me.is_some() && !v.quorum_lost && !v.leader_lost;
    let leader_addr = v
        .leader
        .and_then(|l| v.members.iter().find(|m| m.id == l))
        .map(|m| m.addr.client.clone())
        .unwrap_or_default();
    // Host and port on lines of their own: no value holds a `:` (as in
    // Redis's), since clients split each line on every one of them
    // (redis-py's `cluster_info()` fails on a third part).
    let (leader_host, leader_port) = leader_addr.rsplit_once(':').unwrap_or(("", ""));
    let role = match me {
        Some(m) => role_name(v, m),
        None => "none",
    };
    // As Redis counts them: a slot is assigned while a node (here, the
    // last leader known) holds it, ok unless that node failed; the
    // cluster's size counts the masters holding slots, failed or not.
    let assigned = me.is_some()
        && v.last_leader
            .is_some_and(|l| v.members.iter().any(|m| m.id == l));
    let mut o = String::new();
    let _ = write!(
        o,
        "cluster_state:{}\r\ncluster_slots_assigned:{}\r\ncluster_slots_ok:{}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{}\r\n\
         cluster_known_nodes:{}\r\ncluster_size:{}\r\ncluster_current_epoch:{}\r\ncluster_my_epoch:{}\r\n\
         idem_node_id:{}\r\nidem_role:{}\r\nidem_leader_id:{}\r\nidem_leader_host:{}\r\nidem_leader_port:{}\r\n\
         idem_commit_index:{}\r\nidem_applied_index:{}\r\nidem_last_log_index:{}\r\nidem_voters:{}\r\nidem_learners:{}\r\nidem_retired:{}\r\nidem_membership:{}\r\nidem_cluster_id:{}\r\n",
        if ok { "ok" } else { "fail" },
        if assigned || ok { 16384 } else { 0 },
        if ok { 16384 } else { 0 },
        if assigned && !ok { 16384 } else { 0 },
        v.members.len(),
        u8::from(assigned || ok),
        v.term,
        v.term,
        v.me,
        role,
        v.leader.map_or(String::new(), |l| l.to_string()),
        leader_host,
        leader_port,
        commit_index,
        v.applied_index,
        v.last_log_index,
        v.members.iter().filter(|m| m.voter).count(),
        v.members.iter().filter(|m| !m.voter).count(),
        v.retired,
        if v.joint { "joint" } else { "uniform" },
        v.cluster_id.clone().unwrap_or_default(),
    );
    o
}

/// `CLUSTER NODES`: one line per member, in Redis's format:
/// `id ip:port@cport flags master ping-sent pong-recv config-epoch
/// link-state slot...`. `pong-recv` is when the member last answered this
/// node (unix ms; `0` for this node itself, as Redis shows it; now for a
/// member whose answers this node does not track: only the leader calls
/// every member), and `ping-sent`, for a member that did not answer this
/// node's last call, when it last answered (now if it never did; `0` for
/// the others).
pub fn nodes_text(v: &ClusterView) -> String {
    let shown = v.last_leader;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut o = String::new();
    for m in v.members.iter().filter(|m| !m.addr.client.is_empty()) {
        let (ip, port) = host_port(&m.addr.client);
        let (_, cport) = host_port(&m.addr.peer);
        let leads = Some(m.id) == shown;
        let mut flags = String::new();
        if m.id == v.me {
            flags.push_str("myself,");
        }
        flags.push_str(if leads || shown.is_none() {
            "master"
        } else {
            "slave"
        });
        let unreachable = matches!(m.reach, Some((false, _)));
        if (leads && v.leader.is_none()) || unreachable {
            // The leader that failed, until another is elected; a member
            // that did not answer this node's last call.
            flags.push_str(",fail?");
        }
        let master = match shown {
            Some(l) if !leads => hex_id(l),
            _ => "-".into(),
        };
        let answered_ms = match m.reach {
            _ if m.id == v.me => 0,
            Some((_, Some(ago))) => now_ms.saturating_sub(ago.as_millis()),
            Some((_, None)) => 0,
            None => now_ms,
        };
        // A call waits for its answer (Redis: a ping not answered yet).
        let ping_sent_ms = match (unreachable, answered_ms) {
            (false, _) => 0,
            (true, 0) => now_ms,
            (true, at) => at,
        };
        let _ = write!(
            o,
            "{} {ip}:{port}@{cport} {flags} {master} {ping_sent_ms} {answered_ms} {} {}",
            hex_id(m.id),
            if leads { v.term } else { 0 },
            if unreachable {
                "disconnected"
            } else {
                "connected"
            }
        );
        if leads {
            o.push_str(" 0-16383");
        }
        o.push('\n');
    }
    o
}

fn node_entry(m: &MemberView) -> Frame {
    let (ip, port) = host_port(&m.addr.client);
    Frame::Array(vec![
        bulk(ip),
        Frame::Integer(i64::from(port)),
        bulk(hex_id(m.id)),
    ])
}

/// `CLUSTER SLOTS`: one range, 0-16383, served by the leader, with every
/// other member as a replica. While an election runs, the last leader
/// known (as Redis Cluster shows a failed master until its replacement is
/// elected: clients then retry and refresh). Empty if none was ever known.
fn slots(v: &ClusterView) -> Frame {
    let Some(leader) = v
        .last_leader
        .and_then(|l| v.members.iter().find(|m| m.id == l))
    else {
        return Frame::Array(vec![]);
    };
    let mut range = vec![Frame::Integer(0), Frame::Integer(16383), node_entry(leader)];
    range.extend(
        v.members
            .iter()
            .filter(|m| m.id != leader.id && !m.addr.client.is_empty())
            .map(node_entry),
    );
    Frame::Array(vec![Frame::Array(range)])
}

/// `CLUSTER SHARDS`: one shard, Redis 7's shape, the (last known) leader
/// first, as in `CLUSTER SLOTS`.
fn shards(v: &ClusterView) -> Frame {
    let mut members: Vec<&MemberView> = v
        .members
        .iter()
        .filter(|m| !m.addr.client.is_empty())
        .collect();
    members.sort_by_key(|m| Some(m.id) != v.last_leader);
    let nodes = members
        .into_iter()
        .map(|m| {
            let (ip, port) = host_port(&m.addr.client);
            let leads = Some(m.id) == v.last_leader;
            Frame::Map(vec![
                (bulk("id"), bulk(hex_id(m.id))),
                (bulk("port"), Frame::Integer(i64::from(port))),
                (bulk("ip"), bulk(ip.clone())),
                (bulk("endpoint"), bulk(ip)),
                (bulk("role"), bulk(if leads { "master" } else { "replica" })),
                (
                    bulk("replication-offset"),
                    Frame::Integer(m.matched.unwrap_or(0) as i64),
                ),
                (
                    bulk("health"),
                    // As `CLUSTER NODES` flags it `fail?`.
                    bulk(
                        if (leads && v.leader.is_none()) || matches!(m.reach, Some((false, _))) {
                            "failed"
                        } else {
                            "online"
                        },
                    ),
                ),
            ])
        })
        .collect();
    let slots = if v.last_leader.is_some() {
        vec![Frame::Integer(0), Frame::Integer(16383)]
    } else {
        vec![]
    };
    Frame::Array(vec![Frame::Map(vec![
        (bulk("slots"), Frame::Array(slots)),
        (bulk("nodes"), Frame::Array(nodes)),
    ])])
}

/// `CLUSTER MEMBERS`: one map per member: id, addresses, voter or
/// learner, its Raft role, the incarnation of its data directory (once the
/// leader reached it), match index and lag (known on the leader; -1
/// elsewhere).
fn members(v: &ClusterView) -> Frame {
    Frame::Array(
        v.members
            .iter()
            .map(|m| {
                let lag = m
                    .matched
                    .map_or(-1, |i| v.last_log_index.saturating_sub(i) as i64);
                Frame::Map(vec![
                    (bulk("id"), Frame::Integer(m.id as i64)),
                    (bulk("client_addr"), bulk(m.addr.client.clone())),
                    (bulk("peer_addr"), bulk(m.addr.peer.clone())),
                    (
                        bulk("membership"),
                        bulk(if m.voter { "voter" } else { "learner" }),
                    ),
                    (bulk("role"), bulk(role_name(v, m))),
                    (
                        bulk("incarnation"),
                        bulk(m.addr.inc.map_or(String::new(), |i| format!("{i:016x}"))),
                    ),
                    (
                        bulk("match_index"),
                        Frame::Integer(m.matched.map_or(-1, |i| i as i64)),
                    ),
                    (bulk("lag"), Frame::Integer(lag)),
                    (
                        bulk("reachable"),
                        bulk(match m.reach {
                            _ if m.id == v.me => "self",
                            Some((true, _)) => "yes",
                            Some((false, _)) => "no",
                            None => "unknown",
                        }),
                    ),
                    (
                        bulk("last_answer_ms"),
                        Frame::Integer(
                            m.reach
                                .and_then(|(_, ago)| ago)
                                .map_or(-1, |d| d.as_millis() as i64),
                        ),
                    ),
                ])
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use openraft::ServerState;

    use super::*;
    use crate::engine::raft::cluster::{IdSet, MemberAddr};

    fn view(leader: u64) -> ClusterView {
        let members = (1..=3)
            .map(|id| MemberView {
                id,
                addr: MemberAddr::parse(&format!(
                    "127.0.0.1:{}@127.0.0.1:{}",
                    7000 + id,
                    17000 + id
                )),
                voter: true,
                matched: Some(10),
                reach: Some((true, None)),
            })
            .collect();
        ClusterView {
            me: leader,
            leader: Some(leader),
            last_leader: Some(leader),
            serving: true,
            state: ServerState::Leader,
            term: 3,
            cluster_id: None,
            last_log_index: 10,
            applied_index: 10,
            members,
            retired: IdSet::default(),
            leader_lost: false,
            joint: false,
            removed: false,
            quorum_lost: false,
            leader_heard: None,
        }
    }

    /// The client ports of the nodes `CLUSTER SLOTS` and `CLUSTER SHARDS`
    /// list, in their order (the only integers from 7001 to 7003 there).
    fn ports(f: &Frame) -> Vec<i64> {
        match f {
            Frame::Array(items) => items.iter().flat_map(ports).collect(),
            Frame::Map(pairs) => pairs.iter().flat_map(|(_, v)| ports(v)).collect(),
            Frame::Integer(p) if (7001..=7003).contains(p) => vec![*p],
            _ => vec![],
        }
    }

    #[test]
    fn slots_and_shards_list_the_leader_first() {
        for leader in 1..=3 {
            let v = view(leader);
            let first = 7000 + leader as i64;
            assert_eq!(
                ports(&slots(&v))[0],
                first,
                "CLUSTER SLOTS, leader {leader}"
            );
            let sh = ports(&shards(&v));
            assert_eq!(sh.len(), 3);
            assert_eq!(sh[0], first, "CLUSTER SHARDS, leader {leader}: {sh:?}");
        }
    }

    /// `CLUSTER INFO`'s `field` as a number.
    fn field(text: &str, name: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Redis's arithmetic: failed slots are assigned slots; a cluster
    /// whose leader failed still has its slots assigned (to that leader)
    /// and its size; a node that never knew a leader has none assigned.
    #[test]
    fn cluster_info_counts_slots_as_redis_does() {
        let counts = |v: &ClusterView| {
            let t = info_text(v, 10);
            [
                "cluster_slots_assigned",
                "cluster_slots_ok",
                "cluster_slots_fail",
                "cluster_size",
            ]
            .map(|f| field(&t, f))
        };
        assert_eq!(counts(&view(1)), [16384, 16384, 0, 1], "serving");

        let mut down = view(1);
        down.me = 2;
        down.leader = None;
        down.serving = false;
        down.state = ServerState::Candidate;
        assert!(info_text(&down, 10).contains("cluster_state:fail"));
        assert_eq!(counts(&down), [16384, 0, 16384, 1], "leader lost");

        let mut never = down.clone();
        never.last_leader = None;
        assert_eq!(counts(&never), [0, 0, 0, 0], "no leader ever known");

        let mut gone = down.clone();
        gone.last_leader = Some(9);
        assert_eq!(
            counts(&gone),
            [0, 0, 0, 0],
            "a last leader no longer a member"
        );

        let mut removed = down;
        removed.removed = true;
        assert_eq!(counts(&removed), [0, 0, 0, 0], "removed");
    }
}
