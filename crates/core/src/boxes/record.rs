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
    r[at..at + k].copy_from_slice(key.as_bytes());
    r[at + k..at + k + state.len()].copy_from_slice(state);
    at + k + state.len()
}
