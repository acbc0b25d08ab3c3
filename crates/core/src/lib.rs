//! # pollbox-core
//!
//! The sans-IO heart of pollbox: everything that decides what a byte means and
//! what goes back, with no sockets, threads or clocks of its own. The server
//! crate feeds it bytes and instants; tests, fuzzers and benches do the same.
//!
//! Where things are:
//! - [`http`]: request framing (head, `Content-Length` and chunked bodies,
//!   pipelining, limits) and response heads, the cached `Date`.
//! - [`config`]: the TOML configuration (docs/config.md).
//! - [`plan`]: the configured fields compiled once.
//! - [`projection`]: a body validated by a single-pass JSON scanner, only the
//!   configured paths read, into a worker's arena.
//! - [`boxes`]: the box table shared by all workers; where a box is updated.
//! - [`clients`]: who a connection's requests come from (the peer, a PROXY
//!   v2 header, `X-Forwarded-For`) and the per-client limits.
//! - [`log`]: what a record of the Kafka log does to the box table (a node
//!   of a log is a replica built from it).
//! - [`snapshot`]: the snapshot format, written to any `Write` and read from
//!   any `Read` (files are the server's).
//! - [`render`]: payload rendering (docs/boxes.md#payloads).
//! - [`arena`]: the per-worker arena, reset at each epoch (tick).
//! - [`wheel`]: the hashed timer wheel.
//! - `bytes`: the line-feed search and decimal parser the framer and the
//!   projection share.
//!
//! What it is not: an HTTP library. It knows exactly the requests pollbox serves.

pub mod arena;
pub mod auth;
pub mod boxes;
pub mod buffers;
mod bytes;
pub mod clients;
pub mod config;
pub mod conn;
pub mod http;
pub mod log;
pub mod plan;
pub mod projection;
pub mod render;
pub mod service;
pub mod snapshot;
pub mod wheel;
