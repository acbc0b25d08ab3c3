//! Why a whole body was refused, and where in it the JSON went wrong.

/// A body refused whole: nothing in it is applied (docs/http.md#bad-input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not valid JSON, or not valid UTF-8. `at` is the byte offset in the whole
    /// body (for NDJSON too: the line's start plus the offset in the line).
    #[error("invalid json: {what} at byte {at}")]
    InvalidJson { at: usize, what: &'static str },
    /// The top level is a scalar, or an array where one object is expected
    /// (`POST /v1/boxes/{key}`).
    #[error("body must be a JSON object or an array of objects")]
    NotObjectOrArray,
    /// The worker's arena reached `arena_limit_bytes`; ingest is refused until
    /// the next epoch resets it.
    #[error("ingest arena full, retry after the next epoch")]
    ArenaFull,
}

impl BodyError {
    /// HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            BodyError::InvalidJson { .. } | BodyError::NotObjectOrArray => 400,
            BodyError::ArenaFull => 503,
        }
    }

    /// Append the reason as plain text (the caller wraps it in
    /// `{"error":"..."}`). The text is ASCII without `"` or `\`, so it needs no
    /// JSON escaping.
    pub fn write_message(&self, out: &mut Vec<u8>) {
        match *self {
            BodyError::InvalidJson { at, what } => {
                out.extend_from_slice(b"invalid json: ");
                out.extend_from_slice(what.as_bytes());
                out.extend_from_slice(b" at byte ");
                out.extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
            }
            BodyError::NotObjectOrArray => {
                out.extend_from_slice(b"body must be a JSON object or an array of objects")
            }
            BodyError::ArenaFull => {
                out.extend_from_slice(b"ingest arena full, retry after the next epoch")
            }
        }
    }

    /// Label for `pollbox_ingest_messages_total{result=...}` and request metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            BodyError::InvalidJson { .. } => "invalid_json",
            BodyError::NotObjectOrArray => "not_object",
            BodyError::ArenaFull => "arena_full",
        }
    }
}

/// A scanner failure at `local` in a document that starts at byte `base` of
/// the body.
#[cold]
pub(super) fn invalid_json((local, what): super::scan::Fail, base: usize) -> BodyError {
    BodyError::InvalidJson {
        at: base + local,
        what,
    }
}
