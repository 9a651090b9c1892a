//! Guards the `ferrite put|get|del|ls|stat` commands against an engine
//! process: values round-trip, `--json` output parses and carries the
//! fields scripts read, a missing key is an error exit, and a bad URL fails
//! with a message naming it.

mod kv_support;

use std::process::{Command, Output};

use kv_support::EngineProc;

fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("running ferrite")
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

#[test]
fn put_get_ls_stat_del_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    // Over TCP the CLI finds the token in the engine's data dir.
    let dir_flag = ["--data-dir", engine.dir.to_str().unwrap()];
    for (url, extra) in [
        (engine.unix.as_str(), &[][..]),
        (engine.tcp.as_str(), &dir_flag[..]),
    ] {
        let ferrite = |args: &[&str]| ferrite(&[args, extra].concat());
        let put = json(&ferrite(&[
            "put",
            "--engine",
            url,
            "--json",
            "greeting",
            "hello world",
        ]));
        assert!(put["version"].as_u64().unwrap() > 0);
        let get = ferrite(&["get", "--engine", url, "greeting"]);
        assert!(get.status.success());
        assert_eq!(get.stdout, b"hello world");
        let got = json(&ferrite(&["get", "--engine", url, "--json", "greeting"]));
        assert_eq!(got["value"], "hello world");
        let ls = json(&ferrite(&["ls", "--engine", url, "--json"]));
        assert!(
            ls["keys"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "greeting"),
            "{ls}"
        );
        let stat = json(&ferrite(&["stat", "--engine", url, "--json"]));
        assert_eq!(stat["targets"].as_array().unwrap().len(), 1);
        assert!(!stat["regions"].as_array().unwrap().is_empty());
        ferrite(&["del", "--engine", url, "greeting"]);
        let missing = ferrite(&["get", "--engine", url, "greeting"]);
        assert!(!missing.status.success());
        assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
    }
    let bad = ferrite(&["get", "--engine", "tcp://127.0.0.1:1", "k"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("tcp://127.0.0.1:1"));
}
