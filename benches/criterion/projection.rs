//! The projection: candidates for reading the key and two fields
//! of an ingest message while validating the whole body, side by side.
//!
//! Candidates (the bench first feeds each one messages with a fault in the
//! cargo: the pollbox projectors and `serde_json_value` must refuse them all,
//! as the server refuses a body that is not valid JSON anywhere; what
//! `serde_typed` and `sonic_rs_iter` let through is printed):
//! - `scanner`: today's [`Projector`], the validating single-pass scanner
//!   (`crates/table/src/projection/scan/`);
//! - `simd_json_tape`: the projector before the scanner (copy in
//!   `projection/tape.rs`): the body copied into the arena, simd-json's tape of
//!   the whole message, the tape walked for the paths;
//! - `sonic_rs_iter`: sonic-rs's checked object iterator over the message
//!   (`to_object_iter`, each skipped value validated by `skip_one`), the
//!   three members decoded;
//! - `serde_json_value`: a serde_json `Value` DOM;
//! - `serde_typed`: serde_json into a struct with borrowed strings, the cargo
//!   skipped by serde's `IgnoredAny`.
//!
//! Bodies: 512 B and 8 KiB messages with the three read members first or
//! last, and a 32 × 512 B NDJSON batch (throughput in messages).
//!
//! The pollbox benches reset the epoch every 100 messages, as the timer wheel
//! would, so the arena stays warm and its reset is amortised in.
//! `arena_reset` times `Arena::reset` after 100 projected 512 B messages.

#[path = "projection/tape.rs"]
mod tape;

use bumpalo::Bump;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use pollbox_core::arena::Arena;
use pollbox_core::plan::{Plan, Value};
use pollbox_core::projection::{BodyFormat, KeySource, Projector};
use serde::de::IgnoredAny;
use serde::Deserialize;
use sonic_rs::JsonValueTrait;
use std::borrow::Cow;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tape::TapeProjector;

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
    /// `pollbox load`'s messages: the fields, then one `"cargo"` member made
    /// by [`pollbox_load::cargo_json`] (objects of a number, two strings and
    /// a nested object, in an array, then a long string): the end-to-end
    /// ingest benches' shape.
    Generator,
}

/// A message of exactly `size` bytes with `"key":"box-42","value":5,
/// "player":"p-7"` and cargo: nested objects and arrays, numbers, booleans,
/// nulls and escaped strings, so the skip path does real work.
fn message(size: usize, layout: Layout) -> Vec<u8> {
    const FIELDS: &str = r#""key":"box-42","value":5,"player":"p-7""#;
    if let Layout::Generator = layout {
        let head = format!("{{{FIELDS},\"cargo\":");
        let mut s = head.into_bytes();
        let cargo = pollbox_load::cargo_json(size - s.len() - 1);
        s.extend_from_slice(&cargo);
        s.push(b'}');
        assert_eq!(s.len(), size);
        assert!(serde_json::from_slice::<serde_json::Value>(&s).is_ok());
        return s;
    }
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
        Layout::FieldsLast | Layout::Generator => 10 + FIELDS.len(),
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

/// Either projector, with its own warm epoch.
struct Projection<P> {
    projector: P,
    arena: Arena,
    since_reset: usize,
}

trait Project {
    fn project<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        format: BodyFormat,
    ) -> Result<pollbox_core::projection::Batch<'a>, pollbox_core::projection::BodyError>;
}

impl Project for Projector {
    fn project<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        format: BodyFormat,
    ) -> Result<pollbox_core::projection::Batch<'a>, pollbox_core::projection::BodyError> {
        Projector::project(self, arena, body, format, KeySource::Body)
    }
}

impl Project for TapeProjector {
    fn project<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        format: BodyFormat,
    ) -> Result<pollbox_core::projection::Batch<'a>, pollbox_core::projection::BodyError> {
        TapeProjector::project(self, arena, body, format, KeySource::Body)
    }
}

impl<P: Project> Projection<P> {
    fn new(projector: P) -> Projection<P> {
        Projection {
            projector,
            arena: Arena::new(4 << 20, 64 << 20),
            since_reset: 0,
        }
    }

    /// Project one body and read what it found; a checksum, or `None` when
    /// the body was refused.
    fn try_run(&mut self, body: &[u8], format: BodyFormat) -> Option<i64> {
        if self.since_reset == MESSAGES_PER_EPOCH {
            self.arena.reset();
            self.since_reset = 0;
        }
        self.since_reset += 1;
        let batch = self
            .projector
            .project(self.arena.bump(), body, format)
            .ok()?;
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
        Some(sum)
    }

    fn run(&mut self, body: &[u8], format: BodyFormat) -> i64 {
        self.try_run(body, format).expect("bench body is valid")
    }
}

fn scanner() -> Projection<Projector> {
    Projection::new(Projector::new(Arc::new(Plan::default_plan())))
}

fn simd_json_tape() -> Projection<TapeProjector> {
    Projection::new(TapeProjector::new(Arc::new(Plan::default_plan())))
}

fn try_serde_json_value(body: &[u8]) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(
        v["key"].as_str().map_or(0, str::len) as i64
            + v["value"].as_i64().unwrap_or(0)
            + v["player"].as_str().map_or(0, str::len) as i64,
    )
}

/// The ordinary typed way: borrowed strings (owned only when escaped), the
/// cargo skipped by `IgnoredAny` (serde's default for unknown members).
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow)]
    key: Option<Cow<'a, str>>,
    value: Option<i64>,
    #[serde(borrow)]
    player: Option<Cow<'a, str>>,
}

fn try_serde_typed(body: &[u8]) -> Option<i64> {
    let m: Typed<'_> = serde_json::from_slice(body).ok()?;
    Some(
        m.key.map_or(0, |k| k.len()) as i64
            + m.value.unwrap_or(0)
            + m.player.map_or(0, |p| p.len()) as i64,
    )
}

// `IgnoredAny` is what serde uses for unknown members; named so the intent
// shows.
#[allow(dead_code)]
type Cargo = IgnoredAny;

fn try_sonic_rs_iter(body: &[u8]) -> Option<i64> {
    let mut sum = 0;
    for member in sonic_rs::to_object_iter(body) {
        let (name, value) = member.ok()?;
        match &*name {
            "key" | "player" => sum += value.as_str().map_or(0, str::len) as i64,
            "value" => sum += value.as_i64().unwrap_or(0),
            _ => {}
        }
    }
    Some(sum)
}

fn per_line(body: &[u8], f: fn(&[u8]) -> Option<i64>) -> i64 {
    body.split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| f(l).expect("bench body is valid"))
        .sum()
}

/// The pollbox projectors and serde_json's `Value` refuse a message whose
/// only fault is in the cargo (the others are noted when they do not), and
/// every candidate reads the valid one alike.
fn check_candidates(valid: &[u8]) {
    let text = String::from_utf8(valid.to_vec()).expect("ASCII bench body");
    let cargo = r#""c0":{"id":0,"#;
    assert!(text.contains(cargo));
    for fault in [
        r#""c0":{"id":01,"#,
        r#""c0":{"id":[1,],"#,
        r#""c0":{"id":"a\qb","#,
        r#""c0":{"id":"\ud800","#,
        "\"c0\":{\"id\":\"a\u{1}b\",",
        r#""c0":{"id":tru,"#,
    ] {
        let bad = text.replacen(cargo, fault, 1).into_bytes();
        let mut bytes = vec![bad.clone()];
        // Invalid UTF-8 in a cargo string.
        let mut utf8 = text.replacen(cargo, r#""c0":{"id":"ab","#, 1).into_bytes();
        if let Some(at) = utf8.windows(4).position(|w| w == b"\"ab\"") {
            utf8[at + 1] = 0xFF;
            bytes.push(utf8);
        }
        for bad in bytes {
            let show = String::from_utf8_lossy(&bad[..60.min(bad.len())]).into_owned();
            assert!(
                scanner().try_run(&bad, BodyFormat::Json).is_none(),
                "scanner {show}"
            );
            assert!(
                simd_json_tape().try_run(&bad, BodyFormat::Json).is_none(),
                "tape {show}"
            );
            assert!(try_serde_json_value(&bad).is_none(), "serde_json {show}");
            // The typed and sonic-rs ways skip cargo more loosely: say what
            // they let through (recorded in BENCHMARKS.md).
            if try_serde_typed(&bad).is_some() {
                eprintln!("note: serde_typed accepts {show:?}");
            }
            if try_sonic_rs_iter(&bad).is_some() {
                eprintln!("note: sonic_rs_iter accepts {show:?}");
            }
        }
    }
    let sum = scanner().run(valid, BodyFormat::Json);
    assert_eq!(simd_json_tape().run(valid, BodyFormat::Json), sum);
    assert_eq!(try_serde_json_value(valid), Some(sum));
    assert_eq!(try_serde_typed(valid), Some(sum));
    assert_eq!(try_sonic_rs_iter(valid), Some(sum));
}

const BODIES: [(&str, usize, Layout); 6] = [
    ("512B", 512, Layout::FieldsFirst),
    ("512B_fields_last", 512, Layout::FieldsLast),
    ("8KiB", 8192, Layout::FieldsFirst),
    ("8KiB_fields_last", 8192, Layout::FieldsLast),
    ("load_512B", 512, Layout::Generator),
    ("load_8KiB", 8192, Layout::Generator),
];

fn projection_msgs(c: &mut Criterion) {
    let mut group = c.benchmark_group("projection_msgs");
    for (label, size, layout) in BODIES {
        let body = message(size, layout);
        check_candidates(&body);
        group.throughput(Throughput::Elements(1));
        let mut p = scanner();
        group.bench_with_input(BenchmarkId::new("scanner", label), &body, |b, body| {
            b.iter(|| p.run(black_box(body), BodyFormat::Json))
        });
        let mut p = simd_json_tape();
        group.bench_with_input(
            BenchmarkId::new("simd_json_tape", label),
            &body,
            |b, body| b.iter(|| p.run(black_box(body), BodyFormat::Json)),
        );
        group.bench_with_input(
            BenchmarkId::new("sonic_rs_iter", label),
            &body,
            |b, body| b.iter(|| try_sonic_rs_iter(black_box(body))),
        );
        group.bench_with_input(
            BenchmarkId::new("serde_json_value", label),
            &body,
            |b, body| b.iter(|| try_serde_json_value(black_box(body))),
        );
        group.bench_with_input(BenchmarkId::new("serde_typed", label), &body, |b, body| {
            b.iter(|| try_serde_typed(black_box(body)))
        });
    }

    // A 32-message NDJSON batch; the serde and sonic candidates line by line.
    let line = message(512, Layout::FieldsFirst);
    let mut batch = Vec::new();
    for _ in 0..32 {
        batch.extend_from_slice(&line);
        batch.push(b'\n');
    }
    let label = "ndjson_32x512B";
    group.throughput(Throughput::Elements(32));
    let mut p = scanner();
    group.bench_with_input(BenchmarkId::new("scanner", label), &batch, |b, body| {
        b.iter(|| p.run(black_box(body), BodyFormat::Ndjson))
    });
    let mut p = simd_json_tape();
    group.bench_with_input(
        BenchmarkId::new("simd_json_tape", label),
        &batch,
        |b, body| b.iter(|| p.run(black_box(body), BodyFormat::Ndjson)),
    );
    group.bench_with_input(
        BenchmarkId::new("sonic_rs_iter", label),
        &batch,
        |b, body| b.iter(|| per_line(black_box(body), try_sonic_rs_iter)),
    );
    group.bench_with_input(
        BenchmarkId::new("serde_json_value", label),
        &batch,
        |b, body| b.iter(|| per_line(black_box(body), try_serde_json_value)),
    );
    group.bench_with_input(BenchmarkId::new("serde_typed", label), &batch, |b, body| {
        b.iter(|| per_line(black_box(body), try_serde_typed))
    });
    group.finish();
}

/// The cost of ending an epoch that held 100 projected 512 B messages: only
/// the reset is timed.
fn arena_reset(c: &mut Criterion) {
    let body = message(512, Layout::FieldsFirst);
    let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    let mut arena = Arena::new(4 << 20, 64 << 20);
    let mut group = c.benchmark_group("arena_reset");
    group.bench_function("reset_after_100x512B", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                for _ in 0..MESSAGES_PER_EPOCH {
                    let batch = projector
                        .project(arena.bump(), &body, BodyFormat::Json, KeySource::Body)
                        .expect("bench body is valid");
                    black_box(&batch);
                }
                let start = Instant::now();
                black_box(arena.reset());
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

criterion_group!(benches, projection_msgs, arena_reset);

/// One candidate on one body, `iters` times, outside criterion: for
/// `callgrind` instruction counts (`benches/projection/callgrind.sh` runs it
/// with two counts and takes the difference per message). The candidate
/// `dump` writes the body to stdout instead.
fn run_one(spec: &str) {
    type Runner = Box<dyn FnMut(&[u8]) -> i64>;
    let mut parts = spec.split(':');
    let (Some(candidate), Some(label), Some(iters)) = (parts.next(), parts.next(), parts.next())
    else {
        panic!("PROJECTION_CALLGRIND=candidate:body:iterations, got {spec:?}");
    };
    let iters: usize = iters.parse().expect("iterations");
    let (body, format) = if label == "ndjson_32x512B" {
        let line = message(512, Layout::FieldsFirst);
        let mut batch = Vec::new();
        for _ in 0..32 {
            batch.extend_from_slice(&line);
            batch.push(b'\n');
        }
        (batch, BodyFormat::Ndjson)
    } else {
        let (_, size, layout) = BODIES
            .into_iter()
            .find(|b| b.0 == label)
            .expect("body label");
        (message(size, layout), BodyFormat::Json)
    };
    if candidate == "dump" {
        // The body itself, for a reference parser outside this binary
        // (benches/simdjson-ref).
        std::io::Write::write_all(&mut std::io::stdout(), &body).expect("stdout");
        return;
    }
    let lines = |f: fn(&[u8]) -> Option<i64>| -> Runner {
        if format == BodyFormat::Ndjson {
            Box::new(move |b| per_line(b, f))
        } else {
            Box::new(move |b| f(b).expect("valid"))
        }
    };
    let mut run: Runner = match candidate {
        "scanner" => {
            let mut p = scanner();
            Box::new(move |b| p.run(b, format))
        }
        "simd_json_tape" => {
            let mut p = simd_json_tape();
            Box::new(move |b| p.run(b, format))
        }
        "sonic_rs_iter" => lines(try_sonic_rs_iter),
        "serde_json_value" => lines(try_serde_json_value),
        "serde_typed" => lines(try_serde_typed),
        _ => panic!("unknown candidate {candidate}"),
    };
    let mut sum = 0;
    for _ in 0..iters {
        sum += run(black_box(&body));
    }
    println!("{candidate} {label} {iters}: checksum {sum}");
}

fn main() {
    if let Ok(spec) = std::env::var("PROJECTION_CALLGRIND") {
        run_one(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
