//! `XstreamSet`: one pinned thread per core, each running a glommio
//! `LocalExecutor` with one task queue per [`TaskClass`] and a mailbox pump.

use std::fmt::Display;
use std::future::Future;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use glommio::{Latency, LocalExecutorBuilder, Placement, Shares, TaskQueueHandle};

use crate::checks;
use crate::context::{self, InFlight, XstreamContext};
use crate::error::{Error, Result};
use crate::mesh::Mesh;
use crate::{TaskClass, XstreamConfig, XstreamId};

/// How often the pump yields while waiting for aborted tasks at shutdown.
const SHUTDOWN_YIELDS: usize = 100_000;

/// A running set of pinned execution streams. Dropping it shuts it down.
pub struct XstreamSet {
    mesh: Mesh,
    cores: Vec<usize>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for XstreamSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XstreamSet")
            .field("cores", &self.cores)
            .finish()
    }
}

type InitResult = std::result::Result<(), String>;

impl XstreamSet {
    /// Starts one xstream per configured core, with nothing to initialise.
    pub fn start(config: XstreamConfig) -> Result<Self> {
        Self::start_with(config, |_| async { Ok::<(), std::convert::Infallible>(()) })
    }

    /// Starts the xstreams and runs `init(id)` on each one before it takes
    /// messages, so `!Send` per-core state (thread-locals, `Rc`s) can be set
    /// up there. Returns once every init finished; the first init error
    /// stops the whole set.
    pub fn start_with<I, Fut, E>(config: XstreamConfig, init: I) -> Result<Self>
    where
        I: Fn(XstreamId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + 'static,
        E: Display,
    {
        let cores = checks::resolve_cores(config.cores.as_deref())?;
        checks::check_io_uring()?;
        checks::register_membarrier();
        let io_memory = checks::io_memory_for_limit(config.io_memory_bytes, cores.len())?;
        let mesh = Mesh::new(cores.len(), config.mailbox_capacity);
        let init = Arc::new(init);
        let (ready_tx, ready_rx) = mpsc::channel::<(XstreamId, Result<()>)>();
        let mut set = Self {
            mesh,
            cores: cores.clone(),
            threads: Vec::new(),
        };
        for (index, &core) in cores.iter().enumerate() {
            let id = XstreamId(index);
            let spawn = spawn_xstream(
                &config,
                id,
                core,
                io_memory,
                set.mesh.clone(),
                init.clone(),
                ready_tx.clone(),
            );
            match spawn {
                Ok(handle) => set.threads.push(handle),
                Err(e) => {
                    let _ = set.stop();
                    return Err(e);
                }
            }
        }
        drop(ready_tx);
        for _ in 0..cores.len() {
            let outcome = ready_rx.recv().map_err(|_| Error::Thread {
                xstream: XstreamId(set.threads.len()),
                reason: "an xstream thread exited during start-up".into(),
            });
            if let Err(e) = outcome.and_then(|(_, r)| r) {
                let _ = set.stop();
                return Err(e);
            }
        }
        Ok(set)
    }

    /// Number of xstreams.
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Always false: a set has at least one xstream.
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// The core each xstream is pinned to, by xstream index.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// The mesh, to send work to the xstreams. Clone it freely.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Ids of all xstreams.
    pub fn ids(&self) -> impl Iterator<Item = XstreamId> {
        (0..self.len()).map(XstreamId)
    }

    /// Stops taking messages, cancels the tasks that messages started (their
    /// callers get [`Error::Canceled`]), drops queued messages, and joins the
    /// threads.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        self.mesh.close();
        let mut first_error = Ok(());
        for (i, handle) in self.threads.drain(..).enumerate() {
            if handle.join().is_err() && first_error.is_ok() {
                let reason = "the thread panicked".to_string();
                first_error = Err(Error::Thread {
                    xstream: XstreamId(i),
                    reason,
                });
            }
        }
        first_error
    }
}

impl Drop for XstreamSet {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn spawn_xstream<I, Fut, E>(
    config: &XstreamConfig,
    id: XstreamId,
    core: usize,
    io_memory: usize,
    mesh: Mesh,
    init: Arc<I>,
    ready: mpsc::Sender<(XstreamId, Result<()>)>,
) -> Result<JoinHandle<()>>
where
    I: Fn(XstreamId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), E>> + 'static,
    E: Display,
{
    let name = format!("{}-{}", config.name, id.0);
    let mut builder = LocalExecutorBuilder::new(Placement::Fixed(core))
        .name(&name)
        .io_memory(io_memory)
        // Also the longest a background slice runs before newly woken
        // foreground work gets the CPU (glommio's default is 100 ms).
        .preempt_timer(config.latency_deadline);
    if let Some(spin) = config.spin_before_park {
        builder = builder.spin_before_park(spin);
    }
    let config = config.clone();
    let body = move || {
        let executor = match builder.make() {
            Ok(executor) => executor,
            Err(e) => {
                let reason = e.to_string();
                let _ = ready.send((
                    id,
                    Err(Error::ExecutorStart {
                        xstream: id,
                        core,
                        reason,
                    }),
                ));
                return;
            }
        };
        executor.run(async move {
            let queues = create_queues(&config);
            let in_flight = InFlight::default();
            context::install(XstreamContext {
                id,
                queues,
                mesh: mesh.clone(),
                in_flight: in_flight.clone(),
            });
            let outcome: InitResult = init(id).await.map_err(|e| e.to_string());
            let failed = outcome.is_err();
            let _ = ready.send((
                id,
                outcome.map_err(|reason| Error::Init {
                    xstream: id,
                    reason,
                }),
            ));
            drop(ready);
            if !failed {
                mesh.pump(id).await;
            }
            drain_in_flight(&in_flight).await;
            context::uninstall();
        });
    };
    std::thread::Builder::new()
        .name(name)
        .spawn(body)
        .map_err(|e| Error::Thread {
            xstream: id,
            reason: e.to_string(),
        })
}

fn create_queues(config: &XstreamConfig) -> [TaskQueueHandle; 3] {
    TaskClass::ALL.map(|class| {
        let latency = match class {
            TaskClass::Background => Latency::NotImportant,
            _ => Latency::Matters(config.latency_deadline),
        };
        let shares = Shares::Static(config.shares.of(class).max(1));
        glommio::executor().create_task_queue(shares, latency, class.name())
    })
}

/// Aborts the tasks messages started and lets them unwind (bounded).
async fn drain_in_flight(in_flight: &InFlight) {
    in_flight.abort_all();
    for _ in 0..SHUTDOWN_YIELDS {
        if in_flight.live() == 0 {
            break;
        }
        glommio::executor().yield_task_queue_now().await;
    }
}
