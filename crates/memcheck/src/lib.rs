//! `pollbox memcheck`: scrape `/metrics` and put side by side what pollbox
//! accounts, what jemalloc holds, and what the kernel sees (RSS), with the gaps
//! between them and a verdict (docs/operations.md#memcheck).
//!
//! What it is not: part of the server. It is an HTTP client of any pollbox,
//! local or remote, and needs nothing of the server's code.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// The figures memcheck compares, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Memory {
    pub accounted: f64,
    pub arena: f64,
    pub boxes: f64,
    pub buffers: f64,
    pub send_queue: f64,
    pub runtime: f64,
    /// Tombstones of removed boxes' keys (a bounded number).
    pub tombstones: f64,
    pub allocated: f64,
    /// Freed bytes in jemalloc's thread caches (part of `allocated`).
    pub tcache: f64,
    pub active: f64,
    pub resident: f64,
    pub rss: f64,
    /// The part of `rss` backed by files (the binary, shared libraries);
    /// zero from a pollbox that does not export it.
    pub rss_file: f64,
}

impl Memory {
    /// Pull the figures out of a Prometheus text exposition.
    pub fn from_metrics(text: &str) -> Result<Memory, String> {
        let mut m = Memory::default();
        let mut seen = 0;
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let slot = match name {
                "pollbox_accounted_bytes{part=\"arena\"}" => &mut m.arena,
                "pollbox_accounted_bytes{part=\"boxes\"}" => &mut m.boxes,
                "pollbox_accounted_bytes{part=\"buffers\"}" => &mut m.buffers,
                "pollbox_accounted_bytes{part=\"send_queue\"}" => &mut m.send_queue,
                "pollbox_accounted_bytes{part=\"runtime\"}" => &mut m.runtime,
                "pollbox_accounted_bytes{part=\"tombstones\"}" => &mut m.tombstones,
                "pollbox_jemalloc_allocated_bytes" => &mut m.allocated,
                "pollbox_jemalloc_tcache_bytes" => &mut m.tcache,
                "pollbox_jemalloc_active_bytes" => &mut m.active,
                "pollbox_jemalloc_resident_bytes" => &mut m.resident,
                "process_resident_memory_bytes" => &mut m.rss,
                "pollbox_process_resident_file_bytes" => {
                    m.rss_file = v;
                    continue;
                }
                _ => continue,
            };
            *slot = v;
            seen += 1;
        }
        if seen < 8 {
            return Err(
                "the metrics do not look like pollbox's (accounted/jemalloc figures missing)"
                    .into(),
            );
        }
        m.accounted = m.arena + m.boxes + m.buffers + m.send_queue + m.runtime + m.tombstones;
        Ok(m)
    }

    /// What the program holds by jemalloc's count: allocated minus the freed
    /// bytes parked in thread caches.
    pub fn in_use(&self) -> f64 {
        self.allocated - self.tcache
    }

    /// jemalloc holds more than accounted by over 10%.
    pub fn leaking(&self) -> bool {
        self.in_use() > self.accounted * 1.10
    }

    pub fn verdict(&self) -> String {
        let gap = self.in_use() - self.accounted;
        let pct = if self.accounted > 0.0 {
            100.0 * gap / self.accounted
        } else {
            f64::INFINITY
        };
        if self.leaking() {
            format!(
                "VERDICT: jemalloc holds {} more than pollbox accounts for ({pct:+.1}%): memory is held outside pollbox's accounting",
                mib(gap)
            )
        } else if pct >= -10.0 {
            format!("verdict: ok — jemalloc allocated is within 10% of accounted ({pct:+.1}%)")
        } else {
            format!(
                "verdict: ok — jemalloc allocated is {:.1}% under accounted: pollbox counts \
                 capacity it reserved and has not filled yet; nothing is held outside its accounting",
                -pct
            )
        }
    }
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1024.0 * 1024.0))
}

/// GET `{url}/metrics` with a plain HTTP/1.1 request.
pub fn scrape(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| format!("{hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET /metrics: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

/// The table printed by `memcheck`.
pub fn table(m: &Memory, header: bool) -> String {
    let mut s = String::new();
    if header {
        s.push_str(&format!(
            "{:>11} {:>11} {:>11} {:>11} {:>11} | {:>13} {:>13} {:>11}\n",
            "accounted",
            "je.alloc",
            "je.active",
            "je.resident",
            "rss",
            "alloc-acct",
            "resident-alloc",
            "rss-resident"
        ));
    }
    s.push_str(&format!(
        "{:>11} {:>11} {:>11} {:>11} {:>11} | {:>13} {:>13} {:>11}\n",
        mib(m.accounted),
        mib(m.allocated),
        mib(m.active),
        mib(m.resident),
        mib(m.rss),
        mib(m.in_use() - m.accounted),
        mib(m.resident - m.allocated),
        mib(m.rss - m.resident),
    ));
    s
}

pub fn run(url: &str, watch: Option<u64>) -> Result<ExitCode, String> {
    let url = url.trim_end_matches('/').trim_end_matches("/metrics");
    let mut first = true;
    loop {
        let m = Memory::from_metrics(&scrape(url)?)?;
        print!("{}", table(&m, first));
        if first {
            println!(
                "  je.tcache {} (freed, in thread caches) is left out of alloc-acct",
                mib(m.tcache)
            );
            if m.rss_file > 0.0 {
                println!(
                    "  rss = anonymous {} + files {} (the binary and shared libraries: clean, reclaimable)",
                    mib(m.rss - m.rss_file),
                    mib(m.rss_file)
                );
            }
            println!(
                "  accounted = arena {} + boxes {} + buffers {} + send_queue {} + runtime {} + tombstones {}",
                mib(m.arena),
                mib(m.boxes),
                mib(m.buffers),
                mib(m.send_queue),
                mib(m.runtime),
                mib(m.tombstones)
            );
        }
        println!("  {}", m.verdict());
        first = false;
        match watch {
            Some(secs) => std::thread::sleep(Duration::from_secs(secs.max(1))),
            None => return Ok(ExitCode::SUCCESS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# HELP x\n\
pollbox_accounted_bytes{part=\"arena\"} 1000\n\
pollbox_accounted_bytes{part=\"boxes\"} 2000\n\
pollbox_accounted_bytes{part=\"buffers\"} 500\n\
pollbox_accounted_bytes{part=\"send_queue\"} 500\n\
pollbox_jemalloc_allocated_bytes 4200\n\
pollbox_jemalloc_active_bytes 5000\n\
pollbox_jemalloc_resident_bytes 6000\n\
process_resident_memory_bytes 8000\n\
pollbox_process_resident_file_bytes 1500\n";

    #[test]
    fn parses_and_judges() {
        let m = Memory::from_metrics(SAMPLE).unwrap();
        assert_eq!(m.accounted, 4000.0);
        assert_eq!((m.rss, m.rss_file), (8000.0, 1500.0));
        assert!(!m.leaking(), "5% over is fine");
        let worse = Memory::from_metrics(&SAMPLE.replace("4200", "4500")).unwrap();
        assert!(worse.leaking());
        assert!(worse.verdict().starts_with("VERDICT"));
        assert!(
            m.verdict().contains("within 10% of accounted (+5.0%)"),
            "{}",
            m.verdict()
        );
        let under = Memory::from_metrics(&SAMPLE.replace("4200", "3200")).unwrap();
        assert!(!under.leaking());
        let v = under.verdict();
        assert!(
            v.starts_with("verdict: ok — jemalloc allocated is 20.0% under accounted"),
            "{v}"
        );
        assert!(!v.contains("within 10%"), "{v}");
    }

    #[test]
    fn refuses_foreign_metrics() {
        assert!(Memory::from_metrics("up 1\n").is_err());
    }
}
