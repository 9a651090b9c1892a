//! The message mesh: one mailbox per xstream, each with one bounded lane per
//! sending xstream (single producer) and one lane shared by every other
//! thread. A message is a closure that the destination's mailbox pump runs
//! to spawn the real task into the requested class queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::oneshot;
use futures::task::AtomicWaker;

use crate::context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::lane::Lane;
use crate::schedstat::{self, Sample, SchedStat};
use crate::{TaskClass, XstreamId};

pub(crate) type Message = Box<dyn FnOnce() + Send>;

/// How long an idle pump sleeps at most before it checks its lanes again: a
/// backstop only. Every push wakes the pump through its waker; the lost
/// cross-thread wakes this once guarded against at 500 µs (2,000 wakeups a
/// second of an idle xstream) were glommio parking with runnable queues,
/// fixed in vendor/glommio (vendor/PATCHES.md). A recheck that finds mail
/// whose wake was lost is counted ([`Mesh::lost_wakes`]) and logged.
const IDLE_RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// An idle wait starts with this long a first stage; only a pump still idle
/// after it reads its thread's scheduler statistics (a `/proc` read, too dear
/// for every idle transition of a busy xstream) before the rest of the wait.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(1);

/// A wake that has not had the pump polled after this long may have been
/// lost: an executor runs a woken task within microseconds. More than half
/// of the wait after [`SETTLE`], so that a wake that was delivered leaves
/// less than this much of the wait for the thread to have slept in.
const LOST_AFTER: std::time::Duration = std::time::Duration::from_millis(12);

/// A recheck timer that fires this late says its thread was not running.
const LATE: std::time::Duration = std::time::Duration::from_millis(2);

/// Measurement slack for the sleep a lost wake implies.
const SLEEP_SLACK: std::time::Duration = std::time::Duration::from_millis(1);

/// Messages the pump runs before it lets the task queues run.
const PUMP_BUDGET: usize = 64;

static NEXT_MESH_UID: AtomicU64 = AtomicU64::new(1);

/// A cheap, cloneable, `Send + Sync` handle to send work to the xstreams of
/// one set, from an xstream or from any other thread.
#[derive(Clone)]
pub struct Mesh {
    inner: Arc<MeshInner>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("xstreams", &self.len())
            .finish()
    }
}

struct MeshInner {
    uid: u64,
    /// Origin of the mailboxes' wake stamps.
    epoch: std::time::Instant,
    mailboxes: Vec<Mailbox>,
    closed: AtomicBool,
}

struct Mailbox {
    /// `lanes[i]` for i < n is written by xstream i only; `lanes[n]` by
    /// everyone else.
    lanes: Vec<Lane<Message>>,
    waker: AtomicWaker,
    /// 0 while the pump has seen every wake; else 1 + nanoseconds from the
    /// mesh epoch to the first push since the pump last looked at its lanes.
    woken_at: AtomicU64,
    /// Times the idle recheck timer, not a wake, ended the pump's wait.
    rechecks: AtomicU64,
    /// Of those, times the lanes had mail whose wake was older than
    /// [`LOST_AFTER`]: a push whose wake was lost.
    lost_wakes: AtomicU64,
}

impl Mesh {
    pub(crate) fn new(xstreams: usize, lane_capacity: usize) -> Self {
        let mailboxes = (0..xstreams)
            .map(|_| Mailbox {
                lanes: (0..=xstreams).map(|_| Lane::new(lane_capacity)).collect(),
                waker: AtomicWaker::new(),
                woken_at: AtomicU64::new(0),
                rechecks: AtomicU64::new(0),
                lost_wakes: AtomicU64::new(0),
            })
            .collect();
        let uid = NEXT_MESH_UID.fetch_add(1, Ordering::Relaxed);
        Self {
            inner: Arc::new(MeshInner {
                uid,
                epoch: std::time::Instant::now(),
                mailboxes,
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Number of xstreams.
    pub fn len(&self) -> usize {
        self.inner.mailboxes.len()
    }

    /// Always false: a set has at least one xstream.
    pub fn is_empty(&self) -> bool {
        self.inner.mailboxes.is_empty()
    }

    /// Messages waiting in the mailbox of `xs` (a snapshot, for metrics).
    pub fn queued(&self, xs: XstreamId) -> usize {
        self.inner
            .mailboxes
            .get(xs.0)
            .map_or(0, |m| m.lanes.iter().map(Lane::len).sum())
    }

    /// Times the pump of `xs` woke from idle by its recheck timer rather
    /// than by a push (an idle xstream's periodic wakeups).
    pub fn idle_rechecks(&self, xs: XstreamId) -> u64 {
        self.inner
            .mailboxes
            .get(xs.0)
            .map_or(0, |m| m.rechecks.load(Ordering::Relaxed))
    }

    /// Pushes, on every xstream, whose wake was lost: found by the idle
    /// recheck instead (0 unless the executor loses wakeups).
    pub fn lost_wakes(&self) -> u64 {
        (self.inner.mailboxes.iter())
            .map(|m| m.lost_wakes.load(Ordering::Relaxed))
            .sum()
    }

    /// True once the set began shutting down.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Runs `f()` and awaits its future on xstream `xs` in queue `class`, and
    /// returns the output. Works from an xstream (any, including `xs`) and
    /// from any other thread; the returned future is `Send`. Waits for space
    /// when the mailbox lane is full.
    pub fn run_on<F, Fut, T>(
        &self,
        xs: XstreamId,
        class: TaskClass,
        f: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        // A caller on another xstream of this mesh gets its answer through
        // its own mailbox, so the wake of the waiting task is a local one.
        // (The "lost cross-thread wakes" this once guarded against were
        // glommio 0.9 parking with runnable queues; vendor/PATCHES.md.)
        let origin = self.origin().filter(|&o| o != xs);
        let mesh = self.clone();
        let message = task_message(class, move || {
            let fut = f();
            async move {
                let output = fut.await;
                match origin {
                    Some(o) => {
                        let reply: Message = Box::new(move || {
                            let _ = tx.send(output);
                        });
                        let _ = mesh.push(o, reply).await;
                    }
                    None => {
                        let _ = tx.send(output);
                    }
                }
            }
        });
        let push = self.push(xs, message);
        async move {
            push.await?;
            rx.await.map_err(|_| Error::Canceled)
        }
    }

    /// Queues `f()` to run on `xs` without waiting for it; resolves once the
    /// message is in the mailbox (waiting for space when full).
    pub fn send<F, Fut>(
        &self,
        xs: XstreamId,
        class: TaskClass,
        f: F,
    ) -> impl Future<Output = Result<()>> + Send + 'static
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        self.push(xs, task_message(class, f))
    }

    /// Like [`Mesh::send`] but fails with [`Error::MailboxFull`] instead of
    /// waiting.
    pub fn try_send<F, Fut>(&self, xs: XstreamId, class: TaskClass, f: F) -> Result<()>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let (mailbox, lane) = self.route(xs)?;
        let lane_ref = &mailbox.lanes[lane];
        lane_ref
            .try_push(task_message(class, f))
            .map_err(|_| Error::MailboxFull { xstream: xs })?;
        self.after_push(mailbox, lane);
        Ok(())
    }

    /// Runs `f()` on `xs` and completes `event` with its output (or with the
    /// error that stopped it). Nobody needs to poll anything: the xstream
    /// completes the event, and the owner of its [`EventQueue`](crate::EventQueue)
    /// sees it in `poll`.
    pub fn run_with_event<F, Fut, T>(
        &self,
        xs: XstreamId,
        class: TaskClass,
        event: Event<T>,
        f: F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Event<T>>();
        let message = task_message(class, move || {
            let fut = f();
            async move {
                let output = fut.await;
                if let Ok(event) = rx.await {
                    event.complete(Ok(output));
                }
            }
        });
        let push = self.push(xs, message);
        async move {
            match push.await {
                Ok(()) => {
                    // If the task is gone already the event comes back here.
                    if let Err(event) = tx.send(event) {
                        event.complete(Err(Error::Canceled));
                    }
                }
                Err(e) => event.complete(Err(e)),
            }
        }
    }

    fn route(&self, xs: XstreamId) -> Result<(&Mailbox, usize)> {
        if self.is_closed() {
            return Err(Error::ShutDown);
        }
        let count = self.len();
        let mailbox = self
            .inner
            .mailboxes
            .get(xs.0)
            .ok_or(Error::NoSuchXstream { xstream: xs, count })?;
        Ok((mailbox, self.origin().map_or(count, |o| o.0)))
    }

    /// The calling xstream, if it belongs to this mesh.
    fn origin(&self) -> Option<XstreamId> {
        let uid = self.inner.uid;
        context::with(|c| (c.mesh.inner.uid == uid).then_some(c.id)).flatten()
    }

    fn after_push(&self, mailbox: &Mailbox, lane: usize) {
        fence(Ordering::SeqCst);
        if self.is_closed() {
            // The pump may have drained for the last time already: drop
            // what is left so that every waiter sees `Canceled`.
            while mailbox.lanes[lane].pop().is_some() {}
            return;
        }
        mailbox.stamp_wake(|| self.stamp());
        mailbox.waker.wake();
    }

    /// 1 + nanoseconds since the mesh epoch (never 0).
    fn stamp(&self) -> u64 {
        1 + self.inner.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn push(&self, xs: XstreamId, message: Message) -> Push {
        Push {
            mesh: self.clone(),
            xs,
            message: Some(message),
        }
    }

    /// Closes every mailbox and wakes the pumps.
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        for mailbox in &self.inner.mailboxes {
            mailbox.waker.wake();
            mailbox.lanes.iter().for_each(Lane::wake_space_waiters);
        }
    }

    /// The mailbox pump of xstream `me`: runs messages until the mesh closes,
    /// then drops what is left.
    pub(crate) async fn pump(&self, me: XstreamId) {
        let mailbox = &self.inner.mailboxes[me.0];
        let sched = SchedStat::of_this_thread();
        loop {
            let mut ran = 0;
            for lane in &mailbox.lanes {
                while ran < PUMP_BUDGET {
                    let Some(message) = lane.pop() else { break };
                    message();
                    ran += 1;
                }
            }
            if self.is_closed() {
                break;
            }
            if ran > 0 {
                glommio::executor().yield_task_queue_now().await;
            } else {
                self.wait_idle(mailbox, me, &sched).await;
            }
        }
        for lane in &mailbox.lanes {
            while lane.pop().is_some() {}
        }
    }

    /// Waits until there is mail or the mesh closes, or one recheck period
    /// passed (a backstop: the timer bounds what a lost cross-thread wake
    /// could cost, and a recheck that finds such mail counts it).
    async fn wait_idle(&self, mailbox: &Mailbox, me: XstreamId, sched: &SchedStat) {
        if !self.wait_stage(mailbox, SETTLE).await || mailbox.has_mail() {
            return;
        }
        // Each reading lies outside the stamps it is compared with, so that a
        // preemption in between counts as waiting, never as sleep.
        let baseline = sched.sample();
        let since = Baseline {
            at: self.stamp(),
            sched: baseline,
        };
        if self.wait_stage(mailbox, IDLE_RECHECK - SETTLE).await {
            let now = self.stamp();
            mailbox.note_recheck(me, since, now, sched.sample());
        }
    }

    /// Waits for mail or `period`; true if the period ended it.
    async fn wait_stage(&self, mailbox: &Mailbox, period: std::time::Duration) -> bool {
        let mail = WaitForMail {
            mailbox,
            closed: &self.inner.closed,
        };
        let timer = glommio::timer::Timer::new(period);
        let (mail, timer) = (std::pin::pin!(mail), std::pin::pin!(timer));
        // The timer is polled first, so that mail found when it has fired is
        // seen by `note_recheck` (polled second, the mail would win and a
        // lost wake would never be counted).
        matches!(
            futures::future::select(timer, mail).await,
            futures::future::Either::Left(_)
        )
    }
}

/// Where a recheck period began: a mesh stamp and the thread's scheduler
/// statistics then.
struct Baseline {
    at: u64,
    sched: Option<Sample>,
}

fn task_message<F, Fut>(class: TaskClass, f: F) -> Message
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    // `f` runs inside the task, so that a panic in it (caught there) cannot
    // take the pump down.
    Box::new(move || context::spawn_tracked(class, async move { f().await }))
}

pub(crate) struct Push {
    mesh: Mesh,
    xs: XstreamId,
    message: Option<Message>,
}

impl Future for Push {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        let (mailbox, lane) = match this.mesh.route(this.xs) {
            Ok(route) => route,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if this.message.is_none() {
            return Poll::Ready(Ok(()));
        }
        match mailbox.lanes[lane].poll_push(&mut this.message, cx) {
            Poll::Ready(()) => {
                this.mesh.after_push(mailbox, lane);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Mailbox {
    fn has_mail(&self) -> bool {
        self.lanes.iter().any(|l| !l.is_empty())
    }

    /// Records `stamp()` as the time of the first wake since the pump last
    /// looked at its lanes (the clock is read only for that one).
    fn stamp_wake(&self, stamp: impl FnOnce() -> u64) {
        if self.woken_at.load(Ordering::Relaxed) == 0 {
            let _ =
                (self.woken_at).compare_exchange(0, stamp(), Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// Counts a recheck period (begun at `since`) the timer ended at `now`,
    /// and a lost wake if there is mail whose wake is [`LOST_AFTER`] old and
    /// the thread slept through it (logged the first time). Younger mail
    /// raced the timer: its wake is on its way. A delivered wake leaves the
    /// thread running or waiting for a CPU from the push on, so a thread
    /// that was descheduled on a busy machine, or blocked, is not counted:
    /// neither is one whose timer fired [`LATE`] or more after its deadline.
    fn note_recheck(&self, me: XstreamId, since: Baseline, now: u64, sched: Option<Sample>) {
        self.rechecks.fetch_add(1, Ordering::Relaxed);
        let woken_at = self.woken_at.load(Ordering::SeqCst);
        if woken_at == 0 || !self.has_mail() {
            return;
        }
        let age = now.saturating_sub(woken_at);
        let period = (IDLE_RECHECK - SETTLE).as_nanos() as u64;
        let late = now.saturating_sub(since.at + period);
        if age < LOST_AFTER.as_nanos() as u64 || late >= LATE.as_nanos() as u64 {
            return;
        }
        let slept = match (since.sched, sched) {
            (Some(a), Some(b)) => schedstat::slept(a, b, now - since.at),
            _ => age, // no scheduler info: trust the clock alone
        };
        if slept + (SLEEP_SLACK.as_nanos() as u64) < age {
            return;
        }
        if self.lost_wakes.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                xstream = me.0,
                wake_age_us = age / 1000,
                slept_us = slept / 1000,
                "mailbox pump found mail its waker missed"
            );
        }
    }
}

struct WaitForMail<'a> {
    mailbox: &'a Mailbox,
    closed: &'a AtomicBool,
}

impl Future for WaitForMail<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.mailbox.waker.register(cx.waker());
        // Pushes from here on stamp their wake; earlier ones are seen below.
        self.mailbox.woken_at.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.mailbox.has_mail() || self.closed.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::{XstreamConfig, XstreamSet};

    /// What an executor that loses a wake looks like to the pump: a pushed
    /// message, its wake stamped, the waker never called.
    fn push_unwoken(mesh: &Mesh, xs: XstreamId, message: Message) {
        let (mailbox, lane) = mesh.route(xs).unwrap();
        assert!(mailbox.lanes[lane].try_push(message).is_ok());
        mailbox.stamp_wake(|| mesh.stamp());
    }

    /// The recheck's verdict on mail whose wake is 17 ms old: lost only if
    /// the thread slept through it, not if it was waiting for a CPU (a busy
    /// machine) or the timer fired late.
    #[test]
    fn only_a_thread_that_slept_with_mail_waiting_counts_a_lost_wake() {
        const MS: u64 = 1_000_000;
        let mesh = Mesh::new(1, 4);
        let (mailbox, lane) = mesh.route(XstreamId(0)).unwrap();
        assert!(mailbox.lanes[lane].try_push(Box::new(|| {})).is_ok());
        let t0 = 100 * MS;
        mailbox.woken_at.store(t0 + 2 * MS, Ordering::SeqCst);
        let since = || Baseline {
            at: t0,
            sched: Some(Sample { run: 0, wait: 0 }),
        };
        let at_deadline = t0 + 19 * MS;
        let recheck = |since: Baseline, now: u64, run: u64, wait: u64| {
            let before = mailbox.lost_wakes.load(Ordering::Relaxed);
            let sched = Some(Sample { run, wait });
            mailbox.note_recheck(XstreamId(0), since, now, sched);
            mailbox.lost_wakes.load(Ordering::Relaxed) - before
        };
        // Descheduled for 15 of the 19 ms: a busy machine, not a lost wake.
        assert_eq!(recheck(since(), at_deadline, MS, 15 * MS), 0);
        // Running other tasks for 16 ms: not a lost wake either.
        assert_eq!(recheck(since(), at_deadline, 16 * MS, 0), 0);
        // The timer fired 3 ms late: the thread was not running.
        assert_eq!(recheck(since(), at_deadline + 3 * MS, 0, 0), 0);
        // Asleep from the push to the timer: lost.
        assert_eq!(recheck(since(), at_deadline, MS / 5, MS / 5), 1);
        // Without scheduler statistics the clock alone decides.
        let blind = Baseline {
            at: t0,
            sched: None,
        };
        assert_eq!(recheck(blind, at_deadline, 0, 0), 1);
        // Mail 11 ms old raced the timer.
        mailbox.woken_at.store(t0 + 8 * MS, Ordering::SeqCst);
        assert_eq!(recheck(since(), at_deadline, 0, 0), 0);
        assert_eq!(mailbox.rechecks.load(Ordering::Relaxed), 6);
    }

    /// The recheck finds the message, runs it, and counts the lost wake;
    /// messages pushed the normal way are not counted.
    #[test]
    fn a_lost_wake_is_found_by_the_recheck_and_counted() {
        let set = XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).unwrap();
        let mesh = set.mesh().clone();
        let xs = XstreamId(0);
        for k in 0..50usize {
            let got = futures::executor::block_on(mesh.run_on(
                xs,
                TaskClass::Foreground,
                move || async move { k },
            ));
            assert_eq!(got.unwrap(), k);
        }
        assert_eq!(mesh.lost_wakes(), 0);
        // Let the pump go idle, then hide a message from it early in its
        // recheck period, so that it is LOST_AFTER old when the timer fires.
        // A thread that did not sleep through it (the test machine is busy)
        // is not counted: try again, a bounded number of times.
        for attempt in 1..=10 {
            std::thread::sleep(Duration::from_millis(5));
            let (tx, rx) = mpsc::channel();
            push_unwoken(&mesh, xs, Box::new(move || tx.send(()).unwrap()));
            rx.recv_timeout(Duration::from_secs(5))
                .expect("the recheck runs the message");
            if mesh.lost_wakes() > 0 || attempt == 10 {
                break;
            }
        }
        assert_eq!(mesh.lost_wakes(), 1);
        set.shutdown().unwrap();
    }
}
