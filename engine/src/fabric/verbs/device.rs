//! RDMA device discovery and selection, and the opened device (context,
//! protection domain, port, RoCE v2 GID) every queue pair and memory
//! registration of a process hangs off.
//!
//! A device is chosen by a [`DeviceSelector`]: any device, a device name
//! (`rxe1`, `mlx5_0`), the name of the network interface it is bound to
//! (`veth1`, `eth0`), or an IP address one of its GIDs carries
//! (`192.0.2.2`). The GID index used is the one of that address, else the
//! first RoCE v2 GID, else the first non-zero GID.

use std::ffi::CStr;
use std::net::IpAddr;
use std::path::Path;

use rdma_sys::{
    ___ibv_query_port, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_dealloc_pd,
    ibv_device_attr, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid,
    ibv_open_device, ibv_pd, ibv_port_attr, ibv_query_device, ibv_query_gid,
};

use crate::server::ServerError;

/// The message of the error when the machine has no RDMA device.
pub const NO_DEVICE: &str = "no RDMA device: ibv_get_device_list returned 0; use fabric=shm or tcp";

/// Which device to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// The first device with an active port and a usable GID.
    Any,
    /// A device name, or the name of a network interface a device is bound to.
    Name(String),
    /// An address one of the device's GIDs carries.
    Addr(IpAddr),
}

impl DeviceSelector {
    /// `""`/`"auto"` → any; an IP address → by address; else a name.
    ///
    /// ```
    /// use ferrite_engine::fabric::verbs::DeviceSelector;
    /// assert_eq!(DeviceSelector::parse("auto"), DeviceSelector::Any);
    /// assert_eq!(DeviceSelector::parse("rxe1"), DeviceSelector::Name("rxe1".into()));
    /// assert!(matches!(DeviceSelector::parse("192.0.2.2"), DeviceSelector::Addr(_)));
    /// ```
    pub fn parse(text: &str) -> Self {
        match text.trim() {
            "" | "auto" | "any" => Self::Any,
            t => t.parse().map(Self::Addr).unwrap_or(Self::Name(t.into())),
        }
    }
}

/// The 16-byte GID a RoCE device uses for an IP address (IPv4: mapped).
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// An opened device: context, protection domain, the port and GID used.
#[derive(Debug)]
pub struct Device {
    name: String,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    port: u8,
    gid_index: u8,
    gid: [u8; 16],
    lid: u16,
    active_mtu: u32,
    max_rd_atomic: u8,
}

// SAFETY: libibverbs contexts and protection domains may be used from any
// thread (the library locks internally); the pointers are owned by Device
// and freed once in Drop.
unsafe impl Send for Device {}
// SAFETY: as above; Device has no interior state besides the verbs objects.
unsafe impl Sync for Device {}

impl Device {
    /// Opens the device `selector` names. Errors name what was found.
    pub fn open(selector: &DeviceSelector) -> Result<Self, ServerError> {
        let mut n: i32 = 0;
        // SAFETY: n is a valid out pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: list came from ibv_get_device_list.
                unsafe { ibv_free_device_list(list) };
            }
            return Err(ServerError::Fabric(NO_DEVICE.into()));
        }
        let mut found = Vec::new();
        let mut opened = None;
        for i in 0..n as usize {
            // SAFETY: the list holds n device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a listed device; the name is a C string it owns.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            let gid = match pick_gid(&name, selector) {
                Some(g) => g,
                None => {
                    found.push(format!("{name} (does not match)"));
                    continue;
                }
            };
            match Self::open_one(dev, &name, gid) {
                Ok(d) => {
                    opened = Some(d);
                    break;
                }
                Err(e) => found.push(format!("{name} ({e})")),
            }
        }
        // SAFETY: list came from ibv_get_device_list; opened contexts stay valid.
        unsafe { ibv_free_device_list(list) };
        opened.ok_or_else(|| {
            ServerError::Fabric(format!(
                "no usable RDMA device for {selector:?}: found {}; use fabric=shm or tcp",
                found.join(", ")
            ))
        })
    }

    fn open_one(
        dev: *mut rdma_sys::ibv_device,
        name: &str,
        (port, gid_index): (u8, u8),
    ) -> Result<Self, String> {
        // SAFETY: dev is a listed device.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(format!(
                "ibv_open_device: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut d = Self {
            name: name.into(),
            ctx,
            pd: std::ptr::null_mut(),
            port,
            gid_index,
            gid: [0; 16],
            lid: 0,
            active_mtu: 0,
            max_rd_atomic: 1,
        };
        d.query()?;
        // SAFETY: ctx is open.
        d.pd = unsafe { ibv_alloc_pd(ctx) };
        if d.pd.is_null() {
            return Err(format!("ibv_alloc_pd: {}", std::io::Error::last_os_error()));
        }
        Ok(d)
    }

    /// Port attributes, the GID and the device limits (Drop closes `ctx` on error).
    fn query(&mut self) -> Result<(), String> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut port: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; port is a valid out pointer.
        if unsafe { ___ibv_query_port(self.ctx, self.port, &mut port) } != 0 {
            return Err(format!("query port {}", self.port));
        }
        // SAFETY: as above.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; gid is a valid out pointer.
        if unsafe { ibv_query_gid(self.ctx, self.port, i32::from(self.gid_index), &mut gid) } != 0 {
            return Err(format!("query GID {}", self.gid_index));
        }
        // SAFETY: as above.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; attr is a valid out pointer.
        if unsafe { ibv_query_device(self.ctx, &mut attr) } != 0 {
            return Err("query device".into());
        }
        // SAFETY: raw is the byte view of the 16-byte GID union.
        self.gid = unsafe { gid.raw };
        self.lid = port.lid;
        self.active_mtu = port.active_mtu;
        let rd = attr
            .max_qp_rd_atom
            .min(attr.max_qp_init_rd_atom)
            .clamp(1, 16);
        self.max_rd_atomic = u8::try_from(rd).unwrap_or(1);
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub(crate) fn ctx(&self) -> *mut ibv_context {
        self.ctx
    }
    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd
    }
    pub fn port(&self) -> u8 {
        self.port
    }
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }
    pub fn lid(&self) -> u16 {
        self.lid
    }
    /// The port's active MTU as an `ibv_mtu` value (1 = 256 … 5 = 4096).
    pub fn active_mtu(&self) -> u32 {
        self.active_mtu
    }
    /// Outstanding RDMA READs per queue pair the device allows (at most 16).
    pub fn max_rd_atomic(&self) -> u8 {
        self.max_rd_atomic
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: pd and ctx were created by open_one and are freed once;
        // every QP and MR of this device holds an Arc<Device> and is gone.
        unsafe {
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}

/// Port 1 and the GID index to use on device `name` for `selector`, from
/// sysfs (`ports/1/gids`, `gid_attrs/types`, `gid_attrs/ndevs`); `None` when
/// the device does not match.
fn pick_gid(name: &str, selector: &DeviceSelector) -> Option<(u8, u8)> {
    let port = Path::new("/sys/class/infiniband")
        .join(name)
        .join("ports/1");
    let read = |sub: &str, i: u8| {
        std::fs::read_to_string(port.join(sub).join(i.to_string()))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let gids: Vec<(u8, String, String, String)> = (0..=254u8)
        .map(|i| {
            let g = read("gids", i);
            (i, g, read("gid_attrs/types", i), read("gid_attrs/ndevs", i))
        })
        .take_while(|(_, g, _, _)| !g.is_empty())
        .filter(|(_, g, _, _)| g.chars().any(|c| c != '0' && c != ':'))
        .collect();
    let v2_v4 = |(_, g, t, _): &&(u8, String, String, String)| {
        t.contains("v2") && g.starts_with("0000:0000:0000:0000:0000:ffff")
    };
    let chosen = match selector {
        DeviceSelector::Any => gids.iter().find(v2_v4).or(gids.first()),
        DeviceSelector::Name(n) if n == name => gids.iter().find(v2_v4).or(gids.first()),
        DeviceSelector::Name(n) => gids
            .iter()
            .filter(|(_, _, _, dev)| dev == n)
            .find(v2_v4)
            .or_else(|| gids.iter().find(|(_, _, _, dev)| dev == n)),
        DeviceSelector::Addr(a) => {
            let want = sysfs_gid_text(gid_of(*a));
            (gids.iter().filter(|(_, g, _, _)| *g == want))
                .find(|(_, _, t, _)| t.contains("v2"))
                .or_else(|| gids.iter().find(|(_, g, _, _)| *g == want))
        }
    };
    chosen.map(|(i, ..)| (1, *i))
}

/// A GID as sysfs prints it: eight groups of four hex digits.
pub fn sysfs_gid_text(gid: [u8; 16]) -> String {
    let groups: Vec<String> = gid
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect();
    groups.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_here_gives_the_clear_error() {
        // This machine (and CI) has no RDMA device: the error must say so.
        // Where a device exists the open succeeds and the test checks it.
        let kernel_has_none = !Path::new("/sys/class/infiniband").exists();
        match Device::open(&DeviceSelector::Any) {
            Err(ServerError::Fabric(m)) if kernel_has_none => assert_eq!(m, NO_DEVICE),
            Err(ServerError::Fabric(m)) => assert!(
                m == NO_DEVICE || m.starts_with("no usable RDMA device"),
                "unexpected message {m}"
            ),
            Err(e) => panic!("wrong error kind: {e}"),
            Ok(d) => assert!(!d.name().is_empty()),
        }
    }

    #[test]
    fn gids_of_addresses_match_sysfs_text() {
        let g = gid_of("192.0.2.2".parse().unwrap());
        assert_eq!(sysfs_gid_text(g), "0000:0000:0000:0000:0000:ffff:c000:0202");
        let g6 = gid_of("fe80::1".parse().unwrap());
        assert_eq!(
            sysfs_gid_text(g6),
            "fe80:0000:0000:0000:0000:0000:0000:0001"
        );
    }

    #[test]
    fn selectors_parse() {
        assert_eq!(DeviceSelector::parse(""), DeviceSelector::Any);
        assert_eq!(
            DeviceSelector::parse(" veth1 "),
            DeviceSelector::Name("veth1".into())
        );
        assert_eq!(
            DeviceSelector::parse("::1"),
            DeviceSelector::Addr("::1".parse().unwrap())
        );
    }
}
