//! The hot loop allocates nothing per request: a counting global allocator tallies what
//! the load threads (named `load-<n>`) allocate, and a run answering many more requests
//! allocates no more than a short one.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Behaviour, TestServer};
use pollbox_load::{run, LoadArgs, Mix};

static LOAD_THREAD_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Inside the allocator already (looking up the thread's name may allocate).
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// 0 = not looked at yet, 1 = a load thread, 2 = another thread.
    static IS_LOAD_THREAD: Cell<u8> = const { Cell::new(0) };
}

struct Counting;

fn count() {
    let _ = BUSY.try_with(|busy| {
        if busy.replace(true) {
            return;
        }
        let kind = IS_LOAD_THREAD.with(|k| {
            if k.get() == 0 {
                let load = std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("load-"));
                k.set(if load { 1 } else { 2 });
            }
            k.get()
        });
        if kind == 1 {
            LOAD_THREAD_ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        }
        busy.set(false);
    });
}

// SAFETY: every call is passed on unchanged to the system allocator; counting touches
// only const-initialised thread-locals and an atomic, none of which allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_for(duration: Duration, rate: Option<f64>) -> (u64, u64) {
    let server = TestServer::start(Behaviour::default());
    let mut a = LoadArgs::new(server.url());
    a.quiet = true;
    a.connections = 4;
    a.pipeline = 2;
    a.keys = 100;
    a.duration = duration;
    a.rate = rate;
    a.mix = Mix::parse("poll:60,ingest:20,batch:10,longpoll:10").unwrap();
    a.longpoll_wait = Duration::from_millis(5);
    let before = LOAD_THREAD_ALLOCATIONS.load(Ordering::SeqCst);
    let report = run(&a).unwrap();
    let allocations = LOAD_THREAD_ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);
    (allocations, report.total_requests())
}

#[test]
fn load_threads_do_not_allocate_per_request() {
    for rate in [None, Some(4000.0)] {
        let (short_allocs, short_requests) = allocations_for(Duration::from_millis(100), rate);
        let (long_allocs, long_requests) = allocations_for(Duration::from_millis(700), rate);
        println!(
            "rate {rate:?}: {short_allocs} allocations for {short_requests} requests, {long_allocs} for {long_requests}"
        );
        assert!(
            long_requests > short_requests + 1000,
            "{long_requests} vs {short_requests}"
        );
        assert!(
            long_allocs <= short_allocs + 2,
            "rate {rate:?}: {long_allocs} allocations for {long_requests} requests vs {short_allocs} for {short_requests}"
        );
    }
}
