//! The job service: DAG jobs, the resource manager, job state objects.
//!
//! - [`spec`]: job files (TOML/JSON) checked into a [`spec::JobGraph`] —
//!   cycles, unknown references and duplicate ids are refused by name — with
//!   every task encoded as a record under `task_key(job, task id)`.
//! - [`rm`]: the resource manager and job queue, an event-driven state
//!   machine over execution streams offered by the engine and by workers;
//!   a job runs on the coordinator slot it is granted, which splits it into
//!   tasks and asks the manager for streams for them.
//! - [`state`]: the job state object, a standalone SQLite file per job.
//! - [`service`]: the listener that workers and the CLI talk to
//!   (`ferrite_proto::rpc_jobs` frames), driving the manager from one task
//!   in the control task class of an xstream, fed by mesh messages; with
//!   task slots, the engine's own xstreams run granted tasks too, with the
//!   runner workers use (`ferrite_proto::tasks`).
//!
//! ```
//! use std::sync::Arc;
//! use ferrite_engine::jobs::rm::{Action, Event, ResourceManager};
//! use ferrite_engine::jobs::spec::{parse_spec, JobGraph};
//! use ferrite_proto::rpc_jobs::SpecFormat;
//!
//! let spec = parse_spec(
//!     "name = 'two'\n[[task]]\nid = 'a'\nsteps = [{kind = 'noop'}]\n\
//!      [[task]]\nid = 'b'\nafter = ['a']\nsteps = [{kind = 'noop'}]\n",
//!     SpecFormat::Toml,
//! ).unwrap();
//! let graph = Arc::new(JobGraph::build(1, spec).unwrap());
//! let mut rm = ResourceManager::new(4, 8);
//! rm.handle(Event::NodeOffered { node: 1, name: "w1".into(), xstreams: 1 }, 0);
//! rm.handle(Event::JobSubmitted { graph, restored: vec![] }, 1);
//! let grants: Vec<_> = rm.take_actions().into_iter()
//!     .filter_map(|a| match a { Action::Grant { tasks, .. } => Some(tasks), _ => None })
//!     .flatten().collect();
//! assert_eq!(grants.len(), 1); // only `a`: `b` waits for it
//! assert_eq!(grants[0].idx, 0);
//! ```

pub mod error;
pub mod rm;
pub mod service;
pub mod spec;
pub mod state;

pub use error::{JobError, SpecError};
pub use service::{JobService, JobServiceConfig};
