//! Seeds of the job targets: job files (TOML and JSON) and job-service
//! frame streams.

#[cfg(test)]
use ferrite_engine::jobs::spec::{parse_spec, JobGraph};
use ferrite_proto::rpc_jobs::{
    write_frame, JobPhase, JobSpec, JobStatus, JobSummary, SpecFormat, TaskGrant, TaskPhase,
    TaskResult, TaskRow, ToEngine, ToPeer,
};

/// The job target's first byte: even = TOML, odd = JSON.
pub(crate) fn job_specs() -> Vec<(String, Vec<u8>)> {
    let spec = super::spec();
    let mut toml_text = vec![0u8];
    toml_text.extend_from_slice(toml::to_string(&spec).expect("seed spec prints").as_bytes());
    let mut json = vec![1u8];
    json.extend_from_slice(serde_json::to_string_pretty(&spec).unwrap().as_bytes());
    vec![("toml".into(), toml_text), ("json".into(), json)]
}

#[cfg(test)]
pub(crate) fn spec_decodes(b: &[u8]) -> bool {
    let format = if b[0] & 1 == 0 {
        SpecFormat::Toml
    } else {
        SpecFormat::Json
    };
    let text = std::str::from_utf8(&b[1..]).unwrap();
    parse_spec(text, format).is_ok_and(|s| JobGraph::build(1, s).is_ok())
}

fn row() -> TaskRow {
    TaskRow {
        idx: 1,
        id: "b".into(),
        state: TaskPhase::Done,
        node: Some("n1".into()),
        xstream: Some(0),
        attempt: 1,
        ready_ns: Some(10),
        start_ns: Some(20),
        end_ns: Some(30),
        exit_code: Some(0),
        error: None,
    }
}

pub(crate) fn messages(spec: &JobSpec) -> (Vec<ToEngine>, Vec<ToPeer>) {
    let job = 0x00ab_cdef_u128 << 64 | 7;
    let result = TaskResult {
        job,
        idx: 0,
        attempt: 1,
        xstream: 0,
        start_ns: 1,
        end_ns: 2,
        exit_code: 0,
        error: None,
        stdout: b"hi\n".to_vec(),
        stderr: vec![],
    };
    let to_engine = vec![
        ToEngine::Offer {
            node: "n1".into(),
            xstreams: 2,
        },
        ToEngine::Submit {
            text: serde_json::to_string(spec).unwrap(),
            format: SpecFormat::Json,
            job: Some(job),
            store: Some("unix:///run/ferrite.sock".into()),
        },
        ToEngine::Finished {
            results: vec![result],
        },
        ToEngine::StatusRows {
            query: 3,
            job,
            rows: vec![row()],
        },
        ToEngine::Status { job, watch: true },
        ToEngine::List,
        ToEngine::Wait { job },
        ToEngine::WaitResources { nodes: 2 },
        ToEngine::Cancel { job },
    ];
    let grant = TaskGrant {
        job,
        idx: 0,
        id: "a".into(),
        attempt: 1,
        xstream: 0,
        ready_ns: 5,
        addr: 0,
        record: vec![0x46, 0x52, 0x45, 0x43],
        stdin: b"in".to_vec(),
        inputs: vec![],
    };
    let status = JobStatus {
        job,
        name: "seed".into(),
        state: JobPhase::Running,
        cause: None,
        tasks: vec![row()],
        edges: vec![(0, 1)],
        answered: vec!["n1".into()],
        store: None,
        coordinator: Some("engine/coordinator-0".into()),
    };
    let summary = JobSummary {
        job,
        name: "seed".into(),
        state: JobPhase::Done,
        tasks: 3,
        done: 3,
    };
    let to_peer = vec![
        ToPeer::Welcome { node: "n1".into() },
        ToPeer::Grant {
            tasks: vec![grant],
            store: None,
        },
        ToPeer::Revoke { job },
        ToPeer::StatusQuery { query: 3, job },
        ToPeer::Submitted { job },
        ToPeer::Status { status },
        ToPeer::Jobs {
            jobs: vec![summary],
        },
        ToPeer::Ended {
            job,
            state: JobPhase::Failed,
            cause: Some("task b failed".into()),
        },
        ToPeer::Resources {
            nodes: vec![("n1".into(), 2)],
        },
        ToPeer::Cancelled { job },
        ToPeer::Error {
            message: "no such job".into(),
        },
    ];
    (to_engine, to_peer)
}

/// One stream of every `ToEngine` message and one of every `ToPeer`.
pub(crate) fn job_frames() -> Vec<(String, Vec<u8>)> {
    let (to_engine, to_peer) = super::messages();
    let mut engine = Vec::new();
    for m in &to_engine {
        write_frame(&mut engine, m).unwrap();
    }
    let mut peer = Vec::new();
    for m in &to_peer {
        write_frame(&mut peer, m).unwrap();
    }
    vec![("to-engine".into(), engine), ("to-peer".into(), peer)]
}
