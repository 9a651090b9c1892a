//! Starts an engine in-process on a temporary directory (what an embedded
//! client does), speaks a few raw frames to it over TCP, and shuts it down.
//!
//! ```text
//! cargo run -p ferrite-engine --example embedded_engine
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;

use ferrite_engine::config::EngineConfig;
use ferrite_engine::Engine;
use ferrite_proto::rpc::{self, FrameHeader, Hello, Key, Login, Reply, Request, HEADER_BYTES};

fn call(s: &mut TcpStream, id: u64, req: &Request) -> Result<Reply, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    rpc::encode_request(id, req, &mut out);
    s.write_all(&out)?;
    let mut head = [0u8; HEADER_BYTES];
    s.read_exact(&mut head)?;
    let header = FrameHeader::decode(&head, rpc::BODY_BYTES_MAX)?;
    let mut body = vec![0u8; header.body_len as usize];
    s.read_exact(&mut body)?;
    Ok(rpc::decode_reply(&header, &body)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let engine = Engine::start(EngineConfig::for_temp_dir(dir.path()))?;
    println!("engine listening on {:?}", engine.urls());
    let addr = engine.tcp_addr().ok_or("no tcp listener")?;
    let mut s = TcpStream::connect(addr)?;
    let hello = Request::Hello(Hello {
        flags: 0,
        client_nonce: rand::random(),
    });
    let Reply::Challenge(challenge) = call(&mut s, 1, &hello)? else {
        return Err("no challenge".into());
    };
    println!("auth required: {}", challenge.auth != 0);
    let Reply::Welcome(welcome) = call(&mut s, 2, &Request::Login(Login { proof: [0; 32] }))?
    else {
        return Err("no welcome".into());
    };
    println!(
        "{} targets, {} regions",
        welcome.targets.len(),
        welcome.regions.len()
    );
    let key = Key::new(1, 42, b"dkey", b"akey");
    let put = Request::Update {
        key: key.clone(),
        value: b"hello".to_vec(),
    };
    println!("update -> {:?}", call(&mut s, 3, &put)?);
    println!("fetch  -> {:?}", call(&mut s, 4, &Request::Fetch { key })?);
    drop(s);
    engine.shutdown()?;
    Ok(())
}
