//! The `shm` provider: regions are memory files handed to local clients over
//! the Unix socket (`SCM_RIGHTS`), which map them read-only. A one-sided read
//! is a load from the client's mapping; the engine does nothing per read.

use std::sync::Arc;

use ferrite_proto::region::{Provider, RegionDescriptor};

use super::{Fabric, Registry};
use crate::region::Region;
use crate::server::ServerError;

/// Regions exported as shared memory files.
#[derive(Debug, Default)]
pub struct ShmFabric {
    registry: Registry,
}

impl ShmFabric {
    /// Every registered region with its descriptor, in region id order: the
    /// fds to send with a Welcome (one per descriptor, same order).
    pub fn exports(&self) -> Vec<(Arc<Region>, RegionDescriptor)> {
        self.registry.all()
    }
}

impl Fabric for ShmFabric {
    fn provider(&self) -> Provider {
        Provider::Shm
    }

    fn register(
        &self,
        region: Arc<Region>,
        template: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError> {
        let d = RegionDescriptor {
            provider: Provider::Shm,
            access_key: 0,
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
