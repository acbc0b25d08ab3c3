//! Which cores the process may run on, and pinning a worker's thread to one
//! (`server.pin_workers`): worker i goes to the i-th core of the affinity mask.
//!
//! What it is not: thread priorities ([`crate::thread_priority`]) or the
//! choice of how many workers run (the config's `effective_workers`).

/// Cores this process may run on (1 when the OS cannot say): the worker
/// count when `server.workers` is 0, and the cores workers are pinned to.
pub(crate) fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cores the calling thread may run on (its affinity mask), in ascending
/// order; empty when the OS will not say.
pub(crate) fn allowed_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes only inside `set`,
    // and CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

pub(crate) fn pin_to_core(core: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it (core is
    // below CPU_SETSIZE: it came from allowed_cores), and sched_setaffinity(0, ...)
    // reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(core, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_binds_the_thread_to_one_core() {
        let allowed = allowed_cores();
        assert!(!allowed.is_empty());
        let want = *allowed.last().unwrap();
        let ncpu = libc::CPU_SETSIZE as usize;
        let cpus = std::thread::spawn(move || {
            pin_to_core(want);
            // SAFETY: as in pin_to_core; sched_getaffinity writes into `set`.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                    0
                );
                (0..ncpu)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect::<Vec<_>>()
            }
        })
        .join()
        .unwrap();
        assert_eq!(cpus, vec![want]);
    }

    #[test]
    fn allowed_cores_follow_the_affinity_mask() {
        let all = allowed_cores();
        let last = *all.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_to_core(last);
            allowed_cores()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
    }
}
