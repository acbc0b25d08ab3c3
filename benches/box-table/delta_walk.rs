//! What a delta snapshot's walk costs against the table's size: `delta_walk N
//! PERCENT` fills a table of N default-config boxes, walks it once (a base),
//! updates PERCENT of the boxes (every 100/PERCENT-th), then times a walk of
//! the changed boxes (what a delta writes), three times over. Wall seconds,
//! one thread. Public API only, so it builds against older trees
//! (benches/box-table/delta-walk.sh runs it on a base commit and this tree).
use pollbox_core::boxes::{BoxTable, Walk};
use pollbox_core::plan::{Plan, Value};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let percent: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut plan = Plan::default_plan();
    plan.max_boxes = n as usize + 1;
    let t = BoxTable::new(Arc::new(plan));
    t.track_changes();
    // One message to box `k`: value and sum `v`, player `by`.
    let put = |k: u64, v: i64, by: &str| {
        let msg = [
            Some(Value::I64(v)),
            Some(Value::I64(v)),
            None,
            Some(Value::Str(by)),
        ];
        let _ = t.apply(&format!("box-{k}"), &msg, 0, None);
    };
    for k in 0..n {
        put(k, k as i64, "p-1");
    }
    let mut all = 0u64;
    t.walk(0, Walk::All, |_| {}, |_, _, _, _| all += 1);
    let step = (100 / percent.max(1)).max(1);
    for round in 0..3 {
        for k in (round..n).step_by(step as usize) {
            put(k, (k + round) as i64, "p-2");
        }
        let mut changed = 0u64;
        let t0 = Instant::now();
        t.walk(0, Walk::Changed, |_| {}, |_, _, _, _| changed += 1);
        let s = t0.elapsed().as_secs_f64();
        println!(
            "boxes {all} changed {changed} delta walk {s:.4} s ({:.1} ns a box of the table)",
            s * 1e9 / all as f64
        );
    }
}
