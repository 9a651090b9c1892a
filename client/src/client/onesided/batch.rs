//! Batches of one-sided GETs. Every key's main bucket is fetched first,
//! then the first candidate record of every key, whose address only its
//! bucket gives; each key is then checked exactly as a single GET checks
//! its record. A key the batch did not settle (fingerprint collision, torn,
//! moved or superseded record, overflow chain, stale cached bucket) goes
//! through [`OneSidedReader::get_into`] with its retries and fallbacks.
//!
//! How the two steps fetch depends on the endpoint:
//! - reads that are round trips (verbs posts a list with one doorbell per
//!   queue pair; tcp sends them one after another): the main buckets the
//!   cache lacks go as one list of reads, the records as a second. A batch
//!   of N GETs whose buckets are cached costs one round trip instead of N;
//!   with cold buckets two instead of 2N.
//! - reads that are loads (shm): every main bucket is prefetched; then each
//!   is read, and its candidate record prefetched at once (while the later
//!   buckets are still on their way); then each record is read, so that the
//!   loads of all keys overlap. A bucket read so is not checked unless the key's outcome rests
//!   on it (absent): a record that checks proves itself (see
//!   `proven_by_record`).

use ferrite_proto::bucket::{Bucket, Slot, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;

use super::{check_record, record_span, Lookup, OneSidedReader, SlotCheck, TargetRegions};
use crate::client::counters::{Counter, Counters};
use crate::client::error::{Error, Result};
use crate::fabric::BatchRead;

/// Target regions, main bucket index and fingerprint of a key.
type Located<'a> = (&'a TargetRegions, u64, u32);

/// A key's main bucket as the batch got it, and whether from the cache.
type Main = Option<(Bucket, bool)>;

impl OneSidedReader {
    /// Looks up many keys, overlapping their latency (see [`batch`](self)).
    /// Same guarantees as [`get_into`](Self::get_into), key by key.
    pub fn get_many_into(
        &self,
        keys: &[RecordKey<'_>],
        outs: &mut [Vec<u8>],
        counters: &Counters,
    ) -> Result<Vec<Lookup>> {
        if keys.len() != outs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} keys but {} output buffers",
                keys.len(),
                outs.len()
            )));
        }
        counters.add(Counter::OneSidedBatch, 1);
        let located: Vec<Located<'_>> = keys.iter().map(|k| self.locate(k)).collect();
        let loads = self.endpoint.prefetches();
        let buckets = match loads {
            true => self.main_buckets_loaded(&located),
            false => self.main_buckets(&located, counters)?,
        };
        let slots: Vec<Option<Slot>> = (located.iter().zip(&buckets))
            .map(|(&(regions, _, fingerprint), b)| {
                Some(candidate(regions, fingerprint, &b.as_ref()?.0)?.0)
            })
            .collect();
        match loads {
            true => load_records(self, &located, &slots, outs)?,
            false => read_records(self, &located, &slots, outs)?,
        }
        let mut lookups = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match self.settle(key, located[i].2, &buckets[i], slots[i], &mut outs[i]) {
                Some(l) => {
                    counters.add(Counter::OneSidedHit, 1);
                    lookups.push(l);
                }
                None => lookups.push(self.get_into(key, &mut outs[i], counters)?),
            }
        }
        Ok(lookups)
    }

    /// Starts loading the main bucket of every key and then, as each bucket
    /// arrives, its candidate record, without reading or checking them (shm:
    /// prefetches; other endpoints: nothing), so that lookups of the keys
    /// one by one right after find their lines on the way or in the cache.
    pub fn prefetch_many(&self, keys: &[RecordKey<'_>]) {
        if self.endpoint.prefetches() {
            let located: Vec<Located<'_>> = keys.iter().map(|k| self.locate(k)).collect();
            self.main_buckets_loaded(&located);
        }
    }

    /// A key's outcome from its main bucket and its candidate record (in
    /// `out`), when they settle it.
    fn settle(
        &self,
        key: &RecordKey<'_>,
        fingerprint: u32,
        main: &Main,
        slot: Option<Slot>,
        out: &mut Vec<u8>,
    ) -> Option<Lookup> {
        match (main, slot) {
            (Some(_), Some(slot)) => match check_record(key, slot, None, out) {
                SlotCheck::Value(version) => Some(Lookup::Found { version }),
                SlotCheck::Deleted => Some(Lookup::Absent),
                _ => None,
            },
            // A freshly read main bucket that checks, without the
            // fingerprint and without an overflow chain: the key has no value.
            (Some((b, false)), None)
                if self.policy.absent_is_final
                    && b.matching(fingerprint).next().is_none()
                    && b.next() == 0
                    && b.check().is_ok() =>
            {
                Some(Lookup::Absent)
            }
            _ => None,
        }
    }

    /// Every key's main bucket, prefetched then loaded (shm), unchecked;
    /// the record of its candidate slot is prefetched as soon as it is
    /// loaded, while the later buckets are still on their way.
    fn main_buckets_loaded(&self, located: &[Located<'_>]) -> Vec<Main> {
        for &(regions, index, _) in located {
            let offset = index * BUCKET_BYTES as u64;
            self.endpoint
                .prefetch(&regions.buckets, offset, BUCKET_BYTES);
        }
        (located.iter())
            .map(|&(regions, index, fingerprint)| {
                let mut b = Bucket([0; BUCKET_BYTES]);
                let offset = index * BUCKET_BYTES as u64;
                (self
                    .endpoint
                    .read(&regions.buckets, offset, BUCKET_BYTES, &mut b.0))
                .ok()?;
                if let Some((_, (offset, len))) = candidate(regions, fingerprint, &b) {
                    self.endpoint.prefetch(&regions.log, offset, len);
                }
                Some((b, false))
            })
            .collect()
    }

    /// Every key's main bucket, from the cache or read in one list; `None`
    /// where a read bucket failed its check (those that check are cached).
    fn main_buckets(&self, located: &[Located<'_>], counters: &Counters) -> Result<Vec<Main>> {
        let mut out: Vec<Main> = (located.iter())
            .map(|&(r, index, _)| self.cache.get(r.buckets.target, index).map(|b| (b, true)))
            .collect();
        counters.add(Counter::CacheHit, out.iter().flatten().count() as u64);
        let missing: Vec<usize> = (0..out.len()).filter(|&i| out[i].is_none()).collect();
        let mut fresh = vec![Bucket([0; BUCKET_BYTES]); missing.len()];
        let mut reads: Vec<BatchRead<'_>> = (missing.iter().zip(fresh.iter_mut()))
            .map(|(&i, b)| {
                let (regions, index, _) = located[i];
                BatchRead {
                    region: &regions.buckets,
                    offset: index * BUCKET_BYTES as u64,
                    buf: &mut b.0,
                }
            })
            .collect();
        if !reads.is_empty() {
            self.endpoint.read_many(&mut reads)?;
        }
        for (&i, b) in missing.iter().zip(fresh) {
            if b.check().is_ok() {
                let (regions, index, _) = located[i];
                self.cache.put(regions.buckets.target, index, &b);
                out[i] = Some((b, false));
            }
        }
        Ok(out)
    }
}

/// Reads the record of every key that has a candidate slot into its output
/// buffer, as one list.
fn read_records(
    reader: &OneSidedReader,
    located: &[Located<'_>],
    slots: &[Option<Slot>],
    outs: &mut [Vec<u8>],
) -> Result<()> {
    let mut reads = Vec::with_capacity(slots.len());
    for ((&(regions, _, _), slot), out) in located.iter().zip(slots).zip(outs.iter_mut()) {
        let Some((offset, len)) = slot.and_then(|s| record_span(regions, s)) else {
            continue;
        };
        out.resize(len, 0);
        reads.push(BatchRead {
            region: &regions.log,
            offset,
            buf: &mut out[..len],
        });
    }
    if reads.is_empty() {
        return Ok(());
    }
    reader.endpoint.read_many(&mut reads)
}

/// The first slot of `bucket` with `fingerprint`, when it can point into
/// the ring, and where its record lies there.
fn candidate(
    regions: &TargetRegions,
    fingerprint: u32,
    bucket: &Bucket,
) -> Option<(Slot, (u64, usize))> {
    let slot = bucket.matching(fingerprint).next()?;
    Some((slot, record_span(regions, slot)?))
}

/// Loads the record of every key that has a candidate slot into its output
/// buffer (shm; prefetched as its bucket was loaded).
fn load_records(
    reader: &OneSidedReader,
    located: &[Located<'_>],
    slots: &[Option<Slot>],
    outs: &mut [Vec<u8>],
) -> Result<()> {
    for ((&(regions, _, _), slot), out) in located.iter().zip(slots).zip(outs.iter_mut()) {
        if let Some((offset, len)) = slot.and_then(|s| record_span(regions, s)) {
            out.resize(len, 0);
            reader.endpoint.read(&regions.log, offset, len, out)?;
        }
    }
    Ok(())
}
