//! The `[boxes]` section of the configuration (docs/config.md#boxes): the
//! key, the sizes and the fields a box keeps, with the checks that types
//! alone cannot make, and the error every section's check answers with.
//!
//! What it is not: the whole configuration. The file, its other sections and
//! their checks belong to the protocol crate (`pollbox_core::config`), which
//! holds this section as `Config::boxes`.

use serde::{Deserialize, Serialize};

/// Why a configuration was refused. The message always names the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("config: {0}")]
    Parse(String),
    #[error("config: `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BoxesConfig {
    pub key_field: String,
    pub max_key_bytes: usize,
    pub max_boxes: usize,
    pub max_payload_bytes: usize,
    /// A box with no accepted message for this many seconds is removed; 0 = never.
    pub ttl_s: u64,
    /// Every key kept in order for pages and streams of a prefix
    /// (docs/boxes.md#rooms); off, prefix routes are 404 and a box costs
    /// about 60 bytes less.
    pub rooms: bool,
    #[serde(rename = "field")]
    pub fields: Vec<FieldConfig>,
}

/// One payload field: where it comes from in a message, its type and reducer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldConfig {
    pub name: String,
    /// JSON pointer (RFC 6901); absent only for `count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub ty: Option<FieldType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    pub reduce: Reduce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    I64,
    F64,
    Bool,
    Str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    Last,
    Sum,
    Min,
    Max,
    Count,
}

impl Default for BoxesConfig {
    fn default() -> Self {
        let field = |name: &str, path: Option<&str>, ty, max_len, reduce| FieldConfig {
            name: name.into(),
            path: path.map(Into::into),
            ty,
            max_len,
            reduce,
        };
        Self {
            key_field: "key".into(),
            max_key_bytes: 128,
            max_boxes: 1_000_000,
            max_payload_bytes: 256,
            ttl_s: 0,
            rooms: true,
            fields: vec![
                field(
                    "v",
                    Some("/value"),
                    Some(FieldType::I64),
                    None,
                    Reduce::Last,
                ),
                field(
                    "sum",
                    Some("/value"),
                    Some(FieldType::I64),
                    None,
                    Reduce::Sum,
                ),
                field("n", None, None, None, Reduce::Count),
                field(
                    "by",
                    Some("/player"),
                    Some(FieldType::Str),
                    Some(16),
                    Reduce::Last,
                ),
            ],
        }
    }
}

impl BoxesConfig {
    /// `[boxes]`: the key, the sizes, the fields and the payload they render.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let b = self;
        if b.key_field.is_empty() {
            return Err(invalid("boxes.key_field", "must not be empty"));
        }
        if b.max_key_bytes == 0 || b.max_key_bytes > 4096 {
            return Err(invalid("boxes.max_key_bytes", "must be 1 to 4096"));
        }
        if b.max_boxes == 0 {
            return Err(invalid("boxes.max_boxes", "must be greater than 0"));
        }
        if b.max_payload_bytes < 16 || b.max_payload_bytes > 65_536 {
            return Err(invalid("boxes.max_payload_bytes", "must be 16 to 65536"));
        }
        if b.ttl_s > MAX_TTL_S {
            return Err(invalid(
                "boxes.ttl_s",
                format!("must be 0 (never) to {MAX_TTL_S} (about 68 years)"),
            ));
        }
        if b.fields.is_empty() {
            return Err(invalid(
                "boxes.field",
                "at least one [[boxes.field]] is needed",
            ));
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, f) in b.fields.iter().enumerate() {
            check_field(b, i, f, &mut names)?;
        }
        let worst = largest_payload(b);
        if worst > b.max_payload_bytes {
            return Err(invalid(
                "boxes.max_payload_bytes",
                format!(
                    "the fields' largest values render a payload of {worst} bytes with an \
                     empty key, over {}: every box whose fields grow that large would be \
                     refused (422); raise max_payload_bytes or lower the fields' max_len",
                    b.max_payload_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// One `[[boxes.field]]`, the `i`th; `names` are the fields' names before it
/// (this one's is added).
fn check_field<'c>(
    b: &'c BoxesConfig,
    i: usize,
    f: &'c FieldConfig,
    names: &mut Vec<&'c str>,
) -> Result<(), ConfigError> {
    let at = |k: &str| format!("boxes.field[{i}].{k}");
    if f.name.is_empty()
        || !f
            .name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    {
        return Err(invalid(at("name"), "must be non-empty [A-Za-z0-9_-]"));
    }
    if f.name == "k" || f.name == "ver" {
        return Err(invalid(at("name"), "`k` and `ver` are reserved"));
    }
    if names.contains(&f.name.as_str()) {
        return Err(invalid(at("name"), format!("`{}` is used twice", f.name)));
    }
    names.push(&f.name);
    match f.reduce {
        Reduce::Count => {
            if f.path.is_some() {
                return Err(invalid(
                    at("path"),
                    "a count counts every accepted message and reads no path: leave `path` out",
                ));
            }
            if f.ty.is_some_and(|t| t != FieldType::I64) {
                return Err(invalid(at("type"), "a count is an i64; leave `type` out"));
            }
            if f.max_len.is_some() {
                return Err(invalid(at("max_len"), "only for type = \"str\""));
            }
        }
        reduce => {
            let Some(path) = &f.path else {
                return Err(invalid(at("path"), "required unless reduce = \"count\""));
            };
            if let Err(reason) = parse_pointer(path) {
                return Err(invalid(at("path"), reason));
            }
            let Some(ty) = f.ty else {
                return Err(invalid(at("type"), "required unless reduce = \"count\""));
            };
            match ty {
                FieldType::Str => match f.max_len {
                    None => return Err(invalid(at("max_len"), "required for type = \"str\"")),
                    Some(0) => return Err(invalid(at("max_len"), "must be at least 1")),
                    Some(n) if n > b.max_payload_bytes => {
                        return Err(invalid(
                            at("max_len"),
                            "must not exceed boxes.max_payload_bytes",
                        ))
                    }
                    Some(_) => {}
                },
                _ if f.max_len.is_some() => {
                    return Err(invalid(at("max_len"), "only for type = \"str\""))
                }
                _ => {}
            }
            let numeric = matches!(ty, FieldType::I64 | FieldType::F64);
            if matches!(reduce, Reduce::Sum | Reduce::Min | Reduce::Max) && !numeric {
                return Err(invalid(
                    at("reduce"),
                    "sum, min and max need type = \"i64\" or \"f64\"",
                ));
            }
        }
    }
    Ok(())
}

/// The longest payload the fields can render, with an empty key: `{"k":"",
/// "ver":` and a 20-digit version, then each field at its widest (an i64 or
/// a count 20 characters, an f64 24, a bool 5, a string its `max_len` and
/// two quotes, unescaped). A key may then take what is left of
/// `max_payload_bytes`; a string that needs escapes renders longer.
pub fn largest_payload(b: &BoxesConfig) -> usize {
    let head = r#"{"k":"","ver":}"#.len() + 20;
    head + b
        .fields
        .iter()
        .map(|f| {
            let value = match (f.reduce, f.ty) {
                (Reduce::Count, _) | (_, Some(FieldType::I64)) | (_, None) => 20,
                (_, Some(FieldType::F64)) => 24,
                (_, Some(FieldType::Bool)) => 5,
                (_, Some(FieldType::Str)) => f.max_len.unwrap_or(0) + 2,
            };
            r#","":"#.len() + f.name.len() + value
        })
        .sum::<usize>()
}

/// The longest `boxes.ttl_s`: expiry times are kept as 32-bit seconds.
pub const MAX_TTL_S: u64 = (1 << 31) - 1;

/// Split an RFC 6901 JSON pointer into its unescaped reference tokens.
/// Only object members are addressed (no array indices), so every token is a key.
pub fn parse_pointer(path: &str) -> Result<Vec<String>, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "`{path}` is not a JSON pointer (it must start with `/`)"
        ));
    }
    let mut out = Vec::new();
    for raw in path[1..].split('/') {
        let mut tok = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '~' {
                match chars.next() {
                    Some('0') => tok.push('~'),
                    Some('1') => tok.push('/'),
                    _ => return Err(format!("`{path}`: `~` must be followed by 0 or 1")),
                }
            } else {
                tok.push(c);
            }
        }
        out.push(tok);
    }
    Ok(out)
}
