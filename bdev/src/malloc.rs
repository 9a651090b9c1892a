//! `malloc`: a RAM device for tests and emulation. Writes are durable as
//! soon as they complete (there is nothing to lose on flush).

use crate::{check_range, Bdev, BdevError, Channel, IoBuf, IoFuture, IoType, Result};
use std::cell::Cell;
use std::sync::{Arc, RwLock};

pub const MALLOC_BLOCK_SIZE: u32 = 4096;
const MALLOC_QUEUE_DEPTH: usize = 128;

/// A RAM-backed device.
pub struct MallocBdev {
    name: String,
    block_size: u32,
    data: Arc<RwLock<Vec<u8>>>,
}

impl MallocBdev {
    /// A zeroed device of `size_bytes` (a multiple of the block size).
    pub fn new(name: &str, size_bytes: u64, block_size: u32) -> Result<Self> {
        if block_size == 0 || size_bytes == 0 || size_bytes % u64::from(block_size) != 0 {
            return Err(BdevError::BadSpec {
                spec: name.to_string(),
                reason: format!(
                    "size {size_bytes} is not a positive multiple of the block size {block_size}"
                ),
            });
        }
        let len = usize::try_from(size_bytes).map_err(|_| BdevError::BadSpec {
            spec: name.to_string(),
            reason: "size does not fit in memory".into(),
        })?;
        Ok(Self {
            name: name.to_string(),
            block_size,
            data: Arc::new(RwLock::new(vec![0u8; len])),
        })
    }
}

impl Bdev for MallocBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn block_count(&self) -> u64 {
        let len = self.data.read().map(|d| d.len()).unwrap_or(0);
        len as u64 / u64::from(self.block_size)
    }
    fn io_type_supported(&self, _io_type: IoType) -> bool {
        true
    }
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(MallocChannel {
            name: self.name.clone(),
            block_size: self.block_size,
            size_bytes: self.size_bytes(),
            data: Arc::clone(&self.data),
            in_flight: Cell::new(0),
            _not_send: std::marker::PhantomData,
        }))
    }
}

struct MallocChannel {
    name: String,
    block_size: u32,
    size_bytes: u64,
    data: Arc<RwLock<Vec<u8>>>,
    in_flight: Cell<usize>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl MallocChannel {
    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(
            &self.name,
            op,
            self.block_size,
            self.size_bytes,
            offset,
            len,
        )
    }
    fn poisoned(&self) -> BdevError {
        BdevError::Other {
            device: self.name.clone(),
            reason: "memory lock poisoned by a panic".into(),
        }
    }
    fn copy_out(&self, offset: u64, bufs: &mut [IoBuf]) -> Result<()> {
        let total: usize = bufs.iter().map(IoBuf::len).sum();
        self.check("read", offset, total as u64)?;
        let data = self.data.read().map_err(|_| self.poisoned())?;
        let mut pos = offset as usize;
        for b in bufs {
            let n = b.len();
            b.as_mut_slice().copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }
    fn copy_in(&self, offset: u64, bufs: &[IoBuf]) -> Result<()> {
        let total: usize = bufs.iter().map(IoBuf::len).sum();
        self.check("write", offset, total as u64)?;
        let mut data = self.data.write().map_err(|_| self.poisoned())?;
        let mut pos = offset as usize;
        for b in bufs {
            data[pos..pos + b.len()].copy_from_slice(b.as_slice());
            pos += b.len();
        }
        Ok(())
    }
    fn zero(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        self.check(op, offset, len)?;
        let mut data = self.data.write().map_err(|_| self.poisoned())?;
        data[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

impl Channel for MallocChannel {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        if len % self.block_size as usize != 0 {
            return Err(BdevError::Misaligned {
                device: self.name.clone(),
                op: "alloc",
                offset: 0,
                len: len as u64,
                block_size: self.block_size,
            });
        }
        Ok(IoBuf::new(len))
    }
    fn read(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, IoBuf> {
        let r = self
            .copy_out(offset, std::slice::from_mut(&mut buf))
            .map(|()| buf);
        Box::pin(std::future::ready(r))
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        let r = self
            .copy_in(offset, std::slice::from_ref(&buf))
            .map(|()| buf);
        Box::pin(std::future::ready(r))
    }
    fn readv(&self, offset: u64, mut bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        let r = self.copy_out(offset, &mut bufs).map(|()| bufs);
        Box::pin(std::future::ready(r))
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        let r = self.copy_in(offset, &bufs).map(|()| bufs);
        Box::pin(std::future::ready(r))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(std::future::ready(self.zero("write_zeroes", offset, len)))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(std::future::ready(self.zero("unmap", offset, len)))
    }
    fn in_flight(&self) -> usize {
        self.in_flight.get()
    }
    fn queue_depth(&self) -> usize {
        MALLOC_QUEUE_DEPTH
    }
}
