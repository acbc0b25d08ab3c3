//! Allocation counts of the box table's hot paths, and its memory accounting
//! against what the allocator was really asked for.
//!
//! A counting global allocator (`pollbox-test-alloc`) wraps `System`; counters
//! are per thread, so the test harness running tests in parallel does not
//! disturb a measurement.

use std::sync::Arc;

use pollbox_table::boxes::{size_class, BoxTable};
use pollbox_table::plan::{Plan, Value};

/// Live bytes are also kept rounded to jemalloc's size classes.
#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting =
    pollbox_test_alloc::Counting::new().size_classes(size_class);

/// Bytes live on this thread, as requested, and rounded to jemalloc size classes.
fn live() -> (i64, i64) {
    let b = ALLOC.live_on_this_thread();
    (b.requested, b.classed)
}

/// Allocations made by `f` on this thread.
fn count(f: impl FnOnce()) -> u64 {
    ALLOC.count_on_this_thread(f)
}

fn table() -> BoxTable {
    BoxTable::new(Arc::new(Plan::default_plan()))
}

fn message(v: i64, by: &str) -> [Option<Value<'_>>; 4] {
    [
        Some(Value::I64(v)),
        Some(Value::I64(v)),
        None,
        Some(Value::Str(by)),
    ]
}

#[test]
fn poll_allocates_nothing() {
    let t = table();
    for k in 0..1000 {
        t.apply(&format!("box-{k}"), &message(k, "p-1"), 0, None)
            .expect("ok");
    }
    let keys: Vec<Vec<u8>> = (0..1000).map(|k| format!("box-{k}").into_bytes()).collect();
    let mut out = Vec::with_capacity(512);
    // Warm-up: nothing lazily initialised may be left for the measured loop.
    for key in &keys {
        out.clear();
        t.poll(key, &mut out).expect("present");
    }
    let n = count(|| {
        for i in 0..10_000 {
            out.clear();
            let v = t.poll(&keys[i % keys.len()], &mut out);
            assert_eq!(v, Some(1));
        }
        // Misses and version checks too.
        for _ in 0..1000 {
            assert!(t.poll(b"missing", &mut out).is_none());
            assert_eq!(t.version(b"box-7"), Some(1));
        }
    });
    assert_eq!(n, 0, "10,000 polls allocated {n} times");
}

#[test]
fn apply_to_an_existing_box_rewrites_its_record_in_place() {
    let t = table();
    // Warm-up: this thread's scratch buffers are sized once, and the version
    // reaches 4 digits, which the measured loop keeps.
    for _ in 0..1000 {
        t.apply("box-1", &message(0, "p-1"), 0, None).expect("ok");
    }
    let mut out = Vec::with_capacity(512);
    let n = count(|| {
        for i in 0..8_000i64 {
            // Payloads of the same length (v 1 or 2, sum going up and down by
            // one, by p-3 or p-4): the record is rewritten in place.
            let (v, step, by) = if i % 2 == 0 {
                (1, 1, "p-3")
            } else {
                (2, -1, "p-4")
            };
            let values = [
                Some(Value::I64(v)),
                Some(Value::I64(step)),
                None,
                Some(Value::Str(by)),
            ];
            out.clear();
            t.apply("box-1", &values, 0, Some(&mut out)).expect("ok");
        }
    });
    println!("8,000 applies to an existing box: {n} allocations");
    assert_eq!(n, 0);
}

#[test]
fn a_record_outgrowing_its_size_class_allocates_once() {
    let t = table();
    t.apply("box-1", &message(1, "p"), 0, None).expect("ok");
    t.apply("box-1", &message(1, "p"), 0, None)
        .expect("warm-up");
    let n = count(|| {
        t.apply("box-1", &message(1, "0123456789abcdef"), 0, None)
            .expect("ok");
    });
    assert_eq!(n, 1, "a new record, nothing else");
}

#[test]
fn rejected_messages_allocate_nothing_on_an_existing_box() {
    let t = table();
    t.apply("box-1", &message(i64::MAX, "p"), 0, None)
        .expect("ok");
    t.apply("box-1", &[None, None, None, None], 0, None)
        .expect("warm-up");
    let n = count(|| {
        for _ in 0..100 {
            assert!(t.apply("box-1", &message(1, "p"), 0, None).is_err());
        }
    });
    assert_eq!(n, 0);
}

/// What the allocator was asked for while 100,000 (default-config) boxes were
/// created, against what the table says it holds. Run with `--nocapture` to
/// see the numbers.
#[test]
fn accounted_bytes_track_real_allocations_at_100k_boxes() {
    const BOXES: usize = 100_000;
    let (live0, classed0) = live();
    let t = table();
    let keys: Vec<String> = (0..BOXES).map(|k| format!("box-{k}")).collect();
    let (live1, classed1) = live();
    let (keys_live, keys_classed) = (live1 - live0, classed1 - classed0);
    for (k, key) in keys.iter().enumerate() {
        let by = format!("p-{}", k % 100);
        for m in 0..3 {
            t.apply(key, &message(k as i64 + m, &by), 0, None)
                .expect("ok");
        }
    }
    let (live2, classed2) = live();
    // Take out what the test itself holds (the key strings).
    let real = (live2 - live0 - keys_live) as f64;
    let real_classed = (classed2 - classed0 - keys_classed) as f64;
    let accounted = t.accounted_bytes() as f64;
    println!(
        "{BOXES} boxes: accounted {:.1} MB ({:.0} B/box), requested {:.1} MB ({:.0} B/box), \
         at size classes {:.1} MB ({:.0} B/box)",
        accounted / 1e6,
        accounted / BOXES as f64,
        real / 1e6,
        real / BOXES as f64,
        real_classed / 1e6,
        real_classed / BOXES as f64,
    );
    let mut sample = Vec::new();
    t.poll(b"box-99999", &mut sample).expect("present");
    println!(
        "payload: {} ({} bytes)",
        String::from_utf8_lossy(&sample),
        sample.len()
    );
    assert_eq!(t.len(), BOXES);
    // Within 20% of what a size-classed allocator (jemalloc) holds, and never
    // below what was asked for.
    assert!(
        (accounted - real_classed).abs() <= real_classed * 0.2,
        "accounted {accounted} vs {real_classed}"
    );
    assert!(
        accounted >= real * 0.95,
        "accounted {accounted} vs requested {real}"
    );
    // The memory budget: 25 MB for 100k boxes all told.
    assert!(accounted < 25e6);
}
