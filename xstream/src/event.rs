//! Completion events for the asynchronous API, shaped like `daos_eq`: take an
//! [`Event`] from an [`EventQueue`], hand it to an operation (for instance
//! [`Mesh::run_with_event`](crate::Mesh::run_with_event)), and later collect
//! completed events with [`EventQueue::poll`] from any thread, or await one
//! with [`EventQueue::wait`] / [`EventQueue::next`].
//!
//! An operation that nobody else finishes (a one-sided read whose
//! completion the client must poll for itself) hands its work to the queue
//! with [`Event::complete_with`]: whoever polls or waits on the queue then
//! drives it, as `daos_eq_poll` progresses the network.
//!
//! Everything here is `Send + Sync`; a queue is meant to be owned by client
//! threads that are not xstreams. The queue is bounded: at most `capacity`
//! events are in flight or completed-but-not-collected.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Identifies an event within its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// One completed event.
#[derive(Debug)]
pub struct Completion<T> {
    pub id: EventId,
    pub result: Result<T>,
}

/// A bounded queue of completion events. Cloning gives another handle to
/// the same queue.
pub struct EventQueue<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for EventQueue<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for EventQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue")
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

struct Inner<T> {
    capacity: usize,
    state: Mutex<State<T>>,
    completed_cv: Condvar,
}

struct State<T> {
    next_id: u64,
    /// Events handed out and not yet completed.
    launched: usize,
    completed: VecDeque<Completion<T>>,
    wakers: Vec<Waker>,
    /// Work of events launched with [`Event::complete_with`].
    progress: Vec<Progress<T>>,
    /// Some progress work asked to be polled again since the last drive.
    progress_woken: bool,
}

type Work<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// The work that completes one event, polled by the queue's pollers.
struct Progress<T> {
    id: EventId,
    work: Work<T>,
}

/// The completion side of one operation. `Send`: hand it to whoever finishes
/// the operation. Dropping it without completing completes it with
/// [`Error::Canceled`].
pub struct Event<T> {
    id: EventId,
    queue: Option<Arc<Inner<T>>>,
}

impl<T> std::fmt::Debug for Event<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("id", &self.id).finish()
    }
}

impl<T> EventQueue<T> {
    /// A queue that holds at most `capacity` (at least 1) events at a time.
    pub fn new(capacity: usize) -> Self {
        let state = State {
            next_id: 0,
            launched: 0,
            completed: VecDeque::new(),
            wakers: Vec::new(),
            progress: Vec::new(),
            progress_woken: false,
        };
        let inner = Inner {
            capacity: capacity.max(1),
            state: Mutex::new(state),
            completed_cv: Condvar::new(),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Takes a new event, or [`Error::EventQueueFull`] when `capacity`
    /// events are in flight or waiting to be collected.
    pub fn event(&self) -> Result<Event<T>> {
        let mut state = self.inner.lock();
        if state.launched + state.completed.len() >= self.inner.capacity {
            return Err(Error::EventQueueFull {
                capacity: self.inner.capacity,
            });
        }
        state.launched += 1;
        let id = EventId(state.next_id);
        state.next_id += 1;
        Ok(Event {
            id,
            queue: Some(self.inner.clone()),
        })
    }

    /// Events launched and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().launched
    }

    /// Waits up to `timeout` for at least one completed event and returns up
    /// to `max` of them, oldest first. Returns at once (maybe empty) when no
    /// event is in flight. Drives the work of events launched with
    /// [`Event::complete_with`] meanwhile (sleeping only while none of it
    /// asked to be polled again). Blocks the calling thread: for client
    /// threads.
    pub fn poll(&self, max: usize, timeout: Duration) -> Vec<Completion<T>>
    where
        T: Send + 'static,
    {
        let deadline = Instant::now() + timeout;
        let waker = Waker::from(Arc::new(ProgressWake {
            inner: Arc::downgrade(&self.inner),
        }));
        loop {
            self.inner.drive(&waker);
            let state = self.inner.lock();
            let now = Instant::now();
            if !state.completed.is_empty() || state.launched == 0 || now >= deadline {
                return Self::take(state, max);
            }
            if state.progress_woken {
                continue;
            }
            let state = match self.inner.completed_cv.wait_timeout(state, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
            if !state.completed.is_empty() {
                return Self::take(state, max);
            }
        }
    }

    fn take(mut state: MutexGuard<'_, State<T>>, max: usize) -> Vec<Completion<T>> {
        let n = max.min(state.completed.len());
        state.completed.drain(..n).collect()
    }

    /// The next completed event, as a future.
    pub fn next(&self) -> impl Future<Output = Completion<T>> + Send + 'static
    where
        T: Send + 'static,
    {
        Wait {
            inner: self.inner.clone(),
            id: None,
        }
    }

    /// Completion of one event, as a future; it is removed from the queue so
    /// `poll` will not return it.
    pub fn wait(&self, id: EventId) -> impl Future<Output = Completion<T>> + Send + 'static
    where
        T: Send + 'static,
    {
        Wait {
            inner: self.inner.clone(),
            id: Some(id),
        }
    }
}

impl<T> Inner<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn complete(&self, id: EventId, result: Result<T>) {
        let wakers = {
            let mut state = self.lock();
            state.launched -= 1;
            state.completed.push_back(Completion { id, result });
            std::mem::take(&mut state.wakers)
        };
        self.completed_cv.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Polls every progress work once with `waker`, completes the events
    /// of what finished; true when some is still pending.
    fn drive(&self, waker: &Waker) -> bool {
        let mut work = {
            let mut state = self.lock();
            state.progress_woken = false;
            std::mem::take(&mut state.progress)
        };
        if work.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(waker);
        let mut done = Vec::new();
        work.retain_mut(|p| match p.work.as_mut().poll(&mut cx) {
            Poll::Ready(result) => {
                done.push((p.id, result));
                false
            }
            Poll::Pending => true,
        });
        let pending = !work.is_empty();
        self.lock().progress.append(&mut work);
        for (id, result) in done {
            self.complete(id, result);
        }
        pending
    }
}

/// Wakes a thread in [`EventQueue::poll`] when progress work asks to be
/// polled again.
struct ProgressWake<T> {
    inner: Weak<Inner<T>>,
}

impl<T: Send + 'static> Wake for ProgressWake<T> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(inner) = self.inner.upgrade() {
            inner.lock().progress_woken = true;
            inner.completed_cv.notify_all();
        }
    }
}

impl<T> Event<T> {
    /// This event's id, as `poll` will report it.
    pub fn id(&self) -> EventId {
        self.id
    }

    /// Completes the operation; callable from any thread.
    pub fn complete(mut self, result: Result<T>) {
        if let Some(queue) = self.queue.take() {
            queue.complete(self.id, result);
        }
    }

    /// Completes the operation with what `work` gives, `work` being polled
    /// by whoever polls or waits on the queue ([`EventQueue::poll`],
    /// [`EventQueue::next`], [`EventQueue::wait`]): for work that makes
    /// progress only when polled. Dropping the queue drops the work.
    pub fn complete_with(mut self, work: impl Future<Output = Result<T>> + Send + 'static)
    where
        T: 'static,
    {
        if let Some(queue) = self.queue.take() {
            let mut state = queue.lock();
            state.progress.push(Progress {
                id: self.id,
                work: Box::pin(work),
            });
            state.progress_woken = true;
            drop(state);
            queue.completed_cv.notify_all();
            let wakers = std::mem::take(&mut queue.lock().wakers);
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

impl<T> Drop for Event<T> {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.take() {
            queue.complete(self.id, Err(Error::Canceled));
        }
    }
}

struct Wait<T> {
    inner: Arc<Inner<T>>,
    id: Option<EventId>,
}

impl<T> Future for Wait<T> {
    type Output = Completion<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completion<T>> {
        self.inner.drive(cx.waker());
        let mut state = self.inner.lock();
        let position = match self.id {
            None => (!state.completed.is_empty()).then_some(0),
            Some(id) => state.completed.iter().position(|c| c.id == id),
        };
        if let Some(completion) = position.and_then(|p| state.completed.remove(p)) {
            return Poll::Ready(completion);
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_from_another_thread_and_polls_in_order() {
        let eq = EventQueue::<u32>::new(4);
        let events: Vec<_> = (0..3).map(|_| eq.event().unwrap()).collect();
        let ids: Vec<_> = events.iter().map(Event::id).collect();
        assert!(eq.event().is_ok(), "fourth fits");
        let t = std::thread::spawn(move || {
            for (i, ev) in events.into_iter().enumerate() {
                ev.complete(Ok(i as u32 * 10));
            }
        });
        t.join().unwrap();
        // The fourth event was dropped at once: canceled.
        let mut got = eq.poll(10, Duration::from_secs(5));
        assert_eq!(got.len(), 4);
        let canceled = got.remove(0);
        assert!(matches!(canceled.result, Err(Error::Canceled)));
        let values: Vec<_> = got
            .iter()
            .map(|c| (c.id, *c.result.as_ref().unwrap()))
            .collect();
        assert_eq!(values, vec![(ids[0], 0), (ids[1], 10), (ids[2], 20)]);
        assert!(
            eq.poll(10, Duration::from_millis(1)).is_empty(),
            "nothing in flight: no wait"
        );
    }

    #[test]
    fn bounded_and_awaitable() {
        let eq = EventQueue::<&'static str>::new(2);
        let a = eq.event().unwrap();
        let b = eq.event().unwrap();
        assert!(matches!(
            eq.event(),
            Err(Error::EventQueueFull { capacity: 2 })
        ));
        let (a_id, b_id) = (a.id(), b.id());
        b.complete(Ok("b"));
        a.complete(Ok("a"));
        let first = futures::executor::block_on(eq.wait(a_id));
        assert_eq!((first.id, first.result.unwrap()), (a_id, "a"));
        let next = futures::executor::block_on(eq.next());
        assert_eq!((next.id, next.result.unwrap()), (b_id, "b"));
        assert_eq!(eq.in_flight(), 0);
    }

    /// Work that is ready only after being polled a few times (as a
    /// one-sided read polling its completion queue wakes itself) completes
    /// its event through `poll` and through `wait`, and work dropped with
    /// its queue is not run.
    #[test]
    fn work_handed_to_the_queue_is_driven_by_its_pollers() {
        struct Spins(u32, u32);
        impl Future for Spins {
            type Output = Result<u32>;
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<u32>> {
                if self.0 == 0 {
                    return Poll::Ready(Ok(self.1));
                }
                self.0 -= 1;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
        let eq = EventQueue::<u32>::new(4);
        let (a, b) = (eq.event().unwrap(), eq.event().unwrap());
        let (a_id, b_id) = (a.id(), b.id());
        a.complete_with(Spins(100, 7));
        b.complete_with(Spins(3, 8));
        let mut got = Vec::new();
        for _ in 0..100 {
            got.extend(eq.poll(4, Duration::from_secs(5)));
            if got.len() == 2 {
                break;
            }
        }
        let mut got: Vec<_> = got.into_iter().map(|c| (c.id, c.result.unwrap())).collect();
        got.sort();
        assert_eq!(got, vec![(a_id, 7), (b_id, 8)]);
        assert_eq!(eq.in_flight(), 0);
        let c = eq.event().unwrap();
        let c_id = c.id();
        c.complete_with(Spins(10, 9));
        let done = futures::executor::block_on(eq.wait(c_id));
        assert_eq!((done.id, done.result.unwrap()), (c_id, 9));
        let dropped = EventQueue::<u32>::new(1);
        dropped.event().unwrap().complete_with(Spins(u32::MAX, 0));
        assert_eq!(dropped.in_flight(), 1, "never driven");
    }
}
