//! One connection to an engine: handshake, then pipelined requests matched
//! to replies by request id. Any number of threads may send on it at once;
//! a reader thread delivers replies as they arrive, in any order.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrite_proto::rpc::handshake::{
    engine_proof, login_proof, AUTH_TOKEN_HMAC_SHA256, HELLO_BULK_REGION, HELLO_WANT_SHM,
    NONCE_BYTES, WELCOME_BULK_MAPPED, WELCOME_FDS_ATTACHED,
};
use ferrite_proto::rpc::{self, Hello, Login, Reply, Request, Welcome};
use rand::RngCore;

use crate::client::error::{Error, Result};
use crate::client::url::EngineUrl;
use crate::client::waiter::{Answer, ReplyFuture, Sink, Waiter};
use crate::fabric::shm::{recv_with_fds, send_with_fds};

/// Largest reply body this client accepts.
pub const MAX_REPLY_BODY_BYTES: usize = rpc::MAX_BODY_BYTES;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn open(url: &EngineUrl) -> Result<Self> {
        match url {
            EngineUrl::Tcp { .. } => {
                let s =
                    TcpStream::connect(url.socket_addr()?).map_err(|e| Error::connect(url, e))?;
                let _ = s.set_nodelay(true);
                Ok(Self::Tcp(s))
            }
            EngineUrl::Unix { path } => Ok(Self::Unix(
                UnixStream::connect(path).map_err(|e| Error::connect(url, e))?,
            )),
        }
    }
    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => Self::Tcp(s.try_clone()?),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
        })
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.write_all(buf),
            Self::Unix(s) => s.write_all(buf),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Self::Tcp(s) => s.shutdown(Shutdown::Both),
            Self::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// How to open a connection.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Shared secret for engines that require it (TCP, non-loopback).
    pub token: Option<Vec<u8>>,
    /// Ask for shm region fds (Unix socket only).
    pub want_shm: bool,
    /// Offer this bulk region's memory file (a sealed memfd, see
    /// [`super::bulk`]) with the Login (Unix socket only); the caller keeps
    /// the fd open until the handshake returned.
    pub bulk_fd: Option<RawFd>,
}

/// What the handshake returned.
#[derive(Debug)]
pub struct Session {
    pub welcome: Welcome,
    /// One fd per region when the engine attached them (shm), in order.
    pub fds: Vec<OwnedFd>,
    /// The engine mapped the offered bulk region: bulk requests may go on
    /// this connection.
    pub bulk_mapped: bool,
}

struct Shared {
    url: String,
    pending: Mutex<Pending>,
    /// Mirrors `Pending::dead` for lock-free checks on hot paths.
    dead: AtomicBool,
}

#[derive(Default)]
struct Pending {
    sinks: HashMap<u64, Sink>,
    /// Set once the connection is gone; nothing more will be answered.
    dead: Option<String>,
}

/// A handshaken, pipelined connection.
pub struct Connection {
    shared: Arc<Shared>,
    writer: Mutex<Stream>,
    next_id: AtomicU64,
    timeout: Duration,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.shared.url)
            .finish()
    }
}

impl Connection {
    /// Connects, runs the handshake and starts the reply reader.
    pub fn open(
        url: &EngineUrl,
        opts: &ConnectOptions,
        timeout: Duration,
    ) -> Result<(Self, Session)> {
        let mut stream = Stream::open(url)?;
        let session = handshake(&mut stream, url, opts)?;
        let reader = stream.try_clone().map_err(|e| Error::connect(url, e))?;
        let shared = Arc::new(Shared {
            url: url.to_string(),
            pending: Mutex::new(Pending::default()),
            dead: AtomicBool::new(false),
        });
        let reader_shared = shared.clone();
        std::thread::Builder::new()
            .name("ferrite-conn".into())
            .spawn(move || read_replies(reader, reader_shared))
            .map_err(|e| Error::io("spawn connection reader", e))?;
        let conn = Self {
            shared,
            writer: Mutex::new(stream),
            next_id: AtomicU64::new(16),
            timeout,
        };
        Ok((conn, session))
    }

    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// True once the connection broke.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    /// Why the connection broke, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.pending).dead.clone()
    }

    fn disconnected(&self, op: &'static str, detail: String) -> Error {
        Error::Disconnected {
            url: self.shared.url.clone(),
            op,
            detail,
        }
    }

    /// Sends one request; its reply goes to `sink`.
    fn send(&self, request: &Request, sink: Sink) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(64);
        rpc::encode_request(id, request, &mut frame);
        {
            let mut p = lock(&self.shared.pending);
            if let Some(d) = p.dead.clone() {
                drop(p);
                sink.deliver(Err(self.disconnected(op_name(request), d.clone())));
                return Err(self.disconnected(op_name(request), d));
            }
            p.sinks.insert(id, sink);
        }
        let written = lock(&self.writer).write_all(&frame);
        if let Err(e) = written {
            let detail = format!("write failed: {e}");
            fail_all(&self.shared, &detail);
            return Err(self.disconnected(op_name(request), detail));
        }
        Ok(id)
    }

    /// Sends a request and returns its reply as a future.
    pub fn request_async(&self, request: &Request) -> ReplyFuture {
        let waiter = Arc::new(Waiter::default());
        // A failed send has already delivered the error into the waiter.
        let _ = self.send(request, Sink::Waiter(waiter.clone()));
        ReplyFuture { waiter }
    }

    /// Sends a request whose reply completes `event`.
    pub fn request_event(&self, request: &Request, event: ferrite_xstream::Event<Answer>) {
        let _ = self.send(request, Sink::Event(event));
    }

    /// Sends a request and blocks for its reply (up to the timeout).
    pub fn request(&self, request: &Request) -> Result<Reply> {
        let waiter = Arc::new(Waiter::default());
        let id = self.send(request, Sink::Waiter(waiter.clone()))?;
        self.wait(id, &waiter, op_name(request))
    }

    fn wait(&self, id: u64, waiter: &Waiter, op: &'static str) -> Result<Reply> {
        match waiter.wait_until(Instant::now() + self.timeout) {
            Some(a) => a,
            None => {
                lock(&self.shared.pending).sinks.remove(&id);
                Err(Error::Timeout {
                    url: self.shared.url.clone(),
                    op,
                    timeout_ms: self.timeout.as_millis() as u64,
                })
            }
        }
    }

    /// Closes the connection; pending requests fail.
    pub fn close(&self) {
        lock(&self.writer).shutdown();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn op_name(r: &Request) -> &'static str {
    match r {
        Request::Hello(_) => "hello",
        Request::Login(_) => "login",
        Request::Update { .. } => "put",
        Request::Fetch { .. } => "get",
        Request::Punch { .. } => "delete",
        Request::ListDkeys { .. } | Request::ListAkeys { .. } | Request::ListValues { .. } => {
            "list"
        }
        Request::CondUpdate { .. } => "conditional put",
        Request::ExtentWrite { .. } => "extent write",
        Request::ExtentRead { .. } => "extent read",
        Request::ExtentList { .. } => "extent list",
        Request::BulkWrite { .. } => "bulk extent write",
        Request::BulkRead { .. } => "bulk extent read",
        Request::Batch(_) => "batch",
        Request::Stat => "stat",
        Request::Sync => "sync",
        Request::ListObjects { .. } => "list objects",
        Request::Verify { .. } => "verify",
        Request::RegionRead { .. } => "region read",
    }
}

fn fail_all(shared: &Shared, detail: &str) {
    let sinks: Vec<Sink> = {
        let mut p = lock(&shared.pending);
        if p.dead.is_none() {
            p.dead = Some(detail.to_string());
        }
        shared.dead.store(true, Ordering::Release);
        p.sinks.drain().map(|(_, s)| s).collect()
    };
    for s in sinks {
        s.deliver(Err(Error::Disconnected {
            url: shared.url.clone(),
            op: "request",
            detail: detail.to_string(),
        }));
    }
}

/// The reader thread: frames in, replies out to their sinks.
fn read_replies(mut stream: Stream, shared: Arc<Shared>) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    let detail = loop {
        match next_frame(&mut stream, &mut buf, &mut chunk) {
            Ok(Some((header, body))) => {
                let answer = rpc::decode_reply(&header, &body).map_err(|e| Error::Protocol {
                    url: shared.url.clone(),
                    detail: e.to_string(),
                });
                if header.request_id == 0 {
                    break match answer {
                        Ok(Reply::Error { code, message }) => {
                            format!("engine closed the connection: {code:?}: {message}")
                        }
                        _ => "engine sent an unsolicited frame".to_string(),
                    };
                }
                let sink = lock(&shared.pending).sinks.remove(&header.request_id);
                if let Some(s) = sink {
                    s.deliver(answer);
                }
            }
            Ok(None) => break "engine closed the connection".to_string(),
            Err(e) => break e,
        }
    };
    stream.shutdown();
    fail_all(&shared, &detail);
}

/// Reads until one whole frame is buffered; `None` at a clean end of stream.
fn next_frame(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
) -> std::result::Result<Option<(rpc::FrameHeader, Vec<u8>)>, String> {
    loop {
        match rpc::split_frame(buf, MAX_REPLY_BODY_BYTES) {
            Err(e) => return Err(format!("bad frame from engine: {e}")),
            Ok(Some((header, len))) if buf.len() >= len => {
                let body = buf[rpc::HEADER_BYTES..len].to_vec();
                buf.drain(..len);
                return Ok(Some((header, body)));
            }
            // A big body (ior transfers) is read straight into its own
            // buffer: one copy out of the kernel instead of three.
            Ok(Some((header, len))) if len - rpc::HEADER_BYTES > chunk.len() => {
                let mut body = buf.split_off(rpc::HEADER_BYTES);
                buf.clear();
                read_rest(stream, &mut body, len - rpc::HEADER_BYTES)?;
                return Ok(Some((header, body)));
            }
            Ok(_) => {}
        }
        match read_some(stream, chunk)? {
            0 if buf.is_empty() => return Ok(None),
            0 => return Err("engine closed the connection mid-frame".into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One `read`, retried when interrupted.
fn read_some(stream: &mut Stream, into: &mut [u8]) -> std::result::Result<usize, String> {
    loop {
        match stream.read(into) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
}

/// Reads into `body` (which holds fewer than `len` bytes) until it holds `len`.
fn read_rest(
    stream: &mut Stream,
    body: &mut Vec<u8>,
    len: usize,
) -> std::result::Result<(), String> {
    let mut have = body.len();
    body.resize(len, 0);
    while have < len {
        match read_some(stream, &mut body[have..])? {
            0 => return Err("engine closed the connection mid-frame".into()),
            n => have += n,
        }
    }
    Ok(())
}

/// Reads one whole reply frame during the handshake, collecting any fds.
fn handshake_frame(stream: &mut Stream, url: &EngineUrl, fds: &mut Vec<OwnedFd>) -> Result<Reply> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    let gone = |detail: String| Error::Disconnected {
        url: url.to_string(),
        op: "handshake",
        detail,
    };
    loop {
        if let Some((header, len)) = rpc::split_frame(&buf, MAX_REPLY_BODY_BYTES)? {
            if buf.len() >= len {
                if buf.len() > len {
                    return Err(Error::Protocol {
                        url: url.to_string(),
                        detail: "bytes after a handshake reply".into(),
                    });
                }
                let reply = rpc::decode_reply(&header, &buf[rpc::HEADER_BYTES..len])?;
                return Ok(reply);
            }
        }
        let n = match stream {
            Stream::Unix(s) => {
                let (n, got) = recv_with_fds(s, &mut chunk)?;
                fds.extend(got);
                n
            }
            Stream::Tcp(_) => stream.read(&mut chunk).map_err(|e| gone(e.to_string()))?,
        };
        if n == 0 {
            return Err(gone(
                "engine closed the connection during the handshake".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn refused(url: &EngineUrl, reply: Reply, want: &str) -> Error {
    match reply {
        Reply::Error { code, message } => Error::Remote {
            op: "handshake",
            status: code as u16,
            message,
        },
        other => Error::Protocol {
            url: url.to_string(),
            detail: format!("expected {want}, got {other:?}"),
        },
    }
}

fn handshake(stream: &mut Stream, url: &EngineUrl, opts: &ConnectOptions) -> Result<Session> {
    let gone = |e: std::io::Error| Error::Disconnected {
        url: url.to_string(),
        op: "handshake",
        detail: e.to_string(),
    };
    let mut client_nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut client_nonce);
    let want_shm = opts.want_shm && matches!(stream, Stream::Unix(_));
    let bulk_fd = opts.bulk_fd.filter(|_| matches!(stream, Stream::Unix(_)));
    let hello = Hello {
        flags: if want_shm { HELLO_WANT_SHM } else { 0 }
            | if bulk_fd.is_some() {
                HELLO_BULK_REGION
            } else {
                0
            },
        client_nonce,
    };
    let mut frame = Vec::new();
    rpc::encode_request(1, &Request::Hello(hello), &mut frame);
    stream.write_all(&frame).map_err(gone)?;
    let mut fds = Vec::new();
    let challenge = match handshake_frame(stream, url, &mut fds)? {
        Reply::Challenge(c) => c,
        other => return Err(refused(url, other, "a challenge")),
    };
    let token = opts.token.as_deref();
    let proof = match (challenge.auth, token) {
        (AUTH_TOKEN_HMAC_SHA256, Some(t)) => login_proof(t, &challenge.server_nonce, &client_nonce),
        (AUTH_TOKEN_HMAC_SHA256, None) => {
            return Err(Error::InvalidArgument(format!(
                "engine at {url} requires a token (--token or FERRITE_TOKEN)"
            )))
        }
        _ => [0; 32],
    };
    frame.clear();
    rpc::encode_request(2, &Request::Login(Login { proof }), &mut frame);
    send_login(stream, &frame, bulk_fd).map_err(|e| Error::Disconnected {
        url: url.to_string(),
        op: "handshake",
        detail: e.to_string(),
    })?;
    let welcome = match handshake_frame(stream, url, &mut fds)? {
        Reply::Welcome(w) => w,
        other => return Err(refused(url, other, "a welcome")),
    };
    if let (AUTH_TOKEN_HMAC_SHA256, Some(t)) = (challenge.auth, token) {
        if welcome.server_proof != engine_proof(t, &challenge.server_nonce, &client_nonce) {
            return Err(Error::Protocol {
                url: url.to_string(),
                detail: "engine does not hold the token (bad server proof)".into(),
            });
        }
    }
    let attached = welcome.flags & WELCOME_FDS_ATTACHED != 0;
    if attached && fds.len() != welcome.regions.len() {
        return Err(Error::Protocol {
            url: url.to_string(),
            detail: format!(
                "welcome lists {} regions but carried {} fds",
                welcome.regions.len(),
                fds.len()
            ),
        });
    }
    let bulk_mapped = bulk_fd.is_some() && welcome.flags & WELCOME_BULK_MAPPED != 0;
    Ok(Session {
        welcome,
        fds,
        bulk_mapped,
    })
}

/// Sends the Login frame, with the bulk region's fd on its first bytes when
/// one is offered.
fn send_login(stream: &mut Stream, frame: &[u8], bulk_fd: Option<RawFd>) -> Result<()> {
    let sent = match (&*stream, bulk_fd) {
        (Stream::Unix(s), Some(fd)) => send_with_fds(s, frame, &[fd])?,
        _ => 0,
    };
    stream
        .write_all(&frame[sent..])
        .map_err(|e| Error::io("send login", e))
}
