//! The asynchronous face of [`Client`]: futures (runtime-agnostic, `Send`,
//! `'static`) and [`EventQueue`] events. Every call sends its request at
//! once, so issuing many before awaiting any pipelines them on the
//! connection; replies are matched by request id.
//!
//! One-sided GETs over shm complete inside the call (they are a few
//! loads). Over an endpoint with asynchronous reads (verbs, tcp) the GET's
//! first read is started in the call and the future does the rest of the
//! lookup, polling for its reads' completions (verbs: RDMA READs on the
//! calling thread's queue pair, staged in the call and rung together, one
//! doorbell, at the first poll; never blocking the executor); only
//! fallbacks go to the engine by RPC.

use std::future::Future;
use std::sync::Arc;

use ferrite_proto::rpc::{ErrorCode, Found, Key, Reply, Request};
use ferrite_xstream::{Event, EventQueue};

use crate::client::conn::Connection;
use crate::client::counters::{Counter, Counters};
use crate::client::error::{Error, Result};
use crate::client::handle::Client;
use crate::client::onesided::{AsyncLookupFuture, Lookup};
use crate::client::reply;
use crate::client::waiter::{Answer, ReplyFuture};

/// A batch sent as one frame per connection: each frame's reply and where
/// its items sit in the batch.
pub(crate) struct SentBatch {
    pub(crate) n: usize,
    pub(crate) url: String,
    pub(crate) parts: Vec<(Vec<usize>, ReplyFuture)>,
    /// The items that read (where they sit, their connection, the
    /// request): the engine may answer one with [`ErrorCode::TooLarge`]
    /// when the batch's replies together pass its reply budget, and it is
    /// then asked again alone.
    pub(crate) reads: Vec<(usize, Arc<Connection>, Request)>,
}

impl SentBatch {
    /// Blocks for every frame's reply ([`ReplyFuture::wait`]: reading the
    /// connection itself where nobody else does); replies in item order.
    pub(crate) fn wait(self) -> Result<Vec<Reply>> {
        let answers = (self.parts.into_iter())
            .map(|(at, reply)| (at, reply.wait()))
            .collect();
        let mut out = assemble_batch(self.n, &self.url, answers)?;
        for (i, conn, request) in self.reads {
            if is_too_large(&out[i]) {
                out[i] = conn.request(&request)?;
            }
        }
        Ok(out)
    }
}

/// Whether an item was refused for the batch's reply budget. Alone, every
/// read fits a frame (a value or an extent read is at most 1 MiB, a
/// listing is cut with `more`); an item refused again stays refused, its
/// message saying why.
fn is_too_large(reply: &Reply) -> bool {
    matches!(
        reply,
        Reply::Error {
            code: ErrorCode::TooLarge,
            ..
        }
    )
}

/// Items whose reply can be large: the engine may refuse them in a batch.
fn reads(request: &Request) -> bool {
    matches!(
        request,
        Request::Fetch { .. }
            | Request::ExtentRead { .. }
            | Request::ListDkeys { .. }
            | Request::ListAkeys { .. }
            | Request::ListValues { .. }
            | Request::Verify { .. }
    )
}

/// The replies of a batch of `n` items in item order, from the replies of
/// its frames.
fn assemble_batch(n: usize, url: &str, answers: Vec<(Vec<usize>, Answer)>) -> Result<Vec<Reply>> {
    let mut out: Vec<Option<Reply>> = vec![None; n];
    for (at, answer) in answers {
        let replies = reply::batch(answer?)?;
        if replies.len() != at.len() {
            return Err(Error::Protocol {
                url: url.to_string(),
                detail: format!(
                    "batch of {} answered with {} replies",
                    at.len(),
                    replies.len()
                ),
            });
        }
        for (i, r) in at.into_iter().zip(replies) {
            out[i] = Some(r);
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// An event queue whose events carry a client reply.
pub type ClientEventQueue = EventQueue<Answer>;

impl Client {
    /// Sends `request` now; the future resolves to its reply.
    pub fn request_async(&self, request: &Request) -> ReplyFuture {
        self.counters.add(Counter::RpcRequest, 1);
        self.conn_for(request).request_async(request)
    }

    /// GET as a future: one-sided in the call over shm, one-sided in the
    /// future over an endpoint with asynchronous reads, else by RPC.
    pub fn get_async(
        &self,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Found>>> + Send + 'static {
        enum Get {
            Done(Result<Option<Found>>),
            Rpc(ReplyFuture),
            OneSided(AsyncLookupFuture, Arc<Connection>, Arc<Counters>, Key),
        }
        let state = match self.get_start(key) {
            Some(Ok(lookup)) => Get::OneSided(
                lookup,
                self.conn_for(&Request::Fetch { key: key.clone() }).clone(),
                self.counters.clone(),
                key.clone(),
            ),
            Some(Err(e)) => Get::Done(Err(e)),
            None if self.one_sided_provider() == Some("shm") => {
                let mut value = Vec::new();
                let r = self.get_into(&key.as_record_key(), &mut value);
                Get::Done(r.map(|v| v.map(|version| Found { version, value })))
            }
            None => Get::Rpc(self.request_async(&Request::Fetch { key: key.clone() })),
        };
        async move {
            match state {
                Get::Done(r) => r,
                Get::Rpc(f) => reply::value("get", f.await?),
                Get::OneSided(lookup, conn, counters, key) => match lookup.await? {
                    (Lookup::Found { version }, value) => Ok(Some(Found { version, value })),
                    (Lookup::Absent, _) => Ok(None),
                    (Lookup::Fallback(_), _) => {
                        counters.add(Counter::RpcRequest, 1);
                        let reply = conn.request_async(&Request::Fetch { key }).await?;
                        reply::value("get", reply)
                    }
                },
            }
        }
    }

    /// The asynchronous one-sided lookup of `key`, its first read posted,
    /// when the reader's endpoint has asynchronous reads and is not shm
    /// (whose reads are loads, done in the call); the error when the engine
    /// is known gone.
    fn get_start(&self, key: &Key) -> Option<Result<AsyncLookupFuture>> {
        let reader = self.reader()?;
        if reader.provider() == "shm" {
            return None;
        }
        let lookup = reader.lookup_async(key, self.counters.clone())?;
        Some(self.check_alive("get").map(|()| lookup))
    }

    /// PUT as a future resolving to the new version.
    pub fn put_async(
        &self,
        key: &Key,
        value: &[u8],
    ) -> impl Future<Output = Result<u64>> + Send + 'static {
        let f = self.request_async(&Request::Update {
            key: key.clone(),
            value: value.to_vec(),
        });
        async move { reply::version("put", f.await?) }
    }

    /// DELETE as a future resolving to the deletion's version.
    pub fn delete_async(&self, key: &Key) -> impl Future<Output = Result<u64>> + Send + 'static {
        let f = self.request_async(&Request::Punch {
            scope: ferrite_proto::rpc::PunchScope::Akey,
            key: key.clone(),
        });
        async move { reply::version("delete", f.await?) }
    }

    /// Sends `requests` (at most `BATCH_ITEMS_MAX`) now, as one batch frame
    /// per connection that serves their targets, so that the engine runs
    /// each part on the owning xstream with no hop between xstreams. The
    /// future gives the replies in request order (`Reply::Error` per failed
    /// item); the parts run concurrently, as the items of one batch do.
    pub fn batch_async(
        &self,
        requests: Vec<Request>,
    ) -> impl Future<Output = Result<Vec<Reply>>> + Send + 'static {
        let sent = self.send_batch(requests);
        async move {
            let mut answers = Vec::with_capacity(sent.parts.len());
            for (at, reply) in sent.parts {
                answers.push((at, reply.await));
            }
            let mut out = assemble_batch(sent.n, &sent.url, answers)?;
            for (i, conn, request) in sent.reads {
                if is_too_large(&out[i]) {
                    out[i] = conn.request_async(&request).await?;
                }
            }
            Ok(out)
        }
    }

    /// Sends `requests` as one batch frame per connection serving them.
    pub(crate) fn send_batch(&self, requests: Vec<Request>) -> SentBatch {
        let n = requests.len();
        let mut groups: Vec<(Arc<Connection>, Vec<usize>, Vec<Request>)> = Vec::new();
        let mut read_items = Vec::new();
        for (i, r) in requests.into_iter().enumerate() {
            let conn = self.conn_for(&r);
            if reads(&r) {
                read_items.push((i, conn.clone(), r.clone()));
            }
            match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, conn)) {
                Some(g) => {
                    g.1.push(i);
                    g.2.push(r);
                }
                None => groups.push((conn.clone(), vec![i], vec![r])),
            }
        }
        self.counters.add(Counter::RpcRequest, groups.len() as u64);
        let parts = groups
            .into_iter()
            .map(|(conn, at, part)| (at, conn.request_async(&Request::Batch(part))))
            .collect();
        SentBatch {
            n,
            url: self.url(),
            parts,
            reads: read_items,
        }
    }

    /// Sends `request`; its reply completes `event` (collect it with
    /// [`EventQueue::poll`] or await it with [`EventQueue::wait`]).
    pub fn submit(&self, request: &Request, event: Event<Answer>) {
        self.counters.add(Counter::RpcRequest, 1);
        self.conn_for(request).request_event(request, event);
    }

    /// GET completing `event` with `Reply::Value`: at once when one-sided
    /// over shm; over an endpoint with asynchronous reads, by the
    /// [`get_async`](Self::get_async) future, which whoever polls or waits
    /// on the event's queue drives ([`Event::complete_with`]).
    pub fn get_event(&self, key: &Key, event: Event<Answer>) {
        if self.one_sided_provider() == Some("shm") {
            let mut value = Vec::new();
            let r = self.get_into(&key.as_record_key(), &mut value);
            let answer = r.map(|v| Reply::Value(v.map(|version| Found { version, value })));
            event.complete(Ok(answer));
            return;
        }
        if self.reader().is_some_and(|r| r.has_async_reads()) {
            let get = self.get_async(key);
            event.complete_with(async move { Ok(get.await.map(Reply::Value)) });
            return;
        }
        self.submit(&Request::Fetch { key: key.clone() }, event);
    }
}
