//! Task state objects: the part of a job state object that travels with a
//! job's tasks to the node running them. One SQLite file per (job, node),
//! holding the `tasks` rows (layout shared with the job state object) of
//! every task of that job this node was granted; only this node writes it.

use std::path::{Path, PathBuf};

use ferrite_proto::rpc_jobs::{TaskPhase, TaskRow, TASKS_TABLE_SQL};
use rusqlite::{params, Connection};

use super::error::JobsError;

/// Columns of a [`TaskRow`] in `tasks`, in struct order.
const ROW_COLUMNS: &str =
    "idx, id, state, node, xstream, attempt, ready_ns, start_ns, end_ns, exit_code, error";

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

/// Wrapper over one task state file.
#[derive(Debug)]
pub struct TaskState {
    conn: Connection,
    path: PathBuf,
    node: String,
}

/// `<dir>/<job>.<node>.task.sqlite`, the node name reduced to `[A-Za-z0-9_-]`.
pub fn task_state_path(dir: &Path, job: u128, node: &str) -> PathBuf {
    let node: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{job:032x}.{node}.task.sqlite"))
}

impl TaskState {
    /// Opens (creating if needed) this node's task state object of `job`.
    pub fn open(dir: &Path, job: u128, node: &str) -> Result<Self, JobsError> {
        let path = task_state_path(dir, job, node);
        let err = |source| JobsError::State {
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

    fn err(&self) -> impl Fn(rusqlite::Error) -> JobsError + '_ {
        move |source| JobsError::State {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Applies updates in one transaction. A row of an older attempt never
    /// replaces a newer one.
    pub fn apply(&mut self, updates: &[RowUpdate]) -> Result<(), JobsError> {
        let path = self.path.display().to_string();
        let err = |source| JobsError::State {
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
    pub fn rows(&self) -> Result<Vec<TaskRow>, JobsError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {ROW_COLUMNS} FROM tasks ORDER BY idx"))
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], row_from_sql)
            .map_err(self.err())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.err())?;
        Ok(rows)
    }
}

fn row_from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
    let state: String = r.get(2)?;
    let state = TaskPhase::parse(&state).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            2,
            rusqlite::types::Type::Text,
            format!("unknown task state {state:?}").into(),
        )
    })?;
    let ns = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|v| v as u64))
    };
    Ok(TaskRow {
        idx: r.get(0)?,
        id: r.get(1)?,
        state,
        node: r.get(3)?,
        xstream: r.get(4)?,
        attempt: r.get(5)?,
        ready_ns: ns(6)?,
        start_ns: ns(7)?,
        end_ns: ns(8)?,
        exit_code: r.get(9)?,
        error: r.get(10)?,
    })
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
}
