//! Waiting for the log head to move: the cleaner and the keeper sleep until
//! appends take the head past a mark of theirs, instead of waking on a timer
//! to look (an idle engine woke ~1000 times a second for that, each wake a
//! park and unpark of its executor).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Futures waiting for the head to reach their marks.
pub(crate) struct HeadWatch {
    /// The lowest mark waited for (`u64::MAX`: none), so that an append
    /// below it costs one comparison.
    lowest: Cell<u64>,
    waiting: RefCell<Vec<(u64, Waker)>>,
    /// Bumped by [`HeadWatch::wake_all`]: waiters return whatever the head.
    epoch: Cell<u64>,
}

impl Default for HeadWatch {
    fn default() -> Self {
        Self {
            lowest: Cell::new(u64::MAX),
            waiting: RefCell::new(Vec::new()),
            epoch: Cell::new(0),
        }
    }
}

impl HeadWatch {
    /// The head is now `head`: wakes the waiters whose mark it reached.
    #[inline]
    pub(crate) fn advanced(&self, head: u64) {
        if head >= self.lowest.get() {
            self.wake_upto(head);
        }
    }

    fn wake_upto(&self, head: u64) {
        let mut lowest = u64::MAX;
        self.waiting.borrow_mut().retain(|(mark, waker)| {
            if *mark <= head {
                waker.wake_by_ref();
                false
            } else {
                lowest = lowest.min(*mark);
                true
            }
        });
        self.lowest.set(lowest);
    }

    /// Wakes every waiter, whatever its mark (the store stops or fails).
    pub(crate) fn wake_all(&self) {
        self.epoch.set(self.epoch.get() + 1);
        self.wake_upto(u64::MAX);
    }

    /// Resolves once `head()` is at least `mark`, or at the next
    /// [`HeadWatch::wake_all`].
    pub(crate) fn wait<'a, H: Fn() -> u64 + 'a>(
        &'a self,
        mark: u64,
        head: H,
    ) -> impl Future<Output = ()> + 'a {
        Wait {
            watch: self,
            mark,
            head,
            epoch: self.epoch.get(),
        }
    }
}

struct Wait<'a, H> {
    watch: &'a HeadWatch,
    mark: u64,
    head: H,
    epoch: u64,
}

impl<H: Fn() -> u64> Future for Wait<'_, H> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let w = self.watch;
        if (self.head)() >= self.mark || w.epoch.get() != self.epoch {
            return Poll::Ready(());
        }
        let mut waiting = w.waiting.borrow_mut();
        waiting.retain(|(_, k)| !k.will_wake(cx.waker()));
        waiting.push((self.mark, cx.waker().clone()));
        w.lowest.set(w.lowest.get().min(self.mark));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::HeadWatch;
    use std::cell::Cell;
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    #[derive(Default)]
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    impl Flag {
        fn woken(&self) -> bool {
            self.0.swap(false, Ordering::SeqCst)
        }
    }

    fn poll(f: &mut (impl Future<Output = ()> + Unpin), flag: &Arc<Flag>) -> bool {
        let waker = Waker::from(flag.clone());
        std::pin::Pin::new(f).poll(&mut Context::from_waker(&waker)) == Poll::Ready(())
    }

    /// A waiter is woken when the head reaches its mark (not before) and
    /// at `wake_all`; appends below every mark wake no one.
    #[test]
    fn waiters_wake_at_their_mark_or_at_wake_all() {
        let watch = HeadWatch::default();
        let head = Cell::new(0u64);
        let (f100, f200) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
        let mut at_100 = Box::pin(watch.wait(100, || head.get()));
        let mut at_200 = Box::pin(watch.wait(200, || head.get()));
        assert!(!poll(&mut at_100, &f100));
        assert!(!poll(&mut at_200, &f200));
        head.set(99);
        watch.advanced(99);
        assert!(!f100.woken() && !f200.woken());
        head.set(150);
        watch.advanced(150);
        assert!(f100.woken() && !f200.woken());
        assert!(poll(&mut at_100, &f100));
        assert!(!poll(&mut at_200, &f200));
        watch.wake_all();
        assert!(f200.woken());
        assert!(poll(&mut at_200, &f200));
        assert!(watch.waiting.borrow().is_empty());
    }
}
