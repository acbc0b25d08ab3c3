//! A box's record: header, key, payload, encoded state, unused slack, in one
//! allocation (the layout is in the [module doc](super)). The payload starts
//! at byte 16, on a word, so a reader copies it a word at a time (`slot.rs`);
//! the key follows it.

pub(super) const HEADER: usize = 16;
/// Set in the stored payload length while the payload is not rendered yet
/// (lazy rendering: an update stores the state and the length its payload
/// will have; the first read renders it).
const STALE: u32 = 1 << 31;
/// Key lengths are stored in 16 bits (the config allows at most 4096).
pub(super) const MAX_KEY: usize = u16::MAX as usize;

pub(super) fn key_len(r: &[u8]) -> usize {
    r.get(8..10)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u16::from_le_bytes(b) as usize)
}

fn stored_len(r: &[u8]) -> u32 {
    r.get(10..14)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The payload's length, rendered or not.
pub(super) fn payload_len(r: &[u8]) -> usize {
    (stored_len(r) & !STALE) as usize
}

/// Whether the payload bytes are rendered (else only its length is known).
pub(super) fn rendered(r: &[u8]) -> bool {
    stored_len(r) & STALE == 0
}

/// The snapshot generation in which the record was last written (bytes
/// 14..16; `BoxTable::changes`): a record of the generation a delta
/// snapshot collects has changed since the snapshot before it.
pub(super) fn generation(r: &[u8]) -> u16 {
    r.get(14..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

/// Stamp the record with the snapshot generation `g` (see [`generation`]).
#[inline]
pub(super) fn set_generation(r: &mut [u8], g: u16) {
    if let Some(b) = r.get_mut(14..16) {
        b.copy_from_slice(&g.to_le_bytes());
    }
}

pub(super) fn version(r: &[u8]) -> u64 {
    r.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Where the key of a record whose payload takes `payload_len` bytes starts.
#[inline]
pub(super) fn key_at(payload_len: usize) -> usize {
    HEADER + payload_len
}

pub(super) fn key(r: &[u8]) -> &[u8] {
    let start = key_at(payload_len(r));
    r.get(start..start + key_len(r)).unwrap_or(&[])
}

/// Whether the record's key is `key`: up to 16 bytes in two overlapping
/// word compares, not through a call to `memcmp` (keys are short).
#[inline]
pub(super) fn key_is(r: &[u8], key: &[u8]) -> bool {
    let k = self::key(r);
    let n = k.len();
    if n != key.len() {
        return false;
    }
    #[inline(always)]
    fn first_and_last_equal<const W: usize>(a: &[u8], b: &[u8]) -> bool {
        a.first_chunk::<W>() == b.first_chunk::<W>() && a.last_chunk::<W>() == b.last_chunk::<W>()
    }
    match n {
        17.. => k == key,
        8.. => first_and_last_equal::<8>(k, key),
        4.. => first_and_last_equal::<4>(k, key),
        2.. => first_and_last_equal::<2>(k, key),
        1 => k[0] == key[0],
        0 => true,
    }
}

pub(super) fn payload(r: &[u8]) -> &[u8] {
    r.get(HEADER..HEADER + payload_len(r)).unwrap_or(&[])
}

/// The encoded state and the slack after it (the state decoder reads one
/// entry per field and never looks further).
pub(super) fn state(r: &[u8]) -> &[u8] {
    r.get(key_at(payload_len(r)) + key_len(r)..).unwrap_or(&[])
}

pub(super) fn size(key: &str, state: &[u8], payload_len: usize) -> usize {
    HEADER + payload_len + key.len() + state.len()
}

/// The payload of a record, rendered or to be rendered.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    Rendered(&'a [u8]),
    /// Not rendered yet; it will take this many bytes.
    Later(usize),
}

impl<'a> Payload<'a> {
    /// What `reduce::next_record` left: `payload` itself when it rendered
    /// it, else the `len` it will take.
    pub(super) fn of(rendered: bool, payload: &'a [u8], len: usize) -> Payload<'a> {
        if rendered {
            Payload::Rendered(payload)
        } else {
            Payload::Later(len)
        }
    }

    pub(super) fn len(self) -> usize {
        match self {
            Payload::Rendered(p) => p.len(),
            Payload::Later(n) => n,
        }
    }
}

/// Fill in the payload of a record whose payload was left for later (its
/// length must be the one stored) and mark it rendered. False (and `r`
/// untouched) when the length differs.
pub(super) fn set_rendered(r: &mut [u8], payload: &[u8]) -> bool {
    let start = HEADER;
    if payload.len() != payload_len(r) {
        return false;
    }
    let Some(dst) = r.get_mut(start..start + payload.len()) else {
        return false;
    };
    dst.copy_from_slice(payload);
    r[10..14].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    true
}

/// Write a record into `r`, which the caller sized with [`size`]. The key
/// is at most [`MAX_KEY`] bytes (checked on entry), the payload at most
/// max_payload_bytes (at most 64 KiB, far below [`STALE`]). A payload to be
/// rendered later leaves its bytes as they were. Returns the bytes written
/// (up to the end of the state).
pub(super) fn write(
    r: &mut [u8],
    version: u64,
    key: &str,
    state: &[u8],
    payload: Payload<'_>,
) -> usize {
    write_with(r, version, key, state, payload, true)
}

/// [`write`] over the record of `key` that `r` holds already (its key was
/// compared equal to `key`): the key is copied only when it moves, that is
/// when the payload's length changes (a box's payload mostly keeps its
/// length from one message to the next).
pub(super) fn rewrite(
    r: &mut [u8],
    version: u64,
    key: &str,
    state: &[u8],
    payload: Payload<'_>,
) -> usize {
    let moved = key_len(r) != key.len() || payload_len(r) != payload.len();
    debug_assert!(moved || self::key(r) == key.as_bytes());
    write_with(r, version, key, state, payload, moved)
}

#[inline(always)]
fn write_with(
    r: &mut [u8],
    version: u64,
    key: &str,
    state: &[u8],
    payload: Payload<'_>,
    copy_key: bool,
) -> usize {
    let (k, p) = (key.len(), payload.len());
    debug_assert!(k <= MAX_KEY && r.len() >= size(key, state, p));
    r[..8].copy_from_slice(&version.to_le_bytes());
    r[8..10].copy_from_slice(&(k as u16).to_le_bytes());
    let stored = match payload {
        Payload::Rendered(_) => p as u32,
        Payload::Later(_) => p as u32 | STALE,
    };
    r[10..14].copy_from_slice(&stored.to_le_bytes());
    r[14..16].fill(0);
    if let Payload::Rendered(bytes) = payload {
        r[HEADER..HEADER + p].copy_from_slice(bytes);
    }
    let at = key_at(p);
    if copy_key {
        copy_short(&mut r[at..at + k], key.as_bytes());
    }
    copy_short(&mut r[at + k..at + k + state.len()], state);
    at + k + state.len()
}

/// `dst.copy_from_slice(src)`; up to 16 bytes in two overlapping loads and
/// stores (the bytes they share are the same), not through a call to
/// `memcpy` (a key and a state are short).
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if n > 16 || dst.len() != n {
        dst.copy_from_slice(src);
        return;
    }
    #[inline(always)]
    fn copy_first_and_last<const W: usize>(dst: &mut [u8], src: &[u8]) {
        if let (Some(d), Some(s)) = (dst.first_chunk_mut::<W>(), src.first_chunk::<W>()) {
            *d = *s;
        }
        if let (Some(d), Some(s)) = (dst.last_chunk_mut::<W>(), src.last_chunk::<W>()) {
            *d = *s;
        }
    }
    match n {
        8.. => copy_first_and_last::<8>(dst, src),
        4.. => copy_first_and_last::<4>(dst, src),
        2.. => copy_first_and_last::<2>(dst, src),
        1 => dst[0] = src[0],
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_copies_are_copies() {
        let src: Vec<u8> = (1..=24u8).collect();
        for n in 0..=src.len() {
            for at in 0..3 {
                let mut dst = vec![0u8; n + 6];
                copy_short(&mut dst[at..at + n], &src[..n]);
                let mut want = vec![0u8; n + 6];
                want[at..at + n].copy_from_slice(&src[..n]);
                assert_eq!(dst, want, "{n} at {at}");
            }
        }
    }

    #[test]
    fn keys_compare_exactly() {
        let keys = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "abcdefg",
            "abcdefgh",
            "abcdefghijklmnop",
        ];
        let long = "abcdefghijklmnopqrstuvwxyz";
        for n in 0..=long.len() {
            let key = &long[..n];
            let mut r = vec![0u8; 96];
            write(&mut r, 1, key, &[6, 1], Payload::Later(5));
            assert!(key_is(&r, key.as_bytes()), "{key}");
            for other in keys.iter().filter(|&&o| o != key) {
                assert!(!key_is(&r, other.as_bytes()), "{key} is not {other}");
            }
            for i in 0..n {
                let mut off = key.as_bytes().to_vec();
                off[i] ^= 0x20;
                assert!(!key_is(&r, &off), "{key} at {i}");
            }
        }
    }

    /// A record rewritten over the one of its key is the record written
    /// afresh, whether the key stays where it was or moves.
    #[test]
    fn rewrites_are_writes() {
        let state = [6u8, 1, 2, 3];
        for key in ["k", "box-42", "a-longer-key-of-22-b"] {
            for old_len in [0usize, 5, 8, 13] {
                for new_len in [0usize, 5, 8, 13] {
                    for rendered in [false, true] {
                        let (old, new) = (vec![b'o'; old_len], vec![b'n'; new_len]);
                        let old_payload = Payload::of(rendered, &old, old_len);
                        let new_payload = Payload::of(rendered, &new, new_len);
                        let mut r = vec![0u8; 128];
                        write(&mut r, 1, key, &[5, 5, 5, 5, 5, 5], old_payload);
                        let mut want = r.clone();
                        let used = rewrite(&mut r, 2, key, &state, new_payload);
                        let want_used = write(&mut want, 2, key, &state, new_payload);
                        assert_eq!(used, want_used);
                        assert_eq!(r, want, "{key} {old_len} -> {new_len}");
                        assert_eq!(self::key(&r), key.as_bytes());
                    }
                }
            }
        }
    }
}
