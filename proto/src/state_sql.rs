//! The `tasks` table ([`TASKS_TABLE_SQL`]) through rusqlite: one reader and
//! one writer of [`TaskRow`]s, used by the job state object (engine) and by
//! the task state objects (workers), so that both read and write the rows
//! the same way.
//!
//! ```
//! use ferrite_proto::rpc_jobs::{TaskPhase, TaskRow, TASKS_TABLE_SQL};
//! use ferrite_proto::state_sql::{select_rows, upsert_rows};
//!
//! let conn = rusqlite::Connection::open_in_memory().unwrap();
//! conn.execute_batch(TASKS_TABLE_SQL).unwrap();
//! let row = TaskRow {
//!     idx: 0, id: "a".into(), state: TaskPhase::Done, node: Some("n".into()),
//!     xstream: Some(0), attempt: 1, ready_ns: Some(1), start_ns: Some(2),
//!     end_ns: Some(3), exit_code: Some(0), error: None,
//! };
//! upsert_rows(&conn, std::slice::from_ref(&row)).unwrap();
//! // An older attempt does not replace a newer one.
//! upsert_rows(&conn, &[TaskRow { attempt: 0, state: TaskPhase::Failed, ..row.clone() }]).unwrap();
//! assert_eq!(select_rows(&conn).unwrap(), vec![row]);
//! ```

use rusqlite::{params, Connection};

use crate::rpc_jobs::{TaskPhase, TaskRow};

/// Columns of a [`TaskRow`] in `tasks`, in struct order.
pub const ROW_COLUMNS: &str =
    "idx, id, state, node, xstream, attempt, ready_ns, start_ns, end_ns, exit_code, error";

/// Inserts a row or replaces the stored one, unless that is of a later attempt.
pub const UPSERT_ROW_SQL: &str = "INSERT INTO tasks(idx, id, state, node, xstream, attempt, ready_ns, start_ns, end_ns, exit_code, error)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
     ON CONFLICT(idx) DO UPDATE SET id=excluded.id, state=excluded.state, node=excluded.node,
       xstream=excluded.xstream, attempt=excluded.attempt, ready_ns=excluded.ready_ns,
       start_ns=excluded.start_ns, end_ns=excluded.end_ns, exit_code=excluded.exit_code, error=excluded.error
     WHERE excluded.attempt >= tasks.attempt";

/// Reads a [`TaskRow`] from a row selected with [`ROW_COLUMNS`].
pub fn row_from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
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

/// Every row of `tasks`, by task index.
pub fn select_rows(conn: &Connection) -> rusqlite::Result<Vec<TaskRow>> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {ROW_COLUMNS} FROM tasks ORDER BY idx"))?;
    let rows = stmt.query_map([], row_from_sql)?;
    rows.collect()
}

/// Upserts one row with [`UPSERT_ROW_SQL`]; returns the rows changed (0
/// when the stored row is of a later attempt).
pub fn upsert_row(conn: &Connection, r: &TaskRow) -> rusqlite::Result<usize> {
    let mut stmt = conn.prepare_cached(UPSERT_ROW_SQL)?;
    stmt.execute(params![
        r.idx,
        r.id,
        r.state.as_str(),
        r.node,
        r.xstream,
        r.attempt,
        r.ready_ns.map(|v| v as i64),
        r.start_ns.map(|v| v as i64),
        r.end_ns.map(|v| v as i64),
        r.exit_code,
        r.error
    ])
}

/// Upserts rows (the caller decides the transaction).
pub fn upsert_rows(conn: &Connection, rows: &[TaskRow]) -> rusqlite::Result<()> {
    for r in rows {
        upsert_row(conn, r)?;
    }
    Ok(())
}
