//! Where each phase puts its files, relative to the backend's root.
//!
//! ```text
//! io500.<run>/timestampfile                                   made before the first phase
//! io500.<run>/state/<phase>.json                              a phase's result, when phases
//!                                                             run one by one (`phases`)
//! io500.<run>/data/ior-easy/ior_file_easy.<task:08>           one per task
//! io500.<run>/data/ior-hard/IOR_file                          shared by all tasks
//! io500.<run>/data/mdtest-easy/mdtest_tree.<task>/file.mdtest.<task>.<i>
//! io500.<run>/data/mdtest-hard/file.mdtest.<task>.<i>         one shared directory
//! ```
//! The find phase walks `io500.<run>/data`, as IO500 walks its data directory with the
//! timestamp file kept outside it.

/// The paths of one run.
#[derive(Debug, Clone)]
pub struct Layout {
    root: String,
}

impl Layout {
    /// The layout of the run with `run_seed` (the seed names the run directory).
    pub fn new(run_seed: u64) -> Self {
        Self {
            root: format!("io500.{run_seed:016x}"),
        }
    }

    /// The run directory.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The file whose mtime find compares against.
    pub fn timestamp(&self) -> String {
        format!("{}/timestampfile", self.root)
    }

    /// Where phases run one by one leave their results.
    pub fn state_dir(&self) -> String {
        format!("{}/state", self.root)
    }

    /// The result file of phase `name`.
    pub fn phase_state(&self, name: &str) -> String {
        format!("{}/{name}.json", self.state_dir())
    }

    /// The directory find walks.
    pub fn data(&self) -> String {
        format!("{}/data", self.root)
    }

    /// ior-easy's directory.
    pub fn ior_easy_dir(&self) -> String {
        format!("{}/data/ior-easy", self.root)
    }

    /// ior-easy's file name of `task` (no directory).
    pub fn ior_easy_name(task: usize) -> String {
        format!("ior_file_easy.{task:08}")
    }

    /// ior-easy's file of `task`.
    pub fn ior_easy_file(&self, task: usize) -> String {
        format!("{}/{}", self.ior_easy_dir(), Self::ior_easy_name(task))
    }

    /// ior-hard's directory.
    pub fn ior_hard_dir(&self) -> String {
        format!("{}/data/ior-hard", self.root)
    }

    /// ior-hard's shared file name.
    pub const IOR_HARD_NAME: &'static str = "IOR_file";

    /// ior-hard's shared file.
    pub fn ior_hard_file(&self) -> String {
        format!("{}/{}", self.ior_hard_dir(), Self::IOR_HARD_NAME)
    }

    /// mdtest-easy's top directory.
    pub fn mdtest_easy_dir(&self) -> String {
        format!("{}/data/mdtest-easy", self.root)
    }

    /// mdtest-easy's directory of `task`.
    pub fn mdtest_easy_task_dir(&self, task: usize) -> String {
        format!("{}/mdtest_tree.{task}", self.mdtest_easy_dir())
    }

    /// mdtest's file name of `task`'s file `index` (same form in easy and hard).
    pub fn mdtest_name(task: usize, index: u64) -> String {
        format!("file.mdtest.{task}.{index}")
    }

    /// mdtest-easy's file `index` of `task`.
    pub fn mdtest_easy_file(&self, task: usize, index: u64) -> String {
        format!(
            "{}/{}",
            self.mdtest_easy_task_dir(task),
            Self::mdtest_name(task, index)
        )
    }

    /// mdtest-hard's shared directory.
    pub fn mdtest_hard_dir(&self) -> String {
        format!("{}/data/mdtest-hard", self.root)
    }

    /// mdtest-hard's file `index` of `task`.
    pub fn mdtest_hard_file(&self, task: usize, index: u64) -> String {
        format!(
            "{}/{}",
            self.mdtest_hard_dir(),
            Self::mdtest_name(task, index)
        )
    }
}

/// The task whose files task `task` reads, stats or deletes in the later phases: the next one,
/// so no task reads back its own data from a client cache (IOR `-C`, mdtest `-N 1`).
pub fn neighbour(task: usize, tasks: usize) -> usize {
    (task + 1) % tasks.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_under_the_run_directory() {
        let l = Layout::new(0xab);
        assert_eq!(l.root(), "io500.00000000000000ab");
        assert_eq!(
            l.ior_easy_file(3),
            "io500.00000000000000ab/data/ior-easy/ior_file_easy.00000003"
        );
        assert_eq!(
            l.mdtest_easy_file(2, 17),
            "io500.00000000000000ab/data/mdtest-easy/mdtest_tree.2/file.mdtest.2.17"
        );
        assert!(l.mdtest_hard_file(0, 1).starts_with(&l.data()));
        assert!(!l.timestamp().starts_with(&l.data()));
        assert!(!l.phase_state("find").starts_with(&l.data()));
        assert_eq!(neighbour(3, 4), 0);
        assert_eq!(neighbour(0, 1), 0);
    }
}
