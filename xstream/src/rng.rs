//! SplitMix64: a tiny seeded PRNG whose output never changes between
//! versions, so a printed seed replays the same run forever.

/// Seeded pseudo-random numbers (not for cryptography).
#[derive(Clone, Debug)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0), by multiply-shift.
    pub fn below(&mut self, bound: usize) -> usize {
        ((self.next_u64() as u128 * bound as u128) >> 64) as usize
    }
}

/// The seed to use: `FERRITE_SEED` when set (decimal or 0x-hex), else one
/// drawn from the clock. Printed so a failing run can be replayed.
pub fn seed_from_env() -> u64 {
    let parsed = std::env::var("FERRITE_SEED").ok().and_then(|s| {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        }
    });
    let seed = parsed.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map(|d| d.as_nanos() as u64).unwrap_or(0x5EED)
    });
    eprintln!("seed: FERRITE_SEED={seed} replays this run");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_bounded() {
        let a: Vec<_> = (0..8)
            .scan(SeededRng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<_> = (0..8)
            .scan(SeededRng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], SeededRng::new(8).next_u64());
        let mut r = SeededRng::new(1);
        assert!((0..1000).all(|_| r.below(5) < 5));
    }
}
