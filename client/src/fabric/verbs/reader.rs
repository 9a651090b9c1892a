//! `--fabric verbs[=DEVICE[@HOST:PORT]]`: a one-sided reader over a verbs
//! endpoint for a client whose RPCs go to `engine_url`.
//!
//! `DEVICE` is the local RDMA device (name, netdev or IP, as the engine's
//! `DeviceSelector`; empty: the first device); `HOST:PORT` is the engine's
//! verbs side channel (default: the engine URL's host, port 7601, the
//! engine's default side-channel port).

use ferrite_engine::fabric::verbs::{DeviceSelector, DEFAULT_SIDE_LISTEN};

use super::VerbsEndpoint;
use crate::client::error::{Error, Result};
use crate::client::onesided::{OneSidedReader, RetryPolicy};
use crate::client::EngineUrl;

/// A parsed `verbs[=DEVICE[@HOST:PORT]]` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsFabricArg {
    pub device: DeviceSelector,
    /// The side channel's `host:port`; `None`: from the engine URL.
    pub side: Option<String>,
}

impl VerbsFabricArg {
    /// `None` when `arg` is not a verbs argument.
    ///
    /// ```
    /// use ferrite_client::fabric::verbs::VerbsFabricArg;
    /// let a = VerbsFabricArg::parse("verbs=rxe0@192.0.2.2:7601").unwrap().unwrap();
    /// assert_eq!(a.side.as_deref(), Some("192.0.2.2:7601"));
    /// assert_eq!(VerbsFabricArg::parse("verbs").unwrap().unwrap().side, None);
    /// assert!(VerbsFabricArg::parse("verbs=rxe0@nowhere").unwrap().is_err());
    /// assert!(VerbsFabricArg::parse("shm").is_none());
    /// ```
    pub fn parse(arg: &str) -> Option<Result<Self>> {
        let rest = match arg {
            "verbs" => "",
            a => a.strip_prefix("verbs=")?,
        };
        let (device, side) = rest.split_once('@').unwrap_or((rest, ""));
        let side = match side {
            "" => None,
            s if s.parse::<std::net::SocketAddr>().is_ok() => Some(s.to_string()),
            s => {
                return Some(Err(Error::InvalidArgument(format!(
                    "verbs side channel address {s:?} is not ip:port"
                ))))
            }
        };
        Some(Ok(Self {
            device: DeviceSelector::parse(device),
            side,
        }))
    }

    /// The side channel address for an engine at `engine_url`.
    pub fn side_addr(&self, engine_url: &str) -> Result<String> {
        if let Some(s) = &self.side {
            return Ok(s.clone());
        }
        let port = DEFAULT_SIDE_LISTEN.rsplit(':').next().unwrap_or("7601");
        match engine_url.parse::<EngineUrl>()? {
            EngineUrl::Tcp { host, .. } => Ok(format!("{host}:{port}")),
            EngineUrl::Unix { .. } => Ok(DEFAULT_SIDE_LISTEN.to_string()),
        }
    }
}

/// Connects a verbs endpoint for the engine at `engine_url` and wraps it in
/// a one-sided reader (for `Client::set_one_sided_reader`).
pub fn one_sided_reader(
    engine_url: &str,
    arg: &VerbsFabricArg,
    cache_buckets: usize,
    policy: RetryPolicy,
) -> Result<OneSidedReader> {
    let ep = VerbsEndpoint::connect(&arg.side_addr(engine_url)?, &arg.device)?;
    let targets = ep.targets()?;
    OneSidedReader::new(Box::new(ep), targets, cache_buckets, policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_address_defaults_to_the_engine_host() {
        let a = VerbsFabricArg::parse("verbs=rxe0").unwrap().unwrap();
        assert_eq!(a.device, DeviceSelector::Name("rxe0".into()));
        assert_eq!(
            a.side_addr("tcp://192.0.2.2:7600").unwrap(),
            "192.0.2.2:7601"
        );
        assert_eq!(
            a.side_addr("unix:///tmp/e.sock").unwrap(),
            DEFAULT_SIDE_LISTEN
        );
        assert!(a.side_addr("nonsense").is_err());
        let b = VerbsFabricArg::parse("verbs=@10.0.0.1:9000")
            .unwrap()
            .unwrap();
        assert_eq!(
            b.side_addr("tcp://192.0.2.2:7600").unwrap(),
            "10.0.0.1:9000"
        );
    }
}
