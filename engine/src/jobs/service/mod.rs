//! The job service: a TCP listener (127.0.0.1 by default) for workers and
//! the CLI, one control thread that owns the resource manager, one recorder
//! thread that owns the job state files, and a reader and a writer thread per
//! connection. Threads talk through channels only: the control thread blocks
//! on its channel and wakes for each message — no polling anywhere.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ferrite_proto::rpc_jobs::{read_frame, write_frame, TaskGrant, ToEngine, ToPeer};

use super::error::JobError;
use super::rm::Assignment;
use super::spec::JobGraph;

mod control;
mod gather;
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
}

impl JobServiceConfig {
    pub fn new(state_dir: PathBuf) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir,
            coordinator_slots: 16,
            depth: 64,
        }
    }
}

type ConnId = u64;

/// What a connection's writer thread sends.
enum Out {
    Msg(ToPeer),
    Grant {
        graph: Arc<JobGraph>,
        tasks: Vec<Assignment>,
        /// Where the task records are, when not sent inline.
        store: Option<String>,
    },
}

/// What the control thread is told.
enum Input {
    Connected { conn: ConnId, tx: Sender<Out> },
    Frame { conn: ConnId, msg: ToEngine },
    Closed { conn: ConnId },
    Stop,
}

/// A running job service.
#[derive(Debug)]
pub struct JobService {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    control_tx: Sender<Input>,
    streams: Arc<Mutex<HashMap<ConnId, TcpStream>>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Input")
    }
}

impl JobService {
    /// Starts the service; jobs found unfinished in `state_dir` are queued
    /// again (their done tasks are not run again).
    pub fn start(config: JobServiceConfig) -> Result<Self, JobError> {
        std::fs::create_dir_all(&config.state_dir).map_err(JobError::io("create state dir"))?;
        let listener = TcpListener::bind(config.listen).map_err(JobError::io("bind"))?;
        let addr = listener.local_addr().map_err(JobError::io("local addr"))?;
        let (control_tx, control_rx) = mpsc::channel();
        let control = control::Control::new(&config)?;
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(HashMap::new()));
        let mut threads = Vec::new();
        threads.push(spawn("jobs-control", move || control.run(control_rx))?);
        let (tx, st, sp) = (control_tx.clone(), streams.clone(), stop.clone());
        threads.push(spawn("jobs-listen", move || {
            accept_loop(listener, tx, st, sp)
        })?);
        Ok(Self {
            addr,
            stop,
            control_tx,
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
        let _ = self.control_tx.send(Input::Stop);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Ok(streams) = self.streams.lock() {
            for s in streams.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for JobService {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
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

fn accept_loop(
    listener: TcpListener,
    control: Sender<Input>,
    streams: Arc<Mutex<HashMap<ConnId, TcpStream>>>,
    stop: Arc<AtomicBool>,
) {
    let mut next: ConnId = 1;
    let mut handles = Vec::new();
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let conn = next;
        next += 1;
        let _ = stream.set_nodelay(true);
        let (Ok(read_half), Ok(keep)) = (stream.try_clone(), stream.try_clone()) else {
            continue;
        };
        if let Ok(mut s) = streams.lock() {
            s.insert(conn, keep);
        }
        let (tx, rx) = mpsc::channel();
        if control.send(Input::Connected { conn, tx }).is_err() {
            break;
        }
        let c = control.clone();
        if let Ok(h) = spawn("jobs-read", move || read_loop(conn, read_half, c)) {
            handles.push(h);
        }
        let st = streams.clone();
        if let Ok(h) = spawn("jobs-write", move || write_loop(conn, stream, rx, st)) {
            handles.push(h);
        }
    }
    if let Ok(s) = streams.lock() {
        for s in s.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
    for h in handles {
        let _ = h.join();
    }
}

fn read_loop(conn: ConnId, stream: TcpStream, control: Sender<Input>) {
    let mut input = BufReader::with_capacity(1 << 16, stream);
    loop {
        match read_frame::<_, ToEngine>(&mut input) {
            Ok(Some(msg)) => {
                if control.send(Input::Frame { conn, msg }).is_err() {
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
        } => {
            let inline = store.is_none();
            let tasks = tasks
                .into_iter()
                .map(|a| {
                    let (addr, record) = match inline {
                        true => graph.record(a.idx),
                        false => (0, &[][..]),
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
                    }
                })
                .collect();
            write_frame(out, &ToPeer::Grant { tasks, store })?
        }
    }
    Ok(())
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
