//! Guards: the built-in storage steps run on workers against the job's
//! engine (put and get of key ranges, copy between containers, checksum
//! scrub of a whole container: every object, dkey and akey, each record
//! read back from the engine's device), a damaged record fails the scrub by
//! name — also one corrupted on the device in another object than the
//! steps' — and every task's
//! stdout, stderr and exit code are records in the engine under
//! `output_key(job, task id, akey)` — read back by `ferrite job status`;
//! inside an engine, the resource manager runs on one of its xstreams.
#![cfg(feature = "embedded")]

#[path = "jobs_common.rs"]
mod common;

use std::time::Duration;

use ferrite_client::client::{Client, Key};
use ferrite_client::jobs::outputs;
use ferrite_client::jobs::JobClient;
use ferrite_engine::config::{EngineConfig, Size};
use ferrite_engine::jobs::{JobService, JobServiceConfig};
use ferrite_engine::{Engine, EngineHandle};
use ferrite_proto::rpc_jobs::{step_key, JobPhase, SpecFormat};

const STEPS: &str = "name='steps'\n\
    [[task]]\nid='put'\nsteps=[{kind='put', container=7, prefix='k', count=300, size_bytes=100}]\n\
    [[task]]\nid='get'\nafter=['put']\nsteps=[{kind='get', container=7, prefix='k', count=300}]\n\
    [[task]]\nid='copy'\nafter=['put']\nsteps=[{kind='copy', source=7, target=8, prefix='k', count=300}]\n\
    [[task]]\nid='scrub'\nafter=['copy']\nsteps=[{kind='scrub', container=8}]\n\
    [[task]]\nid='say'\nafter=['scrub', 'get']\nsteps=[{kind='exec', cmd='sh', args=['-c', 'echo out; echo err >&2; exit 3']}]\n\
    [retry]\nmax_attempts=1\n";

/// A job service whose jobs keep their outputs in `store`, and one worker.
fn start(dir: &std::path::Path, store: &Client) -> (JobService, common::Worker) {
    let mut config = JobServiceConfig::new(dir.join("jobs")).with_token(common::TOKEN);
    config.store = Some(store.url());
    let service = JobService::start(config).expect("job service starts");
    let worker = common::Worker::start(&service.addr().to_string(), "w", 2, dir);
    (service, worker)
}

fn run(addr: &str, text: &str) -> (u128, JobPhase, Option<String>) {
    let mut client = JobClient::connect(addr, common::TOKEN).unwrap();
    let job = client.submit(text, SpecFormat::Toml).unwrap();
    let (phase, cause) = client.wait(job).unwrap();
    (job, phase, cause)
}

#[test]
fn storage_steps_run_against_the_engine_and_outputs_are_records() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let store = ferrite_client::embedded::connect().unwrap();
    let (service, _worker) = start(dir.path(), &store);
    let addr = service.addr().to_string();
    let (job, phase, cause) = run(&addr, STEPS);
    // `say` exits 3: the job fails with it, after the other tasks ran.
    assert_eq!(phase, JobPhase::Failed, "{cause:?}");
    assert!(
        cause.as_deref().unwrap_or("").contains("\"say\""),
        "{cause:?}"
    );
    let k42 = step_key(8, b"k42");
    let copied = store
        .get(&Key::new(k42.container, k42.object, k42.dkey, k42.akey))
        .unwrap()
        .expect("copied record");
    assert_eq!(copied.len(), 100);
    let mut client = JobClient::connect(&addr, common::TOKEN).unwrap();
    let status = client.status(job).unwrap();
    assert_eq!(status.store, Some(store.url()));
    let read = |id: &str| outputs::read(&store, job, id).unwrap();
    let say = read("say").expect("outputs of say");
    assert_eq!((say.exit_code, say.stdout.as_str()), (3, "out\n"));
    assert_eq!(say.stderr, "err\n");
    for (id, text) in [
        ("put", "put 300 records of 100 bytes"),
        ("get", "get 300 records, 30000 bytes"),
        ("copy", "copy 300 records, 30000 bytes"),
        (
            "scrub",
            "scrub 300 records, 30000 bytes of 300 keys in 1 objects of container 0x8, all good",
        ),
    ] {
        let o = read(id).unwrap_or_else(|| panic!("outputs of {id}"));
        assert_eq!(o.exit_code, 0, "{id}");
        assert!(o.stdout.starts_with(text), "{id}: {:?}", o.stdout);
    }
    // `ferrite job status --json` reads the output records too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .env("FERRITE_TOKEN", "jobs-test-token")
        .args(["job", "status", &format!("{job:x}"), "--json"])
        .args(["--engine", &addr])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let say_json = json["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == "say")
        .cloned()
        .expect("say in outputs");
    assert_eq!(say_json["stderr"], "err\n");
    assert_eq!(say_json["exit_code"], 3);
    service.shutdown();
}

#[test]
fn scrub_names_a_damaged_record_and_get_a_missing_one() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let store = ferrite_client::embedded::connect().unwrap();
    let (service, _worker) = start(dir.path(), &store);
    let addr = service.addr().to_string();
    let put = "name='p'\n[[task]]\nid='put'\nsteps=[{kind='put', container=9, prefix='r', count=20, size_bytes=64}]\n";
    let (_, phase, cause) = run(&addr, put);
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    // Overwrite one record with bytes that are not what put wrote.
    let r7 = step_key(9, b"r7");
    let key = Key::new(r7.container, r7.object, r7.dkey, r7.akey);
    store.put(&key, &[0u8; 64]).unwrap();
    let scrub = "name='s'\n[retry]\nmax_attempts=1\n[[task]]\nid='scrub'\nsteps=[{kind='scrub', container=9}]\n";
    let (_, phase, cause) = run(&addr, scrub);
    assert_eq!(phase, JobPhase::Failed);
    let cause = cause.unwrap();
    assert!(cause.contains("1 of 20 records bad: r7"), "{cause}");
    let get = "name='g'\n[retry]\nmax_attempts=1\n[[task]]\nid='get'\nsteps=[{kind='get', container=9, prefix='r', count=21}]\n";
    let (_, phase, cause) = run(&addr, get);
    assert_eq!(phase, JobPhase::Failed);
    let cause = cause.unwrap();
    assert!(cause.contains("r7") || cause.contains("r20"), "{cause}");
    service.shutdown();
}

#[test]
fn an_engine_runs_the_resource_manager_in_its_control_task_class() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let mut config = ferrite_engine::config::EngineConfig::for_temp_dir(dir.path());
    config.listen.unix = dir.path().join("e.sock").to_string_lossy().into_owned();
    let engine = ferrite_engine::Engine::start(config).unwrap();
    let url = format!("unix://{}", engine.unix_path().unwrap().display());
    let mut jobs = JobServiceConfig::new(dir.path().join("jobs")).with_token(common::TOKEN);
    jobs.store = Some(url.clone());
    let last = ferrite_xstream::XstreamId(engine.mesh().len() - 1);
    let service = JobService::start_on(jobs, engine.mesh(), last).unwrap();
    let addr = service.addr().to_string();
    let _worker = common::Worker::start(&addr, "w", 1, dir.path());
    let text = "name='e'\n[[task]]\nid='a'\nsteps=[{kind='exec', cmd='echo', args=['hi']}]\n\
                [[task]]\nid='b'\ninputs=['a']\nsteps=[{kind='exec', cmd='tr', args=['a-z', 'A-Z']}]\n";
    let (job, phase, cause) = run(&addr, text);
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    let store = Client::connect(&url).unwrap();
    let b = outputs::read(&store, job, "b")
        .unwrap()
        .expect("outputs of b");
    assert_eq!((b.exit_code, b.stdout.as_str()), (0, "HI\n"));
    service.shutdown();
    engine.shutdown().unwrap();
}

/// An engine of one target on small bdev files in `dir` (the same files on
/// every start), with a job service storing outputs in it and one worker.
fn start_engine(dir: &std::path::Path) -> (EngineHandle, JobService, common::Worker) {
    let mut config = EngineConfig::for_temp_dir(dir);
    config.bdev = "uring:{dir}/target-{i}.bdev?size=64M".into();
    config.cache.ring_bytes = Size(4 << 20);
    config.listen.unix = dir.join("e.sock").to_string_lossy().into_owned();
    let engine = Engine::start(config).unwrap();
    let url = format!("unix://{}", engine.unix_path().unwrap().display());
    let mut jobs = JobServiceConfig::new(dir.join("jobs")).with_token(common::TOKEN);
    jobs.store = Some(url);
    let service = JobService::start(jobs).unwrap();
    let worker = common::Worker::start(&service.addr().to_string(), "w", 1, dir);
    (engine, service, worker)
}

/// Inverts one byte at every place `marker` occurs in the file at `path`;
/// returns how many places.
fn corrupt_every(path: &std::path::Path, marker: &[u8]) -> usize {
    use std::io::{Read, Seek, SeekFrom, Write};
    const CHUNK: usize = 1 << 20;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let size = file.metadata().unwrap().len() as usize;
    let mut hits = Vec::new();
    let mut buf = vec![0u8; CHUNK + marker.len()];
    for start in (0..size).step_by(CHUNK) {
        let len = (CHUNK + marker.len()).min(size - start);
        file.seek(SeekFrom::Start(start as u64)).unwrap();
        file.read_exact(&mut buf[..len]).unwrap();
        if buf[..len].iter().all(|&b| b == 0) {
            continue;
        }
        let found = buf[..len].windows(marker.len()).enumerate();
        hits.extend(found.filter(|(_, w)| *w == marker).map(|(i, _)| start + i));
    }
    hits.dedup();
    for &at in &hits {
        let mut byte = [0u8];
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.read_exact(&mut byte).unwrap();
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.write_all(&[!byte[0]]).unwrap();
    }
    file.sync_all().unwrap();
    hits.len()
}

#[test]
fn scrub_reads_every_object_back_from_the_device() {
    common::watchdog(Duration::from_secs(90));
    let dir = tempfile::tempdir().unwrap();
    let (engine, service, worker) = start_engine(dir.path());
    let url = format!("unix://{}", engine.unix_path().unwrap().display());
    let addr = service.addr().to_string();
    let put = "name='p'\n[[task]]\nid='put'\nsteps=[{kind='put', container=12, prefix='r', count=20, size_bytes=64}]\n";
    assert_eq!(run(&addr, put).1, JobPhase::Done);
    // Three more objects of single values, and a byte array of two extents.
    let store = Client::connect(&url).unwrap();
    let value = |o: u128, i: u32| format!("object {o} record {i}|").repeat(10).into_bytes();
    for o in 1..=3u128 {
        for i in 0..10 {
            let key = Key::new(12, o, format!("d{i}").as_bytes(), b"a");
            store.put(&key, &value(o, i)).unwrap();
        }
    }
    let array = Key::new(12, 4, b"file", b"data");
    store.write_extent(&array, 0, &[1u8; 1000]).unwrap();
    store.write_extent(&array, 500, &[2u8; 1000]).unwrap();
    let scrub = "name='s'\n[retry]\nmax_attempts=1\n[[task]]\nid='scrub'\nsteps=[{kind='scrub', container=12}]\n";
    let (job, phase, cause) = run(&addr, scrub);
    assert_eq!(phase, JobPhase::Done, "{cause:?}");
    let o = outputs::read(&store, job, "scrub").unwrap().unwrap();
    let all = "scrub 52 records, 8680 bytes of 51 keys in 5 objects of container 0xc, all good";
    assert!(o.stdout.starts_with(all), "{}", o.stdout);
    drop(store);
    drop(worker);
    service.shutdown();
    engine.shutdown().unwrap();

    // Bits of object 2's record d5 rot on the device while the engine is
    // down: nothing but a read of that record from the device can tell.
    let bdev = dir.path().join("target-0.bdev");
    assert!(corrupt_every(&bdev, b"object 2 record 5|") > 0);
    let (engine, service, _worker) = start_engine(dir.path());
    let (_, phase, cause) = run(&service.addr().to_string(), scrub);
    assert_eq!(phase, JobPhase::Failed);
    let cause = cause.unwrap();
    assert!(
        cause.contains(r#"1 of 52 records bad: object 0x2 dkey "d5" akey "a""#),
        "{cause}"
    );
    assert!(cause.contains("on the device"), "{cause}");
    service.shutdown();
    engine.shutdown().unwrap();
}
