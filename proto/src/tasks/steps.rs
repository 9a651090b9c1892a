//! Built-in storage steps, run by the node granted the task against the
//! job's engine ([`TaskStore`]): `put` and `get` of key ranges, `copy` of a range
//! between containers, checksum `scrub` of a whole container (every record
//! of every object, read back and checked by the engine).
//!
//! Every key a step touches is [`step_key`]`(container, "{prefix}{i}")`;
//! a value written by `put` is [`fill_pattern`] of its name, so `get`,
//! `copy` and `scrub` check each byte they read, on top of the record
//! checks the client makes itself (key, checksum).

use super::TaskStore;
use crate::rpc::{Key, Reply, Request, Verified};
use crate::rpc_jobs::{step_key, AKEY_VALUE, STEP_OBJECT};

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
pub async fn put<S: TaskStore>(
    c: &S,
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
        check_replies(
            "put",
            (c.batch(batch).await).map_err(|e| format!("put: {e}"))?,
        )?;
    }
    Ok(format!(
        "put {count} records of {size} bytes into container {container:#x}\n"
    ))
}

/// Reads keys `prefix{i}`, `i` in `range`, into `f(name, value)`; a
/// missing key is an error. Returns the bytes read.
async fn read_range<S: TaskStore>(
    c: &S,
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
        .await
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
pub async fn get<S: TaskStore>(
    c: &S,
    container: u64,
    prefix: &str,
    count: u64,
) -> Result<String, String> {
    let mut bytes = 0;
    for range in chunks(count) {
        bytes += read_range(c, "get", container, prefix, range, |n, v| {
            check_value("get", container, n, v)
        })
        .await?;
    }
    Ok(format!(
        "get {count} records, {bytes} bytes from container {container:#x}, all match\n"
    ))
}

/// Copies `count` keys from `source` to `target`, checking each value.
pub async fn copy<S: TaskStore>(
    c: &S,
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
        })
        .await?;
        check_replies(
            "copy",
            (c.batch(batch).await).map_err(|e| format!("copy: {e}"))?,
        )?;
    }
    Ok(format!(
        "copy {count} records, {bytes} bytes from container {source:#x} to {target:#x}\n"
    ))
}

/// What a scrub has seen so far.
#[derive(Default)]
struct Tally {
    objects: u64,
    keys: u64,
    records: u64,
    bytes: u64,
    /// The bad records, named.
    bad: Vec<String>,
}

/// A key as a scrub names it: dkey alone under the step object (the name
/// `put` gave it), else object, dkey and akey.
fn shown(key: &Key) -> String {
    let part = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match key.object == STEP_OBJECT && key.akey == AKEY_VALUE {
        true => part(&key.dkey),
        false => format!(
            "object {:#x} dkey {:?} akey {:?}",
            key.object,
            part(&key.dkey),
            part(&key.akey)
        ),
    }
}

/// Has the engine check every record of `keys` where it keeps it (Verify:
/// read back from its device, and from memory while there; CRC, address,
/// key).
async fn verify_keys<S: TaskStore>(c: &S, keys: &[Key], t: &mut Tally) -> Result<(), String> {
    let batch = keys
        .iter()
        .map(|k| Request::Verify { key: k.clone() })
        .collect();
    let replies = c
        .batch(batch)
        .await
        .map_err(|e| format!("scrub: verify: {e}"))?;
    for (key, reply) in keys.iter().zip(replies) {
        match reply {
            Reply::Verified(Verified::Absent) => {} // deleted since the listing
            Reply::Verified(Verified::Intact {
                records,
                value_bytes,
            }) => {
                t.keys += 1;
                t.records += u64::from(records);
                t.bytes += value_bytes;
            }
            Reply::Verified(Verified::Corrupt {
                records,
                addr,
                reason,
            }) => {
                t.keys += 1;
                t.records += u64::from(records) + 1;
                t.bad
                    .push(format!("{} (record at {addr:#x}: {reason})", shown(key)));
            }
            Reply::Error { message, .. } => t.bad.push(format!("{} ({message})", shown(key))),
            other => return Err(format!("scrub: verify answered {other:?}")),
        }
    }
    Ok(())
}

/// Checks the values of step records against what `put` writes there.
async fn check_patterns<S: TaskStore>(c: &S, keys: &[Key], t: &mut Tally) -> Result<(), String> {
    let keys: Vec<_> = keys
        .iter()
        .filter(|k| k.akey == AKEY_VALUE)
        .map(Key::as_record_key)
        .collect();
    let mut outs: Vec<Vec<u8>> = vec![Vec::new(); keys.len()];
    let got = c
        .get_many_into(&keys, &mut outs)
        .await
        .map_err(|e| format!("scrub: get: {e}"))?;
    for ((key, r), out) in keys.iter().zip(got).zip(&outs) {
        let found = matches!(r, Ok(Some(_)));
        if found && !matches_pattern(key.dkey, out) {
            t.bad.push(String::from_utf8_lossy(key.dkey).into_owned());
        }
    }
    Ok(())
}

/// Every key of one object of the container, in order.
async fn keys_of<S: TaskStore>(c: &S, container: u64, object: u128) -> Result<Vec<Key>, String> {
    let err = |e| format!("scrub: list: {e}");
    let mut keys = Vec::new();
    for dkey in c.list_keys(container, object, None).await.map_err(err)? {
        let akeys = c.list_keys(container, object, Some(&dkey)).await;
        for akey in akeys.map_err(err)? {
            keys.push(Key::new(container, object, &dkey, &akey));
        }
    }
    Ok(keys)
}

/// Checksum scrub of a whole container: walks every object, dkey and akey
/// of it and has the engine read back and check every record (see
/// [`verify_keys`]); records under the step object must also hold what
/// `put` wrote. Fails naming the bad records (up to 8).
pub async fn scrub<S: TaskStore>(c: &S, container: u64) -> Result<String, String> {
    let mut t = Tally::default();
    let objects = c
        .list_objects(container)
        .await
        .map_err(|e| format!("scrub: list objects: {e}"))?;
    for object in objects {
        t.objects += 1;
        let keys = keys_of(c, container, object).await?;
        for chunk in keys.chunks(CHUNK as usize) {
            verify_keys(c, chunk, &mut t).await?;
            if object == STEP_OBJECT {
                check_patterns(c, chunk, &mut t).await?;
            }
        }
    }
    let Tally {
        objects,
        keys,
        records,
        bytes,
        bad,
    } = t;
    if !bad.is_empty() {
        let first: Vec<_> = bad.iter().take(8).cloned().collect();
        return Err(format!(
            "scrub of container {container:#x}: {} of {records} records bad: {}",
            bad.len(),
            first.join(", ")
        ));
    }
    Ok(format!(
        "scrub {records} records, {bytes} bytes of {keys} keys in {objects} objects \
         of container {container:#x}, all good\n"
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
