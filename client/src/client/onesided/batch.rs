//! Batches of one-sided GETs over an endpoint whose reads are round trips
//! (verbs posts a list with one doorbell per queue pair; tcp sends them one
//! after another). The main buckets the
//! cache lacks go as one list of reads; the first candidate record of every
//! key, whose address only its bucket gives, as a second. Each key is then
//! checked exactly as a single GET checks its record; a key the batch did
//! not settle (fingerprint collision, torn, moved or superseded record,
//! overflow chain, stale cached bucket) goes through
//! [`OneSidedReader::get_into`] with its retries and fallbacks.
//!
//! A batch of N GETs whose buckets are cached costs one round trip instead
//! of N; with cold buckets two instead of 2N.

use ferrite_proto::bucket::{Bucket, Slot, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;

use super::{check_record, record_span, Lookup, OneSidedReader, SlotCheck, TargetRegions};
use crate::client::counters::{Counter, Counters};
use crate::client::error::Result;
use crate::fabric::BatchRead;

/// Target regions, main bucket index and fingerprint of a key.
type Located<'a> = (&'a TargetRegions, u64, u32);

impl OneSidedReader {
    pub(super) fn get_many_batched(
        &self,
        keys: &[RecordKey<'_>],
        outs: &mut [Vec<u8>],
        counters: &Counters,
    ) -> Result<Vec<Lookup>> {
        let located: Vec<Located<'_>> = keys.iter().map(|k| self.locate(k)).collect();
        let buckets = self.main_buckets(&located, counters)?;
        let slots: Vec<Option<Slot>> = (located.iter().zip(&buckets))
            .map(|(&(regions, _, fingerprint), b)| {
                let (b, _) = b.as_ref()?;
                b.matching(fingerprint)
                    .next()
                    .filter(|s| record_span(regions, *s).is_some())
            })
            .collect();
        read_records(self, &located, &slots, outs)?;
        let mut lookups = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let (_, _, fingerprint) = located[i];
            let settled = match (&buckets[i], slots[i]) {
                (Some(_), Some(slot)) => match check_record(key, slot, None, &mut outs[i]) {
                    SlotCheck::Value(version) => Some(Lookup::Found { version }),
                    SlotCheck::Deleted => Some(Lookup::Absent),
                    _ => None,
                },
                // A freshly read main bucket without the fingerprint and
                // without an overflow chain: the key has no value.
                (Some((b, false)), None)
                    if self.policy.absent_is_final
                        && b.matching(fingerprint).next().is_none()
                        && b.next() == 0 =>
                {
                    Some(Lookup::Absent)
                }
                _ => None,
            };
            match settled {
                Some(l) => {
                    counters.add(Counter::OneSidedHit, 1);
                    lookups.push(l);
                }
                None => lookups.push(self.get_into(key, &mut outs[i], counters)?),
            }
        }
        Ok(lookups)
    }

    /// Every key's main bucket, from the cache or read in one list; `None`
    /// where a read bucket failed its check. The flag says "from the cache".
    fn main_buckets(
        &self,
        located: &[Located<'_>],
        counters: &Counters,
    ) -> Result<Vec<Option<(Bucket, bool)>>> {
        let mut out: Vec<Option<(Bucket, bool)>> = (located.iter())
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
