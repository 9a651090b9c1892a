//! Job files: parsing, validation, and the checked DAG ([`JobGraph`]).

use std::collections::{BTreeSet, HashMap};

use ferrite_proto::record::{encode_record, record_len, RecordFlags};
use ferrite_proto::rpc_jobs::{task_key, JobSpec, RetryPolicy, SpecFormat};

use super::error::{JobError, SpecError};

/// Longest task id accepted, in bytes (a dkey).
pub const TASK_ID_MAX_BYTES: usize = 1024;

/// Parses a job file of the given format.
pub fn parse_spec(text: &str, format: SpecFormat) -> Result<JobSpec, SpecError> {
    match format {
        SpecFormat::Toml => toml::from_str(text).map_err(|e| SpecError::Syntax {
            format: "TOML",
            message: e.to_string(),
        }),
        SpecFormat::Json => serde_json::from_str(text).map_err(|e| SpecError::Syntax {
            format: "JSON",
            message: e.to_string(),
        }),
    }
}

/// The format a job file's name says it has (`.json`, else TOML).
pub fn format_of_path(path: &std::path::Path) -> SpecFormat {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("json") => SpecFormat::Json,
        _ => SpecFormat::Toml,
    }
}

/// A validated job: tasks by index, constraints both ways, and the task
/// records (record layout, key [`task_key`]) laid out one after another in
/// an arena, as a record log would hold them.
#[derive(Debug)]
pub struct JobGraph {
    pub job: u128,
    pub spec: JobSpec,
    /// `preds[i]`: tasks that must finish before task `i` (deduplicated).
    pub preds: Vec<Vec<u32>>,
    /// `succs[i]`: tasks waiting on task `i`.
    pub succs: Vec<Vec<u32>>,
    /// `inputs[i]`: tasks whose output is task `i`'s input, in order.
    pub inputs: Vec<Vec<u32>>,
    /// Whether some task reads task `i`'s output.
    pub is_input: Vec<bool>,
    arena: Vec<u8>,
    /// `(offset, length)` of each task's record in the arena.
    records: Vec<(u64, u32)>,
}

impl JobGraph {
    /// Checks `spec` and builds the DAG; refuses duplicate ids, unknown
    /// references and cycles, naming the tasks involved.
    pub fn build(job: u128, spec: JobSpec) -> Result<Self, JobError> {
        let index = check_ids(&spec)?;
        let n = spec.tasks.len();
        let mut preds = vec![Vec::new(); n];
        let mut inputs = vec![Vec::new(); n];
        let mut unknown = Vec::new();
        for (i, t) in spec.tasks.iter().enumerate() {
            for (name, is_input) in t
                .after
                .iter()
                .map(|a| (a, false))
                .chain(t.inputs.iter().map(|a| (a, true)))
            {
                match index.get(name.as_str()) {
                    Some(&p) => {
                        preds[i].push(p);
                        if is_input {
                            inputs[i].push(p);
                        }
                    }
                    None => unknown.push((t.id.clone(), name.clone())),
                }
            }
            preds[i].sort_unstable();
            preds[i].dedup();
        }
        if !unknown.is_empty() {
            return Err(SpecError::UnknownReferences(unknown).into());
        }
        let mut succs = vec![Vec::new(); n];
        for (i, ps) in preds.iter().enumerate() {
            for &p in ps {
                succs[p as usize].push(i as u32);
            }
        }
        if let Some(cycle) = find_cycle(&preds, &succs) {
            let names = cycle
                .iter()
                .map(|&i| spec.tasks[i as usize].id.clone())
                .collect();
            return Err(SpecError::Cycle(names).into());
        }
        let mut is_input = vec![false; n];
        for &p in inputs.iter().flatten() {
            is_input[p as usize] = true;
        }
        let (arena, records) = encode_records(job, &spec)?;
        Ok(Self {
            job,
            spec,
            preds,
            succs,
            inputs,
            is_input,
            arena,
            records,
        })
    }

    pub fn len(&self) -> usize {
        self.spec.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spec.tasks.is_empty()
    }

    pub fn id(&self, idx: u32) -> &str {
        &self.spec.tasks[idx as usize].id
    }

    /// The retry policy that applies to task `idx`.
    pub fn retry(&self, idx: u32) -> RetryPolicy {
        self.spec.tasks[idx as usize]
            .retry
            .unwrap_or(self.spec.retry)
    }

    /// Task `idx`'s record and the address it lives at in the arena.
    pub fn record(&self, idx: u32) -> (u64, &[u8]) {
        let (off, len) = self.records[idx as usize];
        (off, &self.arena[off as usize..off as usize + len as usize])
    }

    /// Edges as (before, after) pairs.
    pub fn edges(&self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for (i, ps) in self.preds.iter().enumerate() {
            out.extend(ps.iter().map(|&p| (p, i as u32)));
        }
        out
    }
}

fn check_ids(spec: &JobSpec) -> Result<HashMap<&str, u32>, SpecError> {
    if spec.tasks.is_empty() {
        return Err(SpecError::NoTasks(spec.name.clone()));
    }
    let mut index = HashMap::with_capacity(spec.tasks.len());
    let mut dups = BTreeSet::new();
    let mut no_steps = Vec::new();
    for (i, t) in spec.tasks.iter().enumerate() {
        if t.id.is_empty() || t.id.len() > TASK_ID_MAX_BYTES {
            return Err(SpecError::BadId(t.id.clone()));
        }
        if index.insert(t.id.as_str(), i as u32).is_some() {
            dups.insert(t.id.clone());
        }
        if t.steps.is_empty() {
            no_steps.push(t.id.clone());
        }
        if t.retry.unwrap_or(spec.retry).max_attempts == 0 {
            return Err(SpecError::BadRetry(t.id.clone()));
        }
    }
    if !dups.is_empty() {
        return Err(SpecError::DuplicateIds(dups.into_iter().collect()));
    }
    if !no_steps.is_empty() {
        return Err(SpecError::NoSteps(no_steps));
    }
    Ok(index)
}

/// Kahn's algorithm; if some tasks are never freed, walks predecessors from
/// one of them until a task repeats and returns that cycle in edge order.
fn find_cycle(preds: &[Vec<u32>], succs: &[Vec<u32>]) -> Option<Vec<u32>> {
    let n = preds.len();
    let mut indegree: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut stack: Vec<u32> = (0..n as u32)
        .filter(|&i| indegree[i as usize] == 0)
        .collect();
    let mut freed = 0;
    while let Some(i) = stack.pop() {
        freed += 1;
        for &s in &succs[i as usize] {
            indegree[s as usize] -= 1;
            if indegree[s as usize] == 0 {
                stack.push(s);
            }
        }
    }
    if freed == n {
        return None;
    }
    // Every unfreed task has an unfreed predecessor: walking back must loop.
    let start = (0..n).find(|&i| indegree[i] > 0)? as u32;
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    let mut at = start;
    while seen[at as usize] == usize::MAX {
        seen[at as usize] = path.len();
        path.push(at);
        at = *preds[at as usize]
            .iter()
            .find(|&&p| indegree[p as usize] > 0)?;
    }
    let mut cycle = path.split_off(seen[at as usize]);
    cycle.reverse(); // predecessor walk -> edge order
    cycle.push(cycle[0]);
    Some(cycle)
}

/// The record arena and each record's `(offset, length)` in it.
type Records = (Vec<u8>, Vec<(u64, u32)>);

fn encode_records(job: u128, spec: &JobSpec) -> Result<Records, JobError> {
    let mut arena = Vec::new();
    let mut records = Vec::with_capacity(spec.tasks.len());
    for t in &spec.tasks {
        let value = serde_json::to_vec(t).map_err(|e| SpecError::Syntax {
            format: "JSON",
            message: e.to_string(),
        })?;
        let key = task_key(job, t.id.as_bytes());
        let len = record_len(&key, value.len());
        let off = arena.len();
        arena.resize(off + len, 0);
        encode_record(
            &mut arena[off..],
            &key,
            &value,
            1,
            off as u64,
            RecordFlags::empty(),
            0,
        )?;
        records.push((off as u64, len as u32));
    }
    Ok((arena, records))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_proto::record::RecordView;

    fn spec(text: &str) -> JobSpec {
        parse_spec(text, SpecFormat::Toml).unwrap()
    }

    #[test]
    fn cycle_is_named_in_edge_order() {
        let s = spec(
            r#"name = "c"
[[task]]
id = "a"
after = ["c"]
steps = [{kind = "noop"}]
[[task]]
id = "b"
after = ["a"]
steps = [{kind = "noop"}]
[[task]]
id = "c"
after = ["b"]
steps = [{kind = "noop"}]
[[task]]
id = "free"
steps = [{kind = "noop"}]
"#,
        );
        let err = JobGraph::build(1, s).unwrap_err().to_string();
        assert!(
            err.contains("a -> b -> c -> a")
                || err.contains("b -> c -> a -> b")
                || err.contains("c -> a -> b -> c"),
            "{err}"
        );
        assert!(!err.contains("free"), "{err}");
    }

    #[test]
    fn duplicates_and_unknown_references_are_named() {
        let dup = spec(
            "name='d'\n[[task]]\nid='x'\nsteps=[{kind='noop'}]\n[[task]]\nid='x'\nsteps=[{kind='noop'}]\n",
        );
        assert_eq!(
            JobGraph::build(1, dup).unwrap_err().to_string(),
            "duplicate task ids: x"
        );
        let unknown = spec(
            "name='u'\n[[task]]\nid='x'\nafter=['ghost']\ninputs=['y']\nsteps=[{kind='noop'}]\n",
        );
        let err = JobGraph::build(1, unknown).unwrap_err().to_string();
        assert!(
            err.contains(r#""x" -> "ghost""#) && err.contains(r#""x" -> "y""#),
            "{err}"
        );
    }

    #[test]
    fn records_carry_the_key_and_the_task() {
        let s = spec(
            "name='r'\n[[task]]\nid='first'\nsteps=[{kind='noop'}]\n[[task]]\nid='second'\ninputs=['first']\nsteps=[{kind='exec',cmd='cat'}]\n",
        );
        let g = JobGraph::build(0xabc, s).unwrap();
        assert_eq!(g.preds[1], vec![0]);
        assert_eq!(g.inputs[1], vec![0]);
        assert!(g.is_input[0] && !g.is_input[1]);
        let (addr, bytes) = g.record(1);
        let view = RecordView::parse(bytes).unwrap();
        view.verify_for(&task_key(0xabc, b"second"), addr).unwrap();
        assert!(view.verify_for(&task_key(0xabc, b"first"), addr).is_err());
        let back: ferrite_proto::rpc_jobs::TaskSpec = serde_json::from_slice(view.value()).unwrap();
        assert_eq!(back, g.spec.tasks[1]);
    }

    #[test]
    fn json_and_syntax_errors() {
        let j = parse_spec(
            r#"{"name":"j","tasks":[{"id":"a","steps":[{"kind":"noop"}]}]}"#,
            SpecFormat::Json,
        )
        .unwrap();
        assert_eq!(j.tasks.len(), 1);
        let e = parse_spec("name = ", SpecFormat::Toml).unwrap_err();
        assert!(matches!(e, SpecError::Syntax { format: "TOML", .. }));
        let e = JobGraph::build(1, spec("name='e'\ntask=[]\n")).unwrap_err();
        assert!(e.to_string().contains("no tasks"));
    }
}
