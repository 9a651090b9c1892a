//! The job state object: one standalone SQLite file per job.
//!
//! Tables: `job_meta(key, value)` (format, job id, name, state, cause, times,
//! the job file as JSON, the store, the coordinator slot that split the job), `edges(before, after, data)`, `tasks` (the layout
//! shared with task state objects, [`TASKS_TABLE_SQL`]) and
//! `outputs(idx, exit_code, stdout, stderr)`. Any SQLite tool reads it.

use std::path::{Path, PathBuf};

use ferrite_proto::rpc_jobs::{JobPhase, JobSpec, TaskPhase, TaskRow, TASKS_TABLE_SQL};
use ferrite_proto::state_sql::{select_rows, upsert_row};
use rusqlite::{params, Connection, OptionalExtension};

use super::error::JobError;
use super::spec::JobGraph;

/// Value of `job_meta.format` this code writes and reads.
pub const JOB_STATE_FORMAT: &str = "1";

/// A job's metadata as kept in its state file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobMeta {
    pub job: u128,
    pub name: String,
    pub state: JobPhase,
    pub cause: Option<String>,
    pub submitted_ns: u64,
    pub ended_ns: Option<u64>,
    pub spec: JobSpec,
    /// URL of the engine holding the job's output records (and its task
    /// records when `records_in_store`).
    pub store: Option<String>,
    /// Whether the task records are in `store` (else they ride in grants).
    pub records_in_store: bool,
    /// The resource that split the job into tasks (its coordinator slot),
    /// once one did.
    pub coordinator: Option<String>,
}

/// What a finished task left: its row and outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    pub row: TaskRow,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// A finished task's (stdout, stderr).
pub type Outputs = (Vec<u8>, Vec<u8>);

/// Wrapper over a job state file.
#[derive(Debug)]
pub struct JobState {
    conn: Connection,
    path: PathBuf,
}

impl JobState {
    /// Creates the file for a validated job; every task starts `pending`.
    pub fn create(path: &Path, graph: &JobGraph, submitted_ns: u64) -> Result<Self, JobError> {
        let mut me = Self::open_raw(path)?;
        let spec = serde_json::to_string(&graph.spec).map_err(|e| me.corrupt(e.to_string()))?;
        let p = me.path.display().to_string();
        let err = |source| JobError::State {
            path: p.clone(),
            source,
        };
        let tx = me.conn.transaction().map_err(err)?;
        {
            let mut meta = tx
                .prepare("INSERT OR REPLACE INTO job_meta(key, value) VALUES (?1, ?2)")
                .map_err(err)?;
            for (k, v) in [
                ("format", JOB_STATE_FORMAT.to_string()),
                ("job", format!("{:032x}", graph.job)),
                ("name", graph.spec.name.clone()),
                ("state", JobPhase::Queued.as_str().to_string()),
                ("submitted_ns", submitted_ns.to_string()),
                ("spec", spec),
            ] {
                meta.execute(params![k, v]).map_err(err)?;
            }
            let mut task = tx
                .prepare("INSERT INTO tasks(idx, id, state, attempt) VALUES (?1, ?2, 'pending', 0)")
                .map_err(err)?;
            for (i, t) in graph.spec.tasks.iter().enumerate() {
                task.execute(params![i as u32, t.id]).map_err(err)?;
            }
            let mut edge = tx
                .prepare("INSERT INTO edges(before, after, data) VALUES (?1, ?2, ?3)")
                .map_err(err)?;
            for (i, ps) in graph.preds.iter().enumerate() {
                for &p in ps {
                    let data = graph.inputs[i].contains(&p);
                    edge.execute(params![p, i as u32, data]).map_err(err)?;
                }
            }
        }
        tx.commit().map_err(err)?;
        Ok(me)
    }

    /// Opens an existing job state file and checks its format.
    pub fn open(path: &Path) -> Result<Self, JobError> {
        if !path.exists() {
            return Err(JobError::Corrupt {
                path: path.display().to_string(),
                what: "no such file".into(),
            });
        }
        let me = Self::open_raw(path)?;
        match me.meta_value("format")? {
            Some(f) if f == JOB_STATE_FORMAT => Ok(me),
            other => Err(me.corrupt(format!("format {other:?}, expected {JOB_STATE_FORMAT}"))),
        }
    }

    fn open_raw(path: &Path) -> Result<Self, JobError> {
        let p = path.display().to_string();
        let err = |source| JobError::State {
            path: p.clone(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS job_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS edges(before INTEGER NOT NULL, after INTEGER NOT NULL, data INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS outputs(idx INTEGER PRIMARY KEY, exit_code INTEGER, stdout BLOB, stderr BLOB);",
        )
        .map_err(err)?;
        conn.execute_batch(TASKS_TABLE_SQL).map_err(err)?;
        Ok(Self {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql_err(&self) -> impl Fn(rusqlite::Error) -> JobError + '_ {
        move |source| JobError::State {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn corrupt(&self, what: String) -> JobError {
        JobError::Corrupt {
            path: self.path.display().to_string(),
            what,
        }
    }

    fn meta_value(&self, key: &str) -> Result<Option<String>, JobError> {
        self.conn
            .query_row("SELECT value FROM job_meta WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(self.sql_err())
    }

    fn meta_required(&self, key: &str) -> Result<String, JobError> {
        self.meta_value(key)?
            .ok_or_else(|| self.corrupt(format!("job_meta has no {key:?}")))
    }

    /// The job's metadata.
    pub fn meta(&self) -> Result<JobMeta, JobError> {
        let job = u128::from_str_radix(&self.meta_required("job")?, 16)
            .map_err(|e| self.corrupt(format!("job id: {e}")))?;
        let state = self.meta_required("state")?;
        let state =
            JobPhase::parse(&state).ok_or_else(|| self.corrupt(format!("state {state:?}")))?;
        let num = |k: &str| -> Result<Option<u64>, JobError> {
            self.meta_value(k)?
                .map(|v| v.parse().map_err(|e| self.corrupt(format!("{k}: {e}"))))
                .transpose()
        };
        let spec = serde_json::from_str(&self.meta_required("spec")?)
            .map_err(|e| self.corrupt(format!("spec: {e}")))?;
        Ok(JobMeta {
            job,
            name: self.meta_required("name")?,
            state,
            cause: self.meta_value("cause")?,
            submitted_ns: num("submitted_ns")?.unwrap_or(0),
            ended_ns: num("ended_ns")?,
            spec,
            store: self.meta_value("store")?,
            // Files written before the key existed kept a store only for
            // task records.
            records_in_store: self.meta_value("records")?.as_deref() != Some("inline"),
            coordinator: self.meta_value("coordinator")?,
        })
    }

    /// Records the job's phase (and, when it ends, the cause and time).
    pub fn set_phase(
        &mut self,
        phase: JobPhase,
        cause: Option<&str>,
        now_ns: u64,
    ) -> Result<(), JobError> {
        let p = self.path.display().to_string();
        let err = |source| JobError::State {
            path: p.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        let set = |k: &str, v: &str| {
            tx.execute(
                "INSERT OR REPLACE INTO job_meta(key, value) VALUES (?1, ?2)",
                params![k, v],
            )
        };
        set("state", phase.as_str()).map_err(err)?;
        if let Some(c) = cause {
            set("cause", c).map_err(err)?;
        }
        if phase.is_final() {
            set("ended_ns", &now_ns.to_string()).map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// Records the resource (coordinator slot) that split the job.
    pub fn set_coordinator(&mut self, coordinator: &str) -> Result<(), JobError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO job_meta(key, value) VALUES ('coordinator', ?1)",
                [coordinator],
            )
            .map_err(self.sql_err())?;
        Ok(())
    }

    /// Records the engine holding the job's outputs, and whether its task
    /// records are there too.
    pub fn set_store(&mut self, url: &str, records_in_store: bool) -> Result<(), JobError> {
        let records = if records_in_store { "store" } else { "inline" };
        self.conn
            .execute(
                "INSERT OR REPLACE INTO job_meta(key, value) VALUES ('store', ?1), ('records', ?2)",
                [url, records],
            )
            .map_err(self.sql_err())?;
        Ok(())
    }

    /// Stores task rows (and outputs) in one transaction. A row replaces the
    /// stored one unless the stored one is of a later attempt.
    pub fn record(&mut self, outcomes: &[TaskOutcome]) -> Result<(), JobError> {
        let p = self.path.display().to_string();
        let err = |source| JobError::State {
            path: p.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut out_stmt = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO outputs(idx, exit_code, stdout, stderr) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(err)?;
            for o in outcomes {
                let changed = upsert_row(&tx, &o.row).map_err(err)?;
                if changed > 0 && o.row.state.is_final() {
                    out_stmt
                        .execute(params![o.row.idx, o.row.exit_code, o.stdout, o.stderr])
                        .map_err(err)?;
                }
            }
        }
        tx.commit().map_err(err)
    }

    /// Every task row, by index.
    pub fn rows(&self) -> Result<Vec<TaskRow>, JobError> {
        select_rows(&self.conn).map_err(self.sql_err())
    }

    /// How many tasks the job has, and how many of them are done.
    pub fn task_counts(&self) -> Result<(u32, u32), JobError> {
        self.conn
            .query_row(
                "SELECT count(*), count(CASE WHEN state = ?1 THEN 1 END) FROM tasks",
                [TaskPhase::Done.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(self.sql_err())
    }

    /// Constraints as (before, after) task indices.
    pub fn edges(&self) -> Result<Vec<(u32, u32)>, JobError> {
        let mut stmt = self
            .conn
            .prepare("SELECT before, after FROM edges ORDER BY after, before")
            .map_err(self.sql_err())?;
        let edges = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.sql_err())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql_err())?;
        Ok(edges)
    }

    /// A finished task's stdout and stderr.
    pub fn output(&self, idx: u32) -> Result<Option<Outputs>, JobError> {
        self.conn
            .query_row(
                "SELECT stdout, stderr FROM outputs WHERE idx = ?1",
                [idx],
                |r| {
                    Ok((
                        r.get::<_, Option<Vec<u8>>>(0)?.unwrap_or_default(),
                        r.get::<_, Option<Vec<u8>>>(1)?.unwrap_or_default(),
                    ))
                },
            )
            .optional()
            .map_err(self.sql_err())
    }

    /// The rows of some tasks: the part of this object that travels with
    /// them to the node that will run them, as its task state object.
    pub fn split(&self, idxs: &[u32]) -> Result<Vec<TaskRow>, JobError> {
        let all = self.rows()?;
        Ok(idxs
            .iter()
            .filter_map(|&i| all.get(i as usize).cloned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::spec::parse_spec;
    use ferrite_proto::rpc_jobs::SpecFormat;

    fn graph() -> JobGraph {
        let s = parse_spec(
            "name='s'\n[[task]]\nid='a'\nsteps=[{kind='noop'}]\n[[task]]\nid='b'\ninputs=['a']\nsteps=[{kind='noop'}]\n",
            SpecFormat::Toml,
        )
        .unwrap();
        JobGraph::build(0x1234, s).unwrap()
    }

    fn done_row(idx: u32, id: &str, attempt: u32) -> TaskRow {
        TaskRow {
            idx,
            id: id.into(),
            state: TaskPhase::Done,
            node: Some("n1".into()),
            xstream: Some(0),
            attempt,
            ready_ns: Some(10),
            start_ns: Some(11),
            end_ns: Some(12),
            exit_code: Some(0),
            error: None,
        }
    }

    #[test]
    fn create_record_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let g = graph();
        let mut st = JobState::create(&path, &g, 5).unwrap();
        st.record(&[TaskOutcome {
            row: done_row(0, "a", 1),
            stdout: b"out".to_vec(),
            stderr: vec![],
        }])
        .unwrap();
        // An older attempt never overwrites a newer one.
        st.record(&[TaskOutcome {
            row: TaskRow {
                state: TaskPhase::Failed,
                ..done_row(0, "a", 0)
            },
            stdout: vec![],
            stderr: vec![],
        }])
        .unwrap();
        st.set_phase(JobPhase::Done, None, 99).unwrap();
        drop(st);
        let st = JobState::open(&path).unwrap();
        let meta = st.meta().unwrap();
        assert_eq!(meta.job, 0x1234);
        assert_eq!(meta.state, JobPhase::Done);
        assert_eq!(meta.ended_ns, Some(99));
        assert_eq!(meta.spec, g.spec);
        let rows = st.rows().unwrap();
        assert_eq!(rows[0], done_row(0, "a", 1));
        assert_eq!(rows[1].state, TaskPhase::Pending);
        assert_eq!(st.task_counts().unwrap(), (2, 1));
        assert_eq!(st.output(0).unwrap().unwrap().0, b"out");
        assert_eq!(st.split(&[1]).unwrap()[0].id, "b");
    }

    #[test]
    fn open_refuses_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.sqlite");
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE x(y)").unwrap();
        drop(c);
        let e = JobState::open(&path).unwrap_err().to_string();
        assert!(e.contains("format"), "{e}");
        assert!(JobState::open(&dir.path().join("missing")).is_err());
    }
}
