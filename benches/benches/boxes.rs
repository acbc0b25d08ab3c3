//! The box table and payload rendering, beside the common way.
//!
//! Groups:
//! - `render`: rendering one default-config payload from its state;
//! - `poll`: one poll hit among 100,000 boxes, payload copied into a reused
//!   buffer. `pollbox` is [`BoxTable::poll`]; `rwlock_hashmap_serde_json` is
//!   the common way, a `std::sync::RwLock<HashMap<String, serde_json::Value>>`
//!   serialising the stored `Value` on each poll. Their ratio is the point of
//!   pre-rendering. The `_one_hot_box` rows poll one box over and over:
//!   everything in cache, so the ratio is the work itself;
//! - `apply`: one message to an existing box (reduce, render, write the record
//!   in place), and one message creating a new box (a fresh table per sample,
//!   keys prepared outside the timing).

use criterion::{criterion_group, criterion_main, Criterion};
use pollbox_core::boxes::BoxTable;
use pollbox_core::plan::{Plan, Value};
use pollbox_core::render::{render_payload, FieldState};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

const BOXES: usize = 100_000;

fn message(v: i64, by: &str) -> [Option<Value<'_>>; 4] {
    [
        Some(Value::I64(v)),
        Some(Value::I64(v)),
        None,
        Some(Value::Str(by)),
    ]
}

fn keys() -> Vec<String> {
    (0..BOXES).map(|k| format!("box-{k}")).collect()
}

/// A table of `BOXES` boxes, each after three messages, and the same boxes as
/// serde_json values keyed by `String`.
fn tables(keys: &[String]) -> (BoxTable, RwLock<HashMap<String, serde_json::Value>>) {
    let mut plan = Plan::default_plan();
    plan.max_boxes = BOXES * 2;
    let table = BoxTable::new(Arc::new(plan));
    let mut map = HashMap::with_capacity(keys.len());
    for (k, key) in keys.iter().enumerate() {
        let by = format!("p-{}", k % 100);
        for m in 0..3 {
            table
                .apply(key, &message(k as i64 + m, &by), 0, None)
                .expect("bench message applies");
        }
        let v = k as i64 + 2;
        map.insert(
            key.clone(),
            serde_json::json!({
                "k": key, "ver": 3, "v": v, "sum": 3 * v - 3, "n": 3, "by": by,
            }),
        );
    }
    (table, RwLock::new(map))
}

fn render(c: &mut Criterion) {
    let plan = Plan::default_plan();
    let state = [
        FieldState::I64(5),
        FieldState::I64(12),
        FieldState::Count(2),
        FieldState::Str("p-7".into()),
    ];
    let mut out = Vec::with_capacity(256);
    c.bench_function("render/default_payload", |b| {
        b.iter(|| {
            out.clear();
            render_payload(&plan, black_box("box-42"), black_box(2), &state, &mut out);
            black_box(out.len())
        })
    });
}

/// The keyed hash of a box key: std's SipHash-1-3 (`RandomState`, what the
/// table used before issue 15) against foldhash (quality, what it uses now;
/// fast, for reference). All three randomly seeded.
fn hash(c: &mut Criterion) {
    use std::hash::BuildHasher;
    let sip = std::collections::hash_map::RandomState::new();
    let quality = foldhash::quality::RandomState::default();
    let fast = foldhash::fast::RandomState::default();
    let mut group = c.benchmark_group("hash");
    for key in ["box-42", "device-0123456789abcdef"] {
        group.bench_function(format!("siphash13/{}B", key.len()), |b| {
            b.iter(|| sip.hash_one(black_box(key.as_bytes())))
        });
        group.bench_function(format!("foldhash_quality/{}B", key.len()), |b| {
            b.iter(|| quality.hash_one(black_box(key.as_bytes())))
        });
        group.bench_function(format!("foldhash_fast/{}B", key.len()), |b| {
            b.iter(|| fast.hash_one(black_box(key.as_bytes())))
        });
    }
    group.finish();
}

fn poll(c: &mut Criterion) {
    let keys = keys();
    let (table, map) = tables(&keys);
    // A fixed pseudo-random walk over the keys, so both sides miss caches alike.
    let order: Vec<usize> = (0..BOXES).map(|i| (i * 7919) % BOXES).collect();
    let mut group = c.benchmark_group("poll");
    let mut out = Vec::with_capacity(512);
    let mut i = 0;
    group.bench_function("pollbox", |b| {
        b.iter(|| {
            i = (i + 1) % BOXES;
            out.clear();
            black_box(table.poll(keys[order[i]].as_bytes(), &mut out));
            black_box(out.len())
        })
    });
    group.bench_function("rwlock_hashmap_serde_json", |b| {
        b.iter(|| {
            i = (i + 1) % BOXES;
            out.clear();
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = map.get(keys[order[i]].as_str()) {
                serde_json::to_writer(&mut out, v).expect("serialising to a Vec");
            }
            black_box(out.len())
        })
    });
    group.bench_function("pollbox_one_hot_box", |b| {
        b.iter(|| {
            out.clear();
            black_box(table.poll(b"box-42", &mut out));
            black_box(out.len())
        })
    });
    group.bench_function("rwlock_hashmap_serde_json_one_hot_box", |b| {
        b.iter(|| {
            out.clear();
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = map.get(black_box("box-42")) {
                serde_json::to_writer(&mut out, v).expect("serialising to a Vec");
            }
            black_box(out.len())
        })
    });
    group.finish();
}

fn apply(c: &mut Criterion) {
    let keys = keys();
    let (table, _) = tables(&keys);
    let mut group = c.benchmark_group("apply");
    let mut out = Vec::with_capacity(512);
    let mut n = 0i64;
    group.bench_function("existing_box", |b| {
        b.iter(|| {
            n += 1;
            let by = if n % 2 == 0 { "p-3" } else { "p-4" };
            out.clear();
            black_box(
                table
                    .apply("box-42", &message(n & 7, by), 0, Some(&mut out))
                    .expect("applies"),
            )
        })
    });
    group.bench_function("new_box", |b| {
        b.iter_custom(|iters| {
            let mut plan = Plan::default_plan();
            plan.max_boxes = usize::MAX;
            let table = BoxTable::new(Arc::new(plan));
            let keys: Vec<String> = (0..iters).map(|k| format!("new-{k}")).collect();
            let start = Instant::now();
            for key in &keys {
                black_box(
                    table
                        .apply(key, &message(1, "p-1"), 0, None)
                        .expect("creates"),
                );
            }
            let elapsed = start.elapsed();
            drop(black_box(table));
            elapsed
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = render, hash, poll, apply
}
criterion_main!(benches);
