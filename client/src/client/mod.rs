//! The client library: connect to an engine, read and write keys.
//!
//! ```no_run
//! use ferrite_client::client::{Client, Key};
//!
//! let client = Client::connect("unix:///run/ferrite/engine.sock")?;
//! let key = Key::new(1, 42, b"dkey", b"akey");
//! let version = client.put(&key, b"hello")?;
//! assert_eq!(client.get(&key)?.as_deref(), Some(&b"hello"[..]));
//! let later = client.put_if_version(&key, version, b"world")?;
//! assert!(later > version);
//! println!("one-sided hits: {}", client.counters().one_sided_hits);
//! # Ok::<(), ferrite_client::client::Error>(())
//! ```
//!
//! GETs read the engine's buckets and records one-sided ([`onesided`]) over
//! shm (Unix socket URLs) or tcp, and fall back to RPC. Everything else is an
//! RPC on a pooled, pipelined connection ([`conn`]); the `*_async` methods
//! return futures and [`Client::submit`] completes `EventQueue` events.
//! [`Client::get_async`] and [`Client::get_event`] stay one-sided over an
//! endpoint with asynchronous reads (verbs, tcp): the future, or the event
//! queue's poller, polls for the reads' completions.

pub mod async_api;
pub mod bulk;
pub mod cache;
pub mod conn;
pub mod counters;
pub mod error;
pub mod extent_lists;
pub mod handle;
pub mod onesided;
pub(crate) mod reader;
pub(crate) mod reply;
pub(crate) mod spin;
pub mod url;
pub mod waiter;

pub use async_api::ClientEventQueue;
pub use counters::CounterSnapshot;
pub use error::{Error, Result};
pub use ferrite_proto::rpc::{Found, Key, PunchScope, Reply, Request, Verified};
pub use handle::{Client, ClientOptions, EngineStat};
pub use onesided::RetryPolicy;
pub use spin::DEFAULT_REPLY_SPIN;
pub use url::EngineUrl;
pub use waiter::{Answer, ReplyFuture};
