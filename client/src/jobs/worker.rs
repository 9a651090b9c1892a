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

use ferrite_proto::rpc_jobs::{read_frame, write_frame, TaskGrant, TaskResult, ToEngine, ToPeer};
use ferrite_proto::tasks::recorder::{record_loop, run_granted, Answer, Objects, RecMsg};

use super::api::{connect_authenticated, service_addr};
use super::error::JobsError;
use super::node::{run_here, WorkerThread};
use super::task_state::{Layout, RowUpdate};
use crate::client::Client;

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
    /// The job service's token (the engine's).
    pub token: Vec<u8>,
}

type Revoked = Arc<RwLock<HashSet<u128>>>;

/// A granted task and the engine holding its record, if not inline.
type Work = (TaskGrant, Option<Arc<Client>>);

/// Runs until the job service closes the connection.
pub fn run_worker(config: &WorkerConfig) -> Result<(), JobsError> {
    std::fs::create_dir_all(&config.state_dir).map_err(JobsError::io("create state dir"))?;
    let stream = connect_authenticated(&service_addr(&config.engine), &config.token)?;
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
    let objects = Objects::new(config.state_dir.clone(), node.clone(), config.layout);
    let report = move |results, answers| send_batch(&mut output, results, answers).is_ok();
    let recorder = std::thread::Builder::new()
        .name("worker-record".into())
        .spawn(move || record_loop(objects, rec_rx, report))
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
                    let row = RowUpdate::granted(&g);
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
        let dropped = revoked.read().is_ok_and(|r| r.contains(&g.job));
        let store = store.as_deref();
        let msg = run_here(run_granted(
            &g,
            dropped,
            store,
            &WorkerThread,
            &mut buf,
            &rec,
        ));
        if rec.send(msg).is_err() {
            return;
        }
    }
}

/// Writes the frames reporting one batch: finished tasks, then the rows
/// asked for by status queries.
fn send_batch(
    out: &mut BufWriter<TcpStream>,
    results: Vec<TaskResult>,
    answers: Vec<Answer>,
) -> Result<(), JobsError> {
    if !results.is_empty() {
        write_frame(out, &ToEngine::Finished { results })?;
    }
    for (query, job, rows) in answers {
        write_frame(out, &ToEngine::StatusRows { query, job, rows })?;
    }
    out.flush().map_err(JobsError::io("report"))
}
