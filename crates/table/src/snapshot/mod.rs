//! Box table snapshots (docs/operations.md#snapshots-and-durability): the binary
//! format and its checks, written to any `Write` and read from any `Read`.
//!
//! A snapshot is a **chain**: a base (every box) and deltas (the boxes written
//! and the keys removed since the file before, [`Walk`](crate::boxes::Walk)),
//! each a file of format 5, little endian throughout:
//!
//! ```text
//! magic "PBOXSNAP" | format u32 (= 5) | kind u8 (0 base, 1 delta) | chain u64 | seq u32 | wall_ms u64
//! field count u32 | per field: name_len u16, name, type u8, reduce u8
//! per box:     1u8 | key_len u16, key | version u64 | idle_s u32 | state_len u32, state
//! per removal: 2u8 | key_len u16, key                                   (deltas only)
//! end:         0u8 | box count u64 | removal count u64 | version floor u64
//!              | topic_len u16, topic | partition count u32 | per partition: partition i32, next offset i64
//!                [, version base u64 when the partition's high bit is set]
//!              | CRC-32 (IEEE) u32 of every byte before it
//! ```
//!
//! `chain` names the base every file of the chain builds on (a random number
//! drawn when the base is written), `seq` is 0 for the base and 1, 2, ... for
//! its deltas, `wall_ms` the wall clock at the write (a box a delta does not
//! hold has been idle since the file that holds it, longer by the time
//! between the two). A chain is read newest file first ([`read_link_into`]):
//! the first state of a key that a file gives wins, older ones are skipped,
//! and a key a newer file removed is skipped in older ones, so every box is
//! restored once, from the newest file that holds it.
//!
//! Formats 4 and 3 were one file, a base with no chain (the layout above
//! without kind, chain, seq, wall_ms and removal count); 4 ends with the log
//! position, 3 has none. Both are still read, as a base; 4 is still written by
//! [`write_snapshot_at`] (tools and tests).
//!
//! The log position (formats 4 and 5) is where a node of a Kafka log stands:
//! the next offset to read in each partition of `topic` (`topic_len` 0: a
//! standalone node's snapshot, no position). It is taken *before* the walk,
//! so the boxes reflect at least every record before it; records applied
//! during the walk are read again at a restart and skipped by their version
//! (`BoxTable::apply_logged`), so none is applied twice. A delta holds the
//! position of the state it completes, so the newest file's is the chain's.
//! A partition of a migrated topic whose versions run past its offsets
//! (`log::Bases`) has the high bit of its number set and its base after the
//! offset; other positions are written as before.
//!
//! `state` holds one entry per field in the box table's own field-state encoding
//! (`boxes/codec.rs`: a tag, then a varint, 8 bytes or a string), so records and
//! snapshots share one codec. The version floor is the highest version a removed
//! box served, so a key created again after a restart still starts past it
//! (docs/boxes.md#incarnations); it is read after the walk, so a box removed before
//! the walk reached it is in the floor if it is not in the file; `idle_s` is how
//! long the box had accepted no message, so its ttl runs on after a restart instead
//! of starting over. Format 2 had neither: it is still read (floor 0, every box
//! fresh). Format 1 wrote fixed-width values instead; it is refused as an
//! unsupported version. Only boxes in the table are written: a deleted or expired
//! box is gone from it at once. Boxes are streamed, so a snapshot of a million
//! boxes needs no second copy in memory, and the count is written at the end
//! because boxes may be created during the walk.
//!
//! The field list is compared with the configuration's names, types and
//! reducers: a snapshot written with another layout is refused, never
//! reinterpreted. Every damage is refused with its own [`SnapshotError`].
//!
//! One job a file:
//! - `format.rs`: the constants of the format (magic, versions, bounds,
//!   markers) and the field layout as stored;
//! - `chain.rs`: a file's place in its chain ([`Kind`], [`Link`]) and what
//!   newer files settled for older ones ([`Newer`]);
//! - `write.rs`: the writer ([`write_link`], [`write_snapshot_at`]);
//! - `read.rs`: the reader and its checks ([`read_link_into`],
//!   [`read_snapshot_into`]);
//! - `crc.rs`: the checksummed byte streams both go through;
//! - `error.rs`: [`SnapshotError`].
//!
//! What it is not: files. The chain of a base and its deltas on disk, the
//! atomic save and the load at start are the server's
//! (`pollbox_server::snapshot_file`).

mod chain;
mod crc;
mod error;
mod format;
mod read;
mod write;

#[cfg(test)]
mod tests;

pub use chain::{Kind, Link, Newer};
pub use error::SnapshotError;
pub use format::FORMAT_VERSION;
pub use read::{
    read_link, read_link_into, read_snapshot, read_snapshot_at, read_snapshot_into, FileRead,
    Restored, Versions,
};
pub use write::{write_link, write_snapshot, write_snapshot_at, Written};
