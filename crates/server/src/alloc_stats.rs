//! Memory as jemalloc sees it.
//!
//! Global statistics (`stats.*`) are refreshed by advancing jemalloc's `epoch`,
//! which locks every arena: that is done only when `/metrics` is scraped, never
//! on a worker's tick, and at most once per [`MIN_EPOCH_INTERVAL`], so a client
//! scraping in a loop cannot keep the workers' allocations waiting on arena
//! locks (between advances a scrape reads the last epoch's figures). Per-thread cumulative counters (`thread.allocatedp` /
//! `thread.deallocatedp`) are plain thread-local reads, copied into the worker's
//! stats at each tick, so an allocating worker shows itself.
//!
//! When jemalloc is not the global allocator (unit tests of this crate), every
//! figure reads 0 and nothing fails.

use crate::stats::WorkerStats;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tikv_jemalloc_ctl::thread::ThreadLocal;

/// jemalloc's global figures, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JemallocStats {
    pub allocated: u64,
    pub active: u64,
    pub resident: u64,
    pub mapped: u64,
    pub retained: u64,
    pub metadata: u64,
    /// Freed small objects held in the threads' caches (jemalloc counts them
    /// as allocated; the program no longer holds them).
    pub tcache: u64,
}

impl JemallocStats {
    /// Resident pages that hold no live allocation (resident − active − metadata).
    pub fn dirty(&self) -> u64 {
        self.resident
            .saturating_sub(self.active)
            .saturating_sub(self.metadata)
    }
    /// Bytes the program holds: allocated minus what sits in thread caches.
    pub fn in_use(&self) -> u64 {
        self.allocated.saturating_sub(self.tcache)
    }
    /// Active pages not covered by live allocations (active − allocated).
    pub fn fragmentation(&self) -> u64 {
        self.active.saturating_sub(self.allocated)
    }
}

/// The least time between two advances of jemalloc's epoch.
pub const MIN_EPOCH_INTERVAL: Duration = Duration::from_millis(200);

/// When the epoch was last advanced (ns since `START`), 0 for never.
static LAST_ADVANCE_NS: AtomicU64 = AtomicU64::new(0);
static START: OnceLock<Instant> = OnceLock::new();

/// Advance jemalloc's epoch (unless that was done less than
/// [`MIN_EPOCH_INTERVAL`] ago) and read its global statistics: for scrapes.
pub fn read_global() -> JemallocStats {
    let now = START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1;
    let last = LAST_ADVANCE_NS.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= MIN_EPOCH_INTERVAL.as_nanos() as u64;
    let advance = due
        && LAST_ADVANCE_NS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
    read(advance)
}

/// Advance jemalloc's epoch now and read its global statistics: for the one
/// measurement at start-up, which must not see an older epoch.
pub fn read_global_fresh() -> JemallocStats {
    read(true)
}

fn read(advance: bool) -> JemallocStats {
    use tikv_jemalloc_ctl::{epoch, stats};
    if advance && epoch::advance().is_err() {
        return JemallocStats::default();
    }
    JemallocStats {
        allocated: stats::allocated::read().unwrap_or(0) as u64,
        active: stats::active::read().unwrap_or(0) as u64,
        resident: stats::resident::read().unwrap_or(0) as u64,
        mapped: stats::mapped::read().unwrap_or(0) as u64,
        retained: stats::retained::read().unwrap_or(0) as u64,
        metadata: stats::metadata::read().unwrap_or(0) as u64,
        // SAFETY: `stats.arenas.<i>.tcache_bytes` is a size_t, read into a usize;
        // 4096 is MALLCTL_ARENAS_ALL (every arena merged). The name is
        // NUL-terminated, as raw::read requires. Covered by
        // tests/memory.rs (jemalloc as global allocator).
        tcache: unsafe {
            tikv_jemalloc_ctl::raw::read::<usize>(b"stats.arenas.4096.tcache_bytes\0")
        }
        .unwrap_or(0) as u64,
    }
}

thread_local! {
    static COUNTERS: Option<(ThreadLocal<u64>, ThreadLocal<u64>)> = {
        use tikv_jemalloc_ctl::thread::{allocatedp, deallocatedp};
        match (allocatedp::read(), deallocatedp::read()) {
            (Ok(a), Ok(d)) => Some((a, d)),
            _ => None,
        }
    };
}

/// This thread's cumulative (allocated, deallocated) bytes.
pub fn thread_counters() -> (u64, u64) {
    COUNTERS.with(|c| c.map_or((0, 0), |(a, d)| (a.get(), d.get())))
}

/// Copy this thread's counters into its worker's stats.
pub fn publish_thread_counters(stats: &WorkerStats) {
    let (a, d) = thread_counters();
    stats.thread_allocated.set(a);
    stats.thread_deallocated.set(d);
}

/// Give back, now, what this thread's allocator holds that nothing uses: the
/// objects cached in its thread cache (`thread.tcache.flush`) and the dirty
/// pages of its arena (`arena.<i>.purge`), which jemalloc would otherwise
/// keep for `dirty_decay_ms`. A worker does it once when it goes quiet (no
/// connection left, nothing to expire): whatever it freed is not about to be
/// reused. Returns whether both controls answered (not jemalloc: false).
pub fn give_back_idle_memory() -> bool {
    // SAFETY: `thread.arena` is an unsigned int, read into a u32; the name is
    // NUL-terminated, as raw::read requires. Covered by tests/memory.rs
    // (`a_quiet_worker_gives_its_dirty_pages_back`).
    let Ok(arena) = (unsafe { tikv_jemalloc_ctl::raw::read::<u32>(b"thread.arena\0") }) else {
        return false;
    };
    let purge = format!("arena.{arena}.purge\0");
    let mut ok = true;
    for name in [&b"thread.tcache.flush\0"[..], purge.as_bytes()] {
        // SAFETY: both are controls that read and write nothing: no old value
        // (null, null) and no new one (null, 0), as jemalloc requires of them;
        // the name is NUL-terminated. Covered as above.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        ok &= rc == 0;
    }
    ok
}

/// Dirty pages (freed, not given back yet) of this thread's arena, read
/// fresh: for tests of [`give_back_idle_memory`].
pub fn this_arena_dirty_pages() -> usize {
    let _ = tikv_jemalloc_ctl::epoch::advance();
    // SAFETY: `thread.arena` is an unsigned int, read into a u32, and
    // `stats.arenas.<i>.pdirty` a size_t, read into a usize; the names are
    // NUL-terminated. Covered as above.
    unsafe {
        let Ok(arena) = tikv_jemalloc_ctl::raw::read::<u32>(b"thread.arena\0") else {
            return 0;
        };
        let name = format!("stats.arenas.{arena}.pdirty\0");
        tikv_jemalloc_ctl::raw::read::<usize>(name.as_bytes()).unwrap_or(0)
    }
}
