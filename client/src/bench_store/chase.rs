//! The host's dependent-load latency: how long one load takes when its
//! address comes from the load before, over a buffer of a given size.
//!
//! A fetch of a resident record is two such loads (the key's bucket, then
//! the record its slot points at) over a working set of the bucket region
//! and the live records, so `ferrite bench store` prints this latency over
//! a buffer of that size beside the fetch rates: the rate of fetches that
//! were nothing but those loads, from the same run on the same core.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// One cache line, as the chase visits it: its first word names the next.
const LINE_WORDS: usize = 8;

/// Largest buffer chased (a 1 MiB value case holds a gigabyte of records;
/// past a few hundred MiB the latency no longer grows with the size).
pub const CHASE_BYTES_MAX: usize = 256 << 20;

/// Mean nanoseconds of one dependent load over `bytes` (at least two cache
/// lines, at most [`CHASE_BYTES_MAX`]) visiting every line once, in a
/// random single cycle, `loads` times in all.
pub fn dependent_load_ns(bytes: usize, loads: usize) -> f64 {
    let lines = (bytes.min(CHASE_BYTES_MAX) / (LINE_WORDS * 8)).max(2);
    let (words, start) = cycle(lines);
    // One lap first, so that the buffer is as cached as it will get.
    let mut at = chase(&words, start, lines);
    let t0 = Instant::now();
    at = chase(&words, at, loads.max(1));
    let ns = t0.elapsed().as_nanos() as f64 / loads.max(1) as f64;
    std::hint::black_box(at);
    ns
}

/// `lines` cache lines whose first words link them into one random cycle
/// (Sattolo's shuffle), and the word the cycle starts at.
fn cycle(lines: usize) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for i in (1..lines).rev() {
        order.swap(i, rng.gen_range(0..i));
    }
    let mut words = vec![0usize; lines * LINE_WORDS];
    for w in order.windows(2) {
        words[w[0] * LINE_WORDS] = w[1] * LINE_WORDS;
    }
    words[order[lines - 1] * LINE_WORDS] = order[0] * LINE_WORDS;
    (words, order[0] * LINE_WORDS)
}

fn chase(words: &[usize], mut at: usize, loads: usize) -> usize {
    for _ in 0..loads {
        at = words[at];
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chase visits every line: a cycle of `lines` loads comes back to
    /// where it started and not earlier.
    #[test]
    fn the_chase_is_one_cycle_through_every_line() {
        let lines = 1000;
        let (words, start) = cycle(lines);
        let mut seen = vec![false; lines];
        let mut at = start;
        for _ in 0..lines {
            assert!(
                !seen[at / LINE_WORDS],
                "line {} visited twice",
                at / LINE_WORDS
            );
            seen[at / LINE_WORDS] = true;
            at = words[at];
        }
        assert_eq!(at, start);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn a_latency_is_measured_for_any_size() {
        for bytes in [0, 64, 4096, 1 << 20] {
            let ns = dependent_load_ns(bytes, 10_000);
            assert!(ns.is_finite() && ns > 0.0, "{bytes} bytes: {ns} ns");
        }
    }
}
