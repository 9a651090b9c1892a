//! One-sided GETs over RDMA verbs against a real `ferrite-engine`, on
//! soft-RoCE in the `hack/softroce` guest (payload
//! `hack/softroce.d/ferrite-verbs.sh`). Ignored elsewhere: they need an RDMA
//! device (`cargo test --features rdma -- --ignored` where one exists).
//!
//! Environment (defaults are the guest's): `FERRITE_VERBS_PROVIDER`
//! (`verbs=rxe1@192.0.2.2:7601`, the engine's provider entry) and
//! `FERRITE_VERBS_CLIENT_DEVICE` (`rxe0`).
#![cfg(feature = "rdma")]

mod kv_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_client::client::onesided::{OneSidedReader, RetryPolicy};
use ferrite_client::client::{Client, ClientEventQueue, Key, Reply};
use ferrite_client::fabric::verbs::{ReadCounts, VerbsEndpoint};
use ferrite_client::fabric::Endpoint;
use ferrite_engine::fabric::verbs::DeviceSelector;
use ferrite_proto::bucket::{Bucket, BUCKET_BYTES};
use ferrite_proto::key::RecordKey;
use ferrite_proto::record::record_crc;
use kv_support::linearizable::{value, Workload};
use kv_support::EngineProc;

const WORKLOAD: Workload = Workload {
    prefix: "verbs",
    writers: 2,
    keys_per_writer: 8,
    writes_per_writer: 600,
    max_gets: 2_000_000,
    limit: Duration::from_secs(180),
};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn provider() -> String {
    env("FERRITE_VERBS_PROVIDER", "verbs=rxe1@192.0.2.2:7601")
}

fn side_addr() -> String {
    let p = provider();
    p.split_once('@')
        .map(|(_, a)| a.to_string())
        .expect("provider entry has @LISTEN")
}

/// An engine whose one-sided reads go over verbs. Small regions: the guest's
/// memory is small, and registering (pinning) them is slow on an emulated CPU.
fn start_engine(dir: &std::path::Path) -> EngineProc {
    let t0 = Instant::now();
    let e = EngineProc::start_with(
        dir,
        &[
            "--providers",
            &provider(),
            "--ring-bytes",
            "16M",
            "--buckets",
            "65536",
        ],
    );
    eprintln!(
        "verbs: engine ready after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    e
}

fn endpoint() -> VerbsEndpoint {
    let dev = DeviceSelector::parse(&env("FERRITE_VERBS_CLIENT_DEVICE", "rxe0"));
    VerbsEndpoint::connect(&side_addr(), &dev).expect("verbs connect")
}

/// A client whose one-sided GETs are RDMA READs (RPC over tcp).
fn verbs_client(engine: &EngineProc) -> Client {
    verbs_client_counted(engine, 4096).0
}

/// A verbs client with a bucket cache of `cache_buckets` (0: none), and
/// its endpoint's read and doorbell counts.
fn verbs_client_counted(engine: &EngineProc, cache_buckets: usize) -> (Client, Arc<ReadCounts>) {
    let mut c = engine.client(&engine.tcp);
    let ep = endpoint();
    let counts = ep.read_counts();
    let targets = ep.targets().expect("verbs targets");
    let reader = OneSidedReader::new(Box::new(ep), targets, cache_buckets, RetryPolicy::default())
        .expect("reader");
    c.set_one_sided_reader(Some(reader));
    assert_eq!(c.one_sided_provider(), Some("verbs"));
    (c, counts)
}

fn key(k: u64) -> Key {
    WORKLOAD.key(k)
}

#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_gets_return_latest_values_while_writers_run() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path());
    let writer_client = Arc::new(engine.client(&engine.tcp));
    let readers: Vec<Arc<Client>> = (0..2).map(|_| Arc::new(verbs_client(&engine))).collect();
    let seen = WORKLOAD.run(&writer_client, &readers);
    let found = seen.iter().flatten().filter(|s| s.1.is_some()).count();
    assert!(found > 0, "no GET found a value");
    for c in &readers {
        let n = c.counters();
        assert!(n.one_sided_hits > 0, "no one-sided verbs GET hit: {n:?}");
    }
    let total: usize = seen.iter().map(|s| s.len()).sum();
    eprintln!(
        "verbs: checked {total} GETs ({found} values) against {} PUTs",
        WORKLOAD.writers * WORKLOAD.writes_per_writer
    );
}

/// RDMA READs and doorbells `f` costs on `counts`.
fn cost(counts: &ReadCounts, f: impl FnOnce()) -> (u64, u64) {
    let (reads, doorbells) = (counts.reads(), counts.doorbells());
    f();
    (counts.reads() - reads, counts.doorbells() - doorbells)
}

/// Checks that 50 GETs of `names[1]` cost `single` (reads, doorbells) each
/// and one batched GET of all `names` costs `batch`, with the values the
/// writer left (`value(k, 0)`) and no retry or fallback.
fn assert_costs(
    c: &Client,
    counts: &ReadCounts,
    names: &[Key],
    single: (u64, u64),
    batch: (u64, u64),
) {
    for round in 0..50 {
        let spent = cost(counts, || {
            assert_eq!(c.get(&names[1]).unwrap(), Some(value(1, 0)), "{round}");
        });
        assert_eq!(spent, single, "one GET: (reads, doorbells), round {round}");
    }
    let keys: Vec<RecordKey<'_>> = names.iter().map(Key::as_record_key).collect();
    let mut outs = vec![Vec::new(); keys.len()];
    let spent = cost(counts, || {
        let got = c.get_many_into(&keys, &mut outs).unwrap();
        for (k, (g, out)) in got.into_iter().zip(&outs).enumerate() {
            assert!(g.unwrap().is_some(), "key {k}");
            assert_eq!(*out, value(k as u64, 0), "key {k}");
        }
    });
    assert_eq!(spent, batch, "{} GETs as one batch", names.len());
    let n = c.counters();
    assert_eq!((n.fallbacks, n.retries), (0, 0), "no writer runs: {n:?}");
}

#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_get_costs_one_read_cached_and_two_cold() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path());
    let names: Vec<Key> = (0..8).map(key).collect();
    let writer = engine.client(&engine.tcp);
    for (k, name) in names.iter().enumerate() {
        writer.put(name, &value(k as u64, 0)).unwrap();
    }
    // No bucket cache: a GET reads its bucket, then (dependent) its record;
    // a batch posts all buckets with one doorbell, then all records.
    let (cold, counts) = verbs_client_counted(&engine, 0);
    assert_costs(&cold, &counts, &names, (2, 2), (16, 2));
    // Cached buckets: one read per GET, one doorbell per batch.
    let (warm, counts) = verbs_client_counted(&engine, 4096);
    for name in &names {
        warm.get(name).unwrap();
    }
    assert_costs(&warm, &counts, &names, (1, 1), (8, 1));
    let keys: Vec<RecordKey<'_>> = names.iter().map(Key::as_record_key).collect();
    batch_latency(&warm, &names, &keys);
}

/// Eight GETs with warm buckets one after another (eight reads, eight
/// doorbells), then as one batch (one doorbell): p50 of each, printed for
/// ferrite-verbs.sh.
fn batch_latency(c: &Client, names: &[Key], keys: &[RecordKey<'_>]) {
    let mut outs = vec![Vec::new(); keys.len()];
    let (mut single, mut batched) = (Vec::with_capacity(300), Vec::with_capacity(300));
    for round in 0..300 {
        let t0 = Instant::now();
        for (k, name) in names.iter().enumerate() {
            assert_eq!(
                c.get(name).unwrap(),
                Some(value(k as u64, 0)),
                "round {round}"
            );
        }
        single.push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = Instant::now();
        let got = c.get_many_into(keys, &mut outs).unwrap();
        batched.push(t0.elapsed().as_secs_f64() * 1e6);
        for (k, (g, out)) in got.into_iter().zip(&outs).enumerate() {
            assert!(g.unwrap().is_some(), "key {k}, round {round}");
            assert_eq!(*out, value(k as u64, 0), "key {k}, round {round}");
        }
    }
    single.sort_by(f64::total_cmp);
    batched.sort_by(f64::total_cmp);
    println!(
        "FERRITE_VERBS_8_GETS_P50_US={:.2}",
        single[single.len() / 2]
    );
    println!(
        "FERRITE_VERBS_BATCH_8_P50_US={:.2}",
        batched[batched.len() / 2]
    );
}

/// The neighbour entry of the engine's address pointed at a MAC address
/// nobody has, restored on drop: the engine and its side channel live on
/// (the socket is idle, so it notices nothing), but every frame to the
/// engine's address, RDMA READs included, is lost.
struct LostPath {
    addr: String,
    dev: String,
    lladdr: String,
}

impl LostPath {
    fn cut(addr: &str) -> Self {
        let out = std::process::Command::new("ip")
            .args(["-o", "neigh", "show", "to", addr])
            .output()
            .expect("run ip");
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let after = |word: &str| {
            let mut it = line.split_whitespace().skip_while(|w| *w != word);
            it.nth(1).map(str::to_string)
        };
        let (Some(dev), Some(lladdr)) = (after("dev"), after("lladdr")) else {
            panic!("no neighbour entry for {addr}: {out:?}");
        };
        let path = Self {
            addr: addr.to_string(),
            dev,
            lladdr,
        };
        let out = path.neigh("02:00:00:00:00:01").expect("run ip");
        assert!(out.status.success(), "ip neigh replace: {out:?}");
        path
    }

    fn neigh(&self, lladdr: &str) -> std::io::Result<std::process::Output> {
        let args = [
            "neigh", "replace", &self.addr, "lladdr", lladdr, "dev", &self.dev,
        ];
        let args = [&args[..], &["nud", "permanent"]].concat();
        std::process::Command::new("ip").args(args).output()
    }
}

impl Drop for LostPath {
    fn drop(&mut self) {
        match self.neigh(&self.lladdr.clone()) {
            Ok(out) if out.status.success() => {}
            other => eprintln!("verbs: could not restore the neighbour entry: {other:?}"),
        }
    }
}

/// With the engine alive and its side channel open but the frames to it
/// lost, a read ends by the queue pair's own retries (the ACK timeout and
/// retry count the client sets), not by the 10 s poll timeout: a
/// disconnect naming the engine and "retry counter exceeded".
#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_read_over_a_lost_path_fails_by_the_queue_pair_retries() {
    let dir = tempfile::tempdir().unwrap();
    let _engine = start_engine(dir.path());
    let ep = endpoint();
    let t = ep.targets().unwrap()[0];
    let mut buf = vec![0u8; 64];
    ep.read(&t.buckets, 0, 64, &mut buf)
        .expect("read on a working path");
    let host = side_addr()
        .rsplit_once(':')
        .map(|(h, _)| h.to_string())
        .unwrap();
    let cut = LostPath::cut(&host);
    let t0 = Instant::now();
    let err = ep
        .read(&t.buckets, 0, 64, &mut buf)
        .expect_err("read with its packets lost");
    drop(cut);
    eprintln!(
        "verbs: a read whose packets were lost failed after {:.3} s: {err}",
        t0.elapsed().as_secs_f64()
    );
    assert_engine_gone(&err);
    let m = err.to_string();
    assert!(m.contains("retry counter exceeded"), "not the retries: {m}");
}

#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_read_after_engine_killed_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = start_engine(dir.path());
    let ep = endpoint();
    let t = ep.targets().unwrap()[0];
    let mut buf = vec![0u8; 64];
    ep.read(&t.buckets, 0, 64, &mut buf)
        .expect("read while the engine runs");
    let client = verbs_client(&engine);
    client.put(&key(1), &value(1, 0)).unwrap();
    assert_eq!(client.get(&key(1)).unwrap(), Some(value(1, 0)));
    // A GET in flight when the engine dies: posted, not yet polled.
    let in_flight = client.get_async(&key(1));
    let t0 = Instant::now();
    engine.kill();
    let err = ep
        .read(&t.buckets, 0, 64, &mut buf)
        .expect_err("read from a dead engine");
    eprintln!(
        "verbs: a read after the engine was killed failed after {:.3} s: {err}",
        t0.elapsed().as_secs_f64()
    );
    assert_engine_gone(&err);
    // The broken queue pair refuses further reads at once, clearly.
    let again = ep
        .read(&t.buckets, 0, 64, &mut buf)
        .expect_err("read on a broken queue pair");
    assert_engine_gone(&again);
    // The in-flight GET either had its reads land before the kill (and
    // holds the value) or fails as the engine's; never a stale value.
    match futures::executor::block_on(in_flight) {
        Ok(found) => assert_eq!(found.map(|f| f.value), Some(value(1, 0))),
        Err(e) => assert!(e.is_disconnect(), "unclear error: {e}"),
    }
    // A client's GETs fail too: through the broken queue pair, or the lost
    // RPC connection, whichever it notices first.
    let t0 = Instant::now();
    let err = client.get(&key(1)).expect_err("GET from a dead engine");
    assert!(err.is_disconnect(), "unclear error: {err}");
    eprintln!(
        "verbs: a client's GET after the engine was killed failed after {:.3} s: {err}",
        t0.elapsed().as_secs_f64()
    );
    let err = futures::executor::block_on(client.get_async(&key(2)))
        .expect_err("async GET from a dead engine");
    assert!(err.is_disconnect(), "unclear error: {err}");
}

/// A read's error once the engine is gone: a disconnect naming the
/// engine's verbs address and the cause (its side channel closed, or the
/// queue pair's retries exhausted).
fn assert_engine_gone(err: &ferrite_client::client::Error) {
    let m = err.to_string();
    assert!(err.is_disconnect(), "not a disconnect: {m}");
    assert!(
        m.contains(&format!("verbs://{}", side_addr())),
        "names no engine: {m}"
    );
    assert!(m.contains("RDMA READ"), "names no operation: {m}");
    assert!(
        m.contains("closed its verbs connection") || m.contains("retry counter exceeded"),
        "names no cause: {m}"
    );
}

/// `get_async` of every key of `names` (`key(i)` for i from the first),
/// all issued before any is awaited; checks the values (keys from 40 on
/// are absent), that every GET was one-sided and none went by RPC; returns
/// the RDMA READs and doorbells spent and the client's counts of the round.
fn async_gets(
    c: &Client,
    counts: &ReadCounts,
    names: &[Key],
    round: u32,
) -> (u64, u64, ferrite_client::client::CounterSnapshot) {
    let before = c.counters();
    let (reads, doorbells) = cost(counts, || {
        let futures: Vec<_> = names.iter().map(|k| c.get_async(k)).collect();
        let got = futures::executor::block_on(futures::future::join_all(futures));
        for (name, g) in names.iter().zip(got) {
            let k = (0..ABSENT_END)
                .find(|&i| key(i) == *name)
                .expect("a test key");
            let want = (k < 40).then(|| value(k, 0));
            assert_eq!(g.unwrap().map(|f| f.value), want, "key {k}, round {round}");
        }
    });
    let n = c.counters().since(&before);
    assert_eq!(n.one_sided_hits, names.len() as u64, "round {round}: {n:?}");
    assert_eq!(
        (n.rpc_requests, n.fallbacks),
        (0, 0),
        "round {round}: {n:?}"
    );
    (reads, doorbells, n)
}

/// Keys from 40 up to this one are never written.
const ABSENT_END: u64 = 96;

/// Many asynchronous GETs from one thread, all issued before any is
/// awaited, share the thread's queue pair (one per target; their reads
/// matched to completions by wr_id): each is one-sided (two RDMA READs
/// cold, one with its bucket cached), none goes by RPC, values right; the
/// reads they post before the thread polls share doorbells (one list of
/// at most 16 work requests each); and the event-queue GET runs on them,
/// driven by the queue's poller.
#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_async_gets_share_the_thread_queue_pair() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path());
    let writer = engine.client(&engine.tcp);
    let names: Vec<Key> = (0..48).map(key).collect();
    let absent: Vec<Key> = (40..ABSENT_END).map(key).collect();
    for (k, name) in names.iter().enumerate().take(40) {
        writer.put(name, &value(k as u64, 0)).unwrap();
    }
    let (c, counts) = verbs_client_counted(&engine, 4096);
    let mut queue_pairs = 0;
    for round in 0..2 {
        // Present keys: bucket and record READs, one READ fewer per bucket
        // found cached (round 1: all but those whose cache entry another
        // key took).
        let (spent, rung, n) = async_gets(&c, &counts, &names[..40], round);
        assert_eq!(spent, 80 - n.cache_hits, "RDMA READs, round {round}: {n:?}");
        // The bucket READs (or, cached, the record READs) the 40 GETs post
        // in their calls ring 3 doorbells (16 + 16 + 8); those they post
        // after a completion share one when completions come together.
        assert!(
            rung <= 3 + 40,
            "doorbells, round {round}: {rung} for {spent} READs"
        );
        println!("FERRITE_VERBS_ASYNC_40_GETS_ROUND_{round}=READs {spent} doorbells {rung}");
        assert!(
            round == 0 || n.cache_hits > 0,
            "round 1 used the cache: {n:?}"
        );
        // Absent keys: one fresh bucket READ each (posted with the GET when
        // the cached bucket lacks the key).
        let (spent, rung, n) = async_gets(&c, &counts, &absent, round);
        assert_eq!(spent, 56, "RDMA READs of absent keys, round {round}: {n:?}");
        assert_eq!(rung, 4, "56 READs posted before any poll: 16 + 16 + 16 + 8");
        if round == 0 {
            // Connected now to every target the keys live on.
            queue_pairs = counts.queue_pairs();
        }
    }
    assert_eq!(counts.queue_pairs(), queue_pairs, "no queue pair per GET");
    let eq = ClientEventQueue::new(64);
    let before = c.counters();
    let ids: Vec<_> = (names.iter())
        .map(|k| {
            let ev = eq.event().unwrap();
            let id = ev.id();
            c.get_event(k, ev);
            id
        })
        .collect();
    let mut found = 0;
    let limit = Instant::now() + Duration::from_secs(60);
    let mut done = 0;
    while done < ids.len() && Instant::now() < limit {
        for e in eq.poll(64, Duration::from_secs(10)) {
            done += 1;
            let k = ids.iter().position(|id| *id == e.id).unwrap();
            match e.result.unwrap().unwrap() {
                Reply::Value(v) => {
                    assert_eq!(v.map(|f| f.value), (k < 40).then(|| value(k as u64, 0)));
                    found += 1;
                }
                other => panic!("key {k}: {other:?}"),
            }
        }
    }
    assert_eq!(found, names.len(), "every event completed with its value");
    let n = c.counters().since(&before);
    assert_eq!(
        (n.one_sided_hits, n.rpc_requests),
        (names.len() as u64, 0),
        "{n:?}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_batched_reads_match_single_reads() {
    use ferrite_client::fabric::verbs::BatchRead;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path());
    let c = engine.client(&engine.tcp);
    for k in 0..64 {
        c.put(&key(k), &value(k, 0)).unwrap();
    }
    let ep = endpoint();
    let t = ep.targets().unwrap()[0];
    let spans = [
        (&t.buckets, 0u64),
        (&t.buckets, 4096),
        (&t.log, 0),
        (&t.log, 4096),
    ];
    let mut single = vec![vec![0u8; 4096]; spans.len()];
    for ((region, offset), buf) in spans.iter().zip(single.iter_mut()) {
        ep.read(region, *offset, 4096, buf).unwrap();
    }
    let mut batched = vec![vec![0u8; 4096]; spans.len()];
    let mut reads: Vec<BatchRead<'_>> = (spans.iter().zip(batched.iter_mut()))
        .map(|((region, offset), buf)| BatchRead {
            region,
            offset: *offset,
            buf,
        })
        .collect();
    ep.read_batch(&mut reads).unwrap();
    assert_eq!(
        batched, single,
        "one doorbell, same bytes (no writer running)"
    );
    assert!(
        single[2].iter().any(|b| *b != 0),
        "the log holds the records written"
    );
    // What a GET costs beside the reads it makes, back to back in one
    // process: bare reads through the endpoint (64 bytes; 192, about a
    // record of the bench's), then GETs with a cached and with no bucket
    // cache. p50s printed for ferrite-verbs.sh.
    let mut b = [0u8; 192];
    let bare64 = p50_us(|| ep.read(&t.log, 0, 64, &mut b).unwrap());
    let bare192 = p50_us(|| ep.read(&t.log, 0, 192, &mut b).unwrap());
    let (warm, _) = verbs_client_counted(&engine, 4096);
    let (cold, _) = verbs_client_counted(&engine, 0);
    let mut out = Vec::with_capacity(256);
    let k = key(1);
    let k = k.as_record_key();
    let mut get = |c: &Client| {
        let found = c.get_into(&k, &mut out).unwrap();
        assert!(found.is_some() && out == value(1, 0));
    };
    let cached = p50_us(|| get(&warm));
    let uncached = p50_us(|| get(&cold));
    // The CPU a GET spends on checksums, on this (emulated) CPU: a
    // bucket's CRC, and a 152-byte record's (the bench's).
    let (bucket, record) = (Bucket([7; BUCKET_BYTES]), [7u8; 152]);
    let crc_bucket = mean_us(|| {
        std::hint::black_box(std::hint::black_box(&bucket).compute_crc());
    });
    let crc_record = mean_us(|| {
        std::hint::black_box(record_crc(std::hint::black_box(&record), 80));
    });
    println!(
        "FERRITE_VERBS_PARTS_P50_US=read64 {bare64:.2} read192 {bare192:.2} \
         get-cached {cached:.2} get-cold {uncached:.2} (mean crc-bucket {crc_bucket:.2} \
         crc-record {crc_record:.2})"
    );
}

/// Mean time of 10000 runs of `f`, in microseconds.
fn mean_us(mut f: impl FnMut()) -> f64 {
    let t0 = Instant::now();
    for _ in 0..10_000 {
        f();
    }
    t0.elapsed().as_secs_f64() * 1e6 / 10_000.0
}

/// p50 of 2000 runs of `f`, in microseconds.
fn p50_us(mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..2000)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[test]
#[ignore = "needs an RDMA device: run by hack/softroce.d/ferrite-verbs.sh"]
fn verbs_queue_pair_per_thread_and_batched_gets_match_single_gets() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path());
    let writer = engine.client(&engine.tcp);
    for k in 0..48 {
        writer.put(&key(k), &value(k, k)).unwrap();
    }
    // Each reading thread gets its own queue pair to the target.
    let ep = Arc::new(endpoint());
    assert_eq!(ep.queue_pairs(), 1, "connect's own queue pair");
    let t = ep.targets().unwrap()[0];
    let reads: Vec<_> = (0..3)
        .map(|_| {
            let ep = ep.clone();
            std::thread::spawn(move || {
                let mut b = vec![0u8; 4096];
                ep.read(&t.log, 0, 4096, &mut b).map(|()| b)
            })
        })
        .collect();
    let logs: Vec<Vec<u8>> = reads
        .into_iter()
        .map(|h| h.join().unwrap().expect("read from a new thread"))
        .collect();
    assert!(logs.iter().all(|l| *l == logs[0]), "same bytes, no writer");
    assert_eq!(ep.queue_pairs(), 4, "one more queue pair per thread");
    // Batched GETs (one doorbell for the buckets, one for the records)
    // return what single GETs return: cold buckets, then cached ones.
    let c = verbs_client(&engine);
    let names: Vec<Key> = (0..50).map(key).collect();
    let keys: Vec<RecordKey<'_>> = names.iter().map(Key::as_record_key).collect();
    let mut outs = vec![Vec::new(); keys.len()];
    for round in 0..2 {
        let got = c.get_many_into(&keys, &mut outs).unwrap();
        for (k, (g, out)) in got.into_iter().zip(&outs).enumerate() {
            let single = c.get(&names[k]).unwrap();
            match g.unwrap() {
                Some(_) => assert_eq!(Some(out), single.as_ref(), "key {k}, round {round}"),
                None => assert_eq!(single, None, "key {k}, round {round}"),
            }
        }
    }
    let n = c.counters();
    assert_eq!(n.fallbacks, 0, "no GET needed RPC: {n:?}");
    assert!(n.one_sided_hits >= 200, "GETs were not one-sided: {n:?}");
}
