//! Readable counters of the GET path, sharded per thread so that many
//! threads counting millions of GETs a second do not fight over one cache
//! line.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const SHARDS: usize = 32;

#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    one_sided_hits: AtomicU64,
    device_hits: AtomicU64,
    retries: AtomicU64,
    fallbacks: AtomicU64,
    cache_hits: AtomicU64,
    rpc_requests: AtomicU64,
    listed_reads: AtomicU64,
    extent_lists: AtomicU64,
    one_sided_batches: AtomicU64,
}

/// Live counters of one client (all its threads).
#[derive(Debug)]
pub struct Counters {
    shards: Box<[Shard]>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterSnapshot {
    /// GETs answered by one-sided reads alone (values and absent keys).
    pub one_sided_hits: u64,
    /// Of those, lookups whose record had left the memory ring and was read
    /// from the target's device log mapping (shm on a file-backed device);
    /// the rest were read from the ring (or found the key absent).
    pub device_hits: u64,
    /// Bucket re-reads after a mismatch (torn read, stale bucket, moved record).
    pub retries: u64,
    /// GETs that went to the engine by RPC after trying one-sided.
    pub fallbacks: u64,
    /// Buckets found in this client's bucket cache.
    pub cache_hits: u64,
    /// Requests sent by RPC (all kinds).
    pub rpc_requests: u64,
    /// File-chunk reads answered one-sided through the chunk's extent list
    /// (pieces held by records other than the chunk's newest).
    pub listed_reads: u64,
    /// Extent lists asked of the engine (ExtentList requests).
    pub extent_lists: u64,
    /// Lookups of several keys at once whose one-sided reads overlap
    /// (`get_many_into`: the keys' hits count in `one_sided_hits`).
    pub one_sided_batches: u64,
    /// RPC replies read off the socket by the caller that was waiting for
    /// them (one wake-up per round trip), of all replies read (the rest by
    /// the connection's reader thread, see `client::reader`).
    pub replies_read_by_caller: u64,
    /// Of those, replies the caller got by polling the socket rather than
    /// sleeping for them (`client::spin`).
    pub replies_read_polling: u64,
    /// RPC replies read (frames delivered) on this client's connections.
    pub replies_read: u64,
}

impl CounterSnapshot {
    /// One-sided hits over all GETs that tried the one-sided path.
    pub fn one_sided_hit_rate(&self) -> f64 {
        let total = self.one_sided_hits + self.fallbacks;
        if total == 0 {
            0.0
        } else {
            self.one_sided_hits as f64 / total as f64
        }
    }

    /// Counts since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            one_sided_hits: self.one_sided_hits - earlier.one_sided_hits,
            device_hits: self.device_hits - earlier.device_hits,
            retries: self.retries - earlier.retries,
            fallbacks: self.fallbacks - earlier.fallbacks,
            cache_hits: self.cache_hits - earlier.cache_hits,
            rpc_requests: self.rpc_requests - earlier.rpc_requests,
            listed_reads: self.listed_reads - earlier.listed_reads,
            extent_lists: self.extent_lists - earlier.extent_lists,
            one_sided_batches: self.one_sided_batches - earlier.one_sided_batches,
            replies_read_by_caller: self.replies_read_by_caller - earlier.replies_read_by_caller,
            replies_read_polling: self.replies_read_polling - earlier.replies_read_polling,
            replies_read: self.replies_read - earlier.replies_read,
        }
    }
}

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    OneSidedHit,
    DeviceHit,
    Retry,
    Fallback,
    CacheHit,
    RpcRequest,
    ListedRead,
    ExtentList,
    OneSidedBatch,
}

impl Counters {
    #[inline]
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let s = &self.shards[shard_index()];
        let c = match counter {
            Counter::OneSidedHit => &s.one_sided_hits,
            Counter::DeviceHit => &s.device_hits,
            Counter::Retry => &s.retries,
            Counter::Fallback => &s.fallbacks,
            Counter::CacheHit => &s.cache_hits,
            Counter::RpcRequest => &s.rpc_requests,
            Counter::ListedRead => &s.listed_reads,
            Counter::ExtentList => &s.extent_lists,
            Counter::OneSidedBatch => &s.one_sided_batches,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Sums the shards.
    pub fn snapshot(&self) -> CounterSnapshot {
        let mut out = CounterSnapshot::default();
        for s in self.shards.iter() {
            out.one_sided_hits += s.one_sided_hits.load(Ordering::Relaxed);
            out.device_hits += s.device_hits.load(Ordering::Relaxed);
            out.retries += s.retries.load(Ordering::Relaxed);
            out.fallbacks += s.fallbacks.load(Ordering::Relaxed);
            out.cache_hits += s.cache_hits.load(Ordering::Relaxed);
            out.rpc_requests += s.rpc_requests.load(Ordering::Relaxed);
            out.listed_reads += s.listed_reads.load(Ordering::Relaxed);
            out.extent_lists += s.extent_lists.load(Ordering::Relaxed);
            out.one_sided_batches += s.one_sided_batches.load(Ordering::Relaxed);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up() {
        let c = std::sync::Arc::new(Counters::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(Counter::OneSidedHit, 1);
                    }
                    c.add(Counter::Fallback, 1);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = c.snapshot();
        assert_eq!((s.one_sided_hits, s.fallbacks), (4000, 4));
        assert!((s.one_sided_hit_rate() - 4000.0 / 4004.0).abs() < 1e-9);
    }
}
