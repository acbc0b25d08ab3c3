//! With `threads_named`, the total counts only the threads so named.

use pollbox_test_alloc::Counting;

#[global_allocator]
static ALLOC: Counting = Counting::threads_named("counted-");

fn allocate_on(name: &str) {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(|| {
            for i in 0..100u64 {
                std::hint::black_box(Box::new(i));
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn only_named_threads_count_toward_the_total() {
    let before = ALLOC.total();
    allocate_on("other-1");
    assert_eq!(ALLOC.total(), before, "another thread was counted");
    allocate_on("counted-1");
    assert!(ALLOC.total() - before >= 100);
    // Each thread's own count still sees everything.
    let n = ALLOC.count_on_this_thread(|| {
        std::hint::black_box(Box::new(1u8));
    });
    assert_eq!(n, 1);
}
