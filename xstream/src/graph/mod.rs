//! `TaskGraph`: a user-level DAG scheduler in the manner of DAOS's TSE.
//!
//! Tasks are added with the tasks they depend on; a task runs only after all
//! of them completed. A failing (or panicking) task cancels every task that
//! depends on it, directly or not, with the failure as the cause. Cycles
//! are rejected when the closing edge is added ([`TaskGraph::add_dependency`]),
//! naming the tasks around the cycle. The graph is bounded by the capacity
//! given at creation.
//!
//! Storage is flat: per-task vectors plus out-edges as linked lists in two
//! edge vectors, turned into compressed rows at run time. A no-op task costs
//! no heap allocation.
//!
//! Running ([`TaskGraph::run`]) shards the tasks over the xstreams by
//! placement and proceeds in rounds: each xstream runs every task it can in
//! an order drawn from the seed, then the xstreams exchange the completions
//! that cross between them. Given a seed, each xstream's ready order is the
//! same on every run.

mod exchange;
mod run;
mod shard;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::LocalBoxFuture;

use crate::error::{Error, Result};
use crate::{TaskClass, XstreamId};

pub use run::{GraphReport, PreparedGraph, RunOptions, TraceEntry};

const NONE: u32 = u32::MAX;
const ANY: u32 = u32::MAX;

/// Index of a task in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u32);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task#{}", self.0)
    }
}

/// Why a task failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    pub message: String,
}

impl TaskError {
    pub fn new(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TaskError {}

/// How a task ended, as its completion callback sees it.
#[derive(Clone, Debug)]
pub enum TaskOutcome {
    Completed,
    Failed(Arc<TaskError>),
    /// A task it depends on (maybe indirectly) failed: `cause`.
    Canceled {
        cause: TaskId,
        error: Arc<TaskError>,
    },
}

type SyncBody = Box<dyn FnOnce() -> Result<(), TaskError> + Send>;
type AsyncBody = Box<dyn FnOnce() -> LocalBoxFuture<'static, Result<(), TaskError>> + Send>;
pub(crate) type Callback = Box<dyn FnOnce(TaskId, &TaskOutcome) + Send>;

pub(crate) enum Body {
    Noop,
    Sync(SyncBody),
    Async(TaskClass, AsyncBody),
}

/// A task to add: its body, placement, name and completion callback.
pub struct Task {
    body: Body,
    placement: Option<XstreamId>,
    callback: Option<Callback>,
    name: Option<String>,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .finish()
    }
}

impl Task {
    /// A task that does nothing (a barrier, or a benchmark node).
    pub fn noop() -> Self {
        Self {
            body: Body::Noop,
            placement: None,
            callback: None,
            name: None,
        }
    }

    /// A task that runs `body` inline on its xstream's scheduler.
    pub fn new(body: impl FnOnce() -> Result<(), TaskError> + Send + 'static) -> Self {
        Self {
            body: Body::Sync(Box::new(body)),
            ..Self::noop()
        }
    }

    /// A task whose future is spawned into `class` on its xstream; the
    /// future may be `!Send` (it is created there).
    pub fn new_async<F, Fut>(class: TaskClass, body: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), TaskError>> + 'static,
    {
        let body: AsyncBody = Box::new(move || Box::pin(body()));
        Self {
            body: Body::Async(class, body),
            ..Self::noop()
        }
    }

    /// Place the task on `xs` (default: spread by task id).
    pub fn on(mut self, xs: XstreamId) -> Self {
        self.placement = Some(xs);
        self
    }

    /// A name for error messages.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Called on the task's xstream once it completed, failed or was canceled.
    pub fn completion_callback(
        mut self,
        callback: impl FnOnce(TaskId, &TaskOutcome) + Send + 'static,
    ) -> Self {
        self.callback = Some(Box::new(callback));
        self
    }
}

/// A DAG of tasks; see the module documentation.
pub struct TaskGraph {
    capacity: usize,
    placement: Vec<u32>,
    /// Dependencies given to `add`, in rows: task `i` waits for
    /// `deps[dep_offsets[i]..dep_offsets[i + 1]]`.
    dep_offsets: Vec<u32>,
    deps: Vec<u32>,
    /// Dependencies added later by `add_dependency`.
    late_deps: HashMap<u32, Vec<u32>>,
    late_count: usize,
    bodies: Vec<Body>,
    callbacks: Vec<Option<Callback>>,
    names: HashMap<u32, String>,
}

impl fmt::Debug for TaskGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskGraph")
            .field("tasks", &self.len())
            .field("edges", &self.edge_count())
            .finish()
    }
}

impl TaskGraph {
    /// An empty graph that accepts up to `capacity` tasks (at most
    /// `u32::MAX - 1`). Per-task storage is reserved up front.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.min(NONE as usize - 1);
        let reserve = capacity.min(1 << 24);
        Self {
            capacity,
            placement: Vec::with_capacity(reserve),
            dep_offsets: vec![0],
            deps: Vec::new(),
            late_deps: HashMap::new(),
            late_count: 0,
            bodies: Vec::with_capacity(reserve),
            callbacks: Vec::with_capacity(reserve),
            names: HashMap::new(),
        }
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    /// True when no task was added.
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// Number of dependency edges.
    pub fn edge_count(&self) -> usize {
        self.deps.len() + self.late_count
    }

    /// Adds `task`, to run after every task in `deps` (which must exist; a
    /// repeated dependency counts once per mention). A new task cannot close
    /// a cycle.
    pub fn add(&mut self, deps: &[TaskId], task: Task) -> Result<TaskId> {
        if self.len() >= self.capacity {
            return Err(Error::GraphFull {
                capacity: self.capacity,
            });
        }
        if let Some(bad) = deps.iter().find(|d| d.0 as usize >= self.len()) {
            return Err(Error::UnknownTask { task: bad.0 });
        }
        let id = self.len() as u32;
        self.placement
            .push(task.placement.map_or(ANY, |x| x.0 as u32));
        self.deps.extend(deps.iter().map(|d| d.0));
        self.dep_offsets.push(self.deps.len() as u32);
        self.bodies.push(task.body);
        self.callbacks.push(task.callback);
        if let Some(name) = task.name {
            self.names.insert(id, name);
        }
        Ok(TaskId(id))
    }

    /// Makes `task` also wait for `depends_on`. Rejected with
    /// [`Error::Cycle`] when `depends_on` already (transitively) waits for
    /// `task`; the graph is unchanged then.
    pub fn add_dependency(&mut self, task: TaskId, depends_on: TaskId) -> Result<()> {
        for t in [task, depends_on] {
            if t.0 as usize >= self.len() {
                return Err(Error::UnknownTask { task: t.0 });
            }
        }
        if let Some(path) = self.path(depends_on.0, task.0) {
            let mut cycle: Vec<String> = path.iter().rev().map(|&t| self.describe(t)).collect();
            cycle.push(self.describe(task.0));
            return Err(Error::Cycle {
                task: self.describe(task.0),
                depends_on: self.describe(depends_on.0),
                cycle,
            });
        }
        self.late_deps.entry(task.0).or_default().push(depends_on.0);
        self.late_count += 1;
        Ok(())
    }

    /// The name of a task, or `task#N`.
    pub fn describe(&self, task: u32) -> String {
        match self.names.get(&task) {
            Some(name) => format!("{name} ({})", TaskId(task)),
            None => TaskId(task).to_string(),
        }
    }

    /// Every task `task` waits for.
    pub(crate) fn dependencies(&self, task: u32) -> impl Iterator<Item = u32> + '_ {
        let row =
            self.dep_offsets[task as usize] as usize..self.dep_offsets[task as usize + 1] as usize;
        let late = match self.late_count {
            0 => &[][..],
            _ => self.late_deps.get(&task).map(Vec::as_slice).unwrap_or(&[]),
        };
        self.deps[row].iter().chain(late).copied()
    }

    /// A path of dependencies from `from` to `to`, both included, if any
    /// (iterative depth-first search with a parent map).
    fn path(&self, from: u32, to: u32) -> Option<Vec<u32>> {
        let mut parent: HashMap<u32, u32> = HashMap::from([(from, NONE)]);
        let mut stack = vec![from];
        while let Some(node) = stack.pop() {
            if node == to {
                let mut path = vec![node];
                let mut at = node;
                while let Some(&p) = parent.get(&at).filter(|&&p| p != NONE) {
                    path.push(p);
                    at = p;
                }
                path.reverse();
                return Some(path);
            }
            for next in self.dependencies(node) {
                if let std::collections::hash_map::Entry::Vacant(v) = parent.entry(next) {
                    v.insert(node);
                    stack.push(next);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_is_rejected_with_names_and_graph_unchanged() {
        let mut g = TaskGraph::with_capacity(8);
        let a = g.add(&[], Task::noop().named("a")).unwrap();
        let b = g.add(&[a], Task::noop().named("b")).unwrap();
        let c = g.add(&[b], Task::noop()).unwrap();
        let err = g.add_dependency(a, c).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("a (task#0) -> b (task#1) -> task#2 -> a (task#0)"),
            "{msg}"
        );
        assert_eq!(g.edge_count(), 2);
        let err = g.add_dependency(b, b).unwrap_err();
        assert!(matches!(err, Error::Cycle { .. }), "{err}");
        g.add_dependency(c, a).unwrap();
        assert_eq!(g.edge_count(), 3);
    }

    #[test]
    fn bounded_and_checks_ids() {
        let mut g = TaskGraph::with_capacity(2);
        let a = g.add(&[], Task::noop()).unwrap();
        assert!(matches!(
            g.add(&[TaskId(5)], Task::noop()),
            Err(Error::UnknownTask { task: 5 })
        ));
        g.add(&[a], Task::noop()).unwrap();
        assert!(matches!(
            g.add(&[], Task::noop()),
            Err(Error::GraphFull { capacity: 2 })
        ));
        assert!(matches!(
            g.add_dependency(a, TaskId(9)),
            Err(Error::UnknownTask { task: 9 })
        ));
    }
}
