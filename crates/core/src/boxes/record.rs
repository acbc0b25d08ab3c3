//! A box's record: header, key, payload, encoded state, unused slack, in one
//! allocation (the layout is in the [module doc](super)).

use super::size::size_class;

const HEADER: usize = 14;
/// Key lengths are stored in 16 bits (the config allows at most 4096).
pub(super) const MAX_KEY: usize = u16::MAX as usize;

fn key_len(r: &[u8]) -> usize {
    r.get(8..10)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u16::from_le_bytes(b) as usize)
}

fn payload_len(r: &[u8]) -> usize {
    r.get(10..14)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u32::from_le_bytes(b) as usize)
}

pub(super) fn version(r: &[u8]) -> u64 {
    r.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

pub(super) fn key(r: &[u8]) -> &[u8] {
    r.get(HEADER..HEADER + key_len(r)).unwrap_or(&[])
}

pub(super) fn payload(r: &[u8]) -> &[u8] {
    let start = HEADER + key_len(r);
    r.get(start..start + payload_len(r)).unwrap_or(&[])
}

/// The encoded state and the slack after it (the state decoder reads one
/// entry per field and never looks further).
pub(super) fn state(r: &[u8]) -> &[u8] {
    r.get(HEADER + key_len(r) + payload_len(r)..).unwrap_or(&[])
}

pub(super) fn size(key: &str, state: &[u8], payload: &[u8]) -> usize {
    HEADER + key.len() + payload.len() + state.len()
}

/// Write a record into `r`, which the caller sized with [`size`]. The key
/// is at most [`MAX_KEY`] bytes (checked on entry), the payload at most
/// max_payload_bytes (at most 64 KiB).
pub(super) fn write(r: &mut [u8], version: u64, key: &str, state: &[u8], payload: &[u8]) {
    let (k, p) = (key.len(), payload.len());
    debug_assert!(k <= MAX_KEY && r.len() >= size(key, state, payload));
    r[..8].copy_from_slice(&version.to_le_bytes());
    r[8..10].copy_from_slice(&(k as u16).to_le_bytes());
    r[10..14].copy_from_slice(&(p as u32).to_le_bytes());
    let body = &mut r[HEADER..];
    body[..k].copy_from_slice(key.as_bytes());
    body[k..k + p].copy_from_slice(payload);
    body[k + p..k + p + state.len()].copy_from_slice(state);
}

/// A new record, allocated at its size class.
pub(super) fn build(version: u64, key: &str, state: &[u8], payload: &[u8]) -> Box<[u8]> {
    let mut r = vec![0u8; size_class(size(key, state, payload))];
    write(&mut r, version, key, state, payload);
    r.into_boxed_slice()
}
