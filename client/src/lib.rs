//! Ferrite client library.
pub mod bench_xstream;
pub mod io500;
pub mod client;
pub mod fabric;
pub mod fs;
pub mod fuse;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod bench_kv;
pub mod jobs;
pub mod bdevperf;
