//! A room's stream resumed over and over while writers change it
//! (docs/http.md#rooms, docs/boxes.md#watermarks): each reconnect sends its
//! last `Last-Event-ID` and must be sent exactly what moved since: never a
//! version the client holds or an older one, and at the end the client holds
//! exactly the room. Real sockets, real writers on every worker.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One server-sent event.
#[derive(Debug, Default)]
struct Event {
    event: String,
    data: String,
    id: Option<String>,
}

/// A prefix stream read event by event.
struct Sse {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl Sse {
    fn open(a: SocketAddr, prefix: &str, id: Option<&str>) -> Sse {
        let mut stream = connect(a);
        let last = id.map_or(String::new(), |i| format!("Last-Event-ID: {i}\r\n"));
        write!(
            stream,
            "GET /v1/boxes?prefix={prefix} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{last}\r\n"
        )
        .unwrap();
        let mut s = Sse {
            stream,
            buf: Vec::new(),
        };
        let head = s.block().expect("a head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    }

    /// The next block up to a blank line (the head, then each event).
    fn block(&mut self) -> Option<String> {
        loop {
            let sep = if self.buf.starts_with(b"HTTP/") {
                &b"\r\n\r\n"[..]
            } else {
                &b"\n\n"[..]
            };
            if let Some(i) = self.buf.windows(sep.len()).position(|w| w == sep) {
                let block = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + sep.len());
                return Some(block);
            }
            let mut chunk = [0u8; 16384];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn next(&mut self) -> Option<Event> {
        loop {
            let block = self.block()?;
            let mut e = Event::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    e.event = v.into();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    e.data = v.into();
                } else if let Some(v) = line.strip_prefix("id: ") {
                    e.id = Some(v.into());
                }
            }
            if !e.data.is_empty() || !e.event.is_empty() {
                return Some(e);
            }
        }
    }
}

/// What the client holds: each key's version and payload.
#[derive(Default)]
struct Held {
    boxes: BTreeMap<String, (u64, String)>,
    /// Keys held when a reset began: those not listed again by `synced` go.
    unconfirmed: Option<Vec<String>>,
    resets: usize,
    /// The last events, for a failure's message.
    log: std::collections::VecDeque<String>,
    /// Every event by key, for a failure's message.
    by_key: BTreeMap<String, Vec<String>>,
    conn: usize,
}

impl Held {
    /// Apply one event; panics on a version the client holds or an older
    /// one outside a reset's listing.
    fn apply(&mut self, e: &Event) {
        self.log
            .push_back(format!("{} {} {:?}", e.event, e.data, e.id));
        if self.log.len() > 40 {
            self.log.pop_front();
        }
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&e.data) {
            if let Some(k) = v["k"].as_str() {
                let (ver, _) = if e.event.is_empty() {
                    split_ver(&e.data)
                } else {
                    (0, String::new())
                };
                self.by_key
                    .entry(k.to_string())
                    .or_default()
                    .push(format!("conn {} {} {} {:?}", self.conn, e.event, ver, e.id));
            }
        }
        match e.event.as_str() {
            "" => {
                let (ver, _) = split_ver(&e.data);
                let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
                let key = v["k"].as_str().unwrap().to_string();
                if let Some(list) = self.unconfirmed.as_mut() {
                    list.retain(|k| k != &key);
                } else if let Some(&(held, _)) = self.boxes.get(&key) {
                    assert!(
                        ver > held,
                        "{key}: sent {ver}, the client holds {held}; last events:\n{}",
                        self.log.iter().cloned().collect::<Vec<_>>().join("\n")
                    );
                }
                self.boxes.insert(key, (ver, e.data.clone()));
            }
            "deleted" => {
                let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
                self.boxes.remove(v["k"].as_str().unwrap());
            }
            "reset" => {
                self.resets += 1;
                self.unconfirmed = Some(self.boxes.keys().cloned().collect());
            }
            "synced" => {
                for k in self.unconfirmed.take().unwrap_or_default() {
                    self.boxes.remove(&k);
                }
            }
            other => panic!("unexpected event {other}: {e:?}"),
        }
    }
}

/// The room as the server has it now, page by page.
fn room(a: SocketAddr, prefix: &str) -> BTreeMap<String, (u64, String)> {
    let mut all = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let r = get(a, &format!("/v1/boxes?prefix={prefix}&limit=50{cursor}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let page = r.json();
        for b in page["boxes"].as_array().unwrap() {
            let text = b.to_string();
            let (ver, _) = split_ver(&text);
            all.insert(b["k"].as_str().unwrap().to_string(), (ver, text));
        }
        match page["next"].as_str() {
            Some(n) => cursor = format!("&cursor={n}"),
            None => return all,
        }
    }
}

/// Writers on their own connections: updates, creations and deletions of 40
/// keys under `room/` and some under `other/`, until told to stop.
fn writers(a: SocketAddr, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<usize>> {
    (0..3u64)
        .map(|w| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w + 1);
                let mut ops = 0;
                let mut rd = Reader::new(connect(a));
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = if x.is_multiple_of(10) {
                        format!("other/k{}", x % 7)
                    } else {
                        format!("room/k{:02}", (x >> 8) % 40)
                    };
                    let req = if (x >> 20).is_multiple_of(8) {
                        format!("DELETE /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\n\r\n")
                    } else {
                        let body = format!(r#"{{"value":{}}}"#, x % 1000);
                        format!(
                            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    rd.send(req.as_bytes());
                    let r = rd.read(false);
                    assert!(matches!(r.status, 200 | 204 | 404), "{}", r.text());
                    ops += 1;
                }
                ops
            })
        })
        .collect()
}

#[test]
fn a_room_resumed_over_and_over_is_sent_exactly_what_moved() {
    let s = start(config());
    let a = s.addr();
    for i in 0..40 {
        let r = post(a, &format!("/v1/boxes/room/k{i:02}"), r#"{"value":1}"#);
        assert_eq!(r.status, 200);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads = writers(a, stop.clone());
    let mut held = Held::default();
    let mut id: Option<String> = None;
    let mut reconnects = 0;
    let mut events = 0usize;
    let mut x = 12345u64;
    while reconnects < 200 {
        held.log.push_back(format!("-- reconnect with {id:?}"));
        held.conn += 1;
        for v in held.by_key.values_mut() {
            v.push(format!("conn {} opens with {id:?}", held.conn));
        }
        let mut sse = Sse::open(a, "room/", id.as_deref());
        // Read a few events (at least through the listing's `synced` on the
        // first connect), then hang up at an event that carried an id.
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut budget = 1 + (x >> 33) % 12;
        let mut synced = false;
        loop {
            let e = sse.next().expect("the stream goes on");
            held.apply(&e);
            events += 1;
            synced |= e.event == "synced";
            if let Some(i) = &e.id {
                id = Some(i.clone());
                budget = budget.saturating_sub(1);
                if synced && budget == 0 {
                    break;
                }
            }
        }
        reconnects += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let ops: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(ops > 500, "the writers wrote: {ops}");
    // Quiet now: one more resume, read until it has sent what moved since.
    let mut sse = Sse::open(a, "room/", id.as_deref());
    let want = room(a, "room/");
    held.conn += 1;
    loop {
        let e = sse.next().expect("the stream goes on");
        held.apply(&e);
        if e.event == "synced" {
            id = e.id.clone();
            break;
        }
    }
    let differ: Vec<&String> = held
        .boxes
        .keys()
        .filter(|k| !want.contains_key(*k))
        .chain(want.keys().filter(|k| !held.boxes.contains_key(*k)))
        .collect();
    for k in &differ {
        let hist = held.by_key.get(*k).cloned().unwrap_or_default();
        let tail = &hist[hist.len().saturating_sub(12)..];
        eprintln!(
            "{k}: server {:?}\n  {}",
            want.get(*k).map(|w| w.0),
            tail.join("\n  ")
        );
    }
    assert_eq!(
        held.boxes.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the client holds the room's boxes ({events} events, {reconnects} reconnects, {ops} writes, {} resets)",
        held.resets
    );
    for (k, (ver, payload)) in &want {
        let (got_ver, got) = held.boxes.get(k).expect("held");
        assert_eq!(got_ver, ver, "{k}");
        let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(parse(got), parse(payload), "{k}");
    }
    // Resets come only from removals no longer kept (256 a set of the key
    // order; this room's 40 keys are all in one): exact all the same.
    eprintln!(
        "{events} events, {reconnects} reconnects, {ops} writes, {} resets",
        held.resets
    );
    // A quiet resume from the last id sends nothing but `synced`, with an id
    // at or past it (the node may have published writes elsewhere since).
    let mut again = Sse::open(a, "room/", id.as_deref());
    let e = again.next().expect("an event");
    assert_eq!(e.event, "synced", "{e:?}");
    let cut = |w: &str| -> Vec<u64> {
        let (_, c) = w.split_once('.').expect("a watermark");
        c.split(',')
            .map(|p| u64::from_str_radix(p, 16).unwrap())
            .collect()
    };
    let (was, now) = (cut(id.as_deref().unwrap()), cut(e.id.as_deref().unwrap()));
    assert!(
        was.iter().zip(&now).all(|(w, n)| n >= w),
        "{was:?} -> {now:?}"
    );
    s.shutdown().unwrap();
}
