//! A full file system under a file bdev: updates fail at once with
//! `NoSpace` instead of poisoning the store, reads of earlier keys keep
//! working, updates succeed again once space returns, and after a reopen
//! every acknowledged update is there and no refused one is. Runs on a
//! small tmpfs mounted for the test (needs root; skipped otherwise), the
//! bdev through the page cache (tmpfs refuses O_DIRECT).

use ferrite_engine::store::{Store, StoreConfig, StoreError};
use ferrite_proto::key::RecordKey;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A tmpfs mounted on a temp dir, unmounted on drop (also on a panic).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes 256 KiB pieces to `path` until the file system refuses one (at
/// most `max` pieces); returns how many it took.
fn fill(path: &Path, max: usize) -> usize {
    let mut f = std::fs::File::create(path).unwrap();
    let piece = vec![0x5a_u8; 256 << 10];
    for n in 0..max {
        if f.write_all(&piece).and_then(|_| f.sync_all()).is_err() {
            return n;
        }
    }
    panic!("the file system never filled");
}

/// Frees the last `bytes` of the filler: room for part of a commit.
fn shrink(path: &Path, bytes: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(bytes)).unwrap();
}

fn key(i: u32) -> [u8; 4] {
    i.to_le_bytes()
}

fn value(i: u32) -> Vec<u8> {
    format!("value {i};").bytes().cycle().take(4000).collect()
}

/// Updates key `i`, failing the test if no answer comes within a minute.
async fn update(s: &Store, i: u32) -> Result<u64, StoreError> {
    let (k, v) = (key(i), value(i));
    let rk = RecordKey::new(1, 1, b"a", &k);
    let put = std::pin::pin!(s.update(&rk, &v));
    let timeout = std::pin::pin!(glommio::timer::sleep(Duration::from_secs(60)));
    match futures::future::select(put, timeout).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(_) => panic!("update of key {i} hung"),
    }
}

async fn fetch(s: &Store, i: u32) -> Option<Vec<u8>> {
    let k = key(i);
    let got = s.fetch(&RecordKey::new(1, 1, b"a", &k)).await.unwrap();
    got.map(|(_, v)| v)
}

fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

/// Phase 1 on a fresh store: acknowledged updates, the file system filled,
/// refused updates, reads, space returned, updates again. Returns what was
/// acknowledged and the keys refused.
async fn fill_and_recover(spec: String, filler: PathBuf) -> Outcome {
    let s = Store::open(ferrite_bdev::open(&spec).unwrap(), StoreConfig::small())
        .await
        .unwrap();
    let mut acked = HashMap::new();
    for i in 0..50 {
        update(&s, i).await.unwrap();
        acked.insert(i, value(i));
    }
    let pieces = fill(&filler, 4096);
    assert!(pieces > 0, "no room for the filler at all");
    let mut refused = Vec::new();
    let mut i = 1000;
    // At most 16 MiB of updates: more than the tmpfs holds.
    while refused.len() < 3 && i < 5000 {
        match update(&s, i).await {
            Ok(_) => {
                acked.insert(i, value(i));
            }
            Err(StoreError::NoSpace { .. }) => refused.push(i),
            Err(e) => panic!("update {i} on a full file system: {e}"),
        }
        i += 1;
    }
    assert_eq!(
        refused.len(),
        3,
        "no update was refused on a full file system"
    );
    assert!(!s.stats().poisoned, "a full file system poisoned the store");
    // Both checkpoint areas: one may never have been written.
    for _ in 0..2 {
        match s.checkpoint().await {
            Ok(_) | Err(StoreError::NoSpace { .. }) => {}
            Err(e) => panic!("checkpoint on a full file system: {e}"),
        }
    }
    assert!(
        !s.stats().poisoned,
        "a checkpoint on a full file system poisoned the store"
    );
    for (k, v) in &acked {
        assert_eq!(fetch(&s, *k).await.as_ref(), Some(v), "key {k} while full");
    }
    for k in &refused {
        assert_eq!(fetch(&s, *k).await, None, "refused key {k} is visible");
    }
    std::fs::remove_file(&filler).unwrap();
    for i in 6000..6100 {
        update(&s, i).await.unwrap();
        acked.insert(i, value(i));
    }
    s.sync().await.unwrap();
    (acked, refused)
}

#[test]
fn a_full_file_system_refuses_updates_and_recovers_when_space_returns() {
    on_full_tmpfs(fill_and_recover);
}

/// Eight writers at once against a file system with room for part of a
/// group commit: some commits land in part before one of their writes is
/// refused. Every update is acknowledged or refused with `NoSpace`; after
/// space returns and a reopen, exactly the acknowledged ones are there.
async fn concurrent_writers(spec: String, filler: PathBuf) -> Outcome {
    let s = std::rc::Rc::new(
        Store::open(ferrite_bdev::open(&spec).unwrap(), StoreConfig::small())
            .await
            .unwrap(),
    );
    fill(&filler, 4096);
    shrink(&filler, 100 << 10);
    let tasks: Vec<_> = (0..8u32)
        .map(|t| {
            let s = s.clone();
            glommio::spawn_local(async move {
                let (mut acked, mut refused) = (Vec::new(), Vec::new());
                for i in 0..100 {
                    let k = t * 1000 + i;
                    match update(&s, k).await {
                        Ok(_) => acked.push(k),
                        Err(StoreError::NoSpace { .. }) => refused.push(k),
                        Err(e) => panic!("update {k} on a full file system: {e}"),
                    }
                }
                (acked, refused)
            })
        })
        .collect();
    let (mut acked, mut refused) = (HashMap::new(), Vec::new());
    for t in tasks {
        let (a, r) = t.await;
        acked.extend(a.into_iter().map(|k| (k, value(k))));
        refused.extend(r);
    }
    assert!(
        !refused.is_empty(),
        "no update was refused on a full file system"
    );
    assert!(!s.stats().poisoned, "a full file system poisoned the store");
    for k in &refused {
        assert_eq!(fetch(&s, *k).await, None, "refused key {k} is visible");
    }
    std::fs::remove_file(&filler).unwrap();
    for i in 9000..9100 {
        update(&s, i).await.unwrap();
        acked.insert(i, value(i));
    }
    s.sync().await.unwrap();
    (acked, refused)
}

#[test]
fn concurrent_writers_on_a_file_system_with_room_for_part_of_a_commit() {
    on_full_tmpfs(concurrent_writers);
}

/// Reopens the store and checks that exactly the acknowledged keys are there.
fn check_after_reopen(spec: String, acked: HashMap<u32, Vec<u8>>, refused: Vec<u32>) {
    let s2 = spec;
    run(move || {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let s = Store::open(ferrite_bdev::open(&s2).unwrap(), StoreConfig::small())
                    .await
                    .unwrap();
                for (k, v) in &acked {
                    assert_eq!(
                        fetch(&s, *k).await.as_ref(),
                        Some(v),
                        "key {k} after reopen"
                    );
                }
                for k in &refused {
                    assert_eq!(fetch(&s, *k).await, None, "refused key {k} after reopen");
                }
            })
            .unwrap()
            .join()
            .unwrap()
    });
}

/// What a case returns: the acknowledged keys and values, the refused keys.
type Outcome = (HashMap<u32, Vec<u8>>, Vec<u32>);

/// Runs `case` (given the bdev spec and the filler's path) on a store on a
/// fresh tmpfs, then checks the outcome after a reopen.
fn on_full_tmpfs<F, Fut>(case: F)
where
    F: FnOnce(String, PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Outcome> + 'static,
{
    let Some(fs) = Tmpfs::mount("24m") else {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    let spec = format!(
        "uring:{}?size=32M&direct=0",
        fs.path().join("store.img").display()
    );
    let filler = fs.path().join("filler");
    let s1 = spec.clone();
    let (acked, refused) = run(move || {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || case(s1, filler))
            .unwrap()
            .join()
            .unwrap()
    });
    check_after_reopen(spec, acked, refused);
    drop(fs);
}
