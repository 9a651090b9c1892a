//! The books of one queue pair, with no device in them: which reads are
//! staged for the next doorbell, which are in flight, where each lands in
//! the registered buffer, and what each completion brought.
//!
//! A read is *staged* when asked for (its `wr_id` and landing range given
//! at once) and *posted* with every other staged read of the queue pair as
//! one linked work-request list, one doorbell ([`Book::staged`], then
//! [`Book::mark_posted`]). Asynchronous GETs of one thread stage their
//! reads and the first of them to poll rings the doorbell for all (see
//! `posted.rs` for when a poll waits a little longer so that reads made
//! ready by one batch of completions go together).

use ferrite_engine::fabric::verbs::{ReadWr, BATCH_MAX};

/// Landing ranges start at multiples of this.
pub(super) const ALIGN: usize = 64;

/// Where one read goes: `len` bytes at `addr` of the engine (rkey).
#[derive(Debug, Clone, Copy)]
pub(super) struct Remote {
    pub addr: u64,
    pub rkey: u32,
    pub len: usize,
}

/// How a read stands.
#[derive(Debug)]
enum Landed {
    /// Waiting for the next doorbell.
    Staged,
    Posted,
    /// Completed; a detached read's bytes were copied out (its landing
    /// range is free).
    Done(Result<Option<Vec<u8>>, String>),
}

/// One read of the queue pair.
#[derive(Debug)]
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
            Landed::Staged | Landed::Posted => true,
            Landed::Done(Ok(None)) => true,
            Landed::Done(_) => false,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self.landed, Landed::Done(_))
    }
}

/// The reads of one queue pair, staged, in flight or landed.
#[derive(Debug)]
pub(super) struct Book {
    /// Address and key of the registered landing buffer, and its bytes.
    base: u64,
    lkey: u32,
    capacity: usize,
    next_wr_id: u64,
    flights: Vec<Flight>,
    /// The work requests of the next doorbell, in `wr_id` order.
    staged: Vec<ReadWr>,
}

impl Book {
    /// Books for a landing buffer of `capacity` bytes at `base` (`lkey`).
    pub(super) fn new(base: u64, lkey: u32, capacity: usize, depth: usize) -> Self {
        Self {
            base,
            lkey,
            capacity,
            next_wr_id: 1,
            flights: Vec::with_capacity(depth),
            staged: Vec::with_capacity(BATCH_MAX),
        }
    }

    /// Stages `reads` for the next doorbell, all or none; returns the
    /// first one's `wr_id` (the others follow in order), or `None` when
    /// the staged list, the `room` left in the send queue or the landing
    /// buffer cannot take them now.
    pub(super) fn stage(&mut self, reads: &[Remote], detach: bool, room: usize) -> Option<u64> {
        let staged = self.staged.len() + reads.len();
        if staged > BATCH_MAX || staged > room {
            return None;
        }
        let (first, held) = (self.next_wr_id, self.flights.len());
        for (i, r) in reads.iter().enumerate() {
            let Some(at) = self.find_gap(r.len) else {
                self.flights.truncate(held);
                self.staged.truncate(staged - reads.len());
                return None;
            };
            let wr_id = first + i as u64;
            self.flights.push(Flight {
                wr_id,
                at,
                len: r.len,
                detach,
                abandoned: false,
                landed: Landed::Staged,
            });
            self.staged.push(ReadWr {
                wr_id,
                local_addr: self.base + at as u64,
                lkey: self.lkey,
                len: r.len as u32,
                remote_addr: r.addr,
                rkey: r.rkey,
            });
        }
        self.next_wr_id += reads.len() as u64;
        Some(first)
    }

    /// The work requests staged for the next doorbell.
    pub(super) fn staged(&self) -> &[ReadWr] {
        &self.staged
    }

    /// The staged reads were posted.
    pub(super) fn mark_posted(&mut self) {
        for f in self.flights.iter_mut() {
            if matches!(f.landed, Landed::Staged) {
                f.landed = Landed::Posted;
            }
        }
        self.staged.clear();
    }

    /// The staged reads could not be posted: each fails with `cause`.
    pub(super) fn fail_staged(&mut self, cause: &str) {
        for f in self.flights.iter_mut() {
            if matches!(f.landed, Landed::Staged) {
                f.landed = Landed::Done(Err(cause.to_string()));
            }
        }
        self.flights.retain(|f| !(f.abandoned && f.is_done()));
        self.staged.clear();
    }

    /// Files the completion of `wr_id` (`buf`: the landing buffer).
    pub(super) fn complete(&mut self, wr_id: u64, result: Result<(), String>, buf: &[u8]) {
        let Some(i) = self.flights.iter().position(|f| f.wr_id == wr_id) else {
            return;
        };
        let f = &mut self.flights[i];
        if f.abandoned {
            self.flights.swap_remove(i);
            return;
        }
        f.landed = Landed::Done(match result {
            Ok(()) if f.detach => Ok(Some(buf[f.at..f.at + f.len].to_vec())),
            Ok(()) => Ok(None),
            Err(cause) => Err(cause),
        });
    }

    /// Whether a poll should ring the doorbell for the staged reads now:
    /// not while detached reads have landed whose futures have not taken
    /// their bytes yet (polled next, they may stage reads of their own that
    /// can go with these: the record reads a batch of bucket completions
    /// makes ready), unless the poller has already held back once (a
    /// future nobody polls must not hold the others back).
    pub(super) fn ring_now(&self, held_back: bool) -> bool {
        !self.staged.is_empty() && (held_back || self.untaken() == 0)
    }

    /// Detached reads whose completion came and whose poster has not yet
    /// taken the bytes (their futures, once polled, may stage more reads).
    pub(super) fn untaken(&self) -> usize {
        (self.flights.iter())
            .filter(|f| f.detach && !f.abandoned && f.is_done())
            .count()
    }

    fn done_at(&self, wr_id: u64) -> Option<usize> {
        (self.flights.iter()).position(|f| f.wr_id == wr_id && f.is_done())
    }

    /// Where a completed read landed in the buffer (it stays filed until
    /// taken), or why it failed; `None` while it is staged or in flight.
    pub(super) fn landed_at(&self, wr_id: u64) -> Option<Result<usize, String>> {
        let f = &self.flights[self.done_at(wr_id)?];
        Some(match &f.landed {
            Landed::Done(Ok(None)) => Ok(f.at),
            Landed::Done(Err(cause)) => Err(cause.clone()),
            _ => Err("a detached read has no landing range".into()),
        })
    }

    /// A completed read's bytes copied into `dst`, its flight gone; `None`
    /// while it is staged or in flight.
    pub(super) fn take_into(
        &mut self,
        wr_id: u64,
        dst: &mut [u8],
        buf: &[u8],
    ) -> Option<Result<(), String>> {
        let f = self.flights.swap_remove(self.done_at(wr_id)?);
        Some(match f.landed {
            Landed::Done(Ok(None)) => {
                dst.copy_from_slice(&buf[f.at..f.at + dst.len()]);
                Ok(())
            }
            Landed::Done(Ok(Some(bytes))) => {
                dst.copy_from_slice(&bytes[..dst.len()]);
                Ok(())
            }
            Landed::Done(Err(cause)) => Err(cause),
            Landed::Staged | Landed::Posted => Err("read taken while in flight".into()),
        })
    }

    /// A completed detached read's bytes; `None` while it is staged or in
    /// flight.
    pub(super) fn take_owned(&mut self, wr_id: u64, buf: &[u8]) -> Option<Result<Vec<u8>, String>> {
        let f = self.flights.swap_remove(self.done_at(wr_id)?);
        Some(match f.landed {
            Landed::Done(Ok(Some(bytes))) => Ok(bytes),
            Landed::Done(Ok(None)) => Ok(buf[f.at..f.at + f.len].to_vec()),
            Landed::Done(Err(cause)) => Err(cause),
            Landed::Staged | Landed::Posted => Err("read taken while in flight".into()),
        })
    }

    /// Forgets a read whose poster gave up on it: a staged one at once,
    /// one in flight when its completion comes (its landing range stays
    /// taken until then, since the device may still write).
    pub(super) fn abandon(&mut self, wr_id: u64) {
        let Some(i) = self.flights.iter().position(|f| f.wr_id == wr_id) else {
            return;
        };
        match self.flights[i].landed {
            Landed::Posted => self.flights[i].abandoned = true,
            Landed::Staged => {
                self.flights.swap_remove(i);
                self.staged.retain(|w| w.wr_id != wr_id);
            }
            Landed::Done(_) => {
                self.flights.swap_remove(i);
            }
        }
    }

    /// Where `len` more bytes can land now (see [`first_gap`]).
    fn find_gap(&self, len: usize) -> Option<usize> {
        let held = (self.flights.iter())
            .filter(|f| f.holds_range())
            .map(|f| (f.at, f.len));
        first_gap(held, len, self.capacity)
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

#[cfg(test)]
mod tests;
