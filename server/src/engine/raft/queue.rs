//! The bounded queue of proposals between the connections and the
//! proposer.
//!
//! One buffer under a lock rather than a channel: a channel stores what it
//! holds in blocks allocated as it fills, and the few blocks it keeps after
//! a burst sit among everything else allocated meanwhile, each holding a
//! page of the allocator resident while the server is idle. The queue's
//! buffer is one allocation, let go of ([`Queue::trim`]) once the server
//! goes quiet.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, TryAcquireError};

use super::{Proposal, Submitted};
use crate::store::Op;
use tokio::sync::oneshot;

/// Room the buffer keeps once trimmed: a few connections' worth.
const KEEP: usize = 64;

/// Why an item was not queued.
pub(super) enum Refused {
    /// The queue holds its capacity.
    Full(Proposal),
    /// The engine is stopping.
    Closed,
}

/// A batch taken from the queue.
pub(super) struct Batch {
    /// The ops, in queue order.
    pub(super) ops: Vec<Op>,
    /// Where each op's outcome goes.
    pub(super) txs: Vec<oneshot::Sender<Submitted>>,
    /// Their approximate encoded size.
    pub(super) bytes: usize,
}

/// A bounded multi-producer queue with one taker.
pub(super) struct Queue {
    items: Mutex<VecDeque<Proposal>>,
    /// Wakes the taker.
    ready: Notify,
    /// Free places: a producer takes one before it queues, the taker gives
    /// back those it takes. Closed when the queue is.
    room: Semaphore,
    /// Free bytes, the same way: a producer takes its proposal's size (all
    /// of them for a proposal larger than that), so that large writes
    /// queued faster than the log takes them wait with their connections
    /// (whose requests count toward the client budget meanwhile) instead
    /// of piling up here. Closed when the queue is.
    bytes_room: Semaphore,
    /// What `bytes_room` holds when the queue is empty.
    bytes_cap: usize,
    /// Proposals queued since the queue was made ([`Queue::arrived`]).
    arrived: AtomicU64,
}

impl Queue {
    /// A queue of at most `capacity` (at least one) proposals, and at most
    /// `bytes` (at least one) of them.
    pub(super) fn new(capacity: usize, bytes: usize) -> Self {
        let bytes_cap = bytes.clamp(1, (u32::MAX as usize).min(Semaphore::MAX_PERMITS));
        Queue {
            items: Mutex::new(VecDeque::with_capacity(KEEP)),
            ready: Notify::new(),
            room: Semaphore::new(capacity.clamp(1, Semaphore::MAX_PERMITS)),
            bytes_room: Semaphore::new(bytes_cap),
            bytes_cap,
            arrived: AtomicU64::new(0),
        }
    }

    /// How many proposals were ever queued: a mark to count, later, those
    /// that came after it ([`Queue::gather_expected`]).
    pub(super) fn arrived(&self) -> u64 {
        self.arrived.load(Ordering::Relaxed)
    }

    /// Queues `p` if there is room; a full queue hands it back, to be
    /// queued when there is (as a channel's `try_send` does).
    #[allow(clippy::result_large_err)]
    pub(super) fn try_push(&self, p: Proposal) -> Result<(), Refused> {
        let place = match self.room.try_acquire() {
            Ok(place) => place,
            Err(TryAcquireError::NoPermits) => return Err(Refused::Full(p)),
            Err(TryAcquireError::Closed) => return Err(Refused::Closed),
        };
        match self.bytes_room.try_acquire_many(self.charge(&p)) {
            Ok(bytes) => {
                place.forget();
                bytes.forget();
                self.put(p);
                Ok(())
            }
            // (The place goes back.)
            Err(TryAcquireError::NoPermits) => Err(Refused::Full(p)),
            Err(TryAcquireError::Closed) => Err(Refused::Closed),
        }
    }

    /// Queues `p` once there is room; refused once the queue is closed.
    pub(super) async fn push(&self, p: Proposal) -> Result<(), Refused> {
        let Ok(place) = self.room.acquire().await else {
            return Err(Refused::Closed);
        };
        let Ok(bytes) = self.bytes_room.acquire_many(self.charge(&p)).await else {
            return Err(Refused::Closed);
        };
        place.forget();
        bytes.forget();
        self.put(p);
        Ok(())
    }

    /// The bytes `p` takes of the queue's: its size, at most all of them
    /// (a larger one waits for an empty queue), at least one.
    fn charge(&self, p: &Proposal) -> u32 {
        p.bytes.clamp(1, self.bytes_cap) as u32
    }

    fn put(&self, p: Proposal) {
        self.items.lock().push_back(p);
        self.arrived.fetch_add(1, Ordering::Relaxed);
        // Stores a wakeup if the taker is not waiting yet: none is lost.
        self.ready.notify_one();
    }

    /// Waits until a proposal is queued (or the queue is closed), then
    /// lets the runtime poll its sockets again, up to `polls` times, as
    /// long as each poll brings more proposals: requests already on their
    /// way (typically from the clients the last entry answered) join the
    /// next batch instead of waiting a whole round for the one after.
    /// Each poll is a yield, not a timer: when nothing more has arrived,
    /// the batch goes at once.
    pub(super) async fn gather(&self, polls: usize) {
        let mut queued = self.first_proposal().await;
        for _ in 0..polls {
            // Runs again once the runtime has polled its I/O driver.
            tokio::task::yield_now().await;
            let now = self.items.lock().len();
            if now == queued {
                break;
            }
            queued = now;
        }
        // The wakeup that the proposals gathered here stored is spent by
        // the next `next_batch`, which finds them queued.
    }

    /// Waits until a proposal is queued (or the queue is closed); how many
    /// are queued then.
    async fn first_proposal(&self) -> usize {
        loop {
            let queued = self.items.lock().len();
            if queued > 0 || self.room.is_closed() {
                return queued;
            }
            // A proposal queued since the check above left its wakeup
            // stored: this returns at once.
            self.ready.notified().await;
        }
    }

    /// Waits for a first proposal, then lets the runtime poll its sockets
    /// again (each poll a yield, not a timer) until `expect` proposals
    /// came after the mark `since` (an earlier [`Queue::arrived`]), or
    /// `idle` passed since the latest one came, or `max` since the first:
    /// the requests of the clients the last entries answered join the next
    /// batch, although they arrive spread out. Proposals queued before the
    /// mark are not counted (they are taken anyway): they come from
    /// clients answered earlier, and counting them would stop the wait
    /// short of as many of those just answered. Whether `expect` came.
    pub(super) async fn gather_expected(
        &self,
        expect: usize,
        since: u64,
        idle: Duration,
        max: Duration,
    ) -> bool {
        self.first_proposal().await;
        let came = || self.arrived().wrapping_sub(since);
        let mut seen = came();
        let first = Instant::now();
        let mut latest = first;
        while seen < expect as u64 && !self.room.is_closed() {
            tokio::task::yield_now().await;
            let now = Instant::now();
            let n = came();
            if n != seen {
                (seen, latest) = (n, now);
            } else if now - latest >= idle {
                break;
            }
            if now - first >= max {
                break;
            }
        }
        seen >= expect as u64
    }

    /// Waits for proposals, then takes them from the front: at most
    /// `max_ops`, and no more than `max_bytes` unless the first alone is
    /// larger. Proposals whose submitter gave up are dropped on the way
    /// (never proposed). `None` once the queue is closed and empty.
    pub(super) async fn next_batch(&self, max_ops: usize, max_bytes: usize) -> Option<Batch> {
        loop {
            let (batch, taken, freed) = {
                let mut items = self.items.lock();
                let mut batch = Batch {
                    ops: Vec::new(),
                    txs: Vec::new(),
                    bytes: 0,
                };
                let mut taken = 0;
                let mut freed = 0;
                while let Some(p) = items.front() {
                    if !batch.ops.is_empty() && batch.bytes + p.bytes > max_bytes {
                        break;
                    }
                    let Some(p) = items.pop_front() else {
                        break;
                    };
                    taken += 1;
                    freed += self.charge(&p) as usize;
                    if p.take() {
                        batch.bytes += p.bytes;
                        batch.ops.push(p.op);
                        batch.txs.push(p.tx);
                        if batch.ops.len() >= max_ops {
                            break;
                        }
                    }
                }
                (batch, taken, freed)
            };
            self.room.add_permits(taken);
            self.bytes_room.add_permits(freed);
            if !batch.ops.is_empty() {
                return Some(batch);
            }
            if taken == 0 && self.room.is_closed() {
                return None;
            }
            if taken == 0 {
                self.ready.notified().await;
            }
        }
    }

    /// Lets go of the buffer's room beyond a few places if it is empty
    /// (called when the server goes quiet).
    pub(super) fn trim(&self) {
        let mut items = self.items.lock();
        if items.is_empty() && items.capacity() > KEEP {
            *items = VecDeque::with_capacity(KEEP);
        }
    }

    /// Whether the queue was closed (the engine is stopping).
    pub(super) fn is_closed(&self) -> bool {
        self.room.is_closed()
    }

    /// Refuses further proposals; the taker takes what is queued, then
    /// stops.
    pub(super) fn close(&self) {
        self.room.close();
        self.bytes_room.close();
        self.ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    use bytes::Bytes;

    use super::*;
    use crate::engine::raft::{QUEUED, WITHDRAWN};

    /// A proposal of `bytes` that expires key `n`; its state and receiver.
    fn proposal(n: u8, bytes: usize) -> (Proposal, Arc<AtomicU8>, oneshot::Receiver<Submitted>) {
        let (tx, rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let p = Proposal {
            op: Op::Expire {
                keys: vec![Bytes::from(vec![n])],
            },
            bytes,
            tx,
            state: Arc::clone(&state),
        };
        (p, state, rx)
    }

    fn key(op: &Op) -> u8 {
        match op {
            Op::Expire { keys } => keys[0][0],
            _ => unreachable!(),
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_until_the_taker_frees_room() {
        let q = Arc::new(Queue::new(2, 1 << 20));
        assert!(q.try_push(proposal(1, 10).0).is_ok());
        assert!(q.try_push(proposal(2, 10).0).is_ok());
        let Err(Refused::Full(third)) = q.try_push(proposal(3, 10).0) else {
            panic!("a third proposal fit in a queue of two");
        };
        let pusher = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.push(third).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(!pusher.is_finished(), "pushed into a full queue");
        let batch = q.next_batch(1, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [1]);
        assert!(pusher.await.unwrap(), "the waiting push got the freed room");
        let batch = q.next_batch(10, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [2, 3]);
    }

    /// Large writes queued faster than the log takes them piled up here
    /// (a count of proposals bounded them, not their size): now they
    /// wait for room in bytes too, and one larger than the whole room
    /// waits for an empty queue.
    #[tokio::test]
    async fn a_queue_holds_no_more_bytes_than_its_cap() {
        let q = Arc::new(Queue::new(100, 100));
        assert!(q.try_push(proposal(1, 60).0).is_ok());
        let Err(Refused::Full(second)) = q.try_push(proposal(2, 60).0) else {
            panic!("120 bytes queued in a room of 100");
        };
        assert!(q.try_push(proposal(3, 40).0).is_ok(), "40 more fit");
        let pusher = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.push(second).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(!pusher.is_finished(), "pushed past the byte cap");
        let batch = q.next_batch(1, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [1]);
        assert!(
            pusher.await.unwrap(),
            "the waiting push got the freed bytes"
        );
        // Larger than the whole room: queued once the queue is empty.
        let Err(Refused::Full(big)) = q.try_push(proposal(4, 500).0) else {
            panic!("500 bytes queued beside 100");
        };
        let batch = q.next_batch(10, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [3, 2]);
        assert!(q.try_push(big).is_ok(), "alone, it fits");
        assert!(
            matches!(q.try_push(proposal(5, 1).0), Err(Refused::Full(_))),
            "nothing fits beside it"
        );
    }

    #[tokio::test]
    async fn a_batch_keeps_to_its_caps_and_drops_the_withdrawn() {
        let q = Queue::new(100, 1 << 20);
        let mut states = Vec::new();
        let mut receivers = Vec::new();
        for n in 0..6 {
            let (p, state, rx) = proposal(n, 40);
            q.try_push(p).ok().unwrap();
            states.push(state);
            receivers.push(rx);
        }
        // Its submitter gave up: never proposed.
        states[1].store(WITHDRAWN, Ordering::Release);
        // 100 bytes: two proposals of 40 (the withdrawn one not counted).
        let batch = q.next_batch(10, 100).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(batch.bytes, 80);
        assert_eq!(batch.txs.len(), 2);
        // A first proposal larger than the cap goes alone.
        let batch = q.next_batch(10, 10).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [3]);
        // At most max_ops.
        let batch = q.next_batch(1, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [4]);
        assert!(
            receivers[1].try_recv().is_err(),
            "the withdrawn proposal's sender is dropped, never answered"
        );
    }

    #[tokio::test]
    async fn a_closed_queue_hands_over_what_it_holds_then_ends() {
        let q = Queue::new(10, 1 << 20);
        q.try_push(proposal(7, 1).0).ok().unwrap();
        q.close();
        assert!(matches!(q.try_push(proposal(8, 1).0), Err(Refused::Closed)));
        assert!(matches!(
            q.push(proposal(9, 1).0).await,
            Err(Refused::Closed)
        ));
        let batch = q.next_batch(10, usize::MAX).await.unwrap();
        assert_eq!(batch.ops.iter().map(key).collect::<Vec<_>>(), [7]);
        assert!(q.next_batch(10, usize::MAX).await.is_none());
    }

    #[tokio::test]
    async fn the_taker_wakes_for_a_proposal_queued_while_it_waits() {
        let q = Arc::new(Queue::new(10, 1 << 20));
        let taker = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.next_batch(10, usize::MAX).await.map(|b| b.ops.len()) }
        });
        tokio::task::yield_now().await;
        q.try_push(proposal(1, 1).0).ok().unwrap();
        let taken = tokio::time::timeout(std::time::Duration::from_secs(5), taker)
            .await
            .expect("the taker was not woken")
            .unwrap();
        assert_eq!(taken, Some(1));
    }

    /// A producer that queues `n` proposals, one per turn of the runtime
    /// (as connections read requests that arrive one after another).
    fn trickle(q: &Arc<Queue>, n: u8) -> tokio::task::JoinHandle<()> {
        let q = Arc::clone(q);
        tokio::spawn(async move {
            for k in 0..n {
                q.try_push(proposal(k, 1).0).ok().unwrap();
                tokio::task::yield_now().await;
            }
        })
    }

    /// Pushes `n` proposals, `gap` apart.
    fn spaced(q: &Arc<Queue>, n: u8, gap: Duration) -> tokio::task::JoinHandle<()> {
        let q = Arc::clone(q);
        tokio::spawn(async move {
            for k in 0..n {
                q.try_push(proposal(k, 1).0).ok().unwrap();
                tokio::time::sleep(gap).await;
            }
        })
    }

    #[tokio::test]
    async fn gathering_the_expected_waits_for_them_while_they_keep_coming() {
        let ms = Duration::from_millis;
        // Five expected, coming 2 ms apart: all five, however long that
        // takes within `max`.
        let q = Arc::new(Queue::new(100, 1 << 20));
        let producer = spaced(&q, 5, ms(2));
        q.gather_expected(5, q.arrived(), ms(50), ms(5_000)).await;
        assert_eq!(q.items.lock().len(), 5);
        producer.await.unwrap();
        q.next_batch(100, usize::MAX).await.unwrap();
        // Five expected, two come, then nothing for longer than `idle`:
        // the two, once `idle` passed.
        let producer = spaced(&q, 2, ms(1));
        let started = Instant::now();
        q.gather_expected(5, q.arrived(), ms(30), ms(5_000)).await;
        let took = started.elapsed();
        assert_eq!(q.items.lock().len(), 2);
        assert!(took >= ms(30) && took < ms(2_000), "took {took:?}");
        producer.await.unwrap();
        q.next_batch(100, usize::MAX).await.unwrap();
        // More expected than come within `max`, though they keep coming:
        // what came by then.
        let producer = spaced(&q, 100, ms(5));
        let started = Instant::now();
        q.gather_expected(100, q.arrived(), ms(1_000), ms(40)).await;
        let (took, got) = (started.elapsed(), q.items.lock().len());
        assert!(took >= ms(40) && took < ms(2_000), "took {took:?}");
        assert!((2..100).contains(&got), "{got} gathered");
        producer.abort();
        // A closed queue: no wait.
        q.close();
        tokio::time::timeout(
            ms(5_000),
            q.gather_expected(1_000, q.arrived(), ms(1_000), ms(1_000)),
        )
        .await
        .expect("gathering waited on a closed queue");
    }

    #[tokio::test]
    async fn gathering_the_expected_counts_only_those_queued_after_the_mark() {
        let ms = Duration::from_millis;
        // Three stragglers of an earlier round are queued when an entry of
        // five is answered (the mark); those five clients' requests come
        // back 2 ms apart. The wait is for the five, not for five in all:
        // counting the stragglers would take three of the five and leave
        // two for the round after, and the clients would stay split.
        let q = Arc::new(Queue::new(100, 1 << 20));
        for k in 0..3 {
            q.try_push(proposal(100 + k, 1).0).ok().unwrap();
        }
        let mark = q.arrived();
        assert_eq!(mark, 3);
        let producer = spaced(&q, 5, ms(2));
        let met = q.gather_expected(5, mark, ms(50), ms(5_000)).await;
        assert!(met, "the five answered came back");
        assert_eq!(q.items.lock().len(), 8, "the stragglers and all five");
        producer.await.unwrap();
        let batch = q.next_batch(100, usize::MAX).await.unwrap();
        assert_eq!(
            batch.ops.iter().map(key).collect::<Vec<_>>(),
            [100, 101, 102, 0, 1, 2, 3, 4],
            "in the order they came"
        );
        // Arrivals keep counting across batches taken.
        assert_eq!(q.arrived(), 8);
        // Fewer come back than were answered: what came, after `idle`.
        let mark = q.arrived();
        let producer = spaced(&q, 2, ms(1));
        assert!(!q.gather_expected(5, mark, ms(30), ms(5_000)).await);
        assert_eq!(q.items.lock().len(), 2);
        producer.await.unwrap();
    }

    #[tokio::test]
    async fn gathering_waits_for_a_first_proposal_then_for_those_still_coming() {
        let q = Arc::new(Queue::new(100, 1 << 20));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), q.gather(8))
                .await
                .is_err(),
            "gathered from an empty queue"
        );
        let producer = trickle(&q, 5);
        q.gather(8).await;
        assert_eq!(
            q.items.lock().len(),
            5,
            "each turn brought one more: all five gathered"
        );
        producer.await.unwrap();
        let batch = q.next_batch(100, usize::MAX).await.unwrap();
        assert_eq!(
            batch.ops.iter().map(key).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }

    #[tokio::test]
    async fn gathering_stops_at_its_polls_or_at_a_poll_that_brings_nothing() {
        // At most `polls` turns: the first proposal and two more.
        let q = Arc::new(Queue::new(100, 1 << 20));
        let producer = trickle(&q, 6);
        q.gather(2).await;
        assert_eq!(q.items.lock().len(), 3);
        producer.await.unwrap();
        q.next_batch(100, usize::MAX).await.unwrap();
        // Nothing more coming: one poll, and the batch goes.
        q.try_push(proposal(9, 1).0).ok().unwrap();
        let lonely = tokio::time::timeout(std::time::Duration::from_secs(5), q.gather(1_000_000));
        lonely
            .await
            .expect("gathering waited although nothing came");
        assert_eq!(q.items.lock().len(), 1);
        // A closed, empty queue: no wait.
        q.next_batch(100, usize::MAX).await.unwrap();
        q.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), q.gather(4))
            .await
            .expect("gathering waited on a closed queue");
    }

    #[tokio::test]
    async fn an_emptied_queue_lets_go_of_a_burst_s_room() {
        let q = Queue::new(10_000, 1 << 20);
        for _ in 0..5_000 {
            q.try_push(proposal(0, 1).0).ok().unwrap();
        }
        q.next_batch(4_999, usize::MAX).await.unwrap();
        // Not while anything is queued.
        q.trim();
        assert!(q.items.lock().capacity() >= 5_000);
        q.next_batch(10, usize::MAX).await.unwrap();
        q.trim();
        assert!(q.items.lock().capacity() <= 2 * KEEP);
        // Room freed by taking is room again.
        assert_eq!(q.room.available_permits(), 10_000);
    }
}
