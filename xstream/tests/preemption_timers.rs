//! Guards the vendored glommio's preemption-timer patch (vendor/PATCHES.md):
//! a scheduler turn that does not sleep keeps the preemption timers already
//! armed instead of cancelling and arming both again (two `io_uring_enter`
//! calls and two in-kernel cancellations per turn, which made up most of an
//! xstream's system calls under a pipelined client).

use std::time::Duration;

/// Timer wake-ups the task waits for; each ends a turn of the executor.
const TURNS: u64 = 500;

#[test]
fn turns_that_do_not_sleep_keep_the_armed_preemption_timers() {
    let armed = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(0))
        // Spinning between turns (glommio spins only on a pinned thread):
        // a turn's end polls instead of sleeping, like a busy xstream's.
        .spin_before_park(Duration::from_millis(50))
        .spawn(|| async {
            let before = glommio::executor().preemption_timers_armed();
            for _ in 0..TURNS {
                glommio::timer::sleep(Duration::from_micros(20)).await;
            }
            glommio::executor().preemption_timers_armed() - before
        })
        .unwrap()
        .join()
        .unwrap();
    // Unpatched: two per turn (latency and throughput), 1000 here. Patched:
    // only when one fired or the executor slept (descheduled for longer
    // than the spin), a handful.
    assert!(
        armed < TURNS / 2,
        "{armed} preemption timers armed over {TURNS} turns"
    );
    eprintln!("{armed} preemption timers armed over {TURNS} turns");
}
