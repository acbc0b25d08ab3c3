//! The priority of the server's background threads (snapshot writer, auth file
//! watcher): they run at nice 19 so they never stand in front of a worker.
//!
//! What it is not: where threads run (the workers' pinning to cores is in
//! [`crate::cores`]).

/// Run the calling thread at nice 19 (and the threads it starts from now on,
/// which inherit it): on a core it shares with a worker it gets what the
/// worker leaves, so it never stands in front of a readable poll for long.
pub(crate) fn lower_priority(what: &str) {
    // SAFETY: gettid takes no arguments and cannot fail; setpriority with
    // PRIO_PROCESS and a thread id changes only that thread's nice value (Linux).
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if r != 0 {
        eprintln!(
            "pollbox: {what} thread keeps its priority ({})",
            std::io::Error::last_os_error()
        );
    }
}
