//! Job files as the job service takes them from a submitter: the first
//! input byte picks TOML or JSON, the rest is the text. `parse_spec` and
//! `JobGraph::build` must refuse bad files with an error, never a panic. A
//! spec that parses must print as JSON (and, when TOML can hold its
//! numbers, as TOML) to a text that parses to the same spec; a graph that
//! builds has acyclic, in-range constraints and a task record per task that
//! verifies for the task's key.

#![no_main]

use ferrite_engine::jobs::spec::{parse_spec, JobGraph};
use ferrite_proto::record::RecordView;
use ferrite_proto::rpc_jobs::{task_key, SpecFormat};
use libfuzzer_sys::fuzz_target;

const JOB: u128 = 0x0123_4567_89ab_cdef;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let format = if pick & 1 == 0 {
        SpecFormat::Toml
    } else {
        SpecFormat::Json
    };
    let Ok(spec) = parse_spec(text, format) else {
        return;
    };
    let json = serde_json::to_string(&spec).expect("a parsed spec prints as JSON");
    assert_eq!(parse_spec(&json, SpecFormat::Json).as_ref(), Ok(&spec));
    // TOML integers are i64: a u64 field above i64::MAX does not print.
    if let Ok(toml) = toml::to_string(&spec) {
        assert_eq!(parse_spec(&toml, SpecFormat::Toml).as_ref(), Ok(&spec));
    }
    let Ok(graph) = JobGraph::build(JOB, spec) else {
        return;
    };
    let n = graph.len() as u32;
    for (before, after) in graph.edges() {
        assert!(before < n && after < n && before != after);
    }
    for idx in 0..n {
        let (addr, bytes) = graph.record(idx);
        let view = RecordView::parse(bytes).expect("a task record parses");
        let id = graph.id(idx).as_bytes();
        view.verify_for(&task_key(JOB, id), addr)
            .expect("a task record verifies for its key");
    }
});
