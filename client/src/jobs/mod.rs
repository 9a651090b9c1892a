//! DAG jobs from the client side: the [`api::JobClient`] the CLI uses, the
//! worker that offers execution streams and runs tasks ([`worker`]), the task
//! state objects it keeps ([`task_state`]) and the terminal picture of a job
//! ([`picture`]).
//!
//! ```no_run
//! use ferrite_client::jobs::api::JobClient;
//! use ferrite_proto::rpc_jobs::SpecFormat;
//!
//! let mut c = JobClient::connect("127.0.0.1:7341")?;
//! let job = c.submit("name='hi'\n[[task]]\nid='a'\nsteps=[{kind='exec', cmd='true'}]\n", SpecFormat::Toml)?;
//! c.wait(job)?;
//! let status = c.status(job)?;
//! println!("{}", ferrite_client::jobs::picture::render(&status));
//! # Ok::<(), ferrite_client::jobs::error::JobsError>(())
//! ```

pub mod api;
pub mod error;
pub mod outputs;
pub mod picture;
pub mod run;
pub mod steps;
pub mod task_state;
pub mod worker;

pub use api::JobClient;
pub use error::JobsError;
pub use worker::{run_worker, WorkerConfig};
