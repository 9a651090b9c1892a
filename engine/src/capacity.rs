//! `size=auto` in a file bdev spec: the size a new bdev file gets from the
//! free space of the file system it is created on. Files are sparse, so
//! the size is what the store may grow to, not what it takes at once:
//! each target gets [`FREE_SHARE`] of the free space, divided among the
//! targets, at least [`AUTO_SIZE_FLOOR`] and at most [`AUTO_SIZE_CAP`],
//! rounded down to a MiB. A file that already exists keeps its size (the
//! store's layout was fixed when it was formatted): with several targets,
//! the largest existing file's. A file system that later runs short of the
//! space promised refuses writes with "no space" (`store/nospace.rs`).
//!
//! ```
//! use ferrite_engine::capacity::auto_size;
//! const GIB: u64 = 1 << 30;
//! // 74 GB free, 2 targets: a quarter each.
//! assert_eq!(auto_size(74 * GIB, 2), 74 * GIB / 4);
//! // Little free space: the floor.
//! assert_eq!(auto_size(GIB, 2), GIB);
//! ```

use std::path::Path;

/// The share of the free space the targets' files may grow to together.
pub const FREE_SHARE: (u64, u64) = (1, 2);
/// The smallest `size=auto` gives a target.
pub const AUTO_SIZE_FLOOR: u64 = 1 << 30;
/// The largest `size=auto` gives a target.
pub const AUTO_SIZE_CAP: u64 = 1 << 40;

/// The size of each of `targets` new files on a file system with `free`
/// bytes free (see the module docs).
pub fn auto_size(free: u64, targets: usize) -> u64 {
    let share = free / FREE_SHARE.1 * FREE_SHARE.0 / targets.max(1) as u64;
    let size = share.clamp(AUTO_SIZE_FLOOR, AUTO_SIZE_CAP);
    size - size % (1 << 20)
}

/// Bytes free to an unprivileged writer on the file system of `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` points to writable memory
    // of the size statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `spec` with `size=auto` replaced by a size in bytes for one of
/// `targets` files at the paths `paths` (unchanged without `size=auto`).
pub fn resolve(spec: &str, paths: &[&Path]) -> std::io::Result<String> {
    if !spec.contains("size=auto") {
        return Ok(spec.to_string());
    }
    let existing = paths
        .iter()
        .filter_map(|p| p.metadata().ok().filter(|m| m.is_file()))
        .map(|m| m.len())
        .max();
    let size = match existing {
        Some(len) => len,
        None => {
            let dir = paths
                .first()
                .and_then(|p| p.parent())
                .unwrap_or(Path::new("."));
            auto_size(free_bytes(dir)?, paths.len())
        }
    };
    Ok(spec.replace("size=auto", &format!("size={size}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_share_is_clamped_and_whole_mebibytes() {
        assert_eq!(auto_size(0, 1), AUTO_SIZE_FLOOR);
        assert_eq!(auto_size(1 << 50, 1), AUTO_SIZE_CAP);
        assert_eq!(auto_size(10 * GIB + 12345, 1) % (1 << 20), 0);
        assert_eq!(auto_size(40 * GIB, 4), 5 * GIB);
    }

    #[test]
    fn an_existing_file_keeps_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("target-0.bdev");
        let b = dir.path().join("target-1.bdev");
        let spec = "uring:X?size=auto&direct=1";
        let fresh = resolve(spec, &[&a, &b]).unwrap();
        assert!(
            fresh.starts_with("uring:X?size=") && fresh.ends_with("&direct=1"),
            "{fresh}"
        );
        let n: u64 = fresh["uring:X?size=".len()..fresh.len() - "&direct=1".len()]
            .parse()
            .unwrap();
        assert!(n >= AUTO_SIZE_FLOOR, "{n}");
        std::fs::File::create(&a).unwrap().set_len(3 << 20).unwrap();
        assert_eq!(
            resolve(spec, &[&a, &b]).unwrap(),
            "uring:X?size=3145728&direct=1"
        );
        assert_eq!(resolve("malloc:8M", &[&a]).unwrap(), "malloc:8M");
    }
}
