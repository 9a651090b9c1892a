//! The one-sided GET as a future, over an endpoint's [`AsyncReads`]: the
//! same walk, checks, retries and fallbacks as
//! [`OneSidedReader::get_into`], each read awaited instead of waited for,
//! so that one thread keeps many GETs in flight (verbs: many RDMA READs on
//! its queue pair, each completion found by whichever GET polls).
//!
//! The first read (the record's when the main bucket is cached, else the
//! bucket's) is started when the lookup is made, not when it is first
//! polled: GETs issued one after another travel together (verbs: their
//! reads are staged and the first poll rings one doorbell for all).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;
use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::Key;

use super::{
    check_record, checked_bucket, next_link, not_found, record_span, settle, slot_step, Attempts,
    FallbackReason, Lookup, OneSidedReader, Pass, RetryPolicy, SlotCheck, TargetRegions, CHAIN_MAX,
};
use crate::client::cache::BucketCache;
use crate::client::counters::{Counter, Counters};
use crate::client::error::Result;
use crate::fabric::{AsyncReads, ReadFuture};

/// A GET's outcome and, on `Found`, its value.
pub type AsyncLookupFuture = Pin<Box<dyn Future<Output = Result<(Lookup, Vec<u8>)>> + Send>>;

/// A read posted ahead: (region id, offset, length) and its future.
type Posted = (u32, u64, usize, ReadFuture);

/// What one asynchronous GET owns.
struct AsyncLookup {
    reads: Arc<dyn AsyncReads>,
    regions: TargetRegions,
    main_index: u64,
    fingerprint: u32,
    cache: Arc<BucketCache>,
    counters: Arc<Counters>,
    attempts: Attempts,
    policy: RetryPolicy,
    first: Option<Posted>,
}

impl OneSidedReader {
    /// Looks `key` up as a future (`None` when the endpoint has no
    /// asynchronous reads). Same guarantees as
    /// [`get_into`](Self::get_into); the first read is posted now.
    pub fn lookup_async(&self, key: &Key, counters: Arc<Counters>) -> Option<AsyncLookupFuture> {
        let reads = self.async_reads.clone()?;
        let (regions, main_index, fingerprint) = self.locate(&key.as_record_key());
        let mut lookup = AsyncLookup {
            reads,
            regions: *regions,
            main_index,
            fingerprint,
            cache: self.cache.clone(),
            counters,
            attempts: Attempts::new(self.policy),
            policy: self.policy,
            first: None,
        };
        lookup.post_first();
        let key = key.clone();
        Some(Box::pin(
            async move { lookup.run(&key.as_record_key()).await },
        ))
    }
}

impl AsyncLookup {
    /// Posts the read the first pass will start with: the record of the
    /// first matching slot of a cached main bucket, else the main bucket.
    fn post_first(&mut self) {
        let target = self.regions.buckets.target;
        let slot = (self.cache.get(target, self.main_index))
            .and_then(|b| b.matching(self.fingerprint).next())
            .and_then(|s| record_span(&self.regions, s));
        let (region, offset, len) = match slot {
            Some((offset, len)) => (self.regions.log, offset, len),
            None => (
                self.regions.buckets,
                self.main_index * BUCKET_BYTES as u64,
                BUCKET_BYTES,
            ),
        };
        let f = self.reads.read_async(&region, offset, len);
        self.first = Some((region.region_id, offset, len, f));
    }

    /// Reads `len` bytes at `offset` of `region`: the read posted ahead if
    /// it is that one (else that one stays for a later read, and is
    /// abandoned if none asks for it), or a new one.
    async fn read(
        &mut self,
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>> {
        match self.first.take() {
            Some((id, o, l, f)) if (id, o, l) == (region.region_id, offset, len) => f.await,
            other => {
                self.first = other;
                self.reads.read_async(region, offset, len).await
            }
        }
    }

    async fn run(mut self, key: &RecordKey<'_>) -> Result<(Lookup, Vec<u8>)> {
        let (mut use_cache, mut failed_fresh) = (true, None);
        let mut out = Vec::new();
        while self.attempts.next(&self.counters) {
            match self.pass(key, use_cache, failed_fresh, &mut out).await? {
                Pass::Done(found) => return Ok((settle(found, &self.counters), out)),
                Pass::Retry(failed) => (use_cache, failed_fresh) = (false, failed),
            }
        }
        let exhausted = Lookup::Fallback(FallbackReason::RetriesExhausted);
        Ok((settle(exhausted, &self.counters), out))
    }

    /// A bucket, from the cache when allowed; `None` when the one read
    /// fails its check.
    async fn bucket(&mut self, index: u64, use_cache: bool) -> Result<Option<(Bucket, bool)>> {
        let target = self.regions.buckets.target;
        let offset = index * BUCKET_BYTES as u64;
        // A read of this bucket posted ahead is fresher than the cache.
        let posted = (self.first.as_ref())
            .is_some_and(|p| (p.0, p.1) == (self.regions.buckets.region_id, offset));
        if use_cache && !posted {
            if let Some(b) = self.cache.get(target, index) {
                self.counters.add(Counter::CacheHit, 1);
                return Ok(Some((b, true)));
            }
        }
        let region = self.regions.buckets;
        let bytes = self.read(&region, offset, BUCKET_BYTES).await?;
        let mut b = Bucket([0; BUCKET_BYTES]);
        b.0.copy_from_slice(&bytes);
        Ok(checked_bucket(&self.cache, target, index, b).map(|b| (b, false)))
    }

    /// One walk of the bucket chain, as `OneSidedReader::pass` walks it.
    async fn pass(
        &mut self,
        key: &RecordKey<'_>,
        use_cache: bool,
        failed_fresh: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<Pass> {
        let bucket_count = self.regions.buckets.length / BUCKET_BYTES as u64;
        let (mut index, mut any_cached) = (self.main_index, false);
        for _ in 0..CHAIN_MAX {
            let Some((bucket, cached)) = self.bucket(index, use_cache).await? else {
                return Ok(Pass::Retry(None));
            };
            any_cached |= cached;
            for slot in bucket.matching(self.fingerprint) {
                let log = self.regions.log;
                let check = match record_span(&self.regions, slot) {
                    None => SlotCheck::Stale,
                    Some((offset, len)) => {
                        *out = self.read(&log, offset, len).await?;
                        check_record(key, slot, None, out)
                    }
                };
                let target = self.regions.buckets.target;
                let invalidate = || self.cache.invalidate(target, index);
                if let Some(pass) = slot_step(check, slot.addr, cached, failed_fresh, invalidate) {
                    return Ok(pass);
                }
            }
            match next_link(&bucket, bucket_count, any_cached, &self.policy) {
                Ok(next) => index = next,
                Err(end) => return Ok(end),
            }
        }
        Ok(not_found(any_cached, &self.policy))
    }
}
