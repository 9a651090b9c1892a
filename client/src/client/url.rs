//! Engine addresses: `tcp://host:port` and `unix:///path/to/socket`.
//!
//! ```
//! use ferrite_client::client::url::EngineUrl;
//! let u: EngineUrl = "tcp://127.0.0.1:7400".parse().unwrap();
//! assert!(u.is_loopback());
//! let u: EngineUrl = "unix:///run/ferrite.sock".parse().unwrap();
//! assert_eq!(u.to_string(), "unix:///run/ferrite.sock");
//! assert!("http://x".parse::<EngineUrl>().is_err());
//! ```

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;

use crate::client::error::{Error, Result};

/// Where an engine listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EngineUrl {
    /// `tcp://host:port`: the host as written (resolved at connect time).
    Tcp { host: String, port: u16 },
    /// `unix:///absolute/path`: a Unix socket; enables the shm fabric.
    Unix { path: PathBuf },
}

impl EngineUrl {
    /// Resolves a TCP address (first result), or errors for a Unix URL.
    pub fn socket_addr(&self) -> Result<SocketAddr> {
        match self {
            Self::Tcp { host, port } => {
                // An IP literal (IPv6 in brackets) needs no resolver.
                let literal = host.trim_matches(|c| c == '[' || c == ']');
                if let Ok(ip) = literal.parse::<std::net::IpAddr>() {
                    return Ok(SocketAddr::new(ip, *port));
                }
                (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| Error::connect(self, e))?
                    .next()
                    .ok_or_else(|| Error::url(&self.to_string(), "host resolves to no address"))
            }
            Self::Unix { .. } => Err(Error::url(&self.to_string(), "not a tcp URL")),
        }
    }

    /// True for Unix sockets and TCP to a loopback address (the same host;
    /// TCP needs the token all the same).
    pub fn is_loopback(&self) -> bool {
        match self {
            Self::Unix { .. } => true,
            Self::Tcp { host, .. } => {
                host == "localhost"
                    || host
                        .trim_matches(|c| c == '[' || c == ']')
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
        }
    }
}

impl fmt::Display for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Self::Unix { path } => write!(f, "unix://{}", path.display()),
        }
    }
}

impl FromStr for EngineUrl {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            let rest = rest.trim_end_matches('/');
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| Error::url(s, "expected tcp://host:port"))?;
            if host.is_empty() {
                return Err(Error::url(s, "empty host"));
            }
            let port = port
                .parse::<u16>()
                .map_err(|_| Error::url(s, "port is not a number in 1..=65535"))?;
            if port == 0 {
                return Err(Error::url(s, "port 0"));
            }
            Ok(Self::Tcp {
                host: host.to_string(),
                port,
            })
        } else if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(Error::url(s, "expected unix:///absolute/path"));
            }
            Ok(Self::Unix {
                path: PathBuf::from(path),
            })
        } else {
            Err(Error::url(s, "scheme must be tcp:// or unix://"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!(
            "tcp://localhost:1".parse::<EngineUrl>().unwrap(),
            EngineUrl::Tcp {
                host: "localhost".into(),
                port: 1
            }
        );
        let v6: EngineUrl = "tcp://[::1]:9000".parse().unwrap();
        assert!(v6.is_loopback());
        assert_eq!(v6.socket_addr().unwrap().port(), 9000);
        let remote: EngineUrl = "tcp://10.0.0.1:9000".parse().unwrap();
        assert!(!remote.is_loopback());
        for bad in [
            "tcp://host",
            "tcp://:80",
            "tcp://h:0",
            "tcp://h:99999",
            "unix://rel",
            "udp://x:1",
            "",
        ] {
            assert!(bad.parse::<EngineUrl>().is_err(), "{bad} accepted");
        }
    }
}
