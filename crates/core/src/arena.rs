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
}

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
    /// chunk for reuse, unless a spike grew the arena past 4× its working size,
    /// in which case the arena is replaced so the memory goes back.
    pub fn reset(&mut self) -> ResetStats {
        let used_before = self.used_bytes();
        self.high_water = self.high_water.max(used_before);
        self.bump.reset();
        let mut replaced = false;
        if self.bump.allocated_bytes() > self.working_size.saturating_mul(4) {
            self.bump = Self::fresh(self.working_size, self.limit);
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

    #[test]
    fn spike_is_given_back() {
        let mut e = Arena::new(16 * 1024, 8 << 20);
        for _ in 0..64 {
            let _ = e.bump().alloc_slice_fill_copy(64 * 1024, 1u8);
        }
        assert!(e.capacity_bytes() > 4 * 16 * 1024);
        let s = e.reset();
        assert!(s.replaced);
        assert!(
            e.capacity_bytes() <= 4 * 16 * 1024,
            "{}",
            e.capacity_bytes()
        );
    }

    #[test]
    fn limit_fails_allocation_instead_of_panicking() {
        let e = Arena::new(16 * 1024, 128 * 1024);
        let big = e.bump().try_alloc_slice_fill_copy(1 << 20, 0u8);
        assert!(big.is_err());
    }
}
