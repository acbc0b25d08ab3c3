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
//!
//! The `prefix_streams` operation (`--prefix-streams N`) is read by the same thread:
//! N event streams of prefixes (docs/http.md#rooms; stream `i` on the prefix
//! `--prefix` gives for `i`, [`PrefixTemplate`]). A prefix stream first lists its room
//! (counted as `listed`) up to `event: synced`; every box event after it counts as an
//! event, its latency from the key and version in its payload as above; `event:
//! reset` starts a listing again.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::request::{KeyNames, MAX_KEY_NAME};
use crate::rooms::{encode_query_value, PrefixTemplate};
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

/// What the subscribers of one kind (one-box streams, or prefix streams) saw.
pub struct SseStats {
    pub subscribers: usize,
    /// Streams that answered with something other than an event stream, or broke.
    pub errors: u64,
    /// Events received in the measured window (for prefix streams: box events after
    /// the stream's listing, `event: synced`).
    pub events: u64,
    /// `event: deleted` received.
    pub deleted: u64,
    /// Events whose publish time was unknown (overtaken, or another publisher).
    pub unmatched: u64,
    /// Prefix streams: box events of their listings (before `event: synced`).
    pub listed: u64,
    /// Prefix streams: `event: synced` received (once a stream unless reset).
    pub synced: u64,
    /// Prefix streams: `event: reset` received (the server lists the room again).
    pub resets: u64,
    /// Publish-to-receive, ns.
    pub latency: Histogram<u64>,
}

impl SseStats {
    fn new(subscribers: usize) -> SseStats {
        SseStats {
            subscribers,
            errors: 0,
            events: 0,
            deleted: 0,
            unmatched: 0,
            listed: 0,
            synced: 0,
            resets: 0,
            latency: latency_histogram(),
        }
    }
}

/// What a stream watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// One box: `GET /v1/boxes/{key}`.
    Key(u32),
    /// Every box under a prefix: `GET /v1/boxes?prefix=P`.
    Prefix,
}

/// An event stream whose request is written (its answer not yet read).
pub struct Subscription {
    pub watch: Watch,
    pub stream: std::net::TcpStream,
}

/// What both kinds of streams saw.
pub struct StreamStats {
    pub keys: SseStats,
    pub prefixes: SseStats,
}

struct Sub {
    stream: TcpStream,
    watch: Watch,
    buf: Vec<u8>,
    head_done: bool,
    /// A prefix stream has sent `event: synced` (its listing is over).
    synced: bool,
    open: bool,
}

/// An event whose ingest answer was not seen yet.
struct Pending {
    key: u32,
    version: u64,
    received: u64,
    /// Of a prefix stream (else a one-box stream).
    prefix: bool,
}

/// Events that wait for their ingest's answer, at most.
const MAX_PENDING: usize = 1 << 16;

/// Open `n` event streams of one box each on `addr` (the head is written, not yet
/// read): subscriber `i` on key `i % keys`.
pub fn subscribe(
    addr: SocketAddr,
    host: &str,
    names: KeyNames,
    keys: u32,
    n: usize,
) -> io::Result<Vec<Subscription>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let key = (i % keys.max(1) as usize) as u32;
        let mut name = [0u8; MAX_KEY_NAME];
        let len = names.write(key, &mut name);
        let mut head = b"GET /v1/boxes/".to_vec();
        head.extend_from_slice(&name[..len]);
        out.push(Subscription {
            watch: Watch::Key(key),
            stream: open(addr, host, &head)?,
        });
    }
    Ok(out)
}

/// Open `n` event streams of prefixes on `addr` (the head is written, not yet read):
/// stream `i` on the prefix `template` gives for `i`.
pub fn subscribe_prefixes(
    addr: SocketAddr,
    host: &str,
    template: &PrefixTemplate,
    n: usize,
) -> io::Result<Vec<Subscription>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut head = b"GET /v1/boxes?prefix=".to_vec();
        encode_query_value(&template.render(i), &mut head);
        out.push(Subscription {
            watch: Watch::Prefix,
            stream: open(addr, host, &head)?,
        });
    }
    Ok(out)
}

/// Connect and write `GET <path>` asking for an event stream.
pub(crate) fn open(addr: SocketAddr, host: &str, path: &[u8]) -> io::Result<std::net::TcpStream> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    let mut head = path.to_vec();
    write!(
        head,
        " HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    s.write_all(&head)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// When the streams are read: until `end_ns` (ns after `origin`), counting
/// what is received from `warmup_ns` on.
#[derive(Clone, Copy)]
pub struct Window {
    pub origin: Instant,
    pub warmup_ns: u64,
    pub end_ns: u64,
}

/// Read the streams through `window`. `reader` matches each event to the
/// ingest that published it.
pub fn drive(
    streams: Vec<Subscription>,
    reader: Reader<'_>,
    window: Window,
) -> io::Result<StreamStats> {
    let Window {
        origin,
        warmup_ns,
        end_ns,
    } = window;
    let published = reader.published;
    let mut poll = Poll::new()?;
    let mut subs = Vec::with_capacity(streams.len());
    for (i, sub) in streams.into_iter().enumerate() {
        let mut stream = TcpStream::from_std(sub.stream);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)?;
        subs.push(Sub {
            stream,
            watch: sub.watch,
            buf: Vec::with_capacity(4096),
            head_done: false,
            synced: false,
            open: true,
        });
    }
    let prefix_subs = subs.iter().filter(|s| s.watch == Watch::Prefix).count();
    let mut stats = StreamStats {
        keys: SseStats::new(subs.len() - prefix_subs),
        prefixes: SseStats::new(prefix_subs),
    };
    let mut events = Events::with_capacity(1024);
    let mut pending: Vec<Pending> = Vec::new();
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
            let Some(sub) = subs.get_mut(ev.token().0) else {
                continue;
            };
            let stats = match sub.watch {
                Watch::Key(_) => &mut stats.keys,
                Watch::Prefix => &mut stats.prefixes,
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
            reader.take_events(sub, received, measured, stats, &mut pending);
        }
        // Events that came before their ingest's answer was processed.
        pending.retain(|p| {
            let stats = if p.prefix {
                &mut stats.prefixes
            } else {
                &mut stats.keys
            };
            match published.sent(p.key, p.version) {
                Ok(None) => true,
                Ok(Some(sent)) => {
                    stats
                        .latency
                        .saturating_record(p.received.saturating_sub(sent));
                    false
                }
                Err(()) => {
                    stats.unmatched += 1;
                    false
                }
            }
        });
    }
    Ok(stats)
}

/// What reading events needs besides the stream.
/// How events are matched to the run's ingests. Prefix streams' events name
/// their box: `names` and `keys` say which of the run's keys it is. Without
/// `timed` (no single ingests in the mix, so no publish times), events are
/// counted as unmatched at once.
pub struct Reader<'a> {
    pub published: &'a Published,
    /// Events can be matched to the ingests of the run.
    pub timed: bool,
    pub names: KeyNames,
    pub keys: u32,
}

impl Reader<'_> {
    /// Take the complete head and events out of the subscriber's buffer.
    fn take_events(
        &self,
        sub: &mut Sub,
        received: u64,
        measured: bool,
        stats: &mut SseStats,
        pending: &mut Vec<Pending>,
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
            let seen = match sub.watch {
                Watch::Key(key) => key_event(block, key, measured, stats),
                Watch::Prefix => self.prefix_event(block, &mut sub.synced, measured, stats),
            };
            let Some((key, version)) = seen else {
                continue;
            };
            if !self.timed {
                stats.unmatched += 1;
                continue;
            }
            match self.published.sent(key, version) {
                Ok(Some(sent)) => stats
                    .latency
                    .saturating_record(received.saturating_sub(sent)),
                Ok(None) if pending.len() < MAX_PENDING => pending.push(Pending {
                    key,
                    version,
                    received,
                    prefix: sub.watch == Watch::Prefix,
                }),
                Ok(None) | Err(()) => stats.unmatched += 1,
            }
        }
        sub.buf.drain(..start);
    }

    /// One event of a prefix stream: the listing's boxes until `event: synced`, then
    /// each box that moved, `event: deleted`, `event: reset` (listed again). Returns
    /// the key and version of a measured box event after the listing.
    fn prefix_event(
        &self,
        block: &[u8],
        synced: &mut bool,
        measured: bool,
        stats: &mut SseStats,
    ) -> Option<(u32, u64)> {
        let mut event: &[u8] = b"";
        let mut data = None;
        for line in block.split(|&b| b == b'\n') {
            if let Some(v) = line.strip_prefix(b"event: ") {
                event = v;
            } else if let Some(v) = line.strip_prefix(b"data: ") {
                data = Some(v);
            }
        }
        match (event, data) {
            (b"synced", _) => {
                stats.synced += 1;
                *synced = true;
            }
            (b"reset", _) => {
                stats.resets += 1;
                *synced = false;
            }
            (b"deleted", _) => stats.deleted += 1,
            (b"", Some(_)) if !*synced => stats.listed += 1,
            (b"", Some(payload)) if measured => {
                stats.events += 1;
                let seen = box_of(payload).and_then(|(name, version)| {
                    Some((self.names.index_of(name, self.keys)?, version))
                });
                if seen.is_none() {
                    stats.unmatched += 1;
                }
                return seen;
            }
            // `retry:`, heartbeats, events before the window.
            _ => {}
        }
        None
    }
}

/// One event of a one-box stream: returns the version of a measured box event.
fn key_event(block: &[u8], key: u32, measured: bool, stats: &mut SseStats) -> Option<(u32, u64)> {
    if block.starts_with(b"event: deleted") {
        stats.deleted += 1;
        return None;
    }
    // `retry:` and heartbeats have no id.
    let id = block
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"id: "))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())?;
    if !measured {
        return None;
    }
    stats.events += 1;
    Some((key, id))
}

/// The key and version of a box payload (`{"k":"KEY","ver":N,...}`), the key as it is
/// written (the run's keys need no escapes).
fn box_of(payload: &[u8]) -> Option<(&[u8], u64)> {
    let k = find(payload, b"\"k\":\"")? + 5;
    let len = payload[k..].iter().position(|&b| b == b'"')?;
    let ver = find(payload, b"\"ver\":")? + 6;
    let digits = payload[ver..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let version = std::str::from_utf8(&payload[ver..ver + digits])
        .ok()?
        .parse()
        .ok()?;
    Some((&payload[k..k + len], version))
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
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

    #[test]
    fn prefix_events_list_sync_then_count() {
        let published = Published::new(100);
        published.record(17, 5, 1_000);
        let reader = Reader {
            published: &published,
            timed: true,
            names: KeyNames { rooms: 10 },
            keys: 100,
        };
        let mut stats = SseStats::new(1);
        let mut synced = false;
        let mut see = |block: &[u8], measured: bool, synced: &mut bool| {
            reader.prefix_event(block, synced, measured, &mut stats)
        };
        assert_eq!(see(b"retry: 1000", true, &mut synced), None);
        let event = br#"data: {"k":"room-7/lg-17","ver":5,"v":1}"#;
        assert_eq!(see(event, true, &mut synced), None, "listed, not counted");
        assert_eq!(see(b"event: synced\ndata: {}", true, &mut synced), None);
        assert!(synced);
        assert_eq!(see(b": heartbeat", true, &mut synced), None);
        assert_eq!(see(event, false, &mut synced), None, "before the window");
        assert_eq!(see(event, true, &mut synced), Some((17, 5)));
        // An id before the data (a later server's) changes nothing.
        let with_id = b"id: 77\ndata: {\"k\":\"room-7/lg-17\",\"ver\":6}";
        assert_eq!(see(with_id, true, &mut synced), Some((17, 6)));
        // A box that is not one of the run's keys: counted, unmatched.
        assert_eq!(
            see(br#"data: {"k":"room-7/x","ver":1}"#, true, &mut synced),
            None
        );
        assert_eq!(
            see(
                b"event: deleted\ndata: {\"k\":\"room-7/lg-17\"}",
                true,
                &mut synced
            ),
            None
        );
        assert_eq!(see(b"event: reset\ndata: {}", true, &mut synced), None);
        assert!(!synced);
        assert_eq!(see(event, true, &mut synced), None, "listed again");
        assert_eq!(
            (
                stats.listed,
                stats.synced,
                stats.events,
                stats.unmatched,
                stats.deleted,
                stats.resets
            ),
            (2, 1, 3, 1, 1, 1)
        );
        assert_eq!(
            box_of(br#"{"k":"a/b","ver":12,"v":1}"#),
            Some((&b"a/b"[..], 12))
        );
        assert_eq!(box_of(br#"{"k":"a/b"}"#), None);
    }
}
