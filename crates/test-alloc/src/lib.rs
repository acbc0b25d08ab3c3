//! A counting global allocator for the allocation tests: the system allocator,
//! plus counts of how often it was asked for memory, so a test can assert that
//! a hot path allocates nothing (ENGINEERING.md: allocation counts are part of
//! the contract).
//!
//! Each test binary that measures declares it as its allocator:
//!
//! ```
//! #[global_allocator]
//! static ALLOC: pollbox_test_alloc::Counting = pollbox_test_alloc::Counting::new();
//!
//! fn main() {
//!     let n = ALLOC.count_on_this_thread(|| drop(std::hint::black_box(vec![1u8; 10])));
//!     assert_eq!(n, 1);
//! }
//! ```
//!
//! and reads the counts through that static:
//! - [`Counting::on_this_thread`] and [`Counting::count_on_this_thread`]: this
//!   thread's allocations, undisturbed by tests running on other threads;
//! - [`Counting::total`]: every thread's (a server's workers included), or,
//!   with [`Counting::threads_named`], only those of threads whose name starts
//!   with a prefix;
//! - [`Counting::live_on_this_thread`]: bytes this thread holds, as requested
//!   and rounded up to the size classes given with [`Counting::size_classes`].
//!
//! An allocation is a call of `alloc`, `alloc_zeroed` or `realloc`; `dealloc`
//! is not one. The counters live in this crate (statics and thread-locals),
//! not in the value: a binary has one global allocator.
//!
//! What it is not: a memory profiler, or anything a release build links (it is
//! a dev-dependency only). A count of zero means zero only if the counter can
//! be seen counting: keep a positive control beside each zero assertion.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting (see the crate doc).
pub struct Counting {
    /// Only threads whose name starts with this count toward [`Counting::total`].
    thread_prefix: Option<&'static str>,
    /// Rounds a request up to the block an allocator would hold for it.
    size_class: fn(usize) -> usize,
}

/// Bytes a thread holds: allocated by it minus freed by it (memory freed on
/// another thread than the one that allocated it moves the two threads'
/// figures, not their sum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBytes {
    /// As requested.
    pub requested: i64,
    /// Each request rounded up with the [`Counting::size_classes`] function.
    pub classed: i64,
}

static TOTAL: AtomicU64 = AtomicU64::new(0);

// Const-initialised `Cell`s without destructors: reading or bumping them never
// allocates, so the allocator may use them. `try_with` everywhere, because
// the allocator also runs while a thread's locals are being torn down.
thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_REQUESTED: Cell<i64> = const { Cell::new(0) };
    static LIVE_CLASSED: Cell<i64> = const { Cell::new(0) };
    /// Whether this thread counts toward the total: 0 = not looked at yet,
    /// 1 = it does, 2 = it does not.
    static IN_TOTAL: Cell<u8> = const { Cell::new(0) };
    /// Inside the allocator already: looking up the thread's name may allocate.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

impl Counting {
    /// Counts every thread's allocations toward the total.
    pub const fn new() -> Counting {
        Counting {
            thread_prefix: None,
            size_class: identity,
        }
    }

    /// Counts toward [`Counting::total`] only the allocations of threads whose
    /// name starts with `prefix` (e.g. the `load-<n>` threads of a run); each
    /// thread's own count still sees all of its allocations.
    pub const fn threads_named(prefix: &'static str) -> Counting {
        Counting {
            thread_prefix: Some(prefix),
            size_class: identity,
        }
    }

    /// Also keep [`LiveBytes::classed`], each request rounded up with
    /// `size_class` (which must not allocate).
    pub const fn size_classes(self, size_class: fn(usize) -> usize) -> Counting {
        Counting { size_class, ..self }
    }

    /// Allocations counted toward the total since the process started.
    pub fn total(&self) -> u64 {
        TOTAL.load(Ordering::SeqCst)
    }

    /// This thread's allocations since it started.
    pub fn on_this_thread(&self) -> u64 {
        ALLOCATIONS.with(Cell::get)
    }

    /// The allocations this thread makes while running `f`.
    pub fn count_on_this_thread(&self, f: impl FnOnce()) -> u64 {
        let before = self.on_this_thread();
        f();
        self.on_this_thread() - before
    }

    /// The bytes this thread holds.
    pub fn live_on_this_thread(&self) -> LiveBytes {
        LiveBytes {
            requested: LIVE_REQUESTED.with(Cell::get),
            classed: LIVE_CLASSED.with(Cell::get),
        }
    }

    fn allocated(&self, size: usize) {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        self.live(size, 1);
        if self.in_total() {
            TOTAL.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn live(&self, size: usize, sign: i64) {
        let _ = LIVE_REQUESTED.try_with(|b| b.set(b.get() + sign * size as i64));
        let classed = (self.size_class)(size) as i64;
        let _ = LIVE_CLASSED.try_with(|b| b.set(b.get() + sign * classed));
    }

    /// Whether this thread counts toward the total. The name is looked up once
    /// per thread; an allocation made by that lookup is not counted.
    fn in_total(&self) -> bool {
        let Some(prefix) = self.thread_prefix else {
            return true;
        };
        BUSY.try_with(|busy| {
            if busy.replace(true) {
                return false;
            }
            let counted = IN_TOTAL.with(|k| {
                if k.get() == 0 {
                    let named = std::thread::current()
                        .name()
                        .is_some_and(|n| n.starts_with(prefix));
                    k.set(if named { 1 } else { 2 });
                }
                k.get() == 1
            });
            busy.set(false);
            counted
        })
        .unwrap_or(false)
    }
}

impl Default for Counting {
    fn default() -> Counting {
        Counting::new()
    }
}

fn identity(size: usize) -> usize {
    size
}

// SAFETY: every call is passed on unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counting around it touches only const-initialised
// thread-locals without destructors, an atomic, and (once per thread, guarded
// against re-entry by `BUSY`) the thread's name, and never unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.allocated(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.allocated(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.live(layout.size(), -1);
        // SAFETY: `ptr` came from `System` with `layout` (every allocation of
        // this allocator does); the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.live(layout.size(), -1);
        self.allocated(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; the caller's
        // contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
