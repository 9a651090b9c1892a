//! Ferrite execution streams.
//!
//! An *xstream* is an OS thread pinned to one core running a glommio
//! `LocalExecutor`. An [`XstreamSet`] starts one per core (or per core of a
//! configured list), after checking the core list, io_uring and the
//! locked-memory limit. Each xstream has three task queues, one per
//! [`TaskClass`]: foreground I/O gets most of the CPU, background work
//! (flush, compaction, rebuild) gets what is left, control sits between.
//!
//! Work crosses cores only as messages on the [`Mesh`]: bounded, lock-free
//! lanes, one per sending xstream plus one shared by all other threads, with
//! waker-based wakeups and back-pressure when full.
//!
//! ```
//! use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
//!
//! let set = XstreamSet::start(XstreamConfig::default()).unwrap();
//! let mesh = set.mesh().clone();
//! // From a plain thread: run a closure on xstream 0 and wait for it.
//! let on = futures::executor::block_on(
//!     mesh.run_on(XstreamId(0), TaskClass::Foreground, || async {
//!         ferrite_xstream::current().unwrap()
//!     }),
//! );
//! assert_eq!(on.unwrap(), XstreamId(0));
//! set.shutdown().unwrap();
//! ```
//!
//! Per-core `!Send` state is set up by an init closure that runs on each
//! xstream before it takes messages:
//!
//! ```
//! use std::cell::Cell;
//! use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
//!
//! thread_local!(static TARGET: Cell<usize> = const { Cell::new(usize::MAX) });
//! let set = XstreamSet::start_with(XstreamConfig::default(), |id: XstreamId| async move {
//!     TARGET.with(|t| t.set(id.0 * 10));
//!     Ok::<(), std::io::Error>(())
//! })
//! .unwrap();
//! let last = XstreamId(set.len() - 1);
//! let got = futures::executor::block_on(
//!     set.mesh().run_on(last, TaskClass::Control, || async { TARGET.with(Cell::get) }),
//! );
//! assert_eq!(got.unwrap(), last.0 * 10);
//! ```
//!
//! A [`TaskGraph`] runs tasks with dependencies over the xstreams, like
//! DAOS's TSE. A failure cancels the dependents, with the failure as cause:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use ferrite_xstream::{RunOptions, Task, TaskError, TaskGraph, TaskOutcome, XstreamConfig, XstreamSet};
//!
//! let set = XstreamSet::start(XstreamConfig::default()).unwrap();
//! let mut graph = TaskGraph::with_capacity(16);
//! let seen = Arc::new(Mutex::new(None));
//! let fetch = graph.add(&[], Task::new(|| Ok(()))).unwrap();
//! let parse = graph.add(&[fetch], Task::new(|| Err(TaskError::new("bad header")))).unwrap();
//! let s = seen.clone();
//! let index = graph
//!     .add(&[parse], Task::noop().completion_callback(move |_, outcome| {
//!         *s.lock().unwrap() = Some(outcome.clone());
//!     }))
//!     .unwrap();
//! // A dependency that would close a cycle is refused, naming the tasks.
//! assert!(graph.add_dependency(fetch, index).is_err());
//! let report = futures::executor::block_on(graph.run(set.mesh(), RunOptions::seeded(7))).unwrap();
//! assert_eq!((report.completed, report.canceled, report.failed.len()), (1, 1, 1));
//! let outcome = seen.lock().unwrap().clone();
//! assert!(matches!(outcome, Some(TaskOutcome::Canceled { cause, .. }) if cause == parse));
//! ```
//!
//! The asynchronous client API completes [`Event`]s into an [`EventQueue`],
//! polled from any thread, as with `daos_eq_poll`:
//!
//! ```
//! use std::time::Duration;
//! use ferrite_xstream::{EventQueue, TaskClass, XstreamConfig, XstreamId, XstreamSet};
//!
//! let set = XstreamSet::start(XstreamConfig::default()).unwrap();
//! let eq = EventQueue::<u64>::new(64);
//! let event = eq.event().unwrap();
//! let id = event.id();
//! futures::executor::block_on(set.mesh().run_with_event(XstreamId(0), TaskClass::Foreground, event, || async { 42 }));
//! let done = eq.poll(8, Duration::from_secs(10));
//! assert_eq!(done.len(), 1);
//! assert_eq!((done[0].id, *done[0].result.as_ref().unwrap()), (id, 42));
//! ```

mod alloc;
mod checks;
mod config;
mod context;
mod error;
mod event;
mod graph;
mod lane;
mod mesh;
mod rng;
mod schedstat;
mod set;

pub use alloc::tune_allocator;
pub use checks::{
    allowed_cores, check_io_uring, fit_io_memory, io_memory_for_limit, process_cores,
    resolve_cores, IO_MEMORY_BYTES_MIN, RING_OVERHEAD_BYTES,
};
pub use config::{ClassShares, TaskClass, XstreamConfig, XstreamId, DEFAULT_IO_MEMORY_BYTES};
pub use context::{current, current_mesh, spawn, yield_now};
pub use error::{Error, Result};
pub use event::{Completion, Event, EventId, EventQueue};
pub use graph::{
    GraphReport, PreparedGraph, RunOptions, Task, TaskError, TaskGraph, TaskId, TaskOutcome,
    TraceEntry,
};
pub use mesh::Mesh;
pub use rng::{seed_from_env, SeededRng};
pub use set::XstreamSet;
