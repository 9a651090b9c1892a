//! Start-up checks: the core list, io_uring, and locked memory. Each failure
//! is a clear [`Error`] naming what to change.

use crate::error::{Error, Result};

/// Registers the process for private expedited `membarrier(2)` once, before
/// any xstream starts. glommio registers lazily, at an executor's first
/// attempt to sleep, and in a process with several threads the kernel waits
/// for an RCU grace period there (5 to 20 ms measured): an xstream that is
/// told of new work in that window answers it only then. Registering twice
/// is cheap; a kernel without the command leaves glommio its fallback.
pub(crate) fn register_membarrier() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        // SAFETY: membarrier takes two integers and touches no memory.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0 as libc::c_long,
            )
        };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            tracing::debug!(%error, "membarrier registration refused");
        }
    });
}

/// Smallest io_uring buffer memory an xstream is started with.
pub const IO_MEMORY_BYTES_MIN: usize = 1 << 20;
/// Locked memory the rings of one xstream take besides `io_memory` (three
/// rings of glommio's default depth, rounded up generously).
pub const RING_OVERHEAD_BYTES: usize = 256 << 10;

/// Cores this process may run on (the calling thread's affinity mask),
/// ascending.
pub fn allowed_cores() -> Result<Vec<usize>> {
    affinity_of(0)
}

/// Cores the process's main thread may run on, ascending: what the
/// process may use, however a calling thread has pinned itself.
pub fn process_cores() -> Result<Vec<usize>> {
    // SAFETY: no arguments.
    affinity_of(unsafe { libc::getpid() })
}

/// The affinity mask of thread `tid` (0: the calling thread), ascending.
fn affinity_of(tid: libc::pid_t) -> Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size and pointer describe `set`.
    let rc =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let reason = format!("sched_getaffinity: {}", std::io::Error::last_os_error());
        return Err(Error::InvalidCoreList {
            cores: Vec::new(),
            reason,
        });
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads `set` within bounds for every core < max.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Checks a core list against the allowed cores: not empty, no repeats,
/// every core allowed. `None` means every allowed core.
pub fn resolve_cores(requested: Option<&[usize]>) -> Result<Vec<usize>> {
    let allowed = allowed_cores()?;
    match requested {
        None => Ok(allowed),
        Some(cores) => validate_cores(cores, &allowed).map(|()| cores.to_vec()),
    }
}

fn validate_cores(cores: &[usize], allowed: &[usize]) -> Result<()> {
    let invalid = |reason: String| {
        Err(Error::InvalidCoreList {
            cores: cores.to_vec(),
            reason,
        })
    };
    if cores.is_empty() {
        return invalid("the list is empty".into());
    }
    for (i, core) in cores.iter().enumerate() {
        if cores[..i].contains(core) {
            return invalid(format!("core {core} appears twice"));
        }
        if !allowed.contains(core) {
            return invalid(format!(
                "core {core} is not online or not allowed; allowed: {allowed:?}"
            ));
        }
    }
    Ok(())
}

/// Creates and closes a tiny io_uring to learn whether the kernel allows it.
pub fn check_io_uring() -> Result<()> {
    // io_uring_params is 120 bytes of plain integers; the kernel fills it.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(entries, params) writes at most 120 bytes to
    // `params`; we own the returned fd and close it below.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        let reason = match err.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no io_uring (ENOSYS)".to_string(),
            Some(libc::EPERM) => "io_uring is disabled for this process (EPERM)".to_string(),
            _ => format!("io_uring_setup failed: {err}"),
        };
        return Err(Error::IoUringUnavailable { reason });
    }
    // SAFETY: `fd` is a descriptor we just created and nobody else holds.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

/// io_memory per xstream that fits the current RLIMIT_MEMLOCK.
pub fn io_memory_for_limit(requested: usize, xstreams: usize) -> Result<usize> {
    // SAFETY: geteuid has no preconditions.
    let privileged = unsafe { libc::geteuid() } == 0;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for getrlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    let limit_bytes = if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(limit.rlim_cur)
    };
    fit_io_memory(requested, xstreams, limit_bytes, privileged)
}

/// The sizing rule behind [`io_memory_for_limit`]: privileged processes and
/// unlimited limits get what they asked for; otherwise each xstream gets an
/// equal part of the limit after ring overhead, at most `requested`, and at
/// least [`IO_MEMORY_BYTES_MIN`] or an error.
pub fn fit_io_memory(
    requested: usize,
    xstreams: usize,
    limit_bytes: Option<u64>,
    privileged: bool,
) -> Result<usize> {
    let Some(limit) = limit_bytes.filter(|_| !privileged) else {
        return Ok(requested);
    };
    let xstreams = xstreams.max(1);
    let overhead = (RING_OVERHEAD_BYTES * xstreams) as u64;
    let per_xstream = (limit.saturating_sub(overhead) / xstreams as u64) as usize & !4095;
    let wanted = requested.min(per_xstream);
    if wanted < IO_MEMORY_BYTES_MIN.min(requested) {
        let needed = (IO_MEMORY_BYTES_MIN.min(requested) + RING_OVERHEAD_BYTES) * xstreams;
        return Err(Error::MemlockTooLow {
            limit_bytes: limit,
            needed_bytes: needed as u64,
            xstreams,
        });
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_rules() {
        let allowed = [0, 1, 2];
        assert!(validate_cores(&[0, 2], &allowed).is_ok());
        let msg = validate_cores(&[], &allowed).unwrap_err().to_string();
        assert!(msg.contains("empty"), "{msg}");
        let msg = validate_cores(&[1, 1], &allowed).unwrap_err().to_string();
        assert!(msg.contains("core 1 appears twice"), "{msg}");
        let msg = validate_cores(&[7], &allowed).unwrap_err().to_string();
        assert!(msg.contains("core 7 is not online"), "{msg}");
    }

    #[test]
    fn resolve_rejects_a_core_beyond_the_machine() {
        let err = resolve_cores(Some(&[100_000])).unwrap_err();
        assert!(matches!(err, Error::InvalidCoreList { .. }), "{err}");
        let all = resolve_cores(None).unwrap();
        assert!(!all.is_empty());
    }

    #[test]
    fn memlock_sizing() {
        let ten = 10 << 20;
        assert_eq!(fit_io_memory(ten, 4, Some(1 << 20), true).unwrap(), ten);
        assert_eq!(fit_io_memory(ten, 4, None, false).unwrap(), ten);
        let got = fit_io_memory(ten, 2, Some(8 << 20), false).unwrap();
        assert!(got < ten && got >= IO_MEMORY_BYTES_MIN, "{got}");
        assert!(2 * (got + RING_OVERHEAD_BYTES) <= 8 << 20);
        let err = fit_io_memory(ten, 8, Some(64 << 10), false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("ulimit -l"), "{msg}");
        assert!(matches!(err, Error::MemlockTooLow { xstreams: 8, .. }));
    }

    #[test]
    fn io_uring_is_available_here() {
        // The engine cannot run without it; this machine class has it.
        check_io_uring().unwrap();
    }
}
