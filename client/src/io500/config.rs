//! Run settings and the parsers for durations (`30s`, `500ms`) and sizes (`64MiB`).

use std::time::Duration;

use super::Io500Error;

/// ior-easy transfer size (IO500: `-t 2m`).
pub const IOR_EASY_TRANSFER_BYTES: usize = 2 * 1024 * 1024;
/// ior-hard transfer size (IO500: `-t 47008 -b 47008`).
pub const IOR_HARD_TRANSFER_BYTES: usize = 47008;
/// mdtest-hard file size (IO500: `-w 3901 -e 3901`).
pub const MDTEST_HARD_FILE_BYTES: usize = 3901;
/// Files an mdtest task hands the backend at once in every mdtest phase
/// ([`Io500Backend::create_files`](super::Io500Backend::create_files),
/// [`stat_files`](super::Io500Backend::stat_files),
/// [`read_files`](super::Io500Backend::read_files),
/// [`unlink_files`](super::Io500Backend::unlink_files)); a backend may keep
/// their operations in flight together. 256: since the engine appends and commits each
/// target's writes of a batch as one group, bigger groups pay (embedded engine, 8 tasks, 5 s
/// stonewall, two whole runs each, alternating: mdtest-easy-write 634/676 kIOPS against
/// 484/516 with 64, mdtest-hard-write 132/132 against 99/107, mdtest-easy-delete 651/683
/// against 457/503, mdtest-hard-delete 358/369 against 244/270; 128 fell between; 512 was
/// no better than 256). The posix backend runs them one by one whatever the group.
pub const MDTEST_FILES_PER_GROUP: u64 = 256;

// The mdtest-hard files 8 tasks have in flight each take a small slot of the default bulk
// area; the ones without a slot travel inside their frames, which cost the engine a fresh
// megabyte allocation per batch (mdtest-hard-write ~20 % slower with half of them framed).
const _: () = {
    use crate::client::bulk::{BULK_SLOTS_DEFAULT, BULK_SMALL_PER_SLOT, BULK_SMALL_SLOT_BYTES};
    assert!(BULK_SLOTS_DEFAULT * BULK_SMALL_PER_SLOT >= 8 * MDTEST_FILES_PER_GROUP as usize);
    assert!(MDTEST_HARD_FILE_BYTES <= BULK_SMALL_SLOT_BYTES);
};

/// Everything a run needs besides the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Client tasks (threads) per phase.
    pub tasks: usize,
    /// How long each write phase runs before its tasks stop (then wear out to the max count).
    pub stonewall: Duration,
    /// Leave the run directory and the ior files in place afterwards.
    pub keep: bool,
    /// Live progress lines on stderr (a final line per phase is printed either way when set).
    pub progress: bool,
    /// Per-task cap on ior-easy transfers.
    pub ior_easy_max_transfers: u64,
    /// Per-task cap on ior-hard segments (one 47008-byte transfer each).
    pub ior_hard_max_segments: u64,
    /// Per-task cap on mdtest-easy files.
    pub mdtest_easy_max_files: u64,
    /// Per-task cap on mdtest-hard files.
    pub mdtest_hard_max_files: u64,
    /// Seed of the data pattern; a new one per run so stale files never verify.
    pub run_seed: u64,
}

impl Config {
    /// Defaults: the stonewall given, no caps, no progress, clean up.
    pub fn new(tasks: usize, stonewall: Duration) -> Self {
        Self {
            tasks,
            stonewall,
            keep: false,
            progress: false,
            ior_easy_max_transfers: u64::MAX,
            ior_hard_max_segments: u64::MAX,
            mdtest_easy_max_files: u64::MAX,
            mdtest_hard_max_files: u64::MAX,
            run_seed: fresh_seed(),
        }
    }

    /// What validity is judged against ([`super::validity`]).
    pub fn limits(&self) -> super::validity::Limits {
        super::validity::Limits {
            stonewall: self.stonewall,
            tasks: self.tasks,
            ior_easy_max_transfers: self.ior_easy_max_transfers,
            ior_hard_max_segments: self.ior_hard_max_segments,
            mdtest_easy_max_files: self.mdtest_easy_max_files,
            mdtest_hard_max_files: self.mdtest_hard_max_files,
        }
    }

    /// Refuses settings no phase can run with.
    pub fn validate(&self) -> Result<(), Io500Error> {
        if self.tasks == 0 || self.tasks > u32::MAX as usize {
            return Err(Io500Error::Config(format!(
                "--tasks must be between 1 and {}, got {}",
                u32::MAX,
                self.tasks
            )));
        }
        if self.stonewall.is_zero() {
            return Err(Io500Error::Config("--stonewall must be above zero".into()));
        }
        let caps = [
            ("ior-easy transfers", self.ior_easy_max_transfers),
            ("ior-hard segments", self.ior_hard_max_segments),
            ("mdtest-easy files", self.mdtest_easy_max_files),
            ("mdtest-hard files", self.mdtest_hard_max_files),
        ];
        for (what, cap) in caps {
            if cap == 0 {
                return Err(Io500Error::Config(format!(
                    "the cap on {what} must be at least 1"
                )));
            }
        }
        Ok(())
    }
}

/// A seed from the clock and the process id.
fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// Splits `text` into a decimal number and a suffix.
fn split_number(text: &str) -> Option<(f64, &str)> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let number: f64 = text[..end].parse().ok()?;
    Some((number, text[end..].trim()))
}

/// Parses `300s`, `5s`, `500ms`, `2m`, `1.5s` or a bare number of seconds.
///
/// ```
/// use ferrite_client::io500::config::parse_duration;
/// use std::time::Duration;
/// assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert_eq!(parse_duration("300s").unwrap(), Duration::from_secs(300));
/// assert!(parse_duration("5 parsecs").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {text:?}: use e.g. 30s, 500ms, 2m");
    let (number, suffix) = split_number(text).ok_or_else(bad)?;
    let seconds = match suffix {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

/// Parses a byte count: `4096`, `64KiB`, `2MiB`, `1GiB`, `1G`, `10M`, `8k` (binary multiples).
///
/// ```
/// use ferrite_client::io500::config::parse_bytes;
/// assert_eq!(parse_bytes("2MiB").unwrap(), 2 << 20);
/// assert_eq!(parse_bytes("4096").unwrap(), 4096);
/// ```
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let bad = || format!("bad size {text:?}: use e.g. 4096, 64KiB, 2MiB, 1GiB");
    let (number, suffix) = split_number(text).ok_or_else(bad)?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(bad()),
    };
    let bytes = number * (1u64 << shift) as f64;
    if bytes.is_nan() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_accepted_form() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("10 fortnights").is_err());
    }

    #[test]
    fn sizes_in_every_accepted_form() {
        assert_eq!(parse_bytes("64KiB").unwrap(), 64 * 1024);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("0.5MiB").unwrap(), 512 * 1024);
        assert!(parse_bytes("12 apples").is_err());
    }

    #[test]
    fn validate_refuses_zero_tasks_stonewall_and_caps() {
        let ok = Config::new(2, Duration::from_secs(1));
        assert!(ok.validate().is_ok());
        assert!(Config::new(0, Duration::from_secs(1)).validate().is_err());
        assert!(Config::new(1, Duration::ZERO).validate().is_err());
        let mut capped = ok.clone();
        capped.mdtest_hard_max_files = 0;
        assert!(capped.validate().is_err());
    }
}
