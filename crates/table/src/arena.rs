//! The per-worker arena and its epochs.
//!
//! Each worker owns one [`Arena`]. Request bodies are copied into its arena and
//! parsed there; everything the projection extracts borrows from it. At every
//! timer-wheel tick the worker calls [`Arena::reset`], which needs `&mut self`:
//! while any parsed value borrows the arena (`&Bump` from [`Arena::bump`]), the
//! borrow checker refuses the reset, so nothing parsed can outlive its epoch.
//!
//! The word: in pollbox an *epoch* is the time between two resets of the
//! arena, one tick of `server.epoch_ms`. Two libraries use it for other
//! things: crossbeam-epoch, the collector the box table retires memory to
//! (`boxes/`, "pinned"), and jemalloc's statistics epoch (the server's
//! `alloc_stats.rs`, advanced at scrape time).

use bumpalo::Bump;

/// What one reset did, for metrics. How long it took is the caller's to
/// measure: the core reads no clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetStats {
    /// Bytes in use just before the reset (`allocated_bytes - chunk_capacity`).
    pub used_before: usize,
    /// Chunk capacity after the reset.
    pub capacity_after: usize,
    /// The arena had grown past 4× its working size and was replaced.
    pub replaced: bool,
}

/// A bumpalo arena with an allocation limit, a working size and statistics.
pub struct Arena {
    bump: Bump,
    working_size: usize,
    limit: usize,
    high_water: usize,
    resets: u64,
    /// Resets in a row whose epoch used under a quarter of the arena.
    light_epochs: u32,
}

/// A grown arena is replaced after this many epochs in a row that used under a
/// quarter of it (~128 ms at 16 ms epochs).
pub const LIGHT_EPOCHS_BEFORE_REPLACE: u32 = 8;

impl Arena {
    /// `working_size`: the capacity the arena is expected to need per epoch (it
    /// is pre-allocated). `limit`: the most the arena may grow to
    /// (`arena_limit_bytes`); past it allocations fail and ingest answers 503.
    pub fn new(working_size: usize, limit: usize) -> Arena {
        let working_size = working_size.min(limit);
        Arena {
            bump: Self::fresh(working_size, limit),
            working_size,
            limit,
            high_water: 0,
            resets: 0,
            light_epochs: 0,
        }
    }

    fn fresh(working_size: usize, limit: usize) -> Bump {
        let bump = Bump::with_capacity(working_size);
        bump.set_allocation_limit(Some(limit));
        bump
    }

    /// The arena of the current epoch.
    #[inline]
    pub fn bump(&self) -> &Bump {
        &self.bump
    }

    /// Bytes handed out in the current epoch.
    pub fn used_bytes(&self) -> usize {
        self.bump
            .allocated_bytes()
            .saturating_sub(self.bump.chunk_capacity())
    }

    /// Bytes the arena holds from the allocator (all chunks).
    pub fn capacity_bytes(&self) -> usize {
        self.bump.allocated_bytes()
    }

    /// Largest `used_bytes` seen at a reset.
    pub fn high_water_bytes(&self) -> usize {
        self.high_water
    }

    pub fn working_size(&self) -> usize {
        self.working_size
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// End the epoch: free everything allocated in it. Keeps the arena's newest
    /// chunk for reuse. An arena grown past 4× its working size is replaced, so
    /// the memory goes back, once the spike that grew it is over: after
    /// [`LIGHT_EPOCHS_BEFORE_REPLACE`] epochs in a row that used under a quarter
    /// of it. One that a steady load keeps filling stays: replacing it at every
    /// reset would have each epoch allocate its chunks again and fault their
    /// pages in (BENCHMARKS.md, "Polls beside ingest").
    pub fn reset(&mut self) -> ResetStats {
        let used_before = self.used_bytes();
        self.high_water = self.high_water.max(used_before);
        self.bump.reset();
        let capacity = self.bump.allocated_bytes();
        if used_before.saturating_mul(4) < capacity {
            self.light_epochs = self.light_epochs.saturating_add(1);
        } else {
            self.light_epochs = 0;
        }
        let mut replaced = false;
        if capacity > self.working_size.saturating_mul(4)
            && self.light_epochs >= LIGHT_EPOCHS_BEFORE_REPLACE
        {
            self.bump = Self::fresh(self.working_size, self.limit);
            self.light_epochs = 0;
            replaced = true;
        }
        self.resets += 1;
        ResetStats {
            used_before,
            capacity_after: self.bump.allocated_bytes(),
            replaced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_measures_use_and_high_water() {
        let mut e = Arena::new(64 * 1024, 1 << 20);
        let _ = e.bump().alloc_slice_fill_copy(1000, 0u8);
        assert!(e.used_bytes() >= 1000);
        let s = e.reset();
        assert!(s.used_before >= 1000);
        assert!(!s.replaced);
        assert_eq!(e.used_bytes(), 0);
        assert!(e.high_water_bytes() >= 1000);
        assert_eq!(e.resets(), 1);
    }

    /// One epoch's worth of 64 KiB allocations, `n` of them.
    fn fill(e: &Arena, n: usize) {
        for _ in 0..n {
            let _ = e.bump().alloc_slice_fill_copy(64 * 1024, 1u8);
        }
    }

    #[test]
    fn spike_is_given_back_once_it_is_over() {
        let mut e = Arena::new(16 * 1024, 8 << 20);
        fill(&e, 64);
        assert!(e.capacity_bytes() > 4 * 16 * 1024);
        let grown = e.capacity_bytes();
        // The epochs after the spike use little: the arena is replaced after
        // LIGHT_EPOCHS_BEFORE_REPLACE of them, not before.
        for i in 0..LIGHT_EPOCHS_BEFORE_REPLACE {
            let s = e.reset();
            assert!(!s.replaced, "reset {i}");
            assert!(e.capacity_bytes() > 4 * 16 * 1024);
            let _ = e.bump().alloc_slice_fill_copy(100, 1u8);
        }
        let s = e.reset();
        assert!(s.replaced);
        assert!(
            e.capacity_bytes() <= 4 * 16 * 1024,
            "{} (was {grown})",
            e.capacity_bytes()
        );
    }

    #[test]
    fn an_arena_a_steady_load_fills_is_kept() {
        let mut e = Arena::new(16 * 1024, 8 << 20);
        fill(&e, 64);
        e.reset();
        let kept = e.capacity_bytes();
        assert!(kept > 4 * 16 * 1024);
        for i in 0..4 * LIGHT_EPOCHS_BEFORE_REPLACE {
            // Each epoch fills a good part of the chunk kept: no new chunk, no
            // replacement.
            fill(&e, kept / (2 * 64 * 1024));
            let s = e.reset();
            assert!(!s.replaced, "reset {i}");
            assert_eq!(e.capacity_bytes(), kept, "reset {i}");
        }
        // One light epoch among busy ones does not replace it either.
        e.reset();
        fill(&e, kept / (2 * 64 * 1024));
        assert!(!e.reset().replaced);
    }

    #[test]
    fn limit_fails_allocation_instead_of_panicking() {
        let e = Arena::new(16 * 1024, 128 * 1024);
        let big = e.bump().try_alloc_slice_fill_copy(1 << 20, 0u8);
        assert!(big.is_err());
    }
}
