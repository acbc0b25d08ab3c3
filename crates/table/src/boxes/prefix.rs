//! What a prefix is (docs/boxes.md#rooms): empty, or ending with a
//! separator (`/`, `:`, `.`); the prefixes of a key, one by one or, for an
//! update looking for its watchers, eight bytes a step.

/// The separators that end a prefix.
pub fn is_separator(b: u8) -> bool {
    matches!(b, b'/' | b':' | b'.')
}

/// Whether `p` is a prefix: empty, or ending with a separator.
pub fn is_prefix(p: &[u8]) -> bool {
    p.last().is_none_or(|&b| is_separator(b))
}

/// The prefixes of `key` (docs/boxes.md#rooms), shortest first: the empty
/// prefix, then the key up to and including each separator, the key itself
/// excluded.
pub fn prefixes_of(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::once(&key[..0]).chain(
        key.iter()
            .enumerate()
            .filter(|&(i, &b)| is_separator(b) && i + 1 < key.len())
            .map(move |(i, _)| &key[..=i]),
    )
}

/// Call `f` with the length of each non-empty prefix of `key` (up to and
/// including each separator but a last byte), shortest first: what
/// [`prefixes_of`] gives after the empty one, eight bytes a step (an update
/// looks for its key's prefixes while any prefix is watched).
#[inline]
pub fn each_prefix_len(key: &[u8], mut f: impl FnMut(usize)) {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // The high bit of each byte of `w` equal to `c`, exactly (no carries
    // between bytes).
    let eq = |w: u64, c: u8| {
        let x = w ^ (ONES * u64::from(c));
        !(((x & LOW7) + LOW7) | x | LOW7)
    };
    // The key's last byte ends no prefix (the key itself is not one).
    let len = key.len();
    let n = len.saturating_sub(1);
    let mut i = 0;
    while i < n {
        // Eight bytes from `i`; past the end, the key's last eight (bytes
        // before `i` masked off); a key under eight bytes, padded with
        // zeros (no separator).
        let (w, base) = if let Some(c) = key.get(i..).and_then(|r| r.first_chunk::<8>()) {
            (u64::from_le_bytes(*c), i)
        } else if let Some(c) = key.last_chunk::<8>() {
            (u64::from_le_bytes(*c), len - 8)
        } else {
            let mut b = [0u8; 8];
            if let Some(d) = b.get_mut(..len) {
                d.copy_from_slice(key);
            }
            (u64::from_le_bytes(b), 0)
        };
        let (lo, hi) = (i - base, (n - base).min(8));
        let keep = (u64::MAX << (lo * 8)) & u64::MAX.checked_shr(64 - hi as u32 * 8).unwrap_or(0);
        let mut m = (eq(w, b'/') | eq(w, b':') | eq(w, b'.')) & keep;
        while m != 0 {
            f(base + m.trailing_zeros() as usize / 8 + 1);
            m &= m - 1;
        }
        i = base + 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_are_found_eight_bytes_a_step_as_one_by_one() {
        let keys: [&[u8]; 8] = [
            b"",
            b"/",
            b"a/b",
            b"room-17/alice",
            b"tenant:4:orders.eu/x",
            b"//////////////////",
            b"abcdefghijklmnop/q",
            "caf\u{e9}/\u{7f}\u{80}./:x".as_bytes(),
        ];
        for key in keys {
            let mut fast = Vec::new();
            each_prefix_len(key, |n| fast.push(&key[..n]));
            let slow: Vec<&[u8]> = prefixes_of(key).skip(1).collect();
            assert_eq!(fast, slow, "{key:?}");
        }
        // Every byte value around a separator, at every offset.
        for pos in 0..20 {
            for b in 0..=255u8 {
                let mut key = vec![b'x'; 21];
                key[pos] = b;
                let mut fast = Vec::new();
                each_prefix_len(&key, |n| fast.push(n));
                let slow: Vec<usize> = prefixes_of(&key).skip(1).map(<[u8]>::len).collect();
                assert_eq!(fast, slow, "{pos} {b}");
            }
        }
    }

    #[test]
    fn prefixes_are_empty_or_end_with_a_separator() {
        assert!(is_prefix(b"") && is_prefix(b"room-17/") && is_prefix(b"tenant:4:"));
        assert!(is_prefix(b"eu.") && !is_prefix(b"room-17") && !is_prefix(b"a/b"));
        let p: Vec<&[u8]> = prefixes_of(b"room-17/a:b").collect();
        assert_eq!(p, [&b""[..], b"room-17/", b"room-17/a:"]);
        let p: Vec<&[u8]> = prefixes_of(b"a/").collect();
        assert_eq!(p, [&b""[..]], "the key itself is not its prefix");
    }
}
