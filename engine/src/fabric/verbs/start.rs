//! Starting the verbs provider from the engine's `fabric.providers`:
//!
//! - `"verbs"`: any device, side channel on `127.0.0.1:7601`;
//! - `"verbs=SELECTOR@LISTEN"`: the device [`DeviceSelector::parse`] makes of
//!   `SELECTOR` (name, netdev or IP), side channel on `LISTEN`, e.g.
//!   `verbs=192.0.2.2@192.0.2.2:7601`; either part may be empty;
//! - `"auto"`: like `"verbs"`, but when no device can be opened the engine
//!   logs why and serves one-sided reads with `tcp` instead.

use std::sync::Arc;

use super::{serve, DeviceSelector, SideChannel, VerbsFabric};
use crate::fabric::Fabric;
use crate::server::ServerError;
use crate::store::StoreRegions;

/// Where the side channel listens when the provider entry does not say.
pub const DEFAULT_SIDE_LISTEN: &str = "127.0.0.1:7601";

/// A parsed `verbs`/`auto` provider entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsSpec {
    pub device: DeviceSelector,
    pub listen: String,
    /// `auto`: fall back to tcp when no device opens.
    pub fallback: bool,
}

impl VerbsSpec {
    /// `None` when `entry` is not a verbs or auto entry.
    ///
    /// ```
    /// use ferrite_engine::fabric::verbs::{DeviceSelector, VerbsSpec};
    /// let s = VerbsSpec::parse("verbs=rxe1@192.0.2.2:7601").unwrap().unwrap();
    /// assert_eq!(s.device, DeviceSelector::Name("rxe1".into()));
    /// assert_eq!(s.listen, "192.0.2.2:7601");
    /// assert!(VerbsSpec::parse("tcp").is_none());
    /// assert!(VerbsSpec::parse("verbs=rxe1@nonsense").unwrap().is_err());
    /// ```
    pub fn parse(entry: &str) -> Option<Result<Self, String>> {
        let (fallback, rest) = match entry {
            "auto" => (true, ""),
            "verbs" => (false, ""),
            e => (false, e.strip_prefix("verbs=")?),
        };
        let (dev, listen) = rest.split_once('@').unwrap_or((rest, ""));
        let listen = match listen {
            "" => DEFAULT_SIDE_LISTEN.to_string(),
            l if l.parse::<std::net::SocketAddr>().is_ok() => l.to_string(),
            l => {
                return Some(Err(format!(
                    "verbs side channel address {l:?} is not ip:port"
                )))
            }
        };
        Some(Ok(Self {
            device: DeviceSelector::parse(dev),
            listen,
            fallback,
        }))
    }
}

/// The running verbs provider of an engine.
#[derive(Debug)]
pub struct RunningVerbs {
    pub fabric: Arc<VerbsFabric>,
    pub side: SideChannel,
}

/// What [`start_for_engine`] did.
#[derive(Debug, Default)]
pub struct VerbsStart {
    pub running: Option<RunningVerbs>,
    /// `auto` found no usable device: tcp must serve one-sided reads.
    pub fell_back: bool,
}

/// Opens the device, registers every region and starts the side channel
/// when `providers` holds a verbs or auto entry.
pub fn start_for_engine(
    providers: &[String],
    regions: &[StoreRegions],
) -> Result<VerbsStart, ServerError> {
    let Some(spec) = providers.iter().find_map(|p| VerbsSpec::parse(p)) else {
        return Ok(VerbsStart::default());
    };
    let spec = spec.map_err(ServerError::Config)?;
    let fabric = match VerbsFabric::open(&spec.device) {
        Ok(f) => f,
        Err(e) if spec.fallback => {
            tracing::warn!("fabric = \"auto\": {e}; falling back to tcp");
            eprintln!("ferrite-engine: fabric = \"auto\": {e}; falling back to tcp");
            return Ok(VerbsStart {
                running: None,
                fell_back: true,
            });
        }
        Err(e) => return Err(e),
    };
    for r in regions {
        let [buckets, log] = r.descriptors(fabric.provider());
        fabric.register(r.buckets.clone(), buckets)?;
        fabric.register(r.log.clone(), log)?;
    }
    let fabric = Arc::new(fabric);
    let side = serve(fabric.clone(), &spec.listen)?;
    tracing::info!(device = fabric.device().name(), listen = %side.local_addr(), "verbs provider up");
    Ok(VerbsStart {
        running: Some(RunningVerbs { fabric, side }),
        fell_back: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let a = VerbsSpec::parse("auto").unwrap().unwrap();
        assert!(a.fallback);
        assert_eq!(
            (a.device, a.listen.as_str()),
            (DeviceSelector::Any, DEFAULT_SIDE_LISTEN)
        );
        let v = VerbsSpec::parse("verbs=192.0.2.2@").unwrap().unwrap();
        assert!(!v.fallback);
        assert!(matches!(v.device, DeviceSelector::Addr(_)));
        assert!(VerbsSpec::parse("verbsx").is_none());
        assert!(VerbsSpec::parse("shm").is_none());
    }

    #[test]
    fn auto_without_a_device_falls_back_and_verbs_fails_clearly() {
        if std::path::Path::new("/sys/class/infiniband").exists() {
            return; // a machine with RDMA: covered by the guest tests
        }
        let auto = start_for_engine(&["auto".into()], &[]).unwrap();
        assert!(auto.fell_back && auto.running.is_none());
        let err = start_for_engine(&["verbs".into()], &[]).unwrap_err();
        assert!(err.to_string().contains(super::super::NO_DEVICE), "{err}");
        let none = start_for_engine(&["tcp".into()], &[]).unwrap();
        assert!(!none.fell_back && none.running.is_none());
    }
}
