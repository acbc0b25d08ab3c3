//! What the box table's tests share: a table of given fields, a message
//! applied, a payload read back.

use super::*;
use crate::config::FieldType;
use crate::plan::FieldPlan;

pub(super) fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
    FieldPlan {
        name: name.into(),
        path: if reduce == Reduce::Count {
            vec![]
        } else {
            vec![name.into()]
        },
        ty,
        reduce,
        max_len: if ty == FieldType::Str { 16 } else { 0 },
    }
}

pub(super) fn table_with(fields: Vec<FieldPlan>) -> BoxTable {
    BoxTable::new(Arc::new(Plan {
        key_field: "key".into(),
        max_key_bytes: 16,
        max_payload_bytes: 256,
        max_boxes: 1000,
        ttl_s: 0,
        rooms: true,
        fields,
    }))
}

pub(super) fn payload(t: &BoxTable, key: &str) -> String {
    let mut out = Vec::new();
    t.poll(key.as_bytes(), &mut out).expect("box exists");
    String::from_utf8(out).expect("UTF-8 payload")
}

pub(super) fn apply(
    t: &BoxTable,
    key: &str,
    values: &[Option<Value<'_>>],
) -> Result<u64, MessageError> {
    t.apply(key, values, 0, None)
}

pub(super) fn i(v: i64) -> Option<Value<'static>> {
    Some(Value::I64(v))
}

pub(super) fn f(v: f64) -> Option<Value<'static>> {
    Some(Value::F64(v))
}

/// The box must be exactly as before a rejected message.
pub(super) fn assert_unchanged(t: &BoxTable, key: &str, before: &str) {
    assert_eq!(payload(t, key), before);
}
