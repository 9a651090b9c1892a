//! The `verbs` endpoint (cargo feature `rdma`): one-sided reads with RDMA
//! READ over RC queue pairs to one engine, into registered local buffers,
//! completions polled by the calling thread.
//!
//! [`VerbsEndpoint::connect`] opens the local device, creates a queue pair,
//! trades queue pair info with the engine's verbs side channel (see
//! `ferrite_engine::fabric::verbs`) and receives the verbs region
//! descriptors; [`VerbsEndpoint::targets`] pairs them up for a
//! `OneSidedReader`.
//!
//! Queue pairs are per (calling thread, target): a thread's first read of a
//! target's regions connects one more queue pair (its own side-channel
//! exchange, completion queue and registered buffer), so client threads
//! never share a send queue, and a batch spanning targets rings one
//! doorbell per target queue pair and polls them together. A thread that
//! ends leaves its queue pairs until the endpoint is dropped.
//!
//! [`VerbsEndpoint::read_batch`] (also `Endpoint::read_many`) posts
//! independent reads (e.g. the buckets, then the records, of a batch of
//! GETs) as one linked work-request list per queue pair: one doorbell, one
//! poll loop.
//!
//! `Endpoint::async_reads` gives reads whose futures poll the completion
//! queue when polled, never blocking (`posted.rs`); any number of them
//! share the thread's queue pair with its blocking reads, each read matched
//! to its completion by `wr_id` (`conn.rs`, `book.rs`). They are staged
//! when asked for and rung together, one doorbell, by the first poll of
//! any read of the queue pair (or once 16 are staged): the GETs a thread
//! issues before it waits, and the record reads one batch of bucket
//! completions makes ready, go out as one work-request list.
//!
//! A read fails as soon as the engine is seen gone: its side-channel
//! socket closed (looked at while a read waits), or the queue pair's
//! retries exhausted (about 0.5 s, see `ferrite_engine::fabric::verbs::
//! RETRY_COUNT`); the error is [`Error::Disconnected`], naming the engine
//! and the cause, and every later read of that queue pair fails at once.
//!
//! ```no_run
//! use ferrite_client::fabric::verbs::VerbsEndpoint;
//! use ferrite_engine::fabric::verbs::DeviceSelector;
//! let ep = VerbsEndpoint::connect("192.0.2.2:7601", &DeviceSelector::parse("rxe0")).unwrap();
//! let targets = ep.targets().unwrap();
//! assert!(!targets.is_empty());
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::ThreadId;

use ferrite_engine::fabric::verbs::{
    exchange, Device, DeviceSelector, MemoryRegion, RcQp, ACCESS_LOCAL_WRITE, BATCH_MAX,
};
use ferrite_proto::region::{RegionDescriptor, RegionKind};

use crate::client::error::{Error, Result};
use crate::client::onesided::{TargetRegions, RECORD_MAX_BYTES};
pub use crate::fabric::BatchRead;
use crate::fabric::{check_bounds, read_in_turn, AsyncReads, DependentReads, Endpoint};

mod book;
mod conn;
mod posted;
mod reader;
use conn::{Conn, Remote, QP_DEPTH};
pub use reader::{one_sided_reader, VerbsFabricArg};

/// Bytes of each queue pair's registered local buffer (the largest single
/// read).
pub const BUFFER_BYTES: usize = RECORD_MAX_BYTES.next_power_of_two();
/// Queue pairs one endpoint keeps at most (threads × targets).
pub const QUEUE_PAIRS_MAX: usize = 4096;

type ConnRef = Arc<Mutex<Conn>>;

/// (endpoint number, target, queue pair) of [`LAST_CONN`].
type LastConn = (u64, u16, Weak<Mutex<Conn>>);

/// Endpoints made so far in this process (an endpoint's number).
static ENDPOINTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The queue pair this thread used last: (endpoint number, target,
    /// queue pair). A GET's reads, and the GETs after it, find it here
    /// without the thread id, the map's lock and its hash, which cost an
    /// emulated CPU a few microseconds a read. Weak: the endpoint owns its
    /// queue pairs.
    static LAST_CONN: RefCell<Option<LastConn>> = const { RefCell::new(None) };
}

/// RDMA READs and doorbells (work-request lists posted) of one endpoint,
/// over all its queue pairs: what one-sided GETs cost in round trips (a
/// doorbell's reads travel together; dependent reads need one each).
#[derive(Debug, Default)]
pub struct ReadCounts {
    reads: AtomicU64,
    doorbells: AtomicU64,
    queue_pairs: AtomicU64,
}

impl ReadCounts {
    /// RDMA READs posted.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Lists of reads posted (one doorbell each).
    pub fn doorbells(&self) -> u64 {
        self.doorbells.load(Ordering::Relaxed)
    }

    /// Queue pairs connected (one per thread and target read).
    pub fn queue_pairs(&self) -> u64 {
        self.queue_pairs.load(Ordering::Relaxed)
    }

    fn posted(&self, reads: usize) {
        self.doorbells.fetch_add(1, Ordering::Relaxed);
        self.reads.fetch_add(reads as u64, Ordering::Relaxed);
    }
}

/// RDMA READs of one engine's regions.
pub struct VerbsEndpoint {
    shared: Arc<Shared>,
}

/// What the endpoint and its asynchronous reads share.
struct Shared {
    /// This endpoint's number (see [`ENDPOINTS`]).
    id: u64,
    device: Arc<Device>,
    side_addr: String,
    regions: Vec<RegionDescriptor>,
    /// Queue pairs by (thread, target). Each is locked by its own thread,
    /// and by a future of its thread's polled elsewhere; the mutex makes
    /// the endpoint `Sync`.
    conns: Mutex<HashMap<(ThreadId, u16), ConnRef>>,
    counts: Arc<ReadCounts>,
    url: Arc<str>,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("engine", &self.shared.url)
            .field("regions", &self.shared.regions.len())
            .field("queue_pairs", &self.shared.conns_map().len())
            .finish()
    }
}

fn fabric_err(url: &str, e: impl std::fmt::Display) -> Error {
    Error::Protocol {
        url: url.to_string(),
        detail: format!("verbs: {e}"),
    }
}

/// A read that failed because the engine or the path to it is gone.
fn read_failed(url: &str, region_id: u32, cause: String) -> Error {
    Error::Disconnected {
        url: url.to_string(),
        op: "RDMA READ",
        detail: format!("region {region_id}: {cause}"),
    }
}

fn lock(c: &ConnRef) -> MutexGuard<'_, Conn> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// Creates a queue pair on `device`, connects it through the side channel
/// at `side_addr` and registers its landing buffer; returns it with the
/// engine's verbs region descriptors.
fn open_conn(
    device: &Arc<Device>,
    side_addr: &str,
    url: &str,
    counts: &Arc<ReadCounts>,
) -> Result<(Conn, Vec<RegionDescriptor>)> {
    let mut qp = RcQp::create(device.clone(), QP_DEPTH as u32).map_err(|e| fabric_err(url, e))?;
    let mut side = TcpStream::connect(side_addr).map_err(|source| Error::Connect {
        url: url.to_string(),
        source,
    })?;
    let (remote, regions) =
        exchange(&mut side, &qp.local_info()).map_err(|e| fabric_err(url, e))?;
    qp.connect(&remote, false).map_err(|e| fabric_err(url, e))?;
    side.set_nonblocking(true)
        .map_err(|e| fabric_err(url, format!("side channel: {e}")))?;
    let mut buf = vec![0u8; BUFFER_BYTES].into_boxed_slice();
    // SAFETY: buf is owned by Conn next to mr, and Conn drops mr first.
    let mr = unsafe {
        MemoryRegion::register(
            device.clone(),
            buf.as_mut_ptr(),
            buf.len(),
            ACCESS_LOCAL_WRITE,
        )
    }
    .map_err(|e| fabric_err(url, e))?;
    Ok((Conn::new(qp, mr, buf, side, counts.clone()), regions))
}

impl VerbsEndpoint {
    /// Connects to the verbs side channel at `side_addr` (`host:port`) from
    /// the local device `selector` names. The first queue pair (this
    /// thread's, for the first target) is connected here, so an unreachable
    /// engine fails now.
    pub fn connect(side_addr: &str, selector: &DeviceSelector) -> Result<Self> {
        let url = format!("verbs://{side_addr}");
        let device = Arc::new(Device::open(selector).map_err(|e| fabric_err(&url, e))?);
        let counts = Arc::new(ReadCounts {
            queue_pairs: AtomicU64::new(1),
            ..ReadCounts::default()
        });
        let (conn, regions) = open_conn(&device, side_addr, &url, &counts)?;
        let first_target = regions.iter().map(|d| d.target).min().unwrap_or(0);
        let mut conns = HashMap::new();
        conns.insert(
            (std::thread::current().id(), first_target),
            Arc::new(Mutex::new(conn)),
        );
        let shared = Shared {
            id: ENDPOINTS.fetch_add(1, Ordering::Relaxed),
            device,
            side_addr: side_addr.to_string(),
            regions,
            conns: Mutex::new(conns),
            counts,
            url: url.into(),
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The verbs region descriptors the engine sent.
    pub fn regions(&self) -> &[RegionDescriptor] {
        &self.shared.regions
    }

    /// The regions by target, for a `OneSidedReader`.
    pub fn targets(&self) -> Result<Vec<TargetRegions>> {
        pair_targets(&self.shared.regions).map_err(|e| fabric_err(&self.shared.url, e))
    }

    /// This endpoint's read and doorbell counts (shared: still readable
    /// after the endpoint is boxed into a `OneSidedReader`).
    pub fn read_counts(&self) -> Arc<ReadCounts> {
        self.shared.counts.clone()
    }

    /// Queue pairs connected so far (one per thread and target read).
    pub fn queue_pairs(&self) -> usize {
        self.shared.conns_map().len()
    }

    /// Reads every entry of `reads` with one doorbell per target queue pair
    /// (at most [`BATCH_MAX`] reads and [`BUFFER_BYTES`] per queue pair; a
    /// longer list goes in rounds).
    pub fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        self.shared.read_batch(reads)
    }
}

impl Shared {
    fn conns_map(&self) -> MutexGuard<'_, HashMap<(ThreadId, u16), ConnRef>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This thread's queue pair to `target`, connected on first use.
    fn conn(&self, target: u16) -> Result<ConnRef> {
        let last = LAST_CONN.with_borrow(|l| match l {
            Some((id, t, c)) if (*id, *t) == (self.id, target) => c.upgrade(),
            _ => None,
        });
        if let Some(c) = last {
            return Ok(c);
        }
        let c = self.conn_slow(target)?;
        LAST_CONN.set(Some((self.id, target, Arc::downgrade(&c))));
        Ok(c)
    }

    /// This thread's queue pair to `target` from the map, or connected.
    fn conn_slow(&self, target: u16) -> Result<ConnRef> {
        let key = (std::thread::current().id(), target);
        if let Some(c) = self.conns_map().get(&key) {
            return Ok(c.clone());
        }
        if self.conns_map().len() >= QUEUE_PAIRS_MAX {
            return Err(fabric_err(
                &self.url,
                format!("{QUEUE_PAIRS_MAX} queue pairs open (threads x targets); no more"),
            ));
        }
        // Connected without holding the map: other threads go on reading.
        let (conn, regions) = open_conn(&self.device, &self.side_addr, &self.url, &self.counts)?;
        if regions != self.regions {
            return Err(fabric_err(
                &self.url,
                "the engine's regions changed since connect (engine restarted?)",
            ));
        }
        let conn = Arc::new(Mutex::new(conn));
        self.conns_map().insert(key, conn.clone());
        self.counts.queue_pairs.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        for r in reads.iter() {
            check_bounds(r.region, r.offset, r.buf.len(), r.buf.len())?;
            if r.buf.len() > BUFFER_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "verbs batch read of {} bytes (at most {BUFFER_BYTES})",
                    r.buf.len()
                )));
            }
        }
        // Reads by target, in list order.
        let mut by_target: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, r) in reads.iter().enumerate() {
            let t = r.region.target;
            match by_target.iter_mut().find(|(x, _)| *x == t) {
                Some((_, list)) => list.push(i),
                None => by_target.push((t, vec![i])),
            }
        }
        let conns = (by_target.iter())
            .map(|(t, _)| self.conn(*t))
            .collect::<Result<Vec<_>>>()?;
        let mut next = vec![0usize; by_target.len()];
        while next.iter().zip(&by_target).any(|(n, (_, l))| *n < l.len()) {
            self.round(reads, &by_target, &conns, &mut next)?;
        }
        Ok(())
    }

    /// Posts the next chunk of every target's list, then waits for each
    /// chunk and copies its bytes out; advances `next`.
    fn round(
        &self,
        reads: &mut [BatchRead<'_>],
        by_target: &[(u16, Vec<usize>)],
        conns: &[ConnRef],
        next: &mut [usize],
    ) -> Result<()> {
        let mut guards: Vec<MutexGuard<'_, Conn>> = conns.iter().map(lock).collect();
        let mut posted: Vec<(&[usize], Option<u64>)> = Vec::with_capacity(guards.len());
        for ((g, (_, list)), n) in guards.iter_mut().zip(by_target).zip(next.iter_mut()) {
            let (mut bytes, mut end) = (0usize, *n);
            while end < list.len()
                && end - *n < BATCH_MAX
                && bytes + reads[list[end]].buf.len() <= BUFFER_BYTES
            {
                bytes += reads[list[end]].buf.len();
                end += 1;
            }
            let chunk = &list[*n..end];
            *n = end;
            let Some(&head) = chunk.first() else {
                posted.push((chunk, None));
                continue;
            };
            let remotes: Vec<Remote> = chunk.iter().map(|&i| batch_remote(&reads[i])).collect();
            let region_id = reads[head].region.region_id;
            // A full queue pair (asynchronous reads in flight) takes the
            // chunk in the wait below instead.
            let first = (g.post(&remotes, false))
                .map_err(|cause| read_failed(&self.url, region_id, cause))?;
            posted.push((chunk, first));
        }
        for (g, (chunk, first)) in guards.iter_mut().zip(posted) {
            if chunk.is_empty() {
                continue;
            }
            let region_id = reads[chunk[0]].region.region_id;
            let failed = |cause| read_failed(&self.url, region_id, cause);
            let remotes: Vec<Remote> = match first {
                Some(_) => Vec::new(),
                None => chunk.iter().map(|&i| batch_remote(&reads[i])).collect(),
            };
            let mut dsts = pick_bufs(reads, chunk);
            match first {
                Some(first) => g.wait_posted(first, &mut dsts).map_err(failed)?,
                None => g.read_wait(&remotes, &mut dsts).map_err(failed)?,
            }
        }
        Ok(())
    }

    /// One read of at most [`BUFFER_BYTES`] (checked by the caller): one
    /// work request on this thread's queue pair, posted and polled without
    /// the lists a batch builds.
    fn read_one(&self, region: &RegionDescriptor, offset: u64, buf: &mut [u8]) -> Result<()> {
        let conn = self.conn(region.target)?;
        let r = remote(region, offset, buf.len());
        let mut g = lock(&conn);
        g.read_wait(&[r], &mut [buf])
            .map_err(|cause| read_failed(&self.url, region.region_id, cause))
    }

    /// [`Endpoint::read_dependent`] on this thread's queue pair: the
    /// second read is posted from the poll that finds the first landed,
    /// picked from the landing buffer; one lookup and lock of the queue
    /// pair for both. A second read longer than [`BUFFER_BYTES`] is
    /// returned to be read on its own after the first.
    fn read_dependent(&self, reads: DependentReads<'_>) -> Result<bool> {
        let DependentReads {
            first,
            second,
            pick,
            out,
            meanwhile,
        } = reads;
        let conn = self.conn(first.region.target)?;
        let r = remote(first.region, first.offset, first.buf.len());
        let mut later = None;
        let mut pick_remote = |bytes: &[u8]| {
            let (offset, len) = pick(bytes)?;
            if check_bounds(second, offset, len, len).is_err() || len > BUFFER_BYTES {
                later = Some((offset, len));
                return None;
            }
            out.resize(len, 0);
            Some(remote(second, offset, len))
        };
        let mut g = lock(&conn);
        let fused = (g.read_dependent(r, first.buf, &mut pick_remote, meanwhile))
            .map_err(|cause| read_failed(&self.url, first.region.region_id, cause))?;
        if let Some(second_id) = fused {
            (g.wait_posted(second_id, &mut [out.as_mut_slice()]))
                .map_err(|cause| read_failed(&self.url, second.region_id, cause))?;
            return Ok(true);
        }
        drop(g);
        let Some((offset, len)) = later else {
            return Ok(false);
        };
        // Too long for the landing buffer (or out of bounds: the error).
        out.resize(len, 0);
        self.read(second, offset, out).map(|()| true)
    }

    /// Reads `buf.len()` bytes at `offset` of `region`, in reads of at
    /// most [`BUFFER_BYTES`].
    fn read(&self, region: &RegionDescriptor, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_bounds(region, offset, buf.len(), buf.len())?;
        for (i, chunk) in buf.chunks_mut(BUFFER_BYTES).enumerate() {
            self.read_one(region, offset + (i * BUFFER_BYTES) as u64, chunk)?;
        }
        Ok(())
    }
}

/// Where a read of `len` bytes at `offset` of `region` goes.
fn remote(region: &RegionDescriptor, offset: u64, len: usize) -> Remote {
    Remote {
        addr: region.remote_addr + offset,
        rkey: region.access_key as u32,
        len,
    }
}

/// Where a batch entry reads from.
fn batch_remote(r: &BatchRead<'_>) -> Remote {
    remote(r.region, r.offset, r.buf.len())
}

/// The buffers of `reads` at the indices of `chunk` (distinct, ascending).
fn pick_bufs<'a>(reads: &'a mut [BatchRead<'_>], chunk: &[usize]) -> Vec<&'a mut [u8]> {
    let mut out = Vec::with_capacity(chunk.len());
    let mut it = chunk.iter().peekable();
    for (i, r) in reads.iter_mut().enumerate() {
        if it.peek() == Some(&&i) {
            it.next();
            out.push(&mut *r.buf);
        }
    }
    out
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
        self.shared.read(region, offset, &mut buf[..len])
    }

    fn read_dependent(&self, reads: DependentReads<'_>) -> Result<bool> {
        let len = reads.first.buf.len();
        check_bounds(reads.first.region, reads.first.offset, len, len)?;
        if len > BUFFER_BYTES || reads.first.region.target != reads.second.target {
            return read_in_turn(self, reads);
        }
        self.shared.read_dependent(reads)
    }

    fn read_many(&self, reads: &mut [BatchRead<'_>]) -> Result<()> {
        self.shared.read_batch(reads)
    }

    fn provider(&self) -> &'static str {
        "verbs"
    }

    fn async_reads(&self) -> Option<Arc<dyn AsyncReads>> {
        Some(self.shared.clone())
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
            device: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
