//! The projection plan: the config's `[[boxes.field]]` list compiled once into
//! the form the parser, the box table and the renderer share.

use crate::config::{parse_pointer, BoxesConfig, ConfigError, FieldType, Reduce};

/// How the key of a room's presence ends (docs/presence.md): `room-17/~presence`
/// is who is in `room-17/`. No message may write such a key.
pub const PRESENCE_SUFFIX: &[u8] = b"~presence";

/// Whether `key` is reserved for a room's presence ([`PRESENCE_SUFFIX`]).
#[inline]
pub fn reserved_key(key: &[u8]) -> bool {
    key.ends_with(PRESENCE_SUFFIX)
}

/// One configured field, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldPlan {
    /// Payload name, written as the JSON member name.
    pub name: String,
    /// Unescaped JSON pointer tokens; empty for `count`, which reads nothing.
    pub path: Vec<String>,
    /// Value type; `count` fields are `I64`.
    pub ty: FieldType,
    pub reduce: Reduce,
    /// Longest accepted string in bytes (`str` only).
    pub max_len: usize,
}

/// Every field, in config (and payload) order, plus the key rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Member holding the box key in `/v1/ingest` messages.
    pub key_field: String,
    pub max_key_bytes: usize,
    pub max_payload_bytes: usize,
    pub max_boxes: usize,
    /// Seconds without an accepted message after which a box is removed; 0 = never.
    pub ttl_s: u32,
    /// Keys kept in order for rooms (`boxes.rooms`).
    pub rooms: bool,
    pub fields: Vec<FieldPlan>,
}

/// A value read from a message by the projection. Strings borrow from the arena
/// the message was parsed in, so a `Value` cannot outlive the epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(&'a str),
}

impl Plan {
    /// Compile the `[boxes]` section. The config is assumed validated
    /// (`Config::validate`), but a bad pointer is still reported, not panicked on.
    pub fn compile(cfg: &BoxesConfig) -> Result<Plan, ConfigError> {
        let mut fields = Vec::with_capacity(cfg.fields.len());
        for (i, f) in cfg.fields.iter().enumerate() {
            let path = match (&f.path, f.reduce) {
                (_, Reduce::Count) => Vec::new(),
                (Some(p), _) => parse_pointer(p).map_err(|reason| ConfigError::Invalid {
                    key: format!("boxes.field[{i}].path"),
                    reason,
                })?,
                (None, _) => {
                    return Err(ConfigError::Invalid {
                        key: format!("boxes.field[{i}].path"),
                        reason: "required unless reduce = \"count\"".into(),
                    })
                }
            };
            fields.push(FieldPlan {
                name: f.name.clone(),
                path,
                ty: if f.reduce == Reduce::Count {
                    FieldType::I64
                } else {
                    f.ty.unwrap_or(FieldType::I64)
                },
                reduce: f.reduce,
                max_len: f.max_len.unwrap_or(0),
            });
        }
        Ok(Plan {
            key_field: cfg.key_field.clone(),
            max_key_bytes: cfg.max_key_bytes,
            max_payload_bytes: cfg.max_payload_bytes,
            max_boxes: cfg.max_boxes,
            // Validated at most MAX_TTL_S (31 bits); saturate rather than wrap anyway.
            ttl_s: u32::try_from(cfg.ttl_s).unwrap_or(u32::MAX),
            rooms: cfg.rooms,
            fields,
        })
    }

    /// The plan of the default config (tests, benches, examples).
    pub fn default_plan() -> Plan {
        // The default config is covered by config's tests.
        Plan::compile(&BoxesConfig::default()).expect("default plan compiles")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_has_four_fields_in_order() {
        let p = Plan::default_plan();
        let names: Vec<_> = p.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["v", "sum", "n", "by"]);
        assert_eq!(p.fields[0].path, ["value"]);
        assert!(p.fields[2].path.is_empty());
        assert_eq!(p.fields[3].max_len, 16);
    }
}

/// Why one message was rejected (422 for a single message, an `errors` entry in
/// a batch). A rejected message changes nothing. Field errors carry the index of
/// the field in [`Plan::fields`] so the message can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageError {
    /// A batch element that is not a JSON object.
    NotAnObject,
    MissingKey,
    KeyNotString,
    EmptyKey,
    KeyTooLong,
    /// The key is not valid UTF-8 (path keys after percent-decoding).
    KeyNotUtf8,
    /// The key ends with [`PRESENCE_SUFFIX`]: it names a room's presence
    /// (docs/presence.md), which no message writes.
    ReservedKey,
    /// The field's value has another JSON type than configured.
    WrongType {
        field: u16,
    },
    /// A `str` field longer than its `max_len`.
    StringTooLong {
        field: u16,
    },
    /// A `sum` that would leave the i64 range (or an f64 sum that is not finite).
    SumOverflow {
        field: u16,
    },
    /// The rendered payload would exceed `max_payload_bytes`.
    PayloadTooLarge,
    /// A new box past `max_boxes` (507 for a single message).
    TooManyBoxes,
    /// The key is outside the token's write scope (403 for a single message).
    Forbidden,
}

impl MessageError {
    /// HTTP status when this is the answer to a single-message ingest.
    pub fn status(&self) -> u16 {
        match self {
            MessageError::TooManyBoxes => 507,
            MessageError::Forbidden => 403,
            _ => 422,
        }
    }

    /// Label for `pollbox_ingest_messages_total{result=...}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            MessageError::NotAnObject => "not_object",
            MessageError::MissingKey
            | MessageError::KeyNotString
            | MessageError::EmptyKey
            | MessageError::KeyTooLong
            | MessageError::KeyNotUtf8
            | MessageError::ReservedKey => "bad_key",
            MessageError::WrongType { .. } => "wrong_type",
            MessageError::StringTooLong { .. } => "string_too_long",
            MessageError::SumOverflow { .. } => "overflow",
            MessageError::PayloadTooLarge => "payload_too_large",
            MessageError::TooManyBoxes => "too_many_boxes",
            MessageError::Forbidden => "forbidden",
        }
    }

    /// Append the human-readable reason (plain text, no JSON quoting) to `out`,
    /// e.g. `missing key: no member named key` or `field by: string longer
    /// than 16 bytes`.
    pub fn write_reason(&self, plan: &Plan, out: &mut Vec<u8>) {
        let field = |i: u16| plan.fields.get(i as usize);
        match *self {
            MessageError::NotAnObject => out.extend_from_slice(b"not an object"),
            MessageError::MissingKey => {
                // Named, so a batch sent with another key member says what is
                // missing; a name that would need JSON escapes is not echoed.
                out.extend_from_slice(b"missing key: no member named ");
                let k = plan.key_field.as_bytes();
                if k.iter()
                    .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
                {
                    out.extend_from_slice(k);
                } else {
                    out.extend_from_slice(b"boxes.key_field");
                }
            }
            MessageError::KeyNotString => out.extend_from_slice(b"key is not a string"),
            MessageError::EmptyKey => out.extend_from_slice(b"key is empty"),
            MessageError::KeyTooLong => {
                out.extend_from_slice(b"key longer than ");
                out.extend_from_slice(itoa::Buffer::new().format(plan.max_key_bytes).as_bytes());
                out.extend_from_slice(b" bytes");
            }
            MessageError::KeyNotUtf8 => out.extend_from_slice(b"key is not valid UTF-8"),
            MessageError::ReservedKey => out.extend_from_slice(
                b"key ends with ~presence, which names a room's presence: no message writes it",
            ),
            MessageError::WrongType { field: i } => {
                if let Some(f) = field(i) {
                    out.extend_from_slice(b"field ");
                    out.extend_from_slice(f.name.as_bytes());
                    out.extend_from_slice(b": expected ");
                    out.extend_from_slice(match f.ty {
                        FieldType::I64 => b"an integer (i64)".as_slice(),
                        FieldType::F64 => b"a number (f64)",
                        FieldType::Bool => b"a boolean",
                        FieldType::Str => b"a string",
                    });
                }
            }
            MessageError::StringTooLong { field: i } => {
                if let Some(f) = field(i) {
                    out.extend_from_slice(b"field ");
                    out.extend_from_slice(f.name.as_bytes());
                    out.extend_from_slice(b": string longer than ");
                    out.extend_from_slice(itoa::Buffer::new().format(f.max_len).as_bytes());
                    out.extend_from_slice(b" bytes");
                }
            }
            MessageError::SumOverflow { field: i } => {
                if let Some(f) = field(i) {
                    out.extend_from_slice(b"field ");
                    out.extend_from_slice(f.name.as_bytes());
                    out.extend_from_slice(b": sum overflows");
                }
            }
            MessageError::PayloadTooLarge => {
                out.extend_from_slice(b"payload would exceed ");
                out.extend_from_slice(
                    itoa::Buffer::new()
                        .format(plan.max_payload_bytes)
                        .as_bytes(),
                );
                out.extend_from_slice(b" bytes");
            }
            MessageError::TooManyBoxes => {
                out.extend_from_slice(b"too many boxes (max_boxes is ");
                out.extend_from_slice(itoa::Buffer::new().format(plan.max_boxes).as_bytes());
                out.extend_from_slice(b")");
            }
            MessageError::Forbidden => {
                out.extend_from_slice(b"forbidden: key outside the token's write scope")
            }
        }
    }
}
