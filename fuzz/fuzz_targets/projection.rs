//! Fuzz target `projection`: any body under any valid `[boxes]` config,
//! projected as JSON and NDJSON with keys from the body and from the path, and
//! every accepted message applied to a [`BoxTable`].
//!
//! Input layout: a small config derived from the first bytes, the rest is the
//! body.
//! - byte 0: field count (bits 0-1, 1 to 4), `key_field` (bits 2-3), arena
//!   limit (bits 4-5), `max_boxes` (bits 6-7);
//! - byte 1: `max_key_bytes` (1 to 16, or 128 with the top bit);
//! - byte 2: `max_payload_bytes` (16 + byte, raised to what the fields need
//!   at their widest: the config check's rule);
//! - byte 3: the key a `POST /v1/boxes/{key}` would carry;
//! - two bytes per field: type, reducer, JSON pointer, `max_len`, name.
//!
//! Properties:
//! - nothing panics, whatever the body, config or arena limit;
//! - the projection agrees with a model built on `serde_json`: a body the
//!   projection accepts is valid JSON; same top-level shape, same number of
//!   messages, same key, same values or the same first error per message
//!   (out-of-range numbers and serde_json's recursion limit included: the
//!   projection follows serde_json there);
//! - the box table agrees with a model of the reducers: same accept/reject
//!   decision, same version, and a payload byte-for-byte equal to the model's
//!   rendering, valid JSON, within `max_payload_bytes`; a poll returns it.
#![no_main]

#[path = "model.rs"]
mod model;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use model::*;
use pollbox_core::arena::Arena;
use pollbox_core::boxes::BoxTable;
use pollbox_core::config::{largest_payload, BoxesConfig, Config, FieldConfig, FieldType, Reduce};
use pollbox_core::plan::{MessageError, Plan, Value};
use pollbox_core::projection::{BodyError, BodyFormat, KeySource, Projector};
use serde_json::Value as Json;

const KEY_FIELDS: [&str; 4] = ["key", "k", "a", "value"];
const POINTERS: [&str; 8] = [
    "/value", "/player", "/key", "/a", "/a/b", "/", "/a~1b", "/a/b/c",
];
const TYPES: [FieldType; 4] = [
    FieldType::I64,
    FieldType::F64,
    FieldType::Bool,
    FieldType::Str,
];
const REDUCERS: [Reduce; 5] = [
    Reduce::Last,
    Reduce::Sum,
    Reduce::Min,
    Reduce::Max,
    Reduce::Count,
];
const NAMES: [[&str; 4]; 2] = [["v", "sum", "n", "by"], ["a-b_", "key", "value", "X9"]];
const ARENA_LIMITS: [usize; 4] = [2048, 16 * 1024, 1 << 20, 1 << 20];
const MAX_BOXES: [usize; 4] = [1, 2, 5, 1000];
const PATH_KEYS: [&str; 8] = [
    "p",
    "box-42",
    "",
    "q\"\\\u{1}\u{7f}\u{e9}/",
    "kkkkkkkkkkkkkkkkkkkk",
    "a",
    "\u{2028}\t",
    "x y",
];

struct Setup {
    plan: Arc<Plan>,
    arena_limit: usize,
    path_key: &'static str,
}

fuzz_target!(|data: &[u8]| {
    let Some((setup, body)) = setup(data) else {
        return;
    };
    let plan = setup.plan;
    let mut projector = Projector::new(plan.clone());
    let mut arena = Arena::new(setup.arena_limit.min(4096), setup.arena_limit);
    let table = BoxTable::new(plan.clone());
    let mut model = TableModel::default();
    for (format, keys) in [
        (BodyFormat::Json, KeySource::Body),
        (BodyFormat::Ndjson, KeySource::Body),
        (BodyFormat::Json, KeySource::Path),
        (BodyFormat::Ndjson, KeySource::Path),
    ] {
        {
            let got = projector.project(arena.bump(), body, format, keys);
            let expected = model_body(&plan, body, format, keys);
            check_projection(
                &plan,
                body,
                &got,
                &expected,
                setup.arena_limit,
                (format, keys),
            );
            if let Ok(batch) = &got {
                for item in batch.items.iter() {
                    let Ok(msg) = item else { continue };
                    let key = match keys {
                        KeySource::Body => msg.key,
                        KeySource::Path => setup.path_key,
                    };
                    check_apply(&plan, &table, &mut model, key, msg.values);
                }
            }
        }
        arena.reset();
    }
    assert_eq!(table.len(), model.boxes.len());
});

fn setup(data: &[u8]) -> Option<(Setup, &[u8])> {
    let (&[b0, b1, b2, b3], rest) = data.split_first_chunk::<4>()?;
    let n = usize::from(b0 & 3) + 1;
    if rest.len() < 2 * n {
        return None;
    }
    let (field_bytes, body) = rest.split_at(2 * n);
    let max_payload_bytes = 16 + usize::from(b2);
    let mut boxes = BoxesConfig {
        key_field: KEY_FIELDS[usize::from((b0 >> 2) & 3)].into(),
        max_key_bytes: if b1 & 0x80 != 0 {
            128
        } else {
            1 + usize::from(b1 & 0x0f)
        },
        max_boxes: MAX_BOXES[usize::from(b0 >> 6)],
        max_payload_bytes,
        ttl_s: 0,
        // Both ways: the key order kept for rooms, and none.
        rooms: b3 & 8 != 0,
        fields: Vec::new(),
    };
    for (i, fb) in field_bytes.chunks_exact(2).enumerate() {
        let reduce = REDUCERS[usize::from((fb[0] >> 2) & 7) % REDUCERS.len()];
        let mut ty = TYPES[usize::from(fb[0] & 3)];
        if matches!(reduce, Reduce::Sum | Reduce::Min | Reduce::Max)
            && !matches!(ty, FieldType::I64 | FieldType::F64)
        {
            // Only numbers sum, min and max: keep the config valid.
            ty = if ty == FieldType::Bool {
                FieldType::I64
            } else {
                FieldType::F64
            };
        }
        let field = if reduce == Reduce::Count {
            FieldConfig {
                name: NAMES[usize::from(fb[1] >> 7)][i].into(),
                path: None,
                ty: None,
                max_len: None,
                reduce,
            }
        } else {
            FieldConfig {
                name: NAMES[usize::from(fb[1] >> 7)][i].into(),
                path: Some(POINTERS[usize::from(fb[0] >> 5)].into()),
                ty: Some(ty),
                max_len: (ty == FieldType::Str)
                    .then(|| 1 + usize::from(fb[1] & 0x7f) % max_payload_bytes),
                reduce,
            }
        };
        boxes.fields.push(field);
    }
    // The config check refuses fields whose widest values cannot fit the
    // payload limit with an empty key; a long key or escapes still can pass
    // it, so payloads over the limit stay reachable.
    boxes.max_payload_bytes = boxes.max_payload_bytes.max(largest_payload(&boxes));
    static EMBEDDED: OnceLock<Config> = OnceLock::new();
    let mut config = EMBEDDED.get_or_init(Config::embedded).clone();
    config.boxes = boxes;
    if let Err(e) = config.validate() {
        panic!(
            "the harness built an invalid config: {e}\n{:#?}",
            config.boxes
        );
    }
    let plan = Plan::compile(&config.boxes).ok()?;
    Some((
        Setup {
            plan: Arc::new(plan),
            arena_limit: ARENA_LIMITS[usize::from((b0 >> 4) & 3)],
            path_key: PATH_KEYS[usize::from(b3 & 7)],
        },
        body,
    ))
}

// ---- the projection against its model ----

fn check_projection(
    plan: &Plan,
    body: &[u8],
    got: &Result<pollbox_core::projection::Batch<'_>, BodyError>,
    expected: &ModelBody,
    arena_limit: usize,
    how: (BodyFormat, KeySource),
) {
    let show = || String::from_utf8_lossy(body).into_owned();
    if let Err(e) = got {
        let mut text = Vec::new();
        e.write_message(&mut text);
        assert!(
            text.iter()
                .all(|&b| b.is_ascii() && b != b'"' && b != b'\\'),
            "{e:?} message needs escaping"
        );
        assert!(matches!(e.status(), 400 | 503));
    }
    match (got, expected) {
        (Err(BodyError::ArenaFull), _) => {
            // A body this small fits a 1 MiB arena many times over.
            assert!(
                arena_limit < (1 << 20) || body.len() > 64 * 1024,
                "arena full for a {}-byte body under a 1 MiB limit",
                body.len()
            );
        }
        (Err(BodyError::InvalidJson { at, .. }), ModelBody::Invalid) => {
            assert!(*at <= body.len(), "error offset {at} past the body");
        }
        (Err(BodyError::NotObjectOrArray), ModelBody::NotObjectOrArray) => {}
        (Ok(batch), ModelBody::Ok { shape, items }) => {
            assert_eq!(batch.shape, *shape, "{how:?} {:?}", show());
            assert_eq!(batch.items.len(), items.len(), "{how:?} {:?}", show());
            for (i, (g, m)) in batch.items.iter().zip(items).enumerate() {
                match (g, m) {
                    (Ok(msg), Ok((key, values))) => {
                        if let Some(key) = key {
                            assert_eq!(msg.key, key, "{how:?} item {i} of {:?}", show());
                        }
                        let got_values: Vec<_> = msg.values.iter().map(to_model).collect();
                        assert!(
                            same_values(&got_values, values),
                            "{how:?} item {i} of {:?}: projection {got_values:?}, model {values:?}",
                            show()
                        );
                    }
                    (Err(g), Err(m)) => {
                        assert_eq!(g, m, "{how:?} item {i} of {:?}", show());
                        let mut reason = Vec::new();
                        g.write_reason(plan, &mut reason);
                        assert!(!reason.is_empty());
                    }
                    _ => panic!(
                        "{how:?} item {i} of {:?}: projection {g:?}, model {m:?}",
                        show()
                    ),
                }
            }
        }
        _ => panic!(
            "{how:?}: projection says {:?}, serde_json model says {expected:?} for {:?}",
            got.as_ref().map(|b| b.shape),
            show()
        ),
    }
}

// ---- the box table, modelled ----

#[derive(Debug, Clone, PartialEq)]
enum MState {
    Unset,
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Count(u64),
}

#[derive(Default)]
struct TableModel {
    boxes: HashMap<String, (u64, Vec<MState>)>,
}

impl TableModel {
    /// docs/boxes.md#reducers: the reducers, `max_payload_bytes`, `max_boxes`; a
    /// rejected message changes nothing. Returns the new version and payload.
    fn apply(
        &mut self,
        plan: &Plan,
        key: &str,
        values: &[Option<MVal>],
    ) -> Result<(u64, Vec<u8>), MessageError> {
        if key.is_empty() {
            return Err(MessageError::EmptyKey);
        }
        if key.len() > plan.max_key_bytes {
            return Err(MessageError::KeyTooLong);
        }
        let (old_version, old) = match self.boxes.get(key) {
            Some((v, s)) => (*v, s.clone()),
            None => (0, vec![MState::Unset; plan.fields.len()]),
        };
        let mut next = Vec::with_capacity(plan.fields.len());
        for (i, f) in plan.fields.iter().enumerate() {
            let field = u16::try_from(i).unwrap_or(u16::MAX);
            let prev = old[i].clone();
            if f.reduce == Reduce::Count {
                let n = match prev {
                    MState::Count(n) => n,
                    _ => 0,
                };
                next.push(MState::Count(n.saturating_add(1)));
                continue;
            }
            let Some(value) = values.get(i).cloned().flatten() else {
                next.push(prev);
                continue;
            };
            let typed = match (f.ty, value) {
                (FieldType::I64, MVal::I64(v)) => MState::I64(v),
                (FieldType::F64, MVal::F64(v)) if v.is_finite() => MState::F64(v),
                (FieldType::F64, MVal::I64(v)) => MState::F64(v as f64),
                (FieldType::Bool, MVal::Bool(b)) => MState::Bool(b),
                (FieldType::Str, MVal::Str(s)) if s.len() > f.max_len => {
                    return Err(MessageError::StringTooLong { field })
                }
                (FieldType::Str, MVal::Str(s)) => MState::Str(s),
                _ => return Err(MessageError::WrongType { field }),
            };
            let reduced = match (f.reduce, prev, typed) {
                (Reduce::Sum, MState::I64(a), MState::I64(b)) => MState::I64(
                    a.checked_add(b)
                        .ok_or(MessageError::SumOverflow { field })?,
                ),
                (Reduce::Sum, MState::F64(a), MState::F64(b)) => {
                    let s = a + b;
                    if !s.is_finite() {
                        return Err(MessageError::SumOverflow { field });
                    }
                    MState::F64(s)
                }
                (Reduce::Min, MState::I64(a), MState::I64(b)) => MState::I64(a.min(b)),
                (Reduce::Max, MState::I64(a), MState::I64(b)) => MState::I64(a.max(b)),
                (Reduce::Min, MState::F64(a), MState::F64(b)) => {
                    MState::F64(if b < a { b } else { a })
                }
                (Reduce::Max, MState::F64(a), MState::F64(b)) => {
                    MState::F64(if b > a { b } else { a })
                }
                (_, _, t) => t,
            };
            next.push(reduced);
        }
        let version = old_version + 1;
        let payload = render(plan, key, version, &next);
        if payload.len() > plan.max_payload_bytes {
            return Err(MessageError::PayloadTooLarge);
        }
        if old_version == 0 && self.boxes.len() >= plan.max_boxes {
            return Err(MessageError::TooManyBoxes);
        }
        self.boxes.insert(key.to_owned(), (version, next));
        Ok((version, payload))
    }
}

/// The payload of docs/boxes.md#payloads: strings with serde_json's escaping
/// (`\n`-style short escapes, `\u00XX` for other control characters, UTF-8 kept),
/// floats in their shortest round-trip form (ryu's, as `render.rs` promises).
fn render(plan: &Plan, key: &str, version: u64, state: &[MState]) -> Vec<u8> {
    let string = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut out = format!("{{\"k\":{},\"ver\":{version}", string(key));
    for (f, s) in plan.fields.iter().zip(state) {
        let v = match s {
            MState::Unset => continue,
            MState::I64(v) => v.to_string(),
            MState::Count(n) => n.to_string(),
            MState::F64(x) => ryu::Buffer::new().format_finite(*x).to_owned(),
            MState::Bool(b) => b.to_string(),
            MState::Str(s) => string(s),
        };
        out.push(',');
        out.push_str(&string(&f.name));
        out.push(':');
        out.push_str(&v);
    }
    out.push('}');
    out.into_bytes()
}

fn check_apply(
    plan: &Plan,
    table: &BoxTable,
    model: &mut TableModel,
    key: &str,
    values: &[Option<Value<'_>>],
) {
    let model_values: Vec<_> = values.iter().map(to_model).collect();
    let mut out = Vec::new();
    let got = table.apply(key, values, 0, Some(&mut out));
    let expected = model.apply(plan, key, &model_values);
    match (&got, &expected) {
        (Ok(version), Ok((v, payload))) => {
            assert_eq!(version, v, "version of {key:?}");
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(payload),
                "payload of {key:?} after {model_values:?}"
            );
            assert!(out.len() <= plan.max_payload_bytes);
            let parsed: Json = serde_json::from_slice(&out).unwrap_or_else(|e| {
                panic!(
                    "payload is not JSON ({e}): {:?}",
                    String::from_utf8_lossy(&out)
                )
            });
            assert_eq!(parsed.get("k").and_then(Json::as_str), Some(key));
            // Every float reads back as the very value stored.
            let state = &model.boxes[key].1;
            for (f, s) in plan.fields.iter().zip(state) {
                if let MState::F64(x) = s {
                    let text = parsed.get(&f.name).map(Json::to_string).unwrap_or_default();
                    let back = text.parse::<f64>().map(f64::to_bits);
                    assert_eq!(back, Ok(x.to_bits()), "{} rendered as {text}", f.name);
                }
            }
            let mut polled = Vec::new();
            assert_eq!(table.poll(key.as_bytes(), &mut polled), Some(*version));
            assert_eq!(polled, out, "poll differs from the ingest answer");
        }
        (Err(g), Err(m)) => {
            assert_eq!(g, m, "{key:?} {model_values:?}");
            assert!(out.is_empty(), "a rejected message wrote a payload");
        }
        _ => panic!(
            "apply {key:?} {model_values:?}: table {got:?}, model {:?}",
            expected.as_ref().map(|(v, _)| v)
        ),
    }
}
