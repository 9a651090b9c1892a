//! End-of-round exchange between the shards of a running graph: every shard
//! sends every other shard one batch per round (maybe empty) and waits for
//! the batches of the same round from all others. A shard is at most one
//! round ahead of any other, so each inbox holds at most `2 * shards`
//! batches.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crossbeam_queue::ArrayQueue;
use futures::task::AtomicWaker;

/// What a shard tells the others at the end of a round.
pub(crate) struct Batch {
    pub(crate) round: u32,
    pub(crate) from: usize,
    /// Its tasks not yet finished.
    pub(crate) remaining: u64,
    /// Tasks it finished this round.
    pub(crate) finished: u64,
    /// Released dependents on the receiver: `local index << 32 | cause`.
    pub(crate) items: Vec<u64>,
}

pub(crate) struct Exchange {
    inboxes: Vec<Inbox>,
}

struct Inbox {
    queue: ArrayQueue<Batch>,
    waker: AtomicWaker,
}

impl Exchange {
    pub(crate) fn new(shards: usize) -> Self {
        let inboxes = (0..shards)
            .map(|_| Inbox {
                queue: ArrayQueue::new(2 * shards.max(1)),
                waker: AtomicWaker::new(),
            })
            .collect();
        Self { inboxes }
    }

    pub(crate) fn len(&self) -> usize {
        self.inboxes.len()
    }

    /// The bound above makes `send` never fail; a full inbox is a scheduler
    /// bug and is reported as such.
    /// Queues `batch` for shard `to`; the sender then has `wake(to)` run
    /// on `to`'s xstream (a message), so the wake is a local one.
    pub(crate) fn send(&self, to: usize, batch: Batch) -> Result<(), ()> {
        self.inboxes[to].queue.push(batch).map_err(|_| ())
    }

    /// Wakes shard `to` if it waits for batches.
    pub(crate) fn wake(&self, to: usize) {
        self.inboxes[to].waker.wake();
    }

    /// Waits for the batches of `round` from every shard but `me`, keeping
    /// early batches of the next round in `stash`. Returns them by sender.
    pub(crate) fn receive<'a>(
        &'a self,
        me: usize,
        round: u32,
        stash: &'a mut Vec<Batch>,
    ) -> impl Future<Output = Vec<Batch>> + 'a {
        let mut got: Vec<Batch> = Vec::with_capacity(self.inboxes.len());
        let mut i = 0;
        while i < stash.len() {
            if stash[i].round == round {
                got.push(stash.swap_remove(i));
            } else {
                i += 1;
            }
        }
        Receive {
            exchange: self,
            me,
            round,
            stash,
            got,
        }
    }
}

struct Receive<'a> {
    exchange: &'a Exchange,
    me: usize,
    round: u32,
    stash: &'a mut Vec<Batch>,
    got: Vec<Batch>,
}

impl Future for Receive<'_> {
    type Output = Vec<Batch>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<Batch>> {
        let this = &mut *self;
        let inbox = &this.exchange.inboxes[this.me];
        let wanted = this.exchange.inboxes.len() - 1;
        loop {
            while let Some(batch) = inbox.queue.pop() {
                if batch.round == this.round {
                    this.got.push(batch);
                } else {
                    this.stash.push(batch);
                }
            }
            if this.got.len() >= wanted {
                let mut got = std::mem::take(&mut this.got);
                got.sort_unstable_by_key(|b| b.from);
                return Poll::Ready(got);
            }
            inbox.waker.register(cx.waker());
            if inbox.queue.is_empty() {
                return Poll::Pending;
            }
        }
    }
}
