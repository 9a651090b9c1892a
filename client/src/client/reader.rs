//! Reading a connection's replies: whoever holds the read side reads for
//! everyone.
//!
//! A caller blocked on its own reply ([`ReplyFuture::wait`], and so every
//! synchronous request and batch) takes the read side when nobody holds it
//! and reads until its reply is there, delivering the other replies it meets
//! to their owners. Its round trip then costs one wake-up, the engine's reply
//! waking the caller itself, instead of two (a reader thread woken by the
//! reply, then the caller woken by the reader thread); on a virtual machine
//! each is a context switch and often an exit.
//!
//! Replies owed to someone who does not read (a future polled by an
//! executor, an [`EventQueue`](ferrite_xstream::EventQueue) event, a caller
//! that found the read side taken) are read by the connection's background
//! thread. It sleeps until *kicked*, then reads while anything is pending
//! and sleeps again: a caller that releases the read side with replies still
//! owed kicks it, and so do futures when they are first polled and events
//! when they are sent. The kick and the thread's "nothing pending, sleep"
//! check go through one lock, so a request registered just as the thread
//! stops reading still wakes it.
//!
//! Before it sleeps for its reply, such a caller polls the socket for a
//! while where that is allowed ([`super::spin`]); the background reader
//! always sleeps.
//!
//! Lock order: `wake`, then `pending`; `side` is taken before either and
//! never while holding them.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use ferrite_proto::rpc::{self, Reply};

use crate::client::conn::{Stream, REPLY_BODY_BYTES_MAX};
use crate::client::error::Error;
use crate::client::spin::SpinPolicy;
use crate::client::waiter::{Answer, Sink, Waiter};

/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Replies owed, by request id.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) sinks: HashMap<u64, Sink>,
    /// Set once the connection is gone; nothing more will be answered.
    pub(crate) dead: Option<String>,
}

/// The socket's read half and the bytes read from it but not yet delivered
/// (a frame can be cut between two holders' reads).
struct ReadSide {
    stream: Stream,
    buf: Vec<u8>,
    chunk: Vec<u8>,
}

/// The background reader's state.
#[derive(Default)]
struct Wake {
    /// Awake and reading (or waiting for the read side to read).
    reading: bool,
    /// Asked to read since it last looked.
    kicked: bool,
    /// The connection is closed: exit.
    closed: bool,
}

/// What one connection's senders, waiters and reader share.
pub(crate) struct Shared {
    pub(crate) url: String,
    pub(crate) pending: Mutex<Pending>,
    /// Mirrors `Pending::dead` for lock-free checks on hot paths.
    pub(crate) dead: AtomicBool,
    /// How long a caller waits for a reply.
    pub(crate) timeout: Duration,
    /// Where and how long a caller reading for its reply polls.
    spin: SpinPolicy,
    side: Mutex<ReadSide>,
    wake: Mutex<Wake>,
    wake_cv: Condvar,
    /// Frames delivered by callers reading for their own reply, and in all.
    read_by_caller: AtomicU64,
    read_all: AtomicU64,
    /// Frames whose last bytes a caller got by polling (see [`super::spin`]).
    read_polling: AtomicU64,
}

/// Result of one read step.
enum Step {
    /// A frame was delivered (possibly to nobody: its waiter timed out).
    Delivered,
    /// The deadline passed with no whole frame.
    TimedOut,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Shared state for a connection whose replies arrive on `reader`, and
    /// its background reader thread.
    pub(crate) fn start(
        url: String,
        reader: Stream,
        timeout: Duration,
        spin: SpinPolicy,
    ) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Self {
            url,
            pending: Mutex::new(Pending::default()),
            dead: AtomicBool::new(false),
            timeout,
            spin,
            side: Mutex::new(ReadSide {
                stream: reader,
                buf: Vec::with_capacity(READ_CHUNK_BYTES),
                chunk: vec![0u8; READ_CHUNK_BYTES],
            }),
            wake: Mutex::new(Wake::default()),
            wake_cv: Condvar::new(),
            read_by_caller: AtomicU64::new(0),
            read_all: AtomicU64::new(0),
            read_polling: AtomicU64::new(0),
        });
        let background = shared.clone();
        std::thread::Builder::new()
            .name("ferrite-conn".into())
            .spawn(move || background.background())?;
        Ok(shared)
    }

    /// Someone is owed a reply and will not read: wakes the background
    /// reader unless it is reading already.
    pub(crate) fn kick(&self) {
        let mut w = lock(&self.wake);
        if !w.reading && !w.kicked {
            w.kicked = true;
            self.wake_cv.notify_one();
        }
    }

    /// Replies read by callers waiting for their own, by callers polling
    /// (a subset), and in all.
    pub(crate) fn replies_read(&self) -> (u64, u64, u64) {
        (
            self.read_by_caller.load(Ordering::Relaxed),
            self.read_polling.load(Ordering::Relaxed),
            self.read_all.load(Ordering::Relaxed),
        )
    }

    /// Stops the background reader (the socket is shut down, or broke).
    pub(crate) fn close(&self) {
        lock(&self.wake).closed = true;
        self.wake_cv.notify_one();
    }

    /// The timeout error of request `id`, whose sink is dropped.
    pub(crate) fn timed_out(&self, id: u64, op: &'static str) -> Error {
        lock(&self.pending).sinks.remove(&id);
        Error::Timeout {
            url: self.url.clone(),
            op,
            timeout_ms: self.timeout.as_millis() as u64,
        }
    }

    /// Waits for `waiter`'s answer until `deadline` (`None`: timed out),
    /// reading the socket itself while nobody else does.
    pub(crate) fn wait_reading(&self, waiter: &Waiter, deadline: Instant) -> Option<Answer> {
        loop {
            if let Some(a) = waiter.take() {
                return Some(a);
            }
            let mut side = match self.side.try_lock() {
                Ok(side) => side,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                // Whoever reads delivers to us. The holder may be the
                // background reader just stopping (it found nothing owed
                // before our request was registered): kick it.
                Err(TryLockError::WouldBlock) => {
                    self.kick();
                    return waiter.wait_until(deadline);
                }
            };
            let polling = self.spin.begin();
            let spin = polling.as_ref().map(|p| p.budget);
            let outcome = loop {
                if waiter.is_answered() {
                    break Ok(());
                }
                match self.step(&mut side, Some(deadline), spin) {
                    Ok(Step::Delivered) => {
                        self.read_by_caller.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Step::TimedOut) => break Ok(()),
                    Err(detail) => break Err(detail),
                }
            };
            drop(polling);
            match outcome {
                Ok(()) => {
                    drop(side);
                    if !lock(&self.pending).sinks.is_empty() {
                        self.kick();
                    }
                }
                // Every waiter, this one too, now holds the error.
                Err(detail) => self.broken(&mut side, &detail),
            }
            if let Some(a) = waiter.take() {
                return Some(a);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// The background reader: sleeps until kicked, then reads while any
    /// reply is owed.
    fn background(self: Arc<Self>) {
        loop {
            {
                let mut w = lock(&self.wake);
                while !w.kicked && !w.closed {
                    w = self.wake_cv.wait(w).unwrap_or_else(|e| e.into_inner());
                }
                if w.closed {
                    drop(w);
                    fail_all(&self, "connection closed");
                    return;
                }
                w.kicked = false;
                w.reading = true;
            }
            let mut side = lock(&self.side);
            loop {
                {
                    let mut w = lock(&self.wake);
                    if w.closed {
                        drop(w);
                        fail_all(&self, "connection closed");
                        return;
                    }
                    if lock(&self.pending).sinks.is_empty() {
                        w.reading = false;
                        break;
                    }
                }
                if let Err(detail) = self.step(&mut side, None, None) {
                    self.broken(&mut side, &detail);
                    return;
                }
            }
        }
    }

    /// The connection broke while `side` was read: shuts it down, fails
    /// every pending request with `detail` and stops the background reader.
    fn broken(&self, side: &mut ReadSide, detail: &str) {
        side.stream.shutdown();
        fail_all(self, detail);
        self.close();
    }

    /// Reads one whole frame (waiting at most until `deadline`, polling the
    /// socket for up to `spin` first) and delivers it to its sink; `Err`
    /// when the connection is gone or broke the protocol.
    fn step(
        &self,
        side: &mut ReadSide,
        deadline: Option<Instant>,
        spin: Option<Duration>,
    ) -> Result<Step, String> {
        let ReadSide { stream, buf, chunk } = side;
        let mut polled = false;
        let frame = next_frame(stream, buf, chunk, deadline, spin.map(|s| (s, &mut polled)))?;
        let Some((header, body)) = frame else {
            return Ok(Step::TimedOut);
        };
        if polled {
            self.read_polling.fetch_add(1, Ordering::Relaxed);
        }
        let answer = rpc::decode_reply(&header, &body).map_err(|e| Error::Protocol {
            url: self.url.clone(),
            detail: e.to_string(),
        });
        if header.request_id == 0 {
            return Err(match answer {
                Ok(Reply::Error { code, message }) => {
                    format!("engine closed the connection: {code:?}: {message}")
                }
                _ => "engine sent an unsolicited frame".to_string(),
            });
        }
        // Counted before the delivery, which may end its caller's wait.
        self.read_all.fetch_add(1, Ordering::Relaxed);
        let sink = lock(&self.pending).sinks.remove(&header.request_id);
        if let Some(s) = sink {
            s.deliver(answer);
        }
        Ok(Step::Delivered)
    }
}

/// Marks the connection dead and fails every pending request with `detail`.
pub(crate) fn fail_all(shared: &Shared, detail: &str) {
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

/// Reads until one whole frame is buffered: `Ok(None)` when `deadline`
/// passed first; a clean end of stream is an error (replies were owed).
/// Before it first sleeps for bytes, it polls for them for up to `spin`'s
/// budget, and sets its flag when polling got some.
fn next_frame(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    deadline: Option<Instant>,
    mut spin: Option<(Duration, &mut bool)>,
) -> Result<Option<(rpc::FrameHeader, Vec<u8>)>, String> {
    let mut spin_until = None;
    loop {
        match rpc::split_frame(buf, REPLY_BODY_BYTES_MAX) {
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
        if let Some((budget, polled)) = spin.as_mut() {
            let until = *spin_until.get_or_insert_with(|| Instant::now() + *budget);
            match read_polling(stream.as_raw_fd(), chunk, until)? {
                Some(0) if buf.is_empty() => return Err("engine closed the connection".into()),
                Some(0) => return Err("engine closed the connection mid-frame".into()),
                Some(n) => {
                    **polled = true;
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
                None => {}
            }
        }
        if let Some(deadline) = deadline {
            if !readable_by(stream.as_raw_fd(), deadline)? {
                return Ok(None);
            }
        }
        match read_some(stream, chunk)? {
            0 if buf.is_empty() => return Err("engine closed the connection".into()),
            0 => return Err("engine closed the connection mid-frame".into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads from `fd` without sleeping, trying until bytes come or `until`
/// passes (`None`); `Some(0)` at the end of the stream. Between tries it
/// yields the CPU to whatever else may run there: the kernel work that
/// completes a device write is often queued on this CPU, and a poller
/// that held it would make the reply wait for itself.
fn read_polling(fd: RawFd, into: &mut [u8], until: Instant) -> Result<Option<usize>, String> {
    while Instant::now() < until {
        // SAFETY: `into` is valid for writes of its length during the call.
        let n = unsafe { libc::recv(fd, into.as_mut_ptr().cast(), into.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => {
                // SAFETY: no arguments.
                unsafe { libc::sched_yield() };
            }
            std::io::ErrorKind::Interrupted => {}
            _ => return Err(format!("read failed: {e}")),
        }
    }
    Ok(None)
}

/// Waits until `fd` is readable (or closed) or `deadline` passes (`false`).
fn readable_by(fd: RawFd, deadline: Instant) -> Result<bool, String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        let ms = if ms == 0 && !left.is_zero() { 1 } else { ms };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call's duration.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            0 if Instant::now() >= deadline => return Ok(false),
            0 => {}
            n if n > 0 => return Ok(true),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(format!("poll failed: {e}"));
                }
            }
        }
    }
}

/// One `read`, retried when interrupted.
fn read_some(stream: &mut Stream, into: &mut [u8]) -> Result<usize, String> {
    loop {
        match stream.read(into) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
    }
}

/// Reads into `body` (which holds fewer than `len` bytes) until it holds `len`.
fn read_rest(stream: &mut Stream, body: &mut Vec<u8>, len: usize) -> Result<(), String> {
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
