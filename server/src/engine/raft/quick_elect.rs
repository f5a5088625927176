//! Campaigning as soon as the leader is known to be gone.
//!
//! A follower campaigns on its own timer only after the leader lease and
//! a random election timeout have passed without a word from the leader
//! (300 ms and 300-600 ms by default). When the leader's process dies,
//! its peer connections close at once: a follower that sees the
//! connection from the leader it follows close, and hears nothing from it
//! since, campaigns as soon as the lease it granted that leader has run
//! out. That is the earliest any follower could grant a vote anyway (a
//! follower refuses other candidates while the lease runs), so the dead
//! leader can no longer be serving. The followers go in turns, by node id
//! ([`STAGGER`] apart), so they do not split the vote; a campaign that
//! fails leaves the ordinary timers to elect, as before. A leader that
//! removed itself (the membership says so) is treated the same way once
//! nothing has come from it for the lease, whether or not its connections
//! have closed.
//!
//! Nothing here bears on safety: an election may start at any time and
//! votes decide it. It only moves the first campaign earlier when the
//! leader's connection closing says it is gone; a leader alive behind a
//! connection that closed keeps its followers, since its next
//! AppendEntries (heartbeats every third of the lease) comes before the
//! campaign would start.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::{Raft, ServerState};
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::info;

use super::types::{NodeId, TypeConfig};

/// How far apart the followers' quick campaigns start, in node id order.
pub(super) const STAGGER: Duration = Duration::from_millis(50);

/// This node's turn among the voters other than `from` (by node id) and
/// the term, if it follows `from` as a voter.
fn turn(raft: &Raft<TypeConfig>, from: NodeId) -> Option<(usize, u64)> {
    let m = raft.metrics();
    let m = m.borrow();
    if m.state != ServerState::Follower || m.current_leader != Some(from) {
        return None;
    }
    let mut others: Vec<NodeId> = m
        .membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != from)
        .collect();
    others.sort_unstable();
    let rank = others.iter().position(|id| *id == m.id)?;
    Some((rank, m.current_term))
}

/// How long after the leader's last word the follower at `rank` campaigns:
/// the lease it granted, a tenth more (another follower's clock may run a
/// little behind this one's), and its turn.
fn campaign_wait(raft: &Raft<TypeConfig>, rank: usize) -> Duration {
    let lease = Duration::from_millis(raft.config().leader_lease);
    lease + lease / 10 + STAGGER * rank as u32
}

/// Whether this node still follows `from` in `term`.
fn still_follows(raft: &Raft<TypeConfig>, from: NodeId, term: u64) -> bool {
    let m = raft.metrics();
    let m = m.borrow();
    m.state == ServerState::Follower && m.current_leader == Some(from) && m.current_term == term
}

/// What a node heard from its peers, and the quick campaigns it made.
#[derive(Debug, Default)]
pub(super) struct LeaderWatch {
    /// When each member last sent this node an AppendEntries or a snapshot
    /// chunk (or was still sending one: see `peer::from_leader_meanwhile`).
    heard: Mutex<HashMap<NodeId, Instant>>,
    /// The leader and term a quick campaign is waiting for (one at a
    /// time), and when the latest connection from that leader closed.
    armed: Mutex<Option<(NodeId, u64, Instant)>>,
    /// Quick campaigns started, since start.
    campaigns: AtomicU64,
    /// The removed leader and term a campaign is waiting on
    /// ([`LeaderWatch::leader_removed`]).
    removed: Mutex<Option<(NodeId, u64)>>,
    /// The leader and term of the last quick campaign: one per leader
    /// gone, whichever way it was noticed (both at once campaigned twice).
    campaigned: Mutex<Option<(NodeId, u64)>>,
}

impl LeaderWatch {
    /// Whether to campaign now for `from` gone in `term` (once).
    fn first_campaign(&self, from: NodeId, term: u64) -> bool {
        let mut c = self.campaigned.lock();
        if *c == Some((from, term)) {
            return false;
        }
        *c = Some((from, term));
        true
    }
}

impl LeaderWatch {
    /// Notes an AppendEntries or a snapshot chunk from `from` (also every
    /// heartbeat interval while a chunk from it is being taken).
    pub(super) fn heard(&self, raft: &Raft<TypeConfig>, from: NodeId) {
        let now = Instant::now();
        let mut heard = self.heard.lock();
        if let Some(t) = heard.get_mut(&from) {
            *t = now;
            return;
        }
        // The first from `from`: kept for a member only, so that a peer
        // claiming id after id in its handshakes cannot grow the map, or
        // for the leader this node follows (a new learner's first entries
        // come before it knows any member).
        let known = {
            let m = raft.metrics();
            let m = m.borrow();
            m.current_leader == Some(from)
                || m.membership_config.membership().get_node(&from).is_some()
        };
        if known {
            heard.insert(from, now);
        }
    }

    /// How long ago `from` was last heard from, as [`Self::heard`] notes it
    /// (`None`: never, since start).
    pub(super) fn heard_ago(&self, from: NodeId) -> Option<Duration> {
        self.heard.lock().get(&from).map(|t| t.elapsed())
    }

    /// Quick campaigns started since start.
    pub(super) fn campaigns(&self) -> u64 {
        self.campaigns.load(Ordering::Relaxed)
    }

    /// A peer connection from `from` closed: if `from` is the leader this
    /// node follows as a voter, campaign once its lease has run out, unless
    /// something comes from it (or from another leader) before then.
    pub(super) fn connection_closed(self: &Arc<Self>, raft: &Raft<TypeConfig>, from: NodeId) {
        let closed = Instant::now();
        let Some((rank, term)) = turn(raft, from) else {
            return;
        };
        {
            let mut armed = self.armed.lock();
            if let Some((f, t, latest)) = armed.as_mut()
                && (*f, *t) == (from, term)
            {
                // Another connection from it: the waiting campaign checks
                // from this later close.
                *latest = closed;
                return;
            }
            *armed = Some((from, term, closed));
        }
        // The lease runs from the last word from the leader, which came
        // before the connection closed.
        let wait = campaign_wait(raft, rank);
        // A connection dropped while the runtime shuts down has nowhere to
        // campaign from.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (watch, raft) = (Arc::clone(self), raft.clone());
        rt.spawn(async move {
            let mut closed = closed;
            loop {
                tokio::time::sleep_until(closed + wait).await;
                let latest = match *watch.armed.lock() {
                    Some((f, t, latest)) if (f, t) == (from, term) => latest,
                    _ => closed,
                };
                if latest <= closed {
                    break;
                }
                closed = latest;
            }
            watch
                .campaign_if_still_gone(&raft, from, term, closed)
                .await;
        });
    }

    /// The leader this node follows as a voter is recorded as removed in
    /// its membership (it removed itself): campaign once nothing has come
    /// from it for the lease and a tenth (and this node's turn), as after
    /// its connection closes. Its connections close when it lets go of
    /// its peers, but one its replication still held stayed open after its
    /// last heartbeat, and the followers waited for their own timers (766
    /// ms here, under load).
    pub(super) fn leader_removed(self: &Arc<Self>, raft: &Raft<TypeConfig>, from: NodeId) {
        let Some((rank, term)) = turn(raft, from) else {
            return;
        };
        {
            let mut removed = self.removed.lock();
            if *removed == Some((from, term)) {
                return;
            }
            *removed = Some((from, term));
        }
        let wait = campaign_wait(raft, rank);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (watch, raft) = (Arc::clone(self), raft.clone());
        let armed = Instant::now();
        rt.spawn(async move {
            let last = loop {
                let last = watch.heard.lock().get(&from).copied().unwrap_or(armed);
                tokio::time::sleep_until(last + wait).await;
                if watch.heard.lock().get(&from).is_none_or(|t| *t <= last) {
                    break last;
                }
            };
            if !still_follows(&raft, from, term) || !watch.first_campaign(from, term) {
                return;
            }
            watch.campaigns.fetch_add(1, Ordering::Relaxed);
            info!(
                leader = from,
                term,
                silent_ms = last.elapsed().as_millis() as u64,
                "the leader removed itself and nothing came from it for its lease: campaigning now"
            );
            let _ = raft.trigger().elect().await;
        });
    }

    async fn campaign_if_still_gone(
        &self,
        raft: &Raft<TypeConfig>,
        from: NodeId,
        term: u64,
        closed: Instant,
    ) {
        {
            let mut armed = self.armed.lock();
            if armed.is_some_and(|(f, t, _)| (f, t) == (from, term)) {
                *armed = None;
            }
        }
        let heard_since = self.heard.lock().get(&from).is_some_and(|t| *t > closed);
        if !still_follows(raft, from, term) || heard_since || !self.first_campaign(from, term) {
            return;
        }
        self.campaigns.fetch_add(1, Ordering::Relaxed);
        info!(
            leader = from,
            term,
            "the leader's connection closed and nothing came from it for its lease: campaigning now"
        );
        let _ = raft.trigger().elect().await;
    }
}
