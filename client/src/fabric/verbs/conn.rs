//! One queue pair of a verbs endpoint: its registered landing buffer, the
//! books of its reads (`book.rs`: staged, in flight, landed; matched to
//! their completions by `wr_id`), and the side-channel socket whose
//! closing says the engine is gone.
//!
//! Every read gets its own range of the landing buffer and its own
//! `wr_id`, so blocking reads ([`Conn::read_wait`]) and any number of
//! asynchronous ones (`posted.rs`) share the queue pair: whoever polls the
//! completion queue files every completion it finds under its read. An
//! asynchronous read's bytes are copied out of the landing buffer as soon
//! as its completion is seen (by whichever caller polls), so that a
//! blocking read never waits for a future nobody polls to free its range.
//!
//! Reads are staged and go out together, one doorbell
//! ([`ReadCounts::doorbells`]) for all the queue pair holds staged: an
//! asynchronous read is staged when asked for and rung by the first poll
//! of any read of the queue pair ([`Conn::flush`]), a blocking read rings
//! at once, taking the staged ones with it.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_engine::fabric::verbs::{MemoryRegion, RcQp, WorkCompletion, BATCH_MAX};

use super::book::Book;
pub(super) use super::book::Remote;
use super::ReadCounts;

/// Reads one queue pair keeps in flight at most (its send queue depth).
pub(super) const QP_DEPTH: usize = 64;
/// How long a read may wait for its completion when neither the queue
/// pair's retries nor the side channel say the engine is gone.
pub(super) const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Empty polls of the completion queue between two looks at the clock and
/// the side channel: on an emulated clock every reading of it would delay
/// noticing the completion.
const CHECK_EVERY: u32 = 1024;

/// One connected queue pair with its registered landing buffer.
pub(super) struct Conn {
    qp: RcQp,
    // Declared after qp: the registration goes after the queue pair and
    // before the memory it covers.
    _mr: MemoryRegion,
    buf: Box<[u8]>,
    /// Non-blocking; the engine never writes after the exchange, so a read
    /// of 0 bytes means it closed (stopped or was killed).
    side: TcpStream,
    book: Book,
    /// Why the queue pair is unusable, once it is.
    broken: Option<String>,
    completions: Vec<WorkCompletion>,
    counts: Arc<ReadCounts>,
}

impl Conn {
    /// `buf` must be the memory `mr` registers (kept here, dropped after it).
    pub(super) fn new(
        qp: RcQp,
        mr: MemoryRegion,
        mut buf: Box<[u8]>,
        side: TcpStream,
        counts: Arc<ReadCounts>,
    ) -> Self {
        let book = Book::new(buf.as_mut_ptr() as u64, mr.lkey(), buf.len(), QP_DEPTH);
        Self {
            qp,
            _mr: mr,
            buf,
            side,
            book,
            broken: None,
            completions: Vec::with_capacity(BATCH_MAX),
            counts,
        }
    }

    /// Stages `reads` for the next doorbell (ringing it first when they
    /// would not fit in one); returns the first one's `wr_id` (the others
    /// follow in order), or `None` when the send queue or the landing
    /// buffer has no room for them now. `detach`: the bytes are taken with
    /// [`Conn::take_owned`], else with [`Conn::take_into`].
    pub(super) fn stage(&mut self, reads: &[Remote], detach: bool) -> Result<Option<u64>, String> {
        if let Some(cause) = &self.broken {
            return Err(cause.clone());
        }
        if reads.len() > BATCH_MAX {
            return Ok(None);
        }
        if self.book.staged().len() + reads.len() > BATCH_MAX {
            self.flush()?;
        }
        let room = QP_DEPTH.saturating_sub(self.qp.outstanding());
        Ok(self.book.stage(reads, detach, room))
    }

    /// Rings the doorbell for every staged read (one work-request list);
    /// on failure each of them fails with the returned cause.
    pub(super) fn flush(&mut self) -> Result<(), String> {
        let n = self.book.staged().len();
        if n == 0 {
            return Ok(());
        }
        if let Err(e) = self.qp.post_reads(self.book.staged()) {
            let cause = self.break_with(e.to_string());
            self.book.fail_staged(&cause);
            return Err(cause);
        }
        self.book.mark_posted();
        self.counts.posted(n);
        Ok(())
    }

    /// Whether a poll should ring the doorbell now (see `Book::ring_now`).
    pub(super) fn ring_now(&self, held_back: bool) -> bool {
        self.book.ring_now(held_back)
    }

    /// Whether reads wait for the next doorbell.
    pub(super) fn has_staged(&self) -> bool {
        !self.book.staged().is_empty()
    }

    /// Posts `reads` at once, with whatever was staged before them (one
    /// doorbell when they fit in one); returns the first one's `wr_id`, or
    /// `None` when there is no room for them now.
    pub(super) fn post(&mut self, reads: &[Remote], detach: bool) -> Result<Option<u64>, String> {
        let Some(first) = self.stage(reads, detach)? else {
            return Ok(None);
        };
        if let Err(cause) = self.flush() {
            (0..reads.len()).for_each(|i| self.book.abandon(first + i as u64));
            return Err(cause);
        }
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
            self.book.complete(wr_id, result, &self.buf);
        }
        self.completions = completions;
        n
    }

    /// A completed read's bytes copied into `dst`, its flight gone; `None`
    /// while it is staged or in flight.
    pub(super) fn take_into(&mut self, wr_id: u64, dst: &mut [u8]) -> Option<Result<(), String>> {
        self.book.take_into(wr_id, dst, &self.buf)
    }

    /// A completed detached read's bytes; `None` while it is staged or in
    /// flight.
    pub(super) fn take_owned(&mut self, wr_id: u64) -> Option<Result<Vec<u8>, String>> {
        self.book.take_owned(wr_id, &self.buf)
    }

    /// Forgets a read whose poster gave up on it.
    pub(super) fn abandon(&mut self, wr_id: u64) {
        self.book.abandon(wr_id);
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

    /// Posts `reads` and blocks until each read has landed in its `dsts`
    /// entry, filing other reads' completions on the way.
    pub(super) fn read_wait(
        &mut self,
        reads: &[Remote],
        dsts: &mut [&mut [u8]],
    ) -> Result<(), String> {
        let first = self.post_waiting(reads)?;
        self.wait_posted(first, dsts)
    }

    /// Posts `reads`, waiting for room when the queue pair has none now;
    /// returns the first one's `wr_id`.
    fn post_waiting(&mut self, reads: &[Remote]) -> Result<u64, String> {
        let mut patience = Patience::default();
        loop {
            if let Some(first) = self.post(reads, false)? {
                return Ok(first);
            }
            // No room: staged reads go out now (they may be what fills the
            // send queue), and completions free room.
            self.flush()?;
            if self.progress() == 0 {
                patience.idle(self)?;
            }
        }
    }

    /// Two dependent reads: posts `first`, and from the poll that finds it
    /// landed posts the read `pick` chooses from its bytes in the landing
    /// buffer (`None`: no second read), before anything else is done with
    /// them; then copies them into `dst` and runs `meanwhile` on them while
    /// the second read is in flight. Returns the second read's `wr_id`
    /// (wait for it with [`Conn::wait_posted`]).
    pub(super) fn read_dependent(
        &mut self,
        first: Remote,
        dst: &mut [u8],
        pick: &mut dyn FnMut(&[u8]) -> Option<Remote>,
        meanwhile: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<u64>, String> {
        let id = self.post_waiting(&[first])?;
        let at = match self.wait_landed(id) {
            Ok(at) => at,
            Err(cause) => {
                self.abandon(id);
                return Err(cause);
            }
        };
        let second = pick(&self.buf[at..at + dst.len()]);
        let posted = match second {
            Some(r) => self.post(&[r], false),
            None => Ok(None),
        };
        let taken = self.take_into(id, dst);
        let posted = posted?;
        match taken {
            Some(Ok(())) => {}
            Some(Err(cause)) => return Err(cause),
            None => return Err("landed read not found".into()),
        }
        meanwhile(dst);
        match (posted, second) {
            (Some(second_id), _) => Ok(Some(second_id)),
            // No room for it at once: it goes now, waiting for room.
            (None, Some(r)) => self.post_waiting(&[r]).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// Blocks until the read `wr_id` has landed; returns where, in the
    /// landing buffer (the read stays filed until taken).
    fn wait_landed(&mut self, wr_id: u64) -> Result<usize, String> {
        let mut patience = Patience::default();
        loop {
            match self.book.landed_at(wr_id) {
                Some(r) => return r,
                None if self.progress() == 0 => patience.idle(self)?,
                None => {}
            }
        }
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
