//! Why a whole body was refused, and where in it the JSON went wrong.

use simd_json::ErrorType;

/// A body refused whole: nothing in it is applied (SPEC §5).
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

/// Turn a simd-json error on `doc` (which starts at byte `base` of the body)
/// into a [`BodyError::InvalidJson`] with an offset a user can look up.
///
/// Structural errors carry the offending character and its offset. Stage-1
/// errors (UTF-8, raw control characters, unterminated strings, no value at
/// all) come with offset 0 and string-escape errors with an offset inside the
/// string, so for those the document is scanned again to find the spot; this
/// runs only on the error path.
#[cold]
pub(super) fn invalid_json(err: &simd_json::Error, doc: &[u8], base: usize) -> BodyError {
    let ty = err.error();
    let rescan = err.character().is_none()
        || matches!(
            ty,
            ErrorType::InvalidEscape
                | ErrorType::InvalidUnicodeEscape
                | ErrorType::InvalidUnicodeCodepoint
                | ErrorType::InvalidUtf8
        );
    let (local, what) = match rescan.then(|| find_lexical_error(doc)).flatten() {
        Some(found) => found,
        None if err.character().is_some() => (err.index(), describe(ty)),
        None => (0, describe(ty)),
    };
    BodyError::InvalidJson {
        at: base + local.min(doc.len()),
        what,
    }
}

fn describe(ty: &ErrorType) -> &'static str {
    match ty {
        ErrorType::InvalidUtf8 => "invalid UTF-8",
        ErrorType::InvalidNumber | ErrorType::InvalidExponent => "invalid number",
        ErrorType::InvalidEscape => "invalid escape in string",
        ErrorType::InvalidUnicodeEscape | ErrorType::InvalidUnicodeCodepoint => {
            "invalid unicode escape in string"
        }
        ErrorType::UnterminatedString => "unterminated string",
        ErrorType::Eof => "unexpected end of input",
        ErrorType::TrailingData => "trailing characters after the value",
        ErrorType::DepthLimitExceeded => "nesting too deep",
        ErrorType::ExpectedObjectColon => "expected ':'",
        ErrorType::ExpectedArrayComma => "expected ',' or ']'",
        ErrorType::ExpectedMapComma => "expected ',' or '}'",
        ErrorType::ExpectedObjectKey | ErrorType::KeyMustBeAString | ErrorType::BadKeyType => {
            "expected a string member name"
        }
        ErrorType::ExpectedTrue
        | ErrorType::ExpectedFalse
        | ErrorType::ExpectedNull
        | ErrorType::ExpectedArrayContent
        | ErrorType::ExpectedObjectContent
        | ErrorType::UnexpectedCharacter
        | ErrorType::InternalError
        | ErrorType::Syntax => "unexpected character",
        ErrorType::InputTooLarge => "body too large",
        _ => "syntax error",
    }
}

/// The first lexical error in `doc`: invalid UTF-8, a raw control character
/// or a bad escape inside a string, a string left open, or no value at all.
/// `None` when the bytes are lexically fine (the error is structural).
fn find_lexical_error(doc: &[u8]) -> Option<(usize, &'static str)> {
    if let Err(e) = std::str::from_utf8(doc) {
        return Some((e.valid_up_to(), "invalid UTF-8"));
    }
    let mut i = 0;
    let mut any_value = false;
    while i < doc.len() {
        match doc[i] {
            b'"' => {
                any_value = true;
                i = match scan_string(doc, i) {
                    Ok(end) => end,
                    Err(found) => return Some(found),
                };
            }
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                any_value = true;
                i += 1;
            }
        }
    }
    (!any_value).then_some((doc.len(), "no JSON value"))
}

/// Check the string opening at `doc[open]`; `Ok` with the offset after its
/// closing quote.
fn scan_string(doc: &[u8], open: usize) -> Result<usize, (usize, &'static str)> {
    const BAD_ESCAPE: &str = "invalid escape in string";
    const BAD_UNICODE: &str = "invalid unicode escape in string";
    let mut i = open + 1;
    while let Some(&b) = doc.get(i) {
        match b {
            b'"' => return Ok(i + 1),
            b'\\' => match doc.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                Some(b'u') => {
                    let unit = hex4(doc, i + 2).ok_or((i, BAD_UNICODE))?;
                    match unit {
                        0xD800..=0xDBFF => {
                            // A high surrogate must be followed by an escaped low one.
                            let low = (doc.get(i + 6) == Some(&b'\\')
                                && doc.get(i + 7) == Some(&b'u'))
                            .then(|| hex4(doc, i + 8))
                            .flatten();
                            if !matches!(low, Some(0xDC00..=0xDFFF)) {
                                return Err((i, BAD_UNICODE));
                            }
                            i += 12;
                        }
                        0xDC00..=0xDFFF => return Err((i, BAD_UNICODE)),
                        _ => i += 6,
                    }
                }
                _ => return Err((i, BAD_ESCAPE)),
            },
            0x00..=0x1F => return Err((i, "control character in string")),
            _ => i += 1,
        }
    }
    Err((open, "unterminated string"))
}

fn hex4(doc: &[u8], at: usize) -> Option<u32> {
    let digits = doc.get(at..at + 4)?;
    digits.iter().try_fold(0u32, |acc, &d| {
        let v = (d as char).to_digit(16)?;
        Some(acc * 16 + v)
    })
}
