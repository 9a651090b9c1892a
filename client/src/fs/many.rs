//! Namespace operations on many files at once, each file with its own
//! outcome: the creates of a group go to the engine as one batch, their
//! writes and size updates as a second; the name removals of a group as one
//! batch, the removal of their data as another. Every file keeps the
//! semantics of the one-file operation (a create is a conditional insert
//! that fails that file with `EEXIST`; a file's data and size are
//! acknowledged before its result is), only the round trips are shared.

use super::entry::{Entry, EntryKind};
use super::error::{client_err, unexpected_reply, FsError, FsResult};
use super::file::{chunk_dkey, CHUNK_AKEY};
use super::{check_name, new_object_id, FileHandle, FsFuture, Namespace, REMOVE_SCOPE};
use crate::client::bulk::BulkLease;
use crate::client::{Error as ClientError, Key, Reply, Request};

/// One file of [`Namespace::create_files`]: directory object, name, and the
/// data written at offset 0 before the close (empty: none).
#[derive(Debug, Clone, Copy)]
pub struct NewFile<'a> {
    pub dir: u128,
    pub name: &'a str,
    pub data: &'a [u8],
}

/// Chunks a file's data removal punches chunk by chunk at most (beyond,
/// the whole object is punched).
pub(super) const TARGETED_CHUNKS_MAX: u64 = 16;

/// The replies of `requests` sent as batches, or the error of the batch,
/// as text for every item (a client error is not `Clone`).
fn batch_replies(ns: &Namespace, requests: Vec<Request>) -> Vec<Result<Reply, String>> {
    let n = requests.len();
    match ns.client.batch(requests) {
        Ok(replies) => replies.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e.to_string()); n],
    }
}

/// A batch failure as the error of file `name`.
fn batch_error(what: String, detail: String, url: String) -> FsError {
    client_err(what)(ClientError::Disconnected {
        url,
        op: "batch",
        detail,
    })
}

impl Namespace {
    /// Creates every file of `files` (mode `mode`), writes its data and
    /// closes it: two round trips for the whole group (the creates, then
    /// the writes with the size updates), one result per file in order.
    pub fn create_files(&self, files: &[NewFile<'_>], mode: u32) -> Vec<FsResult<()>> {
        let mut results: Vec<FsResult<()>> = Vec::with_capacity(files.len());
        let mut inserts = Vec::new();
        let mut created = Vec::new();
        for (i, f) in files.iter().enumerate() {
            results.push(check_name(f.name));
            if results[i].is_ok() {
                let e = Entry::new(EntryKind::File, mode, new_object_id(), self.chunk_bytes);
                inserts.push(Request::CondUpdate {
                    key: self.entry_key(f.dir, f.name),
                    expected_version: 0,
                    value: e.encode(),
                });
                created.push((i, e));
            }
        }
        let mut handles = Vec::new();
        for ((i, e), reply) in created.into_iter().zip(batch_replies(self, inserts)) {
            let f = &files[i];
            let what = || format!("create {}", f.name);
            let version = reply
                .map_err(|d| batch_error(what(), d, self.client.url()))
                .and_then(|r| match crate::client::reply::cond(0, r) {
                    Ok(v) => Ok(v),
                    Err(ClientError::VersionMismatch { .. }) => Err(FsError::Exists(f.name.into())),
                    Err(err) => Err(client_err(what())(err)),
                });
            match version {
                Ok(v) if !f.data.is_empty() => {
                    handles.push((i, FileHandle::new(f.dir, f.name, e, v)))
                }
                Ok(_) => {}
                Err(err) => results[i] = Err(err),
            }
        }
        self.write_and_close_files(files, handles, &mut results);
        results
    }

    /// The second round trip of [`create_files`](Self::create_files): each
    /// handle's data and size update, all in one batch.
    fn write_and_close_files(
        &self,
        files: &[NewFile<'_>],
        handles: Vec<(usize, FileHandle)>,
        results: &mut [FsResult<()>],
    ) {
        let mut requests = Vec::new();
        let mut leases = Vec::new();
        let mut closing = Vec::with_capacity(handles.len());
        for (i, fh) in handles {
            let (mut r, mut l, seen) = self.close_batch(&fh, 0, files[i].data);
            closing.push((i, fh, seen, r.len()));
            requests.append(&mut r);
            leases.append(&mut l);
        }
        let replies = batch_replies(self, requests);
        // Bulk slots come back once the batch was answered; the engine may
        // still use those of one that was not.
        if replies.iter().any(|r| r.is_err()) {
            leases.into_iter().for_each(BulkLease::abandon);
        }
        let mut replies = replies.into_iter();
        for (i, fh, seen, n) in closing {
            let mine: Result<Vec<Reply>, String> = replies.by_ref().take(n).collect();
            results[i] = match mine {
                Ok(mine) => self.finish_close(&fh, seen, mine),
                Err(d) => Err(batch_error(fh.name().to_string(), d, self.client.url())),
            };
        }
    }

    /// Removes the files (or symlinks) `files` (directory object, name):
    /// their names in one round trip after one-sided lookups, one result per
    /// file in order. The removal of their data is sent and returned as one
    /// future to await later (`None`: nothing to remove), as with
    /// [`unlink_behind`](Self::unlink_behind).
    pub fn unlink_files(&self, files: &[(u128, &str)]) -> (Vec<FsResult<()>>, Option<FsFuture>) {
        let mut results: Vec<FsResult<()>> = files.iter().map(|(_, n)| check_name(n)).collect();
        let keys: Vec<Key> = files.iter().map(|(d, n)| self.entry_key(*d, n)).collect();
        let record_keys: Vec<_> = keys.iter().map(Key::as_record_key).collect();
        let mut values = vec![Vec::new(); files.len()];
        let found = match self.client.get_many_into(&record_keys, &mut values) {
            Ok(found) => found,
            Err(e) => {
                let d = e.to_string();
                let url = self.client.url();
                let all = files
                    .iter()
                    .map(|(_, n)| Err(batch_error(format!("lookup {n}"), d.clone(), url.clone())));
                return (all.collect(), None);
            }
        };
        let mut punches = Vec::new();
        let mut removed = Vec::new();
        for (i, (r, value)) in found.into_iter().zip(&values).enumerate() {
            let name = files[i].1;
            let entry = match (results[i].is_ok(), r) {
                (false, _) => continue,
                (_, Err(e)) => Err(client_err(format!("lookup {name}"))(e)),
                (_, Ok(None)) => Err(FsError::NotFound(name.to_string())),
                (_, Ok(Some(_))) => {
                    Entry::decode(value).map_err(|e| FsError::Corrupt(name.to_string(), e))
                }
            };
            match entry {
                Ok(e) if e.kind == EntryKind::Dir => results[i] = Err(FsError::IsDir(name.into())),
                Ok(e) => {
                    punches.push(Request::Punch {
                        scope: REMOVE_SCOPE,
                        key: keys[i].clone(),
                    });
                    removed.push((i, e));
                }
                Err(err) => results[i] = Err(err),
            }
        }
        let mut data = Vec::new();
        for ((i, e), reply) in removed.into_iter().zip(batch_replies(self, punches)) {
            let name = files[i].1;
            results[i] = match reply {
                Ok(Reply::Version(_)) => Ok(()),
                Ok(other) => Err(unexpected_reply(
                    format!("remove {name}"),
                    "punch",
                    self.client.url(),
                    other,
                )),
                Err(d) => Err(batch_error(format!("remove {name}"), d, self.client.url())),
            };
            if results[i].is_ok() && e.kind == EntryKind::File && e.size > 0 {
                data.push((e, name));
            }
        }
        let behind = (!data.is_empty()).then(|| self.remove_data_many(&data));
        (results, behind)
    }

    /// Removes the chunks of the files `removed`: small files' chunk dkeys
    /// inside their size, in batches sent now (one target each); big files'
    /// whole objects (one request to every target each) before this returns.
    /// Chunks a crashed writer wrote past the published size of a small file
    /// are not reclaimed.
    pub(super) fn remove_data_many(&self, removed: &[(Entry, &str)]) -> FsFuture {
        let mut punches = Vec::new();
        let mut whole = Vec::new();
        for (e, name) in removed {
            let chunks = e.size.div_ceil(u64::from(e.chunk_size.max(1)));
            if chunks > TARGETED_CHUNKS_MAX {
                whole.push(self.punch_object(e.object, name));
                continue;
            }
            punches.extend((0..chunks).map(|i| Request::Punch {
                scope: REMOVE_SCOPE,
                key: Key::new(self.container, e.object, &chunk_dkey(i), CHUNK_AKEY),
            }));
        }
        let sent: Vec<_> = punches
            .chunks(ferrite_proto::rpc::message::MAX_BATCH_ITEMS)
            .map(|part| self.client.batch_async(part.to_vec()))
            .collect();
        let url = self.client.url();
        Box::pin(async move {
            whole.into_iter().collect::<FsResult<Vec<()>>>()?;
            for batch in futures::future::join_all(sent).await {
                for r in batch.map_err(client_err("remove file data"))? {
                    if !matches!(r, Reply::Version(_)) {
                        return Err(unexpected_reply("remove file data", "punch", url, r));
                    }
                }
            }
            Ok(())
        })
    }
}
