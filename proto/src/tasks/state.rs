//! Task state objects: the part of a job state object that travels with a
//! job's tasks to the node running them, as SQLite files holding `tasks`
//! rows (layout shared with the job state object); only the node running a
//! task writes its object. Two layouts ([`Layout`]):
//!
//! - [`Layout::PerTask`]: one file per task,
//!   `<dir>/<job>/<idx>.<task id>.task.sqlite`, created when the task is
//!   granted and closed when it ends.
//! - [`Layout::PerJob`] (the worker's default): one file per (job, node),
//!   `<dir>/<job>.<node>.task.sqlite`, with one row per task. Creating a
//!   SQLite file per task costs more than running a no-op task many times
//!   over (see `ferrite bench jobs --task-state per-task`).

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use crate::rpc_jobs::{TaskPhase, TaskRow, TASKS_TABLE_SQL};
use crate::state_sql::select_rows;

/// Why a task state object could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskStateError {
    #[error("task state file {path}: {source}")]
    Sql {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("task state ({what}): {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("task state: update of task {idx} of job {job:032x} before its grant")]
    BeforeGrant { job: u128, idx: u32 },
}

impl TaskStateError {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}

/// A change to one task's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowUpdate {
    /// The task arrived here (its row travels with it).
    Granted {
        idx: u32,
        id: String,
        attempt: u32,
        xstream: u32,
        ready_ns: u64,
    },
    Started {
        idx: u32,
        attempt: u32,
        start_ns: u64,
    },
    Finished {
        idx: u32,
        attempt: u32,
        start_ns: u64,
        end_ns: u64,
        exit_code: i32,
        error: Option<String>,
    },
    /// The job was revoked before the task ran.
    Dropped { idx: u32, attempt: u32 },
}

impl RowUpdate {
    /// The row of a task as it arrives on its node.
    pub fn granted(grant: &crate::rpc_jobs::TaskGrant) -> Self {
        RowUpdate::Granted {
            idx: grant.idx,
            id: grant.id.clone(),
            attempt: grant.attempt,
            xstream: grant.xstream,
            ready_ns: grant.ready_ns,
        }
    }

    /// The task the update is about.
    pub fn idx(&self) -> u32 {
        match self {
            RowUpdate::Granted { idx, .. }
            | RowUpdate::Started { idx, .. }
            | RowUpdate::Finished { idx, .. }
            | RowUpdate::Dropped { idx, .. } => *idx,
        }
    }

    /// Whether the task's row is final after it.
    pub fn ends(&self) -> bool {
        matches!(self, RowUpdate::Finished { .. } | RowUpdate::Dropped { .. })
    }
}

/// Wrapper over one task state file.
#[derive(Debug)]
pub struct TaskState {
    conn: Connection,
    path: PathBuf,
    node: String,
}

/// How a node lays out its task state objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One SQLite file per task.
    PerTask,
    /// One SQLite file per (job, node), one row per task.
    #[default]
    PerJob,
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "per-task" => Ok(Layout::PerTask),
            "per-job" => Ok(Layout::PerJob),
            other => Err(format!("{other:?}: expected per-task or per-job")),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::PerTask => "per-task",
            Layout::PerJob => "per-job",
        })
    }
}

/// A name reduced to `[A-Za-z0-9_-]`.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<dir>/<job>.<node>.task.sqlite` ([`Layout::PerJob`]).
pub fn task_state_path(dir: &Path, job: u128, node: &str) -> PathBuf {
    dir.join(format!("{job:032x}.{}.task.sqlite", file_safe(node)))
}

/// `<dir>/<job>/` ([`Layout::PerTask`]).
pub fn job_task_dir(dir: &Path, job: u128) -> PathBuf {
    dir.join(format!("{job:032x}"))
}

/// `<dir>/<job>/<idx>.<task id>.task.sqlite` ([`Layout::PerTask`]).
pub fn one_task_path(dir: &Path, job: u128, idx: u32, id: &str) -> PathBuf {
    job_task_dir(dir, job).join(format!("{idx}.{}.task.sqlite", file_safe(id)))
}

impl TaskState {
    /// Opens (creating if needed) this node's task state object of `job`
    /// ([`Layout::PerJob`]).
    pub fn open(dir: &Path, job: u128, node: &str) -> Result<Self, TaskStateError> {
        Self::open_path(task_state_path(dir, job, node), job, node)
    }

    /// Opens (creating if needed) the task state object of task `idx`
    /// ([`Layout::PerTask`]).
    pub fn open_task(
        dir: &Path,
        job: u128,
        idx: u32,
        id: &str,
        node: &str,
    ) -> Result<Self, TaskStateError> {
        let path = one_task_path(dir, job, idx, id);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(TaskStateError::io("create task state dir"))?;
        }
        Self::open_path(path, job, node)
    }

    /// Every row of every per-task object of `job` under `dir`.
    pub fn rows_of_tasks(dir: &Path, job: u128) -> Result<Vec<TaskRow>, TaskStateError> {
        let entries = match std::fs::read_dir(job_task_dir(dir, job)) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(TaskStateError::io("read task state dir")(e)),
        };
        let mut rows = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(TaskStateError::io("read task state dir"))?
                .path();
            if !path.to_string_lossy().ends_with(".task.sqlite") {
                continue;
            }
            let err = |source| TaskStateError::Sql {
                path: path.display().to_string(),
                source,
            };
            let conn = Connection::open(&path).map_err(err)?;
            rows.extend(select_rows(&conn).map_err(err)?);
        }
        rows.sort_by_key(|r| r.idx);
        Ok(rows)
    }

    fn open_path(path: PathBuf, job: u128, node: &str) -> Result<Self, TaskStateError> {
        let err = |source| TaskStateError::Sql {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(&path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS task_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(err)?;
        conn.execute_batch(TASKS_TABLE_SQL).map_err(err)?;
        conn.execute(
            "INSERT OR IGNORE INTO task_meta(key, value) VALUES ('format', '1'), ('job', ?1), ('node', ?2)",
            params![format!("{job:032x}"), node],
        )
        .map_err(err)?;
        Ok(Self {
            conn,
            path,
            node: node.to_string(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> TaskStateError + '_ {
        move |source| TaskStateError::Sql {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Applies updates in one transaction. A row of an older attempt never
    /// replaces a newer one.
    pub fn apply(&mut self, updates: &[RowUpdate]) -> Result<(), TaskStateError> {
        let path = self.path.display().to_string();
        let err = |source| TaskStateError::Sql {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut grant = tx
                .prepare_cached(
                    "INSERT INTO tasks(idx, id, state, node, xstream, attempt, ready_ns)
                     VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6)
                     ON CONFLICT(idx) DO UPDATE SET state='running', node=excluded.node,
                       xstream=excluded.xstream, attempt=excluded.attempt, ready_ns=excluded.ready_ns,
                       start_ns=NULL, end_ns=NULL, exit_code=NULL, error=NULL
                     WHERE excluded.attempt >= tasks.attempt",
                )
                .map_err(err)?;
            let mut start = tx
                .prepare_cached("UPDATE tasks SET start_ns=?3 WHERE idx=?1 AND attempt=?2")
                .map_err(err)?;
            let mut finish = tx
                .prepare_cached(
                    "UPDATE tasks SET state=?3, start_ns=?4, end_ns=?5, exit_code=?6, error=?7
                     WHERE idx=?1 AND attempt=?2",
                )
                .map_err(err)?;
            let mut drop = tx
                .prepare_cached("UPDATE tasks SET state='cancelled' WHERE idx=?1 AND attempt=?2")
                .map_err(err)?;
            for u in updates {
                match u {
                    RowUpdate::Granted {
                        idx,
                        id,
                        attempt,
                        xstream,
                        ready_ns,
                    } => grant.execute(params![
                        idx,
                        id,
                        self.node,
                        xstream,
                        attempt,
                        *ready_ns as i64
                    ]),
                    RowUpdate::Started {
                        idx,
                        attempt,
                        start_ns,
                    } => start.execute(params![idx, attempt, *start_ns as i64]),
                    RowUpdate::Finished {
                        idx,
                        attempt,
                        start_ns,
                        end_ns,
                        exit_code,
                        error,
                    } => {
                        let ok = error.is_none() && *exit_code == 0;
                        let state = if ok {
                            TaskPhase::Done
                        } else {
                            TaskPhase::Failed
                        };
                        finish.execute(params![
                            idx,
                            attempt,
                            state.as_str(),
                            *start_ns as i64,
                            *end_ns as i64,
                            exit_code,
                            error
                        ])
                    }
                    RowUpdate::Dropped { idx, attempt } => drop.execute(params![idx, attempt]),
                }
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// Every row, by task index.
    pub fn rows(&self) -> Result<Vec<TaskRow>, TaskStateError> {
        select_rows(&self.conn).map_err(self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_task_and_old_attempts_lose() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = TaskState::open(dir.path(), 5, "w/1").unwrap();
        assert!(st
            .path()
            .ends_with("00000000000000000000000000000005.w_1.task.sqlite"));
        let grant = |attempt| RowUpdate::Granted {
            idx: 3,
            id: "t3".into(),
            attempt,
            xstream: 1,
            ready_ns: 10,
        };
        st.apply(&[
            grant(1),
            RowUpdate::Started {
                idx: 3,
                attempt: 1,
                start_ns: 11,
            },
        ])
        .unwrap();
        st.apply(&[grant(0)]).unwrap(); // stale: ignored
        st.apply(&[RowUpdate::Finished {
            idx: 3,
            attempt: 1,
            start_ns: 11,
            end_ns: 12,
            exit_code: 2,
            error: None,
        }])
        .unwrap();
        drop(st);
        let st = TaskState::open(dir.path(), 5, "w/1").unwrap();
        let rows = st.rows().unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.state, r.attempt, r.node.as_deref()),
            (TaskPhase::Failed, 1, Some("w/1"))
        );
        assert_eq!(
            (r.start_ns, r.end_ns, r.exit_code),
            (Some(11), Some(12), Some(2))
        );
    }

    #[test]
    fn per_task_objects_are_files_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        for (idx, id) in [(4, "b/x"), (1, "a")] {
            let mut st = TaskState::open_task(dir.path(), 9, idx, id, "n1").unwrap();
            st.apply(&[RowUpdate::Granted {
                idx,
                id: id.into(),
                attempt: 0,
                xstream: 0,
                ready_ns: 5,
            }])
            .unwrap();
        }
        assert!(one_task_path(dir.path(), 9, 4, "b/x").ends_with("4.b_x.task.sqlite"));
        assert!(one_task_path(dir.path(), 9, 4, "b/x").exists());
        let rows = TaskState::rows_of_tasks(dir.path(), 9).unwrap();
        let ids: Vec<_> = rows.iter().map(|r| (r.idx, r.id.as_str())).collect();
        assert_eq!(ids, vec![(1, "a"), (4, "b/x")]);
        assert_eq!(rows[0].state, TaskPhase::Running);
        assert!(TaskState::rows_of_tasks(dir.path(), 10).unwrap().is_empty());
    }
}
