//! Figures about this process from `/proc`, under the names Prometheus
//! client libraries give them (`process_*`).

/// Figures about this process from `/proc`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessStats {
    pub rss: u64,
    /// The part of `rss` backed by files (the binary, shared libraries) or
    /// shared memory: clean pages the kernel may drop and read back.
    pub rss_file: u64,
    pub cpu_seconds: f64,
    pub open_fds: u64,
    pub start_time: f64,
}

/// Open file descriptors. Since Linux 6.2 `stat` on `/proc/self/fd` says how
/// many there are, at a cost that does not grow with them; before, the entries
/// are counted (a scrape then costs more with more connections).
fn open_fds() -> u64 {
    match std::fs::metadata("/proc/self/fd") {
        Ok(m) if m.len() > 0 => m.len(),
        _ => std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
    }
}

pub fn process_stats() -> ProcessStats {
    let mut p = ProcessStats::default();
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    // SAFETY: as above.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        // Pages: size, resident, shared (file-backed or shared, resident), ...
        let mut f = statm.split_whitespace().map(|v| v.parse::<u64>().ok());
        if let (Some(Some(rss)), Some(Some(shared))) = (f.nth(1), f.next()) {
            p.rss = rss * page;
            p.rss_file = shared * page;
        }
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name; utime is field 14, stime 15, starttime 22.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            p.cpu_seconds = (num(11) + num(12)) as f64 / ticks;
            let boot = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
            p.start_time = boot as f64 + num(19) as f64 / ticks;
        }
    }
    p.open_fds = open_fds();
    p
}
