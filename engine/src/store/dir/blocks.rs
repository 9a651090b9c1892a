//! The directory's blocks in key order, in runs of at most [`RUN_MAX`].
//!
//! One flat vector of blocks (and one of their fences) made every block
//! split or removal shift everything after it: at the ~35,000 blocks of a
//! target holding 700,000 keys that was ~1.2 MB of `memmove` per split, a
//! split every ~15 new keys, and a tenth of a busy xstream's time in
//! mdtest-hard-write. Here a split shifts within one run (at most
//! [`RUN_MAX`] blocks), and only a run that overflows shifts the short
//! vectors of runs. Blocks keep flat indices (`0..len`) for the directory;
//! a run is found from an index by a binary search of the runs' first
//! indices, and from a key by a search of the runs' first fences, then of
//! the fences in the run.

use super::fence::Fence;
use std::ops::{Index, IndexMut};

/// A run is split in two when it grows past this many blocks.
const RUN_MAX: usize = 256;
/// A run's vectors grow by a quarter of their blocks at a time, by this
/// many at most (little spare room: it is DRAM per key too; growing a run of
/// 8 blocks by 16 gave a store of 256 keys 4 bytes of spare room per key).
const RUN_GROWTH: usize = 16;

/// Block slots a run of `len` blocks grows by when full.
fn growth(len: usize) -> usize {
    (len / 4).clamp(1, RUN_GROWTH)
}

#[derive(Default)]
struct Run {
    blocks: Vec<Box<[u8]>>,
    /// `fences[i]` is `Fence::of_block(&blocks[i])`.
    fences: Vec<Fence>,
}

impl Run {
    fn insert(&mut self, at: usize, b: Box<[u8]>) {
        if self.blocks.len() == self.blocks.capacity() {
            self.blocks.reserve_exact(growth(self.blocks.len()));
        }
        if self.fences.len() == self.fences.capacity() {
            self.fences.reserve_exact(growth(self.fences.len()));
        }
        self.fences.insert(at, Fence::of_block(&b));
        self.blocks.insert(at, b);
    }
}

/// The blocks, in key order.
#[derive(Default)]
pub(super) struct Blocks {
    runs: Vec<Run>,
    /// `heads[r]` is `runs[r].fences[0]` (no run is empty).
    heads: Vec<Fence>,
    /// `starts[r]`: the flat index of `runs[r]`'s first block.
    starts: Vec<usize>,
    len: usize,
}

impl Blocks {
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run holding flat index `i` (`i < len`) and the index in it.
    fn locate(&self, i: usize) -> (usize, usize) {
        let r = self.starts.partition_point(|&s| s <= i) - 1;
        (r, i - self.starts[r])
    }

    pub(super) fn get(&self, i: usize) -> Option<&[u8]> {
        (i < self.len).then(|| {
            let (r, p) = self.locate(i);
            &*self.runs[r].blocks[p]
        })
    }

    /// Replaces block `i` (its fence follows).
    pub(super) fn set(&mut self, i: usize, b: Box<[u8]>) {
        let (r, p) = self.locate(i);
        let run = &mut self.runs[r];
        run.fences[p] = Fence::of_block(&b);
        run.blocks[p] = b;
        if p == 0 {
            self.heads[r] = run.fences[0];
        }
    }

    /// Inserts `b` as block `i` (`i <= len`).
    pub(super) fn insert(&mut self, i: usize, b: Box<[u8]>) {
        assert!(i <= self.len, "block {i} inserted past {}", self.len);
        if self.runs.is_empty() {
            self.runs.push(Run::default());
            self.heads.push(Fence::of_block(&b));
            self.starts.push(0);
        }
        let (r, p) = if i == self.len {
            let r = self.runs.len() - 1;
            (r, i - self.starts[r])
        } else {
            self.locate(i)
        };
        self.runs[r].insert(p, b);
        self.heads[r] = self.runs[r].fences[0];
        self.len += 1;
        self.shift_starts(r + 1, true);
        if self.runs[r].blocks.len() > RUN_MAX {
            self.split_run(r);
        }
    }

    /// Removes block `i` (`i < len`).
    pub(super) fn remove(&mut self, i: usize) {
        let (r, p) = self.locate(i);
        let run = &mut self.runs[r];
        run.blocks.remove(p);
        run.fences.remove(p);
        self.len -= 1;
        if run.blocks.is_empty() {
            self.runs.remove(r);
            self.heads.remove(r);
            self.starts.remove(r);
            self.shift_starts(r, false);
        } else {
            self.heads[r] = run.fences[0];
            self.shift_starts(r + 1, false);
        }
    }

    /// Moves the first index of the runs from `from` on by one.
    fn shift_starts(&mut self, from: usize, up: bool) {
        for s in self.starts.iter_mut().skip(from) {
            *s = if up { *s + 1 } else { *s - 1 };
        }
    }

    /// Splits run `r` in two halves.
    fn split_run(&mut self, r: usize) {
        let run = &mut self.runs[r];
        let half = run.blocks.len() / 2;
        let second = Run {
            blocks: run.blocks.split_off(half),
            fences: run.fences.split_off(half),
        };
        run.blocks.shrink_to(half + growth(half));
        run.fences.shrink_to(half + growth(half));
        self.heads.insert(r + 1, second.fences[0]);
        self.starts.insert(r + 1, self.starts[r] + half);
        self.runs.insert(r + 1, second);
    }

    /// The last block `i` for which `at_most(fence, bytes)` holds, or 0 if
    /// none does. `at_most` must hold of a prefix of the blocks (it is "the
    /// block's first key is at most the wanted one").
    pub(super) fn search(&self, at_most: impl Fn(&Fence, &[u8]) -> bool) -> usize {
        let runs = count_true(0, self.runs.len(), |r| {
            at_most(&self.heads[r], &self.runs[r].blocks[0])
        });
        let Some(r) = runs.checked_sub(1) else {
            return 0;
        };
        let run = &self.runs[r];
        // The run's first block is at most the key (its head is).
        let in_run = count_true(1, run.blocks.len(), |i| {
            at_most(&run.fences[i], &run.blocks[i])
        });
        self.starts[r] + in_run - 1
    }

    /// The blocks from index `i` on, in order.
    pub(super) fn iter_from(&self, i: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let (r, p) = if i < self.len {
            self.locate(i)
        } else {
            (self.runs.len(), 0)
        };
        let first = self.runs.get(r).map_or(&[][..], |run| &run.blocks[p..]);
        let rest = self.runs.iter().skip(r + 1).flat_map(|run| &run.blocks);
        first.iter().chain(rest).map(|b| &**b)
    }

    /// Heap bytes of the vectors (not of the blocks' own allocations).
    pub(super) fn vector_bytes(&self) -> usize {
        let per_run = std::mem::size_of::<Run>()
            + std::mem::size_of::<Fence>()
            + std::mem::size_of::<usize>();
        let runs = self.runs.capacity().max(self.heads.capacity()) * per_run;
        runs + self
            .runs
            .iter()
            .map(|run| {
                run.blocks.capacity() * std::mem::size_of::<Box<[u8]>>()
                    + run.fences.capacity() * std::mem::size_of::<Fence>()
            })
            .sum::<usize>()
    }

    /// Spare block slots over all runs (capacity beyond the blocks).
    #[cfg(test)]
    pub(super) fn spare(&self) -> usize {
        (self.runs.iter())
            .map(|run| run.blocks.capacity().max(run.fences.capacity()) - run.blocks.len())
            .sum()
    }

    /// Panics unless every fence, head and start says what it should.
    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut at = 0;
        for (r, run) in self.runs.iter().enumerate() {
            assert!(!run.blocks.is_empty(), "run {r} is empty");
            assert!(run.blocks.len() <= RUN_MAX, "run {r} is too long");
            assert_eq!(self.starts[r], at, "run {r} starts elsewhere");
            let fences: Vec<Fence> = run.blocks.iter().map(|b| Fence::of_block(b)).collect();
            assert_eq!(run.fences, fences, "a block's fence is stale");
            assert_eq!(self.heads[r], run.fences[0], "run {r}'s head is stale");
            at += run.blocks.len();
        }
        assert_eq!(at, self.len);
    }
}

/// `lo` plus how many of `lo..hi` satisfy `pred`, which holds of a prefix
/// of the range (a binary search).
fn count_true(mut lo: usize, mut hi: usize, pred: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl Index<usize> for Blocks {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        let (r, p) = self.locate(i);
        &self.runs[r].blocks[p]
    }
}

impl IndexMut<usize> for Blocks {
    /// A block's bytes in place: the caller keeps its first key (and so its
    /// fence) unchanged.
    fn index_mut(&mut self, i: usize) -> &mut [u8] {
        let (r, p) = self.locate(i);
        &mut self.runs[r].blocks[p]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A block holding the single key `n` (object `n`, big endian).
    fn block(n: u32) -> Box<[u8]> {
        let mut c = [0u8; super::super::OBJ_BYTES];
        c[20..].copy_from_slice(&n.to_be_bytes());
        let mut b = Vec::new();
        let tail = [1u8, 0, 0, 0, 0, 0, 0, 1];
        super::super::encode_entry(&mut b, (&[], None), &c, 0, &tail);
        b.into_boxed_slice()
    }

    /// Random inserts and removes (runs split, empty and vanish) against a
    /// flat vector: same blocks in the same order, every search answers as
    /// a linear scan does, and the spare room stays small while it grows.
    #[test]
    fn runs_behave_as_one_sorted_vector() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut blocks = Blocks::default();
        let mut model: Vec<u32> = Vec::new();
        for step in 0..6000 {
            let grow = step < 4000 || rng.gen_bool(0.2);
            if grow || model.is_empty() {
                let n = rng.gen::<u32>() >> 1;
                let at = model.partition_point(|&m| m < n);
                model.insert(at, n);
                blocks.insert(at, block(n));
            } else {
                let at = rng.gen_range(0..model.len());
                model.remove(at);
                blocks.remove(at);
            }
            if step % 97 == 0 || step > 5900 {
                blocks.check();
                assert_eq!(blocks.len(), model.len());
                let got: Vec<Box<[u8]>> = blocks.iter_from(0).map(Box::from).collect();
                let want: Vec<Box<[u8]>> = model.iter().map(|&n| block(n)).collect();
                assert_eq!(got, want);
                // (Removes keep a run's room, as a vector's remove does.)
                assert!(step >= 4000 || blocks.spare() <= blocks.len() / 8 + 16);
                let probe = rng.gen::<u32>() >> 1;
                let f = Fence::of_block(&block(probe));
                let found = blocks.search(|fence, _| *fence <= f);
                let linear = model.partition_point(|&m| m <= probe).saturating_sub(1);
                assert_eq!(found, linear, "search for {probe}");
                let from = rng.gen_range(0..=model.len());
                assert_eq!(blocks.iter_from(from).count(), model.len() - from);
            }
        }
        assert!(blocks.runs.len() > 4, "the test never split a run");
        while !model.is_empty() {
            let at = rng.gen_range(0..model.len());
            model.remove(at);
            blocks.remove(at);
        }
        blocks.check();
        assert!(blocks.runs.is_empty() && blocks.is_empty());
    }
}
