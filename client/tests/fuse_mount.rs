//! Guards the FUSE mount: `ferrite mount` (embedded engine) serves the
//! namespace to standard tools — cp, tar, rsync, find, dd, fio and a make
//! build of a small C project — and `ferrite umount` / SIGTERM unmount it.
//! Needs root and /dev/fuse; set FERRITE_SKIP_FUSE=1 to skip elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = dir.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&*want))
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Mount {
    child: Child,
    dir: PathBuf,
    /// The mount process's TMPDIR, where its embedded engine lives.
    tmp: PathBuf,
}

impl Mount {
    fn start(dir: &Path) -> Self {
        let tmp = dir.with_extension("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .arg("mount")
            .arg(dir)
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.with_extension("log")).unwrap())
            .spawn()
            .expect("spawn ferrite mount");
        let m = Self {
            child,
            dir: dir.to_path_buf(),
            tmp,
        };
        wait_for("the mount", || is_mounted(dir));
        m
    }

    /// Waits (bounded) for the mount process to exit on its own, checks
    /// that it succeeded and removed its embedded engine's directory.
    fn expect_clean_exit(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the mount process did not exit");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "exit status {status}");
        assert!(!is_mounted(&self.dir), "still mounted");
        let left: Vec<_> = std::fs::read_dir(&self.tmp).unwrap().collect();
        assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
        let log = std::fs::read_to_string(self.dir.with_extension("log")).unwrap();
        assert!(!log.contains("ERROR"), "errors logged: {log}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.dir) {
            let _ = Command::new(env!("CARGO_BIN_EXE_ferrite"))
                .arg("umount")
                .arg(&self.dir)
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(cwd: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "script failed: {script}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn usable() -> bool {
    if std::env::var_os("FERRITE_SKIP_FUSE").is_some() {
        eprintln!("FERRITE_SKIP_FUSE set: skipping the FUSE test");
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root && Path::new("/dev/fuse").exists(),
        "the FUSE test needs root and /dev/fuse (or FERRITE_SKIP_FUSE=1)"
    );
    true
}

/// statvfs(2) of `dir`: (size, used) in bytes.
fn space(dir: &Path) -> (u64, u64) {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` points to writable memory
    // of the size statvfs fills.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs {}", dir.display());
    // SAFETY: statvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    let block = st.f_frsize;
    (st.f_blocks * block, (st.f_blocks - st.f_bfree) * block)
}

#[test]
fn standard_tools_work_on_the_mount() {
    if !usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    for i in 0..20 {
        std::fs::write(
            src.join(format!("sub/f{i:02}.txt")),
            format!("file {i}\n").repeat(i * 50 + 1),
        )
        .unwrap();
    }
    std::fs::write(
        src.join("sub/deeper/big.bin"),
        (0..3_000_000u32)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    std::os::unix::fs::symlink("f01.txt", src.join("sub/link")).unwrap();
    let mut m = Mount::start(&mnt);
    let s = src.display();
    // cp -a and a byte-for-byte comparison, symlinks included.
    sh(
        &mnt,
        &format!("cp -a {s} cp && diff -r {s} cp && test \"$(readlink cp/sub/link)\" = f01.txt"),
    );
    // tar out of and into the mount.
    sh(
        &mnt,
        &format!("tar -C {s} -cf t.tar . && mkdir un && tar -C un -xf t.tar && diff -r {s} un"),
    );
    // rsync in, then again (nothing to transfer), then compare.
    sh(
        &mnt,
        &format!(
            "rsync -a {s}/ rs/ && rsync -a --itemize-changes {s}/ rs/ > again && diff -r {s} rs"
        ),
    );
    let again = std::fs::read_to_string(mnt.join("again")).unwrap();
    assert!(
        again.lines().all(|l| !l.starts_with(">f")),
        "second rsync re-sent files: {again}"
    );
    // find by name and size.
    let found = sh(&mnt, "find cp -name 'f1*.txt' | sort | wc -l");
    assert_eq!(found.trim(), "10");
    let big = sh(&mnt, "find . -size +2M -name big.bin | wc -l");
    assert_eq!(big.trim(), "3");
    // dd with odd block sizes, read back through the mount.
    sh(&mnt, "head -c 5000000 /dev/urandom > ../rand && dd if=../rand of=dd.bin bs=33333 status=none && cmp dd.bin ../rand");
    // statfs says what the engine holds: its space ceiling as the size,
    // the live data (at least the files written so far) as used.
    let (size, used) = space(&mnt);
    assert!(
        used >= 5_000_000 && used < size,
        "statfs: size {size} used {used}"
    );
    // fio with verification.
    sh(&mnt, "fio --name=v --directory=. --rw=randwrite --size=2m --bs=4k --ioengine=psync --verify=crc32c --do_verify=1 --output=fio.out && grep -q 'err= 0' fio.out");
    // Build a small C project with make.
    sh(&mnt, "mkdir proj && cd proj && printf 'int add(int a,int b);\\nint main(void){return add(2,3)==5?0:1;}\\n' > main.c && printf 'int add(int a,int b){return a+b;}\\n' > add.c && printf 'prog: main.o add.o\\n\\tcc -o prog main.o add.o\\n%%.o: %%.c\\n\\tcc -c $< -o $@\\n' > Makefile && make -s && ./prog");
    // Errors map to the right errno.
    let e = std::fs::create_dir(mnt.join("cp")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    let e = std::fs::remove_dir(mnt.join("cp")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    let e = std::fs::read(mnt.join("missing")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    // Unmount with `ferrite umount`; the mount process exits.
    let st = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg("umount")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!is_mounted(&mnt));
    m.expect_clean_exit();
}

#[test]
fn sigterm_unmounts_cleanly() {
    if !usable() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut m = Mount::start(&mnt);
    std::fs::write(mnt.join("x"), b"data").unwrap();
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(m.child.id() as i32, libc::SIGTERM) };
    m.expect_clean_exit();
}
