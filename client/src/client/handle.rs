//! [`Client`]: a handle to one engine, shared by any number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrite_proto::key::RecordKey;
use ferrite_proto::region::{Provider, RegionDescriptor, RegionKind};
use ferrite_proto::rpc::handshake::WELCOME_SERVED_BY;
use ferrite_proto::rpc::message::BATCH_ITEMS_MAX;
use ferrite_proto::rpc::{
    Found, Key, PunchScope, Reply, Request, TargetInfo, TargetStat, Verified,
};

use crate::client::bulk::BulkArea;
use crate::client::conn::{ConnectOptions, Connection, Session};
use crate::client::counters::{Counter, CounterSnapshot, Counters};
use crate::client::error::{Error, Result};
use crate::client::extent_lists::ExtentLists;
use crate::client::onesided::{Lookup, OneSidedReader, RetryPolicy, TargetRegions};
use crate::client::reply;
use crate::client::url::EngineUrl;
use crate::fabric::shm::{ShmEndpoint, ShmMapping};
use crate::fabric::tcp::TcpEndpoint;
use crate::fabric::Endpoint;

/// Keys per list request page.
const LIST_PAGE: u32 = 1024;

/// How a [`Client`] connects and reads.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Shared secret every TCP listener requires. None: found at connect
    /// by [`crate::auth::find_token`] (environment, then `./engine.token`).
    /// Unused on the Unix socket, where the engine checks the peer's uid.
    pub token: Option<Vec<u8>>,
    /// Connections in the pool (requests are pipelined on each).
    pub connections: usize,
    /// Use one-sided reads for GET when the engine exports regions.
    pub one_sided: bool,
    /// Buckets kept in the bucket cache, for remote providers (tcp). Over
    /// shm a bucket read is a load from the mapping, as cheap as a cache hit
    /// and never stale, so no cache is kept there.
    pub bucket_cache: usize,
    /// How long a blocking call waits for its reply.
    pub request_timeout: Duration,
    /// Retries of the one-sided GET before asking by RPC.
    pub retry: RetryPolicy,
    /// Slots (1 MiB each) of the bulk region offered to an engine on the
    /// Unix socket, through which file data travels instead of inside the
    /// frames ([`crate::client::bulk`]); 0 = none. Default: the
    /// `FERRITE_BULK_SLOTS` environment variable if set (0 turns the bulk
    /// path off, for A/B runs), else `BULK_SLOTS_DEFAULT`.
    pub bulk_slots: usize,
    /// How long a caller blocked on its reply polls the socket before it
    /// sleeps, on a CPU none of a local engine's xstreams uses
    /// ([`super::spin`]). Default: the `FERRITE_REPLY_SPIN_US` environment
    /// variable if set (0 turns polling off, for A/B runs), else
    /// [`super::DEFAULT_REPLY_SPIN`].
    pub reply_spin: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            connections: 2,
            one_sided: true,
            bucket_cache: 1 << 16,
            request_timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            bulk_slots: std::env::var("FERRITE_BULK_SLOTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(crate::client::bulk::BULK_SLOTS_DEFAULT),
            reply_spin: std::env::var("FERRITE_REPLY_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(super::DEFAULT_REPLY_SPIN, Duration::from_micros),
        }
    }
}

/// What `stat` reports.
#[derive(Debug, Clone)]
pub struct EngineStat {
    pub url: String,
    pub incarnation: u64,
    pub targets: Vec<TargetInfo>,
    pub regions: Vec<RegionDescriptor>,
    /// `None` when GETs go by RPC only.
    pub one_sided_provider: Option<&'static str>,
    pub target_counters: Vec<TargetStat>,
    pub client_counters: CounterSnapshot,
}

/// The connections being opened, by the xstream serving each.
struct ConnPool {
    conns: Vec<Arc<Connection>>,
    by_xstream: Vec<Vec<usize>>,
}

impl ConnPool {
    fn new(xstreams: usize) -> Self {
        Self {
            conns: Vec::new(),
            by_xstream: vec![Vec::new(); xstreams],
        }
    }

    fn add(&mut self, conn: Connection, welcome: &ferrite_proto::rpc::Welcome) {
        let served = welcome.flags & WELCOME_SERVED_BY != 0;
        if let Some(list) = self
            .by_xstream
            .get_mut(usize::from(welcome.served_by))
            .filter(|_| served)
        {
            list.push(self.conns.len());
        }
        self.conns.push(Arc::new(conn));
    }

    /// Every xstream serves a connection (or the engine does not say which).
    fn covers_all(&self) -> bool {
        self.by_xstream.iter().all(|l| !l.is_empty())
            || self.by_xstream.iter().all(|l| l.is_empty())
    }
}

/// A connection pool to one engine plus its one-sided reader.
/// `Send + Sync`: share it (in an `Arc`) between threads.
pub struct Client {
    url: EngineUrl,
    conns: Vec<Arc<Connection>>,
    /// Indices into `conns` of the connections each xstream serves.
    by_xstream: Vec<Vec<usize>>,
    reader: Option<OneSidedReader>,
    /// The bulk region every connection's engine side mapped, if any.
    pub(crate) bulk: Option<Arc<BulkArea>>,
    pub(crate) counters: Arc<Counters>,
    /// Extent lists of the arrays read lately (one-sided piece reads).
    pub(crate) extent_lists: ExtentLists,
    incarnation: u64,
    targets: Vec<TargetInfo>,
    regions: Vec<RegionDescriptor>,
    next_conn: AtomicUsize,
    /// Keeps an embedded engine alive as long as the client.
    pub(crate) _owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url.to_string())
            .field("connections", &self.conns.len())
            .field("reader", &self.reader)
            .finish()
    }
}

fn is_loopback_shm(url: &EngineUrl) -> bool {
    matches!(url, EngineUrl::Unix { .. })
}

thread_local! {
    /// The scratch buffer of this thread's one-sided extent reads.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's scratch buffer for one-sided extent reads
/// (kept between reads, so that a read allocates nothing). `f` must not
/// call back into `with_scratch`.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    SCRATCH.with(|scratch| f(&mut scratch.borrow_mut()))
}

impl Client {
    /// Connects to `tcp://host:port` or `unix:///path` with default options
    /// (over TCP, the token [`crate::auth::find_token`] finds).
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ClientOptions::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(url: &str, opts: ClientOptions) -> Result<Self> {
        let url: EngineUrl = url.parse()?;
        let n = opts.connections.max(1);
        // A bulk region is offered on the Unix socket only; if it cannot be
        // made, data goes in the frames.
        let area = (opts.bulk_slots > 0 && is_loopback_shm(&url))
            .then(|| BulkArea::create(opts.bulk_slots).ok())
            .flatten();
        let first_opts = ConnectOptions {
            token: crate::client::conn::token_for(&url, opts.token.clone())?,
            want_shm: opts.one_sided && is_loopback_shm(&url),
            bulk_fd: area.as_ref().map(|a| a.raw_fd()),
            reply_spin: opts.reply_spin,
        };
        let (first, session) = Connection::open(&url, &first_opts, opts.request_timeout)?;
        let mut bulk_everywhere = session.bulk_mapped;
        let xstreams = session.welcome.targets.iter().map(|t| t.xstream).max();
        let xstreams = usize::from(xstreams.unwrap_or(0)) + 1;
        let mut pool = ConnPool::new(xstreams);
        pool.add(first, &session.welcome);
        let rest = ConnectOptions {
            want_shm: false,
            ..first_opts
        };
        // `n` connections, and more (a few) until every xstream serves one.
        for _ in 1..n + 2 * xstreams {
            if pool.conns.len() >= n && pool.covers_all() {
                break;
            }
            let (c, s) = Connection::open(&url, &rest, opts.request_timeout)?;
            bulk_everywhere &= s.bulk_mapped;
            pool.add(c, &s.welcome);
        }
        let ConnPool { conns, by_xstream } = pool;
        let Session { welcome, fds, .. } = session;
        let reader = if opts.one_sided {
            build_reader(
                &welcome.regions,
                fds,
                welcome.targets.len(),
                &conns[0],
                &opts,
            )?
        } else {
            None
        };
        Ok(Self {
            url,
            conns,
            by_xstream,
            reader,
            bulk: area.filter(|_| bulk_everywhere),
            counters: Arc::new(Counters::default()),
            extent_lists: ExtentLists::default(),
            incarnation: welcome.incarnation,
            targets: welcome.targets,
            regions: welcome.regions,
            next_conn: AtomicUsize::new(0),
            _owner: None,
        })
    }

    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// Random per engine start: a change means the engine restarted.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub fn targets(&self) -> &[TargetInfo] {
        &self.targets
    }

    pub fn regions(&self) -> &[RegionDescriptor] {
        &self.regions
    }

    /// Replaces the one-sided reader, e.g. with one over a verbs endpoint
    /// (`OneSidedReader::new(Box::new(verbs_endpoint), targets, ..)`), or
    /// turns one-sided GETs off with `None`.
    pub fn set_one_sided_reader(&mut self, reader: Option<OneSidedReader>) {
        self.reader = reader;
    }

    /// `"shm"`, `"tcp"` (or another endpoint's name) when GETs are
    /// one-sided, else `None`.
    pub fn one_sided_provider(&self) -> Option<&'static str> {
        self.reader.as_ref().map(OneSidedReader::provider)
    }

    pub(crate) fn reader(&self) -> Option<&OneSidedReader> {
        self.reader.as_ref()
    }

    /// One-sided hits, retries, fallbacks and RPC counts so far.
    pub fn counters(&self) -> CounterSnapshot {
        let mut snapshot = self.counters.snapshot();
        for conn in &self.conns {
            let (by_caller, polling, all) = conn.replies_read();
            snapshot.replies_read_by_caller += by_caller;
            snapshot.replies_read_polling += polling;
            snapshot.replies_read += all;
        }
        snapshot
    }

    /// This thread's slot, spreading threads over connections.
    fn slot(&self) -> usize {
        thread_local! {
            static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
        }
        SLOT.with(|s| {
            if s.get() == usize::MAX {
                s.set(self.next_conn.fetch_add(1, Ordering::Relaxed));
            }
            s.get()
        })
    }

    /// A connection of the pool, spreading threads over them.
    pub(crate) fn conn(&self) -> &Arc<Connection> {
        &self.conns[self.slot() % self.conns.len()]
    }

    /// The connection for `request`: one served by the xstream of the
    /// target that owns it (the engine then runs it without a hop between
    /// xstreams), else any.
    pub(crate) fn conn_for(&self, request: &Request) -> &Arc<Connection> {
        let served = request
            .owner(self.targets.len() as u32)
            .and_then(|t| self.targets.get(t as usize))
            .and_then(|t| self.by_xstream.get(usize::from(t.xstream)))
            .filter(|c| !c.is_empty());
        match served {
            Some(c) => &self.conns[c[self.slot() % c.len()]],
            None => self.conn(),
        }
    }

    /// Sends one request and waits for its reply (any reply, including
    /// `Reply::Error`).
    pub fn request(&self, request: &Request) -> Result<Reply> {
        self.counters.add(Counter::RpcRequest, 1);
        self.conn_for(request).request(request)
    }

    /// The value of `key`, or `None` if it has none.
    pub fn get(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        Ok(self.get_versioned(key)?.map(|f| f.value))
    }

    /// The value of `key` and its version.
    pub fn get_versioned(&self, key: &Key) -> Result<Option<Found>> {
        let mut value = Vec::new();
        Ok(self
            .get_into(&key.as_record_key(), &mut value)?
            .map(|version| Found { version, value }))
    }

    /// Puts the value of `key` into `out` and returns its version (`None`
    /// and `out` unspecified if absent). One-sided when possible; the
    /// allocation-free form for hot loops.
    pub fn get_into(&self, key: &RecordKey<'_>, out: &mut Vec<u8>) -> Result<Option<u64>> {
        if let Some(reader) = &self.reader {
            self.check_alive("get")?;
            match reader.get_into(key, out, &self.counters)? {
                Lookup::Found { version } => return Ok(Some(version)),
                Lookup::Absent => return Ok(None),
                Lookup::Fallback(_) => {}
            }
        }
        self.fetch_into(key, out)
    }

    /// Hints that `keys` are about to be read one-sided, one after the
    /// other: their buckets and records start loading now (shm; a no-op
    /// elsewhere). Reads nothing and changes no result.
    pub fn prefetch(&self, keys: &[RecordKey<'_>]) {
        if let Some(reader) = &self.reader {
            reader.prefetch_many(keys);
        }
    }

    /// GETs of many keys at once: `outs[i]` gets the value of `keys[i]` and
    /// the result says its version (`None` = absent). One-sided lookups
    /// overlap their memory accesses (prefetch); the keys that need the
    /// engine go to it together, in batches.
    pub fn get_many_into(
        &self,
        keys: &[RecordKey<'_>],
        outs: &mut [Vec<u8>],
    ) -> Result<Vec<Result<Option<u64>>>> {
        let mut results: Vec<Option<Result<Option<u64>>>> = match &self.reader {
            None => (0..keys.len()).map(|_| None).collect(),
            Some(reader) => {
                self.check_alive("get")?;
                reader
                    .get_many_into(keys, outs, &self.counters)?
                    .into_iter()
                    .map(|l| match l {
                        Lookup::Found { version } => Some(Ok(Some(version))),
                        Lookup::Absent => Some(Ok(None)),
                        Lookup::Fallback(_) => None,
                    })
                    .collect()
            }
        };
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_none()).collect();
        let fetches: Vec<Request> = missing
            .iter()
            .map(|&i| {
                let k = &keys[i];
                Request::Fetch {
                    key: Key::new(k.container, k.object, k.dkey, k.akey),
                }
            })
            .collect();
        let replies = match fetches.len() {
            0 => Vec::new(),
            1 => vec![self.request(&fetches[0])?],
            _ => self.batch(fetches)?,
        };
        for (&i, r) in missing.iter().zip(replies) {
            results[i] = Some(reply::value("get", r).map(|found| {
                found.map(|f| {
                    outs[i].clear();
                    outs[i].extend_from_slice(&f.value);
                    f.version
                })
            }));
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(Ok(None))).collect())
    }

    /// The shm regions stay mapped after the engine dies: refuse to serve
    /// them once the connection that brought them is gone.
    pub(crate) fn check_alive(&self, op: &'static str) -> Result<()> {
        let first = &self.conns[0];
        if first.is_dead() {
            return Err(Error::Disconnected {
                url: self.url(),
                op,
                detail: first.failure().unwrap_or_default(),
            });
        }
        Ok(())
    }

    fn fetch_into(&self, key: &RecordKey<'_>, out: &mut Vec<u8>) -> Result<Option<u64>> {
        let owned = Key::new(key.container, key.object, key.dkey, key.akey);
        let found = reply::value("get", self.request(&Request::Fetch { key: owned })?)?;
        Ok(found.map(|f| {
            out.clear();
            out.extend_from_slice(&f.value);
            f.version
        }))
    }

    /// Stores `value` under `key`; returns the version it got. Durable when
    /// this returns (the engine acknowledges after group commit).
    pub fn put(&self, key: &Key, value: &[u8]) -> Result<u64> {
        let r = self.request(&Request::Update {
            key: key.clone(),
            value: value.to_vec(),
        })?;
        reply::version("put", r)
    }

    /// Deletes `key` (its akey); returns the version of the deletion.
    pub fn delete(&self, key: &Key) -> Result<u64> {
        self.punch(PunchScope::Akey, key)
    }

    /// Deletes an akey, every akey of a dkey, or a whole object.
    pub fn punch(&self, scope: PunchScope, key: &Key) -> Result<u64> {
        let r = self.request(&Request::Punch {
            scope,
            key: key.clone(),
        })?;
        reply::version("delete", r)
    }

    /// Stores `value` only if the key's version is `expected_version`
    /// (0 = the key must be absent). Returns the new version, or
    /// [`Error::VersionMismatch`].
    pub fn put_if_version(&self, key: &Key, expected_version: u64, value: &[u8]) -> Result<u64> {
        let r = self.request(&Request::CondUpdate {
            key: key.clone(),
            expected_version,
            value: value.to_vec(),
        })?;
        reply::cond(expected_version, r)
    }

    /// Writes `data` at byte `offset` of the array stored under `key`.
    pub fn write_extent(&self, key: &Key, offset: u64, data: &[u8]) -> Result<u64> {
        let r = self.request(&Request::ExtentWrite {
            key: key.clone(),
            offset,
            data: data.to_vec(),
        })?;
        reply::version("extent write", r)
    }

    /// Reads `len` bytes at `offset` of the array under `key` (holes read
    /// as zero); `None` if the array does not exist.
    pub fn read_extent(&self, key: &Key, offset: u64, len: u32) -> Result<Option<Found>> {
        if let Some(found) = self.read_extent_one_sided(key, offset, len)? {
            return Ok(found);
        }
        let r = self.request(&Request::ExtentRead {
            key: key.clone(),
            offset,
            len,
        })?;
        reply::value("extent read", r)
    }

    /// [`read_extent`](Self::read_extent) without the engine, when the
    /// array's newest extent record is in memory and covers the range
    /// (`Some`: the answer, `Some(None)` for an absent array); `None` when
    /// only the engine can answer.
    pub fn read_extent_one_sided(
        &self,
        key: &Key,
        offset: u64,
        len: u32,
    ) -> Result<Option<Option<Found>>> {
        let Some(reader) = &self.reader else {
            return Ok(None);
        };
        self.check_alive("extent read")?;
        let mut value = Vec::new();
        let lookup = reader.get_extent_into(
            &key.as_record_key(),
            offset,
            len,
            &mut value,
            &self.counters,
        )?;
        Ok(match lookup {
            Lookup::Found { version } => Some(Some(Found { version, value })),
            Lookup::Absent => Some(None),
            Lookup::Fallback(_) => None,
        })
    }

    /// [`read_extent_one_sided`](Self::read_extent_one_sided) straight into
    /// `buf` (`buf.len()` bytes at `offset`): `Some(true)` the bytes are in
    /// `buf`; `Some(false)` the array does not exist (`buf` untouched);
    /// `None` when only the engine can answer. The record is read into a
    /// buffer kept per thread, so a read allocates nothing and copies the
    /// bytes once out of it.
    pub fn read_extent_one_sided_into(
        &self,
        key: &Key,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<bool>> {
        let Some(reader) = &self.reader else {
            return Ok(None);
        };
        self.check_alive("extent read")?;
        let lookup = with_scratch(|scratch| {
            scratch.clear();
            let key = key.as_record_key();
            reader.get_extent_into_slice(&key, offset, buf, scratch, &self.counters)
        })?;
        Ok(match lookup {
            Lookup::Found { .. } => Some(true),
            Lookup::Absent => Some(false),
            Lookup::Fallback(_) => None,
        })
    }

    /// Every dkey of an object, sorted (pages through the engine).
    pub fn list_dkeys(&self, container: u64, object: u128) -> Result<Vec<Vec<u8>>> {
        self.list_pages(|after| Request::ListDkeys {
            container,
            object,
            after,
            limit: LIST_PAGE,
        })
    }

    /// Every akey of a dkey, sorted.
    pub fn list_akeys(&self, container: u64, object: u128, dkey: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.list_pages(|after| Request::ListAkeys {
            container,
            object,
            dkey: dkey.to_vec(),
            after,
            limit: LIST_PAGE,
        })
    }

    /// Every object of a container that holds a key, sorted by id.
    pub fn list_objects(&self, container: u64) -> Result<Vec<u128>> {
        self.pages(
            |after| Request::ListObjects {
                container,
                after,
                limit: LIST_PAGE,
            },
            reply::objects,
        )
    }

    /// Has the engine read back and check every record of the key's value
    /// (on its device, and in memory while there); see [`Verified`].
    pub fn verify(&self, key: &Key) -> Result<Verified> {
        let req = Request::Verify { key: key.clone() };
        reply::verified(self.request(&req)?)
    }

    fn list_pages(&self, page: impl Fn(Option<Vec<u8>>) -> Request) -> Result<Vec<Vec<u8>>> {
        self.pages(page, |r| reply::keys("list", r))
    }

    /// Every item of a paged listing: `page(last item so far)` asks for the
    /// next page, `parse` gives its items and whether more follow.
    fn pages<T: Clone>(
        &self,
        page: impl Fn(Option<T>) -> Request,
        parse: impl Fn(Reply) -> Result<(Vec<T>, bool)>,
    ) -> Result<Vec<T>> {
        let mut all: Vec<T> = Vec::new();
        loop {
            let (items, more) = parse(self.request(&page(all.last().cloned()))?)?;
            let got = items.len();
            all.extend(items);
            if !more || got == 0 {
                return Ok(all);
            }
        }
    }

    /// Runs data requests as batches of up to `BATCH_ITEMS_MAX`, each sent as
    /// one frame per connection serving its targets
    /// ([`batch_async`](Self::batch_async)); replies in order,
    /// `Reply::Error` per failed item.
    pub fn batch(&self, requests: Vec<Request>) -> Result<Vec<Reply>> {
        let mut out = Vec::with_capacity(requests.len());
        let mut it = requests.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<Request> = it.by_ref().take(BATCH_ITEMS_MAX).collect();
            out.extend(self.send_batch(chunk).wait()?);
        }
        Ok(out)
    }

    /// Returns once every update acknowledged to anyone before the call
    /// survives a power loss of the engine's devices (fsync for engines that
    /// acknowledge at `process` durability; cheap on `device` durability).
    pub fn sync(&self) -> Result<()> {
        reply::synced(self.request(&Request::Sync)?)
    }

    /// Targets, regions and counters of the engine and of this client.
    pub fn stat(&self) -> Result<EngineStat> {
        let target_counters = reply::stat(self.request(&Request::Stat)?)?;
        Ok(EngineStat {
            url: self.url(),
            incarnation: self.incarnation,
            targets: self.targets.clone(),
            regions: self.regions.clone(),
            one_sided_provider: self.one_sided_provider(),
            target_counters,
            client_counters: self.counters(),
        })
    }
}

/// Builds the one-sided reader from the Welcome: shm when fds came with it,
/// tcp when the regions are tcp-provided, none otherwise.
fn build_reader(
    regions: &[RegionDescriptor],
    fds: Vec<std::os::fd::OwnedFd>,
    target_count: usize,
    conn: &Arc<Connection>,
    opts: &ClientOptions,
) -> Result<Option<OneSidedReader>> {
    let mut per_target: Vec<[Option<RegionDescriptor>; 3]> = vec![[None; 3]; target_count];
    for r in regions {
        let Some(t) = per_target.get_mut(usize::from(r.target)) else {
            return Ok(None);
        };
        let i = match r.kind {
            RegionKind::Buckets => 0,
            RegionKind::Log => 1,
            RegionKind::DeviceLog => 2,
        };
        t[i] = Some(*r);
    }
    let mut targets = Vec::with_capacity(target_count);
    for t in per_target {
        match t {
            [Some(buckets), Some(log), device] => targets.push(TargetRegions {
                buckets,
                log,
                // Only a shm endpoint maps device logs (the mapping below).
                device: device.filter(|_| !fds.is_empty()),
            }),
            _ => return Ok(None),
        }
    }
    let mut cache_buckets = opts.bucket_cache;
    let endpoint: Box<dyn Endpoint> = if !fds.is_empty() {
        cache_buckets = 0;
        let mut ep = ShmEndpoint::new();
        // Each region mapped (page tables populated) on its own thread: the first client
        // of an engine populates gigabytes of ring.
        let mappings: Vec<Result<ShmMapping>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = regions
                .iter()
                .zip(&fds)
                .map(|(r, fd)| {
                    scope.spawn(move || match r.kind {
                        RegionKind::DeviceLog => {
                            ShmMapping::map_at(fd, r.remote_addr, r.length, false)
                        }
                        _ => ShmMapping::map(fd, r.length),
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().expect("region mapping thread panicked"))
                .collect()
        });
        for (r, mapping) in regions.iter().zip(mappings) {
            ep.insert(r, mapping?)?;
        }
        Box::new(ep)
    } else if regions.iter().all(|r| r.provider == Provider::Tcp) {
        Box::new(TcpEndpoint::new(conn.clone()))
    } else {
        return Ok(None);
    };
    Ok(Some(OneSidedReader::new(
        endpoint,
        targets,
        cache_buckets,
        opts.retry,
    )?))
}
