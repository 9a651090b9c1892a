//! One io_uring per channel, driven from the xstream without blocking it
//! for long.
//!
//! An operation future pushes its entry on first poll (or waits for a free
//! slot: back-pressure at the queue depth) and is then completed by reaping
//! the completion queue. Of the futures in flight exactly one, the *poller*,
//! looks at the ring; the others sleep until the poller reaps their
//! completion and wakes them (a woken future whose result is there completes
//! without a system call). A future that pushes its entry while another
//! future polls submits it at once (one `io_uring_enter`, as fio submits);
//! the first future in flight becomes the poller and submits its entry in
//! the call that waits for the next completion. With nothing in flight no
//! task is scheduled, so an idle channel costs no CPU.
//!
//! A poll that reaps nothing waits: in the kernel, for one completion and
//! at most `park` (`park_us=`, default 50 µs), submitting the pending
//! entries in the same call, then re-schedules itself so that the xstream's
//! other tasks run between waits (events of glommio's own rings, like a
//! socket becoming readable, are seen after the wait). After
//! [`KERNEL_WAITS`] such waits in a row found nothing (a slow device, a long
//! flush), or at once when only flushes are in flight (their
//! hundreds of µs outlast every short wait: waiting first cost a device-
//! durability PUT ~15 % of its rate), the poller sleeps without blocking
//! the xstream: an eventfd
//! registered with the ring is read through glommio's reactor (see
//! `wakeup.rs`), so the xstream runs its other tasks or parks in glommio
//! until the read completes. Off an xstream (a bare glommio executor,
//! another thread) it keeps waiting in the kernel.
//!
//! Measured on a loaded 2-core VM: a sleep on the eventfd costs ~10 system
//! calls in glommio's park and wake (its own rings, a membarrier). With the
//! poller sleeping there whenever it found nothing, a 4 KiB random read at
//! QD32 made ~1.4 `io_uring_enter` per I/O (fio ~1.0) and a kv PUT at
//! pipeline 16 (write + flush) ~2.0 per operation; waiting in the kernel
//! first, ~0.1 and ~1.1. Pure spinning (`park_us=0`) waits for the next
//! time slice on a shared core (~0.55x fio's IOPS).
//!
//! Rings are set up with `DEFER_TASKRUN` where the kernel has it (6.1+,
//! without SQPOLL), as fio does: the kernel neither interrupts nor wakes the
//! thread for each completion, it queues the completion work and raises
//! `IORING_SQ_TASKRUN`; a poll that sees the flag runs the work with one
//! `io_uring_enter` (together with any pending submissions).
//!
//! The buffers of an operation live in its slot until the kernel is done,
//! even if the future is dropped first (the slot is then *orphaned* and
//! freed when its completion arrives).

use super::wakeup::Wakeup;
use crate::IoBuf;
use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{squeue, IoUring};
use std::collections::VecDeque;
use std::task::Waker;

/// What an operation owns while the kernel works on it.
#[derive(Debug)]
pub(super) enum Payload {
    None,
    One(IoBuf),
    Many(Vec<IoBuf>),
}

#[derive(Debug, Default)]
struct Slot {
    busy: bool,
    /// A flush (or fallocate): hundreds of µs to ms on a disk.
    slow: bool,
    orphaned: bool,
    result: Option<i32>,
    waker: Option<Waker>,
    payload: Option<Payload>,
    /// iovecs of a readv/writev; the kernel reads them at submission.
    iovecs: Vec<libc::iovec>,
}

pub(super) struct RingState {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Futures waiting for a free slot.
    waiters: VecDeque<Waker>,
    /// Slot whose future re-schedules itself to poll the ring.
    poller: Option<u32>,
    /// Entries pushed and not yet submitted.
    pending_submit: bool,
    /// Slots in flight marked slow ([`RingState::mark_slow`]).
    slow_in_flight: usize,
    /// Waits in the kernel in a row that found nothing.
    empty_waits: u32,
    /// Longest blocking wait for a completion without a wakeup.
    park: Timespec,
    /// Whether the poller ever sleeps (`park_us=0`: it only spins).
    park_enabled: bool,
    /// How the poller sleeps without blocking the xstream, where it can.
    wakeup: Option<Wakeup>,
    /// The poller sleeps on `wakeup`; a new entry must wake it to submit.
    asleep: bool,
    /// Times the poller went to sleep on `wakeup`.
    pub(super) sleeps: u64,
    /// Times the poller waited in `io_uring_enter` (tests).
    pub(super) kernel_waits: u64,
    /// Set after the ring itself failed; every later op fails with it.
    pub(super) broken: Option<String>,
}

/// Waits in the kernel in a row that found nothing before the poller
/// sleeps on its eventfd (so at most 200 µs of `park = 50 µs` slices).
pub(super) const KERNEL_WAITS: u32 = 4;

impl RingState {
    pub(super) fn new(
        ring: IoUring,
        queue_depth: usize,
        park: std::time::Duration,
        wakeup: Option<Wakeup>,
    ) -> Self {
        Self {
            ring,
            slots: (0..queue_depth).map(|_| Slot::default()).collect(),
            free: (0..queue_depth as u32).rev().collect(),
            waiters: VecDeque::new(),
            poller: None,
            pending_submit: false,
            empty_waits: 0,
            slow_in_flight: 0,
            park: Timespec::new()
                .sec(park.as_secs())
                .nsec(park.subsec_nanos()),
            park_enabled: !park.is_zero(),
            wakeup,
            asleep: false,
            sleeps: 0,
            kernel_waits: 0,
            broken: None,
        }
    }

    #[cfg(test)]
    pub(super) fn wakeup_fds(&self) -> Option<[std::os::fd::RawFd; 2]> {
        self.wakeup.as_ref().map(Wakeup::fds)
    }

    #[cfg(test)]
    pub(super) fn unsubmitted(&self) -> bool {
        self.pending_submit
    }

    pub(super) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Takes a free slot, or queues `waker` and returns `None`.
    pub(super) fn take_slot(&mut self, waker: &Waker) -> Option<u32> {
        match self.free.pop() {
            Some(s) => {
                let slot = &mut self.slots[s as usize];
                slot.busy = true;
                slot.result = None;
                Some(s)
            }
            None => {
                self.waiters.push_back(waker.clone());
                None
            }
        }
    }

    /// Marks `slot`'s operation slow (a flush): while only such operations
    /// are in flight the poller sleeps at once instead of waiting in the
    /// kernel first, whose short waits would all run out before a device
    /// flush completes.
    pub(super) fn mark_slow(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if !s.slow {
            s.slow = true;
            self.slow_in_flight += 1;
        }
    }

    /// iovec storage of a slot, for a vectored entry.
    pub(super) fn iovecs(&mut self, slot: u32) -> &mut Vec<libc::iovec> {
        &mut self.slots[slot as usize].iovecs
    }

    /// Pushes `entry` for `slot`, holding `payload` until completion.
    pub(super) fn push(
        &mut self,
        slot: u32,
        entry: squeue::Entry,
        payload: Payload,
    ) -> std::io::Result<()> {
        let entry = entry.user_data(u64::from(slot));
        // SAFETY: every pointer in `entry` points into `payload` (kept in
        // the slot until the completion) or the slot's iovecs.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            self.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| std::io::Error::other("submission queue full after submit"))?;
        }
        self.slots[slot as usize].payload = Some(payload);
        self.pending_submit = true;
        Ok(())
    }

    /// Submits pushed entries (one syscall for all of them).
    pub(super) fn submit(&mut self) -> std::io::Result<()> {
        match self.ring.submit() {
            Ok(_) => {
                self.pending_submit = false;
                Ok(())
            }
            // Completion queue busy: reap, then try again on the next poll.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Submits pushed entries and, on a `DEFER_TASKRUN` ring with
    /// completion work pending, runs it (one `io_uring_enter` for both).
    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        if self.pending_submit || self.ring.submission().taskrun() {
            self.submit()?;
        }
        Ok(())
    }

    /// Moves every completion into its slot and wakes its future; returns
    /// how many there were.
    pub(super) fn reap(&mut self) -> usize {
        let mut done: [(u64, i32); 64] = [(0, 0); 64];
        let mut total = 0;
        loop {
            let mut n = 0;
            for cqe in self.ring.completion().take(done.len()) {
                done[n] = (cqe.user_data(), cqe.result());
                n += 1;
            }
            for &(user_data, result) in &done[..n] {
                self.complete(user_data as usize, result);
            }
            total += n;
            if n < done.len() {
                return total;
            }
        }
    }

    /// One poll of the ring by the future of `slot`, whose entry is in
    /// flight and whose result was not there. Another future's poll only
    /// registers `waker` (woken when its completion is reaped, or to take
    /// over polling). The poller runs pending completion work and reaps;
    /// after a reap it re-schedules itself (the futures it woke push their
    /// next entries meanwhile); finding nothing, it waits (see the module
    /// doc). Returns whether completions were reaped here (the caller looks
    /// at its own result again).
    pub(super) fn poll(&mut self, slot: u32, waker: &Waker) -> std::io::Result<bool> {
        if self.poller.is_some_and(|p| p != slot) {
            self.store_waker(slot, waker);
            return Ok(false);
        }
        self.poller = Some(slot);
        self.asleep = false;
        if self.ring.submission().taskrun() {
            // Completion work is pending: one enter submits and runs it.
            self.submit()?;
        }
        if self.reap() > 0 {
            if self.pending_submit {
                // Completions came without an enter (no DEFER_TASKRUN).
                self.submit()?;
            }
            self.empty_waits = 0;
            waker.wake_by_ref();
            return Ok(true);
        }
        if !self.park_enabled {
            self.flush()?;
            waker.wake_by_ref();
            return Ok(self.reap() > 0);
        }
        let only_slow = self.slow_in_flight == self.in_flight();
        if self.wakeup.is_none() || (self.empty_waits < KERNEL_WAITS && !only_slow) {
            let reaped = self.wait_in_kernel()?;
            self.empty_waits = if reaped > 0 { 0 } else { self.empty_waits + 1 };
            waker.wake_by_ref();
            return Ok(reaped > 0);
        }
        self.empty_waits = 0;
        Ok(self.sleep(slot, waker))
    }

    /// Submits pending entries and waits for one completion, at most
    /// `park`, in one `io_uring_enter` (blocking the thread); reaps.
    fn wait_in_kernel(&mut self) -> std::io::Result<usize> {
        self.kernel_waits += 1;
        let args = SubmitArgs::new().timespec(&self.park);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => self.pending_submit = false,
            // Nothing within `park`, or a signal: the entries went in.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {
                self.pending_submit = false;
            }
            // Completion queue busy: reap first, submit on the next poll.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => {}
            Err(e) => return Err(e),
        }
        Ok(self.reap())
    }

    /// The poller sleeps on the wakeup unless a last look finds
    /// completions; returns whether it reaped any.
    fn sleep(&mut self, slot: u32, waker: &Waker) -> bool {
        if let Some(w) = &mut self.wakeup {
            w.reset();
        }
        // A failure shows up again on the next poll's flush.
        let _ = self.flush();
        // Still flagged: the kernel ran only part of the pending work.
        if self.reap() > 0 || self.ring.submission().taskrun() {
            waker.wake_by_ref();
            return true;
        }
        let slept = self.wakeup.as_mut().map(|w| w.sleep(waker));
        match slept {
            Some(Ok(true)) => {
                // Its completion may be reaped by a submitting future.
                self.store_waker(slot, waker);
                self.asleep = true;
                self.sleeps += 1;
            }
            Some(Ok(false)) | None => waker.wake_by_ref(),
            Some(Err(())) => {
                self.wakeup = None; // the kernel refused the read: park there
                waker.wake_by_ref();
            }
        }
        false
    }

    fn store_waker(&mut self, slot: u32, waker: &Waker) {
        let stored = &mut self.slots[slot as usize].waker;
        if !stored.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *stored = Some(waker.clone());
        }
    }

    fn complete(&mut self, slot: usize, result: i32) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        if s.orphaned {
            s.orphaned = false;
            s.payload = None;
            self.release(slot as u32);
            return;
        }
        s.result = Some(result);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }

    pub(super) fn result_ready(&self, slot: u32) -> bool {
        self.slots[slot as usize].result.is_some()
    }

    /// The result of `slot` and its payload, if complete; frees the slot.
    pub(super) fn take_result(&mut self, slot: u32) -> Option<(i32, Payload)> {
        let s = &mut self.slots[slot as usize];
        let result = s.result.take()?;
        let payload = s.payload.take().unwrap_or(Payload::None);
        s.waker = None;
        self.release(slot);
        Some((result, payload))
    }

    fn release(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.busy = false;
        if std::mem::take(&mut s.slow) {
            self.slow_in_flight -= 1;
        }
        self.free.push(slot);
        if self.poller == Some(slot) {
            self.poller = None;
            self.asleep = false;
        }
        // Whoever finishes while no one polls (the poller itself, or a
        // future woken to take over that found its own completion already
        // reaped) hands polling to a sleeping in-flight future; otherwise
        // those would wait until some new operation polled the ring.
        if self.poller.is_none() {
            self.hand_over_polling();
        }
        for w in self.waiters.drain(..) {
            w.wake();
        }
    }

    /// Wakes one sleeping in-flight future so that it becomes the poller.
    fn hand_over_polling(&mut self) {
        if let Some(w) = self.slots.iter_mut().find_map(|s| s.waker.take()) {
            w.wake();
        }
    }

    /// Parks the future of `slot`, which has just pushed its entry, until
    /// its completion. If no one polls the ring, this future becomes the
    /// poller and re-schedules itself (its next poll submits, in the call
    /// that waits). Otherwise the entry goes to the kernel now, as fio
    /// does, rather than with the poller's next wait: holding the entries
    /// that a reap's woken futures push until the poller ran again cost a
    /// 4 KiB random read at QD32 ~8 % of its IOPS (the device queue ran
    /// short by the entries held); and a sleeping poller is woken.
    pub(super) fn park(&mut self, slot: u32, waker: &Waker) {
        match self.poller {
            None => {
                self.poller = Some(slot);
                waker.wake_by_ref();
            }
            Some(p) if p == slot => waker.wake_by_ref(),
            Some(p) => {
                self.store_waker(slot, waker);
                // A failure shows up again on the poller's next submit.
                let _ = self.submit();
                if std::mem::take(&mut self.asleep) {
                    if let Some(w) = self.slots[p as usize].waker.take() {
                        w.wake();
                    }
                }
            }
        }
    }

    /// The future of `slot` was dropped before completion.
    pub(super) fn orphan(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.result.is_some() {
            s.payload = None;
            s.result = None;
            self.release(slot);
        } else if s.busy {
            s.orphaned = true;
            s.waker = None;
            if self.poller == Some(slot) {
                self.poller = None;
                self.asleep = false;
            }
            if self.poller.is_none() {
                self.hand_over_polling();
            }
        }
    }

    /// Waits (blocking) for every in-flight entry, at most `limit`; returns
    /// whether all completed. Used when the channel is dropped.
    pub(super) fn drain_blocking(&mut self, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        while self.slots.iter().any(|s| s.busy) && start.elapsed() < limit {
            let _ = self.ring.submit_and_wait(1);
            self.reap();
            for slot in 0..self.slots.len() as u32 {
                if self.slots[slot as usize].result.is_some() {
                    self.orphan(slot);
                }
            }
        }
        !self.slots.iter().any(|s| s.busy)
    }

    /// Forgets the payloads of entries the kernel may still use.
    pub(super) fn leak_in_flight(&mut self) {
        for s in &mut self.slots {
            if s.busy {
                std::mem::forget(s.payload.take());
            }
        }
    }
}
