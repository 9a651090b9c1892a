//! The engine's side of the handshake (see `ferrite_proto::rpc::handshake`):
//! Hello → Challenge, Login → Welcome. Every TCP connection must prove it
//! holds the engine's token (there is always one: configured, or generated
//! in the data dir); on the Unix socket the peer's credentials were checked
//! at accept ([`super::listen::PeerPolicy`]) and the Challenge offers no
//! token auth. A client on the Unix socket that asks
//! for shm gets the regions' memory files with the Welcome (`SCM_RIGHTS`);
//! one that offers a bulk region sends its memory file with the Login, and
//! the engine maps it for the connection's life ([`super::bulk`]).

use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use ferrite_proto::rpc::handshake::{
    engine_proof, verify_login_proof, AUTH_NONE, AUTH_TOKEN_HMAC_SHA256, HELLO_BULK_REGION,
    HELLO_WANT_SHM, NONCE_BYTES, PROOF_BYTES, WELCOME_BULK_MAPPED, WELCOME_FDS_ATTACHED,
    WELCOME_SERVED_BY,
};
use ferrite_proto::rpc::{
    self, Challenge, ErrorCode, FrameHeader, MessageType, Reply, Request, Welcome, HEADER_BYTES,
};
use futures::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use rand::RngCore;

use super::bulk::{recvmsg_fds, BulkRegion};
use super::conn::{read_body, read_header, FrameError, Transport};
use super::Shared;

/// The frame limit of a connection that has not logged in: handshake
/// bodies are tiny (Hello 20 bytes, Login 32), so a header announcing more
/// is refused (error 2, oversized) and the connection closed before any
/// body is read or a buffer for it allocated.
pub(crate) const PRE_AUTH_BODY_MAX_BYTES: usize = 64;
/// Attempts at sending the Welcome with its fds when the socket is full.
const SEND_FDS_ATTEMPTS: usize = 1000;
/// Pause between looks for a Login that carries a bulk region's fd.
const RECV_FDS_PAUSE: Duration = Duration::from_micros(50);

fn refused(code: ErrorCode, message: impl Into<String>) -> FrameError {
    FrameError::Refused(code, message.into())
}

async fn expect<R: AsyncRead + Unpin>(
    rd: &mut R,
    want: MessageType,
) -> Result<(u64, Request), FrameError> {
    let Some(header) = read_header(rd, PRE_AUTH_BODY_MAX_BYTES).await? else {
        return Err(FrameError::Gone);
    };
    check_header(&header, want)?;
    Ok((header.request_id, read_body(rd, &header).await?))
}

fn check_header(header: &FrameHeader, want: MessageType) -> Result<(), FrameError> {
    if header.kind != want || header.is_reply() {
        return Err(refused(
            ErrorCode::Unauthenticated,
            format!(
                "expected {want:?} before anything else, got {:?}",
                header.kind
            ),
        ));
    }
    Ok(())
}

/// Reads the Login frame whose first bytes carry the client's bulk region
/// fd: the header with `recvmsg` straight from socket `fd` (the buffered
/// reader holds nothing: the client sends its Login only after our
/// Challenge), the body through `rd`. Returns the frame and the fd, if one
/// came.
async fn expect_login_with_fd<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    fd: RawFd,
) -> Result<(u64, Request, Option<OwnedFd>), FrameError> {
    if !rd.buffer().is_empty() {
        return Err(refused(
            ErrorCode::Malformed,
            "Login sent before the Challenge",
        ));
    }
    let mut head = [0u8; HEADER_BYTES];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < HEADER_BYTES {
        match recvmsg_fds(fd, &mut head[got..], libc::MSG_DONTWAIT) {
            Ok((0, _)) => return Err(FrameError::Gone),
            Ok((n, more)) => {
                got += n;
                fds.extend(more);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                glommio::timer::sleep(RECV_FDS_PAUSE).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(FrameError::Gone),
        }
    }
    let header =
        FrameHeader::decode(&head, PRE_AUTH_BODY_MAX_BYTES).map_err(FrameError::malformed)?;
    check_header(&header, MessageType::Login)?;
    let login = read_body(rd, &header).await?;
    Ok((header.request_id, login, fds.into_iter().next()))
}

/// Maps the bulk region the client sent, or says why not (the client then
/// goes on without it: the Welcome does not carry [`WELCOME_BULK_MAPPED`]).
fn map_bulk(fd: Option<OwnedFd>) -> Option<Arc<BulkRegion>> {
    let Some(fd) = fd else {
        tracing::debug!("a client offered a bulk region but sent no fd");
        return None;
    };
    match BulkRegion::map(fd) {
        Ok(region) => Some(Arc::new(region)),
        Err(reason) => {
            tracing::debug!(reason, "bulk region refused");
            None
        }
    }
}

/// Runs the handshake; on success the connection may send data requests,
/// with the client's bulk region when it offered one the engine mapped.
pub(crate) async fn run<R, W>(
    rd: &mut BufReader<R>,
    wr: &mut W,
    fd: RawFd,
    shared: &Shared,
    transport: Transport,
) -> Result<Option<Arc<BulkRegion>>, FrameError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (hello_id, hello) = match expect(rd, MessageType::Hello).await? {
        (id, Request::Hello(h)) => (id, h),
        _ => return Err(refused(ErrorCode::Malformed, "bad Hello")),
    };
    let auth = transport == Transport::Tcp;
    let mut server_nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut server_nonce);
    let challenge = Reply::Challenge(Challenge {
        auth: if auth {
            AUTH_TOKEN_HMAC_SHA256
        } else {
            AUTH_NONE
        },
        server_nonce,
    });
    let mut out = Vec::new();
    rpc::encode_reply(MessageType::Hello, hello_id, &challenge, &mut out);
    send(wr, &out).await?;

    let bulk_offered = transport == Transport::Unix && hello.flags & HELLO_BULK_REGION != 0;
    let login = if bulk_offered {
        expect_login_with_fd(rd, fd).await?
    } else {
        let (id, login) = expect(rd, MessageType::Login).await?;
        (id, login, None)
    };
    let (login_id, proof, bulk_fd) = match login {
        (id, Request::Login(l), bulk_fd) => (id, l.proof, bulk_fd),
        _ => return Err(refused(ErrorCode::Malformed, "bad Login")),
    };
    let mut server_proof = [0u8; PROOF_BYTES];
    if auth {
        let token = &shared.token;
        if !verify_login_proof(token, &server_nonce, &hello.client_nonce, &proof) {
            tracing::warn!("tcp login refused: wrong token proof");
            return Err(refused(ErrorCode::Unauthenticated, "wrong token proof"));
        }
        server_proof = engine_proof(token, &server_nonce, &hello.client_nonce);
    }
    let bulk = if bulk_offered {
        map_bulk(bulk_fd)
    } else {
        None
    };
    let bulk_flag = if bulk.is_some() {
        WELCOME_BULK_MAPPED
    } else {
        0
    };
    let shm = transport == Transport::Unix && hello.flags & HELLO_WANT_SHM != 0;
    let exports = match (&shared.shm, shm) {
        (Some(f), true) => f.exports(),
        _ => Vec::new(),
    };
    let regions = if exports.is_empty() {
        shared.tcp_descriptors()
    } else {
        exports.iter().map(|(_, d)| *d).collect()
    };
    let served_by = ferrite_xstream::current().map(|x| x.0 as u16);
    let fds_flag = if exports.is_empty() {
        0
    } else {
        WELCOME_FDS_ATTACHED
    };
    let welcome = Reply::Welcome(Welcome {
        flags: fds_flag | bulk_flag | served_by.map_or(0, |_| WELCOME_SERVED_BY),
        served_by: served_by.unwrap_or(0),
        incarnation: shared.incarnation,
        server_proof,
        targets: shared.target_map(),
        regions,
    });
    let mut out = Vec::new();
    rpc::encode_reply(MessageType::Login, login_id, &welcome, &mut out);
    if exports.is_empty() {
        send(wr, &out).await?;
        return Ok(bulk);
    }
    let fds: Vec<RawFd> = exports.iter().map(|(r, _)| r.raw_fd()).collect();
    let sent = send_with_fds(fd, &out, &fds).await?;
    // `exports` keeps the regions (and so their fds) alive until here.
    drop(exports);
    send(wr, &out[sent..]).await?;
    Ok(bulk)
}

async fn send<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> Result<(), FrameError> {
    wr.write_all(bytes).await.map_err(|_| FrameError::Gone)?;
    wr.flush().await.map_err(|_| FrameError::Gone)
}

/// Sends the start of `bytes` with `fds` as `SCM_RIGHTS` on socket `fd`;
/// returns how many bytes went out (at least one, carrying the fds).
async fn send_with_fds(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> Result<usize, FrameError> {
    for _ in 0..SEND_FDS_ATTEMPTS {
        match sendmsg_fds(fd, bytes, fds) {
            Ok(n) if n > 0 => return Ok(n),
            Ok(_) => return Err(FrameError::Gone),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                glommio::executor().yield_task_queue_now().await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(FrameError::Gone),
        }
    }
    Err(FrameError::Gone)
}

fn sendmsg_fds(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation on a length.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes, enough for one cmsghdr
    // with `fd_bytes` of data, so CMSG_FIRSTHDR is non-null and its data
    // area holds `fds.len()` descriptors.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
    }
    // SAFETY: fd is the connection's socket; msg and the buffers it points at
    // live across the call. MSG_DONTWAIT keeps the xstream from blocking.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}
