//! `ErrorBdev`: fails or corrupts chosen I/Os of the device below.

use super::forward_geometry;
use crate::{Bdev, BdevError, BdevRef, Channel, IoBuf, IoFuture, IoType, Result};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// What a firing rule does to the I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The I/O is not passed down; it fails with an injected I/O error.
    Fail,
    /// Data I/O completes with damaged data: a read returns its buffer with
    /// one byte inverted, a write stores its data with one byte inverted (the
    /// caller's buffer comes back unchanged). Flush, write_zeroes and unmap
    /// are silently skipped and report success (a lost operation).
    Corrupt,
}

/// Which I/Os to hit. Built with [`ErrorRule::fail`] or
/// [`ErrorRule::corrupt`] and narrowed with the builder methods; all
/// conditions must hold for the rule to fire.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorRule {
    /// Kinds of I/O the rule looks at (`readv`/`writev` count as
    /// `Read`/`Write`); empty means all.
    pub io_types: Vec<IoType>,
    /// Only I/Os overlapping this byte range.
    pub range: Option<Range<u64>>,
    /// Only the n-th I/O that matches kind and range (1-based).
    pub nth: Option<u64>,
    /// Chance that a matching I/O is hit, drawn from the bdev's seeded PRNG.
    pub probability: f64,
    /// Stop firing after this many hits.
    pub max_hits: Option<u64>,
    pub fault: Fault,
}

impl ErrorRule {
    /// Fail every I/O of these kinds (empty: all kinds).
    pub fn fail(io_types: &[IoType]) -> Self {
        Self {
            io_types: io_types.to_vec(),
            range: None,
            nth: None,
            probability: 1.0,
            max_hits: None,
            fault: Fault::Fail,
        }
    }
    /// Corrupt every I/O of these kinds (empty: all kinds).
    pub fn corrupt(io_types: &[IoType]) -> Self {
        Self {
            fault: Fault::Corrupt,
            ..Self::fail(io_types)
        }
    }
    pub fn range(mut self, bytes: Range<u64>) -> Self {
        self.range = Some(bytes);
        self
    }
    pub fn nth(mut self, n: u64) -> Self {
        self.nth = Some(n);
        self
    }
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }
    pub fn max_hits(mut self, n: u64) -> Self {
        self.max_hits = Some(n);
        self
    }
}

struct RuleState {
    rule: ErrorRule,
    seen: u64,
    hits: u64,
}

struct ErrorState {
    rules: Vec<RuleState>,
    rng: StdRng,
    injected: u64,
}

impl ErrorState {
    /// The fault to apply to this I/O, if any, and a random byte index for
    /// corruption.
    fn decide(&mut self, io_type: IoType, offset: u64, len: u64) -> Option<(Fault, u64)> {
        let end = offset.saturating_add(len.max(1));
        for r in &mut self.rules {
            let rule = &r.rule;
            let kind_ok = rule.io_types.is_empty() || rule.io_types.contains(&io_type);
            let range_ok = rule
                .range
                .as_ref()
                .is_none_or(|range| offset < range.end && range.start < end);
            if !kind_ok || !range_ok {
                continue;
            }
            r.seen += 1;
            if rule.nth.is_some_and(|n| n != r.seen) || rule.max_hits.is_some_and(|m| r.hits >= m) {
                continue;
            }
            if rule.probability < 1.0 && !self.rng.gen_bool(rule.probability.clamp(0.0, 1.0)) {
                continue;
            }
            r.hits += 1;
            self.injected += 1;
            return Some((rule.fault, self.rng.gen_range(0..len.max(1))));
        }
        None
    }
}

/// A device that fails or corrupts the I/Os its rules pick. With no rules
/// it passes everything through.
pub struct ErrorBdev {
    inner: BdevRef,
    state: Arc<Mutex<ErrorState>>,
}

impl ErrorBdev {
    /// Wraps `inner`; `seed` drives the probability draws and the corrupted
    /// byte positions.
    pub fn new(inner: BdevRef, seed: u64) -> Self {
        Self {
            inner,
            state: Arc::new(Mutex::new(ErrorState {
                rules: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                injected: 0,
            })),
        }
    }
    /// Adds a rule; rules are tried in order, the first that fires wins.
    /// Takes effect on open channels too.
    pub fn add_rule(&self, rule: ErrorRule) {
        lock(&self.state).rules.push(RuleState {
            rule,
            seen: 0,
            hits: 0,
        });
    }
    /// Removes every rule: I/O passes through again.
    pub fn clear_rules(&self) {
        lock(&self.state).rules.clear();
    }
    /// How many I/Os were failed or corrupted so far.
    pub fn injected(&self) -> u64 {
        lock(&self.state).injected
    }
}

fn lock(state: &Mutex<ErrorState>) -> std::sync::MutexGuard<'_, ErrorState> {
    // A panic while holding the lock leaves consistent counters: go on.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Bdev for ErrorBdev {
    forward_geometry!();
    fn channel(&self) -> Result<Box<dyn Channel>> {
        Ok(Box::new(ErrorChannel {
            inner: self.inner.channel()?,
            name: self.inner.name().to_string(),
            state: Arc::clone(&self.state),
        }))
    }
}

struct ErrorChannel {
    inner: Box<dyn Channel>,
    name: String,
    state: Arc<Mutex<ErrorState>>,
}

fn flip(bufs: &mut [IoBuf], mut at: u64) {
    for b in bufs {
        if at < b.len() as u64 {
            b.as_mut_slice()[at as usize] ^= 0xFF;
            return;
        }
        at -= b.len() as u64;
    }
}

impl ErrorChannel {
    fn decide(&self, io_type: IoType, offset: u64, len: u64) -> Option<(Fault, u64)> {
        lock(&self.state).decide(io_type, offset, len)
    }
    fn injected(&self, op: &'static str, offset: u64) -> BdevError {
        BdevError::Io {
            device: self.name.clone(),
            op,
            offset,
            source: std::io::Error::other("injected I/O error (ErrorBdev)"),
        }
    }
    async fn read_bufs(&self, offset: u64, mut bufs: Vec<IoBuf>) -> Result<Vec<IoBuf>> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        let fault = self.decide(IoType::Read, offset, len);
        if let Some((Fault::Fail, _)) = fault {
            return Err(self.injected("read", offset));
        }
        bufs = match bufs.len() {
            1 => vec![self.inner.read(offset, bufs.remove(0)).await?],
            _ => self.inner.readv(offset, bufs).await?,
        };
        if let Some((Fault::Corrupt, at)) = fault {
            flip(&mut bufs, at);
        }
        Ok(bufs)
    }
    async fn write_bufs(&self, offset: u64, mut bufs: Vec<IoBuf>) -> Result<Vec<IoBuf>> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        let fault = self.decide(IoType::Write, offset, len);
        match fault {
            Some((Fault::Fail, _)) => return Err(self.injected("write", offset)),
            Some((Fault::Corrupt, at)) => flip(&mut bufs, at),
            None => {}
        }
        let mut bufs = match bufs.len() {
            1 => vec![self.inner.write(offset, bufs.remove(0)).await?],
            _ => self.inner.writev(offset, bufs).await?,
        };
        if let Some((Fault::Corrupt, at)) = fault {
            flip(&mut bufs, at);
        }
        Ok(bufs)
    }
    async fn other(&self, io_type: IoType, op: &'static str, offset: u64, len: u64) -> Result<()> {
        match self.decide(io_type, offset, len) {
            Some((Fault::Fail, _)) => Err(self.injected(op, offset)),
            Some((Fault::Corrupt, _)) => Ok(()),
            None => match io_type {
                IoType::Flush => self.inner.flush().await,
                IoType::Unmap => self.inner.unmap(offset, len).await,
                _ => self.inner.write_zeroes(offset, len).await,
            },
        }
    }
}

fn single(r: Result<Vec<IoBuf>>) -> Result<IoBuf> {
    r?.pop().ok_or_else(|| BdevError::Other {
        device: "error bdev".into(),
        reason: "internal: buffer lost".into(),
    })
}

impl Channel for ErrorChannel {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn alloc(&self, len: usize) -> Result<IoBuf> {
        self.inner.alloc(len)
    }
    fn read(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(async move { single(self.read_bufs(offset, vec![buf]).await) })
    }
    fn write(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, IoBuf> {
        Box::pin(async move { single(self.write_bufs(offset, vec![buf]).await) })
    }
    fn readv(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(self.read_bufs(offset, bufs))
    }
    fn writev(&self, offset: u64, bufs: Vec<IoBuf>) -> IoFuture<'_, Vec<IoBuf>> {
        Box::pin(self.write_bufs(offset, bufs))
    }
    fn flush(&self) -> IoFuture<'_, ()> {
        Box::pin(self.other(IoType::Flush, "flush", 0, 0))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.other(IoType::WriteZeroes, "write_zeroes", offset, len))
    }
    fn unmap(&self, offset: u64, len: u64) -> IoFuture<'_, ()> {
        Box::pin(self.other(IoType::Unmap, "unmap", offset, len))
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
}
