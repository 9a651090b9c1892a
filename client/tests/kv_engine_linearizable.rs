//! Guards what a GET may return while writers run, against a real engine
//! process: over shm (Unix socket) and tcp, each GET returns a value that was
//! the latest acknowledged one at some moment during the GET (or one whose
//! PUT was in flight then). Each key has one writer doing sequential PUTs
//! whose (start, ack) instants are recorded; readers record (start, end) of
//! every GET and the sequence number in the value they got.

mod kv_support;

use std::sync::Arc;
use std::time::Duration;

use ferrite_client::client::Client;
use kv_support::linearizable::Workload;
use kv_support::EngineProc;

const WORKLOAD: Workload = Workload {
    prefix: "lin",
    writers: 2,
    keys_per_writer: 8,
    writes_per_writer: 1500,
    max_gets: 5_000_000,
    limit: Duration::from_secs(120),
};

#[test]
fn gets_return_latest_acknowledged_values_over_shm_and_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let writer_client = Arc::new(Client::connect(&engine.unix).unwrap());
    let shm = Arc::new(Client::connect(&engine.unix).unwrap());
    let tcp = Arc::new(engine.client(&engine.tcp));
    assert_eq!(shm.one_sided_provider(), Some("shm"));
    assert_eq!(tcp.one_sided_provider(), Some("tcp"));
    let seen = WORKLOAD.run(&writer_client, &[shm.clone(), shm.clone(), tcp.clone()]);
    let checked: usize = seen.iter().map(Vec::len).sum();
    let found = seen.iter().flatten().filter(|s| s.1.is_some()).count();
    assert!(found > 0, "no GET found a value among {checked}");
    let (s, t) = (shm.counters(), tcp.counters());
    assert!(
        s.one_sided_hits > 0 && t.one_sided_hits > 0,
        "shm {s:?} tcp {t:?}"
    );
    eprintln!("checked {checked} GETs ({found} values); shm {s:?}; tcp {t:?}");
}
