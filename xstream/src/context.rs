//! What an xstream knows about itself: its id, its task queues, its mesh.
//! Lives in a thread-local set up before the init closure runs.

use std::cell::RefCell;
use std::future::Future;

use std::panic::AssertUnwindSafe;

use futures::future::{AbortHandle, Abortable};
use futures::FutureExt;
use glommio::{Task, TaskQueueHandle};

use crate::error::{Error, Result};
use crate::mesh::Mesh;
use crate::{TaskClass, XstreamId};

pub(crate) struct XstreamContext {
    pub(crate) id: XstreamId,
    pub(crate) queues: [TaskQueueHandle; 3],
    pub(crate) mesh: Mesh,
    /// Tasks started by messages, aborted at shutdown.
    pub(crate) in_flight: InFlight,
}

thread_local! {
    static CONTEXT: RefCell<Option<XstreamContext>> = const { RefCell::new(None) };
}

pub(crate) fn install(context: XstreamContext) {
    CONTEXT.with(|c| *c.borrow_mut() = Some(context));
}

pub(crate) fn uninstall() -> Option<XstreamContext> {
    CONTEXT.with(|c| c.borrow_mut().take())
}

pub(crate) fn with<R>(f: impl FnOnce(&XstreamContext) -> R) -> Option<R> {
    CONTEXT.with(|c| c.borrow().as_ref().map(f))
}

/// The xstream the calling thread is, if it is one.
pub fn current() -> Option<XstreamId> {
    with(|c| c.id)
}

/// The mesh of the xstream the calling thread is, if it is one.
pub fn current_mesh() -> Option<Mesh> {
    with(|c| c.mesh.clone())
}

/// Spawns `future` into the `class` queue of the calling xstream.
///
/// Errors with [`Error::NotOnXstream`] on any other thread.
pub fn spawn<T: 'static>(
    class: TaskClass,
    future: impl Future<Output = T> + 'static,
) -> Result<Task<T>> {
    let queue = with(|c| c.queues[class.index()]).ok_or(Error::NotOnXstream)?;
    glommio::spawn_local_into(future, queue).map_err(|_| Error::ShutDown)
}

/// Spawns a message's task: tracked so that shutdown can abort it.
pub(crate) fn spawn_tracked(class: TaskClass, future: impl Future<Output = ()> + 'static) {
    let started = with(|c| {
        let (handle, registration) = AbortHandle::new_pair();
        let slot = c.in_flight.insert(handle);
        let in_flight = c.in_flight.clone();
        let task = async move {
            // A panic cancels this task only: its caller sees `Canceled`.
            let _ = Abortable::new(AssertUnwindSafe(future).catch_unwind(), registration).await;
            in_flight.remove(slot);
        };
        glommio::spawn_local_into(task, c.queues[class.index()]).map(Task::detach)
    });
    // Outside an xstream, or the queue is gone: dropping the future cancels
    // it, which its caller sees as `Error::Canceled`.
    let _ = started;
}

/// Abort handles of the tasks started by messages, by slot.
#[derive(Clone, Default)]
pub(crate) struct InFlight {
    slots: std::rc::Rc<RefCell<Slots>>,
}

#[derive(Default)]
struct Slots {
    handles: Vec<Option<AbortHandle>>,
    free: Vec<usize>,
    live: usize,
}

impl InFlight {
    fn insert(&self, handle: AbortHandle) -> usize {
        let mut s = self.slots.borrow_mut();
        s.live += 1;
        match s.free.pop() {
            Some(slot) => {
                s.handles[slot] = Some(handle);
                slot
            }
            None => {
                s.handles.push(Some(handle));
                s.handles.len() - 1
            }
        }
    }

    fn remove(&self, slot: usize) {
        let mut s = self.slots.borrow_mut();
        if let Some(h) = s.handles.get_mut(slot) {
            if h.take().is_some() {
                s.live -= 1;
                s.free.push(slot);
            }
        }
    }

    pub(crate) fn abort_all(&self) {
        let s = self.slots.borrow();
        s.handles.iter().flatten().for_each(AbortHandle::abort);
    }

    pub(crate) fn live(&self) -> usize {
        self.slots.borrow().live
    }
}

/// Lets the other ready tasks of the current task queue run once, then
/// resumes (one `Pending` with an immediate self-wake).
pub async fn yield_now() {
    struct YieldNow(bool);
    impl std::future::Future for YieldNow {
        type Output = ();
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<()> {
            if self.0 {
                return std::task::Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
    YieldNow(false).await
}
