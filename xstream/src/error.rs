//! The one error type of this crate.

use crate::XstreamId;

/// Everything that can go wrong when starting xstreams, sending work between
/// them, running a [`TaskGraph`](crate::TaskGraph) or waiting on an
/// [`EventQueue`](crate::EventQueue).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configured core list cannot be used.
    #[error("invalid core list {cores:?}: {reason}")]
    InvalidCoreList { cores: Vec<usize>, reason: String },

    /// The locked-memory limit cannot hold the io_uring memory of every xstream.
    #[error(
        "RLIMIT_MEMLOCK is {limit_bytes} bytes but {xstreams} xstreams need at least \
         {needed_bytes} bytes of locked memory; raise it with `ulimit -l unlimited` (shell), \
         `LimitMEMLOCK=infinity` (systemd unit) or a `memlock` line in \
         /etc/security/limits.conf, or run as root"
    )]
    MemlockTooLow {
        limit_bytes: u64,
        needed_bytes: u64,
        xstreams: usize,
    },

    /// The kernel refused to create an io_uring instance.
    #[error(
        "io_uring is unavailable: {reason} (needs Linux >= 5.8 and kernel.io_uring_disabled=0)"
    )]
    IoUringUnavailable { reason: String },

    /// glommio could not build the executor of an xstream.
    #[error("cannot start xstream {xstream} on core {core}: {reason}")]
    ExecutorStart {
        xstream: XstreamId,
        core: usize,
        reason: String,
    },

    /// The per-xstream init closure failed.
    #[error("init of xstream {xstream} failed: {reason}")]
    Init { xstream: XstreamId, reason: String },

    /// An xstream thread could not be spawned or joined.
    #[error("xstream thread {xstream}: {reason}")]
    Thread { xstream: XstreamId, reason: String },

    /// A message named an xstream the set does not have.
    #[error("no xstream {xstream} (the set has {count})")]
    NoSuchXstream { xstream: XstreamId, count: usize },

    /// `try_send` found the destination mailbox full.
    #[error("mailbox of xstream {xstream} is full")]
    MailboxFull { xstream: XstreamId },

    /// The set is shutting down or gone; the work was not run.
    #[error("xstream set is shut down")]
    ShutDown,

    /// The work was accepted but dropped before it finished (shutdown, or
    /// the task panicked).
    #[error("the operation was canceled before it completed")]
    Canceled,

    /// Called outside an xstream when an xstream is required.
    #[error("not running on an xstream")]
    NotOnXstream,

    /// The graph holds as many tasks as its capacity allows.
    #[error("task graph is full: capacity is {capacity} tasks")]
    GraphFull { capacity: usize },

    /// A dependency named a task that is not in the graph.
    #[error("unknown task {task}")]
    UnknownTask { task: u32 },

    /// Adding the dependency would close a cycle; `cycle` lists the tasks
    /// around it, first and last equal.
    #[error("dependency {task} -> {depends_on} would create the cycle {}", cycle.join(" -> "))]
    Cycle {
        task: String,
        depends_on: String,
        cycle: Vec<String>,
    },

    /// A graph stopped making progress (a scheduler bug; never expected).
    #[error("task graph stalled with {remaining} tasks left")]
    GraphStalled { remaining: u64 },

    /// The event queue already holds `capacity` events in flight.
    #[error("event queue is full: {capacity} events in flight")]
    EventQueueFull { capacity: usize },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
