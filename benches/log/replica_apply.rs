//! What the consuming thread does per record, without a broker: N records of
//! 512 B on 10,000 keys, each in its key's home partition of 4, applied with
//! `Replica::apply` to a box table, counted under callgrind
//! (`benches/log/callgrind.sh`: this tree beside a base commit).
//!
//! `replica_apply N`: a warm-up of 20,000 records, then N, inside `measured`.

use pollbox_core::boxes::BoxTable;
use pollbox_core::log::{Record, Replica};
use pollbox_core::plan::Plan;
use std::hint::black_box;
use std::sync::Arc;

const KEYS: usize = 10_000;
#[allow(dead_code)] // unused where the base has no partitions
const PARTITIONS: u32 = 4;

#[inline(never)]
fn measured(replica: &mut Replica, table: &BoxTable, records: &[(String, i32, Vec<u8>)], n: usize) {
    let mut key = Vec::with_capacity(64);
    for i in 0..n + 20_000 {
        let (k, partition, value) = &records[i % records.len()];
        let rec = Record {
            partition: *partition,
            offset: i as i64,
            timestamp_ms: 1_764_000_000_000,
            key: Some(k.as_bytes()),
            value: Some(value),
            headers: Default::default(),
        };
        // Nobody watches: the wake-up is the server's (`Waiters::notify`).
        black_box(replica.apply(table, &rec, &mut key, &mut ()));
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let plan = Arc::new(Plan::default_plan());
    let table = BoxTable::new(plan.clone());
    let mut replica = Replica::new(plan, 64 << 20, PARTITIONS);
    let cargo = "x".repeat(420);
    let records: Vec<(String, i32, Vec<u8>)> = (0..KEYS)
        .map(|k| {
            let key = format!("lg-{k}");
            let partition = pollbox_core::log::home_partition(key.as_bytes(), PARTITIONS);
            let value = format!(
                r#"{{"key":"{key}","value":{},"player":"p-{:03}","cargo":"{cargo}"}}"#,
                1_000_000 + k,
                k % 1000
            );
            (key, partition, value.into_bytes())
        })
        .collect();
    measured(&mut replica, &table, &records, n);
    eprintln!("{} boxes", table.len());
}
