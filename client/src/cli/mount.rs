//! `ferrite mount|umount`: the file namespace as a FUSE file system.

use anyhow::{bail, Context};
use ferrite_client::client::Client;
use ferrite_client::fs::{Namespace, DEFAULT_CONTAINER};
use ferrite_client::fuse::FerriteFuse;
use fuser::MountOption;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct MountArgs {
    /// Engine URL (`unix:///path` or `tcp://host:port`); without it an
    /// engine is started inside this process on a temp directory and goes
    /// away at unmount.
    #[arg(long)]
    pub engine: Option<String>,
    /// Namespace container id.
    #[arg(long, default_value_t = DEFAULT_CONTAINER)]
    pub container: u64,
    /// Directory to mount on (must exist).
    pub mountpoint: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// A mount point made by `ferrite mount`.
    pub mountpoint: PathBuf,
}

fn connect(engine: Option<&str>) -> anyhow::Result<Client> {
    match engine {
        Some(url) => Client::connect(url).with_context(|| format!("connect to {url}")),
        #[cfg(feature = "embedded")]
        None => ferrite_client::embedded::connect().context("start an embedded engine"),
        #[cfg(not(feature = "embedded"))]
        None => bail!("no --engine given and this build has no embedded engine"),
    }
}

/// Blocks SIGTERM/SIGINT in this thread (and threads it spawns later) so
/// that they can be taken with `sigtimedwait`.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits up to `timeout` for a blocked stop signal; true if one came.
fn wait_stop_signal(set: &libc::sigset_t, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: set and ts are valid for the call; no siginfo wanted.
    unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) > 0 }
}

pub fn mount(a: MountArgs) -> anyhow::Result<()> {
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    let signals = block_stop_signals();
    let client = connect(a.engine.as_deref())?;
    let ns = Namespace::new(Arc::new(client), a.container);
    let options = [
        MountOption::FSName("ferrite".into()),
        MountOption::Subtype("ferrite".into()),
        MountOption::DefaultPermissions,
        MountOption::AllowOther,
        MountOption::RW,
    ];
    let session =
        fuser::spawn_mount2(FerriteFuse::new(ns), &a.mountpoint, &options).with_context(|| {
            format!(
                "mount on {} (needs /dev/fuse and root or fusermount3)",
                a.mountpoint.display()
            )
        })?;
    println!("ferrite: mounted on {}", a.mountpoint.display());
    // Until a stop signal, or until someone else unmounts (the session ends).
    while !session.guard.is_finished() {
        if wait_stop_signal(&signals, Duration::from_millis(500)) {
            eprintln!(
                "ferrite: stop signal, unmounting {}",
                a.mountpoint.display()
            );
            break;
        }
    }
    super::unmounting();
    session.join();
    if is_mounted(&a.mountpoint) {
        bail!(
            "{} is still mounted; try `ferrite umount {0}`",
            a.mountpoint.display()
        );
    }
    Ok(())
}

/// True if `dir` is a mount point in /proc/self/mounts (paths as the kernel
/// prints them: octal escapes for blanks, which a mount point made by
/// `ferrite mount` with such a name would also carry).
fn is_mounted(dir: &std::path::Path) -> bool {
    let dir = (dir.canonicalize())
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_path_buf());
    let want = dir.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

pub fn umount(a: UmountArgs) -> anyhow::Result<()> {
    let path = std::ffi::CString::new(a.mountpoint.as_os_str().as_encoded_bytes())
        .context("mount point contains a NUL byte")?;
    // SAFETY: path is a valid C string.
    if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    // Not root: fall back to fusermount3, which may unmount user mounts.
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&a.mountpoint)
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => bail!("umount {}: {err}", a.mountpoint.display()),
    }
}
