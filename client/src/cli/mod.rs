//! Subcommands of the `ferrite` CLI, one module each.

pub mod bdevperf;
pub mod bench;
pub mod io500;
pub mod job;
pub mod kv;
pub mod mount;

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings, but none of
/// fuser's unmount: after `ferrite umount` its own second unmount fails with
/// EINVAL and logs an error; `ferrite mount` checks the mount itself).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser::mnt=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
