//! The job service: a TCP listener (127.0.0.1 by default) for workers and
//! the CLI; the resource manager as one task in the control task class of
//! an xstream (the engine's own, or one the service starts when it runs by
//! itself); with task slots, the engine's own execution streams as node 0
//! ([`local`]); one recorder thread that updates the job state files (a new
//! job's file is written, and an ended job's file read for `status`, by the
//! xstream's blocking-thread pool, so the control task keeps answering
//! meanwhile); a reader and a writer thread
//! per connection. Inputs reach the control task as
//! messages on the xstream mesh, and it wakes for each batch of them — no
//! polling anywhere.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ferrite_proto::rpc_jobs::auth::{server_handshake, Service};
use ferrite_proto::rpc_jobs::{read_frame, write_frame, TaskGrant, TaskResult, ToEngine, ToPeer};
use ferrite_proto::tasks::recorder::Answer;
use ferrite_xstream::{Mesh, TaskClass, XstreamConfig, XstreamId, XstreamSet};
use futures::channel::mpsc::{unbounded, UnboundedSender};
use futures::channel::oneshot;

use super::error::JobError;
use super::rm::Assignment;
use super::spec::JobGraph;
use crate::server::Router;

mod control;
mod gather;
mod local;
mod recorder;

/// Where and how the job service runs.
#[derive(Debug, Clone)]
pub struct JobServiceConfig {
    /// Address to listen on; port 0 picks one.
    pub listen: SocketAddr,
    /// Directory of the job state files (`<job>.job.sqlite`).
    pub state_dir: PathBuf,
    /// Jobs that run at once; the rest wait in the queue.
    pub coordinator_slots: u32,
    /// Tasks granted to one execution stream at once.
    pub depth: u32,
    /// Engine URL where workers store the outputs of jobs submitted
    /// without one (`ferrite-engine` gives its own); `None` keeps them in
    /// the job state file.
    pub store: Option<String>,
    /// Execution streams the engine itself offers to the resource manager
    /// (node [`ENGINE_NODE`]): granted tasks run on the engine's xstreams
    /// (stream `x` on xstream `x mod n`), storage steps through `router`.
    /// 0: only workers run tasks.
    pub task_slots: u32,
    /// The engine's router, for the tasks its own streams run: the jobs
    /// whose store is this engine (one of its URLs) or none. Without it the
    /// engine's streams run only jobs without a store.
    pub router: Option<Router>,
    /// The shared-secret token every connection must prove it holds
    /// (`ferrite_proto::rpc_jobs::auth`) before its first frame. Mandatory:
    /// [`JobService::start_on`] refuses `None` and an empty token.
    pub token: Option<Vec<u8>>,
    /// Whether jobs may have exec steps (`[jobs] exec`); without, a job
    /// with one is refused at submit.
    pub exec: bool,
    /// How long a connection may take to finish the handshake.
    pub handshake_timeout: Duration,
}

/// The name of the engine's own execution streams in task rows and task
/// state objects.
pub const ENGINE_NODE: &str = "engine";

impl JobServiceConfig {
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir,
            coordinator_slots: 16,
            depth: 64,
            store: None,
            task_slots: 0,
            router: None,
            token: None,
            exec: true,
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// The same with `token` as the connections' shared secret.
    pub fn with_token(mut self, token: &[u8]) -> Self {
        self.token = Some(token.to_vec());
        self
    }
}

type ConnId = u64;

/// What a connection's writer thread sends.
enum Out {
    Msg(ToPeer),
    Grant {
        graph: Arc<JobGraph>,
        tasks: Vec<Assignment>,
        /// The engine holding the job's outputs.
        store: Option<String>,
        /// Whether the task records go in the grant (else: fetch from `store`).
        inline: bool,
    },
}

/// What the control task is told.
enum Input {
    Connected {
        conn: ConnId,
        tx: Sender<Out>,
    },
    Frame {
        conn: ConnId,
        msg: ToEngine,
    },
    Closed {
        conn: ConnId,
    },
    /// A submitted job's state file was written off the xstream (or not).
    Created(control::Created),
    /// An answer made off the xstream (from a job state file), to send.
    Answer {
        conn: ConnId,
        msg: ToPeer,
    },
    /// The engine's own streams finished these tasks, and its recorder
    /// answered these status queries (their rows are written).
    Local {
        results: Vec<TaskResult>,
        answers: Vec<Answer>,
    },
    Stop,
}

/// Where the control task runs: inputs go there as mesh messages, each
/// handing its input to the task through a channel local to that xstream
/// (so the task's wake-up is a local one).
#[derive(Clone)]
struct Inbox {
    mesh: Mesh,
    xstream: XstreamId,
    tx: UnboundedSender<Input>,
}

impl Inbox {
    /// Hands `input` to the control task; waits while its mailbox is full.
    /// False once the control task or its xstreams are gone.
    fn send(&self, input: Input) -> bool {
        let tx = self.tx.clone();
        let push = self
            .mesh
            .send(self.xstream, TaskClass::Control, move || async move {
                let _ = tx.unbounded_send(input);
            });
        futures::executor::block_on(push).is_ok() && !self.tx.is_closed()
    }
}

/// A running job service.
pub struct JobService {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    inbox: Inbox,
    /// Resolves when the control task has ended (or is gone).
    control_done: Option<oneshot::Receiver<()>>,
    /// The xstream the service started for itself, if not given one.
    own_xstreams: Option<XstreamSet>,
    streams: Arc<Mutex<HashMap<ConnId, TcpStream>>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for JobService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobService")
            .field("addr", &self.addr)
            .field("xstream", &self.inbox.xstream)
            .finish()
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Input")
    }
}

impl JobService {
    /// Starts the service on an xstream of its own (one pinned thread);
    /// jobs found unfinished in `state_dir` are queued again (their done
    /// tasks are not run again).
    pub fn start(config: JobServiceConfig) -> Result<Self, JobError> {
        let allowed = ferrite_xstream::allowed_cores().map_err(JobError::xstream)?;
        let core = allowed.last().copied().unwrap_or(0);
        let xs_config = XstreamConfig {
            name: "jobs".into(),
            io_memory_bytes: ferrite_xstream::IO_MEMORY_BYTES_MIN,
            ..XstreamConfig::default().with_cores(vec![core])
        };
        let set = XstreamSet::start(xs_config).map_err(JobError::xstream)?;
        let mesh = set.mesh().clone();
        let mut me = Self::start_on(config, &mesh, XstreamId(0))?;
        me.own_xstreams = Some(set);
        Ok(me)
    }

    /// Starts the service with its resource manager in the control task
    /// class of xstream `xstream` of `mesh` (the engine's).
    pub fn start_on(
        config: JobServiceConfig,
        mesh: &Mesh,
        xstream: XstreamId,
    ) -> Result<Self, JobError> {
        let token = match &config.token {
            Some(t) if !t.is_empty() => Arc::new(t.clone()),
            _ => return Err(JobError::NoToken),
        };
        std::fs::create_dir_all(&config.state_dir).map_err(JobError::io("create state dir"))?;
        let listener = TcpListener::bind(config.listen).map_err(JobError::io("bind"))?;
        let addr = listener.local_addr().map_err(JobError::io("local addr"))?;
        let (tx, rx) = unbounded();
        let inbox = Inbox {
            mesh: mesh.clone(),
            xstream,
            tx,
        };
        let control = control::Control::new(&config, inbox.clone())?;
        let (done_tx, control_done) = oneshot::channel();
        let started = mesh.send(xstream, TaskClass::Control, move || async move {
            control.run(rx).await;
            let _ = done_tx.send(());
        });
        futures::executor::block_on(started).map_err(JobError::xstream)?;
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(HashMap::new()));
        let gate = Gate {
            token,
            timeout: config.handshake_timeout,
        };
        let (ib, st, sp) = (inbox.clone(), streams.clone(), stop.clone());
        let threads = vec![spawn("jobs-listen", move || {
            accept_loop(listener, gate, ib, st, sp)
        })?];
        Ok(Self {
            addr,
            stop,
            inbox,
            control_done: Some(control_done),
            own_xstreams: None,
            streams,
            threads,
        })
    }

    /// The address workers and the CLI connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, drops every connection, writes every pending state
    /// update, and joins the service's threads.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.inbox.send(Input::Stop);
        if let Some(done) = self.control_done.take() {
            if futures::executor::block_on(done).is_err() {
                tracing::warn!("job service control task ended without stopping");
            }
        }
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Ok(streams) = self.streams.lock() {
            for s in streams.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(set) = self.own_xstreams.take() {
            if let Err(e) = set.shutdown() {
                tracing::warn!("job service xstream: {e}");
            }
        }
    }
}

impl Drop for JobService {
    fn drop(&mut self) {
        if self.control_done.is_some() || !self.threads.is_empty() {
            self.stop_now();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, JobError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(JobError::io("spawn thread"))
}

/// What a connection must pass before its first frame.
#[derive(Clone)]
struct Gate {
    token: Arc<Vec<u8>>,
    timeout: Duration,
}

impl Gate {
    /// Runs the token handshake on `stream` under the pre-authentication
    /// deadline; true when the peer proved it holds the token.
    fn admit(&self, stream: &mut TcpStream) -> bool {
        let mut nonce = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let deadline = Some(self.timeout);
        if stream.set_read_timeout(deadline).is_err() || stream.set_write_timeout(deadline).is_err()
        {
            return false;
        }
        let peer = stream.peer_addr().ok();
        if let Err(e) = server_handshake(stream, Service::Jobs, &self.token, nonce) {
            tracing::warn!(?peer, "job connection refused: {e}");
            return false;
        }
        stream.set_read_timeout(None).is_ok() && stream.set_write_timeout(None).is_ok()
    }
}

fn accept_loop(
    listener: TcpListener,
    gate: Gate,
    control: Inbox,
    streams: Arc<Mutex<HashMap<ConnId, TcpStream>>>,
    stop: Arc<AtomicBool>,
) {
    let mut next: ConnId = 1;
    let handles = Arc::new(Mutex::new(Vec::new()));
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let conn = next;
        next += 1;
        let (g, c, st, h) = (
            gate.clone(),
            control.clone(),
            streams.clone(),
            handles.clone(),
        );
        // The handshake runs on the connection's own thread, so a slow or
        // silent peer never holds up the accept loop.
        let _ = spawn("jobs-admit", move || {
            admit_and_serve(conn, stream, &g, &c, &st, &h)
        });
    }
    if let Ok(s) = streams.lock() {
        for s in s.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
    let taken = match handles.lock() {
        Ok(mut h) => std::mem::take(&mut *h),
        Err(_) => Vec::new(),
    };
    for h in taken {
        let _ = h.join();
    }
}

/// Admits one connection (token handshake), then starts its reader and
/// writer threads; a connection that fails the handshake is closed
/// without a single job frame read.
fn admit_and_serve(
    conn: ConnId,
    mut stream: TcpStream,
    gate: &Gate,
    control: &Inbox,
    streams: &Arc<Mutex<HashMap<ConnId, TcpStream>>>,
    handles: &Mutex<Vec<JoinHandle<()>>>,
) {
    let _ = stream.set_nodelay(true);
    if let Ok(keep) = stream.try_clone() {
        if let Ok(mut s) = streams.lock() {
            s.insert(conn, keep); // so shutdown can end a pending handshake
        }
    }
    let admitted = gate.admit(&mut stream);
    let read_half = stream.try_clone();
    let (true, Ok(read_half)) = (admitted, read_half) else {
        if let Ok(mut s) = streams.lock() {
            s.remove(&conn);
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return;
    };
    let (tx, rx) = mpsc::channel();
    if !control.send(Input::Connected { conn, tx }) {
        return;
    }
    let mut started = Vec::new();
    let c = control.clone();
    if let Ok(h) = spawn("jobs-read", move || read_loop(conn, read_half, c)) {
        started.push(h);
    }
    let st = streams.clone();
    if let Ok(h) = spawn("jobs-write", move || write_loop(conn, stream, rx, st)) {
        started.push(h);
    }
    if let Ok(mut h) = handles.lock() {
        h.extend(started);
    }
}

fn read_loop(conn: ConnId, stream: TcpStream, control: Inbox) {
    let mut input = BufReader::with_capacity(1 << 16, stream);
    loop {
        match read_frame::<_, ToEngine>(&mut input) {
            Ok(Some(msg)) => {
                if !control.send(Input::Frame { conn, msg }) {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(conn, "job connection dropped: {e}");
                break;
            }
        }
    }
    let _ = control.send(Input::Closed { conn });
}

fn write_loop(
    conn: ConnId,
    stream: TcpStream,
    rx: Receiver<Out>,
    streams: Arc<Mutex<HashMap<ConnId, TcpStream>>>,
) {
    let mut out = BufWriter::with_capacity(1 << 16, stream);
    'outer: while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(item) = next {
            if let Err(e) = write_out(&mut out, item) {
                tracing::debug!(conn, "job connection write failed: {e}");
                break 'outer;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().is_err() {
            break;
        }
    }
    if let Ok(mut s) = streams.lock() {
        if let Some(s) = s.remove(&conn) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn write_out(out: &mut impl Write, item: Out) -> Result<(), JobError> {
    match item {
        Out::Msg(m) => write_frame(out, &m)?,
        Out::Grant {
            graph,
            tasks,
            store,
            inline,
        } => {
            let tasks = task_grants(&graph, tasks, store.is_some(), inline);
            write_frame(out, &ToPeer::Grant { tasks, store })?
        }
    }
    Ok(())
}

/// What a node is sent for each task granted to it: the task record when
/// `inline` (else the node fetches it from the job's store by key), and
/// with a `store` the ids of the tasks whose stdout records are its input.
fn task_grants(
    graph: &JobGraph,
    tasks: Vec<Assignment>,
    store: bool,
    inline: bool,
) -> Vec<TaskGrant> {
    tasks
        .into_iter()
        .map(|a| {
            let (addr, record) = match inline {
                true => graph.record(a.idx),
                false => (0, &[][..]),
            };
            let inputs = match store {
                true => graph.inputs[a.idx as usize]
                    .iter()
                    .map(|&p| graph.id(p).to_string())
                    .collect(),
                false => Vec::new(),
            };
            TaskGrant {
                job: a.job,
                idx: a.idx,
                id: graph.id(a.idx).to_string(),
                attempt: a.attempt,
                xstream: a.xstream,
                ready_ns: a.ready_ns,
                addr,
                record: record.to_vec(),
                stdin: a.stdin,
                inputs,
            }
        })
        .collect()
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
