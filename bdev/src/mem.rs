//! The channel shared by the memory-backed devices (`malloc`, `pmem`): every
//! operation is a copy to or from a mapping, completed before its future is
//! first polled. Channels of one device touch the mapping without a lock:
//! like a real disk, concurrent writes to the same block leave either one.

use crate::{check_range, BdevError, Channel, IoBuf, IoFuture, Result};
use std::sync::Arc;

/// Memory a device lives in. `base()..base()+len()` stays mapped for the
/// backing's lifetime.
pub(crate) trait MemBacking: Send + Sync + 'static {
    fn base(&self) -> *mut u8;
    fn len(&self) -> usize;
    /// Called after bytes `offset..offset+len` were written.
    fn persist(&self, offset: usize, len: usize) -> Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Whether [`flush`](Self::flush) waits for a device (`msync`): the
    /// channel then runs it on the executor's blocking thread, so that the
    /// xstream keeps running its other tasks meanwhile.
    fn flush_waits(&self) -> bool {
        false
    }
}

pub(crate) struct MemChannel<B: MemBacking> {
    pub(crate) name: Arc<str>,
    pub(crate) block_size: u32,
    pub(crate) backing: Arc<B>,
    pub(crate) queue_depth: usize,
    /// Channels are per xstream (`!Send`).
    pub(crate) _not_send: std::marker::PhantomData<*const ()>,
}

/// Copies `len` bytes at `offset` of the backing out to `dst`.
/// The caller has checked the range.
pub(crate) fn copy_out<B: MemBacking>(backing: &B, offset: usize, dst: &mut [u8]) {
    // SAFETY: offset + dst.len() ≤ backing.len() (checked by the caller);
    // the mapping lives as long as `backing`; dst is a distinct allocation.
    unsafe {
        std::ptr::copy_nonoverlapping(backing.base().add(offset), dst.as_mut_ptr(), dst.len())
    };
}

/// Copies `src` into the backing at `offset`. The caller has checked the range.
pub(crate) fn copy_in<B: MemBacking>(backing: &B, offset: usize, src: &[u8]) {
    // SAFETY: as in copy_out, in the other direction.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), backing.base().add(offset), src.len()) };
}

impl<B: MemBacking> MemChannel<B> {
    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(
            &self.name,
            op,
            self.block_size,
            self.backing.len() as u64,
            offset,
            len,
        )
    }

    fn read_into(&self, offset: u64, bufs: &mut [IoBuf]) -> Result<()> {
        let total: usize = bufs.iter().map(IoBuf::len).sum();
        self.check("read", offset, total as u64)?;
        let mut pos = offset as usize;
        for b in bufs {
            copy_out(&*self.backing, pos, b.as_mut_slice());
            pos += b.len();
        }
        Ok(())
    }

    fn write_from(&self, offset: u64, bufs: &[IoBuf]) -> Result<()> {
        let total: usize = bufs.iter().map(IoBuf::len).sum();
        self.check("write", offset, total as u64)?;
        let mut pos = offset as usize;
        for b in bufs {
            copy_in(&*self.backing, pos, b.as_slice());
            pos += b.len();
        }
        self.backing.persist(offset as usize, total)
    }

    fn zero(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        self.check(op, offset, len)?;
        // SAFETY: range checked above; the mapping outlives the backing.
        unsafe { std::ptr::write_bytes(self.backing.base().add(offset as usize), 0, len as usize) };
        self.backing.persist(offset as usize, len as usize)
    }
}

/// A buffer for a channel of block size `block_size`: `len` must be a
/// multiple of it.
pub(crate) fn alloc_checked(name: &str, block_size: u32, len: usize) -> Result<IoBuf> {
    if len == 0 || len % block_size as usize != 0 {
        return Err(BdevError::Misaligned {
            device: name.to_string(),
            op: "alloc",
            offset: 0,
            len: len as u64,
            block_size,
        });
    }
    Ok(IoBuf::new(len))
}

impl<B: MemBacking> Channel for MemChannel<B> {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        alloc_checked(&self.name, self.block_size, len)
    }
    fn read(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, IoBuf> {
        let r = self
            .read_into(offset, std::slice::from_mut(&mut buf))
            .map(|()| buf);
        Box::pin(std::future::ready(r))
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        let r = self
            .write_from(offset, std::slice::from_ref(&buf))
            .map(|()| buf);
        Box::pin(std::future::ready(r))
    }
    fn readv(&self, offset: u64, mut bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        let r = self.read_into(offset, &mut bufs).map(|()| bufs);
        Box::pin(std::future::ready(r))
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        let r = self.write_from(offset, &bufs).map(|()| bufs);
        Box::pin(std::future::ready(r))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        if !self.backing.flush_waits() {
            return Box::pin(std::future::ready(self.backing.flush()));
        }
        let backing = self.backing.clone();
        Box::pin(glommio::executor().spawn_blocking(move || backing.flush()))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(std::future::ready(self.zero("write_zeroes", offset, len)))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(std::future::ready(self.zero("unmap", offset, len)))
    }
    fn in_flight(&self) -> usize {
        // Operations complete before their future is returned.
        0
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
}
