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
//!   keys prepared outside the timing). `existing_box` asks for the payload
//!   (single-message ingest answers with it: rendered at once);
//!   `existing_box_lazy` does not (batch ingest: rendered by the next poll);
//! - `apply_per_poll`: N messages to one box then one poll of it, per message:
//!   lazy rendering (render on the first poll of a version) against rendering
//!   every update;
//! - `hot_box_contended`: two threads polling one box while a third updates
//!   it without pause (and `1_poller/`: one thread polling), wall time per
//!   poll per polling thread; `with_churn/`: a fourth thread creates and
//!   removes boxes of the hot box's shard meanwhile. `seqlock_*` is
//!   the table (updates lazy, or rendered at once); `rwlock_reference` is a
//!   minimal copy of the design before seqlock slots (shard `RwLock`, SipHash
//!   index, slot `RwLock` around the record, re-rendered on every update);
//! - `reference`: the same minimal copy, one thread: poll and apply.

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

/// A minimal copy of the box table before seqlock slots: a shard `RwLock` around a
/// SipHash index of slot numbers, each slot an `RwLock` around the record
/// (here: version, payload, state), the payload re-rendered on every update.
/// Polls take two read/unlock pairs, updates a read and a write pair.
struct Reference {
    plan: Plan,
    shards: Vec<RwLock<RefShard>>,
    hasher: std::collections::hash_map::RandomState,
}

struct RefShard {
    index: HashMap<Vec<u8>, usize>,
    slots: Vec<RwLock<RefRecord>>,
    /// Slot `n`'s key (to fix the index when a removal moves the last slot).
    keys: Vec<Vec<u8>>,
}

struct RefRecord {
    version: u64,
    payload: Vec<u8>,
    state: Vec<FieldState>,
}

impl Reference {
    fn new() -> Reference {
        Reference {
            plan: Plan::default_plan(),
            shards: (0..256)
                .map(|_| {
                    RwLock::new(RefShard {
                        index: HashMap::new(),
                        slots: Vec::new(),
                        keys: Vec::new(),
                    })
                })
                .collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn shard(&self, key: &[u8]) -> &RwLock<RefShard> {
        use std::hash::BuildHasher;
        let h = self.hasher.hash_one(key);
        &self.shards[(h >> 40) as usize & 255]
    }

    fn poll(&self, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let shard = self.shard(key).read().unwrap_or_else(|e| e.into_inner());
        let n = *shard.index.get(key)?;
        let record = shard.slots[n].read().unwrap_or_else(|e| e.into_inner());
        out.extend_from_slice(&record.payload);
        Some(record.version)
    }

    /// `last` for `v`, `sum` for the second, `count`, `last` for `by`.
    fn apply(&self, key: &str, v: i64, by: &str) -> u64 {
        let lock = self.shard(key.as_bytes());
        {
            let shard = lock.read().unwrap_or_else(|e| e.into_inner());
            if let Some(&n) = shard.index.get(key.as_bytes()) {
                let mut r = shard.slots[n].write().unwrap_or_else(|e| e.into_inner());
                let r = &mut *r;
                r.version += 1;
                let sum = match r.state[1] {
                    FieldState::I64(s) => s + v,
                    _ => v,
                };
                let count = match r.state[2] {
                    FieldState::Count(c) => c + 1,
                    _ => 1,
                };
                r.state[0] = FieldState::I64(v);
                r.state[1] = FieldState::I64(sum);
                r.state[2] = FieldState::Count(count);
                if !matches!(&r.state[3], FieldState::Str(s) if &**s == by) {
                    r.state[3] = FieldState::Str(by.into());
                }
                r.payload.clear();
                render_payload(&self.plan, key, r.version, &r.state, &mut r.payload);
                return r.version;
            }
        }
        let mut shard = lock.write().unwrap_or_else(|e| e.into_inner());
        let state = vec![
            FieldState::I64(v),
            FieldState::I64(v),
            FieldState::Count(1),
            FieldState::Str(by.into()),
        ];
        let mut payload = Vec::new();
        render_payload(&self.plan, key, 1, &state, &mut payload);
        let n = shard.slots.len();
        shard.slots.push(RwLock::new(RefRecord {
            version: 1,
            payload,
            state,
        }));
        shard.index.insert(key.as_bytes().to_vec(), n);
        shard.keys.push(key.as_bytes().to_vec());
        1
    }

    /// Remove `key` (shard write lock; the last slot moves into the hole).
    fn remove(&self, key: &[u8]) -> Option<u64> {
        let mut shard = self.shard(key).write().unwrap_or_else(|e| e.into_inner());
        let n = shard.index.remove(key)?;
        let record = shard.slots.swap_remove(n);
        shard.keys.swap_remove(n);
        if let Some(moved) = shard.keys.get(n).cloned() {
            shard.index.insert(moved, n);
        }
        let version = record.read().unwrap_or_else(|e| e.into_inner()).version;
        Some(version)
    }

    fn same_shard(&self, a: &[u8], b: &[u8]) -> bool {
        std::ptr::eq(self.shard(a), self.shard(b))
    }
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
/// table used before) against foldhash (quality, what it uses now;
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
    group.bench_function("existing_box_lazy", |b| {
        b.iter(|| {
            n += 1;
            let by = if n % 2 == 0 { "p-3" } else { "p-4" };
            black_box(
                table
                    .apply("box-42", &message(n & 7, by), 0, None)
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

/// N messages to one box, then one poll of it; time per message. `lazy`:
/// applies store the state only, the poll renders. `render_every_update`:
/// each apply renders (asked for the payload, as every apply did before lazy rendering).
fn apply_per_poll(c: &mut Criterion) {
    let keys = keys();
    let (table, _) = tables(&keys);
    let mut group = c.benchmark_group("apply_per_poll");
    let mut out = Vec::with_capacity(512);
    let mut answer = Vec::with_capacity(512);
    let mut m = 0i64;
    for n in [1u64, 10, 100] {
        for lazy in [true, false] {
            let name = if lazy { "lazy" } else { "render_every_update" };
            group.bench_function(format!("{name}/{n}_updates_per_poll"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for i in 0..iters {
                        m += 1;
                        let by = if m % 2 == 0 { "p-3" } else { "p-4" };
                        answer.clear();
                        let into = (!lazy).then_some(&mut answer);
                        black_box(table.apply("box-42", &message(m & 7, by), 0, into))
                            .expect("applies");
                        if (i + 1) % n == 0 {
                            out.clear();
                            black_box(table.poll(b"box-42", &mut out));
                        }
                    }
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

/// One thread, the design before seqlock slots (see [`Reference`]).
fn reference(c: &mut Criterion) {
    let r = Reference::new();
    for k in 0..BOXES {
        for m in 0..3 {
            r.apply(&format!("box-{k}"), k as i64 + m, "p-1");
        }
    }
    let mut group = c.benchmark_group("reference");
    let mut out = Vec::with_capacity(512);
    group.bench_function("rwlock_poll_one_hot_box", |b| {
        b.iter(|| {
            out.clear();
            black_box(r.poll(black_box(b"box-42"), &mut out));
            black_box(out.len())
        })
    });
    let mut n = 0i64;
    group.bench_function("rwlock_apply_existing_box", |b| {
        b.iter(|| {
            n += 1;
            let by = if n % 2 == 0 { "p-3" } else { "p-4" };
            black_box(r.apply(black_box("box-42"), n & 7, by))
        })
    });
    group.finish();
}

/// Two threads poll one box while a third updates it without pause: wall
/// time per poll per polling thread (each polling thread does `iters` polls).
fn hot_box_contended(c: &mut Criterion) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Barrier;
    #[derive(Clone, Copy)]
    enum Which {
        Lazy,
        Eager,
        Reference,
    }
    let keys = keys();
    let table = Arc::new(tables(&keys).0);
    let reference = Arc::new(Reference::new());
    for k in 0..1000 {
        reference.apply(&format!("box-{k}"), k, "p-1");
    }
    let mut group = c.benchmark_group("hot_box_contended");
    // Two pollers and an updater, and one poller and an
    // updater (one thread a core on a 2-core machine).
    // With `churn`, one more thread creates and removes 64 boxes of the hot
    // box's shard without pause (each removal moves the shard's last box):
    // the case where the shard `RwLock` made polls wait.
    let churn_keys = |same: &dyn Fn(&[u8]) -> bool| -> Vec<String> {
        (0..)
            .map(|i| format!("churn-{i}"))
            .filter(|k| same(k.as_bytes()))
            .take(64)
            .collect()
    };
    let table_churn = Arc::new(churn_keys(&|k| table.same_shard(k, b"box-42")));
    let reference_churn = Arc::new(churn_keys(&|k| reference.same_shard(k, b"box-42")));
    for (pollers, churn, name, which) in [
        (2, false, "seqlock_lazy_updates", Which::Lazy),
        (2, false, "seqlock_rendered_updates", Which::Eager),
        (2, false, "rwlock_reference", Which::Reference),
        (1, false, "1_poller/seqlock_lazy_updates", Which::Lazy),
        (1, false, "1_poller/seqlock_rendered_updates", Which::Eager),
        (1, false, "1_poller/rwlock_reference", Which::Reference),
        (2, true, "with_churn/seqlock_rendered_updates", Which::Eager),
        (2, true, "with_churn/rwlock_reference", Which::Reference),
        (
            1,
            true,
            "1_poller_with_churn/seqlock_rendered_updates",
            Which::Eager,
        ),
        (
            1,
            true,
            "1_poller_with_churn/rwlock_reference",
            Which::Reference,
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let stop = Arc::new(AtomicBool::new(false));
                let start = Arc::new(Barrier::new(pollers + 1 + usize::from(churn)));
                let churner = churn.then(|| {
                    let (table, reference) = (Arc::clone(&table), Arc::clone(&reference));
                    let (stop, start) = (Arc::clone(&stop), Arc::clone(&start));
                    let keys = match which {
                        Which::Reference => Arc::clone(&reference_churn),
                        _ => Arc::clone(&table_churn),
                    };
                    std::thread::spawn(move || {
                        let mut n = 0u64;
                        start.wait();
                        while !stop.load(Ordering::Relaxed) {
                            for key in keys.iter() {
                                match which {
                                    Which::Reference => {
                                        reference.apply(key, 1, "p-1");
                                    }
                                    _ => {
                                        table.apply(key, &message(1, "p-1"), 0, None).ok();
                                    }
                                }
                            }
                            for key in keys.iter() {
                                match which {
                                    Which::Reference => reference.remove(key.as_bytes()),
                                    _ => table.remove(key.as_bytes()),
                                };
                            }
                            n += 1;
                        }
                        n
                    })
                });
                let updater = {
                    let (table, reference) = (Arc::clone(&table), Arc::clone(&reference));
                    let (stop, start) = (Arc::clone(&stop), Arc::clone(&start));
                    std::thread::spawn(move || {
                        let mut out = Vec::with_capacity(512);
                        let mut n = 0i64;
                        start.wait();
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            let by = if n % 2 == 0 { "p-3" } else { "p-4" };
                            out.clear();
                            match which {
                                Which::Lazy => {
                                    table.apply("box-42", &message(n & 7, by), 0, None).ok();
                                }
                                Which::Eager => {
                                    table
                                        .apply("box-42", &message(n & 7, by), 0, Some(&mut out))
                                        .ok();
                                }
                                Which::Reference => {
                                    reference.apply("box-42", n & 7, by);
                                }
                            }
                        }
                        n
                    })
                };
                let pollers: Vec<_> = (0..pollers)
                    .map(|_| {
                        let (table, reference) = (Arc::clone(&table), Arc::clone(&reference));
                        let start = Arc::clone(&start);
                        std::thread::spawn(move || {
                            let mut out = Vec::with_capacity(512);
                            start.wait();
                            let t0 = Instant::now();
                            for _ in 0..iters {
                                out.clear();
                                match which {
                                    Which::Reference => reference.poll(b"box-42", &mut out),
                                    _ => table.poll(b"box-42", &mut out),
                                };
                                black_box(out.len());
                            }
                            t0.elapsed()
                        })
                    })
                    .collect();
                let times: Vec<Duration> = pollers
                    .into_iter()
                    .map(|p| p.join().expect("poller"))
                    .collect();
                stop.store(true, Ordering::Relaxed);
                black_box(updater.join().expect("updater"));
                if let Some(c) = churner {
                    black_box(c.join().expect("churner"));
                }
                // The slower poller's time: both did `iters` polls.
                times.into_iter().max().unwrap_or_default()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = render, hash, poll, apply, apply_per_poll, reference, hot_box_contended
}
criterion_main!(benches);
