//! The recorder of a node that runs tasks: one thread owns the node's task
//! state objects ([`Objects`]); the execution streams tell it what happens
//! to their tasks ([`RecMsg`]); it writes each batch of updates, one
//! transaction per file, and only then reports the batch (finished tasks,
//! rows asked for by status queries) — so a task is never reported done
//! before its state object says so.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};

use super::run::{decode_task, failed, is_trivial, now_ns, run_task};
use super::state::{Layout, RowUpdate, TaskState, TaskStateError};
use super::{TaskHost, TaskStore};
use crate::rpc_jobs::{TaskGrant, TaskResult, TaskRow};

/// Messages handled per batch.
const RECORD_BATCH: usize = 8192;

/// What a node's recorder is told.
#[derive(Debug)]
pub enum RecMsg {
    /// A task arrived on this node.
    Granted(u128, RowUpdate),
    /// A task started, or was dropped.
    Update(u128, RowUpdate),
    /// A task ended: its row is final, then the result is reported.
    Finished(TaskResult),
    /// The job service asks for the rows of `job` this node holds.
    Query { query: u64, job: u128 },
}

/// Rows answering a status query: (query, job, rows).
pub type Answer = (u64, u128, Vec<TaskRow>);

/// The task state objects one node writes, open while their tasks run.
#[derive(Debug)]
pub struct Objects {
    dir: PathBuf,
    node: String,
    layout: Layout,
    /// (job, task index for [`Layout::PerTask`]) -> open file.
    open: HashMap<(u128, Option<u32>), TaskState>,
}

impl Objects {
    /// The objects of node `node` under `dir`.
    pub fn new(dir: PathBuf, node: String, layout: Layout) -> Self {
        Self {
            dir,
            node,
            layout,
            open: HashMap::new(),
        }
    }

    /// Applies one batch of updates of `job`, in one transaction per file.
    pub fn apply(&mut self, job: u128, updates: Vec<RowUpdate>) -> Result<(), TaskStateError> {
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
    ) -> Result<&mut TaskState, TaskStateError> {
        use std::collections::hash_map::Entry;
        let st = match self.open.entry((job, idx)) {
            Entry::Occupied(e) => return Ok(e.into_mut()),
            Entry::Vacant(v) => v,
        };
        let file = match (idx, id) {
            (None, _) => TaskState::open(&self.dir, job, &self.node)?,
            (Some(idx), Some(id)) => TaskState::open_task(&self.dir, job, idx, id, &self.node)?,
            (Some(idx), None) => return Err(TaskStateError::BeforeGrant { job, idx }),
        };
        Ok(st.insert(file))
    }

    /// The rows of `job` this node holds.
    pub fn rows(&self, job: u128) -> Result<Vec<TaskRow>, TaskStateError> {
        match self.layout {
            Layout::PerJob => match self.open.get(&(job, None)) {
                Some(f) => f.rows(),
                None => Ok(Vec::new()),
            },
            Layout::PerTask => TaskState::rows_of_tasks(&self.dir, job),
        }
    }
}

/// Runs a granted task as every node does, and returns what the recorder
/// must be told at its end: dropped unrun when its job was `revoked`, else
/// its record is decoded (from `store`, or checked from the grant), the
/// recorder told it started (unless it is only no-op steps), and its steps
/// run.
pub async fn run_granted<S: TaskStore, H: TaskHost>(
    g: &TaskGrant,
    revoked: bool,
    store: Option<&S>,
    host: &H,
    buf: &mut Vec<u8>,
    recorder: &Sender<RecMsg>,
) -> RecMsg {
    if revoked {
        let row = RowUpdate::Dropped {
            idx: g.idx,
            attempt: g.attempt,
        };
        return RecMsg::Update(g.job, row);
    }
    let start_ns = now_ns();
    let result = match decode_task(g, store, buf).await {
        Ok(spec) => {
            if !is_trivial(&spec) {
                let row = RowUpdate::Started {
                    idx: g.idx,
                    attempt: g.attempt,
                    start_ns,
                };
                let _ = recorder.send(RecMsg::Update(g.job, row));
            }
            run_task(g, &spec, start_ns, store, host).await
        }
        Err(error) => failed(g, start_ns, error),
    };
    RecMsg::Finished(result)
}

/// The recorder thread's loop: until every sender is gone, takes a batch of
/// messages, writes it to `objects`, then calls `report` with the finished
/// tasks and the answers to the status queries; stops when `report` returns
/// false (the job service is gone).
pub fn record_loop(
    mut objects: Objects,
    rx: Receiver<RecMsg>,
    mut report: impl FnMut(Vec<TaskResult>, Vec<Answer>) -> bool,
) {
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
            next = match n < RECORD_BATCH {
                true => rx.try_recv().ok(),
                false => None,
            };
        }
        for (job, u) in updates {
            if let Err(e) = objects.apply(job, u) {
                tracing::error!("{e}");
            }
        }
        let answers = queries
            .into_iter()
            .map(|(query, job)| {
                let rows = objects.rows(job).unwrap_or_else(|e| {
                    tracing::error!("{e}");
                    Vec::new()
                });
                (query, job, rows)
            })
            .collect();
        if !report(results, answers) {
            return;
        }
    }
}
