//! The `tcp` provider: one-sided reads over the RPC connection, served by the
//! connection's network task straight from the region memory — the store is
//! not involved. Each region gets a random read token (`access_key`) that a
//! `RegionRead` must present.

use std::sync::Arc;

use ferrite_proto::region::{Provider, RegionDescriptor};
use rand::Rng;

use super::{copy_from_region, Fabric, Registry};
use crate::region::Region;
use crate::server::ServerError;

/// Why a region read was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionReadRefused(pub String);

/// Regions readable through `RegionRead` requests.
#[derive(Debug, Default)]
pub struct TcpFabric {
    registry: Registry,
}

impl TcpFabric {
    /// Copies `len` bytes at `offset` of region `region_id`, after checking
    /// the access key and the bounds.
    pub fn read(
        &self,
        region_id: u32,
        access_key: u64,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, RegionReadRefused> {
        let (region, d) = self
            .registry
            .get(region_id)
            .ok_or_else(|| RegionReadRefused(format!("region {region_id} is not exported")))?;
        if d.access_key != access_key {
            return Err(RegionReadRefused(format!(
                "wrong access key for region {region_id}"
            )));
        }
        let out_of_bounds = || {
            RegionReadRefused(format!(
                "read of {len} bytes at {offset} is outside region {region_id} ({} bytes)",
                d.length
            ))
        };
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|end| end > d.length)
        {
            return Err(out_of_bounds());
        }
        let offset = usize::try_from(offset).map_err(|_| out_of_bounds())?;
        copy_from_region(&region, offset, len as usize).ok_or_else(out_of_bounds)
    }
}

impl Fabric for TcpFabric {
    fn provider(&self) -> Provider {
        Provider::Tcp
    }

    fn register(
        &self,
        region: Arc<Region>,
        template: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError> {
        let access_key = rand::thread_rng().gen_range(1..=u64::MAX);
        let d = RegionDescriptor {
            provider: Provider::Tcp,
            access_key,
            remote_addr: 0,
            ..template
        };
        self.registry.insert(region, d)
    }

    fn deregister(&self, region_id: u32) -> Result<(), ServerError> {
        self.registry.remove(region_id)
    }

    fn descriptors(&self) -> Vec<RegionDescriptor> {
        self.registry.all().into_iter().map(|(_, d)| d).collect()
    }
}
