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

/// A reply (or the error that replaced it).
pub type Answer = Result<Reply>;

#[derive(Default)]
struct State {
    answer: Option<Answer>,
    waker: Option<Waker>,
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
        let waker = {
            let mut s = self.lock();
            s.answer = Some(answer);
            s.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
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
            s = match self.cv.wait_timeout(s, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
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
}

impl std::fmt::Debug for ReplyFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyFuture").finish()
    }
}

impl Future for ReplyFuture {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut s = self.waiter.lock();
        if let Some(a) = s.answer.take() {
            return Poll::Ready(a);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
