//! Allocation contract of the projection (docs/operations.md#memory,
//! docs/boxes.md#epochs-and-arenas): with a warm arena and a warm `Projector`,
//! ingest parsing allocates nothing outside the arena.
//!
//! A counting global allocator (`pollbox-test-alloc`) wraps the system one and
//! counts, per thread, every `alloc`, `alloc_zeroed` and `realloc` call, so
//! tests running in parallel on other threads do not disturb the count.

use pollbox_table::arena::Arena;
use pollbox_table::plan::{Plan, Value};
use pollbox_table::projection::{BodyFormat, KeySource, Projector, Shape};
use std::sync::Arc;

#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting = pollbox_test_alloc::Counting::new();

fn allocations() -> u64 {
    ALLOC.on_this_thread()
}

/// `{"key":"box-<i>","value":<i>,"player":"p-7", cargo...}` of about `size` bytes,
/// with escaped strings and nested cargo.
fn message(i: usize, size: usize) -> String {
    let mut s = format!(r#"{{"key":"box-{i}","value":{i},"player":"p-\u0037""#);
    let mut n = 0;
    while s.len() + 70 < size {
        s.push_str(&format!(
            r#","c{n}":{{"a":[1,2.5,"x\"y",null,true],"b":{{"value":{n}}}}},"s{n}":"zz""#
        ));
        n += 1;
    }
    s.push('}');
    s
}

struct Bodies {
    single: String,
    ndjson: String,
    array: String,
}

fn bodies() -> Bodies {
    let single = message(42, 512);
    assert!(
        single.len() > 440 && single.len() <= 512,
        "{}",
        single.len()
    );
    let lines: Vec<String> = (0..32).map(|i| message(i, 512)).collect();
    Bodies {
        single,
        ndjson: lines.join("\n") + "\n",
        array: format!("[{}]", lines.join(",")),
    }
}

/// Project the three bodies once and check what came out (so the work cannot
/// be skipped), without allocating on success.
fn project_all(p: &mut Projector, arena: &Arena, b: &Bodies) {
    let batch = p
        .project(
            arena.bump(),
            b.single.as_bytes(),
            BodyFormat::Json,
            KeySource::Body,
        )
        .unwrap();
    assert_eq!(batch.shape, Shape::Object);
    let m = batch.items[0].unwrap();
    assert_eq!(m.key, "box-42");
    assert_eq!(m.values[0], Some(Value::I64(42)));
    assert_eq!(m.values[3], Some(Value::Str("p-7")));

    for (body, format) in [
        (&b.ndjson, BodyFormat::Ndjson),
        (&b.array, BodyFormat::Json),
    ] {
        let batch = p
            .project(arena.bump(), body.as_bytes(), format, KeySource::Body)
            .unwrap();
        assert_eq!(batch.items.len(), 32);
        for (i, item) in batch.items.iter().enumerate() {
            assert_eq!(item.unwrap().values[1], Some(Value::I64(i as i64)));
        }
    }

    let batch = p
        .project(
            arena.bump(),
            b.single.as_bytes(),
            BodyFormat::Json,
            KeySource::Path,
        )
        .unwrap();
    assert_eq!(batch.items[0].unwrap().key, "");
}

#[test]
fn warm_projection_allocates_only_in_the_arena() {
    let b = bodies();
    let mut arena = Arena::new(1 << 20, 64 << 20);
    // A new projector allocates its path tree and slots: this proves the
    // counter sees allocations made on this thread.
    let cold = allocations();
    let mut p = Projector::new(Arc::new(Plan::default_plan()));
    assert!(allocations() > cold, "the counting allocator saw nothing");
    project_all(&mut p, &arena, &b);
    arena.reset();

    // Warm up, then count whole epochs: reset, project, project, ...
    project_all(&mut p, &arena, &b);
    arena.reset();
    let before = allocations();
    for _ in 0..100 {
        project_all(&mut p, &arena, &b);
        arena.reset();
    }
    let made = allocations() - before;
    assert_eq!(
        made, 0,
        "steady-state projection allocated {made} times outside the arena"
    );
}

#[test]
fn rejected_messages_and_refused_bodies_allocate_nothing_when_warm() {
    let mut arena = Arena::new(1 << 20, 64 << 20);
    let mut p = Projector::new(Arc::new(Plan::default_plan()));
    let bodies: [&[u8]; 6] = [
        br#"{"value":1}"#,
        br#"{"key":"k","value":"x"}"#,
        br#"[1,{"key":""},{"key":"k","player":"01234567890123456789"}]"#,
        br#"{"key":"k","value":01}"#,
        b"{\"key\":\"\xff\"}",
        b"5",
    ];
    let run = |p: &mut Projector, arena: &Arena| {
        for body in bodies {
            let _ = p.project(arena.bump(), body, BodyFormat::Json, KeySource::Body);
        }
    };
    run(&mut p, &arena);
    arena.reset();
    let before = allocations();
    for _ in 0..10 {
        run(&mut p, &arena);
        arena.reset();
    }
    assert_eq!(allocations() - before, 0);
}
