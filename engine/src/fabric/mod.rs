//! The fabric: registered memory regions and the providers that let clients
//! read them one-sided, without the store (and for `shm`, without the
//! engine's CPU at all).
//!
//! A provider implements [`Fabric`]: [`Fabric::register`] takes a region and
//! a descriptor with the provider-neutral fields filled in (kind, target,
//! region id, length, param) and returns the descriptor a client needs,
//! with the provider, the `access_key` (tcp: a read token; verbs: the rkey)
//! and the `remote_addr` (verbs: the registered virtual address). A `verbs`
//! provider fits the same trait: `register` is `ibv_reg_mr`.
//!
//! ```
//! use std::sync::Arc;
//! use ferrite_engine::fabric::{Fabric, TcpFabric};
//! use ferrite_engine::region::Region;
//! use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};
//!
//! let region = Arc::new(Region::new(3, "doc", 4096).unwrap());
//! // SAFETY: 4096 bytes mapped, no other writer.
//! unsafe { region.as_ptr().add(8).write(0xab) };
//! let fabric = TcpFabric::default();
//! let template = RegionDescriptor {
//!     provider: Provider::Tcp, kind: RegionKind::Log, target: 0, region_id: 3,
//!     length: 4096, param: 4096, access_key: 0, remote_addr: 0,
//! };
//! let d = fabric.register(region, template).unwrap();
//! assert_ne!(d.access_key, 0);
//! assert_eq!(fabric.read(3, d.access_key, 8, 1).unwrap(), vec![0xab]);
//! assert!(fabric.read(3, d.access_key ^ 1, 8, 1).is_err(), "wrong key");
//! ```

mod shm;
mod tcp;
#[cfg(feature = "rdma")]
pub mod verbs;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ferrite_proto::region::{Provider, RegionDescriptor};

use crate::region::Region;
use crate::server::ServerError;

pub use shm::ShmFabric;
pub use tcp::TcpFabric;

/// A provider of one-sided reads of registered regions.
pub trait Fabric: Send + Sync {
    /// Which provider this is (goes into every descriptor it returns).
    fn provider(&self) -> Provider;

    /// Registers `region` and returns its completed descriptor. `template`
    /// carries kind, target, region id, length and param; the provider sets
    /// `provider`, `access_key` and `remote_addr`. The region stays
    /// registered (and alive) until [`Fabric::deregister`].
    fn register(
        &self,
        region: Arc<Region>,
        template: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError>;

    /// Drops the registration of `region_id`; reads of it fail from now on.
    fn deregister(&self, region_id: u32) -> Result<(), ServerError>;

    /// Descriptors of every registered region, in region id order.
    fn descriptors(&self) -> Vec<RegionDescriptor>;
}

/// Registered regions by id, shared by the providers here.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    regions: Mutex<BTreeMap<u32, (Arc<Region>, RegionDescriptor)>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, (Arc<Region>, RegionDescriptor)>> {
        // A panic while holding the lock leaves the map consistent (every
        // change is one insert or remove), so a poisoned lock is still usable.
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn insert(
        &self,
        region: Arc<Region>,
        descriptor: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError> {
        if descriptor.region_id != region.id() || descriptor.length > region.len() as u64 {
            return Err(ServerError::Fabric(format!(
                "descriptor of region {} (length {}) does not match region {} ({} bytes)",
                descriptor.region_id,
                descriptor.length,
                region.id(),
                region.len()
            )));
        }
        descriptor
            .validate()
            .map_err(|e| ServerError::Fabric(e.to_string()))?;
        let mut map = self.lock();
        if map.contains_key(&descriptor.region_id) {
            return Err(ServerError::Fabric(format!(
                "region {} is already registered",
                descriptor.region_id
            )));
        }
        map.insert(descriptor.region_id, (region, descriptor));
        Ok(descriptor)
    }

    pub(crate) fn remove(&self, region_id: u32) -> Result<(), ServerError> {
        match self.lock().remove(&region_id) {
            Some(_) => Ok(()),
            None => Err(ServerError::Fabric(format!(
                "region {region_id} is not registered"
            ))),
        }
    }

    pub(crate) fn get(&self, region_id: u32) -> Option<(Arc<Region>, RegionDescriptor)> {
        self.lock().get(&region_id).cloned()
    }

    pub(crate) fn all(&self) -> Vec<(Arc<Region>, RegionDescriptor)> {
        self.lock().values().cloned().collect()
    }
}

/// Copies `len` bytes at `offset` out of a region that another thread may be
/// writing, with aligned 64-bit atomic loads (the engine's writers publish
/// buckets with 64-bit atomic stores; torn records are caught by their CRC).
pub(crate) fn copy_from_region(region: &Region, offset: usize, len: usize) -> Option<Vec<u8>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let end = offset.checked_add(len)?;
    if end > region.len() {
        return None;
    }
    let first_word = offset / 8;
    let last_word = end.div_ceil(8);
    let mut words = Vec::with_capacity(last_word - first_word);
    let base = region.as_ptr().cast::<u64>();
    for w in first_word..last_word {
        // SAFETY: the region is mapped for `len()` bytes, page aligned, and
        // `w * 8 + 8 <= round_up(end, 8) <= len()` since the length is a
        // multiple of the page size. AtomicU64 has the alignment of u64.
        let word = unsafe { AtomicU64::from_ptr(base.add(w)) }.load(Ordering::Acquire);
        words.push(word);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let skip = offset - first_word * 8;
    Some(bytes[skip..skip + len].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::region::RegionKind;

    fn template(id: u32, len: u64) -> RegionDescriptor {
        RegionDescriptor {
            provider: Provider::Shm,
            kind: RegionKind::Log,
            target: 0,
            region_id: id,
            length: len,
            param: len,
            access_key: 0,
            remote_addr: 0,
        }
    }

    #[test]
    fn unaligned_copies_match_memory() {
        let r = Region::new(1, "copy", 4096).unwrap();
        for i in 0..64u8 {
            // SAFETY: within the 4096-byte mapping, single writer.
            unsafe { r.as_ptr().add(usize::from(i)).write(i) };
        }
        assert_eq!(copy_from_region(&r, 3, 5).unwrap(), vec![3, 4, 5, 6, 7]);
        assert_eq!(copy_from_region(&r, 0, 0).unwrap(), Vec::<u8>::new());
        assert!(copy_from_region(&r, 4090, 7).is_none());
        assert!(copy_from_region(&r, usize::MAX, 2).is_none());
        assert_eq!(copy_from_region(&r, 4095, 1).unwrap(), vec![0]);
    }

    #[test]
    fn registry_refuses_mismatch_and_duplicates() {
        let reg = Registry::default();
        let r = Arc::new(Region::new(5, "reg", 4096).unwrap());
        assert!(
            reg.insert(r.clone(), template(6, 4096)).is_err(),
            "wrong id"
        );
        assert!(
            reg.insert(r.clone(), template(5, 8192)).is_err(),
            "too long"
        );
        reg.insert(r.clone(), template(5, 4096)).unwrap();
        assert!(reg.insert(r, template(5, 4096)).is_err(), "duplicate");
        assert_eq!(reg.all().len(), 1);
        reg.remove(5).unwrap();
        assert!(reg.remove(5).is_err());
    }
}
