//! The engine server: xstreams with one target each, the fabric, and the RPC
//! listeners.
//!
//! [`Engine::start`] opens (or recovers) every target's store on its
//! xstream, registers the stores' regions with the enabled providers, and
//! listens on TCP and the Unix socket. Requests are routed to the target
//! owning the key's dkey. [`EngineHandle::shutdown`] stops listening, makes
//! everything durable, checkpoints each store and stops the xstreams; a
//! later start on the same bdevs recovers.
//!
//! ```no_run
//! use ferrite_engine::config::EngineConfig;
//! use ferrite_engine::Engine;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::start(EngineConfig::for_temp_dir(dir.path())).unwrap();
//! println!("listening on {:?}", engine.urls());
//! engine.shutdown().unwrap();
//! ```

mod budget;
mod bulk;
mod conn;
mod datadir;
mod error;
mod handshake;
mod listen;
mod route;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferrite_proto::region::RegionDescriptor;
use ferrite_proto::rpc::TargetInfo;
use ferrite_xstream::{Mesh, TaskClass, XstreamConfig, XstreamId, XstreamSet};
use futures::channel::oneshot;
use futures::executor::block_on;

pub use bulk::recvmsg_fds;
pub(crate) use bulk::BulkSlice;
pub use datadir::LOCK_FILE_NAME;
pub use error::{Result, ServerError};

use crate::config::EngineConfig;
use crate::fabric::{Fabric, ShmFabric, TcpFabric};
use crate::store::{StoreConfig, StoreRegions};
use crate::target;

/// What every connection of the engine shares (read-only after start).
pub(crate) struct Shared {
    pub(crate) mesh: Mesh,
    pub(crate) targets: Vec<TargetInfo>,
    /// Per target: set once a write failed on the device (the store is
    /// poisoned and read-only until restarted); reported in Welcomes.
    pub(crate) read_only: Vec<AtomicBool>,
    pub(crate) shm: Option<ShmFabric>,
    pub(crate) tcp: Option<TcpFabric>,
    /// The token every TCP client must prove (never empty).
    pub(crate) token: Vec<u8>,
    /// Who the Unix socket admits ([`listen::PeerPolicy`]).
    pub(crate) peers: listen::PeerPolicy,
    pub(crate) incarnation: u64,
    pub(crate) max_frame_bytes: usize,
    pub(crate) max_inflight: usize,
    /// A logged-in connection silent this long, with nothing of its own
    /// running, is closed (`[limits] idle_timeout_s`; `None`: never).
    pub(crate) idle_timeout: Option<std::time::Duration>,
    pub(crate) next_xstream: AtomicUsize,
    pub(crate) connections: AtomicUsize,
    pub(crate) max_connections: usize,
}

impl Shared {
    pub(crate) fn target_count(&self) -> u32 {
        self.targets.len() as u32
    }
    /// The target map with each target's current state.
    pub(crate) fn target_map(&self) -> Vec<TargetInfo> {
        let state = |i: usize| u8::from(self.read_only[i].load(Ordering::Relaxed));
        (self.targets.iter().enumerate())
            .map(|(i, t)| TargetInfo {
                state: state(i),
                ..*t
            })
            .collect()
    }
    pub(crate) fn tcp_descriptors(&self) -> Vec<RegionDescriptor> {
        self.tcp
            .as_ref()
            .map(|f| f.descriptors())
            .unwrap_or_default()
    }
}

/// Starts engines.
#[derive(Debug)]
pub struct Engine;

/// A running engine. Dropping it shuts it down (errors are then only logged).
pub struct EngineHandle {
    set: Option<XstreamSet>,
    shared: Arc<Shared>,
    tcp: Option<SocketAddr>,
    unix: Option<PathBuf>,
    stops: Vec<oneshot::Sender<()>>,
    unix_acceptor: Option<listen::UnixAcceptor>,
    /// Held for the engine's life: no second engine opens the data dir.
    _dir_lock: datadir::DirLock,
    /// The verbs provider and its side channel (feature `rdma`).
    #[cfg(feature = "rdma")]
    #[allow(dead_code)] // held for its lifetime: stops the side channel on drop
    verbs: crate::fabric::verbs::VerbsStart,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("tcp", &self.tcp)
            .field("unix", &self.unix)
            .field("targets", &self.shared.targets.len())
            .finish()
    }
}

fn store_config(config: &EngineConfig, target: usize) -> StoreConfig {
    StoreConfig {
        target: target as u16,
        region_id: (target * 2) as u32,
        bucket_count: config.cache.buckets,
        overflow_buckets: config.cache.overflow_buckets,
        ring_bytes: config.cache.ring_bytes.0,
        hot_value_max: config.cache.hot_value_max.0 as u32,
        hugetlb: config.cache.hugetlb,
        populate: config.cache.populate,
        durability: config.durability,
        flush_interval: std::time::Duration::from_millis(config.flush_interval_ms.max(1)),
        ..StoreConfig::default()
    }
}

/// Starts the xstreams, each opening its target; returns the regions.
fn start_targets(
    config: &EngineConfig,
    cores: Vec<usize>,
) -> Result<(XstreamSet, Vec<StoreRegions>)> {
    let n = cores.len();
    let collected: Arc<Mutex<Vec<Option<StoreRegions>>>> = Arc::new(Mutex::new(vec![None; n]));
    let sink = collected.clone();
    let specs: Vec<(String, StoreConfig)> = (0..n)
        .map(|i| (config.bdev_spec(i), store_config(config, i)))
        .collect();
    let mut xs_config = XstreamConfig {
        name: "ferrite".into(),
        ..XstreamConfig::default().with_cores(cores)
    };
    if config.spin_us > 0 {
        xs_config = xs_config.with_spin(std::time::Duration::from_micros(config.spin_us));
    }
    let set = XstreamSet::start_with(xs_config, move |id: XstreamId| {
        let (spec, store_config) = specs[id.0].clone();
        let sink = sink.clone();
        async move {
            let regions = target::open(id.0 as u16, &spec, store_config)
                .await
                .map_err(|source| ServerError::Store {
                    target: id.0,
                    source,
                })?;
            sink.lock().unwrap_or_else(|p| p.into_inner())[id.0] = Some(regions);
            Ok::<(), ServerError>(())
        }
    })?;
    let regions = std::mem::take(&mut *collected.lock().unwrap_or_else(|p| p.into_inner()));
    let regions: Option<Vec<StoreRegions>> = regions.into_iter().collect();
    let regions = regions.ok_or_else(|| ServerError::Config("a target did not open".into()))?;
    Ok((set, regions))
}

fn register_all<F: Fabric>(fabric: F, regions: &[StoreRegions]) -> Result<F> {
    for r in regions {
        let [buckets, log] = r.descriptors(fabric.provider());
        fabric.register(r.buckets.clone(), buckets)?;
        fabric.register(r.log.clone(), log)?;
    }
    Ok(fabric)
}

/// Registers every target's regions with the shm provider, and the log
/// area of each device that is a regular file (region ids after the memory
/// regions': `2 · targets + target`), as long as a Welcome has room for
/// them.
fn register_shm(regions: &[StoreRegions]) -> Result<ShmFabric> {
    let fabric = register_all(ShmFabric::default(), regions)?;
    if 3 * regions.len() > ferrite_proto::rpc::handshake::REGIONS_MAX {
        tracing::info!(
            targets = regions.len(),
            "too many targets to export device logs"
        );
        return Ok(fabric);
    }
    for r in regions {
        let Some(device) = &r.device_log else {
            continue;
        };
        let id = (2 * regions.len() + usize::from(r.target)) as u32;
        fabric.register_file(device.file.clone(), device.descriptor(r.target, id))?;
    }
    Ok(fabric)
}

impl Engine {
    /// Starts an engine: opens or recovers every target, registers the
    /// regions, starts listening. Returns once it accepts connections.
    pub fn start(mut config: EngineConfig) -> Result<EngineHandle> {
        config.validate()?;
        datadir::prepare(&config.data_dir)?;
        let dir_lock = datadir::DirLock::take(&config.data_dir)?;
        let token = datadir::token(&config)?;
        datadir::raise_open_file_limit();
        let cores = config.resolve_cores()?;
        config
            .resolve_auto_size(cores.len())
            .map_err(ServerError::Config)?;
        let (set, regions) = start_targets(&config, cores)?;
        datadir::restrict_bdev_files(&config, set.len())?;
        let shm = match config.has_provider("shm") {
            true => Some(register_shm(&regions)?),
            false => None,
        };
        #[cfg(feature = "rdma")]
        let verbs = crate::fabric::verbs::start_for_engine(&config.fabric.providers, &regions)?;
        #[cfg(feature = "rdma")]
        let tcp_fallback = verbs.fell_back;
        #[cfg(not(feature = "rdma"))]
        let tcp_fallback = false;
        let tcp = match config.has_provider("tcp") || tcp_fallback {
            true => Some(register_all(TcpFabric::default(), &regions)?),
            false => None,
        };
        let targets = (0..set.len())
            .map(|i| TargetInfo {
                target: i as u16,
                xstream: i as u16,
                state: 0,
                core: u16::try_from(set.cores()[i]).ok(),
            })
            .collect();
        let shared = Arc::new(Shared {
            mesh: set.mesh().clone(),
            read_only: (0..set.len()).map(|_| AtomicBool::new(false)).collect(),
            targets,
            shm,
            tcp,
            token,
            peers: listen::PeerPolicy::new(&config.listen),
            incarnation: rand::random(),
            max_frame_bytes: config.limits.max_frame_bytes.0 as usize,
            max_inflight: config.limits.max_inflight_per_connection,
            idle_timeout: (config.limits.idle_timeout_s > 0)
                .then(|| std::time::Duration::from_secs(config.limits.idle_timeout_s)),
            next_xstream: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            max_connections: config.limits.max_connections,
        });
        let mut handle = EngineHandle {
            set: Some(set),
            shared,
            tcp: None,
            unix: None,
            stops: Vec::new(),
            unix_acceptor: None,
            _dir_lock: dir_lock,
            #[cfg(feature = "rdma")]
            verbs,
        };
        handle.listen(&config)?;
        Ok(handle)
    }
}

/// Runs requests on an engine's targets from inside its process, as if
/// they had come over a connection (see [`EngineHandle::router`]).
#[derive(Clone)]
pub struct Router {
    shared: Arc<Shared>,
    urls: Vec<String>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("urls", &self.urls).finish()
    }
}

impl Router {
    /// Runs one request (a batch fans out to the owning targets) and
    /// returns its reply. Call it from an xstream of the engine: a request
    /// for that xstream's target runs in place, others go over the mesh.
    pub async fn execute(&self, req: ferrite_proto::rpc::Request) -> ferrite_proto::rpc::Reply {
        route::execute(&self.shared, req, None).await
    }

    /// The engine's URLs when the router was taken (clients name the
    /// engine by one of them).
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The mesh of the engine's xstreams.
    pub fn mesh(&self) -> &Mesh {
        &self.shared.mesh
    }
}

impl EngineHandle {
    fn listen(&mut self, config: &EngineConfig) -> Result<()> {
        let mesh = self.shared.mesh.clone();
        if let Some(addr) = config.tcp_addr()? {
            let (stop, stopped) = oneshot::channel();
            self.stops.push(stop);
            let shared = self.shared.clone();
            let bound = block_on(mesh.run_on(
                XstreamId(0),
                TaskClass::Control,
                move || async move { listen::start_tcp(shared, addr, stopped) },
            ))??;
            self.tcp = Some(bound);
        }
        if let Some(path) = config.unix_path() {
            let acceptor = listen::UnixAcceptor::start(self.shared.clone(), path.clone())?;
            self.unix_acceptor = Some(acceptor);
            self.unix = Some(path);
        }
        Ok(())
    }

    /// The mesh of the engine's xstreams (services that run tasks on
    /// them, like the job service's resource manager, send them there).
    pub fn mesh(&self) -> &Mesh {
        &self.shared.mesh
    }

    /// The engine's request router, for services inside this process that
    /// read and write records (the job service's own execution streams):
    /// requests go to their owning targets over the mesh, with no RPC.
    pub fn router(&self) -> Router {
        Router {
            shared: self.shared.clone(),
            urls: self.urls(),
        }
    }

    /// The bound TCP address, if TCP is enabled.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The Unix socket path, if enabled.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_deref()
    }

    /// `tcp://ADDR` and `unix://PATH` for every listener.
    pub fn urls(&self) -> Vec<String> {
        let mut urls = Vec::new();
        if let Some(a) = self.tcp {
            urls.push(format!("tcp://{a}"));
        }
        if let Some(p) = &self.unix {
            urls.push(format!("unix://{}", p.display()));
        }
        urls
    }

    /// The token TCP clients must prove: what an embedded client passes
    /// to its own engine.
    pub fn token(&self) -> &[u8] {
        &self.shared.token
    }

    /// Number of targets (= xstreams).
    pub fn target_count(&self) -> usize {
        self.shared.targets.len()
    }

    /// Descriptors of every exported region, all providers.
    pub fn regions(&self) -> Vec<RegionDescriptor> {
        let mut all = Vec::new();
        if let Some(f) = &self.shared.shm {
            all.extend(f.descriptors());
        }
        all.extend(self.shared.tcp_descriptors());
        all
    }

    /// Stops listening, makes every target durable and checkpoints it, and
    /// stops the xstreams.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        let Some(set) = self.set.take() else {
            return Ok(());
        };
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        if let Some(mut acceptor) = self.unix_acceptor.take() {
            acceptor.stop();
        }
        let mut first_error = Ok(());
        for id in set.ids() {
            let closed = block_on(set.mesh().run_on(id, TaskClass::Control, target::close));
            let outcome = match closed {
                Ok(r) => r.map_err(|source| ServerError::Store {
                    target: id.0,
                    source,
                }),
                Err(e) => Err(ServerError::Xstream(e)),
            };
            if let (Err(e), true) = (outcome, first_error.is_ok()) {
                first_error = Err(e);
            }
        }
        set.shutdown()?;
        first_error
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "engine shutdown failed");
        }
    }
}
