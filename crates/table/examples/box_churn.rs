//! Instruction counts of creating, removing and updating boxes, for
//! callgrind: `box_churn MODE N` runs N operations of one kind inside
//! `measured`, on a table (default config, rooms on) that already holds
//! 100,000 boxes in 100 rooms, keyed as `pollbox load --rooms 100` keys them
//! (`room-<n % 100>/lg-<n>`). Modes: `create` (N new boxes), `remove` (N
//! boxes created beforehand, outside the count), `update` (N lazy updates
//! of existing boxes, spread over them), `walk` (N boxes walked room by
//! room, as a page of a prefix walks them: 64 keys out of the key order a
//! step, then a poll of each).
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

/// Walk `n` boxes, room after room, in steps of 64 keys each followed by
/// a poll of every key (as `Service::page_step` does).
fn walk(t: &BoxTable, n: usize) -> u64 {
    let (mut acc, mut walked, mut room) = (0u64, 0, 0);
    let (mut keys, mut body) = (Vec::new(), Vec::new());
    while walked < n {
        let prefix = format!("room-{}/", room % 100);
        let mut after: Option<Vec<u8>> = None;
        loop {
            keys.clear();
            let (got, more) = t
                .order()
                .page(prefix.as_bytes(), after.as_deref(), 64, &mut keys);
            let mut rest = &keys[..];
            while let Some((len, r)) = rest.split_first_chunk::<2>() {
                let (key, r) = r.split_at(u16::from_le_bytes(*len) as usize);
                body.clear();
                acc += t.poll(key, &mut body).unwrap_or(0);
                after = Some(key.to_vec());
                rest = r;
            }
            walked += got;
            if !more || walked >= n {
                break;
            }
        }
        room += 1;
    }
    acc
}

#[inline(never)]
fn measured(t: &BoxTable, mode: &str, keys: &[String]) -> u64 {
    if mode == "walk" {
        return walk(t, keys.len());
    }
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
    println!(
        "{mode} {n}: {acc} ({} boxes; key order {:.2} B a box)",
        t.len(),
        t.order().bytes() as f64 / t.len().max(1) as f64
    );
}
