//! Cursors and watermarks: what a page of a prefix and a room's stream or
//! long-poll hand the client to go on from (docs/boxes.md#watermarks), and
//! the key a parked long-poll of a prefix is registered under.
//!
//! What it is not: how a page or a room is walked (`pages.rs`, `rooms.rs`).

/// The hexadecimal of `bytes`.
pub(super) fn write_hex(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

/// The bytes a [`write_hex`] names: a page's cursor is its last key in
/// hexadecimal (opaque to clients, safe in a URL as it is).
pub(super) fn read_hex(raw: &[u8]) -> Option<Vec<u8>> {
    if !raw.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    raw.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// The end of a page's list and what follows it: `],"next":` the cursor
/// (the last key, hex) or `null`, then `,"after":"W"` (the closing brace
/// is the caller's).
pub(super) fn write_next_after(next: Option<&[u8]>, run: u64, cut: &[u64], out: &mut Vec<u8>) {
    out.extend_from_slice(b"],\"next\":");
    match next {
        Some(key) => {
            out.push(b'"');
            write_hex(key, out);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"after\":\"");
    write_watermark(run, cut, out);
    out.push(b'"');
}

/// A watermark: `<run>.<p0>,<p1>,...` in hexadecimal, the table's run and
/// the cut (docs/boxes.md#watermarks). An event's `id:`, a page's `after`.
pub fn write_watermark(run: u64, cut: &[u64], out: &mut Vec<u8>) {
    let hex = |v: u64, out: &mut Vec<u8>| {
        out.extend_from_slice(format!("{v:x}").as_bytes());
    };
    hex(run, out);
    out.push(b'.');
    for (i, &c) in cut.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        hex(c, out);
    }
}

/// The run and cut a [`write_watermark`] names.
pub fn read_watermark(raw: &[u8]) -> Option<(u64, Vec<u64>)> {
    let text = std::str::from_utf8(raw).ok()?;
    let (run, cut) = text.split_once('.')?;
    let hex = |p: &str| -> Option<u64> {
        if p.is_empty() || p.len() > 16 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(p, 16).ok()
    };
    let cut = if cut.is_empty() {
        Vec::new()
    } else {
        cut.split(',').map(hex).collect::<Option<Vec<u64>>>()?
    };
    Some((hex(run)?, cut))
}

/// The prefix of a parked long-poll's key (its prefix, then its
/// watermark's cut).
pub fn parked_prefix(key: &[u8]) -> &[u8] {
    let Some((len, rest)) = key.split_first_chunk::<2>() else {
        return &[];
    };
    rest.get(..u16::from_le_bytes(*len) as usize)
        .unwrap_or_default()
}

/// A parked long-poll's key: the prefix, then the cut it waits past.
pub(super) fn parked_key(prefix: &[u8], cut: &[u64]) -> Box<[u8]> {
    let mut k = Vec::with_capacity(2 + prefix.len() + 8 * cut.len());
    k.extend_from_slice(&(prefix.len() as u16).to_le_bytes());
    k.extend_from_slice(prefix);
    for c in cut {
        k.extend_from_slice(&c.to_le_bytes());
    }
    k.into()
}

/// The cut of a [`parked_key`].
pub(super) fn parked_cut(key: &[u8]) -> Vec<u64> {
    let rest = key.get(2 + parked_prefix(key).len()..).unwrap_or_default();
    rest.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_hex_and_read_back() {
        let mut c = Vec::new();
        write_hex("room-17/é".as_bytes(), &mut c);
        assert_eq!(c, b"726f6f6d2d31372fc3a9");
        assert_eq!(read_hex(&c).as_deref(), Some("room-17/é".as_bytes()));
        assert_eq!(read_hex(b"abc"), None);
        assert_eq!(read_hex(b"zz"), None);
        assert_eq!(read_hex(b""), Some(Vec::new()));
    }

    #[test]
    fn watermarks_name_the_run_and_the_cut() {
        let mut w = Vec::new();
        write_watermark(0xabc, &[0, 17, 1 << 40], &mut w);
        assert_eq!(w, b"abc.0,11,10000000000");
        assert_eq!(read_watermark(&w), Some((0xabc, vec![0, 17, 1 << 40])));
        assert_eq!(read_watermark(b"abc."), Some((0xabc, vec![])));
        assert_eq!(read_watermark(b"abc"), None);
        assert_eq!(read_watermark(b"abc.1,,2"), None);
        assert_eq!(read_watermark(b"abc.x"), None);
        assert_eq!(read_watermark(b"17"), None, "a one-box stream's id");
    }

    #[test]
    fn a_parked_key_holds_the_prefix_and_the_cut() {
        let k = parked_key(b"room-1/", &[3, 9]);
        assert_eq!(parked_prefix(&k), b"room-1/");
        assert_eq!(parked_cut(&k), [3, 9]);
        let empty = parked_key(b"", &[]);
        assert_eq!(parked_prefix(&empty), b"");
        assert!(parked_cut(&empty).is_empty());
    }
}
