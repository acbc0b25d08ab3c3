//! # pollbox-table
//!
//! The box table and its formats: what a box is, how a message becomes one,
//! and how a box is written down. Both sources of messages use it: the HTTP
//! service in `pollbox-core` and the records of a Kafka log.
//!
//! Where things are:
//! - [`config`]: the `[boxes]` section (the key, the sizes, the fields), and
//!   the error every section's check answers with.
//! - [`plan`]: the configured fields compiled once.
//! - [`projection`]: a body validated by a single-pass JSON scanner, only the
//!   configured paths read, into a worker's arena.
//! - [`boxes`]: the box table shared by all workers; where a box is updated,
//!   and who is told ([`boxes::Watchers`]).
//! - [`render`]: payload rendering (docs/boxes.md#payloads).
//! - [`snapshot`]: the snapshot format, written to any `Write` and read from
//!   any `Read` (files are the server's).
//! - [`log`]: what a record of the Kafka log does to the box table (a node
//!   of a log is a replica built from it).
//! - [`wal`]: the write-ahead file's records and segments (bytes only: the
//!   server writes and syncs the files).
//! - [`arena`]: the per-worker arena, reset at each epoch (tick).
//! - [`bytes`]: the line-feed search and decimal parser that the projection
//!   and the HTTP framer above share.
//!
//! What it is not: the protocol. It knows no request, connection, token or
//! answer; `pollbox-core` builds those on top of it, and cargo keeps this
//! crate from reaching up (docs/architecture.md#crates).

pub mod arena;
pub mod boxes;
pub mod bytes;
pub mod config;
pub mod log;
pub mod plan;
pub mod projection;
pub mod render;
pub mod snapshot;
pub mod wal;
