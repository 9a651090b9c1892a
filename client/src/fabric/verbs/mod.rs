//! The `verbs` endpoint (cargo feature `rdma`): one-sided reads with RDMA
//! READ over an RC queue pair to one engine, into a registered local
//! buffer, completions polled by the calling thread.
//!
//! [`VerbsEndpoint::connect`] opens the local device, creates the queue
//! pair, trades queue pair info with the engine's verbs side channel (see
//! `ferrite_engine::fabric::verbs`) and receives the verbs region
//! descriptors; [`VerbsEndpoint::targets`] pairs them up for a
//! `OneSidedReader`. One endpoint (queue pair) per client thread and
//! engine: reads on one endpoint are serialised by a mutex.
//!
//! [`VerbsEndpoint::read_batch`] posts independent reads (e.g. the records
//! behind several cached buckets) as one linked work-request list: one
//! doorbell, one poll loop.
//!
//! ```no_run
//! use ferrite_client::fabric::verbs::VerbsEndpoint;
//! use ferrite_engine::fabric::verbs::DeviceSelector;
//! let ep = VerbsEndpoint::connect("192.0.2.2:7601", &DeviceSelector::parse("rxe0")).unwrap();
//! let targets = ep.targets().unwrap();
//! assert!(!targets.is_empty());
//! ```

use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrite_engine::fabric::verbs::{
    exchange, Device, DeviceSelector, MemoryRegion, RcQp, ReadWr, ACCESS_LOCAL_WRITE, MAX_BATCH,
};
use ferrite_proto::region::{RegionDescriptor, RegionKind};

use crate::client::error::{Error, Result};
use crate::client::onesided::{TargetRegions, RECORD_MAX_BYTES};
use crate::fabric::{check_bounds, Endpoint};

/// Bytes of the registered local buffer (the largest single read).
pub const BUFFER_BYTES: usize = RECORD_MAX_BYTES.next_power_of_two();
/// How long a read may wait for its completion (the queue pair's own
/// retries end sooner when the engine is gone).
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// One read of a batch.
#[derive(Debug)]
pub struct BatchRead<'a> {
    pub region: &'a RegionDescriptor,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

struct Inner {
    qp: RcQp,
    // Declared after qp: the registration goes after the queue pair and
    // before the memory it covers.
    mr: MemoryRegion,
    buf: Box<[u8]>,
    _side: TcpStream,
}

/// RDMA READs of one engine's regions.
pub struct VerbsEndpoint {
    inner: Mutex<Inner>,
    regions: Vec<RegionDescriptor>,
    url: String,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("engine", &self.url)
            .field("regions", &self.regions.len())
            .finish()
    }
}

fn fabric_err(url: &str, e: impl std::fmt::Display) -> Error {
    Error::Protocol {
        url: url.to_string(),
        detail: format!("verbs: {e}"),
    }
}

impl VerbsEndpoint {
    /// Connects to the verbs side channel at `side_addr` (`host:port`) from
    /// the local device `selector` names.
    pub fn connect(side_addr: &str, selector: &DeviceSelector) -> Result<Self> {
        let url = format!("verbs://{side_addr}");
        let device = Arc::new(Device::open(selector).map_err(|e| fabric_err(&url, e))?);
        let mut qp =
            RcQp::create(device.clone(), MAX_BATCH as u32).map_err(|e| fabric_err(&url, e))?;
        let mut side = TcpStream::connect(side_addr).map_err(|source| Error::Connect {
            url: url.clone(),
            source,
        })?;
        let (remote, regions) =
            exchange(&mut side, &qp.local_info()).map_err(|e| fabric_err(&url, e))?;
        qp.connect(&remote, false)
            .map_err(|e| fabric_err(&url, e))?;
        let mut buf = vec![0u8; BUFFER_BYTES].into_boxed_slice();
        // SAFETY: buf is owned by Inner next to mr, and Inner drops mr first.
        let mr = unsafe {
            MemoryRegion::register(device, buf.as_mut_ptr(), buf.len(), ACCESS_LOCAL_WRITE)
        }
        .map_err(|e| fabric_err(&url, e))?;
        Ok(Self {
            inner: Mutex::new(Inner {
                qp,
                mr,
                buf,
                _side: side,
            }),
            regions,
            url,
        })
    }

    /// The verbs region descriptors the engine sent.
    pub fn regions(&self) -> &[RegionDescriptor] {
        &self.regions
    }

    /// The regions by target, for a `OneSidedReader`.
    pub fn targets(&self) -> Result<Vec<TargetRegions>> {
        pair_targets(&self.regions).map_err(|e| fabric_err(&self.url, e))
    }

    /// Reads every entry of `reads` with one doorbell (at most
    /// [`MAX_BATCH`] reads, [`BUFFER_BYTES`] in all).
    pub fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        let total: usize = reads.iter().map(|r| r.buf.len()).sum();
        if reads.len() > MAX_BATCH || total > BUFFER_BYTES {
            return Err(Error::InvalidArgument(format!(
                "verbs batch of {} reads, {total} bytes (at most {MAX_BATCH}, {BUFFER_BYTES})",
                reads.len()
            )));
        }
        for r in reads.iter() {
            check_bounds(r.region, r.offset, r.buf.len(), r.buf.len())?;
        }
        if reads.is_empty() {
            return Ok(());
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *inner;
        let base = inner.buf.as_mut_ptr() as u64;
        let (lkey, mut at) = (inner.mr.lkey(), 0u64);
        let wrs: Vec<ReadWr> = reads
            .iter()
            .map(|r| {
                let w = ReadWr {
                    local_addr: base + at,
                    lkey,
                    len: r.buf.len() as u32,
                    remote_addr: r.region.remote_addr + r.offset,
                    rkey: r.region.access_key as u32,
                };
                at += r.buf.len() as u64;
                w
            })
            .collect();
        let region_id = reads[0].region.region_id;
        let failed = |e| Error::Region {
            region_id,
            reason: format!("RDMA READ from {}: {e}", self.url),
        };
        inner.qp.post_reads(&wrs).map_err(failed)?;
        inner.qp.poll(POLL_TIMEOUT).map_err(failed)?;
        let mut at = 0usize;
        for r in reads.iter_mut() {
            let n = r.buf.len();
            r.buf.copy_from_slice(&inner.buf[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

impl Endpoint for VerbsEndpoint {
    fn read(
        &self,
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        check_bounds(region, offset, len, buf.len())?;
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(BUFFER_BYTES);
            let mut one = [BatchRead {
                region,
                offset: offset + done as u64,
                buf: &mut buf[done..done + n],
            }];
            self.read_batch(&mut one)?;
            done += n;
        }
        Ok(())
    }

    fn provider(&self) -> &'static str {
        "verbs"
    }
}

/// Pairs bucket and log descriptors by target, in target order; every
/// target must have exactly one of each.
pub fn pair_targets(
    regions: &[RegionDescriptor],
) -> std::result::Result<Vec<TargetRegions>, String> {
    let targets = regions
        .iter()
        .map(|d| usize::from(d.target) + 1)
        .max()
        .unwrap_or(0);
    let mut out = Vec::with_capacity(targets);
    for t in 0..targets {
        let find = |kind| {
            let mut it = regions
                .iter()
                .filter(|d| usize::from(d.target) == t && d.kind == kind);
            match (it.next(), it.next()) {
                (Some(d), None) => Ok(*d),
                _ => Err(format!("target {t}: expected one {kind:?} region")),
            }
        };
        out.push(TargetRegions {
            buckets: find(RegionKind::Buckets)?,
            log: find(RegionKind::Log)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
