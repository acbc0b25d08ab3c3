//! `pin_workers = true` pins each worker to one core of the process's affinity
//! mask (`taskset -c 8-15 pollbox serve` keeps its workers on 8-15), not to core i.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Parse a `Cpus_allowed_list` value such as `0-3,8,10-11`.
fn parse_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

fn cpus_of(status: &str) -> Vec<usize> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in status");
    parse_list(line)
}

/// The allowed cores of each thread of this process whose name starts with `prefix`.
fn thread_cpus(prefix: &str) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = e.path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue;
        };
        let name = comm.trim().to_string();
        if name.starts_with(prefix) {
            out.push((name, cpus_of(&status)));
        }
    }
    out.sort();
    out
}

#[test]
fn pinned_workers_stay_inside_the_affinity_mask() {
    let allowed = cpus_of(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    let last = *allowed.last().expect("at least one allowed core");
    // The server is started from a thread allowed only the last core, so its
    // workers inherit that mask; both must be pinned inside it.
    std::thread::spawn(move || {
        // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it (last is below
        // CPU_SETSIZE: the kernel listed it), sched_setaffinity reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(last, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
        let mut c = config();
        c.server.workers = 2;
        c.server.pin_workers = true;
        let s = start(c);
        // Each worker pins itself when its thread starts: wait until both have.
        let deadline = Instant::now() + Duration::from_secs(10);
        let workers = loop {
            let w = thread_cpus("pollbox-w");
            if w.len() == 2 && w.iter().all(|(_, cpus)| cpus.len() == 1) {
                break w;
            }
            assert!(Instant::now() < deadline, "workers not pinned: {w:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        for (name, cpus) in &workers {
            assert_eq!(cpus, &vec![last], "{name} left the mask");
        }
        let r = get(s.addr(), "/healthz");
        assert_eq!(r.status, 200);
        s.shutdown().unwrap();
    })
    .join()
    .unwrap();
}
