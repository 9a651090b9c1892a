//! One io_uring per channel, driven from the xstream without blocking it
//! for long.
//!
//! An operation future pushes its entry on first poll (or waits for a free
//! slot: back-pressure at the queue depth), registers its waker and is
//! completed when its completion is reaped. One task per channel, the
//! *reaper*, looks at the ring while entries are in flight and wakes the
//! futures whose completions it reaps. The push that finds no reaper
//! spawns one, in its own task queue (so the queue that does the I/O reaps
//! it: a reaper in the control queue the store was opened from cost io500
//! ~3 %); it ends when nothing is in flight, so an idle channel costs no
//! CPU. A future that pushes while the reaper runs
//! submits its entry at once (one `io_uring_enter`, as fio submits); an
//! entry pushed to an idle reaper is submitted by the reaper in the call
//! that waits for the next completion.
//!
//! The reaper is a task of its own because the futures of a channel are not
//! polled whenever their task runs: a task may keep reads in flight in a
//! stream and await something else (the cleaner keeps its window reads in
//! flight while it waits for a group commit). When one of those futures was
//! also the one that looked at the ring, every other operation of the
//! channel, the commit's own writes among them, waited for a completion
//! nobody reaped: the xstream hung.
//!
//! A poll of the reaper that reaps nothing waits: in the kernel, for one
//! completion and at most `park` (`park_us=`, default 50 µs), submitting
//! the pending entries in the same call, then re-schedules itself so that
//! the xstream's other tasks run between waits (events of glommio's own
//! rings, like a socket becoming readable, are seen after the wait). After
//! [`KERNEL_WAITS`] such waits in a row found nothing (a slow device, a long
//! flush), or at once when only flushes (and durable writes) are in
//! flight (their hundreds of µs outlast every short wait: waiting first
//! cost a device-durability PUT ~15 % of its rate), the reaper sleeps
//! without blocking the xstream: an eventfd registered with the ring is
//! read through glommio's reactor (see `wakeup.rs`), so the xstream runs
//! its other tasks or parks in glommio until the read completes. Off an
//! xstream (a bare glommio executor) it keeps waiting in the kernel.
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
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Weak;
use std::task::{Context, Poll, Waker};

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
    /// Entries pushed whose completion has not been reaped.
    awaiting: usize,
    /// The reaper task's waker (from its last poll) and what it is doing.
    reaper: Option<Waker>,
    reaper_state: ReaperState,
    /// Entries pushed and not yet submitted.
    pending_submit: bool,
    /// Slots in flight marked slow ([`RingState::mark_slow`]).
    slow_in_flight: usize,
    /// Waits in the kernel in a row that found nothing.
    empty_waits: u32,
    /// Longest blocking wait for a completion without a wakeup.
    park: Timespec,
    /// Whether the reaper ever sleeps (`park_us=0`: it only spins).
    park_enabled: bool,
    /// How the reaper sleeps without blocking the xstream, where it can.
    wakeup: Option<Wakeup>,
    /// Times the reaper went to sleep on `wakeup`.
    pub(super) sleeps: u64,
    /// Times the reaper waited in `io_uring_enter` (tests).
    pub(super) kernel_waits: u64,
    /// Flushes pushed (tests).
    pub(super) flushes: u64,
    /// Set after the ring itself failed; every later op fails with it.
    pub(super) broken: Option<String>,
}

/// What the reaper task is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReaperState {
    /// None runs (nothing was in flight): the next push spawns one.
    Absent,
    /// Scheduled or running: it submits what is pushed on its next poll.
    Running,
    /// Asleep on the eventfd: a push submits and wakes it.
    Asleep,
}

/// Waits in the kernel in a row that found nothing before the reaper
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
            awaiting: 0,
            reaper: None,
            reaper_state: ReaperState::Absent,
            pending_submit: false,
            empty_waits: 0,
            slow_in_flight: 0,
            park: Timespec::new()
                .sec(park.as_secs())
                .nsec(park.subsec_nanos()),
            park_enabled: !park.is_zero(),
            wakeup,
            sleeps: 0,
            kernel_waits: 0,
            flushes: 0,
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
    /// are in flight the reaper sleeps at once instead of waiting in the
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
        self.awaiting += 1;
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

    /// One poll of the ring by the reaper task: runs pending completion
    /// work and reaps, waking the futures of what it reaped; after a reap
    /// it re-schedules itself (the futures it woke push their next entries
    /// meanwhile); finding nothing, it waits (see the module doc). With
    /// nothing in flight it is done.
    pub(super) fn reaper_poll(&mut self, waker: &Waker) -> std::io::Result<Poll<()>> {
        if !self.reaper.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.reaper = Some(waker.clone());
        }
        if self.awaiting == 0 {
            // Done: the next push spawns a reaper in its own task queue.
            self.reaper_state = ReaperState::Absent;
            self.reaper = None;
            return Ok(Poll::Ready(()));
        }
        self.reaper_state = ReaperState::Running;
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
        } else if !self.park_enabled {
            self.flush()?;
            self.reap();
        } else {
            let only_slow = self.slow_in_flight == self.in_flight();
            if self.wakeup.is_none() || (self.empty_waits < KERNEL_WAITS && !only_slow) {
                let reaped = self.wait_in_kernel()?;
                self.empty_waits = if reaped > 0 { 0 } else { self.empty_waits + 1 };
            } else {
                self.empty_waits = 0;
                if self.sleep(waker) {
                    return Ok(Poll::Pending);
                }
            }
        }
        waker.wake_by_ref();
        Ok(Poll::Pending)
    }

    /// The ring failed: every later operation fails with `reason`, and the
    /// futures in flight are woken to see it.
    pub(super) fn fail(&mut self, reason: String) {
        self.broken = Some(reason);
        for w in self.slots.iter_mut().filter_map(|s| s.waker.take()) {
            w.wake();
        }
        for w in self.waiters.drain(..) {
            w.wake();
        }
    }

    /// Wakes the reaper, if one runs. (When the channel is dropped, the
    /// woken reaper finds the ring gone and ends.)
    pub(super) fn wake_reaper(&self) {
        if let Some(w) = &self.reaper {
            w.wake_by_ref();
        }
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

    /// The reaper sleeps on the wakeup unless a last look finds
    /// completions; returns whether it sleeps (else it polls again).
    fn sleep(&mut self, waker: &Waker) -> bool {
        if let Some(w) = &mut self.wakeup {
            w.reset();
        }
        // A failure shows up again on the next poll's flush.
        let _ = self.flush();
        // Still flagged: the kernel ran only part of the pending work.
        if self.reap() > 0 || self.ring.submission().taskrun() {
            return false;
        }
        match self.wakeup.as_mut().map(|w| w.sleep(waker)) {
            Some(Ok(true)) => {
                self.reaper_state = ReaperState::Asleep;
                self.sleeps += 1;
                true
            }
            Some(Ok(false)) | None => false,
            Some(Err(())) => {
                self.wakeup = None; // the kernel refused the read: park there
                false
            }
        }
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
        self.awaiting = self.awaiting.saturating_sub(1);
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
        for w in self.waiters.drain(..) {
            w.wake();
        }
    }

    /// Parks the future of `slot` until its completion is reaped (`waker`
    /// is woken then). With no reaper, returns true: the caller spawns one,
    /// which submits the entry in its first wait. If the reaper runs, the
    /// entry goes to the kernel now, as fio does, rather than with the
    /// reaper's next wait: holding the entries that a reap's woken futures
    /// push until the reaper ran again cost a 4 KiB random read at QD32
    /// ~8 % of its IOPS (the device queue ran short by the entries held);
    /// and a sleeping reaper is woken.
    #[must_use = "true: the caller spawns a reaper"]
    pub(super) fn park(&mut self, slot: u32, waker: &Waker) -> bool {
        self.store_waker(slot, waker);
        match self.reaper_state {
            ReaperState::Absent => {
                self.reaper_state = ReaperState::Running;
                return true;
            }
            ReaperState::Running => {
                // A failure shows up again on the reaper's next submit.
                let _ = self.submit();
            }
            ReaperState::Asleep => {
                let _ = self.submit();
                self.reaper_state = ReaperState::Running;
                self.wake_reaper();
            }
        }
        false
    }

    /// A later poll of the future of `slot`, still in flight: takes what
    /// the completion queue holds (no system call) and registers `waker`.
    /// Returns whether its result is there.
    pub(super) fn check(&mut self, slot: u32, waker: &Waker) -> bool {
        if self.result_ready(slot) {
            return true;
        }
        self.reap();
        if self.result_ready(slot) {
            return true;
        }
        self.store_waker(slot, waker);
        false
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

/// The reaper task of a channel (see the module doc). It holds the ring
/// weakly: the channel owns it, and wakes the task to end when dropped.
pub(super) struct Reaper(pub(super) Weak<RefCell<RingState>>);

impl Future for Reaper {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(state) = self.0.upgrade() else {
            return Poll::Ready(());
        };
        let Ok(mut state) = state.try_borrow_mut() else {
            // An operation of this xstream holds the ring: look again.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        match state.reaper_poll(cx.waker()) {
            Ok(p) => p,
            Err(e) => {
                state.fail(e.to_string());
                Poll::Ready(())
            }
        }
    }
}
