//! Server-side waiting: `CLAIM ... WAIT` and `SETTLE ... WAIT` park here,
//! beside the store, until the key leaves the in-flight state.
//!
//! A waiter is registered under the same lock that is taken to serve the
//! key's waiters, and its command is applied while that lock is held, so a
//! change can never slip between "still in flight" and "parked" (no lost
//! wake-ups). When a key changes, its waiters are served in arrival order:
//! each one's command is applied again; the first that finds the key in
//! flight (because an earlier waiter just acquired it) stops the pass and
//! the rest keep waiting. So one COMPLETE answers every waiter with the same
//! shared value, and a RELEASE, lapse or ABANDON hands the key to the first
//! waiter only.
//!
//! Lock order: waiter shard, then store shard; the store never calls back.

use std::collections::{HashMap, VecDeque};
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
use tokio::time::Instant;

use crate::engine::Engine;

const SHARDS: usize = 64;

struct Waiter {
    id: u64,
    /// The command to apply again, without its WAIT.
    cmd: Command,
    tx: oneshot::Sender<Reply>,
}

struct Queue {
    list: VecDeque<Waiter>,
    /// The task that serves the queue when the owner's lease runs out.
    timer: AbortHandle,
}

impl Drop for Queue {
    fn drop(&mut self) {
        // A queue's timer lives exactly as long as the queue.
        self.timer.abort();
    }
}

/// Longest sleep of a lease timer before it looks again (a lease renewed
/// shorter, or a lapse noticed elsewhere, is served within this).
const TIMER_RECHECK_MS: u64 = 1000;

type Map = HashMap<Bytes, Queue>;

/// Counters for INFO.
#[derive(Debug, Default)]
pub struct WaitStats {
    /// Waits answered with a completed outcome.
    pub hits_after_wait: AtomicU64,
    /// Waits that ran out.
    pub timed_out: AtomicU64,
    /// Waits parked so far.
    pub parked_total: AtomicU64,
    /// Waits parked now.
    pub parked_now: AtomicU64,
}

/// The registry of parked requests, keyed by record key.
pub struct Waiters {
    shards: Box<[CachePadded<Mutex<Map>>]>,
    engine: Arc<Engine>,
    next_id: AtomicU64,
    hasher: std::hash::RandomState,
    /// Counters.
    pub stats: WaitStats,
}

/// The outcome of [`Waiters::apply_or_park`].
pub enum Parked {
    /// Answered at once.
    Done(Reply),
    /// Parked: await the handle.
    Waiting(WaitHandle),
}

fn in_flight(reply: &Reply) -> Option<u64> {
    match reply {
        Reply::Claim(ClaimReply::InFlight { remaining_ms })
        | Reply::Settle(SettleReply::InFlight { remaining_ms }) => Some(*remaining_ms),
        _ => None,
    }
}

fn strip_wait(cmd: &Command) -> Command {
    let mut cmd = cmd.clone();
    match &mut cmd {
        Command::Claim(c) => c.wait_ms = None,
        Command::Settle(s) => s.wait_ms = None,
        _ => {}
    }
    cmd
}

impl Waiters {
    /// An empty registry over `engine`.
    pub fn new(engine: Arc<Engine>) -> Arc<Self> {
        Arc::new(Waiters {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            engine,
            next_id: AtomicU64::new(1),
            hasher: std::hash::RandomState::new(),
            stats: WaitStats::default(),
        })
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Map> {
        use std::hash::BuildHasher;
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// Applies a CLAIM or SETTLE; if the key is in flight and `wait_ms` is
    /// above zero, parks it until the key changes or the wait ends.
    pub fn apply_or_park(self: &Arc<Self>, cmd: &Command, wait_ms: u64) -> Parked {
        let Some(key) = cmd.key().cloned() else {
            return Parked::Done(self.engine.apply(cmd).reply);
        };
        let cmd = strip_wait(cmd);
        let mut map = self.shard(&key).lock();
        if map.contains_key(&key) && self.engine.poke(&key).is_none() {
            // The owner's lease ran out and the timer has not fired yet:
            // earlier waiters go first.
            self.serve_locked(&mut map, &key);
        }
        let applied = self.engine.apply(&cmd);
        if applied.wake {
            // This very call noticed a lapse: earlier waiters go first.
            self.serve_locked(&mut map, &key);
        }
        let Some(remaining) = in_flight(&applied.reply).filter(|_| wait_ms > 0) else {
            return Parked::Done(applied.reply);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let queue = map.entry(key.clone()).or_insert_with(|| Queue {
            list: VecDeque::new(),
            timer: self.arm(key.clone(), remaining),
        });
        queue.list.push_back(Waiter {
            id,
            cmd: cmd.clone(),
            tx,
        });
        self.stats.parked_total.fetch_add(1, Ordering::Relaxed);
        self.stats.parked_now.fetch_add(1, Ordering::Relaxed);
        drop(map);
        Parked::Waiting(WaitHandle {
            waiters: Arc::clone(self),
            key,
            id,
            cmd,
            rx: Some(rx),
            timer: Box::pin(tokio::time::sleep_until(
                Instant::now() + Duration::from_millis(wait_ms),
            )),
        })
    }

    /// Starts the task that serves `key`'s queue when the lease running now
    /// (`remaining` ms left) runs out.
    fn arm(self: &Arc<Self>, key: Bytes, remaining: u64) -> AbortHandle {
        tokio::spawn(lease_timer(Arc::clone(self), key, remaining)).abort_handle()
    }

    /// Serves the waiters of `key` after it left the in-flight state.
    pub fn wake(self: &Arc<Self>, key: &[u8]) {
        let mut map = self.shard(key).lock();
        self.serve_locked(&mut map, key);
    }

    fn serve_locked(self: &Arc<Self>, map: &mut Map, key: &[u8]) {
        let Some(queue) = map.get_mut(key) else {
            return;
        };
        while let Some(front) = queue.list.front() {
            if front.tx.is_closed() {
                queue.list.pop_front();
                self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let applied = self.engine.apply(&front.cmd);
            if let Some(remaining) = in_flight(&applied.reply) {
                // A new owner holds the key (an earlier waiter, or a claim
                // that came in between): time the rest on its lease.
                queue.timer.abort();
                queue.timer = self.arm(Bytes::copy_from_slice(key), remaining);
                break;
            }
            let Some(waiter) = queue.list.pop_front() else {
                break;
            };
            self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
            let hit = matches!(
                applied.reply,
                Reply::Claim(ClaimReply::Completed { .. })
                    | Reply::Settle(SettleReply::Completed { .. })
            );
            match waiter.tx.send(applied.reply) {
                Ok(()) => {
                    if hit {
                        self.stats.hits_after_wait.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // The waiter left between the check and the send: give back
                // what it was handed, and serve the next one.
                Err(reply) => self.undo(key, &waiter.cmd, reply),
            }
        }
        if queue.list.is_empty() {
            map.remove(key);
        }
    }

    /// Gives back ownership handed to a waiter that has left. Not for a
    /// claim with an ATTEMPT id: a retry of the same attempt may hold the
    /// same fence on another connection; that claim's lease decides.
    fn undo(&self, key: &[u8], cmd: &Command, reply: Reply) {
        if matches!(cmd, Command::Claim(c) if c.attempt.is_some()) {
            return;
        }
        let key = Bytes::copy_from_slice(key);
        match reply {
            Reply::Claim(ClaimReply::Acquired { fence }) => {
                self.engine.apply(&Command::Release(Release { key, fence }));
            }
            Reply::Claim(ClaimReply::Recover { fence, .. }) => {
                self.engine.apply(&Command::Abandon(Abandon { key, fence }));
            }
            _ => {}
        }
    }

    fn cancel(&self, key: &[u8], id: u64) {
        let mut map = self.shard(key).lock();
        let Some(queue) = map.get_mut(key) else {
            return;
        };
        if let Some(pos) = queue.list.iter().position(|w| w.id == id) {
            queue.list.remove(pos);
            self.stats.parked_now.fetch_sub(1, Ordering::Relaxed);
        }
        if queue.list.is_empty() {
            map.remove(key);
        }
    }

    /// Parked requests now.
    pub fn parked(&self) -> u64 {
        self.stats.parked_now.load(Ordering::Relaxed)
    }
}

/// Serves the key's waiters when the owner's lease runs out (the store only
/// notices a lapse when something looks). One task per waited-on key,
/// aborted when its queue goes or a new owner's lease replaces it.
async fn lease_timer(waiters: Arc<Waiters>, key: Bytes, mut remaining: u64) {
    loop {
        tokio::time::sleep(Duration::from_millis(remaining.clamp(1, TIMER_RECHECK_MS))).await;
        let mut map = waiters.shard(&key).lock();
        if !map.contains_key(&key) {
            return;
        }
        if let Some(left) = waiters.engine.poke(&key) {
            remaining = left;
            continue;
        }
        // Serving re-arms a fresh timer if a waiter becomes the owner and
        // others stay; this one then ends at its next sleep.
        waiters.serve_locked(&mut map, &key);
        remaining = TIMER_RECHECK_MS;
    }
}

/// A parked request. Dropping it withdraws the request.
pub struct WaitHandle {
    waiters: Arc<Waiters>,
    key: Bytes,
    id: u64,
    cmd: Command,
    rx: Option<oneshot::Receiver<Reply>>,
    /// The end of the wait, registered once for the handle's life.
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl WaitHandle {
    /// Waits for the reply: the key's new state, or, when the wait runs
    /// out, its state then (usually INFLIGHT with the lease left).
    pub async fn wait(&mut self) -> Reply {
        let Some(rx) = self.rx.as_mut() else {
            return self.waiters.engine.apply(&self.cmd).reply;
        };
        let reply = tokio::select! {
            biased;
            r = &mut *rx => r.ok(),
            _ = self.timer.as_mut() => {
                self.waiters.cancel(&self.key, self.id);
                // Served between the timeout and the withdrawal?
                rx.try_recv().ok()
            }
        };
        self.rx = None;
        match reply {
            Some(reply) => reply,
            None => {
                self.waiters.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                let applied = self.waiters.engine.apply(&self.cmd);
                if applied.wake {
                    self.waiters.wake(&self.key);
                }
                applied.reply
            }
        }
    }
}

impl Drop for WaitHandle {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            self.waiters.cancel(&self.key, self.id);
            // Handed ownership just before leaving: give it back.
            if let Ok(reply) = rx.try_recv() {
                self.waiters.undo(&self.key, &self.cmd, reply);
                self.waiters.wake(&self.key);
            }
        }
    }
}
