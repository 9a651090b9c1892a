//! DAG jobs from the client side: the [`api::JobClient`] the CLI uses, the
//! worker that offers execution streams and runs tasks ([`worker`], with the
//! runner shared with the engine, [`ferrite_proto::tasks`]; [`node`] is what
//! the worker gives it), the task state objects it keeps ([`task_state`])
//! and the terminal picture of a job ([`picture`]).
//!
//! ```no_run
//! use ferrite_client::jobs::api::JobClient;
//! use ferrite_proto::rpc_jobs::SpecFormat;
//!
//! let token = std::fs::read("ferrite-data/token")?;
//! let mut c = JobClient::connect("127.0.0.1:7341", &token)?;
//! let job = c.submit("name='hi'\n[[task]]\nid='a'\nsteps=[{kind='exec', cmd='true'}]\n", SpecFormat::Toml)?;
//! c.wait(job)?;
//! let status = c.status(job)?;
//! println!("{}", ferrite_client::jobs::picture::render(&status));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod api;
pub mod error;
pub mod node;
pub mod outputs;
pub mod picture;
pub mod worker;

/// The task runner, storage steps and task state objects, shared with the
/// engine's own execution streams.
pub use ferrite_proto::tasks::{run, state as task_state, steps};

pub use api::JobClient;
pub use error::JobsError;
pub use worker::{run_worker, WorkerConfig};
