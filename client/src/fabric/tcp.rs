//! The `tcp` endpoint: one-sided reads served by the target's network task
//! straight from the region (a `RegionRead` request carrying the region's
//! read token), for clients on other hosts. The engine's store is not
//! involved; its network task copies the bytes out of the region.

use std::sync::Arc;

use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::{Reply, Request};

use crate::client::conn::Connection;
use crate::client::error::{Error, Result};
use crate::fabric::{check_bounds, Endpoint};

/// Reads regions over an engine connection.
#[derive(Debug)]
pub struct TcpEndpoint {
    conn: Arc<Connection>,
}

impl TcpEndpoint {
    pub fn new(conn: Arc<Connection>) -> Self {
        Self { conn }
    }
}

impl Endpoint for TcpEndpoint {
    fn read(
        &self,
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        check_bounds(region, offset, len, buf.len())?;
        let len32 = u32::try_from(len).map_err(|_| Error::Region {
            region_id: region.region_id,
            reason: format!("read of {len} bytes is too long"),
        })?;
        let request = Request::RegionRead {
            region_id: region.region_id,
            access_key: region.access_key,
            offset,
            len: len32,
        };
        match self.conn.request(&request)? {
            Reply::Data(bytes) if bytes.len() == len => {
                buf[..len].copy_from_slice(&bytes);
                Ok(())
            }
            Reply::Error { code, message } => Err(Error::Remote {
                op: "region read",
                status: code as u16,
                message,
            }),
            other => Err(Error::Protocol {
                url: self.conn.url().to_string(),
                detail: format!("region read of {len} bytes answered with {other:?}"),
            }),
        }
    }

    fn provider(&self) -> &'static str {
        "tcp"
    }
}
