//! The reducers (docs/boxes.md): the next state and payload of a box from its
//! current state and one accepted message, built in per-thread scratch
//! buffers so that updating a box allocates nothing on the steady path.

use std::cell::RefCell;

use super::codec;
use crate::config::{FieldType, Reduce};
use crate::plan::{FieldPlan, MessageError, Plan, Value};
use crate::render::{
    field_head_len, render_head, rendered_head_len, value_len, write_field_head, write_value,
    FieldView,
};

/// The table's reducers: its plan, and each field's `,"name":` as
/// [`field_heads`] rendered it (empty: rendered as needed).
#[derive(Clone, Copy)]
pub(super) struct Reducers<'a> {
    pub plan: &'a Plan,
    pub heads: &'a [Box<[u8]>],
}

/// One accepted message: the box's key and one value per plan field
/// (`None`: absent).
#[derive(Clone, Copy)]
pub(super) struct Message<'a> {
    pub key: &'a str,
    pub values: &'a [Option<Value<'a>>],
}

/// A box as a message finds it: its state (empty for a new box) and the
/// version the next one follows.
#[derive(Clone, Copy)]
pub(super) struct Prior<'a> {
    pub state: &'a [u8],
    pub version: u64,
}

/// Compute the next state of the box `prior` into `st` after `msg`, and,
/// when `render`, its payload into `payload` (else only the payload's length
/// is computed: lazy rendering). Returns the new version and the payload's
/// length.
#[inline]
pub(super) fn next_record(
    reducers: Reducers<'_>,
    msg: Message<'_>,
    prior: Prior<'_>,
    st: &mut Vec<u8>,
    payload: &mut Vec<u8>,
    render: bool,
) -> Result<(u64, usize), MessageError> {
    // One copy of the steps for each, so that neither carries the other's
    // code.
    let f = if render { fold::<true> } else { fold::<false> };
    f(reducers.plan, reducers.heads, msg, prior, st, payload)
}

/// [`next_record`], rendering or not. The plan and the heads are arguments
/// of their own, not a [`Reducers`]: as arguments they are known to stay
/// unchanged while the payload is written, and are not read again (callgrind:
/// +15 instructions a message when they came in a struct).
#[inline(never)]
fn fold<const RENDER: bool>(
    plan: &Plan,
    heads: &[Box<[u8]>],
    Message { key, values }: Message<'_>,
    prior: Prior<'_>,
    st: &mut Vec<u8>,
    payload: &mut Vec<u8>,
) -> Result<(u64, usize), MessageError> {
    let render = RENDER;
    st.clear();
    payload.clear();
    // Sized once per thread for the largest payload, so they never grow on the
    // steady path (reserve is a no-op once the capacity is there).
    payload.reserve(plan.max_payload_bytes + 1);
    st.reserve(plan.max_payload_bytes + 16 * plan.fields.len());
    let version = prior.version.saturating_add(1);
    // The payload is rendered, or only its length added up, from the new
    // values as they are made: the new state is not decoded again.
    let mut out = Out {
        render,
        len: 0,
        st,
        payload,
    };
    if render {
        render_head(key, version, out.payload);
    } else {
        out.len = rendered_head_len(key, version);
    }
    let mut old = codec::Decoder::new(prior.state);
    for (i, field) in plan.fields.iter().enumerate() {
        let value = values.get(i).unwrap_or(&None);
        let out = &mut out.at(field, heads.get(i).map(|h| &h[..]));
        // The common kinds of field in one typed step each; the others (and
        // every mismatch, which the typed steps leave to it) in the general
        // one. Both read one old view and write one new one.
        match (field.reduce, field.ty, value) {
            (Reduce::Count, _, _) => {
                let n = match old.next_count() {
                    FieldView::Count(n) => n,
                    _ => 0,
                };
                out.put(FieldView::Count(n.saturating_add(1)));
            }
            (Reduce::Last, FieldType::I64, &Some(Value::I64(v))) => {
                old.skip_one();
                out.put(FieldView::I64(v));
            }
            (Reduce::Sum, FieldType::I64, &Some(Value::I64(v))) => {
                let next = match old.next_i64() {
                    FieldView::I64(a) => a.checked_add(v).ok_or(MessageError::SumOverflow {
                        field: field_index(i),
                    })?,
                    _ => v,
                };
                out.put(FieldView::I64(next));
            }
            (Reduce::Last, FieldType::Str, &Some(Value::Str(s))) => {
                if field.max_len > 0 && s.len() > field.max_len {
                    return Err(MessageError::StringTooLong {
                        field: field_index(i),
                    });
                }
                old.skip_one();
                out.put(FieldView::Str(s));
            }
            (_, _, &value) => {
                // `last` with a value replaces the old one whatever it was: it
                // is stepped over, not decoded.
                let prev = if field.reduce == Reduce::Last && value.is_some() {
                    old.skip_one();
                    FieldView::Unset
                } else {
                    old.next().unwrap_or_default()
                };
                out.put(reduce(field, i, prev, value)?);
            }
        }
    }
    let len = if render {
        out.payload.push(b'}');
        out.payload.len()
    } else {
        out.len
    };
    if len > plan.max_payload_bytes {
        return Err(MessageError::PayloadTooLarge);
    }
    Ok((version, len))
}

/// Each field's `,"name":` as rendered in a payload (the same in every
/// payload, so rendered once per table), in plan order.
pub(super) fn field_heads(plan: &Plan) -> Box<[Box<[u8]>]> {
    plan.fields
        .iter()
        .map(|f| {
            let mut head = Vec::new();
            write_field_head(f, &mut head);
            head.into_boxed_slice()
        })
        .collect()
}

/// Where the next record goes: its state, and its payload or only the
/// payload's length.
struct Out<'s> {
    render: bool,
    len: usize,
    st: &'s mut Vec<u8>,
    payload: &'s mut Vec<u8>,
}

impl<'s> Out<'s> {
    #[inline(always)]
    fn at<'o, 'f>(
        &'o mut self,
        field: &'f FieldPlan,
        head: Option<&'f [u8]>,
    ) -> FieldOut<'o, 's, 'f> {
        FieldOut {
            out: self,
            field,
            head,
        }
    }
}

/// [`Out`] for one field, with its rendered head (`None`: rendered here).
struct FieldOut<'o, 's, 'f> {
    out: &'o mut Out<'s>,
    field: &'f FieldPlan,
    head: Option<&'f [u8]>,
}

impl FieldOut<'_, '_, '_> {
    /// Add the field's new view to the state and to the payload (or its
    /// length); an unset field is left out of the payload. Inlined into each
    /// typed step, where the view's kind is known.
    #[inline(always)]
    fn put(&mut self, next: FieldView<'_>) {
        let out = &mut *self.out;
        if next != FieldView::Unset {
            if out.render {
                match self.head {
                    Some(head) => out.payload.extend_from_slice(head),
                    None => write_field_head(self.field, out.payload),
                }
                write_value(next, out.payload);
            } else {
                let head = self
                    .head
                    .map_or_else(|| field_head_len(self.field), <[u8]>::len);
                out.len += head + value_len(next);
            }
        }
        codec::encode(next, out.st);
    }
}

fn field_index(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

/// One reducer step for one field.
fn reduce<'a>(
    field: &FieldPlan,
    i: usize,
    prev: FieldView<'a>,
    value: Option<Value<'a>>,
) -> Result<FieldView<'a>, MessageError> {
    use FieldView as V;
    if field.reduce == Reduce::Count {
        let n = match prev {
            V::Count(n) => n,
            _ => 0,
        };
        return Ok(V::Count(n.saturating_add(1)));
    }
    let Some(value) = value else {
        return Ok(prev);
    };
    let idx = field_index(i);
    let next = typed(field, idx, value)?;
    Ok(match (field.reduce, prev, next) {
        (Reduce::Sum, V::I64(a), V::I64(b)) => V::I64(
            a.checked_add(b)
                .ok_or(MessageError::SumOverflow { field: idx })?,
        ),
        (Reduce::Sum, V::F64(a), V::F64(b)) => {
            let s = a + b;
            if !s.is_finite() {
                return Err(MessageError::SumOverflow { field: idx });
            }
            V::F64(s)
        }
        (Reduce::Min, V::I64(a), V::I64(b)) => V::I64(a.min(b)),
        (Reduce::Max, V::I64(a), V::I64(b)) => V::I64(a.max(b)),
        (Reduce::Min, V::F64(a), V::F64(b)) => V::F64(if b < a { b } else { a }),
        (Reduce::Max, V::F64(a), V::F64(b)) => V::F64(if b > a { b } else { a }),
        // `last`, and the first value of sum/min/max.
        _ => next,
    })
}

/// Check a value against the field's type. The projection already did; this
/// keeps the table's invariants (no non-finite f64, strings within max_len)
/// whoever calls it. An integer is accepted for an f64 field.
fn typed<'a>(field: &FieldPlan, idx: u16, value: Value<'a>) -> Result<FieldView<'a>, MessageError> {
    match (field.ty, value) {
        (FieldType::I64, Value::I64(v)) => Ok(FieldView::I64(v)),
        (FieldType::F64, Value::F64(v)) if v.is_finite() => Ok(FieldView::F64(v)),
        (FieldType::F64, Value::I64(v)) => Ok(FieldView::F64(v as f64)),
        (FieldType::Bool, Value::Bool(b)) => Ok(FieldView::Bool(b)),
        (FieldType::Str, Value::Str(s)) if field.max_len > 0 && s.len() > field.max_len => {
            Err(MessageError::StringTooLong { field: idx })
        }
        (FieldType::Str, Value::Str(s)) => Ok(FieldView::Str(s)),
        _ => Err(MessageError::WrongType { field: idx }),
    }
}

/// Per-thread buffers the next record is built in, so updating an existing box
/// allocates nothing once they have grown to a payload's size.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) state: Vec<u8>,
    pub(super) payload: Vec<u8>,
    /// A copy of a record read from its slot, and the next record built on it.
    pub(super) image: Vec<u8>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            state: Vec::new(),
            payload: Vec::new(),
            image: Vec::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.state.clear();
        self.payload.clear();
        self.image.clear();
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
}

/// Run `f` with this thread's scratch buffers, borrowed in place (a flag
/// set and reset, where taking them out and putting them back moved three
/// `Vec`s twice); a nested call (they are borrowed) or a thread being torn
/// down just gets fresh ones.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut f = Some(f);
    let done = SCRATCH.try_with(|c| {
        let mut scratch = c.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut scratch))
    });
    match (done, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut Scratch::default()),
        // `f` is taken only to run it, and then its result is returned
        // above.
        (_, None) => unreachable!("with_scratch: f taken but not run"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{apply, assert_unchanged, f, field, i, payload, table_with};
    use super::with_scratch;
    use crate::boxes::BoxTable;
    use crate::config::{FieldType, Reduce};
    use crate::plan::{MessageError, Plan, Value};
    use std::sync::Arc;

    #[test]
    fn scratch_is_kept_per_thread_and_fresh_when_nested() {
        with_scratch(|s| {
            s.clear();
            s.state.extend_from_slice(b"outer");
            // Borrowed: a nested call gets buffers of its own.
            with_scratch(|inner| {
                assert!(inner.state.is_empty());
                inner.state.extend_from_slice(b"inner");
            });
            assert_eq!(s.state, b"outer");
        });
        // Kept for the next call on this thread, not the nested one's.
        with_scratch(|s| assert_eq!(s.state, b"outer"));
        assert_eq!(with_scratch(|_| 7), 7);
    }

    #[test]
    fn absent_fields_keep_their_state_but_count_counts() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        apply(&t, "a", &[i(3), i(3), None, Some(Value::Str("x"))]).expect("ok");
        apply(&t, "a", &[None, None, Some(Value::Bool(true)), None]).expect("ok");
        apply(&t, "a", &[]).expect("a short values slice means absent fields");
        assert_eq!(
            payload(&t, "a"),
            r#"{"k":"a","ver":3,"v":3,"sum":3,"n":3,"by":"x"}"#
        );
    }

    #[test]
    fn i64_reducers() {
        let t = table_with(vec![
            field("last", FieldType::I64, Reduce::Last),
            field("sum", FieldType::I64, Reduce::Sum),
            field("min", FieldType::I64, Reduce::Min),
            field("max", FieldType::I64, Reduce::Max),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        for v in [4, -2, 9, 1] {
            apply(&t, "k", &[i(v), i(v), i(v), i(v), i(1000)]).expect("ok");
        }
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":4,"last":1,"sum":12,"min":-2,"max":9,"n":4}"#
        );
    }

    #[test]
    fn f64_reducers_and_integers_for_f64_fields() {
        let t = table_with(vec![
            field("last", FieldType::F64, Reduce::Last),
            field("sum", FieldType::F64, Reduce::Sum),
            field("min", FieldType::F64, Reduce::Min),
            field("max", FieldType::F64, Reduce::Max),
        ]);
        apply(&t, "k", &[f(0.5), f(0.5), f(0.5), f(0.5)]).expect("ok");
        apply(&t, "k", &[f(-1.25), f(-1.25), f(-1.25), f(-1.25)]).expect("ok");
        apply(&t, "k", &[i(3), i(3), i(3), i(3)]).expect("an integer is a number");
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":3,"last":3.0,"sum":2.25,"min":-1.25,"max":3.0}"#
        );
    }

    #[test]
    fn bool_and_str_last() {
        let t = table_with(vec![
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
        ]);
        apply(
            &t,
            "k",
            &[Some(Value::Bool(true)), Some(Value::Str("é\"\n"))],
        )
        .expect("ok");
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":1,"b":true,"s":"é\"\n"}"#
        );
        apply(&t, "k", &[Some(Value::Bool(false)), Some(Value::Str(""))]).expect("ok");
        assert_eq!(payload(&t, "k"), r#"{"k":"k","ver":2,"b":false,"s":""}"#);
    }

    #[test]
    fn i64_sum_overflow_at_the_edge_rejects_and_changes_nothing() {
        let t = table_with(vec![
            field("v", FieldType::I64, Reduce::Last),
            field("sum", FieldType::I64, Reduce::Sum),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        apply(&t, "up", &[i(i64::MAX - 1), i(i64::MAX - 1), None]).expect("ok");
        apply(&t, "up", &[i(1), i(1), None]).expect("exactly i64::MAX is fine");
        let before = payload(&t, "up");
        assert!(before.contains(&format!(r#""sum":{}"#, i64::MAX)));
        assert_eq!(
            apply(&t, "up", &[i(7), i(1), None]),
            Err(MessageError::SumOverflow { field: 1 })
        );
        assert_unchanged(&t, "up", &before);

        apply(&t, "down", &[None, i(i64::MIN + 1), None]).expect("ok");
        apply(&t, "down", &[None, i(-1), None]).expect("exactly i64::MIN is fine");
        let before = payload(&t, "down");
        assert_eq!(
            apply(&t, "down", &[None, i(-1), None]),
            Err(MessageError::SumOverflow { field: 1 })
        );
        assert_unchanged(&t, "down", &before);
        assert_eq!(t.version(b"down"), Some(2));
    }

    #[test]
    fn f64_sum_that_is_not_finite_is_an_overflow() {
        let t = table_with(vec![field("sum", FieldType::F64, Reduce::Sum)]);
        apply(&t, "k", &[f(f64::MAX)]).expect("ok");
        let before = payload(&t, "k");
        assert_eq!(
            apply(&t, "k", &[f(f64::MAX)]),
            Err(MessageError::SumOverflow { field: 0 })
        );
        assert_unchanged(&t, "k", &before);
        apply(&t, "k", &[f(-f64::MAX)]).expect("back to zero");
        assert_eq!(payload(&t, "k"), r#"{"k":"k","ver":2,"sum":0.0}"#);
    }

    #[test]
    fn min_max_at_the_edges() {
        let t = table_with(vec![
            field("min", FieldType::I64, Reduce::Min),
            field("max", FieldType::I64, Reduce::Max),
            field("fmin", FieldType::F64, Reduce::Min),
            field("fmax", FieldType::F64, Reduce::Max),
        ]);
        apply(&t, "k", &[i(0), i(0), f(0.0), f(0.0)]).expect("ok");
        apply(
            &t,
            "k",
            &[i(i64::MIN), i(i64::MAX), f(-f64::MAX), f(f64::MAX)],
        )
        .expect("ok");
        apply(&t, "k", &[i(5), i(-5), f(1.0), f(-1.0)]).expect("ok");
        let v: serde_json::Value = serde_json::from_str(&payload(&t, "k")).expect("JSON");
        assert_eq!(v["min"], i64::MIN);
        assert_eq!(v["max"], i64::MAX);
        assert_eq!(v["fmin"], -f64::MAX);
        assert_eq!(v["fmax"], f64::MAX);
    }

    #[test]
    fn wrong_types_are_rejected_whole() {
        let t = table_with(vec![
            field("i", FieldType::I64, Reduce::Sum),
            field("f", FieldType::F64, Reduce::Last),
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        apply(
            &t,
            "k",
            &[
                i(1),
                f(1.0),
                Some(Value::Bool(true)),
                Some(Value::Str("a")),
                None,
            ],
        )
        .expect("ok");
        let before = payload(&t, "k");
        let cases: [(Vec<Option<Value<'_>>>, u16); 6] = [
            (vec![f(1.0)], 0),
            (vec![i(2), Some(Value::Str("1"))], 1),
            (vec![i(2), f(f64::NAN)], 1),
            (vec![i(2), f(f64::INFINITY)], 1),
            (vec![i(2), None, i(1)], 2),
            (vec![i(2), None, None, Some(Value::Bool(false))], 3),
        ];
        for (values, field) in cases {
            assert_eq!(
                apply(&t, "k", &values),
                Err(MessageError::WrongType { field }),
                "{values:?}"
            );
            assert_unchanged(&t, "k", &before);
        }
        assert_eq!(
            apply(
                &t,
                "k",
                &[None, None, None, Some(Value::Str("seventeen bytes!!"))]
            ),
            Err(MessageError::StringTooLong { field: 3 })
        );
        assert_unchanged(&t, "k", &before);
    }
}

/// `next_record` against the one it replaced (kept here as it was: decode,
/// reduce, length, encode, a pass each), on random plans, old states (well
/// formed, of the wrong kinds, or damaged), values and versions.
#[cfg(test)]
mod same_as_before {
    use super::{field_heads, next_record, reduce, Message, Prior, Reducers};
    use crate::boxes::codec;
    use crate::config::{FieldType, Reduce};
    use crate::plan::{FieldPlan, MessageError, Plan, Value};
    use crate::render::{render_field, render_head, rendered_field_len, rendered_head_len};
    use crate::render::{FieldState, FieldView};
    use proptest::prelude::*;

    fn before(
        plan: &Plan,
        Message { key, values }: Message<'_>,
        Prior {
            state: old_state,
            version: old_version,
        }: Prior<'_>,
        st: &mut Vec<u8>,
        payload: &mut Vec<u8>,
        render: bool,
    ) -> Result<(u64, usize), MessageError> {
        st.clear();
        payload.clear();
        let version = old_version.saturating_add(1);
        let mut len = 0;
        if render {
            render_head(key, version, payload);
        } else {
            len = rendered_head_len(key, version);
        }
        let mut old = codec::Decoder::new(old_state);
        for (i, field) in plan.fields.iter().enumerate() {
            let value = values.get(i).copied().flatten();
            let prev = if field.reduce == Reduce::Last && value.is_some() {
                old.skip_one();
                FieldView::Unset
            } else {
                old.next().unwrap_or_default()
            };
            let next = reduce(field, i, prev, value)?;
            if render {
                render_field(field, next, payload);
            } else {
                len += rendered_field_len(field, next);
            }
            codec::encode(next, st);
        }
        if render {
            payload.push(b'}');
            len = payload.len();
        }
        if len > plan.max_payload_bytes {
            return Err(MessageError::PayloadTooLarge);
        }
        Ok((version, len))
    }

    fn arb_field() -> impl Strategy<Value = FieldPlan> {
        (
            prop_oneof![
                Just(FieldType::I64),
                Just(FieldType::F64),
                Just(FieldType::Bool),
                Just(FieldType::Str)
            ],
            prop_oneof![
                Just(Reduce::Last),
                Just(Reduce::Sum),
                Just(Reduce::Min),
                Just(Reduce::Max),
                Just(Reduce::Count)
            ],
            prop_oneof![
                Just("v".to_string()),
                Just("n\"\u{1}".to_string()),
                "[a-z]{1,9}"
            ],
            0usize..6,
        )
            .prop_map(|(ty, reduce, name, max_len)| FieldPlan {
                path: vec![name.clone()],
                name,
                ty,
                reduce,
                max_len,
            })
    }

    fn arb_int() -> impl Strategy<Value = i64> {
        prop_oneof![
            -70i64..70,
            -20_000i64..20_000,
            any::<i64>(),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::MAX - 1),
        ]
    }

    fn arb_view() -> impl Strategy<Value = FieldState> {
        prop_oneof![
            Just(FieldState::Unset),
            arb_int().prop_map(FieldState::I64),
            prop_oneof![any::<f64>(), Just(f64::MAX), Just(0.5)].prop_map(FieldState::F64),
            any::<bool>().prop_map(FieldState::Bool),
            "[a-z\"\n]{0,8}".prop_map(|s| FieldState::Str(s.into())),
            prop_oneof![0u64..300, any::<u64>(), Just(u64::MAX)].prop_map(FieldState::Count),
        ]
    }

    #[derive(Debug, Clone)]
    enum Val {
        I(i64),
        F(f64),
        B(bool),
        S(String),
    }

    fn arb_value() -> impl Strategy<Value = Option<Val>> {
        prop::option::weighted(
            0.8,
            prop_oneof![
                3 => arb_int().prop_map(Val::I),
                1 => prop_oneof![any::<f64>(), Just(f64::MAX), Just(-1.5)].prop_map(Val::F),
                1 => any::<bool>().prop_map(Val::B),
                2 => "[a-z\"\\\\\u{1}é]{0,8}".prop_map(Val::S),
            ],
        )
    }

    fn as_value(v: &Option<Val>) -> Option<Value<'_>> {
        v.as_ref().map(|v| match v {
            Val::I(i) => Value::I64(*i),
            Val::F(f) => Value::F64(*f),
            Val::B(b) => Value::Bool(*b),
            Val::S(s) => Value::Str(s),
        })
    }

    /// An old state: views encoded (any kind, whatever the field), maybe cut
    /// short or followed by bytes, or bytes at random.
    fn arb_state() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => (prop::collection::vec(arb_view(), 0..7), 0usize..4, prop::collection::vec(any::<u8>(), 0..9))
                .prop_map(|(views, cut, tail)| {
                    let mut b = Vec::new();
                    for v in &views {
                        codec::encode(v.view(), &mut b);
                    }
                    b.truncate(b.len().saturating_sub(cut));
                    b.extend(tail);
                    b
                }),
            1 => prop::collection::vec(any::<u8>(), 0..24),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn next_record_is_what_it_was(
            fields in prop::collection::vec(arb_field(), 0..7),
            max_payload in prop_oneof![20usize..80, Just(4096)],
            key in "[a-z0-9\"\u{1}-]{1,12}",
            state in arb_state(),
            old_version in prop_oneof![0u64..20, any::<u64>(), Just(u64::MAX)],
            values in prop::collection::vec(arb_value(), 0..8),
            render in any::<bool>(),
            steps in 1usize..4,
            cached_names in any::<bool>(),
        ) {
            let plan = Plan {
                key_field: "key".into(),
                max_key_bytes: 64,
                max_payload_bytes: max_payload,
                max_boxes: 10,
                ttl_s: 0,
                rooms: true,
                fields,
            };
            let names = if cached_names { field_heads(&plan) } else { Box::default() };
            let values: Vec<_> = values.iter().map(as_value).collect();
            let (mut st, mut payload) = (Vec::new(), Vec::new());
            let (mut want_st, mut want_payload) = (Vec::new(), Vec::new());
            // Applied a few times over, each on the state the last one made.
            let mut old = state;
            let mut version = old_version;
            for _ in 0..steps {
                let msg = Message { key: &key, values: &values };
                let prior = Prior { state: &old, version };
                let reducers = Reducers { plan: &plan, heads: &names };
                let got = next_record(reducers, msg, prior, &mut st, &mut payload, render);
                let want = before(&plan, msg, prior, &mut want_st, &mut want_payload, render);
                prop_assert_eq!(got, want);
                let Ok((v, _)) = got else { break };
                prop_assert_eq!(&st, &want_st);
                if render {
                    prop_assert_eq!(&payload, &want_payload);
                }
                old = st.clone();
                version = v;
            }
        }
    }
}
