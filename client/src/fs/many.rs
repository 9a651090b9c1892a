//! Namespace operations on many files at once, each file with its own
//! outcome: the data of a group's new files goes to the engine as one
//! batch, their sized entries as a second; the name removals of a group as
//! one batch, the removal of their data as another. Every file keeps the
//! semantics of the one-file operation (a create is a conditional insert
//! that fails that file with `EEXIST`; a file's data and size are
//! acknowledged before its result is), only the round trips are shared.

use super::entry::{Entry, EntryKind};
use super::error::{client_err, unexpected_reply, FsError, FsResult};
use super::{check_name, file_handle, new_object_id, FsFuture, Namespace, REMOVE_SCOPE};
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

/// A batch reply that must acknowledge an update (`op`, for `what`).
fn acked(
    what: String,
    op: &'static str,
    url: String,
    reply: Result<Reply, String>,
) -> FsResult<()> {
    match reply {
        Ok(Reply::Version(_)) => Ok(()),
        Ok(other) => Err(unexpected_reply(what, op, url, other)),
        Err(d) => Err(batch_error(what, d, url)),
    }
}

impl Namespace {
    /// Creates every file of `files` (mode `mode`) with its data: two round
    /// trips for the whole group, one result per file in order. The data
    /// goes first, into each file's new object (no name leads to it yet),
    /// then the entries, already sized, as conditional inserts: whoever
    /// finds the name finds the data, and each file costs two records, not
    /// three (no size update after the data). A create that loses to an
    /// existing name fails with `EEXIST` and removes the data it wrote; a
    /// client that dies between the two round trips leaves unreachable data.
    pub fn create_files(&self, files: &[NewFile<'_>], mode: u32) -> Vec<FsResult<()>> {
        let mut results: Vec<FsResult<()>> = files.iter().map(|f| check_name(f.name)).collect();
        let entries: Vec<Entry> = files
            .iter()
            .map(|f| {
                let mut e = Entry::new(EntryKind::File, mode, new_object_id(), self.chunk_bytes);
                e.size = f.data.len() as u64;
                e
            })
            .collect();
        self.write_new_data(files, &entries, &mut results);
        let inserting: Vec<usize> = (0..files.len()).filter(|&i| results[i].is_ok()).collect();
        let inserts = inserting
            .iter()
            .map(|&i| Request::CondUpdate {
                key: self.entry_key(files[i].dir, files[i].name),
                expected_version: 0,
                value: entries[i].encode(),
            })
            .collect();
        let mut orphans = Vec::new();
        for (&i, reply) in inserting.iter().zip(batch_replies(self, inserts)) {
            let f = &files[i];
            let what = || format!("create {}", f.name);
            results[i] = match reply.map(|r| crate::client::reply::cond(0, r)) {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(ClientError::VersionMismatch { .. })) => {
                    // The name was there: nothing will ever reach this data.
                    if !f.data.is_empty() {
                        orphans.push((entries[i].clone(), f.name));
                    }
                    Err(FsError::Exists(f.name.into()))
                }
                Ok(Err(err)) => Err(client_err(what())(err)),
                // Unknown whether the entry landed: its data stays.
                Err(d) => Err(batch_error(what(), d, self.client.url())),
            };
        }
        if !orphans.is_empty() {
            if let Err(e) = futures::executor::block_on(self.remove_data_many(&orphans)) {
                tracing::warn!("create: removing the data of files that existed: {e}");
            }
        }
        results
    }

    /// The first round trip of [`create_files`](Self::create_files): the
    /// data of every file still `Ok` in `results`, at offset 0 of its new
    /// object, all in one batch. A file whose write fails gets that error.
    fn write_new_data(
        &self,
        files: &[NewFile<'_>],
        entries: &[Entry],
        results: &mut [FsResult<()>],
    ) {
        let mut requests = Vec::new();
        let mut leases = Vec::new();
        let mut spans = Vec::new();
        for (i, (f, e)) in files.iter().zip(entries).enumerate() {
            if results[i].is_ok() && !f.data.is_empty() {
                let (mut r, mut l) = self.write_requests(e, 0, f.data);
                spans.push((i, r.len()));
                requests.append(&mut r);
                leases.append(&mut l);
            }
        }
        if requests.is_empty() {
            return;
        }
        let replies = batch_replies(self, requests);
        // Bulk slots come back once the batch was answered; the engine may
        // still use those of one that was not.
        if replies.iter().any(|r| r.is_err()) {
            leases.into_iter().for_each(BulkLease::abandon);
        }
        let mut replies = replies.into_iter();
        for (i, n) in spans {
            for reply in replies.by_ref().take(n) {
                let what = format!("write {}", files[i].name);
                let r = acked(what, "extent write", self.client.url(), reply);
                if results[i].is_ok() {
                    results[i] = r;
                }
            }
        }
    }

    /// Removes the files (or symlinks) `files` (directory object, name):
    /// their names in one round trip after one-sided lookups, one result per
    /// file in order. The removal of their data is sent and returned as one
    /// future to await later (`None`: nothing to remove), as with
    /// [`unlink_behind`](Self::unlink_behind).
    pub fn unlink_files(&self, files: &[(u128, &str)]) -> (Vec<FsResult<()>>, Option<FsFuture>) {
        let keys: Vec<Key> = files.iter().map(|(d, n)| self.entry_key(*d, n)).collect();
        let entries = self.lookup_keys(files, &keys);
        let mut results: Vec<FsResult<()>> = Vec::with_capacity(files.len());
        let mut punches = Vec::new();
        let mut removed = Vec::new();
        for (i, entry) in entries.into_iter().enumerate() {
            results.push(match entry {
                Ok((e, _)) if e.kind == EntryKind::Dir => Err(FsError::IsDir(files[i].1.into())),
                Ok((e, _)) => {
                    punches.push(Request::Punch {
                        scope: REMOVE_SCOPE,
                        key: keys[i].clone(),
                    });
                    removed.push((i, e));
                    Ok(())
                }
                Err(err) => Err(err),
            });
        }
        let mut data = Vec::new();
        for ((i, e), reply) in removed.into_iter().zip(batch_replies(self, punches)) {
            let name = files[i].1;
            results[i] = acked(format!("remove {name}"), "punch", self.client.url(), reply);
            if results[i].is_ok() && e.kind == EntryKind::File && e.size > 0 {
                data.push((e, name));
            }
        }
        let behind = (!data.is_empty()).then(|| self.remove_data_many(&data));
        (results, behind)
    }

    /// The entries `files` (directory object, name) at once, one result per
    /// name, in order, each what [`lookup_versioned`](Self::lookup_versioned)
    /// of it returns (a bad name fails alone). The one-sided reads overlap;
    /// the keys they cannot resolve go to the engine in one batch.
    pub fn lookup_entries(&self, files: &[(u128, &str)]) -> Vec<FsResult<(Entry, u64)>> {
        let keys: Vec<Key> = files.iter().map(|(d, n)| self.entry_key(*d, n)).collect();
        self.lookup_keys(files, &keys)
    }

    /// Reads the start of each of the files `files` (directory object,
    /// name) into `bufs[i]`, as much as it holds: one result per file, in
    /// order, each what [`open`](Self::open) then [`read`](Self::read) at
    /// offset 0 return (the bytes read). The entries are looked up together;
    /// then the buckets and records of the files' first chunks start loading
    /// at once (shm), before the files are read one by one.
    pub fn read_files(&self, files: &[(u128, &str)], bufs: &mut [Vec<u8>]) -> Vec<FsResult<usize>> {
        if bufs.len() != files.len() {
            let bad = || Err(FsError::Invalid("read_files".into(), "one buffer per file"));
            return files.iter().map(|_| bad()).collect();
        }
        let opened: Vec<FsResult<_>> = (self.lookup_entries(files).into_iter().zip(files))
            .map(|(r, &(dir, name))| r.and_then(|(e, version)| file_handle(dir, name, e, version)))
            .collect();
        let first_chunks: Vec<Key> = (opened.iter().flatten())
            .map(|fh| self.chunk_key(fh.entry().object, 0))
            .collect();
        let record_keys: Vec<_> = first_chunks.iter().map(Key::as_record_key).collect();
        self.client.prefetch(&record_keys);
        (opened.into_iter().zip(bufs.iter_mut()))
            .map(|(fh, buf)| self.read(&fh?, 0, buf))
            .collect()
    }

    /// [`lookup_entries`](Self::lookup_entries) with the files' entry keys.
    fn lookup_keys(&self, files: &[(u128, &str)], keys: &[Key]) -> Vec<FsResult<(Entry, u64)>> {
        let record_keys: Vec<_> = keys.iter().map(Key::as_record_key).collect();
        let mut values = vec![Vec::new(); files.len()];
        let found = match self.client.get_many_into(&record_keys, &mut values) {
            Ok(found) => found,
            Err(e) => {
                let (d, url) = (e.to_string(), self.client.url());
                return (files.iter())
                    .map(|(_, n)| Err(batch_error(format!("lookup {n}"), d.clone(), url.clone())))
                    .collect();
            }
        };
        let each = files.iter().zip(found.into_iter().zip(&values));
        each.map(|(&(_, name), (r, value))| {
            check_name(name)?;
            match r {
                Err(e) => Err(client_err(format!("lookup {name}"))(e)),
                Ok(None) => Err(FsError::NotFound(name.to_string())),
                Ok(Some(version)) => Entry::decode(value)
                    .map(|e| (e, version))
                    .map_err(|e| FsError::Corrupt(name.to_string(), e)),
            }
        })
        .collect()
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
                key: self.chunk_key(e.object, i),
            }));
        }
        let sent: Vec<_> = punches
            .chunks(ferrite_proto::rpc::message::BATCH_ITEMS_MAX)
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
