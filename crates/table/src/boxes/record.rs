//! A box's record: header, payload, encoded state, unused slack, in one
//! allocation (the layout is in the [module doc](super)). The payload starts
//! at byte 16, on a word, so a reader copies it a word at a time (`slot.rs`).
//!
//! The key is the payload's own: every payload starts `{"k":"` key `"`, so a
//! key JSON writes as it is lies at byte 22 of the record, and is not stored
//! twice. A payload not rendered yet holds that start all the same (its
//! other bytes are left as they were). A key JSON must escape (a quote, a
//! backslash, a control character) is stored apart, after the payload, and
//! the header says so ([`APART`]).

use crate::render::is_plain_json_str;

pub(super) const HEADER: usize = 16;
/// Bit 15 of the stored key length: the key is stored after the payload,
/// not read from it.
const APART: u16 = 1 << 15;
/// How every payload starts, before its key.
const PREFIX: &[u8; 6] = b"{\"k\":\"";
/// Where a key read from its payload starts.
const KEY_IN_PAYLOAD: usize = HEADER + PREFIX.len();
/// Set in the stored payload length while the payload is not rendered yet
/// (lazy rendering: an update stores the state and the length its payload
/// will have; the first read renders it).
const STALE: u32 = 1 << 31;
/// Key lengths are stored in 15 bits (the config allows at most 4096).
pub(super) const MAX_KEY: usize = (APART - 1) as usize;

fn stored_key_len(r: &[u8]) -> u16 {
    r.get(8..10)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

pub(super) fn key_len(r: &[u8]) -> usize {
    (stored_key_len(r) & !APART) as usize
}

/// Whether JSON escapes `key` (it is then kept apart from the payload). A
/// scan of the key: a record says it without one ([`escapes_in`]).
#[inline]
pub(super) fn escapes(key: &str) -> bool {
    !is_plain_json_str(key)
}

/// Whether the key of record `r` is kept apart (as [`escapes`] says of it).
#[inline]
pub(super) fn escapes_in(r: &[u8]) -> bool {
    stored_key_len(r) & APART != 0
}

/// Whether a record of a key of `k` bytes (that JSON escapes, or not) with a
/// payload of `payload_len` bytes keeps the key apart: when JSON escapes it,
/// or (never in a table, which renders every payload from its key) when the
/// payload is too short to hold it.
#[inline]
fn kept_apart(escapes: bool, k: usize, payload_len: usize) -> bool {
    escapes || payload_len < PREFIX.len() + k + 1
}

/// Where the key starts in a record whose first 16 bytes are `head`.
#[inline]
pub(super) fn key_start(head: &[u8]) -> usize {
    if stored_key_len(head) & APART != 0 {
        HEADER + payload_len(head)
    } else {
        KEY_IN_PAYLOAD
    }
}

/// Where the key starts and its length, from the record's second word
/// (bytes 8..16: the key's and the payload's stored lengths).
#[inline]
pub(super) fn key_span(word1: u64) -> (usize, usize) {
    let stored = word1 as u16;
    let len = (stored & !APART) as usize;
    if stored & APART != 0 {
        let payload = ((word1 >> 16) as u32 & !STALE) as usize;
        (HEADER + payload, len)
    } else {
        (KEY_IN_PAYLOAD, len)
    }
}

/// Where the state starts.
#[inline]
fn state_start(r: &[u8]) -> usize {
    let apart = stored_key_len(r) & APART != 0;
    HEADER + payload_len(r) + if apart { key_len(r) } else { 0 }
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

pub(super) fn version(r: &[u8]) -> u64 {
    r.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

pub(super) fn key(r: &[u8]) -> &[u8] {
    let start = key_start(r);
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
    r.get(state_start(r)..).unwrap_or(&[])
}

/// The bytes of a record of `key` (that JSON escapes, or not: [`escapes`]).
pub(super) fn size(key: &str, escapes: bool, state: &[u8], payload_len: usize) -> usize {
    let apart = if kept_apart(escapes, key.len(), payload_len) {
        key.len()
    } else {
        0
    };
    HEADER + payload_len + apart + state.len()
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
    escapes: bool,
    state: &[u8],
    payload: Payload<'_>,
) -> usize {
    write_with(r, version, key, escapes, state, payload, true)
}

/// [`write`] over the record of `key` that `r` holds already (its key was
/// compared equal to `key`): a key kept apart is copied only when it moves,
/// that is when the payload's length changes (a box's payload mostly keeps
/// its length from one message to the next); a key in the payload stays
/// where it is (a rendered payload starts with it, and one left for later
/// keeps the start the record had).
pub(super) fn rewrite(
    r: &mut [u8],
    version: u64,
    key: &str,
    state: &[u8],
    payload: Payload<'_>,
) -> usize {
    let moved = key_len(r) != key.len() || payload_len(r) != payload.len();
    debug_assert!(moved || self::key(r) == key.as_bytes());
    write_with(r, version, key, escapes_in(r), state, payload, moved)
}

#[inline(always)]
fn write_with(
    r: &mut [u8],
    version: u64,
    key: &str,
    escapes: bool,
    state: &[u8],
    payload: Payload<'_>,
    copy_key: bool,
) -> usize {
    let (k, p) = (key.len(), payload.len());
    debug_assert!(k <= MAX_KEY && r.len() >= size(key, escapes, state, p));
    debug_assert!(escapes || !self::escapes(key));
    let apart = kept_apart(escapes, k, p);
    r[..8].copy_from_slice(&version.to_le_bytes());
    let stored_key = k as u16 | if apart { APART } else { 0 };
    r[8..10].copy_from_slice(&stored_key.to_le_bytes());
    let stored = match payload {
        Payload::Rendered(_) => p as u32,
        Payload::Later(_) => p as u32 | STALE,
    };
    r[10..14].copy_from_slice(&stored.to_le_bytes());
    r[14..16].fill(0); // unused
    match payload {
        Payload::Rendered(bytes) => {
            debug_assert!(apart || bytes[PREFIX.len()..].starts_with(key.as_bytes()));
            r[HEADER..HEADER + p].copy_from_slice(bytes);
        }
        // The start a rendered payload will have, so the key is there.
        Payload::Later(_) if copy_key && !apart => {
            r[HEADER..KEY_IN_PAYLOAD].copy_from_slice(PREFIX);
            copy_short(&mut r[KEY_IN_PAYLOAD..KEY_IN_PAYLOAD + k], key.as_bytes());
            r[KEY_IN_PAYLOAD + k] = b'"';
        }
        Payload::Later(_) => {}
    }
    let mut at = HEADER + p;
    if apart {
        if copy_key {
            copy_short(&mut r[at..at + k], key.as_bytes());
        }
        at += k;
    }
    copy_short(&mut r[at..at + state.len()], state);
    at + state.len()
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

    /// A payload of `len` bytes as a table renders one for `key` (its start,
    /// then filler `fill`); too short to hold the start, filler only.
    fn payload_of(key: &str, len: usize, fill: u8) -> Vec<u8> {
        let mut p = Vec::new();
        crate::render::render_head(key, 1, &mut p);
        p.resize(len.max(p.len()), fill);
        if len < PREFIX.len() + key.len() + 1 {
            p = vec![fill; len];
        }
        p.truncate(len);
        p
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
        // Payloads too short to hold the key (it is kept apart), and payloads
        // a table would render (the key is read from them), left for later
        // or not.
        for payload_len in [5, 64] {
            for rendered in [false, true] {
                for n in 0..=long.len() {
                    let key = &long[..n];
                    let mut r = vec![0u8; 128];
                    let p = payload_of(key, payload_len, b'x');
                    let used = write(
                        &mut r,
                        1,
                        key,
                        escapes(key),
                        &[6, 1],
                        Payload::of(rendered, &p, p.len()),
                    );
                    assert_eq!(used, size(key, escapes(key), &[6, 1], p.len()));
                    assert_eq!(self::key(&r), key.as_bytes());
                    assert_eq!(state(&r)[..2], [6, 1]);
                    assert_eq!(key_start(&r) == KEY_IN_PAYLOAD, payload_len == 64);
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
        }
    }

    /// A key read from its payload is not stored twice; one JSON escapes is.
    #[test]
    fn a_key_lies_in_its_payload_unless_json_escapes_it() {
        let st = [6u8, 1];
        let plain = payload_of("box-42", 40, b' ');
        assert_eq!(size("box-42", escapes("box-42"), &st, 40), HEADER + 40 + 2);
        let escaped = "say \"hi\"";
        assert!(escapes(escaped) && !escapes("box-42"));
        assert_eq!(
            size(escaped, true, &st, 40),
            HEADER + 40 + escaped.len() + 2
        );
        for (key, p) in [("box-42", plain), (escaped, payload_of(escaped, 40, b' '))] {
            for rendered in [false, true] {
                let mut r = vec![0u8; 96];
                write(
                    &mut r,
                    7,
                    key,
                    escapes(key),
                    &st,
                    Payload::of(rendered, &p, 40),
                );
                assert_eq!(self::key(&r), key.as_bytes());
                assert_eq!(key_len(&r), key.len());
                assert_eq!(state(&r)[..2], st);
                assert_eq!(version(&r), 7);
                // Rendered later, the payload is the one a table renders.
                if !rendered {
                    assert!(set_rendered(&mut r, &p));
                }
                assert_eq!(payload(&r), p);
                assert_eq!(self::key(&r), key.as_bytes());
                assert_eq!(state(&r)[..2], st);
            }
        }
    }

    /// A record rewritten over the one of its key is the record written
    /// afresh, whether the key stays where it was or moves.
    #[test]
    fn rewrites_are_writes() {
        let state = [6u8, 1, 2, 3];
        for key in ["k", "box-42", "a-longer-key-of-22-b", "with \\ escape"] {
            let base = payload_of(key, 0, b'o')
                .len()
                .max(PREFIX.len() + key.len() + 10);
            for old_len in [0usize, 5, base, base + 5, base + 13] {
                for new_len in [0usize, 5, base, base + 8, base + 13] {
                    for rendered in [false, true] {
                        let (old, new) = (
                            payload_of(key, old_len, b'o'),
                            payload_of(key, new_len, b'n'),
                        );
                        let old_payload = Payload::of(rendered, &old, old_len);
                        let new_payload = Payload::of(rendered, &new, new_len);
                        let mut r = vec![0u8; 160];
                        write(
                            &mut r,
                            1,
                            key,
                            escapes(key),
                            &[5, 5, 5, 5, 5, 5],
                            old_payload,
                        );
                        let mut want = r.clone();
                        let used = rewrite(&mut r, 2, key, &state, new_payload);
                        let was_apart = escapes_in(&want);
                        let want_used = write(&mut want, 2, key, was_apart, &state, new_payload);
                        assert_eq!(used, want_used);
                        assert_eq!(r, want, "{key} {old_len} -> {new_len}");
                        assert_eq!(self::key(&r), key.as_bytes());
                        assert_eq!(self::state(&r)[..4], state);
                    }
                }
            }
        }
    }
}
