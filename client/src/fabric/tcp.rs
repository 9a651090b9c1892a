//! The `tcp` endpoint: one-sided reads served by the target's network task
//! straight from the region (a `RegionRead` request carrying the region's
//! read token), for clients on other hosts. The engine's store is not
//! involved; its network task copies the bytes out of the region.

use std::sync::Arc;

use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::{Reply, Request};

use crate::client::conn::Connection;
use crate::client::error::{Error, Result};
use crate::fabric::{check_bounds, AsyncReads, Endpoint, ReadFuture};

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

impl TcpEndpoint {
    /// The `RegionRead` request for a read, after checking its bounds.
    fn request(
        region: &RegionDescriptor,
        offset: u64,
        len: usize,
        buf_len: usize,
    ) -> Result<Request> {
        check_bounds(region, offset, len, buf_len)?;
        let len32 = u32::try_from(len).map_err(|_| Error::Region {
            region_id: region.region_id,
            reason: format!("read of {len} bytes is too long"),
        })?;
        Ok(Request::RegionRead {
            region_id: region.region_id,
            access_key: region.access_key,
            offset,
            len: len32,
        })
    }
}

/// The bytes of a `RegionRead` reply of `len` bytes.
fn reply_bytes(url: &str, len: usize, reply: Reply) -> Result<Vec<u8>> {
    match reply {
        Reply::Data(bytes) if bytes.len() == len => Ok(bytes),
        Reply::Error { code, message } => Err(Error::Remote {
            op: "region read",
            status: code as u16,
            message,
        }),
        other => Err(Error::Protocol {
            url: url.to_string(),
            detail: format!("region read of {len} bytes answered with {other:?}"),
        }),
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
        let request = Self::request(region, offset, len, buf.len())?;
        let bytes = reply_bytes(self.conn.url(), len, self.conn.request(&request)?)?;
        buf[..len].copy_from_slice(&bytes);
        Ok(())
    }

    fn provider(&self) -> &'static str {
        "tcp"
    }

    fn async_reads(&self) -> Option<Arc<dyn AsyncReads>> {
        Some(Arc::new(TcpEndpoint {
            conn: self.conn.clone(),
        }))
    }
}

/// A read sent now as its own pipelined frame; the reply completes it.
impl AsyncReads for TcpEndpoint {
    fn read_async(&self, region: &RegionDescriptor, offset: u64, len: usize) -> ReadFuture {
        let sent = Self::request(region, offset, len, len).map(|r| self.conn.request_async(&r));
        let url = self.conn.url().to_string();
        Box::pin(async move { reply_bytes(&url, len, sent?.await?) })
    }
}
