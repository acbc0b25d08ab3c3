//! The counter counts: this thread's allocations exactly, every thread's in
//! the total, and the bytes held, as requested and rounded up.

use pollbox_test_alloc::{Counting, LiveBytes};

fn power_of_two(size: usize) -> usize {
    size.next_power_of_two()
}

#[global_allocator]
static ALLOC: Counting = Counting::new().size_classes(power_of_two);

#[test]
fn this_threads_allocations_are_counted_exactly() {
    let n = ALLOC.count_on_this_thread(|| {
        let mut v = std::hint::black_box(Vec::<u8>::with_capacity(10));
        v.extend_from_slice(&[1; 10]);
        // A realloc is an allocation; the free at the end is not.
        v.reserve_exact(100);
        std::hint::black_box(&v);
    });
    assert_eq!(n, 2);
    assert_eq!(ALLOC.count_on_this_thread(|| {}), 0);
}

#[test]
fn the_total_sees_other_threads() {
    let before = ALLOC.total();
    std::thread::spawn(|| {
        for i in 0..100u64 {
            std::hint::black_box(Box::new(i));
        }
    })
    .join()
    .unwrap();
    assert!(ALLOC.total() - before >= 100);
}

#[test]
fn live_bytes_follow_allocations_and_frees() {
    let at = |b: LiveBytes| (b.requested, b.classed);
    let before = at(ALLOC.live_on_this_thread());
    let v = std::hint::black_box(Vec::<u8>::with_capacity(100));
    let held = at(ALLOC.live_on_this_thread());
    assert_eq!((held.0 - before.0, held.1 - before.1), (100, 128));
    drop(v);
    assert_eq!(at(ALLOC.live_on_this_thread()), before);
}
