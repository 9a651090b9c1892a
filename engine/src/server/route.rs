//! Routing: a request goes to the target that owns its dkey (over the
//! xstream mesh, or directly when that is the calling xstream); requests
//! that span targets (batches, dkey and object listings, object punches,
//! stat) fan out and their replies are merged. Region reads never reach a
//! target: the network task serves them from the region. Bulk requests
//! have their range checked against the connection's bulk region here,
//! before they travel to their target.

use std::sync::Arc;

use ferrite_proto::rpc::{ErrorCode, Key, PunchScope, Reply, Request, LIST_VALUE_BYTES_MAX};
use ferrite_xstream::{TaskClass, XstreamId};
use futures::future::join_all;

use super::bulk::{BulkRegion, BulkSlice};
use super::{budget, Shared};
use crate::target::{self, GroupWrite};

/// Runs one request (after the handshake) and returns its reply, within
/// the reply budget ([`budget`]: a batch's items share it, a listing is cut
/// at it). `bulk` is the connection's bulk region, if it has one.
pub(crate) async fn execute(
    shared: &Arc<Shared>,
    req: Request,
    bulk: Option<&Arc<BulkRegion>>,
) -> Reply {
    match req {
        Request::Batch(items) => Reply::Batch(budget::bound_batch(
            execute_batch(shared, items, bulk).await,
        )),
        other => budget::bound_alone(execute_one(shared, other, bulk).await),
    }
}

/// Items of one kind bound for one target, gathered from a batch: the
/// target, where each item sits in the batch, and the items.
type Group<T> = (usize, Vec<usize>, Vec<T>);

/// Adds `item`, at position `i` of its batch, to target `t`'s group.
fn push_grouped<T>(groups: &mut Vec<Group<T>>, t: usize, i: usize, item: T) {
    match groups.iter_mut().find(|g| g.0 == t) {
        Some(g) => {
            g.1.push(i);
            g.2.push(item);
        }
        None => groups.push((t, vec![i], vec![item])),
    }
}

/// Runs the items of a batch (or a burst of pipelined requests) and returns
/// their replies in order. Its writes bound for one target (updates,
/// conditional updates, extent writes (bulk ones too) and punches of akeys
/// or dkeys: the data, creates and deletes of a batch of files) travel
/// there as one message and are
/// appended and committed as one group ([`target::handle_writes`]: one mesh
/// crossing, one task and one wait for durability per target instead of
/// per write); its fetches of one target
/// go there together and run as one `Store::fetch_batch`, which overlaps
/// their memory loads ([`target::handle_fetches`]). Every other item runs on
/// its own. Groups and other items all run concurrently.
pub(crate) async fn execute_batch(
    shared: &Arc<Shared>,
    items: Vec<Request>,
    bulk: Option<&Arc<BulkRegion>>,
) -> Vec<Reply> {
    let count = items.len();
    let mut writes: Vec<Group<GroupWrite>> = Vec::new();
    let mut fetches: Vec<Group<Key>> = Vec::new();
    let mut others = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let t = owner(shared, &item);
        if let Request::Fetch { key } = item {
            push_grouped(&mut fetches, t, i, key);
            continue;
        }
        // A bulk write whose range is refused runs alone, which refuses it.
        let slice = match item {
            Request::BulkWrite { .. } => bulk_slice(bulk, &item).ok(),
            _ => None,
        };
        let write = GroupWrite {
            req: item,
            bulk: slice,
        };
        if write.is_grouped() {
            push_grouped(&mut writes, t, i, write);
        } else {
            others.push((i, write.req));
        }
    }
    let writes = writes
        .into_iter()
        .map(|(t, at, group)| async move { (at, writes_on_target(shared, t, group).await) });
    let fetches = fetches
        .into_iter()
        .map(|(t, at, keys)| async move { (at, fetches_on_target(shared, t, keys).await) });
    let singles = others
        .into_iter()
        .map(|(i, req)| async move { (vec![i], vec![execute_one(shared, req, bulk).await]) });
    let (updated, fetched, ran) =
        futures::join!(join_all(writes), join_all(fetches), join_all(singles));
    let mut replies: Vec<Option<Reply>> = vec![None; count];
    for (at, group) in updated.into_iter().chain(fetched).chain(ran) {
        for (i, reply) in at.into_iter().zip(group) {
            replies[i] = Some(reply);
        }
    }
    replies
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Reply::error(ErrorCode::Internal, "no reply for an item")))
        .collect()
}

/// Runs a group of writes on target `t`'s xstream; notes a target turned
/// read-only.
async fn writes_on_target(shared: &Arc<Shared>, t: usize, group: Vec<GroupWrite>) -> Vec<Reply> {
    let count = group.len();
    let replies = on_xstream(shared, t, move || target::handle_writes(group))
        .await
        .unwrap_or_else(|e| vec![Reply::error(ErrorCode::ShuttingDown, e); count]);
    for reply in &replies {
        note_read_only(shared, t, reply);
    }
    replies
}

/// The checked slice of the connection's bulk region a bulk request names.
fn bulk_slice(bulk: Option<&Arc<BulkRegion>>, req: &Request) -> Result<BulkSlice, Reply> {
    let (region_offset, len) = match req {
        Request::BulkWrite {
            region_offset, len, ..
        }
        | Request::BulkRead {
            region_offset, len, ..
        } => (*region_offset, *len),
        _ => return Err(Reply::error(ErrorCode::Internal, "not a bulk request")),
    };
    let Some(region) = bulk else {
        return Err(Reply::error(
            ErrorCode::BadRegion,
            "this connection has no bulk region (offer one in the Hello, on a Unix socket)",
        ));
    };
    region
        .slice(region_offset, len)
        .map_err(|e| Reply::error(ErrorCode::BadRegion, e))
}

async fn execute_one(shared: &Arc<Shared>, req: Request, bulk: Option<&Arc<BulkRegion>>) -> Reply {
    match req {
        Request::BulkWrite { .. } | Request::BulkRead { .. } => match bulk_slice(bulk, &req) {
            Ok(slice) => {
                let t = owner(shared, &req);
                on_target(shared, t, req, Some(slice)).await
            }
            Err(refusal) => refusal,
        },
        Request::RegionRead {
            region_id,
            access_key,
            offset,
            len,
        } => match &shared.tcp {
            None => Reply::error(ErrorCode::BadRegion, "the tcp provider is not enabled"),
            Some(f) => f
                .read(region_id, access_key, offset, len)
                .map_or_else(|e| Reply::error(ErrorCode::BadRegion, e.0), Reply::Data),
        },
        Request::Stat => {
            let mut all = Vec::new();
            for reply in fan_out(shared, &Request::Stat).await {
                match reply {
                    Reply::Stat(mut t) => all.append(&mut t),
                    error => return error,
                }
            }
            Reply::Stat(all)
        }
        Request::Sync => {
            for reply in fan_out(shared, &Request::Sync).await {
                if !matches!(reply, Reply::Synced) {
                    return reply;
                }
            }
            Reply::Synced
        }
        Request::ListDkeys { limit, .. } => {
            merge_keys(fan_out_list(shared, &req).await, limit as usize)
        }
        Request::ListObjects { limit, .. } => {
            merge_objects(fan_out(shared, &req).await, limit as usize)
        }
        Request::ListValues { limit, .. } => {
            merge_values(fan_out_list(shared, &req).await, limit as usize)
        }
        Request::Punch {
            scope: PunchScope::Object,
            ..
        } => {
            let mut newest = 0;
            for reply in fan_out(shared, &req).await {
                match reply {
                    Reply::Version(v) => newest = newest.max(v),
                    error => return error,
                }
            }
            Reply::Version(newest)
        }
        Request::Hello(_) | Request::Login(_) | Request::Batch(_) => Reply::error(
            ErrorCode::InvalidArgument,
            format!("{:?} is not allowed here", req.kind()),
        ),
        keyed => {
            let t = owner(shared, &keyed);
            on_target(shared, t, keyed, None).await
        }
    }
}

/// The target owning a keyed request's dkey (0 for others).
fn owner(shared: &Shared, req: &Request) -> usize {
    req.owner(shared.target_count()).unwrap_or(0) as usize
}

/// Runs `req` (with its bulk slice) on target `t`'s xstream; notes a
/// target turned read-only.
async fn on_target(shared: &Arc<Shared>, t: usize, req: Request, bulk: Option<BulkSlice>) -> Reply {
    let reply = on_xstream(shared, t, move || run_here(req, bulk))
        .await
        .unwrap_or_else(|e| Reply::error(ErrorCode::ShuttingDown, e));
    note_read_only(shared, t, &reply);
    reply
}

/// Notes that target `t` turned read-only if `reply` says so.
fn note_read_only(shared: &Shared, t: usize, reply: &Reply) {
    if let Reply::Error {
        code: ErrorCode::ReadOnly,
        ..
    } = reply
    {
        if let Some(flag) = shared.read_only.get(t) {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Runs `run` on target `t`'s xstream: right here when that is the
/// calling one, else over the mesh (`Err`: the mesh refused).
async fn on_xstream<F, Fut, T>(shared: &Arc<Shared>, t: usize, run: F) -> Result<T, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    if ferrite_xstream::current() == Some(XstreamId(t)) {
        return Ok(run().await);
    }
    let run = shared.mesh.run_on(XstreamId(t), TaskClass::Foreground, run);
    run.await.map_err(|e| format!("target {t}: {e}"))
}

/// Fetches `keys` on target `t` as one batch; one reply per key.
async fn fetches_on_target(shared: &Arc<Shared>, t: usize, keys: Vec<Key>) -> Vec<Reply> {
    let n = keys.len();
    let replies = on_xstream(shared, t, move || target::handle_fetches(keys)).await;
    replies.unwrap_or_else(|e| vec![Reply::error(ErrorCode::ShuttingDown, e); n])
}

/// Runs `req` on the calling xstream's target.
async fn run_here(req: Request, bulk: Option<BulkSlice>) -> Reply {
    match bulk {
        Some(slice) => target::handle_bulk(req, slice).await,
        None => target::handle(req).await,
    }
}

async fn fan_out(shared: &Arc<Shared>, req: &Request) -> Vec<Reply> {
    let n = shared.target_count() as usize;
    join_all((0..n).map(|t| on_target(shared, t, req.clone(), None))).await
}

/// Merges per-target sorted, disjoint key lists into one of at most `limit`.
fn merge_keys(replies: Vec<Reply>, limit: usize) -> Reply {
    let split = |reply| match reply {
        Reply::Keys { keys, more } => Ok((keys, more)),
        error => Err(error),
    };
    merge(replies, limit, split, |keys, more| Reply::Keys {
        keys,
        more,
    })
}

/// Merges per-target sorted object lists (an object has keys on several
/// targets) into one of at most `limit`.
fn merge_objects(replies: Vec<Reply>, limit: usize) -> Reply {
    let split = |reply| match reply {
        Reply::Objects { objects, more } => Ok((objects, more)),
        error => Err(error),
    };
    merge(replies, limit, split, |objects, more| Reply::Objects {
        objects,
        more,
    })
}

/// Merges per-target sorted, disjoint (dkey, value) lists into one of at
/// most `limit`, leaving out values past [`LIST_VALUE_BYTES_MAX`] in all
/// (the client fetches those).
fn merge_values(replies: Vec<Reply>, limit: usize) -> Reply {
    let split = |reply| match reply {
        Reply::Values { entries, more } => Ok((entries, more)),
        error => Err(error),
    };
    merge(replies, limit, split, |mut entries, more| {
        let mut left = LIST_VALUE_BYTES_MAX;
        for (_, value) in &mut entries {
            match value {
                Some(v) if v.len() <= left => left -= v.len(),
                _ => *value = None,
            }
        }
        Reply::Values { entries, more }
    })
}

/// Merges the sorted lists `split` takes out of each reply, each item once,
/// and keeps the exact prefix of the listing: a target that has more listed
/// its entries only up to its last one, so nothing past the smallest such
/// last entry is kept (another target's entries may be missing there); then
/// cuts it to `limit` (then more follow); the first error reply wins.
fn merge<T: Ord + Clone>(
    replies: Vec<Reply>,
    limit: usize,
    split: impl Fn(Reply) -> Result<(Vec<T>, bool), Reply>,
    join: impl FnOnce(Vec<T>, bool) -> Reply,
) -> Reply {
    let limit = limit.clamp(1, target::LIST_LIMIT_MAX);
    let mut lists = Vec::with_capacity(replies.len());
    for reply in replies {
        match split(reply) {
            Ok(list) => lists.push(list),
            Err(error) => return error,
        }
    }
    let cutoff = (lists.iter())
        .filter(|(_, more)| *more)
        .filter_map(|(items, _)| items.last())
        .min()
        .cloned();
    let mut more = lists.iter().any(|(_, more)| *more);
    let lists = lists.into_iter().map(|(items, _)| items).collect();
    let mut all = merge_sorted(lists, cutoff.as_ref(), limit + 1);
    if all.len() > limit {
        all.truncate(limit);
        more = true;
    }
    join(all, more)
}

/// The items of the sorted `lists` in order, each once, none past `cutoff`,
/// at most `take`: one pass over the lists' heads (they were sorted by
/// their targets; sorting their concatenation was a tenth of the engine's
/// time in io500's find).
fn merge_sorted<T: Ord>(lists: Vec<Vec<T>>, cutoff: Option<&T>, take: usize) -> Vec<T> {
    // Reversed, so that each list's head is its last item, popped in O(1).
    let mut lists: Vec<Vec<T>> = (lists.into_iter())
        .map(|mut items| {
            items.reverse();
            items
        })
        .collect();
    let mut out: Vec<T> = Vec::with_capacity(take.min(lists.iter().map(Vec::len).sum()));
    while out.len() < take {
        let least = (0..lists.len())
            .filter(|&i| !lists[i].is_empty())
            .min_by(|&a, &b| lists[a].last().cmp(&lists[b].last()));
        let Some(item) = least.and_then(|i| lists[i].pop()) else {
            break;
        };
        if cutoff.is_some_and(|c| item > *c) {
            break;
        }
        if out.last() != Some(&item) {
            out.push(item);
        }
    }
    out
}

/// Entries each of `targets` targets lists for a merged page of `limit`
/// keys that hash over them (dkeys, values): its share of the page with a
/// quarter and [`LIST_SPARE`] to spare, so that together they list about
/// a page and a quarter, not a page each, of which the merge kept one (a
/// directory read page by page was listed twice over by two targets).
/// The merge keeps the exact prefix whatever each target listed.
fn per_target_limit(limit: u32, targets: usize) -> u32 {
    let limit = limit.clamp(1, target::LIST_LIMIT_MAX as u32);
    let share = (u64::from(limit) * 5).div_ceil(4 * targets.max(1) as u64) + LIST_SPARE;
    share.min(u64::from(limit)) as u32
}

/// Entries each target lists beyond its share of a page.
const LIST_SPARE: u64 = 8;

/// `req` (a ListDkeys or ListValues) on every target, each asked for its
/// share of the page ([`per_target_limit`]).
async fn fan_out_list(shared: &Arc<Shared>, req: &Request) -> Vec<Reply> {
    let mut req = req.clone();
    if let Request::ListDkeys { limit, .. } | Request::ListValues { limit, .. } = &mut req {
        *limit = per_target_limit(*limit, shared.target_count() as usize);
    }
    fan_out(shared, &req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sorts_cuts_and_keeps_errors() {
        let a = Reply::Keys {
            keys: vec![b"a".to_vec(), b"d".to_vec()],
            more: false,
        };
        let b = Reply::Keys {
            keys: vec![b"b".to_vec(), b"c".to_vec()],
            more: false,
        };
        match merge_keys(vec![a.clone(), b], 3) {
            Reply::Keys { keys, more } => {
                assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
                assert!(more);
            }
            other => panic!("{other:?}"),
        }
        let err = Reply::error(ErrorCode::Io, "x");
        assert_eq!(merge_keys(vec![a, err.clone()], 3), err);
        let objects = |objects: Vec<u128>, more| Reply::Objects { objects, more };
        // An object with keys on both targets is listed once.
        let merged = merge_objects(
            vec![objects(vec![1, 4], false), objects(vec![2, 4], true)],
            2,
        );
        assert_eq!(merged, objects(vec![1, 2], true));
        let merged = merge_objects(vec![objects(vec![1, 4], false), objects(vec![4], false)], 5);
        assert_eq!(merged, objects(vec![1, 4], false));
    }

    /// Per-target value listings merge in key order, cut to the limit, and
    /// keep at most LIST_VALUE_BYTES_MAX of values in all: later ones are
    /// left out (the client fetches them), their names kept.
    #[test]
    fn merged_values_keep_order_and_the_value_budget() {
        let half = LIST_VALUE_BYTES_MAX / 2;
        let values = |entries: Vec<(&[u8], Option<usize>)>, more| Reply::Values {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.map(|n| vec![k[0]; n])))
                .collect(),
            more,
        };
        let a = values(vec![(b"a", Some(half)), (b"c", Some(half))], false);
        let b = values(
            vec![(b"b", Some(half)), (b"d", None), (b"e", Some(1))],
            false,
        );
        let merged = merge_values(vec![a, b], 4);
        let want = values(
            vec![
                (b"a", Some(half)),
                (b"b", Some(half)),
                (b"c", None),
                (b"d", None),
            ],
            true,
        );
        assert_eq!(merged, want);
        let err = Reply::error(ErrorCode::Io, "x");
        assert_eq!(merge_values(vec![err.clone(), want], 4), err);
    }

    proptest::proptest! {
        /// Merging sorted lists gives what sorting their concatenation,
        /// dropping duplicates and items past the cutoff, and taking the
        /// first `take` gives.
        #[test]
        fn merging_sorted_lists_is_sorting_their_concatenation(
            lists in proptest::collection::vec(
                proptest::collection::btree_set(0u16..200, 0..40), 0..5),
            cutoff in proptest::option::of(0u16..220),
            take in 0usize..100,
        ) {
            let lists: Vec<Vec<u16>> = lists.into_iter().map(|l| l.into_iter().collect()).collect();
            let mut want: Vec<u16> = lists.iter().flatten().copied().collect();
            want.sort();
            want.dedup();
            want.retain(|x| cutoff.is_none_or(|c| *x <= c));
            want.truncate(take);
            proptest::prop_assert_eq!(merge_sorted(lists, cutoff.as_ref(), take), want);
        }
    }

    /// Past the smallest last entry of a target that has more, nothing is
    /// kept: that target's next entries may lie before the others'.
    #[test]
    fn merge_stops_where_a_target_with_more_stopped() {
        let keys = |keys: &[&str], more| Reply::Keys {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            more,
        };
        let merged = merge_keys(
            vec![
                keys(&["a", "c", "e"], true),
                keys(&["b", "d", "f", "g"], false),
            ],
            10,
        );
        assert_eq!(merged, keys(&["a", "b", "c", "d", "e"], true));
        let merged = merge_keys(vec![keys(&["a", "c"], false), keys(&["b", "d"], false)], 10);
        assert_eq!(merged, keys(&["a", "b", "c", "d"], false));
    }

    /// Paging through keys spread over targets, each target asked for its
    /// share of a page, lists every key once, in order, for page sizes
    /// from 1 up, and pages are nearly full.
    #[test]
    fn pages_of_target_shares_list_every_key_once() {
        for targets in 1..=4usize {
            for limit in [1u32, 2, 7, 64, 1024] {
                let all: Vec<Vec<u8>> = (0u32..1000).map(|k| k.to_be_bytes().to_vec()).collect();
                // A fixed, uneven spread (as hashing gives).
                let on = |k: &Vec<u8>| {
                    (k.iter().map(|b| *b as usize * 31).sum::<usize>() * 7 + 3) % targets
                };
                let share = per_target_limit(limit, targets) as usize;
                let (mut listed, mut after, mut pages) = (Vec::new(), None::<Vec<u8>>, 0);
                loop {
                    let replies = (0..targets)
                        .map(|t| {
                            let mut keys: Vec<Vec<u8>> = (all.iter())
                                .filter(|k| on(k) == t && after.as_ref().is_none_or(|a| *k > a))
                                .take(share + 1)
                                .cloned()
                                .collect();
                            let more = keys.len() > share;
                            keys.truncate(share);
                            Reply::Keys { keys, more }
                        })
                        .collect();
                    let Reply::Keys { keys, more } = merge_keys(replies, limit as usize) else {
                        panic!("not keys");
                    };
                    assert!(!keys.is_empty() || !more, "an empty page with more");
                    after = keys.last().cloned().or(after);
                    listed.extend(keys);
                    pages += 1;
                    assert!(pages <= 1000, "{targets} targets, limit {limit}: no end");
                    if !more {
                        break;
                    }
                }
                assert_eq!(listed, all, "{targets} targets, limit {limit}");
                let full = all.len().div_ceil(limit as usize);
                assert!(
                    pages <= full + full / 4 + 1,
                    "{targets} targets, limit {limit}: {pages} pages"
                );
            }
        }
    }
}
