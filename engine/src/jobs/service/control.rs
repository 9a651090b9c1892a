//! The control task (control task class of an xstream): owns the resource
//! manager, turns frames into events and actions into frames.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;

use ferrite_proto::rpc_jobs::{JobSummary, SpecFormat, ToEngine, ToPeer};
use ferrite_xstream::TaskClass;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::StreamExt;

use super::gather::{Gather, Watch};
use super::local::LocalNode;
use super::recorder::{self, RecordCmd};
use super::{now_ns, task_grants, ConnId, Inbox, Input, JobServiceConfig, Out, ENGINE_NODE};
use crate::jobs::error::JobError;
use crate::jobs::rm::{coordinator_name, Action, Assignment, Event, NodeId, ResourceManager};
use crate::jobs::spec::{parse_spec, JobGraph};
use crate::jobs::state::{JobMeta, JobState};

/// Inputs handled before actions are flushed, so grants go out in batches.
const BATCH_INPUTS: usize = 4096;

pub(super) struct Conn {
    pub tx: Sender<Out>,
    pub node: Option<NodeId>,
}

pub(super) struct Control {
    pub rm: ResourceManager,
    pub state_dir: PathBuf,
    pub conns: HashMap<ConnId, Conn>,
    pub node_conn: HashMap<NodeId, ConnId>,
    next_node: NodeId,
    pub next_query: u64,
    pub gathers: HashMap<u64, Gather>,
    pub watchers: HashMap<(ConnId, u128), Watch>,
    /// Jobs that had ended before this service started: what `list` and
    /// `wait` say of them is read once, at start; `status` reads the file
    /// on the blocking-thread pool.
    pub archived: HashMap<u128, Archived>,
    recorder: Option<Sender<RecordCmd>>,
    recorder_thread: Option<JoinHandle<()>>,
    pub dirty: HashSet<u128>,
    /// `WaitResources` requests not yet satisfied: (conn, nodes wanted).
    resource_waits: Vec<(ConnId, u32)>,
    /// Jobs with an engine store: job -> (URL, task records there too).
    pub stores: HashMap<u128, (String, bool)>,
    /// Store of jobs submitted without one.
    default_store: Option<String>,
    /// `Wait` requests: (conn, job).
    waiters: Vec<(ConnId, u128)>,
    /// The control task's own inbox, for inputs made on this xstream.
    inbox: UnboundedSender<Input>,
    /// Jobs whose state file is being written: their ids are taken.
    creating: HashSet<u128>,
    /// The engine's own execution streams (node [`LOCAL`]), if it offers any.
    pub local: Option<LocalNode>,
    /// Whether jobs with exec steps are accepted (`[jobs] exec`).
    exec: bool,
}

/// The node id of the engine's own execution streams.
pub(super) const LOCAL: NodeId = 0;

/// A job that had ended before the service started.
pub(super) struct Archived {
    pub path: PathBuf,
    pub summary: JobSummary,
    pub cause: Option<String>,
}

impl Archived {
    /// Reads what the service keeps of an ended job (`st` is its file).
    fn read(st: &JobState, meta: JobMeta) -> Result<Self, JobError> {
        let (tasks, done) = st.task_counts()?;
        Ok(Self {
            path: st.path().to_path_buf(),
            summary: JobSummary {
                job: meta.job,
                name: meta.name,
                state: meta.state,
                tasks,
                done,
            },
            cause: meta.cause,
        })
    }
}

/// A job accepted or refused by the blocking-thread pool.
pub(super) struct Created {
    conn: ConnId,
    job: u128,
    /// The engine holding the job's outputs, and whether its task records
    /// are there too.
    store: Option<(String, bool)>,
    result: Result<Arc<JobGraph>, JobError>,
}

/// The job state file of `job` in `dir`.
pub fn job_state_path(dir: &Path, job: u128) -> PathBuf {
    dir.join(format!("{job:032x}.job.sqlite"))
}

impl Control {
    /// `inbox` feeds the control task's own receiver (see [`Self::run`]).
    pub fn new(config: &JobServiceConfig, inbox: Inbox) -> Result<Self, JobError> {
        let (tx, thread) = recorder::start(config.state_dir.clone())?;
        let local = match config.task_slots {
            0 => None,
            slots => Some(LocalNode::start(
                ENGINE_NODE.to_string(),
                slots,
                inbox.mesh.clone(),
                config.router.clone(),
                config.state_dir.join("tasks"),
                inbox.clone(),
            )?),
        };
        let mut me = Self {
            rm: ResourceManager::new(config.coordinator_slots, config.depth),
            state_dir: config.state_dir.clone(),
            conns: HashMap::new(),
            node_conn: HashMap::new(),
            next_node: 1,
            next_query: 1,
            gathers: HashMap::new(),
            watchers: HashMap::new(),
            archived: HashMap::new(),
            recorder: Some(tx),
            recorder_thread: Some(thread),
            dirty: HashSet::new(),
            resource_waits: Vec::new(),
            exec: config.exec,
            waiters: Vec::new(),
            stores: HashMap::new(),
            default_store: config.store.clone(),
            inbox: inbox.tx,
            creating: HashSet::new(),
            local,
        };
        me.restore()?;
        Ok(me)
    }

    /// Queues again every unfinished job found in the state directory.
    fn restore(&mut self) -> Result<(), JobError> {
        let dir = std::fs::read_dir(&self.state_dir).map_err(JobError::io("read state dir"))?;
        let mut paths: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".job.sqlite"))
            .collect();
        paths.sort();
        for path in paths {
            let st = match JobState::open(&path) {
                Ok(st) => st,
                Err(e) => {
                    tracing::warn!("skipping job state file: {e}");
                    continue;
                }
            };
            let meta = st.meta()?;
            if meta.state.is_final() {
                let job = meta.job;
                self.archived.insert(job, Archived::read(&st, meta)?);
                continue;
            }
            self.keep_off_local(meta.job, meta.store.as_deref());
            if let Some(url) = meta.store {
                self.stores.insert(meta.job, (url, meta.records_in_store));
            }
            let graph = Arc::new(JobGraph::build(meta.job, meta.spec)?);
            let mut restored = Vec::new();
            for row in st.rows()? {
                let out = if graph.is_input[row.idx as usize] {
                    st.output(row.idx)?.map(|o| o.0).unwrap_or_default()
                } else {
                    Vec::new()
                };
                restored.push((row, out));
            }
            self.rm
                .handle(Event::JobSubmitted { graph, restored }, now_ns());
        }
        self.flush_actions();
        Ok(())
    }

    /// The engine's own streams cannot reach a store in another engine:
    /// the manager keeps such a job off them.
    fn keep_off_local(&mut self, job: u128, store: Option<&str>) {
        if self.local.as_ref().is_some_and(|l| !l.reaches(store)) {
            self.rm.keep_off(job, LOCAL);
        }
    }

    /// The control task: waits for inputs, handles each batch, then sends
    /// what the manager decided. Runs until [`Input::Stop`].
    pub async fn run(mut self, mut rx: UnboundedReceiver<Input>) {
        // The engine offers its own streams from its xstream, where their
        // grants can be sent to the other xstreams.
        if let Some(local) = &self.local {
            let offer = Event::NodeOffered {
                node: LOCAL,
                name: local.name.clone(),
                xstreams: local.streams,
            };
            self.rm.handle(offer, now_ns());
            self.flush_actions();
        }
        'outer: while let Some(first) = rx.next().await {
            let mut next = Some(first);
            let mut handled = 0;
            while let Some(input) = next {
                if matches!(input, Input::Stop) {
                    break 'outer;
                }
                self.input(input);
                handled += 1;
                next = match handled < BATCH_INPUTS {
                    true => rx.try_recv().ok(),
                    false => None,
                };
            }
            self.flush_actions();
            self.refresh_watchers();
            if !self.waiters.is_empty() {
                self.answer_waiters();
            }
            // Let the xstream's other tasks run between batches.
            ferrite_xstream::yield_now().await;
        }
        rx.close();
        self.flush_actions();
        self.local = None;
        self.conns.clear();
        self.recorder = None;
        if let Some(t) = self.recorder_thread.take() {
            let _ = t.join();
        }
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Connected { conn, tx } => {
                self.conns.insert(conn, Conn { tx, node: None });
            }
            Input::Frame { conn, msg } => self.frame(conn, msg),
            Input::Created(created) => self.created(created),
            Input::Answer { conn, msg } => self.send(conn, msg),
            Input::Local { results, answers } => {
                if !results.is_empty() {
                    let event = Event::TasksFinished {
                        node: LOCAL,
                        results,
                    };
                    self.rm.handle(event, now_ns());
                }
                for (query, job, rows) in answers {
                    self.node_rows(LOCAL, query, job, rows);
                }
            }
            Input::Closed { conn } => {
                let node = self.conns.remove(&conn).and_then(|c| c.node);
                self.watchers.retain(|&(c, _), _| c != conn);
                self.resource_waits.retain(|&(c, _)| c != conn);
                self.waiters.retain(|&(c, _)| c != conn);
                if let Some(node) = node {
                    self.node_conn.remove(&node);
                    self.rm.handle(Event::NodeLost { node }, now_ns());
                    self.node_gone(node);
                }
            }
            Input::Stop => {}
        }
    }

    pub fn send(&self, conn: ConnId, msg: ToPeer) {
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.tx.send(Out::Msg(msg));
        }
    }

    fn frame(&mut self, conn: ConnId, msg: ToEngine) {
        match msg {
            ToEngine::Offer { node, xstreams } => self.offer(conn, node, xstreams),
            ToEngine::Finished { results } => {
                if let Some(node) = self.conns.get(&conn).and_then(|c| c.node) {
                    self.rm
                        .handle(Event::TasksFinished { node, results }, now_ns());
                }
            }
            ToEngine::StatusRows { query, job, rows } => self.rows_answered(conn, query, job, rows),
            ToEngine::Submit {
                text,
                format,
                job,
                store,
            } => {
                if let Err(e) = self.submit(conn, text, format, job, store) {
                    let message = e.to_string();
                    self.send(conn, ToPeer::Error { message });
                }
            }
            ToEngine::Status { job, watch } => self.status(conn, job, watch),
            ToEngine::Wait { job } => {
                self.waiters.push((conn, job));
                self.answer_waiters();
            }
            ToEngine::WaitResources { nodes } => {
                self.resource_waits.push((conn, nodes));
                self.answer_resource_waits();
            }
            ToEngine::List => {
                let jobs = self.list();
                self.send(conn, ToPeer::Jobs { jobs });
            }
            ToEngine::Cancel { job } => {
                let reply = match self.rm.phase(job) {
                    Some((p, _)) if !p.is_final() => {
                        self.rm.handle(Event::JobCancelled { job }, now_ns());
                        ToPeer::Cancelled { job }
                    }
                    Some((p, _)) => ToPeer::Error {
                        message: format!("job {job:032x} already {}", p.as_str()),
                    },
                    None => ToPeer::Error {
                        message: JobError::NoSuchJob(job).to_string(),
                    },
                };
                self.send(conn, reply);
            }
        }
    }

    fn offer(&mut self, conn: ConnId, name: String, xstreams: u32) {
        let node = self.next_node;
        self.next_node += 1;
        let taken = self
            .node_conn
            .keys()
            .any(|&n| self.rm.node_label(n) == Some(name.as_str()))
            || self.local.as_ref().is_some_and(|l| l.name == name);
        let name = if taken || name.is_empty() {
            format!("{name}#{node}")
        } else {
            name
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.node = Some(node);
        }
        self.node_conn.insert(node, conn);
        self.rm.handle(
            Event::NodeOffered {
                node,
                name: name.clone(),
                xstreams,
            },
            now_ns(),
        );
        self.send(conn, ToPeer::Welcome { node: name });
        self.answer_resource_waits();
    }

    /// Answers the `Wait` requests of jobs that ended (or are unknown).
    pub fn answer_waiters(&mut self) {
        let mut keep = Vec::new();
        for (conn, job) in std::mem::take(&mut self.waiters) {
            let ended = match self.rm.phase(job) {
                Some((state, cause)) if state.is_final() => Some((state, cause)),
                Some(_) => None,
                None => match self.archived.get(&job) {
                    Some(a) => Some((a.summary.state, a.cause.clone())),
                    None => {
                        let message = JobError::NoSuchJob(job).to_string();
                        self.send(conn, ToPeer::Error { message });
                        continue;
                    }
                },
            };
            match ended {
                Some((state, cause)) => self.send(conn, ToPeer::Ended { job, state, cause }),
                None => keep.push((conn, job)),
            }
        }
        self.waiters = keep;
    }

    /// Answers the `WaitResources` requests that enough nodes satisfy.
    fn answer_resource_waits(&mut self) {
        let nodes = self.rm.resources();
        let have = nodes.len() as u32;
        let (ready, waiting): (Vec<_>, Vec<_>) =
            self.resource_waits.drain(..).partition(|&(_, n)| n <= have);
        self.resource_waits = waiting;
        for (conn, _) in ready {
            let nodes = nodes.clone();
            self.send(conn, ToPeer::Resources { nodes });
        }
    }

    fn job_id_free(&self, id: u128) -> bool {
        id != 0
            && !self.creating.contains(&id)
            && self.rm.phase(id).is_none()
            && !self.archived.contains_key(&id)
            && !job_state_path(&self.state_dir, id).exists()
    }

    /// Accepts a job file; with `store`, its task records are already in
    /// that engine under the submitter's `job` id. Parsing, checking and
    /// writing the job state file run on the xstream's blocking-thread pool
    /// (a big job's file takes a while); the answer goes out when
    /// [`Input::Created`] comes back. Errors here are answered at once.
    fn submit(
        &mut self,
        conn: ConnId,
        text: String,
        format: SpecFormat,
        job: Option<u128>,
        store: Option<String>,
    ) -> Result<(), JobError> {
        let job = match job {
            Some(id) if self.job_id_free(id) => id,
            Some(id) => return Err(JobError::JobIdTaken(id)),
            None => loop {
                let id: u128 = rand::random();
                if self.job_id_free(id) {
                    break id;
                }
            },
        };
        let store = match store {
            Some(url) => Some((url, true)),
            None => self.default_store.clone().map(|url| (url, false)),
        };
        let path = job_state_path(&self.state_dir, job);
        let file_store = store.clone();
        let exec = self.exec;
        let write = move || {
            create_job(
                &path,
                &text,
                format,
                job,
                file_store.as_ref().map(|(u, r)| (u.as_str(), *r)),
                exec,
            )
        };
        let inbox = self.inbox.clone();
        let task = async move {
            let result = glommio::executor().spawn_blocking(write).await;
            let created = Created {
                conn,
                job,
                store,
                result,
            };
            // Fails only once the control task has stopped.
            let _ = inbox.unbounded_send(Input::Created(created));
        };
        ferrite_xstream::spawn(TaskClass::Control, task)
            .map_err(JobError::xstream)?
            .detach();
        self.creating.insert(job);
        Ok(())
    }

    /// Runs `answer` on the xstream's blocking-thread pool (it reads job
    /// state files) and sends what it returns to `conn` from this task.
    pub(super) fn answer_blocking(
        &self,
        conn: ConnId,
        answer: impl FnOnce() -> ToPeer + Send + 'static,
    ) {
        let inbox = self.inbox.clone();
        let task = async move {
            let msg = glommio::executor().spawn_blocking(answer).await;
            // Fails only once the control task has stopped.
            let _ = inbox.unbounded_send(Input::Answer { conn, msg });
        };
        match ferrite_xstream::spawn(TaskClass::Control, task) {
            Ok(t) => {
                t.detach();
            }
            Err(e) => {
                let message = JobError::xstream(e).to_string();
                self.send(conn, ToPeer::Error { message });
            }
        }
    }

    /// A job's state file is written: the job enters the queue.
    fn created(&mut self, created: Created) {
        let Created {
            conn,
            job,
            store,
            result,
        } = created;
        self.creating.remove(&job);
        let reply = match result {
            Ok(graph) => {
                self.keep_off_local(job, store.as_ref().map(|s| s.0.as_str()));
                if let Some(store) = store {
                    self.stores.insert(job, store);
                }
                let restored = Vec::new();
                self.rm
                    .handle(Event::JobSubmitted { graph, restored }, now_ns());
                ToPeer::Submitted { job }
            }
            Err(e) => ToPeer::Error {
                message: e.to_string(),
            },
        };
        self.send(conn, reply);
    }

    fn list(&self) -> Vec<JobSummary> {
        let mut jobs = self.rm.summaries();
        jobs.extend(self.archived.values().map(|a| a.summary.clone()));
        jobs.sort_by_key(|s| s.job);
        jobs
    }

    /// Sends what the manager asked for: grants batched per node and job.
    pub fn flush_actions(&mut self) {
        let mut grants: HashMap<(NodeId, u128), Vec<_>> = HashMap::new();
        for action in self.rm.take_actions() {
            match action {
                Action::Grant { node, tasks } => {
                    for t in tasks {
                        grants.entry((node, t.job)).or_default().push(t);
                    }
                }
                Action::Revoke { node: LOCAL, job } => {
                    if let Some(local) = &self.local {
                        local.revoke(job);
                    }
                }
                Action::Revoke { node, job } => {
                    if let Some(&c) = self.node_conn.get(&node) {
                        self.send(c, ToPeer::Revoke { job });
                    }
                }
                Action::Record { job, outcomes } => {
                    self.dirty.insert(job);
                    self.record(RecordCmd::Record { job, outcomes });
                }
                Action::Split { job, slot, ready } => {
                    tracing::debug!(job = %format!("{job:032x}"), slot, ready, "job split");
                    self.dirty.insert(job);
                    let coordinator = coordinator_name(slot);
                    self.record(RecordCmd::Coordinator { job, coordinator });
                }
                Action::CoordinatorGranted { .. } | Action::StreamsGranted { .. } => {}
                Action::JobPhase { job, phase, cause } => {
                    self.dirty.insert(job);
                    let cmd = RecordCmd::Phase {
                        job,
                        phase,
                        cause,
                        now_ns: now_ns(),
                    };
                    self.record(cmd);
                }
            }
        }
        for ((node, job), tasks) in grants {
            if node == LOCAL {
                self.grant_local(job, tasks);
                continue;
            }
            let (Some(&conn), Some(graph)) = (self.node_conn.get(&node), self.rm.graph(job)) else {
                continue;
            };
            if let Some(c) = self.conns.get(&conn) {
                let graph = graph.clone();
                let (store, inline) = match self.stores.get(&job) {
                    Some((url, records)) => (Some(url.clone()), !records),
                    None => (None, true),
                };
                let _ = c.tx.send(Out::Grant {
                    graph,
                    tasks,
                    store,
                    inline,
                });
            }
        }
    }

    /// Sends tasks granted to the engine's own streams to them.
    fn grant_local(&self, job: u128, tasks: Vec<Assignment>) {
        let (Some(local), Some(graph)) = (&self.local, self.rm.graph(job)) else {
            return;
        };
        let (store, inline) = match self.stores.get(&job) {
            Some((_, records)) => (true, !records),
            None => (false, true),
        };
        local.grant(task_grants(graph, tasks, store, inline), store);
    }

    fn record(&self, cmd: RecordCmd) {
        if let Some(r) = &self.recorder {
            if r.send(cmd).is_err() {
                tracing::error!("job state recorder is gone");
            }
        }
    }
}

/// Parses and checks a job file and writes its state file at `path`
/// (blocking: runs off the xstream). A file left half written is removed.
fn create_job(
    path: &Path,
    text: &str,
    format: SpecFormat,
    job: u128,
    store: Option<(&str, bool)>,
    exec: bool,
) -> Result<Arc<JobGraph>, JobError> {
    let spec = parse_spec(text, format)?;
    if !exec {
        let with_exec = spec.tasks.iter().find(|t| {
            t.steps
                .iter()
                .any(|s| matches!(s, ferrite_proto::rpc_jobs::Step::Exec { .. }))
        });
        if let Some(t) = with_exec {
            return Err(JobError::ExecDisabled(t.id.clone()));
        }
    }
    let graph = Arc::new(JobGraph::build(job, spec)?);
    let written = JobState::create(path, &graph, now_ns()).and_then(|mut st| match store {
        Some((url, records_in_store)) => st.set_store(url, records_in_store),
        None => Ok(()),
    });
    if let Err(e) = written {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(graph)
}
