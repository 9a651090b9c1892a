//! The Ferrite engine: targets (one per pinned xstream), each with its
//! record store on its own bdev, exported through the fabric (shm, tcp, and
//! verbs with the `rdma` feature), served over a framed RPC protocol, plus
//! the job service (DAG records, resource manager, job state objects).
//!
//! - [`store`]: the per-target record log + lock-free metadata buckets in
//!   registered [`region`]s, group commit, checkpoints, recovery, cleaner.
//! - [`fabric`]: registering regions so clients read them one-sided.
//! - [`server`]: listeners, routing of requests to the owning target.
//! - [`config`]: `engine.toml` and flags.
//! - [`jobs`]: DAG jobs, resource manager, SQLite job/task state objects.
//!
//! Start an engine on a temp directory and stop it (what `ferrite-engine`
//! and the CLI's embedded mode do):
//!
//! ```
//! use ferrite_engine::config::EngineConfig;
//! use ferrite_engine::Engine;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let config = EngineConfig::for_temp_dir(dir.path());
//! let engine = Engine::start(config).unwrap();
//! assert_eq!(engine.target_count(), 1);
//! assert!(!engine.regions().is_empty(), "buckets and log are exported");
//! assert!(engine.urls().iter().any(|u| u.starts_with("tcp://127.0.0.1:")));
//! engine.shutdown().unwrap();
//! ```

pub mod capacity;
pub mod config;
pub mod fabric;
pub mod jobs;
pub mod region;
pub mod server;
pub mod store;
pub mod target;
pub use server::{Engine, EngineHandle, Router};
