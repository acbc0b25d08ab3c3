//! Byte scanning shared by the HTTP framer and the projection: the line-feed
//! search and count (request heads, NDJSON lines), the plain decimal number
//! (`Content-Length`, the long-poll query), the test for a box key that
//! needs no decoding, and short byte strings as words (box keys, member
//! names).

/// The bytes of `b` (at most 8) as the low bytes of a little-endian word,
/// the rest zero: two overlapping loads (the bytes they share are the same,
/// so or-ing them is exact), instead of a copy through a buffer.
#[inline(always)]
pub fn short_le(b: &[u8]) -> u64 {
    let n = b.len();
    debug_assert!(n <= 8);
    match n {
        4..=8 => {
            let lo = b.first_chunk::<4>().map_or(0, |c| u32::from_le_bytes(*c));
            let hi = b.last_chunk::<4>().map_or(0, |c| u32::from_le_bytes(*c));
            u64::from(lo) | u64::from(hi) << ((n - 4) * 8)
        }
        2.. => {
            let lo = b.first_chunk::<2>().map_or(0, |c| u16::from_le_bytes(*c));
            let hi = b.last_chunk::<2>().map_or(0, |c| u16::from_le_bytes(*c));
            u64::from(lo) | u64::from(hi) << ((n - 2) * 8)
        }
        1 => u64::from(b[0]),
        _ => 0,
    }
}

/// Index of the first LF in `hay`, eight bytes at a time (SWAR): heads and
/// NDJSON bodies are lines, and this is the one pass over their bytes besides
/// the parsers.
#[inline]
pub fn find_lf(hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const LFS: u64 = ONES * b'\n' as u64;
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes) ^ LFS;
        // A zero byte of x is an LF. The lowest flagged byte is always a true
        // zero (borrows only create false flags above a true one).
        let zeros = x.wrapping_sub(ONES) & !x & HIGHS;
        if zeros != 0 {
            return Some(at + (zeros.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|p| at + p)
}

/// LFs in `body`, eight bytes at a time (SWAR; the exact zero-byte test, so
/// every flagged byte is an LF and the flags can be counted).
#[inline]
pub fn count_lf(body: &[u8]) -> usize {
    const LOWS: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    const LFS: u64 = 0x0A0A_0A0A_0A0A_0A0A;
    let mut words = body.chunks_exact(8);
    let mut n = 0;
    for word in words.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes) ^ LFS;
        // High bit set in each byte of x that is not zero.
        let nonzero = ((x & LOWS) + LOWS) | x;
        n += (!nonzero & !LOWS).count_ones() as usize;
    }
    n + words.remainder().iter().filter(|&&b| b == b'\n').count()
}

/// Whether `s` is all ASCII without the byte `b` (an ASCII byte), eight
/// bytes at a time.
#[inline]
pub fn ascii_without(s: &[u8], b: u8) -> bool {
    ascii_without_either(s, b, b)
}

/// Whether `s` is all ASCII without the bytes `a` and `b` (ASCII bytes), in
/// one pass, eight bytes at a time: a path's key needs no percent-decoding,
/// no UTF-8 check and no check of its path segments when it has no `%`, no
/// `/` and no byte over 0x7F.
#[inline]
pub fn ascii_without_either(s: &[u8], a: u8, b: u8) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut words = s.chunks_exact(8);
    for word in words.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes);
        let ya = x ^ (ONES * u64::from(a));
        let yb = x ^ (ONES * u64::from(b));
        // Some byte of ya or yb is zero (exact as a yes/no: borrows only flag
        // bytes above a true zero), or some byte of x is not ASCII.
        if (ya.wrapping_sub(ONES) & !ya | yb.wrapping_sub(ONES) & !yb | x) & HIGHS != 0 {
            return false;
        }
    }
    words
        .remainder()
        .iter()
        .all(|&c| c.is_ascii() && c != a && c != b)
}

/// Why [`parse_decimal`] refused its input; each caller maps it to its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecimalError {
    /// Empty, or a byte that is not an ASCII digit (a sign, a space, a dot).
    NotDecimal,
    /// All digits, but more than `u64::MAX`.
    TooLarge,
}

/// `1*DIGIT` as a u64: no sign, no spaces, no list, no overflow.
#[inline]
pub fn parse_decimal(v: &[u8]) -> Result<u64, DecimalError> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        // Judged first, so that `20000000000000000000x` is not a number
        // rather than a number too large.
        return Err(DecimalError::NotDecimal);
    }
    let mut n: u64 = 0;
    for &b in v {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(DecimalError::TooLarge)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn find_lf_matches_a_plain_search() {
        let mut buf = vec![b'a'; 40];
        assert_eq!(find_lf(&buf), None);
        for at in 0..40 {
            buf.fill(b'a');
            // Bytes next to '\n' in value (0x09, 0x0b, 0x8a) must not match.
            buf[at / 2] = 0x0b;
            buf[at] = b'\n';
            assert_eq!(find_lf(&buf), Some(at), "at {at}");
            for b in [0x09, 0x0b, 0x8a, 0x00, 0xff] {
                buf[at] = b;
                assert_eq!(find_lf(&buf), buf.iter().position(|&x| x == b'\n'));
            }
        }
    }

    #[test]
    fn decimals_at_the_edges() {
        assert_eq!(parse_decimal(b"0"), Ok(0));
        assert_eq!(parse_decimal(b"007"), Ok(7));
        assert_eq!(parse_decimal(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_decimal(b"18446744073709551616"),
            Err(DecimalError::TooLarge)
        );
        for bad in [&b""[..], b"+1", b"-1", b" 1", b"1 ", b"1.5", b"1,2", b"0x1"] {
            assert_eq!(parse_decimal(bad), Err(DecimalError::NotDecimal), "{bad:?}");
        }
    }

    #[test]
    fn ascii_without_matches_a_plain_test() {
        for len in 0..40 {
            let mut s = vec![b'k'; len];
            assert!(ascii_without(&s, b'%'));
            for at in 0..len {
                for (c, ok) in [
                    (b'%', false),
                    (0x80, false),
                    (0xff, false),
                    (0xa5, false),
                    (b'$', true),
                    (b'&', true),
                    (0x7f, true),
                    (0, true),
                ] {
                    s[at] = c;
                    assert_eq!(ascii_without(&s, b'%'), ok, "{len} {at} {c:#x}");
                    s[at] = b'k';
                }
            }
        }
    }

    proptest! {
        #[test]
        fn ascii_without_agrees(s in proptest::collection::vec(prop::sample::select(vec![b'%', b'a', 0x24, 0x25, 0x26, 0x7f, 0x80, 0xa5, 0]), 0..40)) {
            prop_assert_eq!(ascii_without(&s, b'%'), s.iter().all(|&c| c.is_ascii() && c != b'%'));
        }

        #[test]
        fn ascii_without_either_agrees(s in proptest::collection::vec(prop::sample::select(vec![b'%', b'/', b'a', 0x24, 0x2e, 0x2f, 0x30, 0x7f, 0x80, 0xaf, 0]), 0..40)) {
            prop_assert_eq!(
                ascii_without_either(&s, b'%', b'/'),
                s.iter().all(|&c| c.is_ascii() && c != b'%' && c != b'/')
            );
        }

        #[test]
        fn find_lf_agrees(s in proptest::collection::vec(prop::sample::select(vec![b'\n', b'a', 0x0b, 0x8a, 0]), 0..64)) {
            prop_assert_eq!(find_lf(&s), s.iter().position(|&b| b == b'\n'));
        }

        #[test]
        fn decimal_agrees_with_std(v in proptest::collection::vec(prop::sample::select(b"0123456789+- x".to_vec()), 0..24)) {
            // What std parses from all-digit input (std also takes a sign).
            let expected = std::str::from_utf8(&v).ok().filter(|s| s.bytes().all(|b| b.is_ascii_digit())).map(str::parse::<u64>);
            match parse_decimal(&v) {
                Ok(n) => prop_assert_eq!(expected, Some(Ok(n))),
                Err(DecimalError::TooLarge) => prop_assert!(matches!(expected, Some(Err(_)))),
                Err(DecimalError::NotDecimal) => prop_assert!(v.is_empty() || expected.is_none()),
            }
        }
    }
}
