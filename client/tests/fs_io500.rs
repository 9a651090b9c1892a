//! Guards the IO500 backend on the Ferrite namespace (embedded engine): a whole capped run
//! passes its checks, the metadata phases take the round trips they are built for (a group of
//! mdtest creates is one batch, the group's writes and closes one more, a group of deletes one
//! or two, find and stat none per entry over shm; each file of a group keeps its own
//! outcome), write-behind keeps the IO500 rule (written and closed by one client,
//! read back whole by another), and phases run one by one through separate clients make a
//! passing run.

use std::sync::Arc;
use std::time::Duration;

use ferrite_client::client::Client;
use ferrite_client::fs::io500::FerriteBackend;
use ferrite_client::fs::{Namespace, READDIR_PAGE, ROOT_OBJECT};
use ferrite_client::io500::config::MDTEST_FILES_PER_GROUP;
use ferrite_client::io500::{run, Config, Io500Backend};

fn backend() -> FerriteBackend {
    let client = ferrite_client::embedded::connect().expect("embedded engine");
    FerriteBackend::new(Namespace::new(Arc::new(client), 9), "test".into())
}

fn round_trips_per_op(report: &ferrite_client::io500::RunReport, phase: &str) -> f64 {
    let p = report.phase(phase).expect(phase);
    p.round_trips_per_op()
        .expect("the ferrite backend counts round trips")
}

#[test]
fn capped_run_passes_with_few_round_trips_per_metadata_op() {
    let backend = backend();
    let mut config = Config::new(2, Duration::from_secs(600));
    config.ior_easy_max_transfers = 2;
    config.ior_hard_max_segments = 30;
    config.mdtest_easy_max_files = 120;
    config.mdtest_hard_max_files = 120;
    let report = run(&backend, &config).unwrap();
    assert!(report.passed(), "{}", report.table());
    assert_eq!(report.verify_errors, 0);
    let table = report.table();
    // Each task hands the backend groups of files: 120 files per task are 2 groups. The
    // group's creates are one batch (one request: the engine has one target); an
    // mdtest-hard group's writes and size updates one more. A delete group's names are one
    // batch after one-sided lookups; mdtest-hard's data removal one more.
    let per_op = |batches_per_group: u64| {
        let groups = 120u64.div_ceil(MDTEST_FILES_PER_GROUP);
        (batches_per_group * groups) as f64 / 120.0
    };
    for (phase, batches) in [
        ("mdtest-easy-write", 1),
        ("mdtest-hard-write", 2),
        ("mdtest-easy-delete", 1),
        ("mdtest-hard-delete", 2),
    ] {
        assert_eq!(
            round_trips_per_op(&report, phase),
            per_op(batches),
            "{phase}: {table}"
        );
    }
    // Listing pages (a request per target page), entries read one-sided over shm.
    assert!(round_trips_per_op(&report, "find") < 0.1, "{table}");
    assert!(
        round_trips_per_op(&report, "mdtest-hard-stat") < 0.1,
        "{table}"
    );
    // ior-hard: a write per transfer, plus the fsync and size publication per task.
    assert!(
        round_trips_per_op(&report, "ior-hard-write") < 1.2,
        "{table}"
    );
    // The engine's counters at the end of the run: what the run appended and what of it
    // is still live (the ior files: 2 tasks × 2 × 2 MiB easy, 2 × 30 × 47008 B hard).
    let counter = |name: &str| report.storage_counters.get(name).copied();
    let live = counter("live_bytes").expect("live_bytes counted");
    assert!(live >= 2 * 2 * (2 << 20) + 2 * 30 * 47_008, "{table}");
    assert!(counter("bytes_appended").unwrap() >= live, "{table}");
    assert_eq!(counter("cleaner_failures"), Some(0), "{table}");
    assert!(table.contains("storage: bytes_appended "), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["storage_counters"]["live_bytes"].as_u64(), Some(live));
    // The caps ended the write phases before the stonewall: IO500 would
    // mark them, and so the score, invalid; the checks themselves passed.
    assert_eq!(json["valid"], serde_json::Value::Bool(false), "{table}");
    for phase in json["phases"].as_array().unwrap() {
        let write = phase["name"].as_str().unwrap().ends_with("-write");
        assert_eq!(phase["valid"].as_bool(), Some(!write), "{phase}");
        if write {
            let reasons = phase["invalid_because"].to_string();
            assert!(reasons.contains("below the 600 s stonewall"), "{reasons}");
            assert!(reasons.contains("stopped at its cap"), "{reasons}");
        }
    }
    assert!(table.contains("[INVALID]"), "{table}");
}

#[test]
fn write_behind_and_deferred_writes_are_read_back_by_another_client() {
    let backend = backend();
    let url = backend.namespace().client().url();
    let other = Namespace::new(Arc::new(Client::connect(&url).unwrap()), 9);
    // Many interleaved transfers on one handle, beyond the in-flight window,
    // to the file all tasks share (ior-hard's: a chunk per transfer).
    let transfer = 47_008usize;
    let count = 200u64;
    let big = backend.create_shared("shared").unwrap();
    for i in 0..count {
        let data = vec![(i % 251) as u8; transfer];
        backend.write_at(&big, i * transfer as u64, &data).unwrap();
    }
    backend.sync(&big).unwrap();
    backend.close(big).unwrap();
    let fh = other.open(ROOT_OBJECT, "shared").unwrap();
    assert_eq!(fh.size(), count * transfer as u64);
    assert_eq!(fh.entry().chunk_size as usize, transfer);
    let mut buf = vec![0u8; transfer];
    for i in 0..count {
        other.read(&fh, i * transfer as u64, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == (i % 251) as u8), "transfer {i}");
    }
    // A small file: the write waits for the close and goes with the size.
    let small = backend.create("small").unwrap();
    backend.write_at(&small, 0, &[5u8; 3901]).unwrap();
    let mut back = vec![0u8; 3901];
    assert_eq!(backend.read_at(&small, 0, &mut back).unwrap(), 3901);
    assert!(
        back.iter().all(|&b| b == 5),
        "read through the writing handle"
    );
    backend.close(small).unwrap();
    let deferred = backend.create("deferred").unwrap();
    backend.write_at(&deferred, 0, &[6u8; 3901]).unwrap();
    backend.close(deferred).unwrap();
    // The close went behind: drained, another client sees it.
    backend.drain().unwrap();
    let fh = other.open(ROOT_OBJECT, "deferred").unwrap();
    assert_eq!(fh.size(), 3901);
    other.read(&fh, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 6));
}

#[test]
fn write_and_close_merges_a_concurrent_entry_change() {
    let backend = backend();
    let ns = backend.namespace();
    let fh = ns.create(ROOT_OBJECT, "f", 0o644).unwrap();
    // Another client changes the entry after our create: the close's conditional size
    // update misses and must merge instead of losing either change.
    let attr = ferrite_client::fs::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    ns.setattr(ROOT_OBJECT, "f", attr).unwrap();
    ns.write_and_close(fh, 0, &[1u8; 100]).unwrap();
    let e = ns.lookup(ROOT_OBJECT, "f").unwrap();
    assert_eq!(e.size, 100);
    assert_eq!(e.mode & 0o777, 0o600);
}

#[test]
fn readdir_gets_entries_with_the_listing_without_one_sided_reads() {
    let client = ferrite_client::embedded::connect_with(
        ferrite_client::client::ClientOptions {
            one_sided: false,
            ..Default::default()
        },
        |_| {},
    )
    .unwrap();
    let ns = Namespace::new(Arc::new(client), 9);
    let d = ns.mkdir(ROOT_OBJECT, "d", 0o755).unwrap();
    let n = READDIR_PAGE as usize * 3 / 2; // two listing pages
    for i in 0..n {
        ns.close(ns.create(d.object, &format!("e{i}"), 0o644).unwrap())
            .unwrap();
    }
    let before = ns.client().counters().rpc_requests;
    let mut seen = 0usize;
    ns.readdir(d.object, |_, _| {
        seen += 1;
        Ok(())
    })
    .unwrap();
    let requests = ns.client().counters().rpc_requests - before;
    assert_eq!(seen, n);
    // Two pages, one listing each: the entries, still in the engine's
    // rings, come with the names (ListValues), not a request per entry nor
    // a batch of fetches per page.
    assert_eq!(requests, 2);
}

#[test]
fn closes_and_unlinks_behind_complete_in_drain_and_report_failures() {
    let backend = backend();
    let url = backend.namespace().client().url();
    let other = Namespace::new(Arc::new(Client::connect(&url).unwrap()), 9);
    let files = 300u64; // beyond the backend's in-flight window
    for i in 0..files {
        let f = backend.create(&format!("f{i}")).unwrap();
        backend.write_at(&f, 0, &[i as u8; 3901]).unwrap();
        backend.close(f).unwrap();
    }
    backend.drain().unwrap();
    let mut back = vec![0u8; 3901];
    for i in 0..files {
        let fh = other.open(ROOT_OBJECT, &format!("f{i}")).unwrap();
        assert_eq!(fh.size(), 3901, "f{i}");
        other.read(&fh, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8), "f{i}");
    }
    // An unlink removes the name before it returns; the data goes behind.
    for i in 0..files {
        backend.unlink(&format!("f{i}")).unwrap();
        assert!(other.lookup(ROOT_OBJECT, &format!("f{i}")).is_err(), "f{i}");
    }
    backend.drain().unwrap();
    // A close-behind that fails (the file was removed meanwhile) is reported by drain.
    let f = backend.create("gone").unwrap();
    backend.write_at(&f, 0, &[1u8; 3901]).unwrap();
    other.unlink(ROOT_OBJECT, "gone").unwrap();
    backend.close(f).unwrap();
    assert!(backend.drain().is_err(), "the failed close was lost");
    backend.drain().unwrap();
}

/// Phases run one by one, each through a client of its own (as the processes of a job's
/// tasks would), hand their results on through the namespace and make a passing run.
#[test]
fn phases_one_by_one_through_separate_clients_pass() {
    use ferrite_client::io500::phases::{run_phase, Phase, PhaseOutcome};
    let first = backend();
    let url = first.namespace().client().url();
    let mut config = Config::new(2, Duration::from_secs(600));
    config.ior_easy_max_transfers = 2;
    config.ior_hard_max_segments = 30;
    config.mdtest_easy_max_files = 40;
    config.mdtest_hard_max_files = 102;
    let mut report = None;
    for phase in Phase::ORDER {
        let client = Client::connect(&url).unwrap();
        let backend = FerriteBackend::new(Namespace::new(Arc::new(client), 9), "test".into());
        if let PhaseOutcome::Report(r) = run_phase(&backend, &config, phase).unwrap() {
            report = Some(r);
        }
    }
    let report = report.expect("score ran");
    assert!(report.passed(), "{}", report.table());
    assert_eq!((report.find_found, report.find_expected), (2, 2));
    drop(first); // the embedded engine lived in it
}

/// A group of creates: one batch for the data and one for the sized entries, two records
/// per file; an existing name fails that file only (EEXIST) and the data written for it is
/// removed again; the others are created with their data, and another client reads them
/// back. A group of unlinks: one batch for the names, the data behind; a missing name fails
/// that path only.
#[test]
fn file_groups_share_round_trips_and_keep_each_files_outcome() {
    let backend = backend();
    let url = backend.namespace().client().url();
    let other = Namespace::new(Arc::new(Client::connect(&url).unwrap()), 9);
    backend
        .create("taken")
        .and_then(|f| backend.close(f))
        .unwrap();
    let data: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 3901]).collect();
    let mut files: Vec<(String, &[u8])> =
        (0..10).map(|i| (format!("g{i}"), &data[i][..])).collect();
    files[4].0 = "taken".into();
    let requests = || backend.namespace().client().counters().rpc_requests;
    let engine = |name: &str| -> u64 {
        let stat = backend.namespace().client().stat().unwrap();
        let of = |t: &ferrite_proto::rpc::TargetStat| {
            t.counters
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, v)| *v)
        };
        stat.target_counters.iter().map(of).sum()
    };
    let (keys, records) = (engine("keys"), engine("records_appended"));
    let before = requests();
    let results = backend.create_files(&files);
    // Data, entries, and the removal of the data written for "taken".
    assert_eq!(requests() - before, 3);
    // 9 new files of one chunk each: an entry and a chunk apiece, nothing of "taken" left.
    assert_eq!(engine("keys") - keys, 18);
    // 10 data writes, 9 entries, 1 punch; a size update after the data would add 9 more.
    let appended = engine("records_appended") - records;
    assert!(appended <= 20, "{appended} records for 9 files");
    for (i, r) in results.iter().enumerate() {
        match (i, r) {
            (4, Err(e)) => {
                assert_eq!(e.error.kind(), std::io::ErrorKind::AlreadyExists);
                assert_eq!(e.op, "create");
            }
            (_, r) => assert!(r.is_ok(), "g{i}: {r:?}"),
        }
    }
    let mut back = vec![0u8; 3901];
    for i in (0..10).filter(|&i| i != 4) {
        let fh = other.open(ROOT_OBJECT, &format!("g{i}")).unwrap();
        assert_eq!(fh.size(), 3901, "g{i}");
        other.read(&fh, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8), "g{i}");
    }
    // "taken" stays the empty file it was.
    assert_eq!(other.lookup(ROOT_OBJECT, "taken").unwrap().size, 0);

    let paths: Vec<String> = (0..10).map(|i| format!("g{i}")).collect();
    let before = requests();
    let results = backend.unlink_files(&paths);
    // The names in one batch (lookups one-sided over shm), the data in one more.
    assert_eq!(requests() - before, 2);
    for (i, r) in results.iter().enumerate() {
        match (i, r) {
            (4, Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            (_, r) => assert!(r.is_ok(), "g{i}: {r:?}"),
        }
        assert!(other.lookup(ROOT_OBJECT, &paths[i]).is_err(), "g{i}");
    }
    backend.drain().unwrap();
    assert!(other.lookup(ROOT_OBJECT, "taken").is_ok());
}

#[test]
fn stat_files_answers_each_path_as_stat_does_without_requests() {
    let backend = backend();
    backend.mkdir("d").unwrap();
    backend.mkdir("d/e").unwrap();
    let data = vec![7u8; 3901];
    let made = backend.create_files(&[("d/a".into(), &data[..]), ("b".into(), &[][..])]);
    assert!(made.iter().all(Result::is_ok), "{made:?}");
    let paths: Vec<String> = [
        "d/a",
        "b",
        "missing",
        "d/e",
        "d/..",
        "d/missing",
        "nodir/x",
        "b/x",
    ]
    .map(String::from)
    .to_vec();
    let counters = || backend.namespace().client().counters();
    let before = counters();
    let batch = backend.stat_files(&paths);
    // The entries looked up together, every one (present or not) settled one-sided over
    // shm.
    let used = counters().since(&before);
    assert_eq!(
        (used.one_sided_batches, used.rpc_requests),
        (1, 0),
        "{used:?}"
    );
    // The eight in the batch ("d/.." too: its bad name fails alone after; the two whose
    // directory failed hold their places with a stand-in), and the lookups of "nodir" and
    // "b" as directories.
    assert_eq!(used.one_sided_hits, 10, "{used:?}");
    assert_eq!(batch.len(), paths.len());
    for (path, got) in paths.iter().zip(&batch) {
        let one = backend.stat(path);
        match (got, &one) {
            (Ok(a), Ok(b)) => assert_eq!(
                (a.kind, a.size_bytes, a.mtime),
                (b.kind, b.size_bytes, b.mtime),
                "{path}"
            ),
            (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{path}: {a} / {b}"),
            _ => panic!("{path}: stat_files {got:?}, stat {one:?}"),
        }
    }
    assert_eq!(batch[0].as_ref().unwrap().size_bytes, 3901);
    assert_eq!(
        batch[2].as_ref().unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    assert!(batch[4].is_err() && batch[6].is_err() && batch[7].is_err());
}

#[test]
fn read_files_reads_each_file_as_open_read_close_does() {
    let backend = backend();
    backend.mkdir("r").unwrap();
    let data: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i + 1; 3901]).collect();
    let files: Vec<(String, &[u8])> = (0..6).map(|i| (format!("r/f{i}"), &data[i][..])).collect();
    assert!(backend.create_files(&files).iter().all(Result::is_ok));
    backend.drain().unwrap();
    let mut paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    paths.extend(["r/missing", "r", "nodir/f"].map(String::from));
    let mut bufs = vec![vec![0u8; 3902]; paths.len()];
    let counters = || backend.namespace().client().counters();
    let before = counters();
    let results = backend.read_files(&paths, &mut bufs);
    let used = counters().since(&before);
    // The entries in one one-sided batch, the data one-sided too: no request.
    assert_eq!(
        (used.one_sided_batches, used.rpc_requests),
        (1, 0),
        "{used:?}"
    );
    assert_eq!(results.len(), paths.len());
    for (i, r) in results.iter().enumerate().take(6) {
        assert_eq!(*r.as_ref().unwrap(), 3901, "{}", paths[i]);
        assert_eq!(&bufs[i][..3901], &data[i][..], "{}", paths[i]);
    }
    // The failures are those of opening each path alone.
    for (i, r) in results.iter().enumerate().skip(6) {
        let alone = backend.open(&paths[i]).map(|_| ()).unwrap_err();
        assert_eq!(
            r.as_ref().unwrap_err().error.kind(),
            alone.kind(),
            "{}",
            paths[i]
        );
    }
    // A buffer shorter than the file gets the file's start.
    let mut short = vec![vec![0u8; 100]];
    let r = backend.read_files(&paths[2..3], &mut short);
    assert_eq!(*r[0].as_ref().unwrap(), 100);
    assert_eq!(short[0], vec![3u8; 100]);
}
