//! Shared by the `jobs_*` tests of the engine: a peer speaking the job
//! service's frames (`ferrite_proto::rpc_jobs`), as the CLI and workers do.

#![allow(dead_code)]

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;

use ferrite_engine::jobs::JobService;
use ferrite_proto::rpc_jobs::{read_frame, write_frame, ToEngine, ToPeer};

pub struct Peer {
    pub input: BufReader<TcpStream>,
    pub output: BufWriter<TcpStream>,
}

impl Peer {
    pub fn connect(service: &JobService) -> Peer {
        Self::connect_to(service.addr())
    }

    pub fn connect_to(addr: std::net::SocketAddr) -> Peer {
        let s = TcpStream::connect(addr).unwrap();
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
