//! Payload rendering (SPEC §3).
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
    out.extend_from_slice(b",");
    // Field names are validated as [A-Za-z0-9_-] by the config, but the
    // renderer does not rely on that for the output to be valid JSON.
    write_json_str(&field.name, out);
    out.push(b':');
    write_value(value, out);
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
    1 + json_str_len(&field.name) + 1 + value_len(value)
}

/// Decimal digits of `v`.
#[inline]
fn dec_len(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn value_len(value: FieldView<'_>) -> usize {
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
fn json_str_len(s: &str) -> usize {
    // Most strings (keys, names) need no escape: one pass that finds none.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        return 2 + s.len();
    }
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

fn write_value(value: FieldView<'_>, out: &mut Vec<u8>) {
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
