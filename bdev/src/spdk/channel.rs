//! The per-xstream channel of an SPDK bdev (untested, see the module guide).

use super::ffi::*;
use super::{Desc, DROP_POLL_LIMIT, SPDK_QUEUE_DEPTH};
use crate::{check_range, BdevError, Channel, IoBuf, IoFuture, Result};
use std::cell::Cell;
use std::future::Future;
use std::os::raw::c_void;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub(super) struct SpdkChannel {
    name: Arc<str>,
    desc: Arc<Desc>,
    ch: *mut spdk_io_channel,
    thread: *mut spdk_thread,
    block_size: u32,
    size_bytes: u64,
    buf_align: usize,
    in_flight: Cell<usize>,
}

impl SpdkChannel {
    pub(super) fn new(
        name: Arc<str>,
        desc: Arc<Desc>,
        ch: *mut spdk_io_channel,
        thread: *mut spdk_thread,
        block_size: u32,
        size_bytes: u64,
        buf_align: usize,
    ) -> Self {
        Self {
            name,
            desc,
            ch,
            thread,
            block_size,
            size_bytes,
            buf_align,
            in_flight: Cell::new(0),
        }
    }

    fn poll_thread(&self) {
        // SAFETY: this channel's thread, polled on the xstream that made it.
        unsafe { spdk_thread_poll(self.thread, 0, 0) };
    }
}

impl Drop for SpdkChannel {
    fn drop(&mut self) {
        // SAFETY: obtained from spdk_bdev_get_io_channel on this thread.
        unsafe { spdk_put_io_channel(self.ch) };
        self.poll_thread();
    }
}

#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Unmap,
}

/// Set by the completion callback; boxed so its address is stable.
struct Completion {
    done: Cell<Option<bool>>,
}

unsafe extern "C" fn complete(io: *mut spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the boxed Completion of a live or leaked SpdkOp.
    unsafe {
        spdk_bdev_free_io(io);
        (*(arg as *const Completion)).done.set(Some(success));
    }
}

/// Bounce buffer from SPDK's DMA-able memory.
struct Bounce {
    ptr: *mut c_void,
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: allocated with spdk_dma_zmalloc.
        unsafe { spdk_dma_free(self.ptr) };
    }
}

struct SpdkOp<'a> {
    ch: &'a SpdkChannel,
    op: Op,
    offset: u64,
    len: u64,
    buf: Option<IoBuf>,
    bounce: Option<Bounce>,
    completion: Option<Box<Completion>>,
}

impl SpdkOp<'_> {
    fn error(&self, reason: String) -> BdevError {
        BdevError::Other {
            device: self.ch.name.to_string(),
            reason,
        }
    }

    /// Submits; `Ok(false)` when SPDK is out of bdev_io (retry later).
    fn submit(&mut self) -> Result<bool> {
        let ch = self.ch;
        if matches!(self.op, Op::Read | Op::Write) && self.bounce.is_none() {
            // SAFETY: FFI per spdk/env.h.
            let ptr =
                unsafe { spdk_dma_zmalloc(self.len as usize, ch.buf_align, std::ptr::null_mut()) };
            if ptr.is_null() {
                return Err(self.error("spdk_dma_zmalloc failed".into()));
            }
            if let (Op::Write, Some(b)) = (self.op, &self.buf) {
                // SAFETY: ptr has len bytes; b holds len bytes.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), ptr.cast(), b.len()) };
            }
            self.bounce = Some(Bounce { ptr });
        }
        let completion = Box::new(Completion {
            done: Cell::new(None),
        });
        let arg = (&*completion as *const Completion)
            .cast_mut()
            .cast::<c_void>();
        let data = self.bounce.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr);
        let (d, c, off, len) = (ch.desc.0, ch.ch, self.offset, self.len);
        // SAFETY: FFI per spdk/bdev.h; `data` and `completion` live until the
        // callback (kept in self, leaked if dropped in flight).
        let rc = unsafe {
            match self.op {
                Op::Read => spdk_bdev_read(d, c, data, off, len, complete, arg),
                Op::Write => spdk_bdev_write(d, c, data, off, len, complete, arg),
                Op::Flush => spdk_bdev_flush(d, c, off, len, complete, arg),
                Op::WriteZeroes => spdk_bdev_write_zeroes(d, c, off, len, complete, arg),
                Op::Unmap => spdk_bdev_unmap(d, c, off, len, complete, arg),
            }
        };
        match rc {
            0 => {
                self.completion = Some(completion);
                ch.in_flight.set(ch.in_flight.get() + 1);
                Ok(true)
            }
            rc if rc == -libc::ENOMEM => Ok(false),
            rc => Err(self.error(format!("submit at offset {off}: error {rc}"))),
        }
    }
}

impl Future for SpdkOp<'_> {
    type Output = Result<Option<IoBuf>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.ch.poll_thread();
        if this.completion.is_none() {
            let full = this.ch.in_flight.get() >= SPDK_QUEUE_DEPTH;
            match if full { Ok(false) } else { this.submit() } {
                Ok(true) => {}
                Ok(false) => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let done = this.completion.as_ref().and_then(|c| c.done.get());
        let Some(success) = done else {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        this.completion = None;
        this.ch.in_flight.set(this.ch.in_flight.get() - 1);
        if !success {
            return Poll::Ready(Err(
                this.error(format!("I/O at offset {} failed", this.offset))
            ));
        }
        if let (Op::Read, Some(b), Some(bounce)) = (this.op, &mut this.buf, &this.bounce) {
            // SAFETY: the bounce buffer holds len = b.len() bytes.
            unsafe { std::ptr::copy_nonoverlapping(bounce.ptr.cast(), b.as_mut_ptr(), b.len()) };
        }
        Poll::Ready(Ok(this.buf.take()))
    }
}

impl Drop for SpdkOp<'_> {
    fn drop(&mut self) {
        let Some(c) = &self.completion else {
            return;
        };
        let start = std::time::Instant::now();
        while c.done.get().is_none() && start.elapsed() < DROP_POLL_LIMIT {
            self.ch.poll_thread();
        }
        if c.done.get().is_none() {
            // SPDK may still write here: leak rather than free.
            std::mem::forget(self.completion.take());
            std::mem::forget(self.bounce.take());
        } else {
            self.ch.in_flight.set(self.ch.in_flight.get() - 1);
        }
    }
}

impl SpdkChannel {
    fn op(&self, op: Op, offset: u64, len: u64, buf: Option<IoBuf>) -> SpdkOp<'_> {
        SpdkOp {
            ch: self,
            op,
            offset,
            len,
            buf,
            bounce: None,
            completion: None,
        }
    }

    async fn data(&self, op: Op, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let name = if matches!(op, Op::Read) {
            "read"
        } else {
            "write"
        };
        check_range(
            &self.name,
            name,
            self.block_size,
            self.size_bytes,
            offset,
            buf.len() as u64,
        )?;
        let len = buf.len() as u64;
        self.op(op, offset, len, Some(buf))
            .await?
            .ok_or_else(|| BdevError::Other {
                device: self.name.to_string(),
                reason: "internal: buffer lost".into(),
            })
    }

    async fn vectored(&self, op: Op, mut offset: u64, bufs: Vec<IoBuf>) -> Result<Vec<IoBuf>> {
        let mut out = Vec::with_capacity(bufs.len());
        for b in bufs {
            let len = b.len() as u64;
            out.push(self.data(op, offset, b).await?);
            offset += len;
        }
        Ok(out)
    }

    async fn no_data(&self, op: Op, name: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(
            &self.name,
            name,
            self.block_size,
            self.size_bytes,
            offset,
            len,
        )?;
        self.op(op, offset, len, None).await.map(|_| ())
    }
}

impl Channel for SpdkChannel {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        crate::mem::alloc_checked(&self.name, self.block_size, len)
    }
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(self.data(Op::Read, offset, buf))
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(self.data(Op::Write, offset, buf))
    }
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(self.vectored(Op::Read, offset, bufs))
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(self.vectored(Op::Write, offset, bufs))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(self.no_data(Op::Flush, "flush", 0, self.size_bytes))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.no_data(Op::WriteZeroes, "write_zeroes", offset, len))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.no_data(Op::Unmap, "unmap", offset, len))
    }
    fn in_flight(&self) -> usize {
        self.in_flight.get()
    }
    fn queue_depth(&self) -> usize {
        SPDK_QUEUE_DEPTH
    }
}
