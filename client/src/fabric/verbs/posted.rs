//! Asynchronous RDMA READs: staged on the calling thread's queue pair when
//! asked for, posted by the first poll of any read of that queue pair
//! (one doorbell for every read staged by then), completed by the future
//! that polls the completion queue.
//!
//! So the GETs a thread issues before it awaits any ring one doorbell for
//! their first reads. And when one poll of the completion queue files
//! several reads' completions, the first of their futures to stage its
//! next read (a record after its bucket) holds the doorbell back once,
//! while completions its neighbours have not taken yet remain: polled
//! next, they stage their reads too and the last one rings for all.
//!
//! A poll never blocks: it files what completions the queue holds (its own
//! and other reads' of the queue pair, by `wr_id`), and when its read has
//! not landed it wakes its own task again and returns `Pending`, so that
//! the executor runs other tasks before polling once more. The wait is
//! bounded as a blocking read's is (side channel closed, queue pair
//! retries, `POLL_TIMEOUT`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ferrite_proto::region::RegionDescriptor;

use super::conn::{Conn, Patience, Remote};
use super::{lock, read_failed, remote, ConnRef, Shared, BUFFER_BYTES};
use crate::client::error::{Error, Result};
use crate::fabric::{check_bounds, AsyncReads, ReadFuture};

/// One asynchronous read.
struct PostedRead {
    conn: ConnRef,
    remote: Remote,
    region_id: u32,
    /// Set once staged (the queue pair may have had no room at first).
    wr_id: Option<u64>,
    finished: bool,
    /// Whether a poll has already held the doorbell back for neighbours.
    held_back: bool,
    patience: Patience,
    url: Arc<str>,
}

impl PostedRead {
    /// Stages the read if it is not yet and there is room; the error when
    /// the queue pair is broken.
    fn try_stage(&mut self) -> Result<()> {
        if self.wr_id.is_some() {
            return Ok(());
        }
        let staged = lock(&self.conn).stage(std::slice::from_ref(&self.remote), true);
        match staged {
            Ok(Some(id)) => {
                self.wr_id = Some(id);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(cause) => Err(self.failed(cause)),
        }
    }

    fn failed(&mut self, cause: String) -> Error {
        self.finished = true;
        read_failed(&self.url, self.region_id, cause)
    }

    /// The read's bytes (or its error) once landed.
    fn take(&mut self, conn: &mut Conn) -> Option<Result<Vec<u8>>> {
        let r = conn.take_owned(self.wr_id?)?;
        self.finished = true;
        Some(r.map_err(|cause| read_failed(&self.url, self.region_id, cause)))
    }
}

impl Future for PostedRead {
    type Output = Result<Vec<u8>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Err(e) = this.try_stage() {
            return Poll::Ready(Err(e));
        }
        let conn = this.conn.clone();
        let mut g = lock(&conn);
        if let Some(r) = this.take(&mut g) {
            return Poll::Ready(r);
        }
        if g.ring_now(this.held_back) {
            // A failure fails every staged read, this one among them: its
            // error is taken below.
            let _ = g.flush();
        } else if g.has_staged() {
            this.held_back = true;
            drop(g);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let found = g.progress();
        if let Some(r) = this.take(&mut g) {
            return Poll::Ready(r);
        }
        if found == 0 {
            if let Err(cause) = this.patience.idle(&mut g) {
                drop(g);
                return Poll::Ready(Err(this.failed(cause)));
            }
        }
        drop(g);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Drop for PostedRead {
    fn drop(&mut self) {
        if let (Some(id), false) = (self.wr_id, self.finished) {
            lock(&self.conn).abandon(id);
        }
    }
}

impl AsyncReads for Shared {
    fn read_async(&self, region: &RegionDescriptor, offset: u64, len: usize) -> ReadFuture {
        let start = || -> Result<PostedRead> {
            check_bounds(region, offset, len, len)?;
            if len > BUFFER_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "verbs read of {len} bytes (at most {BUFFER_BYTES})"
                )));
            }
            let mut read = PostedRead {
                conn: self.conn(region.target)?,
                remote: remote(region, offset, len),
                region_id: region.region_id,
                wr_id: None,
                finished: false,
                held_back: false,
                patience: Patience::default(),
                url: self.url.clone(),
            };
            read.try_stage()?;
            Ok(read)
        };
        match start() {
            Ok(read) => Box::pin(read),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}
