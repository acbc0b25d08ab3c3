//! Keys as a request for many boxes, a parked poll and a room stream keep
//! them: one buffer, each key a little-endian `u16` length and its bytes.
//!
//! What it is not: how such keys are parsed from a query (`http`) or
//! answered (`many.rs`).

/// Decoded keys, each as a little-endian `u16` length and its bytes.
pub struct ManyKeys<'a>(pub &'a [u8]);

impl<'a> Iterator for ManyKeys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (len, rest) = self.0.split_first_chunk::<2>()?;
        let len = u16::from_le_bytes(*len) as usize;
        let (key, rest) = rest.split_at_checked(len)?;
        self.0 = rest;
        Some(key)
    }
}
