//! The projection plan: the config's `[[boxes.field]]` list compiled once into
//! the form the parser, the box table and the renderer share.

use crate::config::{parse_pointer, BoxesConfig, ConfigError, FieldType, Reduce};

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
