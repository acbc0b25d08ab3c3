//! The chain of snapshot files: what a file of a chain is (a base or a
//! delta, [`Kind`]), where it stands in its chain ([`Link`]), and what the
//! newer files, read first, settled for the older ones ([`Newer`]).
//!
//! What it is not: the files on disk, their names and their order (the
//! server's `snapshot_file`), or the reading of a file (`read`).

use std::collections::HashMap;

/// What a file of a snapshot chain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every box.
    Base,
    /// The boxes written and the keys removed since the file before.
    Delta,
}

/// Where a file stands in its chain (the head of a format-5 file; a file of
/// format 4 or older reads as a base of chain 0 written at wall_ms 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub kind: Kind,
    /// The chain: drawn when its base is written, carried by its deltas.
    pub chain: u64,
    /// 0 for the base, then 1, 2, ... for its deltas in order.
    pub seq: u32,
    /// The wall clock (ms since the Unix epoch) when the file was written.
    pub wall_ms: u64,
}

/// What the newer files of a chain, read already, settled for the older
/// ones: the keys they removed (and in which file), the wall clock of the
/// newest.
#[derive(Debug, Default)]
pub struct Newer {
    pub(super) removed: HashMap<String, u32>,
    pub(super) newest_wall_ms: Option<u64>,
}
