//! Scrubbing: listing a container's objects, and checking every record a
//! key's value is made of where it is kept — read back from the device, and
//! from the memory ring while it is there — without trusting any copy.

use super::ops::MOVED_RETRIES;
use super::Store;
use crate::store::error::Result;
use crate::store::StoreError;
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::RecordView;
use ferrite_proto::rpc::Verified;

impl Store {
    /// Objects of `container` holding a key on this target, strictly after
    /// `after`, sorted by id, at most `limit`.
    pub fn list_objects(&self, container: u64, after: Option<u128>, limit: usize) -> Vec<u128> {
        self.dir.borrow().list_objects(container, after, limit)
    }

    /// Checks every record the key's value is made of (one for a single
    /// value; each record holding a live piece of a byte array): magic,
    /// format, lengths, CRC, address and key, of the device copy once
    /// written and of the ring copy while resident. Stops at the first
    /// record that fails. A device error is an error, not a verdict.
    pub async fn verify(&self, key: &RecordKey<'_>) -> Result<Verified> {
        Self::validate(key, 0)?;
        'retry: for _ in 0..MOVED_RETRIES {
            let Some(records) = self.records_of(key) else {
                return Ok(Verified::Absent);
            };
            let (mut good, mut value_bytes) = (0u32, 0u64);
            for (addr, len) in records {
                match self.verify_record(key, addr, len).await? {
                    Ok(bytes) => {
                        good += 1;
                        value_bytes += bytes;
                    }
                    // The cleaner copied it elsewhere meanwhile: start over.
                    Err(_) if self.moved(key, addr) => continue 'retry,
                    Err(reason) => {
                        return Ok(Verified::Corrupt {
                            records: good,
                            addr,
                            reason,
                        })
                    }
                }
            }
            return Ok(Verified::Intact {
                records: good,
                value_bytes,
            });
        }
        Err(StoreError::Invalid("verify: records kept moving".into()))
    }

    /// `(address, length)` of each record the key's value uses, in log
    /// order; `None` if the key is absent.
    fn records_of(&self, key: &RecordKey<'_>) -> Option<Vec<(u64, u32)>> {
        let dir = self.dir.borrow();
        let e = dir.get((key.container, key.object), key.dkey, key.akey)?;
        let mut records = match &e.extents {
            None => vec![(e.addr, e.len)],
            Some(m) => m.values().map(|p| (p.rec_addr, p.rec_len)).collect(),
        };
        records.sort_unstable();
        records.dedup();
        Some(records)
    }

    /// Checks both copies of the record at `addr`: `Ok(value bytes)`, or
    /// `Err(why)` naming the copy that failed.
    async fn verify_record(
        &self,
        key: &RecordKey<'_>,
        addr: u64,
        len: u32,
    ) -> Result<std::result::Result<u64, String>> {
        let check = |b: &[u8]| {
            let v = RecordView::parse(b).and_then(|v| v.verify_for(key, addr).map(|()| v))?;
            Ok::<u64, ferrite_proto::FormatError>(v.value().len() as u64)
        };
        let mut value_bytes = None;
        // The ring copy first: nothing may overwrite it before the next await.
        if self.resident(addr) {
            match check(self.ring_slice(addr, len as usize)) {
                Ok(n) => value_bytes = Some(n),
                Err(e) => return Ok(Err(format!("in memory: {e}"))),
            }
        }
        if addr + u64::from(len) <= self.log.borrow().durable {
            let (buf, off) = self.read_log(addr, len as usize).await?;
            match check(&buf.as_slice()[off..off + len as usize]) {
                Ok(n) => value_bytes = Some(n),
                Err(e) => return Ok(Err(format!("on the device: {e}"))),
            }
        }
        Ok(value_bytes.ok_or_else(|| "neither in memory nor on the device".to_string()))
    }
}
