//! The `verbs` provider (cargo feature `rdma`): regions registered with an
//! RDMA device (`ibv_reg_mr`, remote read only) so that clients on other
//! hosts read buckets and records with RDMA READ, without the engine's CPU.
//!
//! - [`Device`] opens the device a [`DeviceSelector`] names (device name,
//!   bound network interface, or IP address) with a protection domain.
//! - [`VerbsFabric`] implements [`Fabric`]: each region is registered with
//!   `IBV_ACCESS_REMOTE_READ` only (remote read needs no local write
//!   access); its descriptor carries the rkey as `access_key` and the
//!   region's virtual address as `remote_addr`.
//! - Connections: the RPC protocol has no field for queue pair info, so the
//!   engine runs a small TCP side channel ([`serve`]): the client sends its
//!   32-byte [`QpInfo`], the engine creates an RC queue pair, moves it to
//!   RTS, answers with its own `QpInfo`, a u32 LE descriptor count and the
//!   40-byte descriptors, and keeps the queue pair until the client closes
//!   the socket.
//! - [`RcQp`] is the shared queue pair code (client and engine): INIT →
//!   RTR → RTS with the RoCE v2 GID, linked RDMA READ lists, polling.
//!
//! With no device the error is [`NO_DEVICE`]:
//!
//! ```
//! use ferrite_engine::fabric::verbs::{DeviceSelector, VerbsFabric, NO_DEVICE};
//! match VerbsFabric::open(&DeviceSelector::Any) {
//!     Err(e) => assert!(e.to_string().contains("RDMA device")),
//!     Ok(f) => assert!(!f.device().name().is_empty()),
//! }
//! # let _ = NO_DEVICE;
//! ```

mod device;
mod qp;
mod side;
mod start;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ferrite_proto::region::{Provider, RegionDescriptor};
use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use super::{Fabric, Registry};
use crate::region::Region;
use crate::server::ServerError;

pub use device::{gid_of, sysfs_gid_text, Device, DeviceSelector, NO_DEVICE};
pub use qp::{
    QpInfo, QpState, RcQp, ReadWr, WorkCompletion, ACK_TIMEOUT_EXPONENT, BATCH_MAX, QP_INFO_BYTES,
    RETRY_COUNT,
};
pub use side::{exchange, serve, SideChannel};
pub use start::{start_for_engine, RunningVerbs, VerbsSpec, VerbsStart, DEFAULT_SIDE_LISTEN};

/// Access of a local buffer that RDMA READs land in.
pub const ACCESS_LOCAL_WRITE: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
/// Access of an exported region: remote read only.
pub const ACCESS_REMOTE_READ: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;

/// A memory registration; deregistered on drop.
#[derive(Debug)]
pub struct MemoryRegion {
    mr: *mut ibv_mr,
    _device: Arc<Device>,
}

// SAFETY: an MR handle may be used and freed from any thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: only lkey/rkey are read through &self.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` with `access` (`ibv_access_flags`).
    ///
    /// # Safety
    /// The memory must stay mapped until this value is dropped.
    pub unsafe fn register(
        device: Arc<Device>,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Self, ServerError> {
        // SAFETY: pd is valid; the caller keeps the memory mapped.
        let mr = unsafe { ibv_reg_mr(device.pd(), addr.cast(), len, access as i32) };
        if mr.is_null() {
            return Err(ServerError::Fabric(format!(
                "ibv_reg_mr of {len} bytes on {}: {}",
                device.name(),
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self {
            mr,
            _device: device,
        })
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// Regions registered with one RDMA device.
#[derive(Debug)]
pub struct VerbsFabric {
    device: Arc<Device>,
    registry: Registry,
    mrs: Mutex<BTreeMap<u32, MemoryRegion>>,
}

impl VerbsFabric {
    /// Opens the device `selector` names.
    pub fn open(selector: &DeviceSelector) -> Result<Self, ServerError> {
        Ok(Self {
            device: Arc::new(Device::open(selector)?),
            registry: Registry::default(),
            mrs: Mutex::new(BTreeMap::new()),
        })
    }
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Fabric for VerbsFabric {
    fn provider(&self) -> Provider {
        Provider::Verbs
    }

    fn register(
        &self,
        region: Arc<Region>,
        template: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError> {
        let len = usize::try_from(template.length)
            .ok()
            .filter(|l| *l <= region.len())
            .ok_or_else(|| {
                ServerError::Fabric(format!("region {} too long", template.region_id))
            })?;
        let access = ACCESS_REMOTE_READ;
        // SAFETY: the region stays mapped while the registry holds its Arc,
        // and the MR is dropped (deregister) before the registry entry.
        let mr =
            unsafe { MemoryRegion::register(self.device.clone(), region.as_ptr(), len, access)? };
        let d = RegionDescriptor {
            provider: Provider::Verbs,
            access_key: u64::from(mr.rkey()),
            remote_addr: region.as_ptr() as u64,
            ..template
        };
        let d = self.registry.insert(region, d)?;
        let mut mrs = self.mrs.lock().unwrap_or_else(|p| p.into_inner());
        mrs.insert(d.region_id, mr);
        Ok(d)
    }

    fn deregister(&self, region_id: u32) -> Result<(), ServerError> {
        let mr = self
            .mrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&region_id);
        drop(mr);
        self.registry.remove(region_id)
    }

    fn descriptors(&self) -> Vec<RegionDescriptor> {
        self.registry.all().into_iter().map(|(_, d)| d).collect()
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        // Memory registrations go before the regions they cover.
        self.mrs.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
