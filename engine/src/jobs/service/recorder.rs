//! The recorder thread: the only writer of job state files once they are
//! created (see `Control::submit`) while the service runs. Updates arrive on a channel and are written in batches,
//! one transaction per job per batch.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use ferrite_proto::rpc_jobs::JobPhase;

use super::control::job_state_path;
use crate::jobs::error::JobError;
use crate::jobs::state::{JobState, TaskOutcome};

pub(super) enum RecordCmd {
    Record {
        job: u128,
        outcomes: Vec<TaskOutcome>,
    },
    Phase {
        job: u128,
        phase: JobPhase,
        cause: Option<String>,
        now_ns: u64,
    },
    /// The coordinator slot that split the job.
    Coordinator { job: u128, coordinator: String },
}

pub(super) fn start(dir: PathBuf) -> Result<(Sender<RecordCmd>, JoinHandle<()>), JobError> {
    let (tx, rx) = mpsc::channel();
    let t = super::spawn("jobs-record", move || run(dir, rx))?;
    Ok((tx, t))
}

fn run(dir: PathBuf, rx: Receiver<RecordCmd>) {
    let mut files: HashMap<u128, JobState> = HashMap::new();
    while let Ok(first) = rx.recv() {
        let mut pending: Vec<(u128, Vec<TaskOutcome>)> = Vec::new();
        let mut next = Some(first);
        while let Some(cmd) = next {
            match cmd {
                RecordCmd::Record { job, mut outcomes } => {
                    match pending.iter_mut().find(|p| p.0 == job) {
                        Some(p) => p.1.append(&mut outcomes),
                        None => pending.push((job, outcomes)),
                    }
                }
                RecordCmd::Phase {
                    job,
                    phase,
                    cause,
                    now_ns,
                } => {
                    // Rows first: a job is never marked done before its tasks.
                    write_rows(&dir, &mut files, &mut pending);
                    let res = file(&dir, &mut files, job)
                        .and_then(|f| f.set_phase(phase, cause.as_deref(), now_ns));
                    if let Err(e) = res {
                        tracing::error!("job state: {e}");
                    }
                    if phase.is_final() {
                        files.remove(&job);
                    }
                }
                RecordCmd::Coordinator { job, coordinator } => {
                    let res =
                        file(&dir, &mut files, job).and_then(|f| f.set_coordinator(&coordinator));
                    if let Err(e) = res {
                        tracing::error!("job state: {e}");
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        write_rows(&dir, &mut files, &mut pending);
    }
}

fn file<'a>(
    dir: &std::path::Path,
    files: &'a mut HashMap<u128, JobState>,
    job: u128,
) -> Result<&'a mut JobState, JobError> {
    if let std::collections::hash_map::Entry::Vacant(v) = files.entry(job) {
        v.insert(JobState::open(&job_state_path(dir, job))?);
    }
    files.get_mut(&job).ok_or(JobError::NoSuchJob(job))
}

fn write_rows(
    dir: &std::path::Path,
    files: &mut HashMap<u128, JobState>,
    pending: &mut Vec<(u128, Vec<TaskOutcome>)>,
) {
    for (job, outcomes) in pending.drain(..) {
        if let Err(e) = file(dir, files, job).and_then(|f| f.record(&outcomes)) {
            tracing::error!("job state: {e}");
        }
    }
}
