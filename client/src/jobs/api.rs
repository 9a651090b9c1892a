//! [`JobClient`]: submit, list, watch and cancel jobs on a job service.

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::path::Path;

use ferrite_proto::rpc_jobs::{
    read_frame, write_frame, JobPhase, JobStatus, JobSummary, SpecFormat, ToEngine, ToPeer,
};

use super::error::JobsError;
use crate::client::{Client, Key, Reply, Request};
use ferrite_proto::rpc_jobs::{JobSpec, AKEY_TASK, JOBS_CONTAINER};

/// Port the job service listens on when none is given.
pub const DEFAULT_JOBS_PORT: u16 = 7341;

/// `tcp://host:port`, `host:port` or `host` → `host:port`.
pub fn service_addr(url: &str) -> String {
    let s = url
        .strip_prefix("tcp://")
        .unwrap_or(url)
        .trim_end_matches('/');
    if s.rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_JOBS_PORT}")
    }
}

/// Parses a job id printed by `ferrite job submit` (hex).
pub fn parse_job_id(s: &str) -> Result<u128, JobsError> {
    let t = s.trim().trim_start_matches("0x");
    if t.is_empty() || t.len() > 32 {
        return Err(JobsError::BadJobId(s.into()));
    }
    u128::from_str_radix(t, 16).map_err(|_| JobsError::BadJobId(s.into()))
}

/// The format a job file's name says it has (`.json`, else TOML).
pub fn format_of_path(path: &Path) -> SpecFormat {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("json") => SpecFormat::Json,
        _ => SpecFormat::Toml,
    }
}

/// Connects to the job service at `addr` and proves this client holds
/// `token` (and that the service does too) before any job frame; refuses a
/// service that does not challenge, and an empty token.
pub fn connect_authenticated(addr: &str, token: &[u8]) -> Result<TcpStream, JobsError> {
    use ferrite_proto::rpc_jobs::auth::{client_handshake, Service};
    let mut stream = TcpStream::connect(addr).map_err(|source| JobsError::Connect {
        addr: addr.to_string(),
        source,
    })?;
    let _ = stream.set_nodelay(true);
    let deadline = Some(std::time::Duration::from_secs(30));
    let timed = stream.set_read_timeout(deadline);
    timed.map_err(JobsError::io("set handshake deadline"))?;
    let mut nonce = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
    client_handshake(&mut stream, Service::Jobs, token, nonce).map_err(|source| {
        JobsError::Auth {
            addr: addr.to_string(),
            source,
        }
    })?;
    let untimed = stream.set_read_timeout(None);
    untimed.map_err(JobsError::io("clear handshake deadline"))?;
    Ok(stream)
}

/// A connection to a job service, one request at a time.
#[derive(Debug)]
pub struct JobClient {
    input: BufReader<TcpStream>,
    output: BufWriter<TcpStream>,
}

impl JobClient {
    /// Connects to the job service at `url`, authenticating with `token`
    /// (see [`connect_authenticated`]).
    pub fn connect(url: &str, token: &[u8]) -> Result<Self, JobsError> {
        let stream = connect_authenticated(&service_addr(url), token)?;
        let read = stream.try_clone().map_err(JobsError::io("clone stream"))?;
        Ok(Self {
            input: BufReader::new(read),
            output: BufWriter::new(stream),
        })
    }

    fn send(&mut self, msg: &ToEngine) -> Result<(), JobsError> {
        write_frame(&mut self.output, msg)?;
        self.output.flush().map_err(JobsError::io("send"))
    }

    fn recv(&mut self) -> Result<ToPeer, JobsError> {
        match read_frame(&mut self.input)? {
            Some(ToPeer::Error { message }) => Err(JobsError::Service(message)),
            Some(m) => Ok(m),
            None => Err(JobsError::Closed),
        }
    }

    /// Submits a job file's text; returns the job id.
    pub fn submit(&mut self, text: &str, format: SpecFormat) -> Result<u128, JobsError> {
        self.send(&ToEngine::Submit {
            text: text.to_string(),
            format,
            job: None,
            store: None,
        })?;
        match self.recv()? {
            ToPeer::Submitted { job } => Ok(job),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Stores every task of the job as a record in the engine behind
    /// `store` (key `task_key(job, task id)`, value = JSON task), then
    /// submits the job: workers fetch the task records from that engine.
    pub fn submit_stored(
        &mut self,
        text: &str,
        format: SpecFormat,
        store: &Client,
    ) -> Result<u128, JobsError> {
        let spec: JobSpec = match format {
            SpecFormat::Json => {
                serde_json::from_str(text).map_err(|e| JobsError::Service(e.to_string()))?
            }
            SpecFormat::Toml => {
                toml::from_str(text).map_err(|e| JobsError::Service(e.to_string()))?
            }
        };
        let job = loop {
            let id: u128 = rand::random();
            if id != 0 {
                break id;
            }
        };
        let mut puts = Vec::with_capacity(spec.tasks.len());
        for t in &spec.tasks {
            let value = serde_json::to_vec(t).map_err(|e| JobsError::Service(e.to_string()))?;
            let key = Key::new(JOBS_CONTAINER, job, t.id.as_bytes(), AKEY_TASK);
            puts.push(Request::Update { key, value });
        }
        for (reply, t) in store.batch(puts)?.into_iter().zip(&spec.tasks) {
            if let Reply::Error { message, .. } = reply {
                return Err(JobsError::Store(format!(
                    "task record {:?}: {message}",
                    t.id
                )));
            }
        }
        self.send(&ToEngine::Submit {
            text: text.to_string(),
            format,
            job: Some(job),
            store: Some(store.url()),
        })?;
        match self.recv()? {
            ToPeer::Submitted { job } => Ok(job),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Submits a job file (TOML, or JSON if it ends in `.json`).
    pub fn submit_file(&mut self, path: &Path) -> Result<u128, JobsError> {
        let text = std::fs::read_to_string(path).map_err(JobsError::io("read job file"))?;
        self.submit(&text, format_of_path(path))
    }

    /// The job's state, gathered from the nodes' task state objects.
    pub fn status(&mut self, job: u128) -> Result<JobStatus, JobsError> {
        self.send(&ToEngine::Status { job, watch: false })?;
        self.expect_status()
    }

    fn expect_status(&mut self) -> Result<JobStatus, JobsError> {
        match self.recv()? {
            ToPeer::Status { status } => Ok(status),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Calls `each` with the job's state every time it changes, until the
    /// job ends; returns the final state.
    pub fn watch(
        &mut self,
        job: u128,
        mut each: impl FnMut(&JobStatus),
    ) -> Result<JobStatus, JobsError> {
        self.send(&ToEngine::Status { job, watch: true })?;
        loop {
            let status = self.expect_status()?;
            each(&status);
            if status.state.is_final() {
                return Ok(status);
            }
        }
    }

    /// Waits until the job ends; returns its final phase and cause.
    pub fn wait(&mut self, job: u128) -> Result<(JobPhase, Option<String>), JobsError> {
        self.send(&ToEngine::Wait { job })?;
        match self.recv()? {
            ToPeer::Ended { state, cause, .. } => Ok((state, cause)),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    pub fn list(&mut self) -> Result<Vec<JobSummary>, JobsError> {
        self.send(&ToEngine::List)?;
        match self.recv()? {
            ToPeer::Jobs { jobs } => Ok(jobs),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Waits until at least `nodes` worker nodes have joined; returns them
    /// with their execution streams. The service answers when they have.
    pub fn wait_resources(&mut self, nodes: u32) -> Result<Vec<(String, u32)>, JobsError> {
        self.send(&ToEngine::WaitResources { nodes })?;
        match self.recv()? {
            ToPeer::Resources { nodes } => Ok(nodes),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }

    pub fn cancel(&mut self, job: u128) -> Result<(), JobsError> {
        self.send(&ToEngine::Cancel { job })?;
        match self.recv()? {
            ToPeer::Cancelled { .. } => Ok(()),
            other => Err(JobsError::Unexpected(format!("{other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_ids_parse() {
        assert_eq!(service_addr("tcp://127.0.0.1:9/"), "127.0.0.1:9");
        assert_eq!(
            service_addr("127.0.0.1"),
            format!("127.0.0.1:{DEFAULT_JOBS_PORT}")
        );
        assert_eq!(parse_job_id("0xff").unwrap(), 255);
        assert!(parse_job_id("xyz").is_err());
        assert!(parse_job_id(&"f".repeat(33)).is_err());
        assert_eq!(format_of_path(Path::new("a.JSON")), SpecFormat::Json);
        assert_eq!(format_of_path(Path::new("a.toml")), SpecFormat::Toml);
    }
}
