//! The server's clocks beside the workers' own: the wall clock (versions of a
//! standalone node, box expiry on a node of a log) and the clock box expiry
//! counts on, which depends on whether the node reads a log.
//!
//! What it is not: a worker's loop clock (ms since start, read once a turn in
//! the worker) or the timer wheel.

/// The clock box expiry counts on, from the server's `now_ms` (ms since
/// start): on a standalone node that clock itself, on a node of a log
/// (`logged`) the wall clock ([`crate::shared::Shared::table_clock`]).
pub(crate) fn table_clock(logged: bool, now_ms: u64) -> u64 {
    if logged {
        wall_ms()
    } else {
        now_ms
    }
}

/// Microseconds since the Unix epoch: a standalone node's version clock
/// (`pollbox_core::boxes::VersionClock`).
pub(crate) fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
