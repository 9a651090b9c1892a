//! Guards `ferrite bench store --json`: a small in-process run on a malloc
//! device prints every figure the side-by-side script and the closing notes
//! read, each a finite positive number with its unit, and the memory-only
//! fetch rate is the one two dependent loads of the printed latency allow.

use std::collections::HashMap;
use std::process::Command;

fn figures(args: &[&str]) -> HashMap<String, (f64, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["bench", "store", "--json"])
        .args(args)
        .output()
        .expect("running ferrite bench store");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let name = v["name"].as_str().expect("name").to_string();
        let value = v["ferrite"].as_f64().expect("ferrite figure");
        let unit = v["unit"].as_str().expect("unit").to_string();
        assert!(
            map.insert(name.clone(), (value, unit)).is_none(),
            "{name} twice"
        );
    }
    map
}

#[test]
fn a_small_run_prints_every_figure() {
    let f = figures(&[
        "--bdevs",
        "malloc",
        "--sizes",
        "64,4096",
        "--max-keys",
        "2000",
        "--fetches",
        "20000",
        "--no-cleaner",
    ]);
    for size in ["64B", "4KiB"] {
        for (name, unit) in [
            ("update", "ops/s"),
            ("update_p99", "us"),
            ("fetch_one_per_call", "ops/s"),
            ("fetch_one_per_call_per_cpu", "ops/cpu-s"),
            ("fetch_concurrent", "ops/s"),
            ("fetch_concurrent_per_cpu", "ops/cpu-s"),
            ("fetch_concurrent_p99", "us"),
            ("fetch_served_batch16", "ops/s"),
            ("fetch_served_batch16_p99", "us"),
            ("metadata_bytes_per_key", "B"),
            ("bucket_load", "ratio"),
            ("host_load_ns_over_working_set", "ns"),
            ("fetch_one_per_call_memory_only", "ops/s"),
        ] {
            let key = format!("store.{name}.malloc.{size}");
            let (v, u) = f.get(&key).unwrap_or_else(|| panic!("{key} missing"));
            assert_eq!(u, unit, "{key}");
            assert!(v.is_finite() && *v > 0.0, "{key} = {v}");
        }
        let ns = f[&format!("store.host_load_ns_over_working_set.malloc.{size}")].0;
        let rate = f[&format!("store.fetch_one_per_call_memory_only.malloc.{size}")].0;
        assert!(
            (rate * 2.0 * ns / 1e9 - 1.0).abs() < 1e-9,
            "{rate} ops/s, {ns} ns"
        );
    }
}

#[test]
fn an_unknown_device_is_an_error_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["bench", "store", "--bdevs", "floppy", "--no-cleaner"])
        .output()
        .expect("running ferrite bench store");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("floppy"), "stderr: {err}");
}
