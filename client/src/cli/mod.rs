//! Subcommands of the `ferrite` CLI, one module each.

pub mod bdevperf;
pub mod bench;
pub mod io500;
pub mod job;
pub mod kv;
pub mod mount;

/// Set once `ferrite mount` starts unmounting.
static UNMOUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings, but none of
/// fuser's unmount: after `ferrite umount` its own second unmount fails with
/// EINVAL and logs an error; `ferrite mount` checks the mount itself). Once
/// [`unmounting`], fuser's failures to reply are not logged either.
pub fn init_tracing() {
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser::mnt=off"));
    let replies_matter = tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.target() == "fuser::reply" && UNMOUNTING.load(std::sync::atomic::Ordering::Relaxed))
    });
    let layer = (tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with_filter(env.and(replies_matter));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// `ferrite mount` is unmounting: the kernel drops the requests still in
/// flight (a file's release is sent after its `close` returned), and
/// fuser's replies to them fail with ENOENT, which it logs as errors.
pub fn unmounting() {
    UNMOUNTING.store(true, std::sync::atomic::Ordering::Relaxed);
}
