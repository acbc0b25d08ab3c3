//! Expiry (`ttl_s`): the stamp each box carries (the second it becomes due)
//! and the sweep, a bounded step a tick over a table-wide cursor, so no tick
//! does more than [`SweepBudget`] of it however many boxes expire at once.

use super::*;

/// How much one [`BoxTable::expire`] step may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBudget {
    /// Expiry stamps read.
    pub scan: usize,
    /// Boxes removed.
    pub remove: usize,
}

impl SweepBudget {
    /// One worker's step per tick: 16,384 stamps read (about 0.1 ms) and at
    /// most 1,024 boxes removed (about 0.2 ms), so with 2 workers and 16 ms
    /// ticks a table of a million boxes is read through in half a second (once
    /// a second at most) and up to 128,000 boxes a second are removed.
    pub const PER_TICK: SweepBudget = SweepBudget {
        scan: 16_384,
        remove: 1_024,
    };
}

/// What one [`BoxTable::expire`] step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub scanned: usize,
    pub removed: usize,
}

/// A box taken out of the table (expired): a copy of its record, freed when
/// dropped.
pub struct Removed(Vec<u8>);

impl Removed {
    pub fn key(&self) -> &[u8] {
        record::key(&self.0)
    }

    /// The last version it served.
    pub fn version(&self) -> u64 {
        record::version(&self.0)
    }
}

/// The caller's clock in whole seconds, as expiry stamps count (below [`NEVER`]).
#[inline]
pub(super) fn second(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).map_or(NEVER - 1, |s| s.min(NEVER - 1))
}

/// An accepted message moved a box's expiry (under its slot's claim). Stored
/// only when the second changed, so updates of neighbouring boxes on several
/// workers do not keep writing one cache line.
#[inline]
pub(super) fn touch(stamp: &AtomicU32, expires: u32) {
    if stamp.load(Ordering::Relaxed) != expires {
        stamp.store(expires, Ordering::Relaxed);
    }
}

impl BoxTable {
    /// The expiry stamp of a box that accepts a message at `now_ms`: due once
    /// the clock's second passes `ttl_s` whole seconds after this one, so a box
    /// is due between `ttl_s` and `ttl_s + 1` seconds after its last message
    /// (and removed by the next pass of the sweep, which starts once a second).
    pub(super) fn expires_at(&self, now_ms: u64) -> u32 {
        match self.plan.ttl_s {
            0 => NEVER,
            ttl => second(now_ms)
                .saturating_add(ttl)
                .saturating_add(1)
                .min(NEVER - 1),
        }
    }

    /// One step of the expiry sweep at `now_ms`: go on from where the last step
    /// (of any worker) stopped, read at most `budget.scan` expiry stamps and
    /// remove at most `budget.remove` boxes that are due, pushing them to
    /// `removed` (the caller wakes their long-polls, then drops them, which
    /// frees them outside every lock). Nothing to remove without `ttl_s`.
    ///
    /// The first few calls (once a tick per worker) after this thread retired
    /// something (a removed box, an emptied chunk, a replaced map) also
    /// let the epoch collector go on: the thread's retired memory goes to the
    /// global queue, and what no pinned thread can hold any more is freed. So
    /// the memory of removed boxes goes back within a few ticks even on a
    /// server that does nothing else (collection otherwise runs every 128
    /// pins).
    pub fn expire(&self, now_ms: u64, budget: SweepBudget, removed: &mut Vec<Removed>) -> Swept {
        slot::flush_owed();
        let mut done = Swept::default();
        if self.plan.ttl_s == 0 || self.is_empty() {
            return done;
        }
        let now = second(now_ms);
        // A step goes at most once around the table, however small it is.
        let mut claims = 0;
        while done.scanned < budget.scan && done.removed < budget.remove && claims < SHARDS {
            let pos = self.sweep.load(Ordering::Acquire);
            if pos == SWEEP_START && now < self.next_pass.load(Ordering::Acquire) {
                // This second's pass is done.
                break;
            }
            let s = (pos >> 32) as usize % SHARDS;
            let shard = &self.shards[s];
            let room = (budget.remove - done.removed).min(REMOVE_PER_LOCK);
            // Each shard is read from its end down: a removal moves the shard's
            // last box, which this pass has read already, into the hole, so no
            // box the pass has yet to read ever moves. Stamps are read without
            // a lock; the claim stops early once the boxes due are as many as
            // one hold of the mutex may remove.
            let (lo, hi, due, next) = {
                let guard = epoch::pin();
                let map = shard.map(&guard);
                let stamp = |i: usize| {
                    map.and_then(|m| m.place(i, &guard))
                        .map_or(NEVER, |p| p.stamp.load(Ordering::Relaxed))
                };
                let hi = (pos as u32 as usize).min(shard.write.len.load(Ordering::Acquire));
                let mut lo = hi;
                let mut due = 0;
                while lo > 0 && hi - lo < budget.scan - done.scanned && due < room {
                    lo -= 1;
                    if stamp(lo) <= now {
                        due += 1;
                    }
                }
                let next = if lo == 0 {
                    (((s + 1) % SHARDS) as u64) << 32 | u64::from(u32::MAX)
                } else {
                    (s as u64) << 32 | lo as u64
                };
                (lo, hi, due, next)
            };
            // Claim the slots read; another worker that moved the cursor first
            // has claimed them (or others) itself: read on from where it is.
            if self
                .sweep
                .compare_exchange(pos, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if pos == SWEEP_START {
                self.next_pass
                    .fetch_max(now.saturating_add(1), Ordering::AcqRel);
            }
            claims += 1;
            done.scanned += hi - lo;
            if due == 0 {
                continue;
            }
            let guard = epoch::pin();
            let _writer = shard.lock();
            let mut taken = 0;
            for i in (lo..hi.min(shard.write.len.load(Ordering::Relaxed))).rev() {
                if taken == room {
                    break;
                }
                let stamp = shard.map(&guard).and_then(|m| m.place(i, &guard));
                if stamp.is_none_or(|p| p.stamp.load(Ordering::Relaxed) > now) {
                    continue;
                }
                // The stamp is read again under the slot's claim: an update
                // may have moved it since.
                if let Some(record) = self.remove_slot(shard, i, Some(now), None, &guard) {
                    removed.push(Removed(record));
                    taken += 1;
                }
            }
            done.removed += taken;
        }
        done
    }
}
