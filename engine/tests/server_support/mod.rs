//! Shared by the `server_*` tests: start the `ferrite-engine` binary in a
//! temp dir, and a minimal blocking client speaking raw frames from
//! `ferrite_proto::rpc` (independent of the client library).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};
use ferrite_proto::key::target_of;
use ferrite_proto::record::{RecordFlags, RecordView};
use ferrite_proto::region::{RegionDescriptor, RegionKind};
use ferrite_proto::rpc::handshake::{login_proof, HELLO_WANT_SHM};
use ferrite_proto::rpc::{
    self, FrameHeader, Hello, Login, Reply, Request, Welcome, BODY_BYTES_MAX, HEADER_BYTES,
};

/// How long an engine may take to print `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Socket read timeout of test clients (a hung engine fails the test).
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// A `ferrite-engine` child process.
pub struct EngineProcess {
    child: Option<Child>,
    pub tcp: SocketAddr,
    pub unix: PathBuf,
    pub dir: PathBuf,
    /// The job service's address (its `jobs ADDR` line), if it runs.
    pub jobs: Option<SocketAddr>,
    /// The token TCP clients prove: read from the file of its
    /// `token_file PATH` line (generated in `dir` unless `--token-file`).
    pub token: Vec<u8>,
}

impl EngineProcess {
    /// Starts an engine with 2 xstreams (`FERRITE_TEST_XSTREAMS` to change)
    /// on file bdevs in `dir`, TCP on a free loopback port; `extra` flags
    /// are appended.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_with(dir, extra, |_| {})
    }

    /// [`EngineProcess::start`], with `configure` changing the command
    /// before it is spawned (environment, limits, where stderr goes).
    pub fn start_with(dir: &Path, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Self {
        let unix = dir.join("engine.sock");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrite-engine"));
        cmd.arg("--data-dir")
            .arg(dir)
            .arg("--xstreams")
            .arg(std::env::var("FERRITE_TEST_XSTREAMS").unwrap_or_else(|_| "2".into()))
            .args(["--tcp", "127.0.0.1:0"])
            .args(["--bdev", "uring:{dir}/target-{i}.bdev?size=64M"])
            .args(["--ring-bytes", "4M", "--buckets", "4096"])
            .arg("--unix")
            .arg(&unix)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        configure(&mut cmd);
        let mut child = cmd.spawn().expect("spawn ferrite-engine");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let (mut tcp, mut jobs, mut token) = (None, None, None);
        loop {
            let Ok(line) = rx.recv_timeout(START_TIMEOUT) else {
                // Do not leave the engine running behind a failed test.
                let _ = child.kill();
                let _ = child.wait();
                panic!("engine did not print `ready` within {START_TIMEOUT:?}");
            };
            if let Some(url) = line.strip_prefix("listen tcp://") {
                tcp = Some(url.parse().expect("tcp address"));
            }
            if let Some(path) = line.strip_prefix("token_file ") {
                let read = ferrite_proto::rpc::handshake::read_token_file(Path::new(path));
                token = Some(read.expect("the engine's token file"));
            }
            if let Some(addr) = line.strip_prefix("jobs ") {
                jobs = Some(addr.parse().expect("job service address"));
            }
            if line == "ready" {
                break;
            }
        }
        Self {
            child: Some(child),
            tcp: tcp.expect("engine listens on tcp"),
            unix,
            dir: dir.to_path_buf(),
            jobs,
            token: token.expect("engine prints its token_file"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL and reap.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, wait, return the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().ok()?.code()
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Either kind of stream.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn raw(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A blocking raw-frame client.
pub struct RawClient {
    pub stream: Stream,
    next_id: u64,
    pub welcome: Option<Welcome>,
    /// The shm fds received with the Welcome, in descriptor order.
    pub fds: Vec<OwnedFd>,
}

impl RawClient {
    pub fn tcp(addr: SocketAddr) -> std::io::Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Self::over(Stream::Tcp(s)))
    }

    pub fn unix(path: &Path) -> std::io::Result<Self> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        Ok(Self::over(Stream::Unix(s)))
    }

    fn over(stream: Stream) -> Self {
        Self {
            stream,
            next_id: 1,
            welcome: None,
            fds: Vec::new(),
        }
    }

    /// Connects over TCP and logs in (with `token` when the engine asks).
    pub fn connect_tcp(addr: SocketAddr, token: Option<&[u8]>) -> std::io::Result<Self> {
        let mut c = Self::tcp(addr)?;
        c.login(0, token)?;
        Ok(c)
    }

    /// Connects over the Unix socket, asking for shm regions when `shm`.
    pub fn connect_unix(path: &Path, shm: bool) -> std::io::Result<Self> {
        let mut c = Self::unix(path)?;
        c.login(if shm { HELLO_WANT_SHM } else { 0 }, None)?;
        Ok(c)
    }

    /// Hello, Challenge, Login, Welcome.
    pub fn login(&mut self, flags: u32, token: Option<&[u8]>) -> std::io::Result<()> {
        let client_nonce: [u8; 16] = rand::random();
        let challenge = match self.call(&Request::Hello(Hello {
            flags,
            client_nonce,
        }))? {
            Reply::Challenge(c) => c,
            other => return Err(other_error(format!("expected a challenge, got {other:?}"))),
        };
        let proof = match (challenge.auth, token) {
            (0, _) => [0; 32],
            (_, Some(t)) => login_proof(t, &challenge.server_nonce, &client_nonce),
            (_, None) => [0; 32],
        };
        self.send(&Request::Login(Login { proof }))?;
        let (_, reply) = self.recv_with_fds()?;
        match reply {
            Reply::Welcome(w) => {
                self.welcome = Some(w);
                Ok(())
            }
            other => Err(other_error(format!("expected a welcome, got {other:?}"))),
        }
    }

    /// Sends one request; returns its id.
    pub fn send(&mut self, req: &Request) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut out = Vec::new();
        rpc::encode_request(id, req, &mut out);
        self.stream.write_all(&out)?;
        Ok(id)
    }

    /// Sends several requests in one write (they reach the engine
    /// together); returns their ids.
    pub fn send_all(&mut self, reqs: &[Request]) -> std::io::Result<Vec<u64>> {
        let mut out = Vec::new();
        let mut ids = Vec::with_capacity(reqs.len());
        for req in reqs {
            ids.push(self.next_id);
            rpc::encode_request(self.next_id, req, &mut out);
            self.next_id += 1;
        }
        self.stream.write_all(&out)?;
        Ok(ids)
    }

    /// Reads one reply frame.
    pub fn recv(&mut self) -> std::io::Result<(FrameHeader, Reply)> {
        let mut head = [0u8; HEADER_BYTES];
        self.stream.read_exact(&mut head)?;
        self.finish_recv(head)
    }

    fn finish_recv(&mut self, head: [u8; HEADER_BYTES]) -> std::io::Result<(FrameHeader, Reply)> {
        let header = FrameHeader::decode(&head, BODY_BYTES_MAX).map_err(other_error)?;
        let mut body = vec![0u8; header.body_len as usize];
        self.stream.read_exact(&mut body)?;
        let reply = rpc::decode_reply(&header, &body).map_err(other_error)?;
        Ok((header, reply))
    }

    /// Reads one reply frame whose header may carry fds (SCM_RIGHTS).
    fn recv_with_fds(&mut self) -> std::io::Result<(FrameHeader, Reply)> {
        let mut head = [0u8; HEADER_BYTES];
        let (n, fds) = ferrite_engine::server::recvmsg_fds(self.stream.raw(), &mut head, 0)?;
        self.fds = fds;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.stream.read_exact(&mut head[n..])?;
        self.finish_recv(head)
    }

    /// Sends a request and waits for its reply (no other request pending).
    pub fn call(&mut self, req: &Request) -> std::io::Result<Reply> {
        let id = self.send(req)?;
        let (h, reply) = self.recv()?;
        if h.request_id != id {
            return Err(other_error(format!(
                "reply id {} for request {id}: {reply:?}",
                h.request_id
            )));
        }
        Ok(reply)
    }

    /// Reads until the engine closes; returns the frames it sent first.
    pub fn drain_until_closed(&mut self) -> Vec<Reply> {
        let mut got = Vec::new();
        for _ in 0..10_000 {
            match self.recv() {
                Ok((_, r)) => got.push(r),
                Err(_) => break,
            }
        }
        got
    }
}

/// The code of the error frame the engine sends last before it closes
/// `c` (panics if the last frame is not an error).
pub fn closing_error(c: &mut RawClient) -> rpc::ErrorCode {
    let frames = c.drain_until_closed();
    match frames.last() {
        Some(Reply::Error { code, .. }) => *code,
        other => panic!("expected a closing error frame, got {other:?} (all: {frames:?})"),
    }
}

/// A write and a read of key `i` on `c` succeed.
pub fn healthy(c: &mut RawClient, i: u64) {
    let k = key(5, "healthy", &i.to_string());
    let r = c
        .call(&Request::Update {
            key: k.clone(),
            value: vec![1; 8],
        })
        .unwrap();
    assert!(matches!(r, Reply::Version(_)), "{r:?}");
    assert!(matches!(
        c.call(&Request::Fetch { key: k }).unwrap(),
        Reply::Value(Some(_))
    ));
}

pub fn other_error(e: impl ToString) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// A read-only mapping of an fd (for shm regions).
pub struct Mapping {
    ptr: *const u8,
    len: usize,
}

impl Mapping {
    pub fn new(fd: &OwnedFd, len: usize) -> std::io::Result<Self> {
        // SAFETY: mapping a valid fd read-only and shared; the kernel picks
        // the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr: p.cast(), len })
    }

    /// Copies `len` bytes at `offset` with volatile loads.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len);
        (0..len)
            // SAFETY: in bounds of the mapping (checked above).
            .map(|i| unsafe { self.ptr.add(offset + i).read_volatile() })
            .collect()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The seed of a randomised test: `FERRITE_SEED` if set, else random;
/// printed so a failure can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("FERRITE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("FERRITE_SEED={seed}");
    seed
}

/// A fresh temp dir for one engine.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A key of the tests: container 1, object `object`, dkey and akey strings.
pub fn key(object: u128, dkey: &str, akey: &str) -> rpc::Key {
    rpc::Key::new(1, object, dkey.as_bytes(), akey.as_bytes())
}

/// Looks `key` up one-sided, as a client does: bucket, slot, record, all
/// read through `read(descriptor, offset, len)`. `None` if not found.
pub fn one_sided_get(
    regions: &[RegionDescriptor],
    target_count: u32,
    key: &rpc::Key,
    mut read: impl FnMut(&RegionDescriptor, u64, u32) -> Vec<u8>,
) -> Option<(u64, Vec<u8>)> {
    let rk = key.as_record_key();
    let target = target_of(rk.dkey_hash(), target_count) as u16;
    let find = |kind| {
        regions
            .iter()
            .find(|d| d.target == target && d.kind == kind)
            .copied()
            .expect("region of the target")
    };
    let (buckets, log) = (find(RegionKind::Buckets), find(RegionKind::Log));
    let hash = rk.hash();
    let mut index = hash.bucket_index(buckets.param);
    for _ in 0..64 {
        let bytes = read(&buckets, index * BUCKET_BYTES as u64, BUCKET_BYTES as u32);
        let mut b = [0u8; BUCKET_BYTES];
        b.copy_from_slice(&bytes);
        let bucket = Bucket(b);
        bucket.check().expect("a quiet bucket passes its CRC");
        for slot in bucket.matching(hash.fingerprint()) {
            let rec = read(&log, slot.addr % log.param, slot.length);
            let Ok(view) = RecordView::parse(&rec) else {
                continue;
            };
            if view.verify_for(&rk, slot.addr).is_ok() {
                if view.flags().has(RecordFlags::TOMBSTONE) {
                    return None;
                }
                return Some((view.version(), view.value().to_vec()));
            }
        }
        if bucket.next() == 0 {
            return None;
        }
        index = u64::from(bucket.next());
    }
    None
}
