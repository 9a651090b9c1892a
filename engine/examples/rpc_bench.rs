//! Throughput of the RPC server: pipelined PUTs, RPC GETs and tcp-provider
//! region reads against an in-process engine on a temp dir.
//!
//! ```text
//! cargo run --release -p ferrite-engine --example rpc_bench -- [clients] [depth] [keys] [seconds]
//! ```
//! Defaults: 1 client thread, depth 64, 100000 keys, 5 s per phase, 64-byte
//! values, one xstream (the engine gets one core, the clients the other).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferrite_engine::config::{EngineConfig, Size};
use ferrite_engine::Engine;
use ferrite_proto::rpc::{self, FrameHeader, Hello, Key, Login, Reply, Request, HEADER_BYTES};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Self, Error> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let mut c = Self { s, buf: Vec::new() };
        let hello = Hello {
            flags: 0,
            client_nonce: rand::random(),
        };
        c.send(0, &Request::Hello(hello))?;
        c.recv()?;
        c.send(0, &Request::Login(Login { proof: [0; 32] }))?;
        c.recv()?;
        Ok(c)
    }
    fn send(&mut self, id: u64, req: &Request) -> Result<(), Error> {
        self.buf.clear();
        rpc::encode_request(id, req, &mut self.buf);
        self.s.write_all(&self.buf)?;
        Ok(())
    }
    fn recv(&mut self) -> Result<Reply, Error> {
        let mut head = [0u8; HEADER_BYTES];
        self.s.read_exact(&mut head)?;
        let h = FrameHeader::decode(&head, rpc::BODY_BYTES_MAX)?;
        let mut body = vec![0u8; h.body_len as usize];
        self.s.read_exact(&mut body)?;
        Ok(rpc::decode_reply(&h, &body)?)
    }
}

fn key(i: u64) -> Key {
    Key::new(1, 7, format!("key-{i}").as_bytes(), b"v")
}

/// Runs `make(i)` requests with `depth` outstanding for `secs`; returns ops.
fn drive(
    addr: SocketAddr,
    depth: usize,
    keys: u64,
    secs: f64,
    make: fn(u64) -> Request,
) -> Result<u64, Error> {
    let mut c = Conn::open(addr)?;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let (mut sent, mut done) = (0u64, 0u64);
    while Instant::now() < end {
        while sent - done < depth as u64 {
            c.send(sent, &make(rand::random::<u64>() % keys))?;
            sent += 1;
        }
        match c.recv()? {
            Reply::Error { code, message } => return Err(format!("{code:?}: {message}").into()),
            _ => done += 1,
        }
    }
    for _ in done..sent {
        c.recv()?;
    }
    Ok(done)
}

fn phase(
    name: &str,
    clients: usize,
    depth: usize,
    keys: u64,
    secs: f64,
    addr: SocketAddr,
    make: fn(u64) -> Request,
) -> Result<(), Error> {
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| std::thread::spawn(move || drive(addr, depth, keys, secs, make)))
        .collect();
    let mut ops = 0;
    for t in threads {
        ops += t.join().map_err(|_| "client thread panicked")??;
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64();
    println!("{name:<12} clients {clients} depth {depth:>3}: {rate:>10.0} ops/s");
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let clients = *args.first().unwrap_or(&1) as usize;
    let depth = *args.get(1).unwrap_or(&64) as usize;
    let keys = *args.get(2).unwrap_or(&100_000);
    let secs = *args.get(3).unwrap_or(&5) as f64;
    let dir = tempfile::tempdir()?;
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.bdev = "uring:{dir}/target-{i}.bdev?size=2G".into();
    config.cache.ring_bytes = Size(256 << 20);
    config.cache.buckets = 1 << 17;
    config.cache.overflow_buckets = 1 << 15;
    let engine = Engine::start(config)?;
    let addr = engine.tcp_addr().ok_or("no tcp")?;
    // Load every key once so GETs find them.
    let mut c = Conn::open(addr)?;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(512) {
        let batch = chunk
            .iter()
            .map(|&i| Request::Update {
                key: key(i),
                value: vec![7; 64],
            })
            .collect();
        c.send(0, &Request::Batch(batch))?;
        c.recv()?;
    }
    phase("put", clients, depth, keys, secs, addr, |i| {
        Request::Update {
            key: key(i),
            value: vec![9; 64],
        }
    })?;
    phase("get (rpc)", clients, depth, keys, secs, addr, |i| {
        Request::Fetch { key: key(i) }
    })?;
    let d = engine
        .regions()
        .into_iter()
        .find(|d| d.provider == ferrite_proto::region::Provider::Tcp)
        .ok_or("no tcp region")?;
    let region_read = move |i: u64| Request::RegionRead {
        region_id: d.region_id,
        access_key: d.access_key,
        offset: (i * 64) % (d.length - 64),
        len: 64,
    };
    // fn pointers cannot capture: run the region read phase by hand.
    let start = Instant::now();
    let mut c = Conn::open(addr)?;
    let end = start + Duration::from_secs_f64(secs);
    let (mut sent, mut done) = (0u64, 0u64);
    while Instant::now() < end {
        while sent - done < depth as u64 {
            c.send(sent, &region_read(sent))?;
            sent += 1;
        }
        c.recv()?;
        done += 1;
    }
    for _ in done..sent {
        c.recv()?;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    println!(
        "{:<12} clients 1 depth {depth:>3}: {rate:>10.0} ops/s (64-byte reads)",
        "region read"
    );
    engine.shutdown()?;
    Ok(())
}
