//! Client-side fabric endpoints: how a client reads a registered region of
//! an engine without the engine's CPU.
//!
//! An [`Endpoint`] is given a [`RegionDescriptor`] from the handshake and
//! copies bytes out of that region. Providers: [`shm`] (a read-only mapping
//! of a memfd handed over a Unix socket) and [`tcp`] (reads served by the
//! target's network task). A verbs endpoint fits the same trait: `read` is an
//! RDMA READ of `(remote_addr + offset, len)` with the descriptor's rkey.
//!
//! An endpoint whose reads are network round trips may also offer
//! [`AsyncReads`]: a read posted at once whose completion a future polls
//! for (the asynchronous GET of `Client::get_async` uses it).
//!
//! The engine writes regions while clients read them. A read never fails
//! because of that; it may return a mix of old and new bytes, and the
//! caller checks what it read (bucket and record CRCs) and reads again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ferrite_proto::region::RegionDescriptor;

use crate::client::error::Result;

pub mod shm;
pub mod tcp;
#[cfg(feature = "rdma")]
pub mod verbs;

/// How [`DependentReads::pick`] chooses: offset and length, or `None`.
pub type PickSpan<'a> = dyn FnMut(&[u8]) -> Option<(u64, usize)> + 'a;

/// The two dependent reads of [`Endpoint::read_dependent`].
pub struct DependentReads<'a> {
    /// The first read (a GET's bucket).
    pub first: BatchRead<'a>,
    /// The region of the second (the log).
    pub second: &'a RegionDescriptor,
    /// Chooses the second read's span (offset, length) from the first's
    /// bytes, unchecked; `None`: no second read.
    pub pick: &'a mut PickSpan<'a>,
    /// The second read's bytes (resized to its length).
    pub out: &'a mut Vec<u8>,
    /// Gets the first read's bytes while the second is in flight, from an
    /// endpoint whose reads are round trips; one whose reads are copies
    /// (the default [`Endpoint::read_dependent`]) does not call it, and the
    /// caller checks the bytes itself when it needs them checked.
    pub meanwhile: &'a mut dyn FnMut(&[u8]),
}

/// One read of a list given to [`Endpoint::read_many`]: `buf.len()` bytes
/// at `offset` of `region`.
#[derive(Debug)]
pub struct BatchRead<'a> {
    pub region: &'a RegionDescriptor,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// One-sided reads of an engine's registered regions.
pub trait Endpoint: Send + Sync {
    /// Copies `len` bytes at `offset` of `region` into `buf[..len]`.
    ///
    /// Contract: `offset + len <= region.length` and `buf.len() >= len`,
    /// else an error and `buf` untouched. The bytes may be concurrently
    /// written by the engine; the copy is done with atomic loads (8 bytes at
    /// a time when `offset` and `len` are multiples of 8) or by the kernel
    /// (shm's reads of device log windows are `pread`s), so it is never undefined
    /// behaviour, only possibly torn.
    fn read(
        &self,
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<()>;

    /// The two dependent reads of a cold GET in one call: reads
    /// `first.buf` at `first.offset` of `first.region`, then the span of
    /// `second` that `pick` chooses from those bytes into `out`. `pick`
    /// sees the first read's bytes unchecked and only chooses where to
    /// read; `meanwhile` may get them (as now in `first.buf`) while the
    /// second read is in flight, to check them there. Returns whether the
    /// second read was made. The default reads one after the other and
    /// leaves the checks to the caller; an endpoint whose reads are round
    /// trips posts the second read straight from the first's completion
    /// (verbs: from its landing buffer, before the bytes are copied out)
    /// and calls `meanwhile` while it is in flight.
    fn read_dependent(&self, reads: DependentReads<'_>) -> Result<bool> {
        read_in_turn(self, reads)
    }

    /// Hints that `len` bytes at `offset` will be read soon (a CPU prefetch
    /// on shm; nothing where a read is a network round trip). Never fails.
    fn prefetch(&self, _region: &RegionDescriptor, _offset: u64, _len: usize) {}

    /// Reads every entry of `reads`, which are independent of each other.
    /// The default reads them one after another; an endpoint whose reads
    /// are network round trips may post them together (verbs: one doorbell
    /// per queue pair).
    fn read_many(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        for r in reads.iter_mut() {
            let len = r.buf.len();
            self.read(r.region, r.offset, len, r.buf)?;
        }
        Ok(())
    }

    /// Whether reads are CPU loads that [`Endpoint::prefetch`] overlaps
    /// (shm). A batch of GETs then prefetches every bucket and record and
    /// reads key by key; otherwise it reads the buckets, then the records,
    /// as lists ([`Endpoint::read_many`]): one round trip each, not one per
    /// key.
    fn prefetches(&self) -> bool {
        false
    }

    /// Provider name, for `stat` and logs.
    fn provider(&self) -> &'static str;

    /// The endpoint's asynchronous reads, when it has them (`None`: the
    /// default; its reads are only the blocking ones above).
    fn async_reads(&self) -> Option<Arc<dyn AsyncReads>> {
        None
    }
}

/// An asynchronous read's bytes, as a future.
pub type ReadFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>>> + Send>>;

/// Reads that are started when asked for and completed by polling their
/// future, so that one thread keeps many in flight. A future that is
/// dropped before it completes abandons its read.
pub trait AsyncReads: Send + Sync {
    /// Starts reading `len` bytes at `offset` of `region`: now, or staged
    /// to go out with the thread's other reads at the next poll of any of
    /// them (verbs: one doorbell), or at the future's first poll when the
    /// endpoint has no room now; the future gives the bytes. Same contract
    /// and bounds as [`Endpoint::read`].
    fn read_async(&self, region: &RegionDescriptor, offset: u64, len: usize) -> ReadFuture;
}

/// [`Endpoint::read_dependent`] as two reads one after the other.
pub(crate) fn read_in_turn<E: Endpoint + ?Sized>(ep: &E, r: DependentReads<'_>) -> Result<bool> {
    let len = r.first.buf.len();
    ep.read(r.first.region, r.first.offset, len, r.first.buf)?;
    let span = (r.pick)(r.first.buf);
    let Some((offset, len)) = span else {
        return Ok(false);
    };
    r.out.resize(len, 0);
    ep.read(r.second, offset, len, r.out)?;
    Ok(true)
}

/// Checks a read's bounds against its descriptor.
pub(crate) fn check_bounds(
    region: &RegionDescriptor,
    offset: u64,
    len: usize,
    buf_len: usize,
) -> Result<()> {
    let end = offset.checked_add(len as u64);
    if end.is_none_or(|e| e > region.length) || buf_len < len {
        return Err(crate::client::error::Error::Region {
            region_id: region.region_id,
            reason: format!(
                "read of {len} bytes at offset {offset} outside region of {} bytes \
                 (buffer {buf_len})",
                region.length
            ),
        });
    }
    Ok(())
}
