//! `job status`: the manager's view merged with the rows of the task state
//! objects, as the nodes holding them answer.

use ferrite_proto::rpc_jobs::{JobStatus, TaskRow, ToPeer};

use super::control::{Control, LOCAL};
use super::ConnId;
use crate::jobs::error::JobError;
use crate::jobs::rm::{coordinator_name, NodeId};
use crate::jobs::state::JobState;

/// A status query waiting for nodes.
pub(super) struct Gather {
    job: u128,
    conn: ConnId,
    waiting: Vec<NodeId>,
    answered: Vec<String>,
    rows: Vec<TaskRow>,
    watch: bool,
}

/// A `--watch` subscription.
#[derive(Default)]
pub(super) struct Watch {
    in_flight: bool,
    stale: bool,
}

impl Control {
    pub(super) fn status(&mut self, conn: ConnId, job: u128, watch: bool) {
        if let Some(archived) = self.archived.get(&job) {
            let path = archived.path.clone();
            return self.answer_blocking(conn, move || match archived_status(&path) {
                Ok(status) => ToPeer::Status { status },
                Err(e) => ToPeer::Error {
                    message: e.to_string(),
                },
            });
        }
        if self.rm.phase(job).is_none() {
            let message = JobError::NoSuchJob(job).to_string();
            return self.send(conn, ToPeer::Error { message });
        }
        if watch {
            self.watchers.insert((conn, job), Watch::default());
        }
        self.start_gather(conn, job, watch);
    }

    fn start_gather(&mut self, conn: ConnId, job: u128, watch: bool) {
        let query = self.next_query;
        self.next_query += 1;
        let waiting = self.rm.nodes_of(job);
        for node in &waiting {
            if *node == LOCAL {
                if let Some(local) = &self.local {
                    local.query(query, job);
                }
            } else if let Some(&c) = self.node_conn.get(node) {
                self.send(c, ToPeer::StatusQuery { query, job });
            }
        }
        if let Some(w) = self.watchers.get_mut(&(conn, job)) {
            w.in_flight = true;
            w.stale = false;
        }
        let g = Gather {
            job,
            conn,
            waiting,
            answered: Vec::new(),
            rows: Vec::new(),
            watch,
        };
        self.gathers.insert(query, g);
        self.try_finish(query);
    }

    pub(super) fn rows_answered(
        &mut self,
        conn: ConnId,
        query: u64,
        job: u128,
        rows: Vec<TaskRow>,
    ) {
        if let Some(node) = self.conns.get(&conn).and_then(|c| c.node) {
            self.node_rows(node, query, job, rows);
        }
    }

    /// `node` answered status query `query` with the rows it holds.
    pub(super) fn node_rows(&mut self, node: NodeId, query: u64, job: u128, rows: Vec<TaskRow>) {
        let label = self.rm.node_label(node).unwrap_or("?").to_string();
        if let Some(g) = self.gathers.get_mut(&query) {
            if g.job == job && g.waiting.contains(&node) {
                g.waiting.retain(|&n| n != node);
                g.answered.push(label);
                g.rows.extend(rows);
            }
        }
        self.try_finish(query);
    }

    /// A node is gone: queries stop waiting for it.
    pub(super) fn node_gone(&mut self, node: NodeId) {
        let queries: Vec<u64> = self.gathers.keys().copied().collect();
        for q in queries {
            if let Some(g) = self.gathers.get_mut(&q) {
                g.waiting.retain(|&n| n != node);
            }
            self.try_finish(q);
        }
    }

    fn try_finish(&mut self, query: u64) {
        if !self
            .gathers
            .get(&query)
            .is_some_and(|g| g.waiting.is_empty())
        {
            return;
        }
        let Some(g) = self.gathers.remove(&query) else {
            return;
        };
        let Some(status) = self.merged_status(g.job, g.rows, g.answered) else {
            return;
        };
        let done = status.state.is_final();
        self.send(g.conn, ToPeer::Status { status });
        if g.watch {
            let key = (g.conn, g.job);
            let stale = match self.watchers.get_mut(&key) {
                Some(w) => {
                    w.in_flight = false;
                    w.stale
                }
                None => false,
            };
            if done {
                self.watchers.remove(&key);
            } else if stale {
                self.start_gather(g.conn, g.job, true);
            }
        }
    }

    fn merged_status(
        &self,
        job: u128,
        node_rows: Vec<TaskRow>,
        answered: Vec<String>,
    ) -> Option<JobStatus> {
        let mut tasks = self.rm.rows(job)?;
        for row in node_rows {
            let Some(base) = tasks.get_mut(row.idx as usize) else {
                continue;
            };
            let newer = row.attempt > base.attempt
                || (row.attempt == base.attempt && !base.state.is_final());
            if newer && row.id == base.id {
                *base = row;
            }
        }
        let graph = self.rm.graph(job)?;
        let (state, cause) = self.rm.phase(job)?;
        Some(JobStatus {
            job,
            name: graph.spec.name.clone(),
            state,
            cause,
            tasks,
            edges: graph.edges(),
            answered,
            store: self.stores.get(&job).map(|s| s.0.clone()),
            coordinator: self.rm.coordinator_slot(job).map(coordinator_name),
        })
    }

    /// Starts a gather for every watcher of a job that changed.
    pub(super) fn refresh_watchers(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        let mut start = Vec::new();
        for (&(conn, job), w) in self.watchers.iter_mut() {
            if !dirty.contains(&job) {
                continue;
            }
            if w.in_flight {
                w.stale = true;
            } else {
                start.push((conn, job));
            }
        }
        for (conn, job) in start {
            self.start_gather(conn, job, true);
        }
    }
}

/// The status of a job that ended before this service started.
fn archived_status(path: &std::path::Path) -> Result<JobStatus, JobError> {
    let st = JobState::open(path)?;
    let meta = st.meta()?;
    Ok(JobStatus {
        job: meta.job,
        name: meta.name,
        state: meta.state,
        cause: meta.cause,
        tasks: st.rows()?,
        edges: st.edges()?,
        answered: Vec::new(),
        store: meta.store,
        coordinator: meta.coordinator,
    })
}
