//! What a `ferrite worker` gives the shared task runner
//! ([`ferrite_proto::tasks`]): the job's engine through the client library
//! (task records and inputs read one-sided when the engine exports its
//! regions), and its own threads to block on.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use ferrite_proto::key::RecordKey;
use ferrite_proto::tasks::{TaskHost, TaskStore};

use crate::client::{Client, Reply, Request};

impl TaskStore for Client {
    async fn batch(&self, requests: Vec<Request>) -> Result<Vec<Reply>, String> {
        Client::batch(self, requests).map_err(|e| e.to_string())
    }

    async fn get_many_into(
        &self,
        keys: &[RecordKey<'_>],
        outs: &mut [Vec<u8>],
    ) -> Result<Vec<Result<Option<u64>, String>>, String> {
        let got = Client::get_many_into(self, keys, outs).map_err(|e| e.to_string())?;
        Ok(got
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect())
    }

    async fn get_into(
        &self,
        key: &RecordKey<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Option<u64>, String> {
        Client::get_into(self, key, out).map_err(|e| e.to_string())
    }

    // Listings are not batch items on the wire: each page is a request.
    async fn list_objects(&self, container: u64) -> Result<Vec<u128>, String> {
        Client::list_objects(self, container).map_err(|e| e.to_string())
    }

    async fn list_keys(
        &self,
        container: u64,
        object: u128,
        dkey: Option<&[u8]>,
    ) -> Result<Vec<Vec<u8>>, String> {
        match dkey {
            None => self.list_dkeys(container, object),
            Some(dkey) => self.list_akeys(container, object, dkey),
        }
        .map_err(|e| e.to_string())
    }
}

/// A worker's execution stream: a thread of its own, so blocking work
/// (a child process) runs in place.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerThread;

impl TaskHost for WorkerThread {
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, String> {
        ferrite_proto::tasks::run_caught(f)
    }

    fn check_io500_phase(&self, phase: &str) -> Result<(), String> {
        match crate::io500::phases::Phase::parse(phase) {
            Some(_) => Ok(()),
            None => {
                let names = crate::io500::phases::Phase::names();
                Err(format!("no io500 phase {phase:?}; phases: all, {names}"))
            }
        }
    }
}

/// Drives `f` to its end on this thread. Not `futures::executor::block_on`:
/// the client library's blocking calls use that themselves, and it refuses
/// to be nested. Here every `await` of the runner is on a blocking client
/// call, so `f` is done at its first poll; were it not, the thread parks
/// until woken.
pub fn run_here<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}
