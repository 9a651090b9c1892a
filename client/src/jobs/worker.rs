//! `ferrite worker`: offers this process's execution streams to a job
//! service and runs the tasks it is granted.
//!
//! Threads: the main thread reads the service's frames; one thread per
//! execution stream runs its granted tasks in order; one recorder thread owns
//! the task state objects and the outgoing side of the connection — it
//! writes each batch of updates to the state files, then reports the batch.
//! All hand-offs are channels; nothing polls.

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, RwLock};

use ferrite_proto::rpc_jobs::{
    read_frame, write_frame, TaskGrant, TaskResult, TaskRow, ToEngine, ToPeer,
};

use super::api::service_addr;
use super::error::JobsError;
use super::run::{decode_task, is_trivial, now_ns, run_task};
use super::task_state::{Layout, RowUpdate, TaskState};
use crate::client::Client;

/// Updates handled per batch by the recorder.
const RECORD_BATCH: usize = 8192;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Job service address (`tcp://host:port` or `host:port`).
    pub engine: String,
    /// Name offered to the resource manager (made unique by it if taken).
    pub node: String,
    /// Execution streams offered.
    pub xstreams: u32,
    /// Where the task state objects go.
    pub state_dir: PathBuf,
    /// One task state file per task, or per job.
    pub layout: Layout,
}

enum RecMsg {
    Granted(u128, RowUpdate),
    Update(u128, RowUpdate),
    Finished(TaskResult),
    Query { query: u64, job: u128 },
}

type Revoked = Arc<RwLock<HashSet<u128>>>;

/// A granted task and the engine holding its record, if not inline.
type Work = (TaskGrant, Option<Arc<Client>>);

/// Runs until the job service closes the connection.
pub fn run_worker(config: &WorkerConfig) -> Result<(), JobsError> {
    std::fs::create_dir_all(&config.state_dir).map_err(JobsError::io("create state dir"))?;
    let addr = service_addr(&config.engine);
    let stream = TcpStream::connect(&addr).map_err(|source| JobsError::Connect {
        addr: addr.clone(),
        source,
    })?;
    let _ = stream.set_nodelay(true);
    let mut input =
        BufReader::with_capacity(1 << 16, stream.try_clone().map_err(JobsError::io("clone"))?);
    let mut output = BufWriter::with_capacity(1 << 16, stream);
    let xstreams = config.xstreams.max(1);
    write_frame(
        &mut output,
        &ToEngine::Offer {
            node: config.node.clone(),
            xstreams,
        },
    )?;
    output.flush().map_err(JobsError::io("offer"))?;
    let node = match read_frame(&mut input)? {
        Some(ToPeer::Welcome { node }) => node,
        Some(other) => return Err(JobsError::Unexpected(format!("{other:?}"))),
        None => return Err(JobsError::Closed),
    };
    tracing::info!(node, xstreams, "worker joined");
    let revoked: Revoked = Arc::default();
    let (rec_tx, rec_rx) = mpsc::channel();
    let objects = Objects {
        dir: config.state_dir.clone(),
        node: node.clone(),
        layout: config.layout,
        open: HashMap::new(),
    };
    let recorder = std::thread::Builder::new()
        .name("worker-record".into())
        .spawn(move || record_loop(objects, rec_rx, output))
        .map_err(JobsError::io("spawn"))?;
    let mut queues = Vec::new();
    let mut threads = Vec::new();
    for x in 0..xstreams {
        let (tx, rx) = mpsc::channel::<Work>();
        let (rec, rev) = (rec_tx.clone(), revoked.clone());
        let t = std::thread::Builder::new()
            .name(format!("worker-x{x}"))
            .spawn(move || xstream_loop(rx, rec, rev))
            .map_err(JobsError::io("spawn"))?;
        queues.push(tx);
        threads.push(t);
    }
    let res = read_loop(&mut input, &queues, &rec_tx, &revoked);
    drop(queues);
    for t in threads {
        let _ = t.join();
    }
    drop(rec_tx);
    let _ = recorder.join();
    res
}

fn read_loop(
    input: &mut BufReader<TcpStream>,
    queues: &[Sender<Work>],
    rec: &Sender<RecMsg>,
    revoked: &Revoked,
) -> Result<(), JobsError> {
    let mut stores: HashMap<String, Arc<Client>> = HashMap::new();
    loop {
        let msg = match read_frame::<_, ToPeer>(input) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing::info!("job service connection ended: {e}");
                return Ok(());
            }
        };
        match msg {
            ToPeer::Grant { tasks, store } => {
                let client = match store {
                    Some(url) => Some(store_client(&mut stores, &url)?),
                    None => None,
                };
                for g in tasks {
                    let row = RowUpdate::Granted {
                        idx: g.idx,
                        id: g.id.clone(),
                        attempt: g.attempt,
                        xstream: g.xstream,
                        ready_ns: g.ready_ns,
                    };
                    let _ = rec.send(RecMsg::Granted(g.job, row));
                    let q = &queues[g.xstream as usize % queues.len()];
                    if q.send((g, client.clone())).is_err() {
                        return Ok(());
                    }
                }
            }
            ToPeer::Revoke { job } => {
                if let Ok(mut r) = revoked.write() {
                    r.insert(job);
                }
            }
            ToPeer::StatusQuery { query, job } => {
                let _ = rec.send(RecMsg::Query { query, job });
            }
            other => tracing::warn!("worker: ignoring {other:?}"),
        }
    }
}

/// A connection to the engine holding task records, made on first use.
fn store_client(
    stores: &mut HashMap<String, Arc<Client>>,
    url: &str,
) -> Result<Arc<Client>, JobsError> {
    if let Some(c) = stores.get(url) {
        return Ok(c.clone());
    }
    let c = Arc::new(Client::connect(url)?);
    tracing::info!(url, provider = ?c.one_sided_provider(), "task records from engine");
    stores.insert(url.to_string(), c.clone());
    Ok(c)
}

fn xstream_loop(rx: Receiver<Work>, rec: Sender<RecMsg>, revoked: Revoked) {
    let mut buf = Vec::new();
    while let Ok((g, store)) = rx.recv() {
        if revoked.read().is_ok_and(|r| r.contains(&g.job)) {
            let row = RowUpdate::Dropped {
                idx: g.idx,
                attempt: g.attempt,
            };
            let _ = rec.send(RecMsg::Update(g.job, row));
            continue;
        }
        let start_ns = now_ns();
        let result = match decode_task(&g, store.as_deref(), &mut buf) {
            Ok(spec) => {
                if !is_trivial(&spec) {
                    let row = RowUpdate::Started {
                        idx: g.idx,
                        attempt: g.attempt,
                        start_ns,
                    };
                    let _ = rec.send(RecMsg::Update(g.job, row));
                }
                run_task(&g, &spec, start_ns, store.as_deref())
            }
            Err(error) => TaskResult {
                job: g.job,
                idx: g.idx,
                attempt: g.attempt,
                xstream: g.xstream,
                start_ns,
                end_ns: now_ns(),
                exit_code: -1,
                error: Some(error),
                stdout: Vec::new(),
                stderr: Vec::new(),
            },
        };
        if rec.send(RecMsg::Finished(result)).is_err() {
            return;
        }
    }
}

/// The task state objects this node writes, open while their tasks run.
struct Objects {
    dir: PathBuf,
    node: String,
    layout: Layout,
    /// (job, task index for [`Layout::PerTask`]) -> open file.
    open: HashMap<(u128, Option<u32>), TaskState>,
}

impl Objects {
    /// Applies one batch of updates of `job`, in one transaction per file.
    fn apply(&mut self, job: u128, updates: Vec<RowUpdate>) -> Result<(), JobsError> {
        if self.layout == Layout::PerJob {
            return self.file(job, None, None)?.apply(&updates);
        }
        let mut by_task: HashMap<u32, Vec<RowUpdate>> = HashMap::new();
        for u in updates {
            by_task.entry(u.idx()).or_default().push(u);
        }
        for (idx, updates) in by_task {
            let id = updates.iter().find_map(|u| match u {
                RowUpdate::Granted { id, .. } => Some(id.as_str()),
                _ => None,
            });
            self.file(job, Some(idx), id)?.apply(&updates)?;
            if updates.last().is_some_and(RowUpdate::ends) {
                self.open.remove(&(job, Some(idx)));
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        job: u128,
        idx: Option<u32>,
        id: Option<&str>,
    ) -> Result<&mut TaskState, JobsError> {
        use std::collections::hash_map::Entry;
        let st = match self.open.entry((job, idx)) {
            Entry::Occupied(e) => return Ok(e.into_mut()),
            Entry::Vacant(v) => v,
        };
        let file = match (idx, id) {
            (None, _) => TaskState::open(&self.dir, job, &self.node)?,
            (Some(idx), Some(id)) => TaskState::open_task(&self.dir, job, idx, id, &self.node)?,
            (Some(idx), None) => {
                return Err(JobsError::Unexpected(format!(
                    "update of task {idx} of job {job:032x} before its grant"
                )))
            }
        };
        Ok(st.insert(file))
    }

    /// The rows of `job` this node holds.
    fn rows(&self, job: u128) -> Result<Vec<TaskRow>, JobsError> {
        match self.layout {
            Layout::PerJob => match self.open.get(&(job, None)) {
                Some(f) => f.rows(),
                None => Ok(Vec::new()),
            },
            Layout::PerTask => TaskState::rows_of_tasks(&self.dir, job),
        }
    }
}

fn record_loop(mut objects: Objects, rx: Receiver<RecMsg>, mut out: BufWriter<TcpStream>) {
    while let Ok(first) = rx.recv() {
        let mut updates: HashMap<u128, Vec<RowUpdate>> = HashMap::new();
        let mut results = Vec::new();
        let mut queries = Vec::new();
        let mut next = Some(first);
        let mut n = 0;
        while let Some(msg) = next {
            match msg {
                RecMsg::Granted(job, u) | RecMsg::Update(job, u) => {
                    updates.entry(job).or_default().push(u)
                }
                RecMsg::Finished(r) => {
                    let u = RowUpdate::Finished {
                        idx: r.idx,
                        attempt: r.attempt,
                        start_ns: r.start_ns,
                        end_ns: r.end_ns,
                        exit_code: r.exit_code,
                        error: r.error.clone(),
                    };
                    updates.entry(r.job).or_default().push(u);
                    results.push(r);
                }
                RecMsg::Query { query, job } => queries.push((query, job)),
            }
            n += 1;
            next = if n < RECORD_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        for (job, u) in updates {
            if let Err(e) = objects.apply(job, u) {
                tracing::error!("task state: {e}");
            }
        }
        if send_batch(&mut out, &objects, results, queries).is_err() {
            return;
        }
    }
}

fn send_batch(
    out: &mut BufWriter<TcpStream>,
    objects: &Objects,
    results: Vec<TaskResult>,
    queries: Vec<(u64, u128)>,
) -> Result<(), JobsError> {
    if !results.is_empty() {
        write_frame(out, &ToEngine::Finished { results })?;
    }
    for (query, job) in queries {
        let rows = objects.rows(job).unwrap_or_else(|e| {
            tracing::error!("task state: {e}");
            Vec::new()
        });
        write_frame(out, &ToEngine::StatusRows { query, job, rows })?;
    }
    out.flush().map_err(JobsError::io("report"))
}
