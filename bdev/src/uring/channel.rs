//! The per-xstream channel of a `uring` device and its operation future.

use super::ring::{Payload, Reaper, RingState};
use super::wakeup::Wakeup;
use super::UringOptions;
use crate::{check_range, BdevError, BufPool, Channel, IoBuf, IoFuture, Result};
use io_uring::{opcode, squeue, types, IoUring};
use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

/// How long dropping a channel waits for the kernel to finish its I/O.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest chunk of zeros written when fallocate is not supported.
const ZERO_CHUNK: u64 = 1 << 20;
/// Buffered (`direct=0`) writes up to this size are copied into the page
/// cache by a `pwrite` on the calling thread. Through the ring they cannot
/// complete inline (ext4 and most file systems refuse non-blocking buffered
/// writes), so each would be handed to an io-wq kernel thread and its
/// completion back: two context switches for a copy of a few microseconds.
/// Bigger writes still go through the ring, where the copy runs off the
/// xstream.
const INLINE_WRITE_MAX: usize = 64 << 10;

pub(super) struct UringChannel {
    name: Arc<str>,
    /// Shared with the channel's reaper task (weakly).
    state: Rc<RefCell<RingState>>,
    raw_fd: RawFd,
    fixed_file: bool,
    fixed_bufs: bool,
    /// `direct=0`: small writes are done inline (`INLINE_WRITE_MAX`).
    buffered: bool,
    /// `direct_from`: the O_DIRECT descriptor (fixed file 1 when files are
    /// registered) and the write size from which it is used.
    direct: Option<(RawFd, usize)>,
    pool: Option<BufPool>,
    block_size: u32,
    size_bytes: u64,
    queue_depth: usize,
    /// Keep the descriptors open while the ring uses them.
    _file: Arc<std::fs::File>,
    _direct_file: Option<Arc<std::fs::File>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
    /// A write through the O_DIRECT descriptor (`direct_from`).
    WriteDirect,
    /// A write with `RWF_DSYNC` (durable when it completes), on a channel
    /// whose writes all bypass the page cache.
    WriteDurable,
    Flush,
    Fallocate {
        len: u64,
        mode: i32,
        name: &'static str,
    },
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write | Op::WriteDirect => "write",
            Op::WriteDurable => "durable write",
            Op::Flush => "flush",
            Op::Fallocate { name, .. } => name,
        }
    }
}

fn build_ring(name: &str, opts: &UringOptions) -> Result<IoUring> {
    let entries = opts.queue_depth.next_power_of_two();
    if !opts.sqpoll {
        // Completion work waits for this thread to ask for it (see ring.rs);
        // kernels before 6.1 refuse the flags and get a plain ring.
        let mut b = IoUring::builder();
        b.setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag();
        if let Ok(ring) = b.build(entries) {
            return Ok(ring);
        }
    }
    let mut b = IoUring::builder();
    if opts.sqpoll {
        b.setup_sqpoll(1000);
    }
    b.build(entries).map_err(|e| BdevError::Io {
        device: name.to_string(),
        op: "io_uring_setup",
        offset: 0,
        source: e,
    })
}

impl UringChannel {
    pub(super) fn new(
        name: Arc<str>,
        file: Arc<std::fs::File>,
        direct_file: Option<Arc<std::fs::File>>,
        block_size: u32,
        size_bytes: u64,
        opts: &UringOptions,
    ) -> Result<Self> {
        let ring = build_ring(&name, opts)?;
        let queue_depth = opts.queue_depth as usize;
        let pool = BufPool::new(opts.buf_size, queue_depth);
        let raw_fd = file.as_raw_fd();
        let direct = direct_file
            .as_ref()
            .zip(opts.direct_from)
            .map(|(f, from)| (f.as_raw_fd(), from));
        let mut fixed_file = false;
        let mut fixed_bufs = false;
        if opts.fixed {
            let mut fds = vec![raw_fd];
            fds.extend(direct.map(|(fd, _)| fd));
            fixed_file = ring.submitter().register_files(&fds).is_ok();
            if let Some(p) = &pool {
                let (base, len) = p.slab();
                let iov = libc::iovec {
                    iov_base: base.cast(),
                    iov_len: len,
                };
                // SAFETY: the slab stays allocated while the ring lives:
                // `pool` is dropped after `state` (field order) and every
                // buffer holds the slab too. Refusal (RLIMIT_MEMLOCK) is fine.
                fixed_bufs = unsafe { ring.submitter().register_buffers(&[iov]) }.is_ok();
            }
        }
        // Sleeping without blocking needs a glommio reactor: an xstream.
        let wakeup = if !opts.park.is_zero() && ferrite_xstream::current().is_some() {
            Wakeup::new(&ring)
        } else {
            None
        };
        let state = Rc::new(RefCell::new(RingState::new(
            ring,
            queue_depth,
            opts.park,
            wakeup,
        )));
        Ok(Self {
            name,
            state,
            raw_fd,
            fixed_file,
            fixed_bufs,
            buffered: !opts.direct,
            direct,
            pool,
            block_size,
            size_bytes,
            queue_depth,
            _file: file,
            _direct_file: direct_file,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Copies a small buffered write into the page cache now (see
    /// `INLINE_WRITE_MAX`); a later flush through the ring covers it.
    fn write_inline(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let bytes = buf.as_slice();
        let mut done = 0usize;
        while done < bytes.len() {
            let rest = &bytes[done..];
            // SAFETY: `rest` is valid for reads of its length; the
            // descriptor is kept open by `_file`.
            let n = unsafe {
                libc::pwrite(
                    self.raw_fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                // A regular file takes less than asked only when its file
                // system is full.
                0 => return Err(self.io_error(Op::Write, offset, no_space())),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(self.io_error(Op::Write, offset, e));
                    }
                }
            }
        }
        Ok(buf)
    }

    /// Times the reaper slept without blocking the xstream (tests).
    #[cfg(test)]
    pub(super) fn sleeps(&self) -> u64 {
        self.state.borrow().sleeps
    }

    /// Flushes submitted (tests).
    #[cfg(test)]
    pub(super) fn flushes(&self) -> u64 {
        self.state.borrow().flushes
    }

    /// Times the reaper waited in the kernel (tests).
    #[cfg(test)]
    pub(super) fn kernel_waits(&self) -> u64 {
        self.state.borrow().kernel_waits
    }

    /// Whether entries were pushed and not yet given to the kernel (tests).
    #[cfg(test)]
    pub(super) fn unsubmitted(&self) -> bool {
        self.state.borrow().unsubmitted()
    }

    /// The descriptors of the reaper's eventfd, if it has one (tests).
    #[cfg(test)]
    pub(super) fn wakeup_fds(&self) -> Option<[RawFd; 2]> {
        self.state.borrow().wakeup_fds()
    }

    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(
            &self.name,
            op,
            self.block_size,
            self.size_bytes,
            offset,
            len,
        )?;
        if len > u64::from(u32::MAX) && op != "write_zeroes" && op != "unmap" {
            return Err(BdevError::Other {
                device: self.name.to_string(),
                reason: format!("{op} of {len} bytes is larger than one I/O may be"),
            });
        }
        Ok(())
    }

    /// The vectored op `op(total length)` on `bufs` at `offset`, after the
    /// checks of the range (`name`: the op's name in errors) and buffers.
    async fn vectored(
        &self,
        name: &'static str,
        offset: u64,
        bufs: Vec<IoBuf>,
        op: impl FnOnce(usize) -> Op,
    ) -> Result<Vec<IoBuf>> {
        let total: usize = bufs.iter().map(IoBuf::len).sum();
        self.check(name, offset, total as u64)?;
        self.check_bufs(&bufs.iter().collect::<Vec<_>>())?;
        if bufs.is_empty() {
            return Ok(bufs);
        }
        many(self.submit(op(total), offset, Payload::Many(bufs)).await)
    }

    fn check_bufs(&self, bufs: &[&IoBuf]) -> Result<()> {
        for b in bufs {
            if b.as_ptr() as usize % self.block_size as usize != 0 {
                return Err(BdevError::BufferMisaligned {
                    device: self.name.to_string(),
                    addr: b.as_ptr() as usize,
                    len: b.len(),
                    align: self.block_size as usize,
                });
            }
        }
        Ok(())
    }

    /// Builds the entry of `op` at `offset` on `payload` (iovecs of a
    /// vectored op go into the slot's storage).
    fn entry(
        &self,
        state: &mut RingState,
        slot: u32,
        op: Op,
        offset: u64,
        payload: &mut Payload,
    ) -> squeue::Entry {
        let (fixed_index, raw_fd) = match (op, self.direct) {
            (Op::WriteDirect, Some((fd, _))) => (1, fd),
            _ => (0, self.raw_fd),
        };
        macro_rules! on_fd {
            (|$fd:ident| $body:expr) => {
                if self.fixed_file {
                    let $fd = types::Fixed(fixed_index);
                    $body
                } else {
                    let $fd = types::Fd(raw_fd);
                    $body
                }
            };
        }
        match (op, payload) {
            (Op::Read, Payload::One(b)) => {
                let (ptr, len) = (b.as_mut_ptr(), b.len() as u32);
                if self.fixed_bufs && self.pool.as_ref().is_some_and(|p| p.contains(ptr)) {
                    on_fd!(|fd| opcode::ReadFixed::new(fd, ptr, len, 0)
                        .offset(offset)
                        .build())
                } else {
                    on_fd!(|fd| opcode::Read::new(fd, ptr, len).offset(offset).build())
                }
            }
            (Op::Write | Op::WriteDirect | Op::WriteDurable, Payload::One(b)) => {
                let (ptr, len) = (b.as_ptr(), b.len() as u32);
                let flags = match op {
                    Op::WriteDurable => libc::RWF_DSYNC,
                    _ => 0,
                };
                if self.fixed_bufs && self.pool.as_ref().is_some_and(|p| p.contains(ptr)) {
                    on_fd!(|fd| opcode::WriteFixed::new(fd, ptr, len, 0)
                        .offset(offset)
                        .rw_flags(flags)
                        .build())
                } else {
                    on_fd!(|fd| opcode::Write::new(fd, ptr, len)
                        .offset(offset)
                        .rw_flags(flags)
                        .build())
                }
            }
            (Op::Read | Op::Write | Op::WriteDirect | Op::WriteDurable, Payload::Many(bufs)) => {
                let iov = state.iovecs(slot);
                iov.clear();
                iov.extend(bufs.iter_mut().map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                }));
                let (ptr, n) = (iov.as_ptr(), iov.len() as u32);
                let flags = match op {
                    Op::WriteDurable => libc::RWF_DSYNC,
                    _ => 0,
                };
                if matches!(op, Op::Read) {
                    on_fd!(|fd| opcode::Readv::new(fd, ptr, n).offset(offset).build())
                } else {
                    on_fd!(|fd| opcode::Writev::new(fd, ptr, n)
                        .offset(offset)
                        .rw_flags(flags)
                        .build())
                }
            }
            (Op::Fallocate { len, mode, .. }, _) => {
                on_fd!(|fd| opcode::Fallocate::new(fd, len)
                    .offset(offset)
                    .mode(mode)
                    .build())
            }
            (_, _) => on_fd!(|fd| opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()),
        }
    }

    fn submit(&self, op: Op, offset: u64, payload: Payload) -> UringOp<'_> {
        UringOp {
            channel: self,
            stage: Stage::Ready {
                op,
                offset,
                payload,
            },
            expected: 0,
        }
    }

    fn io_error(&self, op: Op, offset: u64, source: std::io::Error) -> BdevError {
        BdevError::io(&self.name, op.name(), offset, source)
    }

    async fn fallocate(&self, name: &'static str, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.check(name, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let op = Op::Fallocate { len, mode, name };
        self.submit(op, offset, Payload::None).await.map(|_| ())
    }

    /// The first hole of the file in `[from, end)`, as a block-aligned
    /// range inside both (`None`: no hole, or no way to tell).
    fn next_hole(&self, from: u64, end: u64) -> Result<Option<(u64, u64)>> {
        let seek = |at: u64, whence: i32| -> Result<Option<u64>> {
            // SAFETY: lseek on the descriptor `_file` keeps open; it moves
            // only the file position, which this channel never uses (its
            // reads and writes carry their offsets).
            let r = unsafe { libc::lseek(self.raw_fd, at as libc::off_t, whence) };
            if r >= 0 {
                return Ok(Some(r as u64));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // Past the end (ENXIO), or no hole support (EINVAL).
                Some(libc::ENXIO) | Some(libc::EINVAL) => Ok(None),
                _ => Err(self.io_error(Op::Write, at, e)),
            }
        };
        let bs = u64::from(self.block_size);
        let Some(hole) = seek(from, libc::SEEK_HOLE)? else {
            return Ok(None);
        };
        let start = hole.next_multiple_of(bs);
        if start >= end {
            return Ok(None);
        }
        let data = seek(start, libc::SEEK_DATA)?.unwrap_or(end).min(end);
        let stop = data / bs * bs;
        Ok((stop > start).then_some((start, stop)))
    }

    async fn fill_holes_impl(&self, offset: u64, len: u64) -> Result<u64> {
        self.check("fill_holes", offset, len)?;
        let end = offset + len;
        let (mut pos, mut filled) = (offset, 0);
        while let Some((start, stop)) = self.next_hole(pos, end)? {
            let mut at = start;
            while at < stop {
                let n = ZERO_CHUNK.min(stop - at);
                let buf = IoBuf::new(n as usize);
                self.submit(Op::Write, at, Payload::One(buf)).await?;
                at += n;
            }
            filled += stop - start;
            pos = stop;
        }
        Ok(filled)
    }

    async fn write_zeroes_impl(&self, offset: u64, len: u64) -> Result<()> {
        let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate("write_zeroes", offset, len, mode).await {
            Err(BdevError::Io { source, .. })
                if source.raw_os_error() == Some(libc::EOPNOTSUPP) =>
            {
                let mut pos = offset;
                while pos < offset + len {
                    let n = ZERO_CHUNK.min(offset + len - pos);
                    let buf = IoBuf::new(n as usize);
                    self.submit(Op::Write, pos, Payload::One(buf)).await?;
                    pos += n;
                }
                Ok(())
            }
            r => r,
        }
    }
}

enum Stage {
    Ready {
        op: Op,
        offset: u64,
        payload: Payload,
    },
    InFlight {
        op: Op,
        offset: u64,
        slot: u32,
    },
    Done,
}

/// One operation on the ring; resolves to its payload.
struct UringOp<'a> {
    channel: &'a UringChannel,
    stage: Stage,
    /// Bytes a read or write must move.
    expected: usize,
}

impl UringOp<'_> {
    fn poll_ready(&mut self, state: &mut RingState, cx: &mut Context<'_>) -> Poll<Result<Payload>> {
        let Stage::Ready { op, offset, .. } = self.stage else {
            return Poll::Pending;
        };
        state.reap();
        let Some(slot) = state.take_slot(cx.waker()) else {
            return Poll::Pending;
        };
        let Stage::Ready { mut payload, .. } = std::mem::replace(&mut self.stage, Stage::Done)
        else {
            return Poll::Pending;
        };
        self.expected = match &payload {
            Payload::One(b) => b.len(),
            Payload::Many(v) => v.iter().map(IoBuf::len).sum(),
            Payload::None => 0,
        };
        let entry = self.channel.entry(state, slot, op, offset, &mut payload);
        if let Err(e) = state.push(slot, entry, payload) {
            state.broken = Some(e.to_string());
            return Poll::Ready(Err(self.channel.io_error(op, offset, e)));
        }
        if matches!(op, Op::Flush | Op::WriteDurable | Op::Fallocate { .. }) {
            state.mark_slow(slot);
        }
        state.flushes += u64::from(matches!(op, Op::Flush));
        self.stage = Stage::InFlight { op, offset, slot };
        Poll::Pending
    }

    fn complete(
        &mut self,
        state: &mut RingState,
        op: Op,
        offset: u64,
        slot: u32,
    ) -> Poll<Result<Payload>> {
        match state.take_result(slot) {
            Some((result, payload)) => {
                self.stage = Stage::Done;
                Poll::Ready(self.finish(op, offset, result, payload))
            }
            None => Poll::Pending,
        }
    }

    fn finish(&self, op: Op, offset: u64, result: i32, payload: Payload) -> Result<Payload> {
        if result < 0 {
            let e = std::io::Error::from_raw_os_error(-result);
            return Err(self.channel.io_error(op, offset, e));
        }
        if matches!(
            op,
            Op::Read | Op::Write | Op::WriteDirect | Op::WriteDurable
        ) && result as usize != self.expected
        {
            if !matches!(op, Op::Read) {
                // A write cut short: the file system is full.
                return Err(self.channel.io_error(op, offset, no_space()));
            }
            let e = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("short {}: {result} of {} bytes", op.name(), self.expected),
            );
            return Err(self.channel.io_error(op, offset, e));
        }
        Ok(payload)
    }
}

impl Future for UringOp<'_> {
    type Output = Result<Payload>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let channel = this.channel;
        let mut state = channel.state.borrow_mut();
        if let Some(reason) = &state.broken {
            return Poll::Ready(Err(BdevError::Other {
                device: channel.name.to_string(),
                reason: format!("ring failed earlier: {reason}"),
            }));
        }
        if matches!(this.stage, Stage::Ready { .. }) {
            if let Poll::Ready(r) = this.poll_ready(&mut state, cx) {
                return Poll::Ready(r);
            }
            // Pushed: submitted now if the reaper runs, else by the reaper
            // in its next wait.
            if let Stage::InFlight { slot, .. } = this.stage {
                if state.park(slot, cx.waker()) {
                    // The channel lives on a glommio executor (an xstream):
                    // its completions are reaped by a task there, in the
                    // queue of the operation that found none reaping.
                    glommio::spawn_local(Reaper(Rc::downgrade(&channel.state))).detach();
                }
            }
            return Poll::Pending;
        }
        let Stage::InFlight { op, offset, slot } = this.stage else {
            return Poll::Pending;
        };
        if state.check(slot, cx.waker()) {
            return this.complete(&mut state, op, offset, slot);
        }
        Poll::Pending
    }
}

impl Drop for UringOp<'_> {
    fn drop(&mut self) {
        if let Stage::InFlight { slot, .. } = self.stage {
            if let Ok(mut state) = self.channel.state.try_borrow_mut() {
                state.orphan(slot);
            }
        }
    }
}

impl Drop for UringChannel {
    fn drop(&mut self) {
        let mut state = self.state.borrow_mut();
        // A sleeping reaper would never see that the ring is gone.
        state.wake_reaper();
        if !state.drain_blocking(DRAIN_LIMIT) {
            // The kernel may still write into these buffers: never free them.
            state.leak_in_flight();
        }
    }
}

fn payload_lost() -> BdevError {
    BdevError::Other {
        device: "uring".into(),
        reason: "internal: an operation came back without its buffers".into(),
    }
}

fn one(r: Result<Payload>) -> Result<IoBuf> {
    match r? {
        Payload::One(b) => Ok(b),
        _ => Err(payload_lost()),
    }
}

fn many(r: Result<Payload>) -> Result<Vec<IoBuf>> {
    match r? {
        Payload::Many(v) => Ok(v),
        _ => Err(payload_lost()),
    }
}

impl Channel for UringChannel {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        if len == 0 || len % self.block_size as usize != 0 {
            return Err(BdevError::Misaligned {
                device: self.name.to_string(),
                op: "alloc",
                offset: 0,
                len: len as u64,
                block_size: self.block_size,
            });
        }
        Ok(self
            .pool
            .as_ref()
            .and_then(|p| p.alloc(len))
            .unwrap_or_else(|| IoBuf::new(len)))
    }
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(async move {
            self.check("read", offset, buf.len() as u64)?;
            self.check_bufs(&[&buf])?;
            one(self.submit(Op::Read, offset, Payload::One(buf)).await)
        })
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(async move {
            self.check("write", offset, buf.len() as u64)?;
            self.check_bufs(&[&buf])?;
            if let Some((_, from)) = self.direct {
                if buf.len() >= from {
                    // Offset, length and buffer are block aligned (checked
                    // above): what O_DIRECT needs.
                    let op = Op::WriteDirect;
                    return one(self.submit(op, offset, Payload::One(buf)).await);
                }
            }
            if self.buffered && buf.len() <= INLINE_WRITE_MAX {
                return self.write_inline(offset, buf);
            }
            one(self.submit(Op::Write, offset, Payload::One(buf)).await)
        })
    }
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(self.vectored("read", offset, bufs, |_| Op::Read))
    }
    /// With `direct_from`, a big write (all buffers together) goes through
    /// the O_DIRECT descriptor, as [`write`](Channel::write) does.
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(
            self.vectored("write", offset, bufs, |total| match self.direct {
                // Every buffer's address and length are block aligned (checked;
                // lengths by the caller): what O_DIRECT needs.
                Some((_, from)) if total >= from => Op::WriteDirect,
                _ => Op::Write,
            }),
        )
    }
    /// With every write O_DIRECT, one vectored write with `RWF_DSYNC`, as
    /// [`write_durable`](Channel::write_durable).
    fn writev_durable(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        if self.buffered {
            return crate::writev_then_flush(self, offset, bufs);
        }
        Box::pin(self.vectored("write", offset, bufs, |_| Op::WriteDurable))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(async move { self.submit(Op::Flush, 0, Payload::None).await.map(|_| ()) })
    }
    /// With every write O_DIRECT (`direct=1`), one write with `RWF_DSYNC`:
    /// the kernel flushes the device cache as it ends (or writes with FUA),
    /// which makes the writes completed before it durable too, as a flush
    /// does. With a page cache in the way its sync would cover only its own
    /// range, not the other dirty pages: there it writes, then flushes.
    fn write_durable(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        if self.buffered {
            return crate::write_then_flush(self, offset, buf);
        }
        Box::pin(async move {
            self.check("write", offset, buf.len() as u64)?;
            self.check_bufs(&[&buf])?;
            one(self
                .submit(Op::WriteDurable, offset, Payload::One(buf))
                .await)
        })
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.write_zeroes_impl(offset, len))
    }
    fn fill_holes(&self, offset: u64, len: u64) -> IoFuture<'_, u64> {
        Box::pin(self.fill_holes_impl(offset, len))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        Box::pin(self.fallocate("unmap", offset, len, mode))
    }
    fn in_flight(&self) -> usize {
        self.state.borrow().in_flight()
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
}

#[cfg(test)]
mod tests;

/// The error of a write the file system cut short (it had no room).
fn no_space() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOSPC)
}
