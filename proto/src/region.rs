//! Descriptors of registered memory regions, as handed to clients at the
//! handshake. 40 bytes each, little-endian (see `FORMAT.md`).
//!
//! A target exports two regions: its bucket array (`RegionKind::Buckets`:
//! `param` = number of main-area buckets (1 to 2^32 − 1); overflow buckets
//! follow them) and its record log ring (`RegionKind::Log`: `param` = ring
//! bytes; the record at log address `a` starts at ring offset `a % param` and
//! never wraps). A target whose device is a regular file may also export, over
//! shm only, the log area of that file (`RegionKind::DeviceLog`: `param` =
//! device log bytes; the record at log address `a` starts at region offset
//! `a % param`; `remote_addr` = the file offset where the region starts,
//! a multiple of [`DEVICE_LOG_ALIGN`]): a record that has left the ring is
//! still read one-sided there.

use crate::FormatError;

pub const DESCRIPTOR_BYTES: usize = 40;
/// A device log region's file offset (`remote_addr`) is a multiple of this
/// (the page size: a client maps the file from there).
pub const DEVICE_LOG_ALIGN: u64 = 4096;

pub const OFF_PROVIDER: usize = 0;
pub const OFF_KIND: usize = OFF_PROVIDER + 1;
pub const OFF_TARGET: usize = OFF_KIND + 1;
pub const OFF_REGION_ID: usize = OFF_TARGET + 2;
pub const OFF_LENGTH: usize = OFF_REGION_ID + 4;
pub const OFF_PARAM: usize = OFF_LENGTH + 8;
pub const OFF_ACCESS_KEY: usize = OFF_PARAM + 8;
pub const OFF_REMOTE_ADDR: usize = OFF_ACCESS_KEY + 8;
const _: () = assert!(OFF_REMOTE_ADDR + 8 == DESCRIPTOR_BYTES);
const _: () = assert!(DEVICE_LOG_ALIGN.is_power_of_two());

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
    /// The log area of the target's device file, read-only (shm only).
    DeviceLog = 3,
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
    /// Provider-specific base address: verbs remote address; for a
    /// [`RegionKind::DeviceLog`] region, the offset in the device file where
    /// the region starts; else 0.
    pub remote_addr: u64,
}

impl RegionDescriptor {
    pub fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        b[OFF_PROVIDER] = self.provider as u8;
        b[OFF_KIND] = self.kind as u8;
        b[OFF_TARGET..OFF_REGION_ID].copy_from_slice(&self.target.to_le_bytes());
        b[OFF_REGION_ID..OFF_LENGTH].copy_from_slice(&self.region_id.to_le_bytes());
        b[OFF_LENGTH..OFF_PARAM].copy_from_slice(&self.length.to_le_bytes());
        b[OFF_PARAM..OFF_ACCESS_KEY].copy_from_slice(&self.param.to_le_bytes());
        b[OFF_ACCESS_KEY..OFF_REMOTE_ADDR].copy_from_slice(&self.access_key.to_le_bytes());
        b[OFF_REMOTE_ADDR..DESCRIPTOR_BYTES].copy_from_slice(&self.remote_addr.to_le_bytes());
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
        let provider = match b[OFF_PROVIDER] {
            1 => Provider::Shm,
            2 => Provider::Tcp,
            3 => Provider::Verbs,
            v => return Err(range("provider", u64::from(v))),
        };
        let kind = match b[OFF_KIND] {
            1 => RegionKind::Buckets,
            2 => RegionKind::Log,
            3 => RegionKind::DeviceLog,
            v => return Err(range("kind", u64::from(v))),
        };
        let d = Self {
            provider,
            kind,
            target: u16::from_le_bytes([b[OFF_TARGET], b[OFF_TARGET + 1]]),
            region_id: u32::from_le_bytes([
                b[OFF_REGION_ID],
                b[OFF_REGION_ID + 1],
                b[OFF_REGION_ID + 2],
                b[OFF_REGION_ID + 3],
            ]),
            length: u64_at(OFF_LENGTH),
            param: u64_at(OFF_PARAM),
            access_key: u64_at(OFF_ACCESS_KEY),
            remote_addr: u64_at(OFF_REMOTE_ADDR),
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
            RegionKind::DeviceLog => {
                if self.provider != Provider::Shm {
                    return Err(range("provider of a device log", self.provider as u64));
                }
                if self.param == 0 || self.param > self.length || self.param % 8 != 0 {
                    return Err(range("param (device log bytes)", self.param));
                }
                let end = self.remote_addr.checked_add(self.length);
                if self.remote_addr % DEVICE_LOG_ALIGN != 0 || end.is_none() {
                    return Err(range("remote_addr (file offset)", self.remote_addr));
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
        b[1] = 4;
        assert!(RegionDescriptor::decode(&b).is_err(), "unknown kind");
    }

    fn device_log() -> RegionDescriptor {
        RegionDescriptor {
            provider: Provider::Shm,
            kind: RegionKind::DeviceLog,
            target: 1,
            region_id: 5,
            length: 8 << 20,
            param: 8 << 20,
            access_key: 0,
            remote_addr: 1 << 20,
        }
    }

    #[test]
    fn device_log_bytes_are_as_documented() {
        let d = device_log();
        let b = d.encode();
        assert_eq!(&b[..4], &[1, 3, 1, 0], "provider shm, kind 3, target 1");
        assert_eq!(&b[4..8], &5u32.to_le_bytes());
        assert_eq!(&b[8..16], &(8u64 << 20).to_le_bytes(), "length");
        assert_eq!(&b[16..24], &(8u64 << 20).to_le_bytes(), "param");
        assert_eq!(&b[24..32], &[0; 8], "access_key");
        assert_eq!(&b[32..40], &(1u64 << 20).to_le_bytes(), "file offset");
        assert_eq!(RegionDescriptor::decode(&b), Ok(d));
    }

    #[test]
    fn bad_device_logs_are_refused() {
        let bad = [
            RegionDescriptor {
                provider: Provider::Tcp,
                ..device_log()
            },
            RegionDescriptor {
                remote_addr: 4095,
                ..device_log()
            },
            RegionDescriptor {
                remote_addr: u64::MAX - 4095,
                ..device_log()
            },
            RegionDescriptor {
                param: (8 << 20) + 8,
                ..device_log()
            },
            RegionDescriptor {
                param: 12,
                ..device_log()
            },
        ];
        for d in bad {
            assert!(RegionDescriptor::decode(&d.encode()).is_err(), "{d:?}");
        }
    }
}
