//! Fuzz target `projection_diff`: the projection's validating scanner against
//! serde_json, on arbitrary bytes and on JSON-like text built from the fuzz
//! bytes.
//!
//! Input layout: byte 0 picks how the body is made:
//! - even: the rest of the input is the body, as is;
//! - odd: the rest drives a generator of JSON text that leans on the edges:
//!   strings with every escape, surrogate pairs and lone surrogates, raw
//!   UTF-8, control characters and invalid bytes; numbers at every edge of
//!   i64, u64 and f64 (and malformed ones); nesting around serde_json's
//!   recursion limit; member names from a small pool, escaped or not, so
//!   duplicates and configured paths are frequent; stray whitespace and
//!   single-byte corruptions.
//!
//! Properties, for each of three plans and for JSON, NDJSON and path-key
//! projection:
//! - `projection::validate` accepts exactly what `serde_json::from_slice::<
//!   Value>` accepts (serde_json without `arbitrary_precision`, rounding as
//!   with `float_roundtrip`: this crate turns `arbitrary_precision` on for
//!   the number texts, so the out-of-range refusal it drops is put back by
//!   parsing every number's text with `str::parse::<f64>`, which is correctly
//!   rounded);
//! - `projection::validate_split` (the cargo skip split in two, a second
//!   cursor speculating ahead) gives `validate`'s answer, error and offset
//!   included, at four split points drawn from the body;
//! - the projection agrees with a model built on serde_json plus a JSON
//!   pointer lookup with the projection's rules (null is absent, pointers go
//!   through objects only, the last duplicate wins): same verdict (invalid,
//!   not an object/array, or a batch), same shape and number of messages,
//!   same key and values (floats by their bits) or the same first error;
//! - nothing panics; error offsets lie within the body.
#![no_main]

#[path = "model.rs"]
mod model;

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use model::*;
use pollbox_core::arena::Arena;
use pollbox_core::config::{FieldType, Reduce};
use pollbox_core::plan::{FieldPlan, Plan};
use pollbox_core::projection::{self, BodyError, BodyFormat, KeySource, Projector};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let generated;
    let body: &[u8] = if mode & 1 == 0 {
        rest
    } else {
        generated = Gen::new(rest).body();
        &generated
    };
    check(body);
});

fn plans() -> &'static [Arc<Plan>] {
    static PLANS: OnceLock<Vec<Arc<Plan>>> = OnceLock::new();
    PLANS.get_or_init(|| {
        let f = |name: &str, path: &[&str], ty, max_len| FieldPlan {
            name: name.into(),
            path: path.iter().map(|s| s.to_string()).collect(),
            ty,
            reduce: Reduce::Last,
            max_len,
        };
        let plan = |key: &str, max_key: usize, fields| {
            Arc::new(Plan {
                key_field: key.into(),
                max_key_bytes: max_key,
                max_payload_bytes: 256,
                max_boxes: 1000,
                ttl_s: 0,
                rooms: true,
                fields,
            })
        };
        vec![
            Arc::new(Plan::default_plan()),
            plan(
                "k",
                8,
                vec![
                    f("f", &["value"], FieldType::F64, 0),
                    f("i", &["a", "b"], FieldType::I64, 0),
                    f("s", &["a", "c"], FieldType::Str, 4),
                    f("t", &["b"], FieldType::Bool, 0),
                ],
            ),
            plan(
                "a/b",
                128,
                vec![
                    f("x", &["a/b"], FieldType::F64, 0),
                    f("y", &["key", "value"], FieldType::Str, 64),
                    f("z", &["value"], FieldType::I64, 0),
                    f("w", &["\u{e9}", "a"], FieldType::Str, 2),
                ],
            ),
        ]
    })
}

fn check(body: &[u8]) {
    let show = || String::from_utf8_lossy(body).into_owned();
    // Validity of the whole text, whatever its top-level value.
    let serde_ok = matches!(parse(body), Parsed::Doc(_));
    let ours = projection::validate(body);
    assert_eq!(
        ours.is_ok(),
        serde_ok,
        "validate says {ours:?}, serde_json says {serde_ok} for {:?}",
        show()
    );
    if let Err(BodyError::InvalidJson { at, .. }) = ours {
        assert!(at <= body.len());
    }
    // The cargo skip split in two (a second, speculating cursor; large
    // containers only in the server) answers as one cursor does, error and
    // offset included, wherever the split falls. Split points from the
    // body's bytes, so the fuzzer steers them too.
    let seed = body
        .iter()
        .fold(body.len(), |h, &b| h.wrapping_mul(31) ^ usize::from(b));
    for k in 0..4 {
        let w = (seed >> (k * 3)) % 8;
        let target = (seed >> (k * 5 + 12)) % (body.len() + 1);
        let split = projection::validate_split(body, w, target);
        assert_eq!(
            split,
            ours,
            "split after {w} steps at {target}: {:?}",
            show()
        );
    }
    let mut arena = Arena::new(1 << 16, 16 << 20);
    for plan in plans() {
        let mut projector = Projector::new(plan.clone());
        for (format, keys) in [
            (BodyFormat::Json, KeySource::Body),
            (BodyFormat::Ndjson, KeySource::Body),
            (BodyFormat::Json, KeySource::Path),
        ] {
            {
                let got = projector.project(arena.bump(), body, format, keys);
                let expected = model_body(plan, body, format, keys);
                compare(body, &got, &expected, (format, keys));
            }
            arena.reset();
        }
    }
}

// ---- the projection against the model (model.rs) ----

fn compare(
    body: &[u8],
    got: &Result<projection::Batch<'_>, BodyError>,
    expected: &ModelBody,
    how: (BodyFormat, KeySource),
) {
    let show = || String::from_utf8_lossy(body).into_owned();
    match (got, expected) {
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
                    (Err(g), Err(m)) => assert_eq!(g, m, "{how:?} item {i} of {:?}", show()),
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

// ---- the generator ----

/// Member names as they appear in the text: plain, escaped, and the names
/// the plans look for.
const NAMES: [&str; 16] = [
    r#""key""#,
    r#""k""#,
    r#""value""#,
    r#""player""#,
    r#""a""#,
    r#""b""#,
    r#""c""#,
    r#""a/b""#,
    r#""a\/b""#,
    r#""k\u0065y""#,
    r#""\u0076alue""#,
    r#""\u00e9""#,
    "\"\u{e9}\"",
    r#""pl\u0061yer""#,
    r#""""#,
    r#""\ud83d\ude00""#,
];

const NUMBERS: [&str; 40] = [
    "0",
    "-0",
    "1",
    "-1",
    "5",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "-18446744073709551616",
    "123456789012345678901234567890",
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "1.7976931348623159e308",
    "-1.7976931348623159e308",
    "1e309",
    "2.2250738585072014e-308",
    "2.2250738585072011e-308",
    "4.9406564584124654e-324",
    "2.4703282292062327e-324",
    "2.4703282292062328e-324",
    "1e-400",
    "0e999999999999999999",
    "1e-999999999999999999",
    "0.1",
    "1.5",
    "5.0",
    "-0.0",
    "1e3",
    "-1E+2",
    "9007199254740993",
    "0.30000000000000004",
    "01",
    "1.",
    "-",
    "1e",
    ".5",
];

const STRING_PIECES: [&str; 24] = [
    "a",
    "box-42",
    "p-7",
    "\\n",
    "\\\"",
    "\\\\",
    "\\/",
    "\\b\\f\\r\\t",
    "\\u0041",
    "\\u00e9",
    "\\u20ac",
    "\\ud83d\\ude00",
    "\\uD834\\uDD1E",
    "\\ud800",
    "\\udc00",
    "\\ud800\\u0041",
    "\\u12",
    "\\x",
    "\u{e9}",
    "\u{20ac}",
    "\u{1f600}",
    "\u{7f}",
    "\t",
    "0123456789abcdef",
];

struct Gen<'a> {
    data: &'a [u8],
    at: usize,
    out: Vec<u8>,
}

impl<'a> Gen<'a> {
    fn new(data: &'a [u8]) -> Gen<'a> {
        Gen {
            data,
            at: 0,
            out: Vec::new(),
        }
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn body(mut self) -> Vec<u8> {
        let top = self.byte();
        match top % 4 {
            // NDJSON-ish: several lines.
            0 => {
                let lines = 1 + self.byte() % 4;
                for _ in 0..lines {
                    self.value(0);
                    if self.byte() % 4 == 0 {
                        self.out.push(b'\r');
                    }
                    self.out.push(b'\n');
                }
            }
            // A batch array of objects.
            1 => {
                self.out.push(b'[');
                let n = self.byte() % 4;
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.object(1);
                }
                self.out.push(b']');
            }
            // Deep nesting around the recursion limit.
            2 => {
                let depth = 120 + usize::from(self.byte() % 16);
                let array = self.byte() % 2 == 0;
                for _ in 0..depth {
                    self.out
                        .extend_from_slice(if array { b"[" } else { b"{\"a\":" });
                }
                self.value(depth);
                for _ in 0..depth {
                    self.out.push(if array { b']' } else { b'}' });
                }
            }
            _ => self.object(0),
        }
        // One corruption now and then: change, drop or insert a byte.
        let how = self.byte();
        if how % 4 == 0 && !self.out.is_empty() {
            let pos = usize::from(self.byte()) * 7 % self.out.len();
            let b = self.byte();
            match how / 4 % 3 {
                0 => self.out[pos] = b,
                1 => {
                    self.out.remove(pos);
                }
                _ => self.out.insert(pos, b),
            }
        }
        self.out
    }

    fn ws(&mut self) {
        if self.byte() % 8 == 0 {
            let w = [b' ', b'\t', b'\n', b'\r', 0x0c, b' ', b' ', 0xa0];
            let pick = usize::from(self.byte() % 8);
            self.out.push(w[pick]);
        }
    }

    fn object(&mut self, depth: usize) {
        self.out.push(b'{');
        let n = self.byte() % 6;
        for i in 0..n {
            if i > 0 {
                self.out.push(b',');
            }
            self.ws();
            let b = self.byte();
            if b == 255 {
                self.string();
            } else {
                self.out
                    .extend_from_slice(NAMES[usize::from(b) % NAMES.len()].as_bytes());
            }
            self.ws();
            self.out.push(b':');
            self.value(depth + 1);
        }
        self.ws();
        self.out.push(b'}');
    }

    fn value(&mut self, depth: usize) {
        self.ws();
        let kind = if self.done() || depth > 140 {
            6
        } else {
            self.byte() % 10
        };
        match kind {
            0 | 1 => self.object(depth),
            2 => {
                self.out.push(b'[');
                let n = self.byte() % 4;
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.value(depth + 1);
                }
                self.out.push(b']');
            }
            3 | 4 => self.string(),
            5 => self.number(),
            6 => {
                let n = NUMBERS[usize::from(self.byte()) % NUMBERS.len()];
                self.out.extend_from_slice(n.as_bytes());
            }
            _ => {
                let lits = ["true", "false", "null", "tru", "nul", "True"];
                let l = lits[usize::from(self.byte()) % lits.len()];
                self.out.extend_from_slice(l.as_bytes());
            }
        }
        self.ws();
    }

    /// A number from parts: sign, integer digits, fraction, exponent.
    fn number(&mut self) {
        let shape = self.byte();
        if shape & 1 != 0 {
            self.out.push(b'-');
        }
        let digits = 1 + usize::from(self.byte() % 24);
        for i in 0..digits {
            let d = self.byte() % 10;
            self.out.push(if i == 0 && digits > 1 {
                b'1' + d % 9
            } else {
                b'0' + d
            });
        }
        if shape & 2 != 0 {
            self.out.push(b'.');
            for _ in 0..1 + self.byte() % 20 {
                let d = self.byte() % 10;
                self.out.push(b'0' + d);
            }
        }
        if shape & 4 != 0 {
            self.out.push(if shape & 8 != 0 { b'e' } else { b'E' });
            match shape >> 4 & 3 {
                0 => self.out.push(b'-'),
                1 => self.out.push(b'+'),
                _ => {}
            }
            let e = u32::from(self.byte()) * u32::from(self.byte() % 4 + 1);
            self.out.extend_from_slice(e.to_string().as_bytes());
        }
    }

    fn string(&mut self) {
        self.out.push(b'"');
        let n = self.byte() % 6;
        for _ in 0..n {
            let b = self.byte();
            match b {
                0..=239 => {
                    let p = STRING_PIECES[usize::from(b) % STRING_PIECES.len()];
                    self.out.extend_from_slice(p.as_bytes());
                }
                240..=247 => {
                    let u = u16::from_le_bytes([self.byte(), self.byte()]);
                    self.out.extend_from_slice(format!("\\u{u:04x}").as_bytes());
                }
                // Raw bytes: control characters, stray continuation and
                // lead bytes, 0xFF.
                _ => {
                    let raw = [0x00, 0x1f, 0x80, 0xc3, 0xed, 0xf4, 0xff, b'"'];
                    self.out.push(raw[usize::from(b - 248)]);
                }
            }
        }
        self.out.push(b'"');
    }
}
