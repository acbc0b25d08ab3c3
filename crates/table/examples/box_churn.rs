//! Instruction counts of creating, removing and updating boxes, for
//! callgrind: `box_churn MODE N` runs N operations of one kind inside
//! `measured`, on a table (default config, rooms on) that already holds
//! 100,000 boxes in 100 rooms, keyed as `pollbox load --rooms 100` keys them
//! (`room-<n % 100>/lg-<n>`). Modes: `create` (N new boxes), `remove` (N
//! boxes created beforehand, outside the count), `update` (N lazy updates
//! of existing boxes, spread over them).
//!
//!   valgrind --tool=callgrind --toggle-collect='box_churn::measured' \
//!     target/release/examples/box_churn create 100000
//!
//! Only the table's public API: benches/box-table/churn-callgrind.sh builds
//! the same file against a base commit's tree.
use pollbox_table::boxes::BoxTable;
use pollbox_table::plan::{Plan, Value};
use std::hint::black_box;
use std::sync::Arc;

const BASE: usize = 100_000;

fn message(v: i64) -> [Option<Value<'static>>; 4] {
    [
        Some(Value::I64(v)),
        Some(Value::I64(v)),
        None,
        Some(Value::Str("p-1")),
    ]
}

#[inline(never)]
fn measured(t: &BoxTable, mode: &str, keys: &[String]) -> u64 {
    let mut acc = 0u64;
    for (i, key) in keys.iter().enumerate() {
        acc += match mode {
            "create" | "update" => t.apply(key, &message(i as i64), 0, None).unwrap_or(0),
            "remove" => t.remove(key.as_bytes()).unwrap_or(0),
            _ => panic!("unknown mode {mode}"),
        };
    }
    acc
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("create", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let key = |k: usize| format!("room-{}/lg-{k}", k % 100);
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    for k in 0..BASE {
        t.apply(&key(k), &message(k as i64), 0, None)
            .expect("applies");
    }
    let keys: Vec<String> = match mode {
        // Spread over the existing boxes, in another order than created.
        "update" => (0..n).map(|i| key(i * 7919 % BASE)).collect(),
        _ => (BASE..BASE + n).map(key).collect(),
    };
    if mode == "remove" {
        for k in &keys {
            t.apply(k, &message(1), 0, None).expect("applies");
        }
    }
    let acc = black_box(measured(&t, mode, &keys));
    println!("{mode} {n}: {acc} ({} boxes)", t.len());
}
