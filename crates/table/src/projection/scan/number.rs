//! A JSON number: its grammar (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`,
//! and serde_json's rule that its value be finite), a plain number on a fast
//! path, and the decoding of a validated number's text into an i64 or the
//! correctly rounded f64.
//!
//! What it is not: which field type a number fits (`i64` or `f64`: the
//! projection's, when it reads a field).

use super::token::byte;
use super::Fail;

pub(super) const BAD_NUMBER: &str = "invalid number";
pub(super) const OUT_OF_RANGE: &str = "number out of range";

/// At `-` or a digit: the offset after the number when it is a plain one
/// (an integer, or with a fraction, of at most 308 integer digits and no
/// exponent); `None` for anything else, valid or not, which [`number_end`]
/// then reads. An `Option` stays in registers where `number_end`'s
/// `Result` goes through memory.
#[inline(always)]
pub(super) fn number_fast(buf: &[u8], start: usize) -> Option<usize> {
    let digit = |i: usize| byte(buf, i).wrapping_sub(b'0') < 10;
    let int_start = start + usize::from(byte(buf, start) == b'-');
    let mut i = int_start + 1;
    match byte(buf, int_start) {
        b'0' => {}
        b'1'..=b'9' => {
            while digit(i) {
                i += 1;
            }
        }
        _ => return None,
    }
    match byte(buf, i) {
        b'.' => {
            let mut j = i + 1;
            while digit(j) {
                j += 1;
            }
            match byte(buf, j) {
                _ if j == i + 1 => None,
                b'e' | b'E' => None,
                _ if i - int_start > 308 => None,
                _ => Some(j),
            }
        }
        // An exponent, or a digit after a leading zero.
        b'e' | b'E' | b'0'..=b'9' => None,
        _ if i - int_start > 308 => None,
        _ => Some(i),
    }
}

/// At `-` or a digit: the offset after the number, and whether it is an
/// integer (no fraction, no exponent).
#[inline(always)]
pub(super) fn number_end(buf: &[u8], start: usize) -> Result<(usize, bool), Fail> {
    let digit = |i: usize| byte(buf, i).wrapping_sub(b'0') < 10;
    let int_start = start + usize::from(byte(buf, start) == b'-');
    let mut i = int_start + 1;
    match byte(buf, int_start) {
        b'0' => {
            if digit(i) {
                return Err((i, BAD_NUMBER));
            }
        }
        b'1'..=b'9' => {
            while digit(i) {
                i += 1;
            }
        }
        _ => return Err((int_start, BAD_NUMBER)),
    }
    let int_digits = i - int_start;
    match byte(buf, i) {
        // A fraction without an exponent, the common case, is read here;
        // [`number_rest`] takes exponents and the rare long integer part.
        b'.' if int_digits <= 308 => {
            let mut j = i + 1;
            while digit(j) {
                j += 1;
            }
            match byte(buf, j) {
                _ if j == i + 1 => Err((j, BAD_NUMBER)),
                b'e' | b'E' => number_rest(buf, start, i, int_digits),
                _ => Ok((j, false)),
            }
        }
        b'.' | b'e' | b'E' => number_rest(buf, start, i, int_digits),
        _ if int_digits > 308 => number_rest(buf, start, i, int_digits),
        _ => Ok((i, true)),
    }
}

/// A number's fraction and exponent, from `i`, and its range.
#[inline(never)]
fn number_rest(
    buf: &[u8],
    start: usize,
    mut i: usize,
    int_digits: usize,
) -> Result<(usize, bool), Fail> {
    let digit = |i: usize| matches!(buf.get(i), Some(b'0'..=b'9'));
    let mut int = true;
    if buf.get(i) == Some(&b'.') {
        i += 1;
        if !digit(i) {
            return Err((i, BAD_NUMBER));
        }
        while digit(i) {
            i += 1;
        }
        int = false;
    }
    // An upper bound of the number's decimal magnitude: |value| <
    // 10^magnitude.
    let mut magnitude = int_digits as i64;
    if let Some(b'e' | b'E') = buf.get(i) {
        int = false;
        i += 1;
        let negative = match buf.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        if !digit(i) {
            return Err((i, BAD_NUMBER));
        }
        let mut exp: i64 = 0;
        while let Some(&d) = buf.get(i).filter(|d| d.is_ascii_digit()) {
            exp = (exp * 10 + i64::from(d - b'0')).min(1 << 40);
            i += 1;
        }
        if !negative {
            magnitude += exp;
        }
    }
    // Below 10^308 every number is finite; past it, round it to see.
    if magnitude > 308 && !parse_f64(&buf[start..i]).is_finite() {
        return Err((start, OUT_OF_RANGE));
    }
    Ok((i, int))
}

/// An integer's text (`-?[0-9]+`, validated) as i64; `None` past i64.
#[inline]
pub(in crate::projection) fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    // Accumulate negatively so that i64::MIN fits.
    let mut n: i64 = 0;
    for &d in digits {
        n = n
            .checked_mul(10)?
            .checked_sub(i64::from(d.wrapping_sub(b'0')))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// A validated number's text as the nearest f64 (correctly rounded).
#[inline]
pub(in crate::projection) fn parse_f64(text: &[u8]) -> f64 {
    // Validated number text is ASCII, so this cannot fail.
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}
