//! The hot loop allocates nothing per request: a counting global allocator tallies what
//! the load threads (named `load-<n>`) allocate, and a run answering many more requests
//! allocates no more than a short one.

mod common;

use std::time::Duration;

use common::{Behaviour, TestServer};
use pollbox_load::{run, LoadArgs, Mix};

/// Counts toward its total what the load threads allocate.
#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting = pollbox_test_alloc::Counting::threads_named("load-");

fn allocations_for(duration: Duration, rate: Option<f64>) -> (u64, u64) {
    let server = TestServer::start(Behaviour::default());
    let mut a = LoadArgs::new(server.url());
    a.quiet = true;
    a.connections = 4;
    a.pipeline = 2;
    a.keys = 100;
    a.duration = duration;
    a.rate = rate;
    a.mix =
        Mix::parse("poll:50,ingest:20,batch:10,longpoll:10,poll_many:5,longpoll_many:5").unwrap();
    a.keys_per_request = 20;
    a.longpoll_wait = Duration::from_millis(5);
    let before = ALLOC.total();
    let report = run(&a).unwrap();
    let allocations = ALLOC.total() - before;
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
