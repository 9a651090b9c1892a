//! The verbs side channel: a TCP listener of the engine where a client
//! trades queue pair info for a connected RC queue pair and the verbs
//! region descriptors.
//!
//! Exchange: client → engine: `QpInfo` (32 bytes, see [`super::qp`]);
//! engine → client: `QpInfo` (32), descriptor count (u32 LE), then that many
//! 40-byte region descriptors. The engine's queue pair lives until the
//! client closes the socket (or the engine stops).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferrite_proto::region::{RegionDescriptor, DESCRIPTOR_BYTES};

use super::qp::{QpInfo, RcQp, QP_INFO_BYTES};
use super::VerbsFabric;
use crate::fabric::Fabric;
use crate::server::ServerError;

/// Most descriptors a reply may carry (two per target).
const DESCRIPTORS_MAX: u32 = 4096;
/// Reads per queue pair in flight at most (send queue depth).
const QP_DEPTH: u32 = 64;
/// Connected queue pairs (side-channel connections, one thread each) at
/// most; clients open one per thread and target, so this bounds
/// clients × threads × targets. More are refused (the socket is closed).
pub const SIDE_CONNECTIONS_MAX: usize = 4096;

fn io_err(op: &str, e: std::io::Error) -> ServerError {
    ServerError::Fabric(format!("verbs side channel {op}: {e}"))
}

/// A running side channel; dropping it stops accepting and ends the
/// connection threads within about a second.
#[derive(Debug)]
pub struct SideChannel {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SideChannel {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for SideChannel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `listen` (e.g. `192.0.2.2:7601`) for verbs connections to
/// `fabric`'s regions.
pub fn serve(fabric: Arc<VerbsFabric>, listen: &str) -> Result<SideChannel, ServerError> {
    let listener = TcpListener::bind(listen).map_err(|e| io_err("bind", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| io_err("local address", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("nonblocking", e))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("verbs-side".into())
        .spawn(move || accept_loop(listener, fabric, flag))
        .map_err(|e| io_err("spawn", e))?;
    tracing::info!(%addr, "verbs side channel listening");
    Ok(SideChannel {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(listener: TcpListener, fabric: Arc<VerbsFabric>, stop: Arc<AtomicBool>) {
    let live = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if live.load(Ordering::Relaxed) >= SIDE_CONNECTIONS_MAX {
                    tracing::warn!(%peer, "verbs side channel: {SIDE_CONNECTIONS_MAX} queue pairs connected; refused");
                    continue;
                }
                live.fetch_add(1, Ordering::Relaxed);
                let (fabric, stop, done) = (fabric.clone(), stop.clone(), live.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("verbs-conn".into())
                        .spawn(move || {
                            match serve_one(stream, &fabric, &stop) {
                                Ok(()) => tracing::debug!(%peer, "verbs connection closed"),
                                Err(e) => tracing::warn!(%peer, "verbs connection: {e}"),
                            }
                            done.fetch_sub(1, Ordering::Relaxed);
                        });
                if let Err(e) = spawned {
                    live.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!("verbs side channel: cannot spawn: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!("verbs side channel accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    fabric: &VerbsFabric,
    stop: &AtomicBool,
) -> Result<(), ServerError> {
    stream
        .set_nonblocking(false)
        .map_err(|e| io_err("blocking", e))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| io_err("timeout", e))?;
    let mut b = [0u8; QP_INFO_BYTES];
    stream.read_exact(&mut b).map_err(|e| io_err("read", e))?;
    let remote = QpInfo::decode(&b)?;
    let mut qp = RcQp::create(fabric.device().clone(), QP_DEPTH)?;
    qp.connect(&remote, true)?;
    let descriptors = fabric.descriptors();
    let mut reply = qp.local_info().encode().to_vec();
    reply.extend_from_slice(&(descriptors.len() as u32).to_le_bytes());
    for d in &descriptors {
        reply.extend_from_slice(&d.encode());
    }
    stream.write_all(&reply).map_err(|e| io_err("write", e))?;
    // Keep the queue pair until the client goes away or the engine stops.
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| io_err("timeout", e))?;
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(io_err("read", e)),
        }
    }
    drop(qp);
    Ok(())
}

/// Client half of the exchange: sends `local`, returns the engine's queue
/// pair info and its verbs region descriptors.
pub fn exchange(
    stream: &mut TcpStream,
    local: &QpInfo,
) -> Result<(QpInfo, Vec<RegionDescriptor>), ServerError> {
    stream
        .write_all(&local.encode())
        .map_err(|e| io_err("write", e))?;
    let mut b = [0u8; QP_INFO_BYTES];
    stream.read_exact(&mut b).map_err(|e| io_err("read", e))?;
    let remote = QpInfo::decode(&b)?;
    let mut n = [0u8; 4];
    stream.read_exact(&mut n).map_err(|e| io_err("read", e))?;
    let n = u32::from_le_bytes(n);
    if n > DESCRIPTORS_MAX {
        return Err(ServerError::Fabric(format!(
            "{n} region descriptors is too many"
        )));
    }
    let mut descriptors = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let mut d = [0u8; DESCRIPTOR_BYTES];
        stream.read_exact(&mut d).map_err(|e| io_err("read", e))?;
        let d = RegionDescriptor::decode(&d).map_err(|e| ServerError::Fabric(e.to_string()))?;
        descriptors.push(d);
    }
    Ok((remote, descriptors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::region::{Provider, RegionKind};
    use std::net::TcpListener;

    fn info(qpn: u32) -> QpInfo {
        QpInfo {
            qpn,
            psn: 0x123,
            gid: [9; 16],
            lid: 0,
            mtu: 3,
        }
    }

    /// Runs the client half against an engine half that answers `reply`
    /// (bytes) to the 32-byte queue pair info it reads, then closes.
    fn exchange_against(reply: Vec<u8>) -> Result<(QpInfo, Vec<RegionDescriptor>), ServerError> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let engine = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut b = [0u8; QP_INFO_BYTES];
            s.read_exact(&mut b).unwrap();
            s.write_all(&reply).unwrap();
            QpInfo::decode(&b).unwrap()
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let got = exchange(&mut stream, &info(7));
        assert_eq!(engine.join().unwrap(), info(7), "the engine read our info");
        got
    }

    #[test]
    fn exchange_decodes_the_engine_reply_and_refuses_bad_ones() {
        let regions: Vec<RegionDescriptor> = [RegionKind::Buckets, RegionKind::Log]
            .into_iter()
            .enumerate()
            .map(|(i, kind)| RegionDescriptor {
                provider: Provider::Verbs,
                kind,
                target: 0,
                region_id: i as u32,
                length: 1 << 20,
                param: 4096,
                access_key: 0xabc,
                remote_addr: 0x7f00_0000_0000 + ((i as u64) << 20),
            })
            .collect();
        let mut reply = info(42).encode().to_vec();
        reply.extend_from_slice(&2u32.to_le_bytes());
        for d in &regions {
            reply.extend_from_slice(&d.encode());
        }
        let (remote, got) = exchange_against(reply.clone()).unwrap();
        assert_eq!((remote, got), (info(42), regions));

        let mut too_many = info(42).encode().to_vec();
        too_many.extend_from_slice(&(DESCRIPTORS_MAX + 1).to_le_bytes());
        let e = exchange_against(too_many).unwrap_err().to_string();
        assert!(e.contains("too many"), "{e}");

        let cut = reply[..reply.len() - 5].to_vec();
        let e = exchange_against(cut).unwrap_err().to_string();
        assert!(e.contains("verbs side channel read"), "{e}");

        let mut bad_magic = reply;
        bad_magic[0] = b'X';
        let e = exchange_against(bad_magic).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
    }
}
