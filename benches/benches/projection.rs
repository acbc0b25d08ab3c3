//! The projection (simd-json tape in the worker's arena, only configured paths
//! read) beside the common ways: a serde_json `Value` DOM, and sonic-rs's
//! checked `get_many` of the same three paths.
//!
//! Groups:
//! - `projection_msgs`: throughput in messages (512 B and 8 KiB single
//!   messages, and a 32 × 512 B NDJSON batch);
//!   `8KiB_fields_last` puts the three read members after the cargo: sonic-rs
//!   stops reading once it has found every path, so with the members first it
//!   never looks at (or validates) the cargo, while the projection always
//!   validates the whole body (invalid JSON must be refused whole, SPEC §5);
//! - `projection_bytes`: the same single messages, throughput in bytes;
//! - `arena_reset`: `Epoch::reset` after 100 projected 512 B messages.
//!
//! The projection benches reset the epoch every 100 messages, as the timer
//! wheel would, so the arena stays warm and its reset is amortised in.

use bumpalo::Bump;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pollbox_core::epoch::Epoch;
use pollbox_core::plan::{Plan, Value};
use pollbox_core::projection::{BodyFormat, KeySource, Projector};
use sonic_rs::{JsonValueTrait, PointerTree};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages projected between two epoch resets.
const MESSAGES_PER_EPOCH: usize = 100;

/// Where the three read members sit in a bench message.
#[derive(Clone, Copy)]
enum Layout {
    /// `{"key":..,"value":..,"player":.., cargo...}`: a lazy reader can stop
    /// early.
    FieldsFirst,
    /// `{cargo..., "key":..,"value":..,"player":..}`: every reader must go
    /// through the cargo.
    FieldsLast,
}

/// A message of exactly `size` bytes with `"key":"box-42","value":5,
/// "player":"p-7"` and cargo: nested objects and arrays, numbers, booleans,
/// nulls and escaped strings, so the skip path does real work.
fn message(size: usize, layout: Layout) -> Vec<u8> {
    const FIELDS: &str = r#""key":"box-42","value":5,"player":"p-7""#;
    let reserved = FIELDS.len() + 12; // `{`, `,"pad":""`, `}` and a comma
    let mut s = String::from("{");
    if let Layout::FieldsFirst = layout {
        s.push_str(FIELDS);
        s.push(',');
    }
    let mut n = 0;
    loop {
        let chunk = format!(
            r#""c{n}":{{"id":{n},"tags":["a","b\"c"],"pos":{{"x":1.25,"y":-3,"z":null}},"ok":true,"hist":[[1,2],[3,{{"value":4}}]]}},"#
        );
        if s.len() + chunk.len() + reserved > size {
            break;
        }
        s.push_str(&chunk);
        n += 1;
    }
    let tail_len = match layout {
        Layout::FieldsFirst => 9,
        Layout::FieldsLast => 10 + FIELDS.len(),
    };
    let pad = size.saturating_sub(s.len() + tail_len);
    s.push_str(r#""pad":""#);
    s.push_str(&"x".repeat(pad));
    s.push('"');
    if let Layout::FieldsLast = layout {
        s.push(',');
        s.push_str(FIELDS);
    }
    s.push('}');
    assert_eq!(s.len(), size);
    assert!(serde_json::from_str::<serde_json::Value>(&s).is_ok());
    s.into_bytes()
}

struct Projection {
    projector: Projector,
    epoch: Epoch,
    since_reset: usize,
}

impl Projection {
    fn new() -> Projection {
        Projection {
            projector: Projector::new(Arc::new(Plan::default_plan())),
            epoch: Epoch::new(4 << 20, 64 << 20),
            since_reset: 0,
        }
    }

    /// Project one body and read what it found; returns a checksum.
    fn run(&mut self, body: &[u8], format: BodyFormat) -> i64 {
        if self.since_reset == MESSAGES_PER_EPOCH {
            self.epoch.reset();
            self.since_reset = 0;
        }
        self.since_reset += 1;
        let batch = self
            .projector
            .project(self.epoch.arena(), body, format, KeySource::Body)
            .expect("bench body is valid");
        let mut sum = 0;
        for m in batch.items.iter().flatten() {
            sum += m.key.len() as i64;
            if let Some(Value::I64(v)) = m.values[0] {
                sum += v;
            }
            if let Some(Value::Str(s)) = m.values[3] {
                sum += s.len() as i64;
            }
        }
        sum
    }
}

fn serde_json_value(body: &[u8]) -> i64 {
    let v: serde_json::Value = serde_json::from_slice(body).expect("bench body is valid");
    v["key"].as_str().map_or(0, str::len) as i64
        + v["value"].as_i64().unwrap_or(0)
        + v["player"].as_str().map_or(0, str::len) as i64
}

fn sonic_tree() -> PointerTree {
    let mut tree = PointerTree::new();
    tree.add_path(&["key"]);
    tree.add_path(&["value"]);
    tree.add_path(&["player"]);
    tree
}

fn sonic_get_many(body: &[u8], tree: &PointerTree) -> i64 {
    let found = sonic_rs::get_many(body, tree).expect("bench body is valid");
    let str_len = |i: usize| {
        found[i]
            .as_ref()
            .and_then(|v| v.as_str().map(str::len))
            .unwrap_or(0) as i64
    };
    str_len(0) + found[1].as_ref().and_then(|v| v.as_i64()).unwrap_or(0) + str_len(2)
}

fn single_messages(c: &mut Criterion, group_name: &str, bytes: bool) {
    let tree = sonic_tree();
    let mut group = c.benchmark_group(group_name);
    for (label, size, layout) in [
        ("512B", 512, Layout::FieldsFirst),
        ("8KiB", 8192, Layout::FieldsFirst),
        ("8KiB_fields_last", 8192, Layout::FieldsLast),
    ] {
        let body = message(size, layout);
        group.throughput(if bytes {
            Throughput::Bytes(body.len() as u64)
        } else {
            Throughput::Elements(1)
        });
        let mut projection = Projection::new();
        group.bench_with_input(
            BenchmarkId::new("pollbox_project", label),
            &body,
            |b, body| b.iter(|| projection.run(black_box(body), BodyFormat::Json)),
        );
        group.bench_with_input(
            BenchmarkId::new("serde_json_value", label),
            &body,
            |b, body| b.iter(|| serde_json_value(black_box(body))),
        );
        group.bench_with_input(
            BenchmarkId::new("sonic_rs_get_many", label),
            &body,
            |b, body| b.iter(|| sonic_get_many(black_box(body), &tree)),
        );
    }
    group.finish();
}

fn projection_msgs(c: &mut Criterion) {
    single_messages(c, "projection_msgs", false);

    // A 32-message NDJSON batch, against serde_json line by line.
    let line = message(512, Layout::FieldsFirst);
    let mut batch = Vec::new();
    for _ in 0..32 {
        batch.extend_from_slice(&line);
        batch.push(b'\n');
    }
    let mut group = c.benchmark_group("projection_msgs");
    group.throughput(Throughput::Elements(32));
    let mut projection = Projection::new();
    group.bench_with_input(
        BenchmarkId::new("pollbox_project", "ndjson_32x512B"),
        &batch,
        |b, body| b.iter(|| projection.run(black_box(body), BodyFormat::Ndjson)),
    );
    group.bench_with_input(
        BenchmarkId::new("serde_json_value", "ndjson_32x512B"),
        &batch,
        |b, body| {
            b.iter(|| {
                body.split(|&c| c == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(serde_json_value)
                    .sum::<i64>()
            })
        },
    );
    group.finish();
}

fn projection_bytes(c: &mut Criterion) {
    single_messages(c, "projection_bytes", true);
}

/// The cost of ending an epoch that held 100 parsed 512 B messages: only the
/// reset is timed.
fn arena_reset(c: &mut Criterion) {
    let body = message(512, Layout::FieldsFirst);
    let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    let mut epoch = Epoch::new(4 << 20, 64 << 20);
    let mut group = c.benchmark_group("arena_reset");
    group.bench_function("reset_after_100x512B", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                for _ in 0..MESSAGES_PER_EPOCH {
                    let batch = projector
                        .project(epoch.arena(), &body, BodyFormat::Json, KeySource::Body)
                        .expect("bench body is valid");
                    black_box(&batch);
                }
                let start = Instant::now();
                black_box(epoch.reset());
                timed += start.elapsed();
            }
            timed
        })
    });
    // For scale: a fresh bump arena's reset with nothing in it.
    let mut empty = Bump::with_capacity(4 << 20);
    group.bench_function("reset_empty_bump", |b| b.iter(|| empty.reset()));
    group.finish();
}

criterion_group!(benches, projection_msgs, projection_bytes, arena_reset);
criterion_main!(benches);
