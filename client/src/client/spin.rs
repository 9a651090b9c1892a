//! Busy-polling for a reply, and where it is allowed.
//!
//! A caller blocked on its own reply ([`super::reader`]) polls the socket
//! without sleeping for up to a budget ([`ClientOptions::reply_spin`]) before
//! it sleeps in `poll(2)`. Sleeping costs the round trip a wake-up on each
//! side: the engine's send must wake the caller's idle CPU, and the caller's
//! thread must be scheduled in again; on a virtual machine each is an exit,
//! together about a third of a 16-request PUT batch's round trip over a Unix
//! socket. The engine's xstreams poll the same way before they park.
//!
//! Polling burns the CPU it runs on, so the poller yields it between tries
//! (whatever else is runnable there goes first: other threads, and the
//! kernel workers that complete a device write, which polling without
//! yielding held up so that durable PUTs ran at half speed), and a caller
//! polls only where that takes nothing from the engine or other pollers:
//! - never on a CPU one of the engine's xstreams is pinned to, when the
//!   engine is on this host (a Unix socket, or TCP to a loopback address):
//!   the Welcome names those CPUs ([`TargetInfo::core`]). A caller there
//!   would hold the CPU the reply has to be made on;
//! - by at most as many callers at once, in this process, as it may run on
//!   CPUs that no such xstream uses.
//!
//! An embedded engine has an xstream on every CPU this process may use, so
//! its callers never poll.
//!
//! [`ClientOptions::reply_spin`]: super::ClientOptions::reply_spin
//! [`TargetInfo::core`]: ferrite_proto::rpc::TargetInfo::core

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferrite_proto::rpc::TargetInfo;

/// Default of [`super::ClientOptions::reply_spin`]: a little over a
/// device-durable write's round trip on one host.
pub const DEFAULT_REPLY_SPIN: Duration = Duration::from_micros(500);

/// Callers of this process polling a socket right now.
static POLLING: AtomicUsize = AtomicUsize::new(0);

/// Where and how long a connection's callers may poll for their replies.
#[derive(Debug)]
pub(crate) struct SpinPolicy {
    budget: Duration,
    /// CPUs of the engine's xstreams on this host: never polled on.
    avoid: Vec<usize>,
    /// Callers that may poll at once.
    limit: usize,
}

impl SpinPolicy {
    /// The policy for an engine with `targets`; `local` when it runs on
    /// this host. `allowed`: the CPUs this process may run on.
    pub(crate) fn new(
        budget: Duration,
        targets: &[TargetInfo],
        local: bool,
        allowed: &[usize],
    ) -> Self {
        let avoid: Vec<usize> = match local {
            true => targets
                .iter()
                .filter_map(|t| t.core)
                .map(usize::from)
                .collect(),
            false => Vec::new(),
        };
        let limit = allowed.iter().filter(|c| !avoid.contains(c)).count();
        Self {
            budget,
            avoid,
            limit,
        }
    }

    /// Polling allowed for now: the budget, and a guard that frees this
    /// caller's place among the pollers when dropped. `None`: sleep.
    pub(crate) fn begin(&self) -> Option<Polling> {
        if self.budget.is_zero() || self.limit == 0 {
            return None;
        }
        // SAFETY: no arguments; returns the CPU this thread runs on, or -1.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu < 0 || self.avoid.contains(&(cpu as usize)) {
            return None;
        }
        let limit = self.limit;
        let taken = POLLING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        });
        taken.ok().map(|_| Polling {
            budget: self.budget,
        })
    }
}

/// A caller's place among the pollers (see [`SpinPolicy::begin`]).
#[derive(Debug)]
pub(crate) struct Polling {
    pub(crate) budget: Duration,
}

impl Drop for Polling {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(core: Option<u16>) -> TargetInfo {
        TargetInfo {
            target: 0,
            xstream: 0,
            state: 0,
            core,
        }
    }

    #[test]
    fn a_local_engine_keeps_its_cpus_and_the_pollers_share_the_rest() {
        let budget = Duration::from_micros(50);
        let t = [target(Some(0)), target(Some(2))];
        let p = SpinPolicy::new(budget, &t, true, &[0, 1, 2, 3]);
        assert_eq!((p.avoid.clone(), p.limit), (vec![0, 2], 2));
        // A remote engine's CPUs are not ours.
        let r = SpinPolicy::new(budget, &t, false, &[0, 1, 2, 3]);
        assert_eq!((r.avoid.len(), r.limit), (0, 4));
        // An engine that does not name its CPUs, or one on every CPU.
        let old = SpinPolicy::new(budget, &[target(None)], true, &[0, 1]);
        assert_eq!(old.limit, 2);
        let full = SpinPolicy::new(budget, &t, true, &[0, 2]);
        assert!(full.begin().is_none(), "no CPU is free of the engine");
        assert!(SpinPolicy::new(Duration::ZERO, &t, false, &[0])
            .begin()
            .is_none());
    }

    #[test]
    fn pollers_never_sit_on_the_engines_cpu_nor_outnumber_the_free_ones() {
        // This thread on one CPU, so that it cannot move between the checks.
        let allowed = ferrite_xstream::allowed_cores().unwrap();
        let here = allowed[0];
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and the call get a
        // valid set of the size given.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(here, &mut set);
            let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            assert_eq!(rc, 0, "pin the test thread");
        }
        let here = here as u16;
        let on_us = SpinPolicy::new(DEFAULT_REPLY_SPIN, &[target(Some(here))], true, &allowed);
        assert!(
            on_us.begin().is_none(),
            "this thread runs on the engine's CPU"
        );
        // A remote engine: one poller per allowed CPU, then no more.
        let remote = SpinPolicy::new(
            DEFAULT_REPLY_SPIN,
            &[target(Some(here))],
            false,
            &[here.into()],
        );
        let first = remote.begin();
        assert!(first.is_some());
        assert!(remote.begin().is_none(), "the only free CPU has its poller");
        drop(first);
        assert!(remote.begin().is_some(), "the place was freed");
    }
}
