//! Running granted tasks, the same way on every node that offers execution
//! streams: a `ferrite worker` process (through the client library) and an
//! engine's own xstreams (through its router, no RPC to itself).
//!
//! - [`run`]: a granted task's record checked against its key and decoded,
//!   its steps run, its outputs stored back as records.
//! - [`steps`]: the built-in storage steps (`put`, `get`, `copy`, `scrub`);
//!   what `put` writes ([`steps::fill_pattern`]) is what the others check,
//!   whichever node ran which.
//! - [`state`]: task state objects, the SQLite files a node writes as its
//!   tasks progress.
//! - [`recorder`]: the thread that owns a node's task state objects, writes
//!   each batch of updates and then reports it.
//!
//! A node supplies two small things: a [`TaskStore`] (the job's engine) and
//! a [`TaskHost`] (where blocking work such as a child process may run).
//! The code is `async` so an engine runs it on its xstreams, where it must
//! not block; a worker drives it with `futures::executor::block_on` on its
//! own threads.
//!
//! ```
//! use ferrite_proto::rpc_jobs::{TaskGrant, TaskSpec, Step};
//! use ferrite_proto::rpc::{Reply, Request};
//! use ferrite_proto::tasks::{run, TaskHost, TaskStore};
//!
//! /// No engine: storage steps fail, no-op and exec steps run.
//! struct Nowhere;
//! impl TaskStore for Nowhere {
//!     async fn batch(&self, _: Vec<Request>) -> Result<Vec<Reply>, String> {
//!         Err("no engine".into())
//!     }
//! }
//! struct Here;
//! impl TaskHost for Here {
//!     async fn blocking<R: Send + 'static>(
//!         &self,
//!         f: impl FnOnce() -> R + Send + 'static,
//!     ) -> Result<R, String> {
//!         ferrite_proto::tasks::run_caught(f)
//!     }
//! }
//! let grant = TaskGrant { job: 1, idx: 0, id: "a".into(), attempt: 0, xstream: 0,
//!     ready_ns: 0, addr: 0, record: vec![], stdin: vec![], inputs: vec![] };
//! let spec = TaskSpec { id: "a".into(), after: vec![], inputs: vec![],
//!     steps: vec![Step::Noop], retry: None };
//! let r = futures::executor::block_on(run::run_task(&grant, &spec, 1, None::<&Nowhere>, &Here));
//! assert_eq!((r.exit_code, r.error), (0, None));
//! ```

use std::path::PathBuf;

use crate::key::RecordKey;
use crate::rpc::{Key, Reply, Request};

pub mod recorder;
pub mod run;
pub mod state;
pub mod steps;

/// Keys asked for per listing page.
const LIST_PAGE: u32 = 1024;

/// The engine holding a job's records, as a node running its tasks sees
/// it. Only [`TaskStore::batch`] is required; the reads default to
/// batches of `Fetch` and of one listing request each (an engine's router
/// takes listings in a batch; a client, whose wire batches do not, lists
/// with its own calls and reads one-sided).
// The futures stay on the thread that made them (an xstream, or a worker
// thread in `block_on`): no `Send` bound is wanted.
#[allow(async_fn_in_trait)]
pub trait TaskStore {
    /// Runs the requests; one reply each, in order.
    async fn batch(&self, requests: Vec<Request>) -> Result<Vec<Reply>, String>;

    /// Reads the values of `keys` into `outs`: per key its version, `None`
    /// when absent, or why it could not be read.
    async fn get_many_into(
        &self,
        keys: &[RecordKey<'_>],
        outs: &mut [Vec<u8>],
    ) -> Result<Vec<Result<Option<u64>, String>>, String> {
        let requests = keys
            .iter()
            .map(|k| Request::Fetch {
                key: Key::new(k.container, k.object, k.dkey, k.akey),
            })
            .collect();
        let replies = self.batch(requests).await?;
        let mut got = Vec::with_capacity(keys.len());
        for (reply, out) in replies.into_iter().zip(outs.iter_mut()) {
            got.push(match reply {
                Reply::Value(Some(found)) => {
                    *out = found.value;
                    Ok(Some(found.version))
                }
                Reply::Value(None) => Ok(None),
                Reply::Error { message, .. } => Err(message),
                other => Err(format!("fetch answered {other:?}")),
            });
        }
        Ok(got)
    }

    /// Reads the value of `key` into `out`: its version, or `None`.
    async fn get_into(
        &self,
        key: &RecordKey<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Option<u64>, String> {
        let mut outs = [std::mem::take(out)];
        let got = self
            .get_many_into(std::slice::from_ref(key), &mut outs)
            .await?;
        *out = std::mem::take(&mut outs[0]);
        got.into_iter()
            .next()
            .unwrap_or_else(|| Err("fetch: no reply".into()))
    }

    /// Every object of `container`, in order.
    async fn list_objects(&self, container: u64) -> Result<Vec<u128>, String> {
        let mut all: Vec<u128> = Vec::new();
        loop {
            let after = all.last().copied();
            let request = Request::ListObjects {
                container,
                after,
                limit: LIST_PAGE,
            };
            match one(self.batch(vec![request]).await?)? {
                Reply::Objects { objects, more } => {
                    all.extend(objects);
                    if !more {
                        return Ok(all);
                    }
                }
                other => return Err(format!("list objects answered {other:?}")),
            }
        }
    }

    /// Every dkey of `object`, or with `dkey` every akey under it, in order.
    async fn list_keys(
        &self,
        container: u64,
        object: u128,
        dkey: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>, String> {
        let mut all: Vec<Vec<u8>> = Vec::new();
        loop {
            let after = all.last().cloned();
            let request = match dkey {
                None => Request::ListDkeys {
                    container,
                    object,
                    after,
                    limit: LIST_PAGE,
                },
                Some(d) => Request::ListAkeys {
                    container,
                    object,
                    dkey: d.to_vec(),
                    after,
                    limit: LIST_PAGE,
                },
            };
            match one(self.batch(vec![request]).await?)? {
                Reply::Keys { keys, more } => {
                    all.extend(keys);
                    if !more {
                        return Ok(all);
                    }
                }
                other => return Err(format!("list keys answered {other:?}")),
            }
        }
    }
}

/// The only reply of a one-request batch; an error reply as an error.
fn one(replies: Vec<Reply>) -> Result<Reply, String> {
    match replies.into_iter().next() {
        Some(Reply::Error { message, .. }) => Err(message),
        Some(reply) => Ok(reply),
        None => Err("no reply".into()),
    }
}

/// What the node running a task provides besides the store.
/// Seconds an exec step may run when its `timeout_s` says nothing.
pub const EXEC_TIMEOUT_S: u64 = 3600;

#[allow(async_fn_in_trait)]
pub trait TaskHost {
    /// Runs `f` where it may block (it waits for a child process) and
    /// returns what it returns: on an engine, a thread of its own, so no
    /// xstream ever waits; on a worker's own thread, in place. An error
    /// when `f` gave nothing (it panicked: see [`run_caught`]), so that the
    /// task fails with the cause instead of staying "running".
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, String>;

    /// The `ferrite` program that `io500` steps run: `$FERRITE_BIN`, else
    /// `ferrite` next to this executable, else this executable.
    fn ferrite_binary(&self) -> PathBuf {
        ferrite_binary()
    }

    /// Refuses an unknown io500 phase before anything runs (`all` is
    /// checked by the caller); by default `ferrite io500` itself refuses it.
    fn check_io500_phase(&self, phase: &str) -> Result<(), String> {
        let _ = phase;
        Ok(())
    }
}

/// `$FERRITE_BIN`, else `ferrite` beside the running executable (an
/// engine's), else the running executable itself (the `ferrite` CLI).
pub fn ferrite_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("FERRITE_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| "ferrite".into());
    let beside = exe.with_file_name("ferrite");
    match beside.is_file() {
        true => beside,
        false => exe,
    }
}

/// Runs `f`, turning a panic into an error that carries its message.
pub fn run_caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let message = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        format!("the task's work panicked: {message}")
    })
}
