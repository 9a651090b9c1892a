//! A job's DAG drawn in the terminal: tasks by level (longest path from a
//! root), each with a state mark and the tasks it waits for.

use std::fmt::Write;

use ferrite_proto::rpc_jobs::{JobStatus, TaskPhase};

/// Jobs with more tasks than this are drawn as counts per level.
pub const DETAIL_MAX_TASKS: usize = 60;
/// Levels drawn at most.
pub const LEVELS_MAX: usize = 40;

/// The mark of a task state.
pub fn mark(state: TaskPhase) -> char {
    match state {
        TaskPhase::Pending => '·',
        TaskPhase::Ready => '○',
        TaskPhase::Running => '▶',
        TaskPhase::Done => '✓',
        TaskPhase::Failed => '✗',
        TaskPhase::Cancelled => '⊘',
    }
}

/// Level of each task: 0 for roots, else 1 + the deepest predecessor.
pub fn levels(tasks: usize, edges: &[(u32, u32)]) -> Vec<usize> {
    let mut preds = vec![Vec::new(); tasks];
    let mut succs = vec![Vec::new(); tasks];
    for &(b, a) in edges {
        if (b as usize) < tasks && (a as usize) < tasks {
            preds[a as usize].push(b as usize);
            succs[b as usize].push(a as usize);
        }
    }
    let mut waiting: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut level = vec![0; tasks];
    let mut stack: Vec<usize> = (0..tasks).filter(|&i| waiting[i] == 0).collect();
    while let Some(i) = stack.pop() {
        for &s in &succs[i] {
            level[s] = level[s].max(level[i] + 1);
            waiting[s] -= 1;
            if waiting[s] == 0 {
                stack.push(s);
            }
        }
    }
    level
}

/// The whole picture: a header line, then one line per level.
pub fn render(status: &JobStatus) -> String {
    let mut out = String::new();
    let count = |p: TaskPhase| status.tasks.iter().filter(|t| t.state == p).count();
    let _ = writeln!(
        out,
        "job {:032x} {:?}: {}  {}/{} done, {} running, {} failed",
        status.job,
        status.name,
        status.state.as_str(),
        count(TaskPhase::Done),
        status.tasks.len(),
        count(TaskPhase::Running),
        count(TaskPhase::Failed)
    );
    if let Some(c) = &status.coordinator {
        let _ = writeln!(out, "split by {c}");
    }
    if let Some(c) = &status.cause {
        let _ = writeln!(out, "cause: {c}");
    }
    let level = levels(status.tasks.len(), &status.edges);
    let depth = level.iter().copied().max().map_or(0, |m| m + 1);
    let mut by_level = vec![Vec::new(); depth];
    for (i, &l) in level.iter().enumerate() {
        by_level[l].push(i);
    }
    let mut preds = vec![Vec::new(); status.tasks.len()];
    for &(b, a) in &status.edges {
        if let Some(p) = preds.get_mut(a as usize) {
            p.push(b as usize);
        }
    }
    let detail = status.tasks.len() <= DETAIL_MAX_TASKS;
    for (l, members) in by_level.iter().enumerate().take(LEVELS_MAX) {
        let _ = write!(out, "level {l:>3} ");
        if detail {
            for &i in members {
                let t = &status.tasks[i];
                let _ = write!(out, " {} {}", mark(t.state), t.id);
                if !preds[i].is_empty() {
                    let names: Vec<&str> = preds[i]
                        .iter()
                        .map(|&p| status.tasks[p].id.as_str())
                        .collect();
                    let _ = write!(out, " ◀ {}", names.join(","));
                }
                out.push_str("  ");
            }
        } else {
            let _ = write!(out, " {:>7} tasks ", members.len());
            for p in [
                TaskPhase::Done,
                TaskPhase::Running,
                TaskPhase::Ready,
                TaskPhase::Pending,
                TaskPhase::Failed,
                TaskPhase::Cancelled,
            ] {
                let n = members
                    .iter()
                    .filter(|&&i| status.tasks[i].state == p)
                    .count();
                if n > 0 {
                    let _ = write!(out, " {}{n}", mark(p));
                }
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    if depth > LEVELS_MAX {
        let _ = writeln!(out, "… {} more levels", depth - LEVELS_MAX);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::rpc_jobs::{JobPhase, TaskRow};

    fn row(idx: u32, id: &str, state: TaskPhase) -> TaskRow {
        TaskRow {
            idx,
            id: id.into(),
            state,
            node: None,
            xstream: None,
            attempt: 0,
            ready_ns: None,
            start_ns: None,
            end_ns: None,
            exit_code: None,
            error: None,
        }
    }

    #[test]
    fn fan_out_fan_in_is_drawn_by_level() {
        let status = JobStatus {
            job: 1,
            name: "diamond".into(),
            state: JobPhase::Running,
            cause: None,
            tasks: vec![
                row(0, "join", TaskPhase::Pending),
                row(1, "root", TaskPhase::Done),
                row(2, "left", TaskPhase::Running),
                row(3, "right", TaskPhase::Done),
            ],
            edges: vec![(1, 2), (1, 3), (2, 0), (3, 0)],
            answered: vec![],
            store: None,
            coordinator: Some("engine/coordinator-3".into()),
        };
        assert_eq!(levels(4, &status.edges), vec![2, 0, 1, 1]);
        let pic = render(&status);
        let lines: Vec<&str> = pic.lines().collect();
        assert!(lines[0].contains("2/4 done, 1 running"), "{pic}");
        assert_eq!(lines[1], "split by engine/coordinator-3");
        assert_eq!(lines[2], "level   0  ✓ root");
        assert_eq!(lines[3], "level   1  ▶ left ◀ root   ✓ right ◀ root");
        assert_eq!(lines[4], "level   2  · join ◀ left,right");
    }
}
