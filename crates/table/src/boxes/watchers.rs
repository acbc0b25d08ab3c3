//! Who is told that a box changed: parked long-polls and event streams, on
//! any worker. The table's writers (an HTTP ingest, an expiry, a record of the
//! log) all tell them the same way.
//!
//! What it is not: the waiting itself. Who waits on which key, and how a
//! worker is woken, is the server's (its wake-ups).

/// Whoever waits on boxes (parked long-polls, event streams, on any
/// worker). Every change of a box tells it the same way: an HTTP ingest or
/// `DELETE` (the service's host), an expiry, and a record of the log
/// ([`crate::log::Replica::apply`]).
pub trait Watchers {
    /// `key` was updated, deleted or expired: wake whoever waits on it.
    fn box_updated(&mut self, key: &[u8]);
}

/// Nobody waits (a replay, a test).
impl Watchers for () {
    fn box_updated(&mut self, _key: &[u8]) {}
}
