//! One queue pair of a verbs endpoint: its registered landing buffer, the
//! reads in flight on it (matched to their completions by `wr_id`), and the
//! side-channel socket whose closing says the engine is gone.
//!
//! Every read gets its own range of the landing buffer and its own
//! `wr_id`, so blocking reads ([`Conn::read_wait`]) and any number of
//! asynchronous ones (`posted.rs`) share the queue pair: whoever polls the
//! completion queue files every completion it finds under its read. An
//! asynchronous read's bytes are copied out of the landing buffer as soon
//! as its completion is seen (by whichever caller polls), so that a
//! blocking read never waits for a future nobody polls to free its range.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferrite_engine::fabric::verbs::{MemoryRegion, RcQp, ReadWr, WorkCompletion, MAX_BATCH};

/// Reads one queue pair keeps in flight at most (its send queue depth).
pub(super) const QP_DEPTH: usize = 64;
/// How long a read may wait for its completion when neither the queue
/// pair's retries nor the side channel say the engine is gone.
pub(super) const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Empty polls of the completion queue between two looks at the clock and
/// the side channel: on an emulated clock every reading of it would delay
/// noticing the completion.
const CHECK_EVERY: u32 = 1024;
/// Landing ranges start at multiples of this.
const ALIGN: usize = 64;

/// Where one read goes: `len` bytes at `addr` of the engine (rkey).
#[derive(Debug, Clone, Copy)]
pub(super) struct Remote {
    pub addr: u64,
    pub rkey: u32,
    pub len: usize,
}

/// How a read in flight stands.
enum Landed {
    Posted,
    /// Completed; a detached read's bytes were copied out (its landing
    /// range is free).
    Done(Result<Option<Vec<u8>>, String>),
}

/// One read posted on the queue pair.
struct Flight {
    wr_id: u64,
    at: usize,
    len: usize,
    /// Copy the bytes out at completion and free the range.
    detach: bool,
    /// Its poster is gone: drop it once completed.
    abandoned: bool,
    landed: Landed,
}

impl Flight {
    /// Whether it still holds its landing range.
    fn holds_range(&self) -> bool {
        match &self.landed {
            Landed::Posted => true,
            Landed::Done(Ok(None)) => true,
            Landed::Done(_) => false,
        }
    }
}

/// One connected queue pair with its registered landing buffer.
pub(super) struct Conn {
    qp: RcQp,
    // Declared after qp: the registration goes after the queue pair and
    // before the memory it covers.
    mr: MemoryRegion,
    buf: Box<[u8]>,
    /// Non-blocking; the engine never writes after the exchange, so a read
    /// of 0 bytes means it closed (stopped or was killed).
    side: TcpStream,
    next_wr_id: u64,
    flights: Vec<Flight>,
    /// Why the queue pair is unusable, once it is.
    broken: Option<String>,
    completions: Vec<WorkCompletion>,
}

impl Conn {
    /// `buf` must be the memory `mr` registers (kept here, dropped after it).
    pub(super) fn new(qp: RcQp, mr: MemoryRegion, buf: Box<[u8]>, side: TcpStream) -> Self {
        Self {
            qp,
            mr,
            buf,
            side,
            next_wr_id: 1,
            flights: Vec::with_capacity(QP_DEPTH),
            broken: None,
            completions: Vec::with_capacity(MAX_BATCH),
        }
    }

    /// Where `len` more bytes can land now (see [`first_gap`]).
    fn find_gap(&self, len: usize) -> Option<usize> {
        let held = (self.flights.iter())
            .filter(|f| f.holds_range())
            .map(|f| (f.at, f.len));
        first_gap(held, len, self.buf.len())
    }

    /// Posts `reads` as one list (one doorbell; at most [`MAX_BATCH`]);
    /// returns the first one's `wr_id` (the others follow in order), or
    /// `None` when the send queue or the landing buffer has no room for
    /// them now. `detach`: the bytes are taken with [`Conn::take_owned`],
    /// else with [`Conn::take_into`].
    pub(super) fn post(&mut self, reads: &[Remote], detach: bool) -> Result<Option<u64>, String> {
        if let Some(cause) = &self.broken {
            return Err(cause.clone());
        }
        if reads.len() > MAX_BATCH || self.qp.outstanding() + reads.len() > QP_DEPTH {
            return Ok(None);
        }
        let (first, held) = (self.next_wr_id, self.flights.len());
        for (i, r) in reads.iter().enumerate() {
            let Some(at) = self.find_gap(r.len) else {
                self.flights.truncate(held);
                return Ok(None);
            };
            self.flights.push(Flight {
                wr_id: first + i as u64,
                at,
                len: r.len,
                detach,
                abandoned: false,
                landed: Landed::Posted,
            });
        }
        let (base, lkey) = (self.buf.as_mut_ptr() as u64, self.mr.lkey());
        let mut wrs = [ReadWr {
            wr_id: 0,
            local_addr: 0,
            lkey,
            len: 0,
            remote_addr: 0,
            rkey: 0,
        }; MAX_BATCH];
        for ((w, r), f) in wrs.iter_mut().zip(reads).zip(&self.flights[held..]) {
            *w = ReadWr {
                wr_id: f.wr_id,
                local_addr: base + f.at as u64,
                lkey,
                len: r.len as u32,
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        if let Err(e) = self.qp.post_reads(&wrs[..reads.len()]) {
            self.flights.truncate(held);
            return Err(self.break_with(e.to_string()));
        }
        self.next_wr_id += reads.len() as u64;
        Ok(Some(first))
    }

    /// Files what completions the completion queue holds now under their
    /// reads; returns how many there were.
    pub(super) fn progress(&mut self) -> usize {
        self.completions.clear();
        let n = match self.qp.poll_completions(&mut self.completions) {
            Ok(n) => n,
            Err(e) => {
                self.break_with(e.to_string());
                return 0;
            }
        };
        let mut completions = std::mem::take(&mut self.completions);
        for (wr_id, result) in completions.drain(..) {
            // Every read after a failed one is flushed: each reports the
            // first failure.
            let result = result.map_err(|c| self.break_with(format!("RDMA READ failed: {c}")));
            let Some(i) = self.flights.iter().position(|f| f.wr_id == wr_id) else {
                continue;
            };
            let f = &mut self.flights[i];
            if f.abandoned {
                self.flights.swap_remove(i);
                continue;
            }
            f.landed = Landed::Done(match result {
                Ok(()) if f.detach => Ok(Some(self.buf[f.at..f.at + f.len].to_vec())),
                Ok(()) => Ok(None),
                Err(cause) => Err(cause),
            });
        }
        self.completions = completions;
        n
    }

    fn done_at(&self, wr_id: u64) -> Option<usize> {
        (self.flights.iter()).position(|f| f.wr_id == wr_id && !matches!(f.landed, Landed::Posted))
    }

    /// A completed read's bytes copied into `dst`, its flight gone; `None`
    /// while it is in flight.
    pub(super) fn take_into(&mut self, wr_id: u64, dst: &mut [u8]) -> Option<Result<(), String>> {
        let f = self.flights.swap_remove(self.done_at(wr_id)?);
        Some(match f.landed {
            Landed::Done(Ok(None)) => {
                dst.copy_from_slice(&self.buf[f.at..f.at + dst.len()]);
                Ok(())
            }
            Landed::Done(Ok(Some(bytes))) => {
                dst.copy_from_slice(&bytes[..dst.len()]);
                Ok(())
            }
            Landed::Done(Err(cause)) => Err(cause),
            Landed::Posted => Err("read taken while in flight".into()),
        })
    }

    /// A completed detached read's bytes; `None` while it is in flight.
    pub(super) fn take_owned(&mut self, wr_id: u64) -> Option<Result<Vec<u8>, String>> {
        let f = self.flights.swap_remove(self.done_at(wr_id)?);
        Some(match f.landed {
            Landed::Done(Ok(Some(bytes))) => Ok(bytes),
            Landed::Done(Ok(None)) => Ok(self.buf[f.at..f.at + f.len].to_vec()),
            Landed::Done(Err(cause)) => Err(cause),
            Landed::Posted => Err("read taken while in flight".into()),
        })
    }

    /// Forgets a read whose poster gave up on it (its landing range stays
    /// taken until the completion comes, since the device may still write).
    pub(super) fn abandon(&mut self, wr_id: u64) {
        if let Some(i) = self.done_at(wr_id) {
            self.flights.swap_remove(i);
        } else if let Some(f) = self.flights.iter_mut().find(|f| f.wr_id == wr_id) {
            f.abandoned = true;
        }
    }

    /// Marks the queue pair unusable for `cause` (the first cause stays);
    /// returns the cause reads now fail with.
    fn break_with(&mut self, cause: String) -> String {
        self.broken.get_or_insert(cause).clone()
    }

    /// Why the engine is gone when its side-channel socket says so.
    fn side_closed(&self) -> Option<String> {
        match self.side.peek(&mut [0u8; 1]) {
            Ok(0) => Some("the engine closed its verbs connection (stopped or killed)".into()),
            Ok(_) => None,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
            Err(e) => Some(format!("the engine's verbs connection failed: {e}")),
        }
    }

    /// Posts `reads` and blocks until each has landed in its `dsts` entry,
    /// filing other reads' completions on the way.
    pub(super) fn read_wait(
        &mut self,
        reads: &[Remote],
        dsts: &mut [&mut [u8]],
    ) -> Result<(), String> {
        let mut patience = Patience::default();
        let first = loop {
            if let Some(first) = self.post(reads, false)? {
                break first;
            }
            if self.progress() == 0 {
                patience.idle(self)?;
            }
        };
        self.wait_posted(first, dsts)
    }

    /// Blocks until the reads posted from `first` on (one per `dsts`
    /// entry) have landed in `dsts`.
    pub(super) fn wait_posted(&mut self, first: u64, dsts: &mut [&mut [u8]]) -> Result<(), String> {
        let mut patience = Patience::default();
        let mut next = 0usize;
        let mut result = Ok(());
        while next < dsts.len() && result.is_ok() {
            match self.take_into(first + next as u64, dsts[next]) {
                Some(r) => {
                    next += 1;
                    result = r;
                }
                None if self.progress() == 0 => result = patience.idle(self),
                None => {}
            }
        }
        if result.is_err() {
            (next..dsts.len()).for_each(|i| self.abandon(first + i as u64));
        }
        result
    }
}

/// The lowest offset, 0 or a multiple of [`ALIGN`] just past a held
/// range, where `len` bytes fit in `capacity` overlapping none of the
/// `held` (offset, length) ranges; `None` when there is none.
/// Allocation-free: a GET's reads come this way one by one.
fn first_gap(
    held: impl Iterator<Item = (usize, usize)> + Clone,
    len: usize,
    capacity: usize,
) -> Option<usize> {
    let fits =
        |at: usize| at + len <= capacity && held.clone().all(|(s, n)| at + len <= s || s + n <= at);
    if fits(0) {
        return Some(0);
    }
    (held.clone())
        .map(|(s, n)| (s + n).next_multiple_of(ALIGN))
        .filter(|&at| fits(at))
        .min()
}

/// How long a waiter has found nothing: every [`CHECK_EVERY`] empty polls
/// it looks at the side channel and the clock.
#[derive(Debug, Default)]
pub(super) struct Patience {
    empty_polls: u32,
    deadline: Option<Instant>,
}

impl Patience {
    /// Counts an empty poll of `conn`; the error (the queue pair is then
    /// broken) once the engine is seen gone or [`POLL_TIMEOUT`] passed
    /// since the first look at the clock.
    pub(super) fn idle(&mut self, conn: &mut Conn) -> Result<(), String> {
        if let Some(cause) = &conn.broken {
            return Err(cause.clone());
        }
        self.empty_polls = self.empty_polls.wrapping_add(1);
        if self.empty_polls % CHECK_EVERY != 0 {
            return Ok(());
        }
        if let Some(cause) = conn.side_closed() {
            return Err(conn.break_with(cause));
        }
        let now = Instant::now();
        if now > *self.deadline.get_or_insert(now + POLL_TIMEOUT) {
            let cause = format!(
                "{} RDMA READs not completed within {POLL_TIMEOUT:?}; the engine may be gone or unreachable",
                conn.qp.outstanding()
            );
            return Err(conn.break_with(cause));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landing_ranges_never_overlap_and_reuse_freed_gaps() {
        let cap = 4096;
        assert_eq!(first_gap(std::iter::empty(), 64, cap), Some(0));
        assert_eq!(first_gap(std::iter::empty(), cap + 1, cap), None);
        let mut held: Vec<(usize, usize)> = Vec::new();
        for want in [0, 64, 128, 256] {
            let len = if want == 128 { 100 } else { 64 };
            let at = first_gap(held.iter().copied(), len, cap).unwrap();
            assert_eq!(at, want, "packed at 64-byte boundaries");
            held.push((at, len));
        }
        // A freed range in the middle is reused by a read that fits it.
        held.retain(|r| r.0 != 64);
        assert_eq!(first_gap(held.iter().copied(), 64, cap), Some(64));
        assert_eq!(first_gap(held.iter().copied(), 65, cap), Some(320));
        // Full: nothing left of the right size.
        let full = [(0usize, cap - 32)];
        assert_eq!(first_gap(full.iter().copied(), 64, cap), None);
        assert_eq!(
            first_gap(full.iter().copied(), 32, cap),
            None,
            "4064 is no multiple of 64"
        );
        // Random lists: a found range stays inside and overlaps nothing.
        let mut x = 0x9e37_79b9_u64;
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 1 + (x >> 33) as usize % 700;
            match first_gap(held.iter().copied(), len, cap) {
                Some(at) => {
                    assert!(at + len <= cap && at % ALIGN == 0);
                    assert!(held.iter().all(|&(s, n)| at + len <= s || s + n <= at));
                    held.push((at, len));
                }
                None => {
                    held.remove((x >> 40) as usize % held.len());
                }
            }
        }
    }
}
