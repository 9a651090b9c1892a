//! Ferrite client library.
pub mod bdevperf;
pub mod bench_jobs;
pub mod bench_kv;
pub mod bench_xstream;
pub mod client;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod fabric;
pub mod fs;
pub mod fuse;
pub mod io500;
pub mod jobs;
pub mod bench_store;
