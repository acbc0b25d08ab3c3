//! The boxes a connection watches with the many-box operations: its key sets, drawn
//! once when it is set up, and the last ETag it saw for each, sent back as
//! `If-None-Match`.
//!
//! What it is not: the key choice of the single-key operations (each request draws
//! its key from the run's sampler), nor the checking of the answers (`answer_check`).

use super::KEY_SETS;
use crate::keys::{KeySampler, Rng};

/// Longest ETag kept to send back as `If-None-Match` (pollbox's are a quoted `u64`,
/// at most 22 bytes); a longer one is not sent back.
pub(super) const MAX_ETAG: usize = 64;

/// An ETag as the server sent it, quotes included.
#[derive(Clone, Copy)]
pub(super) struct Etag {
    pub(super) len: u8,
    pub(super) bytes: [u8; MAX_ETAG],
}

/// The key sets of the many-box operations on one connection: [`KEY_SETS`] sets of
/// `--keys-per-request` distinct keys, drawn when the connection is set up (a client
/// watching the same boxes), and the last ETag the connection saw for each, sent back
/// as `If-None-Match`.
pub(super) struct KeySets {
    pub(super) per_set: usize,
    /// Set `i` is `keys[i * per_set..(i + 1) * per_set]`.
    pub(super) keys: Vec<u32>,
    pub(super) etags: Vec<Option<Etag>>,
}

impl KeySets {
    /// No sets: the mix has no many-box operation.
    pub(super) fn none() -> KeySets {
        KeySets {
            per_set: 0,
            keys: Vec::new(),
            etags: Vec::new(),
        }
    }

    /// [`KEY_SETS`] sets of `per_set` distinct keys of `0..key_count`, each key drawn
    /// from `sampler` as single-key operations draw theirs. A key already in the set is
    /// drawn again (up to 16 times, then the next free key after it is taken, so a
    /// set as large as the key space fills up too). `per_set` ≤ `key_count`.
    pub(super) fn draw(
        sampler: &KeySampler,
        key_count: u32,
        per_set: usize,
        rng: &mut Rng,
    ) -> KeySets {
        let key_count = key_count.max(1);
        let per_set = per_set.min(key_count as usize);
        let mut keys = Vec::with_capacity(KEY_SETS * per_set);
        for _ in 0..KEY_SETS {
            let start = keys.len();
            for _ in 0..per_set {
                let mut key = sampler.sample(rng);
                let mut tries = 0;
                while keys[start..].contains(&key) {
                    if tries < 16 {
                        key = sampler.sample(rng);
                        tries += 1;
                    } else {
                        key = (key + 1) % key_count;
                    }
                }
                keys.push(key);
            }
        }
        KeySets {
            per_set,
            keys,
            etags: vec![None; KEY_SETS],
        }
    }

    #[inline]
    pub(super) fn keys(&self, set: u32) -> &[u32] {
        let at = set as usize * self.per_set;
        &self.keys[at..at + self.per_set]
    }

    #[inline]
    pub(super) fn etag(&self, set: u32) -> Option<&[u8]> {
        self.etags[set as usize]
            .as_ref()
            .map(|e| &e.bytes[..usize::from(e.len)])
    }

    #[inline]
    pub(super) fn set_etag(&mut self, set: u32, etag: &[u8]) {
        self.etags[set as usize] = (etag.len() <= MAX_ETAG).then(|| {
            let mut bytes = [0; MAX_ETAG];
            bytes[..etag.len()].copy_from_slice(etag);
            Etag {
                len: etag.len() as u8,
                bytes,
            }
        });
    }
}

/// A fingerprint of an ETag (FNV-1a, never 0), to match an answer's ETag against the
/// `If-None-Match` its request sent without keeping the bytes in flight.
#[inline]
pub(super) fn etag_id(etag: &[u8]) -> u64 {
    let h = etag.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}
