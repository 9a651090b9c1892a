//! Shared by the `jobs_*` tests of the engine: a peer speaking the job
//! service's frames (`ferrite_proto::rpc_jobs`), as the CLI and workers do.

#![allow(dead_code)]

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;

use ferrite_engine::jobs::JobService;
use ferrite_proto::rpc_jobs::auth::{client_handshake, Service};
use ferrite_proto::rpc_jobs::{read_frame, write_frame, ToEngine, ToPeer};

/// The token every test service is started with.
pub const TOKEN: &[u8] = b"jobs-test-token";

pub struct Peer {
    pub input: BufReader<TcpStream>,
    pub output: BufWriter<TcpStream>,
}

impl Peer {
    pub fn connect(service: &JobService) -> Peer {
        Self::connect_to(service.addr())
    }

    /// Connects and proves it holds [`TOKEN`].
    pub fn connect_to(addr: std::net::SocketAddr) -> Peer {
        Self::connect_with(addr, TOKEN).expect("handshake with the test token")
    }

    /// Connects and runs the handshake with `token`.
    pub fn connect_with(
        addr: std::net::SocketAddr,
        token: &[u8],
    ) -> Result<Peer, ferrite_proto::rpc_jobs::auth::AuthError> {
        let mut s = TcpStream::connect(addr).unwrap();
        client_handshake(&mut s, Service::Jobs, token, rand_nonce())?;
        Ok(Self::over(s))
    }

    /// A peer on a connection that skipped the handshake.
    pub fn over(s: TcpStream) -> Peer {
        Peer {
            input: BufReader::new(s.try_clone().unwrap()),
            output: BufWriter::new(s),
        }
    }

    /// Sends `msg` and reads the answer.
    pub fn ask(&mut self, msg: ToEngine) -> ToPeer {
        write_frame(&mut self.output, &msg).unwrap();
        self.output.flush().unwrap();
        read_frame(&mut self.input).unwrap().expect("an answer")
    }
}

fn rand_nonce() -> [u8; 16] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (t ^ u128::from(std::process::id())).to_le_bytes()
}

/// Aborts the test process if a test runs longer than `limit`.
pub fn watchdog(limit: std::time::Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("watchdog: test exceeded {limit:?}");
        std::process::abort();
    });
}
