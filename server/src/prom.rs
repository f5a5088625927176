//! Prometheus metrics: `GET /metrics` on `metrics_listen`, in the text
//! exposition format, read from the same counters as INFO (the two views
//! cannot disagree). Names follow Prometheus's conventions: an `idem_`
//! prefix, base units (seconds, bytes), `_total` for counters, and labels
//! of small, fixed cardinality only (command, error code, outcome; never a
//! key, a user or a client).
//!
//! The listener is a minimal HTTP/1.1 responder: one request a connection
//! (`Connection: close`), its head read within [`REQUEST_TIMEOUT`] and at
//! most [`MAX_HEAD`] bytes, at most [`MAX_SCRAPES`] connections at once
//! (more are closed at once). It has no authentication, and clients that
//! open connections and send nothing can keep scrapes out: serve it on
//! loopback or a trusted network.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info};

use openraft::ServerState;

use crate::cmdstats::HISTOGRAM_BOUNDS_US;
use crate::engine::raft::cluster::ClusterView;
use crate::metrics::get;
use crate::node::Node;

/// Longest request head read.
pub const MAX_HEAD: usize = 4096;
/// How long a scraper may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes served at once.
pub const MAX_SCRAPES: usize = 16;

/// Serves `GET /metrics` on `listener` until `stop` turns true.
pub async fn serve(node: Node, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    if let Ok(addr) = listener.local_addr() {
        info!(addr = %addr, "metrics on http://{addr}/metrics");
    }
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => return,
            a = listener.accept() => a,
        };
        let Ok((socket, _)) = accepted else {
            // Out of descriptors or a transient error: try again shortly.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(&node, socket).await {
                debug!(error = %e, "metrics request failed");
            }
            drop(permit);
        });
    }
}

/// Reads one request head and answers it.
async fn answer(node: &Node, mut socket: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() >= MAX_HEAD {
                return Ok(false);
            }
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                return Ok(false);
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(true)
    })
    .await;
    let whole = match read {
        Ok(r) => r?,
        Err(_) => false,
    };
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, kind, body) = if !whole {
        ("400 Bad Request", "text/plain", "bad request\n".to_owned())
    } else if method != b"GET" && method != b"HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_owned(),
        )
    } else if path != b"/metrics" {
        ("404 Not Found", "text/plain", "GET /metrics\n".to_owned())
    } else {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(node),
        )
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != b"HEAD" {
        out.push_str(&body);
    }
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        socket.write_all(out.as_bytes()).await?;
        socket.shutdown().await
    })
    .await
    .unwrap_or(Ok(()))
}

/// Writes one metric family: its help, type, and samples (`labels` in
/// braces, or none).
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = write!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }

    /// A family with one sample per value of one label.
    fn labelled<V: std::fmt::Display>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (&'static str, V)>,
    ) {
        self.family(name, kind, help);
        for (value, n) in samples {
            self.sample(name, &format!("{label}=\"{value}\""), n);
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }
}

/// The membership's voters, and on the leader the other members it
/// reaches and how far behind each one is.
fn replicas(o: &mut Out, v: &ClusterView) {
    // As ROLE sees it: the leader once it serves.
    let leads = v.state == ServerState::Leader && v.serving && !v.removed;
    o.one(
        "idem_raft_voters",
        "gauge",
        "Voting members in this node's membership.",
        v.members.iter().filter(|m| m.voter).count(),
    );
    let others = || v.members.iter().filter(|m| m.id != v.me);
    let answering = |voters: bool| {
        if leads {
            others()
                // As ROLE lists replicas (with a client address); voters
                // whatever address they were last seen with.
                .filter(|m| {
                    m.answering()
                        && if voters {
                            m.voter
                        } else {
                            !m.addr.client.is_empty()
                        }
                })
                .count()
        } else {
            0
        }
    };
    o.one(
        "idem_raft_replicas_connected",
        "gauge",
        "On the leader: the other members that answer it (ROLE's replicas: answered its last call, or one within 1 s), learners included; 0 elsewhere.",
        answering(false),
    );
    o.one(
        "idem_raft_voters_connected",
        "gauge",
        "On the leader: the other voters that answer it; 0 elsewhere. Below idem_raft_voters - 1, one more failure may stop writes.",
        answering(true),
    );
    o.family(
        "idem_raft_replica_lag_entries",
        "gauge",
        "On the leader: how many log entries each other member lacks (by node id).",
    );
    if leads {
        for m in others() {
            if let Some(matched) = m.matched {
                o.sample(
                    "idem_raft_replica_lag_entries",
                    &format!("node=\"{}\"", m.id),
                    v.last_log_index.saturating_sub(matched),
                );
            }
        }
    }
}

/// The exposition text.
pub fn render(node: &Node) -> String {
    let mut o = Out(String::with_capacity(8192));
    let st = node.engine().stats();
    let c = &st.counters;
    let m = node.metrics();
    let w = &node.waiters().stats;

    o.family(
        "idem_build_info",
        "gauge",
        "The build and engine, as labels.",
    );
    o.sample(
        "idem_build_info",
        &format!(
            "version=\"{}\",engine=\"{}\"",
            env!("CARGO_PKG_VERSION"),
            node.engine().kind().as_str()
        ),
        1,
    );
    o.one(
        "idem_uptime_seconds",
        "gauge",
        "Seconds since the process started.",
        node.started().elapsed().as_secs(),
    );

    o.labelled(
        "idem_records",
        "gauge",
        "Records stored, by state (past their deadline but not yet removed included).",
        "state",
        [
            ("in_flight", st.in_flight),
            ("abandoned", st.abandoned),
            ("completed", st.completed),
        ],
    );
    o.one(
        "idem_memory_used_bytes",
        "gauge",
        "Memory the store accounts for its records.",
        st.memory,
    );
    if let Some(l) = st.limits {
        o.one(
            "idem_memory_max_bytes",
            "gauge",
            "The store's memory limit (max_memory_bytes).",
            l.max_memory_bytes,
        );
    }

    o.labelled(
        "idem_claims_total",
        "counter",
        "CLAIMs applied, by what they found.",
        "outcome",
        [
            ("acquired", c.acquired),
            ("recovered", c.recovered),
            ("replayed", c.replays),
            ("in_flight", c.conflicts),
            ("mismatch", c.mismatches),
            ("oom", c.oom),
        ],
    );
    o.one(
        "idem_completions_total",
        "counter",
        "Records completed.",
        c.completed,
    );
    o.one(
        "idem_fenced_total",
        "counter",
        "Writes refused because the fence did not own the key.",
        c.fenced,
    );
    o.one(
        "idem_lease_lapses_total",
        "counter",
        "Leases that ran out.",
        c.lapses,
    );
    o.one(
        "idem_expired_keys_total",
        "counter",
        "Records removed at their deadline (a lapsed FREE lease, or the end of retention).",
        c.dropped,
    );
    o.one(
        "idem_expired_records_total",
        "counter",
        "Deprecated: idem_expired_keys_total under its former name (to be removed).",
        c.dropped,
    );

    o.labelled(
        "idem_waits_total",
        "counter",
        "Requests with WAIT, by how the wait went.",
        "result",
        [
            ("parked", &w.parked_total),
            ("answered", &w.hits_after_wait),
            ("timed_out", &w.timed_out),
            ("refused", &w.refused),
        ]
        .map(|(r, n)| (r, n.load(Ordering::Relaxed))),
    );
    o.one(
        "idem_waiters",
        "gauge",
        "Requests parked now.",
        node.waiters().parked(),
    );

    o.one(
        "idem_connected_clients",
        "gauge",
        "Client connections open.",
        node.clients().count(),
    );
    o.one(
        "idem_connections_total",
        "counter",
        "Client connections accepted.",
        get(&m.connections),
    );
    o.one(
        "idem_rejected_connections_total",
        "counter",
        "Client connections refused at max_connections.",
        get(&m.rejected),
    );
    o.one(
        "idem_commands_processed_total",
        "counter",
        "Commands run.",
        get(&m.commands),
    );
    o.labelled(
        "idem_acl_denied_total",
        "counter",
        "Requests refused by access control, by reason.",
        "reason",
        [
            ("auth", get(&m.auth_failures)),
            ("command", get(&m.acl_denied_cmd)),
            ("key", get(&m.acl_denied_key)),
        ],
    );
    o.one(
        "idem_client_limit_disconnects_total",
        "counter",
        "Clients disconnected for their output buffer, the client memory budget or a write timeout.",
        get(&m.output_limit_disconnects)
            + node.clients().evictions()
            + get(&m.write_timeouts),
    );
    let (net_in, net_out) = node.cmdstats().net();
    o.one(
        "idem_net_input_bytes_total",
        "counter",
        "Bytes read from clients.",
        net_in,
    );
    o.one(
        "idem_net_output_bytes_total",
        "counter",
        "Bytes written to clients.",
        net_out,
    );
    o.one(
        "idem_protocol_errors_total",
        "counter",
        "Malformed requests (the connection was closed).",
        get(&m.protocol_errors),
    );

    let stats = node.cmdstats();
    let figures = stats.figures();
    o.family(
        "idem_commands_total",
        "counter",
        "Calls by command (refusals left out).",
    );
    for f in &figures {
        o.sample(
            "idem_commands_total",
            &format!("cmd=\"{}\"", f.name),
            f.calls,
        );
    }
    o.family(
        "idem_command_errors_total",
        "counter",
        "Error replies by command: rejected before running, or failed.",
    );
    for f in &figures {
        o.sample(
            "idem_command_errors_total",
            &format!("cmd=\"{}\",kind=\"rejected\"", f.name),
            f.rejected,
        );
        o.sample(
            "idem_command_errors_total",
            &format!("cmd=\"{}\",kind=\"failed\"", f.name),
            f.failed,
        );
    }
    o.family(
        "idem_command_duration_seconds",
        "histogram",
        "Time from a command's dispatch until its reply is ready to go out.",
    );
    for f in &figures {
        for (us, n) in HISTOGRAM_BOUNDS_US.iter().zip(&f.below) {
            o.sample(
                "idem_command_duration_seconds_bucket",
                &format!("cmd=\"{}\",le=\"{}\"", f.name, *us as f64 / 1e6),
                n,
            );
        }
        o.sample(
            "idem_command_duration_seconds_bucket",
            &format!("cmd=\"{}\",le=\"+Inf\"", f.name),
            f.observed,
        );
        o.sample(
            "idem_command_duration_seconds_sum",
            &format!("cmd=\"{}\"", f.name),
            f.usec as f64 / 1e6,
        );
        o.sample(
            "idem_command_duration_seconds_count",
            &format!("cmd=\"{}\"", f.name),
            f.observed,
        );
    }
    o.labelled(
        "idem_error_replies_total",
        "counter",
        "Error replies by code.",
        "code",
        stats.errors().into_iter().map(|(c, n)| (c.as_str(), n)),
    );

    if let Some((r, dir)) = node.engine().raft_info() {
        // Read now (a statvfs), as INFO does.
        if let Ok(free) = fs4::available_space(&dir) {
            o.one(
                "idem_disk_free_bytes",
                "gauge",
                "Free space on the data directory's filesystem.",
                free,
            );
        }
        o.one(
            "idem_disk_min_free_bytes",
            "gauge",
            "min_free_disk_bytes: below this much free space writes are refused (-TRYAGAIN).",
            node.config().raft.min_free_disk_bytes,
        );
        o.one(
            "idem_disk_full_refusals_total",
            "counter",
            "Writes refused for lack of disk space.",
            r.disk_full_refusals,
        );
        o.one(
            "idem_log_full_waits_total",
            "counter",
            "Times writes waited for a snapshot, the log held at four times what makes one due.",
            r.log_full_waits,
        );
        o.one(
            "idem_raft_is_leader",
            "gauge",
            "1 on the leader.",
            u8::from(r.leader),
        );
        o.one(
            "idem_raft_has_leader",
            "gauge",
            "1 while this node knows a leader (on the leader: while a majority answers it, or has within an election's time).",
            u8::from((r.leader || r.leader_known) && !r.quorum_lost),
        );
        o.one("idem_raft_term", "gauge", "The current term.", r.term);
        o.one(
            "idem_raft_lease_seconds",
            "gauge",
            "How long a leader here serves on a majority's answers: four fifths of election_timeout_ms, or of a voter's if smaller.",
            r.lease_ms as f64 / 1000.0,
        );
        o.one(
            "idem_raft_follower_reads_total",
            "counter",
            "Reads on this follower after READONLY that asked for the leader's read index.",
            r.follower_reads,
        );
        o.one(
            "idem_raft_read_index_rounds_total",
            "counter",
            "Requests for the leader's read index sent for them (one serves every read waiting).",
            r.read_index_rounds,
        );
        o.one(
            "idem_raft_follower_reads_redirected_total",
            "counter",
            "Follower reads that went to the leader after all (no read index came, or it was not applied in time).",
            r.follower_reads_redirected,
        );
        o.one(
            "idem_raft_leader_changes_seen_total",
            "counter",
            "Times a leader became known that differs from the last one (the first included).",
            r.leader_changes,
        );
        o.one(
            "idem_raft_last_log_index",
            "gauge",
            "The last log entry's index.",
            r.last_log_index,
        );
        o.one(
            "idem_raft_commit_index",
            "gauge",
            "The highest entry known committed.",
            r.commit_index,
        );
        o.one(
            "idem_raft_applied_index",
            "gauge",
            "The highest entry applied.",
            r.applied_index,
        );
        o.one(
            "idem_raft_followers",
            "gauge",
            "On the leader: the members it sends entries to, answering or not (see idem_raft_replicas_connected).",
            r.followers,
        );
        if let Some(raft) = node.engine().raft_engine() {
            replicas(&mut o, &raft.cluster_view());
        }
        o.one(
            "idem_raft_quick_elections_total",
            "counter",
            "Elections this node started as soon as a dead leader's lease ran out.",
            r.quick_elections,
        );
        o.one(
            "idem_raft_peer_timeouts_total",
            "counter",
            "Peer requests that timed out.",
            r.peer_timeouts,
        );
        o.one(
            "idem_raft_snapshots_built_total",
            "counter",
            "Snapshots built.",
            r.snapshots_built,
        );
        o.one(
            "idem_raft_log_bytes",
            "gauge",
            "Bytes of log entries kept.",
            r.log_bytes,
        );
        o.one(
            "idem_wal_fsyncs_total",
            "counter",
            "Log fdatasyncs.",
            r.fsyncs,
        );
        o.one(
            "idem_wal_entries_total",
            "counter",
            "Log entries written.",
            r.entries,
        );
        o.one(
            "idem_wal_commands_total",
            "counter",
            "Commands in the log entries written.",
            r.ops,
        );
        let name = "idem_wal_fsync_duration_seconds";
        o.labelled(
            name,
            "summary",
            "Log fdatasync times since start, by quantile.",
            "quantile",
            [("0.5", r.fsync_p50_us), ("0.99", r.fsync_p99_us)].map(|(q, us)| (q, us as f64 / 1e6)),
        );
        o.sample(&format!("{name}_sum"), "", r.fsync_total_us as f64 / 1e6);
        o.sample(&format!("{name}_count"), "", r.fsyncs);
    }
    if let Some((user, sys)) = crate::admin::process_cpu() {
        o.one(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time of the process.",
            user + sys,
        );
    }
    if let Some(rss) = crate::admin::process_rss() {
        o.one(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of the process.",
            rss,
        );
    }
    o.0
}
