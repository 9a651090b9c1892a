//! One connection to an engine: handshake, then pipelined requests matched
//! to replies by request id. Any number of threads may send on it at once;
//! replies arrive in any order and are read by a caller waiting for its own
//! or by the connection's reader thread ([`super::reader`]).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrite_proto::rpc::handshake::{
    check_token, engine_proof, login_proof, AUTH_NONE, AUTH_TOKEN_HMAC_SHA256, HELLO_BULK_REGION,
    HELLO_WANT_SHM, NONCE_BYTES, WELCOME_BULK_MAPPED, WELCOME_FDS_ATTACHED,
};
use ferrite_proto::rpc::{self, Hello, Login, Reply, Request, Welcome};
use rand::RngCore;

use crate::client::error::{Error, Result};
use crate::client::reader::{fail_all, lock, Shared};
use crate::client::spin::SpinPolicy;
use crate::client::url::EngineUrl;
use crate::client::waiter::{Answer, ReplyFuture, Sink, Waiter};
use crate::fabric::shm::{recv_with_fds, send_with_fds};

/// Largest reply body this client accepts.
pub const REPLY_BODY_BYTES_MAX: usize = rpc::BODY_BYTES_MAX;

pub(crate) enum Stream {
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
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
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
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Self::Tcp(s) => s.shutdown(Shutdown::Both),
            Self::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// How to open a connection.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Shared secret: required over TCP (every TCP listener asks for it; a
    /// TCP engine that does not is refused), unused on the Unix socket.
    pub token: Option<Vec<u8>>,
    /// Ask for shm region fds (Unix socket only).
    pub want_shm: bool,
    /// Offer this bulk region's memory file (a sealed memfd, see
    /// [`super::bulk`]) with the Login (Unix socket only); the caller keeps
    /// the fd open until the handshake returned.
    pub bulk_fd: Option<RawFd>,
    /// How long a caller blocked on its reply polls the socket before it
    /// sleeps, where it may ([`super::spin`]); zero: it sleeps at once.
    pub reply_spin: Duration,
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

/// A handshaken, pipelined connection.
pub struct Connection {
    shared: Arc<Shared>,
    writer: Mutex<Stream>,
    next_id: AtomicU64,
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
        let targets = &session.welcome.targets;
        let cpus = ferrite_xstream::process_cores().unwrap_or_default();
        let spin = SpinPolicy::new(opts.reply_spin, targets, url.is_loopback(), &cpus);
        let shared = Shared::start(url.to_string(), reader, timeout, spin)
            .map_err(|e| Error::io("spawn connection reader", e))?;
        let conn = Self {
            shared,
            writer: Mutex::new(stream),
            next_id: AtomicU64::new(16),
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

    /// Replies read on this connection by the callers waiting for them,
    /// by callers polling for them (a subset of those), and in all.
    pub fn replies_read(&self) -> (u64, u64, u64) {
        self.shared.replies_read()
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

    /// Sends one request under a new id, which it returns; its reply (or
    /// the error that replaces it) goes to `sink`.
    fn send(&self, request: &Request, sink: Sink) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(64);
        rpc::encode_request(id, request, &mut frame);
        {
            let mut p = lock(&self.shared.pending);
            if let Some(d) = p.dead.clone() {
                drop(p);
                sink.deliver(Err(self.disconnected(op_name(request), d)));
                return id;
            }
            p.sinks.insert(id, sink);
        }
        let written = lock(&self.writer).write_all(&frame);
        if let Err(e) = written {
            let detail = format!("write failed: {e}");
            let own = lock(&self.shared.pending).sinks.remove(&id);
            fail_all(&self.shared, &detail);
            if let Some(sink) = own {
                sink.deliver(Err(self.disconnected(op_name(request), detail)));
            }
        }
        id
    }

    /// Sends a request and returns its reply as a future.
    pub fn request_async(&self, request: &Request) -> ReplyFuture {
        let waiter = Arc::new(Waiter::default());
        let id = self.send(request, Sink::Waiter(waiter.clone()));
        ReplyFuture {
            waiter,
            conn: self.shared.clone(),
            id,
            op: op_name(request),
        }
    }

    /// Sends a request whose reply completes `event`.
    pub fn request_event(&self, request: &Request, event: ferrite_xstream::Event<Answer>) {
        self.send(request, Sink::Event(event));
        self.shared.kick();
    }

    /// Sends a request and blocks for its reply (up to the timeout).
    pub fn request(&self, request: &Request) -> Result<Reply> {
        self.request_async(request).wait()
    }

    /// Closes the connection; pending requests fail.
    pub fn close(&self) {
        lock(&self.writer).shutdown();
        self.shared.close();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
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

/// The token for a connection to `url`: `given`, else over TCP what
/// [`crate::auth::find_token`] finds; a TCP engine without one is an error
/// that lists where it looked. None on the Unix socket when none is given.
pub fn token_for(url: &EngineUrl, given: Option<Vec<u8>>) -> Result<Option<Vec<u8>>> {
    if given.is_some() || matches!(url, EngineUrl::Unix { .. }) {
        return Ok(given);
    }
    match crate::auth::find_token(None, None)? {
        Some(token) => Ok(Some(token)),
        None => Err(Error::Unauthenticated(format!(
            "engine at {url} requires a token and none was found (looked at {})",
            crate::auth::sources_looked_at(None)
        ))),
    }
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
        if let Some((header, len)) = rpc::split_frame(&buf, REPLY_BODY_BYTES_MAX)? {
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

/// The Login proof answering `challenge`; refuses a TCP engine that asks
/// for none, and goes no further without a token when one is asked for.
fn proof_for(
    url: &EngineUrl,
    tcp: bool,
    challenge: &ferrite_proto::rpc::Challenge,
    token: Option<&[u8]>,
    client_nonce: &[u8; NONCE_BYTES],
) -> Result<[u8; 32]> {
    Ok(match (challenge.auth, token) {
        (AUTH_TOKEN_HMAC_SHA256, Some(t)) => login_proof(t, &challenge.server_nonce, client_nonce),
        (AUTH_TOKEN_HMAC_SHA256, None) => {
            return Err(Error::Unauthenticated(format!(
                "engine at {url} requires a token (--token-file, FERRITE_TOKEN or \
                 FERRITE_TOKEN_FILE)"
            )))
        }
        // No downgrade: every TCP listener of an engine asks for the token,
        // so a TCP peer that does not is not one (or is misconfigured).
        (AUTH_NONE, _) if tcp => {
            return Err(Error::Unauthenticated(format!(
                "engine at {url} offers no authentication over TCP; refusing to send \
                 anything to it"
            )))
        }
        _ => [0; 32],
    })
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
    let tcp = matches!(stream, Stream::Tcp(_));
    let token = opts.token.as_deref();
    if let Some(t) = token {
        check_token(t, "the client's token").map_err(|e| Error::Unauthenticated(e.to_string()))?;
    }
    let mut frame = Vec::new();
    rpc::encode_request(1, &Request::Hello(hello), &mut frame);
    let mut fds = Vec::new();
    if let Err(e) = stream.write_all(&frame) {
        // An engine that refused this peer at accept wrote why and closed:
        // that reply beats "broken pipe".
        return Err(match handshake_frame(stream, url, &mut fds) {
            Ok(reply @ Reply::Error { .. }) => refused(url, reply, "a challenge"),
            _ => gone(e),
        });
    }
    let challenge = match handshake_frame(stream, url, &mut fds)? {
        Reply::Challenge(c) => c,
        other => return Err(refused(url, other, "a challenge")),
    };
    let proof = proof_for(url, tcp, &challenge, token, &client_nonce)?;
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
            return Err(Error::Unauthenticated(format!(
                "engine at {url} does not hold the token (bad server proof)"
            )));
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
