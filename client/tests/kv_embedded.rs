//! Guards embedded mode: `embedded::connect` starts an engine in this
//! process on a temp directory and GETs on it are one-sided over shm; the
//! `ferrite` CLI without `--engine` works on such an engine.

#![cfg(feature = "embedded")]

use ferrite_client::client::Key;

#[test]
fn embedded_engine_serves_one_sided_gets() {
    let client = ferrite_client::embedded::connect().unwrap();
    assert_eq!(client.one_sided_provider(), Some("shm"));
    for i in 0..100u32 {
        client
            .put(
                &Key::new(0, 0, format!("e{i}").as_bytes(), b""),
                &i.to_le_bytes(),
            )
            .unwrap();
    }
    for i in 0..100u32 {
        let v = client
            .get(&Key::new(0, 0, format!("e{i}").as_bytes(), b""))
            .unwrap();
        assert_eq!(v, Some(i.to_le_bytes().to_vec()));
    }
    assert_eq!(client.counters().one_sided_hits, 100);
}

#[test]
fn cli_without_engine_uses_an_embedded_one() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["put", "--json", "k", "v"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["version"].as_u64().unwrap() > 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("embedded"));
}
