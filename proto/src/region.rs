//! Descriptors of registered memory regions, as handed to clients at the
//! handshake. 40 bytes each, little-endian (see `FORMAT.md`).
//!
//! A target exports two regions: its bucket array (`RegionKind::Buckets`:
//! `param` = number of main-area buckets (1 to 2^32 − 1); overflow buckets
//! follow them) and its record log ring (`RegionKind::Log`: `param` = ring
//! bytes; the record at log address `a` starts at ring offset `a % param` and
//! never wraps).

use crate::FormatError;

pub const DESCRIPTOR_BYTES: usize = 40;

/// Which transport serves one-sided reads of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Provider {
    Shm = 1,
    Tcp = 2,
    Verbs = 3,
}

/// What a region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RegionKind {
    Buckets = 1,
    Log = 2,
}

/// Everything a client needs to read a region one-sided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionDescriptor {
    pub provider: Provider,
    pub kind: RegionKind,
    pub target: u16,
    pub region_id: u32,
    pub length: u64,
    pub param: u64,
    /// Provider-specific key: verbs rkey, tcp token; 0 for shm.
    pub access_key: u64,
    /// Provider-specific base address: verbs remote address; else 0.
    pub remote_addr: u64,
}

impl RegionDescriptor {
    pub fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        b[0] = self.provider as u8;
        b[1] = self.kind as u8;
        b[2..4].copy_from_slice(&self.target.to_le_bytes());
        b[4..8].copy_from_slice(&self.region_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.length.to_le_bytes());
        b[16..24].copy_from_slice(&self.param.to_le_bytes());
        b[24..32].copy_from_slice(&self.access_key.to_le_bytes());
        b[32..40].copy_from_slice(&self.remote_addr.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < DESCRIPTOR_BYTES {
            return Err(FormatError::Short {
                what: "region descriptor",
                need: DESCRIPTOR_BYTES,
                have: b.len(),
            });
        }
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let provider = match b[0] {
            1 => Provider::Shm,
            2 => Provider::Tcp,
            3 => Provider::Verbs,
            v => return Err(range("provider", u64::from(v))),
        };
        let kind = match b[1] {
            1 => RegionKind::Buckets,
            2 => RegionKind::Log,
            v => return Err(range("kind", u64::from(v))),
        };
        let d = Self {
            provider,
            kind,
            target: u16::from_le_bytes([b[2], b[3]]),
            region_id: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            length: u64_at(8),
            param: u64_at(16),
            access_key: u64_at(24),
            remote_addr: u64_at(32),
        };
        d.validate()?;
        Ok(d)
    }

    /// Checks that `param` is consistent with `length` for the kind.
    pub fn validate(&self) -> Result<(), FormatError> {
        match self.kind {
            RegionKind::Buckets => {
                let main_bytes = self.param.checked_mul(crate::bucket::BUCKET_BYTES as u64);
                let count_ok = (1..=u64::from(u32::MAX)).contains(&self.param);
                if !count_ok || main_bytes.is_none_or(|m| m > self.length) {
                    return Err(range("param (bucket count)", self.param));
                }
            }
            RegionKind::Log => {
                if self.param == 0 || self.param > self.length || self.param % 8 != 0 {
                    return Err(range("param (ring bytes)", self.param));
                }
            }
        }
        Ok(())
    }
}

fn range(field: &'static str, value: u64) -> FormatError {
    FormatError::Range {
        what: "region descriptor",
        field,
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let d = RegionDescriptor {
            provider: Provider::Tcp,
            kind: RegionKind::Buckets,
            target: 3,
            region_id: 7,
            length: 64 * 1024,
            param: 512,
            access_key: 0xfeed,
            remote_addr: 0,
        };
        assert_eq!(RegionDescriptor::decode(&d.encode()), Ok(d));
    }

    #[test]
    fn bad_bytes_are_refused() {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        assert!(RegionDescriptor::decode(&b).is_err());
        b[0] = 1;
        b[1] = 2;
        assert!(RegionDescriptor::decode(&b).is_err(), "zero ring size");
        assert!(RegionDescriptor::decode(&b[..10]).is_err());
    }
}
