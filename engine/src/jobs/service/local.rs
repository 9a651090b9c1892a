//! The engine's own execution streams as a node of the resource manager
//! (node 0, offered when the service has task slots): granted tasks run on
//! the engine's xstreams, in the background task class, with the same
//! runner as a `ferrite worker` ([`ferrite_proto::tasks`]).
//!
//! - Stream `x` runs on xstream `x mod n` of the mesh, its tasks one after
//!   the other (a queue per stream on that xstream).
//! - Storage steps, task records and outputs go to the targets through the
//!   engine's [`Router`] (over the mesh, no RPC), for jobs whose store is
//!   this engine; the manager keeps other engines' jobs off these streams.
//! - `exec` and `io500` steps run on a thread of their own, so no xstream
//!   ever waits for a child process (nor does the job service's use of the
//!   xstream's blocking-thread pool).
//! - One recorder thread owns this node's task state objects (the same code
//!   as a worker's): it writes each batch of updates, then reports the
//!   batch to the control task as [`Input::Local`].

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, RwLock};

use ferrite_proto::rpc::{Reply, Request};
use ferrite_proto::rpc_jobs::TaskGrant;
use ferrite_proto::tasks::recorder::{record_loop, run_granted, Objects, RecMsg};
use ferrite_proto::tasks::state::{Layout, RowUpdate};
use ferrite_proto::tasks::{run_caught, TaskHost, TaskStore};
use ferrite_xstream::{Mesh, TaskClass, XstreamId};
use futures::channel::oneshot;

use super::{Inbox, Input};
use crate::jobs::error::JobError;
use crate::server::Router;

/// Tasks a stream runs before it lets the xstream's other tasks run.
const YIELD_EVERY: u32 = 32;

static NEXT_NODE_UID: AtomicU64 = AtomicU64::new(1);

/// A granted task, and whether it runs against this engine's store.
struct Work {
    grant: TaskGrant,
    store: bool,
}

/// What every stream of the node shares.
struct Shared {
    uid: u64,
    mesh: Mesh,
    router: Option<Router>,
    recorder: Sender<RecMsg>,
    revoked: RwLock<HashSet<u128>>,
    /// Set when the service stops: queued tasks are dropped unrun.
    stopped: AtomicBool,
}

/// The engine as a node running tasks.
pub(super) struct LocalNode {
    pub name: String,
    pub streams: u32,
    mesh: Mesh,
    shared: Arc<Shared>,
}

impl LocalNode {
    /// `streams` execution streams on the xstreams of `mesh`, named `name`
    /// in task state objects (under `dir`), storing through `router`.
    pub fn start(
        name: String,
        streams: u32,
        mesh: Mesh,
        router: Option<Router>,
        dir: PathBuf,
        inbox: Inbox,
    ) -> Result<Self, JobError> {
        std::fs::create_dir_all(&dir).map_err(JobError::io("create task state dir"))?;
        let (recorder, rx) = mpsc::channel();
        let objects = Objects::new(dir, name.clone(), Layout::PerJob);
        let report = move |results, answers| inbox.send(Input::Local { results, answers });
        // Not joined: it ends once the streams and the control task let go
        // of their senders, or the control task is gone.
        super::spawn("jobs-engine-record", move || {
            record_loop(objects, rx, report)
        })?;
        let shared = Arc::new(Shared {
            uid: NEXT_NODE_UID.fetch_add(1, Ordering::Relaxed),
            mesh: mesh.clone(),
            router,
            recorder,
            revoked: RwLock::new(HashSet::new()),
            stopped: AtomicBool::new(false),
        });
        Ok(Self {
            name,
            streams,
            mesh,
            shared,
        })
    }

    /// Whether the node can run the tasks of a job whose store is `url`:
    /// no store, or this engine.
    pub fn reaches(&self, url: Option<&str>) -> bool {
        match (url, &self.shared.router) {
            (None, _) => true,
            (Some(url), Some(r)) => r.urls().iter().any(|u| u == url),
            (Some(_), None) => false,
        }
    }

    /// Runs granted tasks: each is recorded as granted, then queued on its
    /// stream's xstream. Called from the control task.
    pub fn grant(&self, grants: Vec<TaskGrant>, store: bool) {
        let n = self.mesh.len();
        let mut by_xstream: HashMap<usize, Vec<Work>> = HashMap::new();
        for grant in grants {
            let row = RowUpdate::granted(&grant);
            let _ = self.shared.recorder.send(RecMsg::Granted(grant.job, row));
            let xs = grant.xstream as usize % n;
            by_xstream
                .entry(xs)
                .or_default()
                .push(Work { grant, store });
        }
        let mesh = self.mesh.clone();
        let shared = self.shared.clone();
        let send = async move {
            for (xs, works) in by_xstream {
                let shared = shared.clone();
                let sent = mesh.send(XstreamId(xs), TaskClass::Background, move || async move {
                    enqueue(shared, works)
                });
                if let Err(e) = sent.await {
                    tracing::warn!("engine task stream on xstream {xs}: {e}");
                }
            }
        };
        match ferrite_xstream::spawn(TaskClass::Control, send) {
            Ok(t) => {
                t.detach();
            }
            Err(e) => tracing::error!("engine task streams: {e}"),
        }
    }

    /// Drops the job's tasks not started yet.
    pub fn revoke(&self, job: u128) {
        if let Ok(mut r) = self.shared.revoked.write() {
            r.insert(job);
        }
    }

    /// Asks the recorder for the rows of `job` (answered as [`Input::Local`]).
    pub fn query(&self, query: u64, job: u128) {
        let _ = self.shared.recorder.send(RecMsg::Query { query, job });
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
    }
}

/// The tasks queued on this xstream for each stream of each node.
struct Queue {
    works: RefCell<VecDeque<Work>>,
}

thread_local! {
    static QUEUES: RefCell<HashMap<(u64, u32), Rc<Queue>>> = RefCell::new(HashMap::new());
}

/// On the stream's xstream: queues the works; starts the stream's runner
/// if it is idle.
fn enqueue(shared: Arc<Shared>, works: Vec<Work>) {
    let mut idle: Vec<(u32, Rc<Queue>)> = Vec::new();
    QUEUES.with(|queues| {
        let mut queues = queues.borrow_mut();
        for work in works {
            let key = (shared.uid, work.grant.xstream);
            let queue = queues.entry(key).or_insert_with(|| {
                let q = Rc::new(Queue {
                    works: RefCell::new(VecDeque::new()),
                });
                idle.push((work.grant.xstream, q.clone()));
                q
            });
            queue.works.borrow_mut().push_back(work);
        }
    });
    for (stream, queue) in idle {
        let runner = run_stream(shared.clone(), stream, queue);
        match ferrite_xstream::spawn(TaskClass::Background, runner) {
            Ok(t) => {
                t.detach();
            }
            Err(e) => tracing::error!("engine task stream {stream}: {e}"),
        }
    }
}

/// Runs a stream's queued tasks in order; ends (and forgets the queue) once
/// it is empty.
async fn run_stream(shared: Arc<Shared>, stream: u32, queue: Rc<Queue>) {
    let store = shared.router.clone().map(EngineStore);
    let host = XstreamHost {
        mesh: shared.mesh.clone(),
        here: ferrite_xstream::current().unwrap_or(XstreamId(0)),
    };
    let mut buf = Vec::new();
    let mut ran = 0u32;
    loop {
        let next = queue.works.borrow_mut().pop_front();
        let Some(work) = next else {
            QUEUES.with(|q| q.borrow_mut().remove(&(shared.uid, stream)));
            return;
        };
        if shared.stopped.load(Ordering::SeqCst) {
            continue;
        }
        let store = store.as_ref().filter(|_| work.store);
        let g = &work.grant;
        let revoked = shared.revoked.read().is_ok_and(|r| r.contains(&g.job));
        let msg = run_granted(g, revoked, store, &host, &mut buf, &shared.recorder).await;
        if shared.recorder.send(msg).is_err() {
            return;
        }
        ran += 1;
        if ran % YIELD_EVERY == 0 {
            ferrite_xstream::yield_now().await;
        }
    }
}

/// This engine's targets, reached through its router.
struct EngineStore(Router);

impl TaskStore for EngineStore {
    async fn batch(&self, requests: Vec<Request>) -> Result<Vec<Reply>, String> {
        match self.0.execute(Request::Batch(requests)).await {
            Reply::Batch(replies) => Ok(replies),
            Reply::Error { message, .. } => Err(message),
            other => Err(format!("batch answered {other:?}")),
        }
    }
}

/// An engine xstream: blocking work (a child process to wait for) goes to
/// a thread of its own, whose result comes back over the mesh (so the
/// wake-up is a local one). Not the xstream's blocking-thread pool: that is
/// one thread, which the job service also uses to write job state files, so
/// a long `exec` task there would hold up every submit.
struct XstreamHost {
    mesh: Mesh,
    here: XstreamId,
}

impl TaskHost for XstreamHost {
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, String> {
        let (tx, rx) = oneshot::channel();
        let (mesh, here) = (self.mesh.clone(), self.here);
        let run = move || {
            let out = run_caught(f);
            let deliver = mesh.send(here, TaskClass::Background, move || async move {
                let _ = tx.send(out);
            });
            if let Err(e) = futures::executor::block_on(deliver) {
                tracing::warn!("engine task result: {e}");
            }
        };
        // Kept here too, to run on the pool if no thread can be started.
        let job = Arc::new(Mutex::new(Some(run)));
        let theirs = job.clone();
        let spawned = std::thread::Builder::new()
            .name("jobs-exec".into())
            .spawn(move || {
                if let Some(run) = take(&theirs) {
                    run();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("engine task thread: {e}; running it on the blocking pool");
            if let Some(run) = take(&job) {
                glommio::executor().spawn_blocking(run).await;
            }
        }
        // No result at all: the xstreams are stopping.
        rx.await
            .unwrap_or_else(|_| Err("the engine stopped before the task's work ended".into()))
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

#[cfg(test)]
mod tests {
    use super::XstreamHost;
    use ferrite_proto::tasks::TaskHost;
    use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
    use std::time::Duration;

    /// Work that panics on its thread ends the call with the panic's
    /// message (it used to leave the task waiting forever, "running").
    #[test]
    fn blocking_work_that_panics_is_an_error_not_a_hang() {
        let set = XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).unwrap();
        let mesh = set.mesh().clone();
        let done = set
            .mesh()
            .run_on(XstreamId(0), TaskClass::Foreground, move || async move {
                let host = XstreamHost {
                    mesh,
                    here: XstreamId(0),
                };
                let fine = host.blocking(|| 7).await;
                let boom = host.blocking(|| -> u32 { panic!("boom") }).await;
                (fine, boom)
            });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(futures::executor::block_on(done));
        });
        let (fine, boom) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the panicking work never ended the call")
            .unwrap();
        assert_eq!(fine, Ok(7));
        let err = boom.unwrap_err();
        assert!(err.contains("boom"), "{err}");
        set.shutdown().unwrap();
    }
}
