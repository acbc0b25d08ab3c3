//! Failpoints: `POLLBOX_FAILPOINT=<name>` makes the process abort
//! (`std::process::abort`, as a `kill -9` would stop it, nothing flushed) the
//! first time it reaches the step of that name, so tests can crash it at every
//! step of writing a snapshot (docs/operations.md#snapshots-and-durability
//! lists the names). Read once, at start; a step not asked for costs a load
//! and a compare.

use std::sync::OnceLock;

static POINT: OnceLock<Option<String>> = OnceLock::new();

/// Read `POLLBOX_FAILPOINT` (once; later calls do nothing).
pub(crate) fn init() {
    POINT.get_or_init(|| {
        std::env::var("POLLBOX_FAILPOINT")
            .ok()
            .filter(|s| !s.is_empty())
    });
}

/// Abort here if this is the step asked for: `prefix` and `step` together
/// name it (`snapshot:` and `delta-synced`).
pub(crate) fn hit(prefix: &str, step: &str) {
    init();
    if let Some(Some(p)) = POINT.get() {
        if p.strip_prefix(prefix) == Some(step) {
            eprintln!("pollbox: failpoint {p}: aborting");
            std::process::abort();
        }
    }
}
