//! Built-in storage steps, run by a worker against the job's engine through
//! the client library: `put` and `get` of key ranges, `copy` of a range
//! between containers, `scrub` of a container.
//!
//! Every key a step touches is [`step_key`]`(container, "{prefix}{i}")`;
//! a value written by `put` is [`fill_pattern`] of its name, so `get`,
//! `copy` and `scrub` check each byte they read, on top of the record
//! checks the client makes itself (key, checksum).

use ferrite_proto::rpc_jobs::{step_key, STEP_OBJECT};

use crate::client::{Client, Key, Reply, Request};

/// Requests per batch frame, and keys read at once.
const CHUNK: u64 = 256;

/// The value `put` writes under `name`: `size` bytes of a sequence seeded
/// by the name, so that any reader can check it without the writer.
pub fn fill_pattern(name: &[u8], size: usize) -> Vec<u8> {
    let mut state = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut out = Vec::with_capacity(size);
    while out.len() < size {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let take = (size - out.len()).min(8);
        out.extend_from_slice(&z.to_le_bytes()[..take]);
    }
    out
}

/// Whether `value` is what `put` writes under `name`.
pub fn matches_pattern(name: &[u8], value: &[u8]) -> bool {
    fill_pattern(name, value.len()) == value
}

fn name(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i}").into_bytes()
}

fn owned(container: u64, name: &[u8]) -> Key {
    let k = step_key(container, name);
    Key::new(k.container, k.object, k.dkey, k.akey)
}

fn check_replies(op: &str, replies: Vec<Reply>) -> Result<(), String> {
    for r in replies {
        if let Reply::Error { message, .. } = r {
            return Err(format!("{op}: {message}"));
        }
    }
    Ok(())
}

/// Writes `count` values of `size` bytes; returns the summary line.
pub fn put(
    c: &Client,
    container: u64,
    prefix: &str,
    count: u64,
    size: u64,
) -> Result<String, String> {
    let size_usize = usize::try_from(size).map_err(|_| format!("put: size {size} too large"))?;
    for range in chunks(count) {
        let batch = range
            .map(|j| {
                let n = name(prefix, j);
                let value = fill_pattern(&n, size_usize);
                Request::Update {
                    key: owned(container, &n),
                    value,
                }
            })
            .collect();
        check_replies("put", c.batch(batch).map_err(|e| format!("put: {e}"))?)?;
    }
    Ok(format!(
        "put {count} records of {size} bytes into container {container:#x}\n"
    ))
}

/// Reads keys `prefix{i}`, `i` in `range`, into `f(name, value)`; a
/// missing key is an error. Returns the bytes read.
fn read_range(
    c: &Client,
    op: &str,
    container: u64,
    prefix: &str,
    range: std::ops::Range<u64>,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), String>,
) -> Result<u64, String> {
    let names: Vec<Vec<u8>> = range.map(|j| name(prefix, j)).collect();
    let keys: Vec<_> = names.iter().map(|n| step_key(container, n)).collect();
    let mut outs: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
    let got = c
        .get_many_into(&keys, &mut outs)
        .map_err(|e| format!("{op}: {e}"))?;
    let mut bytes = 0u64;
    for ((r, n), out) in got.into_iter().zip(&names).zip(&outs) {
        let shown = String::from_utf8_lossy(n);
        match r.map_err(|e| format!("{op} {shown}: {e}"))? {
            Some(_) => {
                bytes += out.len() as u64;
                f(n, out)?;
            }
            None => return Err(format!("{op}: {shown} is not in container {container:#x}")),
        }
    }
    Ok(bytes)
}

/// The ranges of at most [`CHUNK`] indices covering `0..count`.
fn chunks(count: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    (0..count.div_ceil(CHUNK)).map(move |k| k * CHUNK..((k + 1) * CHUNK).min(count))
}

fn check_value(op: &str, container: u64, name: &[u8], value: &[u8]) -> Result<(), String> {
    match matches_pattern(name, value) {
        true => Ok(()),
        false => Err(format!(
            "{op}: {} in container {container:#x} does not hold what put wrote",
            String::from_utf8_lossy(name)
        )),
    }
}

/// Reads `count` keys and checks every value against its pattern.
pub fn get(c: &Client, container: u64, prefix: &str, count: u64) -> Result<String, String> {
    let mut bytes = 0;
    for range in chunks(count) {
        bytes += read_range(c, "get", container, prefix, range, |n, v| {
            check_value("get", container, n, v)
        })?;
    }
    Ok(format!(
        "get {count} records, {bytes} bytes from container {container:#x}, all match\n"
    ))
}

/// Copies `count` keys from `source` to `target`, checking each value.
pub fn copy(
    c: &Client,
    source: u64,
    target: u64,
    prefix: &str,
    count: u64,
) -> Result<String, String> {
    let mut bytes = 0;
    for range in chunks(count) {
        let mut batch = Vec::new();
        bytes += read_range(c, "copy", source, prefix, range, |n, v| {
            check_value("copy", source, n, v)?;
            batch.push(Request::Update {
                key: owned(target, n),
                value: v.to_vec(),
            });
            Ok(())
        })?;
        check_replies("copy", c.batch(batch).map_err(|e| format!("copy: {e}"))?)?;
    }
    Ok(format!(
        "copy {count} records, {bytes} bytes from container {source:#x} to {target:#x}\n"
    ))
}

/// Reads every record under the step object of `container` (every key a
/// put or copy step wrote there) and checks it.
pub fn scrub(c: &Client, container: u64) -> Result<String, String> {
    let dkeys = c
        .list_dkeys(container, STEP_OBJECT)
        .map_err(|e| format!("scrub: list: {e}"))?;
    let (mut records, mut bytes, mut bad) = (0u64, 0u64, Vec::new());
    let mut out = Vec::new();
    for dkey in &dkeys {
        let akeys = c
            .list_akeys(container, STEP_OBJECT, dkey)
            .map_err(|e| format!("scrub: list: {e}"))?;
        for akey in &akeys {
            let key = ferrite_proto::key::RecordKey::new(container, STEP_OBJECT, dkey, akey);
            let shown = String::from_utf8_lossy(dkey).into_owned();
            match c.get_into(&key, &mut out) {
                Ok(Some(_)) => {
                    records += 1;
                    bytes += out.len() as u64;
                    if !matches_pattern(dkey, &out) {
                        bad.push(shown);
                    }
                }
                // Deleted between the listing and the read.
                Ok(None) => {}
                Err(e) => bad.push(format!("{shown} ({e})")),
            }
        }
    }
    if !bad.is_empty() {
        let first: Vec<_> = bad.iter().take(8).cloned().collect();
        return Err(format!(
            "scrub of container {container:#x}: {} of {records} records bad: {}",
            bad.len(),
            first.join(", ")
        ));
    }
    Ok(format!(
        "scrub {records} records, {bytes} bytes in container {container:#x}, all good\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_depend_on_the_name_and_catch_changes() {
        let a = fill_pattern(b"k1", 37);
        assert_eq!(a.len(), 37);
        assert_eq!(a, fill_pattern(b"k1", 37));
        assert_ne!(a, fill_pattern(b"k2", 37));
        assert!(matches_pattern(b"k1", &a));
        let mut b = a.clone();
        b[36] ^= 1;
        assert!(!matches_pattern(b"k1", &b));
        assert!(matches_pattern(b"k1", &[]));
    }

    #[test]
    fn chunks_cover_the_range_once() {
        let all: Vec<u64> = chunks(CHUNK * 2 + 3).flatten().collect();
        assert_eq!(all, (0..CHUNK * 2 + 3).collect::<Vec<_>>());
        assert_eq!(chunks(0).count(), 0);
        assert_eq!(chunks(CHUNK).count(), 1);
    }
}
