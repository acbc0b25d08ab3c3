//! # pollbox-core
//!
//! The sans-IO protocol of pollbox: everything that decides what a request
//! means and what goes back, with no sockets, threads or clocks of its own.
//! The server crate feeds it bytes and instants; tests, fuzzers and benches
//! do the same.
//!
//! It stands on `pollbox-table` (the box table and its formats: the fields,
//! the projection, rendering, snapshots, the log's records), re-exported
//! here under the same names, so a user of the core reaches every part
//! through one crate. Cargo keeps the table from reaching up into the
//! protocol (docs/architecture.md#crates).
//!
//! Where things are:
//! - [`http`]: request framing (head, `Content-Length` and chunked bodies,
//!   pipelining, limits) and response heads, the cached `Date`.
//! - [`config`]: the TOML configuration (docs/config.md): the file, and each
//!   section checked by the part that owns it.
//! - [`auth`]: who may read and write which box: tokens and their scopes.
//! - [`clients`]: who a connection's requests come from (the peer, a PROXY
//!   v2 header, `X-Forwarded-For`) and the per-client limits.
//! - [`presence`]: who is in each room, served as the box `<room>~presence`.
//! - [`service`]: what every request is answered.
//! - [`conn`]: each connection's state machine (framing, keep-alive, timeouts,
//!   parking, streams, the close).
//! - [`buffers`]: the bytes all connections buffer, bounded together.
//! - [`wheel`]: the hashed timer wheel.
//! - From the table: [`plan`], [`projection`], [`boxes`], [`render`],
//!   [`snapshot`], [`log`], [`arena`].
//!
//! What it is not: an HTTP library. It knows exactly the requests pollbox serves.

pub mod auth;
pub mod buffers;
pub mod clients;
pub mod config;
pub mod conn;
pub mod http;
pub mod presence;
pub mod service;
pub mod wheel;

pub use pollbox_table::{arena, boxes, log, plan, projection, render, snapshot, wal};
// The byte scanning the framer shares with the projection.
use pollbox_table::bytes;
