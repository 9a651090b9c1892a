//! The `tcp` endpoint: one-sided reads served by the target's network task
//! straight from the region (a `RegionRead` request carrying the region's
//! read token), for clients on other hosts. The engine's store is not
//! involved; its network task copies the bytes out of the region.

use std::sync::Arc;

use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::message::READ_BYTES_MAX;
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
        check_bounds(region, offset, len, buf.len())?;
        // Pieces of at most a request's limit, pipelined.
        let sent: Vec<_> = pieces(offset, len)
            .map(|(at, n)| {
                Self::request(region, at, n, n).map(|r| (n, self.conn.request_async(&r)))
            })
            .collect::<Result<_>>()?;
        let mut pos = 0;
        for (n, reply) in sent {
            let bytes = reply_bytes(self.conn.url(), n, reply.wait()?)?;
            buf[pos..pos + n].copy_from_slice(&bytes);
            pos += n;
        }
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
        let sent: Result<Vec<_>> = pieces(offset, len)
            .map(|(at, n)| {
                Self::request(region, at, n, n).map(|r| (n, self.conn.request_async(&r)))
            })
            .collect();
        let url = self.conn.url().to_string();
        Box::pin(async move {
            let mut out = Vec::with_capacity(len);
            for (n, reply) in sent? {
                out.extend_from_slice(&reply_bytes(&url, n, reply.await?)?);
            }
            Ok(out)
        })
    }
}

/// `(offset, len)` of the requests a read of `len` bytes at `offset` takes:
/// one per [`READ_BYTES_MAX`] (a record of a 1 MiB value, with its header,
/// is longer than one request may ask for; the engine refuses such a
/// request as malformed and drops the connection).
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize)> {
    (0..len.div_ceil(READ_BYTES_MAX).max(1)).map(move |i| {
        let start = i * READ_BYTES_MAX;
        (offset + start as u64, (len - start).min(READ_BYTES_MAX))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_longer_than_a_request_are_split() {
        assert_eq!(pieces(10, 0).collect::<Vec<_>>(), [(10, 0)]);
        assert_eq!(pieces(10, 5).collect::<Vec<_>>(), [(10, 5)]);
        let m = READ_BYTES_MAX;
        assert_eq!(
            pieces(0, m + 88).collect::<Vec<_>>(),
            [(0, m), (m as u64, 88)]
        );
        assert_eq!(pieces(0, 2 * m).count(), 2);
    }
}
