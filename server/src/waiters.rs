//! Server-side waiting: `CLAIM ... WAIT` and `SETTLE ... WAIT` park here,
//! beside the store, until the key leaves the in-flight state.
//!
//! Waiters never apply anything under their own lock. A request parks with
//! the apply index at which it saw the key in flight; the engine's key
//! events (published after every applied op, in apply order) with a larger
//! index start a *serve pass* for the key, one at a time per key:
//!
//! - the waiters are served in arrival order; a waiter that left is
//!   skipped;
//! - a SETTLE waiter, or a CLAIM waiter that would only replay (completed,
//!   or a fingerprint mismatch), is answered from a read of the store;
//! - a CLAIM waiter that would take the key (released, lapsed, abandoned)
//!   gets a *handover*: its CLAIM is submitted through the engine, carrying
//!   its ATTEMPT id (a waiter that sent none is given a unique one), so it is
//!   ordered like any other write and can be retried safely; the pass then
//!   stops, as the key is in flight again, and the rest keep waiting;
//! - ownership handed to a waiter that left just before is given back (a
//!   RELEASE or ABANDON submitted), unless the waiter's own ATTEMPT id was
//!   used: a retry of that attempt on another connection may hold it.
//!
//! So one COMPLETE answers every waiter with the same shared value, and a
//! RELEASE, lapse or ABANDON hands the key to the first waiter only. While
//! a key has waiters, a new CLAIM WAIT queues behind them.
//!
//! No wake-up is lost: events for a key are matched against its queue
//! under the waiter shard lock, and a request that parks after an event it
//! may have missed (the shard saw an event past the index it parks with)
//! reads the key again first. A lapse is noticed by a timer per waited key
//! on the owner's lease, which submits an `Op::Expire` of the key rather
//! than changing the store itself.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use idem_protocol::cmd::{Abandon, Release};
use idem_protocol::{ClaimReply, Command, Reply, SettleReply};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::engine::{Engine, EventSink};
use crate::store::{ClaimOp, Defaults, KeyEvent, Op, Read};

const SHARDS: usize = 64;

/// Longest sleep of a lease timer before it looks again (a lease renewed
/// shorter is served within this).
const TIMER_RECHECK_MS: u64 = 1000;

/// Counters for INFO.
#[derive(Debug, Default)]
pub struct WaitStats {
    /// Waits answered with a completed outcome.
    pub hits_after_wait: AtomicU64,
    /// Waits that ran out.
    pub timed_out: AtomicU64,
    /// Waits parked so far.
    pub parked_total: AtomicU64,
    /// Waits refused at `max_waiters_per_key` or `max_waiters`.
    pub refused: AtomicU64,
    /// Waits parked now.
    pub parked_now: AtomicU64,
}

/// What a parked request asks again when the key changes.
#[derive(Debug, Clone)]
enum Ask {
    Claim {
        op: ClaimOp,
        /// The ATTEMPT id was made up here (the client sent none): the
        /// client cannot retry with it, so a handover to a departed waiter
        /// can be given back.
        made_up: bool,
    },
    Settle(Bytes),
}

struct Waiter {
    id: u64,
    ask: Ask,
    tx: oneshot::Sender<Reply>,
}

struct Queue {
    list: VecDeque<Waiter>,
    /// The apply index at which the key was last seen in flight.
    seen: u64,
    /// A serve pass runs.
    serving: bool,
    /// An event arrived during the pass: look again before it ends.
    again: bool,
    /// The task that notices the owner's lease running out.
    timer: Option<AbortHandle>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        // A queue's timer lives exactly as long as the queue.
        if let Some(t) = self.timer.take() {
            t.abort();
        }
    }
}

#[derive(Default)]
struct Shard {
    queues: HashMap<Bytes, Queue>,
    /// The largest event index this shard has seen.
    last_event: u64,
}

/// Bounds on parked requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    /// On one key, at most.
    pub per_key: usize,
    /// On the whole server, at most.
    pub total: usize,
}

impl Default for WaitLimits {
    fn default() -> Self {
        WaitLimits {
            per_key: 10_000,
            total: 100_000,
        }
    }
}

/// The registry of parked requests, keyed by record key.
pub struct Waiters {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    engine: Arc<Engine>,
    defaults: Defaults,
    limits: WaitLimits,
    next_id: AtomicU64,
    /// Distinguishes the attempt ids made up by this process.
    tag: u64,
    hasher: std::hash::RandomState,
    /// Counters.
    pub stats: WaitStats,
    /// Tests: runs once between a waiting request's ask and its parking.
    #[cfg(test)]
    after_ask: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Tests: this node stopped serving, and redirects with this.
    #[cfg(test)]
    demoted: Mutex<Option<crate::engine::EngineError>>,
}

fn in_flight(reply: &Reply) -> Option<u64> {
    match reply {
        Reply::Claim(ClaimReply::InFlight { remaining_ms })
        | Reply::Settle(SettleReply::InFlight { remaining_ms }) => Some(*remaining_ms),
        _ => None,
    }
}

fn is_hit(reply: &Reply) -> bool {
    matches!(
        reply,
        Reply::Claim(ClaimReply::Completed { .. }) | Reply::Settle(SettleReply::Completed { .. })
    )
}

fn engine_error(e: &crate::engine::EngineError) -> Reply {
    Reply::Error(e.to_server_error())
}

impl Waiters {
    /// An empty registry over `engine`, subscribed to its key events.
    /// `defaults` resolve the options a waiting CLAIM left out.
    pub fn new(engine: Arc<Engine>, defaults: Defaults, limits: WaitLimits) -> Arc<Self> {
        let hasher = std::hash::RandomState::new();
        let tag = hasher.hash_one(std::process::id());
        let waiters = Arc::new(Waiters {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            engine: Arc::clone(&engine),
            defaults,
            limits,
            next_id: AtomicU64::new(1),
            tag,
            hasher,
            stats: WaitStats::default(),
            #[cfg(test)]
            after_ask: Mutex::new(None),
            #[cfg(test)]
            demoted: Mutex::new(None),
        });
        let sink: Arc<dyn EventSink> = waiters.clone();
        engine.subscribe(Arc::downgrade(&sink));
        waiters
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// Parked requests now.
    pub fn parked(&self) -> u64 {
        self.stats.parked_now.load(Ordering::Relaxed)
    }

    /// Runs a CLAIM or SETTLE that may WAIT `wait_ms`: answers at once if
    /// the key is not in flight (or `wait_ms` is 0), else parks until the
    /// key changes or the wait ends. Dropping the future withdraws the
    /// request (and gives back ownership handed to it in the meantime).
    pub async fn wait(self: Arc<Self>, cmd: Command, wait_ms: u64) -> Reply {
        let (key, ask) = match cmd {
            Command::Claim(c) => {
                let Some(Op::Claim(op)) = Op::from_command(Command::Claim(c), &self.defaults)
                else {
                    return Reply::Error(idem_protocol::ServerError::new(
                        idem_protocol::ErrorCode::Err,
                        "not a waitable command",
                    ));
                };
                (op.key.clone(), Ask::Claim { op, made_up: false })
            }
            Command::Settle(s) => (s.key.clone(), Ask::Settle(s.key)),
            _ => {
                return Reply::Error(idem_protocol::ServerError::new(
                    idem_protocol::ErrorCode::Err,
                    "not a waitable command",
                ));
            }
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        let mut parked = match self.park_or_answer(&key, ask.clone(), wait_ms > 0).await {
            Ok(reply) => return reply,
            Err(parked) => parked,
        };
        let got = tokio::select! {
            biased;
            r = &mut parked.rx => r.ok(),
            _ = tokio::time::sleep_until(deadline) => None,
        };
        if let Some(reply) = got.or_else(|| parked.withdraw()) {
            parked.done = true;
            if is_hit(&reply) {
                self.stats.hits_after_wait.fetch_add(1, Ordering::Relaxed);
            }
            return reply;
        }
        parked.done = true;
        self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
        // The wait ran out: answer with the key's state now.
        self.ask_now(&ask).await
    }

    /// Asks once, without waiting: `Ok` with the reply if the key is not in
    /// flight (or is the caller's), `Err` with the reply (INFLIGHT) and the
    /// index it was seen at otherwise.
    async fn ask_once(&self, ask: &Ask) -> Result<Reply, (Reply, u64)> {
        match ask {
            Ask::Settle(key) => {
                // A lapse of the leader's lease is waited out as for any
                // request (see dispatch's `record_routed`).
                if let Some(until) = self.engine.lease_hold_until() {
                    self.engine.lease_regained(until).await;
                }
                // A node that stopped serving while this waited answers
                // with the redirect, never from its own (stale) store.
                if let Err(e) = self.engine.route(Some(key)) {
                    return Ok(engine_error(&e));
                }
                let seen = self.engine.read(Read::Settle(key));
                if seen.due {
                    self.engine.expire_soon(key);
                }
                let reply = seen.reply.unwrap_or(Reply::Settle(SettleReply::Absent));
                match in_flight(&reply) {
                    Some(_) => Err((reply, seen.index)),
                    None => Ok(reply),
                }
            }
            Ask::Claim { op, .. } => match self.engine.submit(Op::Claim(op.clone())).await {
                Err(e) => Ok(engine_error(&e)),
                Ok(applied) => match in_flight(&applied.reply) {
                    Some(_) => Err((applied.reply, applied.index)),
                    None => Ok(applied.reply),
                },
            },
        }
    }

    /// Asks once, without waiting: the reply, whatever it is.
    async fn ask_now(&self, ask: &Ask) -> Reply {
        self.ask_once(ask).await.unwrap_or_else(|(r, _)| r)
    }

    /// Answers at once, or parks (`Err`). A CLAIM behind queued waiters
    /// queues without asking, so earlier waiters go first.
    async fn park_or_answer(
        self: &Arc<Self>,
        key: &Bytes,
        ask: Ask,
        may_wait: bool,
    ) -> Result<Reply, Parked> {
        if may_wait && self.has_queue(key) {
            // A claim that would only replay or mismatch is answered now,
            // and a retry by the attempt that owns the key gets it back now:
            // neither takes anything from the waiters ahead.
            if let Ask::Claim { op, .. } = &ask {
                match self.engine.read(Read::Claim(op)).reply {
                    Some(reply) if in_flight(&reply).is_none() => return Ok(reply),
                    None if self.in_flight_now(key) => {
                        return Ok(self.ask_now(&ask).await);
                    }
                    _ => {}
                }
            }
            let mut sh = self.shard(key).lock();
            if !self.serving() {
                drop(sh);
                return Ok(self.not_serving(key));
            }
            if let Some(q) = sh.queues.get_mut(key) {
                if let Some(full) = self.full(q.list.len()) {
                    return Ok(full);
                }
                let seen = q.seen;
                let parked = self.enqueue(&mut sh, key, ask, seen, None);
                drop(sh);
                // The key may have left flight with no event yet (a lapse
                // not applied): look now, earlier waiters first.
                self.kick_if_not_in_flight(key);
                return Err(parked);
            }
        }
        // Bounded: each round trip sees a change of the key.
        for _ in 0..16 {
            let (reply, index) = match self.ask_once(&ask).await {
                Ok(reply) => return Ok(reply),
                Err(r) => r,
            };
            if !may_wait {
                return Ok(reply);
            }
            #[cfg(test)]
            if let Some(hook) = self.after_ask.lock().take() {
                hook();
            }
            let remaining = in_flight(&reply).unwrap_or(0);
            let mut sh = self.shard(key).lock();
            // Stopped leading since the ask: the parked requests were
            // answered (`on_demoted`), and one parked now would wait for
            // an event or its time to run out. Checked under the shard's
            // lock: a node that stops serving after this drains the queue
            // only once this waiter is in it.
            if !self.serving() {
                drop(sh);
                return Ok(self.not_serving(key));
            }
            let queued = sh.queues.get(key).map_or(0, |q| q.list.len());
            if let Some(full) = self.full(queued) {
                return Ok(full);
            }
            if sh.last_event > index && !sh.queues.contains_key(key) {
                // An event may have passed between the ask and now.
                let seen = self.engine.read(Read::Settle(key));
                if seen.reply.as_ref().and_then(in_flight).is_none() {
                    drop(sh);
                    continue;
                }
            }
            return Err(self.enqueue(&mut sh, key, ask, index, Some(remaining)));
        }
        Ok(self.ask_now(&ask).await)
    }

    /// Whether this node serves records now ([`Engine::serving`]).
    fn serving(&self) -> bool {
        #[cfg(test)]
        if self.demoted.lock().is_some() {
            return false;
        }
        self.engine.serving()
    }

    /// The answer of a node that no longer serves to a request for `key`
    /// that it did not park: the redirect (nothing was changed: a CLAIM
    /// asked found the key in flight).
    fn not_serving(&self, key: &Bytes) -> Reply {
        #[cfg(test)]
        if let Some(e) = self.demoted.lock().as_ref() {
            return engine_error(e);
        }
        match self.engine.route(Some(key)) {
            Err(e) => engine_error(&e),
            // Serving again (a new term): the caller may retry here.
            Ok(()) => Reply::Error(idem_protocol::ServerError::new(
                idem_protocol::ErrorCode::TryAgain,
                "this node's role changed while the request was parked: retry",
            )),
        }
    }

    /// The refusal of one more waiter on a key that has `queued`, if the
    /// per-key or the total bound is reached.
    fn full(&self, queued: usize) -> Option<Reply> {
        let why = if queued >= self.limits.per_key {
            "too many requests are waiting on this key (max_waiters_per_key): retry later or without WAIT"
        } else if self.parked() >= self.limits.total as u64 {
            "too many requests are waiting on this server (max_waiters): retry later or without WAIT"
        } else {
            return None;
        };
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        Some(Reply::Error(idem_protocol::ServerError::new(
            idem_protocol::ErrorCode::TryAgain,
            why,
        )))
    }

    /// Adds a waiter to `key`'s queue (made if missing, with a lease timer
    /// of `remaining` ms).
    fn enqueue(
        self: &Arc<Self>,
        sh: &mut Shard,
        key: &Bytes,
        mut ask: Ask,
        seen: u64,
        remaining: Option<u64>,
    ) -> Parked {
        if let Ask::Claim { op, made_up } = &mut ask
            && op.attempt.is_none()
        {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            op.attempt = Some(Bytes::from(format!("~w{:x}.{n}", self.tag)));
            *made_up = true;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let queue = sh.queues.entry(key.clone()).or_insert_with(|| Queue {
            list: VecDeque::new(),
            seen,
            serving: false,
            again: false,
            timer: None,
        });
        if queue.timer.is_none() {
            queue.timer = Some(self.arm(key.clone(), remaining.unwrap_or(TIMER_RECHECK_MS)));
        }
        queue.list.push_back(Waiter {
            id,
            ask: ask.clone(),
            tx,
        });
        self.stats.parked_total.fetch_add(1, Ordering::Relaxed);
        self.stats.parked_now.fetch_add(1, Ordering::Relaxed);
        Parked {
            waiters: Arc::clone(self),
            key: key.clone(),
            id,
            ask,
            rx,
            done: false,
        }
    }

    /// Starts the task that looks at `key` when the lease running now
    /// (`remaining` ms left) runs out.
    fn arm(self: &Arc<Self>, key: Bytes, remaining: u64) -> AbortHandle {
        tokio::spawn(lease_timer(Arc::clone(self), key, remaining)).abort_handle()
    }

    fn has_queue(&self, key: &Bytes) -> bool {
        self.shard(key).lock().queues.contains_key(key)
    }

    /// Whether `key` is in flight now (a passed deadline counts as applied).
    fn in_flight_now(&self, key: &Bytes) -> bool {
        let seen = self.engine.read(Read::Settle(key));
        seen.reply.as_ref().and_then(in_flight).is_some()
    }

    /// Starts a serve pass of `key` if the key is not in flight now.
    fn kick_if_not_in_flight(self: &Arc<Self>, key: &Bytes) {
        let seen = self.engine.read(Read::Settle(key));
        if seen.due {
            // The owner's lease ran out: applying it sends the event.
            self.engine.expire_soon(key);
        } else if seen.reply.as_ref().and_then(in_flight).is_none() {
            self.kick(key);
        }
    }

    /// Starts a serve pass of `key` (or asks the running one to look again).
    fn kick(self: &Arc<Self>, key: &Bytes) {
        let mut sh = self.shard(key).lock();
        let Some(q) = sh.queues.get_mut(key) else {
            return;
        };
        if q.serving {
            q.again = true;
            return;
        }
        q.serving = true;
        drop(sh);
        tokio::spawn(Arc::clone(self).serve(key.clone()));
    }

    /// Serves `key`'s waiters in order until one finds it in flight.
    async fn serve(self: Arc<Self>, key: Bytes) {
        loop {
            let head = {
                let mut sh = self.shard(&key).lock();
                let Some(q) = sh.queues.get_mut(&key) else {
                    return;
                };
                while q.list.front().is_some_and(|w| w.tx.is_closed()) {
                    q.list.pop_front();
                    self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
                }
                match q.list.front() {
                    Some(w) => (w.id, w.ask.clone()),
                    None => {
                        sh.queues.remove(&key);
                        return;
                    }
                }
            };
            let (id, ask) = head;
            let outcome = match &ask {
                Ask::Settle(k) => {
                    let seen = self.engine.read(Read::Settle(k));
                    let reply = seen.reply.unwrap_or(Reply::Settle(SettleReply::Absent));
                    match in_flight(&reply) {
                        Some(left) => Err((seen.index, left)),
                        None => Ok(reply),
                    }
                }
                Ask::Claim { op, .. } => {
                    let seen = self.engine.read(Read::Claim(op));
                    match seen.reply {
                        Some(reply) => match in_flight(&reply) {
                            Some(left) => Err((seen.index, left)),
                            None => Ok(reply),
                        },
                        // It would take the key: hand it over, in order.
                        None => match self.engine.submit(Op::Claim(op.clone())).await {
                            Err(e) => Ok(engine_error(&e)),
                            Ok(applied) => match in_flight(&applied.reply) {
                                Some(left) => Err((applied.index, left)),
                                None => Ok(applied.reply),
                            },
                        },
                    }
                }
            };
            match outcome {
                Ok(reply) => self.answer(&key, id, &ask, reply),
                Err((index, left)) => {
                    // In flight: the rest wait for the next event.
                    let mut sh = self.shard(&key).lock();
                    let Some(q) = sh.queues.get_mut(&key) else {
                        return;
                    };
                    q.seen = q.seen.max(index);
                    if q.list.is_empty() {
                        // The last waiter left during the pass.
                        sh.queues.remove(&key);
                        return;
                    }
                    if let Some(t) = q.timer.take() {
                        t.abort();
                    }
                    q.timer = Some(self.arm(key.clone(), left));
                    if q.again {
                        q.again = false;
                        continue;
                    }
                    q.serving = false;
                    return;
                }
            }
        }
    }

    /// Sends `reply` to waiter `id` (the head of `key`'s queue); gives back
    /// ownership if it left meanwhile. The send happens under the shard
    /// lock, so a waiter that cannot withdraw any more has its reply.
    fn answer(&self, key: &Bytes, id: u64, ask: &Ask, reply: Reply) {
        let undelivered = {
            let mut sh = self.shard(key).lock();
            let waiter = match sh.queues.get_mut(key) {
                Some(q) if q.list.front().is_some_and(|w| w.id == id) => q.list.pop_front(),
                _ => None,
            };
            match waiter {
                Some(w) => {
                    self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
                    w.tx.send(reply).err()
                }
                // Withdrawn while its claim was being applied.
                None => Some(reply),
            }
        };
        if let Some(reply) = undelivered {
            self.give_back(key, ask, reply);
        }
    }

    /// Gives back ownership handed to a waiter that has left (not for a
    /// claim with the client's own ATTEMPT id: a retry of the same attempt
    /// may hold the same fence on another connection; its lease decides).
    fn give_back(&self, key: &Bytes, ask: &Ask, reply: Reply) {
        let Ask::Claim { made_up: true, .. } = ask else {
            return;
        };
        let op = match reply {
            Reply::Claim(ClaimReply::Acquired { fence }) => Op::Release(Release {
                key: key.clone(),
                fence,
            }),
            Reply::Claim(ClaimReply::Recover { fence, .. }) => Op::Abandon(Abandon {
                key: key.clone(),
                fence,
            }),
            _ => return,
        };
        // Applying it sends the event that serves the next waiter.
        self.engine.detach(op);
    }

    /// Removes waiter `id` from `key`'s queue; false if it was not there.
    fn cancel(&self, key: &Bytes, id: u64) -> bool {
        let mut sh = self.shard(key).lock();
        let Some(q) = sh.queues.get_mut(key) else {
            return false;
        };
        let Some(pos) = q.list.iter().position(|w| w.id == id) else {
            return false;
        };
        q.list.remove(pos);
        self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
        if q.list.is_empty() && !q.serving {
            sh.queues.remove(key);
        }
        true
    }
}

impl EventSink for Waiters {
    /// Answers every parked request at once: `redirect(key)` (`-MOVED` to
    /// the new leader), except the head of a queue whose serve pass runs,
    /// whose handover CLAIM may already be proposed: it gets `-TRYAGAIN`
    /// (it may have been applied; a retry with the same ATTEMPT id is
    /// safe).
    fn on_demoted(self: Arc<Self>, redirect: &dyn Fn(&[u8]) -> crate::engine::EngineError) {
        let mut answered = 0u64;
        for shard in self.shards.iter() {
            let queues = std::mem::take(&mut shard.lock().queues);
            for (key, mut q) in queues {
                let moved = Reply::Error(redirect(&key).to_server_error());
                let mut first = q.serving;
                for w in q.list.drain(..) {
                    let reply = if std::mem::take(&mut first) {
                        Reply::Error(idem_protocol::ServerError::new(
                            idem_protocol::ErrorCode::TryAgain,
                            "this node stopped leading while handing the key over: the claim may have been applied",
                        ))
                    } else {
                        moved.clone()
                    };
                    let _ = w.tx.send(reply);
                    answered += 1;
                }
            }
        }
        self.stats.parked_now.fetch_sub(answered, Ordering::Relaxed);
    }

    fn on_events(self: Arc<Self>, events: &[KeyEvent]) {
        for ev in events {
            let mut sh = self.shard(&ev.key).lock();
            sh.last_event = sh.last_event.max(ev.index);
            let Some(q) = sh.queues.get_mut(&ev.key) else {
                continue;
            };
            if q.serving {
                q.again = true;
                continue;
            }
            if ev.index <= q.seen {
                continue;
            }
            q.serving = true;
            drop(sh);
            tokio::spawn(Arc::clone(&self).serve(ev.key.clone()));
        }
    }
}

/// Looks at the key's state when the owner's lease runs out: a lapse is
/// applied through the engine (`Op::Expire`), whose event serves the queue.
/// One task per waited-on key, aborted when its queue goes or a new owner's
/// lease replaces it.
async fn lease_timer(waiters: Arc<Waiters>, key: Bytes, mut remaining: u64) {
    loop {
        tokio::time::sleep(Duration::from_millis(remaining.clamp(1, TIMER_RECHECK_MS))).await;
        let seen = waiters.engine.read(Read::Settle(&key));
        if let Some(left) = seen.reply.as_ref().and_then(in_flight) {
            remaining = left;
            continue;
        }
        if seen.due {
            waiters.engine.expire_soon(&key);
        } else {
            waiters.kick(&key);
        }
        remaining = TIMER_RECHECK_MS;
    }
}

/// A parked request. Dropping it withdraws the request, giving back
/// ownership handed to it meanwhile.
struct Parked {
    waiters: Arc<Waiters>,
    key: Bytes,
    id: u64,
    ask: Ask,
    rx: oneshot::Receiver<Reply>,
    /// Answered (or given up): nothing to withdraw.
    done: bool,
}

impl Parked {
    /// Withdraws the request after its wait ran out; a reply sent in the
    /// meantime is returned instead.
    fn withdraw(&mut self) -> Option<Reply> {
        if self.waiters.cancel(&self.key, self.id) {
            return None;
        }
        self.rx.try_recv().ok()
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.rx.close();
        if !self.waiters.cancel(&self.key, self.id)
            && let Ok(reply) = self.rx.try_recv()
        {
            // Handed ownership just before leaving: give it back.
            self.waiters.give_back(&self.key, &self.ask, reply);
        }
    }
}

#[cfg(test)]
mod tests;
