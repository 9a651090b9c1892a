//! The Ferrite client: the library (connect, get/put/delete/list, extents,
//! conditional updates, the one-sided GET path with its bucket cache, async
//! API and event queues), the file namespace ([`fs`]) and its FUSE mount
//! ([`fuse`]), job workers ([`jobs`]), the benchmarks, and the `ferrite` CLI.
//!
//! A GET hashes the key to a target and bucket, reads the bucket and then
//! the record straight out of the engine's memory (a shared mapping over
//! the Unix socket, a region read over TCP), checks the record against the
//! key, and falls back to RPC when the record is not in memory.
//!
//! ```
//! use ferrite_client::client::Key;
//! use ferrite_client::fs::{Namespace, ROOT_OBJECT};
//! use std::sync::Arc;
//!
//! // An engine inside this process on a temp directory, reached over its
//! // Unix socket (so GETs are one-sided over shared memory).
//! let client = Arc::new(ferrite_client::embedded::connect().unwrap());
//! let key = Key::new(1, 42, b"dkey", b"akey");
//! let version = client.put(&key, b"hello").unwrap();
//! assert_eq!(client.get_versioned(&key).unwrap().unwrap().version, version);
//! assert_eq!(client.get(&key).unwrap().as_deref(), Some(&b"hello"[..]));
//!
//! // Files on the same engine.
//! let ns = Namespace::new(client.clone(), 7);
//! let dir = ns.mkdir(ROOT_OBJECT, "results", 0o755).unwrap();
//! let file = ns.create(dir.object, "a.txt", 0o644).unwrap();
//! ns.write(&file, 0, b"data").unwrap();
//! ns.close(file).unwrap();
//! assert_eq!(ns.resolve("/results/a.txt").unwrap().1.size, 4);
//! ```

pub mod auth;
pub mod bdevperf;
pub mod bench_jobs;
pub mod bench_kv;
pub mod bench_store;
pub mod bench_xstream;
pub mod client;
#[cfg(feature = "embedded")]
pub mod embedded;
pub mod fabric;
pub mod fs;
pub mod fuse;
pub mod io500;
pub mod jobs;
