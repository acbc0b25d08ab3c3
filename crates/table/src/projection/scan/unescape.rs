//! A validated string's contents decoded: written unescaped into the arena, or
//! compared with a member name without being materialised.
//!
//! What it is not: the validation of a string (`string`); the contents given
//! here must have passed it.

use super::string::hex4;

/// One decoded unit of an escaped string: the UTF-8 bytes of an escape, or
/// one raw byte. `raw` must have passed [`Scanner::string`](super::Scanner::string).
#[inline]
fn next_unit<'r>(raw: &'r [u8], i: &mut usize, tmp: &'r mut [u8; 4]) -> &'r [u8] {
    let at = *i;
    if raw[at] != b'\\' {
        *i += 1;
        return &raw[at..at + 1];
    }
    let byte = match raw.get(at + 1) {
        Some(b'b') => 0x08,
        Some(b'f') => 0x0C,
        Some(b'n') => b'\n',
        Some(b'r') => b'\r',
        Some(b't') => b'\t',
        Some(b'u') => {
            let unit = hex4(raw, at + 2).unwrap_or(0xFFFD);
            let c = if (0xD800..=0xDBFF).contains(&unit) {
                let low = hex4(raw, at + 8).unwrap_or(0xDC00);
                *i += 12;
                0x10000 + ((unit - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF)
            } else {
                *i += 6;
                unit
            };
            let c = char::from_u32(c).unwrap_or('\u{FFFD}');
            return c.encode_utf8(tmp).as_bytes();
        }
        Some(&other) => other,
        None => b'\\',
    };
    *i += 2;
    tmp[0] = byte;
    &tmp[..1]
}

/// Write the unescaped form of the validated string contents `raw` into
/// `out` (at least `raw.len()` bytes: unescaping never grows a string); the
/// number of bytes written.
pub(in crate::projection) fn unescape_into(raw: &[u8], out: &mut [u8]) -> usize {
    let mut i = 0;
    let mut n = 0;
    let mut tmp = [0u8; 4];
    while i < raw.len() {
        // Copy the run up to the next escape in one go.
        let run = raw[i..]
            .iter()
            .position(|&b| b == b'\\')
            .unwrap_or(raw.len() - i);
        if let (Some(dst), Some(src)) = (out.get_mut(n..n + run), raw.get(i..i + run)) {
            dst.copy_from_slice(src);
        }
        n += run;
        i += run;
        if i < raw.len() {
            let unit = next_unit(raw, &mut i, &mut tmp);
            if let Some(dst) = out.get_mut(n..n + unit.len()) {
                dst.copy_from_slice(unit);
            }
            n += unit.len();
        }
    }
    n.min(out.len())
}

/// Whether the validated, escaped string contents `raw` unescape to `name`,
/// without materialising them.
pub(in crate::projection) fn unescaped_eq(raw: &[u8], name: &[u8]) -> bool {
    let mut i = 0;
    let mut at = 0;
    let mut tmp = [0u8; 4];
    while i < raw.len() {
        let unit = next_unit(raw, &mut i, &mut tmp);
        if name.get(at..at + unit.len()) != Some(unit) {
            return false;
        }
        at += unit.len();
    }
    at == name.len()
}
