//! Where a reply waits for whoever asked: a blocking caller, a future, or
//! an [`EventQueue`](ferrite_xstream::EventQueue) event.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use ferrite_proto::rpc::Reply;
use ferrite_xstream::Event;

use crate::client::error::Result;
use crate::client::reader::Shared;

/// A reply (or the error that replaced it).
pub type Answer = Result<Reply>;

#[derive(Default)]
struct State {
    answer: Option<Answer>,
    waker: Option<Waker>,
    /// A thread sleeps on the condition variable (std's `notify_all` makes
    /// a system call whether or not anyone waits).
    sleeping: bool,
}

/// One reply slot, shared by the connection's reader and the caller.
#[derive(Default)]
pub(crate) struct Waiter {
    state: Mutex<State>,
    cv: Condvar,
}

impl Waiter {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn complete(&self, answer: Answer) {
        let (waker, sleeping) = {
            let mut s = self.lock();
            s.answer = Some(answer);
            (s.waker.take(), s.sleeping)
        };
        if sleeping {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The answer, if it is there.
    pub(crate) fn take(&self) -> Option<Answer> {
        self.lock().answer.take()
    }

    pub(crate) fn is_answered(&self) -> bool {
        self.lock().answer.is_some()
    }

    /// Blocks until the answer or `deadline`; `None` on timeout.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<Answer> {
        let mut s = self.lock();
        loop {
            if let Some(a) = s.answer.take() {
                return Some(a);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s.sleeping = true;
            s = match self.cv.wait_timeout(s, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
            s.sleeping = false;
        }
    }
}

/// Where the reader thread delivers one reply.
pub(crate) enum Sink {
    Waiter(Arc<Waiter>),
    Event(Event<Answer>),
}

impl Sink {
    pub(crate) fn deliver(self, answer: Answer) {
        match self {
            Sink::Waiter(w) => w.complete(answer),
            Sink::Event(e) => e.complete(Ok(answer)),
        }
    }
}

/// The reply to one pipelined request, as a future. Dropping it does not
/// cancel the request (the engine still applies a sent update).
pub struct ReplyFuture {
    pub(crate) waiter: Arc<Waiter>,
    pub(crate) conn: Arc<Shared>,
    pub(crate) id: u64,
    pub(crate) op: &'static str,
}

impl std::fmt::Debug for ReplyFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyFuture").field("id", &self.id).finish()
    }
}

impl ReplyFuture {
    /// Blocks for the reply, up to the connection's timeout, reading the
    /// connection itself while nobody else does (see [`super::reader`]):
    /// cheaper than `block_on`, whose reply a reader thread would hand over.
    pub fn wait(self) -> Answer {
        let deadline = Instant::now() + self.conn.timeout;
        match self.conn.wait_reading(&self.waiter, deadline) {
            Some(a) => a,
            None => Err(self.conn.timed_out(self.id, self.op)),
        }
    }
}

impl Future for ReplyFuture {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        {
            let mut s = self.waiter.lock();
            if let Some(a) = s.answer.take() {
                return Poll::Ready(a);
            }
            s.waker = Some(cx.waker().clone());
        }
        // Nobody may be reading for us: the background reader must.
        self.conn.kick();
        Poll::Pending
    }
}
