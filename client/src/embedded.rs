//! Embedded mode: an engine started inside this process on a temporary
//! directory, reached over its Unix socket (so GETs are one-sided over
//! shm). What `ferrite` uses when no `--engine` is given. The engine
//! generates its token in the temp dir; the client is handed it directly
//! (needed only if the engine is reached over TCP).
//!
//! ```no_run
//! use ferrite_client::client::Key;
//! let client = ferrite_client::embedded::connect().unwrap();
//! client.put(&Key::new(0, 0, b"k", b""), b"v").unwrap();
//! ```

use std::path::PathBuf;

use ferrite_engine::config::EngineConfig;
use ferrite_engine::{Engine, EngineHandle};

use crate::client::{Client, ClientOptions, Error, Result};

/// The engine behind an embedded client; shut down when the client drops.
struct Embedded {
    handle: Option<EngineHandle>,
    _dir: tempfile::TempDir,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            if let Err(e) = h.shutdown() {
                tracing::warn!("embedded engine shutdown: {e}");
            }
        }
    }
}

/// Starts a small single-target engine on a temp dir and connects to it.
pub fn connect() -> Result<Client> {
    connect_with(ClientOptions::default(), |_| {})
}

/// Same, with client options and a hook to adjust the engine config (ring
/// and bucket sizes, xstreams...).
pub fn connect_with(opts: ClientOptions, adjust: impl FnOnce(&mut EngineConfig)) -> Result<Client> {
    let dir = tempfile::Builder::new()
        .prefix("ferrite-embedded-")
        .tempdir()
        .map_err(|e| Error::Embedded(format!("temp dir: {e}")))?;
    let mut config = EngineConfig::for_temp_dir(dir.path());
    config.listen.unix = dir
        .path()
        .join("engine.sock")
        .to_string_lossy()
        .into_owned();
    if !config.fabric.providers.iter().any(|p| p == "shm") {
        config.fabric.providers.push("shm".into());
    }
    adjust(&mut config);
    let handle = Engine::start(config).map_err(|e| Error::Embedded(e.to_string()))?;
    let url = match handle.unix_path() {
        Some(p) => format!("unix://{}", PathBuf::from(p).display()),
        None => handle
            .urls()
            .into_iter()
            .next()
            .ok_or_else(|| Error::Embedded("engine listens nowhere".into()))?,
    };
    let opts = ClientOptions {
        token: opts.token.or_else(|| Some(handle.token().to_vec())),
        ..opts
    };
    let mut client = Client::connect_with(&url, opts)?;
    client._owner = Some(Box::new(std::sync::Mutex::new(Embedded {
        handle: Some(handle),
        _dir: dir,
    })));
    Ok(client)
}
