//! `DelayBdev`: adds a fixed latency to each I/O of the device below.
//!
//! The delay is a glommio timer started when the device completes the I/O,
//! so a channel of a `DelayBdev` must be used inside a glommio executor (an
//! xstream). A zero delay adds nothing and needs no timer.

use super::forward_geometry;
use crate::{Bdev, BdevRef, Channel, IoBuf, IoFuture, Result};
use std::time::Duration;

/// Extra latency per kind of I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delays {
    /// read and readv
    pub read: Duration,
    /// write and writev
    pub write: Duration,
    pub flush: Duration,
    /// write_zeroes and unmap
    pub other: Duration,
}

impl Delays {
    /// The same delay for every kind of I/O.
    pub fn all(d: Duration) -> Self {
        Self {
            read: d,
            write: d,
            flush: d,
            other: d,
        }
    }
}

/// A device whose I/Os complete `delays` later than the device below.
pub struct DelayBdev {
    inner: BdevRef,
    delays: Delays,
}

impl DelayBdev {
    pub fn new(inner: BdevRef, delays: Delays) -> Self {
        Self { inner, delays }
    }
    pub fn delays(&self) -> Delays {
        self.delays
    }
}

impl Bdev for DelayBdev {
    forward_geometry!();
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(DelayChannel {
            inner: self.inner.channel()?,
            delays: self.delays,
        }))
    }
}

struct DelayChannel {
    inner: Box<dyn Channel>,
    delays: Delays,
}

async fn delayed<T>(delay: Duration, op: IoFuture<'_, T>) -> Result<T> {
    let r = op.await;
    if !delay.is_zero() {
        glommio::timer::sleep(delay).await;
    }
    r
}

impl Channel for DelayChannel {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        self.inner.alloc(len)
    }
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(delayed(self.delays.read, self.inner.read(offset, buf)))
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(delayed(self.delays.write, self.inner.write(offset, buf)))
    }
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(delayed(self.delays.read, self.inner.readv(offset, bufs)))
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(delayed(self.delays.write, self.inner.writev(offset, bufs)))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(delayed(self.delays.flush, self.inner.flush()))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(delayed(
            self.delays.other,
            self.inner.write_zeroes(offset, len),
        ))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(delayed(self.delays.other, self.inner.unmap(offset, len)))
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
}
