//! A validating single-pass JSON scanner (RFC 8259, with serde_json's limits).
//!
//! The [`Scanner`] is a cursor over one document. It checks the whole grammar
//! and the UTF-8 of every string as it goes, but materialises nothing: a
//! string is reported as the byte range of its (still escaped) contents, a
//! number as the range of its text. The projection decides which of those it
//! needs and decodes only them (see [`unescape_into`], [`parse_i64`],
//! [`parse_f64`]); everything else is stepped over once, validated, and
//! forgotten.
//!
//! What is accepted is exactly what `serde_json::from_slice::<Value>` accepts
//! (with its `float_roundtrip` rounding):
//! - whitespace is space, tab, CR and LF only;
//! - strings: no raw control characters (`< 0x20`), valid UTF-8, the escapes
//!   `\" \\ \/ \b \f \n \r \t \uXXXX`, and `\u` escapes of surrogates only as
//!   a high-low pair;
//! - numbers: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` whose value,
//!   correctly rounded to f64, is finite (`1e400` is out of range; `1e-400` is
//!   0; an integer past u64 is a valid number);
//! - at most [`MAX_DEPTH`] arrays and objects nested (serde_json's recursion
//!   limit of 128 refuses the 128th).
//!
//! Errors carry the byte offset in the document of the first problem.
//!
//! One job a file:
//! - this file: what a scan fails with, the depth limit, and [`validate`];
//! - `scanner.rs`: the [`Scanner`], the cursor the projection drives value by
//!   value, and what it reports of a value ([`Found`]);
//! - `skip.rs`: the cargo skip, a value validated and stepped over in one
//!   loop (large containers are split in two by `projection::ahead`);
//! - `token.rs`: whitespace, the byte at an offset, literals, member names;
//! - `string.rs`: a string validated in place (16 bytes at a time where
//!   plain, then escapes and UTF-8);
//! - `number.rs`: the number grammar, and a number's text decoded;
//! - `unescape.rs`: a string's contents decoded, or compared unescaped.
//!
//! What it is not: the choice of what to read (the configured paths,
//! `projection::paths`) or the rules of a message (`projection`).

mod ahead;
#[cfg(test)]
mod ahead_tests;
mod number;
mod scanner;
mod skip;
mod string;
mod token;
mod unescape;

#[cfg(test)]
mod tests;

pub(super) use number::{parse_f64, parse_i64};
pub(super) use scanner::{Found, Scanner};
pub(super) use skip::{step, Cursor};
pub(super) use string::{member_head, string_end};
pub(super) use token::{name_end, next};
pub(super) use unescape::{unescape_into, unescaped_eq};

/// A problem at a byte offset of the scanned document.
pub(super) type Fail = (usize, &'static str);

/// Most arrays/objects open at once: serde_json refuses the 128th.
pub const MAX_DEPTH: u32 = 127;

pub(super) const UNEXPECTED: &str = "unexpected character";
pub(super) const EOF: &str = "unexpected end of input";

/// Validate `doc` as one JSON text: `Ok` for any valid JSON value.
pub fn validate(doc: &[u8]) -> Result<(), (usize, &'static str)> {
    let mut s = Scanner::new(doc);
    if s.skip_ws().is_none() {
        return Err((doc.len(), "no JSON value"));
    }
    s.value()?;
    s.finish()
}

/// [`validate`] with a top-level container's skip split at `target` after
/// `w` steps ([`ahead::skip_split`]).
pub fn validate_split(doc: &[u8], w: usize, target: usize) -> Result<(), Fail> {
    let mut s = Scanner::new(doc);
    match s.skip_ws() {
        None => return Err((doc.len(), "no JSON value")),
        Some(b'{' | b'[') => s.pos = ahead::skip_split(doc, s.pos, w, target)?,
        Some(_) => {
            s.value()?;
        }
    }
    s.finish()
}
