//! Engine configuration: `engine.toml`, command-line overrides, defaults.
//!
//! ```toml
//! data_dir = "/var/lib/ferrite"          # `{dir}` in the templates below
//! xstreams = 2                            # one target per xstream; default: every allowed core
//! # cores = [2, 3]                        # pin to exactly these cores instead
//! spin_us = 100                          # an idle xstream polls this long before it sleeps (0: at once)
//! bdev = "uring:{dir}/target-{i}.bdev?size=auto" # `{i}` = target index; auto: half the
//!                                       # free space shared by the targets, 1 GiB-1 TiB each,
//!                                       # sparse; an existing file keeps its size (capacity.rs)
//! durability = "device"                  # ack after flush; "process": ack once written,
//! flush_interval_ms = 1000                # flushed this often (process mode only)
//!
//! [listen]
//! tcp = "127.0.0.1:7600"                  # "" disables TCP; every TCP client proves the token
//! unix = "{dir}/engine.sock"              # "" disables the Unix socket (mode 0660)
//! # token = "..."  or  token_file = "/etc/ferrite/token"   # default: {dir}/engine.token,
//! #                                       # created (32 random bytes, hex, 0600) on first start
//! # allow_uids = [1000]                   # Unix socket peers admitted besides the engine's uid and root
//! # allow_gids = [100]                    # ... and peers whose primary gid is one of these
//!
//! [fabric]
//! providers = ["shm", "tcp"]
//!
//! [cache]
//! ring_bytes = "64M"                      # record log ring per target (memory)
//! buckets = 262144                        # main-area buckets per target (any count ≥ 4)
//! overflow_buckets = 65536
//! hugetlb = false
//! populate = false                        # fault the regions in writable at start (resident)
//! hot_value_max = "4K"                    # keep live values up to this size in the ring (0: off)
//!
//! [limits]
//! max_frame_bytes = "8M"
//! max_inflight_per_connection = 256
//! max_connections = 4096
//! idle_timeout_s = 0                      # close a logged-in connection silent this long (0: never)
//!
//! [jobs]
//! task_slots = 0                          # execution streams the engine offers to jobs
//! exec = true                             # false refuses jobs with exec steps (--no-exec)
//! ```
//!
//! ```
//! let config = ferrite_engine::config::EngineConfig::from_toml_str(
//!     "data_dir = \"/d\"\nxstreams = 1\n[listen]\ntcp = \"127.0.0.1:0\"\n",
//! ).unwrap();
//! assert_eq!(config.bdev_spec(0), "uring:/d/target-0.bdev?size=auto");
//! assert_eq!(config.unix_path().unwrap(), std::path::PathBuf::from("/d/engine.sock"));
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ferrite_proto::rpc::handshake::{check_token, read_token_file, TokenError, TOKEN_FILE_NAME};
use serde::Deserialize;

use crate::server::ServerError;
use crate::store::Durability;

/// Default of [`EngineConfig::spin_us`]: about one request's round trip
/// on a loaded client, so a client that pipelines finds its xstream awake.
pub const DEFAULT_SPIN_US: u64 = 100;
/// Largest [`EngineConfig::spin_us`] accepted (10 ms).
pub const SPIN_US_MAX: u64 = 10_000;

/// Everything an engine needs to start. Build it in code, or read
/// `engine.toml` with [`EngineConfig::from_toml_str`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Directory substituted for `{dir}` in `bdev` and `listen.unix`.
    pub data_dir: PathBuf,
    /// Number of xstreams (= targets), on the first allowed cores.
    pub xstreams: Option<usize>,
    /// Exact cores, one xstream each; overrides `xstreams`.
    pub cores: Option<Vec<usize>>,
    /// How long an xstream with nothing to run keeps polling for work
    /// before it sleeps in the kernel, in microseconds. A request that
    /// finds its xstream polling skips the wake-up (a context switch, and
    /// on a virtual machine an exit) it would otherwise wait for; an idle
    /// engine still sleeps after this long. 0 sleeps at once.
    pub spin_us: u64,
    /// Bdev spec template: `{dir}` and `{i}` (target index) are substituted.
    pub bdev: String,
    /// When updates are acknowledged: `device` (after the device flush;
    /// survives power loss) or `process` (once written; survives the engine
    /// being killed, flushed every `flush_interval_ms`).
    pub durability: Durability,
    /// Background flush period under `durability = "process"`.
    pub flush_interval_ms: u64,
    pub listen: ListenConfig,
    pub fabric: FabricConfig,
    pub cache: CacheConfig,
    pub limits: LimitsConfig,
    pub jobs: JobsConfig,
}

/// The engine's part in DAG jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Execution streams this engine offers the resource manager, next to
    /// those of `ferrite worker` processes: stream `x` runs its granted
    /// tasks on xstream `x mod xstreams`, in the background task class
    /// (storage steps straight on the targets, `exec` steps waited for by
    /// a thread of their own). 0, the default, leaves tasks to
    /// workers, so job tasks never compete with client I/O unless asked.
    pub task_slots: u32,
    /// Whether jobs may have `exec` steps (commands run as the engine's
    /// user, for submitters holding the token). `false`: a job with one is
    /// refused at submit.
    pub exec: bool,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            task_slots: 0,
            exec: true,
        }
    }
}

/// Where to listen.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// TCP address; empty disables TCP. Port 0 picks a free port.
    pub tcp: String,
    /// Unix socket path (template with `{dir}`); empty disables it.
    pub unix: String,
    /// Shared secret; TCP clients must prove they hold it. Empty is refused.
    pub token: Option<String>,
    /// File holding the shared secret (trailing whitespace ignored); refused
    /// when group or others may read it. Without `token` and `token_file`
    /// the engine uses `{dir}/engine.token`, creating it on first start.
    pub token_file: Option<PathBuf>,
    /// Uids admitted on the Unix socket (checked with `SO_PEERCRED` at
    /// accept) besides the engine's own uid and root.
    pub allow_uids: Vec<u32>,
    /// Peers whose gid (the primary gid `SO_PEERCRED` reports) is one of
    /// these are admitted on the Unix socket too.
    pub allow_gids: Vec<u32>,
}

/// Which one-sided read providers to export regions with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FabricConfig {
    /// Any of "shm", "tcp".
    pub providers: Vec<String>,
}

/// Memory per target.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub ring_bytes: Size,
    pub buckets: u64,
    pub overflow_buckets: u32,
    pub hugetlb: bool,
    /// Fault the ring and bucket regions in, writable, when a target
    /// opens: appends never stop on a page fault, and the memory is
    /// resident from the start (as a registered region is anyway).
    pub populate: bool,
    /// Live records whose value is at most this big are copied forward
    /// before the ring overwrites them, so clients keep reading them
    /// one-sided (0: off). Bounded to a quarter of the ring's traffic.
    pub hot_value_max: Size,
}

/// Per-connection limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_frame_bytes: Size,
    pub max_inflight_per_connection: usize,
    /// Connections served at once; more are refused with an error frame.
    pub max_connections: usize,
    /// A logged-in connection that sends nothing for this many seconds,
    /// with no request of its own running, is closed (one Error frame,
    /// code 9). 0: never. Off by default: the client library does not
    /// reconnect, so an idle client (a FUSE mount) would lose its
    /// connections for good.
    pub idle_timeout_s: u64,
}

/// A byte count written as an integer or as "64K", "8M", "1G".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeText")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Number(u64),
    Text(String),
}

impl TryFrom<SizeText> for Size {
    type Error = String;
    fn try_from(v: SizeText) -> Result<Self, String> {
        match v {
            SizeText::Number(n) => Ok(Size(n)),
            SizeText::Text(s) => ferrite_bdev::spec::parse_size(&s)
                .map(Size)
                .ok_or_else(|| format!("{s:?} is not a size (like 4096, 64K, 8M, 1G)")),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("."),
            xstreams: None,
            cores: None,
            spin_us: DEFAULT_SPIN_US,
            bdev: "uring:{dir}/target-{i}.bdev?size=auto".into(),
            durability: Durability::Device,
            flush_interval_ms: 1000,
            listen: ListenConfig::default(),
            fabric: FabricConfig::default(),
            cache: CacheConfig::default(),
            limits: LimitsConfig::default(),
            jobs: JobsConfig::default(),
        }
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            tcp: "127.0.0.1:7600".into(),
            unix: "{dir}/engine.sock".into(),
            token: None,
            token_file: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
        }
    }
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            providers: vec!["shm".into(), "tcp".into()],
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            ring_bytes: Size(64 << 20),
            buckets: 1 << 18,
            overflow_buckets: 1 << 16,
            hugetlb: false,
            populate: false,
            hot_value_max: Size(4 << 10),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: Size(ferrite_proto::rpc::BODY_BYTES_MAX as u64),
            max_inflight_per_connection: 256,
            max_connections: 4096,
            idle_timeout_s: 0,
        }
    }
}

impl EngineConfig {
    /// Parses `engine.toml` text; unknown keys are refused.
    pub fn from_toml_str(text: &str) -> Result<Self, ServerError> {
        toml::from_str(text).map_err(|e| ServerError::Config(e.to_string()))
    }

    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> Result<Self, ServerError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServerError::Config(format!("{}: {e}", path.display())))?;
        Self::from_toml_str(&text)
    }

    /// A small single-target engine in `dir`, listening on a free loopback
    /// port and on `dir/engine.sock`: what an embedded client starts.
    pub fn for_temp_dir(dir: &Path) -> Self {
        Self {
            data_dir: dir.to_path_buf(),
            xstreams: Some(1),
            bdev: "uring:{dir}/target-{i}.bdev?size=256M".into(),
            listen: ListenConfig {
                tcp: "127.0.0.1:0".into(),
                ..ListenConfig::default()
            },
            cache: CacheConfig {
                ring_bytes: Size(16 << 20),
                buckets: 1 << 16,
                overflow_buckets: 1 << 14,
                hugetlb: false,
                populate: false,
                hot_value_max: Size(4 << 10),
            },
            ..Self::default()
        }
    }

    fn expand(&self, template: &str) -> String {
        template.replace("{dir}", &self.data_dir.to_string_lossy())
    }

    /// Replaces `size=auto` in the bdev spec with the size of `targets`
    /// files ([`crate::capacity`]); other specs are left as they are.
    pub fn resolve_auto_size(&mut self, targets: usize) -> Result<(), String> {
        let specs: Vec<_> = (0..targets).map(|i| self.bdev_spec(i)).collect();
        let paths: Vec<&std::path::Path> = specs
            .iter()
            .filter_map(|s| s.split_once(':'))
            .filter(|(backend, _)| matches!(*backend, "uring" | "pmem"))
            .map(|(_, rest)| std::path::Path::new(rest.split('?').next().unwrap_or(rest)))
            .collect();
        if paths.is_empty() {
            return Ok(());
        }
        self.bdev = crate::capacity::resolve(&self.bdev, &paths)
            .map_err(|e| format!("bdev size=auto: free space of the data dir: {e}"))?;
        Ok(())
    }

    /// The bdev spec of target `i`.
    pub fn bdev_spec(&self, i: usize) -> String {
        self.expand(&self.bdev).replace("{i}", &i.to_string())
    }

    /// The Unix socket path, if enabled.
    pub fn unix_path(&self) -> Option<PathBuf> {
        (!self.listen.unix.is_empty()).then(|| PathBuf::from(self.expand(&self.listen.unix)))
    }

    /// The TCP address, if enabled.
    pub fn tcp_addr(&self) -> Result<Option<SocketAddr>, ServerError> {
        if self.listen.tcp.is_empty() {
            return Ok(None);
        }
        let addr =
            self.listen.tcp.parse().map_err(|e| {
                ServerError::Config(format!("listen.tcp {:?}: {e}", self.listen.tcp))
            })?;
        Ok(Some(addr))
    }

    /// The configured shared secret, from `token` or `token_file` (None:
    /// the engine uses [`EngineConfig::default_token_file`]). An empty token
    /// and a token file readable by group or others are refused.
    pub fn token(&self) -> Result<Option<Vec<u8>>, ServerError> {
        if let Some(t) = &self.listen.token {
            check_token(t.as_bytes(), "listen.token").map_err(token_error)?;
            return Ok(Some(t.as_bytes().to_vec()));
        }
        let Some(path) = &self.listen.token_file else {
            return Ok(None);
        };
        read_token_file(path).map(Some).map_err(token_error)
    }

    /// The token file used when neither `token` nor `token_file` is set.
    pub fn default_token_file(&self) -> PathBuf {
        self.data_dir.join(TOKEN_FILE_NAME)
    }

    /// The cores to run on, one xstream (and one target) each.
    pub fn resolve_cores(&self) -> Result<Vec<usize>, ServerError> {
        let xs = |e: ferrite_xstream::Error| ServerError::Config(e.to_string());
        if let Some(cores) = &self.cores {
            return ferrite_xstream::resolve_cores(Some(cores)).map_err(xs);
        }
        let allowed = ferrite_xstream::allowed_cores().map_err(xs)?;
        match self.xstreams {
            None => Ok(allowed),
            Some(0) => Err(ServerError::Config("xstreams must be at least 1".into())),
            Some(n) if n > allowed.len() => Err(ServerError::Config(format!(
                "xstreams {n}: only {} cores are allowed ({allowed:?}); one xstream per core",
                allowed.len()
            ))),
            Some(n) => Ok(allowed[..n].to_vec()),
        }
    }

    /// Checks what can be checked before starting anything.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: String| Err(ServerError::Config(m));
        for p in &self.fabric.providers {
            #[cfg(feature = "rdma")]
            if let Some(spec) = crate::fabric::verbs::VerbsSpec::parse(p) {
                spec.map_err(ServerError::Config)?;
                continue;
            }
            if p != "shm" && p != "tcp" {
                return bad(format!(
                    "fabric provider {p:?}: expected \"shm\" or \"tcp\""
                ));
            }
        }
        if self.spin_us > SPIN_US_MAX {
            return bad(format!(
                "spin_us {}: at most {SPIN_US_MAX} (an idle xstream polls this long before it sleeps)",
                self.spin_us
            ));
        }
        if !(4..=crate::store::MAIN_BUCKETS_MAX).contains(&self.cache.buckets) {
            return bad(format!(
                "cache.buckets {} is not between 4 and {}",
                self.cache.buckets,
                crate::store::MAIN_BUCKETS_MAX
            ));
        }
        let frame = self.limits.max_frame_bytes.0;
        if frame < 4096 || frame > ferrite_proto::rpc::BODY_BYTES_MAX as u64 {
            return bad(format!(
                "limits.max_frame_bytes {frame}: must be in 4K..=8M"
            ));
        }
        if self.limits.max_connections == 0 {
            return bad("limits.max_connections must be positive".into());
        }
        if self.limits.max_inflight_per_connection == 0 {
            return bad("limits.max_inflight_per_connection must be positive".into());
        }
        self.tcp_addr()?;
        self.token()?;
        if self.unix_path().is_none() && self.tcp_addr()?.is_none() {
            return bad("no listener: set listen.tcp or listen.unix".into());
        }
        Ok(())
    }

    pub(crate) fn has_provider(&self, name: &str) -> bool {
        self.fabric.providers.iter().any(|p| p == name)
    }
}

fn token_error(e: TokenError) -> ServerError {
    ServerError::Config(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = EngineConfig::from_toml_str(
            r#"
            data_dir = "/data"
            cores = [0]
            spin_us = 0
            bdev = "malloc:64M"
            durability = "process"
            flush_interval_ms = 250
            [listen]
            tcp = "0.0.0.0:7600"
            unix = ""
            token = "s3cret"
            [fabric]
            providers = ["tcp"]
            [cache]
            ring_bytes = "8M"
            buckets = 1024
            [limits]
            max_frame_bytes = 65536
            idle_timeout_s = 30
            "#,
        )
        .unwrap();
        assert_eq!(c.cache.ring_bytes, Size(8 << 20));
        assert_eq!(c.limits.idle_timeout_s, 30);
        assert_eq!(EngineConfig::default().limits.idle_timeout_s, 0);
        assert_eq!(c.durability, Durability::Process);
        assert_eq!(c.flush_interval_ms, 250);
        assert_eq!(c.spin_us, 0);
        assert_eq!(EngineConfig::default().spin_us, DEFAULT_SPIN_US);
        assert_eq!(c.unix_path(), None);
        assert_eq!(c.token().unwrap(), Some(b"s3cret".to_vec()));
        assert!(!c.has_provider("shm"));
        c.validate().unwrap();
    }

    #[test]
    fn jobs_exec_is_on_by_default_and_can_be_turned_off() {
        // Guards the [jobs] exec key: absent means on, `false` turns it off.
        assert!(EngineConfig::default().jobs.exec);
        let off = EngineConfig::from_toml_str("[jobs]\nexec = false\n").unwrap();
        assert!(!off.jobs.exec);
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(EngineConfig::from_toml_str("nonsense = 1").is_err());
        let e = EngineConfig::from_toml_str("durability = \"sometimes\"").unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
        assert!(EngineConfig::from_toml_str("[cache]\nring_bytes = \"8Q\"").is_err());
        let empty = EngineConfig::from_toml_str("[listen]\ntoken = \"\"").unwrap();
        let e = empty.validate().unwrap_err().to_string();
        assert!(e.contains("listen.token") && e.contains("empty"), "{e}");
        let uids = EngineConfig::from_toml_str("[listen]\nallow_uids = [7]\nallow_gids = [8]");
        assert_eq!(uids.unwrap().listen.allow_gids, vec![8]);
        let spin = EngineConfig::from_toml_str("spin_us = 50000").unwrap();
        assert!(spin.validate().unwrap_err().to_string().contains("spin_us"));
        let tiny = EngineConfig::from_toml_str("[cache]\nbuckets = 2").unwrap();
        assert!(tiny.validate().is_err());
        let odd = EngineConfig::from_toml_str("[cache]\nbuckets = 1000").unwrap();
        assert!(odd.validate().is_ok(), "any main bucket count from 4");
        let none = EngineConfig::from_toml_str("[listen]\ntcp = \"\"\nunix = \"\"").unwrap();
        assert!(none.validate().is_err());
        let provider = EngineConfig::from_toml_str("[fabric]\nproviders = [\"ib\"]").unwrap();
        assert!(provider.validate().is_err());
        let many = EngineConfig::from_toml_str("xstreams = 100000").unwrap();
        assert!(many.resolve_cores().is_err(), "more xstreams than cores");
        let zero = EngineConfig::from_toml_str("xstreams = 0").unwrap();
        assert!(zero.resolve_cores().is_err());
    }
}
