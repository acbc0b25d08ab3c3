//! The `sse` operation (`--sse N`): N event streams (docs/http.md#event-streams)
//! held open on the run's keys (subscriber `i` on key `i % keys`), read by one
//! thread with its own mio loop, while the mix runs. It counts events and measures
//! publish-to-receive latency from each event's version: the load threads record,
//! for every key, the version their last ingest answer carried and when that ingest
//! was (intended to be) sent ([`Published`]); an event whose `id:` is that version
//! gets `received - sent`. An event that arrives before its ingest's answer is
//! processed waits for it (a bounded list, looked at each millisecond); one whose
//! version was overtaken by a newer ingest (or that came from another publisher) is
//! counted as unmatched, not measured.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::request::{key_name, MAX_KEY_NAME};
use crate::stats::latency_histogram;

/// The newest version each key's ingests made, and when the ingest that made it
/// was sent (ns since the run's origin).
pub struct Published {
    slots: Vec<(AtomicU64, AtomicU64)>,
}

impl Published {
    pub fn new(keys: u32) -> Published {
        Published {
            slots: (0..keys)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    /// An ingest of `key`, sent at `sent_ns`, was answered with `version`.
    #[inline]
    pub fn record(&self, key: u32, version: u64, sent_ns: u64) {
        if let Some((v, t)) = self.slots.get(key as usize) {
            if version > v.load(Ordering::Acquire) {
                t.store(sent_ns, Ordering::Release);
                v.store(version, Ordering::Release);
            }
        }
    }

    /// When the ingest that made `version` of `key` was sent: `Ok(Some)` when
    /// known, `Ok(None)` when its answer has not been seen yet, `Err` when a
    /// newer version overtook it (or another client made it).
    fn sent(&self, key: u32, version: u64) -> Result<Option<u64>, ()> {
        let Some((v, t)) = self.slots.get(key as usize) else {
            return Err(());
        };
        let newest = v.load(Ordering::Acquire);
        match newest.cmp(&version) {
            std::cmp::Ordering::Less => Ok(None),
            std::cmp::Ordering::Equal => {
                let sent = t.load(Ordering::Acquire);
                // The version may have moved on between the two loads.
                if v.load(Ordering::Acquire) == version {
                    Ok(Some(sent))
                } else {
                    Err(())
                }
            }
            std::cmp::Ordering::Greater => Err(()),
        }
    }
}

/// What the subscribers saw.
pub struct SseStats {
    pub subscribers: usize,
    /// Streams that answered with something other than an event stream, or broke.
    pub errors: u64,
    /// Events received in the measured window.
    pub events: u64,
    /// `event: deleted` received.
    pub deleted: u64,
    /// Events whose publish time was unknown (overtaken, or another publisher).
    pub unmatched: u64,
    /// Publish-to-receive, ns.
    pub latency: Histogram<u64>,
}

struct Sub {
    stream: TcpStream,
    key: u32,
    buf: Vec<u8>,
    head_done: bool,
    /// An event whose ingest answer was not seen yet: (version, received ns).
    waiting: Option<(u64, u64)>,
    open: bool,
}

/// Open `n` event streams on `addr` (the head is written, not yet read).
pub fn subscribe(
    addr: SocketAddr,
    host: &str,
    keys: u32,
    n: usize,
) -> io::Result<Vec<(u32, std::net::TcpStream)>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let key = (i % keys.max(1) as usize) as u32;
        let mut name = [0u8; MAX_KEY_NAME];
        let len = key_name(key, &mut name);
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.write_all(b"GET /v1/boxes/")?;
        s.write_all(&name[..len])?;
        write!(
            s,
            " HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
        )?;
        s.set_nonblocking(true)?;
        out.push((key, s));
    }
    Ok(out)
}

/// Read the streams until `end_ns` (ns after `origin`); events received before
/// `warmup_ns` are not counted.
pub fn drive(
    streams: Vec<(u32, std::net::TcpStream)>,
    published: &Published,
    origin: Instant,
    warmup_ns: u64,
    end_ns: u64,
) -> io::Result<SseStats> {
    let mut poll = Poll::new()?;
    let mut subs = Vec::with_capacity(streams.len());
    for (i, (key, s)) in streams.into_iter().enumerate() {
        let mut stream = TcpStream::from_std(s);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)?;
        subs.push(Sub {
            stream,
            key,
            buf: Vec::with_capacity(4096),
            head_done: false,
            waiting: None,
            open: true,
        });
    }
    let mut stats = SseStats {
        subscribers: subs.len(),
        errors: 0,
        events: 0,
        deleted: 0,
        unmatched: 0,
        latency: latency_histogram(),
    };
    let mut events = Events::with_capacity(1024);
    let mut waiting: Vec<usize> = Vec::new();
    let now_ns = || origin.elapsed().as_nanos() as u64;
    let mut tmp = vec![0u8; 64 * 1024];
    loop {
        let now = now_ns();
        if now >= end_ns && origin.elapsed() >= Duration::from_nanos(end_ns) {
            break;
        }
        let timeout = Duration::from_millis(1).min(Duration::from_nanos(end_ns - now));
        poll.poll(&mut events, Some(timeout))?;
        for ev in events.iter() {
            let i = ev.token().0;
            let Some(sub) = subs.get_mut(i) else {
                continue;
            };
            loop {
                match sub.stream.read(&mut tmp) {
                    Ok(0) => {
                        if sub.open {
                            sub.open = false;
                            stats.errors += 1;
                        }
                        break;
                    }
                    Ok(n) => sub.buf.extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        if sub.open {
                            sub.open = false;
                            stats.errors += 1;
                        }
                        break;
                    }
                }
            }
            let received = now_ns();
            let measured = received >= warmup_ns && received <= end_ns;
            take_events(sub, published, received, measured, &mut stats);
            if sub.waiting.is_some() {
                waiting.push(i);
            }
        }
        // Events that came before their ingest's answer was processed.
        waiting.retain(|&i| {
            let sub = &mut subs[i];
            let Some((version, received)) = sub.waiting else {
                return false;
            };
            match published.sent(sub.key, version) {
                Ok(None) => true,
                Ok(Some(sent)) => {
                    stats
                        .latency
                        .saturating_record(received.saturating_sub(sent));
                    sub.waiting = None;
                    false
                }
                Err(()) => {
                    stats.unmatched += 1;
                    sub.waiting = None;
                    false
                }
            }
        });
    }
    Ok(stats)
}

/// Take the complete head and events out of the subscriber's buffer.
fn take_events(
    sub: &mut Sub,
    published: &Published,
    received: u64,
    measured: bool,
    stats: &mut SseStats,
) {
    if !sub.head_done {
        let Some(end) = find(&sub.buf, b"\r\n\r\n") else {
            return;
        };
        if !sub.buf.starts_with(b"HTTP/1.1 200")
            || find(&sub.buf[..end], b"text/event-stream").is_none()
        {
            stats.errors += 1;
            sub.open = false;
            sub.buf.clear();
            return;
        }
        sub.head_done = true;
        sub.buf.drain(..end + 4);
    }
    let mut start = 0;
    while let Some(end) = find(&sub.buf[start..], b"\n\n") {
        let block = &sub.buf[start..start + end];
        start += end + 2;
        if block.starts_with(b"event: deleted") {
            stats.deleted += 1;
            continue;
        }
        let Some(id) = block
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(b"id: "))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
        else {
            // `retry:`, a heartbeat.
            continue;
        };
        if !measured {
            continue;
        }
        stats.events += 1;
        // A newer event replaces one still waiting for its publish time.
        if sub.waiting.take().is_some() {
            stats.unmatched += 1;
        }
        match published.sent(sub.key, id) {
            Ok(Some(sent)) => stats
                .latency
                .saturating_record(received.saturating_sub(sent)),
            Ok(None) => sub.waiting = Some((id, received)),
            Err(()) => stats.unmatched += 1,
        }
    }
    sub.buf.drain(..start);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_versions_match_only_their_own_ingest() {
        let p = Published::new(4);
        assert_eq!(p.sent(1, 1), Ok(None), "not answered yet");
        p.record(1, 1, 100);
        assert_eq!(p.sent(1, 1), Ok(Some(100)));
        p.record(1, 3, 300);
        assert_eq!(p.sent(1, 1), Err(()), "overtaken");
        assert_eq!(p.sent(1, 3), Ok(Some(300)));
        p.record(1, 2, 200);
        assert_eq!(
            p.sent(1, 3),
            Ok(Some(300)),
            "an older answer changes nothing"
        );
        assert_eq!(p.sent(9, 1), Err(()), "no such key");
    }
}
