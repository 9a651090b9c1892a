//! Checkpoints of the index: the key directory serialised to one of two
//! alternating areas, so recovery only replays the log written after it.
//!
//! A checkpoint is taken synchronously from the published state (every record
//! before `replay_start` is reflected in it), then written and flushed while
//! the xstream goes on serving. Only after the flush are the log segments it
//! found without live records freed.

use super::dir::{Entry, ExtentMap, Piece};
use super::format::*;
use super::{Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::key::RecordKey;

/// What a finished checkpoint covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub generation: u64,
    pub replay_start: u64,
    pub log_tail: u64,
    pub entries: u64,
    pub bytes: u64,
}

fn encode_entry(out: &mut Vec<u8>, obj: (u64, u128), dkey: &[u8], akey: &[u8], e: &Entry) {
    let pieces = e.extents.as_ref().map_or(0, |m| m.len());
    let mut h = [0u8; CE_FIXED_BYTES];
    h[CE_KIND] = if e.extents.is_some() {
        KIND_ARRAY
    } else {
        KIND_SINGLE
    };
    put(&mut h, CE_DKEY_LEN, &(dkey.len() as u16).to_le_bytes());
    put(&mut h, CE_AKEY_LEN, &(akey.len() as u16).to_le_bytes());
    put(&mut h, CE_CONTAINER, &obj.0.to_le_bytes());
    put(&mut h, CE_OBJECT, &obj.1.to_le_bytes());
    put(&mut h, CE_VERSION, &e.version.to_le_bytes());
    put(&mut h, CE_ADDR, &e.addr.to_le_bytes());
    put(&mut h, CE_LEN, &e.len.to_le_bytes());
    put(&mut h, CE_PIECES, &(pieces as u32).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(dkey);
    out.extend_from_slice(akey);
    out.resize(out.len().div_ceil(8) * 8, 0);
    for (start, p) in e.extents.iter().flat_map(|m| m.iter()) {
        let mut b = [0u8; PIECE_BYTES];
        put(&mut b, 0, &start.to_le_bytes());
        put(&mut b, 8, &p.end.to_le_bytes());
        put(&mut b, 16, &p.rec_addr.to_le_bytes());
        put(&mut b, 24, &p.rec_len.to_le_bytes());
        out.extend_from_slice(&b);
    }
}

/// One decoded entry: object, dkey, akey, entry.
type Decoded<'a> = ((u64, u128), &'a [u8], &'a [u8], Entry);

fn decode_entry(b: &[u8]) -> Option<(Decoded<'_>, usize)> {
    if b.len() < CE_FIXED_BYTES {
        return None;
    }
    let dl = usize::from(get_u16(b, CE_DKEY_LEN));
    let al = usize::from(get_u16(b, CE_AKEY_LEN));
    let pieces = get_u32(b, CE_PIECES) as usize;
    let keys_end = (CE_FIXED_BYTES + dl + al).div_ceil(8) * 8;
    let total = keys_end.checked_add(pieces.checked_mul(PIECE_BYTES)?)?;
    if b.len() < total {
        return None;
    }
    let extents = match b[CE_KIND] {
        KIND_SINGLE => None,
        KIND_ARRAY => {
            let mut m = ExtentMap::new();
            for i in 0..pieces {
                let p = &b[keys_end + i * PIECE_BYTES..];
                let piece = Piece {
                    end: get_u64(p, 8),
                    rec_addr: get_u64(p, 16),
                    rec_len: get_u32(p, 24),
                };
                m.insert(get_u64(p, 0), piece);
            }
            Some(Box::new(m))
        }
        _ => return None,
    };
    let e = Entry {
        version: get_u64(b, CE_VERSION),
        addr: get_u64(b, CE_ADDR),
        len: get_u32(b, CE_LEN),
        extents,
    };
    let obj = (get_u64(b, CE_CONTAINER), get_u128(b, CE_OBJECT));
    let dkey = &b[CE_FIXED_BYTES..CE_FIXED_BYTES + dl];
    let akey = &b[CE_FIXED_BYTES + dl..CE_FIXED_BYTES + dl + al];
    Some(((obj, dkey, akey, e), total))
}

impl Store {
    /// Writes a checkpoint of the index and, once it is durable, lets the log
    /// tail advance to what the cleaner has relocated.
    pub async fn checkpoint(&self) -> Result<CheckpointInfo> {
        let _permit = self
            .checkpoint_lock
            .acquire_permit(1)
            .await
            .map_err(|e| StoreError::Invalid(format!("checkpoint lock: {e}")))?;
        self.check_writable()?;
        let unit = HEADER_UNIT_BYTES as usize;
        let (header, buf, written, exact, cold) = {
            let log = self.log.borrow();
            let replay_start = log.replay_start();
            let cold = log.open_segments(self.geo.segment_bytes).1;
            let mut bufs = self.checkpoint_bufs.borrow_mut();
            let (body, kept) = &mut *bufs;
            body.clear();
            let dir = self.dir.borrow();
            // Exact live bytes per slot, from the same walk.
            let mut exact = vec![0u64; self.geo.slots() as usize];
            dir.for_each(|obj, d, a, e| {
                encode_entry(body, obj, d, a, e);
                self.add_slot_live(&mut exact, e);
            });
            debug_assert_eq!(body.len() as u64, dir.checkpoint_bytes());
            let have = self.geo.checkpoint_bytes - HEADER_UNIT_BYTES;
            if body.len() as u64 > have {
                return Err(StoreError::CheckpointTooLarge {
                    need: body.len() as u64,
                    have,
                });
            }
            let mut header = CheckpointHeader {
                generation: self.checkpoint_generation.get() + 1,
                replay_start,
                log_tail: log.slots.low_addr(self.geo.segment_bytes),
                next_version: self.next_version.get(),
                entry_count: dir.len() as u64,
                body_bytes: body.len() as u64,
                body_crc: crc32fast::hash(body),
                ..CheckpointHeader::default()
            };
            self.damage.borrow().fill(&mut header, self.commit_epoch());
            let bs = self.geo.block_size as usize;
            let len = unit + body.len().div_ceil(bs) * bs;
            let mut buf = self.io_buffer(kept.take(), len)?;
            let out = buf.as_mut_slice();
            header.encode(&mut out[..unit]);
            out[unit..unit + body.len()].copy_from_slice(body);
            // A reused buffer holds an earlier checkpoint's bytes here.
            out[unit + body.len()..].fill(0);
            let written = log.committed_appends;
            drop(dir);
            drop(log);
            self.log.borrow_mut().slots.set_exact(&exact);
            (header, buf, written, exact, cold)
        };
        let area = self.geo.checkpoint_area(header.generation);
        let len = buf.len() as u64;
        match self.chan.write(area, buf).await {
            Ok(buf) if !buf.is_pooled() => self.checkpoint_bufs.borrow_mut().1 = Some(buf),
            Ok(_) => {}
            // The older checkpoint stays the newest valid one (a torn
            // one fails its checks): nothing is lost, so no poison.
            Err(ferrite_bdev::BdevError::NoSpace { op, .. }) => {
                return Err(self.no_space_error(op, area));
            }
            Err(e) => {
                self.set_poison(format!("checkpoint write: {e}"));
                return Err(self.device_error("checkpoint write", e));
            }
        }
        if let Err(e) = self.chan.flush().await {
            self.set_poison(format!("checkpoint flush: {e}"));
            return Err(self.device_error("flush", e));
        }
        // The flush also made every log write completed before it stable.
        self.note_flushed(written);
        self.checkpoint_generation.set(header.generation);
        self.checkpoint_bytes.set(len);
        self.checkpoint_replay_start.set(header.replay_start);
        self.free_dead_slots(&exact, header.replay_start, cold);
        self.counters.borrow_mut().checkpoints += 1;
        Ok(CheckpointInfo {
            generation: header.generation,
            replay_start: header.replay_start,
            log_tail: header.log_tail,
            entries: header.entry_count,
            bytes: len,
        })
    }

    /// Reads one area; `None` unless header and body both check.
    async fn read_area(&self, area: u64) -> Result<Option<(CheckpointHeader, Vec<u8>)>> {
        let unit = HEADER_UNIT_BYTES as usize;
        let off = self.geo.checkpoint_area(area);
        let b = self
            .chan
            .alloc(unit)
            .map_err(|e| self.device_error("alloc", e))?;
        let b = self
            .chan
            .read(off, b)
            .await
            .map_err(|e| self.device_error("checkpoint read", e))?;
        if let Some(format) = CheckpointHeader::newer_format(b.as_slice()) {
            return Err(StoreError::Layout {
                device: self.device.to_string(),
                reason: format!(
                    "checkpoint area {area} holds format {format}, newer than this engine \
                     reads (format {CHECKPOINT_FORMAT_VERSION}): open it with a newer ferrite-engine"
                ),
            });
        }
        let Some(h) = CheckpointHeader::decode(b.as_slice()) else {
            return Ok(None);
        };
        if h.body_bytes > self.geo.checkpoint_bytes - HEADER_UNIT_BYTES {
            return Ok(None);
        }
        let bs = u64::from(self.geo.block_size);
        let len = h.body_bytes.div_ceil(bs) * bs;
        let mut body = Vec::new();
        if len > 0 {
            let buf = self
                .chan
                .alloc(len as usize)
                .map_err(|e| self.device_error("alloc", e))?;
            let buf = self
                .chan
                .read(off + HEADER_UNIT_BYTES, buf)
                .await
                .map_err(|e| self.device_error("checkpoint read", e))?;
            body = buf.as_slice()[..h.body_bytes as usize].to_vec();
        }
        if crc32fast::hash(&body) != h.body_crc {
            tracing::warn!(device = %self.device, area, "checkpoint body checksum mismatch; ignored");
            return Ok(None);
        }
        Ok(Some((h, body)))
    }

    /// Loads the newest valid checkpoint into the index.
    pub(crate) async fn load_checkpoint(&self) -> Result<Option<CheckpointHeader>> {
        let a = self.read_area(0).await?;
        let b = self.read_area(1).await?;
        let best = match (a, b) {
            (Some(x), Some(y)) => Some(if x.0.generation >= y.0.generation {
                x
            } else {
                y
            }),
            (x, y) => x.or(y),
        };
        let Some((h, body)) = best else {
            return Ok(None);
        };
        let mut at = 0usize;
        for _ in 0..h.entry_count {
            let Some(((obj, d, a, e), n)) = decode_entry(&body[at..]) else {
                return Err(StoreError::Layout {
                    device: self.device.clone(),
                    reason: format!("checkpoint {} entry at {at} is malformed", h.generation),
                });
            };
            self.index_loaded(&RecordKey::new(obj.0, obj.1, d, a), e)?;
            at += n;
        }
        self.checkpoint_generation.set(h.generation);
        *self.damage.borrow_mut() = super::damage::Damage::from_checkpoint(&h);
        Ok(Some(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_roundtrip() {
        let mut m = ExtentMap::new();
        m.insert(
            10,
            Piece {
                end: 20,
                rec_addr: 4096,
                rec_len: 96,
            },
        );
        let array = Entry {
            version: 9,
            addr: 4096,
            len: 96,
            extents: Some(Box::new(m)),
        };
        let single = Entry {
            version: 3,
            addr: 8,
            len: 80,
            extents: None,
        };
        let mut out = Vec::new();
        encode_entry(&mut out, (1, 2), b"dk", b"akey", &array);
        encode_entry(&mut out, (1, 3), b"", b"a", &single);
        let (one, n) = decode_entry(&out).unwrap();
        assert_eq!((one.0, one.1, one.2), ((1, 2), &b"dk"[..], &b"akey"[..]));
        assert_eq!(one.3, array);
        let (two, m) = decode_entry(&out[n..]).unwrap();
        assert_eq!(two.3, single);
        assert_eq!(n + m, out.len());
        assert!(decode_entry(&out[..n - 1]).is_none());
    }
}
