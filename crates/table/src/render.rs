//! Payload rendering (docs/boxes.md#payloads).
//!
//! This module owns the byte form of a box's payload,
//! `{"k":"box-42","ver":2,"v":5,"sum":12,"n":2,"by":"p-7"}`, and the per-field
//! state it is rendered from ([`FieldState`], owned, and [`FieldView`], its
//! borrowed twin the box table renders from without allocating).
//!
//! A payload is rendered once per accepted message, never per poll: compact,
//! `k` then `ver` then the fields in plan order, fields never set left out.

use crate::config::FieldType;
use crate::plan::{FieldPlan, Plan};

/// The reduced state of one field of one box.
///
/// `Count` is the message count of a `count` field; the other variants hold the
/// field's configured type. Non-finite `F64` values are never stored (the box
/// table rejects them), so rendering never has to invent a number.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum FieldState {
    /// Never set: left out of the payload.
    #[default]
    Unset,
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(Box<str>),
    Count(u64),
}

/// A borrowed [`FieldState`]: what the renderer reads. Strings borrow from the
/// box table's storage or from the message being applied.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FieldView<'a> {
    #[default]
    Unset,
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(&'a str),
    Count(u64),
}

impl FieldState {
    /// The borrowed form of this state.
    pub fn view(&self) -> FieldView<'_> {
        match self {
            FieldState::Unset => FieldView::Unset,
            FieldState::I64(v) => FieldView::I64(*v),
            FieldState::F64(v) => FieldView::F64(*v),
            FieldState::Bool(v) => FieldView::Bool(*v),
            FieldState::Str(s) => FieldView::Str(s),
            FieldState::Count(n) => FieldView::Count(*n),
        }
    }

    /// Whether this state may be held by a field of type `ty` (`count` fields
    /// hold [`FieldState::Count`]). `Unset` fits every field.
    pub fn fits(&self, ty: FieldType, is_count: bool) -> bool {
        self.view().fits(ty, is_count)
    }
}

impl FieldView<'_> {
    /// The owned form of this view (allocates for strings).
    pub fn to_state(self) -> FieldState {
        match self {
            FieldView::Unset => FieldState::Unset,
            FieldView::I64(v) => FieldState::I64(v),
            FieldView::F64(v) => FieldState::F64(v),
            FieldView::Bool(v) => FieldState::Bool(v),
            FieldView::Str(s) => FieldState::Str(s.into()),
            FieldView::Count(n) => FieldState::Count(n),
        }
    }

    /// See [`FieldState::fits`].
    pub fn fits(self, ty: FieldType, is_count: bool) -> bool {
        match self {
            FieldView::Unset => true,
            FieldView::Count(_) => is_count,
            FieldView::I64(_) => !is_count && ty == FieldType::I64,
            FieldView::F64(v) => !is_count && ty == FieldType::F64 && v.is_finite(),
            FieldView::Bool(_) => !is_count && ty == FieldType::Bool,
            FieldView::Str(_) => !is_count && ty == FieldType::Str,
        }
    }
}

/// Append the payload of box `key` at `version` with `state` (one entry per
/// plan field, in plan order) to `out`.
pub fn render_payload(
    plan: &Plan,
    key: &str,
    version: u64,
    state: &[FieldState],
    out: &mut Vec<u8>,
) {
    render_fields(plan, key, version, state.iter().map(FieldState::view), out);
}

/// [`render_payload`] over borrowed states, so the box table can render straight
/// from its compact storage. States past the plan's field count are ignored;
/// missing ones count as unset.
pub fn render_fields<'a>(
    plan: &Plan,
    key: &str,
    version: u64,
    state: impl IntoIterator<Item = FieldView<'a>>,
    out: &mut Vec<u8>,
) {
    render_head(key, version, out);
    for (field, value) in plan.fields.iter().zip(state) {
        render_field(field, value, out);
    }
    out.push(b'}');
}

/// The start of a payload: `{"k":` key `,"ver":` version. Then each field
/// ([`render_field`]), then `}`: [`render_fields`] in pieces, for a caller
/// that makes the values one at a time.
#[inline]
pub fn render_head(key: &str, version: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"k\":");
    write_json_str(key, out);
    out.extend_from_slice(b",\"ver\":");
    out.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
}

/// One field of a payload: `,` name `:` value, or nothing when it is unset.
#[inline]
pub fn render_field(field: &FieldPlan, value: FieldView<'_>, out: &mut Vec<u8>) {
    if value == FieldView::Unset {
        return;
    }
    write_field_head(field, out);
    write_value(value, out);
}

/// The part of [`render_field`] before the value: `,` name `:` (the same in
/// every payload: the box table renders it once per field).
pub(crate) fn write_field_head(field: &FieldPlan, out: &mut Vec<u8>) {
    out.extend_from_slice(b",");
    // Field names are validated as [A-Za-z0-9_-] by the config, but the
    // renderer does not rely on that for the output to be valid JSON.
    write_json_str(&field.name, out);
    out.push(b':');
}

/// The length of what [`render_fields`] would append, computed without
/// writing it (lazy rendering checks max_payload_bytes and sizes the record
/// with it; only an `f64` is formatted, into a buffer on the stack).
pub fn rendered_len<'a>(
    plan: &Plan,
    key: &str,
    version: u64,
    state: impl IntoIterator<Item = FieldView<'a>>,
) -> usize {
    let fields: usize = plan
        .fields
        .iter()
        .zip(state)
        .map(|(field, value)| rendered_field_len(field, value))
        .sum();
    rendered_head_len(key, version) + fields
}

/// The part of [`rendered_len`] that is not about fields: `{"k":` key
/// `,"ver":` version `}`.
#[inline]
pub fn rendered_head_len(key: &str, version: u64) -> usize {
    5 + json_str_len(key) + 7 + dec_len(version) + 1
}

/// What one field adds to [`rendered_len`]: `,` name `:` value, or nothing
/// when it is unset.
#[inline]
pub fn rendered_field_len(field: &FieldPlan, value: FieldView<'_>) -> usize {
    if value == FieldView::Unset {
        return 0;
    }
    field_head_len(field) + value_len(value)
}

/// What `,` name `:` of a set field adds to [`rendered_len`] (the same for
/// every payload: the box table works it out once per field).
pub(crate) fn field_head_len(field: &FieldPlan) -> usize {
    1 + json_str_len(&field.name) + 1
}

/// Decimal digits of `v`: the number of bits gives the digits to within
/// one (`bits * 1233 / 4096` is `bits * log10(2)` rounded down), and one
/// comparison with a power of ten settles it.
#[inline]
fn dec_len(v: u64) -> usize {
    /// `POW10[t]` is the least number with `t + 1` digits (0 for `t` = 0).
    const POW10: [u64; 20] = {
        let mut t = [0u64; 20];
        let mut i = 1;
        let mut p = 10u64;
        while i < 20 {
            t[i] = p;
            p = p.wrapping_mul(10);
            i += 1;
        }
        t
    };
    let bits = u64::BITS - (v | 1).leading_zeros();
    let t = ((bits * 1233) >> 12) as usize;
    // `bits` is 1..=64, so `t` is 0..=19 (`min` only spares a bounds check).
    t + usize::from(v >= POW10[t.min(19)])
}

/// What a set field's value adds to [`rendered_len`].
#[inline(always)]
pub(crate) fn value_len(value: FieldView<'_>) -> usize {
    match value {
        FieldView::Unset => 4,
        FieldView::I64(v) => usize::from(v < 0) + dec_len(v.unsigned_abs()),
        FieldView::Count(n) => dec_len(n),
        FieldView::F64(v) if v.is_finite() => ryu::Buffer::new().format_finite(v).len(),
        FieldView::F64(_) => 4,
        FieldView::Bool(true) => 4,
        FieldView::Bool(false) => 5,
        FieldView::Str(s) => json_str_len(s),
    }
}

/// What [`write_json_str`] appends for `s`, in bytes.
#[inline]
fn json_str_len(s: &str) -> usize {
    // Most strings (keys, names) need no escape: one pass that finds none.
    if !needs_escape(s.as_bytes()) {
        return 2 + s.len();
    }
    escaped_json_str_len(s)
}

/// Whether any byte of `b` is escaped in a JSON string (below 0x20, `"`,
/// `\`), looked for eight bytes at a time: in words read from `b` (the last
/// one overlapping the one before; for fewer than eight bytes, made of two
/// overlapping halves, or quarters).
#[inline]
fn needs_escape(b: &[u8]) -> bool {
    let n = b.len();
    if n >= 8 {
        let (words, _) = b.as_chunks::<8>();
        let last = b.last_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w));
        return words
            .iter()
            .any(|w| word_needs_escape(u64::from_le_bytes(*w)))
            || word_needs_escape(last);
    }
    let w = if n >= 4 {
        let lo = b.first_chunk::<4>().map_or(0, |c| u32::from_le_bytes(*c));
        let hi = b.last_chunk::<4>().map_or(0, |c| u32::from_le_bytes(*c));
        u64::from(lo) | u64::from(hi) << 32
    } else if n >= 2 {
        let lo = b.first_chunk::<2>().map_or(0, |c| u16::from_le_bytes(*c));
        let hi = b.last_chunk::<2>().map_or(0, |c| u16::from_le_bytes(*c));
        (u64::from(lo) | u64::from(hi) << 16) * 0x0000_0001_0000_0001
    } else if let Some(&c) = b.first() {
        u64::from(c) * ONES
    } else {
        return false;
    };
    word_needs_escape(w)
}

const ONES: u64 = 0x0101_0101_0101_0101;

/// Whether a byte of `w` is below 0x20, `"` or `\` (the classic
/// has-a-byte-less-than test, exact as a yes or no).
#[inline(always)]
fn word_needs_escape(w: u64) -> bool {
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x;
    (below(w, 0x20) | below(quote, 1) | below(backslash, 1)) & (ONES * 0x80) != 0
}

/// [`json_str_len`] of a string with something to escape.
fn escaped_json_str_len(s: &str) -> usize {
    let escaped: usize = s
        .bytes()
        .map(|b| match ESCAPE[b as usize] {
            0 => 0,
            b'u' => 5,
            _ => 1,
        })
        .sum();
    2 + s.len() + escaped
}

/// A set field's value, as [`render_field`] writes it.
#[inline]
pub(crate) fn write_value(value: FieldView<'_>, out: &mut Vec<u8>) {
    match value {
        FieldView::Unset => out.extend_from_slice(b"null"),
        FieldView::I64(v) => out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes()),
        FieldView::Count(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        FieldView::F64(v) if v.is_finite() => {
            out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes())
        }
        // Never stored (see FieldState); `null` keeps the payload valid JSON.
        FieldView::F64(_) => out.extend_from_slice(b"null"),
        FieldView::Bool(true) => out.extend_from_slice(b"true"),
        FieldView::Bool(false) => out.extend_from_slice(b"false"),
        FieldView::Str(s) => write_json_str(s, out),
    }
}

/// What a byte turns into inside a JSON string: 0 = itself, `u` = `\u00XX`,
/// anything else = that letter after a backslash.
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Append `s` as a quoted JSON string: `"` and `\` escaped, control characters
/// as `\n`, `\t`, ... or `\u00XX`, every other character (UTF-8 included) as is.
/// Whether [`write_json_str`] writes `s` as it is, between quotes (nothing
/// in it to escape).
#[inline]
pub(crate) fn is_plain_json_str(s: &str) -> bool {
    s.bytes().all(|b| ESCAPE[b as usize] == 0)
}

pub fn write_json_str(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc = ESCAPE[b as usize];
        if esc == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if esc == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', esc]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Reduce;

    fn render(plan: &Plan, key: &str, version: u64, state: &[FieldState]) -> String {
        let mut out = Vec::new();
        render_payload(plan, key, version, state, &mut out);
        String::from_utf8(out).expect("payload is UTF-8")
    }

    fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
        FieldPlan {
            name: name.into(),
            path: vec![name.into()],
            ty,
            reduce,
            max_len: 64,
        }
    }

    fn plan_of(fields: Vec<FieldPlan>) -> Plan {
        Plan {
            key_field: "key".into(),
            max_key_bytes: 128,
            max_payload_bytes: 256,
            max_boxes: 100,
            ttl_s: 0,
            rooms: true,
            fields,
        }
    }

    #[test]
    fn spec_example_byte_for_byte() {
        let plan = Plan::default_plan();
        let state = [
            FieldState::I64(5),
            FieldState::I64(12),
            FieldState::Count(2),
            FieldState::Str("p-7".into()),
        ];
        assert_eq!(
            render(&plan, "box-42", 2, &state),
            r#"{"k":"box-42","ver":2,"v":5,"sum":12,"n":2,"by":"p-7"}"#
        );
    }

    #[test]
    fn never_set_fields_are_left_out() {
        let plan = Plan::default_plan();
        let state = [
            FieldState::I64(-3),
            FieldState::Unset,
            FieldState::Count(1),
            FieldState::Unset,
        ];
        assert_eq!(
            render(&plan, "a", 1, &state),
            r#"{"k":"a","ver":1,"v":-3,"n":1}"#
        );
        assert_eq!(render(&plan, "a", 1, &[]), r#"{"k":"a","ver":1}"#);
    }

    #[test]
    fn every_type_renders() {
        let plan = plan_of(vec![
            field("i", FieldType::I64, Reduce::Last),
            field("f", FieldType::F64, Reduce::Last),
            field("t", FieldType::Bool, Reduce::Last),
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
        ]);
        let state = [
            FieldState::I64(i64::MIN),
            FieldState::F64(0.1),
            FieldState::Bool(true),
            FieldState::Bool(false),
            FieldState::Str("x".into()),
        ];
        assert_eq!(
            render(&plan, "k", u64::MAX, &state),
            format!(
                r#"{{"k":"k","ver":{},"i":-9223372036854775808,"f":0.1,"t":true,"b":false,"s":"x"}}"#,
                u64::MAX
            )
        );
    }

    #[test]
    fn f64_is_shortest_round_trip_and_valid_json() {
        let plan = plan_of(vec![field("f", FieldType::F64, Reduce::Last)]);
        for x in [
            0.0,
            -0.0,
            1.0,
            1.5e300,
            5e-324,
            -2.5,
            1e21,
            123456.789,
            f64::MAX,
        ] {
            let text = render(&plan, "k", 1, &[FieldState::F64(x)]);
            let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            let back = v["f"].as_f64().expect("a number");
            assert_eq!(back.to_bits(), x.to_bits(), "{x} rendered as {text}");
        }
        // Shortest: 0.1 is "0.1", not 0.1000000000000000055511151231257827.
        assert_eq!(
            render(&plan, "k", 1, &[FieldState::F64(0.1)]),
            r#"{"k":"k","ver":1,"f":0.1}"#
        );
    }

    #[test]
    fn non_finite_f64_renders_null_not_garbage() {
        let plan = plan_of(vec![field("f", FieldType::F64, Reduce::Last)]);
        let text = render(&plan, "k", 1, &[FieldState::F64(f64::NAN)]);
        assert_eq!(text, r#"{"k":"k","ver":1,"f":null}"#);
    }

    #[test]
    fn strings_are_escaped_and_utf8_kept() {
        let mut out = Vec::new();
        write_json_str(
            "a\"b\\c\nd\te\r\u{8}\u{c}\u{1}\u{1f}\u{7f}é日本🎉/",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out.clone()).expect("UTF-8"),
            "\"a\\\"b\\\\c\\nd\\te\\r\\b\\f\\u0001\\u001f\u{7f}é日本🎉/\""
        );
        let back: String = serde_json::from_slice(&out).expect("valid JSON string");
        assert_eq!(back, "a\"b\\c\nd\te\r\u{8}\u{c}\u{1}\u{1f}\u{7f}é日本🎉/");
    }

    #[test]
    fn key_and_string_fields_are_escaped_in_payload() {
        let plan = Plan::default_plan();
        let state = [
            FieldState::Unset,
            FieldState::Unset,
            FieldState::Count(1),
            FieldState::Str("\"é\n".into()),
        ];
        let text = render(&plan, "k\"\\", 1, &state);
        assert_eq!(text, r#"{"k":"k\"\\","ver":1,"n":1,"by":"\"é\n"}"#);
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["k"], "k\"\\");
        assert_eq!(v["by"], "\"é\n");
    }

    #[test]
    fn every_control_byte_round_trips_through_a_json_parser() {
        for b in 0u8..0x80 {
            let s = (b as char).to_string();
            let mut out = Vec::new();
            write_json_str(&s, &mut out);
            let back: String = serde_json::from_slice(&out).expect("valid JSON string");
            assert_eq!(back, s, "byte {b:#x}");
        }
    }

    #[test]
    fn appends_without_clearing() {
        let plan = Plan::default_plan();
        let mut out = b"HTTP".to_vec();
        render_payload(&plan, "a", 1, &[], &mut out);
        assert_eq!(out, br#"HTTP{"k":"a","ver":1}"#);
    }

    #[test]
    fn fits_matches_types() {
        assert!(FieldState::Unset.fits(FieldType::Str, false));
        assert!(FieldState::Count(3).fits(FieldType::I64, true));
        assert!(!FieldState::I64(3).fits(FieldType::I64, true));
        assert!(FieldState::I64(3).fits(FieldType::I64, false));
        assert!(!FieldState::I64(3).fits(FieldType::F64, false));
        assert!(!FieldState::F64(f64::INFINITY).fits(FieldType::F64, false));
        assert!(FieldState::Bool(true).fits(FieldType::Bool, false));
        assert!(FieldState::Str("a".into()).fits(FieldType::Str, false));
    }

    fn arb_view() -> impl proptest::strategy::Strategy<Value = FieldState> {
        use proptest::prelude::*;
        prop_oneof![
            Just(FieldState::Unset),
            any::<i64>().prop_map(FieldState::I64),
            prop_oneof![
                any::<f64>(),
                Just(0.0),
                Just(-0.0),
                Just(f64::MAX),
                Just(f64::MIN_POSITIVE),
                Just(5e-324),
                Just(1e21),
                Just(1e-7),
            ]
            .prop_map(FieldState::F64),
            any::<bool>().prop_map(FieldState::Bool),
            any::<String>().prop_map(|s| FieldState::Str(s.into())),
            any::<u64>().prop_map(FieldState::Count),
        ]
    }

    proptest::proptest! {
        #[test]
        fn json_str_len_is_the_written_length(
            s in proptest::prelude::any::<String>(),
            b in proptest::collection::vec(0u8..0x80, 0..40),
        ) {
            for s in [s.as_str(), std::str::from_utf8(&b).expect("ASCII")] {
                let mut out = Vec::new();
                write_json_str(s, &mut out);
                proptest::prop_assert_eq!(json_str_len(s), out.len());
            }
        }

        /// Lazy rendering sizes records by `rendered_len`: it must be exact.
        #[test]
        fn rendered_len_is_the_rendered_length(
            key in proptest::prelude::any::<String>(),
            version in proptest::prelude::any::<u64>(),
            state in proptest::collection::vec(arb_view(), 0..6),
        ) {
            let fields = (0..state.len())
                .map(|i| field(&format!("f\"{i}\u{1}"), FieldType::I64, Reduce::Last))
                .collect();
            let plan = plan_of(fields);
            let mut out = Vec::new();
            render_payload(&plan, &key, version, &state, &mut out);
            let len = rendered_len(&plan, &key, version, state.iter().map(FieldState::view));
            proptest::prop_assert_eq!(len, out.len());
        }
    }

    #[test]
    fn needs_escape_finds_every_escaped_byte_at_every_place() {
        let slow = |b: &[u8]| b.iter().any(|&c| c < 0x20 || c == b'"' || c == b'\\');
        for n in 0..=20 {
            for fill in [b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xff] {
                let base = vec![fill; n];
                assert_eq!(needs_escape(&base), slow(&base), "{base:?}");
                for at in 0..n {
                    for c in (0u8..=0xff).filter(|c| !c.is_ascii_alphanumeric()) {
                        let mut b = base.clone();
                        b[at] = c;
                        assert_eq!(needs_escape(&b), slow(&b), "{b:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn dec_len_is_the_digit_count_around_every_power_of_two_and_ten() {
        let mut edges = vec![0u64, u64::MAX];
        for s in 0..64 {
            edges.extend([(1u64 << s) - 1, 1 << s, (1 << s) + 1]);
        }
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            edges.extend([p - 1, p, p + 1, next - 1]);
            p = next;
        }
        edges.extend([p - 1, p, p + 1]);
        for v in edges {
            assert_eq!(dec_len(v), v.to_string().len(), "{v}");
            let i = v as i64;
            assert_eq!(value_len(FieldView::I64(i)), i.to_string().len(), "{i}");
        }
    }

    #[test]
    fn rendered_len_at_the_edges() {
        let plan = Plan::default_plan();
        for (v, n) in [(0u64, 1), (9, 1), (10, 2), (u64::MAX, 20)] {
            for i in [i64::MIN, -1, 0, 1, i64::MAX] {
                let state = [
                    FieldState::I64(i),
                    FieldState::Unset,
                    FieldState::Count(v),
                    FieldState::Str("\u{0}é\"".into()),
                ];
                let mut out = Vec::new();
                render_payload(&plan, "k\n", v, &state, &mut out);
                let len = rendered_len(&plan, "k\n", v, state.iter().map(FieldState::view));
                assert_eq!(len, out.len(), "{v} {i}");
                assert_eq!(dec_len(v), n);
            }
        }
    }
}
