//! Listeners: xstream 0 accepts TCP and Unix connections and hands each one
//! to an xstream in turn (round robin), which serves it from then on.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::channel::oneshot;
use futures::FutureExt;
use glommio::net::TcpListener;

use super::conn::{serve, Transport};
use super::{ServerError, Shared};
use ferrite_xstream::{TaskClass, XstreamId};

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
        loop {
            let accepted = futures::select! {
                a = listener.shared_accept().fuse() => a,
                _ = stop => break,
            };
            match accepted {
                Ok(conn) => {
                    hand_over(&shared, move |shared| async move {
                        let stream = conn.bind_to_executor();
                        let _ = stream.set_nodelay(true);
                        let fd = stream.as_raw_fd();
                        serve(stream, fd, shared, Transport::Tcp).await;
                    })
                    .await
                }
                Err(e) => tracing::warn!(error = %e, "tcp accept failed"),
            }
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
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "unix accept failed");
                continue;
            }
        };
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
