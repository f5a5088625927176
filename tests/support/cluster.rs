//! A cluster of real idemd processes on loopback, each with its own data
//! directory, for the cluster and failover tests.

use std::net::SocketAddr;
use std::time::Duration;

use idem_protocol::{ClaimReply, Frame, Outcome};

use super::{Conn, DataDir, Idemd, POLL_DEADLINE, bulk, claim, eventually};

/// A free loopback port (bound, then released), never one this test
/// process handed out before, and below the kernel's ephemeral range
/// (`ip_local_port_range`): a port taken from that range could be given
/// again, between its release and its use, to any socket bound to port 0
/// or to the local end of any connection (a TLS test once failed to
/// start with its port in use).
pub fn free_port() -> u16 {
    static NEXT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);
    let ephemeral: Vec<u16> = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .map(|r| {
            r.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let (low, high) = match ephemeral[..] {
        [low, high] => (low, high),
        _ => (32768, 60999),
    };
    // Below the range, or else above it: at least a thousand ports.
    let (from, to) = if low >= 11_000 {
        (10_000u16, low)
    } else if high <= 64_000 {
        (high + 1, 65_535)
    } else {
        panic!("the ephemeral port range {low}-{high} leaves no room for test ports")
    };
    let span = u32::from(to - from);
    let mut next = NEXT.lock().unwrap();
    // Each test process starts somewhere else in the range, and goes on
    // from there.
    let mut port = next.unwrap_or(from + (std::process::id().wrapping_mul(7_919) % span) as u16);
    for _ in 0..span {
        let candidate = port;
        port = if port + 1 >= to { from } else { port + 1 };
        if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            *next = Some(port);
            return candidate;
        }
    }
    panic!("no free port between {from} and {to}")
}

/// One member: its addresses, data directory and process (if running).
pub struct Member {
    pub id: u64,
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub dir: DataDir,
    pub proc: Option<Idemd>,
}

impl Member {
    /// A member with fresh ports and an empty data directory.
    pub fn new(name: &str, id: u64) -> Member {
        Member {
            id,
            client: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            peer: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            dir: DataDir::new(&format!("{name}-n{id}")),
            proc: None,
        }
    }

    /// The idemd arguments of this member (plus `extra`).
    pub fn args(&self, initial: Option<&str>) -> Vec<String> {
        let mut a: Vec<String> = [
            "--engine",
            "raft",
            "--node-id",
            &self.id.to_string(),
            "--listen",
            &self.client.to_string(),
            "--peer-listen",
            &self.peer.to_string(),
            "--data-dir",
            self.dir.arg(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(i) = initial {
            a.push("--initial-cluster".into());
            a.push(i.into());
        }
        a
    }

    /// Starts (or restarts) the process.
    ///
    /// Without turns to snapshot unless `env` sets `IDEM_SNAPSHOT_TURN_MS`:
    /// tests that snapshot every few entries expect a due snapshot to be
    /// taken at once, not up to a round of 2 s turns later (a wait that
    /// on a loaded CI machine outlasted their deadlines); the turns have a
    /// test of their own.
    pub async fn start(&mut self, initial: Option<&str>, env: &[(&str, &str)]) {
        let args = self.args(initial);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = [("IDEM_SNAPSHOT_TURN_MS", "0")]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        self.proc = Some(Idemd::start_with(&env, &args).await);
    }

    /// [`start`](Self::start) with an owned environment.
    pub async fn start_env(&mut self, initial: Option<&str>, env: &[(String, String)]) {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.start(initial, &env).await;
    }

    /// Its applied index (`CLUSTER INFO`'s `idem_applied_index`).
    pub async fn applied(&self) -> u64 {
        self.info("idem_applied_index")
            .await
            .parse()
            .expect("idem_applied_index")
    }

    /// Waits until it has applied `applied` as a follower.
    pub async fn caught_up_as_follower(&self, applied: u64, what: &str) {
        eventually(what, async || {
            let a = self.info("idem_applied_index").await;
            (a.parse::<u64>().unwrap_or(0) >= applied && self.info("idem_role").await == "follower")
                .then_some(())
        })
        .await;
    }

    /// kill -9.
    pub async fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill().await;
        }
    }

    /// `CLUSTER ADD` of this member (its id and addresses) as a learner,
    /// sent through `conn`; the reply.
    pub async fn add_as_learner(&self, conn: &mut Conn) -> Frame {
        conn.cmd(&[
            "CLUSTER",
            "ADD",
            &self.id.to_string(),
            &self.peer.to_string(),
            &self.client.to_string(),
        ])
        .await
    }

    /// A connection to its client port.
    pub async fn conn(&self) -> Conn {
        Conn::connect(self.client).await
    }

    /// Its `CLUSTER INFO` field `name` (empty if absent or unreachable).
    pub async fn info(&self, name: &str) -> String {
        let Ok(Ok(stream)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(self.client),
        )
        .await
        else {
            return String::new();
        };
        drop(stream);
        let mut c = self.conn().await;
        let text = match c.try_cmd(&["CLUSTER", "INFO"]).await {
            Some(f @ Frame::Bulk(_)) => bulk(&f),
            _ => return String::new(),
        };
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or("")
            .trim()
            .to_owned()
    }
}

/// Slowed disks: in debug builds each log sync of a node started with
/// [`SlowSyncs::env`] first sleeps the milliseconds its file holds (read
/// at every sync, so a test can slow one node once it knows its role).
pub struct SlowSyncs(DataDir);

impl SlowSyncs {
    /// Delay files under a fresh directory named after `name`, none set.
    pub fn new(name: &str) -> SlowSyncs {
        let dir = DataDir::new(&format!("{name}-delays"));
        std::fs::create_dir_all(&dir.0).unwrap();
        SlowSyncs(dir)
    }

    /// The environment that points node `id` at its delay file.
    pub fn env(&self, id: u64) -> Vec<(String, String)> {
        let file = self.0.0.join(format!("n{id}"));
        vec![(
            "IDEMD_UNSAFE_TEST_SLOW_SYNC_FILE".to_owned(),
            file.to_str().unwrap().to_owned(),
        )]
    }

    /// Makes node `id`'s log syncs take `ms` more (0: none).
    pub fn set(&self, id: u64, ms: u64) {
        std::fs::write(self.0.0.join(format!("n{id}")), ms.to_string()).unwrap();
    }
}

/// `args` on `conn`, sent again while the node answers that it does not
/// serve right now though it leads (its lease lapsed on a loaded machine,
/// or it applies the log first): such a `-TRYAGAIN` comes before the
/// command is proposed, so sending it again is safe. Any other reply is
/// returned; retries stop after [`POLL_DEADLINE`].
pub async fn cmd_served(conn: &mut Conn, args: &[&str]) -> Frame {
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    loop {
        let r = conn.cmd(args).await;
        let not_serving = matches!(&r, Frame::Error(e)
            if e.starts_with(b"TRYAGAIN this node leads but")
                || e.starts_with(b"TRYAGAIN this node was just elected"));
        if !not_serving || tokio::time::Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `CLAIM key` on `conn` through [`cmd_served`]: it must be acquired.
pub async fn acquire_served(conn: &mut Conn, key: &str) {
    let r = cmd_served(conn, &["CLAIM", key]).await;
    assert!(
        matches!(claim(r.clone()), ClaimReply::Acquired { .. }),
        "CLAIM {key}: {r:?}"
    );
}

/// Claims every `(key, value)` on `conn`: each must be completed with that
/// value (`why` ends the message of one that is not).
pub async fn assert_completed(conn: &mut Conn, completed: &[(String, String)], why: &str) {
    for (k, v) in completed {
        assert_eq!(
            claim(conn.cmd(&["CLAIM", k]).await),
            ClaimReply::Completed {
                outcome: Outcome::Ok,
                value: v.clone().into()
            },
            "{k} {why}"
        );
    }
}

/// A cluster of `n` members bootstrapped with `--initial-cluster`.
pub struct Cluster {
    pub members: Vec<Member>,
    pub initial: String,
}

impl Cluster {
    /// Starts `n` members and waits until they agree on a serving leader.
    pub async fn start(name: &str, n: u64) -> Cluster {
        Cluster::start_with(name, n, &[]).await
    }

    /// [`start`](Self::start) with extra environment variables.
    pub async fn start_with(name: &str, n: u64, env: &[(&str, &str)]) -> Cluster {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Cluster::start_each(name, n, |_| env.clone()).await
    }

    /// [`start`](Self::start), each node serving `/metrics` at the
    /// address returned for it (by member index).
    pub async fn start_with_metrics(name: &str, n: u64) -> (Cluster, Vec<SocketAddr>) {
        let metrics: Vec<SocketAddr> = (0..n)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let c = Cluster::start_each(name, n, |id| {
            vec![(
                "IDEM_METRICS_LISTEN".to_owned(),
                metrics[id as usize - 1].to_string(),
            )]
        })
        .await;
        (c, metrics)
    }

    /// [`start`](Self::start) with environment variables per node id.
    pub async fn start_each(
        name: &str,
        n: u64,
        env_of: impl Fn(u64) -> Vec<(String, String)>,
    ) -> Cluster {
        let members: Vec<Member> = (1..=n).map(|id| Member::new(name, id)).collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.id, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster { members, initial };
        // The lowest id waits for the others before it bootstraps: start
        // them all at once.
        let init = c.initial.clone();
        let futs = c.members.iter_mut().map(|m| {
            let init = init.clone();
            let env = env_of(m.id);
            async move {
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                m.start(Some(&init), &env).await
            }
        });
        futures_util::future::join_all(futs).await;
        c.leader().await;
        c
    }

    /// The index of the member that leads and serves, once all running
    /// members agree on it (waits up to 20 s).
    pub async fn leader(&self) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut leaders = Vec::new();
            for m in self.members.iter().filter(|m| m.proc.is_some()) {
                leaders.push(m.info("idem_leader_id").await);
            }
            if let Some(first) = leaders.first()
                && !first.is_empty()
                && leaders.iter().all(|l| l == first)
            {
                let id: u64 = first.parse().unwrap();
                if let Some(i) = self
                    .members
                    .iter()
                    .position(|m| m.id == id && m.proc.is_some())
                    && !self.members[i].info("idem_role").await.is_empty()
                {
                    // The leader serves once it applied the log.
                    let mut c = self.members[i].conn().await;
                    if let Some(Frame::Array(_) | Frame::Null) =
                        c.try_cmd(&["INSPECT", "probe-leader"]).await
                    {
                        return i;
                    }
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no agreed leader within 20 s: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every running follower has applied what member `l`
    /// (the leader) has committed.
    pub async fn followers_apply_what_leader_committed(&self, l: usize, what: &str) {
        let committed: u64 = self.members[l]
            .info("idem_commit_index")
            .await
            .parse()
            .unwrap();
        for f in self.followers().await {
            self.members[f].caught_up_as_follower(committed, what).await;
        }
    }

    /// The indexes of the running members that do not lead.
    pub async fn followers(&self) -> Vec<usize> {
        let l = self.leader().await;
        (0..self.members.len())
            .filter(|&i| i != l && self.members[i].proc.is_some())
            .collect()
    }

    /// Every client address, comma-separated (the seeds of a client).
    pub fn seeds(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}
