//! A history checker for runs with crashes: clients record every call with
//! its invoke time and its reply (or "unknown" when the reply was lost),
//! and [`check`] verifies the invariants an idempotency store promises
//! over the whole history, not just the last reply:
//!
//! 1. **Fences increase.** No fence is granted (`ACQUIRED`, `RECOVER`)
//!    twice, and a grant whose CLAIM was invoked after another grant's
//!    reply arrived carries a larger fence (one counter for the server).
//! 2. **One live lease per key.** A grant of a key does not arrive before
//!    the lease of an earlier fence of that key has run out, counting each
//!    lease from the invoke time of the CLAIM or RENEW that set it
//!    (acknowledged ones), unless that owner released, abandoned or
//!    completed first (acknowledged or not: an unknown one may have taken
//!    effect). The server's clock counts whole milliseconds, so a lease may
//!    end up to [`CLOCK_RESOLUTION`] early.
//! 3. **Acknowledged COMPLETEs are kept.** A CLAIM invoked after a COMPLETE
//!    was acknowledged replays its value; every replayed value is one some
//!    COMPLETE of that key wrote; two fences never both complete one key.
//! 4. **Acknowledged JOURNALs are kept.** A `RECOVER` hands over the
//!    journal of the latest JOURNAL acknowledged before the CLAIM was
//!    invoked, or a later one (journals are written as
//!    `j-<fence>-<seq>`, so "later" is their order), unless the key was
//!    released meanwhile (which drops the record).
//! 5. **Stale owners are fenced.** A COMPLETE, RENEW or JOURNAL invoked
//!    after a larger fence of its key was granted gets `-FENCED`.
//!
//! Used by the crash tests on one node, and meant for the cluster's.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use idem_protocol::{ClaimReply, Frame, Outcome};

use super::Conn;

/// How early a lease may end by the server's millisecond clock.
pub const CLOCK_RESOLUTION: Duration = Duration::from_millis(1);

/// A call a client made.
#[derive(Debug, Clone)]
pub enum Call {
    /// `CLAIM key LEASE ms ONEXPIRE RECOVER`.
    Claim {
        /// The key.
        key: String,
        /// The lease asked for.
        lease_ms: u64,
    },
    /// `COMPLETE key fence value`.
    Complete {
        /// The key.
        key: String,
        /// The owner's fence.
        fence: u64,
        /// The value.
        value: String,
    },
    /// `RENEW key fence LEASE ms`.
    Renew {
        /// The key.
        key: String,
        /// The owner's fence.
        fence: u64,
        /// The new lease.
        lease_ms: u64,
    },
    /// `JOURNAL key fence j-<fence>-<seq>`.
    Journal {
        /// The key.
        key: String,
        /// The owner's fence.
        fence: u64,
        /// The owner's journal sequence number.
        seq: u64,
    },
    /// `RELEASE key fence`.
    Release {
        /// The key.
        key: String,
        /// The owner's fence.
        fence: u64,
    },
    /// `ABANDON key fence`.
    Abandon {
        /// The key.
        key: String,
        /// The owner's fence.
        fence: u64,
    },
}

impl Call {
    /// The key the call names.
    pub fn key(&self) -> &str {
        match self {
            Call::Claim { key, .. }
            | Call::Complete { key, .. }
            | Call::Renew { key, .. }
            | Call::Journal { key, .. }
            | Call::Release { key, .. }
            | Call::Abandon { key, .. } => key,
        }
    }

    /// The command's words.
    pub fn args(&self) -> Vec<String> {
        match self {
            Call::Claim { key, lease_ms } => vec![
                "CLAIM".into(),
                key.clone(),
                "LEASE".into(),
                lease_ms.to_string(),
                "ONEXPIRE".into(),
                "RECOVER".into(),
            ],
            Call::Complete { key, fence, value } => vec![
                "COMPLETE".into(),
                key.clone(),
                fence.to_string(),
                value.clone(),
            ],
            Call::Renew {
                key,
                fence,
                lease_ms,
            } => vec![
                "RENEW".into(),
                key.clone(),
                fence.to_string(),
                "LEASE".into(),
                lease_ms.to_string(),
            ],
            Call::Journal { key, fence, seq } => vec![
                "JOURNAL".into(),
                key.clone(),
                fence.to_string(),
                journal(*fence, *seq),
            ],
            Call::Release { key, fence } => {
                vec!["RELEASE".into(), key.clone(), fence.to_string()]
            }
            Call::Abandon { key, fence } => {
                vec!["ABANDON".into(), key.clone(), fence.to_string()]
            }
        }
    }
}

/// The journal bytes of an owner's `seq`th JOURNAL.
pub fn journal(fence: u64, seq: u64) -> String {
    format!("j-{fence}-{seq}")
}

fn parse_journal(j: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(j).ok()?.strip_prefix("j-")?;
    let (f, q) = s.split_once('-')?;
    Some((f.parse().ok()?, q.parse().ok()?))
}

/// One call and what came of it.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which client made it.
    pub client: usize,
    /// The call.
    pub call: Call,
    /// When it was sent.
    pub invoke: Instant,
    /// When its reply arrived, and the reply; `None` when the reply was
    /// lost (the call may or may not have taken effect).
    pub reply: Option<(Instant, Frame)>,
}

/// A shared, append-only history.
#[derive(Clone, Default)]
pub struct History(Arc<Mutex<Vec<Event>>>);

impl History {
    /// Appends `event`.
    pub fn record(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    /// Values of COMPLETEs acknowledged so far, by key.
    pub fn completed(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match (&e.call, &e.reply) {
                (Call::Complete { key, value, .. }, Some((_, r))) if is_ok(r) => {
                    Some((key.clone(), value.clone()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every key any call named.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.call.key().to_owned())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// A client whose calls are recorded.
pub struct Recorder {
    /// The client's number in the history.
    pub client: usize,
    conn: Conn,
    history: History,
    /// Follows a cluster's redirects.
    follow: bool,
}

impl Recorder {
    /// A recording client over `conn`.
    pub fn new(client: usize, conn: Conn, history: &History) -> Recorder {
        Recorder {
            client,
            conn,
            history: history.clone(),
            follow: false,
        }
    }

    /// A recording client of a cluster, starting at `conn`: a `-MOVED`
    /// reply (not applied) is followed to the node it names, and the call
    /// made again there; `-TRYAGAIN` and `-CLUSTERDOWN` (which may follow
    /// an applied proposal) are recorded as unknown, like a lost reply.
    pub fn following(client: usize, conn: Conn, history: &History) -> Recorder {
        Recorder {
            follow: true,
            ..Recorder::new(client, conn, history)
        }
    }

    /// Makes `call` and records it; `None` when the reply was lost (the
    /// connection broke: the server died) or, for a cluster, the outcome
    /// is unknown (`-TRYAGAIN`).
    pub async fn call(&mut self, call: Call) -> Option<Frame> {
        let invoke = Instant::now();
        let mut reply = self.conn.try_cmd(&call.args()).await;
        let mut hops = 0;
        while self.follow {
            let Some(Frame::Error(e)) = &reply else {
                break;
            };
            let text = String::from_utf8_lossy(e).into_owned();
            if text.starts_with("TRYAGAIN") || text.starts_with("CLUSTERDOWN") {
                reply = None;
                break;
            }
            let Some(addr) = text
                .strip_prefix("MOVED ")
                .and_then(|m| m.split_whitespace().nth(1))
                .and_then(|a| a.parse().ok())
            else {
                break;
            };
            hops += 1;
            reply = match Conn::try_connect(addr).await {
                Some(conn) if hops <= 5 => {
                    self.conn = conn;
                    self.conn.try_cmd(&call.args()).await
                }
                // The node named is gone: nothing was applied.
                _ => None,
            };
        }
        let event = Event {
            client: self.client,
            call,
            invoke,
            reply: reply.clone().map(|r| (Instant::now(), r)),
        };
        self.history.0.lock().unwrap().push(event);
        reply
    }
}

/// Something that makes calls and records them in a history.
pub trait Caller {
    /// Makes `call` and records it; `None` when its outcome is unknown.
    fn call(&mut self, call: Call) -> impl Future<Output = Option<Frame>> + Send;
}

impl Caller for Recorder {
    fn call(&mut self, call: Call) -> impl Future<Output = Option<Frame>> + Send {
        Recorder::call(self, call)
    }
}

fn is_ok(f: &Frame) -> bool {
    matches!(f, Frame::Simple(s) if s == "OK")
}

fn is_fenced(f: &Frame) -> bool {
    matches!(f, Frame::Error(e) if e.starts_with(b"FENCED"))
}

/// A grant of ownership: an acknowledged `ACQUIRED` or `RECOVER`.
struct Grant<'a> {
    key: &'a str,
    fence: u64,
    invoke: Instant,
    at: Instant,
}

/// Checks `events` against the invariants in the module docs; returns
/// every violation found (empty: the history is consistent).
pub fn check(events: &[Event]) -> Vec<String> {
    let mut bad = Vec::new();
    let claim_reply = |e: &Event| -> Option<(Instant, ClaimReply)> {
        let (at, r) = e.reply.as_ref()?;
        ClaimReply::from_frame(r.clone()).ok().map(|c| (*at, c))
    };
    let mut grants: Vec<Grant<'_>> = Vec::new();
    for e in events {
        if let Call::Claim { key, .. } = &e.call
            && let Some((at, ClaimReply::Acquired { fence } | ClaimReply::Recover { fence, .. })) =
                claim_reply(e)
        {
            grants.push(Grant {
                key,
                fence,
                invoke: e.invoke,
                at,
            });
        }
    }

    // 1. Fences increase.
    let mut by_fence: HashMap<u64, &Grant<'_>> = HashMap::new();
    for g in &grants {
        if let Some(other) = by_fence.insert(g.fence, g) {
            bad.push(format!(
                "fence {} granted twice: on {} and on {}",
                g.fence, other.key, g.key
            ));
        }
    }
    let mut by_reply: Vec<&Grant<'_>> = grants.iter().collect();
    by_reply.sort_by_key(|g| g.at);
    let mut prefix_max: Vec<(u64, &str)> = Vec::with_capacity(by_reply.len());
    for g in &by_reply {
        let last = prefix_max.last().copied().unwrap_or((0, ""));
        prefix_max.push(if g.fence > last.0 {
            (g.fence, g.key)
        } else {
            last
        });
    }
    for g in &grants {
        let n = by_reply.partition_point(|o| o.at < g.invoke);
        if n > 0 {
            let (max, key) = prefix_max[n - 1];
            if g.fence <= max {
                bad.push(format!(
                    "fence {} granted on {} after fence {max} (on {key}) was acknowledged",
                    g.fence, g.key
                ));
            }
        }
    }

    // Per key from here on.
    let mut by_key: HashMap<&str, Vec<&Event>> = HashMap::new();
    for e in events {
        by_key.entry(e.call.key()).or_default().push(e);
    }
    for (key, evs) in &by_key {
        check_key(key, evs, &mut bad);
    }
    bad
}

fn check_key(key: &str, evs: &[&Event], bad: &mut Vec<String>) {
    let claim_of = |e: &Event| -> Option<(Instant, ClaimReply)> {
        let (at, r) = e.reply.as_ref()?;
        ClaimReply::from_frame(r.clone()).ok().map(|c| (*at, c))
    };
    let acked = |e: &Event| e.reply.as_ref().is_some_and(|(_, r)| is_ok(r));
    let acked_at = |e: &Event| e.reply.as_ref().filter(|(_, r)| is_ok(r)).map(|(t, _)| *t);

    // Grants of this key, by fence.
    let mut grants: Vec<(u64, Instant, Instant, u64)> = Vec::new(); // fence, invoke, at, lease
    for e in evs {
        if let Call::Claim { lease_ms, .. } = &e.call
            && let Some((at, ClaimReply::Acquired { fence } | ClaimReply::Recover { fence, .. })) =
                claim_of(e)
        {
            grants.push((fence, e.invoke, at, *lease_ms));
        }
    }
    grants.sort_by_key(|g| g.0);

    // 2. One live lease per key.
    for (i, &(f1, invoke1, _, lease1)) in grants.iter().enumerate() {
        let mut end = invoke1 + Duration::from_millis(lease1);
        let mut ended_by: Option<Instant> = None;
        for e in evs {
            match &e.call {
                Call::Renew {
                    fence, lease_ms, ..
                } if *fence == f1 && acked(e) => {
                    end = end.max(e.invoke + Duration::from_millis(*lease_ms));
                }
                // An end that took effect, or may have (a refused one did
                // not end the lease).
                Call::Release { fence, .. }
                | Call::Abandon { fence, .. }
                | Call::Complete { fence, .. }
                    if *fence == f1 && e.reply.as_ref().is_none_or(|(_, r)| is_ok(r)) =>
                {
                    ended_by = Some(ended_by.map_or(e.invoke, |t: Instant| t.min(e.invoke)));
                }
                _ => {}
            }
        }
        if let Some(t) = ended_by {
            end = end.min(t);
        }
        for &(f2, _, at2, _) in &grants[i + 1..] {
            if at2 + CLOCK_RESOLUTION < end {
                bad.push(format!(
                    "{key}: fence {f2} granted {:?} before the lease of fence {f1} ran out",
                    end - at2
                ));
            }
        }
    }

    // 3. Acknowledged COMPLETEs are kept.
    let completes: Vec<(&Event, u64, &str)> = evs
        .iter()
        .filter_map(|e| match &e.call {
            Call::Complete { fence, value, .. } => Some((*e, *fence, value.as_str())),
            _ => None,
        })
        .collect();
    let mut completed_by: Option<u64> = None;
    for (e, fence, _) in &completes {
        if acked(e) {
            match completed_by {
                Some(f) if f != *fence => bad.push(format!(
                    "{key}: completed by both fence {f} and fence {fence}"
                )),
                _ => completed_by = Some(*fence),
            }
        }
    }
    for e in evs {
        if !matches!(e.call, Call::Claim { .. }) {
            continue;
        }
        let Some((_, reply)) = claim_of(e) else {
            continue;
        };
        // The COMPLETE acknowledged before this CLAIM was sent.
        let before = completes
            .iter()
            .find(|(c, _, _)| acked_at(c).is_some_and(|t| t < e.invoke));
        match (&reply, before) {
            (ClaimReply::Completed { outcome, value }, _) => {
                let written = completes.iter().any(|(c, _, v)| {
                    c.invoke < e.reply.as_ref().unwrap().0 && v.as_bytes() == &value[..]
                });
                if *outcome != Outcome::Ok || !written {
                    bad.push(format!(
                        "{key}: CLAIM replayed {outcome:?} {value:?}, which no COMPLETE wrote"
                    ));
                }
                if let Some((_, _, v)) = before
                    && v.as_bytes() != &value[..]
                {
                    bad.push(format!(
                        "{key}: CLAIM replayed {value:?}, not the acknowledged {v:?}"
                    ));
                }
            }
            (other, Some((_, fence, v))) => bad.push(format!(
                "{key}: the COMPLETE of fence {fence} ({v:?}) was acknowledged, then a CLAIM got {other:?}"
            )),
            _ => {}
        }
    }

    // 4. Acknowledged JOURNALs are kept.
    for e in evs {
        if !matches!(e.call, Call::Claim { .. }) {
            continue;
        }
        let Some((at, ClaimReply::Recover { journal: j, .. })) = claim_of(e) else {
            continue;
        };
        let released = evs
            .iter()
            .any(|r| matches!(r.call, Call::Release { .. }) && r.invoke < at);
        if released {
            continue;
        }
        let latest = evs
            .iter()
            .filter_map(|r| match &r.call {
                Call::Journal { fence, seq, .. } if acked_at(r).is_some_and(|t| t < e.invoke) => {
                    Some((*fence, *seq))
                }
                _ => None,
            })
            .max();
        let got = parse_journal(&j);
        let written = got.is_some_and(|(f, s)| {
            evs.iter().any(|r| {
                matches!(&r.call, Call::Journal { fence, seq, .. } if (*fence, *seq) == (f, s) && r.invoke < at)
            })
        });
        match (latest, got) {
            (_, Some(_)) if !written => bad.push(format!(
                "{key}: RECOVER handed over journal {j:?}, which no JOURNAL wrote"
            )),
            (Some(want), Some(g)) if g < want => bad.push(format!(
                "{key}: RECOVER handed over {j:?}, older than the acknowledged {}",
                journal(want.0, want.1)
            )),
            (Some(want), None) => bad.push(format!(
                "{key}: RECOVER handed over {j:?}, not the acknowledged {}",
                journal(want.0, want.1)
            )),
            _ => {}
        }
    }

    // 5. Stale owners are fenced.
    for e in evs {
        let (Call::Complete { fence, .. }
        | Call::Renew { fence, .. }
        | Call::Journal { fence, .. }) = &e.call
        else {
            continue;
        };
        let Some((_, reply)) = &e.reply else {
            continue;
        };
        let newer = grants
            .iter()
            .find(|g| g.0 > *fence && g.2 < e.invoke)
            .map(|g| g.0);
        if let Some(newer) = newer
            && !is_fenced(reply)
        {
            bad.push(format!(
                "{key}: {:?} by fence {fence} after fence {newer} was granted got {reply:?}, not -FENCED",
                e.call
            ));
        }
    }
}

/// Claims every key `history` used so far through `prober` (a recovering
/// client: acknowledged COMPLETEs must replay, leases cut by a crash must
/// still hold, abandoned keys hand over their journals), asking again
/// while the outcome is unknown; then checks the whole history. The error
/// names the seed and the round, and lists every violation.
pub async fn probe_and_check<C: Caller>(
    prober: &mut C,
    history: &History,
    seed: u64,
    round: usize,
) -> Result<(), String> {
    for k in history.keys() {
        let mut tries = 0;
        loop {
            let probe = Call::Claim {
                key: k.clone(),
                lease_ms: 100,
            };
            if prober.call(probe).await.is_some() {
                break;
            }
            tries += 1;
            assert!(tries < 200, "the prober got no answer for {k}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let bad = check(&history.events());
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "seed {seed:#x}, round {round}: {} violations:\n{}",
        bad.len(),
        bad.join("\n")
    ))
}

/// A tiny deterministic generator (the seed is printed on failure).
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One client's load until a call's outcome is unknown (its connection
/// broke): claims of a few keys shared with the other clients (the set
/// moves on every 50 ms), leases drawn from `leases` (ms), then as
/// the owner journals, renews, sometimes overruns its lease (so another
/// client takes over and this one must be fenced), and completes, abandons,
/// releases or walks away.
pub async fn owner_load<C: Caller>(rec: &mut C, prefix: &str, leases: &[u64], rng: &mut Rng) {
    let start = Instant::now();
    loop {
        let slot = start.elapsed().as_millis() as u64 / 50 + rng.below(4);
        let key = format!("{prefix}-{slot}");
        let lease_ms = leases[rng.below(leases.len() as u64) as usize];
        let Some(reply) = rec
            .call(Call::Claim {
                key: key.clone(),
                lease_ms,
            })
            .await
        else {
            return;
        };
        let fence = match super::claim(reply) {
            ClaimReply::Acquired { fence } | ClaimReply::Recover { fence, .. } => fence,
            ClaimReply::InFlight { .. } => {
                tokio::time::sleep(std::time::Duration::from_millis(rng.below(10))).await;
                continue;
            }
            ClaimReply::Completed { .. } => continue,
        };
        let mut seq = 0;
        let journal = async |rec: &mut C, seq: &mut u64| {
            *seq += 1;
            rec.call(Call::Journal {
                key: key.clone(),
                fence,
                seq: *seq,
            })
            .await
        };
        if rng.below(2) == 0 && journal(rec, &mut seq).await.is_none() {
            return;
        }
        let pause = if rng.below(8) == 0 {
            lease_ms + 40
        } else {
            rng.below(20)
        };
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
        if rng.below(3) == 0 {
            let renew = Call::Renew {
                key: key.clone(),
                fence,
                lease_ms,
            };
            if rec.call(renew).await.is_none() || journal(rec, &mut seq).await.is_none() {
                return;
            }
        }
        let end = match rng.below(20) {
            0..=13 => Call::Complete {
                key: key.clone(),
                fence,
                value: format!("v-{fence}"),
            },
            14..=16 => Call::Abandon { key, fence },
            17 => Call::Release { key, fence },
            _ => continue,
        };
        if rec.call(end).await.is_none() {
            return;
        }
    }
}

/// The checker on made-up histories: each rule fires on a violation of it,
/// and a consistent history passes.
#[cfg(test)]
mod tests {
    use super::*;

    struct Made {
        base: Instant,
        events: Vec<Event>,
    }

    impl Made {
        fn new() -> Made {
            Made {
                base: Instant::now(),
                events: Vec::new(),
            }
        }

        /// `call` invoked at `t` ms, answered `reply` at `t + 1` ms.
        fn at(&mut self, t: u64, call: Call, reply: Option<Frame>) -> &mut Made {
            let invoke = self.base + Duration::from_millis(t);
            self.events.push(Event {
                client: 0,
                call,
                invoke,
                reply: reply.map(|r| (invoke + Duration::from_millis(1), r)),
            });
            self
        }

        fn check(&self) -> Vec<String> {
            check(&self.events)
        }
    }

    fn claim(key: &str, lease_ms: u64) -> Call {
        Call::Claim {
            key: key.into(),
            lease_ms,
        }
    }

    fn acquired(fence: u64) -> Option<Frame> {
        Some(ClaimReply::Acquired { fence }.to_frame())
    }

    fn recover(fence: u64, journal: &str) -> Option<Frame> {
        Some(
            ClaimReply::Recover {
                fence,
                journal: journal.to_owned().into(),
            }
            .to_frame(),
        )
    }

    fn completed(value: &str) -> Option<Frame> {
        Some(
            ClaimReply::Completed {
                outcome: Outcome::Ok,
                value: value.to_owned().into(),
            }
            .to_frame(),
        )
    }

    fn ok() -> Option<Frame> {
        Some(Frame::simple("OK"))
    }

    fn fenced() -> Option<Frame> {
        Some(Frame::Error("FENCED key is not held by this fence".into()))
    }

    fn journal_call(key: &str, fence: u64, seq: u64) -> Call {
        Call::Journal {
            key: key.into(),
            fence,
            seq,
        }
    }

    fn complete(key: &str, fence: u64) -> Call {
        Call::Complete {
            key: key.into(),
            fence,
            value: format!("v-{fence}"),
        }
    }

    /// A consistent history: a lapse, a take-over with the journal, a
    /// fenced stale owner, a completion and its replay.
    fn consistent() -> Made {
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(10, journal_call("a", 1, 1), ok())
            .at(150, claim("a", 100), recover(2, "j-1-1"))
            .at(160, complete("a", 1), fenced())
            .at(170, complete("a", 2), ok())
            .at(180, claim("a", 100), completed("v-2"))
            .at(190, claim("b", 100), acquired(3));
        h
    }

    #[test]
    fn a_consistent_history_passes() {
        assert_eq!(consistent().check(), Vec::<String>::new());
    }

    #[test]
    fn a_reused_or_decreasing_fence_is_found() {
        let mut h = consistent();
        h.at(300, claim("c", 100), acquired(3));
        assert!(h.check().iter().any(|v| v.contains("granted twice")));
        let mut h = consistent();
        h.at(300, claim("c", 100), acquired(2));
        let bad = h.check();
        assert!(bad.iter().any(|v| v.contains("after fence 3")), "{bad:?}");
    }

    #[test]
    fn an_overlapping_lease_is_found() {
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(50, claim("a", 100), recover(2, ""));
        assert!(h.check().iter().any(|v| v.contains("before the lease")));
        // Renewed: the lease runs from the RENEW.
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(
                90,
                Call::Renew {
                    key: "a".into(),
                    fence: 1,
                    lease_ms: 100,
                },
                ok(),
            )
            .at(150, claim("a", 100), recover(2, ""));
        assert!(h.check().iter().any(|v| v.contains("before the lease")));
        // Abandoned (even with the reply lost): no overlap.
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(
                20,
                Call::Abandon {
                    key: "a".into(),
                    fence: 1,
                },
                None,
            )
            .at(50, claim("a", 100), recover(2, ""));
        assert_eq!(h.check(), Vec::<String>::new());
    }

    #[test]
    fn a_lost_complete_is_found() {
        let mut h = consistent();
        h.at(400, claim("a", 100), acquired(9));
        assert!(
            h.check()
                .iter()
                .any(|v| v.contains("was acknowledged, then"))
        );
        let mut h = consistent();
        h.at(400, claim("a", 100), completed("v-1"));
        assert!(h.check().iter().any(|v| v.contains("not the acknowledged")));
        let mut h = consistent();
        h.at(400, claim("b", 100), completed("made-up"));
        assert!(h.check().iter().any(|v| v.contains("no COMPLETE wrote")));
    }

    #[test]
    fn a_lost_journal_is_found() {
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(10, journal_call("a", 1, 1), ok())
            .at(150, claim("a", 100), recover(2, ""));
        assert!(h.check().iter().any(|v| v.contains("not the acknowledged")));
    }

    #[test]
    fn a_stale_owner_not_fenced_is_found() {
        let mut h = Made::new();
        h.at(0, claim("a", 100), acquired(1))
            .at(150, claim("a", 100), recover(2, ""))
            .at(160, complete("a", 1), ok());
        let bad = h.check();
        assert!(bad.iter().any(|v| v.contains("not -FENCED")), "{bad:?}");
    }
}
