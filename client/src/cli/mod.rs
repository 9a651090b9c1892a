//! Subcommands of the `ferrite` CLI, one module each.

pub mod bdevperf;
pub mod bench;
pub mod io500;
pub mod job;
pub mod kv;
pub mod mount;

/// How a command finds the token a TCP engine asks for (flatten into a
/// command's arguments; see [`ferrite_client::auth::find_token`]).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TokenArgs {
    /// File holding the engine's token (TCP; mode 0600). Default:
    /// $FERRITE_TOKEN, $FERRITE_TOKEN_FILE, then DATA_DIR/engine.token.
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    /// The engine's data dir, where its token file is (TCP; default
    /// /var/lib/ferrite).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
}

impl TokenArgs {
    /// The token for engine `url`: none for a Unix socket (the engine
    /// checks this process's uid instead), else the one found, or an error
    /// that says where it looked.
    pub fn token_for(&self, url: &str) -> anyhow::Result<Option<Vec<u8>>> {
        if url.starts_with("unix://") {
            return Ok(None);
        }
        let (file, dir) = (self.token_file.as_deref(), self.data_dir.as_deref());
        match ferrite_client::auth::find_token(file, dir)? {
            Some(token) => Ok(Some(token)),
            None => anyhow::bail!(
                "engine {url} requires a token and none was found (looked at {})",
                ferrite_client::auth::sources_looked_at(dir)
            ),
        }
    }
}

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
