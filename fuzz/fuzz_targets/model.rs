//! The projection as the fuzz targets `projection` and `projection_diff` model it:
//! serde_json parses the body, a JSON pointer lookup reads each field, and
//! docs/boxes.md#messages with the projection's documented choices (the key first,
//! then the fields in plan order; `null` and a pointer through a non-object are
//! absent; the last duplicate member wins) decides each message. Shared by both
//! targets (`#[path = "model.rs"] mod model;`).

use pollbox_core::config::FieldType;
use pollbox_core::plan::{MessageError, Plan, Value};
use pollbox_core::projection::{BodyFormat, KeySource, Shape};
use serde_json::Value as Json;

/// A value as the model reads it (owned, so it outlives nothing).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MVal {
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
}

/// One message as the model reads it: its key (`None` with path keys) and
/// one value per plan field, or why it is rejected.
pub(crate) type ModelMessage = Result<(Option<String>, Vec<Option<MVal>>), MessageError>;

#[derive(Debug)]
pub(crate) enum ModelBody {
    /// Not valid JSON for the model, or no JSON value at all.
    Invalid,
    NotObjectOrArray,
    Ok {
        shape: Shape,
        items: Vec<ModelMessage>,
    },
}

pub(crate) enum Parsed {
    Doc(Json),
    Invalid,
}

/// serde_json's verdict without `arbitrary_precision` (which this crate
/// needs for the number texts): that also refuses numbers whose nearest f64
/// is infinite.
pub(crate) fn parse(doc: &[u8]) -> Parsed {
    match serde_json::from_slice::<Json>(doc) {
        Ok(_) if has_out_of_range_number(doc) => Parsed::Invalid,
        Ok(v) => Parsed::Doc(v),
        Err(_) => Parsed::Invalid,
    }
}

/// Whether a valid JSON text holds a number whose nearest f64 is infinite.
/// Scans the text, not the parsed value: a duplicate member's earlier value
/// is gone from the value but still has to be valid.
pub(crate) fn has_out_of_range_number(doc: &[u8]) -> bool {
    let mut i = 0;
    while i < doc.len() {
        match doc[i] {
            b'"' => {
                i += 1;
                while i < doc.len() && doc[i] != b'"' {
                    i += if doc[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < doc.len()
                    && matches!(doc[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let text = std::str::from_utf8(&doc[start..i]).unwrap_or("x");
                if !text.parse::<f64>().is_ok_and(f64::is_finite) {
                    return true;
                }
            }
            _ => i += 1,
        }
    }
    false
}

pub(crate) fn is_integer_text(text: &str) -> bool {
    !text.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
}

pub(crate) fn model_body(
    plan: &Plan,
    body: &[u8],
    format: BodyFormat,
    keys: KeySource,
) -> ModelBody {
    if format == BodyFormat::Ndjson && keys == KeySource::Body {
        let mut items = Vec::new();
        for line in body.split(|&b| b == b'\n') {
            if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                continue;
            }
            match parse(line) {
                Parsed::Invalid => return ModelBody::Invalid,
                Parsed::Doc(Json::Object(o)) => items.push(model_message(plan, &o, keys)),
                Parsed::Doc(_) => items.push(Err(MessageError::NotAnObject)),
            }
        }
        if items.is_empty() {
            return ModelBody::Invalid;
        }
        return ModelBody::Ok {
            shape: Shape::Ndjson,
            items,
        };
    }
    match parse(body) {
        Parsed::Invalid => ModelBody::Invalid,
        Parsed::Doc(Json::Object(o)) => ModelBody::Ok {
            shape: Shape::Object,
            items: vec![model_message(plan, &o, keys)],
        },
        Parsed::Doc(Json::Array(a)) if keys == KeySource::Body => ModelBody::Ok {
            shape: Shape::Array,
            items: a
                .iter()
                .map(|e| match e {
                    Json::Object(o) => model_message(plan, o, keys),
                    _ => Err(MessageError::NotAnObject),
                })
                .collect(),
        },
        Parsed::Doc(_) => ModelBody::NotObjectOrArray,
    }
}

pub(crate) type Object = serde_json::Map<String, Json>;

/// docs/boxes.md#messages and the projection's documented choices: the key first,
/// then the fields in plan order; the first problem rejects the message; `null` and
/// a pointer through a non-object are absent.
pub(crate) fn model_message(plan: &Plan, o: &Object, keys: KeySource) -> ModelMessage {
    let key = match keys {
        KeySource::Path => None,
        KeySource::Body => match o.get(&plan.key_field) {
            None => return Err(MessageError::MissingKey),
            Some(Json::String(s)) if s.is_empty() => return Err(MessageError::EmptyKey),
            Some(Json::String(s)) if s.len() > plan.max_key_bytes => {
                return Err(MessageError::KeyTooLong)
            }
            // A room's presence (docs/presence.md): no message writes it.
            Some(Json::String(s)) if s.ends_with("~presence") => {
                return Err(MessageError::ReservedKey)
            }
            Some(Json::String(s)) => Some(s.clone()),
            Some(_) => return Err(MessageError::KeyNotString),
        },
    };
    let mut values = Vec::with_capacity(plan.fields.len());
    for (i, f) in plan.fields.iter().enumerate() {
        let field = u16::try_from(i).unwrap_or(u16::MAX);
        if f.path.is_empty() {
            values.push(None);
            continue;
        }
        let mut at = Some(o);
        let mut found = None;
        for (depth, token) in f.path.iter().enumerate() {
            let Some(obj) = at else { break };
            match obj.get(token) {
                Some(v) if depth + 1 == f.path.len() => found = Some(v),
                Some(Json::Object(inner)) => at = Some(inner),
                _ => at = None,
            }
        }
        let value = match (f.ty, found) {
            (_, None | Some(Json::Null)) => None,
            (FieldType::I64, Some(Json::Number(n))) => {
                let text = n.to_string();
                match text.parse::<i64>() {
                    Ok(v) if is_integer_text(&text) => Some(MVal::I64(v)),
                    _ => return Err(MessageError::WrongType { field }),
                }
            }
            (FieldType::F64, Some(Json::Number(n))) => {
                let text = n.to_string();
                let v = if is_integer_text(&text) {
                    match text.parse::<i64>() {
                        Ok(v) => v as f64,
                        Err(_) => text
                            .parse::<f64>()
                            .map_err(|_| MessageError::WrongType { field })?,
                    }
                } else {
                    text.parse::<f64>()
                        .map_err(|_| MessageError::WrongType { field })?
                };
                Some(MVal::F64(v))
            }
            (FieldType::Bool, Some(Json::Bool(b))) => Some(MVal::Bool(*b)),
            (FieldType::Str, Some(Json::String(s))) if s.len() > f.max_len => {
                return Err(MessageError::StringTooLong { field })
            }
            (FieldType::Str, Some(Json::String(s))) => Some(MVal::Str(s.clone())),
            _ => return Err(MessageError::WrongType { field }),
        };
        values.push(value);
    }
    Ok((key, values))
}

pub(crate) fn to_model(v: &Option<Value<'_>>) -> Option<MVal> {
    v.map(|v| match v {
        Value::I64(n) => MVal::I64(n),
        Value::F64(x) => MVal::F64(x),
        Value::Bool(b) => MVal::Bool(b),
        Value::Str(s) => MVal::Str(s.to_owned()),
    })
}

/// Floats compare by bits: `-0.0` and `0.0` render differently.
pub(crate) fn same_values(a: &[Option<MVal>], b: &[Option<MVal>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(MVal::F64(x)), Some(MVal::F64(y))) => x.to_bits() == y.to_bits(),
            _ => x == y,
        })
}
