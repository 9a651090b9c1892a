//! The data dir's hygiene at start: its mode (0700), the lock that keeps a
//! second engine out of it, the token file generated on first start (0600),
//! the bdev files' mode (0600) and the open-file limit.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ferrite_proto::rpc::handshake::{read_token_file, GENERATED_TOKEN_BYTES};
use rand::RngCore;

use super::{Result, ServerError};
use crate::config::EngineConfig;

/// The lock file in the data dir, held with `flock` for the engine's life.
pub const LOCK_FILE_NAME: &str = "engine.lock";

pub(crate) const DATA_DIR_MODE: u32 = 0o700;
pub(crate) const PRIVATE_FILE_MODE: u32 = 0o600;
pub(crate) const SOCKET_MODE: u32 = 0o660;

fn path_error(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServerError {
    let path = path.to_path_buf();
    move |source| ServerError::Path { op, path, source }
}

/// Sets `path`'s permission bits to `mode`.
pub(crate) fn set_mode(path: &Path, mode: u32, op: &'static str) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(path_error(op, path))
}

/// Creates the data dir if needed and makes it 0700.
pub(crate) fn prepare(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(path_error("create data dir", dir))?;
    set_mode(dir, DATA_DIR_MODE, "chmod 0700 data dir")
}

/// The data dir's lock: an exclusive `flock` on `engine.lock`, released
/// when dropped (or when the process dies). The file holds the pid.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock, or says which dir is in use and by which pid.
    pub(crate) fn take(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(PRIVATE_FILE_MODE)
            .open(&path)
            .map_err(path_error("open lock file", &path))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(path_error("lock", &path)(error));
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(ServerError::DataDirInUse {
                dir: dir.to_path_buf(),
                holder_pid: text.trim().parse().ok(),
            });
        }
        let pid = format!("{}\n", std::process::id());
        let written = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()));
        written.map_err(path_error("write lock file", &path))?;
        Ok(Self { _file: file })
    }
}

/// The token TCP clients must prove: the configured one, else the data
/// dir's token file, created with a fresh random token if absent.
pub(crate) fn token(config: &EngineConfig) -> Result<Vec<u8>> {
    if let Some(token) = config.token()? {
        return Ok(token);
    }
    let path = config.default_token_file();
    if !path.exists() {
        create_token_file(&path)?;
    }
    read_token_file(&path).map_err(|e| ServerError::Config(e.to_string()))
}

fn create_token_file(path: &PathBuf) -> Result<()> {
    let mut secret = [0u8; GENERATED_TOKEN_BYTES];
    rand::thread_rng().fill_bytes(&mut secret);
    let mut text: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
        .map_err(path_error("create token file", path))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(path_error("write token file", path))?;
    // The umask may have taken bits away, never added any; say it exactly.
    set_mode(path, PRIVATE_FILE_MODE, "chmod 0600 token file")?;
    tracing::info!(path = %path.display(), "created the engine's token file");
    Ok(())
}

/// Makes every target's bdev file (uring, pmem on a regular file) 0600.
pub(crate) fn restrict_bdev_files(config: &EngineConfig, targets: usize) -> Result<()> {
    for i in 0..targets {
        let Ok(spec) = ferrite_bdev::spec::BdevSpec::parse(&config.bdev_spec(i)) else {
            continue;
        };
        if spec.backend != "uring" && spec.backend != "pmem" {
            continue;
        }
        let path = Path::new(&spec.target);
        if path.metadata().is_ok_and(|m| m.is_file()) {
            set_mode(path, PRIVATE_FILE_MODE, "chmod 0600 bdev file")?;
        }
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard one (each connection, region
/// and bdev holds descriptors). Failure is logged, not fatal.
pub(crate) fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the plain struct above.
    let raised = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            false
        } else if limit.rlim_cur >= limit.rlim_max {
            true
        } else {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
        }
    };
    if !raised {
        let error = std::io::Error::last_os_error();
        tracing::warn!(%error, "could not raise RLIMIT_NOFILE to its hard limit");
    }
}
