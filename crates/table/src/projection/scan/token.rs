//! The bytes between tokens and the small tokens: whitespace, the byte at an
//! offset (0 past the end, which no token starts with), the literals `true`,
//! `false` and `null`, a member name with its `:`, and the error for a byte
//! that starts nothing (the end of input when there is none).
//!
//! What it is not: the grammar of a string or a number (`string`, `number`);
//! a member name's string is read by `string`.

use super::string::string_end;
use super::{Fail, EOF, UNEXPECTED};

/// Step over whitespace from `i`.
#[inline(always)]
pub(super) fn ws(buf: &[u8], mut i: usize) -> usize {
    while let Some(&b) = buf.get(i) {
        if b > b' ' || !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            break;
        }
        i += 1;
    }
    i
}

/// The byte at `i`; 0 past the end (a byte no token starts with).
#[inline(always)]
pub(super) fn byte(buf: &[u8], i: usize) -> u8 {
    match buf.get(i) {
        Some(&b) => b,
        None => 0,
    }
}

/// The first byte from `i` that is not whitespace, and its offset; 0 at the
/// end. One load and one compare when `buf[i]` is no whitespace.
#[inline(always)]
pub(in crate::projection) fn next(buf: &[u8], i: usize) -> (usize, u8) {
    let c = byte(buf, i);
    if c > b' ' {
        (i, c)
    } else {
        next_after_ws(buf, i)
    }
}

#[inline(never)]
fn next_after_ws(buf: &[u8], i: usize) -> (usize, u8) {
    let i = ws(buf, i);
    (i, byte(buf, i))
}

/// The error for an unexpected byte at `i`: the end of input if there is none.
#[cold]
pub(super) fn at_end_or(buf: &[u8], i: usize, what: &'static str) -> Fail {
    if i >= buf.len() {
        (i, EOF)
    } else {
        (i, what)
    }
}

#[inline(always)]
pub(super) fn literal_end(buf: &[u8], i: usize, word: &[u8]) -> Result<usize, Fail> {
    if buf.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err((i, UNEXPECTED))
    }
}

/// At a member name's `"`: the offset after the name and its `:`.
#[inline(always)]
pub(in crate::projection) fn name_end(buf: &[u8], i: usize) -> Result<usize, Fail> {
    let i = string_end(buf, i)?;
    if byte(buf, i) == b':' {
        return Ok(i + 1);
    }
    let (i, c) = next(buf, i);
    if c == b':' {
        Ok(i + 1)
    } else {
        Err(at_end_or(buf, i, "expected ':'"))
    }
}
