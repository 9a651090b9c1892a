//! A bounded, lock-free lane (crossbeam `ArrayQueue`) with waker-based
//! back-pressure: a producer that finds the lane full parks its waker and is
//! woken when the consumer frees a slot. The waiter list is touched only on
//! that slow path.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use crossbeam_queue::ArrayQueue;

pub(crate) struct Lane<T> {
    queue: ArrayQueue<T>,
    space_waiters: Mutex<Vec<Waker>>,
    has_space_waiters: AtomicBool,
}

impl<T> Lane<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            queue: ArrayQueue::new(capacity.max(1)),
            space_waiters: Mutex::new(Vec::new()),
            has_space_waiters: AtomicBool::new(false),
        }
    }

    /// Pushes without waiting; gives the item back when the lane is full.
    pub(crate) fn try_push(&self, item: T) -> Result<(), T> {
        self.queue.push(item)
    }

    /// Pushes `item` (taken from the slot) or parks the waker until there is
    /// space; on `Pending` the item is back in the slot.
    pub(crate) fn poll_push(&self, slot: &mut Option<T>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(item) = slot.take() else {
            return Poll::Ready(());
        };
        let item = match self.queue.push(item) {
            Ok(()) => return Poll::Ready(()),
            Err(item) => item,
        };
        {
            let mut waiters = self.space_waiters.lock().unwrap_or_else(|e| e.into_inner());
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            self.has_space_waiters.store(true, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        match self.queue.push(item) {
            Ok(()) => Poll::Ready(()),
            Err(item) => {
                *slot = Some(item);
                Poll::Pending
            }
        }
    }

    pub(crate) fn pop(&self) -> Option<T> {
        let item = self.queue.pop()?;
        fence(Ordering::SeqCst);
        if self.has_space_waiters.load(Ordering::SeqCst) {
            self.wake_space_waiters();
        }
        Some(item)
    }

    pub(crate) fn wake_space_waiters(&self) {
        let waiters = {
            let mut waiters = self.space_waiters.lock().unwrap_or_else(|e| e.into_inner());
            self.has_space_waiters.store(false, Ordering::SeqCst);
            std::mem::take(&mut *waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;

    #[test]
    fn full_lane_parks_then_accepts_after_pop() {
        let lane = Lane::new(2);
        lane.try_push(1).unwrap();
        lane.try_push(2).unwrap();
        assert_eq!(lane.try_push(3), Err(3));
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut slot = Some(3);
        assert!(lane.poll_push(&mut slot, &mut cx).is_pending());
        assert_eq!(slot, Some(3));
        assert_eq!(lane.pop(), Some(1));
        assert!(lane.poll_push(&mut slot, &mut cx).is_ready());
        assert_eq!(slot, None);
        assert_eq!(
            (lane.pop(), lane.pop(), lane.pop()),
            (Some(2), Some(3), None)
        );
        assert!(lane.is_empty());
    }
}
