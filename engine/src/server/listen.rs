//! Listeners: xstream 0 accepts TCP and Unix connections and hands each one
//! to an xstream in turn (round robin), which serves it from then on.
//!
//! The Unix socket is made 0660 and checks each peer's credentials
//! (`SO_PEERCRED`) at accept: the engine's own uid and root are admitted,
//! and the uids and gids of `[listen] allow_uids` / `allow_gids`. A refused
//! peer gets one Error frame (code 3, unauthenticated, request id 0) before
//! anything else, and is logged with its uid, gid and pid.
//!
//! An accept that fails for want of resources (EMFILE, ENFILE, ENOBUFS,
//! ENOMEM: the engine is out of file descriptors) is retried after a pause
//! of 10 ms doubling to 1 s ([`AcceptBackoff`]) instead of at once, which
//! would spin the listener at full CPU; the first failure of a burst and
//! the recovery are logged, not every retry.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
use futures::FutureExt;
use glommio::net::TcpListener;

use super::conn::{serve, Transport};
use super::datadir::{set_mode, SOCKET_MODE};
use super::{ServerError, Shared};
use crate::config::ListenConfig;
use ferrite_proto::rpc::{self, ErrorCode, MessageType, Reply};
use ferrite_xstream::{TaskClass, XstreamId};

/// How long a refused Unix peer's error frame may take to write.
const REFUSE_WRITE_TIMEOUT: Duration = Duration::from_millis(200);
/// First pause after an accept failed for want of resources.
const ACCEPT_PAUSE_FIRST: Duration = Duration::from_millis(10);
/// Longest pause between accepts that keep failing.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Paces a listener whose accepts keep failing for want of resources
/// (the process is out of file descriptors): pauses of 10 ms doubling to
/// 1 s, one log line when a burst of failures starts and one when an
/// accept works again.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    failures: u64,
    pause: Duration,
}

impl AcceptBackoff {
    /// Notes a failed accept on `listener`: the pause before the next one,
    /// or `None` to go on at once (the failure was that one connection's,
    /// e.g. aborted before it was accepted).
    pub(crate) fn failed(&mut self, listener: &str, e: &std::io::Error) -> Option<Duration> {
        let scarce = matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        );
        if !scarce {
            tracing::warn!(listener, error = %e, "accept failed");
            return None;
        }
        self.pause = match self.failures {
            0 => {
                tracing::warn!(
                    listener,
                    error = %e,
                    "accept failing: retrying every 10 ms to 1 s until it works"
                );
                ACCEPT_PAUSE_FIRST
            }
            _ => (self.pause * 2).min(ACCEPT_PAUSE_MAX),
        };
        self.failures += 1;
        Some(self.pause)
    }

    /// Notes an accept that worked, ending a burst of failures.
    pub(crate) fn succeeded(&mut self, listener: &str) {
        if self.failures > 0 {
            tracing::warn!(listener, failures = self.failures, "accept works again");
            self.failures = 0;
        }
    }
}

/// Who may connect to the Unix socket, by the peer's credentials.
#[derive(Debug, Clone)]
pub(crate) struct PeerPolicy {
    engine_uid: u32,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

/// A Unix peer's credentials, as `SO_PEERCRED` reports them (at connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCred {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl PeerPolicy {
    pub(crate) fn new(listen: &ListenConfig) -> Self {
        Self {
            // SAFETY: geteuid has no preconditions and cannot fail.
            engine_uid: unsafe { libc::geteuid() },
            uids: listen.allow_uids.clone(),
            gids: listen.allow_gids.clone(),
        }
    }

    /// Root, the engine's uid, or a configured uid or gid.
    pub(crate) fn admits(&self, peer: &PeerCred) -> bool {
        peer.uid == 0
            || peer.uid == self.engine_uid
            || self.uids.contains(&peer.uid)
            || self.gids.contains(&peer.gid)
    }
}

/// The credentials of the peer of Unix socket `fd`.
pub(crate) fn peer_cred(fd: &impl AsRawFd) -> std::io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a plain
    // struct of that size, and the new length into `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Checks a new Unix connection's peer; a refused one is told why (one
/// Error frame) and logged. True when it may go on to the handshake.
fn admit(conn: &mut std::os::unix::net::UnixStream, policy: &PeerPolicy) -> bool {
    let message = match peer_cred(conn) {
        Ok(peer) if policy.admits(&peer) => return true,
        Ok(peer) => {
            tracing::warn!(
                uid = peer.uid,
                gid = peer.gid,
                pid = peer.pid,
                "unix socket peer refused: uid not allowed (listen.allow_uids / allow_gids)"
            );
            format!(
                "uid {} (gid {}) may not use this engine: not its uid, root, or in \
                 listen.allow_uids / allow_gids",
                peer.uid, peer.gid
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "unix socket peer refused: no peer credentials");
            format!("peer credentials unavailable: {e}")
        }
    };
    let mut out = Vec::new();
    let reply = Reply::error(ErrorCode::Unauthenticated, message);
    rpc::encode_reply(MessageType::Error, 0, &reply, &mut out);
    let _ = conn.set_write_timeout(Some(REFUSE_WRITE_TIMEOUT));
    let _ = conn.write_all(&out);
    false
}

/// Binds `addr` on the calling xstream and starts accepting; returns the
/// bound address (the real port when `addr` had port 0).
pub(crate) fn start_tcp(
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: oneshot::Receiver<()>,
) -> Result<SocketAddr, ServerError> {
    let listen_error = |source: std::io::Error| ServerError::Listen {
        address: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).map_err(|e| listen_error(e.into()))?;
    let bound = listener.local_addr().map_err(|e| listen_error(e.into()))?;
    let task = async move {
        let mut stop = stop.fuse();
        let mut backoff = AcceptBackoff::default();
        loop {
            let accepted = futures::select! {
                a = listener.shared_accept().fuse() => a,
                _ = stop => break,
            };
            let conn = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    let Some(pause) = backoff.failed("tcp", &e.into()) else {
                        continue;
                    };
                    futures::select! {
                        _ = glommio::timer::sleep(pause).fuse() => continue,
                        _ = stop => break,
                    }
                }
            };
            backoff.succeeded("tcp");
            hand_over(&shared, move |shared| async move {
                let stream = conn.bind_to_executor();
                let _ = stream.set_nodelay(true);
                let fd = stream.as_raw_fd();
                serve(stream, fd, shared, Transport::Tcp).await;
            })
            .await;
        }
    };
    ferrite_xstream::spawn(TaskClass::Control, task)
        .map_err(|e| ServerError::Config(e.to_string()))?
        .detach();
    Ok(bound)
}

/// The Unix socket's accept thread. glommio's Unix streams do not expose
/// their fd, which the shm handshake needs for `SCM_RIGHTS`, so a plain
/// thread accepts and hands the fd to an xstream that wraps it.
#[derive(Debug)]
pub(crate) struct UnixAcceptor {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UnixAcceptor {
    /// Binds the Unix socket at `path` (replacing a stale one) and starts
    /// accepting.
    pub(crate) fn start(shared: Arc<Shared>, path: PathBuf) -> Result<Self, ServerError> {
        let listen_error = |source: std::io::Error| ServerError::Listen {
            address: path.display().to_string(),
            source,
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(listen_error(e)),
        }
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(listen_error)?;
        set_mode(&path, SOCKET_MODE, "chmod 0660 unix socket")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ferrite-unix-accept".into())
            .spawn(move || accept_unix(&listener, &shared, &stopping))
            .map_err(listen_error)?;
        Ok(Self {
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops accepting, joins the thread and removes the socket file.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for UnixAcceptor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_unix(
    listener: &std::os::unix::net::UnixListener,
    shared: &Arc<Shared>,
    stop: &AtomicBool,
) {
    let mut backoff = AcceptBackoff::default();
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                if let Some(pause) = backoff.failed("unix", &e) {
                    std::thread::sleep(pause);
                }
                continue;
            }
        };
        backoff.succeeded("unix");
        if !admit(&mut conn, &shared.peers) {
            continue;
        }
        let fd = OwnedFd::from(conn);
        futures::executor::block_on(hand_over(shared, move |shared| async move {
            let raw = fd.into_raw_fd();
            // SAFETY: `raw` is a connected Unix stream socket we own (taken
            // from an OwnedFd); the glommio stream takes ownership.
            let stream = unsafe { glommio::net::UnixStream::from_raw_fd(raw) };
            serve(stream, raw, shared, Transport::Unix).await;
        }));
    }
}

/// Runs `serve_it` on the next xstream in turn.
async fn hand_over<F, Fut>(shared: &Arc<Shared>, serve_it: F)
where
    F: FnOnce(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let n = shared.target_count() as usize;
    let xs = XstreamId(shared.next_xstream.fetch_add(1, Ordering::Relaxed) % n);
    let for_task = shared.clone();
    let sent = shared
        .mesh
        .send(xs, TaskClass::Foreground, move || serve_it(for_task))
        .await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, xstream = xs.0, "could not hand over a connection");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Out of descriptors: pauses double from 10 ms to 1 s and start over
    /// after an accept works; a failure of one connection is not paced.
    #[test]
    fn accept_backoff_doubles_to_a_second_and_resets() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut b = AcceptBackoff::default();
        let pauses: Vec<u128> = (0..10)
            .map(|_| b.failed("tcp", &emfile).unwrap().as_millis())
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        b.succeeded("tcp");
        assert_eq!(b.failed("tcp", &emfile), Some(ACCEPT_PAUSE_FIRST));
        let aborted = std::io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(b.failed("tcp", &aborted), None);
    }
}
