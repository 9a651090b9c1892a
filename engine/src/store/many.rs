//! Several writes as one group: [`Store::write_many`]. A batch of creates
//! (conditional inserts), deletes (punches) or updates that a client sends
//! together reaches its target as one group, is appended in order and is
//! acknowledged after one wait for the commit that carries it, instead of a
//! task, a waker and a wait for durability per write.

use super::log::AppendSpec;
use super::{Condition, Conditional, Store, StoreError};
use crate::store::error::Result;
use ferrite_proto::key::{KeyHash, RecordKey};
use ferrite_proto::record::{record_len, RecordFlags};

/// One write of [`Store::write_many`]: what [`Store::update`],
/// [`Store::update_if`], [`Store::update_extent`], [`Store::punch`] or
/// [`Store::punch_dkey`] does alone.
#[derive(Debug, Clone, Copy)]
pub enum WriteOp<'a> {
    /// Replace the key's single value.
    Update { key: RecordKey<'a>, value: &'a [u8] },
    /// Replace it only if `cond` holds.
    UpdateIf {
        key: RecordKey<'a>,
        value: &'a [u8],
        cond: Condition,
    },
    /// Write `bytes` at `offset` of the key's byte array.
    Extent {
        key: RecordKey<'a>,
        offset: u64,
        bytes: &'a [u8],
    },
    /// Delete the akey (`dkey`: every akey of the key's dkey; the key's
    /// akey is then empty).
    Punch { key: RecordKey<'a>, dkey: bool },
}

impl<'a> WriteOp<'a> {
    fn key(&self) -> &RecordKey<'a> {
        match self {
            Self::Update { key, .. }
            | Self::UpdateIf { key, .. }
            | Self::Extent { key, .. }
            | Self::Punch { key, .. } => key,
        }
    }

    fn value(&self) -> &'a [u8] {
        match self {
            Self::Update { value, .. } | Self::UpdateIf { value, .. } => value,
            Self::Extent { bytes, .. } => bytes,
            Self::Punch { .. } => &[],
        }
    }
}

/// What the synchronous step of one write did.
enum Step {
    /// Appended (its append sequence number) or refused by its condition
    /// (no record).
    Done(Option<u64>, Conditional),
    /// A conditional write whose key has a write waiting to be published:
    /// it runs, with every later one, after the group's commit.
    Wait,
}

impl Store {
    /// Runs `ops` as one group: appended in order, then made durable and
    /// published by one wait for the group commit that carries them all.
    /// Returns, per op, what it returns alone: `Applied(version)` (always,
    /// for updates and punches), `Conflict` for a conditional update whose
    /// condition failed, or why it was refused; every write a failed commit
    /// carried fails. A conditional update whose key has a write pending
    /// (another op of the group, say) is decided only after that write is
    /// published: it and the ops after it run one by one after the group,
    /// so the outcome is that of running the ops in order.
    pub async fn write_many(&self, ops: &[WriteOp<'_>]) -> Vec<Result<Conditional>> {
        // Each append first looks the key up in its bucket chain and the
        // ring (`held`): start those memory loads for all of them at once.
        let hashes: Vec<KeyHash> = ops.iter().map(|op| op.key().hash()).collect();
        self.prefetch_keys(&hashes);
        let mut out = Vec::with_capacity(ops.len());
        // The last append's sequence number: once it is committed, so is
        // every append before it.
        let mut last = None;
        for op in ops {
            match self.append_op(op).await {
                Ok(Step::Done(e, outcome)) => {
                    last = e.or(last);
                    out.push(Ok(outcome));
                }
                Ok(Step::Wait) => break,
                Err(e) => out.push(Err(e)),
            }
        }
        if let Some(seq) = last {
            if let Err(first) = self.wait_durable(seq).await {
                self.fail_applied(&mut out, first);
            }
        }
        for op in &ops[out.len()..] {
            out.push(self.write_one(op).await);
        }
        out
    }

    /// Appends one op of a group (its room reserved first).
    async fn append_op(&self, op: &WriteOp<'_>) -> Result<Step> {
        let (key, value) = (op.key(), op.value());
        Self::validate(key, value.len())?;
        match *op {
            WriteOp::UpdateIf { cond, .. } => {
                let len = record_len(key, value.len()) as u64;
                self.admit_write(key, len, false)?;
                self.reserve_space(len, None, false).await?;
                Ok(match self.append_if(key, value, cond)? {
                    None => Step::Wait,
                    Some((_, c @ Conditional::Conflict(_))) => Step::Done(None, c),
                    Some((e, applied)) => Step::Done(Some(e), applied),
                })
            }
            WriteOp::Update { .. } => {
                let spec = AppendSpec::new(key, value, RecordFlags::empty(), 0);
                let (e, version) = self.append(spec, Some(false)).await?;
                Ok(Step::Done(Some(e), Conditional::Applied(version)))
            }
            WriteOp::Extent { offset, bytes, .. } => {
                let spec = Self::extent_spec(key, offset, bytes)?;
                let (e, version) = self.append(spec, Some(true)).await?;
                Ok(Step::Done(Some(e), Conditional::Applied(version)))
            }
            WriteOp::Punch { dkey, .. } => {
                let flags = punch_flags(dkey).with(RecordFlags::TOMBSTONE);
                let spec = AppendSpec::new(key, &[], flags, 0);
                let (e, version) = self.append(spec, None).await?;
                Ok(Step::Done(Some(e), Conditional::Applied(version)))
            }
        }
    }

    /// One op alone, as its own method runs it.
    async fn write_one(&self, op: &WriteOp<'_>) -> Result<Conditional> {
        match *op {
            WriteOp::UpdateIf { key, value, cond } => self.update_if(&key, value, cond).await,
            WriteOp::Update { key, value } => {
                self.update(&key, value).await.map(Conditional::Applied)
            }
            WriteOp::Extent { key, offset, bytes } => {
                (self.update_extent(&key, offset, bytes).await).map(Conditional::Applied)
            }
            WriteOp::Punch { key, dkey } => {
                (self.punch_with(&key, punch_flags(dkey)).await).map(Conditional::Applied)
            }
        }
    }

    /// After a failed group commit: every write it carried (each applied
    /// outcome) fails, the first with the commit's error, the others with
    /// the poisoned store's.
    fn fail_applied(&self, out: &mut [Result<Conditional>], first: StoreError) {
        let mut first = Some(first);
        for r in out
            .iter_mut()
            .filter(|r| matches!(r, Ok(Conditional::Applied(_))))
        {
            let e = first.take().unwrap_or_else(|| match self.check_writable() {
                Err(poisoned) => poisoned,
                Ok(()) => StoreError::Invalid("the group commit failed".into()),
            });
            *r = Err(e);
        }
    }
}

/// The scope flags of a punch (`dkey`: of a whole dkey), as
/// [`Store::punch_with`] takes them.
fn punch_flags(dkey: bool) -> RecordFlags {
    match dkey {
        true => RecordFlags::empty().with(RecordFlags::PUNCH_DKEY),
        false => RecordFlags::empty(),
    }
}
