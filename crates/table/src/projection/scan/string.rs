//! A JSON string validated in place: plain ASCII 16 bytes at a time (a
//! member's `{"name":` head in one read), then escapes, control characters
//! and UTF-8 (RFC 3629) byte by byte; the result is the offset after the
//! closing quote, the contents stay escaped in the document.
//!
//! What it is not: the decoding of a string's contents (`unescape`), done
//! only for the strings the projection reads.

use super::{Fail, EOF};

pub(super) const BAD_ESCAPE: &str = "invalid escape in string";
pub(super) const BAD_UNICODE: &str = "invalid unicode escape in string";
pub(super) const BAD_UTF8: &str = "invalid UTF-8";

/// The bytes of a 16-byte chunk of a string that end its fast path (`"`,
/// `\\`, a control character or any non-ASCII byte), one bit per byte (bit
/// `k`: byte `k`), the quotes among them, and the colons (for a member
/// name's `:`; a caller that does not read them pays nothing for them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn stops16(chunk: &[u8; 16]) -> (u32, u32, u32) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_set_epi64x,
    };
    let [a, b, c, d, e, f, g, h, rest @ ..] = *chunk;
    let lo = u64::from_le_bytes([a, b, c, d, e, f, g, h]);
    let hi = u64::from_le_bytes(rest);
    // SAFETY: these intrinsics only compute on values (no pointer, no
    // memory access); they are `unsafe` only for the CPU feature they need,
    // SSE2, which every x86_64 CPU has (it is part of the target's
    // baseline). Covered by the scanner's tests and JSONTestSuite, and on
    // arbitrary bytes by the `projection` and `projection_diff` fuzz targets.
    // They compile to one unaligned load and five vector instructions.
    unsafe {
        let v = _mm_set_epi64x(hi as i64, lo as i64);
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Signed: below 0x20, and every byte from 0x80 (negative).
        let low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
        let stops = _mm_or_si128(_mm_or_si128(quote, backslash), low);
        let colon = _mm_cmpeq_epi8(v, _mm_set1_epi8(b':' as i8));
        (
            _mm_movemask_epi8(stops) as u32,
            _mm_movemask_epi8(quote) as u32,
            _mm_movemask_epi8(colon) as u32,
        )
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(super) fn stops16(chunk: &[u8; 16]) -> (u32, u32, u32) {
    let (mut stops, mut quotes, mut colons) = (0u32, 0u32, 0u32);
    for (k, &b) in chunk.iter().enumerate() {
        let quote = b == b'"';
        if quote || b == b'\\' || !(0x20..0x80).contains(&b) {
            stops |= 1 << k;
        }
        quotes |= u32::from(quote) << k;
        colons |= u32::from(b == b':') << k;
    }
    (stops, quotes, colons)
}

/// The 16 bytes from `i`, if there are as many.
#[inline(always)]
fn chunk16(buf: &[u8], i: usize) -> Option<&[u8; 16]> {
    buf.get(i..).and_then(<[u8]>::first_chunk)
}

/// A string's first 16 bytes from `i`: `Ok(close)` when they hold its
/// closing quote at `close` and nothing to check before it, else
/// `Err(offset)` of the first byte [`string_rest`] must look at.
#[inline(always)]
pub(super) fn string_head(buf: &[u8], i: usize) -> Result<usize, usize> {
    let Some(chunk) = chunk16(buf, i) else {
        return Err(i);
    };
    let (stops, quotes, _) = stops16(chunk);
    let first = stops & stops.wrapping_neg();
    if first & quotes != 0 {
        Ok(i + first.trailing_zeros() as usize)
    } else {
        Err(i + (stops.trailing_zeros() as usize).min(16))
    }
}

/// At a `{`, or a `,` in an object, the common case in one 16-byte read:
/// when the bytes from `i` are `{"name":` or `,"name":` with a plain name
/// (no escape, control character or non-ASCII byte) and no space, the
/// offset after the `:`. `None` sends the caller to the byte-by-byte path,
/// which validates the same bytes and finds the error if there is one.
#[inline(always)]
pub(in crate::projection) fn member_head(buf: &[u8], i: usize) -> Option<usize> {
    let (stops, quotes, colons) = stops16(chunk16(buf, i)?);
    // Byte 1 opens the name (tested on the mask, not by reading the byte
    // again, which makes the compiler rebuild the vector from pieces).
    let open = quotes & 2 != 0;
    // Bit `k` of these: byte `i + 2 + k`, the name's `k`-th byte.
    let (stops, quotes) = (stops >> 2, quotes >> 2);
    let first = stops & stops.wrapping_neg();
    // The first stop is the closing quote and the byte after it a colon.
    if open && first & quotes & (colons >> 3) != 0 {
        Some(i + 2 + first.trailing_zeros() as usize + 2)
    } else {
        None
    }
}

/// At a `"`: the offset after the string's closing quote, validating it.
/// Plain ASCII is checked 16 bytes at a time here; escapes and non-ASCII
/// go to [`string_rest`].
#[inline(always)]
pub(in crate::projection) fn string_end(buf: &[u8], open: usize) -> Result<usize, Fail> {
    match string_head(buf, open + 1) {
        Ok(close) => Ok(close + 1),
        Err(i) => string_rest(buf, open, i).map(|(end, _)| end),
    }
}

/// The string opened at `open`, from `i` on: the offset after its closing
/// quote and whether it has escapes.
#[inline(never)]
pub(super) fn string_rest(buf: &[u8], open: usize, mut i: usize) -> Result<(usize, bool), Fail> {
    let mut escaped = false;
    loop {
        while let Some(chunk) = chunk16(buf, i) {
            let (stops, _, _) = stops16(chunk);
            if stops != 0 {
                i += stops.trailing_zeros() as usize;
                break;
            }
            i += 16;
        }
        let Some(&b) = buf.get(i) else {
            return Err((open, "unterminated string"));
        };
        match b {
            b'"' => return Ok((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                i = escape(buf, i)?;
            }
            0x00..=0x1F => return Err((i, "control character in string")),
            0x80..=0xFF => i = utf8(buf, i)?,
            _ => i += 1,
        }
    }
}

/// At `buf[i] == b'\\'`: check one escape; the offset after it.
#[inline]
fn escape(buf: &[u8], i: usize) -> Result<usize, Fail> {
    match buf.get(i + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
        Some(b'u') => {
            let unit = hex4(buf, i + 2).ok_or((i, BAD_UNICODE))?;
            match unit {
                0xD800..=0xDBFF => {
                    // A high surrogate must be followed by an escaped low one.
                    let low = (buf.get(i + 6) == Some(&b'\\') && buf.get(i + 7) == Some(&b'u'))
                        .then(|| hex4(buf, i + 8))
                        .flatten();
                    if matches!(low, Some(0xDC00..=0xDFFF)) {
                        Ok(i + 12)
                    } else {
                        Err((i, BAD_UNICODE))
                    }
                }
                0xDC00..=0xDFFF => Err((i, BAD_UNICODE)),
                _ => Ok(i + 6),
            }
        }
        Some(_) => Err((i, BAD_ESCAPE)),
        None => Err((i, EOF)),
    }
}

pub(super) fn hex4(buf: &[u8], at: usize) -> Option<u32> {
    let digits = buf.get(at..at + 4)?;
    digits.iter().try_fold(0u32, |acc, &d| {
        let v = (d as char).to_digit(16)?;
        Some(acc * 16 + v)
    })
}

/// At a non-ASCII byte `buf[i]`: check one UTF-8 sequence (RFC 3629: no
/// overlong forms, no surrogates, nothing past U+10FFFF); the offset after it.
#[inline]
fn utf8(buf: &[u8], i: usize) -> Result<usize, Fail> {
    let cont =
        |at: usize, lo: u8, hi: u8| matches!(buf.get(at), Some(&b) if (lo..=hi).contains(&b));
    let ok = match buf[i] {
        0xC2..=0xDF => cont(i + 1, 0x80, 0xBF).then_some(2),
        0xE0 => (cont(i + 1, 0xA0, 0xBF) && cont(i + 2, 0x80, 0xBF)).then_some(3),
        0xE1..=0xEC | 0xEE..=0xEF => {
            (cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF)).then_some(3)
        }
        0xED => (cont(i + 1, 0x80, 0x9F) && cont(i + 2, 0x80, 0xBF)).then_some(3),
        0xF0 => (cont(i + 1, 0x90, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
            .then_some(4),
        0xF1..=0xF3 => {
            (cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
                .then_some(4)
        }
        0xF4 => (cont(i + 1, 0x80, 0x8F) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
            .then_some(4),
        _ => None,
    };
    ok.map(|n| i + n).ok_or((i, BAD_UTF8))
}
