//! The `shm` provider: regions are memory files handed to local clients over
//! the Unix socket (`SCM_RIGHTS`), which map them read-only. A one-sided read
//! is a load from the client's mapping; the engine does nothing per read.
//! Every descriptor handed out is read-only ([`ShmExport::raw_fd`]): a
//! client can map it for reading and do nothing else with it.
//!
//! Besides memory regions it exports files: the log area of a target's
//! device file (`RegionKind::DeviceLog`), passed as a read-only descriptor
//! that clients map the same way, so that records that have left the
//! memory ring are read one-sided too.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};

use super::{Fabric, Registry};
use crate::region::Region;
use crate::server::ServerError;

/// Regions exported as shared memory files.
#[derive(Debug, Default)]
pub struct ShmFabric {
    registry: Registry,
    /// Exported files (device logs) by region id.
    files: Mutex<BTreeMap<u32, (Arc<std::fs::File>, RegionDescriptor)>>,
}

/// What backs one exported region: a memory region or a read-only file.
#[derive(Debug, Clone)]
pub enum ShmExport {
    Region(Arc<Region>),
    File(Arc<std::fs::File>),
}

impl ShmExport {
    /// The descriptor to send (alive as long as `self`): read-only, a
    /// memory region's [`Region::client_fd`] or the file opened read-only.
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Self::Region(r) => r.client_fd().as_raw_fd(),
            Self::File(f) => f.as_raw_fd(),
        }
    }
}

impl ShmFabric {
    /// Every exported region with its descriptor, in region id order: the
    /// fds to send with a Welcome (one per descriptor, same order).
    pub fn exports(&self) -> Vec<(ShmExport, RegionDescriptor)> {
        let mut all: Vec<_> = (self.registry.all().into_iter())
            .map(|(r, d)| (ShmExport::Region(r), d))
            .collect();
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        all.extend((files.values()).map(|(f, d)| (ShmExport::File(Arc::clone(f)), *d)));
        all.sort_by_key(|(_, d)| d.region_id);
        all
    }

    /// Exports `file` (opened read-only) as the device log region
    /// `descriptor` (kind `DeviceLog`; its file range must lie inside the
    /// file). Region ids are shared with memory regions.
    pub fn register_file(
        &self,
        file: Arc<std::fs::File>,
        descriptor: RegionDescriptor,
    ) -> Result<RegionDescriptor, ServerError> {
        let bad = |why: String| ServerError::Fabric(format!("device log region: {why}"));
        descriptor.validate().map_err(|e| bad(e.to_string()))?;
        if descriptor.kind != RegionKind::DeviceLog || descriptor.provider != Provider::Shm {
            return Err(bad(format!("{descriptor:?} is not an shm device log")));
        }
        // SAFETY: F_GETFL on a descriptor the file keeps open.
        let mode = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if mode < 0 || mode & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(bad(format!(
                "{descriptor:?}: the file is not opened read-only (clients get this descriptor)"
            )));
        }
        let size = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        if descriptor.remote_addr + descriptor.length > size {
            return Err(bad(format!(
                "{descriptor:?} is past the file's end ({size})"
            )));
        }
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if files.contains_key(&descriptor.region_id)
            || self.registry.get(descriptor.region_id).is_some()
        {
            return Err(bad(format!(
                "region {} is already registered",
                descriptor.region_id
            )));
        }
        files.insert(descriptor.region_id, (file, descriptor));
        Ok(descriptor)
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
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if files.contains_key(&d.region_id) {
            return Err(ServerError::Fabric(format!(
                "region {} is already registered",
                d.region_id
            )));
        }
        self.registry.insert(region, d)
    }

    fn deregister(&self, region_id: u32) -> Result<(), ServerError> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if files.remove(&region_id).is_some() {
            return Ok(());
        }
        self.registry.remove(region_id)
    }

    fn descriptors(&self) -> Vec<RegionDescriptor> {
        self.exports().into_iter().map(|(_, d)| d).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn device_log(id: u32, offset: u64, len: u64) -> RegionDescriptor {
        RegionDescriptor {
            provider: Provider::Shm,
            kind: RegionKind::DeviceLog,
            target: 0,
            region_id: id,
            length: len,
            param: len,
            access_key: 0,
            remote_addr: offset,
        }
    }

    /// A file of 64 KiB of zeros, and the same file opened read-only.
    fn file_pair() -> (std::fs::File, std::fs::File) {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[0u8; 64 << 10]).unwrap();
        let path = format!("/proc/self/fd/{}", f.as_raw_fd());
        let ro = std::fs::File::open(path).unwrap();
        (f, ro)
    }

    /// A device log is exported only from a read-only descriptor, and
    /// memory regions are sent by their read-only descriptor.
    #[test]
    fn only_read_only_descriptors_are_exported() {
        let fabric = ShmFabric::default();
        let (rw, ro) = file_pair();
        let err = fabric
            .register_file(Arc::new(rw), device_log(0, 0, 4096))
            .unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        fabric
            .register_file(Arc::new(ro), device_log(0, 0, 4096))
            .unwrap();
        let region = Arc::new(Region::new(1, "t", 4096).unwrap());
        let log = RegionDescriptor {
            kind: RegionKind::Log,
            ..device_log(1, 0, 4096)
        };
        fabric.register(region.clone(), log).unwrap();
        for (export, _) in fabric.exports() {
            // SAFETY: F_GETFL on a live descriptor.
            let mode = unsafe { libc::fcntl(export.raw_fd(), libc::F_GETFL) };
            assert_eq!(mode & libc::O_ACCMODE, libc::O_RDONLY);
        }
    }

    #[test]
    fn device_logs_are_exported_in_id_order_and_checked() {
        let fabric = ShmFabric::default();
        let f = Arc::new(file_pair().1);
        let region = Arc::new(Region::new(1, "t", 4096).unwrap());
        let log = RegionDescriptor {
            kind: RegionKind::Log,
            ..device_log(1, 0, 4096)
        };
        fabric.register(region.clone(), log).unwrap();
        let past_end = device_log(2, 4096, 64 << 10);
        assert!(fabric.register_file(f.clone(), past_end).is_err());
        assert!(
            fabric
                .register_file(f.clone(), device_log(1, 0, 4096))
                .is_err(),
            "id taken"
        );
        assert!(
            fabric.register_file(f.clone(), log).is_err(),
            "not a device log"
        );
        fabric
            .register_file(f.clone(), device_log(0, 4096, 60 << 10))
            .unwrap();
        assert!(
            fabric.register(region, device_log(0, 0, 4096)).is_err(),
            "id taken"
        );
        let ids: Vec<_> = fabric
            .exports()
            .iter()
            .map(|(e, d)| (d.region_id, e.raw_fd()))
            .collect();
        assert_eq!(
            ids,
            vec![(0, f.as_raw_fd()), (1, fabric.exports()[1].0.raw_fd())]
        );
        assert_eq!(fabric.descriptors()[0].kind, RegionKind::DeviceLog);
        fabric.deregister(0).unwrap();
        assert_eq!(fabric.descriptors().len(), 1);
    }
}
