//! The last version a connection saw of each key, so that an answer whose version
//! went backwards is caught.
//!
//! What it is not: a record of every key's history, nor shared between connections
//! (each connection checks only its own order), nor exact above 4096 keys.

/// Last version seen per key on one connection, to check that versions never go
/// backwards. Direct-mapped with at most 4096 slots, so it is exact up to 4096 keys
/// and a bounded sample above; a slot holds `key + 1` (0 = empty) and the version.
pub(super) struct Versions {
    pub(super) slots: Vec<(u32, u64)>,
    pub(super) exact: bool,
    pub(super) mask: usize,
}

impl Versions {
    pub(super) fn new(keys: u32) -> Versions {
        let size = (keys.max(1) as usize).next_power_of_two().min(4096);
        Versions {
            slots: vec![(0, 0); size],
            exact: keys as usize <= size,
            mask: size - 1,
        }
    }

    #[inline]
    pub(super) fn slot(&self, key: u32) -> usize {
        if self.exact {
            key as usize
        } else {
            ((u64::from(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize) & self.mask
        }
    }

    /// Last version seen for `key`, 0 if none.
    #[inline]
    pub(super) fn get(&self, key: u32) -> u64 {
        let (k, v) = self.slots[self.slot(key)];
        if k == key.wrapping_add(1) {
            v
        } else {
            0
        }
    }

    #[inline]
    pub(super) fn set(&mut self, key: u32, version: u64) {
        let i = self.slot(key);
        self.slots[i] = (key.wrapping_add(1), version);
    }
}
