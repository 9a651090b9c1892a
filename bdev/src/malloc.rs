//! `malloc`: a RAM device for tests and emulation. Writes are durable as
//! soon as they complete (there is nothing to lose on flush). The memory is
//! an anonymous mapping: zero until written, touched lazily, no lock between
//! channels.

use crate::mem::{MemBacking, MemChannel};
use crate::{Bdev, BdevError, Channel, IoType, Result};
use std::sync::Arc;

pub const MALLOC_BLOCK_SIZE: u32 = 4096;
const MALLOC_QUEUE_DEPTH: usize = 128;

struct AnonMemory {
    map: memmap2::MmapMut,
    base: *mut u8,
}

// SAFETY: the mapping is only reached through raw copies by channels, as
// with a device; `map` itself is never borrowed mutably after creation.
unsafe impl Send for AnonMemory {}
// SAFETY: as above.
unsafe impl Sync for AnonMemory {}

impl MemBacking for AnonMemory {
    fn base(&self) -> *mut u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn persist(&self, _offset: usize, _len: usize) -> Result<()> {
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// A RAM-backed device.
pub struct MallocBdev {
    name: Arc<str>,
    block_size: u32,
    memory: Arc<AnonMemory>,
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
        let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| BdevError::Io {
            device: name.to_string(),
            op: "map memory",
            offset: 0,
            source: e,
        })?;
        let base = map.as_mut_ptr();
        Ok(Self {
            name: name.into(),
            block_size,
            memory: Arc::new(AnonMemory { map, base }),
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
        self.memory.len() as u64 / u64::from(self.block_size)
    }
    fn io_type_supported(&self, _io_type: IoType) -> bool {
        true
    }
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(MemChannel {
            name: Arc::clone(&self.name),
            block_size: self.block_size,
            backing: Arc::clone(&self.memory),
            queue_depth: MALLOC_QUEUE_DEPTH,
            _not_send: std::marker::PhantomData,
        }))
    }
}
