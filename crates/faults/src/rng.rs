//! The suite's seeded random generator (splitmix64): every random choice of
//! a run, the nemesis' schedule and the workload's keys and values alike,
//! comes from one of these, seeded from the run's seed, so that a seed names
//! one run on any machine.
//!
//! It sits below both the nemesis and the workload (it needs nothing of
//! the crate), so neither has to reach into the other for it.
//!
//! What it is not: a source of secure or unbiased randomness; `below` and
//! `range` take a plain modulo, which is fine for picking faults and keys.

/// A small deterministic generator (splitmix64): the same seed, the same
/// schedule, on any machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
