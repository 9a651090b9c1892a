//! A target: the shard of the store one xstream owns, and the handler that
//! runs a data request against it.
//!
//! Each xstream opens its target's [`Store`] in its init closure and keeps it
//! in a thread-local; [`handle`] runs on that xstream (the router sends it
//! there over the mesh) and turns a [`Request`] into a [`Reply`].

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use ferrite_proto::rpc::{
    ErrorCode, Found, Key, Placed, PunchScope, Reply, Request, TargetStat, LIST_VALUE_BYTES_MAX,
};

use crate::server::BulkSlice;
use crate::store::{
    Condition, Conditional, Durability, Store, StoreConfig, StoreError, StoreRegions, WriteOp,
};
use ferrite_proto::key::RecordKey;

/// Most keys one list request returns from one target.
pub const LIST_LIMIT_MAX: usize = ferrite_proto::rpc::message::LIST_KEYS_MAX;

/// The store of this xstream's target and its state.
#[derive(Debug)]
pub struct Target {
    index: u16,
    store: Rc<Store>,
    closing: Cell<bool>,
}

/// How often a target checkpoints its index when it has new records.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);

thread_local! {
    static TARGET: RefCell<Option<Rc<Target>>> = const { RefCell::new(None) };
}

/// Opens target `index` on the calling xstream from the bdev `spec` and
/// installs it; returns its regions for the fabric.
pub async fn open(index: u16, spec: &str, config: StoreConfig) -> Result<StoreRegions, StoreError> {
    let bdev = ferrite_bdev::open(spec).map_err(|e| StoreError::Layout {
        device: spec.to_string(),
        reason: e.to_string(),
    })?;
    let store = Rc::new(Store::open(bdev, config).await?);
    let regions = store.regions();
    store.spawn_cleaner();
    store.spawn_keeper();
    let target = Rc::new(Target {
        index,
        store,
        closing: Cell::new(false),
    });
    glommio::spawn_local(checkpoint_loop(Rc::downgrade(&target))).detach();
    if target.store.durability() == Durability::Process {
        let interval = target.store.flush_interval();
        glommio::spawn_local(Store::flush_loop(Rc::downgrade(&target.store), interval)).detach();
    }
    TARGET.with(|t| *t.borrow_mut() = Some(target));
    Ok(regions)
}

/// Checkpoints every [`CHECKPOINT_INTERVAL`] while records keep coming, so
/// that recovery replays a bounded tail of the log.
async fn checkpoint_loop(target: std::rc::Weak<Target>) {
    let mut checkpointed_at = 0;
    loop {
        glommio::timer::sleep(CHECKPOINT_INTERVAL).await;
        let Some(t) = target.upgrade() else { return };
        if t.closing.get() {
            return;
        }
        let appended = t.store.stats().records_appended;
        if appended == checkpointed_at {
            continue;
        }
        match t.store.checkpoint().await {
            Ok(_) => checkpointed_at = appended,
            Err(e) => tracing::warn!(target = t.index, error = %e, "checkpoint failed"),
        }
    }
}

/// The target of the calling xstream, if one is open.
pub fn current() -> Option<Rc<Target>> {
    TARGET.with(|t| t.borrow().clone())
}

/// Refuses new writes, makes everything durable and checkpoints the index,
/// then drops the target from this xstream.
pub async fn close() -> Result<(), StoreError> {
    let Some(target) = current() else {
        return Ok(());
    };
    target.closing.set(true);
    target.store.stop_cleaner();
    let outcome = target.store.checkpoint().await.map(|_| ());
    TARGET.with(|t| t.borrow_mut().take());
    outcome
}

fn store_error(e: StoreError) -> Reply {
    let code = match &e {
        StoreError::Invalid(_) | StoreError::WrongKind { .. } => ErrorCode::InvalidArgument,
        StoreError::Poisoned { .. } => ErrorCode::ReadOnly,
        StoreError::Device { .. } | StoreError::Corrupt { .. } => ErrorCode::Io,
        StoreError::IndexFull { .. }
        | StoreError::LogFull { .. }
        | StoreError::CheckpointTooLarge { .. }
        | StoreError::NoSpace { .. } => ErrorCode::NoSpace,
        _ => ErrorCode::Internal,
    };
    Reply::error(code, e.to_string())
}

fn version(r: Result<u64, StoreError>) -> Reply {
    r.map_or_else(store_error, Reply::Version)
}

fn found(r: Result<Option<(u64, Vec<u8>)>, StoreError>) -> Reply {
    match r {
        Ok(v) => Reply::Value(v.map(|(version, value)| Found { version, value })),
        Err(e) => store_error(e),
    }
}

/// Asks for one key more than the client's limit, to tell whether more follow.
fn keys(limit: u32, list: impl FnOnce(usize) -> Vec<Vec<u8>>) -> Reply {
    let (keys, more) = page(limit, list);
    Reply::Keys { keys, more }
}

/// At most `limit` (clamped) items of a listing, and whether more follow.
fn page<T>(limit: u32, list: impl FnOnce(usize) -> Vec<T>) -> (Vec<T>, bool) {
    let limit = (limit as usize).clamp(1, LIST_LIMIT_MAX);
    let mut items = list(limit + 1);
    let more = items.len() > limit;
    items.truncate(limit);
    (items, more)
}

fn is_write(req: &Request) -> bool {
    matches!(
        req,
        Request::Update { .. }
            | Request::Punch { .. }
            | Request::CondUpdate { .. }
            | Request::ExtentWrite { .. }
            | Request::BulkWrite { .. }
    )
}

/// This xstream's target if it takes a request that writes (`write`) or
/// does not.
fn serving(write: bool) -> Result<Rc<Target>, Reply> {
    let Some(t) = current() else {
        return Err(Reply::error(
            ErrorCode::ShuttingDown,
            "no target on this xstream",
        ));
    };
    if t.closing.get() && write {
        return Err(Reply::error(
            ErrorCode::ShuttingDown,
            "the engine is shutting down",
        ));
    }
    Ok(t)
}

/// Runs a bulk request against this xstream's target: a BulkWrite appends
/// the bytes of `slice` (copied from the client's region into the log
/// ring), a BulkRead places the extent into it. `slice` was bounds-checked
/// against the connection's bulk region and is `len` bytes long.
pub(crate) async fn handle_bulk(req: Request, mut slice: BulkSlice) -> Reply {
    let t = match serving(is_write(&req)) {
        Ok(t) => t,
        Err(refusal) => return refusal,
    };
    let s = &t.store;
    match req {
        Request::BulkWrite { key, offset, .. } => version(
            s.update_extent(&key.as_record_key(), offset, slice.bytes())
                .await,
        ),
        Request::BulkRead {
            key, offset, len, ..
        } => {
            let read = s
                .fetch_extent_to(&key.as_record_key(), offset, u64::from(len), &mut slice)
                .await;
            match read {
                Ok(found) => Reply::Placed(found.map(|version| Placed { version, len })),
                Err(e) => store_error(e),
            }
        }
        other => Reply::error(
            ErrorCode::InvalidArgument,
            format!("{:?} is not a bulk operation", other.kind()),
        ),
    }
}

/// A write of a group ([`handle_writes`]): an update, a conditional
/// update, an extent write or a punch of an akey or a dkey; a `BulkWrite`
/// with its checked range of the connection's bulk region.
pub(crate) struct GroupWrite {
    pub req: Request,
    pub bulk: Option<BulkSlice>,
}

impl GroupWrite {
    /// Does a group take it? A `BulkWrite` only with its range.
    pub(crate) fn is_grouped(&self) -> bool {
        self.op().is_some()
    }

    /// What the store runs for it.
    fn op(&self) -> Option<WriteOp<'_>> {
        match (&self.req, &self.bulk) {
            (Request::BulkWrite { key, offset, .. }, Some(slice)) => Some(WriteOp::Extent {
                key: key.as_record_key(),
                offset: *offset,
                bytes: slice.bytes(),
            }),
            (req, _) => write_op(req),
        }
    }
}

/// Runs several writes against this xstream's target as one group:
/// appended in order and acknowledged together once the commit that
/// carries them is durable ([`Store::write_many`]). One reply per write, in
/// order, each what the write alone gets.
pub(crate) async fn handle_writes(writes: Vec<GroupWrite>) -> Vec<Reply> {
    let t = match serving(true) {
        Ok(t) => t,
        Err(refusal) => return vec![refusal; writes.len()],
    };
    let ops: Vec<Option<WriteOp<'_>>> = writes.iter().map(GroupWrite::op).collect();
    let valid: Vec<WriteOp<'_>> = ops.iter().flatten().copied().collect();
    let mut done = t.store.write_many(&valid).await.into_iter();
    let replies = writes.iter().zip(&ops).map(|(w, op)| match (&w.req, op) {
        (req, None) => Reply::error(
            ErrorCode::Internal,
            format!("{:?} is not a group write", req.kind()),
        ),
        (Request::CondUpdate { .. }, Some(_)) => cond_reply(done.next()),
        (_, Some(_)) => match done.next() {
            Some(Ok(Conditional::Applied(v))) => Reply::Version(v),
            Some(Err(e)) => store_error(e),
            other => Reply::error(ErrorCode::Internal, format!("write outcome {other:?}")),
        },
    });
    replies.collect()
}

/// The store's op for a group write (`None`: not one).
fn write_op(req: &Request) -> Option<WriteOp<'_>> {
    Some(match req {
        Request::Update { key, value } => WriteOp::Update {
            key: key.as_record_key(),
            value,
        },
        Request::CondUpdate {
            key,
            expected_version,
            value,
        } => WriteOp::UpdateIf {
            key: key.as_record_key(),
            value,
            cond: condition(*expected_version),
        },
        Request::ExtentWrite { key, offset, data } => WriteOp::Extent {
            key: key.as_record_key(),
            offset: *offset,
            bytes: data,
        },
        Request::Punch {
            scope: PunchScope::Akey,
            key,
        } => WriteOp::Punch {
            key: key.as_record_key(),
            dkey: false,
        },
        Request::Punch {
            scope: PunchScope::Dkey,
            key,
        } => WriteOp::Punch {
            key: RecordKey::new(key.container, key.object, &key.dkey, b""),
            dkey: true,
        },
        _ => return None,
    })
}

/// The condition a `CondUpdate` names (expected version 0: absent).
fn condition(expected_version: u64) -> Condition {
    match expected_version {
        0 => Condition::Absent,
        v => Condition::Version(v),
    }
}

/// The reply to a `CondUpdate`.
fn cond_reply(outcome: Option<Result<Conditional, StoreError>>) -> Reply {
    match outcome {
        Some(Ok(Conditional::Applied(v))) => Reply::Cond {
            applied: true,
            version: v,
        },
        Some(Ok(Conditional::Conflict(v))) => Reply::Cond {
            applied: false,
            version: v.unwrap_or(0),
        },
        Some(Err(e)) => store_error(e),
        None => Reply::error(ErrorCode::Internal, "no outcome for a conditional update"),
    }
}

/// Fetches `keys` from this xstream's target with one
/// [`Store::fetch_batch`] (their memory loads overlap): one reply per key,
/// in order, each what a `Fetch` of that key alone gets.
pub async fn handle_fetches(keys: Vec<Key>) -> Vec<Reply> {
    let t = match serving(false) {
        Ok(t) => t,
        Err(refusal) => return vec![refusal; keys.len()],
    };
    let record_keys: Vec<_> = keys.iter().map(Key::as_record_key).collect();
    let fetched = t.store.fetch_batch(&record_keys).await;
    fetched.into_iter().map(found).collect()
}

/// Runs one data request against this xstream's target.
pub async fn handle(req: Request) -> Reply {
    let t = match serving(is_write(&req)) {
        Ok(t) => t,
        Err(refusal) => return refusal,
    };
    let s = &t.store;
    match req {
        Request::Update { key, value } => version(s.update(&key.as_record_key(), &value).await),
        Request::Fetch { key } => found(s.fetch(&key.as_record_key()).await),
        Request::Punch { scope, key } => version(match scope {
            PunchScope::Akey => s.punch(&key.as_record_key()).await,
            PunchScope::Dkey => s.punch_dkey(key.container, key.object, &key.dkey).await,
            PunchScope::Object => s.punch_object(key.container, key.object).await,
        }),
        Request::ListDkeys {
            container,
            object,
            after,
            limit,
        } => keys(limit, |n| {
            s.list_dkeys(container, object, after.as_deref(), n)
        }),
        Request::ListValues {
            container,
            object,
            akey,
            after,
            limit,
        } => {
            let (entries, more) = page(limit, |n| {
                s.list_values(
                    container,
                    object,
                    &akey,
                    after.as_deref(),
                    n,
                    LIST_VALUE_BYTES_MAX,
                )
            });
            Reply::Values { entries, more }
        }
        Request::ListAkeys {
            container,
            object,
            dkey,
            after,
            limit,
        } => keys(limit, |n| {
            s.list_akeys(container, object, &dkey, after.as_deref(), n)
        }),
        Request::CondUpdate {
            key,
            expected_version,
            value,
        } => {
            let cond = condition(expected_version);
            cond_reply(Some(s.update_if(&key.as_record_key(), &value, cond).await))
        }
        Request::ExtentWrite { key, offset, data } => {
            version(s.update_extent(&key.as_record_key(), offset, &data).await)
        }
        Request::ExtentRead { key, offset, len } => found(
            s.fetch_extent(&key.as_record_key(), offset, u64::from(len))
                .await,
        ),
        Request::ExtentList { key } => s
            .extent_list(&key.as_record_key())
            .map_or_else(store_error, Reply::Extents),
        Request::ListObjects {
            container,
            after,
            limit,
        } => {
            let (objects, more) = page(limit, |n| s.list_objects(container, after, n));
            Reply::Objects { objects, more }
        }
        Request::Verify { key } => s
            .verify(&key.as_record_key())
            .await
            .map_or_else(store_error, Reply::Verified),
        Request::Stat => Reply::Stat(vec![t.stat()]),
        Request::Sync => s.sync().await.map_or_else(store_error, |()| Reply::Synced),
        other => Reply::error(
            ErrorCode::InvalidArgument,
            format!("{:?} is not a target operation", other.kind()),
        ),
    }
}

impl Target {
    /// The store's counters, as named numbers (booleans as 0/1, a fraction
    /// as `name_permille`, a list of numbers as `name_0`, `name_1`, …:
    /// `corrupt_offsets_0` is the log address of the oldest damaged range
    /// kept).
    fn stat(&self) -> TargetStat {
        let mut counters = Vec::new();
        if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(self.store.stats()) {
            for (name, value) in map {
                let n = match value {
                    serde_json::Value::Number(n) => n.as_u64().or_else(|| {
                        let permille = (n.as_f64()? * 1000.0).round() as u64;
                        counters.push((format!("{name}_permille"), permille));
                        None
                    }),
                    serde_json::Value::Bool(b) => Some(u64::from(b)),
                    serde_json::Value::Array(items) => {
                        let numbers = items.iter().filter_map(|v| v.as_u64());
                        for (i, v) in numbers.enumerate() {
                            counters.push((format!("{name}_{i}"), v));
                        }
                        None
                    }
                    _ => None,
                };
                if let Some(n) = n {
                    counters.push((name, n));
                }
            }
        }
        if let (Some(mesh), Some(me)) =
            (ferrite_xstream::current_mesh(), ferrite_xstream::current())
        {
            counters.push(("xstream_idle_rechecks".into(), mesh.idle_rechecks(me)));
            counters.push(("xstream_lost_wakes".into(), mesh.lost_wakes()));
        }
        TargetStat {
            target: self.index,
            counters,
        }
    }
}
