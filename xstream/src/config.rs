//! Identifiers and the configuration of an [`XstreamSet`](crate::XstreamSet).

use std::fmt;
use std::time::Duration;

/// Index of an xstream inside its set: `0..set.len()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct XstreamId(pub usize);

impl fmt::Display for XstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "xs{}", self.0)
    }
}

/// The class of a task decides its glommio task queue on the xstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskClass {
    /// Client I/O: gets the most shares and low-latency preemption.
    Foreground,
    /// Flush, compaction, rebuild: runs in the time foreground leaves over.
    Background,
    /// Management and control messages.
    Control,
}

impl TaskClass {
    /// All classes, in the order of their queue index.
    pub const ALL: [TaskClass; 3] = [Self::Foreground, Self::Background, Self::Control];

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Foreground => 0,
            Self::Background => 1,
            Self::Control => 2,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Foreground => "foreground",
            Self::Background => "background",
            Self::Control => "control",
        }
    }
}

/// glommio shares of each task class. When queues compete for the CPU each
/// gets time in proportion to its shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassShares {
    pub foreground: usize,
    pub background: usize,
    pub control: usize,
}

impl Default for ClassShares {
    fn default() -> Self {
        Self {
            foreground: 1000,
            background: 100,
            control: 500,
        }
    }
}

impl ClassShares {
    pub(crate) fn of(&self, class: TaskClass) -> usize {
        match class {
            TaskClass::Foreground => self.foreground,
            TaskClass::Background => self.background,
            TaskClass::Control => self.control,
        }
    }
}

/// How to start an [`XstreamSet`](crate::XstreamSet).
#[derive(Clone, Debug)]
pub struct XstreamConfig {
    /// Cores to pin one xstream each to, in xstream order. `None`: every
    /// core this process may run on.
    pub cores: Option<Vec<usize>>,
    /// Spin this long looking for work before parking the thread in the
    /// kernel. Lowers cross-xstream latency at the price of CPU.
    pub spin_before_park: Option<Duration>,
    /// io_uring registered buffer memory per xstream (glommio `io_memory`).
    /// Shrunk to fit RLIMIT_MEMLOCK when not root.
    pub io_memory_bytes: usize,
    /// Capacity of each mailbox lane (one lane per sending xstream, plus one
    /// shared by all other threads). Senders wait when a lane is full.
    pub mailbox_capacity: usize,
    /// Shares of the task classes.
    pub shares: ClassShares,
    /// Preemption deadline of the latency-sensitive classes (foreground,
    /// control).
    pub latency_deadline: Duration,
    /// Thread name prefix; xstream `i` is called `{name}-{i}`.
    pub name: String,
}

impl Default for XstreamConfig {
    fn default() -> Self {
        Self {
            cores: None,
            spin_before_park: None,
            io_memory_bytes: DEFAULT_IO_MEMORY_BYTES,
            mailbox_capacity: 1024,
            shares: ClassShares::default(),
            latency_deadline: Duration::from_millis(5),
            name: "xstream".to_string(),
        }
    }
}

/// glommio's own default `io_memory`.
pub const DEFAULT_IO_MEMORY_BYTES: usize = 10 << 20;

impl XstreamConfig {
    /// Pin to exactly these cores.
    pub fn with_cores(mut self, cores: impl Into<Vec<usize>>) -> Self {
        self.cores = Some(cores.into());
        self
    }

    /// Spin before parking (see [`XstreamConfig::spin_before_park`]).
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin_before_park = Some(spin);
        self
    }

    /// Mailbox lane capacity (see [`XstreamConfig::mailbox_capacity`]).
    pub fn with_mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = capacity;
        self
    }
}
