//! Instruction counts of single box-table operations, for callgrind (noise-free on
//! a shared machine, unlike wall time): `box_ops MODE N` runs N operations of one
//! kind inside `measured`, after a warm-up, on a table of 1,000 default-config
//! boxes. Modes: `poll` (one hot box), `version`, `apply` (existing box, payload
//! asked for: rendered at once), `apply_lazy` (not asked for), `apply_poll_N`
//! (N lazy applies then one poll, per message).
//!
//!   valgrind --tool=callgrind --toggle-collect='box_ops::measured' \
//!     target/release/examples/box_ops poll 100000
//!
//! The file only uses the table's public API, so it builds against older trees
//! too (benches/box-table/callgrind.sh runs it on a base commit and this tree).
use pollbox_core::boxes::BoxTable;
use pollbox_core::plan::{Plan, Value};
use std::hint::black_box;
use std::sync::Arc;

fn message(v: i64, by: &str) -> [Option<Value<'_>>; 4] {
    [
        Some(Value::I64(v)),
        Some(Value::I64(v)),
        None,
        Some(Value::Str(by)),
    ]
}

#[inline(never)]
fn measured(t: &BoxTable, mode: &str, n: u64, out: &mut Vec<u8>, answer: &mut Vec<u8>) -> u64 {
    let mut acc = 0u64;
    let every = mode
        .strip_prefix("apply_poll_")
        .and_then(|k| k.parse::<u64>().ok());
    for i in 0..n {
        let by = if i % 2 == 0 { "p-3" } else { "p-4" };
        match (mode, every) {
            ("poll", _) => {
                out.clear();
                acc += t.poll(black_box(b"box-42"), out).unwrap_or(0);
            }
            ("version", _) => acc += t.version(black_box(b"box-42")).unwrap_or(0),
            ("apply", _) => {
                answer.clear();
                acc += t
                    .apply("box-42", &message((i & 7) as i64, by), 0, Some(answer))
                    .unwrap_or(0);
            }
            ("apply_lazy", _) => {
                acc += t
                    .apply("box-42", &message((i & 7) as i64, by), 0, None)
                    .unwrap_or(0);
            }
            (_, Some(k)) => {
                acc += t
                    .apply("box-42", &message((i & 7) as i64, by), 0, None)
                    .unwrap_or(0);
                if (i + 1) % k == 0 {
                    out.clear();
                    acc += t.poll(b"box-42", out).unwrap_or(0);
                }
            }
            _ => panic!("unknown mode {mode}"),
        }
    }
    acc
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("poll", String::as_str);
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    for k in 0..1000 {
        for m in 0..3 {
            t.apply(&format!("box-{k}"), &message(k + m, "p-1"), 0, None)
                .expect("applies");
        }
    }
    let (mut out, mut answer) = (Vec::with_capacity(512), Vec::with_capacity(512));
    // Warm-up: scratch buffers sized, the version at 5 digits for the run.
    black_box(measured(&t, mode, 20_000, &mut out, &mut answer));
    let acc = measured(&t, mode, n, &mut out, &mut answer);
    println!("{mode} {n}: {acc}");
}
