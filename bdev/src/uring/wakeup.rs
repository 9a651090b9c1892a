//! How a channel's reaper sleeps until its ring has completions, without
//! blocking the xstream.
//!
//! An eventfd is registered with the ring: the kernel adds to it whenever
//! completions are posted or, on a `DEFER_TASKRUN` ring, whenever completion
//! work becomes pending (the ring's `IORING_SQ_TASKRUN` flag goes up at the
//! same moment). A reaper that found nothing for a while *arms* a read of the
//! eventfd through glommio's reactor (`BufferedFile::read_at` on a duplicate
//! of the descriptor) and returns `Pending`. The xstream then runs its other
//! tasks, or parks in glommio's own `io_uring_enter` if there are none, and
//! the read completing wakes the reaper.
//!
//! The counter is sticky, which closes the race between "nothing there" and
//! "asleep": the reaper empties it (a non-blocking read) *before* its last
//! look at the ring, so a completion after that look leaves it non-zero and
//! the armed read returns at once.
//!
//! At most one read is in flight per channel, and glommio sees one waker for
//! it (ours, below), however often the reaper sleeps on it.

use futures::task::AtomicWaker;
use glommio::io::BufferedFile;
use io_uring::IoUring;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

type ArmedRead = Pin<Box<dyn Future<Output = glommio::Result<(), ()>>>>;

/// The waker glommio holds for the armed read: records that the read
/// completed and wakes the future that last went to sleep on it.
#[derive(Default)]
struct Fired {
    fired: AtomicBool,
    sleeper: AtomicWaker,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.sleeper.wake();
    }
}

pub(super) struct Wakeup {
    /// Registered with the ring; emptied without blocking.
    eventfd: OwnedFd,
    /// A duplicate of `eventfd`, read through glommio's reactor.
    file: Rc<BufferedFile>,
    armed: Option<ArmedRead>,
    fired: Arc<Fired>,
    fired_waker: Waker,
}

impl Wakeup {
    /// Creates an eventfd and registers it with `ring`. Call it on the
    /// thread of a running glommio executor (an xstream). `None` when the
    /// kernel refuses; the poller then waits in the kernel instead.
    pub(super) fn new(ring: &IoUring) -> Option<Self> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a descriptor nobody else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let dup = eventfd.try_clone().ok()?;
        ring.submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .ok()?;
        // SAFETY: glommio takes ownership of the duplicate and closes it
        // through its reactor while the executor runs; after that, `drop`
        // closes it.
        let file = Rc::new(unsafe { BufferedFile::from_raw_fd(dup.into_raw_fd()) });
        let fired = Arc::new(Fired::default());
        Some(Self {
            eventfd,
            file,
            armed: None,
            fired_waker: Waker::from(Arc::clone(&fired)),
            fired,
        })
    }

    /// The eventfd and its duplicate read through glommio (tests).
    #[cfg(test)]
    pub(super) fn fds(&self) -> [std::os::fd::RawFd; 2] {
        [self.eventfd.as_raw_fd(), self.file.as_raw_fd()]
    }

    /// Empties the counter without blocking (a counter of zero is fine).
    /// Call it before the last look at the ring ahead of [`Self::sleep`].
    pub(super) fn reset(&mut self) {
        if self.armed.is_some() && !self.fired.fired.load(Ordering::Acquire) {
            return; // the armed read has seen zero and waits: nothing to empty
        }
        self.armed = None;
        self.fired.fired.store(false, Ordering::Release);
        let mut value = 0u64;
        let iov = libc::iovec {
            iov_base: (&mut value as *mut u64).cast(),
            iov_len: 8,
        };
        // SAFETY: reads at most 8 bytes into `value`. EAGAIN (zero) is fine.
        unsafe { libc::preadv2(self.eventfd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
    }

    /// Arms the read if it is not armed and makes `waker` the one woken
    /// when it completes. `Ok(false)`: it has completed already
    /// (completions came after [`Self::reset`]), look at the ring again
    /// instead of sleeping. `Err`: the read failed; do not use this wakeup.
    pub(super) fn sleep(&mut self, waker: &Waker) -> Result<bool, ()> {
        self.fired.sleeper.register(waker);
        if self.fired.fired.load(Ordering::Acquire) {
            return Ok(false);
        }
        if self.armed.is_some() {
            return Ok(true);
        }
        let file = Rc::clone(&self.file);
        let mut read: ArmedRead = Box::pin(async move { file.read_at(0, 8).await.map(drop) });
        // Polled with our waker once per read: glommio keeps every waker
        // it is given until the read completes.
        let mut cx = Context::from_waker(&self.fired_waker);
        match read.as_mut().poll(&mut cx) {
            Poll::Pending => {
                self.armed = Some(read);
                Ok(true)
            }
            Poll::Ready(Ok(())) => {
                self.fired.fired.store(true, Ordering::Release);
                Ok(false)
            }
            Poll::Ready(Err(_)) => Err(()),
        }
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        // The armed read holds the file too.
        self.armed = None;
        if ferrite_xstream::current().is_some() {
            return; // on its running xstream: glommio closes the duplicate
        }
        // The xstream's executor has ended (it is run once and dropped):
        // its reactor is gone, or never submits the close it queues now.
        if Rc::strong_count(&self.file) == 1 {
            // SAFETY: the duplicate is owned by `file` alone (the armed read
            // that shared it is gone), whose drop no longer closes it.
            unsafe { libc::close(self.file.as_raw_fd()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::channel::UringChannel;
    use super::super::UringOptions;
    use crate::Channel;
    use ferrite_xstream::{TaskClass, XstreamConfig, XstreamId, XstreamSet};
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::sync::Arc;
    use std::time::Duration;

    /// A channel over a pipe: a read completes exactly when someone writes.
    fn pipe_channel() -> (UringChannel, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors that we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors are new and owned by nobody else.
        let (rx, tx) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        let opts = UringOptions::default();
        let ch =
            UringChannel::new("pipe".into(), Arc::new(rx), None, 4096, 1 << 20, &opts).unwrap();
        (ch, tx)
    }

    /// On an xstream a reaper with nothing to reap sleeps without blocking
    /// the thread (a sibling future keeps running until it feeds the read),
    /// and a completion that arrives while the xstream is otherwise idle
    /// (written by another thread) wakes it. A lost wakeup hangs: bounded.
    #[test]
    fn reaper_sleeps_without_blocking_and_wakes_on_completion() {
        let set = XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).unwrap();
        let body = || async {
            let (ch, mut tx) = pipe_channel();
            let read = ch.read(0, ch.alloc(4096).unwrap());
            let feed = async {
                for _ in 0..50 {
                    glommio::executor().yield_now().await;
                }
                tx.write_all(&[7u8; 4096]).unwrap();
            };
            let (back, ()) = futures::join!(read, feed);
            assert!(back.unwrap().as_slice().iter().all(|&b| b == 7));
            assert!(ch.sleeps() > 0, "the reaper never slept on its eventfd");
            let before = ch.sleeps();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                tx.write_all(&[9u8; 4096]).unwrap();
            });
            let back = ch.read(0, ch.alloc(4096).unwrap()).await.unwrap();
            assert!(back.as_slice().iter().all(|&b| b == 9));
            assert!(ch.sleeps() > before);
            writer.join().unwrap();
        };
        let done = set.mesh().run_on(XstreamId(0), TaskClass::Foreground, body);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(futures::executor::block_on(done));
        });
        let result = rx.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(result, Ok(Ok(()))),
            "stalled or failed: {result:?}"
        );
        set.shutdown().unwrap();
    }

    /// An entry pushed while the reaper runs goes to the kernel at once,
    /// not with the reaper's next wait.
    #[test]
    fn an_entry_pushed_while_the_reaper_runs_is_submitted_at_once() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let (ch, mut tx) = pipe_channel();
                let mut first = Box::pin(ch.read(0, ch.alloc(4096).unwrap()));
                // Push; the woken reaper submits and waits once in vain.
                assert!(futures::poll!(&mut first).is_pending());
                assert!(ch.unsubmitted(), "pushed to an idle reaper");
                glommio::executor().yield_now().await;
                assert!(!ch.unsubmitted());
                let mut second = Box::pin(ch.read(0, ch.alloc(4096).unwrap()));
                assert!(futures::poll!(&mut second).is_pending());
                assert!(!ch.unsubmitted(), "the second read waits for the reaper");
                tx.write_all(&[4u8; 8192]).unwrap();
                let (a, b) = futures::join!(first, second);
                for back in [a.unwrap(), b.unwrap()] {
                    assert!(back.as_slice().iter().all(|&b| b == 4));
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// With only flushes in flight the reaper sleeps on its eventfd at
    /// once: short kernel waits would all run out before a disk's flush.
    #[test]
    fn a_flush_alone_is_slept_on_not_waited_for_in_the_kernel() {
        let set = XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let body = move || async move {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap();
            file.set_len(1 << 20).unwrap();
            let opts = UringOptions {
                direct: false,
                ..UringOptions::default()
            };
            let ch =
                UringChannel::new("flushes".into(), Arc::new(file), None, 4096, 1 << 20, &opts)
                    .unwrap();
            for _ in 0..20 {
                ch.flush().await.unwrap();
            }
            let waits = ch.kernel_waits();
            assert_eq!(waits, 0, "the reaper waited in the kernel for flushes");
        };
        let done = set.mesh().run_on(XstreamId(0), TaskClass::Foreground, body);
        let result = futures::executor::block_on(done);
        assert!(result.is_ok(), "{result:?}");
        set.shutdown().unwrap();
    }

    thread_local! {
        static KEPT: std::cell::RefCell<Vec<UringChannel>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    fn is_eventfd(fd: std::os::fd::RawFd) -> bool {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|target| target.to_string_lossy().contains("eventfd"))
    }

    /// A channel that outlives its xstream's executor (kept in a
    /// thread-local of the xstream's thread, dropped when the thread exits)
    /// closes both of its eventfd's descriptors.
    #[test]
    fn channel_dropped_after_its_executor_closes_its_eventfd() {
        let set = XstreamSet::start(XstreamConfig::default().with_cores(vec![0])).unwrap();
        let body = || async {
            let (ch, _tx) = pipe_channel();
            let fds = ch
                .wakeup_fds()
                .expect("a channel on an xstream has an eventfd");
            KEPT.with(|kept| kept.borrow_mut().push(ch));
            fds
        };
        let done = set.mesh().run_on(XstreamId(0), TaskClass::Foreground, body);
        let fds = futures::executor::block_on(done).unwrap();
        assert!(fds.iter().all(|&fd| is_eventfd(fd)), "{fds:?}");
        set.shutdown().unwrap();
        let open: Vec<_> = fds.iter().filter(|&&fd| is_eventfd(fd)).collect();
        assert!(open.is_empty(), "eventfd descriptors left open: {open:?}");
    }
}
