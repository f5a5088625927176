//! Clusters of real idemd processes on loopback: bootstrap, routing the way
//! Redis Cluster clients route, failover without losing a record, nodes
//! that rejoin, and nodes that must not.
//!
//! The tests that slow a node's disk, cut it off from its peers or skew its
//! wall clock need the fault switches only debug builds of idemd have: they
//! run in debug builds (`cargo test`) and are left out of release ones.

use std::time::Duration;

use idem_protocol::{ClaimReply, Frame, Outcome, key_slot};

#[cfg(debug_assertions)]
use crate::support::cluster::SlowSyncs;
use crate::support::cluster::{Cluster, Member, acquire_served, assert_completed, cmd_served};
use crate::support::*;
use crate::t07_redis_tools::sample;

/// The `-MOVED` target of an error reply.
fn moved(f: &Frame) -> (u16, String) {
    let e = err(f);
    let mut parts = e.split_whitespace();
    assert_eq!(parts.next(), Some("MOVED"), "expected -MOVED, got {e}");
    let slot = parts.next().unwrap().parse().unwrap();
    (slot, parts.next().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_bootstraps_and_followers_redirect_like_redis_cluster() {
    let c = Cluster::start("boot", 3).await;
    let l = c.leader().await;
    let leader = &c.members[l];
    // Every member agrees on the membership and the cluster id.
    let id = leader.info("idem_cluster_id").await;
    assert_eq!(id.len(), 32, "a 16-byte cluster id in hex");
    for m in &c.members {
        assert_eq!(m.info("idem_cluster_id").await, id);
        assert_eq!(m.info("cluster_known_nodes").await, "3");
        assert_eq!(m.info("cluster_state").await, "ok");
        assert_eq!(m.info("idem_voters").await, "3");
        assert_eq!(
            m.info("idem_leader_host").await,
            leader.client.ip().to_string()
        );
        assert_eq!(
            m.info("idem_leader_port").await,
            leader.client.port().to_string()
        );
    }
    assert_eq!(leader.info("idem_role").await, "leader");
    for f in c.followers().await {
        let m = &c.members[f];
        assert_eq!(m.info("idem_role").await, "follower");
        let mut conn = m.conn().await;
        // Writes and reads alike name the leader and the key's slot,
        // hash tags included.
        for (args, k) in [
            (vec!["CLAIM", "order-{7}-a", "LEASE", "5000"], "order-{7}-a"),
            (vec!["INSPECT", "x"], "x"),
            (vec!["SETTLE", "y", "WAIT", "100"], "y"),
        ] {
            let r = conn.cmd(&args).await;
            assert_eq!(
                moved(&r),
                (key_slot(k.as_bytes()), leader.client.to_string()),
                "{args:?}"
            );
        }
        assert_eq!(key_slot(b"order-{7}-a"), key_slot(b"7"));
        // CLUSTER MYID and NODES in Redis's formats.
        let myid = bulk(&conn.cmd(&["CLUSTER", "MYID"]).await);
        assert_eq!(myid, format!("{:040x}", m.id));
        let nodes = bulk(&conn.cmd(&["CLUSTER", "NODES"]).await);
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 3, "{nodes}");
        for line in &lines {
            let f: Vec<&str> = line.split(' ').collect();
            assert!(f.len() >= 8, "{line}");
            assert_eq!(f[0].len(), 40);
            let me = f[0] == myid;
            assert_eq!(f[2].contains("myself"), me, "{line}");
            let is_leader = f[0] == format!("{:040x}", leader.id);
            if is_leader {
                assert!(f[2].ends_with("master"), "{line}");
                assert_eq!(f[3], "-");
                assert_eq!(f[8], "0-16383");
                assert_eq!(
                    f[1],
                    format!("{}@{}", leader.client, leader.peer.port()),
                    "ip:port@cport"
                );
            } else {
                assert!(f[2].ends_with("slave"), "{line}");
                assert_eq!(f[3], format!("{:040x}", leader.id));
                assert_eq!(f.len(), 8, "a replica serves no slots: {line}");
            }
            assert_eq!(f[7], "connected");
        }
        // CLUSTER SLOTS: one range, the leader first, then its replicas.
        let Frame::Array(ranges) = conn.cmd(&["CLUSTER", "SLOTS"]).await else {
            panic!("CLUSTER SLOTS is an array")
        };
        assert_eq!(ranges.len(), 1);
        let Frame::Array(r) = &ranges[0] else {
            panic!("a range is an array")
        };
        assert_eq!((int(&r[0]), int(&r[1])), (0, 16383));
        assert_eq!(r.len(), 5, "range, leader and two replicas");
        let Frame::Array(first) = &r[2] else { panic!() };
        assert_eq!(int(&first[1]), i64::from(leader.client.port()));
    }
    // Without cluster_secret (loopback), no member off this host: the log
    // would go to whatever answers there, unauthenticated.
    let r = leader
        .conn()
        .await
        .cmd(&["CLUSTER", "ADD", "9", "10.1.2.3:17304", "10.1.2.3:7304"])
        .await;
    let e = err(&r);
    assert!(e.starts_with("ERR") && e.contains("cluster_secret"), "{e}");
    // Nothing can be reached at port 0 or at an unspecified host (port 0
    // was taken: a learner never reached).
    for (peer, client) in [
        ("127.0.0.1:0", "127.0.0.1:7304"),
        ("127.0.0.1:17304", "127.0.0.1:0"),
        ("127.0.0.1:17304", "0.0.0.0:7304"),
        ("127.0.0.1:17304", "[::ffff:0.0.0.0]:7304"),
        ("127.0.0.1:17304", "224.0.0.1:7304"),
    ] {
        let r = leader
            .conn()
            .await
            .cmd(&["CLUSTER", "ADD", "9", peer, client])
            .await;
        let e = err(&r);
        assert!(
            e.starts_with("ERR") && e.contains("can be reached"),
            "{peer} {client}: {e}"
        );
    }
    assert_eq!(leader.info("cluster_known_nodes").await, "3");
}

/// A member's `INFO replication` field `name`.
async fn replication_field(m: &Member, name: &str) -> String {
    let text = bulk(&m.conn().await.cmd(&["INFO", "replication"]).await);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .trim()
        .to_owned()
}

/// `ROLE` and `INFO replication` said nothing of where the leader was or
/// which replicas it had (no `master_host`/`master_port`, no `slaveN`
/// lines, `ROLE` unknown): redis_exporter's replication metrics
/// (`redis_master_link_up`, `redis_connected_slave_offset_bytes`, ...)
/// came out without the addresses that tell them apart, and tools that
/// ask `ROLE` for a node's part found none. Now both answer as a Redis
/// primary and its replicas do, through a failover too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_and_info_replication_name_the_leader_and_its_replicas_as_redis_does() {
    let (mut c, metrics) = Cluster::start_with_metrics("role", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    for i in 0..5 {
        conn.acquire(&["CLAIM", &format!("role-{i}")]).await;
    }
    c.followers_apply_what_leader_committed(l, "the claims reach the followers")
        .await;
    let leader = &c.members[l];
    let followers = c.followers().await;
    let ports = |idx: &[usize]| -> Vec<u16> {
        let mut p: Vec<u16> = idx.iter().map(|&i| c.members[i].client.port()).collect();
        p.sort_unstable();
        p
    };
    // The leader: a master with the two followers as its replicas, each
    // at the leader's own offset once the leader has heard they have
    // everything.
    let last: i64 = leader.info("idem_last_log_index").await.parse().unwrap();
    let role = eventually("the leader knows both replicas have it all", async || {
        let Frame::Array(role) = conn.cmd(&["ROLE"]).await else {
            panic!("ROLE is an array")
        };
        let Frame::Array(replicas) = &role[2] else {
            panic!("ROLE's replicas are an array: {role:?}")
        };
        let at_last = |r: &Frame| matches!(r, Frame::Array(r) if bulk(&r[2]) == last.to_string());
        (replicas.len() == 2 && replicas.iter().all(at_last)).then_some(role)
    })
    .await;
    assert_eq!(role.len(), 3, "{role:?}");
    assert_eq!(bulk(&role[0]), "master");
    let offset = int(&role[1]);
    assert_eq!(offset, last);
    let Frame::Array(replicas) = &role[2] else {
        panic!("ROLE's replicas are an array: {role:?}")
    };
    let mut seen = Vec::new();
    for r in replicas {
        let Frame::Array(r) = r else { panic!("{r:?}") };
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(bulk(&r[0]), "127.0.0.1");
        seen.push(bulk(&r[1]).parse::<u16>().unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, ports(&followers));
    assert_eq!(replication_field(leader, "role").await, "master");
    let Frame::Map(hello) = conn.cmd(&["HELLO", "3"]).await else {
        panic!("HELLO 3 is a map")
    };
    assert!(
        hello.contains(&(Frame::bulk("role"), Frame::bulk("master")))
            && hello.contains(&(Frame::bulk("mode"), Frame::bulk("cluster"))),
        "{hello:?}"
    );
    assert_eq!(replication_field(leader, "connected_slaves").await, "2");
    assert_eq!(
        replication_field(leader, "master_repl_offset").await,
        offset.to_string()
    );
    let mut lines = Vec::new();
    for n in ["slave0", "slave1"] {
        let line = replication_field(leader, n).await;
        let port = line
            .split(',')
            .find_map(|kv| kv.strip_prefix("port="))
            .unwrap()
            .parse::<u16>()
            .unwrap();
        assert!(line.starts_with("ip=127.0.0.1,"), "{line}");
        assert!(line.contains(",state=online,"), "{line}");
        assert!(line.contains(&format!(",offset={offset},")), "{line}");
        let lag: u64 = line.rsplit_once("lag=").unwrap().1.parse().unwrap();
        assert!(
            lag <= 2,
            "answered within a heartbeat (whole seconds): {line}"
        );
        lines.push(port);
    }
    lines.sort_unstable();
    assert_eq!(lines, ports(&followers));
    // Each follower: a replica of the leader's client address, its link up.
    for &f in &followers {
        let m = &c.members[f];
        let role = m.conn().await.cmd(&["ROLE"]).await;
        let Frame::Array(role) = role else {
            panic!("ROLE is an array: {role:?}")
        };
        assert_eq!(role.len(), 5, "{role:?}");
        assert_eq!(bulk(&role[0]), "slave");
        assert_eq!(bulk(&role[1]), "127.0.0.1");
        assert_eq!(int(&role[2]), i64::from(leader.client.port()));
        assert_eq!(bulk(&role[3]), "connected");
        assert!(int(&role[4]) >= 5, "{role:?}");
        assert_eq!(replication_field(m, "role").await, "slave");
        // HELLO says the same (Redis's words there: `replica`, `cluster`).
        let hello = m.conn().await.cmd(&["HELLO", "3"]).await;
        let Frame::Map(hello) = hello else {
            panic!("HELLO 3 is a map: {hello:?}")
        };
        let field = |n: &str| {
            hello
                .iter()
                .find(|(k, _)| bulk(k) == n)
                .map(|(_, v)| bulk(v))
                .unwrap()
        };
        assert_eq!(
            (field("role"), field("mode")),
            ("replica".into(), "cluster".into())
        );
        assert_eq!(replication_field(m, "master_host").await, "127.0.0.1");
        assert_eq!(
            replication_field(m, "master_port").await,
            leader.client.port().to_string()
        );
        assert_eq!(replication_field(m, "master_link_status").await, "up");
        let io: i64 = replication_field(m, "master_last_io_seconds_ago")
            .await
            .parse()
            .unwrap();
        assert!(
            (0..=2).contains(&io),
            "heartbeats every 100 ms (whole seconds): {io}"
        );
    }
    // /metrics: three voters; on the leader both others answer, lacking
    // nothing.
    let page = crate::t07_redis_tools::scrape(metrics[l]).await;
    assert_eq!(sample(&page, "idem_raft_voters"), 3.0);
    assert_eq!(sample(&page, "idem_raft_replicas_connected"), 2.0);
    assert_eq!(sample(&page, "idem_raft_voters_connected"), 2.0);
    for &f in &followers {
        let id = c.members[f].id;
        assert_eq!(
            sample(
                &page,
                &format!("idem_raft_replica_lag_entries{{node=\"{id}\"}}")
            ),
            0.0
        );
    }
    let page = crate::t07_redis_tools::scrape(metrics[followers[0]]).await;
    assert_eq!(sample(&page, "idem_raft_voters"), 3.0);
    assert_eq!(sample(&page, "idem_raft_replicas_connected"), 0.0);
    assert!(!page.contains("idem_raft_replica_lag_entries{"), "{page}");
    // redis_exporter reads them as it reads Redis's.
    if let Some((page, _)) = crate::t07_redis_tools::exporter_scrape(leader.client).await {
        assert_eq!(sample(&page, "redis_connected_slaves"), 2.0);
        for p in ports(&followers) {
            let name = format!(
                "redis_connected_slave_offset_bytes{{slave_ip=\"127.0.0.1\",slave_port=\"{p}\",slave_state=\"online\"}}"
            );
            // (At least: an entry may have come since ROLE was asked.)
            assert!(sample(&page, &name) >= offset as f64, "{name}");
        }
        let f = &c.members[followers[0]];
        let (page, _) = crate::t07_redis_tools::exporter_scrape(f.client)
            .await
            .unwrap();
        let labels = format!(
            "{{master_host=\"127.0.0.1\",master_port=\"{}\"}}",
            leader.client.port()
        );
        assert_eq!(sample(&page, &format!("redis_master_link_up{labels}")), 1.0);
        assert!(sample(&page, &format!("redis_slave_repl_offset{labels}")) >= 5.0);
    }
    // kill -9 the leader: the new one has the other follower as its only
    // replica, and that follower names the new leader.
    c.members[l].kill().await;
    let l2 = c.leader().await;
    let other = followers.iter().copied().find(|&f| f != l2).unwrap();
    let new_leader = c.members[l2].client.port();
    let mut conn = c.members[l2].conn().await;
    conn.acquire(&["CLAIM", "role-after"]).await;
    c.followers_apply_what_leader_committed(l2, "the claim reaches the follower")
        .await;
    let role = eventually("the new leader lists its one replica", async || {
        let Frame::Array(role) = conn.cmd(&["ROLE"]).await else {
            panic!("ROLE is an array")
        };
        matches!(&role[2], Frame::Array(r) if r.len() == 1).then_some(role)
    })
    .await;
    assert_eq!(bulk(&role[0]), "master");
    let Frame::Array(r) = &role[2] else { panic!() };
    let Frame::Array(r) = &r[0] else { panic!() };
    assert_eq!(bulk(&r[1]), c.members[other].client.port().to_string());
    assert_eq!(
        replication_field(&c.members[l2], "connected_slaves").await,
        "1"
    );
    let page = crate::t07_redis_tools::scrape(metrics[l2]).await;
    assert_eq!(sample(&page, "idem_raft_replicas_connected"), 1.0);
    assert_eq!(sample(&page, "idem_raft_voters_connected"), 1.0);
    assert_eq!(sample(&page, "idem_raft_voters"), 3.0);
    let Frame::Array(role) = c.members[other].conn().await.cmd(&["ROLE"]).await else {
        panic!("ROLE is an array")
    };
    assert_eq!(bulk(&role[0]), "slave");
    assert_eq!(int(&role[2]), i64::from(new_leader));
    assert_eq!(bulk(&role[3]), "connected");
    assert_eq!(
        replication_field(&c.members[other], "master_port").await,
        new_leader.to_string()
    );
}

/// `raft_quick_elections` from a member's INFO (0 if unreachable).
async fn quick_elections(m: &Member) -> u64 {
    let Ok(Ok(_)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(m.client),
    )
    .await
    else {
        return 0;
    };
    info_field(&mut m.conn().await, "raft_quick_elections").await
}

/// A leader that could not reach a follower tried again only every 500 ms
/// (openraft's default backoff), so a follower restarted meanwhile could
/// wait that long and more to hear from it, and campaign first (its log
/// behind, it cannot win, but its higher term deposed the leader: seen
/// once in 17 restarts of a rolling restart, 0.7 s without a leader).
/// Now it tries again every heartbeat (a third of the election timeout):
/// counted here as connections to the stopped follower's peer address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_retries_an_unreachable_follower_every_heartbeat() {
    let mut c = Cluster::start("retry-follower", 3).await;
    let f = c.followers().await[0];
    c.members[f].kill().await;
    let l = c.leader().await;
    // The follower's peer address takes connections and closes them at
    // once, as a process not yet serving its peers does.
    let listener = tokio::net::TcpListener::bind(c.members[f].peer)
        .await
        .unwrap();
    let count = async {
        let mut n = 0u32;
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        while let Ok(Ok((s, _))) = tokio::time::timeout_at(until, listener.accept()).await {
            drop(s);
            n += 1;
        }
        n
    };
    let tries = count.await;
    // Heartbeats every 100 ms: about 30 in 3 s; every 500 ms, about 6.
    assert!(
        tries >= 12,
        "the leader tried to reach the stopped follower {tries} times in 3 s"
    );
    drop(listener);
    // It is reached as soon as it is back, and nothing campaigned.
    let term = c.members[l].info("cluster_current_epoch").await;
    c.members[f].start(None, &[]).await;
    c.followers_apply_what_leader_committed(l, "the follower is back")
        .await;
    assert_eq!(c.members[l].info("cluster_current_epoch").await, term);
}

/// When the leader's process dies its peer connections close, and the
/// follower first in turn campaigns as soon as the lease it granted has
/// run out, without a random election timeout on top. A follower's death
/// starts no campaign, and neither does anything while the leader lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_campaign_once_a_dead_leaders_lease_runs_out() {
    let log = (
        "RUST_LOG",
        "warn,idem_server::engine::raft::cluster=info,openraft=off",
    );
    let mut c = Cluster::start_with("quick", 3, &[log]).await;
    let f = c.followers().await[0];
    c.members[f].kill().await;
    // Longer than a quick campaign would wait (the lease, a tenth more,
    // and the turns): none starts (checked below). Whether the leader
    // stays is left to the timers: a loaded machine may stall it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let l = c.leader().await;
    c.members[f].start(None, &[log]).await;
    let applied = c.members[l].applied().await;
    c.members[f]
        .caught_up_as_follower(applied, "the restarted follower catches up")
        .await;
    for m in &c.members {
        assert_eq!(quick_elections(m).await, 0, "node {}", m.id);
    }
    c.members[l].kill().await;
    let l2 = c.leader().await;
    assert_ne!(l2, l);
    let mut quick = 0;
    for m in &c.members {
        quick += quick_elections(m).await;
    }
    assert!(quick >= 1, "the new leader was elected by the timers alone");
    // The new leader's log says why it campaigned, naming the dead one.
    let why = c.members[l2]
        .proc
        .as_ref()
        .unwrap()
        .logged(
            "campaigning: this node no longer follows its leader",
            Duration::from_secs(1),
        )
        .await;
    let dead = format!("leader={}", c.members[l].id);
    assert!(
        why.iter().any(|l| l.contains(&dead)),
        "no campaign logged naming the dead leader: {why:?}"
    );
    // The new leader saw two leaders at least: the dead one, then itself.
    let mut conn = c.members[l2].conn().await;
    let changes = info_field(&mut conn, "raft_leader_changes").await;
    assert!(changes >= 2, "raft_leader_changes {changes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_loses_no_acknowledged_record() {
    let mut c = Cluster::start("failover", 3).await;
    let mut fences = Vec::new();
    let mut completed = Vec::new();
    let mut held = Vec::new();
    for round in 0..3 {
        let l = c.leader().await;
        let mut conn = c.members[l].conn().await;
        for i in 0..20 {
            let k = format!("r{round}-done-{i}");
            let f = conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
            assert_eq!(
                conn.cmd(&["COMPLETE", &k, &f.to_string(), &format!("v{i}")])
                    .await,
                ok()
            );
            fences.push(f);
            completed.push((k, format!("v{i}")));
            let k = format!("r{round}-held-{i}");
            let f = conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
            fences.push(f);
            held.push((k, f));
        }
        // kill -9 the leader; the others elect a new one.
        c.members[l].kill().await;
        let l2 = c.leader().await;
        assert_ne!(l2, l);
        let mut conn = c.members[l2].conn().await;
        assert_completed(
            &mut conn,
            &completed,
            &format!("lost its outcome in failover {round}"),
        )
        .await;
        for (k, f) in &held {
            // Still owned: another caller is told so, the owner can renew.
            match claim(conn.cmd(&["CLAIM", k]).await) {
                ClaimReply::InFlight { .. } => {}
                other => panic!("{k} should still be held, got {other:?}"),
            }
            assert_eq!(
                conn.cmd(&["RENEW", k, &f.to_string(), "LEASE", "60000"])
                    .await,
                ok(),
                "{k}'s owner lost its claim in failover {round}"
            );
        }
        // Fences keep increasing across leaders.
        let f = conn.acquire(&["CLAIM", &format!("after-{round}")]).await;
        assert!(
            fences.iter().all(|&x| x < f),
            "fence {f} after failover {round} is not above every earlier one"
        );
        fences.push(f);
        // The killed node restarts on its data and rejoins as a follower.
        c.members[l].start(None, &[]).await;
        let applied = c.members[l2].applied().await;
        c.members[l]
            .caught_up_as_follower(applied, "the restarted node catches up")
            .await;
    }
}

/// A leader killed and restarted raised its saved vote to the next term,
/// the term the others had meanwhile elected a leader in; votes of a term
/// are ordered by node id, so whenever the restarted node's id was the
/// higher it refused the new leader's AppendEntries and that leader
/// stepped down: a second failover, about a second without a leader, on
/// every such restart (12 of 23 in a crash run). Now the restarted node
/// keeps its vote's term, uncommitted, and follows the leader there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_a_killed_leader_does_not_depose_the_one_elected_meanwhile() {
    let mut c = Cluster::start("restart-ex", 3).await;
    let mut tested = false;
    for round in 0..6 {
        let l = c.leader().await;
        let old = c.members[l].id;
        c.members[l]
            .conn()
            .await
            .acquire(&["CLAIM", &format!("r{round}")])
            .await;
        c.members[l].kill().await;
        let l2 = c.leader().await;
        let term = c.members[l2].info("cluster_current_epoch").await;
        c.members[l].start(None, &[]).await;
        let applied = c.members[l2].applied().await;
        c.members[l]
            .caught_up_as_follower(applied, "the restarted ex-leader catches up")
            .await;
        if old < c.members[l2].id {
            // Its vote never outranked the new leader's: nothing to see.
            continue;
        }
        tested = true;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            c.members[l2].info("idem_role").await,
            "leader",
            "node {} stepped down when node {old} came back (round {round})",
            c.members[l2].id
        );
        assert_eq!(c.members[l2].info("cluster_current_epoch").await, term);
        break;
    }
    assert!(tested, "no round restarted an ex-leader of a higher id");
}

/// A cluster ignored `max_memory_bytes`: the limits are replicated state,
/// written once at start, and a cluster node does not lead yet when it
/// starts, so that write was refused and never made again. Clients could
/// grow every node's store without bound. Now the serving leader writes its
/// limits, and they hold on the leader that follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_its_records_within_max_memory_bytes() {
    let max: u64 = 100_000;
    let mut c = Cluster::start_with(
        "memory",
        3,
        &[
            ("IDEM_MAX_MEMORY_BYTES", "100000"),
            ("IDEM_MEMORY_HEADROOM_PERCENT", "10"),
        ],
    )
    .await;
    let value = "v".repeat(20_000);
    let fill = async |conn: &mut Conn, prefix: &str| {
        let mut oom = 0;
        for i in 0..20 {
            let k = format!("{prefix}-{i}");
            let reply = conn.cmd(&["CLAIM", &k]).await;
            if matches!(reply, Frame::Error(_)) {
                assert!(err(&reply).starts_with("OOM"), "{reply:?}");
                oom += 1;
            } else if let ClaimReply::Acquired { fence } = claim(reply.clone()) {
                let done = conn
                    .cmd(&["COMPLETE", &k, &fence.to_string(), &value])
                    .await;
                if done != ok() {
                    assert!(err(&done).starts_with("OOM"), "{done:?}");
                    oom += 1;
                }
            } else {
                panic!("{k}: {reply:?}");
            }
            let used = info_field(conn, "used_memory").await;
            assert!(
                used <= max + max / 10,
                "used_memory {used} over the limit and headroom"
            );
        }
        oom
    };
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    eventually("the limits are in force", async || {
        (info_field(&mut conn, "maxmemory").await == max).then_some(())
    })
    .await;
    assert!(fill(&mut conn, "first").await > 0, "nothing was refused");
    // The next leader keeps them.
    c.members[l].kill().await;
    let l2 = c.leader().await;
    let mut conn = c.members[l2].conn().await;
    assert_eq!(
        fill(&mut conn, "second").await,
        20,
        "a full store took more"
    );
}

/// Followers snapshotted by entry count only (`snapshot_entries`), and
/// held their log in memory until then: large writes grew them by
/// gigabytes while the leader, which asks for a snapshot every
/// `snapshot_log_bytes`, stayed small. Now every node asks by bytes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_snapshot_by_log_bytes_too() {
    let c = Cluster::start_with(
        "log-bytes",
        3,
        &[
            ("IDEM_SNAPSHOT_LOG_BYTES", "1048576"),
            ("IDEM_SNAPSHOT_LOG_PERCENT", "0"),
            ("IDEM_SNAPSHOT_ENTRIES", "1000000"),
        ],
    )
    .await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let value = "v".repeat(200_000);
    for i in 0..40 {
        let k = format!("big-{i}");
        let f = conn.acquire(&["CLAIM", &k]).await;
        assert_eq!(
            conn.cmd(&["COMPLETE", &k, &f.to_string(), &value, "RETAIN", "1000"])
                .await,
            ok()
        );
    }
    // 8 MB went through every log: each node snapshots and purges, and
    // holds a small log.
    for m in &c.members {
        let mut mc = m.conn().await;
        eventually("every node snapshots by bytes", async || {
            let snapshotted = info_field(&mut mc, "raft_snapshot_index").await > 0;
            let held = info_field(&mut mc, "raft_log_bytes").await;
            (snapshotted && held < 4 << 20).then_some(())
        })
        .await;
    }
}

/// A leader whose own disk stalls keeps acknowledging writes: it sends
/// each entry to its followers while it writes it itself, and a majority
/// (the two followers) has it on disk long before the leader's own sync
/// returns. What it acknowledged that way survives its kill -9, and it
/// rejoins afterwards on its data. Snapshots every few entries make it
/// purge its log meanwhile: a purge waits for the stalled disk, the Raft
/// core must not. (Debug builds slow a node's log syncs by the
/// milliseconds in `IDEMD_UNSAFE_TEST_SLOW_SYNC_FILE`.)
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_a_stalled_disk_acknowledges_through_its_followers() {
    let slow = SlowSyncs::new("stalled-disk");
    let env = |id| {
        let mut env = slow.env(id);
        env.push(("IDEM_SNAPSHOT_ENTRIES".to_owned(), "4".to_owned()));
        env
    };
    let mut c = Cluster::start_each("stalled-disk", 3, env).await;
    let l = c.leader().await;
    let stall = Duration::from_millis(2_000);
    slow.set(c.members[l].id, stall.as_millis() as u64);
    let mut conn = c.members[l].conn().await;
    let syncs_before = info_field(&mut conn, "wal_fsyncs").await;
    let snapshots_before = info_field(&mut conn, "raft_snapshots_built").await;
    let writes_started = std::time::Instant::now();
    let mut completed = Vec::new();
    for i in 0..10 {
        let k = format!("stalled-{i}");
        let started = std::time::Instant::now();
        let f = conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
        assert_eq!(
            conn.cmd(&["COMPLETE", &k, &f.to_string(), &format!("v{i}")])
                .await,
            ok()
        );
        let took = started.elapsed();
        // Waiting for the leader's own sync would take the whole stall.
        assert!(
            took < stall / 2,
            "write {i} took {took:?}: it waited for the leader's stalled disk"
        );
        completed.push((k, format!("v{i}")));
    }
    // The stall was real: the leader's disk finished at most one sync per
    // stall (and one begun before) while all of that was acknowledged.
    let syncs = info_field(&mut conn, "wal_fsyncs").await - syncs_before;
    let stalls = writes_started.elapsed().as_millis() / stall.as_millis();
    assert!(
        u128::from(syncs) <= stalls + 1,
        "the leader synced {syncs} times within {stalls} stalls: its disk was not stalled"
    );
    let snapshots = info_field(&mut conn, "raft_snapshots_built").await - snapshots_before;
    assert!(
        snapshots >= 2,
        "the leader built {snapshots} snapshots during the stall: its log was not purged"
    );
    // The leader's log is still behind (its syncs are queued), yet what it
    // acknowledged is on the followers' disks: kill -9 it now.
    c.members[l].kill().await;
    let l2 = c.leader().await;
    assert_ne!(l2, l);
    let mut conn = c.members[l2].conn().await;
    assert_completed(
        &mut conn,
        &completed,
        "was acknowledged by the stalled leader and then lost",
    )
    .await;
    // Its disk healthy again, the old leader rejoins on its data and
    // catches up on what it had not written.
    let id = c.members[l].id;
    slow.set(id, 0);
    c.members[l].start_env(None, &env(id)).await;
    let applied = c.members[l2].applied().await;
    c.members[l]
        .caught_up_as_follower(applied, "the old leader rejoins and catches up")
        .await;
}

/// A leader whose entries reached its followers but not its own disk,
/// killed with -9 and restarted at once (within the followers' lease on
/// it), does not lead again in its old term: its log lacks entries the
/// followers hold under that term, and leading under it would give their
/// log ids to other entries. Every acknowledged outcome stays, and every
/// node ends with the same records.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_at_once_without_its_unwritten_entries_does_not_lead_in_its_old_term() {
    let slow = SlowSyncs::new("restarted-leader");
    let mut c = Cluster::start_each("restarted-leader", 3, |id| slow.env(id)).await;
    let l = c.leader().await;
    let term = c.members[l].info("cluster_current_epoch").await;
    slow.set(c.members[l].id, 3000);
    let mut conn = c.members[l].conn().await;
    let mut completed = Vec::new();
    for i in 0..10 {
        let k = format!("unwritten-{i}");
        // (A lease lapsed on a loaded machine is waited out.)
        let r = cmd_served(&mut conn, &["CLAIM", &k, "LEASE", "60000"]).await;
        let ClaimReply::Acquired { fence: f } = claim(r) else {
            panic!("{k} is acquired");
        };
        assert_eq!(
            cmd_served(
                &mut conn,
                &["COMPLETE", &k, &f.to_string(), &format!("v{i}")]
            )
            .await,
            ok()
        );
        completed.push((k, format!("v{i}")));
    }
    // Its writer is still in the first stalled sync: kill it, and bring it
    // back at once on a healthy disk.
    c.members[l].kill().await;
    let id = c.members[l].id;
    slow.set(id, 0);
    c.members[l].start_env(None, &slow.env(id)).await;
    let l2 = c.leader().await;
    assert_ne!(
        c.members[l2].info("cluster_current_epoch").await,
        term,
        "the cluster is led in the old term again"
    );
    let mut conn = c.members[l2].conn().await;
    assert_completed(
        &mut conn,
        &completed,
        "was acknowledged, then lost when its leader came back",
    )
    .await;
    // Every node holds the same records (each applied the same entries).
    let want = int(&conn.cmd(&["DBSIZE"]).await);
    let applied = c.members[l2].applied().await;
    for m in &c.members {
        eventually("every node applies the same records", async || {
            let a: u64 = m.info("idem_applied_index").await.parse().unwrap_or(0);
            let mut mc = m.conn().await;
            (a >= applied && int(&mc.cmd(&["DBSIZE"]).await) == want).then_some(())
        })
        .await;
    }
}

/// A node alone in its membership writes the entry that adds its first
/// member before it sends that member anything: whatever it sends later
/// is sent under a membership on its disk, so if it is killed and comes
/// back it knows it led others and steps down (it never hands out again
/// log ids the new member holds). Its syncs stall here for 1.5 s: while
/// the CLUSTER ADD's entry is on its way to its disk, the new member has
/// received nothing.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_is_on_the_leaders_disk_before_the_new_member_hears_of_it() {
    let slow = SlowSyncs::new("grow-stalled");
    let mut one = Member::new("grow-stalled", 1);
    let initial = format!("1={}", one.peer);
    one.start_env(Some(&initial), &slow.env(1)).await;
    let mut conn = one.conn().await;
    eventually("the node of one serves", async || {
        matches!(conn.cmd(&["CLAIM", "first"]).await, Frame::Array(_)).then_some(())
    })
    .await;
    let mut two = Member::new("grow-stalled", 2);
    two.start(None, &[]).await;
    slow.set(1, 1500);
    let add = tokio::spawn({
        let (client, peer, addr) = (one.client, two.peer, two.client);
        async move {
            let mut c = Conn::connect(client).await;
            c.cmd(&["CLUSTER", "ADD", "2", &peer.to_string(), &addr.to_string()])
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        two.info("idem_applied_index").await,
        "0",
        "the new member heard of the change before it was on the leader's disk"
    );
    let mut tc = two.conn().await;
    assert_eq!(
        info_field(&mut tc, "raft_last_log_index").await,
        0,
        "the new member was sent entries before the change was on the leader's disk"
    );
    slow.set(1, 0);
    assert_eq!(add.await.unwrap(), ok());
    eventually("the new member catches up", async || {
        (two.info("idem_applied_index")
            .await
            .parse::<u64>()
            .unwrap_or(0)
            > 0)
        .then_some(())
    })
    .await;
}

/// A cluster where one follower's disk takes 250 ms per sync, with the
/// leader's `append_timeout_ms`: five writes, then that follower catches
/// up; the RPCs that ran out of time on the leader meanwhile (INFO
/// `raft_peer_timeouts`).
#[cfg(debug_assertions)]
async fn writes_with_a_slow_follower(name: &str, append_timeout_ms: &str) -> u64 {
    let slow = SlowSyncs::new(name);
    let c = Cluster::start_each(name, 3, |id| {
        let mut env = slow.env(id);
        env.push((
            "IDEM_APPEND_TIMEOUT_MS".to_owned(),
            append_timeout_ms.to_owned(),
        ));
        env
    })
    .await;
    let l = c.leader().await;
    // One follower slow: the other keeps the leader's majority (and its
    // lease) fresh.
    let slow_one = c.followers().await[0];
    slow.set(c.members[slow_one].id, 250);
    let mut conn = c.members[l].conn().await;
    let before = info_field(&mut conn, "raft_peer_timeouts").await;
    for i in 0..5 {
        let k = format!("{name}-{i}");
        let f = conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
        assert_eq!(
            conn.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await,
            ok(),
            "{k} was not completed with a slow follower"
        );
    }
    let committed: u64 = c.members[l]
        .info("idem_commit_index")
        .await
        .parse()
        .unwrap();
    c.members[slow_one]
        .caught_up_as_follower(committed, "the slow follower applies every write")
        .await;
    info_field(&mut conn, "raft_peer_timeouts").await - before
}

/// A follower whose disk is slow but working (250 ms per sync, more than a
/// heartbeat interval) answers every AppendEntries within
/// `append_timeout_ms` (2 s by default): the leader never gives up on one.
/// With a deadline shorter than its syncs (100 ms: openraft's heartbeat
/// interval, the deadline before the setting) it keeps up only through
/// retries after a backoff, and the leader counts the calls that ran out
/// of time.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_slow_disk_is_given_append_timeout_ms_to_answer() {
    assert_eq!(
        writes_with_a_slow_follower("slow-follower", "2000").await,
        0,
        "AppendEntries ran out of time though the follower answers within 2 s"
    );
    assert!(
        writes_with_a_slow_follower("slow-follower-short", "100").await > 0,
        "a 100 ms deadline never ran out against 250 ms syncs: the setting does not reach openraft"
    );
}

/// A leader sends a follower the entries proposed while others are on
/// their way to it at once, up to `max_inflight_appends` unanswered
/// (INFO `raft_appends_pipelined`), and the follower, which reads them
/// ahead, answers each in order: with followers whose syncs take 30 ms and
/// writers that start 10 ms apart, entries are proposed while others are
/// being written, every write is acknowledged and both followers apply the
/// whole log. With `max_inflight_appends = 1` none is sent before the
/// previous answer.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_go_to_followers_without_waiting_up_to_max_inflight_appends() {
    for (depth, name) in [("1", "one-at-a-time"), ("4", "pipelined")] {
        let slow = SlowSyncs::new(name);
        let c = Cluster::start_each(name, 3, |id| {
            let mut env = slow.env(id);
            env.push(("IDEM_MAX_INFLIGHT_APPENDS".to_owned(), depth.to_owned()));
            env
        })
        .await;
        let l = c.leader().await;
        for f in c.followers().await {
            slow.set(c.members[f].id, 30);
        }
        let mut conn = c.members[l].conn().await;
        let before = info_field(&mut conn, "raft_appends_pipelined").await;
        let writers = (0..8u64).map(|w| {
            let addr = c.members[l].client;
            let name = name.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10 * w)).await;
                let mut conn = Conn::connect(addr).await;
                for i in 0..10 {
                    let k = format!("{name}-{w}-{i}");
                    let got = claim(cmd_served(&mut conn, &["CLAIM", &k, "LEASE", "60000"]).await);
                    assert!(matches!(got, ClaimReply::Acquired { .. }), "{k}: {got:?}");
                }
            })
        });
        for w in futures_util::future::join_all(writers).await {
            w.unwrap();
        }
        let pipelined = info_field(&mut conn, "raft_appends_pipelined").await - before;
        if depth == "1" {
            assert_eq!(pipelined, 0, "entries were sent before the previous answer");
        } else {
            assert!(
                pipelined > 0,
                "no entries went to a follower while others were on their way"
            );
        }
        // Every claim holds, and both followers apply all of it.
        for w in 0..8 {
            let k = format!("{name}-{w}-9");
            let got = conn.cmd(&["CLAIM", &k]).await;
            assert!(
                matches!(
                    ClaimReply::from_frame(got.clone()),
                    Ok(ClaimReply::InFlight { .. })
                ),
                "{k} is not held by its owner: {got:?}"
            );
        }
        c.followers_apply_what_leader_committed(l, "a follower applies every pipelined entry")
            .await;
    }
}

/// A member's (`wal_fsyncs_inline`, `wal_fsync_p50_us`).
async fn inline_syncs(m: &Member) -> (u64, u64) {
    let mut conn = m.conn().await;
    (
        info_field(&mut conn, "wal_fsyncs_inline").await,
        info_field(&mut conn, "wal_fsync_p50_us").await,
    )
}

/// Claims 30 keys one after the other through member `l` (the leader),
/// each its own small log entry, and waits until the followers applied
/// them; how many appends the leader wrote itself meanwhile.
async fn claim_one_by_one(c: &Cluster, l: usize, tag: &str) -> u64 {
    let (before, _) = inline_syncs(&c.members[l]).await;
    let mut conn = c.members[l].conn().await;
    for i in 0..30 {
        let k = format!("{tag}-{i}");
        let got = claim(cmd_served(&mut conn, &["CLAIM", &k, "LEASE", "60000"]).await);
        assert!(matches!(got, ClaimReply::Acquired { .. }), "{k}: {got:?}");
    }
    c.followers_apply_what_leader_committed(l, "followers apply the claims")
        .await;
    inline_syncs(&c.members[l]).await.0 - before
}

/// A follower sent one AppendEntries at a time (`max_inflight_appends` 1,
/// the default) writes and syncs a small one itself instead of handing it
/// to its log writer thread (INFO `wal_fsyncs_inline`): two thread
/// wakeups fewer per entry on each follower. A leader never does, a
/// follower that became leader in a failover included: its runtime sends
/// the entries on. Followers sent several at once hand them over as
/// before. (Only while syncs are fast: on a disk whose median sync takes
/// 500 µs or more the follower's count is not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_write_small_appends_themselves_and_leaders_never_do() {
    let followers_inline = async |c: &Cluster, what: &str, expect: bool| {
        for f in c.followers().await {
            let (inlined, p50) = inline_syncs(&c.members[f]).await;
            if !expect {
                assert_eq!(inlined, 0, "{what}: follower {f} wrote appends itself");
            } else if p50 < 500 {
                assert!(
                    inlined > 0,
                    "{what}: follower {f} handed every append to its thread"
                );
            } else {
                eprintln!("{what}: median sync {p50} µs, follower {f} wrote {inlined} itself");
            }
        }
    };
    let mut c = Cluster::start("inline-appends", 3).await;
    let l = c.leader().await;
    assert_eq!(
        claim_one_by_one(&c, l, "first").await,
        0,
        "the leader wrote appends itself"
    );
    followers_inline(&c, "one at a time", true).await;
    // Every node counts the entries written to its log and the commands
    // in them (INFO persistence; a follower's said 0: only what a node
    // proposed was counted).
    for (i, m) in c.members.iter().enumerate() {
        let (entries, cmds) = info_pair(m, "wal_entries", "wal_cmds").await;
        assert!(entries >= 30, "node {i} wrote {entries} entries");
        assert!(cmds >= 30, "node {i} wrote {cmds} commands");
    }
    // A follower that takes over stops: once it serves, its appends go to
    // its thread, while the remaining follower keeps writing its own.
    c.members[l].kill().await;
    let l2 = c.leader().await;
    assert_ne!(l2, l);
    let (other_before, p50) = inline_syncs(&c.members[c.followers().await[0]]).await;
    assert_eq!(
        claim_one_by_one(&c, l2, "second").await,
        0,
        "the new leader wrote appends itself"
    );
    let other = inline_syncs(&c.members[c.followers().await[0]]).await.0;
    assert!(
        p50 >= 500 || other > other_before,
        "the remaining follower handed every append to its thread"
    );
    // Several in flight: the thread syncs together what arrives meanwhile.
    let c = Cluster::start_with("inline-pipelined", 3, &[("IDEM_MAX_INFLIGHT_APPENDS", "2")]).await;
    let l = c.leader().await;
    claim_one_by_one(&c, l, "third").await;
    followers_inline(&c, "several in flight", false).await;
}

/// Two INFO fields of member `m`, read over one connection.
async fn info_pair(m: &Member, a: &str, b: &str) -> (u64, u64) {
    let mut conn = m.conn().await;
    (
        info_field(&mut conn, a).await,
        info_field(&mut conn, b).await,
    )
}

/// A leader polls for its entries' answers (`leader_poll_us`, INFO
/// `raft_leader_polls`): claims made one after another are answered while
/// it polls when the poll outlasts a round (100 ms here, on a loaded
/// machine); with `leader_poll_us` 0 it never polls. Answers are the same
/// either way, and the followers apply every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_polls_for_its_entries_answers_unless_told_not_to() {
    let polls =
        async |m: &Member| info_pair(m, "raft_leader_polls", "raft_leader_polls_answered").await;
    let c = Cluster::start_with("poll", 3, &[("IDEM_LEADER_POLL_US", "100000")]).await;
    let l = c.leader().await;
    let (before, answered_before) = polls(&c.members[l]).await;
    claim_one_by_one(&c, l, "polled").await;
    let (after, answered) = polls(&c.members[l]).await;
    assert!(
        after > before,
        "the leader never polled: {before} -> {after}"
    );
    assert!(
        answered > answered_before && answered - answered_before <= after - before,
        "answered while polling: {answered_before} -> {answered} of {before} -> {after}"
    );
    for f in c.followers().await {
        assert_eq!(polls(&c.members[f]).await, (0, 0), "follower {f} polled");
    }
    let c = Cluster::start_with("no-poll", 3, &[("IDEM_LEADER_POLL_US", "0")]).await;
    let l = c.leader().await;
    claim_one_by_one(&c, l, "slept").await;
    assert_eq!(polls(&c.members[l]).await, (0, 0), "the leader polled");
}

/// A leader gathers each entry until as many writes as it answered since
/// the previous one have come (`gather_idle_us`, INFO
/// `raft_gathers_expecting`): claims made one after another each come as
/// expected; with `gather_idle_us` 0 it takes what has arrived, and
/// followers never gather.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_gathers_the_writes_its_answers_bring_back_unless_told_not_to() {
    let gathers = async |m: &Member| {
        info_pair(m, "raft_gathers_expecting", "raft_gathers_expecting_met").await
    };
    let c = Cluster::start("gather", 3).await;
    let l = c.leader().await;
    let (before, met_before) = gathers(&c.members[l]).await;
    claim_one_by_one(&c, l, "gathered").await;
    let (after, met) = gathers(&c.members[l]).await;
    assert!(
        after >= before + 20,
        "30 claims one after another, gathered expecting them: {before} -> {after}"
    );
    assert!(
        met >= met_before + 20 && met - met_before <= after - before,
        "expected writes that came: {met_before} -> {met} of {before} -> {after}"
    );
    for f in c.followers().await {
        assert_eq!(
            gathers(&c.members[f]).await,
            (0, 0),
            "follower {f} gathered"
        );
    }
    let c = Cluster::start_with("no-gather", 3, &[("IDEM_GATHER_IDLE_US", "0")]).await;
    let l = c.leader().await;
    claim_one_by_one(&c, l, "taken").await;
    assert_eq!(gathers(&c.members[l]).await, (0, 0), "the leader gathered");
}

/// Every node applies the same log, so every node's snapshot fell due at
/// the same entry and all of them wrote the whole store at once. Now the
/// voters take turns (`snapshot_turn_ms`): of nodes due together, those
/// whose turn it is not wait (INFO `raft_snapshot_turn_waits`), and all of
/// them still snapshot; with 0 none waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_voters_snapshot_in_turns_unless_told_not_to() {
    let snapshots =
        async |m: &Member| info_pair(m, "raft_snapshots_built", "raft_snapshot_turn_waits").await;
    // Turns of 2 s: the three fall due within far less, so at most two of
    // them have a turn then; a round (6 s) is the longest wait.
    for turn in ["2000", "0"] {
        let c = Cluster::start_with(
            &format!("turns-{turn}"),
            3,
            &[
                ("IDEM_SNAPSHOT_ENTRIES", "20"),
                ("IDEM_SNAPSHOT_TURN_MS", turn),
            ],
        )
        .await;
        let l = c.leader().await;
        claim_one_by_one(&c, l, "turns").await;
        let mut waits = 0;
        for (i, m) in c.members.iter().enumerate() {
            let (_, waited) = eventually(&format!("node {i} snapshots"), async || {
                Some(snapshots(m).await).filter(|(built, _)| *built >= 1)
            })
            .await;
            waits += waited;
        }
        if turn == "0" {
            assert_eq!(waits, 0, "nodes waited for turns they were not given");
        } else {
            assert!(waits >= 1, "three nodes due together all snapshot at once");
        }
    }
}

/// A follower learns that entries are committed from the entries that
/// follow them: under load an entry costs one AppendEntries per follower,
/// not a second one to tell of its commit (which doubled the followers'
/// work). When nothing follows, the news still reaches them by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_rides_on_the_next_entries_to_the_followers() {
    let c = Cluster::start("commit-news", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let empty = info_field(&mut conn, "raft_appends_empty").await;
    let logged = info_field(&mut conn, "raft_last_log_index").await;
    let started = std::time::Instant::now();
    // Four writers: while one entry is replicated, the next gathers.
    let writers = (0..4).map(|w| {
        let addr = c.members[l].client;
        tokio::spawn(async move {
            let mut conn = Conn::connect(addr).await;
            for i in 0..50 {
                let k = format!("commit-news-{w}-{i}");
                conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
            }
        })
    });
    for w in futures_util::future::join_all(writers).await {
        w.unwrap();
    }
    let empty = info_field(&mut conn, "raft_appends_empty").await - empty;
    let entries = info_field(&mut conn, "raft_last_log_index").await - logged;
    assert!(entries >= 20, "only {entries} entries for 200 writes");
    // Each follower gets a heartbeat every 100 ms (a third of the default
    // election timeout). Beyond those, an empty AppendEntries only tells
    // of a commit no entries followed within 5 ms: 2 per entry when each
    // commit was sent on its own.
    let heartbeats = 2 * (started.elapsed().as_millis() as u64 / 100 + 1);
    assert!(
        empty.saturating_sub(heartbeats) < entries,
        "{empty} empty AppendEntries ({heartbeats} heartbeats) for {entries} entries to 2 followers"
    );
    c.followers_apply_what_leader_committed(l, "each follower applies the last write")
        .await;
}

/// A leader that logged a write, was cut off before it was committed, and
/// caught up from the new leader's snapshot takes writes again when it
/// leads again. The snapshot replaced the entry, which was never applied
/// one by one, and its proposer waited for its answer for good: the node
/// led and refused nothing, yet no write went through. (Found by the
/// simulation; the snapshot now answers the proposals it covers.)
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_leader_caught_up_by_snapshot_takes_writes_when_it_leads_again() {
    let faults = DataDir::new("snap-answer");
    std::fs::create_dir_all(&faults.0).unwrap();
    let env = [
        ("IDEMD_TEST_ISOLATE_DIR", faults.arg()),
        // Longer than the test: only the snapshot can answer the entry.
        ("IDEM_PROPOSAL_TIMEOUT_MS", "60000"),
        ("IDEM_SNAPSHOT_ENTRIES", "20"),
    ];
    let mut c = Cluster::start_with("snap-answer", 3, &env).await;
    let l = c.leader().await;
    let old = c.members[l].id;
    let mut lost = c.members[l].conn().await;
    let index = |m: &Member, f: &'static str| {
        let m = m.client;
        async move {
            let mut conn = Conn::connect(m).await;
            info_field(&mut conn, f).await
        }
    };
    // Cut off, it still logs a write within its lease: the entry is on its
    // disk only.
    let committed = index(&c.members[l], "raft_commit_index").await;
    std::fs::write(faults.0.join(format!("isolate-{old}")), b"").unwrap();
    // (Its answer, -TRYAGAIN, comes at proposal_timeout_ms.)
    lost.write(&["CLAIM", "never-committed", "LEASE", "60000"])
        .await;
    eventually("the cut-off leader logs the write", async || {
        (index(&c.members[l], "raft_last_log_index").await > committed).then_some(())
    })
    .await;
    // The others elect a leader and write past a few snapshots, so the
    // old leader can only catch up from one.
    let new = eventually("the majority elects a leader", async || {
        for (i, m) in c.members.iter().enumerate() {
            if i != l && m.info("idem_role").await == "leader" {
                let mut conn = m.conn().await;
                if let Some(Frame::Array(_) | Frame::Null) =
                    conn.try_cmd(&["INSPECT", "probe"]).await
                {
                    return Some(i);
                }
            }
        }
        None
    })
    .await;
    let mut conn = c.members[new].conn().await;
    for i in 0..100 {
        conn.acquire(&["CLAIM", &format!("after-cut-{i}"), "LEASE", "60000"])
            .await;
    }
    let applied = index(&c.members[new], "raft_applied_index").await;
    assert!(index(&c.members[new], "raft_snapshot_index").await > committed + 1);
    let built = index(&c.members[l], "raft_snapshots_built").await;
    std::fs::remove_file(faults.0.join(format!("isolate-{old}"))).unwrap();
    c.members[l]
        .caught_up_as_follower(applied, "the old leader catches up")
        .await;
    // From a snapshot it was sent, not one it built from entries it got.
    assert!(
        index(&c.members[l], "raft_snapshot_index").await > committed + 1
            && index(&c.members[l], "raft_snapshots_built").await == built,
        "the old leader caught up without a snapshot: the test proves nothing"
    );
    // Kill whichever other node leads until the old leader leads again.
    for round in 0.. {
        let now = c.leader().await;
        if now == l {
            break;
        }
        // (A node just restarted often wins: it may take many rounds.)
        assert!(round < 60, "node {old} never led again in 60 elections");
        c.members[now].kill().await;
        let other = (0..3).find(|&i| i != l && i != now).unwrap();
        eventually("a leader among the two left", async || {
            for i in [l, other] {
                if c.members[i].info("idem_role").await == "leader" {
                    return Some(());
                }
            }
            None
        })
        .await;
        c.members[now].start(None, &env).await;
    }
    let mut conn = c.members[l].conn().await;
    // A stuck proposer never answers (its -TRYAGAIN would come at
    // proposal_timeout_ms, 60 s); a -TRYAGAIN now (a lease renewing after
    // the kills) is retried.
    let mut claim_led = async |key: &str| {
        loop {
            let r = conn.cmd(&["CLAIM", key, "LEASE", "60000"]).await;
            match ClaimReply::from_frame(r.clone()) {
                Ok(c) => return c,
                Err(_) if matches!(&r, Frame::Error(_)) && err(&r).starts_with("TRYAGAIN") => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{key}: {r:?}: {e:?}"),
            }
        }
    };
    let r = tokio::time::timeout(Duration::from_secs(10), claim_led("led-again"))
        .await
        .expect("the former leader takes writes when it leads again");
    assert!(matches!(r, ClaimReply::Acquired { .. }), "{r:?}");
    // The write cut off before its commit was never applied.
    let r = claim_led("never-committed").await;
    assert!(matches!(r, ClaimReply::Acquired { .. }), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_in_cluster_mode_follows_the_leader() {
    // Peers prove they hold the secret (HMAC) on every connection.
    let c = Cluster::start_with(
        "redis-cli",
        3,
        &[("IDEM_CLUSTER_SECRET", "a-secret-of-at-least-16-bytes")],
    )
    .await;
    let f = c.followers().await[0];
    let port = c.members[f].client.port().to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-c", "-p", &port])
            .args(args)
            .output()
            .expect("redis-cli runs (apt-get install redis-tools)");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let k = key("cli");
    assert_eq!(run(&["CLAIM", &k, "LEASE", "30000"]), "ACQUIRED\n1");
    assert!(run(&["SETTLE", &k]).starts_with("INFLIGHT"));
    // Without -c, the follower's redirect is shown as it is.
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port, "INSPECT", &k])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("MOVED"), "{text}");
}

/// `scripts/local-cluster.sh` with `args`, its nodes under `dir` on the
/// ports after `base` (clients) and `base + 100` (peers): its exit code,
/// stdout and stderr.
fn local_cluster(dir: &std::path::Path, base: u16, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/local-cluster.sh"
        ))
        .args(args)
        .env("DIR", dir)
        .env("BASE_PORT", base.to_string())
        .env("PEER_BASE_PORT", (base + 100).to_string())
        .env("IDEMD", env!("CARGO_BIN_EXE_idemd"))
        .output()
        .expect("bash runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The script that starts a cluster on loopback says whether it did: a
/// second cluster started on the same ports failed (its nodes exited at
/// once) and the script said it was up, naming the other cluster's
/// processes; `stop` said it stopped nodes that were not running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_script_reports_what_it_started_and_stopped() {
    // Six free ports: three for clients after `base`, three for peers
    // after `base + 100`; below the ephemeral range, which the other
    // tests' connections take ports from.
    let start = std::process::id() as u16 % 40;
    let base = (0..40u16)
        .map(|i| 20_000 + (start + i) % 40 * 250)
        .find(|&b| {
            (1..=3).all(|i| {
                std::net::TcpListener::bind(("127.0.0.1", b + i)).is_ok()
                    && std::net::TcpListener::bind(("127.0.0.1", b + 100 + i)).is_ok()
            })
        })
        .expect("six free ports below the ephemeral range");
    let a = DataDir::new("script-a");
    let b = DataDir::new("script-b");
    // Stops what the script started, whatever the test's outcome.
    struct Stop<'a>(&'a std::path::Path, u16);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            local_cluster(self.0, self.1, &["stop"]);
        }
    }
    let _stop = (Stop(&a.0, base), Stop(&b.0, base));
    let (code, out, err) = local_cluster(&a.0, base, &["start", "3"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("leader: node"), "{out}");
    // The same ports again, under another folder: its nodes cannot listen.
    let (code, out, err) = local_cluster(&b.0, base, &["start", "3"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("exited") && err.contains("in use"), "{err}");
    let (code, out, _) = local_cluster(&b.0, base, &["status"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no node runs"), "{out}");
    assert!(!out.contains("leader"), "{out}");
    let (code, out, _) = local_cluster(&a.0, base, &["status"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches("follower").count(), 2, "{out}");
    let (_, out, _) = local_cluster(&a.0, base, &["stop"]);
    assert!(out.contains("stopped 3 of 3 nodes"), "{out}");
    let (_, out, _) = local_cluster(&a.0, base, &["stop"]);
    assert!(out.contains("no node was running"), "{out}");
    let (code, out, _) = local_cluster(&a.0, base, &["status"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out.matches("stopped").count(), 3, "{out}");
}

/// Runs idemd with `args`, which must refuse to start (exit within 30 s,
/// not with success): returns what it printed on stderr. One that starts
/// is killed, and fails the test.
fn refused(args: &[String]) -> String {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("idemd runs");
    // Read as it is written: a full pipe would hold the process up.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("idemd is waited for") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "idemd should refuse to start, and serves: {}",
                out.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(!status.success(), "idemd should refuse to start: {out}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_data_was_lost_is_never_let_back_in_under_its_id() {
    let mut c = Cluster::start("lost", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "before"]).await;
    // A follower other than the lowest id (which bootstraps: below).
    let f = c
        .followers()
        .await
        .into_iter()
        .find(|&i| c.members[i].id != 1)
        .unwrap();
    let initial = c.initial.clone();
    // A follower loses its disk.
    c.members[f].kill().await;
    std::fs::remove_dir_all(&c.members[f].dir.0).unwrap();
    let args = c.members[f].args(Some(&initial));
    let text = tokio::task::spawn_blocking(move || refused(&args))
        .await
        .unwrap();
    assert!(text.contains("data was lost"), "{text}");
    // The lowest id (which bootstraps) loses its disk: it does not
    // bootstrap a second cluster.
    let lowest = c.members.iter().position(|m| m.id == 1).unwrap();
    if c.members[lowest].proc.is_some() {
        c.members[lowest].kill().await;
    }
    let _ = std::fs::remove_dir_all(&c.members[lowest].dir.0);
    let args = c.members[lowest].args(Some(&initial));
    let text = tokio::task::spawn_blocking(move || refused(&args))
        .await
        .unwrap();
    // Refused either way: the peers hold a cluster, or they recorded the
    // incarnation of node 1's lost directory (whichever answers first).
    assert!(
        text.contains("already holds a cluster") || text.contains("data was lost"),
        "the lowest id bootstrapped again: {text}"
    );
}

/// A follower whose data directory was put back from an older copy (its
/// log shorter than what it had acknowledged) is sent the log again: the
/// leader took the shorter log for a bug, and stopped (a debug build) or
/// left it out for good while every gauge said it was in step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restored_from_an_older_copy_is_sent_the_log_again() {
    // Without it a debug build's leader stops on the reverted log: the
    // assertion every other test keeps as its tripwire.
    let mut c = Cluster::start_with("restored", 3, &[("IDEMD_TEST_ALLOW_LOG_REVERT", "1")]).await;
    let l = c.leader().await;
    let leader_id = c.members[l].id.to_string();
    let f = (0..c.members.len()).find(|&i| i != l).unwrap();
    let mut conn = c.members[l].conn().await;
    for i in 0..50 {
        conn.acquire(&["CLAIM", &format!("before-{i}")]).await;
    }
    c.followers_apply_what_leader_committed(l, "the first claims")
        .await;
    // The follower is stopped and its data directory copied.
    c.members[f].kill().await;
    let dir = c.members[f].dir.0.clone();
    let copy = dir.with_extension("copy");
    let _ = std::fs::remove_dir_all(&copy);
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    c.members[f].start(None, &[]).await;
    for i in 0..200 {
        conn.acquire(&["CLAIM", &format!("between-{i}")]).await;
    }
    c.followers_apply_what_leader_committed(l, "the claims after the copy")
        .await;
    // Stopped again, and put back from the copy.
    c.members[f].kill().await;
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&copy, &dir).unwrap();
    c.members[f].start(None, &[]).await;
    for i in 0..50 {
        conn.acquire(&["CLAIM", &format!("after-{i}")]).await;
    }
    c.followers_apply_what_leader_committed(l, "the restored follower catches up")
        .await;
    // The same leader throughout, which says what it saw.
    assert_eq!(c.members[l].info("idem_role").await, "leader");
    let said = c.members[l]
        .proc
        .as_ref()
        .unwrap()
        .logged("follower log is reverted", Duration::from_secs(5))
        .await;
    assert!(!said.is_empty(), "the leader did not log the reverted log");
    assert_eq!(c.members[f].info("idem_leader_id").await, leader_id);
    let mut fc = c.members[f].conn().await;
    assert_eq!(
        info_field(&mut fc, "records").await,
        300,
        "the follower's store"
    );
}

/// A member's data directory started under another node id is refused at
/// start, naming node_id (it served, kept out by its peers with hints that
/// pointed at its peer addresses and a lost data directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_is_started_only_as_its_node() {
    let mut one = Member::new("ownid", 1);
    let initial = format!("1={}", one.peer);
    one.start(Some(&initial), &[]).await;
    eventually("node 1 leads", async || {
        (one.info("idem_role").await == "leader").then_some(())
    })
    .await;
    one.conn().await.acquire(&["CLAIM", "k"]).await;
    incarnations_recorded(&mut one.conn().await, 1).await;
    let as_seven = |one: &Member| {
        let mut args = one.args(None);
        let at = args.iter().position(|a| a == "--node-id").unwrap();
        args[at + 1] = "7".into();
        args
    };
    // Twice: the second time without its node-id file, as a directory
    // written before there was one: the membership's record of the
    // directory says whose it is.
    for round in 0..2 {
        one.kill().await;
        if round == 1 {
            std::fs::remove_file(one.dir.0.join("node-id")).unwrap();
        }
        let args = as_seven(&one);
        let text = tokio::task::spawn_blocking(move || refused(&args))
            .await
            .unwrap();
        assert!(
            text.contains("node 1's (its cluster recorded it")
                && text.contains("node_id (--node-id) is 7"),
            "round {round}: {text}"
        );
        // As node 1 it starts, with what it held, and records its id.
        one.start(None, &[]).await;
        let mut c = one.conn().await;
        let r = cmd_served(&mut c, &["CLAIM", "k"]).await;
        assert!(
            matches!(claim(r.clone()), ClaimReply::InFlight { .. }),
            "{r:?}"
        );
        assert!(one.dir.0.join("node-id").exists(), "node-id not written");
    }
    // A node-id file that says otherwise (an earlier release wrote the id
    // a directory was first started under, a typo included) yields to the
    // membership's record: the directory starts as node 1, and the file is
    // put right (it said the directory was node 7's, and as node 7 the
    // membership refused it: no id could start it).
    one.kill().await;
    std::fs::write(one.dir.0.join("node-id"), "7\n").unwrap();
    one.start(None, &[]).await;
    let mut c = one.conn().await;
    let r = cmd_served(&mut c, &["CLAIM", "k"]).await;
    assert!(
        matches!(claim(r.clone()), ClaimReply::InFlight { .. }),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_to_string(one.dir.0.join("node-id")).unwrap(),
        "1\n"
    );
    // A single node's membership records no directory: its node-id file
    // says whose it is.
    let single = DataDir::new("ownid-single");
    let listen = format!("127.0.0.1:{}", crate::support::cluster::free_port());
    let mut s = Idemd::start_raft_at(&single, &listen).await;
    s.conn().await.acquire(&["CLAIM", "k"]).await;
    s.kill().await;
    // Started as node 7 without a peer address: what it says.
    let as_seven = async || {
        let args: Vec<String> = [
            "--engine",
            "raft",
            "--data-dir",
            single.arg(),
            "--listen",
            &listen,
            "--node-id",
            "7",
        ]
        .map(str::to_owned)
        .to_vec();
        tokio::task::spawn_blocking(move || refused(&args))
            .await
            .unwrap()
    };
    let text = as_seven().await;
    assert!(
        text.contains("this data directory is node 1's")
            && text.contains("node_id (--node-id) is 7"),
        "{text}"
    );
    // Without its node-id file (a directory written before there was one),
    // its membership says whose it is: started as node 7 it never served,
    // its client port closed, and said nothing.
    std::fs::remove_file(single.0.join("node-id")).unwrap();
    let text = as_seven().await;
    assert!(
        text.contains("node 1's (the only member it records), and node_id (--node-id) is 7"),
        "{text}"
    );
    // As node 1 it serves what it held.
    let s = Idemd::start_raft_at(&single, &listen).await;
    let r = cmd_served(&mut s.conn().await, &["CLAIM", "k"]).await;
    assert!(
        matches!(claim(r.clone()), ClaimReply::InFlight { .. }),
        "{r:?}"
    );
}

/// A node of another cluster is refused as one, not as a member of this
/// cluster whose data was lost: both clusters have a node 1, and what this
/// one recorded of its own node 1 says nothing of the other's (its
/// message told the operator to remove a healthy member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_refused_as_one() {
    let b = Cluster::start("otherb", 3).await;
    let bl = b.leader().await;
    // B's node 2 knows the data directory recorded for B's node 1.
    let target = b.members.iter().find(|m| m.id == 2).unwrap();
    incarnations_recorded(&mut target.conn().await, 3).await;
    b.members[bl].conn().await.acquire(&["CLAIM", "b"]).await;
    let mut a = Member::new("othera", 1);
    let initial = format!("1={}", a.peer);
    a.start(Some(&initial), &[]).await;
    eventually("A, a cluster of one, leads", async || {
        (a.info("idem_role").await == "leader").then_some(())
    })
    .await;
    // A's operator gives B's node 2 to CLUSTER ADD by mistake.
    let mut conn = a.conn().await;
    let _ = target.add_as_learner(&mut conn).await;
    let at_b = target.proc.as_ref().unwrap();
    let at_a = a.proc.as_ref().unwrap();
    for (side, p) in [("B's node 2", at_b), ("A", at_a)] {
        let said = p
            .logged("is not this node's cluster", Duration::from_secs(20))
            .await;
        assert!(!said.is_empty(), "{side} does not say the clusters differ");
        let lost = p.logged("new data directory", Duration::ZERO).await;
        assert!(
            lost.is_empty(),
            "{side} calls it a member whose data was lost: {lost:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_grows_into_a_cluster_and_shrinks_back() {
    // A single node with data.
    let mut one = Member::new("grow", 1);
    let single = [
        "--engine",
        "raft",
        "--listen",
        &one.client.to_string(),
        "--data-dir",
        one.dir.arg(),
    ]
    .map(str::to_owned);
    let single: Vec<&str> = single.iter().map(String::as_str).collect();
    let p = Idemd::start_with(&[], &single).await;
    let mut conn = p.conn().await;
    // Without a peer address it cannot take members (it could not be
    // reached by them, and its log is written as a single node's).
    let e = err(&conn
        .cmd(&["CLUSTER", "ADD", "2", "127.0.0.1:1", "127.0.0.1:2"])
        .await);
    assert!(e.contains("--peer-listen"), "{e}");
    let fence = conn.acquire(&["CLAIM", "kept"]).await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "kept", &fence.to_string(), "v"])
            .await,
        ok()
    );
    drop(p);
    // Restarted with a peer address: node 1 of a cluster of one.
    one.start(None, &[]).await;
    let mut others: Vec<Member> = (2..=3).map(|id| Member::new("grow", id)).collect();
    for m in &mut others {
        m.start(None, &[]).await;
    }
    let mut conn = one.conn().await;
    for m in &others {
        let id = m.id.to_string();
        let add = m.add_as_learner(&mut conn).await;
        assert_eq!(add, ok(), "{add:?}");
        // Refused until it caught up? It catches up fast here: wait for it,
        // then promote.
        eventually("the learner catches up", async || {
            (m.info("idem_applied_index")
                .await
                .parse::<u64>()
                .unwrap_or(0)
                > 0
                && m.info("idem_leader_id").await == "1")
                .then_some(())
        })
        .await;
        let r = eventually("promote", async || {
            let r = conn.cmd(&["CLUSTER", "PROMOTE", &id]).await;
            (r == ok()).then_some(r)
        })
        .await;
        assert_eq!(r, ok());
    }
    assert_eq!(one.info("idem_voters").await, "3");
    // Bad changes are refused with a reason.
    let e = err(&conn
        .cmd(&["CLUSTER", "ADD", "2", "127.0.0.1:1", "127.0.0.1:2"])
        .await);
    assert!(
        e.contains("already a member") && e.contains("a new id"),
        "{e}"
    );
    // A peer address another member has: the learner would never be
    // reached (its messages go to that member, which refuses them).
    let taken = others[0].peer.to_string();
    let e = err(&conn
        .cmd(&["CLUSTER", "ADD", "9", &taken, "127.0.0.1:2"])
        .await);
    assert!(e.contains("is node 2's"), "{e}");
    // Ids show as signed integers: at most i64::MAX.
    let e = err(&conn
        .cmd(&[
            "CLUSTER",
            "ADD",
            "9223372036854775808",
            "127.0.0.1:1",
            "127.0.0.1:2",
        ])
        .await);
    assert!(e.contains("node ids are from 1 to"), "{e}");
    let e = err(&conn.cmd(&["CLUSTER", "PROMOTE", "9"]).await);
    assert!(e.contains("not a member"), "{e}");
    // The cluster replicates: node 1 dies, the record is on the others.
    one.kill().await;
    let c = Cluster {
        members: others,
        initial: String::new(),
    };
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    assert_eq!(
        claim(conn.cmd(&["CLAIM", "kept"]).await),
        ClaimReply::Completed {
            outcome: Outcome::Ok,
            value: "v".into()
        }
    );
    // Shrinks back: node 1 is removed for good; two voters remain.
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", "1"]).await, ok());
    assert_eq!(c.members[l].info("idem_voters").await, "2");
    assert_eq!(c.members[l].info("cluster_known_nodes").await, "2");
    // A removed id is never accepted again, and the last voter stays.
    let e = err(&conn
        .cmd(&["CLUSTER", "ADD", "1", "127.0.0.1:1", "127.0.0.1:2"])
        .await);
    assert!(e.contains("never reused"), "{e}");
    let other = c.members[1 - l].id.to_string();
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", &other]).await, ok());
    // Consecutive ids are kept as one range.
    let retired = if other == "2" {
        "1-2".into()
    } else {
        format!("1,{other}")
    };
    assert_eq!(c.members[l].info("idem_retired").await, retired);
    let me = c.members[l].id.to_string();
    let e = err(&conn.cmd(&["CLUSTER", "REMOVE", &me]).await);
    assert!(e.contains("last voter"), "{e}");
    // Still serving, alone.
    conn.acquire(&["CLAIM", "alone"]).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A removed node left running misled its clients: a removed follower
/// answered `-CLUSTERDOWN no leader: a majority ... is not reachable`, and
/// a removed leader went on answering `-TRYAGAIN this node was just
/// elected` (and `cluster_state:ok`) for good, so clients that knew it
/// kept retrying there. Both now say that they were removed, and the
/// cluster goes on without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_left_running_tells_its_clients_so() {
    let mut c = Cluster::start("removed", 4).await;
    let removed = |f: &Frame| matches!(f, Frame::Error(e) if e.starts_with(b"CLUSTERDOWN this node was removed"));
    // A follower first.
    let l = c.leader().await;
    let f = (l + 1) % 4;
    let mut conn = c.members[l].conn().await;
    let id = c.members[f].id.to_string();
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", &id]).await, ok());
    let mut gone = c.members[f].conn().await;
    eventually("the removed follower says so", async || {
        removed(&gone.cmd(&["CLAIM", "k"]).await).then_some(())
    })
    .await;
    assert_eq!(c.members[f].info("cluster_state").await, "fail");
    assert_eq!(c.members[f].info("idem_role").await, "none");
    // Then the leader itself, through its own client port.
    let id = c.members[l].id.to_string();
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", &id]).await, ok());
    // Within a second here (27-640 ms in four runs); a CI run with every
    // suite on two cores once took more than 10 s.
    eventually_within(
        Duration::from_secs(30),
        "the removed leader says so",
        async || removed(&conn.cmd(&["CLAIM", "k"]).await).then_some(()),
    )
    .await;
    assert_eq!(c.members[l].info("cluster_state").await, "fail");
    assert_eq!(c.members[l].info("idem_role").await, "none");
    // The two left elect a leader and serve.
    let (a, b) = (c.members.remove(l.max(f)), c.members.remove(l.min(f)));
    let left = Cluster {
        members: std::mem::take(&mut c.members),
        initial: String::new(),
    };
    let l2 = left.leader().await;
    let mut conn = left.members[l2].conn().await;
    cmd_served(&mut conn, &["PING"]).await;
    acquire_served(&mut conn, "after").await;
    // Neither removed node campaigns on once the members refused it: its
    // term stands still (it rose twice a second, with a leader change
    // logged each time, for as long as the node was left running).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = (
        a.info("cluster_current_epoch").await,
        b.info("cluster_current_epoch").await,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = (
        a.info("cluster_current_epoch").await,
        b.info("cluster_current_epoch").await,
    );
    assert_eq!(before, after, "a removed node went on campaigning");
    drop((a, b));
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_peers_stops_serving_and_the_majority_takes_over() {
    let faults = DataDir::new("isolate");
    std::fs::create_dir_all(&faults.0).unwrap();
    let env = [
        ("IDEMD_TEST_ISOLATE_DIR", faults.arg()),
        ("IDEM_PROPOSAL_TIMEOUT_MS", "2000"),
    ];
    let c = Cluster::start_with("cut", 3, &env).await;
    let l = c.leader().await;
    let old = &c.members[l];
    let mut conn = old.conn().await;
    let fence = conn
        .acquire(&["CLAIM", "before-cut", "LEASE", "60000"])
        .await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "before-cut", &fence.to_string(), "v"])
            .await,
        ok()
    );
    // A request parked on the leader, waiting for a key in flight.
    conn.acquire(&["CLAIM", "held", "LEASE", "60000"]).await;
    let mut parked = old.conn().await;
    parked.write(&["SETTLE", "held", "WAIT", "30000"]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Cut the leader off: no peer traffic in or out.
    std::fs::write(faults.0.join(format!("isolate-{}", old.id)), b"").unwrap();
    let cut = std::time::Instant::now();
    // The parked request is not left waiting in silence: it is answered
    // -TRYAGAIN once the leader's lease lapses, not after its 30 s.
    let r = tokio::time::timeout(Duration::from_secs(3), parked.reply())
        .await
        .expect("the parked SETTLE was answered when the leader was cut off");
    assert!(err(&r).starts_with("TRYAGAIN"), "{r:?}");
    assert!(
        cut.elapsed() < Duration::from_millis(1500),
        "{:?}",
        cut.elapsed()
    );
    // Within its lease it stops serving reads and taking writes: -TRYAGAIN,
    // never a stale answer, never a hang past proposal_timeout_ms.
    let refused_at = eventually("the cut-off leader refuses", async || {
        let r = conn.cmd(&["INSPECT", "before-cut"]).await;
        matches!(&r, Frame::Error(_)).then(|| (cut.elapsed(), err(&r)))
    })
    .await;
    assert!(refused_at.1.starts_with("TRYAGAIN"), "{refused_at:?}");
    assert!(refused_at.0 < Duration::from_millis(1500), "{refused_at:?}");
    let started = std::time::Instant::now();
    let w = conn.cmd(&["CLAIM", "during-cut"]).await;
    assert!(
        err(&w).starts_with("TRYAGAIN") || err(&w).starts_with("CLUSTERDOWN"),
        "{w:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(2500));
    // Past its lease and an election's time without a majority, it says
    // the cluster is down, as a follower would.
    eventually("the cut-off leader reports the cluster down", async || {
        let r = conn.cmd(&["CLAIM", "during-cut"]).await;
        (err(&r).starts_with("CLUSTERDOWN") && old.info("cluster_state").await == "fail")
            .then_some(())
    })
    .await;
    // The majority elects another leader, which has the record and takes
    // writes.
    let others: Vec<&Member> = c.members.iter().filter(|m| m.id != old.id).collect();
    let new_leader = eventually("the majority elects a leader", async || {
        let a = others[0].info("idem_leader_id").await;
        let b = others[1].info("idem_leader_id").await;
        (a == b && !a.is_empty() && a != old.id.to_string()).then_some(a)
    })
    .await;
    let nl = c
        .members
        .iter()
        .find(|m| m.id.to_string() == new_leader)
        .unwrap();
    let mut conn2 = eventually("the new leader serves", async || {
        let mut c2 = nl.conn().await;
        // (-TRYAGAIN while it applies the log of earlier terms.)
        let r = c2.cmd(&["CLAIM", "before-cut"]).await;
        matches!(ClaimReply::from_frame(r), Ok(ClaimReply::Completed { .. })).then_some(c2)
    })
    .await;
    let f2 = conn2.acquire(&["CLAIM", "after-cut"]).await;
    assert!(f2 > fence);
    // Healed: the old leader follows and redirects to the new one.
    std::fs::remove_file(faults.0.join(format!("isolate-{}", old.id))).unwrap();
    let mut conn = old.conn().await;
    eventually("the old leader follows the new one", async || {
        let r = conn.cmd(&["INSPECT", "after-cut"]).await;
        (matches!(&r, Frame::Error(_)) && err(&r).starts_with("MOVED")).then_some(())
    })
    .await;
    assert_eq!(old.info("idem_role").await, "follower");
}

/// A leader whose followers are all gone answers the writes it had
/// proposed once its lease lapses (not at `proposal_timeout_ms`), then
/// reports the cluster down on every channel an operator or a client
/// reads: `-CLUSTERDOWN`, `cluster_state:fail`, `idem_raft_has_leader 0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_left_without_a_majority_answers_what_it_proposed_and_reports_the_cluster_down() {
    let (mut c, metrics) = Cluster::start_with_metrics("alone", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "warm"]).await;
    let followers = c.followers().await;
    for f in followers {
        c.members[f].kill().await;
    }
    // Sent at once: proposed while the lease still holds, or held once it
    // lapsed; never committed (proposal_timeout_ms is 10 s by default).
    // (A loaded machine may take past the election's time to get here.)
    let sent = std::time::Instant::now();
    for i in 0..8 {
        conn.write(&["CLAIM", &format!("alone-{i}")]).await;
    }
    for i in 0..8 {
        let r = tokio::time::timeout(Duration::from_secs(5), conn.reply())
            .await
            .unwrap_or_else(|_| panic!("claim {i} unanswered after 5 s"));
        assert!(
            err(&r).starts_with("TRYAGAIN") || err(&r).starts_with("CLUSTERDOWN"),
            "{i}: {r:?}"
        );
    }
    assert!(
        sent.elapsed() < Duration::from_millis(2000),
        "{:?}",
        sent.elapsed()
    );
    let leader = &c.members[l];
    eventually("the lone leader reports the cluster down", async || {
        let r = conn.cmd(&["CLAIM", "later"]).await;
        (err(&r).starts_with("CLUSTERDOWN") && leader.info("cluster_state").await == "fail")
            .then_some(())
    })
    .await;
    assert_eq!(leader.info("idem_role").await, "leader");
    let page = crate::t07_redis_tools::scrape(metrics[l]).await;
    assert!(page.contains("\nidem_raft_has_leader 0\n"), "{page}");
    assert!(page.contains("\nidem_raft_is_leader 1\n"), "{page}");
}

/// A node restarted while its leader is down shows the slot map it knew
/// (as a restarted Redis Cluster node shows the map it saved), at once
/// and while it campaigns, and counts the failed leader's slots as Redis
/// counts a failed master's: `cluster_slots_assigned` was 0 beside
/// `cluster_slots_fail:16384`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_while_its_leader_is_down_still_shows_the_slot_map() {
    let mut c = Cluster::start("restart-map", 3).await;
    let l = c.leader().await;
    let leader_port = i64::from(c.members[l].client.port());
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "before"]).await;
    let f = (0..c.members.len()).find(|&i| i != l).unwrap();
    // Applied on this follower: it has heard the leader in this term.
    let applied = c.members[l].applied().await;
    c.members[f]
        .caught_up_as_follower(applied, "the follower caught up")
        .await;
    for m in &mut c.members {
        m.kill().await;
    }
    // Alone: no leader can be elected while the test looks. It reports
    // the cluster down once its election timeout passes (campaigning, its
    // vote then names itself).
    c.members[f].start(None, &[]).await;
    let node = &c.members[f];
    let first = node.conn().await.cmd(&["CLUSTER", "SLOTS"]).await;
    assert!(
        matches!(&first, Frame::Array(r) if r.len() == 1),
        "at once after the start: {first:?}"
    );
    eventually("the lone node reports the cluster down", async || {
        (node.info("cluster_state").await == "fail").then_some(())
    })
    .await;
    assert_eq!(
        slot_ranges(&mut node.conn().await).await,
        [(0, 16383, leader_port)],
        "one range, the last leader's"
    );
    assert_eq!(node.info("cluster_slots_assigned").await, "16384");
    assert_eq!(node.info("cluster_slots_ok").await, "0");
    assert_eq!(node.info("cluster_slots_fail").await, "16384");
    let nodes = bulk(&node.conn().await.cmd(&["CLUSTER", "NODES"]).await);
    assert!(
        nodes.lines().any(
            |line| line.starts_with(&format!("{:040x}", c.members[l].id))
                && line.ends_with("0-16383")
        ),
        "{nodes}"
    );
}

/// `CLUSTER SLOTS` as (first slot, last slot, the master's port), a range
/// each.
async fn slot_ranges(conn: &mut Conn) -> Vec<(i64, i64, i64)> {
    let Frame::Array(ranges) = conn.cmd(&["CLUSTER", "SLOTS"]).await else {
        panic!("CLUSTER SLOTS is an array")
    };
    ranges
        .iter()
        .map(|range| {
            let Frame::Array(r) = range else {
                panic!("a range is an array: {range:?}")
            };
            let Frame::Array(master) = &r[2] else {
                panic!("a range's master is an array: {range:?}")
            };
            (int(&r[0]), int(&r[1]), int(&master[1]))
        })
        .collect()
}

/// A leader restarted while the others are down shows itself in the slot
/// map, as a restarted Redis Cluster master does until it learns of its
/// replacement: it rejoins as a follower and its saved vote no longer
/// names a leader, so its `CLUSTER SLOTS` was empty (a cluster client
/// seeded with it alone could not start: no slot covered), for as long as
/// it heard of no leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_alone_still_shows_the_slot_map() {
    let mut c = Cluster::start("restart-leader-map", 3).await;
    let l = c.leader().await;
    let port = i64::from(c.members[l].client.port());
    c.members[l]
        .conn()
        .await
        .acquire(&["CLAIM", "before"])
        .await;
    for m in &mut c.members {
        m.kill().await;
    }
    c.members[l].start(None, &[]).await;
    let node = &c.members[l];
    let check = async |when: &str| {
        assert_eq!(
            slot_ranges(&mut node.conn().await).await,
            [(0, 16383, port)],
            "{when}: one range, its own (the leader it was)"
        );
        assert_eq!(node.info("cluster_slots_assigned").await, "16384", "{when}");
    };
    check("at once after the start").await;
    assert_eq!(node.info("idem_role").await, "follower");
    // Still so once its election timeout has passed (it then campaigns,
    // alone, with no one to answer).
    eventually("the lone node reports the cluster down", async || {
        (node.info("cluster_state").await == "fail").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    check("while it campaigns").await;
    assert_eq!(node.info("cluster_slots_fail").await, "16384");
}

/// A leader killed, removed by the others meanwhile, and restarted does
/// not show itself in the slot map once it knows it was removed: as the
/// leader it was when it stopped it would have shown itself for good
/// (no leader ever calls a removed node), sending the clients that asked
/// it to a node that will never serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_restarted_does_not_show_itself_in_the_slot_map() {
    let mut c = Cluster::start("removed-leader-map", 3).await;
    let l = c.leader().await;
    let port = i64::from(c.members[l].client.port());
    c.members[l]
        .conn()
        .await
        .acquire(&["CLAIM", "before"])
        .await;
    c.members[l].kill().await;
    let l2 = c.leader().await;
    let id = c.members[l].id.to_string();
    let mut conn = c.members[l2].conn().await;
    let removed = eventually("the dead leader is removed", async || {
        let r = conn.cmd(&["CLUSTER", "REMOVE", &id]).await;
        (r == ok()).then_some(r)
    })
    .await;
    assert_eq!(removed, ok());
    c.members[l].start(None, &[]).await;
    let node = &c.members[l];
    let mut gone = node.conn().await;
    eventually_within(
        Duration::from_secs(30),
        "the restarted node knows it was removed",
        async || {
            matches!(&gone.cmd(&["CLAIM", "k"]).await,
                Frame::Error(e) if e.starts_with(b"CLUSTERDOWN this node was removed"))
            .then_some(())
        },
    )
    .await;
    let ranges = slot_ranges(&mut gone).await;
    assert!(
        ranges.iter().all(|&(_, _, master)| master != port),
        "it shows itself: {ranges:?}"
    );
    let nodes = bulk(&gone.cmd(&["CLUSTER", "NODES"]).await);
    assert!(
        !nodes
            .lines()
            .any(|line| line.contains("myself") && line.ends_with("0-16383")),
        "{nodes}"
    );
}

/// Writes the leader proposed just before both followers' disks stalled
/// waited out `proposal_timeout_ms` (10 s) for a commit; they are answered
/// once the lease has lapsed and the hold after it passed, saying they may
/// have been applied, which they are once the disks come back.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_proposed_before_the_followers_went_silent_are_answered_when_the_lease_runs_out() {
    let slow = SlowSyncs::new("silent-followers");
    let c = Cluster::start_each("silent-followers", 3, |id| slow.env(id)).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    cmd_served(&mut conn, &["CLAIM", "warm"]).await;
    for f in c.followers().await {
        slow.set(c.members[f].id, 4000);
    }
    let sent = std::time::Instant::now();
    for i in 0..4 {
        conn.write(&["CLAIM", &format!("silent-{i}"), "ATTEMPT", "a"])
            .await;
    }
    let mut unknown = 0;
    for i in 0..4 {
        let r = tokio::time::timeout(Duration::from_secs(3), conn.reply())
            .await
            .unwrap_or_else(|_| panic!("claim {i} unanswered after 3 s"));
        let e = err(&r);
        assert!(e.starts_with("TRYAGAIN"), "{i}: {e}");
        if e.contains("may have been applied") {
            unknown += 1;
        }
    }
    assert!(
        unknown > 0,
        "no claim was proposed before the followers went silent"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    // The disks come back: what was proposed is committed, and a retry
    // with the same attempt id finds its own claim.
    for f in c.followers().await {
        slow.set(c.members[f].id, 0);
    }
    // (The followers may elect one of themselves once their disks return.)
    let r = eventually("the retried claim finds its own", async || {
        let l = c.leader().await;
        let r = c.members[l]
            .conn()
            .await
            .cmd(&["CLAIM", "silent-0", "ATTEMPT", "a"])
            .await;
        matches!(&r, Frame::Array(_)).then_some(r)
    })
    .await;
    assert!(matches!(claim(r), ClaimReply::Acquired { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_owners_keep_their_claims_through_a_leader_kill() {
    use idem_client::{ClaimOutcome, Client, ClientConfig};
    let mut c = Cluster::start("leases", 3).await;
    let config = ClientConfig::default()
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .deadline(Duration::from_secs(20));
    let owners = Client::connect_with_config(c.seeds(), config.clone())
        .await
        .unwrap();
    let rival = Client::connect_with_config(c.seeds(), config)
        .await
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..100 {
        match owners
            .claim(format!("lease-{i}"))
            .lease(Duration::from_secs(2))
            .await
            .unwrap()
        {
            ClaimOutcome::Acquired(g) => guards.push(g),
            other => panic!("{other:?}"),
        }
    }
    // A rival keeps trying to take every key while the leader dies.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rival_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in (0..100).step_by(7) {
                    if let Ok(ClaimOutcome::Acquired(g)) = rival.claim(format!("lease-{i}")).await {
                        panic!("lease-{i} was handed to a rival (fence {})", g.fence());
                    }
                }
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            rounds
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let l = c.leader().await;
    c.members[l].kill().await;
    let new = c.leader().await;
    assert_ne!(new, l);
    // Two more leases' worth of time on the new leader.
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(rival_task.await.unwrap() > 0);
    for g in guards {
        assert!(!g.is_lost(), "{:?} lost its claim in the failover", g.key());
        let k = g.key().clone();
        g.complete("done")
            .await
            .unwrap_or_else(|e| panic!("{k:?}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_client_runs_through_repeated_leader_kills() {
    use idem_client::{Client, ClientConfig, RunOptions};
    let mut c = Cluster::start("client-failover", 3).await;
    let client = Client::connect_with_config(
        c.seeds(),
        ClientConfig::default()
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
            .deadline(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = {
        let (client, runs) = (client.clone(), runs.clone());
        tokio::spawn(async move {
            for i in 0..300u64 {
                let runs = runs.clone();
                let out = client
                    .run_once(
                        format!("job-{i}"),
                        RunOptions::default(),
                        async move |_ctx| {
                            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Ok::<_, std::io::Error>(bytes::Bytes::from(format!("r{i}")))
                        },
                    )
                    .await
                    .unwrap_or_else(|e| panic!("job-{i}: {e}"));
                assert_eq!(&out.value[..], format!("r{i}").as_bytes());
            }
        })
    };
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let l = c.leader().await;
        c.members[l].kill().await;
        c.leader().await;
        c.members[l].start(None, &[]).await;
    }
    worker.await.unwrap();
    // Each effect ran once, and every job replays its value.
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 300);
    for i in [0u64, 150, 299] {
        let again = client
            .run_once(format!("job-{i}"), RunOptions::default(), async |_ctx| {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"never"))
            })
            .await
            .unwrap();
        assert_eq!(&again.value[..], format!("r{i}").as_bytes());
    }
}

/// The lease left on `key`, from INSPECT on `conn` (a leader just elected
/// answers -TRYAGAIN until it has applied its log: asked again).
#[cfg(debug_assertions)]
async fn lease_left(conn: &mut Conn, key: &str) -> i64 {
    let mut r = conn.cmd(&["INSPECT", key]).await;
    for _ in 0..100 {
        match &r {
            Frame::Error(e) if e.starts_with(b"TRYAGAIN") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                r = conn.cmd(&["INSPECT", key]).await;
            }
            _ => break,
        }
    }
    let Frame::Array(fields) = &r else {
        panic!("INSPECT {key} is a flat map: {r:?}")
    };
    let i = fields
        .iter()
        .position(|f| matches!(f, Frame::Bulk(b) | Frame::Simple(b) if &b[..] == b"lease_ms"))
        .unwrap_or_else(|| panic!("no lease_ms in {r:?}"));
    int(&fields[i + 1])
}

#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_with_a_skewed_wall_clock_neither_lapses_early_nor_turns_time_back() {
    // Node 1 keeps true time; nodes 2 and 3 are 10 s ahead and behind.
    let skew = |id: u64| match id {
        2 => "10000",
        3 => "-10000",
        _ => "0",
    };
    let mut c = Cluster::start_each("skew", 3, |id| {
        vec![("IDEMD_TEST_WALL_SKEW_MS".into(), skew(id).into())]
    })
    .await;
    for _ in 0..2 {
        let l = c.leader().await;
        let mut conn = c.members[l].conn().await;
        let k = key("skewed");
        conn.acquire(&["CLAIM", &k, "LEASE", "30000"]).await;
        // An idle while: the leader's reads see the lease run down, and the
        // next leader must not give that time back.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = lease_left(&mut conn, &k).await;
        // Reads follow the replicated clock, which the leader keeps within
        // a tick (100 ms, plus a commit) of its own.
        assert!(
            before <= 28_850,
            "the lease did not run down while idle: {before}"
        );
        let t = std::time::Instant::now();
        c.members[l].kill().await;
        let l2 = c.leader().await;
        let mut conn = c.members[l2].conn().await;
        let after = lease_left(&mut conn, &k).await;
        let real = t.elapsed().as_millis() as i64;
        // Time never went back (the lease did not grow), and it did not
        // run faster than real time (no jump with the new leader's clock).
        assert!(
            after <= before,
            "the clock went back: {before} -> {after} ms left"
        );
        assert!(
            after >= before - real - 50,
            "the lease lost more than the {real} ms that passed: {before} -> {after} ms left"
        );
        let s = skew(c.members[l].id);
        c.members[l]
            .start(None, &[("IDEMD_TEST_WALL_SKEW_MS", s)])
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_down_while_100k_records_are_written_catches_up_by_snapshot() {
    let mut c = Cluster::start_with("catch-up", 3, &[("IDEM_SNAPSHOT_ENTRIES", "50")]).await;
    let f = c.followers().await[0];
    c.members[f].kill().await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    fill(&mut conn, "bulk", 100_000).await;
    let want = int(&conn.cmd(&["DBSIZE"]).await);
    assert!(want >= 100_000);
    // The leader snapshotted and purged the log the follower missed.
    let mut leader_info = c.members[l].conn().await;
    eventually("the leader snapshots", async || {
        (info_field(&mut leader_info, "raft_snapshots_built").await >= 1).then_some(())
    })
    .await;
    c.members[f].start(None, &[]).await;
    let m = &c.members[f];
    let mut fc = m.conn().await;
    eventually("the follower catches up", async || {
        (int(&fc.cmd(&["DBSIZE"]).await) == want).then_some(())
    })
    .await;
    let info = bulk(&fc.cmd(&["INFO", "replication"]).await);
    let snap: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("raft_snapshot_index:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(snap > 0, "the follower was not sent a snapshot: {info}");
    assert_eq!(m.info("idem_role").await, "follower");
    // Writes made while it was down are there, and the leader kept taking
    // writes while it caught up.
    assert!(matches!(
        claim(conn.cmd(&["CLAIM", "bulk-99999", "ATTEMPT", "fill"]).await),
        ClaimReply::Acquired { .. }
    ));
    conn.acquire(&["CLAIM", "after-catch-up"]).await;
}

/// A follower whose snapshot took longer to install than an election
/// timeout campaigned, and its higher term deposed the leader that was
/// sending it (a restarted follower catching up on 84 MB took ~2 s; the
/// terms went 1, 2, 3 and writes failed meanwhile): the follower answers
/// an AppendEntries only once the install is done, so a heartbeat the
/// leader sent meanwhile waited until the leader gave up on it
/// (`append_timeout_ms`, 2 s), and the next came after that and a backoff.
/// Now a follower counts the snapshot it is taking from its leader as word
/// from it, for as long as it takes. (Debug builds: the install is
/// slowed.)
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_slow_to_install_a_snapshot_does_not_depose_its_leader() {
    // An election timeout of 1 s leaves the leader time to reach the
    // restarted follower before it would campaign (2-3 s); a heartbeat
    // every 2.5 s during the 6 s install does not.
    let install = Duration::from_secs(6);
    let mut c = Cluster::start_with(
        "slow-install",
        3,
        &[
            ("IDEM_SNAPSHOT_ENTRIES", "50"),
            ("IDEM_ELECTION_TIMEOUT_MS", "1000"),
        ],
    )
    .await;
    let f = c.followers().await[0];
    let had = info_field(&mut c.members[f].conn().await, "raft_last_log_index").await;
    c.members[f].kill().await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    fill(&mut conn, "bulk", 30_000).await;
    let want = int(&conn.cmd(&["DBSIZE"]).await);
    // The leader's log must start past what the follower has, so that only
    // a snapshot catches it up.
    eventually("the leader purges its log", async || {
        let last = info_field(&mut conn, "raft_last_log_index").await;
        let held = info_field(&mut conn, "raft_log_entries").await;
        (last.saturating_sub(held) > had).then_some(())
    })
    .await;
    let term = c.members[l].info("cluster_current_epoch").await;
    let started = tokio::time::Instant::now();
    let ms = install.as_millis().to_string();
    c.members[f]
        .start(None, &[("IDEMD_TEST_SNAPSHOT_INSTALL_MS", &ms)])
        .await;
    let mut fc = c.members[f].conn().await;
    eventually_within(
        install * 3,
        "the follower installs a snapshot",
        async || (info_field(&mut fc, "raft_snapshot_index").await > 0).then_some(()),
    )
    .await;
    assert!(
        started.elapsed() >= install,
        "the install was not slowed ({:?})",
        started.elapsed()
    );
    assert_eq!(
        info_field(&mut fc, "raft_snapshots_built").await,
        0,
        "the follower built its snapshot: it was not sent one"
    );
    eventually("the follower catches up", async || {
        (int(&fc.cmd(&["DBSIZE"]).await) == want).then_some(())
    })
    .await;
    for m in &c.members {
        assert_eq!(
            m.info("cluster_current_epoch").await,
            term,
            "node {} is in another term: someone campaigned while the snapshot was installed",
            m.id
        );
    }
    assert_eq!(c.leader().await, l);
    conn.acquire(&["CLAIM", "after-catch-up"]).await;
}

/// A snapshot file damaged on disk after it was written was sent as it
/// was: the member it was sent to refused it and its Raft core stopped for
/// good, the process staying up and answering every write with an error.
/// Now the leader checks the file's checksum as it sends it, and a
/// damaged file stops the leader (exit code 70, the reason on stderr), as
/// a damaged data directory keeps a node from starting; another member
/// leads and catches the new member up. (Any error that stops a Raft core
/// now stops its process the same way, rather than leave it serving
/// errors.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_damaged_on_disk_is_never_sent_and_stops_its_node() {
    let mut c = Cluster::start_with("damaged", 3, &[("IDEM_SNAPSHOT_ENTRIES", "50")]).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    fill(&mut conn, "bulk", 20_000).await;
    // The log is purged behind the latest snapshot, which is written (no
    // other one under way that would replace the file).
    let mut leader_info = c.members[l].conn().await;
    let mut built = 0;
    eventually("the leader's snapshots settle", async || {
        let now = info_field(&mut leader_info, "raft_snapshots_built").await;
        let settled = now >= 1 && now == built;
        built = now;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        settled.then_some(())
    })
    .await;
    // A bit flipped on disk in the file's records (its header stays
    // readable).
    let path = c.members[l].dir.0.join("snapshot");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // A new member needs the snapshot: the leader reads it to send it.
    let mut learner = Member::new("damaged", 4);
    learner.start(None, &[]).await;
    let add = learner.add_as_learner(&mut conn).await;
    assert_eq!(add, ok(), "{add:?}");
    let status = tokio::time::timeout(Duration::from_secs(20), async {
        let p = c.members[l].proc.as_mut().unwrap();
        p.child.wait().await.unwrap()
    })
    .await;
    let Ok(status) = status else {
        let mut lc = c.members[l].conn().await;
        let mut nc = learner.conn().await;
        panic!(
            "the leader whose snapshot file is damaged did not stop; leader: {:?}; new member: {:?}",
            lc.cmd(&["INFO", "replication"]).await,
            nc.cmd(&["INFO", "replication"]).await
        );
    };
    assert_eq!(status.code(), Some(70), "{status:?}");
    c.members[l].proc = None;
    // The new member was never sent the damaged snapshot: it catches up
    // from the new leader.
    let l2 = c.leader().await;
    let mut conn = c.members[l2].conn().await;
    conn.acquire(&["CLAIM", "after-the-damage"]).await;
    let want = int(&conn.cmd(&["DBSIZE"]).await);
    assert!(want > 20_000, "{want}");
    let mut nc = learner.conn().await;
    eventually("the new member catches up", async || {
        (int(&nc.cmd(&["DBSIZE"]).await) == want).then_some(())
    })
    .await;
    let p = learner.proc.as_mut().unwrap();
    assert!(p.child.try_wait().unwrap().is_none(), "the new member runs");
    // The damaged node does not start again, and says why.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(c.members[l].args(None))
        .env("RUST_LOG", "warn,openraft=off")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("the damaged node refuses to start")
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
}

/// A Python with redis-py (Debian's python3-redis), if there is one.
pub(crate) fn python_with_redis() -> Option<&'static str> {
    for py in ["/usr/bin/python3", "python3"] {
        let ok = std::process::Command::new(py)
            .args(["-c", "import redis.cluster"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(py);
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "redis-py is required in CI (apt-get install python3-redis)"
    );
    eprintln!("skipping: redis-py is not installed (apt-get install python3-redis)");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_cluster_client_follows_the_leader_through_a_failover() {
    let Some(py) = python_with_redis() else {
        return;
    };
    let mut c = Cluster::start("redis-py", 3).await;
    let f = c.followers().await[0];
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/redis_py_cluster.py"
    );
    let run = tokio::process::Command::new(py)
        .args([script, &c.members[f].client.port().to_string(), "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let l = c.leader().await;
    c.members[l].kill().await;
    let out = tokio::time::timeout(Duration::from_secs(60), run.wait_with_output())
        .await
        .expect("the script ends")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("ok "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n: usize = stdout.trim()["ok ".len()..].parse().unwrap();
    assert!(n > 10, "only {n} keys went through");
}

/// Claims and completes `key` through redis-rs's cluster client, retrying
/// (with the same attempt id, so a lost reply never makes a second owner)
/// what fails while the cluster elects a leader.
async fn redis_rs_claim_complete(
    conn: &mut redis::cluster_async::ClusterConnection,
    key: &str,
    value: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r: redis::RedisResult<redis::Value> = async {
            let r: redis::Value = redis::cmd("CLAIM")
                .arg(key)
                .arg("LEASE")
                .arg(30_000)
                .arg("ATTEMPT")
                .arg(key)
                .query_async(conn)
                .await?;
            let redis::Value::Array(items) = &r else {
                return Ok(r);
            };
            if let [redis::Value::SimpleString(s), redis::Value::Int(fence)] = &items[..] {
                assert_eq!(s, "ACQUIRED", "{key}: {r:?}");
                redis::cmd("COMPLETE")
                    .arg(key)
                    .arg(*fence)
                    .arg(value)
                    .query_async(conn)
                    .await
            } else {
                Ok(r)
            }
        }
        .await;
        match r {
            Ok(redis::Value::Okay) => return,
            Ok(redis::Value::Array(items)) => {
                // The retried claim found its own completion.
                assert_eq!(
                    items,
                    vec![
                        redis::Value::SimpleString("COMPLETED".into()),
                        redis::Value::Okay,
                        redis::Value::BulkString(value.as_bytes().to_vec()),
                    ],
                    "{key}"
                );
                return;
            }
            Ok(other) => panic!("{key}: {other:?}"),
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{key}: still failing: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// redis-rs's async cluster client follows the leader with no
/// Idem-specific code, through a kill -9 of the leader: one client given
/// a follower's address alone, one given every node and reading from
/// replicas (it sends READONLY on each connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rs_cluster_client_follows_the_leader_through_a_failover() {
    use redis::cluster::ClusterClientBuilder;
    let mut c = Cluster::start("redis-rs", 3).await;
    let f = c.followers().await[0];
    let url = |m: &Member| format!("redis://{}/", m.client);
    let plain = ClusterClientBuilder::new(vec![url(&c.members[f])])
        .build()
        .unwrap();
    let replicas = ClusterClientBuilder::new(c.members.iter().map(url).collect::<Vec<_>>())
        .read_routing_strategy(redis::cluster_read_routing::RandomReplicaStrategy)
        .build()
        .unwrap();
    let mut conns = [
        plain.get_async_connection().await.unwrap(),
        replicas.get_async_connection().await.unwrap(),
    ];
    let prefix = key("rs");
    let mut done = Vec::new();
    for phase in ["before", "after"] {
        if phase == "after" {
            let l = c.leader().await;
            c.members[l].kill().await;
        }
        for (n, conn) in conns.iter_mut().enumerate() {
            for i in 0..10 {
                let k = format!("{prefix}-{phase}-{n}-{i}");
                let v = format!("v-{k}");
                redis_rs_claim_complete(conn, &k, &v).await;
                done.push((k, v));
            }
        }
    }
    // Every completion replays through either client, on the new leader.
    for conn in &mut conns {
        for (k, v) in &done {
            let r: redis::Value = redis::cmd("CLAIM").arg(k).query_async(conn).await.unwrap();
            assert_eq!(
                r,
                redis::Value::Array(vec![
                    redis::Value::SimpleString("COMPLETED".into()),
                    redis::Value::Okay,
                    redis::Value::BulkString(v.as_bytes().to_vec()),
                ]),
                "{k}"
            );
        }
    }
}

/// Cluster clients set to read from replicas (redis-py's
/// `read_from_replicas`, ioredis's `scaleReads`, node-redis's
/// `useReplicas`, go-redis's `ReadOnly`) send READONLY on every connection
/// and give a node up if it refuses it, then send the reads they know (or
/// are told) only read to a replica. A follower redirected those too, and
/// these clients, taking a `-MOVED` as news of who owns the slot, sent the
/// next try to a replica again: ioredis failed every such read after 16
/// redirections, node-redis took ~3 ms and several redirections a read.
/// Now every node accepts READONLY and READWRITE, and after READONLY a
/// follower answers SETTLE and INSPECT itself, once it has applied what
/// the leader had committed when asked: a write the leader acknowledged is
/// seen by the next read on any follower. Writes, waits, and reads without
/// READONLY still go to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_from_replicas_connect_and_still_reach_the_leader() {
    let c = Cluster::start("readonly", 3).await;
    let l = c.leader().await;
    let leader = c.members[l].client.to_string();
    let mut writer = c.members[l].conn().await;
    for f in c.followers().await {
        let mut conn = c.members[f].conn().await;
        // Without READONLY, reads are redirected.
        let r = conn.cmd(&["INSPECT", "ro-a"]).await;
        assert_eq!(moved(&r), (key_slot(b"ro-a"), leader.clone()));
        assert_eq!(conn.cmd(&["READONLY"]).await, ok());
        assert_eq!(conn.cmd(&["INSPECT", "ro-a"]).await, Frame::Null);
        let r = conn.cmd(&["SETTLE", "ro-b"]).await;
        assert!(!matches!(r, Frame::Error(_)), "SETTLE on a follower: {r:?}");
        for args in [
            vec!["CLAIM", "ro-c", "LEASE", "5000"],
            vec!["SETTLE", "ro-b", "WAIT", "100"],
        ] {
            let r = conn.cmd(&args).await;
            assert_eq!(
                moved(&r),
                (key_slot(args[1].as_bytes()), leader.clone()),
                "{args:?}"
            );
        }
        // Each write the leader acknowledges is seen by the next read on
        // the follower (it applied up to the leader's read index first).
        // A read the follower could not make current in time (a busy
        // machine) is redirected instead: tried again, and counted.
        let mut redirected = 0;
        for i in 0..30 {
            let k = format!("ro-{f}-{i}");
            let fence = writer.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
            let v = format!("v{i}");
            assert_eq!(
                writer.cmd(&["COMPLETE", &k, &fence.to_string(), &v]).await,
                ok()
            );
            let mut r = conn.cmd(&["INSPECT", &k]).await;
            while matches!(r, Frame::Error(_)) && redirected < 3 {
                assert_eq!(moved(&r), (key_slot(k.as_bytes()), leader.clone()));
                redirected += 1;
                r = conn.cmd(&["INSPECT", &k]).await;
            }
            let shown = format!("{r:?}");
            assert!(
                shown.contains("completed") && shown.contains(&v),
                "a follower's read missed a write the leader acknowledged: {k} {r:?}"
            );
        }
        assert_eq!(conn.cmd(&["readwrite"]).await, ok());
        let r = conn.cmd(&["INSPECT", "ro-a"]).await;
        assert_eq!(moved(&r), (key_slot(b"ro-a"), leader.clone()));
        let e = err(&conn.cmd(&["READONLY", "x"]).await);
        assert!(e.contains("wrong number of arguments"), "{e}");
        // Each redirect is a refusal in the follower's statistics, as
        // Redis counts a -MOVED.
        let stats = bulk(&conn.cmd(&["INFO", "commandstats", "errorstats"]).await);
        let inspect = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_inspect:"))
            .unwrap_or_default();
        assert!(
            inspect.starts_with("cmdstat_inspect:calls=31,")
                && inspect.ends_with(&format!("rejected_calls={},failed_calls=0", 2 + redirected)),
            "{inspect}"
        );
        for line in [
            "cmdstat_claim:calls=0,usec=0,usec_per_call=0.00,rejected_calls=1,failed_calls=0"
                .to_owned(),
            format!("errorstat_MOVED:count={}", 4 + redirected),
        ] {
            assert!(stats.contains(&line), "{line} missing from {stats}");
        }
    }
    // Reads from many connections at once share their requests to the
    // leader: one serves every read waiting when it is sent.
    let f = c.followers().await[0];
    let mut readers = Vec::new();
    for _ in 0..40 {
        let mut conn = c.members[f].conn().await;
        assert_eq!(conn.cmd(&["READONLY"]).await, ok());
        readers.push(conn);
    }
    let rounds =
        async |m: &Member| info_pair(m, "raft_follower_reads", "raft_read_index_rounds").await;
    let (reads_before, rounds_before) = rounds(&c.members[f]).await;
    let redirected = async |m: &Member| {
        info_pair(m, "raft_follower_reads_redirected", "raft_follower_reads")
            .await
            .0
    };
    let redirected_before = redirected(&c.members[f]).await;
    let k = format!("ro-{f}-29");
    let answers = futures_util::future::join_all(
        readers
            .iter_mut()
            .map(async |conn| conn.cmd(&["INSPECT", &k]).await),
    )
    .await;
    let mut answered = 0;
    for r in answers {
        if matches!(r, Frame::Error(_)) {
            assert_eq!(moved(&r), (key_slot(k.as_bytes()), leader.clone()));
        } else {
            assert!(format!("{r:?}").contains("v29"), "{r:?}");
            answered += 1;
        }
    }
    assert!(
        answered >= 36,
        "{answered} of 40 reads at once answered by the follower"
    );
    let (reads, rounds_after) = rounds(&c.members[f]).await;
    assert_eq!(reads - reads_before, 40);
    assert_eq!(
        redirected(&c.members[f]).await - redirected_before,
        40 - answered,
        "INFO raft_follower_reads_redirected counts the reads sent to the leader"
    );
    assert!(
        rounds_after - rounds_before < 40,
        "40 reads at once asked the leader {} times",
        rounds_after - rounds_before
    );
    // Reads pipelined on one connection share rounds too (each waited for
    // a round of its own: 32 reads asked the leader 32 times), and their
    // replies keep the requests' order, a write's redirect among them.
    let mut piped = c.members[f].conn().await;
    assert_eq!(piped.cmd(&["READONLY"]).await, ok());
    let (reads_before, rounds_before) = rounds(&c.members[f]).await;
    for i in 0..32 {
        if i == 16 {
            piped.write(&["CLAIM", "ro-piped", "LEASE", "5000"]).await;
        }
        piped
            .write(&["INSPECT", &format!("ro-{f}-{}", i % 30)])
            .await;
    }
    let mut answered = 0;
    for i in 0..32 {
        if i == 16 {
            let r = piped.reply().await;
            assert_eq!(moved(&r), (key_slot(b"ro-piped"), leader.clone()));
        }
        let r = piped.reply().await;
        let k = format!("ro-{f}-{}", i % 30);
        if matches!(r, Frame::Error(_)) {
            assert_eq!(moved(&r), (key_slot(k.as_bytes()), leader.clone()));
        } else {
            let v = format!("v{}", i % 30);
            assert!(format!("{r:?}").contains(&v), "{k}: {r:?}");
            answered += 1;
        }
    }
    assert!(answered >= 28, "{answered} of 32 pipelined reads answered");
    let (reads, rounds_after) = rounds(&c.members[f]).await;
    assert_eq!(reads - reads_before, 32);
    assert!(
        rounds_after - rounds_before <= 8,
        "32 pipelined reads asked the leader {} times",
        rounds_after - rounds_before
    );
    // A learner applies the same log, and reads the same way.
    let mut learner = Member::new("readonly", 4);
    learner.start(None, &[]).await;
    let add = learner.add_as_learner(&mut writer).await;
    assert_eq!(add, ok(), "{add:?}");
    let mut lc = learner.conn().await;
    assert_eq!(lc.cmd(&["READONLY"]).await, ok());
    let k = format!("ro-{f}-7");
    eventually("the learner answers reads", async || {
        let r = lc.cmd(&["INSPECT", &k]).await;
        format!("{r:?}").contains("v7").then_some(())
    })
    .await;
    let fence = writer.acquire(&["CLAIM", "ro-l", "LEASE", "60000"]).await;
    assert_eq!(
        writer
            .cmd(&["COMPLETE", "ro-l", &fence.to_string(), "lv"])
            .await,
        ok()
    );
    let mut r = lc.cmd(&["INSPECT", "ro-l"]).await;
    for _ in 0..3 {
        if !matches!(r, Frame::Error(_)) {
            break;
        }
        r = lc.cmd(&["INSPECT", "ro-l"]).await;
    }
    assert!(format!("{r:?}").contains("lv"), "the learner's read: {r:?}");
    learner.kill().await;
    let removed = writer.cmd(&["CLUSTER", "REMOVE", "4"]).await;
    assert_eq!(removed, ok(), "{removed:?}");
    let mut conn = c.members[l].conn().await;
    assert_eq!(conn.cmd(&["READONLY"]).await, ok());
    assert!(matches!(
        claim(conn.cmd(&["CLAIM", "ro-d", "LEASE", "5000"]).await),
        ClaimReply::Acquired { .. }
    ));
    assert_eq!(conn.cmd(&["READWRITE"]).await, ok());

    let Some(py) = python_with_redis() else {
        return;
    };
    let f = c.followers().await[0];
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/redis_py_replicas.py"
    );
    let out = tokio::process::Command::new(py)
        .args([script, &c.members[f].client.port().to_string(), "20"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the script ends")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok 20",
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Owner load from eight clients against a cluster, following `-MOVED`,
/// while the leader is killed (SIGKILL) at a random moment, `rounds` times;
/// the killed node restarts on its data each time. After every failover a
/// prober claims every key used so far through the new leader, and the
/// whole history is checked (`support::history`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_leaders_under_load_keeps_every_promise_over_the_whole_history() {
    use crate::support::history::{self, History, Recorder};
    let mut c = Cluster::start("history", 3).await;
    let history = History::default();
    let seed = std::process::id() as u64 ^ 0x5eed_c1a5;
    let mut rng = history::Rng(seed);
    let prefix = key("ch");
    let rounds = 6;
    for round in 0..=rounds {
        let l = c.leader().await;
        let mut prober = Recorder::following(usize::MAX, c.members[l].conn().await, &history);
        history::probe_and_check(&mut prober, &history, seed, round)
            .await
            .unwrap_or_else(|violations| panic!("{violations}"));
        if round == rounds {
            break;
        }
        let mut tasks = Vec::new();
        for t in 0..8 {
            // Half start on a follower and follow its redirect.
            let at = if t % 2 == 0 { l } else { (l + 1) % 3 };
            let mut rec = Recorder::following(t, c.members[at].conn().await, &history);
            let prefix = format!("{prefix}-r{round}");
            let mut load_rng = history::Rng(rng.below(u64::MAX));
            let load = async move {
                history::owner_load(&mut rec, &prefix, &[150, 250], &mut load_rng).await
            };
            tasks.push(tokio::spawn(load));
        }
        tokio::time::sleep(Duration::from_millis(400 + rng.below(600))).await;
        c.members[l].kill().await;
        for t in tasks {
            t.await.unwrap();
        }
        c.leader().await;
        c.members[l].start(None, &[]).await;
    }
    let events = history.events();
    let completes = history.completed().len();
    let unknown = events.iter().filter(|e| e.reply.is_none()).count();
    eprintln!(
        "{} calls, {completes} completes, {unknown} unknown",
        events.len()
    );
    assert!(completes > 40, "too little load: {completes} completes");
    assert!(unknown > 0, "no call was cut by a kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_is_replaced_step_by_step() {
    // The README's steps: the dead node is removed, a new machine joins
    // under a new id as a learner, catches up, and is promoted.
    let mut c = Cluster::start("replace", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    for i in 0..100 {
        let k = format!("before-{i}");
        let f = conn.acquire(&["CLAIM", &k]).await;
        assert_eq!(conn.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
    }
    // A follower's machine is gone for good.
    let dead = c.followers().await[0];
    c.members[dead].kill().await;
    let dead_id = c.members[dead].id.to_string();
    // The leader shows it down: CLUSTER MEMBERS said `role follower`,
    // `lag 0` (nothing written meanwhile) and CLUSTER NODES `connected`.
    eventually("the leader shows the dead node unreachable", async || {
        let reach = member_field(&mut conn, &dead_id, "reachable").await;
        let nodes = bulk(&conn.cmd(&["CLUSTER", "NODES"]).await);
        let line = nodes
            .lines()
            .find(|l| l.contains(&c.members[dead].client.to_string()))
            .unwrap_or_default()
            .to_owned();
        (reach == "no" && line.contains("fail?") && line.ends_with("disconnected")).then_some(())
    })
    .await;
    let live = c.members[c.followers().await[0]].id.to_string();
    assert_eq!(member_field(&mut conn, &live, "reachable").await, "yes");
    // Redis tools read the same from CLUSTER NODES' ping-sent and
    // pong-recv (this node's own line `0 0`; a member that stopped
    // answering keeps the time it last did, where every line showed the
    // time of the call) and CLUSTER SHARDS' health (which said `online`).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let nodes = bulk(&conn.cmd(&["CLUSTER", "NODES"]).await);
    let hex = |id: &str| format!("{:040x}", id.parse::<u64>().unwrap());
    let field = |id: &str, i: usize| -> u128 {
        let line = nodes
            .lines()
            .find(|l| l.starts_with(&hex(id)))
            .unwrap_or_else(|| panic!("no line for node {id}: {nodes}"));
        line.split(' ').nth(i).unwrap().parse().unwrap()
    };
    let leader_id = c.members[l].id.to_string();
    assert_eq!(
        (field(&leader_id, 4), field(&leader_id, 5)),
        (0, 0),
        "{nodes}"
    );
    assert_eq!(field(&live, 4), 0, "{nodes}");
    assert!(field(&dead_id, 4) > 0, "{nodes}");
    // The live follower answered within a few heartbeats (100 ms each).
    assert!(
        field(&dead_id, 5) + 1000 <= field(&live, 5),
        "the dead node's pong-recv is not older than the live one's: {nodes}"
    );
    let Frame::Array(shards) = conn.cmd(&["CLUSTER", "SHARDS"]).await else {
        panic!("CLUSTER SHARDS is not an array");
    };
    assert_eq!(shards.len(), 1);
    let pairs = |f: &Frame| -> Vec<(String, Frame)> {
        let Frame::Array(kv) = f else {
            panic!("not a map: {f:?}")
        };
        kv.chunks(2).map(|p| (bulk(&p[0]), p[1].clone())).collect()
    };
    let shard = pairs(&shards[0]);
    assert_eq!(
        shard[0],
        (
            "slots".into(),
            Frame::Array(vec![Frame::Integer(0), Frame::Integer(16383)])
        )
    );
    let Frame::Array(members) = &shard[1].1 else {
        panic!("no nodes: {shard:?}")
    };
    let mut health: Vec<(String, String, String)> = members
        .iter()
        .map(|m| {
            let kv = pairs(m);
            let get = |k: &str| {
                kv.iter()
                    .find(|(name, _)| name == k)
                    .map(|(_, v)| bulk(v))
                    .unwrap()
            };
            (get("id"), get("role"), get("health"))
        })
        .collect();
    health.sort();
    let mut want = vec![
        (hex(&leader_id), "master".to_owned(), "online".to_owned()),
        (hex(&live), "replica".into(), "online".into()),
        (hex(&dead_id), "replica".into(), "failed".into()),
    ];
    want.sort();
    assert_eq!(health, want);
    // 1. Remove it.
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", &dead_id]).await, ok());
    // 2. Start the replacement: a new id, an empty data directory, no
    //    --initial-cluster.
    let mut new = Member::new("replace", 4);
    new.start(None, &[]).await;
    // 3. Add it as a learner; 4. wait until it caught up; 5. promote it.
    let add = new.add_as_learner(&mut conn).await;
    assert_eq!(add, ok());
    let mut nc = new.conn().await;
    eventually("the replacement catches up", async || {
        (int(&nc.cmd(&["DBSIZE"]).await) >= 100).then_some(())
    })
    .await;
    // Refused until the leader has reached it and recorded its data
    // directory (and until it caught up).
    eventually("the replacement can be promoted", async || {
        (conn.cmd(&["CLUSTER", "PROMOTE", "4"]).await == ok()).then_some(())
    })
    .await;
    assert_eq!(c.members[l].info("idem_voters").await, "3");
    // Restarted with the same --initial-cluster as the original nodes (one
    // configuration for every node), which does not list it: ignored,
    // since its data directory holds the membership (it refused to start).
    drop(nc);
    new.kill().await;
    new.start(Some(&c.initial), &[]).await;
    let applied = c.members[l].applied().await;
    new.caught_up_as_follower(applied, "the replacement rejoins")
        .await;
    // The cluster now survives the loss of another original node: the
    // leader dies, the survivor and the replacement elect one.
    c.members[l].kill().await;
    c.members.push(new);
    let l2 = c.leader().await;
    assert_eq!(c.members[l2].info("idem_voters").await, "3");
    let mut conn = c.members[l2].conn().await;
    for i in [0, 50, 99] {
        assert_eq!(
            claim(conn.cmd(&["CLAIM", &format!("before-{i}")]).await),
            ClaimReply::Completed {
                outcome: Outcome::Ok,
                value: "v".into()
            }
        );
    }
    conn.acquire(&["CLAIM", "after-replace"]).await;
}

/// One host that opens peer connections and never completes their
/// handshake (from 127.0.0.2, reconnecting as soon as one is closed) cannot
/// take the places the members need: a new node flooded that way before
/// it is added still hears from the leader and catches up. Its
/// `max_peer_connections` is 32 here, against 64 such connections; each
/// source has at most `max_peer_handshakes_per_source` (8) in the
/// handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_never_completes_peer_handshakes_cannot_crowd_out_the_members() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use tokio::io::AsyncReadExt;
    let c = Cluster::start("peer-flood", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    for i in 0..50 {
        let k = format!("before-{i}");
        let f = conn.acquire(&["CLAIM", &k]).await;
        assert_eq!(conn.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
    }
    let mut new = Member::new("peer-flood", 4);
    // The default max_peer_handshakes_per_source (8); with it raised to
    // 100 the new node never catches up.
    new.start(None, &[("IDEM_MAX_PEER_CONNECTIONS", "32")])
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for _ in 0..64 {
        let (stop, opened, target) = (Arc::clone(&stop), Arc::clone(&opened), new.peer);
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                if let Ok(mut s) = socket.connect(target).await {
                    opened.fetch_add(1, Ordering::Relaxed);
                    // Never answers the challenge: held until the node
                    // closes it.
                    let mut buf = [0u8; 256];
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // The flood is on before the leader first reaches the new node.
    eventually("the flood reaches the new node", async || {
        (opened.load(Ordering::Relaxed) >= 64).then_some(())
    })
    .await;
    let add = new.add_as_learner(&mut conn).await;
    assert_eq!(add, ok());
    let mut nc = new.conn().await;
    eventually(
        "the flooded node hears from the leader and catches up",
        async || (int(&nc.cmd(&["DBSIZE"]).await) >= 50).then_some(()),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.abort();
    }
}

/// A process on the members' own address (here: loopback, where the whole
/// cluster runs) that opens peer connections to every node and never
/// completes their handshake took every place its address had
/// (`max_peer_handshakes_per_source`): the members' own connections were
/// refused, and after a kill -9 of the leader no new one was elected for
/// 17 s, or at all. Now each new connection closes the oldest one still in
/// its handshake from that address, and a member's, done in
/// milliseconds, gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_peer_connections_from_the_members_address_do_not_stop_a_failover() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut c = Cluster::start("peer-flood-same", 3).await;
    let l = c.leader().await;
    c.members[l]
        .conn()
        .await
        .acquire(&["CLAIM", "before"])
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let targets: Vec<std::net::SocketAddr> = c.members.iter().map(|m| m.peer).collect();
    let flood = {
        let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
        tokio::spawn(async move {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                for t in &targets {
                    if let Ok(Ok(s)) = tokio::time::timeout(
                        Duration::from_millis(200),
                        tokio::net::TcpStream::connect(t),
                    )
                    .await
                    {
                        opened.fetch_add(1, Ordering::Relaxed);
                        held.push_back((std::time::Instant::now(), s));
                    }
                }
                while held
                    .front()
                    .is_some_and(|(t, _)| t.elapsed() > Duration::from_secs(3))
                {
                    held.pop_front();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // Well past every address's places before the kill.
    eventually("the flood is on", async || {
        (opened.load(Ordering::Relaxed) >= 600).then_some(())
    })
    .await;
    c.members[l].kill().await;
    let killed = std::time::Instant::now();
    let l2 = c.leader().await;
    let took = killed.elapsed();
    c.members[l2]
        .conn()
        .await
        .acquire(&["CLAIM", "after"])
        .await;
    stop.store(true, Ordering::Relaxed);
    flood.await.unwrap();
    assert!(
        took < Duration::from_secs(10),
        "a new leader took {took:?} with the flood on (about 0.4 s without it)"
    );
}

/// postcard's varint of `v`.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A peer connection to `peer` (node `to` of the cluster whose id is
/// `cluster`, in hex) that has passed the handshake as node `from`, no
/// secret set: what any local process can open on a loopback cluster
/// without `cluster_secret`.
async fn fake_peer(
    peer: std::net::SocketAddr,
    to: u64,
    from: u64,
    cluster: &str,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(peer).await.unwrap();
    let challenge = read_peer_frame(&mut s).await.expect("the node's challenge");
    assert!(!challenge.is_empty());
    // Hello: protocol 2, the cluster id, from, to, a client address, an
    // incarnation, a nonce and a MAC of zeros (no secret).
    let mut hello = vec![2, 1];
    hello.extend((0..16).map(|i| u8::from_str_radix(&cluster[2 * i..2 * i + 2], 16).unwrap()));
    varint(&mut hello, from);
    varint(&mut hello, to);
    hello.push(11);
    hello.extend_from_slice(b"127.0.0.1:1");
    hello.push(1);
    hello.extend_from_slice(&[b'N'; 16]);
    hello.extend_from_slice(&[0; 32]);
    s.write_all(&(hello.len() as u32).to_be_bytes())
        .await
        .unwrap();
    s.write_all(&hello).await.unwrap();
    let welcome = read_peer_frame(&mut s).await.expect("the node's welcome");
    assert_eq!(welcome.first(), Some(&0), "welcomed: {welcome:?}");
    s
}

/// The next length-delimited frame on a peer connection (`None` once it
/// closed or after 5 s).
async fn read_peer_frame(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.ok()?;
        Some(body)
    })
    .await
    .ok()
    .flatten()
}

/// AppendEntries that no leader's log holds, sent by a process that passed
/// the peer handshake (on loopback without `cluster_secret`, any local
/// one; the node id it gave, 9, is no member's). A batch whose body does
/// not decode was appended, committed and applied, and applying it
/// stopped the node ("malformed entry: cut short"; restarted, it kept the
/// entry, and once elected stopped the others with it); entries that skip
/// an index or go back stopped it too ("append of index 8 where 4 was
/// expected"), or panicked in the log store; and a snapshot that was not
/// one stopped it when installed ("bad magic"). They are refused now,
/// entries before Raft sees them and a snapshot once received, and the
/// node serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_entries_and_snapshots_on_the_peer_port_do_not_stop_a_node() {
    let mut c = Cluster::start("forged-entries", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "before"]).await;
    let f = c.followers().await[0];
    let applied = c.members[l].applied().await;
    c.members[f]
        .caught_up_as_follower(applied, "the follower caught up")
        .await;
    let node = &c.members[f];
    let cluster = node.info("idem_cluster_id").await;
    let term: u64 = node.info("cluster_current_epoch").await.parse().unwrap();
    let last: u64 = node.info("idem_last_log_index").await.parse().unwrap();
    let leader = c.members[l].id;
    // An AppendEntries from node 9 in the next term, after the follower's
    // last entry, carrying `entries` (index, batch or blank).
    let forged = |entries: &[(u64, Option<&[u8]>)]| {
        let mut m = vec![0];
        for v in [term + 1, 9, 1, 1, term, leader, last] {
            varint(&mut m, v);
        }
        varint(&mut m, entries.len() as u64);
        for (index, batch) in entries {
            for v in [term + 1, 9, *index] {
                varint(&mut m, v);
            }
            match batch {
                Some(b) => {
                    m.push(1);
                    varint(&mut m, b.len() as u64);
                    m.extend_from_slice(b);
                }
                None => m.push(0),
            }
        }
        let top = entries.last().map_or(last, |e| e.0);
        for v in [1, term + 1, 9, top] {
            varint(&mut m, v);
        }
        m
    };
    // Format 1, state machine version 1, then a stamp cut short.
    let cut: &[u8] = &[1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff];
    let cases = [
        ("a batch cut short", forged(&[(last + 1, Some(cut))])),
        ("an index skipped", forged(&[(last + 5, None)])),
        (
            "indexes going back",
            forged(&[(last + 1, None), (last + 17, None), (last + 12, None)]),
        ),
    ];
    for (what, message) in cases {
        use tokio::io::AsyncWriteExt;
        let mut s = fake_peer(node.peer, node.id, 9, &cluster).await;
        s.write_all(&(message.len() as u32).to_be_bytes())
            .await
            .unwrap();
        s.write_all(&message).await.unwrap();
        let answer = read_peer_frame(&mut s).await.unwrap_or_default();
        // Response::Failed, saying why.
        assert_eq!(
            answer.first(),
            Some(&4),
            "{what}: refused, not handed to Raft: {answer:?}"
        );
        let why = String::from_utf8_lossy(&answer);
        assert!(why.contains("entry"), "{what}: {why}");
    }
    // Their term was never taken: the leader leads on.
    conn.acquire(&["CLAIM", "between"]).await;
    assert_eq!(
        c.leader().await,
        l,
        "the forged entries' term deposed no one"
    );
    assert_eq!(node.info("cluster_current_epoch").await, term.to_string());
    // A snapshot that is not one: its install failed, and a failed install
    // stopped the node ("not an Idem snapshot (bad magic)").
    {
        use tokio::io::AsyncWriteExt;
        let mut m = vec![2];
        for v in [term + 1, 9, 1, 1, term + 1, 9, last + 100] {
            varint(&mut m, v);
        }
        // Its membership: no log id, no configs, no nodes; its id.
        m.extend_from_slice(&[0, 0, 0, 6]);
        m.extend_from_slice(b"forged");
        // Offset 0, eight bytes of data, done.
        m.extend_from_slice(&[0, 8]);
        m.extend_from_slice(b"garbage!");
        m.push(1);
        let mut s = fake_peer(node.peer, node.id, 9, &cluster).await;
        s.write_all(&(m.len() as u32).to_be_bytes()).await.unwrap();
        s.write_all(&m).await.unwrap();
        let answer = read_peer_frame(&mut s).await.unwrap_or_default();
        let why = String::from_utf8_lossy(&answer);
        assert!(
            why.contains("would not load"),
            "the snapshot refused: {why}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let proc = c.members[f].proc.as_mut().unwrap();
    assert!(
        proc.child.try_wait().unwrap().is_none(),
        "the follower stopped: {:?}",
        proc.logs
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
    );
    // The cluster writes on, and the follower applies what its leader
    // commits. (A snapshot's sender is heard as a leader while the chunk
    // is taken, so its higher term may have called an election.)
    let l2 = c.leader().await;
    c.members[l2]
        .conn()
        .await
        .acquire(&["CLAIM", "after"])
        .await;
    let applied = c.members[l2].applied().await;
    if l2 != f {
        c.members[f]
            .caught_up_as_follower(applied, "the follower applies the leader's entries")
            .await;
    }
}

/// Field `name` of member `id` in `CLUSTER MEMBERS` (as text; empty if
/// absent).
async fn member_field(conn: &mut Conn, id: &str, name: &str) -> String {
    let Frame::Array(ms) = conn.cmd(&["CLUSTER", "MEMBERS"]).await else {
        return String::new();
    };
    let text = |f: &Frame| match f {
        Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Frame::Integer(i) => i.to_string(),
        _ => String::new(),
    };
    for m in &ms {
        let pairs: Vec<(String, String)> = match m {
            Frame::Array(f) => f.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect(),
            Frame::Map(kv) => kv.iter().map(|(k, v)| (text(k), text(v))).collect(),
            _ => continue,
        };
        if pairs.iter().any(|(k, v)| k == "id" && v == id) {
            return pairs
                .into_iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v)
                .unwrap_or_default();
        }
    }
    String::new()
}

/// Waits until the leader has recorded every member's data directory.
async fn incarnations_recorded(conn: &mut Conn, members: usize) {
    eventually("every member's incarnation is recorded", async || {
        let Frame::Array(ms) = conn.cmd(&["CLUSTER", "MEMBERS"]).await else {
            return None;
        };
        let recorded = ms
            .iter()
            .filter(|m| {
                let Frame::Array(f) = m else { return false };
                f.windows(2).any(|w| {
                    matches!(&w[0], Frame::Bulk(k) if &k[..] == b"incarnation")
                        && matches!(&w[1], Frame::Bulk(v) if v.len() == 16)
                })
            })
            .count();
        (recorded == members).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_restarted_on_an_empty_data_dir_is_kept_out() {
    // Restarted with the command that added it (no --initial-cluster), so
    // the bootstrap probe does not run: the recorded incarnation of its
    // data directory is what keeps it out.
    let mut c = Cluster::start("wiped", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    incarnations_recorded(&mut conn, 3).await;
    for i in 0..20 {
        conn.acquire(&["CLAIM", &format!("w-{i}")]).await;
    }
    let fs = c.followers().await;
    let (wiped, other) = (fs[0], fs[1]);
    c.members[wiped].kill().await;
    std::fs::remove_dir_all(&c.members[wiped].dir.0).unwrap();
    c.members[wiped].start(None, &[]).await;
    // It gets nothing: no leader, no log, no records.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = &c.members[wiped];
    assert_eq!(m.info("idem_applied_index").await, "0");
    assert_eq!(m.info("idem_leader_id").await, "");
    assert_eq!(int(&m.conn().await.cmd(&["DBSIZE"]).await), 0);
    // It says why, to its clients and in its log (it said only that it
    // waited to be added, the reason being logged on the leader alone).
    let e = m.conn().await.cmd(&["CLAIM", "on-the-wiped-node"]).await;
    assert!(
        matches!(&e, Frame::Error(t) if t.starts_with(b"CLUSTERDOWN this node's data directory is not the one")),
        "{e:?}"
    );
    let logged = m
        .proc
        .as_ref()
        .unwrap()
        .logged("a member keeps this node out", Duration::from_secs(5))
        .await;
    assert!(
        logged.iter().any(|l| l.contains("CLUSTER REMOVE")),
        "{logged:?}"
    );
    // And it does not count towards a majority: with the other follower
    // gone, the leader cannot commit.
    c.members[other].kill().await;
    let started = std::time::Instant::now();
    let r = conn.cmd(&["CLAIM", "no-quorum"]).await;
    // Within proposal_timeout_ms (10 s by default).
    assert!(started.elapsed() < Duration::from_secs(11));
    assert!(
        matches!(&r, Frame::Error(_)),
        "a write committed without a majority: {r:?}"
    );
    // The other follower back: the cluster works again (the wiped node
    // still outside it), and the wiped id is removed (and never reused).
    c.members[other].start(None, &[]).await;
    let applied = eventually("the wiped node answers", async || {
        Some(c.members[wiped].info("idem_applied_index").await).filter(|a| !a.is_empty())
    })
    .await;
    assert_eq!(applied, "0", "the wiped node was let back in");
    c.members[wiped].kill().await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "quorum-again"]).await;
    let id = c.members[wiped].id.to_string();
    assert_eq!(conn.cmd(&["CLUSTER", "REMOVE", &id]).await, ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_killed_and_restarted_keeps_every_record() {
    let mut c = Cluster::start("all-down", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let mut fences = Vec::new();
    for i in 0..50 {
        let k = format!("all-{i}");
        let f = conn.acquire(&["CLAIM", &k, "LEASE", "60000"]).await;
        if i % 2 == 0 {
            assert_eq!(conn.cmd(&["COMPLETE", &k, &f.to_string(), "v"]).await, ok());
        }
        fences.push(f);
    }
    // kill -9 every node, then start them all again on their data (the
    // same command: --initial-cluster is ignored now).
    for m in &mut c.members {
        m.kill().await;
    }
    let init = c.initial.clone();
    let futs = c.members.iter_mut().map(|m| {
        let init = init.clone();
        async move { m.start(Some(&init), &[]).await }
    });
    futures_util::future::join_all(futs).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    for (i, f) in fences.iter().enumerate() {
        let k = format!("all-{i}");
        match claim(conn.cmd(&["CLAIM", &k]).await) {
            ClaimReply::Completed { value, .. } if i % 2 == 0 => assert_eq!(&value[..], b"v"),
            ClaimReply::InFlight { .. } if i % 2 == 1 => {
                // Its owner still holds it, and can renew.
                let r = conn
                    .cmd(&["RENEW", &k, &f.to_string(), "LEASE", "60000"])
                    .await;
                assert_eq!(r, ok(), "{k}");
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    let f = conn.acquire(&["CLAIM", "after-restart"]).await;
    assert!(fences.iter().all(|&x| x < f));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_is_parked_again_on_the_new_leader() {
    use idem_client::{ClaimOutcome, Client, ClientConfig};
    let mut c = Cluster::start("re-park", 3).await;
    let l = c.leader().await;
    // An owner that never renews: its 2 s lease runs out after the
    // failover.
    let mut owner = c.members[l].conn().await;
    let k = key("parked");
    owner.acquire(&["CLAIM", &k, "LEASE", "2000"]).await;
    let client = Client::connect_with_config(
        c.seeds(),
        ClientConfig::default().backoff(Duration::from_millis(20), Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let waiter = {
        let (client, k) = (client.clone(), k.clone());
        tokio::spawn(async move { client.claim(k.as_str()).wait(Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.members[l].kill().await;
    // The waiter's connection broke: the client finds the new leader,
    // parks there again, and is handed the key when the lease runs out.
    let got = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was answered")
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            got,
            ClaimOutcome::Acquired(_) | ClaimOutcome::Recover { .. }
        ),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    if let ClaimOutcome::Acquired(g) | ClaimOutcome::Recover { claim: g, .. } = got {
        g.complete("after-failover").await.unwrap();
    }
}

/// Sends `sig` (`STOP`, `CONT`) to member `m`'s process.
fn signal(m: &Member, sig: &str) {
    let pid = m.proc.as_ref().expect("running").child.id().expect("a pid");
    let status = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// The member other than `l` that leads and serves (answers a read), once
/// one does.
async fn serving_leader_among_the_others(c: &Cluster, l: usize, what: &str) -> usize {
    let others: Vec<usize> = (0..c.members.len()).filter(|&i| i != l).collect();
    eventually(what, async || {
        for &i in &others {
            if c.members[i].info("idem_role").await == "leader" {
                let mut c2 = c.members[i].conn().await;
                if let Some(Frame::Array(_) | Frame::Null) =
                    c2.try_cmd(&["INSPECT", "probe-leader"]).await
                {
                    return Some(i);
                }
            }
        }
        None
    })
    .await
}

/// A leader paused (SIGSTOP, as a long GC pause or a frozen VM would)
/// while the others elect a new leader and take writes, then resumed:
/// the requests waiting in its sockets are the first thing it reads, with
/// its role and lease as they were before the pause. It must answer them
/// `-TRYAGAIN` or `-MOVED` (or with what the new leader wrote), never
/// with the old state: no read misses a write acknowledged meanwhile, and
/// no claim is granted a second owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_resumed_after_a_failover_answers_nothing_stale() {
    let mut c = Cluster::start("paused-leader", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let f = conn
        .acquire(&["CLAIM", "before-pause", "LEASE", "60000"])
        .await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "before-pause", &f.to_string(), "old"])
            .await,
        ok()
    );
    // Connections to the old leader, opened while it runs.
    let mut read = c.members[l].conn().await;
    let mut write = c.members[l].conn().await;
    signal(&c.members[l], "STOP");
    // The others elect a leader among themselves (the paused node's
    // socket accepts but never answers: it is not asked).
    let l2 =
        serving_leader_among_the_others(&c, l, "a new leader while the old one is paused").await;
    let mut conn2 = c.members[l2].conn().await;
    let f2 = conn2
        .acquire(&["CLAIM", "after-pause", "LEASE", "60000"])
        .await;
    assert_eq!(
        conn2
            .cmd(&["COMPLETE", "after-pause", &f2.to_string(), "new"])
            .await,
        ok()
    );
    // Asked while paused, answered first thing once resumed.
    read.write(&["INSPECT", "after-pause"]).await;
    write
        .write(&["CLAIM", "after-pause", "LEASE", "60000"])
        .await;
    signal(&c.members[l], "CONT");
    let answers = [("INSPECT", &mut read), ("CLAIM", &mut write)];
    for (what, conn) in answers {
        let r = tokio::time::timeout(Duration::from_secs(10), conn.reply())
            .await
            .unwrap_or_else(|_| panic!("the resumed leader answers the {what}"));
        match &r {
            Frame::Error(_) => {
                let e = err(&r);
                assert!(
                    e.starts_with("TRYAGAIN") || e.starts_with("MOVED"),
                    "{what} on the resumed leader: {e}"
                );
            }
            _ if what == "CLAIM" => assert_eq!(
                claim(r),
                ClaimReply::Completed {
                    outcome: Outcome::Ok,
                    value: "new".into()
                },
                "a CLAIM on the resumed leader saw the old state"
            ),
            // INSPECT of the completed record: it names its value.
            _ => assert!(
                format!("{r:?}").contains("new"),
                "an INSPECT on the resumed leader saw the old state: {r:?}"
            ),
        }
    }
    // It rejoins as a follower and catches up on what it missed.
    let applied = c.members[l2].applied().await;
    c.members[l]
        .caught_up_as_follower(applied, "the resumed leader rejoins as a follower")
        .await;
    let mut conn2 = c.members[l2].conn().await;
    assert_completed(
        &mut conn2,
        &[
            ("before-pause".into(), "old".into()),
            ("after-pause".into(), "new".into()),
        ],
        "after the paused leader resumed",
    )
    .await;
    c.members[l].kill().await;
}

/// The environment of a node with `election_timeout_ms` set to `ms`, cut
/// off from its peers while `faults` holds its isolate file.
#[cfg(debug_assertions)]
fn timeout_env<'a>(faults: &'a DataDir, ms: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("IDEM_ELECTION_TIMEOUT_MS", ms),
        ("IDEMD_TEST_ISOLATE_DIR", faults.arg()),
    ]
}

/// `INSPECT key` on a cut-off leader (through `read`), after a new leader
/// completed `key` with `new`: redirected, refused, or the new state;
/// never the old one (`stale` says so).
#[cfg(debug_assertions)]
async fn cut_off_read_is_not_stale(read: &mut Conn, key: &str, stale: &str) {
    let r = tokio::time::timeout(Duration::from_secs(10), read.cmd(&["INSPECT", key]))
        .await
        .expect("the cut-off leader answers");
    match &r {
        Frame::Error(_) => {
            let e = err(&r);
            assert!(
                e.starts_with("TRYAGAIN") || e.starts_with("MOVED"),
                "INSPECT on the cut-off leader: {e}"
            );
        }
        _ => assert!(format!("{r:?}").contains("new"), "{stale}: {r:?}"),
    }
}

/// `election_timeout_ms` set larger on the leader than on its followers
/// (raised on one node and not the others): each follower keeps its vote
/// for the leader it heard from for its own value only, yet the leader
/// served reads on a majority's answers for four fifths of its own (2.4 s
/// against 300 ms here) and heartbeated every third of its own. Cut off
/// from its followers, it went on answering reads with what it held while
/// they had elected another leader and taken writes; and left alone, the
/// followers, hearing from it once a second, elected one of themselves
/// every few seconds. Its lease now follows the smallest value among its
/// voters (INFO `raft_lease_ms`), and it heartbeats often enough to keep
/// that lease: reads do not wait for a heartbeat, and the leader stays.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_serves_no_longer_than_its_followers_keep_their_votes() {
    let faults = DataDir::new("lease-cap-faults");
    std::fs::create_dir_all(&faults.0).unwrap();
    let (long, short) = (timeout_env(&faults, "3000"), timeout_env(&faults, "300"));
    let mut c = Cluster::start_with("lease-cap", 3, &long).await;
    let l = c.leader().await;
    let lease = async |m: &Member| info_field(&mut m.conn().await, "raft_lease_ms").await;
    assert_eq!(lease(&c.members[l]).await, 2400, "four fifths of its own");
    // The followers restarted with a smaller value, one at a time.
    let init = c.initial.clone();
    for f in (0..c.members.len()).filter(|&i| i != l) {
        c.members[f].kill().await;
        c.members[f].start(Some(&init), &short).await;
        eventually("the restarted follower rejoins", async || {
            (c.members[f].info("idem_leader_id").await == c.members[l].id.to_string()).then_some(())
        })
        .await;
    }
    eventually("the leader's lease follows its followers'", async || {
        (lease(&c.members[l]).await == 240).then_some(())
    })
    .await;
    // Left alone for a few of its own heartbeat intervals, it still leads,
    // and serves reads without holding them for its lease to be renewed.
    let mut conn = c.members[l].conn().await;
    let f = conn.acquire(&["CLAIM", "before", "LEASE", "60000"]).await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "before", &f.to_string(), "old"])
            .await,
        ok()
    );
    let term = c.members[l].info("cluster_current_epoch").await;
    let (_, held_before) = info_pair(&c.members[l], "raft_lease_lapses", "raft_lease_held").await;
    for _ in 0..60 {
        let r = conn.cmd(&["INSPECT", "before"]).await;
        assert!(
            format!("{r:?}").contains("old"),
            "a read on the leader: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, held) = info_pair(&c.members[l], "raft_lease_lapses", "raft_lease_held").await;
    // (Its own heartbeats alone, once a second, would leave three in four
    // of these reads held; a heartbeat answered late on a busy machine
    // may hold one or two.)
    assert!(
        held - held_before <= 2,
        "reads waited for the lease to be renewed: {held_before} -> {held} held"
    );
    assert_eq!(
        c.members[l].info("cluster_current_epoch").await,
        term,
        "the followers elected another leader meanwhile"
    );
    // Cut off: the followers elect another leader, which takes a write; a
    // read on the cut-off one must not see the old state.
    let mut read = c.members[l].conn().await;
    let old = c.members[l].id;
    std::fs::write(faults.0.join(format!("isolate-{old}")), b"").unwrap();
    let l2 =
        serving_leader_among_the_others(&c, l, "a new leader while the old one is cut off").await;
    let mut conn2 = c.members[l2].conn().await;
    let fa = conn2.acquire(&["CLAIM", "after", "LEASE", "60000"]).await;
    assert_eq!(
        conn2
            .cmd(&["COMPLETE", "after", &fa.to_string(), "new"])
            .await,
        ok()
    );
    cut_off_read_is_not_stale(
        &mut read,
        "after",
        "the cut-off leader served the old state",
    )
    .await;
    std::fs::remove_file(faults.0.join(format!("isolate-{old}"))).unwrap();
    c.members[l].kill().await;
}

/// Followers restarted with a smaller `election_timeout_ms` (3000 to
/// 300 ms at once, where the docs asked for a tenth per rolling restart)
/// kept their vote for their leader only 300 ms from their restart, while
/// it served on what they had answered before for 2.4 s: cut off from
/// them, it answered a read with what the leader they elected meanwhile
/// had overwritten. A node now records the value it runs with in its
/// data directory, and started with a smaller one first waits out the
/// difference.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_restarted_with_a_smaller_election_timeout_keep_their_earlier_votes() {
    let faults = DataDir::new("lowered-faults");
    std::fs::create_dir_all(&faults.0).unwrap();
    let (long, short) = (timeout_env(&faults, "3000"), timeout_env(&faults, "300"));
    let mut c = Cluster::start_with("lowered", 3, &long).await;
    let l = c.leader().await;
    let old = c.members[l].id;
    let mut read = c.members[l].conn().await;
    let mut conn = c.members[l].conn().await;
    cmd_served(&mut conn, &["INSPECT", "warm"]).await;
    // Answered by a majority just before the cut: the leader's lease runs
    // for 2.4 s from it.
    let f = conn.acquire(&["CLAIM", "k", "LEASE", "60000"]).await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "k", &f.to_string(), "old"]).await,
        ok()
    );
    std::fs::write(faults.0.join(format!("isolate-{old}")), b"").unwrap();
    let followers: Vec<usize> = (0..c.members.len()).filter(|&i| i != l).collect();
    for &i in &followers {
        c.members[i].kill().await;
    }
    let init = c.initial.clone();
    for &i in &followers {
        c.members[i].start(Some(&init), &short).await;
    }
    let l2 = serving_leader_among_the_others(&c, l, "a leader among the restarted followers").await;
    let mut conn2 = c.members[l2].conn().await;
    let f2 = conn2.acquire(&["CLAIM", "k2", "LEASE", "60000"]).await;
    assert_eq!(
        conn2.cmd(&["COMPLETE", "k2", &f2.to_string(), "new"]).await,
        ok()
    );
    cut_off_read_is_not_stale(
        &mut read,
        "k2",
        "the cut-off leader served what was overwritten",
    )
    .await;
    for &i in &followers {
        let kept = std::fs::read_to_string(c.members[i].dir.0.join("election-timeout-ms")).unwrap();
        assert_eq!(kept.trim(), "300", "the value it runs with, recorded");
    }
    std::fs::remove_file(faults.0.join(format!("isolate-{old}"))).unwrap();
    c.members[l].kill().await;
}

/// Both followers' disks stall once for longer than the leader's lease
/// (no answer comes from either meanwhile), then recover: the leader holds
/// the requests that arrive while its lease has lapsed until a majority
/// answers again, and serves them then, instead of failing them with
/// `-TRYAGAIN`. (An election timeout of 2.5 s: a lease of 2 s, and the
/// followers, blocked 2.3 s in the sync, do not campaign when it ends.)
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_holds_requests_through_a_short_stall_of_its_followers_disks() {
    let slow = SlowSyncs::new("disk-hiccup");
    let c = Cluster::start_each("disk-hiccup", 3, |id| {
        let mut env = slow.env(id);
        env.push(("IDEM_ELECTION_TIMEOUT_MS".into(), "2500".into()));
        env
    })
    .await;
    let l = c.leader().await;
    let followers = c.followers().await;
    let mut conn = c.members[l].conn().await;
    let (held, failed) = (
        info_field(&mut conn, "raft_lease_held").await,
        info_field(&mut conn, "raft_lease_held_failed").await,
    );
    // The followers' next sync takes 2.3 s; the ones after it none.
    for &f in &followers {
        slow.set(c.members[f].id, 2_300);
    }
    let started = std::time::Instant::now();
    let mut w = c.members[l].conn().await;
    w.write(&["CLAIM", "hiccup-first", "LEASE", "60000"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for &f in &followers {
        slow.set(c.members[f].id, 0);
    }
    // Reads all along (answered from the leader's store: they need the
    // lease), and a write once it has lapsed.
    let mut writer = c.members[l].conn().await;
    let mut wrote = None;
    let mut reads = 0;
    while started.elapsed() < Duration::from_millis(3_000) {
        let r = conn.cmd(&["INSPECT", "hiccup-first"]).await;
        assert!(!matches!(r, Frame::Error(_)), "a read in the stall: {r:?}");
        reads += 1;
        if wrote.is_none() && started.elapsed() > Duration::from_millis(2_150) {
            writer
                .write(&["CLAIM", "hiccup-second", "LEASE", "60000"])
                .await;
            wrote = Some(std::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(wrote.is_some() && reads > 10);
    for (what, conn) in [("the first write", &mut w), ("the held write", &mut writer)] {
        let r = tokio::time::timeout(Duration::from_secs(10), conn.reply())
            .await
            .unwrap_or_else(|_| panic!("{what} is answered"));
        assert!(
            matches!(claim(r.clone()), ClaimReply::Acquired { .. }),
            "{what}: {r:?}"
        );
    }
    // Requests were held through a lapse (else this proves nothing), and
    // none failed.
    assert!(
        info_field(&mut conn, "raft_lease_held").await > held,
        "no request was held"
    );
    assert_eq!(
        info_field(&mut conn, "raft_lease_held_failed").await,
        failed,
        "a held request was failed"
    );
}

/// A three-node cluster named `name` whose first node to reach crash
/// point `point` exits there, once (`IDEMD_TEST_CRASH`, debug builds), and
/// the file that says it did (in the directory returned, kept as long as
/// it is).
async fn cluster_crashing_at(name: &str, point: &str) -> (DataDir, std::path::PathBuf, Cluster) {
    let dir = DataDir::new(&format!("{name}-crash"));
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("crashed");
    let env = format!("{point}:{}", file.display());
    let c = Cluster::start_with(name, 3, &[("IDEMD_TEST_CRASH", &env)]).await;
    (dir, file, c)
}

/// A leader killed between the two steps of `CLUSTER PROMOTE` (the joint
/// configuration committed, the new one not yet) left the cluster in joint
/// consensus for good: `CLUSTER MEMBERS` showed the learner as a voter
/// (PROMOTE again: "already a voter"), yet every commit needed a majority
/// of the old voters too, so the cluster went down with a majority of its
/// voters up. The next leader now finishes the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_its_leader_died_in_is_finished_by_the_next_leader() {
    if !cfg!(debug_assertions) {
        return; // The crash point is a debug build's.
    }
    let (_crash, file, mut c) = cluster_crashing_at("half-promote", "uniform").await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    conn.acquire(&["CLAIM", "before"]).await;
    let mut four = Member::new("half-promote", 4);
    four.start(None, &[]).await;
    assert_eq!(four.add_as_learner(&mut conn).await, ok());
    let committed: u64 = c.members[l]
        .info("idem_commit_index")
        .await
        .parse()
        .unwrap();
    eventually("the learner catches up", async || {
        (four.applied().await >= committed && four.info("idem_role").await == "learner")
            .then_some(())
    })
    .await;
    // The leader dies once the joint configuration is committed.
    let r = eventually("PROMOTE is taken", async || {
        let r = conn.try_cmd(&["CLUSTER", "PROMOTE", "4"]).await;
        let unknown =
            matches!(&r, Some(Frame::Error(e)) if e.ends_with(b"wait until it catches up"));
        (!unknown).then_some(r)
    })
    .await;
    assert!(
        file.exists(),
        "the leader did not reach the crash point: {r:?}"
    );
    c.members[l].kill().await;
    c.members.push(four);
    let n = c.leader().await;
    eventually_within(
        Duration::from_secs(30),
        "the next leader finishes the promotion",
        async || {
            (c.members[n].info("idem_membership").await == "uniform"
                && c.members[n].info("idem_voters").await == "4")
                .then_some(())
        },
    )
    .await;
    // Every member holds the new configuration, and the cluster serves.
    for m in c.members.iter().filter(|m| m.proc.is_some()) {
        eventually(
            &format!("node {} is past the joint configuration", m.id),
            async || (m.info("idem_membership").await == "uniform").then_some(()),
        )
        .await;
    }
    let mut conn = c.members[n].conn().await;
    acquire_served(&mut conn, "after").await;
}

/// A leader killed in `CLUSTER REMOVE` after it recorded the id as retired
/// and before it removed the member left a voter that called itself
/// removed ("stop this one") while the cluster still counted it: an
/// operator who stopped it was one failure from an outage. The next
/// leader now finishes the removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_its_leader_died_in_is_finished_by_the_next_leader() {
    if !cfg!(debug_assertions) {
        return; // The crash point is a debug build's.
    }
    let (_crash, file, mut c) = cluster_crashing_at("half-remove", "retired").await;
    let l = c.leader().await;
    let f = (l + 1) % 3;
    let gone = c.members[f].id;
    let mut conn = c.members[l].conn().await;
    let _ = conn
        .try_cmd(&["CLUSTER", "REMOVE", &gone.to_string()])
        .await;
    assert!(file.exists(), "the leader did not reach the crash point");
    c.members[l].kill().await;
    // While the old leader is down the removal waits: proposed now, its
    // joint configuration would need a majority of the voters left (the
    // old leader and the third node) and stop every write. The third node
    // leads, with the vote of the node being removed, and serves.
    let third = (0..3).find(|&i| i != l && i != f).unwrap();
    let mut tc = c.members[third].conn().await;
    let r = eventually_within(
        Duration::from_secs(30),
        "the third node serves",
        async || match tc.try_cmd(&["CLAIM", "meanwhile"]).await {
            Some(r @ Frame::Array(_)) => Some(r),
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        },
    )
    .await;
    assert!(
        matches!(claim(r.clone()), ClaimReply::Acquired { .. }),
        "{r:?}"
    );
    assert_eq!(c.members[third].info("idem_voters").await, "3");
    // The node being removed still counts: it sends clients to the leader
    // (it said "removed ... stop this one").
    let mut fc = c.members[f].conn().await;
    let r = eventually_within(
        Duration::from_secs(10),
        "the node being removed redirects to the leader",
        async || match fc.try_cmd(&["CLAIM", "meanwhile-f"]).await {
            Some(r @ Frame::Error(_)) if err(&r).starts_with("MOVED") => Some(err(&r)),
            other => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                eprintln!("node being removed answered {other:?}");
                None
            }
        },
    )
    .await;
    assert!(r.ends_with(&c.members[third].client.to_string()), "{r}");
    // The old leader back, the removal is finished.
    c.members[l].start(None, &[]).await;
    let n = third;
    eventually_within(
        Duration::from_secs(30),
        "the next leader finishes the removal",
        async || {
            let m = &c.members[n];
            (m.info("idem_voters").await == "2"
                && m.info("cluster_known_nodes").await == "2"
                && m.info("idem_retired").await == gone.to_string())
            .then_some(())
        },
    )
    .await;
    let mut conn = c.members[n].conn().await;
    acquire_served(&mut conn, "after").await;
}

/// A leader that removed itself held the writes in flight at that moment,
/// and those queued behind them, until `proposal_timeout_ms` ran out
/// (10 s by default): openraft keeps it leader of a membership without
/// it, so their entries were never answered. They are answered as soon as
/// it stops serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_on_a_leader_that_removes_itself_are_answered_at_once() {
    let c = Cluster::start_with("self-remove", 3, &[("IDEM_PROPOSAL_TIMEOUT_MS", "30000")]).await;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let l = c.leader().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..4 {
        let mut conn = c.members[l].conn().await;
        let stop = Arc::clone(&stop);
        load.push(tokio::spawn(async move {
            let (mut i, mut last) = (0u64, Frame::Null);
            while !stop.load(Ordering::Relaxed) {
                let k = format!("self-remove-{w}-{i}");
                let attempt = format!("a{w}-{i}");
                last = conn.cmd(&["CLAIM", &k, "ATTEMPT", &attempt]).await;
                i += 1;
            }
            last
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admin = c.members[l].conn().await;
    let id = c.members[l].id.to_string();
    assert_eq!(admin.cmd(&["CLUSTER", "REMOVE", &id]).await, ok());
    // The load goes on as the leader steps down.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    // Every request of the load ends (removed: `-CLUSTERDOWN`; in flight:
    // `-TRYAGAIN ... may have been applied`) well before the 30 s
    // proposal_timeout_ms.
    let ended = tokio::time::timeout(Duration::from_secs(5), futures_util::future::join_all(load))
        .await
        .expect("requests on the removed leader were held");
    // Each went on to ask the removed node, which says so.
    for last in ended {
        let last = last.unwrap();
        assert!(
            matches!(&last, Frame::Error(e) if e.starts_with(b"CLUSTERDOWN this node was removed")),
            "{last:?}"
        );
    }
}

/// A leader that removed itself kept its connections to its former
/// followers (pooled for reuse), so they campaigned only on their own
/// timers, after a random election timeout more (~0.9 s without a
/// leader), and meanwhile told clients `the leader's client address is not
/// known yet`. Now it closes them, and they campaign as soon as their
/// lease on it runs out, as when a leader dies; meanwhile they say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_leader_that_removes_itself_campaign_at_once() {
    let c = Cluster::start("self-remove-quick", 3).await;
    let l = c.leader().await;
    let f = c.followers().await;
    let before = quick_elections(&c.members[f[0]]).await + quick_elections(&c.members[f[1]]).await;
    let mut admin = c.members[l].conn().await;
    let id = c.members[l].id.to_string();
    assert_eq!(admin.cmd(&["CLUSTER", "REMOVE", &id]).await, ok());
    let mut conns = [c.members[f[0]].conn().await, c.members[f[1]].conn().await];
    let mut said = std::collections::BTreeSet::new();
    eventually("a new leader serves", async || {
        for fc in conns.iter_mut() {
            let r = fc.cmd(&["CLAIM", "after-removal"]).await;
            match &r {
                // A MOVED names a slot and an address that change.
                Frame::Error(e) if e.starts_with(b"MOVED") => {
                    said.insert("MOVED".to_owned());
                }
                Frame::Error(e) => {
                    said.insert(String::from_utf8_lossy(e).into_owned());
                }
                _ => {
                    if let Ok(ClaimReply::Acquired { .. }) = ClaimReply::from_frame(r) {
                        return Some(());
                    }
                }
            }
        }
        None
    })
    .await;
    assert!(
        !said
            .iter()
            .any(|e| e.contains("client address is not known")),
        "{said:?}"
    );
    let after = quick_elections(&c.members[f[0]]).await + quick_elections(&c.members[f[1]]).await;
    assert!(
        after > before,
        "no follower campaigned as soon as its lease on the removed leader ran out: {said:?}"
    );
}

/// A learner never campaigns, so it went on naming a dead leader
/// (`cluster_state:ok`, `-MOVED` to it) for as long as the voters could
/// not elect another. Once it has not heard from the leader for longer
/// than an election takes, it says the cluster is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_no_longer_hears_a_leader_says_the_cluster_is_down() {
    let mut c = Cluster::start("learner-down", 3).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let mut four = Member::new("learner-down", 4);
    four.start(None, &[]).await;
    assert_eq!(four.add_as_learner(&mut conn).await, ok());
    eventually("the learner follows the leader", async || {
        (four.info("idem_role").await == "learner" && four.info("cluster_state").await == "ok")
            .then_some(())
    })
    .await;
    let mut lc = four.conn().await;
    assert!(
        matches!(lc.cmd(&["CLAIM", "k"]).await, Frame::Error(e) if e.starts_with(b"MOVED")),
        "a learner redirects to the leader"
    );
    // The leader and another voter die at once: no majority is left to
    // elect one. (The learner may have heard the leader only before it
    // knew its members, with its first entries: it recorded hearing no
    // one, and said `cluster_state:ok` for good, failing here every time
    // once the kill came right after the join; on CI, twice under load.)
    let f = (0..c.members.len()).find(|&i| i != l).unwrap();
    c.members[l].kill().await;
    c.members[f].kill().await;
    // (About 3.4 s: four times its lease and election timeout; more on a
    // loaded machine, where a CI run once took over 10 s.)
    eventually_within(
        Duration::from_secs(30),
        "the learner says the cluster is down",
        async || (four.info("cluster_state").await == "fail").then_some(()),
    )
    .await;
    let e = lc.cmd(&["CLAIM", "k"]).await;
    assert!(
        matches!(&e, Frame::Error(m) if m.starts_with(b"CLUSTERDOWN")),
        "{e:?}"
    );
    // A voter comes back: a leader is elected, and the learner follows it.
    c.members[l].start(None, &[]).await;
    eventually_within(
        Duration::from_secs(30),
        "the learner follows the new leader",
        async || (four.info("cluster_state").await == "ok").then_some(()),
    )
    .await;
}
